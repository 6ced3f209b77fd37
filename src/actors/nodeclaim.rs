//! One NodeClaimActor per claim: launch, registration, initialization, timeouts, termination.
//!
//! The actor is level-triggered: every message only records what arrived and asks for a
//! reconcile; one reconcile runs at a time and reads the claim, its Machine and its Node from the
//! indexes, then takes the next step(s) (Karpenter core v1's NodeClaim lifecycle). Whatever a step needs to know
//! later is written to the API first, so a restarted controller resumes at the same step.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use jiff::Timestamp;
use kube::api::Api;
use kube::{Resource, ResourceExt};

use super::backoff::Backoff;
use super::messages::{
    ClaimChanged, Gone, Kick, MachineBound, Poke, Rejection, RequestMachine, RequestRejected,
};
use super::patch::JsonPatch;
use super::scaler::Scaler;
use super::{Error, Shared, api_err};
use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::*;
use crate::capi::scalable::ScalableKind;
use crate::state::claims::{provider_id, recorded_deployment, recorded_instance, recorded_machine};
use crate::state::machines::claimed_elsewhere;
use crate::state::machines::key as machine_key;
use crate::state::versions::Freshness;

pub(crate) mod initialization;
mod launch;
pub(crate) use launch::prelaunch;
mod liveness;
mod preflight;
mod registration;
mod status;
mod termination;

pub(crate) use liveness::registration_clock_start;
use registration::node_registered;

pub(crate) struct NodeClaimActor {
    name: String,
    shared: Arc<Shared>,
    claim: Arc<NodeClaim>,
    /// Its termination was counted (once, by whichever of the finalizer write and the watch
    /// comes first).
    terminated: bool,
    running: bool,
    again: bool,
    /// MachineDeployments that turned this claim down; resolve avoids them.
    excluded: HashSet<String>,
    /// The MachineDeployment we asked for a Machine (so we ask once).
    requested: Option<String>,
    wake: Option<SpawnHandle>,
    /// Which claim version is newest, from the watch's order (resourceVersions are opaque).
    fresh: Freshness,
    /// Retry delays after a failed or abandoned reconcile; reset by one that succeeds.
    backoff: Backoff,
}

impl NodeClaimActor {
    pub(crate) fn new(shared: Arc<Shared>, claim: Arc<NodeClaim>) -> Self {
        Self {
            name: claim.name_any(),
            shared,
            claim,
            running: false,
            again: false,
            excluded: HashSet::new(),
            requested: None,
            wake: None,
            fresh: Freshness::default(),
            backoff: Backoff::api(),
            terminated: false,
        }
    }

    fn kick(&mut self, ctx: &mut Context<Self>) {
        if self.running {
            self.again = true;
            return;
        }
        self.running = true;
        self.again = false;
        let started = self.claim.resource_version();
        let step = Step {
            shared: self.shared.clone(),
            claim: self.claim.clone(),
            excluded: self.excluded.clone(),
            requested: self.requested.clone(),
            terminated: false,
        };
        let name = self.name.clone();
        let deadline = self.shared.settings.deadlines.claim_step;
        let bounded = async move {
            // A request that never answers must not stall this claim forever: abandon the
            // reconcile (every step is a guarded write, so the next one starts from the truth).
            match tokio::time::timeout(deadline, step.run()).await {
                Ok(out) => out,
                Err(_) => Outcome {
                    error: Some(Error::Timeout {
                        what: format!("reconciling NodeClaim {name}"),
                        after: deadline,
                    }),
                    timed_out: true,
                    ..Default::default()
                },
            }
        };
        ctx.spawn(bounded.into_actor(self).map(move |out, act, ctx| {
            act.running = false;
            act.apply(out, started.as_deref(), ctx);
            if act.again {
                act.kick(ctx);
            }
        }));
    }

