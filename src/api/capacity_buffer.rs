//! CapacityBuffer (autoscaling.x-k8s.io/v1beta1): spare capacity kept ready for fast scale-up,
//! declared once for every autoscaler of the cluster (Cluster Autoscaler and Karpenter read the
//! same API). A buffer names the shape of one chunk (a PodTemplate, or a workload's pod
//! template) and how many chunks to keep (`replicas`, `percentage` of the workload, `limits`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;

/// The only provisioning strategy defined: the buffer is kept as placeholder pods every
/// provisioning pass packs (the default when the field is unset).
pub const ACTIVE_CAPACITY: &str = "buffer.x-k8s.io/active-capacity";
/// The pod template is resolved and the chunk count computed.
pub const READY_FOR_PROVISIONING: &str = "ReadyForProvisioning";
/// The buffer's chunks fit on capacity that exists (True) or need new capacity (False).
pub const PROVISIONING: &str = "Provisioning";

/// Marks a placeholder pod made from a CapacityBuffer (upstream Karpenter's annotation).
pub const FAKE_POD_ANNOTATION: &str = "karpenter.sh/capacity-buffer-fake-pod";
/// The buffer a placeholder pod belongs to: its name and namespace.
pub const BUFFER_NAME_ANNOTATION: &str = "karpenter.sh/capacity-buffer-name";
pub const BUFFER_NAMESPACE_ANNOTATION: &str = "karpenter.sh/capacity-buffer-namespace";

/// Whether `pod` is a buffer's placeholder, never a pod of the cluster.
pub fn is_placeholder(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FAKE_POD_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// CapacityBufferSpec defines the desired state of CapacityBuffer.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "autoscaling.x-k8s.io",
    version = "v1beta1",
    kind = "CapacityBuffer",
    plural = "capacitybuffers",
    singular = "capacitybuffer",
    namespaced,
    status = "CapacityBufferStatus",
    category = "autoscaling",
    shortname = "cb",
    derive = "PartialEq",
    doc = "CapacityBuffer is the configuration that an autoscaler can use to provision buffer capacity within a cluster.",
    printcolumn = r#"{"name":"Strategy","type":"string","description":"The strategy to be used.","jsonPath":".spec.provisioningStrategy"}"#,
    printcolumn = r#"{"name":"PodTemplate","type":"string","description":"The name of the PodTemplate used.","jsonPath":".status.podTemplateRef.name"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","description":"The actual number of buffer chunks.","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"ConditionsType","type":"string","description":"List of all condition types.","jsonPath":".status.conditions[*].type"}"#,
    printcolumn = r#"{"name":"ConditionsStatus","type":"string","description":"List of all condition statuses.","jsonPath":".status.conditions[*].status"}"#,
    printcolumn = r#"{"name":"ConditionsReason","type":"string","description":"List of all condition reasons.","jsonPath":".status.conditions[*].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","description":"The age of the CapacityBuffer.","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "message": "If podTemplateRef is set, replicas or limits must also be set",
        "rule": "!has(self.podTemplateRef) || has(self.replicas) || has(self.limits)"
    },
    {
        "message": "You must define either PodTemplateRef or ScalableRef, but not both",
        "rule": "!(has(self.podTemplateRef) && has(self.scalableRef))"
    }
]))]
pub struct CapacityBufferSpec {
    /// How the buffer is used; "buffer.x-k8s.io/active-capacity" (the default) keeps it as
    /// placeholder pods that scale the cluster up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "buffer.x-k8s.io/active-capacity"))]
    pub provisioning_strategy: Option<String>,
    /// A PodTemplate in the same namespace: the shape of one chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_ref: Option<LocalObjectRef>,
    /// An object with a scale subresource whose pod template is the shape of one chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scalable_ref: Option<ScalableRef>,
    /// How many chunks to keep; with `percentage`, the larger of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Chunks as a percentage of the `scalableRef`'s replicas, rounded up to at least 1; left out while it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub percentage: Option<i32>,
    /// Resource totals that bound the number of chunks (alone: as many chunks as fit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, Quantity>>,
}

/// A reference to an object in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LocalObjectRef {
    /// name of the referent.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// A reference to an object with a scale subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalableRef {
    /// API group of the referent; empty for the core group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    /// kind of the referent.
    #[schemars(length(min = 1))]
    pub kind: String,
    /// name of the referent.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// CapacityBufferStatus defines the observed state of CapacityBuffer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityBufferStatus {
    /// The PodTemplate the buffer was resolved from (`spec.podTemplateRef` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_ref: Option<LocalObjectRef>,
    /// The number of chunks kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// The observed generation of that PodTemplate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_generation: Option<i64>,
    /// `ReadyForProvisioning` and `Provisioning`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
    /// The strategy the buffer is provisioned with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_strategy: Option<String>,
}

impl CapacityBuffer {
    /// The strategy in effect: unset (or empty) means active capacity.
    pub fn strategy(&self) -> &str {
        match self.spec.provisioning_strategy.as_deref() {
            None | Some("") => ACTIVE_CAPACITY,
            Some(s) => s,
        }
    }

    pub fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
    }
}
