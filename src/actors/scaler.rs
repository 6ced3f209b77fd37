//! One Scaler per MachineDeployment: the only writer of its `spec.replicas`.
//!
//! Claims ask for Machines; the Scaler re-plans from the indexes (see `plan`) once per batch of
//! messages (a re-plan is scheduled, not run per message, so a burst of requests and Machine
//! events costs one plan, not one per message) and carries out at most one replica write at a
//! time. Requests that arrive while a write is in flight are covered by the next write, and
//! while a burst is under way a scale-up is held for a short adaptive window (`coalesce`: zero
//! at low load, milliseconds in a burst) so one write covers many claims. Bindings are written
//! to the Machine first (the durable truth), guarded by the Machine's resourceVersion, then
//! announced to the claim.

mod adopt;
mod bookkeeping;
mod coalesce;
pub(crate) mod effect;
mod generated;
mod instances;
mod patches;
pub mod plan;
mod relevance;
mod take_back;
mod writes;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use self::plan::Snapshot;
use super::backoff::Backoff;
use super::messages::{CancelRequest, Poke, Rejection, ReleaseMachine, RequestMachine, Stop};
use super::{Error, Shared};
use crate::capi::model::{Machine, MachineDeployment};
use crate::capi::scalable::{ScalableKind, ScalableRef};
use crate::metrics::Metrics;
use crate::state::machines::key;

use bookkeeping::Removal;
pub(crate) use bookkeeping::{managed_replicas, marked_by_us};
pub(crate) use patches::handed_back;
pub(crate) use relevance::{claim_matters, machine_matters};

/// The value we put in `cluster.x-k8s.io/delete-machine`, so that a mark set by somebody else on a
/// baseline Machine is never mistaken for one of ours.
pub(crate) const DELETE_MACHINE_VALUE: &str = "karpenter-capi";

/// How often a Scaler re-plans from the indexes even when nothing told it to.
const RESYNC: Duration = Duration::from_secs(10);

/// A Scaler whose MachineDeployment is gone stops once nothing of it is in flight.
const IDLE_STOP: Duration = Duration::from_secs(5);

pub struct Scaler {
    md: String,
    shared: Arc<Shared>,
    /// Claims that asked, with when they asked (for the binding latency metric).
    asked: VecDeque<(String, Instant)>,
    /// Machine key (or pool instance's provider ID) -> claim, for binds in flight or written
    /// but not yet seen in the index.
    binding: HashMap<String, String>,
    /// Instances of a pool without MachinePool Machines that their deleted claims gave back,
    /// until the hand-back write lands (see `instances`).
    handing_back: HashSet<String>,
    /// Nodes of handed-back instances being left to the pool (see `instances`).
    settling: HashSet<String>,
    /// Machines whose replica we removed (or deleted directly); they are on their way out.
    decremented: HashMap<String, Removal>,
    /// Decremented Machines being read back because Cluster API settled without removing them.
    verifying: HashSet<String>,
    /// Machines with a release annotation in flight.
    releasing: HashSet<String>,
    /// Releases claims asked for that have not landed yet, by Machine: whether the Node was
    /// drained, and when the next attempt may go (a failed one waits out the backoff). A
    /// claim asks once and then waits for the Machine to go, so a release that failed is
    /// this Scaler's to send again.
    to_release: HashMap<String, (bool, Instant)>,
    /// Claims turned down until they ask again.
    rejected: HashSet<String>,
    /// When each claim got its Machine from us; a bound claim missing from the index is only an
    /// orphan once the index has had time to see it.
    bound_at: HashMap<String, Instant>,
    /// The last min/max-size bounds that parsed: a malformed edit of the annotations must not
    /// lift max-size for claims already waiting.
    bounds: Option<(i32, Option<i32>)>,
    /// A replica write (or the read after a conflicting one) is in flight: one request on the
    /// MachineDeployment at a time, so each answer is newer than the last.
    writing: bool,
    retry_scheduled: bool,
    /// A re-plan is scheduled (after the messages already queued).
    replan_scheduled: bool,
    /// A held scale-up's timer.
    hold_timer: Option<SpawnHandle>,
    coalesce: coalesce::Coalescer,
    backoff: Backoff,
    /// Since when the MachineDeployment has been missing (the Scaler stops after a while).
    gone_since: Option<Instant>,
    /// The last write that changed `spec.replicas`, until a write in the other direction may
    /// follow it (see `effect`).
    last_write: Option<effect::LastWrite>,
    /// When the Generator was last asked to create this (generated) MachineDeployment.
    generating: Option<Instant>,
}

