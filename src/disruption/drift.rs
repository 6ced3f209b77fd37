//! Drift (Karpenter core v1 plus Cluster API's own signal): a claim no longer matches what its
//! NodePool or its MachineDeployment would launch today, so it is replaced within the budgets.
//!
//! - `NodePoolDrifted`: the claim's `karpenter.sh/nodepool-hash` differs from the NodePool's
//!   hash of `spec.template` (same hash version). The hash is upstream's own (`api::drift_hash`),
//!   so claims written by upstream Karpenter keep their standing in both directions. A claim
//!   stamped with another hash version is re-stamped, not drifted, as upstream does when its
//!   hash function changes; so is one stamped by an earlier release of this controller, whose
//!   hash differed, while its NodePool is unchanged.
//! - `RequirementsDrifted`: the claim's labels no longer satisfy the NodePool's requirements.
//! - `NodeClassDrifted`: the claim's MachineDeployment is gone or no longer selected by its
//!   ClusterAPINodeClass. Only a known change counts: a selected group the catalog cannot read
//!   (malformed annotations, a template not read yet or failing) is unknown, not gone, so one
//!   typo or a slow management cluster during a failover never replaces a node group.
//! - `MachineTemplateDrifted`: Cluster API reports the claim's Machine `UpToDate=False` (its
//!   MachineSet belongs to an outdated template; under `OnDelete` nothing else replaces it),
//!   or, on a MachinePool (whose Machines are always `UpToDate`), the pool's template changed
//!   since the claim's Machine was bound.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::api::drift_hash::nodepool_hash;
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::{NodePool, legacy_hash};
use crate::api::requirements::Requirements;
use crate::api::wellknown::{
    NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION, NODEPOOL_HASH_VERSION_ANNOTATION,
    WELL_KNOWN_LABELS,
};

// The variants are upstream's drift reasons, by name.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drift {
    NodePoolDrifted,
    RequirementsDrifted,
    NodeClassDrifted,
    MachineTemplateDrifted,
}

impl Drift {
    /// The `Drifted` condition's reason, as upstream spells its own.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Drift::NodePoolDrifted => "NodePoolDrifted",
            Drift::RequirementsDrifted => "RequirementsDrifted",
            Drift::NodeClassDrifted => "NodeClassDrifted",
            Drift::MachineTemplateDrifted => "MachineTemplateDrifted",
        }
    }

    pub(crate) fn message(self) -> &'static str {
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
pub(crate) struct Provider {
    /// The claim's MachineDeployment still exists and is selected by the claim's NodeClass,
    /// whether or not the catalog could read what it offers. None when the catalog cannot tell
    /// yet (not built, NodeClass not ready): no verdict then.
    pub(crate) selected: Option<bool>,
    /// The Machine's `UpToDate` condition, or on a pool whether its template is the one the
    /// claim was bound under (None: not reported, not recorded).
    pub(crate) machine_up_to_date: Option<bool>,
}

/// The NodePool side of drift, worked out once per pool: its hash, the hash earlier releases
/// stamped (made on first use: only a stamp that is not today's needs it) and its requirements.
/// A pass reads every claim against these instead of hashing and parsing the pool per claim,
/// which a pass over thousands of claims every half second cannot afford.
pub(crate) struct PoolSpec<'a> {
    np: &'a NodePool,
    hash: String,
    legacy: OnceLock<String>,
    /// None when the pool's requirements do not parse: reported on the pool, drifts nothing.
    requirements: Option<Requirements>,
}

impl<'a> PoolSpec<'a> {
    pub(crate) fn of(np: &'a NodePool) -> Self {
        PoolSpec {
            np,
            hash: nodepool_hash(np),
            legacy: OnceLock::new(),
            requirements: Requirements::from_node_selector_requirements(
                &np.spec.template.spec.requirements,
            )
            .ok(),
        }
    }

    fn legacy(&self) -> &str {
        self.legacy.get_or_init(|| legacy_hash(self.np))
    }
}

/// Why the claim drifted, first reason first; None when it has not.
pub(crate) fn drifted(claim: &NodeClaim, pool: &PoolSpec, provider: Provider) -> Option<Drift> {
    if hash_drifted(claim, pool) {
        return Some(Drift::NodePoolDrifted);
    }
    if requirements_drifted(claim.metadata.labels.as_ref(), pool) {
        return Some(Drift::RequirementsDrifted);
    }
    if provider.selected == Some(false) {
        return Some(Drift::NodeClassDrifted);
    }
    if provider.machine_up_to_date == Some(false) {
        return Some(Drift::MachineTemplateDrifted);
    }
    None
}

