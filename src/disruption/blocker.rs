//! Why a node was not voluntarily disrupted: for every node a pass weighs, the first thing that
//! stopped it, as one of a closed set of values (upstream's RFC kubernetes-sigs/karpenter#3288
//! proposes such a bounded `blocker` label; issue #711 asks "why was this node not
//! consolidated?"). The values and their label strings live here alone: the view, the
//! decision, the actor's metric and `explain node` all name a blocker through [`Blocker`].

use std::fmt;

use crate::api::nodepool::DisruptionReason;

use super::{Allowed, Candidate, Command};

/// The first thing that stopped a node's voluntary disruption. Each existing rule that holds a
/// node maps to exactly one value; the label strings are a bounded set, safe as a metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Blocker {
    /// `--disruption-paused`, the NodePool's pause annotation, or Cluster API's pause (its
    /// Cluster or MachineDeployment paused, or its replicas held by the Cluster's topology).
    Paused,
    /// Pods are planned onto it: a command's replacement, or a node the provisioner chose.
    Nominated,
    /// A Cluster API rollout of its MachineDeployment is under way or replaces its Machine.
    RollingOut,
    /// `karpenter.sh/do-not-disrupt` on its NodeClaim, its Node or one of its pods.
    DoNotDisrupt,
    /// A PodDisruptionBudget allows no eviction of one of its pods.
    Pdb,
    /// Its MachineDeployment is at its `cluster-api-autoscaler-node-group-min-size`.
    MinSize,
    /// Its NodePool is static (`spec.replicas`), or a static pool's drift has no room.
    StaticPool,
    /// It hosts a CapacityBuffer's placeholders: its room is the buffer's.
    BufferPods,
    /// Its NodePool never consolidates it: `consolidateAfter: Never`, or `WhenEmpty` and it
    /// has pods.
    ConsolidationDisabled,
    /// `consolidateAfter` has not passed since its last pod event.
    NotConsolidatable,
    /// Consolidation waits for pods on their way to other nodes to land; or, with a
    /// terminate-first gate on, a drifted node waits while pods already pending need its
    /// NodePool's room.
    PodsOnTheirWay,
    /// A back-off after a failure: its own rolled-back command, its pool's drift launches
    /// failing, or consolidation pausing after an overshoot.
    Backoff,
    /// Its NodePool's budget for the reason allows no (more) disruption now.
    Budget,
    /// Its pods cannot all be placed elsewhere (with at most one new claim for consolidation).
    NoFeasibleSchedule,
    /// No replacement is cheaper than the node.
    NotCheaper,
    /// The cheaper replacement types alone cannot meet the pool's `minValues`.
    MinValues,
    /// A spot node would only be replaced by spot (upstream's gate off).
    SpotToSpot,
    /// A `Balanced` pool judges the savings too small for the disruption.
    Balanced,
    /// Its command was dropped at validation: the cluster changed during the wait.
    ValidationChurn,
    /// Nothing stopped it, but the pass took another command first or its single-node window
    /// did not reach it: a later pass looks again.
    NotReached,
    /// Its NodeClaim is not initialized with a Node yet.
    NotInitialized,
    /// No NodePool or MachineDeployment of ours is recorded for it (adoption under way).
    Unmanaged,
    /// It is an instance of a MachinePool that cannot remove a specific instance.
    NotRemovable,
}

impl Blocker {
    /// Every value, in the order of the docs' table.
    pub const ALL: &'static [Blocker] = &[
        Blocker::Paused,
        Blocker::Nominated,
        Blocker::RollingOut,
        Blocker::DoNotDisrupt,
        Blocker::Pdb,
        Blocker::MinSize,
        Blocker::StaticPool,
        Blocker::BufferPods,
        Blocker::ConsolidationDisabled,
        Blocker::NotConsolidatable,
        Blocker::PodsOnTheirWay,
        Blocker::Backoff,
        Blocker::Budget,
        Blocker::NoFeasibleSchedule,
        Blocker::NotCheaper,
        Blocker::MinValues,
        Blocker::SpotToSpot,
        Blocker::Balanced,
        Blocker::ValidationChurn,
        Blocker::NotReached,
        Blocker::NotInitialized,
        Blocker::Unmanaged,
        Blocker::NotRemovable,
    ];

    /// The metric label and `explain`'s name for it (snake case).
    pub fn label(self) -> &'static str {
        match self {
            Blocker::Paused => "paused",
            Blocker::Nominated => "nominated",
            Blocker::RollingOut => "rolling_out",
            Blocker::DoNotDisrupt => "do_not_disrupt",
            Blocker::Pdb => "pdb",
            Blocker::MinSize => "min_size",
            Blocker::StaticPool => "static_pool",
            Blocker::BufferPods => "buffer_pods",
            Blocker::ConsolidationDisabled => "consolidation_disabled",
            Blocker::NotConsolidatable => "not_consolidatable",
            Blocker::PodsOnTheirWay => "pods_on_their_way",
            Blocker::Backoff => "backoff",
            Blocker::Budget => "budget",
            Blocker::NoFeasibleSchedule => "no_feasible_schedule",
            Blocker::NotCheaper => "not_cheaper",
            Blocker::MinValues => "min_values",
            Blocker::SpotToSpot => "spot_to_spot",
            Blocker::Balanced => "balanced",
            Blocker::ValidationChurn => "validation_churn",
            Blocker::NotReached => "not_reached",
            Blocker::NotInitialized => "not_initialized",
            Blocker::Unmanaged => "unmanaged",
            Blocker::NotRemovable => "not_removable",
        }
    }
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A blocker with the words that name the object behind it (a pod, a budget, a price), for
/// Events and `explain`.
#[derive(Clone, Debug, PartialEq)]
pub struct Hold {
    pub(crate) blocker: Blocker,
    pub(crate) why: String,
}

