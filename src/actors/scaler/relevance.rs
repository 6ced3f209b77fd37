//! Which watched changes can change a Scaler's plan. Each one the Machine and claim feeds
//! route to a Scaler costs a re-plan over its MachineDeployment's Machines and waiting claims;
//! on a slow API server a burst's events arrive one by one (a Machine's phase, nodeRef, provider
//! ID and conditions, a claim's conditions and status), so every one of them cost a full
//! re-plan and the re-plans followed the run's length, not the claims (issue 40). A plan reads
//! only what is compared here (`bookkeeping`, `adopt`, `effect`): a change to anything else
//! cannot change it, and the periodic resync would still cover one missed.

use kube::ResourceExt;

use crate::api::nodeclaim::NodeClaim;
use crate::capi::model::Machine;
use crate::state::claims::provider_id;

/// Whether a Machine's change from `old` (`None`: it is new to the index) to `new` can change
/// its Scaler's plan.
pub(crate) fn machine_matters(old: Option<&Machine>, new: &Machine) -> bool {
    old.is_none_or(|o| machine_side(o) != machine_side(new))
}

/// What a plan reads of a Machine: the group it belongs to, its place in the FIFO order,
/// whether it is leaving, its binding and release marks (annotations), another provisioner's
/// member label, and whether a rollout would replace it.
fn machine_side(m: &Machine) -> impl PartialEq + '_ {
    (
        (&m.deployment_name, &m.pool_name),
        (m.creation_timestamp, m.deletion_timestamp),
        &m.annotations,
        &*m.labels,
        m.up_to_date,
    )
}

/// Whether a claim's change from `old` (`None`: it is new to the index) to `new` can change the
/// plan of the Scaler it recorded.
pub(crate) fn claim_matters(old: Option<&NodeClaim>, new: &NodeClaim) -> bool {
    old.is_none_or(|o| claim_side(o) != claim_side(new))
}

/// What a plan reads of a claim: when it was created (the FIFO order), whether it is leaving,
/// the group, Machine, instance or rolled-out claim it recorded (annotations), and whether it
/// has a provider ID (a claim another provisioner has not placed yet holds a free Machine back,
/// `adopt::unplaced`). The rest of its status (conditions, Node) is the claim actor's.
fn claim_side(c: &NodeClaim) -> impl PartialEq + '_ {
    (
        &c.metadata.creation_timestamp,
        &c.metadata.deletion_timestamp,
        c.annotations(),
        provider_id(c).is_some(),
    )
}
