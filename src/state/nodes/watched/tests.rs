use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{ObjectList, WatchEvent};
use serde_json::json;

use super::*;
use crate::state::Nodes;
use crate::state::trim;
use crate::state::watched::{assert_names_fields_of, fields_of};

/// A Node as a kubelet's shows on a real API server, carrying every field of its metadata,
/// spec, status and conditions (`carries_every_field` checks it), so a field the watch skips
/// and the trim keeps, or the other way round, shows.
fn served() -> serde_json::Value {
    let condition = |type_: &str, status: &str| {
        json!({"type": type_, "status": status, "reason": format!("Kubelet{type_}"),
               "message": "kubelet is posting ready status",
               "lastHeartbeatTime": "2026-12-01T00:05:00Z",
               "lastTransitionTime": "2026-12-01T00:01:00Z"})
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": "n1", "generateName": "n", "namespace": "", "uid": "u1",
            "resourceVersion": "42", "generation": 1, "selfLink": "",
            "creationTimestamp": "2026-12-01T00:00:00Z",
            "deletionTimestamp": "2026-12-01T01:00:00Z", "deletionGracePeriodSeconds": 0,
            "labels": {"karpenter.sh/nodepool": "p", "kubernetes.io/hostname": "n1"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                                 "name": "c", "uid": "o"}],
            "finalizers": ["karpenter.sh/termination"],
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                "time": "2026-12-01T00:05:00Z", "fieldsType": "FieldsV1", "subresource": "status",
                "fieldsV1": {"f:status": {"f:images": {}, "f:nodeInfo": {"f:bootID": {}}}}}]
        },
        "spec": {
            "providerID": "capi://ns/n1", "podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"],
            "externalID": "n1", "unschedulable": true,
            "configSource": {"configMap": {"name": "kubelet", "namespace": "kube-system",
                                           "kubeletConfigKey": "kubelet"}},
            "taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]
        },
        "status": {
            "phase": "Running",
            "allocatable": {"cpu": "3920m", "memory": "15Gi", "pods": "110"},
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "conditions": [condition("MemoryPressure", "False"), condition("Ready", "True"),
                           condition("KernelDeadlock", "False")],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                          {"type": "Hostname", "address": "n1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "c",
                         "kernelVersion": "k", "kubeProxyVersion": "", "kubeletVersion": "v1.33.1",
                         "machineID": "m", "operatingSystem": "linux", "osImage": "o",
                         "systemUUID": "s", "swap": {"capacity": 0}},
            "images": [{"names": ["registry.k8s.io/pause@sha256:0123", "registry.k8s.io/pause:3.10"],
                        "sizeBytes": 320368}],
            "volumesInUse": ["kubernetes.io/csi/ebs^vol-1"],
            "volumesAttached": [{"name": "kubernetes.io/csi/ebs^vol-1", "devicePath": ""}],
            "config": {"active": {"configMap": {"name": "kubelet", "namespace": "kube-system",
                                                "kubeletConfigKey": "kubelet"}}},
            "features": {"supplementalGroupsPolicy": true},
            "runtimeHandlers": [{"name": "runc", "features": {"recursiveReadOnlyMounts": true,
                                                              "userNamespaces": true}}]
        }
    })
}

fn watched(v: serde_json::Value) -> Node {
    serde_json::from_value::<WatchedNode>(v)
        .expect("the served Node decodes")
        .into_inner()
}

/// The served Node carries every field the trim or the watch could disagree on.
#[test]
fn carries_every_field() {
    let v = served();
    for (part, fields) in [
        (&v["metadata"], fields_of::<ObjectMeta>()),
        (&v["spec"], fields_of::<NodeSpec>()),
        (&v["status"], fields_of::<NodeStatus>()),
        (&v["status"]["conditions"][0], fields_of::<NodeCondition>()),
    ] {
        assert!(!fields.is_empty());
        for f in fields {
            assert!(part.get(f).is_some(), "the served Node lacks {f}");
        }
    }
}

