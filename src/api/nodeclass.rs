//! ClusterAPINodeClass (karpenter.cluster.x-k8s.io/v1alpha1): which Cluster API scalable
//! resources (MachineDeployments) back a NodePool, and how long to wait for their Machines.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::duration::GoDuration;

/// ClusterAPINodeClassSpec is the top level specification for ClusterAPINodeClasses.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "karpenter.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterAPINodeClass",
    plural = "clusterapinodeclasses",
    singular = "clusterapinodeclass",
    status = "ClusterAPINodeClassStatus",
    category = "karpenter",
    shortname = "capinc",
    shortname = "capincs",
    derive = "PartialEq",
    derive = "Default",
    doc = "ClusterAPINodeClass is the Schema for the ClusterAPINodeClass API"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAPINodeClassSpec {
    /// Selects the Cluster API scalable resources (MachineDeployments) taking part in Karpenter
    /// provisioning; always ANDed with the membership label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub scalable_resource_selector: Option<LabelSelector>,
    /// How long a NodeClaim may wait for its Machine to get a providerID before it is given up
    /// (overrides the controller's `--create-timeout`), e.g. "10m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_timeout: Option<GoDuration>,
    /// Node groups made on demand (opt-in): MachineDeployments copied from one source, one per
    /// machine shape a claim chooses, created, reused and removed by the controller
    /// (docs/generate.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate: Option<Generate>,
}

/// Generated node groups: what to copy, which shapes to offer, how a shape reaches the
/// infrastructure template, what a shape costs, and the limits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Generate {
    /// The MachineDeployment everything is copied from (Cluster, version, bootstrap, labels,
    /// taints, failure domain, infrastructure template). It need not be a member itself.
    pub source: GenerateSource,
    /// The shapes offered: every combination of the listed CPU counts, memory sizes and GPU
    /// counts that the bounds allow.
    pub shapes: Shapes,
    /// Failure domains to offer each shape in (one group per shape and zone); empty: the
    /// source's own failure domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    /// JSON-patch operations applied to the copy of the source's infrastructure template.
    /// String values may hold `{{cpu}}`, `{{memoryMiB}}`, `{{memoryGiB}}`, `{{gpus}}`,
    /// `{{zone}}` and `{{shape}}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<TemplatePatch>,
    /// What a shape costs per hour.
    #[serde(default)]
    pub price: ShapePrice,
    /// The most generated MachineDeployments of the current source that may exist at once
    /// (groups are reused, never made per instance).
    #[serde(default = "default_max_machine_deployments")]
    pub max_machine_deployments: i32,
    /// How long a generated MachineDeployment may stay at zero replicas before it is removed
    /// with its template, e.g. "10m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_after: Option<GoDuration>,
    /// What a change to the source's Machines (template, bootstrap, version, Machine labels)
    /// does to the generated groups: `Drift` (the default: new groups are made, the old ones'
    /// claims drift and are replaced within the disruption budgets, the old groups go when
    /// idle) or `Rollout` (each group keeps its name and gets the new template copy, so
    /// Cluster API rolls its Machines out as for any MachineDeployment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_source_change: Option<String>,
}

fn default_max_machine_deployments() -> i32 {
    10
}

/// The source node group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GenerateSource {
    pub namespace: String,
    pub name: String,
}

/// The grid of shapes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Shapes {
    /// CPU counts offered, e.g. [2, 4, 8, 16].
    pub cpu: Vec<i64>,
    /// Memory sizes offered, as quantities, e.g. ["4Gi", "8Gi", "16Gi"].
    pub memory: Vec<String>,
    /// GPU counts offered (`nvidia.com/gpu`); empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<i64>,
    /// The least memory per CPU a shape may have, e.g. "1Gi".
    #[serde(
        default,
        rename = "minMemoryPerCPU",
        skip_serializing_if = "Option::is_none"
    )]
    pub min_memory_per_cpu: Option<String>,
    /// The most memory per CPU a shape may have, e.g. "8Gi".
    #[serde(
        default,
        rename = "maxMemoryPerCPU",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_memory_per_cpu: Option<String>,
}

/// One JSON-patch operation (RFC 6902) on the copied infrastructure template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplatePatch {
    /// add, replace or remove.
    pub op: String,
    /// A JSON pointer, e.g. /spec/template/spec/numCPUs.
    pub path: String,
    /// The value (any JSON); placeholders are filled in strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub value: Option<serde_json::Value>,
    /// `Integer`: the filled string is written as a number (e.g. vSphere's numCPUs);
    /// `String` (the default): as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_type: Option<String>,
}

/// The price of a shape per hour: the sum of the per-unit rates, unless the table names the
/// shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShapePrice {
    /// Per CPU-hour, a decimal string, e.g. "0.0316".
    #[serde(
        default,
        rename = "perCPUHour",
        skip_serializing_if = "Option::is_none"
    )]
    pub per_cpu_hour: Option<String>,
    /// Per GiB of memory per hour.
    #[serde(
        default,
        rename = "perGiBHour",
        skip_serializing_if = "Option::is_none"
    )]
    pub per_gib_hour: Option<String>,
    /// Per GPU-hour.
    #[serde(
        default,
        rename = "perGPUHour",
        skip_serializing_if = "Option::is_none"
    )]
    pub per_gpu_hour: Option<String>,
    /// Prices of named shapes (`4c-16gi`, `8c-32gi-1gpu`), winning over the rates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub table: Vec<ShapePriceEntry>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShapePriceEntry {
    pub shape: String,
    pub price: String,
}

/// A generated node group as the NodeClass status lists it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GeneratedGroup {
    /// `namespace/name` of the MachineDeployment.
    pub machine_deployment: String,
    pub shape: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    pub replicas: i32,
    /// False once the source changed: its claims drift, and it goes when idle.
    pub current: bool,
}

/// ClusterAPINodeClassStatus is the status for ClusterAPINodeClasses.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAPINodeClassStatus {
    /// Signals for health and readiness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// Rollout status: the generation the counts below were computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Rollout status: nodes whose NodeClaims use this class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i64>,
    /// Rollout status: of those, the nodes matching their specs (not drifted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date_nodes: Option<i64>,
    /// Rollout status: of those, the nodes whose NodeClaim is Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_nodes: Option<i64>,
    /// Rollout status: of those, the nodes both up to date and Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date_and_ready_nodes: Option<i64>,
    /// The node groups generated from `spec.generate` that exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated: Option<Vec<GeneratedGroup>>,
}

impl ClusterAPINodeClass {
    /// The create timeout this class asks for, if any.
    pub fn create_timeout(&self) -> Option<Duration> {
        self.spec.create_timeout.map(|d| d.0)
    }

    pub fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rollout counts are written under the names the CRD declares (camelCase, as
    /// NodePool's), or the API server would prune them.
    #[test]
    fn rollout_status_fields_are_camel_case() {
        let status = ClusterAPINodeClassStatus {
            observed_generation: Some(2),
            nodes: Some(3),
            up_to_date_nodes: Some(1),
            ready_nodes: Some(3),
            up_to_date_and_ready_nodes: Some(1),
            ..Default::default()
        };
        let v = serde_json::to_value(&status).expect("serialises");
        assert_eq!(
            v,
            serde_json::json!({"observedGeneration": 2, "nodes": 3, "upToDateNodes": 1,
                               "readyNodes": 3, "upToDateAndReadyNodes": 1})
        );
    }
}
