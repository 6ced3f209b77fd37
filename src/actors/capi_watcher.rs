//! One watch on Machines, one on MachineDeployments and, where the management cluster serves
//! them, one on MachinePools (the second scalable kind, indexed with the MachineDeployments).
//! Each change updates the indexes and is routed to the actor that waits: the Scaler, the claim
//! bound to the Machine, the Catalog. A dropped watch re-lists; after a re-list every Scaler and
//! claim actor reconciles from the fresh state.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};

use super::Shared;
use super::messages::{Kick, Poke};
use crate::capi::model::{Machine, MachineDeployment};
use crate::capi::scalable::{ScalableKind, ScalableRef};
use crate::capi::{autoscaler, version};
use crate::state::feed::Staleness;
use crate::state::machines::{Unreadable, bound_claim, deployment_key};

pub enum CapiEvent {
    Machine(Result<watcher::Event<DynamicObject>, watcher::Error>),
    Deployment(Result<watcher::Event<DynamicObject>, watcher::Error>),
    Pool(Result<watcher::Event<DynamicObject>, watcher::Error>),
    Cluster(Result<watcher::Event<DynamicObject>, watcher::Error>),
}

impl Message for CapiEvent {
    type Result = ();
}

pub struct CapiWatcher {
    shared: Arc<Shared>,
    machine_buffer: Vec<Machine>,
    md_buffer: Vec<MachineDeployment>,
    pool_buffer: Vec<MachineDeployment>,
    unreadable_buffer: BTreeMap<String, Unreadable>,
    pool_unreadable_buffer: BTreeMap<String, Unreadable>,
    machines_stale: Staleness,
    mds_stale: Staleness,
    pools_stale: Staleness,
    /// Clusters by `namespace/name`: whether Cluster API's pause holds each (see
    /// `on_cluster`), and a re-list in progress.
    clusters: BTreeMap<String, bool>,
    cluster_buffer: BTreeMap<String, bool>,
    clusters_stale: Staleness,
}

