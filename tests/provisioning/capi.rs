//! The Cluster API model: both API versions read into one model, scale-from-zero annotations,
//! infrastructure template capacity, provider IDs, version discovery and patches.

use std::collections::BTreeMap;

use karpenter_capi::api::resources::{Quantity, Resources};
use karpenter_capi::api::wellknown::*;
use karpenter_capi::capi::annotations::{self, Gpu, Problem};
use karpenter_capi::capi::model::SelectorOperator;
use karpenter_capi::capi::provider_id::{ProviderId, normalize};
use karpenter_capi::capi::template::{TemplateCapacity, TemplateError, merge};
use karpenter_capi::capi::{
    CapiVersion, DeletionOrder, InfrastructureRef, Machine, MachineDeployment, MachinePhase,
    MachineSet, ModelError, Taint, TaintEffect, patch, version,
};
use serde_json::{Value, json};

fn fixture(path: &str) -> Value {
    let full = format!("{}/tests/fixtures/capi/{path}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&full).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn versioned(kind: &str, v: CapiVersion) -> Value {
    fixture(&format!("{v}/{kind}.json"))
}

fn q(s: &str) -> Quantity {
    s.parse().unwrap()
}

fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Sets `pointer` (a JSON Pointer) in `value`, creating nothing: the parent must exist.
fn set(value: &mut Value, pointer: &str, new: Value) {
    *value.pointer_mut(pointer).unwrap() = new;
}

fn remove(value: &mut Value, pointer: &str) {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    value
        .pointer_mut(parent)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove(key)
        .unwrap();
}

// ---- model: both versions ------------------------------------------------------------------

#[test]
fn machine_reads_the_same_from_both_versions() {
    let v1 = Machine::from_value(
        &versioned("machine", CapiVersion::V1Beta1),
        CapiVersion::V1Beta1,
    )
    .unwrap();
    let v2 = Machine::from_value(
        &versioned("machine", CapiVersion::V1Beta2),
        CapiVersion::V1Beta2,
    )
    .unwrap();

    assert_eq!(v1.name, "workload-md-0-7d9f8-x2k4p");
    assert_eq!(v1.namespace, "capi-workload");
    assert_eq!(v1.key(), "capi-workload/workload-md-0-7d9f8-x2k4p");
    assert_eq!(v1.uid, "5f1c2a9e-8d3b-4c61-9a0e-0b6f3c2d1e11");
    assert_eq!(v1.resource_version, "48213");
    assert_eq!(v1.generation, Some(3));
    assert_eq!(
        v1.creation_timestamp,
        Some("2026-05-04T09:15:02Z".parse().unwrap())
    );
    assert_eq!(v1.deletion_timestamp, None);
    assert_eq!(v1.machine_set_name.as_deref(), Some("workload-md-0-7d9f8"));
    assert_eq!(v1.deployment_name.as_deref(), Some("workload-md-0"));
    assert_eq!(v1.cluster_name, "workload");
    assert_eq!(
        v1.provider_id.as_deref(),
        Some("aws:///us-east-1a/i-0abc123def4567890")
    );
    assert_eq!(v1.provider().unwrap().normalized(), "i-0abc123def4567890");
    assert_eq!(v1.node_ref.as_deref(), Some("ip-10-0-1-23.ec2.internal"));
    assert_eq!(v1.phase, MachinePhase::Failed);
    assert_eq!(v1.failure_reason.as_deref(), Some("UpdateError"));
    assert_eq!(
        v1.failure_message.as_deref(),
        Some("instance i-0abc123def4567890 was terminated")
    );
    assert!(v1.is_failed());
    assert!(!v1.is_deleting());
    assert_eq!(
        v1.annotations.get(NODECLAIM_ANNOTATION).map(String::as_str),
        Some("default-abcde")
    );
    assert_eq!(
        v1.infrastructure_ref,
        InfrastructureRef {
            api_group: "infrastructure.cluster.x-k8s.io".into(),
            kind: "DevMachine".into(),
            name: "workload-md-0-7d9f8-x2k4p".into(),
            version: Some("v1beta1".into()),
        }
    );
    assert_eq!(v1.version, CapiVersion::V1Beta1);

    // v1beta2 references carry no version; everything else is identical.
    assert_eq!(v2.infrastructure_ref.version, None);
    assert_eq!(v2.version, CapiVersion::V1Beta2);
    let mut v2_as_v1 = v2.clone();
    v2_as_v1.version = CapiVersion::V1Beta1;
    v2_as_v1.infrastructure_ref.version = Some("v1beta1".into());
    assert_eq!(v2_as_v1, v1);
}

#[test]
fn machine_deployment_reads_the_same_from_both_versions() {
    let v1 = MachineDeployment::from_value(
        &versioned("machinedeployment", CapiVersion::V1Beta1),
        CapiVersion::V1Beta1,
    )
    .unwrap();
    let v2 = MachineDeployment::from_value(
        &versioned("machinedeployment", CapiVersion::V1Beta2),
        CapiVersion::V1Beta2,
    )
    .unwrap();

    assert_eq!(v1.key(), "capi-workload/workload-md-0");
    assert_eq!(v1.generation, Some(7));
    assert_eq!(v1.spec_replicas, Some(3));
    assert_eq!(v1.status_replicas, Some(3));
    assert_eq!(v1.ready_replicas, Some(2));
    assert_eq!(v1.available_replicas, Some(2));
    assert_eq!(v1.observed_generation, Some(7));
    assert_eq!(v1.cluster_name, "workload");
    assert_eq!(v1.deletion_order, Some(DeletionOrder::Oldest));
    assert!(!v1.paused);
    assert!(!v1.is_deleting());
    assert!(v1.labels.contains_key(MEMBER_LABEL));
    assert_eq!(
        v1.selector.match_labels,
        map(&[
            (CLUSTER_NAME_LABEL, "workload"),
            (DEPLOYMENT_NAME_LABEL, "workload-md-0")
        ])
    );
    assert_eq!(v1.selector.match_expressions.len(), 1);
    assert_eq!(
        v1.selector.match_expressions[0].operator,
        SelectorOperator::NotIn
    );
    assert_eq!(
        v1.selector.to_query(),
        "cluster.x-k8s.io/cluster-name=workload,cluster.x-k8s.io/deployment-name=workload-md-0,tier notin (control-plane)"
    );
    assert_eq!(
        v1.status_selector.as_deref(),
        Some(
            "cluster.x-k8s.io/cluster-name=workload,cluster.x-k8s.io/deployment-name=workload-md-0"
        )
    );
    assert!(v1.selector.matches(&v1.template_labels));
    let mut control_plane = v1.template_labels.clone();
    control_plane.insert("tier".into(), "control-plane".into());
    assert!(!v1.selector.matches(&control_plane));
    assert!(
        v1.template_labels
            .contains_key("node-role.kubernetes.io/worker")
    );
    assert_eq!(
        v1.template_annotations,
        map(&[("example.com/owner", "platform")])
    );
    assert_eq!(v1.infrastructure_ref.kind, "DevMachineTemplate");
    assert_eq!(v1.infrastructure_ref.version.as_deref(), Some("v1beta1"));

    let mut v2_as_v1 = v2.clone();
    v2_as_v1.version = CapiVersion::V1Beta1;
    v2_as_v1.infrastructure_ref.version = Some("v1beta1".into());
    assert_eq!(v2_as_v1, v1);
}

#[test]
fn machine_set_reads_the_same_from_both_versions() {
    let v1 = MachineSet::from_value(
        &versioned("machineset", CapiVersion::V1Beta1),
        CapiVersion::V1Beta1,
    )
    .unwrap();
    let v2 = MachineSet::from_value(
        &versioned("machineset", CapiVersion::V1Beta2),
        CapiVersion::V1Beta2,
    )
    .unwrap();
    assert_eq!(v1.key(), "capi-workload/workload-md-0-7d9f8");
    assert_eq!(v1.deployment_name.as_deref(), Some("workload-md-0"));
    assert_eq!(v1.replicas, Some(3));
    assert_eq!(v1.status_replicas, Some(3));
    assert_eq!(v1.cluster_name, "workload");
    let mut v2_as_v1 = v2;
    v2_as_v1.version = CapiVersion::V1Beta1;
    assert_eq!(v2_as_v1, v1);
}

#[test]
fn machine_set_falls_back_to_the_deployment_label() {
    let mut raw = versioned("machineset", CapiVersion::V1Beta2);
    remove(&mut raw, "/metadata/ownerReferences");
    let ms = MachineSet::from_value(&raw, CapiVersion::V1Beta2).unwrap();
    assert_eq!(ms.deployment_name.as_deref(), Some("workload-md-0"));
}

#[test]
fn reads_from_dynamic_objects() {
    for v in CapiVersion::ALL {
        let raw = versioned("machine", v);
        let dynamic: kube::api::DynamicObject = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(
            Machine::from_dynamic(&dynamic, v).unwrap(),
            Machine::from_value(&raw, v).unwrap()
        );
        let raw = versioned("machinedeployment", v);
        let dynamic: kube::api::DynamicObject = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(
            MachineDeployment::from_dynamic(&dynamic, v).unwrap(),
            MachineDeployment::from_value(&raw, v).unwrap()
        );
        let raw = versioned("machineset", v);
        let dynamic: kube::api::DynamicObject = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(
            MachineSet::from_dynamic(&dynamic, v).unwrap(),
            MachineSet::from_value(&raw, v).unwrap()
        );
    }
}

#[test]
fn a_fresh_machine_has_no_optional_parts() {
    let mut raw = versioned("machine", CapiVersion::V1Beta2);
    remove(&mut raw, "/status");
    remove(&mut raw, "/metadata/ownerReferences");
    remove(&mut raw, "/metadata/generation");
    set(&mut raw, "/spec/providerID", json!(""));
    raw["metadata"]["deletionTimestamp"] = json!(null);
    let m = Machine::from_value(&raw, CapiVersion::V1Beta2).unwrap();
    assert_eq!(m.provider_id, None);
    assert_eq!(m.provider(), None);
    assert_eq!(m.node_ref, None);
    assert_eq!(m.phase, MachinePhase::Pending);
    assert_eq!(m.machine_set_name, None);
    assert_eq!(m.generation, None);
    assert_eq!(m.failure_reason, None);
    assert!(!m.is_failed());
    assert!(!m.is_deleting());
}

#[test]
fn a_v1beta2_machine_whose_infrastructure_was_deleted_is_failed() {
    let mut raw = versioned("machine", CapiVersion::V1Beta2);
    remove(&mut raw, "/status/deprecated");
    raw["metadata"]["deletionTimestamp"] = json!(null);
    set(
        &mut raw,
        "/status/conditions",
        json!([
            {"type": "Ready", "status": "False", "reason": "NotReady"},
            {"type": "InfrastructureReady", "status": "False", "reason": "Deleted",
             "message": "DockerMachine default/m-1 has been deleted"}
        ]),
    );
    let m = Machine::from_value(&raw, CapiVersion::V1Beta2).unwrap();
    assert_eq!(m.failure_reason.as_deref(), Some("InfrastructureDeleted"));
    assert_eq!(
        m.failure_message.as_deref(),
        Some("DockerMachine default/m-1 has been deleted")
    );
    assert!(m.is_failed());
    // Not ready for any other reason is not a failure: the provider is still working on it.
    set(
        &mut raw,
        "/status/conditions",
        json!([{"type": "InfrastructureReady", "status": "False", "reason": "NotReady"}]),
    );
    let m = Machine::from_value(&raw, CapiVersion::V1Beta2).unwrap();
    assert_eq!(m.failure_reason, None);
    // v1beta1 has no such signal (its failure fields say it).
    let m = Machine::from_value(&raw, CapiVersion::V1Beta1);
    assert!(m.map(|m| m.failure_reason.is_none()).unwrap_or(true));
}

#[test]
fn machine_phases_and_deletion() {
    let raw = versioned("machine", CapiVersion::V1Beta1);
    let phase = |p: &str| {
        let mut raw = raw.clone();
        set(&mut raw, "/status/phase", json!(p));
        Machine::from_value(&raw, CapiVersion::V1Beta1)
            .unwrap()
            .phase
    };
    assert_eq!(phase("Provisioning"), MachinePhase::Provisioning);
    assert_eq!(phase("Provisioned"), MachinePhase::Provisioned);
    assert_eq!(phase("Running"), MachinePhase::Running);
    assert_eq!(phase("Deleting"), MachinePhase::Deleting);
    assert_eq!(phase("Deleted"), MachinePhase::Deleted);
    assert_eq!(phase("SomethingNew"), MachinePhase::Unknown);

    let mut deleting = raw.clone();
    set(&mut deleting, "/status/phase", json!("Running"));
    deleting["metadata"]["deletionTimestamp"] = json!("2026-05-04T10:00:00Z");
    let m = Machine::from_value(&deleting, CapiVersion::V1Beta1).unwrap();
    assert!(m.is_deleting());
    assert_eq!(
        m.deletion_timestamp,
        Some("2026-05-04T10:00:00Z".parse().unwrap())
    );
}

#[test]
fn v1beta1_core_group_reference_has_empty_group() {
    let mut raw = versioned("machine", CapiVersion::V1Beta1);
    set(&mut raw, "/spec/infrastructureRef/apiVersion", json!("v1"));
    let m = Machine::from_value(&raw, CapiVersion::V1Beta1).unwrap();
    assert_eq!(m.infrastructure_ref.api_group, "");
    assert_eq!(m.infrastructure_ref.version.as_deref(), Some("v1"));
}

/// Applies `edit` to a fixture and expects a model error naming the object and `field`.
fn expect_error(
    kind: &str,
    v: CapiVersion,
    edit: impl FnOnce(&mut Value),
    field: &str,
) -> ModelError {
    let mut raw = versioned(kind, v);
    edit(&mut raw);
    let err = match kind {
        "machine" => Machine::from_value(&raw, v).map(|_| ()).unwrap_err(),
        "machinedeployment" => MachineDeployment::from_value(&raw, v)
            .map(|_| ())
            .unwrap_err(),
        _ => MachineSet::from_value(&raw, v).map(|_| ()).unwrap_err(),
    };
    let text = err.to_string();
    assert!(text.contains("capi-workload/workload-md-0"), "{text}");
    assert!(text.contains(field), "expected {field:?} in {text}");
    err
}

#[test]
fn malformed_objects_give_errors_naming_object_and_field() {
    use CapiVersion::*;
    let err = expect_error(
        "machine",
        V1Beta1,
        |r| remove(r, "/spec/clusterName"),
        "spec.clusterName",
    );
    assert!(matches!(err, ModelError::Missing { .. }));
    let err = expect_error(
        "machine",
        V1Beta2,
        |r| set(r, "/metadata/labels", json!({"a": 1})),
        "metadata.labels.a",
    );
    assert!(matches!(err, ModelError::WrongType { .. }));
    expect_error(
        "machine",
        V1Beta2,
        |r| remove(r, "/spec/infrastructureRef/apiGroup"),
        "spec.infrastructureRef.apiGroup",
    );
    // A v1beta1 object read as v1beta2 is caught, not silently misread.
    expect_error(
        "machine",
        V1Beta2,
        |r| *r = versioned("machine", V1Beta1),
        "spec.infrastructureRef.apiGroup",
    );
    expect_error(
        "machine",
        V1Beta1,
        |r| set(r, "/spec/infrastructureRef/apiVersion", json!("/v1")),
        "spec.infrastructureRef.apiVersion",
    );
    expect_error(
        "machine",
        V1Beta1,
        |r| remove(r, "/spec/infrastructureRef"),
        "spec.infrastructureRef",
    );
    expect_error(
        "machine",
        V1Beta1,
        |r| set(r, "/metadata/creationTimestamp", json!("yesterday")),
        "metadata.creationTimestamp",
    );
    expect_error(
        "machine",
        V1Beta1,
        |r| set(r, "/spec/providerID", json!(42)),
        "spec.providerID",
    );
    expect_error(
        "machine",
        V1Beta1,
        |r| set(r, "/metadata/ownerReferences/1/controller", json!("yes")),
        "metadata.ownerReferences[1].controller",
    );
    expect_error(
        "machine",
        V1Beta1,
        |r| remove(r, "/metadata/uid"),
        "metadata.uid",
    );
    expect_error(
        "machinedeployment",
        V1Beta1,
        |r| {
            set(
                r,
                "/spec/strategy/rollingUpdate/deletePolicy",
                json!("Smallest"),
            )
        },
        "spec.strategy.rollingUpdate.deletePolicy",
    );
    expect_error(
        "machinedeployment",
        V1Beta2,
        |r| set(r, "/spec/deletion/order", json!("Smallest")),
        "spec.deletion.order",
    );
    expect_error(
        "machinedeployment",
        V1Beta2,
        |r| set(r, "/spec/replicas", json!("three")),
        "spec.replicas",
    );
    expect_error(
        "machinedeployment",
        V1Beta2,
        |r| set(r, "/spec/replicas", json!(1u64 << 40)),
        "spec.replicas",
    );
    expect_error(
        "machinedeployment",
        V1Beta2,
        |r| set(r, "/spec/selector/matchExpressions/0/operator", json!("Gt")),
        "spec.selector.matchExpressions[0].operator",
    );
    expect_error(
        "machinedeployment",
        V1Beta2,
        |r| set(r, "/spec/selector/matchExpressions/0/values", json!([])),
        "spec.selector.matchExpressions[0].values",
    );
    expect_error(
        "machinedeployment",
        V1Beta1,
        |r| remove(r, "/spec/selector"),
        "spec.selector",
    );
    expect_error(
        "machineset",
        V1Beta2,
        |r| set(r, "/spec/clusterName", json!(["workload"])),
        "spec.clusterName",
    );
    // Without a name the message still says what kind of object it was.
    let mut raw = versioned("machine", V1Beta1);
    remove(&mut raw, "/metadata/name");
    let err = Machine::from_value(&raw, V1Beta1).unwrap_err().to_string();
    assert!(err.contains("Machine capi-workload/?"), "{err}");
    assert!(err.contains("metadata.name"), "{err}");
    assert!(Machine::from_value(&json!(null), V1Beta1).is_err());
    assert!(Machine::from_value(&json!("machine"), V1Beta1).is_err());
}

// ---- patches -------------------------------------------------------------------------------

#[test]
fn patches_use_the_same_paths_in_both_versions() {
    for v in CapiVersion::ALL {
        assert_eq!(patch::replicas_path(v), "/spec/replicas");
        assert_eq!(
            patch::replicas_patch(v, Some(3), 5),
            json!([
                {"op": "test", "path": "/spec/replicas", "value": 3},
                {"op": "replace", "path": "/spec/replicas", "value": 5},
            ])
        );
        assert_eq!(
            patch::replicas_merge_patch(v, 2),
            json!({"spec": {"replicas": 2}})
        );
    }
    let guarded = patch::with_resource_version(
        patch::replicas_patch(CapiVersion::V1Beta2, None, 1),
        "47001",
    );
    assert_eq!(
        guarded,
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "47001"},
            {"op": "add", "path": "/spec/replicas", "value": 1},
        ])
    );
    assert_eq!(
        patch::annotation_path(DELETE_MACHINE_ANNOTATION),
        "/metadata/annotations/cluster.x-k8s.io~1delete-machine"
    );
    assert_eq!(patch::label_path("a~b/c"), "/metadata/labels/a~0b~1c");
    assert_eq!(
        patch::annotation_merge_patch(DELETE_MACHINE_ANNOTATION, Some("true")),
        json!({"metadata": {"annotations": {"cluster.x-k8s.io/delete-machine": "true"}}})
    );
    assert_eq!(
        patch::label_merge_patch(MEMBER_LABEL, None),
        json!({"metadata": {"labels": {"node.cluster.x-k8s.io/karpenter-member": null}}})
    );
    // The patch really addresses the field it names.
    let md = versioned("machinedeployment", CapiVersion::V1Beta1);
    assert_eq!(
        md.pointer(patch::replicas_path(CapiVersion::V1Beta1)),
        Some(&json!(3))
    );
}

