//! Karpenter v1.14.1's CapacityBuffer suites (`pkg/controllers/capacitybuffer`) as far as they
//! are the buffer's arithmetic: chunks from `replicas`, `percentage` and `limits`, the pod a
//! chunk is, and the condition a missing reference gives. The whole-flow cases (provisioning,
//! refill, disruption) are in tests/provisioning/buffers.rs and tests/disruption/buffers.rs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

use karpenter_capi::actors::buffers::resolve::{self, NotReady, Source, percentage_of};
use karpenter_capi::api::capacity_buffer::{
    BUFFER_NAME_ANNOTATION, BUFFER_NAMESPACE_ANNOTATION, CapacityBuffer,
};

fn requests(r: &[(&str, &str)]) -> Option<ResourceRequirements> {
    Some(ResourceRequirements {
        requests: Some(
            r.iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        ),
        ..ResourceRequirements::default()
    })
}

fn container(r: &[(&str, &str)]) -> Container {
    Container {
        name: "c".into(),
        resources: if r.is_empty() { None } else { requests(r) },
        ..Container::default()
    }
}

fn pod(containers: &[&[(&str, &str)]], init: &[&[(&str, &str)]]) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers: containers.iter().map(|c| container(c)).collect(),
            init_containers: (!init.is_empty())
                .then(|| init.iter().map(|c| container(c)).collect()),
            ..PodSpec::default()
        }),
    }
}

fn buffer(spec: serde_json::Value) -> CapacityBuffer {
    serde_json::from_value(json!({
        "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
        "metadata": {"name": "cb", "namespace": "default"},
        "spec": spec,
    }))
    .expect("a CapacityBuffer")
}

/// Chunks of a podTemplateRef buffer with `spec`, one chunk being `template`.
fn chunks(spec: serde_json::Value, template: PodTemplateSpec) -> Result<i32, NotReady> {
    let mut spec = spec;
    spec["podTemplateRef"] = json!({"name": "pt"});
    resolve::resolve(
        &buffer(spec),
        Source {
            template,
            scalable_replicas: None,
            pod_template: Some(("pt".into(), 1)),
        },
    )
    .map(|r| r.replicas)
}

/// Chunks of a Deployment-backed buffer with `spec`, the Deployment at `replicas` (None: unset).
fn scalable_chunks(
    spec: serde_json::Value,
    replicas: Option<i32>,
    template: PodTemplateSpec,
) -> Result<i32, NotReady> {
    let mut spec = spec;
    spec["scalableRef"] = json!({"apiGroup": "apps", "kind": "Deployment", "name": "d"});
    resolve::resolve(
        &buffer(spec),
        Source {
            template,
            scalable_replicas: Some(replicas.unwrap_or(1)),
            pod_template: None,
        },
    )
    .map(|r| r.replicas)
}

fn limits_only(limits: &[(&str, &str)], template: PodTemplateSpec) -> Result<i32, NotReady> {
    let l: BTreeMap<&str, &str> = limits.iter().copied().collect();
    chunks(json!({"limits": l}), template)
}

fn cpu(q: &str) -> PodTemplateSpec {
    pod(&[&[("cpu", q)]], &[])
}

// ---- calculateLimitReplicas (helpers_test.go) ----

#[test]
fn limits_divide_the_cpu_request() {
    assert_eq!(limits_only(&[("cpu", "4")], cpu("1")), Ok(4));
}

#[test]
fn limits_divide_the_memory_request() {
    assert_eq!(
        limits_only(&[("memory", "2Gi")], pod(&[&[("memory", "512Mi")]], &[])),
        Ok(4)
    );
}

#[test]
fn limits_take_the_fewest_chunks_across_resources() {
    let t = pod(&[&[("cpu", "1"), ("memory", "1Gi")]], &[]);
    assert_eq!(limits_only(&[("cpu", "8"), ("memory", "4Gi")], t), Ok(4));
}

#[test]
fn limits_count_every_container() {
    let t = pod(&[&[("cpu", "500m")], &[("cpu", "500m")]], &[]);
    assert_eq!(limits_only(&[("cpu", "3")], t), Ok(3));
}

#[test]
fn limits_count_a_larger_init_container() {
    let t = pod(&[&[("cpu", "1")]], &[&[("cpu", "4")]]);
    assert_eq!(limits_only(&[("cpu", "8")], t), Ok(2));
}

#[test]
fn limits_count_the_containers_when_they_are_larger_than_init() {
    let t = pod(&[&[("cpu", "2")]], &[&[("cpu", "500m")]]);
    assert_eq!(limits_only(&[("cpu", "6")], t), Ok(3));
}

