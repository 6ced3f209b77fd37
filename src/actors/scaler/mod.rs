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

mod coalesce;
pub mod plan;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, PatchParams};
use serde_json::{Value, json};

use self::plan::{MachineView, ReplicaWrite, Snapshot};
use super::backoff::Backoff;
use super::messages::{
    CancelRequest, MachineBound, Poke, Rejection, ReleaseMachine, RequestMachine, RequestRejected,
    Stop,
};
use super::patch::JsonPatch;
use super::{Error, Shared, api_err};
use crate::api::wellknown::{
    DELETE_MACHINE_ANNOTATION, EXCLUDE_NODE_DRAINING_ANNOTATION, MANAGED_REPLICAS_ANNOTATION,
    MEMBER_LABEL, NODECLAIM_ANNOTATION,
};
use crate::api::wellknown::{MAX_SIZE_ANNOTATION, MIN_SIZE_ANNOTATION, REPLACES_ANNOTATION};
use crate::capi::model::{Machine, MachineDeployment, ModelError};
use crate::capi::version::CapiVersion;
use crate::capi::{annotations, version};
use crate::metrics::{Metrics, WriteLabels};
use crate::state::claims::recorded_deployment;
use crate::state::machines::{Machines, bound_claim, key};

/// The value we put in `cluster.x-k8s.io/delete-machine`, so that a mark set by somebody else on a
/// baseline Machine is never mistaken for one of ours.
pub const DELETE_MACHINE_VALUE: &str = "karpenter-capi";

/// How often a Scaler re-plans from the indexes even when nothing told it to.
const RESYNC: Duration = Duration::from_secs(10);

/// A Scaler whose MachineDeployment is gone stops once nothing of it is in flight.
const IDLE_STOP: Duration = Duration::from_secs(5);

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

/// How a Machine left the planner's count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Removal {
    /// Its replica was removed by the write that produced this MachineDeployment generation.
    Decremented { generation: Option<i64> },
    /// Deleted directly (below min-size): the API server, not a MachineSet, removes it.
    Deleted,
}

pub struct Scaler {
    md: String,
    shared: Arc<Shared>,
    /// Claims that asked, with when they asked (for the binding latency metric).
    asked: VecDeque<(String, Instant)>,
    /// Machine key -> claim, for binds in flight or written but not yet seen in the index.
    binding: HashMap<String, String>,
    /// Machines whose replica we removed (or deleted directly); they are on their way out.
    decremented: HashMap<String, Removal>,
    /// Decremented Machines being read back because Cluster API settled without removing them.
    verifying: HashSet<String>,
    /// Machines with a release annotation in flight.
    releasing: HashSet<String>,
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
}

