//! The budget check a command makes on the server right before its first write: the indexes
//! a decision was made on may not have delivered a burst of Cluster API's deletions yet.

use std::collections::HashSet;

use kube::api::ListParams;

use crate::actors::Shared;
use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::disruption::Command;

/// What a command may take of one pool's budget, as the indexes saw it right before it starts.
#[derive(Clone, Debug)]
pub(crate) struct PoolRoom {
    pub(crate) pool: String,
    pub(crate) reason: crate::api::nodepool::DisruptionReason,
    /// How many more nodes the pool may start disrupting for `reason`.
    pub(crate) allowed: usize,
    /// The pool's nodes the indexes count as disrupting already.
    pub(crate) busy: usize,
    /// How many of the command's candidates are in the pool.
    pub(crate) needed: usize,
}

/// The server's own view of each pool the command touches, read right before its first write:
/// claims being deleted or disrupted that the watches have not delivered yet (Cluster API
/// deleting a rollout's Machines in a burst, under load) take budget the indexes do not see.
/// One LIST of the pool's claims each (by label). Why the command no longer fits, if it does
/// not; a failed read says nothing (the indexes' check stands).
pub(crate) async fn over_budget_on_server(
    shared: &Shared,
    cmd: &Command,
    rooms: &[PoolRoom],
) -> Option<String> {
    let ours: HashSet<&str> = cmd.candidates.iter().map(|c| c.claim.as_str()).collect();
    for room in rooms {
        let mut selector = format!("{}={}", crate::api::wellknown::NODEPOOL_LABEL, room.pool);
        if let Some(binding) = shared.selector_for::<NodeClaim>() {
            selector = format!("{selector},{binding}");
        }
        let params = ListParams::default().labels(&selector);
        let listed = match shared.api::<NodeClaim>().list(&params).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(nodepool = %room.pool, error = %e, "reading the pool's claims before a disruption failed; going by the indexes");
                continue;
            }
        };
        let busy_on_server = listed
            .items
            .iter()
            .filter(|c| !ours.contains(c.metadata.name.as_deref().unwrap_or_default()))
            .filter(|c| disrupting_on_server(c))
            .count();
        let unseen = busy_on_server.saturating_sub(room.busy);
        if room.needed + unseen > room.allowed {
            return Some(format!(
                "NodePool {} has {unseen} more {} disruptions under way than the indexes showed; {} left, the command needs {}",
                room.pool,
                room.reason.as_str(),
                room.allowed.saturating_sub(unseen),
                room.needed
            ));
        }
    }
    None
}

/// Upstream's accounting on the server's copy: an initialized claim whose instance is not
/// terminating, being deleted or marked by a disruption command.
fn disrupting_on_server(c: &NodeClaim) -> bool {
    let conds = c.conditions();
    conditions::is_true(conds, conditions::INITIALIZED)
        && !conditions::is_true(conds, conditions::INSTANCE_TERMINATING)
        && (c.metadata.deletion_timestamp.is_some()
            || conditions::is_true(conds, conditions::DISRUPTION_REASON))
}
