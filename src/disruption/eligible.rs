//! Which voluntary method may take a candidate, and for which reason: the one statement of the
//! rule. The decision's methods, its validation, the blockers, the snapshot's moved pods, the
//! NodePools' `DisruptionBlocked` Events, the eligible-nodes gauge and `explain nodeclaim` all
//! ask it here, so none of them can disagree with the pass about an empty node again (issue 39:
//! three copies once did).

use crate::api::nodepool::{ConsolidationPolicy, DisruptionReason};

use super::{Blocker, Candidate, Hold};

/// The voluntary reasons, in the order the pass's methods try them.
pub(crate) const REASONS: [DisruptionReason; 4] = [
    DisruptionReason::Unhealthy,
    DisruptionReason::Empty,
    DisruptionReason::Drifted,
    DisruptionReason::Underutilized,
];

impl Candidate {
    /// No pod would move if it went: emptiness's node, not consolidation's. Upstream's
    /// `Candidate.IsEmpty`, counted here by the pods that must move (the view leaves out
    /// DaemonSet, mirror and terminal pods).
    pub(crate) fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The reason consolidation would take the candidate for, or what keeps it off.
    ///
    /// Upstream's `ShouldDisrupt` of emptiness and of consolidation
    /// (`pkg/controllers/disruption/emptiness.go`, `consolidation.go` at 2266468): neither takes
    /// a static pool's node, both need `consolidateAfter` passed (the view's `consolidatable`,
    /// which also carries every other hold on consolidation); an empty node is emptiness's
    /// under any policy and the `Empty` budget, never multi- or single-node consolidation's
    /// ("Empty nodes are handled by Emptiness for correct budget accounting"); a node with pods
    /// is consolidation's unless its pool consolidates `WhenEmpty`.
    pub(crate) fn consolidation_reason(&self) -> Result<DisruptionReason, Hold> {
        if self.static_pool {
            let why = format!(
                "NodePool {} is static: only drift replaces its nodes",
                self.nodepool
            );
            return Err(Hold::new(Blocker::StaticPool, why));
        }
        if !self.consolidatable {
            return Err(self.hold.clone().unwrap_or_else(|| {
                Hold::new(
                    Blocker::NotConsolidatable,
                    "it is not consolidatable this pass",
                )
            }));
        }
        if self.is_empty() {
            return Ok(DisruptionReason::Empty);
        }
        if self.policy == ConsolidationPolicy::WhenEmpty {
            let why = format!(
                "NodePool {} consolidates WhenEmpty and the node has pods",
                self.nodepool
            );
            return Err(Hold::new(Blocker::ConsolidationDisabled, why));
        }
        Ok(DisruptionReason::Underutilized)
    }

    /// Whether a method of the pass may take the candidate for `reason` (its budget aside):
    /// repair when it is due, drift when it drifted, emptiness and consolidation as
    /// [`Candidate::consolidation_reason`] says.
    pub(crate) fn eligible_for(&self, reason: DisruptionReason) -> bool {
        match reason {
            DisruptionReason::Unhealthy => self.repair.is_some(),
            DisruptionReason::Drifted => self.drift.is_some(),
            DisruptionReason::Empty | DisruptionReason::Underutilized => {
                self.consolidation_reason().is_ok_and(|r| r == reason)
            }
        }
    }

    /// Every reason the candidate is eligible for, in the methods' order.
    pub(crate) fn eligible_reasons(&self) -> impl Iterator<Item = DisruptionReason> + '_ {
        REASONS.into_iter().filter(|r| self.eligible_for(*r))
    }
}

/// Keeps consolidation that moves pods off the candidates it would take this pass, saying why;
/// empty nodes, drift and repair go on (a pause after an overshoot, pods on their way).
/// Returns how many were held.
pub(crate) fn hold_underutilized(candidates: &mut [Candidate], hold: &Hold) -> usize {
    candidates
        .iter_mut()
        .filter(|c| c.eligible_for(DisruptionReason::Underutilized))
        .map(|c| super::blocker::hold_consolidation(c, hold.clone()))
        .count()
}
