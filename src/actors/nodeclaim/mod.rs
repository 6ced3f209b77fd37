//! One NodeClaimActor per claim: launch, registration, initialization, timeouts, termination.
//!
//! The actor is level-triggered: every message only records what arrived and asks for a
//! reconcile; one reconcile runs at a time and reads the claim, its Machine and its Node from the
//! indexes, then takes the next step(s) (REFERENCE.md section 3). Whatever a step needs to know
//! later is written to the API first, so a restarted controller resumes at the same step.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, DeleteParams, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::backoff::Backoff;
use super::catalog::{Choice, ResolveError};
use super::patch::{JsonPatch, escape};
use super::scaler::{self, Rejection, RequestMachine, Scaler};
use super::{Error, Shared, api_err};
use crate::api::conditions::{self, ConditionStatus};
use crate::api::nodeclaim::NodeClaim;
use crate::api::requirements::Requirements;
use crate::api::resources::Resources;
use crate::api::wellknown::*;
use crate::capi::model::Machine;
use crate::metrics::{CreatedLabels, Metrics, NodePoolLabels};
use crate::state::claims::{provider_id, recorded_deployment, recorded_machine};
use crate::state::machines::key as machine_key;
use crate::state::versions::Freshness;

mod termination;

/// Something about this claim changed (the claim itself, its Machine or its Node): reconcile.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Kick;

/// The claim as last seen by the NodeClaim watch.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ClaimChanged {
    pub claim: Arc<NodeClaim>,
    /// From a (re-)list rather than a watch event: as new as anything we wrote.
    pub listed: bool,
}

/// The Scaler bound a Machine to this claim.
#[derive(Message)]
#[rtype(result = "()")]
pub struct MachineBound {
    pub machine: String,
}

/// The Scaler cannot give this claim a Machine from that MachineDeployment.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RequestRejected {
    pub machine_deployment: String,
    pub why: Rejection,
}

/// Stop this actor (the controller stops its writers).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

/// The claim is gone from the API (last seen as this): stop. A claim whose finalizer removal
/// answered too late for the reconcile (or that someone else finished) is counted as
/// terminated here.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Gone(pub Arc<NodeClaim>);

pub struct NodeClaimActor {
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
    pub fn new(shared: Arc<Shared>, claim: Arc<NodeClaim>) -> Self {
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
        ctx.spawn(bounded.into_actor(self).map(|out, act, ctx| {
            act.running = false;
            act.apply(out, ctx);
            if act.again {
                act.kick(ctx);
            }
        }));
    }

