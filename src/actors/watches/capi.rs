//! The Cluster API watches, each object read at the version picked at start-up: Machines, one
//! watch per scalable kind of `ScalableKind::ALL` (an optional kind once discovery says it is
//! served), Clusters (their pause and topology) once served, and MachineSets (only for a
//! failing preflight check holding a scale-up: Cluster API reports it on the set, not on its
//! MachineDeployment). Each change goes straight to the actor that waits: the Scaler, the
//! claim bound to the Machine, the Catalog, Disruption. After a re-list every Scaler and claim
//! actor reconciles from the fresh state.

use std::sync::Arc;

use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use parking_lot::RwLock;
use tokio::task::JoinHandle;

use super::{reports, spawn};
use crate::actors::Shared;
use crate::actors::messages::{Kick, Poke};
use crate::actors::scaler::machine_matters;
use crate::capi::model::Machine;
use crate::capi::scalable::ScalableKind;
use crate::capi::version;
use crate::state::machines::feed::{
    ClusterFeed, MachineChange, ScalableChange, ScalableFeed, read_cluster, read_machine,
    read_scalable, read_set,
};
use crate::state::machines::{bound_claim, deployment_key};
use crate::state::watch::Watch;

pub(super) fn start(shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    let v = shared.capi_version;
    let (s, st) = (shared.clone(), &shared.state);
    let mut feeds = vec![
        spawn(
            watch(shared, &version::machine_resource(v), "Machines").feed(
                read_machine(v, st.machines.clone()),
                &st.machines,
                reports(shared),
                move |c| machines_changed(&s, c),
            ),
        ),
        spawn(
            watch(shared, &version::machine_set_resource(v), "MachineSets").feed(
                read_set(v),
                &st.preflight,
                reports(shared),
                {
                    let s = shared.clone();
                    move |mds: Vec<String>| mds.iter().for_each(|md| kick_waiting(&s, md))
                },
            ),
        ),
        spawn(clusters(shared.clone())),
    ];
    feeds.extend(ScalableKind::ALL.map(|kind| spawn(scalables(shared.clone(), kind))));
    feeds
}

/// The objects of `ar` the controller acts on: in `--capi-namespace` when set, of
/// `--cluster-name`'s Cluster when set.
fn watch(shared: &Shared, ar: &ApiResource, what: &'static str) -> Watch<DynamicObject> {
    let watch = Watch::new(api(shared, ar), what);
    match &shared.settings.cluster_name {
        Some(c) => watch.labels(&format!(
            "{}={c}",
            crate::api::wellknown::CLUSTER_NAME_LABEL
        )),
        None => watch,
    }
}

fn api(shared: &Shared, ar: &ApiResource) -> Api<DynamicObject> {
    let client = shared.management.clone();
    match &shared.settings.capi_namespace {
        Some(ns) => Api::namespaced_with(client, ns, ar),
        None => Api::all_with(client, ar),
    }
}

/// One scalable kind's watch, into the node groups' index; an optional kind only once
/// discovery says it is served (without it, or when discovery fails, the other kinds scale).
async fn scalables(shared: Arc<Shared>, kind: ScalableKind) {
    let v = shared.capi_version;
    if kind.optional() {
        let what = kind.watch_name();
        match version::serves_scalable(&shared.management, v, kind).await {
            Ok(true) => {}
            Ok(false) => {
                return tracing::info!("{what} are not served; scaling the other kinds only");
            }
            Err(e) => {
                return tracing::warn!(error = %e, "{what} discovery failed; scaling the other kinds only");
            }
        }
    }
    let index = Arc::new(RwLock::new(ScalableFeed::new(
        kind,
        shared.state.deployments.clone(),
    )));
    let s = shared.clone();
    watch(&shared, &kind.resource(v), kind.watch_name())
        .feed(read_scalable(kind, v), &index, reports(&shared), move |c| {
            scalable_changed(&s, c)
        })
        .await;
}

/// Clusters, to follow their pause and topology (only the one named by `--cluster-name` when
/// set), once discovery says they are served: without them no Cluster can be paused.
async fn clusters(shared: Arc<Shared>) {
    let v = shared.capi_version;
    match version::serves_clusters(&shared.management, v).await {
        Ok(true) => {}
        Ok(false) => {
            return tracing::info!(
                "Clusters are not served; following MachineDeployments' own pause only"
            );
        }
        Err(e) => {
            return tracing::warn!(error = %e, "Cluster discovery failed; following MachineDeployments' own pause only");
        }
    }
    let watch = Watch::new(api(&shared, &v.cluster()), "Clusters");
    let watch = match &shared.settings.cluster_name {
        Some(c) => watch.fields(&format!("metadata.name={c}")),
        None => watch,
    };
    let index = Arc::new(RwLock::new(ClusterFeed::new(
        shared.state.deployments.clone(),
    )));
    let s = shared.clone();
    watch
        .feed(read_cluster, &index, reports(&shared), move |changed| {
            if changed {
                for (_, sc) in s.router.scalers() {
                    sc.do_send(Poke);
                }
                s.router.catalog_changed();
                s.router.disruption_changed();
            }
        })
        .await;
}

fn machines_changed(s: &Shared, change: MachineChange) {
    match change {
        MachineChange::Applied { old, new } => {
            // A Machine appearing, going, or changing rollout state is what the Disruption
            // actor's rollout replacements wait for.
            let rollout_changed = old.as_ref().is_none_or(|o| {
                o.up_to_date != new.up_to_date || o.is_deleting() != new.is_deleting()
            });
            let replan = machine_matters(old.as_deref(), &new);
            if let Some(old) = old.filter(|o| bound_claim(o) != bound_claim(&new)) {
                route_machine(s, &old, replan);
            }
            route_machine(s, &new, replan);
            if rollout_changed {
                s.router.disruption_changed();
            }
        }
        MachineChange::Deleted(Some(old)) => route_machine(s, &old, true),
        MachineChange::Deleted(None) | MachineChange::Unread => {}
        MachineChange::Relisted => everyone_reconciles(s),
    }
}

/// A Machine changed: the claim bound to it looks again, and its Scaler when `replan` (the
/// change can alter its plan, see `scaler::machine_matters`).
fn route_machine(s: &Shared, m: &Machine, replan: bool) {
    if replan
        && let Some(md) = deployment_key(m)
        && let Some(sc) = s.router.scaler(&md)
    {
        sc.do_send(Poke);
    }
    if let Some(claim) = bound_claim(m)
        && let Some(a) = s.router.claim(claim)
    {
        a.do_send(Kick);
    }
}

fn scalable_changed(s: &Shared, change: ScalableChange) {
    match change {
        Some(key) => {
            if let Some(sc) = s.router.scaler(&key) {
                sc.do_send(Poke);
            }
            s.router.catalog_changed();
        }
        None => everyone_reconciles(s),
    }
}

fn everyone_reconciles(s: &Shared) {
    for (_, sc) in s.router.scalers() {
        sc.do_send(Poke);
    }
    for name in s.router.claim_names() {
        s.router.kick_claim(&name);
    }
    s.router.catalog_changed();
}

/// The claims waiting for a Machine of `md` look again (their `Launched` condition names a
/// preflight hold, or no longer does).
fn kick_waiting(s: &Shared, md: &str) {
    let waiting = s.state.claims.read().waiting_on(md).clone();
    tracing::info!(machine_deployment = %md, hold = ?s.state.preflight.read().of_deployment(md), claims = waiting.len(), "MachineSet preflight hold changed");
    for claim in waiting {
        s.router.kick_claim(&claim);
    }
}
