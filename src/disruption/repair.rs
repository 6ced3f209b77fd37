//! Node repair as a voluntary disruption (Karpenter v1.15): a node unhealthy past its
//! toleration is replaced within its NodePool's `Unhealthy` budget, its replacement launched
//! and initialized before it goes, the most overdue first. Which nodes are due, and which are
//! held back (the unhealthy-fraction guard, a MachineHealthCheck, `do-not-repair`), is the
//! view's (`view::repair`, `view::disruption`); this module only decides among them.

use std::cmp::Ordering;
use std::time::Duration;

use super::{
    Allowed, Candidate, Command, Method, command, drift_replacements, every_one_fresh,
    static_replacement, terminate_first,
};
use crate::api::nodepool::DisruptionReason;
use crate::scheduling::Snapshot;

/// Upstream's aging constant: a node this far past its toleration scores one more.
pub(crate) const AGING: Duration = Duration::from_secs(30 * 60);

/// Why a candidate is due for repair.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RepairVerdict {
    /// The condition, as upstream's `condition` label writes it (`ready`).
    pub(crate) condition: String,
    /// Upstream's score: the dense rank of its policy's priority plus the time past the
    /// toleration over [`AGING`]. The highest goes first.
    pub(crate) score: f64,
    /// How long the drain may take (zero: forceful).
    pub(crate) termination_grace_period: Duration,
    /// `Node x has been Ready=False since …` (for the Event).
    pub(crate) why: String,
}

/// The score of a node `overdue` past the toleration of a policy of priority rank `rank`: a
/// more urgent diagnosis goes first, and one waiting [`AGING`] longer climbs a rank, so a
/// flood of low-priority repairs cannot starve a real fault for long, nor a fault the floods.
pub(crate) fn score(rank: usize, overdue: Duration) -> f64 {
    rank as f64 + overdue.as_secs_f64() / AGING.as_secs_f64()
}

/// Upstream's order: the highest score first, then the lower disruption cost, then the name.
fn order(a: &Candidate, b: &Candidate) -> Ordering {
    let score = |c: &Candidate| c.repair.as_ref().map_or(f64::MIN, |r| r.score);
    score(b)
        .total_cmp(&score(a))
        .then_with(|| a.disruption_cost.total_cmp(&b.disruption_cost))
        .then_with(|| a.node.cmp(&b.node))
}

/// One command per pass: the first candidate due for repair, in upstream's order, whose pool's
/// `Unhealthy` budget allows one more and whose replacement can be planned.
pub(super) fn repair(
    snapshot: &Snapshot,
    candidates: &[&Candidate],
    allowed: &Allowed,
) -> Option<Command> {
    let mut due: Vec<&Candidate> = candidates
        .iter()
        .copied()
        .filter(|c| c.repair.is_some())
        .collect();
    due.sort_by(|a, b| order(a, b));
    due.into_iter()
        .filter(|c| allowed.get(&c.nodepool, DisruptionReason::Unhealthy) > 0)
        .find_map(|c| replaced(snapshot, c, allowed))
}

/// The command repairing `c`: a static pool's node is replaced by one claim of its template
/// (when the pool has room for it), or deleted alone and refilled by the pool's count when the
/// pool takes its nodes first (`TerminateFirstRepair` at `limits.nodes`); an empty node is
/// deleted alone, and a node with pods is replaced by the claims its pods need (drift's plan),
/// deleted first when those can only launch in its own room (`TerminateFirstRepair`), or not
/// repaired now when they would not all schedule.
fn replaced(snapshot: &Snapshot, c: &Candidate, allowed: &Allowed) -> Option<Command> {
    let replacements =
        if c.static_pool && allowed.terminates_first(&c.nodepool, DisruptionReason::Unhealthy) {
            Vec::new()
        } else if c.static_pool {
            let room = allowed.static_room.get(&c.nodepool).is_some_and(|r| *r > 0);
            vec![room.then(|| static_replacement(snapshot, c)).flatten()?]
        } else if c.pods.is_empty() {
            Vec::new()
        } else if terminate_first::waits(snapshot, c, allowed, DisruptionReason::Unhealthy) {
            return None;
        } else {
            drift_replacements(snapshot, c).or_else(|| {
                terminate_first::goes_first(snapshot, c, allowed, DisruptionReason::Unhealthy)
                    .then(Vec::new)
            })?
        };
    Some(command(Method::Repair, vec![c], replacements))
}

/// A pending repair after its pause: the candidate still due, within the budget, and its
/// replacement still planned.
pub(super) fn revalidate(
    snapshot: &Snapshot,
    candidates: &[Candidate],
    allowed: &Allowed,
    pending: &Command,
) -> Result<Command, String> {
    let fresh = every_one_fresh(candidates, allowed, pending)?;
    match fresh.as_slice() {
        [one] if one.repair.is_some() => replaced(snapshot, one, allowed)
            .ok_or_else(|| "its replacement can no longer be planned".to_string()),
        [_] => Err("the candidate is no longer due for repair".to_string()),
        _ => Err("a repair takes one node".to_string()),
    }
}