impl Actor for Scaler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::debug!(machine_deployment = %self.md, "scaler started");
        self.shared.metrics.scaler_started(&self.md);
        self.replan(ctx);
        // A resync from the indexes (no API call unless the plan needs one), as controllers
        // resync their caches: whatever a lost message or a failed write left undone is retried.
        ctx.run_interval(RESYNC, |act, ctx| act.replan(ctx));
    }

    fn stopped(&mut self, ctx: &mut Self::Context) {
        self.shared.router.remove_scaler(&self.md, &ctx.address());
        // A gauge of a MachineDeployment nobody scales any more would be exported for ever.
        let md = Metrics::md(&self.md);
        let m = &self.shared.metrics;
        m.scaler_queue_depth.remove(&md);
        m.handed_back_instances.remove(&md);
        m.handed_back_price.remove(&md);
    }
}

impl Handler<RequestMachine> for Scaler {
    type Result = ();
    fn handle(&mut self, msg: RequestMachine, ctx: &mut Self::Context) {
        self.rejected.remove(&msg.claim);
        if !self.asked.iter().any(|(c, _)| c == &msg.claim) {
            let now = Instant::now();
            self.coalesce.requested(now);
            self.asked.push_back((msg.claim, now));
        }
        self.replan(ctx);
    }
}

impl Handler<CancelRequest> for Scaler {
    type Result = bool;
    fn handle(&mut self, msg: CancelRequest, ctx: &mut Self::Context) -> bool {
        self.asked.retain(|(c, _)| c != &msg.claim);
        let binding = self.binding.values().any(|c| *c == msg.claim);
        self.rejected.insert(msg.claim);
        self.replan(ctx);
        binding
    }
}

impl Handler<ReleaseMachine> for Scaler {
    type Result = ();
    fn handle(&mut self, msg: ReleaseMachine, ctx: &mut Self::Context) {
        if self.instances_only() {
            self.handing_back.insert(msg.machine);
            self.replan(ctx);
            return;
        }
        let at = self
            .to_release
            .get(&msg.machine)
            .map_or_else(Instant::now, |(_, at)| *at);
        self.to_release
            .insert(msg.machine.clone(), (msg.drained, at));
        if at <= Instant::now() {
            self.release(msg.machine, msg.drained, ctx);
        }
        self.replan(ctx);
    }
}

impl Handler<Poke> for Scaler {
    type Result = ();
    fn handle(&mut self, _: Poke, ctx: &mut Self::Context) {
        self.replan(ctx);
    }
}

impl Scaler {
    pub(crate) fn new(md: String, shared: Arc<Shared>) -> Self {
        Self {
            md,
            shared,
            asked: VecDeque::new(),
            binding: HashMap::new(),
            handing_back: HashSet::new(),
            settling: HashSet::new(),
            decremented: HashMap::new(),
            verifying: HashSet::new(),
            releasing: HashSet::new(),
            to_release: HashMap::new(),
            rejected: HashSet::new(),
            bound_at: HashMap::new(),
            bounds: None,
            writing: false,
            retry_scheduled: false,
            replan_scheduled: false,
            hold_timer: None,
            coalesce: coalesce::Coalescer::default(),
            backoff: Backoff::api(),
            gone_since: None,
            last_write: None,
            generating: None,
        }
    }

    /// A MachinePool without MachinePool Machines (offered for scale-up only): its instances
    /// are provider IDs, bound on the claim (see `instances`).
    fn instances_only(&self) -> bool {
        self.shared.catalog.scale_up_only(&self.md)
    }

    fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Re-plan once the messages already queued are handled: a burst of requests and Machine
    /// events costs one plan over the MachineDeployment's Machines, not one per message.
    fn replan(&mut self, ctx: &mut Context<Self>) {
        if self.replan_scheduled {
            return;
        }
        self.replan_scheduled = true;
        ctx.run_later(Duration::ZERO, |act, ctx| {
            act.replan_scheduled = false;
            act.replan_now(ctx);
        });
    }

