//! Drift (Karpenter core v1 plus Cluster API's own signal): a claim no longer matches what its
//! NodePool or its MachineDeployment would launch today, so it is replaced within the budgets.
//!
//! - `NodePoolDrifted`: the claim's `karpenter.sh/nodepool-hash` differs from the NodePool's
//!   hash of `spec.template` (same hash version). A claim stamped with another hash version is
//!   re-stamped, not drifted: that is how upstream survives a change of the hash function, and
//!   claims written by another Karpenter keep working.
//! - `RequirementsDrifted`: the claim's labels no longer satisfy the NodePool's requirements.
//! - `NodeClassDrifted`: the claim's MachineDeployment is gone or no longer selected by its
//!   ClusterAPINodeClass.
//! - `MachineTemplateDrifted`: Cluster API reports the claim's Machine `UpToDate=False` (its
//!   MachineSet belongs to an outdated template; under `OnDelete` nothing else replaces it).

use std::collections::BTreeMap;

use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::{NodePool, nodepool_hash};
use crate::api::requirements::Requirements;
use crate::api::wellknown::{
    NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION, NODEPOOL_HASH_VERSION_ANNOTATION,
    WELL_KNOWN_LABELS,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drift {
    NodePoolDrifted,
    RequirementsDrifted,
    NodeClassDrifted,
    MachineTemplateDrifted,
}

impl Drift {
    /// The `Drifted` condition's reason, as upstream spells its own.
    pub fn reason(self) -> &'static str {
        match self {
            Drift::NodePoolDrifted => "NodePoolDrifted",
            Drift::RequirementsDrifted => "RequirementsDrifted",
            Drift::NodeClassDrifted => "NodeClassDrifted",
            Drift::MachineTemplateDrifted => "MachineTemplateDrifted",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Drift::NodePoolDrifted => "the NodePool's template changed since the claim was created",
            Drift::RequirementsDrifted => {
                "the claim's labels no longer satisfy the NodePool's requirements"
            }
            Drift::NodeClassDrifted => {
                "the claim's MachineDeployment is gone or no longer selected by its ClusterAPINodeClass"
            }
            Drift::MachineTemplateDrifted => {
                "Cluster API reports the claim's Machine not UpToDate with its MachineDeployment's template"
            }
        }
    }
}

/// What drift looks at besides the claim and its pool.
#[derive(Clone, Copy, Debug, Default)]
pub struct Provider {
    /// The claim's MachineDeployment is still offered by the claim's NodeClass. None when the
    /// catalog cannot tell yet (not built, NodeClass not ready): no verdict then.
    pub offered: Option<bool>,
    /// The Machine's `UpToDate` condition (None: not reported).
    pub machine_up_to_date: Option<bool>,
}

/// Why the claim drifted, first reason first; None when it has not.
pub fn drifted(claim: &NodeClaim, np: &NodePool, provider: Provider) -> Option<Drift> {
    if hash_drifted(claim, np) {
        return Some(Drift::NodePoolDrifted);
    }
    if requirements_drifted(claim.metadata.labels.as_ref(), np) {
        return Some(Drift::RequirementsDrifted);
    }
    if provider.offered == Some(false) {
        return Some(Drift::NodeClassDrifted);
    }
    if provider.machine_up_to_date == Some(false) {
        return Some(Drift::MachineTemplateDrifted);
    }
    None
}

/// The claim carries a hash of another hash version: re-stamp it with today's (no drift).
pub fn needs_restamp(claim: &NodeClaim) -> bool {
    let annotations = claim.metadata.annotations.as_ref();
    let version = annotations.and_then(|a| a.get(NODEPOOL_HASH_VERSION_ANNOTATION));
    version.is_some_and(|v| v != NODEPOOL_HASH_VERSION)
        || (version.is_none()
            && annotations.is_some_and(|a| a.contains_key(NODEPOOL_HASH_ANNOTATION)))
}

fn hash_drifted(claim: &NodeClaim, np: &NodePool) -> bool {
    let Some(a) = claim.metadata.annotations.as_ref() else {
        return false;
    };
    let (Some(hash), Some(version)) = (
        a.get(NODEPOOL_HASH_ANNOTATION),
        a.get(NODEPOOL_HASH_VERSION_ANNOTATION),
    ) else {
        return false;
    };
    version == NODEPOOL_HASH_VERSION && *hash != nodepool_hash(np)
}