// ---- scale-from-zero annotations -----------------------------------------------------------

#[test]
fn parses_the_fixture_annotations() {
    let md = MachineDeployment::from_value(
        &versioned("machinedeployment", CapiVersion::V1Beta2),
        CapiVersion::V1Beta2,
    )
    .unwrap();
    let sfz = annotations::parse(&md.annotations).unwrap();
    assert_eq!(sfz.cpu, Some(q("4")));
    assert_eq!(sfz.memory, Some(q("16Gi")));
    assert_eq!(sfz.ephemeral_disk, Some(q("100Gi")));
    assert_eq!(sfz.max_pods, Some(58));
    assert_eq!(sfz.gpu, None);
    assert_eq!(
        sfz.labels,
        map(&[
            (INSTANCE_TYPE_LABEL, "m5.xlarge"),
            (ZONE_LABEL, "us-east-1a")
        ])
    );
    assert_eq!(
        sfz.taints,
        vec![Taint {
            key: "dedicated".into(),
            value: Some("batch".into()),
            effect: TaintEffect::NoSchedule
        }]
    );
    assert_eq!(sfz.min_size, Some(0));
    assert_eq!(sfz.max_size, Some(10));
    assert_eq!(sfz.price, Some(0.192));
    assert_eq!(
        sfz.capacity(),
        Resources::new()
            .with("cpu", q("4"))
            .with("memory", q("16Gi"))
            .with("ephemeral-storage", q("100Gi"))
            .with("pods", q("58"))
    );
}