impl Hold {
    pub(crate) fn new(blocker: Blocker, why: impl Into<String>) -> Self {
        Self {
            blocker,
            why: why.into(),
        }
    }
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.why)
    }
}

/// One node a pass did not disrupt, and what stopped it first.
#[derive(Clone, Debug, PartialEq)]
pub struct Blocked {
    pub(crate) claim: String,
    pub(crate) nodepool: String,
    pub(crate) hold: Hold,
}

/// What stopped a candidate the pass did not take, in the order the methods look at it: what
/// the methods it reached said (`refused`), then repair's and drift's budgets, then why
/// consolidation may not take it ([`Candidate::consolidation_reason`]), then the budget of the
/// reason it would go for; a candidate nothing stopped was not reached.
/// None for a candidate of the command.
pub(crate) fn first_blocker(
    c: &Candidate,
    allowed: &Allowed,
    command: Option<&Command>,
    refused: Option<&Hold>,
) -> Option<Hold> {
    if command.is_some_and(|cmd| cmd.candidates.iter().any(|k| k.claim == c.claim)) {
        return None;
    }
    if let Some(hold) = refused {
        return Some(hold.clone());
    }
    // The pool's budget left once this pass's command has taken its part of it.
    let used = |reason: DisruptionReason| {
        command
            .filter(|cmd| cmd.method.reason() == reason)
            .map_or(0, |cmd| {
                let same_pool = cmd.candidates.iter().filter(|k| k.nodepool == c.nodepool);
                same_pool.count()
            })
    };
    let budget = |reason: DisruptionReason| {
        (allowed.get(&c.nodepool, reason) <= used(reason)).then(|| {
            Hold::new(
                Blocker::Budget,
                format!(
                    "NodePool {}'s budget allows no {} disruption now",
                    c.nodepool,
                    reason.as_str()
                ),
            )
        })
    };
    let due = [
        (c.repair.is_some(), DisruptionReason::Unhealthy),
        (c.drift.is_some(), DisruptionReason::Drifted),
    ];
    if let Some(hold) = due
        .iter()
        .filter(|(yes, _)| *yes)
        .find_map(|(_, r)| budget(*r))
    {
        return Some(hold);
    }
    if c.repair.is_none() && c.drift.is_none() {
        match c.consolidation_reason() {
            Err(hold) => return Some(hold),
            Ok(reason) => {
                if let Some(hold) = budget(reason) {
                    return Some(hold);
                }
            }
        }
    }
    Some(Hold::new(
        Blocker::NotReached,
        "nothing stopped it: the pass took another command first or did not reach it yet",
    ))
}

/// Holds back the candidates `held` names for this pass (a back-off), returning them as blocked.
pub(crate) fn hold_back(
    candidates: &mut Vec<Candidate>,
    held: impl Fn(&Candidate) -> Option<Hold>,
) -> Vec<Blocked> {
    let mut out = Vec::new();
    candidates.retain(|c| match held(c) {
        Some(hold) => {
            out.push(Blocked {
                claim: c.claim.clone(),
                nodepool: c.nodepool.clone(),
                hold,
            });
            false
        }
        None => true,
    });
    out
}

/// Keeps consolidation off the candidate this pass, saying why (the first hold wins).
pub(crate) fn hold_consolidation(c: &mut Candidate, hold: Hold) {
    if c.consolidatable {
        c.consolidatable = false;
        c.hold = Some(hold);
    }
}

/// Takes drift off the candidate this pass (its NodePool's drift backs off). When no other
/// method may take it, drift would have: the back-off is what stopped it first.
pub(crate) fn hold_drift(c: &mut Candidate, hold: Hold) {
    c.drift = None;
    if c.consolidation_reason().is_err() {
        c.consolidatable = false;
        c.hold = Some(hold);
    }
}