    /// Take a reconcile's outcome; `started` is the claim version it started from.
    fn apply(&mut self, out: Outcome, started: Option<&str>, ctx: &mut Context<Self>) {
        // One reconcile runs at a time and each of its requests is sent after the previous one
        // answered, so its answer is newer than any earlier one: take it even while an earlier
        // answer still waits for the watch (else the next guarded write starts from a version
        // we already replaced, and conflicts). A reconcile that wrote and read nothing hands
        // back the version it started from, which is no answer at all: a newer version the
        // watch delivered meanwhile (a Scaler's binding) must not be replaced by it, or the
        // claim would wait on its stale copy until something else changed it.
        if let Some(claim) = out.claim
            && claim.resource_version().as_deref() != started
            && claim.resource_version() != self.claim.resource_version()
            && self
                .fresh
                .superseded(&self.name, &claim.resource_version().unwrap_or_default())
        {
            // Held by the index and this actor alike, not copied.
            let claim = crate::state::claims::trimmed(claim);
            self.shared
                .state
                .claims
                .write()
                .apply_own_response(claim.clone());
            self.claim = claim;
        }
        if let Some(md) = out.requested {
            if self.requested.as_deref() != Some(md.as_str()) {
                let pool = self.claim.labels().get(NODEPOOL_LABEL).cloned();
                self.shared.metrics.claim_awaits_machine(
                    pool.as_deref().unwrap_or_default(),
                    &md,
                    &self.claim,
                );
            }
            self.requested = Some(md);
        }
        if out.forget_request {
            self.requested = None;
        }
        if out.timed_out {
            // Say so where an operator looks: the claim's Events and a metric.
            self.shared.metrics.reconcile_timeout("nodeclaim");
            self.shared.events.warning(
                object_ref(&self.claim),
                "ReconcileTimeout",
                format!(
                    "Reconciling NodeClaim {} took longer than {}; abandoned it and retrying",
                    self.name,
                    crate::api::duration::format(self.shared.settings.deadlines.claim_step)
                ),
            );
        }
        if let Some(err) = out.error {
            let d = self.backoff.next_delay_after(err.retry_after());
            tracing::warn!(nodeclaim = %self.name, error = %err, retry_in = ?d, "reconcile failed; retrying");
            self.wake_in(d, ctx);
        } else if out.gone {
            // The claim (or what we patched) vanished: the watch will tell; look again later.
            let d = self.backoff.next_delay();
            self.wake_in(d, ctx);
        } else {
            self.backoff.reset();
            if let Some(d) = out.wake_in {
                self.wake_in(d, ctx);
            }
        }
        self.terminated |= out.terminated;
        if out.done {
            ctx.stop();
        }
    }

    fn wake_in(&mut self, d: Duration, ctx: &mut Context<Self>) {
        if let Some(h) = self.wake.take() {
            ctx.cancel_future(h);
        }
        self.wake = Some(ctx.run_later(d, |act, ctx| {
            act.wake = None;
            act.kick(ctx);
        }));
    }
}

super::registry::stoppable!(NodeClaimActor);

impl Actor for NodeClaimActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.kick(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        tracing::debug!(nodeclaim = %self.name, "nodeclaim actor stopped");
    }
}

impl Handler<Kick> for NodeClaimActor {
    type Result = ();
    fn handle(&mut self, _: Kick, ctx: &mut Self::Context) {
        self.kick(ctx);
    }
}

impl Handler<ClaimChanged> for NodeClaimActor {
    type Result = ();
    fn handle(&mut self, msg: ClaimChanged, ctx: &mut Self::Context) {
        // The watch delivers versions in order; one older than our last write is skipped. A
        // list is at least as new as any write that answered before it.
        if msg.listed {
            self.fresh.clear();
        }
        if self.fresh.watched(
            &self.name,
            &msg.claim.resource_version().unwrap_or_default(),
        ) {
            self.claim = msg.claim;
        }
        self.kick(ctx);
    }
}

impl Handler<MachineBound> for NodeClaimActor {
    type Result = ();
    fn handle(&mut self, msg: MachineBound, ctx: &mut Self::Context) {
        tracing::debug!(nodeclaim = %self.name, machine = %msg.machine, "bound");
        self.kick(ctx);
    }
}

impl Handler<RequestRejected> for NodeClaimActor {
    type Result = ();
    fn handle(&mut self, msg: RequestRejected, ctx: &mut Self::Context) {
        tracing::info!(nodeclaim = %self.name, machine_deployment = %msg.machine_deployment, why = ?msg.why, "machine request rejected; choosing another offering");
        self.excluded.insert(msg.machine_deployment.clone());
        self.requested = None;
        if matches!(msg.why, Rejection::AtMaxSize | Rejection::NotGenerated) {
            self.shared.catalog.mark_unavailable(
                &msg.machine_deployment,
                self.shared.settings.unavailable_offering_ttl,
            );
        }
        // Forget the recorded MachineDeployment so the next reconcile resolves again.
        let claim = Arc::make_mut(&mut self.claim);
        claim
            .annotations_mut()
            .remove(MACHINE_DEPLOYMENT_ANNOTATION);
        self.kick(ctx);
    }
}

impl Handler<Gone> for NodeClaimActor {
    type Result = ();
    fn handle(&mut self, msg: Gone, ctx: &mut Self::Context) {
        if !self.terminated && msg.0.metadata.deletion_timestamp.is_some() {
            self.terminated = true;
            termination::observe_terminated(&self.shared, &msg.0);
        }
        ctx.stop();
    }
}