#[test]
fn absent_annotations_are_empty() {
    let sfz = annotations::parse(&BTreeMap::new()).unwrap();
    assert_eq!(sfz, annotations::ScaleFromZero::default());
    assert!(sfz.capacity().is_empty());
}

#[test]
fn gpu_needs_type_and_count() {
    let gpu = |entries: &[(&str, &str)]| annotations::parse(&map(entries));
    let sfz = gpu(&[
        (GPU_TYPE_ANNOTATION, "nvidia-tesla-t4"),
        (GPU_COUNT_ANNOTATION, "2"),
    ])
    .unwrap();
    assert_eq!(
        sfz.gpu,
        Some(Gpu {
            gpu_type: "nvidia-tesla-t4".into(),
            resource: NVIDIA_GPU_RESOURCE.into(),
            count: 2
        })
    );
    assert_eq!(sfz.capacity().get("nvidia.com/gpu"), q("2"));

    let sfz = gpu(&[
        (GPU_TYPE_ANNOTATION, "amd.com/gpu"),
        (GPU_COUNT_ANNOTATION, "1"),
    ])
    .unwrap();
    assert_eq!(sfz.capacity().get("amd.com/gpu"), q("1"));
    assert_eq!(sfz.capacity().get("nvidia.com/gpu"), Quantity::ZERO);

    let sfz = gpu(&[
        (GPU_TYPE_ANNOTATION, "nvidia.com/gpu"),
        (GPU_COUNT_ANNOTATION, "0"),
    ])
    .unwrap();
    assert!(!sfz.capacity().0.contains_key("nvidia.com/gpu"));

    // Either alone publishes no GPU, as Cluster Autoscaler publishes none (issue 37): the
    // annotation is passed over and recorded naming its partner, not refused.
    let sfz = gpu(&[(GPU_TYPE_ANNOTATION, "nvidia-tesla-t4")]).unwrap();
    assert_eq!(sfz.gpu, None);
    assert!(!sfz.capacity().0.contains_key("nvidia.com/gpu"));
    assert_eq!(sfz.skipped.len(), 1, "{:?}", sfz.skipped);
    assert_eq!(sfz.skipped[0].key, GPU_TYPE_ANNOTATION);
    assert_eq!(sfz.skipped[0].entry, "nvidia-tesla-t4");
    assert!(
        sfz.skipped[0].reason.contains(GPU_COUNT_ANNOTATION),
        "{}",
        sfz.skipped[0]
    );
    let sfz = gpu(&[(GPU_COUNT_ANNOTATION, "1")]).unwrap();
    assert_eq!(sfz.gpu, None);
    assert!(!sfz.capacity().0.contains_key("nvidia.com/gpu"));
    assert_eq!(sfz.skipped.len(), 1, "{:?}", sfz.skipped);
    assert_eq!(sfz.skipped[0].key, GPU_COUNT_ANNOTATION);
    assert_eq!(sfz.skipped[0].entry, "1");
    assert!(
        sfz.skipped[0].reason.contains(GPU_TYPE_ANNOTATION),
        "{}",
        sfz.skipped[0]
    );
    // A blank type is no type.
    let sfz = gpu(&[(GPU_TYPE_ANNOTATION, " "), (GPU_COUNT_ANNOTATION, "1")]).unwrap();
    assert_eq!(sfz.gpu, None);
    assert_eq!(sfz.skipped.len(), 1, "{:?}", sfz.skipped);
    assert_eq!(sfz.skipped[0].key, GPU_TYPE_ANNOTATION);
    assert!(
        sfz.skipped[0].to_string().contains("ignored"),
        "{}",
        sfz.skipped[0]
    );
    // A count that is no integer is refused, as the autoscaler refuses it, once.
    let errs = gpu(&[(GPU_TYPE_ANNOTATION, "t4"), (GPU_COUNT_ANNOTATION, "two")]).unwrap_err();
    assert_eq!(errs.0.len(), 1, "{errs}");
    assert_eq!(errs.0[0].key, GPU_COUNT_ANNOTATION);
    assert_eq!(errs.0[0].problem, Problem::NotAnInteger);
}

