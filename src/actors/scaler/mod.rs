//! One Scaler per MachineDeployment: the only writer of its `spec.replicas`.
//!
//! Claims ask for Machines; the Scaler re-plans from the indexes (see `plan`) after every message
//! and carries out at most one replica write at a time. Requests that arrive while a write is in
//! flight are covered by the next write, so batching is natural: no window at low load, large
//! batches under load. Bindings are written to the Machine first (the durable truth), guarded by
//! the Machine's resourceVersion, then announced to the claim.

pub mod plan;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kube::api::{Api, DeleteParams, DynamicObject, PatchParams};
use serde_json::json;

use self::plan::{MachineView, ReplicaWrite, Snapshot};
use super::nodeclaim::{MachineBound, RequestRejected};
use super::patch::JsonPatch;
use super::{Error, Shared, api_err};
use crate::api::wellknown::{
    DELETE_MACHINE_ANNOTATION, MANAGED_REPLICAS_ANNOTATION, MEMBER_LABEL, NODECLAIM_ANNOTATION,
};
use crate::capi::model::{Machine, MachineDeployment};
use crate::capi::{annotations, version};
use crate::metrics::{Metrics, WriteLabels};
use crate::state::claims::recorded_deployment;
use crate::state::machines::{bound_claim, key};

/// The value we put in `cluster.x-k8s.io/delete-machine`, so that a mark set by somebody else on a
/// baseline Machine is never mistaken for one of ours.
pub const DELETE_MACHINE_VALUE: &str = "karpenter-capi";

/// How long to wait before re-planning after a write failed for a reason other than a conflict.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How often a Scaler re-plans from the indexes even when nothing told it to.
const RESYNC: Duration = Duration::from_secs(10);

/// A replica write that has not answered by then is abandoned (the compare-and-swap makes a
/// retry safe even if the abandoned write landed), so one hung request cannot stall a
/// MachineDeployment.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// A claim needs a Machine from this MachineDeployment (idempotent per claim).
#[derive(Message)]
#[rtype(result = "()")]
pub struct RequestMachine {
    pub claim: String,
}

/// A waiting claim gave up (deleted or timed out) before it got a Machine. Answers whether a
/// bind for it is still in flight: the claim must not let go until that bind has landed (and
/// then release the Machine), or the Machine would be orphaned.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct CancelRequest {
    pub claim: String,
}

/// A terminating claim gives its Machine back: annotate it, then decrement (invariant 3).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReleaseMachine {
    pub machine: String,
}

/// Something this MachineDeployment depends on changed (its Machines, itself, a claim): re-plan.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Poke;

/// Why a request was turned down; the claim picks another offering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    AtMaxSize,
    DeploymentGone,
}

/// True when the Machine carries our release mark (or any mark while bound to one of our claims).
pub fn marked_by_us(m: &Machine) -> bool {
    match m.annotations.get(DELETE_MACHINE_ANNOTATION) {
        Some(v) => v == DELETE_MACHINE_VALUE || bound_claim(m).is_some(),
        None => false,
    }
}

/// The replicas this controller owns, from the MachineDeployment's annotation.
pub fn managed_replicas(md: &MachineDeployment) -> i32 {
    md.annotations
        .get(MANAGED_REPLICAS_ANNOTATION)
        .and_then(|v| v.trim().parse::<i32>().ok())
        .unwrap_or(0)
        .max(0)
}

pub struct Scaler {
    md: String,
    shared: Arc<Shared>,
    /// Claims that asked, with when they asked (for the binding latency metric).
    asked: VecDeque<(String, Instant)>,
    /// Machine key -> claim, for binds in flight or written but not yet seen in the index.
    binding: HashMap<String, String>,
    /// Machines whose replica we removed (or deleted directly); they are on their way out.
    decremented: HashSet<String>,
    /// Machines with a release annotation in flight.
    releasing: HashSet<String>,
    /// Claims turned down until they ask again.
    rejected: HashSet<String>,
    /// When each claim got its Machine from us; a bound claim missing from the index is only an
    /// orphan once the index has had time to see it.
    bound_at: HashMap<String, Instant>,
    writing: bool,
    retry_scheduled: bool,
}