    fn apply(&mut self, out: Outcome, ctx: &mut Context<Self>) {
        if let Some(claim) = out.claim
            && claim.resource_version() != self.claim.resource_version()
            && self
                .fresh
                .responded(&self.name, &claim.resource_version().unwrap_or_default())
        {
            self.shared
                .state
                .claims
                .write()
                .apply_response((*claim).clone());
            self.claim = claim;
        }
        if let Some(md) = out.requested {
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
            let d = self.backoff.next_delay();
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
        if msg.why == Rejection::AtMaxSize {
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

impl Handler<Stop> for NodeClaimActor {
    type Result = ();
    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        ctx.stop();
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

/// How often a claim whose NodeClass is missing or not ready tries again.
const LAUNCH_RETRY: Duration = Duration::from_secs(10);

/// How many steps one reconcile may take before yielding (each step is at most one write).
const MAX_STEPS: usize = 10;

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

    fn api(&self) -> Api<NodeClaim> {
        Api::all(self.shared.workload.clone())
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
            tracing::info!(nodeclaim = %self.name(), node = %n.name_any(), "node deleted; deleting its NodeClaim");
            self.delete_claim().await?;
            return Ok(Next::Wait(None));
        }
        let Some(md) = recorded_deployment(&c)
            .map(str::to_string)
            .filter(|_| has_finalizer(&c))
        else {
            return self.launch_decision().await;
        };
        let bound = self.shared.state.machines.read().bound_to(&self.name());
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
            if let Some(recorded) = recorded_machine(&c)
                && self.shared.state.machines.read().synced()
            {
                return self.machine_gone(recorded.to_string()).await;
            }
            if let Some(left) = self.create_deadline_left() {
                if self.requested.as_deref() == Some(md.as_str()) {
                    return Ok(Next::Wait(Some(left)));
                }
                self.scaler(&md)
                    .do_send(RequestMachine { claim: self.name() });
                return Ok(Next::Requested(md, Some(left)));
            }
            return self.create_timeout(&md, None).await;
        };
        if machine.deletion_timestamp.is_some() {
            return self
                .machine_gone(machine_key(&machine.namespace, &machine.name))
                .await;
        }
        let mk = machine_key(&machine.namespace, &machine.name);
        if recorded_machine(&c) != Some(mk.as_str()) {
            return self.record_machine(&mk).await;
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
            return self.launched(&md, &machine, &pid).await;
        }
        let node = self.shared.state.nodes.read().by_provider_id(&pid);
        let Some(node) = node else {
            return match self.registration_deadline_left() {
                Some(left) => Ok(Next::Wait(Some(left))),
                None => self.registration_timeout(&md).await,
            };
        };
        if !is_true(&c, conditions::REGISTERED) || !node_registered(&node, &c) {
            return self.register(&node).await;
        }
        if !is_true(&c, conditions::INITIALIZED) {
            return self.initialize(&md, &node).await;
        }
        Ok(Next::Wait(None))
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

    fn create_timeout_setting(&self) -> Duration {
        self.shared
            .catalog
            .create_timeout(&self.claim.spec.node_class_ref.name)
            .unwrap_or(self.shared.settings.create_timeout)
    }

    /// Time left before the create timeout, or None when it has passed.
    fn create_deadline_left(&self) -> Option<Duration> {
        left_until(self.created(), self.create_timeout_setting())
    }

    fn registration_deadline_left(&self) -> Option<Duration> {
        let launched =
            condition_time(&self.claim, conditions::LAUNCHED).unwrap_or_else(Timestamp::now);
        left_until(launched, self.shared.settings.registration_timeout)
    }

    /// First step: choose the offering and record it on the claim, with the finalizer and the
    /// offering's labels, before any replica is requested (invariant 4).
    async fn launch_decision(&mut self) -> Result<Next, Error> {
        let c = self.claim.clone();
        let offering = match self.resolve() {
            Ok(o) => o,
            Err(e @ ResolveError::NoCompatibleOffering { .. }) => {
                return self.insufficient_capacity(e).await;
            }
            Err(e @ ResolveError::Invalid(_)) => {
                return self.launch_blocked(e, ConditionStatus::False, None).await;
            }
            // The NodeClass may appear or become ready: retry, as Karpenter does for launch errors.
            Err(e) => {
                return self
                    .launch_blocked(e, ConditionStatus::Unknown, Some(LAUNCH_RETRY))
                    .await;
            }
        };
        let mut p = JsonPatch::guarded(c.resource_version().as_deref());
        let mut finalizers = c.finalizers().to_vec();
        if !finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
            finalizers.push(TERMINATION_FINALIZER.to_string());
        }
        p.set("/metadata/finalizers", json!(finalizers));
        let has_annotations = !c.annotations().is_empty();
        p.set_entry(
            has_annotations,
            "/metadata/annotations",
            MACHINE_DEPLOYMENT_ANNOTATION,
            &offering.machine_deployment,
        );
        let has_labels = !c.labels().is_empty();
        for (k, v) in offering.node_labels() {
            if c.labels().get(&k) != Some(&v) {
                p.set_entry(has_labels, "/metadata/labels", &k, &v);
            }
        }
        let updated = self.patch_claim(p, false).await?;
        tracing::info!(nodeclaim = %self.name(), machine_deployment = %offering.machine_deployment, instance_type = %offering.instance_type, price = offering.price, "offering chosen");
        Ok(Next::Continue(updated))
    }

    fn resolve(&self) -> Result<Choice, ResolveError> {
        let spec = &self.claim.spec;
        let reqs = Requirements::from_node_selector_requirements(&spec.requirements)
            .map_err(|e| ResolveError::Invalid(format!("spec.requirements: {e}")))?;
        let requests = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .map(Resources::from_k8s)
            .transpose()
            .map_err(|e| ResolveError::Invalid(format!("spec.resources.requests: {e}")))?
            .unwrap_or_default();
        let declared = super::provisioner::declared_taints(&spec.taints, &spec.startup_taints);
        self.shared.catalog.resolve(
            &spec.node_class_ref.name,
            &reqs,
            &requests,
            &self.excluded,
            &declared,
        )
    }

    /// A launch that cannot start yet (or ever): say why in `Launched` and an Event, once.
    async fn launch_blocked(
        &mut self,
        e: ResolveError,
        status: ConditionStatus,
        retry: Option<Duration>,
    ) -> Result<Next, Error> {
        let c = self.claim.clone();
        let message = e.to_string();
        // Karpenter's launch timeout: a claim that cannot launch is not kept for ever; deleting
        // it lets the provisioner solve its pods again (perhaps on another NodePool).
        let Some(left) = left_until(self.created(), self.shared.settings.launch_timeout) else {
            tracing::warn!(nodeclaim = %self.name(), error = %e, "not launched within the launch timeout; deleting it");
            self.shared.events.warning(
                object_ref(&c),
                "LaunchTimeout",
                format!(
                    "NodeClaim {} could not launch within {}: {message}; deleting it",
                    self.name(),
                    crate::api::duration::format(self.shared.settings.launch_timeout)
                ),
            );
            self.delete_claim().await?;
            return Ok(Next::Wait(None));
        };
        let retry = Some(retry.map_or(left, |r| r.min(left)));
        let mut st = c.status.clone().unwrap_or_default();
        let mut conds = st.conditions.take().unwrap_or_default();
        let now = Timestamp::now();
        let changed = conditions::set(
            &mut conds,
            conditions::LAUNCHED,
            status,
            e.reason(),
            &message,
            c.metadata.generation,
            now,
        );
        if !changed {
            return Ok(Next::Wait(retry));
        }
        tracing::warn!(nodeclaim = %self.name(), error = %e, "cannot launch yet");
        self.shared.events.warning(
            object_ref(&c),
            e.reason(),
            format!("Cannot launch NodeClaim {}: {message}", self.name()),
        );
        conditions::set_nodeclaim_ready(&mut conds, c.metadata.generation, now);
        st.conditions = Some(conds);
        let updated = self
            .patch_status(serde_json::to_value(&st).unwrap_or(Value::Null))
            .await?;
        self.claim = updated.clone();
        Ok(Next::Wait(retry))
    }

    /// Karpenter's rule: a launch that cannot be satisfied deletes the claim, so the provisioner
    /// retries the pods elsewhere; the Event says why.
    async fn insufficient_capacity(&mut self, e: ResolveError) -> Result<Next, Error> {
        let c = self.claim.clone();
        tracing::warn!(nodeclaim = %self.name(), error = %e, "no offering can launch this claim; deleting it");
        self.shared.events.warning(
            object_ref(&c),
            e.reason(),
            format!("Cannot launch NodeClaim {}: {e}; deleting it", self.name()),
        );
        self.shared
            .metrics
            .cloudprovider_errors
            .get_or_create(&crate::metrics::ErrorLabels {
                method: "Create".into(),
                error: e.reason().into(),
            })
            .inc();
        self.delete_claim().await?;
        Ok(Next::Wait(None))
    }

    async fn record_machine(&mut self, mk: &str) -> Result<Next, Error> {
        let c = self.claim.clone();
        let mut p = JsonPatch::guarded(c.resource_version().as_deref());
        p.set_entry(
            !c.annotations().is_empty(),
            "/metadata/annotations",
            MACHINE_ANNOTATION,
            mk,
        );
        let updated = self.patch_claim(p, false).await?;
        // Karpenter's cloud-provider Create: the claim was accepted (created) until a Machine
        // is bound to it, observed once, when the binding is first recorded on the claim.
        if recorded_machine(&c).is_none() {
            self.shared
                .metrics
                .cloudprovider("Create", since(self.created()));
        }
        Ok(Next::Continue(updated))
    }

    /// The Machine has a provider ID: record it with capacity and `Launched=True`.
    async fn launched(&mut self, md: &str, machine: &Machine, pid: &str) -> Result<Next, Error> {
        let offering = self.shared.catalog.offering(md);
        let updated = self
            .condition_true(conditions::LAUNCHED, |status| {
                status.provider_id = Some(pid.to_string());
                if let Some(o) = &offering {
                    status.capacity = Some(o.capacity.to_k8s());
                    status.allocatable = Some(o.allocatable.to_k8s());
                }
            })
            .await?;
        let m = &self.shared.metrics;
        m.nodeclaims_launched
            .get_or_create(&Metrics::pool(&self.nodepool(), md))
            .inc();
        Metrics::observe(&m.claim_launch_seconds, md, since(self.created()));
        let mk = machine_key(&machine.namespace, &machine.name);
        if let Some(seen) = self.shared.state.machines.read().provider_id_seen(&mk) {
            Metrics::observe(&m.provider_id_to_claim_seconds, md, seen.elapsed());
        }
        tracing::info!(nodeclaim = %self.name(), machine = %mk, provider_id = %pid, machine_deployment = %md, "launched");
        Ok(Next::Continue(updated))
    }

    /// Registration (REFERENCE.md section 3): sync the claim onto the Node, take the
    /// unregistered taint off, own the Node; then `Registered=True`.
    async fn register(&mut self, node: &Node) -> Result<Next, Error> {
        let c = self.claim.clone();
        let node_name = node.name_any();
        if !node_registered(node, &c) {
            self.patch_node(&node_name, registration_patch(node, &c))
                .await?;
        }
        let updated = self
            .condition_true(conditions::REGISTERED, |status| {
                status.node_name = Some(node_name.clone())
            })
            .await?;
        let md = recorded_deployment(&c).unwrap_or_default().to_string();
        let m = &self.shared.metrics;
        m.nodeclaims_registered
            .get_or_create(&Metrics::pool(&self.nodepool(), &md))
            .inc();
        m.nodes_created
            .get_or_create(&NodePoolLabels {
                nodepool: self.nodepool(),
            })
            .inc();
        tracing::info!(nodeclaim = %self.name(), node = %node_name, "registered");
        Ok(Next::Continue(updated))
    }

    /// Initialization: Ready, no startup or ephemeral taints, requested extended resources
    /// present; then label the Node and set `Initialized=True`.
    async fn initialize(&mut self, md: &str, node: &Node) -> Result<Next, Error> {
        let c = self.claim.clone();
        if let Err(why) = node_initialized(node, &c) {
            tracing::debug!(nodeclaim = %self.name(), node = %node.name_any(), why, "not initialized yet");
            return Ok(Next::Wait(None));
        }
        let node_name = node.name_any();
        if node.labels().get(INITIALIZED_LABEL).map(String::as_str) != Some("true") {
            let mut p = JsonPatch::new();
            p.set_entry(
                !node.labels().is_empty(),
                "/metadata/labels",
                INITIALIZED_LABEL,
                "true",
            );
            self.patch_node(&node_name, p).await?;
        }
        let updated = self.condition_true(conditions::INITIALIZED, |_| {}).await?;
        let m = &self.shared.metrics;
        m.nodeclaims_initialized
            .get_or_create(&Metrics::pool(&self.nodepool(), md))
            .inc();
        Metrics::observe(&m.claim_initialized_seconds, md, since(self.created()));
        tracing::info!(nodeclaim = %self.name(), node = %node_name, "initialized");
        Ok(Next::Continue(updated))
    }

    /// Edit the status, set condition `type_` True (and the root `Ready`), write it guarded.
    async fn condition_true(
        &self,
        type_: &str,
        edit: impl FnOnce(&mut crate::api::nodeclaim::NodeClaimStatus),
    ) -> Result<Arc<NodeClaim>, Error> {
        let c = &self.claim;
        let now = Timestamp::now();
        let mut status = c.status.clone().unwrap_or_default();
        edit(&mut status);
        let mut conds = status.conditions.take().unwrap_or_default();
        conditions::set(
            &mut conds,
            type_,
            ConditionStatus::True,
            type_,
            "",
            c.metadata.generation,
            now,
        );
        conditions::set_nodeclaim_ready(&mut conds, c.metadata.generation, now);
        status.conditions = Some(conds);
        self.patch_status(serde_json::to_value(&status).unwrap_or(Value::Null))
            .await
    }

    async fn patch_node(&self, name: &str, p: JsonPatch) -> Result<(), Error> {
        let api: Api<Node> = Api::all(self.shared.workload.clone());
        let patch = p.into_patch().map_err(|source| Error::Patch {
            kind: "Node",
            name: name.to_string(),
            source,
        })?;
        let updated = api
            .patch(name, &PatchParams::default(), &patch)
            .await
            .map_err(api_err(&self.shared.metrics, "patch", "nodes", name))?;
        self.shared.state.nodes.write().apply(updated);
        Ok(())
    }

    async fn create_timeout(&mut self, md: &str, machine: Option<&Machine>) -> Result<Next, Error> {
        let c = self.claim.clone();
        let timeout = self.create_timeout_setting();
        self.shared
            .metrics
            .create_timeouts
            .get_or_create(&Metrics::pool(&self.nodepool(), md))
            .inc();
        self.shared
            .catalog
            .mark_unavailable(md, self.shared.settings.unavailable_offering_ttl);
        let what = match machine {
            Some(m) => format!("Machine {}/{} got no provider ID", m.namespace, m.name),
            None => "no Machine was created".to_string(),
        };
        self.shared.events.warning(
            object_ref(&c),
            "CreateTimeout",
            format!(
                "{what} within {} from MachineDeployment {md}; deleting the NodeClaim and marking the offering unavailable for {}",
                crate::api::duration::format(timeout),
                crate::api::duration::format(self.shared.settings.unavailable_offering_ttl)
            ),
        );
        tracing::warn!(nodeclaim = %self.name(), machine_deployment = %md, "create timeout");
        self.delete_claim().await?;
        Ok(Next::Wait(None))
    }

    /// The claim's Machine failed before its Node registered: avoid the offering for a while,
    /// say why, and delete the claim (its termination releases the Machine).
    async fn machine_failed(&mut self, md: &str, machine: &Machine) -> Result<Next, Error> {
        let c = self.claim.clone();
        self.shared
            .catalog
            .mark_unavailable(md, self.shared.settings.unavailable_offering_ttl);
        self.shared
            .metrics
            .cloudprovider_errors
            .get_or_create(&crate::metrics::ErrorLabels {
                method: "Create".into(),
                error: "MachineFailed".into(),
            })
            .inc();
        let why = match (&machine.failure_reason, &machine.failure_message) {
            (Some(r), Some(m)) => format!("{r}: {m}"),
            (Some(r), None) => r.clone(),
            (None, Some(m)) => m.clone(),
            (None, None) => format!("phase {:?}", machine.phase),
        };
        self.shared.events.warning(
            object_ref(&c),
            "MachineFailed",
            format!(
                "Machine {}/{} of MachineDeployment {md} failed ({why}); deleting the NodeClaim and marking the offering unavailable for {}",
                machine.namespace,
                machine.name,
                crate::api::duration::format(self.shared.settings.unavailable_offering_ttl)
            ),
        );
        tracing::warn!(nodeclaim = %self.name(), machine = %machine.name, reason = %why, "machine failed");
        self.delete_claim().await?;
        Ok(Next::Wait(None))
    }

    async fn registration_timeout(&mut self, md: &str) -> Result<Next, Error> {
        let c = self.claim.clone();
        self.shared
            .metrics
            .registration_timeouts
            .get_or_create(&Metrics::pool(&self.nodepool(), md))
            .inc();
        self.shared
            .catalog
            .mark_unavailable(md, self.shared.settings.unavailable_offering_ttl);
        self.shared.events.warning(
            object_ref(&c),
            "RegistrationTimeout",
            format!(
                "No Node with provider ID {} registered within {}; deleting the NodeClaim",
                provider_id(&c).unwrap_or("?"),
                crate::api::duration::format(self.shared.settings.registration_timeout)
            ),
        );
        self.delete_claim().await?;
        Ok(Next::Wait(None))
    }

    /// Garbage collection: the claim's Machine is gone, so is the claim.
    async fn machine_gone(&mut self, machine: String) -> Result<Next, Error> {
        let c = self.claim.clone();
        self.shared.events.warning(
            object_ref(&c),
            "MachineDeleted",
            format!(
                "Machine {machine} no longer exists; deleting NodeClaim {}",
                self.name()
            ),
        );
        self.delete_claim().await?;
        Ok(Next::Wait(None))
    }

    async fn delete_claim(&self) -> Result<(), Error> {
        let name = self.name();
        match self.api().delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(api_err(&self.shared.metrics, "delete", "nodeclaims", &name)(e)),
        }
    }

    async fn patch_claim(&self, p: JsonPatch, status: bool) -> Result<Arc<NodeClaim>, Error> {
        let name = self.name();
        let patch = p.into_patch().map_err(|source| Error::Patch {
            kind: "NodeClaim",
            name: name.clone(),
            source,
        })?;
        let api = self.api();
        let r = if status {
            api.patch_status(&name, &PatchParams::default(), &patch)
                .await
        } else {
            api.patch(&name, &PatchParams::default(), &patch).await
        };
        r.map(Arc::new)
            .map_err(api_err(&self.shared.metrics, "patch", "nodeclaims", &name))
    }

    /// Replace the status, guarded by the resourceVersion we computed it from.
    async fn patch_status(&self, status: Value) -> Result<Arc<NodeClaim>, Error> {
        let mut p = JsonPatch::guarded(self.claim.resource_version().as_deref());
        p.set("/status", status);
        self.patch_claim(p, true).await
    }
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

pub fn object_ref(c: &NodeClaim) -> k8s_openapi::api::core::v1::ObjectReference {
    c.object_ref(&())
}

/// Labels Karpenter puts on the Node at registration: the claim's labels plus `registered`.
fn registration_labels(c: &NodeClaim) -> BTreeMap<String, String> {
    let mut labels = c.labels().clone();
    labels.insert(REGISTERED_LABEL.to_string(), "true".to_string());
    labels
}

fn same_taint(a: &Taint, b: &Taint) -> bool {
    a.key == b.key && a.effect == b.effect
}

/// The Node's taints after registration: without the unregistered taint, with the claim's
/// taints and startup taints (each once).
fn registration_taints(node: &Node, c: &NodeClaim) -> Vec<Taint> {
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != UNREGISTERED_TAINT_KEY)
        .collect();
    let wanted = c
        .spec
        .taints
        .iter()
        .flatten()
        .chain(c.spec.startup_taints.iter().flatten());
    for t in wanted {
        if !taints.iter().any(|have| same_taint(have, t)) {
            taints.push(t.clone());
        }
    }
    taints
}

/// True when the Node already carries everything registration writes.
fn node_registered(node: &Node, c: &NodeClaim) -> bool {
    let labels = node.labels();
    let has_taint = |key: &str| {
        node.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|ts| ts.iter().any(|t| t.key == key))
            .unwrap_or(false)
    };
    labels.get(REGISTERED_LABEL).map(String::as_str) == Some("true")
        && !has_taint(UNREGISTERED_TAINT_KEY)
        && node.finalizers().iter().any(|f| f == TERMINATION_FINALIZER)
        && node
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == c.metadata.uid.as_ref())
}