#[test]
fn every_malformed_annotation_is_reported_at_once() {
    // Values Cluster Autoscaler refuses, and so are refused here.
    let refused = [
        (CPU_ANNOTATION, "four"),
        (MEMORY_ANNOTATION, "-1Gi"),
        (EPHEMERAL_DISK_ANNOTATION, "1Qi"),
        (MAX_PODS_ANNOTATION, "1.5"),
        (MIN_SIZE_ANNOTATION, "-1"),
        (MAX_SIZE_ANNOTATION, "ten"),
        (PRICE_ANNOTATION, "NaN"),
    ];
    // List entries it passes over (issue 37): passed over here too, never an error.
    let passed_over = [
        (LABELS_ANNOTATION, "a=b,novalue"),
        (TAINTS_ANNOTATION, "dedicated=batch:NoFly"),
    ];
    let bad = map(&[&refused[..], &passed_over[..]].concat());
    let errs = annotations::parse(&bad).unwrap_err();
    let mut keys: Vec<&str> = errs.iter().map(|e| e.key.as_str()).collect();
    keys.sort_unstable();
    let mut expected: Vec<&str> = refused.iter().map(|(k, _)| *k).collect();
    expected.sort_unstable();
    assert_eq!(keys, expected, "{errs}");
    assert_eq!(errs.0.len(), refused.len(), "{errs}");
    let cpu = errs.for_key(CPU_ANNOTATION).next().unwrap();
    assert_eq!(cpu.value, "four");
    assert!(matches!(cpu.problem, Problem::Quantity(_)));
    assert_eq!(
        errs.for_key(MEMORY_ANNOTATION).next().unwrap().problem,
        Problem::Negative
    );
    assert_eq!(
        errs.for_key(MIN_SIZE_ANNOTATION).next().unwrap().problem,
        Problem::Negative
    );
    assert_eq!(
        errs.for_key(PRICE_ANNOTATION).next().unwrap().problem,
        Problem::NotAPrice
    );
    let text = errs.to_string();
    assert!(
        text.contains(MAX_SIZE_ANNOTATION) && text.contains("\"ten\""),
        "{text}"
    );
    assert!(text.contains("\"four\""), "{text}");
    assert!(
        !text.contains(TAINTS_ANNOTATION) && !text.contains(LABELS_ANNOTATION),
        "{text}"
    );

    // Without the refused values the rest is read, and each entry passed over is recorded
    // naming its annotation.
    let sfz = annotations::parse(&map(&passed_over)).unwrap();
    assert_eq!(sfz.labels, map(&[("a", "b")]));
    assert!(sfz.taints.is_empty(), "{:?}", sfz.taints);
    let skipped: Vec<(&str, &str)> = sfz
        .skipped
        .iter()
        .map(|s| (s.key.as_str(), s.entry.as_str()))
        .collect();
    assert_eq!(
        skipped,
        [
            (LABELS_ANNOTATION, "novalue"),
            (TAINTS_ANNOTATION, "dedicated=batch:NoFly")
        ]
    );
    let taint = sfz.skipped[1].to_string();
    assert!(
        taint.starts_with(&format!(
            "annotation {TAINTS_ANNOTATION}: \"dedicated=batch:NoFly\" ignored: "
        )) && taint.contains("NoFly"),
        "{taint}"
    );
}

