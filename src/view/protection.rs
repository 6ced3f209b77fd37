//! What protects a node from voluntary disruption, as upstream decides it: `do-not-disrupt` on
//! the claim or its Node, an active pod's `do-not-disrupt` (the duration form included), and a
//! PodDisruptionBudget that would refuse a pod's eviction now.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;

use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::DO_NOT_DISRUPT_ANNOTATION;
use crate::disruption::{Blocker, Hold};
use crate::scheduling::selector::Selector;
use crate::state::compact::CompactNode;
use crate::state::pods::PodSummary;

/// `do-not-disrupt: "true"` on the claim or its Node.
pub(super) fn node_protected(c: &NodeClaim, node: &CompactNode) -> Option<Hold> {
    let dnd = |a: &BTreeMap<String, String>| {
        a.get(DO_NOT_DISRUPT_ANNOTATION).map(String::as_str) == Some("true")
    };
    let on = if dnd(c.annotations()) {
        "NodeClaim"
    } else if node.annotations().get(DO_NOT_DISRUPT_ANNOTATION) == Some("true") {
        "Node"
    } else {
        return None;
    };
    Some(Hold::new(
        Blocker::DoNotDisrupt,
        format!(
            "disruption is blocked through the \"{DO_NOT_DISRUPT_ANNOTATION}\" annotation on the {on}"
        ),
    ))
}

/// A pod that blocks the node's eviction: do-not-disrupt, or a PodDisruptionBudget.
pub(super) fn pods_protected(
    on_node: &[&PodSummary],
    pdbs: &PdbIndex,
    now: Timestamp,
) -> Option<Hold> {
    // Upstream's `IsDisruptable`: an active pod (DaemonSet and static ones included) whose
    // do-not-disrupt is "true" or a duration still running since it started.
    for p in on_node.iter().filter(|p| p.is_active()) {
        if p.do_not_disrupt(now) {
            let why = format!(
                "pod {} has the \"{DO_NOT_DISRUPT_ANNOTATION}\" annotation",
                p.key()
            );
            return Some(Hold::new(Blocker::DoNotDisrupt, why));
        }
    }
    // Upstream's `CanEvictPods`: every pod a drain would evict, DaemonSet pods included.
    for p in on_node.iter().filter(|p| p.is_evictable(now)) {
        if let Some(why) = pdbs.blocks(p) {
            return Some(Hold::new(Blocker::Pdb, why));
        }
    }
    None
}

/// PodDisruptionBudgets by namespace, parsed once per pass.
pub(super) struct PdbIndex {
    by_ns: HashMap<String, Vec<Budget>>,
}

struct Budget {
    name: String,
    selector: Selector,
    disruptions_allowed: i32,
    /// `unhealthyPodEvictionPolicy: AlwaysAllow`: a pod that is not Ready may always be evicted.
    always_allow_unhealthy: bool,
}

impl PdbIndex {
    pub(super) fn new(pdbs: &BTreeMap<String, Arc<PodDisruptionBudget>>) -> Self {
        let mut by_ns: HashMap<String, Vec<Budget>> = HashMap::new();
        for pdb in pdbs.values() {
            let what = format!("PodDisruptionBudget {}", pdb.name_any());
            // A selector we cannot read protects nothing we can name; the API validates them.
            let Ok(sel) =
                Selector::parse(pdb.spec.as_ref().and_then(|s| s.selector.as_ref()), &what)
            else {
                continue;
            };
            let allowed = pdb
                .status
                .as_ref()
                .map(|s| s.disruptions_allowed)
                .unwrap_or(0);
            let always_allow_unhealthy = pdb
                .spec
                .as_ref()
                .and_then(|s| s.unhealthy_pod_eviction_policy.as_deref())
                == Some("AlwaysAllow");
            by_ns
                .entry(pdb.namespace().unwrap_or_default())
                .or_default()
                .push(Budget {
                    name: pdb.name_any(),
                    selector: sel,
                    disruptions_allowed: allowed,
                    always_allow_unhealthy,
                });
        }
        Self { by_ns }
    }

    /// Upstream's rule: a pod whose PodDisruptionBudget allows no disruption now, or that more
    /// than one budget selects (the Eviction API refuses those), blocks its node.
    fn blocks(&self, p: &PodSummary) -> Option<String> {
        let ns = p.namespace();
        let matching: Vec<&Budget> = self
            .by_ns
            .get(ns)
            .map(|v| {
                v.iter()
                    .filter(|b| b.selector.matches(p.labels()))
                    .collect()
            })
            .unwrap_or_default();
        match matching.as_slice() {
            [] => None,
            [b] if b.always_allow_unhealthy && p.not_ready() => None,
            [b] if b.disruptions_allowed <= 0 => Some(format!(
                "PodDisruptionBudget {ns}/{} prevents evicting pod {}",
                b.name,
                p.key()
            )),
            [_] => None,
            many => Some(format!(
                "pod {} is selected by {} PodDisruptionBudgets",
                p.key(),
                many.len()
            )),
        }
    }
}