impl Actor for Scaler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::debug!(machine_deployment = %self.md, "scaler started");
        self.replan(ctx);
        // A resync from the indexes (no API call unless the plan needs one), as controllers
        // resync their caches: whatever a lost message or a failed write left undone is retried.
        ctx.run_interval(RESYNC, |act, ctx| act.replan(ctx));
    }
}

impl Handler<RequestMachine> for Scaler {
    type Result = ();
    fn handle(&mut self, msg: RequestMachine, ctx: &mut Self::Context) {
        self.rejected.remove(&msg.claim);
        if !self.asked.iter().any(|(c, _)| c == &msg.claim) {
            self.asked.push_back((msg.claim, Instant::now()));
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
        self.release(msg.machine, ctx);
        self.replan(ctx);
    }
}

impl Handler<Poke> for Scaler {
    type Result = ();
    fn handle(&mut self, _: Poke, ctx: &mut Self::Context) {
        self.replan(ctx);
    }
}

/// What `plan` needs, gathered from the indexes.
struct Inputs {
    md: Arc<MachineDeployment>,
    machines: Vec<MachineView>,
    waiting: Vec<String>,
    min_size: i32,
    max_size: Option<i32>,
}

impl Scaler {
    pub fn new(md: String, shared: Arc<Shared>) -> Self {
        Self {
            md,
            shared,
            asked: VecDeque::new(),
            binding: HashMap::new(),
            decremented: HashSet::new(),
            releasing: HashSet::new(),
            rejected: HashSet::new(),
            bound_at: HashMap::new(),
            writing: false,
            retry_scheduled: false,
        }
    }

    fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    fn replan(&mut self, ctx: &mut Context<Self>) {
        let Some(inputs) = self.inputs() else {
            self.reject_all(Rejection::DeploymentGone);
            return;
        };
        let snapshot = Snapshot {
            spec_replicas: inputs.md.spec_replicas.unwrap_or(0),
            managed: managed_replicas(&inputs.md),
            min_size: inputs.min_size,
            max_size: inputs.max_size,
            machines: &inputs.machines,
            waiting: &inputs.waiting,
        };
        let plan = plan::plan(&snapshot);
        for machine in self.orphans(&inputs.machines) {
            tracing::warn!(machine = %machine, machine_deployment = %self.md, "machine bound to a NodeClaim that no longer exists; releasing it");
            self.release(machine, ctx);
        }
        self.metrics()
            .scaler_queue_depth
            .get_or_create(&Metrics::md(&self.md))
            .set(inputs.waiting.len() as i64);

        for (claim, machine) in plan.bind {
            self.bind(claim, machine, ctx);
        }
        for claim in plan.reject {
            self.reject(&claim, Rejection::AtMaxSize);
        }
        for machine in plan.release {
            self.release(machine, ctx);
        }
        if let Some(write) = plan.write
            && !self.writing
        {
            self.write(inputs.md, write, plan.delete_directly, ctx);
        }
    }

    /// Machines bound to a claim that is gone (deleted while a bind was landing, or removed by
    /// someone else): garbage to release, once the claim index had time to see the claim.
    fn orphans(&mut self, machines: &[MachineView]) -> Vec<String> {
        const GRACE: Duration = Duration::from_secs(30);
        self.bound_at.retain(|_, t| t.elapsed() < GRACE * 2);
        let claims = self.shared.state.claims.read();
        if !claims.synced() {
            return Vec::new();
        }
        machines
            .iter()
            .filter(|m| !m.marked)
            .filter_map(|m| {
                let c = m.bound_to.as_deref()?;
                let fresh = self.bound_at.get(c).is_some_and(|t| t.elapsed() < GRACE);
                let in_flight = self.binding.contains_key(&m.key);
                (!claims.contains(c) && !fresh && !in_flight).then(|| m.key.clone())
            })
            .collect()
    }