#[test]
fn label_and_taint_syntax_is_validated() {
    let one = |key: &str, value: &str| annotations::parse(&map(&[(key, value)]));
    // A bad entry is passed over, not refused (issue 37): the value parses, the entry is left
    // out and recorded under the annotation, as written. Returns the reason.
    let skipped_alone = |key: &str, value: &str| {
        let sfz = one(key, value).unwrap_or_else(|e| panic!("{value}: refused: {e}"));
        assert!(sfz.labels.is_empty() && sfz.taints.is_empty(), "{value}");
        assert_eq!(sfz.skipped.len(), 1, "{value}: {:?}", sfz.skipped);
        assert_eq!(sfz.skipped[0].key, key, "{value}");
        assert_eq!(sfz.skipped[0].entry, value);
        assert!(!sfz.skipped[0].reason.is_empty(), "{value}");
        sfz.skipped[0].reason.clone()
    };

    assert_eq!(
        one(LABELS_ANNOTATION, " a=b , example.com/c=d, e= ,")
            .unwrap()
            .labels,
        map(&[("a", "b"), ("example.com/c", "d"), ("e", "")])
    );
    for bad in [
        "=v",
        "k",
        "-k=v",
        "k=-v",
        "Example.com/k=v",
        "a/b/c=v",
        "k=v w",
        "/k=v",
        "example.com/=v",
    ] {
        skipped_alone(LABELS_ANNOTATION, bad);
    }
    let long = format!("k={}", "v".repeat(64));
    assert!(skipped_alone(LABELS_ANNOTATION, &long).contains("63"));
    // The good entries around a bad one stand.
    let sfz = one(LABELS_ANNOTATION, "a=b,k=v w,c=d").unwrap();
    assert_eq!(sfz.labels, map(&[("a", "b"), ("c", "d")]));
    assert_eq!(sfz.skipped.len(), 1);
    assert_eq!(sfz.skipped[0].entry, "k=v w");
    // A label given twice: the later value wins, and the earlier one is recorded.
    let sfz = one(LABELS_ANNOTATION, "a=1,a=2").unwrap();
    assert_eq!(sfz.labels, map(&[("a", "2")]));
    assert_eq!(sfz.skipped.len(), 1);
    assert_eq!(
        (sfz.skipped[0].key.as_str(), sfz.skipped[0].entry.as_str()),
        (LABELS_ANNOTATION, "a=1")
    );

    let taints = one(
        TAINTS_ANNOTATION,
        "a=b:NoSchedule, example.com/c:NoExecute,d=:PreferNoSchedule",
    )
    .unwrap()
    .taints;
    assert_eq!(
        taints.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "a=b:NoSchedule",
            "example.com/c:NoExecute",
            "d:PreferNoSchedule"
        ]
    );
    assert_eq!(taints[1].to_k8s().effect, "NoExecute");
    assert_eq!(taints[0].to_k8s().value.as_deref(), Some("b"));
    for bad in [
        "a=b",
        "a=b:",
        ":NoSchedule",
        "a=b:noschedule",
        "a b:NoSchedule",
        "a=b c:NoExecute",
    ] {
        skipped_alone(TAINTS_ANNOTATION, bad);
    }
    let sfz = one(TAINTS_ANNOTATION, "a=b:noschedule, c=d:NoExecute").unwrap();
    assert_eq!(
        sfz.taints
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["c=d:NoExecute"]
    );
    assert_eq!(sfz.skipped.len(), 1);
    assert_eq!(sfz.skipped[0].entry, "a=b:noschedule");
    assert!(
        sfz.skipped[0].to_string().contains(TAINTS_ANNOTATION),
        "{}",
        sfz.skipped[0]
    );
}