/// What one reconcile decided, applied by the actor.
#[derive(Default)]
struct Outcome {
    claim: Option<Arc<NodeClaim>>,
    requested: Option<String>,
    forget_request: bool,
    wake_in: Option<Duration>,
    error: Option<Error>,
    /// The reconcile was abandoned at its deadline.
    timed_out: bool,
    /// The claim or an object a step patched was not found.
    gone: bool,
    done: bool,
    /// The claim's termination was counted in the metrics.
    terminated: bool,
}

/// One reconcile, detached from the actor (it owns copies of what it needs).
struct Step {
    shared: Arc<Shared>,
    claim: Arc<NodeClaim>,
    excluded: HashSet<String>,
    requested: Option<String>,
    /// Set when this step counted the claim's termination.
    terminated: bool,
}

/// How many steps one reconcile may take before yielding (each step is at most one write).
const MAX_STEPS: usize = 10;

/// How long a claim whose Node patch lost a race waits for the Node watch before it plans
/// again without it (the watch's event usually comes first and kicks it sooner).
const NODE_CONFLICT_WAIT: Duration = Duration::from_millis(250);

enum Next {
    /// The claim changed: take the next step right away.
    Continue(Arc<NodeClaim>),
    /// Nothing to do until an event (or the timer) arrives.
    Wait(Option<Duration>),
    /// Asked the Scaler for a Machine from this MachineDeployment.
    Requested(String, Option<Duration>),
    /// The claim is finished (finalizer removed or deleted).
    Done,
}

impl Step {
    async fn run(mut self) -> Outcome {
        let mut out = Outcome::default();
        for _ in 0..MAX_STEPS {
            match self.next().await {
                Ok(Next::Continue(c)) => {
                    self.claim = c.clone();
                    out.claim = Some(c);
                }
                Ok(Next::Wait(d)) => {
                    out.claim = Some(self.claim.clone());
                    out.wake_in = d;
                    return out;
                }
                Ok(Next::Requested(md, d)) => {
                    out.claim = Some(self.claim.clone());
                    out.requested = Some(md);
                    out.wake_in = d;
                    return out;
                }
                Ok(Next::Done) => {
                    out.done = true;
                    out.terminated = self.terminated;
                    return out;
                }
                // The Node changed under a guarded patch (the kubelet, the node lifecycle
                // controller): the index holds the old copy until the Node watch delivers the
                // new one, and that event kicks this claim. Planning again now would patch the
                // same stale copy, a PATCH and a GET per step, as fast as the server answers.
                Err(e) if e.is_node_conflict() => {
                    out.claim = Some(self.claim.clone());
                    out.wake_in = Some(NODE_CONFLICT_WAIT);
                    return out;
                }
                Err(e) if e.is_conflict() => match self.reread().await {
                    Ok(Some(c)) => {
                        self.claim = c.clone();
                        out.claim = Some(c);
                    }
                    Ok(None) => {
                        out.done = true;
                        return out;
                    }
                    Err(e) => {
                        out.error = Some(e);
                        return out;
                    }
                },
                Err(e) if e.is_not_found() => {
                    // The claim itself is gone (or what we patched vanished): the watch will tell.
                    out.gone = true;
                    return out;
                }
                Err(e) => {
                    out.error = Some(e);
                    return out;
                }
            }
        }
        out.wake_in = Some(Duration::ZERO);
        out
    }

    fn name(&self) -> String {
        self.claim.name_any()
    }

    /// This Cluster's binding when its claims are in the management cluster.
    fn binding(&self) -> Option<&crate::view::binding::Binding> {
        self.shared.settings.karpenter_objects.as_ref()
    }

    fn api(&self) -> Api<NodeClaim> {
        self.shared.api()
    }

    async fn reread(&self) -> Result<Option<Arc<NodeClaim>>, Error> {
        let name = self.name();
        self.api()
            .get_opt(&name)
            .await
            .map(|c| c.map(Arc::new))
            .map_err(api_err(&self.shared.metrics, "get", "nodeclaims", &name))
    }