#[test]
fn limits_on_a_pod_without_requests_size_nothing() {
    let e = limits_only(&[("cpu", "4")], pod(&[&[]], &[])).unwrap_err();
    assert!(e.message.starts_with("spec.limits"), "{}", e.message);
}

#[test]
fn limits_on_resources_the_pod_does_not_request_size_nothing() {
    let e = limits_only(&[("memory", "4Gi")], cpu("1")).unwrap_err();
    assert!(e.message.starts_with("spec.limits"), "{}", e.message);
}

#[test]
fn limits_round_down() {
    assert_eq!(limits_only(&[("cpu", "10")], cpu("3")), Ok(3));
}

#[test]
fn limits_divide_millicores_exactly() {
    assert_eq!(limits_only(&[("cpu", "1")], cpu("250m")), Ok(4));
}

#[test]
fn a_limit_below_one_chunk_gives_none() {
    assert_eq!(limits_only(&[("cpu", "500m")], cpu("1")), Ok(0));
}

// ---- calculatePercentageReplicas (helpers_test.go) ----

#[test]
fn percentage_rounds_up_to_at_least_one_and_is_zero_for_nothing() {
    assert_eq!(percentage_of(10, 20), 2, "calculate percentage and ceil");
    assert_eq!(percentage_of(10, 15), 2, "ceil fractional results");
    assert_eq!(percentage_of(3, 10), 1, "at least 1");
    assert_eq!(
        percentage_of(0, 50),
        0,
        "0 when the scalable has 0 replicas"
    );
    assert_eq!(percentage_of(10, 0), 0, "0 when the percentage is 0");
    assert_eq!(percentage_of(7, 100), 7, "100 percent");
    assert_eq!(percentage_of(4, 250), 10, "above 100 percent");
    assert_eq!(
        percentage_of(1_000_000, 33),
        330_000,
        "large replica counts"
    );
}

// ---- Replica calculation (suite_test.go) ----

#[test]
fn fixed_replicas_only() {
    assert_eq!(chunks(json!({"replicas": 7}), cpu("1")), Ok(7));
}

#[test]
fn replicas_capped_by_a_binding_limit() {
    assert_eq!(
        chunks(json!({"replicas": 10, "limits": {"cpu": "3"}}), cpu("1")),
        Ok(3)
    );
}

#[test]
fn a_limit_that_does_not_bind_leaves_replicas() {
    assert_eq!(
        chunks(json!({"replicas": 3, "limits": {"cpu": "10"}}), cpu("1")),
        Ok(3)
    );
}

#[test]
fn limits_alone_size_the_buffer() {
    assert_eq!(chunks(json!({"limits": {"cpu": "5"}}), cpu("1")), Ok(5));
}

#[test]
fn percentage_only() {
    assert_eq!(
        scalable_chunks(json!({"percentage": 20}), Some(10), cpu("1")),
        Ok(2)
    );
}

/// The larger of `replicas` and `percentage`, as upstream Karpenter's `computeReplicas`, the
/// SIG Autoscaling API text and Cluster Autoscaler's core (since 2026-07) take it.
#[test]
fn replicas_and_percentage_take_the_larger() {
    let spec = json!({"replicas": 5, "percentage": 20});
    assert_eq!(scalable_chunks(spec, Some(10), cpu("1")), Ok(5));
    let spec = json!({"replicas": 5, "percentage": 80});
    assert_eq!(scalable_chunks(spec, Some(10), cpu("1")), Ok(8));
}

/// Upstream adds the percentage only while the workload has replicas.
#[test]
fn a_percentage_of_a_workload_at_zero_is_left_out() {
    let spec = json!({"replicas": 2, "percentage": 50});
    assert_eq!(scalable_chunks(spec, Some(0), cpu("1")), Ok(2));
    let spec = json!({"percentage": 50});
    assert_eq!(scalable_chunks(spec, Some(0), cpu("1")), Ok(0));
}

#[test]
fn replicas_and_percentage_capped_by_a_limit() {
    let spec = json!({"replicas": 5, "percentage": 80, "limits": {"cpu": "4"}});
    assert_eq!(scalable_chunks(spec, Some(10), cpu("1")), Ok(4));
}

#[test]
fn percentage_of_one_replica_rounds_up_to_one() {
    assert_eq!(
        scalable_chunks(json!({"percentage": 10}), Some(1), cpu("1")),
        Ok(1)
    );
}

#[test]
fn a_workload_without_replicas_counts_as_one() {
    assert_eq!(
        scalable_chunks(json!({"percentage": 100}), None, cpu("1")),
        Ok(1)
    );
}

// ---- buildVirtualPods (pkg/state/virtualpods/utilities_test.go) ----

