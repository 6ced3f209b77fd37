//! Terminate-first for dynamic NodePools (Karpenter v1.15's `TerminateFirstDrift` and
//! `TerminateFirstRepair`, carried over from static pools to the constraints Cluster API has).
//!
//! Replace-first needs room for the replacement beside the node it replaces. On a Cluster API
//! cluster that room is often the node's own: its MachineDeployment is at its
//! `cluster-api-autoscaler-node-group-max-size`, its infrastructure is full (a bare-metal or
//! vSphere inventory, seen as launches on it failing or timing out), or the NodePool is at its
//! `limits`. Then replace-first waits forever. With the reason's gate on, such a node goes
//! first: its pods go pending, and once it is gone the provisioner launches into the slot it
//! freed. The test is the same simulation replace-first runs, once more with the node's own room
//! given back; only a node whose replacement needs exactly that room goes first, so a node
//! whose pods fit nowhere at all is never deleted on the hope of it.

use super::{Allowed, Candidate, drift_replacements};
use crate::api::nodepool::DisruptionReason;
use crate::api::resources::Quantity;
use crate::scheduling::Snapshot;

/// Whether `c`, whose replacement cannot be planned beside it, goes before its replacement for
/// `reason`: the reason's gate is on, nothing of its pool is under way, and the replacement fits
/// once `c`'s own room is freed.
pub(super) fn goes_first(
    snapshot: &Snapshot,
    c: &Candidate,
    allowed: &Allowed,
    reason: DisruptionReason,
) -> bool {
    if c.static_pool || !allowed.terminate_first_gates.contains(&reason) {
        return false;
    }
    if launching(snapshot, &c.nodepool) {
        return false;
    }
    let freed = freed(snapshot, c);
    !waiting_for_room(&freed, &c.nodepool) && drift_replacements(&freed, c).is_some()
}

/// Whether `c`'s drift or repair waits this pass, replace-first included, with the reason's
/// gate on: its MachineDeployment is constrained (unavailable, or one Machine short of its
/// max size) and a claim of its pool is still launching, or pods already pending need a new
/// claim of its pool. The catalog counts a claim that recorded its MachineDeployment against
/// that room before the replicas show it (`capi::room`), but a claim still launching may not
/// have chosen its offering yet (a replacement before its launch decision): a replacement
/// planned then could take the same slot, and one of them fail to launch and back the pool's
/// drift off. And between a node taken first and its refill's claim, the refill's pods hold no
/// claim at all: a replacement would take the slot they wait for (both seen in the flow test
/// before this rule). So a constrained pool goes one node at a time.
pub(super) fn waits(
    snapshot: &Snapshot,
    c: &Candidate,
    allowed: &Allowed,
    reason: DisruptionReason,
) -> bool {
    !c.static_pool
        && allowed.terminate_first_gates.contains(&reason)
        && constrained(snapshot, c)
        && (launching(snapshot, &c.nodepool) || waiting_for_room(snapshot, &c.nodepool))
}

/// `c`'s own MachineDeployment is unavailable, or has room for one more Machine at most.
fn constrained(snapshot: &Snapshot, c: &Candidate) -> bool {
    snapshot
        .nodepools
        .iter()
        .filter(|p| p.nodepool.metadata.name.as_deref() == Some(c.nodepool.as_str()))
        .flat_map(|p| p.instance_types.iter().flat_map(|t| &t.offerings))
        .filter(|o| o.machine_deployment == c.machine_deployment)
        .any(|o| !o.available || o.max_size.is_some_and(|max| o.replicas + 1 >= max))
}

/// A claim of `pool` not yet initialized: the last node taken first may be refilling. One
/// node of the pool down at a time, as for static pools: a refill uses no budget, so the budget
/// alone would let the next node go while the last one's pods still wait.
fn launching(snapshot: &Snapshot, pool: &str) -> bool {
    snapshot
        .nodes
        .iter()
        .any(|n| n.nodepool.as_deref() == Some(pool) && !n.initialized())
}

/// Pods already pending, or on their way from a leaving node, that need a new claim of `pool`
/// in `snapshot`: in the freed snapshot (`c` still in place), they would take the room `c`
/// frees, and `c`'s pods would find the slot taken.
fn waiting_for_room(snapshot: &Snapshot, pool: &str) -> bool {
    !snapshot.pods.is_empty()
        && crate::scheduling::solve(snapshot)
            .new_claims
            .iter()
            .any(|n| n.nodepool == pool)
}

/// The snapshot as it will be once `c`'s node is gone: its MachineDeployment one replica
/// smaller (and so its offering launchable again, unless still at max-size), and its NodePool's
/// usage without the node.
pub(super) fn freed(snapshot: &Snapshot, c: &Candidate) -> Snapshot {
    let mut s = snapshot.clone();
    let Some(pool) = s
        .nodepools
        .iter_mut()
        .find(|p| p.nodepool.metadata.name.as_deref() == Some(c.nodepool.as_str()))
    else {
        return s;
    };
    let node = pool
        .instance_types
        .iter()
        .find(|t| t.name == c.instance_type)
        .map(|t| t.capacity.clone())
        .unwrap_or_default()
        .with("nodes", Quantity::from_units(1));
    for (key, value) in node.iter() {
        if let Some(used) = pool.usage.0.get_mut(key) {
            *used = used.saturating_sub(*value).max(Quantity::ZERO);
        }
    }
    let own = pool
        .instance_types
        .iter_mut()
        .flat_map(|t| t.offerings.iter_mut())
        .filter(|o| o.machine_deployment == c.machine_deployment);
    for o in own {
        o.replicas = (o.replicas - 1).max(0);
        // Whatever held it (max-size, a failed or timed-out launch on a full inventory), the
        // slot the node leaves is one more Machine it can take, unless it is over max-size.
        o.available = o.max_size.is_none_or(|max| o.replicas < max);
    }
    s
}
