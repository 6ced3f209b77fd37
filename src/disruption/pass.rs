//! One pass's decision from what it was given, as the Disruption actor makes it and as
//! `explain node` repeats it: consolidation first waits for pods on their way, then the methods
//! decide, and every candidate not taken gets its first blocker.

use std::collections::HashSet;

use super::{Allowed, Blocked, Candidate, Command, Decision, Hold, blocker, consolidation};
use crate::scheduling::Snapshot;

/// The decision over `candidates`, after consolidation of nodes with pods has been held while
/// pods are on their way (`may_settle`); also the number of those pods.
pub(crate) fn settle_and_decide(
    snapshot: &Snapshot,
    mut candidates: Vec<Candidate>,
    allowed: &Allowed,
    not_draining_yet: &HashSet<String>,
    may_settle: bool,
) -> (Decision, usize) {
    let (moving, held) = consolidation::wait_for_pods_on_their_way(
        snapshot,
        &mut candidates,
        not_draining_yet,
        may_settle,
    );
    if held > 0 {
        tracing::debug!(
            pods = moving,
            candidates = held,
            "consolidation waits for pods on their way to land"
        );
    }
    (
        super::decide_explained(snapshot, &candidates, allowed),
        moving,
    )
}

/// The blockers of the candidates when no decision ran this pass: nothing was decidable, or
/// `command` (a validated one) goes on.
pub(crate) fn blocked_besides(
    candidates: &[Candidate],
    allowed: &Allowed,
    command: Option<&Command>,
) -> Vec<Blocked> {
    candidates
        .iter()
        .filter_map(|c| {
            blocker::first_blocker(c, allowed, command, None).map(|hold| Blocked {
                claim: c.claim.clone(),
                nodepool: c.nodepool.clone(),
                hold,
            })
        })
        .collect()
}

/// A pending command dropped at its validation: each of its candidates that the new decision
/// did not take again is blocked by the change (`validation_churn`).
pub(crate) fn churned(pending: &Command, why: &str, decision: &mut Decision) {
    let taken = |claim: &str| {
        decision
            .command
            .as_ref()
            .is_some_and(|c| c.candidates.iter().any(|k| k.claim == claim))
    };
    for c in pending.candidates.iter().filter(|c| !taken(&c.claim)) {
        let hold = Hold::new(
            blocker::Blocker::ValidationChurn,
            format!("its command was dropped at validation: {why}"),
        );
        decision.blocked.retain(|b| b.claim != c.claim);
        decision.blocked.push(Blocked {
            claim: c.claim.clone(),
            nodepool: c.nodepool.clone(),
            hold,
        });
    }
}