#[test]
fn virtual_pods_are_marked_named_and_lowest_priority() {
    let cb = buffer(json!({"podTemplateRef": {"name": "pt"}, "replicas": 3}));
    let mut t = cpu("1");
    t.metadata = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        labels: Some([("app".to_string(), "web".to_string())].into()),
        ..Default::default()
    });
    let resolved = resolve::resolve(
        &cb,
        Source {
            template: t,
            scalable_replicas: None,
            pod_template: Some(("pt".into(), 4)),
        },
    )
    .expect("resolves");
    assert_eq!(resolved.pod_template_generation, Some(4));
    let pods = resolve::placeholder_pods(&cb, &resolved);
    let names: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(
        names,
        [
            "capacity-buffer-cb-1",
            "capacity-buffer-cb-2",
            "capacity-buffer-cb-3"
        ]
    );
    for p in &pods {
        assert!(karpenter_capi::api::capacity_buffer::is_placeholder(p));
        assert_eq!(
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .map(String::as_str),
            Some("web")
        );
        assert_eq!(p.spec.as_ref().and_then(|s| s.priority), Some(i32::MIN));
        // v1.15 (#3174): the template's labels are the pod's labels, and its buffer is named in
        // annotations, so no selector of the workload's pods is crossed by a label of ours.
        let annotations = p.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get(BUFFER_NAME_ANNOTATION).map(String::as_str),
            Some("cb")
        );
        assert!(annotations.contains_key(BUFFER_NAMESPACE_ANNOTATION));
        assert_eq!(p.metadata.labels.as_ref().map(BTreeMap::len), Some(1));
    }
}

#[test]
fn a_buffer_of_zero_replicas_has_no_virtual_pods() {
    let cb = buffer(json!({"podTemplateRef": {"name": "pt"}, "replicas": 0}));
    let resolved = resolve::resolve(
        &cb,
        Source {
            template: cpu("1"),
            scalable_replicas: None,
            pod_template: Some(("pt".into(), 1)),
        },
    )
    .expect("resolves");
    assert!(resolve::placeholder_pods(&cb, &resolved).is_empty());
}

// ---- sanitizeVirtualPodSpec (pkg/state/virtualpods/utilities_test.go) ----

/// A chunk's pod as JSON, resolved and turned into its one placeholder.
fn placeholder_of(spec: serde_json::Value) -> k8s_openapi::api::core::v1::PodSpec {
    let cb = buffer(json!({"podTemplateRef": {"name": "pt"}, "replicas": 1}));
    let template: PodTemplateSpec =
        serde_json::from_value(json!({"spec": spec})).expect("a pod template");
    let resolved = resolve::resolve(
        &cb,
        Source {
            template,
            scalable_replicas: None,
            pod_template: Some(("pt".into(), 1)),
        },
    )
    .expect("resolves");
    let mut pods = resolve::placeholder_pods(&cb, &resolved);
    pods.remove(0).spec.expect("a spec")
}

fn with_volumes(volumes: serde_json::Value) -> serde_json::Value {
    json!({
        "volumes": volumes,
        "containers": [{"name": "c", "image": "i", "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "config", "mountPath": "/config"},
        ]}],
    })
}

fn names(spec: &k8s_openapi::api::core::v1::PodSpec) -> (Vec<String>, Vec<String>) {
    let volumes = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    let mounts = spec.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.clone())
        .collect();
    (volumes, mounts)
}

#[test]
fn ephemeral_volumes_and_their_mounts_are_dropped() {
    let spec = placeholder_of(with_volumes(json!([
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
        {"name": "config", "configMap": {"name": "cm"}},
    ])));
    assert_eq!(
        names(&spec),
        (
            vec!["config".to_string()],
            vec!["data".to_string(), "config".to_string()]
        )
    );
}

#[test]
fn claim_and_ephemeral_volumes_are_dropped_together() {
    let spec = placeholder_of(with_volumes(json!([
        {"name": "data", "persistentVolumeClaim": {"claimName": "pvc"}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
        {"name": "config", "configMap": {"name": "cm"}},
    ])));
    assert_eq!(
        names(&spec),
        (vec!["config".to_string()], vec!["config".to_string()])
    );
}

#[test]
fn tolerations_node_selector_and_affinity_are_kept() {
    let spec = placeholder_of(json!({
        "containers": [{"name": "c", "image": "i"}],
        "nodeSelector": {"disk": "ssd"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}},
        ]}},
    }));
    assert_eq!(
        spec.node_selector
            .unwrap_or_default()
            .get("disk")
            .map(String::as_str),
        Some("ssd")
    );
    assert_eq!(
        spec.tolerations.unwrap_or_default()[0].key.as_deref(),
        Some("gpu")
    );
    assert!(spec.affinity.and_then(|a| a.pod_anti_affinity).is_some());
}