/// Upstream's rule: the claim's labels, read as requirements, must be compatible with the
/// pool's; a key the claim has no label for drifts it only when it is not a well-known label and
/// the pool's requirement needs the label to exist.
fn requirements_drifted(labels: Option<&BTreeMap<String, String>>, np: &NodePool) -> bool {
    let Ok(pool) =
        Requirements::from_node_selector_requirements(&np.spec.template.spec.requirements)
    else {
        // An invalid pool is reported on the pool; it drifts nothing.
        return false;
    };
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    if Requirements::from_labels(labels).compatible(&pool).is_err() {
        return true;
    }
    pool.iter().any(|r| {
        !labels.contains_key(r.key()) && !WELL_KNOWN_LABELS.contains(&r.key()) && !r.allows_absent()
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pool(requirements: serde_json::Value, labels: serde_json::Value) -> NodePool {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
            "spec": {"template": {
                "metadata": {"labels": labels},
                "spec": {"requirements": requirements,
                         "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}}}}
        }))
        .expect("a NodePool")
    }

    fn claim(labels: serde_json::Value, annotations: serde_json::Value) -> NodeClaim {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c", "labels": labels, "annotations": annotations},
            "spec": {"requirements": [],
                     "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}}
        }))
        .expect("a NodeClaim")
    }

    fn stamped(np: &NodePool, version: &str) -> serde_json::Value {
        json!({NODEPOOL_HASH_ANNOTATION: nodepool_hash(np),
               NODEPOOL_HASH_VERSION_ANNOTATION: version})
    }

    #[test]
    fn a_template_change_drifts_the_claim() {
        let before = pool(json!([]), json!({"team": "a"}));
        let after = pool(json!([]), json!({"team": "b"}));
        let c = claim(
            json!({"team": "a"}),
            stamped(&before, NODEPOOL_HASH_VERSION),
        );
        assert_eq!(drifted(&c, &before, Provider::default()), None);
        assert_eq!(
            drifted(&c, &after, Provider::default()),
            Some(Drift::NodePoolDrifted)
        );
    }

    #[test]
    fn another_hash_version_is_restamped_not_drifted() {
        let before = pool(json!([]), json!({"team": "a"}));
        let after = pool(json!([]), json!({"team": "b"}));
        let c = claim(json!({}), stamped(&before, "v2"));
        assert_eq!(drifted(&c, &after, Provider::default()), None);
        assert!(needs_restamp(&c));
        let current = claim(json!({}), stamped(&before, NODEPOOL_HASH_VERSION));
        assert!(!needs_restamp(&current));
        assert!(!needs_restamp(&claim(json!({}), json!({}))));
    }

    #[test]
    fn requirements_the_labels_no_longer_satisfy_drift_the_claim() {
        let np = pool(
            json!([{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5"]},
                   {"key": "team", "operator": "Exists"}]),
            json!({}),
        );
        let ok = claim(
            json!({"node.kubernetes.io/instance-type": "m5", "team": "x"}),
            json!({}),
        );
        assert_eq!(drifted(&ok, &np, Provider::default()), None);
        let other_type = claim(
            json!({"node.kubernetes.io/instance-type": "c5", "team": "x"}),
            json!({}),
        );
        assert_eq!(
            drifted(&other_type, &np, Provider::default()),
            Some(Drift::RequirementsDrifted)
        );
        // A custom key the pool now requires and the claim lacks.
        let no_team = claim(json!({"node.kubernetes.io/instance-type": "m5"}), json!({}));
        assert_eq!(
            drifted(&no_team, &np, Provider::default()),
            Some(Drift::RequirementsDrifted)
        );
        // A well-known key the claim has no label for is not drift.
        let np_zone = pool(
            json!([{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]),
            json!({}),
        );
        assert_eq!(
            drifted(&claim(json!({}), json!({})), &np_zone, Provider::default()),
            None
        );
    }

    #[test]
    fn the_provider_side_drifts_too_but_only_when_it_can_tell() {
        let np = pool(json!([]), json!({}));
        let c = claim(json!({}), json!({}));
        let gone = Provider {
            offered: Some(false),
            machine_up_to_date: None,
        };
        assert_eq!(drifted(&c, &np, gone), Some(Drift::NodeClassDrifted));
        let unknown = Provider {
            offered: None,
            machine_up_to_date: None,
        };
        assert_eq!(drifted(&c, &np, unknown), None);
        let outdated = Provider {
            offered: Some(true),
            machine_up_to_date: Some(false),
        };
        assert_eq!(
            drifted(&c, &np, outdated),
            Some(Drift::MachineTemplateDrifted)
        );
    }
}