    fn replan_now(&mut self, ctx: &mut Context<Self>) {
        self.metrics()
            .scaler_replans
            .get_or_create(&Metrics::md(&self.md))
            .inc();
        let Some(mut inputs) = self.inputs() else {
            if self.await_generated(ctx) {
                return;
            }
            self.reject_all(Rejection::DeploymentGone);
            self.stop_if_abandoned(ctx);
            return;
        };
        self.gone_since = None;
        if self.adopt(&inputs, ctx) {
            return;
        }
        let managed = managed_replicas(&inputs.md);
        let mut snapshot = Snapshot {
            spec_replicas: inputs.md.spec_replicas.unwrap_or(0),
            managed: managed + inputs.instances.take_back.ours(),
            min_size: inputs.min_size,
            max_size: inputs.max_size,
            set_aside: inputs.instances.set_aside,
            machines: &inputs.machines,
            waiting: &inputs.waiting,
            rolling_out: inputs.rolling_out,
            unplaced: 0,
        };
        let mut plan = plan::plan(&snapshot);
        if !plan.release.is_empty() {
            snapshot.unplaced = self.unplaced();
            if snapshot.unplaced > 0 {
                plan = plan::plan(&snapshot);
            }
        }
        let instances = self.instances_only();
        if instances {
            self.report_handed_back(inputs.instances.set_aside);
            self.settle_handed_back_nodes(std::mem::take(&mut inputs.instances.unsettled), ctx);
            take_back::instance_plan(
                &mut plan,
                &inputs.instances.take_back,
                snapshot.spec_replicas,
                managed,
                &inputs.waiting,
            );
        }
        let writable = self.shared.state.deployments.read().writable(&inputs.md);
        if !writable {
            self.hold_while_paused(&mut plan, &inputs.waiting);
        }
        for machine in &inputs.spent {
            self.verify_spent(machine.clone(), ctx);
        }
        for machine in self.orphans(&inputs.machines) {
            tracing::warn!(machine = %machine, machine_deployment = %self.md, "machine bound to a NodeClaim that no longer exists; releasing it");
            self.release(machine, false, ctx);
        }
        self.release_asked(ctx);
        self.metrics()
            .scaler_queue_depth
            .get_or_create(&Metrics::md(&self.md))
            .set(inputs.waiting.len() as i64);

        for (claim, machine) in plan.bind {
            if instances {
                self.bind_instance(claim, machine, ctx);
            } else {
                self.bind(claim, machine, ctx);
            }
        }
        for claim in plan.reject {
            self.reject(&claim, Rejection::AtMaxSize);
        }
        for machine in plan.release {
            self.release(machine, false, ctx);
        }
        if let Some(write) = plan.write
            && !self.writing
        {
            if self.undoes_unacted(&inputs.md, &write) {
                tracing::debug!(machine_deployment = %self.md, from = write.from, to = write.to, "waiting for Cluster API to act on the last replica write before undoing part of it");
            } else if write.delta() > 0
                && let Some(wait) = self.coalesce.hold(Instant::now())
            {
                self.hold_for(wait, ctx);
            } else {
                self.write(inputs.md, write, plan.delete_directly, ctx);
            }
        }
    }

    /// Whether `write` goes the other way from the last write while Cluster API has not acted
    /// on that one yet (see `effect`). Machine and MachineDeployment events plan again.
    fn undoes_unacted(&self, md: &MachineDeployment, write: &plan::ReplicaWrite) -> bool {
        let machines = self.shared.state.machines.read();
        let leaving = |k: &str| {
            machines
                .get(k)
                .is_none_or(|m| m.deletion_timestamp.is_some())
        };
        let live_machines = (!self.instances_only()).then(|| {
            machines
                .keyed_of_deployment(&self.md)
                .filter(|(_, m)| m.deletion_timestamp.is_none())
                .count() as i32
        });
        let seen = effect::Seen {
            spec_replicas: md.spec_replicas.unwrap_or(0),
            observed_generation: md.observed_generation,
            status_replicas: md.status_replicas,
            live_machines,
            leaving: &leaving,
        };
        effect::must_wait(
            self.last_write.as_ref(),
            write.delta(),
            &seen,
            Instant::now(),
        )
    }