#[test]
fn sizes_and_price() {
    let parse = |entries: &[(&str, &str)]| annotations::parse(&map(entries));
    let ok = parse(&[
        (MIN_SIZE_ANNOTATION, "2"),
        (MAX_SIZE_ANNOTATION, "2"),
        (PRICE_ANNOTATION, "0"),
    ])
    .unwrap();
    assert_eq!(
        (ok.min_size, ok.max_size, ok.price),
        (Some(2), Some(2), Some(0.0))
    );
    let errs = parse(&[(MIN_SIZE_ANNOTATION, "5"), (MAX_SIZE_ANNOTATION, "3")]).unwrap_err();
    assert_eq!(errs.0[0].problem, Problem::MinAboveMax { min: 5, max: 3 });
    // Above 32 bits: read (Go's Atoi takes it) and clamped, since replicas are 32-bit; the
    // clamp is recorded.
    let big = parse(&[(MAX_SIZE_ANNOTATION, "99999999999")]).unwrap();
    assert_eq!(big.max_size, Some(i32::MAX));
    assert_eq!(big.skipped.len(), 1, "{:?}", big.skipped);
    assert_eq!(
        (big.skipped[0].key.as_str(), big.skipped[0].entry.as_str()),
        (MAX_SIZE_ANNOTATION, "99999999999")
    );
    // Go's leading `+`.
    let plus = parse(&[(MIN_SIZE_ANNOTATION, "+1"), (MAX_SIZE_ANNOTATION, "+3")]).unwrap();
    assert_eq!((plus.min_size, plus.max_size), (Some(1), Some(3)));
    // Beyond 64 bits even Atoi refuses it; so does an empty size.
    for bad in ["99999999999999999999", "", "ten", "1.5"] {
        assert_eq!(
            parse(&[(MAX_SIZE_ANNOTATION, bad)]).unwrap_err().0[0].problem,
            Problem::NotAnInteger,
            "{bad}"
        );
    }
    for bad in ["inf", "-0.5", "1e3", "", "0x10", "1.2.3"] {
        assert!(parse(&[(PRICE_ANNOTATION, bad)]).is_err(), "{bad}");
    }
    assert_eq!(
        parse(&[(PRICE_ANNOTATION, " 1.25 ")]).unwrap().price,
        Some(1.25)
    );
}