/// The watch's decode alone gives what the whole Node gives once `trim::node_body` cut it: the
/// rules above and the trim skip and drop the same fields, no more, no fewer.
#[test]
fn decodes_to_the_node_the_trim_keeps() {
    let mut whole: Node = serde_json::from_value(served()).unwrap();
    let status = whole.status.as_ref().unwrap();
    assert!(whole.metadata.managed_fields.is_some() && status.images.is_some());
    trim::node_body(&mut whole);
    let node = watched(served());
    assert_eq!(node, whole);
    // And so through the watch's own trim, whatever conditions it keeps.
    let kept = ["KernelDeadlock".to_string()];
    let mut whole: Node = serde_json::from_value(served()).unwrap();
    trim::node_keeping(&mut whole, &kept);
    let mut node = watched(served());
    trim::node_keeping(&mut node, &kept);
    assert_eq!(node, whole);
    let types: Vec<_> = (node
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten()))
    .map(|c| &*c.type_)
    .collect();
    assert_eq!(types, ["Ready", "KernelDeadlock"]);
}

#[test]
fn a_node_with_what_the_index_drops_is_indexed_as_before() {
    let mut before = Nodes::default();
    before.apply(serde_json::from_value(served()).unwrap());
    let mut after = Nodes::default();
    after.apply(watched(served()));
    assert_eq!(after.get("n1"), before.get("n1"));
    let kept = after.compact_by_provider_id("capi://ns/n1").unwrap();
    assert!(kept.ready() && kept.unschedulable() && kept.deleting());
    assert_eq!(
        kept.allocatable(),
        before.compact("n1").unwrap().allocatable()
    );
    assert!(!kept.allocatable().is_empty());
}

/// What kube decodes: a list page and a watch event of the watched type.
#[test]
fn lists_and_watch_events_decode_as_the_watcher_reads_them() {
    let list = json!({"apiVersion": "v1", "kind": "NodeList",
        "metadata": {"resourceVersion": "43"}, "items": [served()]});
    let list: ObjectList<WatchedNode> = serde_json::from_value(list).unwrap();
    assert_eq!(list.metadata.resource_version.as_deref(), Some("43"));
    assert!(list.items[0].0.metadata.managed_fields.is_none());
    let ev = json!({"type": "MODIFIED", "object": served()});
    let ev: WatchEvent<WatchedNode> = serde_json::from_value(ev).unwrap();
    assert!(
        matches!(ev, WatchEvent::Modified(n) if n.0.metadata.resource_version.as_deref() == Some("42"))
    );
}

/// The error of decoding `served()` with `part`'s `field` set to `value`.
fn error_with(part: &str, field: &str, value: serde_json::Value) -> String {
    let mut v = served();
    v[part][field] = value;
    serde_json::from_value::<WatchedNode>(v)
        .unwrap_err()
        .to_string()
}

/// What is kept fails as in a whole Node, naming the Node and the part; a kept condition too.
#[test]
fn a_malformed_field_is_an_error_naming_the_node() {
    let e = error_with("spec", "taints", json!("not a list"));
    assert!(e.contains("Node n1: spec: "), "{e}");
    let e = error_with("status", "allocatable", json!(5));
    assert!(e.contains("Node n1: status: "), "{e}");
    let bad = json!([{"type": "Ready", "status": "True", "lastTransitionTime": "yesterday"}]);
    let e = error_with("status", "conditions", bad);
    assert!(e.contains("Node n1: status: "), "{e}");
    let e = error_with("metadata", "labels", json!(5));
    assert!(e.contains("metadata: "), "{e}");
}

/// A misspelt name in a rule would silently read (or skip) nothing: every name is the type's.
#[test]
fn every_name_a_rule_gives_is_a_field_of_its_type() {
    assert_names_fields_of::<NodeStatus>(&STATUS);
    assert_names_fields_of::<NodeCondition>(&CONDITION);
}
