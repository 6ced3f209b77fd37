use kube::core::{ObjectList, WatchEvent};
use serde_json::json;

use super::*;
use crate::state::pods::Pods;

/// A pod as a real API server sends it: managedFields with a `fieldsV1` tree, a token volume
/// and its mounts, probes, container statuses, and one of each field the index drops.
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
                "ports": [{"containerPort": 80, "hostPort": 8080}],
                "volumeMounts": [{"name": "kube-api-access-x", "readOnly": true,
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 5},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File", "imagePullPolicy": "Always"}],
            "initContainers": [{"name": "sidecar", "image": "envoy", "restartPolicy": "Always",
                "command": ["envoy", "-c", "/etc/envoy.yaml"],
                "resources": {"requests": {"cpu": "100m"}}}],
            "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
            "volumes": [{"name": "kube-api-access-x", "projected": {"defaultMode": 420, "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt",
                                "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
                        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "1Gi"}}}}}}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}],
            "securityContext": {"runAsUser": 1000}, "dnsPolicy": "ClusterFirst",
            "dnsConfig": {"nameservers": ["1.1.1.1"]},
            "hostAliases": [{"ip": "10.0.0.9", "hostnames": ["db"]}],
            "imagePullSecrets": [{"name": "registry"}],
            "readinessGates": [{"conditionType": "example.com/ready"}],
            "priority": 0, "schedulerName": "default-scheduler",
            "serviceAccountName": "default", "terminationGracePeriodSeconds": 30
        },
        "status": {
            "phase": "Running", "startTime": "2026-01-01T00:00:02Z", "podIP": "10.0.0.1",
            "hostIP": "192.168.0.4", "qosClass": "Burstable", "message": "m",
            "podIPs": [{"ip": "10.0.0.1"}], "hostIPs": [{"ip": "192.168.0.4"}],
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
fn decodes_to_the_pod_the_trim_keeps() {
    let body = serde_json::to_vec(&served()).unwrap();
    let watched: WatchedPod = serde_json::from_slice(&body).unwrap();
    let mut whole: Pod = serde_json::from_slice(&body).unwrap();
    assert!(whole.metadata.managed_fields.is_some());
    let mut watched = watched.into_inner();
    assert!(watched.metadata.managed_fields.is_none());
    crate::state::trim::pod(&mut watched);
    crate::state::trim::pod(&mut whole);
    assert_eq!(watched, whole);
    // What the solver and the terminator read survived.
    let spec = watched.spec.as_ref().unwrap();
    let volumes: Vec<_> = spec.volumes.iter().flatten().map(|v| &*v.name).collect();
    assert_eq!(volumes, ["data", "scratch"]);
    let sidecar = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.tolerations.as_ref().unwrap().len(), 1);
}

/// The fields skipped unread, as the watch decodes them: what the trim would have dropped.
#[test]
fn skips_what_the_trim_drops_while_parsing() {
    let watched: WatchedPod = serde_json::from_value(served()).unwrap();
    let pod = watched.into_inner();
    let spec = pod.spec.as_ref().unwrap();
    let c = &spec.containers[0];
    assert!(c.image.is_none() && c.env.is_none() && c.volume_mounts.is_none());
    assert!(c.readiness_probe.is_none() && c.termination_message_path.is_none());
    assert_eq!(c.ports.as_ref().unwrap()[0].host_port, Some(8080));
    let token = &spec.volumes.as_ref().unwrap()[0];
    assert!(
        token.projected.is_none(),
        "the token volume's sources are never built"
    );
    assert!(spec.ephemeral_containers.is_none() && spec.security_context.is_none());
    assert!(spec.dns_config.is_none() && spec.host_aliases.is_none());
    assert!(spec.image_pull_secrets.is_none() && spec.readiness_gates.is_none());
    let status = pod.status.as_ref().unwrap();
    assert!(status.container_statuses.is_none() && status.pod_ip.is_none());
    assert!(status.host_ips.is_none() && status.qos_class.is_none());
    assert_eq!(status.phase.as_deref(), Some("Running"));
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
            .into_inner(),
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
    assert!(e.contains("Pod ns/p: spec: "), "{e}");
    let e = error_with("status", "startTime", json!("yesterday"));
    assert!(e.contains("Pod ns/p: status: "), "{e}");
    let e = error_with("metadata", "labels", json!(5));
    assert!(e.contains("metadata: "), "{e}");
    assert!(serde_json::from_value::<WatchedPod>(json!([1])).is_err());
}

/// A misspelt name in a rule would silently read (or skip) nothing: every name is the type's.
#[test]
fn every_name_a_rule_gives_is_a_field_of_its_type() {
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus, Volume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use crate::state::watched::assert_names_fields_of;
    assert_names_fields_of::<PodSpec>(&slim::SPEC);
    assert_names_fields_of::<PodStatus>(&slim::STATUS);
    assert_names_fields_of::<Container>(&slim::CONTAINER);
    assert_names_fields_of::<Volume>(&slim::VOLUME);
    assert_names_fields_of::<ObjectMeta>(&crate::api::partial::METADATA);
}