/// Property-style: no annotation value, however odd, makes parsing panic.
#[test]
fn garbage_never_panics() {
    let keys = [
        CPU_ANNOTATION,
        MEMORY_ANNOTATION,
        EPHEMERAL_DISK_ANNOTATION,
        MAX_PODS_ANNOTATION,
        GPU_TYPE_ANNOTATION,
        GPU_COUNT_ANNOTATION,
        LABELS_ANNOTATION,
        TAINTS_ANNOTATION,
        MIN_SIZE_ANNOTATION,
        MAX_SIZE_ANNOTATION,
        PRICE_ANNOTATION,
    ];
    let alphabet: Vec<char> = "0123456789.-+eEkKMGiTPnum=:,/ \t_aZ~\u{e9}\u{1F600}\0"
        .chars()
        .collect();
    // A small linear congruential generator: deterministic, no dependency.
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as usize
    };
    let mut rejected = 0;
    for _ in 0..3000 {
        let mut annotations = BTreeMap::new();
        for key in keys {
            if next() % 2 == 0 {
                let len = next() % 24;
                let value: String = (0..len)
                    .map(|_| alphabet[next() % alphabet.len()])
                    .collect();
                annotations.insert(key.to_string(), value);
            }
        }
        if let Err(errs) = annotations::parse(&annotations) {
            rejected += 1;
            for e in errs.iter() {
                assert_eq!(Some(&e.value), annotations.get(&e.key));
                assert!(!e.to_string().is_empty());
            }
        }
    }
    assert!(rejected > 0);
    for huge in [
        "9".repeat(10_000),
        format!("1e{}", "9".repeat(100)),
        format!("0.{}1", "0".repeat(5_000)),
        ",".repeat(10_000),
        "=:".repeat(1_000),
    ] {
        for key in keys {
            let _ = annotations::parse(&map(&[(key, &huge)]));
        }
    }
}

// ---- infrastructure templates --------------------------------------------------------------

#[test]
fn template_status_capacity_and_node_info() {
    let t = TemplateCapacity::from_value(&fixture("devmachinetemplate.json")).unwrap();
    assert_eq!(
        t.capacity,
        Resources::new()
            .with("cpu", q("8"))
            .with("memory", q("32Gi"))
            .with("ephemeral-storage", q("200Gi"))
            .with("pods", q("110"))
            .with("nvidia.com/gpu", q("1"))
    );
    assert_eq!(t.architecture.as_deref(), Some("arm64"));
    assert_eq!(t.operating_system.as_deref(), Some("linux"));

    let dynamic: kube::api::DynamicObject =
        serde_json::from_value(fixture("devmachinetemplate.json")).unwrap();
    assert_eq!(TemplateCapacity::from_dynamic(&dynamic).unwrap(), t);

    // Most providers publish nothing yet.
    let bare = json!({"kind": "DockerMachineTemplate", "metadata": {"name": "x"}, "spec": {}});
    assert_eq!(
        TemplateCapacity::from_value(&bare).unwrap(),
        TemplateCapacity::default()
    );
}

#[test]
fn template_errors_name_object_and_field() {
    let mut raw = fixture("devmachinetemplate.json");
    raw["status"]["capacity"]["memory"] = json!("lots");
    let err = TemplateCapacity::from_value(&raw).unwrap_err();
    assert!(matches!(err, TemplateError::Quantity { .. }));
    let text = err.to_string();
    assert!(
        text.contains("DevMachineTemplate capi-workload/workload-md-0")
            && text.contains("status.capacity.memory"),
        "{text}"
    );
    let mut raw = fixture("devmachinetemplate.json");
    raw["status"]["nodeInfo"]["architecture"] = json!(64);
    let text = TemplateCapacity::from_value(&raw).unwrap_err().to_string();
    assert!(text.contains("status.nodeInfo.architecture"), "{text}");
    let mut raw = fixture("devmachinetemplate.json");
    raw["status"]["capacity"] = json!(["cpu"]);
    assert!(matches!(
        TemplateCapacity::from_value(&raw),
        Err(TemplateError::WrongType { .. })
    ));
}

#[test]
fn annotations_override_the_template() {
    let t = TemplateCapacity::from_value(&fixture("devmachinetemplate.json")).unwrap();
    let sfz = annotations::parse(&map(&[
        (CPU_ANNOTATION, "16"),
        (MAX_PODS_ANNOTATION, "58"),
        (
            LABELS_ANNOTATION,
            "kubernetes.io/os=windows,example.com/team=a",
        ),
        (TAINTS_ANNOTATION, "gpu:NoSchedule"),
    ]))
    .unwrap();
    let shape = merge(Some(&t), &sfz);
    assert_eq!(shape.capacity.get("cpu"), q("16"));
    assert_eq!(shape.capacity.get("memory"), q("32Gi"));
    assert_eq!(shape.capacity.get("pods"), q("58"));
    assert_eq!(shape.capacity.get("nvidia.com/gpu"), q("1"));
    assert_eq!(shape.arch, "arm64");
    assert_eq!(shape.os, "windows");
    assert_eq!(
        shape.labels,
        map(&[
            (ARCH_LABEL, "arm64"),
            (OS_LABEL, "windows"),
            ("example.com/team", "a")
        ])
    );
    assert_eq!(shape.taints.len(), 1);
    assert_eq!(shape.taints[0].effect, TaintEffect::NoSchedule);
}