fn registration_patch(node: &Node, c: &NodeClaim) -> JsonPatch {
    let mut p = JsonPatch::guarded(node.resource_version().as_deref());
    let has_labels = !node.labels().is_empty();
    for (k, v) in registration_labels(c) {
        if node.labels().get(&k) != Some(&v) {
            p.set_entry(has_labels, "/metadata/labels", &k, &v);
        }
    }
    let has_annotations = !node.annotations().is_empty();
    for (k, v) in c.annotations() {
        if k == "kubectl.kubernetes.io/last-applied-configuration"
            || node.annotations().get(k) == Some(v)
        {
            continue;
        }
        p.set_entry(has_annotations, "/metadata/annotations", k, v);
    }
    p.set("/spec/taints", json!(registration_taints(node, c)));
    let mut finalizers = node.finalizers().to_vec();
    if !finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
        finalizers.push(TERMINATION_FINALIZER.to_string());
    }
    p.set("/metadata/finalizers", json!(finalizers));
    let mut owners = node.owner_references().to_vec();
    if let Some(uid) = &c.metadata.uid
        && !owners.iter().any(|o| &o.uid == uid)
    {
        owners.push(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: NodeClaim::api_version(&()).to_string(),
                kind: NodeClaim::kind(&()).to_string(),
                name: c.name_any(),
                uid: uid.clone(),
                block_owner_deletion: Some(true),
                controller: None,
            },
        );
    }
    p.set("/metadata/ownerReferences", json!(owners));
    let _ = escape; // keys are escaped inside set_entry
    p
}

