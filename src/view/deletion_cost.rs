//! Pod deletion cost management (`--feature-gates PodDeletionCostManagement=true`, Karpenter
//! v1.15's alpha): the managed nodes ranked in the order disruption would remove them, and the
//! `controller.kubernetes.io/pod-deletion-cost` each pod on them should carry, so that a
//! ReplicaSet scale-in (lower cost deleted first) empties those nodes first and consolidation
//! has fewer pods to evict. Upstream writes it on every pod of a ranked node; only a ReplicaSet
//! reads it, and DaemonSet and static pods are left out here (no scale-in chooses among them). The actor (`actors::deletion_cost`) writes what [`plan`] says.
//!
//! Ownership is marked with `karpenter.sh/managed-deletion-cost: "true"`: a deletion cost without
//! it is the pod owner's and never touched; a managed value someone else changed is released
//! (the marker removed, the pod left alone from then on) and reported.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::Inputs;
use super::disruption::{View, under_way};
use crate::api::wellknown::{MANAGED_DELETION_COST_ANNOTATION, POD_DELETION_COST_ANNOTATION};
use crate::disruption::Candidate;
use crate::state::Pods;
use crate::state::pods::{
    deletion_cost_managed, is_active, is_daemonset_pod, is_mirror_pod, key, node_name,
};

/// Upstream's bound: at most this many nodes carry deletion costs, so a large cluster's ranking
/// costs a bounded number of pod writes a period.
pub(crate) const MAX_RANKED_NODES: usize = 50;

/// The nodes a scale-in should empty first, first first, at most [`MAX_RANKED_NODES`]: the nodes
/// being disrupted already (their pods are evicted anyway), then the drift candidates (oldest
/// drift first), then the other candidates in consolidation's order (most savings per unit of
/// disruption first). Nodes the view holds back (do-not-disrupt, a PodDisruptionBudget, a paused
/// MachineDeployment or one at its minimum size, a static pool) are not about to be removed and
/// are left out, so their pods lose any managed cost.
pub(crate) fn rank(inputs: Inputs<'_>, view: &View) -> Vec<String> {
    ranking(disrupting(inputs), &view.candidates)
}

/// [`rank`] over its inputs: the nodes being disrupted and the candidates.
pub(crate) fn ranking(mut disrupting: Vec<String>, candidates: &[Candidate]) -> Vec<String> {
    disrupting.sort();
    let mut drifted: Vec<&Candidate> = candidates.iter().filter(|c| c.drift.is_some()).collect();
    drifted.sort_by(|a, b| {
        a.drifted_since
            .unwrap_or(i64::MAX)
            .cmp(&b.drifted_since.unwrap_or(i64::MAX))
            .then_with(|| a.claim.cmp(&b.claim))
    });
    let mut rest: Vec<&Candidate> = candidates.iter().filter(|c| c.drift.is_none()).collect();
    rest.sort_by(|a, b| {
        b.savings_ratio()
            .total_cmp(&a.savings_ratio())
            .then_with(|| a.claim.cmp(&b.claim))
    });
    let mut seen = HashSet::new();
    disrupting
        .into_iter()
        .chain(drifted.into_iter().chain(rest).map(|c| c.node.clone()))
        .filter(|n| seen.insert(n.clone()))
        .take(MAX_RANKED_NODES)
        .collect()
}

/// Nodes whose claim is being deleted or under a disruption command (the disrupted taint or a
/// `DisruptionReason` condition).
fn disrupting(inputs: Inputs<'_>) -> Vec<String> {
    let claims = inputs.state.claims.read();
    let nodes = inputs.state.nodes.read();
    claims
        .all()
        .filter_map(|c| {
            let name = c.status.as_ref()?.node_name.clone()?;
            let node = nodes.compact(&name).map(|n| &**n);
            let going = c.metadata.deletion_timestamp.is_some()
                || node.is_some_and(|n| n.deleting())
                || under_way(c, node);
            going.then_some(name)
        })
        .collect()
}

/// The deletion cost of the pods on the node ranked `position` (0 first): the lowest values
/// first, all below Kubernetes' default of 0, so an unranked node's pods go after every ranked
/// one's. Set by position alone, so a node added at the end changes no other node's value.
pub(crate) fn cost_at(position: usize) -> i32 {
    let position = i32::try_from(position).unwrap_or(i32::MAX);
    position.saturating_sub(MAX_RANKED_NODES as i32)
}

/// What to do to one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write this deletion cost and the ownership marker.
    Set(i32),
    /// The pod's node left the ranking: remove the cost and the marker.
    Clear,
    /// Someone else changed the managed cost: remove only the marker and leave the pod alone
    /// from then on (an Event says so).
    Release,
}

#[derive(Clone, Debug)]
pub(crate) struct Write {
    pub(crate) pod: Arc<Pod>,
    pub(crate) action: Action,
}

/// The writes that bring every pod a scale-in may choose to the ranking. `written` holds, per pod key, the
/// value this controller last wrote there (a managed value that differs was changed by someone
/// else). Nothing is written for a pod already as it should be, so an unchanged ranking writes
/// nothing.
pub(crate) fn plan(
    ranking: &[String],
    pods: &Pods,
    written: &HashMap<String, String>,
) -> Vec<Write> {
    let position: HashMap<&str, usize> = ranking
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let mut writes = Vec::new();
    for pod in pods.bound() {
        let Some(node) = node_name(&pod) else {
            continue;
        };
        if !scaled_in_by_choice(&pod) {
            continue;
        }
        let wanted = position.get(node).map(|i| cost_at(*i));
        if let Some(action) = action(&pod, wanted, written.get(&key(&pod))) {
            writes.push(Write { pod, action });
        }
    }
    writes
}

/// What the pod needs, given the cost its node's rank asks for (`wanted`) and the value this
/// controller last wrote on it (`ours`).
fn action(pod: &Pod, wanted: Option<i32>, ours: Option<&String>) -> Option<Action> {
    let current = pod.annotations().get(POD_DELETION_COST_ANNOTATION);
    let managed = deletion_cost_managed(pod);
    if !managed {
        // The owner's own value (or a pod released before) is never touched; a pod whose marker
        // was removed by someone else is theirs too.
        let marker = pod
            .annotations()
            .contains_key(MANAGED_DELETION_COST_ANNOTATION);
        return match (current, marker, wanted) {
            (None, false, Some(cost)) => Some(Action::Set(cost)),
            _ => None,
        };
    }
    // With no record (this controller restarted), the marker vouches for the value; a value
    // removed but for the marker is written again (upstream reads only a different value as
    // someone else's).
    if ours.is_some_and(|ours| current.is_some_and(|now| now != ours)) {
        return Some(Action::Release);
    }
    match wanted {
        Some(cost) if current.map(String::as_str) == Some(cost.to_string().as_str()) => None,
        Some(cost) => Some(Action::Set(cost)),
        None => Some(Action::Clear),
    }
}

/// A pod a workload's scale-in may choose: active, and neither a DaemonSet's (one per node,
/// never scaled in) nor a static pod (the kubelet's).
fn scaled_in_by_choice(p: &Pod) -> bool {
    is_active(p) && !is_daemonset_pod(p) && !is_mirror_pod(p)
}

#[cfg(test)]
mod tests;
