//! Decoding one watched pod as a real API server serves it (managedFields from three
//! managers, a projected token volume and its mount, environment, probes, the kubelet's
//! statuses): the pod watch's decode (`state::pods::WatchedPod`, which skips what the index
//! drops while parsing) against a whole k8s-openapi `Pod` decoded then trimmed. Both give the
//! same trimmed pod (checked before timing). Compare the two as a ratio in one run. Then the
//! index's share of a change: the same pod applied again to the pod index that holds it.
//!
//! Then one NodeClaim as kube-apiserver serves a launched claim (managedFields from three
//! managers, labels, annotations, status with its conditions): the watches' `Lenient` decode
//! (one pass from the text, managedFields skipped) against what it did before, a whole
//! `serde_json::Value` with managedFields removed, then the typed decode from it through
//! `serde_path_to_error`. Both give the same claim (checked before timing).
//!
//! Then one Node as kube-apiserver serves a kubelet's (managedFields from the kubelet, the
//! node-lifecycle controller and kube-controller-manager, thirty images with digests, node
//! info, addresses, conditions with heartbeats): the Node watch's decode
//! (`state::nodes::WatchedNode`, which skips what the index drops while parsing) against a
//! whole k8s-openapi `Node` decoded then trimmed. Both give the same trimmed Node (checked
//! before timing).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

use karpenter_capi::api::NodeClaim;
use karpenter_capi::api::decode::{self, Lenient};
use karpenter_capi::testing;

/// One container as a Deployment's pod carries it once the API server has defaulted it.
fn container(name: &str) -> serde_json::Value {
    let env: Vec<_> = (0..12)
        .map(|i| json!({"name": format!("SETTING_{i}"), "value": format!("value-{i}")}))
        .collect();
    json!({
        "name": name, "image": "registry.example.com/team/app:1.42.7",
        "command": ["/app"], "args": ["--port=8080", "--log-level=info"],
        "env": env,
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                      "limits": {"memory": "512Mi"}},
        "volumeMounts": [{"name": "kube-api-access-7x2kq", "readOnly": true,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
            "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"},
            "timeoutSeconds": 1, "periodSeconds": 5, "successThreshold": 1, "failureThreshold": 3},
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true}
    })
}

/// A managedFields entry of `manager` with a `fieldsV1` tree of `width` fields.
fn managed(manager: &str, width: usize) -> serde_json::Value {
    let fields: serde_json::Map<_, _> = (0..width)
        .map(|i| (format!("f:field{i}"), json!({".": {}, "f:value": {}})))
        .collect();
    json!({"manager": manager, "operation": "Update", "apiVersion": "v1",
           "time": "2026-12-01T00:00:00Z", "fieldsType": "FieldsV1",
           "fieldsV1": {"f:metadata": fields}})
}

fn served_pod() -> Vec<u8> {
    let statuses: Vec<_> = ["app", "proxy"]
        .iter()
        .map(|c| {
            json!({"name": c, "image": "registry.example.com/team/app:1.42.7",
            "imageID": "registry.example.com/team/app@sha256:0123456789abcdef0123456789abcdef",
            "containerID": "containerd://0123456789abcdef0123456789abcdef0123456789abcdef",
            "ready": true, "started": true, "restartCount": 0,
            "state": {"running": {"startedAt": "2026-12-01T00:00:05Z"}}})
        })
        .collect();
    let conditions: Vec<_> = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ]
    .iter()
    .map(|t| {
        json!({"type": t, "status": "True", "lastProbeTime": null,
                        "lastTransitionTime": "2026-12-01T00:00:05Z"})
    })
    .collect();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "web-7d9f8b6c5d-x2kq7", "generateName": "web-7d9f8b6c5d-",
            "namespace": "shop", "uid": "5f0c1e2a-9b8d-4c7e-a6f5-0e1d2c3b4a59",
            "resourceVersion": "1234567", "creationTimestamp": "2026-12-01T00:00:00Z",
            "labels": {"app": "web", "pod-template-hash": "7d9f8b6c5d", "tier": "frontend"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-30T12:00:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "web-7d9f8b6c5d", "uid": "0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d",
                "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [managed("kube-controller-manager", 24), managed("kubelet", 30),
                              managed("kube-scheduler", 4)]
        },
        "spec": {
            "containers": [container("app"), container("proxy")],
            "volumes": [{"name": "kube-api-access-7x2kq", "projected": {"defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
            "serviceAccount": "default", "nodeName": "node-17", "securityContext": {},
            "schedulerName": "default-scheduler", "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority", "priority": 0,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300}]
        },
        "status": {
            "phase": "Running", "conditions": conditions, "containerStatuses": statuses,
            "hostIP": "10.0.3.17", "hostIPs": [{"ip": "10.0.3.17"}],
            "podIP": "192.168.17.42", "podIPs": [{"ip": "192.168.17.42"}],
            "startTime": "2026-12-01T00:00:01Z", "qosClass": "Burstable"
        }
    });
    serde_json::to_vec(&pod).unwrap_or_default()
}