/// min-size and max-size from their own annotations only (a malformed capacity annotation must
/// not switch the bounds off); a malformed size annotation keeps `last` (the last good bounds).
pub fn size_bounds(
    annotations: &std::collections::BTreeMap<String, String>,
    last: Option<(i32, Option<i32>)>,
) -> (i32, Option<i32>) {
    let sizes: std::collections::BTreeMap<String, String> = annotations
        .iter()
        .filter(|(k, _)| *k == MIN_SIZE_ANNOTATION || *k == MAX_SIZE_ANNOTATION)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    match annotations::parse(&sizes) {
        Ok(s) => (s.min_size.unwrap_or(0), s.max_size),
        // Never seen good bounds: refuse to grow beyond what exists rather than run unbounded.
        Err(_) => last.unwrap_or((0, Some(0))),
    }
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

    fn stopped(&mut self, ctx: &mut Self::Context) {
        self.shared.router.remove_scaler(&self.md, &ctx.address());
        // A gauge of a MachineDeployment nobody scales any more would be exported for ever.
        self.shared
            .metrics
            .scaler_queue_depth
            .remove(&Metrics::md(&self.md));
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
        self.release(msg.machine, msg.drained, ctx);
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
    /// Decremented Machines Cluster API will not remove (see `spent_decrements`).
    spent: Vec<Arc<Machine>>,
    machines: Vec<MachineView>,
    waiting: Vec<String>,
    min_size: i32,
    max_size: Option<i32>,
    rolling_out: bool,
}

impl Scaler {
    pub fn new(md: String, shared: Arc<Shared>) -> Self {
        Self {
            md,
            shared,
            asked: VecDeque::new(),
            binding: HashMap::new(),
            decremented: HashMap::new(),
            verifying: HashSet::new(),
            releasing: HashSet::new(),
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
        }
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
        let Some(inputs) = self.inputs() else {
            self.reject_all(Rejection::DeploymentGone);
            self.stop_if_abandoned(ctx);
            return;
        };
        self.gone_since = None;
        let snapshot = Snapshot {
            spec_replicas: inputs.md.spec_replicas.unwrap_or(0),
            managed: managed_replicas(&inputs.md),
            min_size: inputs.min_size,
            max_size: inputs.max_size,
            machines: &inputs.machines,
            waiting: &inputs.waiting,
            rolling_out: inputs.rolling_out,
        };
        let plan = plan::plan(&snapshot);
        for machine in &inputs.spent {
            self.verify_spent(machine.clone(), ctx);
        }
        for machine in self.orphans(&inputs.machines) {
            tracing::warn!(machine = %machine, machine_deployment = %self.md, "machine bound to a NodeClaim that no longer exists; releasing it");
            self.release(machine, false, ctx);
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
            self.release(machine, false, ctx);
        }
        if let Some(write) = plan.write
            && !self.writing
        {
            if write.delta() > 0
                && let Some(wait) = self.coalesce.hold(Instant::now())
            {
                self.hold_for(wait, ctx);
            } else {
                self.write(inputs.md, write, plan.delete_directly, ctx);
            }
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

    /// Machines bound to a claim that is gone (deleted while a bind was landing, or removed by
    /// someone else): garbage to release, once the claim index had time to see the claim.
    fn orphans(&mut self, machines: &[MachineView]) -> Vec<String> {
        const GRACE: Duration = Duration::from_secs(30);
        let claims = self.shared.state.claims.read();
        // Only claims whose Machine is still here can need the grace period.
        self.bound_at.retain(|c, t| {
            t.elapsed() < GRACE * 2
                && machines
                    .iter()
                    .any(|m| m.bound_to.as_deref() == Some(c.as_str()))
        });
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
        let (min_size, max_size) = size_bounds(&md.annotations, self.bounds);
        self.bounds = Some((min_size, max_size));

        let machines = self.shared.state.machines.read();
        let all = machines.of_deployment(&self.md);
        let live_keys: HashSet<String> = all
            .iter()
            .filter(|m| m.deletion_timestamp.is_none())
            .map(|m| key(&m.namespace, &m.name))
            .collect();
        self.decremented.retain(|k, _| live_keys.contains(k));
        let spent = self.spent_decrements(&md, &machines);
        self.binding.retain(|mk, _| {
            machines
                .get(mk)
                .map(|m| bound_claim(&m).is_none())
                .unwrap_or(false)
        });

        // Cluster API replaces outdated Machines itself under RollingUpdate (not OnDelete, where
        // disruption replaces them as drift).
        let rolling_out = !md.on_delete && all.iter().any(|m| m.up_to_date == Some(false));
        let replaced = if rolling_out {
            replaced_claims(&self.shared.state.claims.read(), &self.md)
        } else {
            HashSet::new()
        };
        let views: Vec<MachineView> = all
            .iter()
            .filter(|m| m.deletion_timestamp.is_none())
            .map(|m| (key(&m.namespace, &m.name), m))
            .filter(|(k, _)| !self.decremented.contains_key(k))
            .map(|(k, m)| MachineView {
                bound_to: bound_claim(m)
                    .map(str::to_string)
                    .or_else(|| self.binding.get(&k).cloned()),
                marked: marked_by_us(m),
                replaced: m.up_to_date == Some(false)
                    && bound_claim(m).is_some_and(|c| replaced.contains(c)),
                key: k,
            })
            .collect();

        let claims = self.shared.state.claims.read();
        if claims.synced() {
            // A turned-down claim that is gone will never ask again.
            self.rejected.retain(|c| claims.contains(c));
        }
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
            spent,
            machines: views,
            waiting,
            min_size,
            max_size,
            rolling_out,
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
        let deadline = self.deadline();
        let fut = async move {
            // Guard on the maps we read and write (the binding lives in the annotations), not
            // the whole resourceVersion: Cluster API writes Machine status all the time, and
            // those writes must not make a bind conflict. A map the Machine does not have yet
            // is tested for null: the API server's json-patch passes that only while the member
            // is absent (and never serves an empty map), so a concurrent bind still conflicts.
            let mut p = JsonPatch::new();
            p.test("/metadata/annotations", json_map(&machine.annotations));
            if machine.labels.is_empty() {
                p.test("/metadata/labels", Value::Null);
            }
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
            let what = format!("binding Machine {} to NodeClaim {claim}", machine.name);
            let result = bounded(
                &shared,
                deadline,
                what,
                patch_machine(&shared, &api, &machine.name, p),
            )
            .await;
            (claim, machine, result)
        };
        ctx.spawn(fut.into_actor(self).map(move |(claim, machine, result), act, ctx| {
            let mk = key(&machine.namespace, &machine.name);
            match result {
                Ok(updated) => {
                    act.backoff.reset();
                    act.shared.state.machines.write().apply_response(updated);
                    act.bound(&claim, mk, asked_at);
                }
                Err(e) if e.is_conflict() => {
                    act.binding.remove(&mk);
                    act.asked.push_front((claim.clone(), asked_at.unwrap_or_else(Instant::now)));
                    act.refresh_machine(machine, ctx);
                    return;
                }
                Err(e) => {
                    // The patch may have landed (a timeout, a lost answer): keep the Machine
                    // reserved for this claim and read it back before the claim may get
                    // another one, so it is never bound twice.
                    tracing::warn!(nodeclaim = %claim, machine = %mk, error = %e, "binding failed or unknown; reading the Machine back");
                    act.confirm_bind(claim, machine, asked_at, ctx);
                    return;
                }
            }
            act.replan(ctx);
        }));
    }

    /// A bind landed: remember when, and tell the claim.
    fn bound(&mut self, claim: &str, mk: String, asked_at: Option<Instant>) {
        self.bound_at.insert(claim.to_string(), Instant::now());
        if let Some(t) = asked_at {
            Metrics::observe(&self.metrics().binding_seconds, &self.md, t.elapsed());
        }
        tracing::debug!(nodeclaim = %claim, machine = %mk, machine_deployment = %self.md, "machine bound");
        if let Some(addr) = self.shared.router.claim(claim) {
            addr.do_send(MachineBound { machine: mk });
        }
    }

    /// After a bind whose result is unknown: read the Machine back (retrying with backoff while
    /// the read fails). Until then the Machine stays in `binding`, so the plan neither offers
    /// it to another claim nor gives this claim a second Machine.
    fn confirm_bind(
        &mut self,
        claim: String,
        machine: Arc<Machine>,
        asked_at: Option<Instant>,
        ctx: &mut Context<Self>,
    ) {
        let mk = key(&machine.namespace, &machine.name);
        let read = self.read_machine(&machine);
        ctx.spawn(read.into_actor(self).map(move |r, act, ctx| {
            match r {
                Ok(m) => {
                    let landed = bound_claim(&m) == Some(claim.as_str());
                    act.shared.state.machines.write().apply_response(m);
                    if landed {
                        // The `binding` entry stays until the index shows the bind.
                        act.backoff.reset();
                        act.bound(&claim, mk, asked_at);
                    } else {
                        act.binding.remove(&mk);
                        act.asked.push_front((claim, asked_at.unwrap_or_else(Instant::now)));
                    }
                    act.replan(ctx);
                }
                Err(e) if e.is_not_found() => {
                    act.shared.state.machines.write().remove(&mk);
                    act.binding.remove(&mk);
                    act.asked.push_front((claim, asked_at.unwrap_or_else(Instant::now)));
                    act.replan(ctx);
                }
                Err(e) => {
                    let d = act.backoff.next_delay();
                    tracing::warn!(machine = %mk, error = %e, retry_in = ?d, "reading the Machine back failed");
                    ctx.run_later(d, move |act, ctx| act.confirm_bind(claim, machine, asked_at, ctx));
                }
            }
        }));
    }

    fn deadline(&self) -> Duration {
        self.shared.settings.deadlines.scaler_write
    }

    /// GET one Machine, bounded by the write deadline.
    fn read_machine(
        &self,
        machine: &Machine,
    ) -> impl std::future::Future<Output = Result<Machine, Error>> + 'static {
        read_model(
            self.shared.clone(),
            self.machine_api(&machine.namespace),
            machine.name.clone(),
            self.deadline(),
            ("Machine", "machines"),
            Machine::from_dynamic,
        )
    }

    /// Mark a Machine for deletion (the decrement follows in the next replica write). A Machine
    /// whose Node the Terminator drained also gets Cluster API's exclude-node-draining
    /// annotation in the same write, so Cluster API does not drain it a second time.
    fn release(&mut self, machine_key: String, drained: bool, ctx: &mut Context<Self>) {
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
        let deadline = self.deadline();
        let fut = async move {
            let mut p = JsonPatch::guarded(Some(machine.resource_version.as_str()));
            p.set_entry(
                !machine.annotations.is_empty(),
                "/metadata/annotations",
                DELETE_MACHINE_ANNOTATION,
                DELETE_MACHINE_VALUE,
            );
            if drained {
                p.set_entry(
                    true,
                    "/metadata/annotations",
                    EXCLUDE_NODE_DRAINING_ANNOTATION,
                    DELETE_MACHINE_VALUE,
                );
            }
            let what = format!("marking Machine {} for deletion", machine.name);
            let result = bounded(
                &shared,
                deadline,
                what,
                patch_machine(&shared, &api, &machine.name, p),
            )
            .await;
            (machine, result)
        };
        ctx.spawn(fut.into_actor(self).map(move |(machine, result), act, ctx| {
            act.releasing.remove(&machine_key);
            match result {
                Ok(updated) => {
                    tracing::info!(machine = %machine_key, machine_deployment = %act.md, "machine marked for deletion");
                    act.backoff.reset();
                    act.shared.state.machines.write().apply_response(updated);
                    act.replan(ctx);
                }
                Err(e) if e.is_conflict() => act.refresh_machine(machine, ctx),
                Err(e) if e.is_not_found() => act.replan(ctx),
                Err(e) => {
                    // The mark may have landed: read the Machine back before planning again
                    // (the mark is idempotent, and the next one is guarded anyway).
                    tracing::warn!(machine = %machine_key, error = %e, "marking machine for deletion failed");
                    act.refresh_machine(machine, ctx);
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
        let what = format!("replica write of MachineDeployment {}", self.md);
        let shared = self.shared.clone();
        let deadline = self.deadline();
        let fut = async move { bounded(&shared, deadline, what, fut).await };
        ctx.spawn(fut.into_actor(self).map(move |result, act, ctx| {
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
                    act.written(updated, &w, delete_directly, ctx);
                }
                // Still "writing" until the read answers: one request on the MachineDeployment
                // at a time.
                Err(e) if e.is_conflict() => act.refresh_deployment(ctx),
                Err(e) => {
                    // Ambiguous: the write may have landed. Stay "writing" and read the
                    // MachineDeployment back; only what it shows decides whether the decrement
                    // happened, so a retry can never remove a second replica.
                    tracing::warn!(machine_deployment = %act.md, error = %e, "replica write failed or unknown; reading the MachineDeployment back");
                    act.confirm_write(w, delete_directly, ctx);
                }
            }
        }));
    }

    /// The replica write landed (answered, or confirmed by a read).
    fn written(
        &mut self,
        updated: MachineDeployment,
        w: &ReplicaWrite,
        delete_directly: Vec<String>,
        ctx: &mut Context<Self>,
    ) {
        self.writing = false;
        self.backoff.reset();
        tracing::info!(machine_deployment = %self.md, from = w.from, to = w.to, managed = w.managed_to, "replicas written");
        let generation = updated.generation;
        self.shared
            .state
            .deployments
            .write()
            .apply_own_response(updated);
        for m in &w.decrements {
            self.decremented
                .insert(m.clone(), Removal::Decremented { generation });
        }
        for m in &delete_directly {
            self.decremented.insert(m.clone(), Removal::Deleted);
        }
        for m in delete_directly {
            self.delete_machine(m, ctx);
        }
        self.replan(ctx);
    }

    /// Read the MachineDeployment back after a replica write with no answer: if it carries
    /// exactly what we wrote, the write landed; otherwise it did not (the compare-and-swap
    /// guarantees nobody else wrote our values on top of the old ones). A failing read is
    /// retried with backoff while no other write may start.
    fn confirm_write(
        &mut self,
        w: ReplicaWrite,
        delete_directly: Vec<String>,
        ctx: &mut Context<Self>,
    ) {
        let Some((ns, name)) = self.md.split_once('/') else {
            self.writing = false;
            return;
        };
        let read = self.read_deployment(ns, name);
        ctx.spawn(read.into_actor(self).map(move |r, act, ctx| match r {
            Ok(md) => {
                let landed = md.spec_replicas == Some(w.to) && managed_replicas(&md) == w.managed_to
                    && md.annotations.contains_key(MANAGED_REPLICAS_ANNOTATION);
                if landed {
                    act.written(md, &w, delete_directly, ctx);
                } else {
                    act.writing = false;
                    act.shared.state.deployments.write().apply_own_response(md);
                    act.retry_later(ctx);
                }
            }
            Err(e) if e.is_not_found() => {
                act.writing = false;
                act.reject_all(Rejection::DeploymentGone);
            }
            Err(e) => {
                let d = act.backoff.next_delay();
                tracing::warn!(machine_deployment = %act.md, error = %e, retry_in = ?d, "reading the MachineDeployment back failed");
                ctx.run_later(d, move |act, ctx| act.confirm_write(w, delete_directly, ctx));
            }
        }));
    }

    /// GET the MachineDeployment, bounded by the write deadline.
    fn read_deployment(
        &self,
        ns: &str,
        name: &str,
    ) -> impl std::future::Future<Output = Result<MachineDeployment, Error>> + 'static {
        read_model(
            self.shared.clone(),
            self.md_api(ns),
            name.to_string(),
            self.deadline(),
            ("MachineDeployment", "machinedeployments"),
            MachineDeployment::from_dynamic,
        )
    }

    /// The MachineDeployment is gone: once nothing of ours is in flight for a while, stop and
    /// leave the router, so a deleted MachineDeployment does not keep a Scaler for ever.
    fn stop_if_abandoned(&mut self, ctx: &mut Context<Self>) {
        if !self.shared.state.deployments.read().synced()
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
            self.writing = false;
            return;
        };
        let read = self.read_deployment(ns, name);
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

    /// Decremented Machines that Cluster API will not remove: the MachineDeployment's status
    /// is at its current generation (no older than our write) and counts as many Machines as
    /// replicas, yet they are still here and not deleting. Their MachineSet spent the decrement
    /// on another Machine: its cache had not seen our mark yet, or another Machine was being
    /// deleted at that moment (a MachineHealthCheck, a user), or a rollout chose elsewhere.
    fn spent_decrements(&self, md: &MachineDeployment, machines: &Machines) -> Vec<Arc<Machine>> {
        let Some(observed) = md.observed_generation else {
            return Vec::new();
        };
        let settled = !self.writing
            && md.status_replicas.is_some()
            && md.status_replicas == md.spec_replicas
            && md.generation.is_none_or(|g| observed >= g);
        if !settled {
            return Vec::new();
        }
        self.decremented
            .iter()
            .filter(|(k, r)| {
                !self.verifying.contains(*k)
                    && matches!(r, Removal::Decremented { generation: Some(g) } if observed >= *g)
            })
            .filter_map(|(k, _)| machines.get(k))
            .filter(|m| m.deletion_timestamp.is_none())
            .collect()
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
                tracing::warn!(machine = %mk, machine_deployment = %act.md, "Cluster API settled without removing a Machine whose replica we removed (its MachineSet removed another); lowering replicas for it again");
                act.metrics()
                    .scaler_spent_decrements
                    .get_or_create(&Metrics::md(&act.md))
                    .inc();
            }
            act.machine_read(&mk, r, ctx);
        }));
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

/// Run `fut` with a deadline; a timeout is counted and becomes `Error::Timeout`.
/// GET one Cluster API object and read it into the model, bounded by `deadline`.
async fn read_model<T>(
    shared: Arc<Shared>,
    api: Api<DynamicObject>,
    name: String,
    deadline: Duration,
    (kind, plural): (&'static str, &'static str),
    parse: fn(&DynamicObject, CapiVersion) -> Result<T, ModelError>,
) -> Result<T, Error> {
    let what = format!("reading {kind} {name}");
    let get = async {
        let obj = api
            .get(&name)
            .await
            .map_err(api_err(&shared.metrics, "get", plural, &name))?;
        parse(&obj, shared.capi_version).map_err(|source| Error::Model {
            kind,
            name: name.clone(),
            source,
        })
    };
    bounded(&shared, deadline, what, get).await
}

async fn bounded<T>(
    shared: &Shared,
    deadline: Duration,
    what: String,
    fut: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(deadline, fut).await {
        Ok(r) => r,
        Err(_) => {
            shared.metrics.reconcile_timeout("scaler");
            Err(Error::Timeout {
                what,
                after: deadline,
            })
        }
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

impl Handler<super::tracked::Tracked> for Scaler {
    type Result = MessageResult<super::tracked::Tracked>;
    fn handle(&mut self, _: super::tracked::Tracked, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            [
                ("asked", self.asked.len()),
                ("binding", self.binding.len()),
                ("decremented", self.decremented.len()),
                ("verifying", self.verifying.len()),
                ("releasing", self.releasing.len()),
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

/// Claims of `md` that a rollout replacement (a claim created for a fresh Machine, naming them)
/// stands in for: their outdated Machines no longer count as replicas we need.
fn replaced_claims(claims: &crate::state::claims::Claims, md: &str) -> HashSet<String> {
    claims
        .all()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| recorded_deployment(c) == Some(md))
        .filter_map(|c| c.annotations().get(REPLACES_ANNOTATION).cloned())
        .collect()
}

/// A string map as a JSON patch `test` value: an empty one is an absent member (null).
fn json_map(m: &std::collections::BTreeMap<String, String>) -> Value {
    if m.is_empty() { Value::Null } else { json!(m) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::wellknown::CPU_ANNOTATION;
    use std::collections::BTreeMap;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_malformed_capacity_annotation_keeps_the_size_bounds() {
        let a = annotations(&[
            (MIN_SIZE_ANNOTATION, "1"),
            (MAX_SIZE_ANNOTATION, "3"),
            (CPU_ANNOTATION, "four"),
        ]);
        assert_eq!(size_bounds(&a, None), (1, Some(3)));
    }

    #[test]
    fn a_malformed_size_annotation_keeps_the_last_good_bounds() {
        let a = annotations(&[(MIN_SIZE_ANNOTATION, "1"), (MAX_SIZE_ANNOTATION, "lots")]);
        assert_eq!(size_bounds(&a, Some((1, Some(3)))), (1, Some(3)));
        // Never parsed: do not grow at all rather than without bound.
        assert_eq!(size_bounds(&a, None), (0, Some(0)));
        assert_eq!(size_bounds(&BTreeMap::new(), Some((1, Some(3)))), (0, None));
    }
}
