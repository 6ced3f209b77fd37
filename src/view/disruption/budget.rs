//! The pass's disruption budgets: where each claim stands in its pool's budget, what each pool
//! may still disrupt per reason, and the pools whose candidates wait for their budget.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use jiff::Timestamp;

use super::claim::{expired, under_way};
use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::{DisruptionReason, NodePool};
use crate::disruption::{Allowed, Candidate, budgets};
use crate::state::compact::CompactNode;

const REASONS: [DisruptionReason; 4] = [
    DisruptionReason::Empty,
    DisruptionReason::Drifted,
    DisruptionReason::Underutilized,
    DisruptionReason::Unhealthy,
];

/// Where a claim stands in its pool's disruption budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BudgetStanding {
    /// It is one of the pool's nodes the budget's percentage is of.
    pub(crate) counted: bool,
    /// It uses up a disruption of the budget now.
    pub(crate) disrupting: bool,
    /// It is disrupting only because its Node is not Ready: down, but nothing is taking it
    /// down. Repair's own budget does not count it (see [`allow`]).
    pub(crate) down: bool,
}

/// Upstream's budget accounting: only initialized claims count, less those whose instance is
/// already terminating; of them, the ones whose Node is not Ready, the ones going away (claim or
/// Node deleting, or expired), those of the commands under way (or, as the caller says,
/// whose Machine Cluster API is deleting) and those still marked (the disrupted taint or the
/// `DisruptionReason` condition) are disrupting. A rolled-back command leaves its marks until
/// the next pass removes them: until then the claim is disrupting for everyone who reads the
/// cluster, so it uses the budget here too (upstream unmarks before it frees the budget). A claim whose
/// Node is already gone still counts while it is deleted (upstream keeps its state node for the
/// claim alone). A launch that never initialized uses no budget when it is deleted, and during an
/// outage (Nodes NotReady) nothing more is disrupted voluntarily.
pub(crate) fn budget_standing(
    c: &NodeClaim,
    node: Option<&CompactNode>,
    executing: bool,
    now: Timestamp,
) -> BudgetStanding {
    let counted = conditions::is_true(c.conditions(), conditions::INITIALIZED)
        && !conditions::is_true(c.conditions(), conditions::INSTANCE_TERMINATING);
    let going = c.metadata.deletion_timestamp.is_some()
        || node.is_some_and(CompactNode::deleting)
        || expired(c, now)
        || under_way(c, node);
    let not_ready = node.is_some_and(|n| !n.ready());
    BudgetStanding {
        counted,
        // A claim of a command under way counts from the command's start, before its marks
        // reach the index: the next pass may come first.
        disrupting: counted && (going || executing || not_ready),
        down: counted && not_ready && !going && !executing,
    }
}

/// One pool's claims in its budget: those its percentage is of, and those of them disrupting.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct BudgetCount {
    counted: usize,
    disrupting: usize,
    down: usize,
}

impl BudgetCount {
    pub(super) fn add(&mut self, standing: BudgetStanding) {
        if standing.counted {
            self.counted += 1;
            if standing.disrupting {
                self.disrupting += 1;
            }
            if standing.down {
                self.down += 1;
            }
        }
    }
}

/// Disruptions allowed now per pool and reason, and the budgets' use (`View::budget_use`).
pub(super) type Allowances = (
    HashMap<(String, DisruptionReason), usize>,
    Vec<(String, DisruptionReason, usize, usize)>,
);

/// Per pool and reason: how many nodes may start disrupting now, and the budget's whole
/// allowance beside the nodes disrupting.
///
/// A node that is merely down (NotReady, nothing disrupting it) uses the budgets of every
/// reason, as upstream counts it, except repair's own: otherwise the node a repair is for
/// would use up the slot it needs (10 % of a pool of ten or fewer is one node), and repair
/// would never act where it matters most. Repairs under way still count, so the `Unhealthy`
/// budget paces how many nodes repair takes down at once.
pub(super) fn allow(
    pools: &HashMap<String, Arc<NodePool>>,
    counts: &HashMap<String, BudgetCount>,
    now: Timestamp,
) -> Allowances {
    let now_unix = now.as_second();
    let (mut left, mut used) = (HashMap::new(), Vec::new());
    for (name, np) in pools {
        let count = counts.get(name).copied().unwrap_or_default();
        for reason in REASONS {
            let busy = match reason {
                DisruptionReason::Unhealthy => count.disrupting - count.down,
                _ => count.disrupting,
            };
            let n = count.counted;
            left.insert(
                (name.clone(), reason),
                budgets::allowed(np, reason, n, busy, now_unix),
            );
            let whole = budgets::allowed(np, reason, n, 0, now_unix);
            used.push((name.clone(), reason, whole, busy));
        }
    }
    (left, used)
}

/// The pools with candidates for a reason whose budget allows no disruption now, in order.
pub(super) fn blocked(
    candidates: &[Candidate],
    allowed: &Allowed,
    pools: &HashMap<String, Arc<NodePool>>,
) -> Vec<(Arc<NodePool>, DisruptionReason)> {
    let mut blocked: HashSet<(String, DisruptionReason)> = HashSet::new();
    for c in candidates {
        for reason in c.eligible_reasons() {
            if allowed.get(&c.nodepool, reason) == 0 {
                blocked.insert((c.nodepool.clone(), reason));
            }
        }
    }
    let mut blocked: Vec<(String, DisruptionReason)> = blocked.into_iter().collect();
    blocked.sort();
    blocked
        .into_iter()
        .filter_map(|(pool, reason)| pools.get(&pool).map(|np| (np.clone(), reason)))
        .collect()
}
