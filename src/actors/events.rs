//! Kubernetes Events for what an operator must see: why a claim was deleted, why a pod cannot be
//! placed, why a NodeClass is not ready. Publishing is best effort: an Event that fails to write
//! is logged, never retried in a loop, and never blocks the actor that emits it.
//!
//! kube's `Recorder` writes events.k8s.io/v1 Events, whose `note` the API server refuses above
//! 1 KiB (bytes) and whose `reason` and `action` above 128 bytes. Messages quote user input (a
//! 10,000-character label value), so every field is cut to its limit here, on a character
//! boundary, with a marker saying it was cut; otherwise the object would get no Event at all.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// events.k8s.io/v1 `note` limit (kube-apiserver `NoteLengthLimit`), in bytes.
pub const NOTE_LIMIT: usize = 1024;
/// events.k8s.io/v1 `reason` and `action` limit, in bytes.
pub const REASON_LIMIT: usize = 128;

/// Appended to a cut message so a reader knows there was more.
const CUT: &str = " …(truncated)";

/// `text` cut to at most `limit` bytes on a character boundary, marked when it was cut.
pub fn truncate(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let marker = if limit > CUT.len() * 2 { CUT } else { "" };
    let mut end = limit - marker.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{marker}", &text[..end])
}

#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    pub fn new(client: kube::Client, instance: String) -> Self {
        let reporter = Reporter {
            controller: "karpenter-capi".into(),
            instance: Some(instance),
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    pub fn normal(&self, object: ObjectReference, reason: &str, note: String) {
        self.publish(object, EventType::Normal, reason, note);
    }

    pub fn warning(&self, object: ObjectReference, reason: &str, note: String) {
        self.publish(object, EventType::Warning, reason, note);
    }

    fn publish(&self, object: ObjectReference, type_: EventType, reason: &str, note: String) {
        let recorder = self.recorder.clone();
        let reason = truncate(reason, REASON_LIMIT);
        let ev = Event {
            type_,
            action: reason.clone(),
            reason,
            note: Some(truncate(&note, NOTE_LIMIT)),
            secondary: None,
        };
        actix::spawn(async move {
            if let Err(e) = recorder.publish(&ev, &object).await {
                tracing::debug!(error = %e, object = ?object.name, reason = %ev.reason, "could not publish event");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_keeps_short_text_and_cuts_long_text_on_a_char_boundary() {
        assert_eq!(truncate("short", NOTE_LIMIT), "short");
        let exact = "x".repeat(NOTE_LIMIT);
        assert_eq!(truncate(&exact, NOTE_LIMIT), exact);
        let long = format!("field spec.x: value {}", "é".repeat(10_000));
        let cut = truncate(&long, NOTE_LIMIT);
        assert!(cut.len() <= NOTE_LIMIT, "{}", cut.len());
        assert!(cut.starts_with("field spec.x: value é"));
        assert!(cut.ends_with("(truncated)"));
        assert!(truncate(&"r".repeat(500), REASON_LIMIT).len() <= REASON_LIMIT);
    }
}
