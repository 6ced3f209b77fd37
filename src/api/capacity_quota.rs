//! CapacityQuota (autoscaling.x-k8s.io/v1beta1, SIG Autoscaling's API, read by Cluster
//! Autoscaler since 1.37): a cap on the summed capacity (cpu, memory, any resource) and count
//! of the nodes a label selector picks. Provisioning opens no claim that would take a quota
//! covering it over a limit; the quota's status says what its nodes use.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::resources::{Quantity, Resources};

/// The condition upstream's controller writes on every quota it reconciles.
pub const RECONCILED: &str = "Reconciled";
/// `Reconciled` reasons (upstream's).
pub const RECONCILIATION_SUCCEEDED: &str = "ReconciliationSucceeded";
pub const RECONCILIATION_FAILED: &str = "ReconciliationFailed";
/// The resource key that counts nodes rather than summing a capacity.
pub const NODES: &str = "nodes";

/// CapacityQuotaSpec defines the desired state of CapacityQuota.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "autoscaling.x-k8s.io",
    version = "v1beta1",
    kind = "CapacityQuota",
    plural = "capacityquotas",
    singular = "capacityquota",
    shortname = "cq",
    status = "CapacityQuotaStatus",
    derive = "PartialEq",
    doc = "CapacityQuota limits the resources the node autoscaler may provision: the capacity of the nodes its selector picks, summed, may not exceed its limits."
)]
#[serde(rename_all = "camelCase")]
pub struct CapacityQuotaSpec {
    /// Selects the nodes the quota applies to; empty or unset selects every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub selector: Option<LabelSelector>,
    /// The quota's limits.
    pub limits: CapacityQuotaLimits,
}

/// CapacityQuotaLimits define quota limits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CapacityQuotaLimits {
    /// Resource limits: cpu, memory, any other node capacity, and `nodes` (the node count).
    /// Non-negative integers only (no milli quantities).
    #[schemars(extend(
        "maxProperties" = 20,
        "x-kubernetes-validations" = [
            {"message": "Resource names must be 63 characters or less.", "rule": "self.all(key, size(key) <= 63)"},
            {"message": "All resource quantities must be non-negative integers.", "rule": "self.all(key, type(self[key]) == int ? self[key] >= 0 : (!self[key].startsWith('-') && quantity(self[key]).isInteger()))"}
        ]
    ))]
    pub resources: BTreeMap<String, K8sQuantity>,
}

/// CapacityQuotaStatus defines the observed state of CapacityQuota.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityQuotaStatus {
    /// What the selected nodes use of the limited resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<CapacityQuotaUsage>,
    /// `Reconciled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
    /// The generation the status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// CapacityQuotaUsage shows the current usage of the quota.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CapacityQuotaUsage {
    /// Usage of each resource the limits name.
    pub resources: BTreeMap<String, K8sQuantity>,
}

/// Why a quota cannot be enforced: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct Malformed {
    pub field: String,
    pub problem: String,
}

impl CapacityQuota {
    /// The limits as quantities, each checked as the CRD's rules do (kube-apiserver enforces
    /// them; an object stored before the CRD was applied, or a schema-less store, may not).
    pub fn limits(&self) -> Result<Resources, Malformed> {
        let mut out = Resources::new();
        for (key, q) in &self.spec.limits.resources {
            let field = format!("spec.limits.resources.{key}");
            let bad = |problem: String| Malformed {
                field: field.clone(),
                problem,
            };
            let v =
                Quantity::from_k8s(q).map_err(|_| bad(format!("{:?} is not a quantity", q.0)))?;
            if q.0.trim_start().starts_with('-') || v.as_nanos() < 0 {
                return Err(bad(format!("{:?} is negative", q.0)));
            }
            if v.as_nanos() % 1_000_000_000 != 0 {
                return Err(bad(format!("{:?} is not a whole number", q.0)));
            }
            out.set(key, v);
        }
        Ok(out)
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

    fn quota(limits: &[(&str, &str)]) -> CapacityQuota {
        CapacityQuota::new(
            "q",
            CapacityQuotaSpec {
                selector: None,
                limits: CapacityQuotaLimits {
                    resources: limits
                        .iter()
                        .map(|(k, v)| (k.to_string(), K8sQuantity(v.to_string())))
                        .collect(),
                },
            },
        )
    }

    #[test]
    fn limits_are_whole_non_negative_quantities() {
        let ok = quota(&[("cpu", "8"), ("memory", "32Gi"), ("nodes", "3")]);
        let l = ok.limits().unwrap();
        assert_eq!(l.get("cpu"), Quantity::from_units(8));
        assert_eq!(l.get("nodes"), Quantity::from_units(3));
        for (v, why) in [
            ("500m", "whole"),
            ("-1", "negative"),
            ("lots", "not a quantity"),
        ] {
            let err = quota(&[("cpu", v)]).limits().unwrap_err();
            assert_eq!(err.field, "spec.limits.resources.cpu");
            assert!(err.problem.contains(why), "{v}: {err}");
        }
    }
}
