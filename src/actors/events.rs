//! Kubernetes Events for what an operator must see: why a claim was deleted, why a pod cannot be
//! placed, why a NodeClass is not ready. Publishing is best effort: an Event that fails to write
//! is logged, never retried in a loop, and never blocks the actor that emits it.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

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
        let ev = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: reason.to_string(),
            secondary: None,
        };
        actix::spawn(async move {
            if let Err(e) = recorder.publish(&ev, &object).await {
                tracing::debug!(error = %e, object = ?object.name, reason = %ev.reason, "could not publish event");
            }
        });
    }
}
