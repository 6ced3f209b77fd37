//! One watch on Machines, one on MachineDeployments and, where the management cluster serves
//! them, one on MachinePools (the second scalable kind, indexed with the MachineDeployments),
//! and one on MachineSets, kept only for a failing preflight check that holds a scale-up.
//! Each change updates the indexes and is routed to the actor that waits: the Scaler, the claim
//! bound to the Machine, the Catalog. A dropped watch re-lists; after a re-list every Scaler and
//! claim actor reconciles from the fresh state.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use actix::prelude::*;
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};

use super::Shared;
use super::messages::{Kick, Poke};
use crate::capi::model::{Machine, MachineDeployment, MachineSet};
use crate::capi::preflight::PreflightHold;
use crate::capi::scalable::{ScalableKind, ScalableRef};
use crate::capi::{autoscaler, version};
use crate::state::feed::Staleness;
use crate::state::machines::{Unreadable, bound_claim, deployment_key};

pub(crate) enum CapiEvent {
    Machine(Result<watcher::Event<DynamicObject>, watcher::Error>),
    Deployment(Result<watcher::Event<DynamicObject>, watcher::Error>),
    Pool(Result<watcher::Event<DynamicObject>, watcher::Error>),
    Cluster(Result<watcher::Event<DynamicObject>, watcher::Error>),
    MachineSet(Result<watcher::Event<DynamicObject>, watcher::Error>),
}

impl Message for CapiEvent {
    type Result = ();
}

pub(crate) struct CapiWatcher {
    shared: Arc<Shared>,
    machine_buffer: Vec<Machine>,
    md_buffer: Vec<MachineDeployment>,
    pool_buffer: Vec<MachineDeployment>,
    unreadable_buffer: BTreeMap<String, Unreadable>,
    pool_unreadable_buffer: BTreeMap<String, Unreadable>,
    machines_stale: Staleness,
    mds_stale: Staleness,
    pools_stale: Staleness,
    /// Clusters by `namespace/name`: what the controller follows of each (see `on_cluster`),
    /// and a re-list in progress.
    clusters: BTreeMap<String, ClusterView>,
    cluster_buffer: BTreeMap<String, ClusterView>,
    clusters_stale: Staleness,
    /// MachineSets holding a scale-up by a failing preflight check, during a re-list.
    set_buffer: BTreeMap<String, (String, PreflightHold)>,
    sets_stale: Staleness,
}

/// What the controller follows of a Cluster.
#[derive(Clone, Debug, Default, PartialEq)]
struct ClusterView {
    /// Cluster API's pause holds it (`autoscaler::cluster_paused`).
    paused: bool,
    /// Its topology's entries that set replicas (`capi::topology`).
    topology_replicas: BTreeSet<crate::capi::topology::Entry>,
}

impl ClusterView {
    fn of(cluster: &DynamicObject) -> Self {
        Self {
            paused: autoscaler::cluster_paused(cluster),
            topology_replicas: crate::capi::topology::entries_with_replicas(cluster),
        }
    }
}

impl CapiWatcher {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
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
            set_buffer: BTreeMap::new(),
            sets_stale: Staleness::new("MachineSets"),
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

