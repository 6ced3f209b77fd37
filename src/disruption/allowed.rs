//! What a disruption pass may do per NodePool: its budgets by reason, where the single-node
//! search starts, a static pool's room for drift replacements, and which pools take their nodes
//! before their replacement.

use std::collections::{HashMap, HashSet};

use crate::api::nodepool::DisruptionReason;

/// How many more nodes each pool may start disrupting, per reason, and where this pass's
/// single-node search starts.
#[derive(Clone, Debug, Default)]
pub struct Allowed {
    pub(crate) budgets: HashMap<(String, DisruptionReason), usize>,
    /// The single-node search looks at [`super::MAX_SINGLE_NODE_SIMULATIONS`] candidates a pass,
    /// starting this far into its order (the actor moves it on each pass), so candidates past
    /// the first ones are reached too when those cannot move.
    pub(crate) rotation: usize,
    /// Per static NodePool: how many drift replacements it may launch now. Its `limits.nodes`
    /// less its claims (running, deleting and under disruption), and none while it holds more
    /// than `spec.replicas` (a scale-down finishes first), as upstream reserves them.
    pub(crate) static_room: HashMap<String, usize>,
    /// Static NodePools, and the reasons, whose nodes go before their replacement
    /// (`TerminateFirstDrift` for `Drifted`, `TerminateFirstRepair` for `Unhealthy`, and no
    /// room under `limits.nodes`: `view::static_capacity::terminate_first`).
    pub(crate) terminate_first: HashSet<(String, DisruptionReason)>,
    /// The reasons whose terminate-first gate is on. A dynamic pool's node disrupted for one
    /// of them goes before its replacement when that replacement can only launch in the room
    /// the node itself holds (`super::terminate_first`).
    pub(crate) terminate_first_gates: HashSet<DisruptionReason>,
}

impl Allowed {
    /// Whether `pool`'s nodes disrupted for `reason` go before their replacement.
    pub(crate) fn terminates_first(&self, pool: &str, reason: DisruptionReason) -> bool {
        self.terminate_first.contains(&(pool.to_string(), reason))
    }

    pub(crate) fn get(&self, pool: &str, reason: DisruptionReason) -> usize {
        self.budgets
            .get(&(pool.to_string(), reason))
            .copied()
            .unwrap_or(0)
    }
}