/// The claim's stamp is not today's and must be replaced (no drift): another hash version
/// (upstream's rule when its hash function changes), or the hash earlier releases of this
/// controller stamped under the same version while the NodePool has not changed since.
pub(crate) fn needs_restamp(claim: &NodeClaim, pool: &PoolSpec) -> bool {
    let (hash, version) = stamp(claim);
    match (hash, version) {
        (_, Some(v)) if v != NODEPOOL_HASH_VERSION => true,
        (Some(_), None) => true,
        (Some(h), Some(_)) => *h != pool.hash && h == pool.legacy(),
        _ => false,
    }
}

fn stamp(claim: &NodeClaim) -> (Option<&String>, Option<&String>) {
    let a = claim.metadata.annotations.as_ref();
    (
        a.and_then(|a| a.get(NODEPOOL_HASH_ANNOTATION)),
        a.and_then(|a| a.get(NODEPOOL_HASH_VERSION_ANNOTATION)),
    )
}

/// Upstream's rule: a claim drifts when its hash differs from the NodePool's under the same hash
/// version; an unstamped claim or another version never drifts here.
fn hash_drifted(claim: &NodeClaim, pool: &PoolSpec) -> bool {
    let (Some(hash), Some(version)) = stamp(claim) else {
        return false;
    };
    version == NODEPOOL_HASH_VERSION && *hash != pool.hash && hash != pool.legacy()
}