    /// Decide and take the next step.
    async fn next(&mut self) -> Result<Next, Error> {
        let c = self.claim.clone();
        if c.metadata.deletion_timestamp.is_some() {
            return self.terminate().await;
        }
        // A Node deleted directly (`kubectl delete node`) ends its claim the same way: deleting
        // the claim runs the one termination flow (our finalizer holds the Node meanwhile).
        if let Some(n) = self.claim_node()
            && n.metadata.deletion_timestamp.is_some()
            && n.finalizers().iter().any(|f| f == TERMINATION_FINALIZER)
        {
            tracing::info!(nodeclaim = %self.name(), node = %n.name_any(), "{}", self.shared.settings.say("node deleted; deleting its NodeClaim", "node deleted; would delete its NodeClaim"));
            self.delete_claim().await?;
            return Ok(Next::Wait(None));
        }
        let Some(md) = recorded_deployment(&c)
            .map(str::to_string)
            .filter(|_| has_finalizer(&c))
        else {
            if let Some(next) = self.adopt().await? {
                return Ok(next);
            }
            return self.launch_decision().await;
        };
        let bound = self.bound_machine();
        let machine = match bound {
            Ok(m) => m,
            Err(many) => {
                // Invariant 1 violated by someone else; refuse to guess.
                self.shared.events.warning(
                    object_ref(&c),
                    "MultipleMachines",
                    format!(
                        "Machines {} all name NodeClaim {}; leaving it for an operator",
                        many.join(", "),
                        self.name()
                    ),
                );
                return Ok(Next::Wait(None));
            }
        };
        let Some(machine) = machine else {
            if let Some(pid) = recorded_instance(&c) {
                if self.handed_back_still(&md, pid) {
                    // Taken back, and the pool's write that counts it as ours again has not
                    // landed (a restart between the two): only the pool's Scaler writes it,
                    // and with every claim bound nothing else would start it.
                    self.scaler(&md).do_send(Poke);
                }
                return self.on_instance(&md, pid).await;
            }
            if let Some(recorded) = recorded_machine(&c)
                && self.shared.state.machines.read().synced()
            {
                return self.recorded_machine_unseen(recorded.to_string()).await;
            }
            if let Some(left) = self.create_deadline_left() {
                if let Some(next) = self.say_why_waiting(&md).await? {
                    return Ok(next);
                }
                if self.requested.as_deref() == Some(md.as_str()) {
                    return Ok(Next::Wait(Some(left)));
                }
                self.scaler(&md)
                    .do_send(RequestMachine { claim: self.name() });
                return Ok(Next::Requested(md, Some(left)));
            }
            return self.create_timeout(&md, None).await;
        };
        if claimed_elsewhere(&machine) {
            // Its Scaler adopts it; it may not be running yet.
            self.scaler(&md).do_send(Poke);
        }
        if machine.deletion_timestamp.is_some() {
            return self
                .machine_gone(machine_key(&machine.namespace, &machine.name))
                .await;
        }
        let mk = machine_key(&machine.namespace, &machine.name);
        if recorded_machine(&c) != Some(mk.as_str()) {
            return self.record_machine(&md, &mk).await;
        }
        // Cluster API gave up on this Machine: fail the claim now rather than at the create
        // timeout (which slow-provider users raise to 15-30 minutes).
        if machine.is_failed() && !is_true(&c, conditions::REGISTERED) {
            return self.machine_failed(&md, &machine).await;
        }
        let Some(pid) = machine.provider_id.clone() else {
            return match self.create_deadline_left() {
                Some(left) => Ok(Next::Wait(Some(left))),
                None => self.create_timeout(&md, Some(&machine)).await,
            };
        };
        if provider_id(&c) != Some(pid.as_str()) || !is_true(&c, conditions::LAUNCHED) {
            return self.launched(&md, Some(&machine), &pid).await;
        }
        self.on_node(&md, &pid).await
    }

    /// A claim bound to an instance of a pool without MachinePool Machines: launched once
    /// bound (the instance has its provider ID already), gone when the pool no longer lists it.
    async fn on_instance(&mut self, md: &str, pid: &str) -> Result<Next, Error> {
        if instance_gone(&self.shared, md, pid) {
            return self.machine_gone(format!("instance {pid} of {md}")).await;
        }
        let c = self.claim.clone();
        if provider_id(&c) != Some(pid) || !is_true(&c, conditions::LAUNCHED) {
            return self.launched(md, None, pid).await;
        }
        self.on_node(md, pid).await
    }

    /// Launched: registration and initialization once the Node appears.
    async fn on_node(&mut self, md: &str, pid: &str) -> Result<Next, Error> {
        let c = self.claim.clone();
        let md = md.to_string();
        // The compact Node: a settled claim's reconcile reads only what is kept in place; the
        // whole Node is rebuilt when registration or initialization has work to do.
        let node = self
            .shared
            .state
            .nodes
            .read()
            .compact_by_provider_id(pid)
            .cloned();
        let Some(node) = node else {
            return match self.registration_deadline_left() {
                Some(left) => Ok(Next::Wait(Some(left))),
                None => self.registration_timeout(&md).await,
            };
        };
        if !is_true(&c, conditions::REGISTERED) || !node_registered(&node, &c, self.binding()) {
            return self.register(&node).await;
        }
        if !is_true(&c, conditions::INITIALIZED) {
            return self.initialize(&md, &node.node()).await;
        }
        Ok(Next::Wait(None))
    }

