use kube::core::{ObjectList, WatchEvent};
use serde_json::json;

use super::*;
use crate::state::pods::Pods;

/// A pod as a real API server sends it: managedFields with a `fieldsV1` tree, a token volume,
/// container statuses.
fn served() -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "42",
            "generateName": "p-", "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "a"}, "annotations": {"karpenter.sh/do-not-disrupt": "true"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r",
                                 "uid": "o", "controller": true}],
            "finalizers": ["f"],
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                "time": "2026-01-01T00:00:01Z", "fieldsType": "FieldsV1", "subresource": "status",
                "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {},
                    "f:status": {}}}, "f:phase": {}}}}],
            "someFutureField": {"x": [1, 2, 3]}
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "image": "nginx", "env": [{"name": "A", "value": "b"}],
                "resources": {"requests": {"cpu": "500m", "memory": "64Mi"}},
                "ports": [{"containerPort": 80, "hostPort": 8080}]}],
            "volumes": [{"name": "kube-api-access-x", "projected": {"sources": []}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]
        },
        "status": {
            "phase": "Running", "startTime": "2026-01-01T00:00:02Z", "podIP": "10.0.0.1",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:03Z"},
                {"type": "Initialized", "status": "True"}],
            "containerStatuses": [{"name": "c", "image": "nginx", "imageID": "i", "ready": true,
                "restartCount": 0, "state": {"running": {"startedAt": "2026-01-01T00:00:03Z"}}}]
        }
    })
}

#[test]
fn decodes_to_the_pod_without_managed_fields() {
    let body = serde_json::to_vec(&served()).unwrap();
    let watched: WatchedPod = serde_json::from_slice(&body).unwrap();
    let mut whole: Pod = serde_json::from_slice(&body).unwrap();
    assert!(whole.metadata.managed_fields.is_some());
    whole.metadata.managed_fields = None;
    assert_eq!(watched.into_pod(), whole);
}

#[test]
fn a_pod_with_managed_fields_is_indexed_as_before() {
    let body = serde_json::to_vec(&served()).unwrap();
    let mut before = Pods::default();
    before.apply(serde_json::from_slice::<Pod>(&body).unwrap());
    let mut after = Pods::default();
    after.apply(
        serde_json::from_slice::<WatchedPod>(&body)
            .unwrap()
            .into_pod(),
    );
    let kept = after.get("ns/p").unwrap();
    assert_eq!(kept, before.get("ns/p").unwrap());
    assert_eq!(after.requested_on("n1"), before.requested_on("n1"));
    assert_eq!(after.bound_with_host_ports().len(), 1);
}

/// What kube decodes: a list page and a watch event of the watched type.
#[test]
fn lists_and_watch_events_decode_as_the_watcher_reads_them() {
    let list = json!({"apiVersion": "v1", "kind": "PodList",
        "metadata": {"resourceVersion": "43", "continue": "c"}, "items": [served()]});
    let list: ObjectList<WatchedPod> = serde_json::from_value(list).unwrap();
    assert_eq!(list.metadata.resource_version.as_deref(), Some("43"));
    assert_eq!(list.items[0].0.metadata.name.as_deref(), Some("p"));
    assert!(list.items[0].0.metadata.managed_fields.is_none());
    let ev = json!({"type": "MODIFIED", "object": served()});
    let ev: WatchEvent<WatchedPod> = serde_json::from_value(ev).unwrap();
    assert!(
        matches!(ev, WatchEvent::Modified(p) if p.0.metadata.resource_version.as_deref() == Some("42"))
    );
    let bookmark = json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
        "metadata": {"resourceVersion": "44", "annotations": {"k8s.io/initial-events-end": "true"}}}});
    let bookmark: WatchEvent<WatchedPod> = serde_json::from_value(bookmark).unwrap();
    assert!(matches!(bookmark, WatchEvent::Bookmark(b) if b.metadata.resource_version == "44"));
}

/// The error of decoding `served()` with `part`'s `field` set to `value`.
fn error_with(part: &str, field: &str, value: serde_json::Value) -> String {
    let mut v = served();
    v[part][field] = value;
    serde_json::from_value::<WatchedPod>(v)
        .unwrap_err()
        .to_string()
}

#[test]
fn a_malformed_field_is_an_error_naming_the_pod() {
    let e = error_with("spec", "containers", json!("not a list"));
    assert!(e.contains("pod ns/p: spec: "), "{e}");
    let e = error_with("status", "startTime", json!("yesterday"));
    assert!(e.contains("pod ns/p: status: "), "{e}");
    let e = error_with("metadata", "labels", json!(5));
    assert!(e.contains("metadata: "), "{e}");
    assert!(serde_json::from_value::<WatchedPod>(json!([1])).is_err());
}