    /// A Cluster changed. A paused Cluster pauses its MachineDeployments for every Cluster API
    /// controller, so it does here too (no replica write, no offering, no disruption of its
    /// nodes); a topology entry that sets replicas takes its node group's replicas from
    /// everyone else (`capi::topology`). Only a change of either reaches the actors.
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
                self.cluster_buffer.insert(key(&o), ClusterView::of(&o));
            }
            watcher::Event::InitDone => self.clusters = std::mem::take(&mut self.cluster_buffer),
            watcher::Event::Apply(o) => {
                self.clusters.insert(key(&o), ClusterView::of(&o));
            }
            watcher::Event::Delete(o) => {
                self.clusters.remove(&key(&o));
            }
        }
        let paused: BTreeSet<String> = self
            .clusters
            .iter()
            .filter(|(_, c)| c.paused)
            .map(|(k, _)| k.clone())
            .collect();
        let topology = self
            .clusters
            .iter()
            .filter(|(_, c)| !c.topology_replicas.is_empty())
            .map(|(k, c)| (k.clone(), c.topology_replicas.clone()))
            .collect();
        let mut deployments = self.shared.state.deployments.write();
        let pause_changed = deployments.set_paused_clusters(paused.clone());
        let topology_changed = deployments.set_topology_replicas(topology);
        drop(deployments);
        if pause_changed {
            tracing::info!(paused = ?paused, "Cluster API pause changed");
        }
        if topology_changed {
            tracing::info!("ClusterClass topology replicas changed");
        }
        if pause_changed || topology_changed {
            for (_, s) in self.shared.router.scalers() {
                s.do_send(Poke);
            }
            self.shared.router.catalog_changed();
            self.shared.router.disruption_changed();
        }
    }

    /// A MachineSet changed: whether a preflight check holds its scale-up. Only a change of
    /// what a MachineDeployment's waiting claims would say reaches them (a kick each).
    fn on_machine_set(&mut self, ev: watcher::Event<DynamicObject>) {
        let v = self.shared.capi_version;
        match ev {
            watcher::Event::Init => self.set_buffer.clear(),
            watcher::Event::InitApply(o) => {
                if let Some((set, md, Some(hold))) = set_hold(&o, v) {
                    self.set_buffer.insert(set, (md, hold));
                }
            }
            watcher::Event::InitDone => {
                let fresh = std::mem::take(&mut self.set_buffer);
                let changed = self.shared.state.preflight.write().replace_all(fresh);
                for md in changed {
                    self.kick_waiting(&md);
                }
            }
            watcher::Event::Apply(o) => {
                if let Some((set, md, hold)) = set_hold(&o, v)
                    && self.shared.state.preflight.write().set(&set, &md, hold)
                {
                    self.kick_waiting(&md);
                }
            }
            watcher::Event::Delete(o) => {
                if let Some((set, md, _)) = set_hold(&o, v)
                    && self.shared.state.preflight.write().set(&set, &md, None)
                {
                    self.kick_waiting(&md);
                }
            }
        }
    }

    /// The claims waiting for a Machine of `md` look again (their `Launched` condition names
    /// a preflight hold, or no longer does).
    fn kick_waiting(&self, md: &str) {
        let waiting = self.shared.state.claims.read().waiting_on(md);
        tracing::info!(machine_deployment = %md, hold = ?self.shared.state.preflight.read().of_deployment(md), claims = waiting.len(), "MachineSet preflight hold changed");
        for claim in waiting {
            self.shared.router.kick_claim(&claim);
        }
    }

    /// Clusters, to follow their pause and topology (only the one named by `--cluster-name` when set), once
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
        // MachineSets only for what holds a scale-up: Cluster API reports a failing preflight
        // check on the set, not on its MachineDeployment.
        let sets = watcher(self.api(&version::machine_set_resource(v)), self.config())
            .default_backoff()
            .map(CapiEvent::MachineSet);
        ctx.add_stream(sets);
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
            CapiEvent::MachineSet(ev) => self.sets_stale.saw(ev, m),
        }
        match ev {
            CapiEvent::Machine(Ok(ev)) => self.on_machine(ev),
            CapiEvent::Deployment(Ok(ev)) => self.on_scalable(ScalableKind::MachineDeployment, ev),
            CapiEvent::Pool(Ok(ev)) => self.on_scalable(ScalableKind::MachinePool, ev),
            CapiEvent::Cluster(Ok(ev)) => self.on_cluster(ev),
            CapiEvent::MachineSet(Ok(ev)) => self.on_machine_set(ev),
            CapiEvent::Machine(Err(e))
            | CapiEvent::Deployment(Err(e))
            | CapiEvent::Pool(Err(e))
            | CapiEvent::Cluster(Err(e))
            | CapiEvent::MachineSet(Err(e)) => {
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

/// A MachineSet of a MachineDeployment: its key, its MachineDeployment's key and the preflight
/// hold it reports. None for a set of no MachineDeployment, or one the model cannot read (a
/// set Cluster API could not read would hold nothing either).
fn set_hold(
    o: &DynamicObject,
    v: crate::capi::CapiVersion,
) -> Option<(String, String, Option<PreflightHold>)> {
    let ms = match MachineSet::from_dynamic(o, v) {
        Ok(ms) => ms,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring malformed MachineSet");
            return None;
        }
    };
    let md = ScalableRef::new(
        ScalableKind::MachineDeployment,
        &ms.namespace,
        ms.deployment_name.as_deref()?,
    )
    .key();
    let set = ms.key();
    let hold = ms.preflight.map(|message| PreflightHold {
        machine_set: set.clone(),
        message,
    });
    Some((set, md, hold))
}

/// A MachineDeployment or MachinePool the model could not read, as the index keeps it.
fn unreadable(kind: ScalableKind, o: &DynamicObject, error: String) -> (String, Unreadable) {
    let labels = o.metadata.labels.clone().unwrap_or_default();
    (scalable_key(kind, o), Unreadable { labels, error })
}