    /// Take over what another provisioner left on this MachineDeployment: first record the
    /// replicas we now own (spec.replicas unchanged), then bind each Machine it claimed to that
    /// claim. True while the count is being recorded: nothing else is planned until it lands.
    fn adopt(&mut self, inputs: &bookkeeping::Inputs, ctx: &mut Context<Self>) -> bool {
        if let Some(managed) = inputs.adopt_managed {
            if !self.writing {
                let spec = inputs.md.spec_replicas.unwrap_or(0);
                tracing::info!(machine_deployment = %self.md, replicas = spec, managed, "{}", self.shared.settings.say("adopting the MachineDeployment", "would adopt the MachineDeployment"));
                let w = plan::ReplicaWrite {
                    from: spec,
                    to: spec,
                    managed_from: 0,
                    managed_to: managed,
                    decrements: Vec::new(),
                    handed_back: Vec::new(),
                    reclaimed: Vec::new(),
                };
                self.write(inputs.md.clone(), w, Vec::new(), ctx);
            }
            return true;
        }
        for (machine, claim) in &inputs.adopted {
            tracing::info!(nodeclaim = %claim, machine = %machine, "{}", self.shared.settings.say("adopting the Machine", "would adopt the Machine"));
            self.bind(claim.clone(), machine.clone(), ctx);
        }
        false
    }

    /// Cluster API's pause (its controllers would not act on a replica change) or a topology
    /// that sets the replicas (its controller would undo one): none is written (nor a surplus
    /// Machine released, which leads to one). Free Machines may still be
    /// bound; claims that need a new one are turned away to launch elsewhere. A Machine a
    /// terminating claim gave back keeps its deletion mark and is decremented once the pause
    /// lifts.
    fn hold_while_paused(&mut self, plan: &mut plan::Plan, waiting: &[String]) {
        if plan.write.take().is_some() || !plan.release.is_empty() {
            tracing::debug!(machine_deployment = %self.md, "paused (cluster.x-k8s.io/paused or spec.paused, on it or its Cluster) or its replicas held by its Cluster's topology: no replica write");
        }
        plan.release.clear();
        plan.delete_directly.clear();
        let binding: HashSet<&String> = plan.bind.iter().map(|(c, _)| c).collect();
        let turned_away: Vec<String> = waiting
            .iter()
            .filter(|c| !binding.contains(c) && !plan.reject.contains(c))
            .cloned()
            .collect();
        for claim in turned_away {
            self.reject(&claim, Rejection::Paused);
        }
    }

    /// Hold a scale-up for `wait` (a burst is under way), then plan again.
    fn hold_for(&mut self, wait: Duration, ctx: &mut Context<Self>) {
        if let Some(h) = self.hold_timer.take() {
            ctx.cancel_future(h);
        }
        self.hold_timer = Some(ctx.run_later(wait, |act, ctx| {
            act.hold_timer = None;
            act.replan(ctx);
        }));
    }

    /// The MachineDeployment is gone: once nothing of ours is in flight for a while, stop and
    /// leave the router, so a deleted MachineDeployment does not keep a Scaler for ever.
    fn stop_if_abandoned(&mut self, ctx: &mut Context<Self>) {
        // Its kind listed: before, a MachinePool missing from the index is not gone.
        let kind = ScalableRef::parse(&self.md).map_or(ScalableKind::MachineDeployment, |r| r.kind);
        if !self.shared.state.deployments.read().listed(kind)
            || self.writing
            || !self.binding.is_empty()
            || !self.releasing.is_empty()
        {
            return;
        }
        let since = *self.gone_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= IDLE_STOP {
            tracing::debug!(machine_deployment = %self.md, "machine deployment gone; stopping its scaler");
            ctx.stop();
        }
    }

    fn refresh_deployment(&mut self, ctx: &mut Context<Self>) {
        let Some(target) = ScalableRef::parse(&self.md) else {
            self.writing = false;
            return;
        };
        let read = self.read_deployment(&target.namespace, &target.name);
        ctx.spawn(read.into_actor(self).map(|r, act, ctx| {
            act.writing = false;
            act.refreshed(r, ctx)
        }));
    }