impl CapiWatcher {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            machine_buffer: Vec::new(),
            md_buffer: Vec::new(),
            pool_buffer: Vec::new(),
            unreadable_buffer: BTreeMap::new(),
            pool_unreadable_buffer: BTreeMap::new(),
            machines_stale: Staleness::new("Machines"),
            mds_stale: Staleness::new("MachineDeployments"),
            pools_stale: Staleness::new("MachinePools"),
            clusters: BTreeMap::new(),
            cluster_buffer: BTreeMap::new(),
            clusters_stale: Staleness::new("Clusters"),
        }
    }

    fn api(&self, ar: &kube::discovery::ApiResource) -> Api<DynamicObject> {
        let client = self.shared.management.clone();
        match &self.shared.settings.capi_namespace {
            Some(ns) => Api::namespaced_with(client, ns, ar),
            None => Api::all_with(client, ar),
        }
    }

    fn config(&self) -> watcher::Config {
        let cfg = watcher::Config::default();
        match &self.shared.settings.cluster_name {
            Some(c) => cfg.labels(&format!(
                "{}={c}",
                crate::api::wellknown::CLUSTER_NAME_LABEL
            )),
            None => cfg,
        }
    }

    fn route_machine(&self, m: &Machine) {
        if let Some(md) = deployment_key(m)
            && let Some(s) = self.shared.router.scaler(&md)
        {
            s.do_send(Poke);
        }
        if let Some(claim) = bound_claim(m)
            && let Some(a) = self.shared.router.claim(claim)
        {
            a.do_send(Kick);
        }
    }

    fn everyone_reconciles(&self) {
        for (_, s) in self.shared.router.scalers() {
            s.do_send(Poke);
        }
        for name in self.shared.router.claim_names() {
            if let Some(a) = self.shared.router.claim(&name) {
                a.do_send(Kick);
            }
        }
        self.shared.router.catalog_changed();
        self.shared.synced.notify_waiters();
    }

    fn on_machine(&mut self, ev: watcher::Event<DynamicObject>) {
        let v = self.shared.capi_version;
        match ev {
            watcher::Event::Init => self.machine_buffer.clear(),
            watcher::Event::InitApply(o) => match Machine::from_dynamic(&o, v) {
                // Shared as they arrive, so the list's buffer holds one copy of each label set.
                Ok(mut m) => {
                    m.labels = self.shared.state.machines.write().share_labels(m.labels);
                    self.machine_buffer.push(m);
                }
                Err(e) => tracing::warn!(error = %e, "ignoring malformed Machine"),
            },
            watcher::Event::InitDone => {
                let fresh = std::mem::take(&mut self.machine_buffer);
                self.shared.state.machines.write().replace_all(fresh);
                self.everyone_reconciles();
            }
            watcher::Event::Apply(o) => match Machine::from_dynamic(&o, v) {
                Ok(m) => {
                    let old = self.shared.state.machines.write().apply(m.clone());
                    // A Machine appearing, going, or changing rollout state is what the
                    // Disruption actor's rollout replacements wait for.
                    let rollout_changed = old.as_ref().is_none_or(|o| {
                        o.up_to_date != m.up_to_date || o.is_deleting() != m.is_deleting()
                    });
                    if let Some(old) = old.filter(|o| bound_claim(o) != bound_claim(&m)) {
                        self.route_machine(&old);
                    }
                    self.route_machine(&m);
                    if rollout_changed {
                        self.shared.router.disruption_changed();
                    }
                }
                Err(e) => tracing::warn!(error = %e, "ignoring malformed Machine"),
            },
            watcher::Event::Delete(o) => {
                let key = format!(
                    "{}/{}",
                    o.metadata.namespace.clone().unwrap_or_default(),
                    o.metadata.name.clone().unwrap_or_default()
                );
                if let Some(old) = self.shared.state.machines.write().remove(&key) {
                    self.route_machine(&old);
                }
            }
        }
    }

    /// A MachineDeployment or MachinePool event (`kind`): both live in one index.
    fn on_scalable(&mut self, kind: ScalableKind, ev: watcher::Event<DynamicObject>) {
        let v = self.shared.capi_version;
        let parse = kind.parser();
        let (buffer, unreadable_buffer) = match kind {
            ScalableKind::MachineDeployment => (&mut self.md_buffer, &mut self.unreadable_buffer),
            ScalableKind::MachinePool => (&mut self.pool_buffer, &mut self.pool_unreadable_buffer),
        };
        match ev {
            watcher::Event::Init => {
                buffer.clear();
                unreadable_buffer.clear();
            }
            watcher::Event::InitApply(o) => match parse(&o, v) {
                Ok(md) => buffer.push(md),
                Err(e) => {
                    tracing::warn!(error = %e, "{kind} cannot be read");
                    let (k, u) = unreadable(kind, &o, e.to_string());
                    unreadable_buffer.insert(k, u);
                }
            },
            watcher::Event::InitDone => {
                let fresh = std::mem::take(buffer);
                let unreadable = std::mem::take(unreadable_buffer);
                let mut deployments = self.shared.state.deployments.write();
                deployments.replace_all(kind, fresh);
                deployments.replace_unreadable(kind, unreadable);
                drop(deployments);
                self.everyone_reconciles();
            }
            watcher::Event::Apply(o) => match parse(&o, v) {
                Ok(md) => {
                    let key = md.key();
                    self.shared.state.deployments.write().apply(md);
                    if let Some(s) = self.shared.router.scaler(&key) {
                        s.do_send(Poke);
                    }
                    self.shared.router.catalog_changed();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "{kind} cannot be read");
                    let (key, u) = unreadable(kind, &o, e.to_string());
                    self.shared
                        .state
                        .deployments
                        .write()
                        .mark_unreadable(key.clone(), u);
                    if let Some(s) = self.shared.router.scaler(&key) {
                        s.do_send(Poke);
                    }
                    self.shared.router.catalog_changed();
                }
            },
            watcher::Event::Delete(o) => {
                let key = scalable_key(kind, &o);
                self.shared.state.deployments.write().remove(&key);
                if let Some(s) = self.shared.router.scaler(&key) {
                    s.do_send(Poke);
                }
                self.shared.router.catalog_changed();
            }
        }
    }

    /// A Cluster changed: a paused Cluster pauses its MachineDeployments for every Cluster API
    /// controller, so it does here too (no replica write, no offering, no disruption of its
    /// nodes). Only a change of which Clusters are paused reaches the actors.
    fn on_cluster(&mut self, ev: watcher::Event<DynamicObject>) {
        let key = |o: &DynamicObject| {
            format!(
                "{}/{}",
                o.metadata.namespace.as_deref().unwrap_or_default(),
                o.metadata.name.as_deref().unwrap_or_default()
            )
        };
        match ev {
            watcher::Event::Init => self.cluster_buffer.clear(),
            watcher::Event::InitApply(o) => {
                self.cluster_buffer
                    .insert(key(&o), autoscaler::cluster_paused(&o));
            }
            watcher::Event::InitDone => self.clusters = std::mem::take(&mut self.cluster_buffer),
            watcher::Event::Apply(o) => {
                self.clusters
                    .insert(key(&o), autoscaler::cluster_paused(&o));
            }
            watcher::Event::Delete(o) => {
                self.clusters.remove(&key(&o));
            }
        }
        let paused = self
            .clusters
            .iter()
            .filter(|(_, p)| **p)
            .map(|(k, _)| k.clone())
            .collect();
        if self
            .shared
            .state
            .deployments
            .write()
            .set_paused_clusters(paused)
        {
            tracing::info!(paused = ?self.clusters.iter().filter(|(_, p)| **p).map(|(k, _)| k.as_str()).collect::<Vec<_>>(), "Cluster API pause changed");
            for (_, s) in self.shared.router.scalers() {
                s.do_send(Poke);
            }
            self.shared.router.catalog_changed();
            self.shared.router.disruption_changed();
        }
    }

    /// Clusters, to follow their pause (only the one named by `--cluster-name` when set), once
    /// discovery says they are served: without them no Cluster can be paused.
    fn watch_clusters(&self, ctx: &mut Context<Self>) {
        let (client, v) = (self.shared.management.clone(), self.shared.capi_version);
        let served = async move { version::serves_clusters(&client, v).await };
        ctx.spawn(served.into_actor(self).map(|served, act, ctx| match served {
            Ok(true) => {
                let cfg = watcher::Config::default();
                let cfg = match &act.shared.settings.cluster_name {
                    Some(c) => cfg.fields(&format!("metadata.name={c}")),
                    None => cfg,
                };
                let clusters = watcher(act.api(&act.shared.capi_version.cluster()), cfg)
                    .default_backoff()
                    .map(CapiEvent::Cluster);
                ctx.add_stream(clusters);
            }
            Ok(false) => tracing::info!("Clusters are not served; following MachineDeployments' own pause only"),
            Err(e) => tracing::warn!(error = %e, "Cluster discovery failed; following MachineDeployments' own pause only"),
        }));
    }

    /// Watches MachinePools once discovery says they are served; without them (or when
    /// discovery fails) only MachineDeployments are scaled.
    fn watch_pools(&self, ctx: &mut Context<Self>) {
        let (client, v) = (self.shared.management.clone(), self.shared.capi_version);
        let served = async move { version::serves_machine_pools(&client, v).await };
        ctx.spawn(served.into_actor(self).map(|served, act, ctx| match served {
            Ok(true) => {
                let pools = watcher(
                    act.api(&version::machine_pool_resource(act.shared.capi_version)),
                    act.config(),
                )
                .default_backoff()
                .map(CapiEvent::Pool);
                ctx.add_stream(pools);
            }
            Ok(false) => tracing::info!("MachinePools are not served; scaling MachineDeployments only"),
            Err(e) => tracing::warn!(error = %e, "MachinePool discovery failed; scaling MachineDeployments only"),
        }));
    }
}