/// A launched NodeClaim as kube-apiserver serves it to a watch.
fn served_claim() -> String {
    let conditions: Vec<_> = [
        "Launched",
        "Registered",
        "Initialized",
        "Ready",
        "Consolidatable",
        "Drifted",
    ]
    .iter()
    .map(|t| {
        let status = if *t == "Drifted" { "False" } else { "True" };
        json!({"type": t, "status": status, "reason": t, "message": "",
               "observedGeneration": 1, "lastTransitionTime": "2026-12-01T00:01:00Z"})
    })
    .collect();
    let claim = json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {
            "name": "general-x7k2p", "generateName": "general-",
            "uid": "0b7e4f5a-2c1d-4e8f-9a6b-3c2d1e0f9a8b", "resourceVersion": "2345678",
            "generation": 1, "creationTimestamp": "2026-12-01T00:00:00Z",
            "labels": {"karpenter.sh/nodepool": "general", "karpenter.sh/capacity-type": "on-demand",
                "node.kubernetes.io/instance-type": "m5.2xlarge", "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux", "topology.kubernetes.io/zone": "zone-b",
                "karpenter.sh/initialized": "true", "karpenter.sh/registered": "true"},
            "annotations": {"karpenter.sh/nodepool-hash": "6821555240594823858",
                "karpenter.sh/nodepool-hash-version": "v3",
                "karpenter.k8s.capi/nodeclass-hash": "1234567890123456789",
                "karpenter.k8s.capi/machine": "capi-system/general-x7k2p"},
            "finalizers": ["karpenter.sh/termination"],
            "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                "name": "general", "uid": "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d",
                "blockOwnerDeletion": true}],
            "managedFields": [managed("karpenter-capi", 20), managed("karpenter-capi-status", 16),
                              managed("kube-controller-manager", 3)]
        },
        "spec": {
            "nodeClassRef": {"group": "infrastructure.cluster.x-k8s.io",
                "kind": "ClusterAPINodeClass", "name": "default"},
            "requirements": [
                {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["general"]},
                {"key": "node.kubernetes.io/instance-type", "operator": "In",
                 "values": ["m5.2xlarge", "m5.4xlarge", "c5.2xlarge"]},
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-b"]}],
            "resources": {"requests": {"cpu": "3500m", "memory": "12Gi", "pods": "14"}},
            "expireAfter": "720h", "terminationGracePeriod": "48h"
        },
        "status": {
            "providerID": "capi://capi-system/general-x7k2p", "nodeName": "general-x7k2p",
            "imageID": "ubuntu-2404-kube-v1.33.1",
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"},
            "allocatable": {"cpu": "7910m", "memory": "31Gi", "pods": "110",
                            "ephemeral-storage": "95Gi"},
            "conditions": conditions,
            "lastPodEventTime": "2026-12-01T00:02:00Z"
        }
    });
    claim.to_string()
}

/// A kubelet's Node as kube-apiserver serves it to a watch.
fn served_node() -> Vec<u8> {
    let images: Vec<_> = (0..30)
        .map(|i| {
            let repo = format!("registry.example.com/platform/service-{i}");
            json!({"names": [format!("{repo}@sha256:{i:02}{}", "0123456789abcdef".repeat(4)),
                             format!("{repo}:v1.{i}.3")],
                   "sizeBytes": 25_000_000 + i * 1_000_003})
        })
        .collect();
    let conditions: Vec<_> = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ]
    .iter()
    .map(|(t, status, reason)| {
        json!({"type": t, "status": status, "reason": reason,
               "message": format!("kubelet reports {reason}"),
               "lastHeartbeatTime": "2026-12-01T00:05:00Z",
               "lastTransitionTime": "2026-12-01T00:01:00Z"})
    })
    .collect();
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": "general-x7k2p", "uid": "3c2d1e0f-9a8b-4c7e-a6f5-0e1d2c3b4a59",
            "resourceVersion": "3456789", "creationTimestamp": "2026-12-01T00:00:30Z",
            "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": "general-x7k2p",
                "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m5.2xlarge",
                "topology.kubernetes.io/region": "region-1",
                "topology.kubernetes.io/zone": "zone-b", "karpenter.sh/nodepool": "general",
                "karpenter.sh/capacity-type": "on-demand", "karpenter.sh/registered": "true",
                "karpenter.sh/initialized": "true"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": "{\"ebs.csi.aws.com\":\"i-0123456789abcdef0\"}",
                "karpenter.sh/nodepool-hash": "6821555240594823858",
                "karpenter.sh/nodepool-hash-version": "v3"},
            "finalizers": ["karpenter.sh/termination"],
            "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                "name": "general-x7k2p", "uid": "0b7e4f5a-2c1d-4e8f-9a6b-3c2d1e0f9a8b",
                "blockOwnerDeletion": true}],
            "managedFields": [managed("kubelet", 60), managed("node-lifecycle-controller", 6),
                              managed("kube-controller-manager", 8)]
        },
        "spec": {"providerID": "capi://capi-system/general-x7k2p",
                 "podCIDR": "192.168.17.0/24", "podCIDRs": ["192.168.17.0/24"]},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110",
                         "ephemeral-storage": "100Gi", "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "allocatable": {"cpu": "7910m", "memory": "31Gi", "pods": "110",
                            "ephemeral-storage": "95Gi", "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "10.0.3.17"},
                          {"type": "InternalDNS", "address": "ip-10-0-3-17.region-1.internal"},
                          {"type": "Hostname", "address": "general-x7k2p"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "ec2a0123456789abcdef0123456789ab",
                "systemUUID": "ec2a0123-4567-89ab-cdef-0123456789ab",
                "bootID": "0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d",
                "kernelVersion": "6.8.0-1021-aws", "osImage": "Ubuntu 24.04.1 LTS",
                "containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": "v1.33.1",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
            "runtimeHandlers": [{"name": "runc", "features": {"recursiveReadOnlyMounts": true,
                                                              "userNamespaces": true}},
                                {"name": "", "features": {"recursiveReadOnlyMounts": true,
                                                          "userNamespaces": true}}],
            "features": {"supplementalGroupsPolicy": true}
        }
    });
    serde_json::to_vec(&node).unwrap_or_default()
}