    /// The Machine bound to this claim: by our binding, else (until the Scaler adopts it) the
    /// one another provisioner bound and named on the claim.
    fn bound_machine(&self) -> Result<Option<Arc<crate::capi::model::Machine>>, Vec<String>> {
        let machines = self.shared.state.machines.read();
        match machines.bound_to(&self.name()) {
            Ok(None) => Ok(recorded_machine(&self.claim)
                .and_then(|mk| machines.get(mk))
                .filter(|m| claimed_elsewhere(m))),
            other => other,
        }
    }

    /// A claim another provisioner launched (it names its Machine, records no MachineDeployment
    /// of ours): record the Machine's MachineDeployment and our finalizer, keeping everything
    /// else, so the claim carries on from where it is. `None` when it is not such a claim.
    async fn adopt(&mut self) -> Result<Option<Next>, Error> {
        let c = self.claim.clone();
        let Some(md) = self
            .bound_machine()
            .ok()
            .flatten()
            .and_then(|m| crate::state::machines::deployment_key(&m))
        else {
            return Ok(None);
        };
        tracing::info!(nodeclaim = %self.name(), machine_deployment = %md, "{}", self.shared.settings.say("adopting the NodeClaim", "would adopt the NodeClaim"));
        let mut p = JsonPatch::guarded(c.resource_version().as_deref());
        if !has_finalizer(&c) {
            let mut finalizers = c.finalizers().to_vec();
            finalizers.push(TERMINATION_FINALIZER.to_string());
            p.set("/metadata/finalizers", serde_json::json!(finalizers));
        }
        p.set_entry(
            !c.annotations().is_empty(),
            "/metadata/annotations",
            MACHINE_DEPLOYMENT_ANNOTATION,
            &md,
        );
        Ok(Some(Next::Continue(self.patch_claim(p, false).await?)))
    }

    /// Whether pool `md` still lists instance `pid` as handed back.
    fn handed_back_still(&self, md: &str, pid: &str) -> bool {
        (self.shared.state.deployments.read().get(md))
            .is_some_and(|d| d.handed_back().contains(pid))
    }

    fn scaler(&self, md: &str) -> Addr<Scaler> {
        let shared = self.shared.clone();
        let key = md.to_string();
        self.shared
            .router
            .scaler_or_start(md, move || Scaler::new(key, shared).start())
    }

    fn nodepool(&self) -> String {
        self.claim
            .labels()
            .get(NODEPOOL_LABEL)
            .cloned()
            .unwrap_or_default()
    }

    fn created(&self) -> Timestamp {
        self.claim
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .unwrap_or_else(Timestamp::now)
    }
}

/// The pool no longer lists the instance (or is gone), as far as the synced index shows.
fn instance_gone(shared: &Shared, md: &str, pid: &str) -> bool {
    let deployments = shared.state.deployments.read();
    // MachinePools are listed after MachineDeployments (by a watch started once discovery
    // answers): before their list, a pool missing from the index is not a pool that is gone.
    deployments.listed(ScalableKind::MachinePool)
        && deployments
            .get(md)
            .is_none_or(|p| !p.provider_id_list.iter().any(|x| x == pid))
}

fn has_finalizer(c: &NodeClaim) -> bool {
    c.finalizers().iter().any(|f| f == TERMINATION_FINALIZER)
}

fn is_true(c: &NodeClaim, type_: &str) -> bool {
    conditions::is_true(c.conditions(), type_)
}

fn condition_time(c: &NodeClaim, type_: &str) -> Option<Timestamp> {
    conditions::get(c.conditions(), type_)
        .filter(|c| c.is_true())
        .map(|c| c.last_transition_time.0)
}

fn since(t: Timestamp) -> Duration {
    let d = Timestamp::now().duration_since(t);
    Duration::try_from(d).unwrap_or_default()
}

fn left_until(start: Timestamp, timeout: Duration) -> Option<Duration> {
    let elapsed = since(start);
    timeout.checked_sub(elapsed).filter(|d| !d.is_zero())
}

pub(crate) fn object_ref(c: &NodeClaim) -> k8s_openapi::api::core::v1::ObjectReference {
    c.object_ref(&())
}