    fn refreshed(&mut self, r: Result<MachineDeployment, Error>, ctx: &mut Context<Self>) {
        match r {
            Ok(md) => {
                self.shared.state.deployments.write().apply_own_response(md);
                self.replan(ctx);
            }
            Err(e) if e.is_not_found() => self.reject_all(Rejection::DeploymentGone),
            Err(e) => {
                tracing::warn!(machine_deployment = %self.md, error = %e, "re-reading machinedeployment failed");
                self.retry_later(ctx);
            }
        }
    }

    fn refresh_machine(&mut self, machine: Arc<Machine>, ctx: &mut Context<Self>) {
        let mk = key(&machine.namespace, &machine.name);
        let read = self.read_machine(&machine);
        ctx.spawn(
            read.into_actor(self)
                .map(move |r, act, ctx| act.machine_read(&mk, r, ctx)),
        );
    }

    /// Put a Machine read back into the index (or drop it when it is gone) and plan again; a
    /// failed read is retried later.
    fn machine_read(&mut self, mk: &str, r: Result<Machine, Error>, ctx: &mut Context<Self>) {
        match r {
            Ok(m) => {
                self.shared.state.machines.write().apply_response(m);
            }
            Err(e) if e.is_not_found() => {
                self.shared.state.machines.write().remove(mk);
            }
            Err(e) => {
                tracing::warn!(machine = %mk, error = %e, "re-reading machine failed");
                self.retry_later(ctx);
                return;
            }
        }
        self.replan(ctx);
    }

    /// Read a Machine `spent_decrements` found back (our Machine index may only lag behind the
    /// MachineDeployment's status). Still there and not deleting: it is a marked Machine whose
    /// replica was never removed, so the next plan lowers replicas for it again.
    fn verify_spent(&mut self, machine: Arc<Machine>, ctx: &mut Context<Self>) {
        let mk = key(&machine.namespace, &machine.name);
        if !self.verifying.insert(mk.clone()) {
            return;
        }
        let read = self.read_machine(&machine);
        ctx.spawn(read.into_actor(self).map(move |r, act, ctx| {
            act.verifying.remove(&mk);
            if let Ok(m) = &r
                && m.deletion_timestamp.is_none()
                && act.decremented.remove(&mk).is_some()
            {
                tracing::warn!(machine = %mk, machine_deployment = %act.md, "Cluster API settled without removing a Machine whose replica we removed (its MachineSet spent the decrement on a Machine it had not created yet, or removed another); lowering replicas for it again");
                act.metrics()
                    .scaler_spent_decrements
                    .get_or_create(&Metrics::md(&act.md))
                    .inc();
            }
            act.machine_read(&mk, r, ctx);
        }));
    }

    /// Send again the releases claims asked for that have not landed and whose backoff is
    /// over; forget those whose Machine is marked, deleting or gone.
    fn release_asked(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let due: Vec<(String, bool)> = {
            let machines = self.shared.state.machines.read();
            self.to_release.retain(|k, _| {
                machines
                    .get(k)
                    .is_some_and(|m| !marked_by_us(&m) && m.deletion_timestamp.is_none())
            });
            self.to_release
                .iter()
                .filter(|(k, (_, at))| *at <= now && !self.releasing.contains(*k))
                .map(|(k, (drained, _))| (k.clone(), *drained))
                .collect()
        };
        for (machine, drained) in due {
            self.release(machine, drained, ctx);
        }
    }

    fn retry_later(&mut self, ctx: &mut Context<Self>) {
        if self.retry_scheduled {
            return;
        }
        self.retry_scheduled = true;
        let d = self.backoff.next_delay();
        ctx.run_later(d, |act, ctx| {
            act.retry_scheduled = false;
            act.replan(ctx);
        });
    }
}

impl Handler<super::tracked::Tracked> for Scaler {
    type Result = MessageResult<super::tracked::Tracked>;
    fn handle(&mut self, _: super::tracked::Tracked, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            [
                ("asked", self.asked.len()),
                ("binding", self.binding.len()),
                ("handing_back", self.handing_back.len()),
                ("decremented", self.decremented.len()),
                ("verifying", self.verifying.len()),
                ("releasing", self.releasing.len()),
                ("to_release", self.to_release.len()),
                ("rejected", self.rejected.len()),
                ("bound_at", self.bound_at.len()),
            ]
            .into_iter()
            .collect(),
        )
    }
}

impl Handler<Stop> for Scaler {
    type Result = ();
    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
