//! The messages actors send each other, in one place so that both sides import them from here
//! (the claim actor and the Scaler never import each other). docs/architecture.md draws the flow.

use std::sync::Arc;

use actix::prelude::*;

use crate::api::nodeclaim::NodeClaim;

/// Stop this actor (the controller stops its writers on shutdown or lost leadership).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Stop;

// --- to a NodeClaimActor ---------------------------------------------------------------------

/// Something about this claim changed (the claim itself, its Machine or its Node): reconcile.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Kick;

/// The claim as last seen by the NodeClaim watch.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct ClaimChanged {
    pub(crate) claim: Arc<NodeClaim>,
    /// From a (re-)list rather than a watch event: as new as anything we wrote.
    pub(crate) listed: bool,
}

/// The claim is gone from the API (last seen as this): stop. A claim whose finalizer removal
/// answered too late for the reconcile (or that someone else finished) is counted as
/// terminated here.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Gone(pub Arc<NodeClaim>);

/// The Scaler bound a Machine to this claim.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct MachineBound {
    pub(crate) machine: String,
}

/// The Scaler cannot give this claim a Machine from that MachineDeployment.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct RequestRejected {
    pub(crate) machine_deployment: String,
    pub(crate) why: Rejection,
}

/// Why a request was turned down; the claim picks another offering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rejection {
    AtMaxSize,
    DeploymentGone,
    /// Cluster API's pause is on the MachineDeployment, or its Cluster's topology holds its
    /// replicas: no replica is written until that ends.
    Paused,
    /// A generated group could not be created (its NodeClass's cap, a patch that does not
    /// apply, an API error): the claim chooses another offering.
    NotGenerated,
}

// --- to a Scaler -----------------------------------------------------------------------------

/// A claim needs a Machine from this MachineDeployment (idempotent per claim).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct RequestMachine {
    pub(crate) claim: String,
}

/// A waiting claim gave up (deleted or timed out) before it got a Machine. Answers whether a
/// bind for it is still in flight: the claim must not let go until that bind has landed (and
/// then release the Machine), or the Machine would be orphaned.
#[derive(Message)]
#[rtype(result = "bool")]
pub(crate) struct CancelRequest {
    pub(crate) claim: String,
}

/// A terminating claim gives its Machine back: annotate it, then decrement (invariant 3).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct ReleaseMachine {
    pub(crate) machine: String,
    /// The claim's Node was drained by the Terminator: Cluster API need not drain it again.
    pub(crate) drained: bool,
}

/// Something this MachineDeployment depends on changed (its Machines, itself, a claim): re-plan.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Poke;