#[test]
fn shape_defaults_without_template() {
    let sfz =
        annotations::parse(&map(&[(CPU_ANNOTATION, "2"), (MEMORY_ANNOTATION, "4G")])).unwrap();
    let shape = merge(None, &sfz);
    assert_eq!(shape.arch, DEFAULT_ARCH);
    assert_eq!(shape.os, DEFAULT_OS);
    assert_eq!(
        shape.labels.get(ARCH_LABEL).map(String::as_str),
        Some("amd64")
    );
    assert_eq!(
        shape.labels.get(OS_LABEL).map(String::as_str),
        Some("linux")
    );
    assert_eq!(
        shape.capacity,
        Resources::new()
            .with("cpu", q("2"))
            .with("memory", q("4G"))
            .with("pods", Quantity::from_units(DEFAULT_MAX_PODS))
    );
    assert!(shape.taints.is_empty());
}

// ---- provider IDs --------------------------------------------------------------------------

#[test]
fn provider_ids_of_common_providers() {
    let cases = [
        ("aws:///us-east-1a/i-0abc", "i-0abc", Some("aws")),
        (
            "azure:///subscriptions/0000/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/md-0-x7k2",
            "md-0-x7k2",
            Some("azure"),
        ),
        (
            "gce://my-project/us-central1-a/md-0-abcd",
            "md-0-abcd",
            Some("gce"),
        ),
        (
            "vsphere://42305f0b-ad4c-7a4f-2b0f-5e1b6c0d9a11",
            "42305f0b-ad4c-7a4f-2b0f-5e1b6c0d9a11",
            Some("vsphere"),
        ),
        ("kubemark://m-1", "m-1", Some("kubemark")),
        (
            "openstack:///9c1a5f3e-2b7d-4e0c-8a61-3f2d9b7c1e44",
            "9c1a5f3e-2b7d-4e0c-8a61-3f2d9b7c1e44",
            Some("openstack"),
        ),
        (
            "docker:////workload-md-0-x2k4p",
            "workload-md-0-x2k4p",
            Some("docker"),
        ),
    ];
    for (exact, normalized, scheme) in cases {
        assert_eq!(normalize(exact), normalized, "{exact}");
        let id = ProviderId::new(exact).unwrap();
        assert_eq!(id.exact(), exact);
        assert_eq!(id.normalized(), normalized);
        assert_eq!(id.scheme(), scheme);
        assert_eq!(id.to_string(), exact);
    }
    let a = ProviderId::new("aws:///us-east-1a/i-0abc").unwrap();
    let b = ProviderId::new("aws://us-east-1a/i-0abc").unwrap();
    assert_ne!(a, b, "Cluster API matches exactly");
    assert!(a.same_instance(&b));
    assert_eq!(normalize(""), "");
    assert_eq!(ProviderId::new("  "), None);
    assert_eq!(ProviderId::new("gce://p/z/"), None);
}

// ---- version discovery ---------------------------------------------------------------------

/// Serves `/apis` with `body` for every request on a local port.
async fn fake_api_server(body: Value) -> kube::Client {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = body.to_string();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

fn group_list(groups: &[(&str, &[&str])]) -> Value {
    let groups: Vec<Value> = groups
        .iter()
        .map(|(name, versions)| {
            let vs: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                .collect();
            json!({"name": name, "versions": vs, "preferredVersion": vs[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

#[tokio::test]
async fn discovery_prefers_v1beta2() {
    let both = fake_api_server(group_list(&[
        ("apps", &["v1"]),
        ("cluster.x-k8s.io", &["v1beta2", "v1beta1"]),
        ("infrastructure.cluster.x-k8s.io", &["v1beta2", "v1beta1"]),
    ]))
    .await;
    assert_eq!(
        version::discover(&both, None).await.unwrap(),
        CapiVersion::V1Beta2
    );
    assert_eq!(
        version::discover(&both, Some(CapiVersion::V1Beta1))
            .await
            .unwrap(),
        CapiVersion::V1Beta1
    );
    assert_eq!(
        version::infrastructure_version(&both, "infrastructure.cluster.x-k8s.io")
            .await
            .unwrap(),
        "v1beta2"
    );
    assert!(matches!(
        version::infrastructure_version(&both, "infrastructure.example.com").await,
        Err(version::Error::InfrastructureGroupNotServed { .. })
    ));

    let old = fake_api_server(group_list(&[(
        "cluster.x-k8s.io",
        &["v1beta1", "v1alpha4"],
    )]))
    .await;
    assert_eq!(
        version::discover(&old, None).await.unwrap(),
        CapiVersion::V1Beta1
    );

    let ancient = fake_api_server(group_list(&[("cluster.x-k8s.io", &["v1alpha3"])])).await;
    let err = version::discover(&ancient, None).await.unwrap_err();
    assert!(err.to_string().contains("v1alpha3"), "{err}");

    let none = fake_api_server(group_list(&[("apps", &["v1"])])).await;
    assert!(matches!(
        version::discover(&none, None).await,
        Err(version::Error::GroupNotServed)
    ));
    // Forcing a version skips discovery entirely.
    assert_eq!(
        version::discover(&none, Some(CapiVersion::V1Beta2))
            .await
            .unwrap(),
        CapiVersion::V1Beta2
    );
}