/// Upstream's rule: the claim's labels, read as requirements, must be compatible with the
/// pool's; a key the claim has no label for drifts it only when it is not a well-known label and
/// the pool's requirement needs the label to exist.
fn requirements_drifted(labels: Option<&BTreeMap<String, String>>, pool: &PoolSpec) -> bool {
    let Some(pool) = &pool.requirements else {
        return false;
    };
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    if !pool.compatible_with_labels(labels) {
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

    fn drifted(claim: &NodeClaim, np: &NodePool, provider: Provider) -> Option<Drift> {
        super::drifted(claim, &PoolSpec::of(np), provider)
    }

    fn needs_restamp(claim: &NodeClaim, np: &NodePool) -> bool {
        super::needs_restamp(claim, &PoolSpec::of(np))
    }

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
        assert!(needs_restamp(&c, &after));
        let current = claim(json!({}), stamped(&before, NODEPOOL_HASH_VERSION));
        assert!(!needs_restamp(&current, &before));
        assert!(!needs_restamp(&claim(json!({}), json!({})), &before));
    }

    /// Upstream's drift rule, as its drift controller applies it: hash and version on both the
    /// NodePool (stamped by upstream with its own hash) and the claim; another version never
    /// drifts.
    fn upstream_drifts(claim: &NodeClaim, np: &NodePool) -> bool {
        let a = claim.metadata.annotations.clone().unwrap_or_default();
        match (
            a.get(NODEPOOL_HASH_ANNOTATION),
            a.get(NODEPOOL_HASH_VERSION_ANNOTATION),
        ) {
            (Some(h), Some(v)) => v == "v3" && *h != nodepool_hash(np),
            _ => false,
        }
    }

    /// A claim moves from upstream Karpenter (or the Go provider) to this controller and back
    /// without drifting: the stamps are the same hash of the same template.
    #[test]
    fn claims_move_between_upstream_and_here_without_drifting() {
        let np = pool(json!([]), json!({"team": "a"}));
        // A NodePool as upstream stores it, and the stamp upstream's own code gives its claims
        // (one of drift_hash's vectors).
        let stored: NodePool = serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
            "spec": {"template": {
                "metadata": {"labels": {"team": "a", "tier": "web"}},
                "spec": {"requirements": [], "expireAfter": "720h",
                         "nodeClassRef": {"group": "karpenter.cluster.x-k8s.io",
                                          "kind": "ClusterAPINodeClass", "name": "default"}}}}
        }))
        .expect("a NodePool");
        let from_upstream = claim(
            json!({"team": "a", "tier": "web"}),
            json!({NODEPOOL_HASH_ANNOTATION: "5626587763754066895",
                   NODEPOOL_HASH_VERSION_ANNOTATION: "v3"}),
        );
        assert_eq!(drifted(&from_upstream, &stored, Provider::default()), None);
        assert!(!needs_restamp(&from_upstream, &stored));
        // Stamped here, read by upstream's rule.
        let here = claim(json!({"team": "a"}), stamped(&np, NODEPOOL_HASH_VERSION));
        assert!(!upstream_drifts(&here, &np));
        // Both still see a real template change.
        let changed = pool(json!([]), json!({"team": "b"}));
        assert!(upstream_drifts(&here, &changed));
        assert_eq!(
            drifted(&here, &changed, Provider::default()),
            Some(Drift::NodePoolDrifted)
        );
    }

    /// Karpenter v1.15 kept the hash (version v3, same values: `drift_hash`'s
    /// `karpenter_v1_15_hashes_as_v1_14_did`), so a claim stamped by upstream v1.14 or v1.15 is
    /// not drifted or re-stamped here under a pool as v1.15's API server stores it
    /// (`consolidateAfter` defaulted), and a claim stamped here is not drifted by upstream's rule
    /// under the same pool as v1.14.1 stored it.
    #[test]
    fn claims_stamped_by_karpenter_v1_14_and_v1_15_do_not_drift() {
        let template = json!({"spec": {"requirements": [
                {"key": "example.com/generation", "operator": "Gte", "values": ["3"]}],
            "expireAfter": "720h",
            "nodeClassRef": {"group": "karpenter.cluster.x-k8s.io",
                             "kind": "ClusterAPINodeClass", "name": "default"}}});
        let stored = |disruption: serde_json::Value| -> NodePool {
            serde_json::from_value(json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
                "spec": {"template": template.clone(), "disruption": disruption}
            }))
            .expect("a NodePool")
        };
        let v1_14 = stored(json!({"consolidateAfter": "30s"}));
        let v1_15 = stored(
            json!({"consolidateAfter": "0s", "budgets": [{"nodes": "10%"}],
                                  "consolidationPolicy": "WhenEmptyOrUnderutilized"}),
        );
        // Upstream's value for this template at v1.14.1 and on the v1.15 line alike.
        // Its node's label meets the Gte requirement (requirements drift is read from labels).
        let labels = json!({"example.com/generation": "4"});
        let upstream = claim(
            labels.clone(),
            json!({NODEPOOL_HASH_ANNOTATION: "18334128632711491354",
                   NODEPOOL_HASH_VERSION_ANNOTATION: "v3"}),
        );
        for np in [&v1_14, &v1_15] {
            assert_eq!(drifted(&upstream, np, Provider::default()), None);
            assert!(!needs_restamp(&upstream, np));
        }
        let here = claim(labels, stamped(&v1_15, NODEPOOL_HASH_VERSION));
        assert!(!upstream_drifts(&here, &v1_14));
        assert_eq!(drifted(&here, &v1_14, Provider::default()), None);
    }

    /// A claim stamped by an earlier release of this controller (its own hash, same version) is
    /// re-stamped while its NodePool is unchanged, and drifts once the template changes.
    #[test]
    fn claims_of_earlier_releases_are_restamped_not_drifted() {
        let np = pool(json!([]), json!({"team": "a"}));
        let old = claim(
            json!({"team": "a"}),
            json!({NODEPOOL_HASH_ANNOTATION: legacy_hash(&np),
                   NODEPOOL_HASH_VERSION_ANNOTATION: NODEPOOL_HASH_VERSION}),
        );
        assert_eq!(drifted(&old, &np, Provider::default()), None);
        assert!(needs_restamp(&old, &np));
        let changed = pool(json!([]), json!({"team": "b"}));
        assert_eq!(
            drifted(&old, &changed, Provider::default()),
            Some(Drift::NodePoolDrifted)
        );
        assert!(!needs_restamp(&old, &changed));
    }

    /// Upstream hashes taints as a set: reordering them drifts nothing.
    #[test]
    fn reordering_taints_drifts_nothing() {
        let with = |taints: serde_json::Value| -> NodePool {
            let mut np = pool(json!([]), json!({}));
            np.spec.template.spec.taints = serde_json::from_value(taints).unwrap();
            np
        };
        let ab = with(
            json!([{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}]),
        );
        let ba = with(
            json!([{"key": "b", "effect": "NoExecute"}, {"key": "a", "effect": "NoSchedule"}]),
        );
        let c = claim(json!({}), stamped(&ab, NODEPOOL_HASH_VERSION));
        assert_eq!(drifted(&c, &ba, Provider::default()), None);
        assert!(!needs_restamp(&c, &ba));
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
            selected: Some(false),
            machine_up_to_date: None,
        };
        assert_eq!(drifted(&c, &np, gone), Some(Drift::NodeClassDrifted));
        let unknown = Provider {
            selected: None,
            machine_up_to_date: None,
        };
        assert_eq!(drifted(&c, &np, unknown), None);
        let outdated = Provider {
            selected: Some(true),
            machine_up_to_date: Some(false),
        };
        assert_eq!(
            drifted(&c, &np, outdated),
            Some(Drift::MachineTemplateDrifted)
        );
    }
}