    /// Gather the planner's inputs; `None` when the MachineDeployment is gone.
    fn inputs(&mut self) -> Option<Inputs> {
        let md = self.shared.state.deployments.read().get(&self.md)?;
        if md.deletion_timestamp.is_some() {
            return None;
        }
        let sizes = annotations::parse(&md.annotations).ok();
        let min_size = sizes.as_ref().and_then(|s| s.min_size).unwrap_or(0);
        let max_size = sizes.as_ref().and_then(|s| s.max_size);

        let machines = self.shared.state.machines.read();
        let all = machines.of_deployment(&self.md);
        let live_keys: HashSet<String> = all
            .iter()
            .filter(|m| m.deletion_timestamp.is_none())
            .map(|m| key(&m.namespace, &m.name))
            .collect();
        self.decremented.retain(|k| live_keys.contains(k));
        self.binding.retain(|mk, _| {
            machines
                .get(mk)
                .map(|m| bound_claim(&m).is_none())
                .unwrap_or(false)
        });

        let views: Vec<MachineView> = all
            .iter()
            .filter(|m| m.deletion_timestamp.is_none())
            .map(|m| (key(&m.namespace, &m.name), m))
            .filter(|(k, _)| !self.decremented.contains(k))
            .map(|(k, m)| MachineView {
                bound_to: bound_claim(m)
                    .map(str::to_string)
                    .or_else(|| self.binding.get(&k).cloned()),
                marked: marked_by_us(m),
                key: k,
            })
            .collect();

        let claims = self.shared.state.claims.read();
        let mut waiting: BTreeSet<String> = claims.waiting_on(&self.md);
        self.asked.retain(|(c, at)| match claims.get(c) {
            // Not in the index yet (its write is newer than our watch): keep asking for a
            // while; a claim the index never shows is gone, and must not hold a replica.
            None => at.elapsed() < Duration::from_secs(30),
            // The index may not have seen the write that recorded this MachineDeployment.
            Some(cl) => {
                cl.metadata.deletion_timestamp.is_none()
                    && recorded_deployment(&cl).is_none_or(|md| md == self.md)
            }
        });
        waiting.extend(self.asked.iter().map(|(c, _)| c.clone()));
        let bound_now: HashSet<&str> = views.iter().filter_map(|v| v.bound_to.as_deref()).collect();
        let mut waiting: Vec<String> = waiting
            .into_iter()
            .filter(|c| !self.rejected.contains(c) && !bound_now.contains(c.as_str()))
            .filter(|c| matches!(machines.bound_to(c), Ok(None)))
            .collect();
        waiting.sort_by_cached_key(|c| {
            (
                claims
                    .get(c)
                    .and_then(|cl| cl.metadata.creation_timestamp.clone()),
                c.clone(),
            )
        });
        Some(Inputs {
            md,
            machines: views,
            waiting,
            min_size,
            max_size,
        })
    }

    fn reject_all(&mut self, why: Rejection) {
        let claims: Vec<String> = self.asked.iter().map(|(c, _)| c.clone()).collect();
        for c in claims {
            self.reject(&c, why);
        }
    }

    fn reject(&mut self, claim: &str, why: Rejection) {
        self.asked.retain(|(c, _)| c != claim);
        self.rejected.insert(claim.to_string());
        if let Some(addr) = self.shared.router.claim(claim) {
            addr.do_send(RequestRejected {
                machine_deployment: self.md.clone(),
                why,
            });
        }
    }

    fn machine_api(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.shared.management.clone(),
            namespace,
            &version::machine_resource(self.shared.capi_version),
        )
    }

