//! Node repair in a disruption pass (Karpenter v1.15): which weighed claims are due for repair
//! and which are held back, and why. Repair rides the budgets like any disruption, but it is
//! not held by what protects a healthy node from voluntary disruption (`do-not-disrupt`,
//! minimum size, a rollout, consolidation's waits): a node that is down is no capacity to
//! protect. It is held by `do-not-repair`, by the operator's pause and by a paused Cluster or
//! MachineDeployment (no replica write can replace the node), and, as in every mode, by the
//! unhealthy-fraction guard and a MachineHealthCheck (`view::repair::decide`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use jiff::Timestamp;
use kube::ResourceExt;

use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::NodePool;
use crate::api::wellknown::DO_NOT_REPAIR_ANNOTATION;
use crate::disruption::{RepairVerdict, pause, repair};
use crate::state::compact::CompactNode;
use crate::view::Inputs;
use crate::view::repair::{Repair, decide};

/// The claims due for repair this pass, by name, and the ones whose repair the guard or a
/// MachineHealthCheck holds back: (claim, node, why).
#[derive(Default)]
pub(super) struct Due {
    pub(super) by_claim: HashMap<String, Repair>,
    pub(super) blocked: Vec<(Arc<NodeClaim>, String, String)>,
    pub(super) held_pools: BTreeMap<String, String>,
}

/// What is due when node repair runs as a disruption method; nothing otherwise (off, or the
/// legacy actor's). Read before the pass locks the indexes (the decision reads them too).
pub(super) fn due(inputs: Inputs<'_>, now: Timestamp) -> Due {
    let Some(policies) = inputs.settings.voluntary_repair() else {
        return Due::default();
    };
    let decision = decide(inputs, policies, now);
    Due {
        by_claim: decision
            .repair
            .into_iter()
            .map(|r| (r.claim.name_any(), r))
            .collect(),
        blocked: decision.blocked,
        held_pools: decision.held_pools,
    }
}

/// Why a claim due for repair is held back now, if it is: `do-not-repair: "true"` on it or its
/// Node, the operator's pause of its pool, or its paused MachineDeployment (`paused`).
pub(super) fn held(
    claim: &NodeClaim,
    node: &CompactNode,
    np: &NodePool,
    operator_paused: bool,
    paused: Option<String>,
) -> Option<String> {
    let vetoed = |value: Option<&str>| value == Some("true");
    if vetoed(
        claim
            .annotations()
            .get(DO_NOT_REPAIR_ANNOTATION)
            .map(String::as_str),
    ) {
        return Some(format!(
            "repair is blocked through the \"{DO_NOT_REPAIR_ANNOTATION}\" annotation on the NodeClaim"
        ));
    }
    if vetoed(node.annotations().get(DO_NOT_REPAIR_ANNOTATION)) {
        return Some(format!(
            "repair is blocked through the \"{DO_NOT_REPAIR_ANNOTATION}\" annotation on the Node"
        ));
    }
    if let Some(p) = pause::paused(operator_paused, np) {
        return Some(p.message());
    }
    paused
}

/// The verdict the decision orders repairs by.
pub(super) fn verdict(r: &Repair) -> RepairVerdict {
    RepairVerdict {
        condition: r.condition.clone(),
        score: repair::score(r.rank, r.overdue),
        termination_grace_period: r.termination_grace_period,
        why: r.why.clone(),
    }
}
