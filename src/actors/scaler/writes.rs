//! The Scaler's requests to the API server: binds and release marks on Machines, the replica
//! write on the MachineDeployment, and the reads that confirm a write whose answer was lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kube::api::{Api, DeleteParams, DynamicObject, PatchParams};

use super::bookkeeping::{Removal, managed_replicas, marked_by_us};
use super::plan::ReplicaWrite;
use super::{Scaler, patches};
use crate::actors::messages::{MachineBound, Rejection};
use crate::actors::patch::JsonPatch;
use crate::actors::{Error, Shared, api_err};
use crate::api::wellknown::MANAGED_REPLICAS_ANNOTATION;
use crate::capi::model::{Machine, MachineDeployment, ModelError};
use crate::capi::scalable::{ScalableKind, ScalableRef};
use crate::capi::version;
use crate::capi::version::CapiVersion;
use crate::metrics::{Metrics, WriteLabels};
use crate::state::machines::{bound_claim, key};

impl Scaler {
    fn machine_api(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.shared.management.clone(),
            namespace,
            &version::machine_resource(self.shared.capi_version),
        )
    }

    /// The kind of the resource this Scaler scales, from its key.
    fn kind(&self) -> ScalableKind {
        ScalableRef::parse(&self.md)
            .map(|r| r.kind)
            .unwrap_or_default()
    }

    fn md_api(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.shared.management.clone(),
            namespace,
            &self.kind().resource(self.shared.capi_version),
        )
    }

    /// Bind: write the claim's name onto the Machine, guarded by the Machine's resourceVersion,
    /// then tell the claim. The Machine annotation is the durable truth (invariant 1).
    pub(super) fn bind(&mut self, claim: String, machine_key: String, ctx: &mut Context<Self>) {
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
            let p = patches::bind(&machine, &claim);
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
    pub(super) fn bound(&mut self, claim: &str, mk: String, asked_at: Option<Instant>) {
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
                    let d = act.backoff.next_delay_after(e.retry_after());
                    tracing::warn!(machine = %mk, error = %e, retry_in = ?d, "reading the Machine back failed");
                    ctx.run_later(d, move |act, ctx| act.confirm_bind(claim, machine, asked_at, ctx));
                }
            }
        }));
    }

    pub(super) fn deadline(&self) -> Duration {
        self.shared.settings.deadlines.scaler_write
    }

    /// GET one Machine, bounded by the write deadline.
    pub(super) fn read_machine(
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
    pub(super) fn release(&mut self, machine_key: String, drained: bool, ctx: &mut Context<Self>) {
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
            let p = patches::release(&machine, drained);
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
                    tracing::info!(machine = %machine_key, machine_deployment = %act.md, "{}", act.shared.settings.say("machine marked for deletion", "would mark the Machine for deletion"));
                    act.backoff.reset();
                    act.to_release.remove(&machine_key);
                    act.shared.state.machines.write().apply_response(updated);
                    act.replan(ctx);
                }
                // A lost race: read the Machine again; the plan after it sends the release
                // again from the new version.
                Err(e) if e.is_conflict() => act.refresh_machine(machine, ctx),
                Err(e) if e.is_not_found() => {
                    act.to_release.remove(&machine_key);
                    act.replan(ctx);
                }
                Err(e) => {
                    // The mark may have landed: read the Machine back before planning again
                    // (the mark is idempotent, and the next one is guarded anyway), and send
                    // it again once the backoff is over if it did not.
                    let d = act.backoff.next_delay_after(e.retry_after());
                    tracing::warn!(machine = %machine_key, error = %e, retry_in = ?d, "marking machine for deletion failed");
                    if let Some(wanted) = act.to_release.get_mut(&machine_key) {
                        wanted.1 = Instant::now() + d;
                        ctx.run_later(d, |act, ctx| act.replan(ctx));
                    }
                    act.refresh_machine(machine, ctx);
                }
            }
        }));
    }

    /// The one replica write in flight: compare-and-swap on `spec.replicas` and the managed
    /// count, so status updates by Cluster API never cause a conflict but another writer does.
    pub(super) fn write(
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
        let kind = self.kind();
        let fut = async move {
            let patch =
                patches::replicas(&md, &w2)
                    .into_patch()
                    .map_err(|source| Error::Patch {
                        kind: kind.as_str(),
                        name: md.name.clone(),
                        source,
                    })?;
            let obj = api
                .patch(&md.name, &PatchParams::default(), &patch)
                .await
                .map_err(api_err(&shared.metrics, "patch", kind.plural(), &md.name))?;
            kind.parser()(&obj, shared.capi_version).map_err(|source| Error::Model {
                kind: kind.as_str(),
                name: md.name.clone(),
                source,
            })
        };
        let what = format!("replica write of {kind} {}", self.md);
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
    pub(super) fn written(
        &mut self,
        updated: MachineDeployment,
        w: &ReplicaWrite,
        delete_directly: Vec<String>,
        ctx: &mut Context<Self>,
    ) {
        self.writing = false;
        self.backoff.reset();
        tracing::info!(machine_deployment = %self.md, from = w.from, to = w.to, managed = w.managed_to, "{}", self.shared.settings.say("replicas written", "would write replicas"));
        let generation = updated.generation;
        if w.delta() != 0 {
            self.last_write = Some(super::effect::LastWrite {
                raised: w.delta() > 0,
                to: w.to,
                generation,
                decrements: w.decrements.clone(),
                at: Instant::now(),
            });
        }
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
        self.handed_back_written(&w.handed_back);
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
        let Some(target) = ScalableRef::parse(&self.md) else {
            self.writing = false;
            return;
        };
        let read = self.read_deployment(&target.namespace, &target.name);
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
                let d = act.backoff.next_delay_after(e.retry_after());
                tracing::warn!(machine_deployment = %act.md, error = %e, retry_in = ?d, "reading the MachineDeployment back failed");
                ctx.run_later(d, move |act, ctx| act.confirm_write(w, delete_directly, ctx));
            }
        }));
    }

    /// GET the MachineDeployment, bounded by the write deadline.
    pub(super) fn read_deployment(
        &self,
        ns: &str,
        name: &str,
    ) -> impl std::future::Future<Output = Result<MachineDeployment, Error>> + 'static {
        let kind = self.kind();
        read_model(
            self.shared.clone(),
            self.md_api(ns),
            name.to_string(),
            self.deadline(),
            (kind.as_str(), kind.plural()),
            kind.parser(),
        )
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
}

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

/// Run `fut` with a deadline; a timeout is counted and becomes `Error::Timeout`.
pub(super) async fn bounded<T>(
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