impl Actor for CapiWatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let v = self.shared.capi_version;
        let machines = watcher(self.api(&version::machine_resource(v)), self.config())
            .default_backoff()
            .map(CapiEvent::Machine);
        let mds = watcher(
            self.api(&version::machine_deployment_resource(v)),
            self.config(),
        )
        .default_backoff()
        .map(CapiEvent::Deployment);
        ctx.add_stream(futures::stream::select(machines, mds));
        self.watch_pools(ctx);
        self.watch_clusters(ctx);
    }
}

impl StreamHandler<CapiEvent> for CapiWatcher {
    fn handle(&mut self, ev: CapiEvent, _: &mut Self::Context) {
        let m = &self.shared.metrics;
        match &ev {
            CapiEvent::Machine(ev) => self.machines_stale.saw(ev, m),
            CapiEvent::Deployment(ev) => self.mds_stale.saw(ev, m),
            CapiEvent::Pool(ev) => self.pools_stale.saw(ev, m),
            CapiEvent::Cluster(ev) => self.clusters_stale.saw(ev, m),
        }
        match ev {
            CapiEvent::Machine(Ok(ev)) => self.on_machine(ev),
            CapiEvent::Deployment(Ok(ev)) => self.on_scalable(ScalableKind::MachineDeployment, ev),
            CapiEvent::Pool(Ok(ev)) => self.on_scalable(ScalableKind::MachinePool, ev),
            CapiEvent::Cluster(Ok(ev)) => self.on_cluster(ev),
            CapiEvent::Machine(Err(e))
            | CapiEvent::Deployment(Err(e))
            | CapiEvent::Pool(Err(e))
            | CapiEvent::Cluster(Err(e)) => {
                tracing::warn!(error = %e, watch = "Cluster API", "watch failed; it will re-list");
            }
        }
    }
}

/// The index key of a MachineDeployment or MachinePool object.
fn scalable_key(kind: ScalableKind, o: &DynamicObject) -> String {
    ScalableRef::new(
        kind,
        o.metadata.namespace.as_deref().unwrap_or_default(),
        o.metadata.name.as_deref().unwrap_or_default(),
    )
    .key()
}

/// A MachineDeployment or MachinePool the model could not read, as the index keeps it.
fn unreadable(kind: ScalableKind, o: &DynamicObject, error: String) -> (String, Unreadable) {
    let labels = o.metadata.labels.clone().unwrap_or_default();
    (scalable_key(kind, o), Unreadable { labels, error })
}
