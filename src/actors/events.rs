//! Kubernetes Events for what an operator must see: why a claim was deleted, why a pod cannot be
//! placed, why a NodeClass is not ready. Publishing is best effort: an Event that fails to write
//! is logged, never retried in a loop, and never blocks the actor that emits it.
//!
//! kube's `Recorder` writes events.k8s.io/v1 Events, whose `note` the API server refuses above
//! 1 KiB (bytes) and whose `reason` and `action` above 128 bytes. Messages quote user input (a
//! 10,000-character label value), so every field is cut to its limit here, on a character
//! boundary, with a marker saying it was cut; otherwise the object would get no Event at all.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

/// events.k8s.io/v1 `note` limit (kube-apiserver `NoteLengthLimit`), in bytes.
pub(crate) const NOTE_LIMIT: usize = 1024;
/// events.k8s.io/v1 `reason` and `action` limit, in bytes.
pub(crate) const REASON_LIMIT: usize = 128;

/// Appended to a cut message so a reader knows there was more.
const CUT: &str = " …(truncated)";

/// `text` cut to at most `limit` bytes on a character boundary, marked when it was cut.
pub(crate) fn truncate(text: &str, limit: usize) -> String {
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

/// Publishes events.k8s.io/v1 Events. Not kube's `Recorder`: it folds every Event with the same
/// object, type and reason into one series and keeps the first note, so a second, different
/// reason ("now the limit is reached" after "no instance type fits") would never be seen.
/// A repeat of the same Event (object, type, reason and note) within `REPEAT_WINDOW` writes
/// nothing: retry loops (a drain blocked by a PodDisruptionBudget, a reconcile that keeps timing
/// out) would otherwise create one Event per attempt, as client-go avoids with its series.
#[derive(Clone)]
pub(crate) struct Events {
    client: kube::Client,
    /// With `--karpenter-objects management`: the management cluster's client and the Cluster's
    /// namespace, where the Events about Karpenter's objects go (they live there).
    karpenter: Option<(kube::Client, String)>,
    instance: String,
    recent: std::sync::Arc<parking_lot::Mutex<Recent>>,
}

/// How long an identical Event is not written again.
const REPEAT_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);
/// At most this many distinct Events remembered (the oldest are forgotten first).
const RECENT_LIMIT: usize = 10_000;

#[derive(Default)]
struct Recent {
    seen: std::collections::HashMap<String, std::time::Instant>,
}

impl Recent {
    /// True when `key` was published within the window; records it otherwise.
    fn repeat(&mut self, key: String, now: std::time::Instant) -> bool {
        if self
            .seen
            .get(&key)
            .is_some_and(|at| now.duration_since(*at) < REPEAT_WINDOW)
        {
            return true;
        }
        if self.seen.len() >= RECENT_LIMIT {
            self.seen
                .retain(|_, at| now.duration_since(*at) < REPEAT_WINDOW);
            if self.seen.len() >= RECENT_LIMIT
                && let Some(oldest) = self
                    .seen
                    .iter()
                    .min_by_key(|(_, at)| **at)
                    .map(|(k, _)| k.clone())
            {
                self.seen.remove(&oldest);
            }
        }
        self.seen.insert(key, now);
        false
    }
}

/// The controller name Events carry (`reportingController`).
const CONTROLLER: &str = "karpenter-capi";

impl Events {
    pub(crate) fn new(client: kube::Client, instance: String) -> Self {
        Self {
            client,
            karpenter: None,
            instance,
            recent: Default::default(),
        }
    }

    /// Events about Karpenter's objects go to `client`, in the Cluster's namespace, when they
    /// live in the management cluster (`binding`); those about Nodes and Pods stay.
    pub(crate) fn with_karpenter(
        mut self,
        client: kube::Client,
        binding: Option<&crate::view::binding::Binding>,
    ) -> Self {
        self.karpenter = binding.map(|b| (client, b.namespace.clone()));
        self
    }

    /// The client and namespace of an Event about `object`: where the object lives.
    fn target(&self, object: &ObjectReference) -> (kube::Client, String) {
        let group = (object.api_version.as_deref().unwrap_or_default())
            .split_once('/')
            .map(|(g, _)| g)
            .unwrap_or_default();
        if let Some((client, namespace)) = &self.karpenter
            && crate::view::binding::is_karpenter_group(group)
        {
            return (client.clone(), namespace.clone());
        }
        // Cluster-scoped objects (NodePools, NodeClasses) get their Events in "default", as
        // kubectl and client-go do.
        let namespace = (object.namespace.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_string());
        (self.client.clone(), namespace)
    }

    pub(crate) fn normal(&self, object: ObjectReference, reason: &str, note: String) {
        self.publish(object, "Normal", reason, note);
    }

    pub(crate) fn warning(&self, object: ObjectReference, reason: &str, note: String) {
        self.publish(object, "Warning", reason, note);
    }

    fn publish(&self, object: ObjectReference, type_: &str, reason: &str, note: String) {
        let key = format!(
            "{}/{}/{}/{}\0{type_}\0{reason}\0{note}",
            object.kind.as_deref().unwrap_or_default(),
            object.namespace.as_deref().unwrap_or_default(),
            object.name.as_deref().unwrap_or_default(),
            object.uid.as_deref().unwrap_or_default(),
        );
        if self.recent.lock().repeat(key, std::time::Instant::now()) {
            return;
        }
        let now = jiff::Timestamp::now();
        let reason = truncate(reason, REASON_LIMIT);
        let (client, namespace) = self.target(&object);
        // `<object>.<nanoseconds, hex>` like client-go; the object part is cut so the name stays
        // within the 253 characters of a DNS subdomain.
        let base: String = object
            .name
            .as_deref()
            .unwrap_or(CONTROLLER)
            .chars()
            .take(200)
            .collect();
        let name = format!(
            "{}.{:x}",
            base.trim_end_matches(['.', '-']),
            now.as_nanosecond()
        );
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(type_.to_string()),
            action: Some(reason.clone()),
            reason: Some(reason),
            note: Some(truncate(&note, NOTE_LIMIT)),
            regarding: Some(object),
            reporting_controller: Some(CONTROLLER.to_string()),
            reporting_instance: Some(truncate(&self.instance, REASON_LIMIT)),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(client, &namespace);
        actix::spawn(async move {
            if let Err(e) = api.create(&PostParams::default(), &ev).await {
                tracing::debug!(error = %e, object = ?ev.regarding.as_ref().and_then(|r| r.name.as_deref()), reason = ?ev.reason, "could not publish event");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_within_the_window_are_suppressed() {
        let mut r = Recent::default();
        let t0 = std::time::Instant::now();
        assert!(!r.repeat("a".into(), t0));
        assert!(r.repeat("a".into(), t0 + std::time::Duration::from_secs(60)));
        assert!(!r.repeat("b".into(), t0));
        assert!(!r.repeat(
            "a".into(),
            t0 + REPEAT_WINDOW + std::time::Duration::from_secs(1)
        ));
        // Bounded: old entries go first.
        for i in 0..RECENT_LIMIT + 10 {
            r.repeat(format!("k{i}"), t0);
        }
        assert!(r.seen.len() <= RECENT_LIMIT);
    }

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