/// A watch's decode of one served object (and its index's trim).
type Decode<T> = fn(&[u8]) -> serde_json::Result<T>;

/// The watch's decode of `body` against the whole object's then trimmed, in the group `what`,
/// after checking both keep the same object; that object.
fn watched_against_whole<T: PartialEq + std::fmt::Debug>(
    c: &mut Criterion,
    what: &str,
    body: &[u8],
    watched: (&str, Decode<T>),
    whole: Decode<T>,
) -> Option<T> {
    let kept = watched.1(body).ok();
    assert!(kept.is_some(), "the served object decodes");
    assert_eq!(kept, whole(body).ok(), "both keep the same object");
    let mut g = c.benchmark_group(format!("decode one served {what}"));
    g.bench_function(watched.0, |b| b.iter(|| watched.1(black_box(body))));
    g.bench_function("whole, then trimmed", |b| b.iter(|| whole(black_box(body))));
    g.finish();
    kept
}

fn bench_node(c: &mut Criterion) {
    let body = served_node();
    let watched = ("as the Node watch does", testing::watched_node as Decode<_>);
    watched_against_whole(c, "Node", &body, watched, testing::whole_node);
}

/// What the NodeClaim watch did before it decoded in one pass.
fn claim_in_two_passes(body: &str) -> Option<NodeClaim> {
    let mut value: serde_json::Value = serde_json::from_str(body).ok()?;
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.remove("managedFields");
    }
    decode::decode::<NodeClaim>(&value).ok()
}

fn claim_as_the_watch_does(body: &str) -> Option<NodeClaim> {
    serde_json::from_str::<Lenient<NodeClaim>>(body).ok()?.ok()
}

fn bench_claim(c: &mut Criterion) {
    let body = served_claim();
    let watched = claim_as_the_watch_does(&body);
    assert!(watched.is_some(), "the served claim decodes");
    assert_eq!(
        watched,
        claim_in_two_passes(&body),
        "both keep the same claim"
    );
    let mut g = c.benchmark_group("decode one served NodeClaim");
    g.bench_function("in one pass, as the watch does", |b| {
        b.iter(|| claim_as_the_watch_does(black_box(&body)))
    });
    g.bench_function("a Value, then the claim from it", |b| {
        b.iter(|| claim_in_two_passes(black_box(&body)))
    });
    g.finish();
}

fn bench(c: &mut Criterion) {
    let body = served_pod();
    let watched = ("as the pod watch does", testing::watched_pod as Decode<_>);
    let watched = watched_against_whole(c, "pod", &body, watched, testing::whole_pod);

    // A change of a bound pod the index already holds: the old entry forgotten, the new one
    // packed against its ReplicaSet's prototype (the first pod indexed).
    let pod = watched.unwrap_or_default();
    let mut index = testing::PodIndex::default();
    index.apply(pod.clone());
    let mut changed = pod.clone();
    changed.metadata.resource_version = Some("1234568".into());
    c.bench_function("index one change of a bound pod", |b| {
        b.iter(|| index.apply(black_box(changed.clone())))
    });
}

criterion_group!(benches, bench, bench_claim, bench_node);
criterion_main!(benches);