    fn md_api(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.shared.management.clone(),
            namespace,
            &version::machine_deployment_resource(self.shared.capi_version),
        )
    }

    /// Bind: write the claim's name onto the Machine, guarded by the Machine's resourceVersion,
    /// then tell the claim. The Machine annotation is the durable truth (invariant 1).
    fn bind(&mut self, claim: String, machine_key: String, ctx: &mut Context<Self>) {
        if self.binding.contains_key(&machine_key) {
            return;
        }
        let Some(machine) = self.shared.state.machines.read().get(&machine_key) else {
            return;
        };
        self.binding.insert(machine_key.clone(), claim.clone());
        let asked_at = self
            .asked
            .iter()
            .find(|(c, _)| c == &claim)
            .map(|(_, t)| *t);
        self.asked.retain(|(c, _)| c != &claim);

        let api = self.machine_api(&machine.namespace);
        let shared = self.shared.clone();
        let fut = async move {
            let mut p = JsonPatch::guarded(Some(machine.resource_version.as_str()));
            p.set_entry(
                !machine.annotations.is_empty(),
                "/metadata/annotations",
                NODECLAIM_ANNOTATION,
                &claim,
            );
            p.set_entry(
                !machine.labels.is_empty(),
                "/metadata/labels",
                MEMBER_LABEL,
                "",
            );
            let result = patch_machine(&shared, &api, &machine.name, p).await;
            (claim, machine, result)
        };
        ctx.spawn(fut.into_actor(self).map(move |(claim, machine, result), act, ctx| {
            let mk = key(&machine.namespace, &machine.name);
            match result {
                Ok(updated) => {
                    act.shared.state.machines.write().apply(updated);
                    act.bound_at.insert(claim.clone(), Instant::now());
                    if let Some(t) = asked_at {
                        Metrics::observe(&act.metrics().binding_seconds, &act.md, t.elapsed());
                    }
                    tracing::debug!(nodeclaim = %claim, machine = %mk, machine_deployment = %act.md, "machine bound");
                    if let Some(addr) = act.shared.router.claim(&claim) {
                        addr.do_send(MachineBound { machine: mk });
                    }
                }
                Err(e) => {
                    act.binding.remove(&mk);
                    act.asked.push_front((claim.clone(), asked_at.unwrap_or_else(Instant::now)));
                    if e.is_conflict() {
                        act.refresh_machine(machine, ctx);
                    } else {
                        tracing::warn!(nodeclaim = %claim, machine = %mk, error = %e, "binding failed");
                        act.retry_later(ctx);
                    }
                    return;
                }
            }
            act.replan(ctx);
        }));
    }

    /// Mark a Machine of ours for deletion (step one of a release; the decrement follows).
    fn release(&mut self, machine_key: String, ctx: &mut Context<Self>) {
        let Some(machine) = self.shared.state.machines.read().get(&machine_key) else {
            return;
        };
        if marked_by_us(&machine)
            || machine.deletion_timestamp.is_some()
            || !self.releasing.insert(machine_key.clone())
        {
            return;
        }
        let api = self.machine_api(&machine.namespace);
        let shared = self.shared.clone();
        let fut = async move {
            let mut p = JsonPatch::guarded(Some(machine.resource_version.as_str()));
            p.set_entry(
                !machine.annotations.is_empty(),
                "/metadata/annotations",
                DELETE_MACHINE_ANNOTATION,
                DELETE_MACHINE_VALUE,
            );
            let result = patch_machine(&shared, &api, &machine.name, p).await;
            (machine, result)
        };
        ctx.spawn(fut.into_actor(self).map(move |(machine, result), act, ctx| {
            act.releasing.remove(&machine_key);
            match result {
                Ok(updated) => {
                    tracing::info!(machine = %machine_key, machine_deployment = %act.md, "machine marked for deletion");
                    act.shared.state.machines.write().apply(updated);
                    act.replan(ctx);
                }
                Err(e) if e.is_conflict() => act.refresh_machine(machine, ctx),
                Err(e) if e.is_not_found() => act.replan(ctx),
                Err(e) => {
                    tracing::warn!(machine = %machine_key, error = %e, "marking machine for deletion failed");
                    act.retry_later(ctx);
                }
            }
        }));
    }

    /// The one replica write in flight: compare-and-swap on `spec.replicas` and the managed
    /// count, so status updates by Cluster API never cause a conflict but another writer does.
    fn write(
        &mut self,
        md: Arc<MachineDeployment>,
        w: ReplicaWrite,
        delete_directly: Vec<String>,
        ctx: &mut Context<Self>,
    ) {
        self.writing = true;
        let api = self.md_api(&md.namespace);
        let shared = self.shared.clone();
        let started = Instant::now();
        let w2 = w.clone();
        let fut = async move {
            let mut p = JsonPatch::new();
            match md.spec_replicas {
                Some(r) => p.test("/spec/replicas", json!(r)),
                None => &mut p,
            };
            p.set("/spec/replicas", json!(w2.to));
            if let Some(v) = md.annotations.get(MANAGED_REPLICAS_ANNOTATION) {
                p.test(
                    &format!(
                        "/metadata/annotations/{}",
                        super::patch::escape(MANAGED_REPLICAS_ANNOTATION)
                    ),
                    json!(v),
                );
            }
            p.set_entry(
                !md.annotations.is_empty(),
                "/metadata/annotations",
                MANAGED_REPLICAS_ANNOTATION,
                &w2.managed_to.to_string(),
            );
            let patch = p.into_patch().map_err(|source| Error::Patch {
                kind: "MachineDeployment",
                name: md.name.clone(),
                source,
            })?;
            let obj = api
                .patch(&md.name, &PatchParams::default(), &patch)
                .await
                .map_err(api_err(
                    &shared.metrics,
                    "patch",
                    "machinedeployments",
                    &md.name,
                ))?;
            MachineDeployment::from_dynamic(&obj, shared.capi_version).map_err(|source| {
                Error::Model {
                    kind: "MachineDeployment",
                    name: md.name.clone(),
                    source,
                }
            })
        };
        let md_name = self.md.clone();
        let fut = async move {
            match tokio::time::timeout(WRITE_TIMEOUT, fut).await {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout {
                    what: format!("replica write of MachineDeployment {md_name}"),
                    after: WRITE_TIMEOUT,
                }),
            }
        };
        ctx.spawn(fut.into_actor(self).map(move |result, act, ctx| {
            act.writing = false;
            let md_label = Metrics::md(&act.md);
            Metrics::observe(&act.metrics().replica_write_seconds, &act.md, started.elapsed());
            let outcome = match &result {
                Ok(_) => "ok",
                Err(e) if e.is_conflict() => "conflict",
                Err(_) => "error",
            };
            act.metrics()
                .replica_writes
                .get_or_create(&WriteLabels { machine_deployment: act.md.clone(), result: outcome.into() })
                .inc();
            match result {
                Ok(updated) => {
                    act.metrics().replica_write_batch.get_or_create(&md_label).observe(f64::from(w.delta().abs()));
                    tracing::info!(machine_deployment = %act.md, from = w.from, to = w.to, managed = w.managed_to, "replicas written");
                    act.shared.state.deployments.write().apply(updated);
                    act.decremented.extend(w.decrements.iter().cloned());
                    act.decremented.extend(delete_directly.iter().cloned());
                    for m in delete_directly {
                        act.delete_machine(m, ctx);
                    }
                    act.replan(ctx);
                }
                Err(e) if e.is_conflict() => act.refresh_deployment(ctx),
                Err(e) => {
                    tracing::warn!(machine_deployment = %act.md, error = %e, "replica write failed");
                    act.retry_later(ctx);
                }
            }
        }));
    }

    /// Below min-size a Machine cannot be removed by lowering replicas; delete it and let its
    /// MachineSet replace it as baseline capacity.
    fn delete_machine(&mut self, machine_key: String, ctx: &mut Context<Self>) {
        let Some((ns, name)) = machine_key.split_once('/') else {
            return;
        };
        let api = self.machine_api(ns);
        let name = name.to_string();
        let metrics = self.shared.metrics.clone();
        ctx.spawn(
            async move {
                api.delete(&name, &DeleteParams::default())
                    .await
                    .map_err(api_err(&metrics, "delete", "machines", &name))
            }
            .into_actor(self)
            .map(move |r, act, ctx| {
                if let Err(e) = r
                    && !e.is_not_found()
                {
                    tracing::warn!(machine = %machine_key, error = %e, "deleting machine failed");
                    act.decremented.remove(&machine_key);
                    act.retry_later(ctx);
                }
            }),
        );
    }

    fn refresh_deployment(&mut self, ctx: &mut Context<Self>) {
        let Some((ns, name)) = self.md.split_once('/') else {
            return;
        };
        let api = self.md_api(ns);
        let name = name.to_string();
        let v = self.shared.capi_version;
        let metrics = self.shared.metrics.clone();
        ctx.spawn(
            async move {
                let obj = api.get(&name).await.map_err(api_err(&metrics, "get", "machinedeployments", &name))?;
                MachineDeployment::from_dynamic(&obj, v)
                    .map_err(|source| Error::Model { kind: "MachineDeployment", name: name.clone(), source })
            }
            .into_actor(self)
            .map(|r, act, ctx| match r {
                Ok(md) => {
                    act.shared.state.deployments.write().apply(md);
                    act.replan(ctx);
                }
                Err(e) if e.is_not_found() => act.reject_all(Rejection::DeploymentGone),
                Err(e) => {
                    tracing::warn!(machine_deployment = %act.md, error = %e, "re-reading machinedeployment failed");
                    act.retry_later(ctx);
                }
            }),
        );
    }

    fn refresh_machine(&mut self, machine: Arc<Machine>, ctx: &mut Context<Self>) {
        let api = self.machine_api(&machine.namespace);
        let v = self.shared.capi_version;
        let metrics = self.shared.metrics.clone();
        let mk = key(&machine.namespace, &machine.name);
        ctx.spawn(
            async move {
                let obj = api.get(&machine.name).await.map_err(api_err(
                    &metrics,
                    "get",
                    "machines",
                    &machine.name,
                ))?;
                Machine::from_dynamic(&obj, v).map_err(|source| Error::Model {
                    kind: "Machine",
                    name: machine.name.clone(),
                    source,
                })
            }
            .into_actor(self)
            .map(move |r, act, ctx| {
                match r {
                    Ok(m) => {
                        act.shared.state.machines.write().apply(m);
                    }
                    Err(e) if e.is_not_found() => {
                        act.shared.state.machines.write().remove(&mk);
                    }
                    Err(e) => {
                        tracing::warn!(machine = %mk, error = %e, "re-reading machine failed");
                        act.retry_later(ctx);
                        return;
                    }
                }
                act.replan(ctx);
            }),
        );
    }

    fn retry_later(&mut self, ctx: &mut Context<Self>) {
        if self.retry_scheduled {
            return;
        }
        self.retry_scheduled = true;
        ctx.run_later(RETRY_AFTER, |act, ctx| {
            act.retry_scheduled = false;
            act.replan(ctx);
        });
    }
}

async fn patch_machine(
    shared: &Shared,
    api: &Api<DynamicObject>,
    name: &str,
    p: JsonPatch,
) -> Result<Machine, Error> {
    let patch = p.into_patch().map_err(|source| Error::Patch {
        kind: "Machine",
        name: name.to_string(),
        source,
    })?;
    let obj = api
        .patch(name, &PatchParams::default(), &patch)
        .await
        .map_err(api_err(&shared.metrics, "patch", "machines", name))?;
    Machine::from_dynamic(&obj, shared.capi_version).map_err(|source| Error::Model {
        kind: "Machine",
        name: name.to_string(),
        source,
    })
}

/// Stop the Scaler (controller shutdown).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

impl Handler<Stop> for Scaler {
    type Result = ();
    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
