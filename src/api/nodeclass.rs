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