/// Why a registered Node is not initialized yet, or Ok.
fn node_initialized(node: &Node, c: &NodeClaim) -> Result<(), &'static str> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status == "True")
        .unwrap_or(false);
    if !ready {
        return Err("node not Ready");
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    if taints
        .iter()
        .any(|t| EPHEMERAL_TAINT_KEYS.contains(&t.key.as_str()))
    {
        return Err("ephemeral taint present");
    }
    if c.spec
        .startup_taints
        .iter()
        .flatten()
        .any(|st| taints.iter().any(|t| same_taint(t, st)))
    {
        return Err("startup taint present");
    }
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let requests = c.spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    for name in requests.into_iter().flat_map(|r| r.keys()) {
        if matches!(
            name.as_str(),
            "cpu" | "memory" | "pods" | "ephemeral-storage"
        ) {
            continue;
        }
        let have = allocatable
            .and_then(|a| a.get(name))
            .and_then(|q| crate::api::resources::Quantity::from_k8s(q).ok())
            .map(|q| !q.is_zero())
            .unwrap_or(false);
        if !have {
            return Err("requested extended resource not yet allocatable");
        }
    }
    Ok(())
}

#[allow(dead_code)]
fn created_labels(reason: &str, nodepool: &str) -> CreatedLabels {
    CreatedLabels {
        reason: reason.into(),
        nodepool: nodepool.into(),
    }
}

#[allow(dead_code)]
fn _assert_send() {
    fn is_send<T: Send>() {}
    let _ = is_send::<Instant>;
    let _ = scaler::DELETE_MACHINE_VALUE;
}
