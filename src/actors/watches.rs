//! Where every watch starts, one line per kind: each feeds its index through `state::feed`
//! (the same re-list semantics and metrics for all), and what its changes tell the actors is
//! said here, in the feed's callback, right after the index applied the change. No actor holds
//! a watch stream.

use std::sync::Arc;

use actix::prelude::*;
use kube::Api;
use kube::ResourceExt;
use tokio::task::JoinHandle;

use super::Shared;
use super::provisioner::{PodsChanged, Provisioner};
use super::supervisor::{ClaimsChanged, Supervisor};
use crate::api::decode::Lenient;
use crate::api::nodeclaim::NodeClaim;
use crate::state::feed::Index;
use crate::state::machines::bound_claim;
use crate::state::nodes::WatchedNode;
use crate::state::pods::WatchedPod;
use crate::state::watch::{Reports, Watch, Watchable};

mod capi;

/// Every watch, each feeding its index (every replica, from the start): the workload
/// cluster's kinds (the workloads only with default topology spread constraints), then the
/// Cluster API's. The Supervisor and the Provisioner hear of the claims' and pods' changes.
pub(super) fn start(
    shared: &Arc<Shared>,
    supervisor: Addr<Supervisor>,
    provisioner: Addr<Provisioner>,
) -> Vec<JoinHandle<()>> {
    let mut feeds = claims_and_pods(shared, supervisor, provisioner);
    feeds.extend(workload_cluster_feeds(shared));
    feeds.extend(workload_feeds(shared));
    feeds.extend(gated_feeds(shared));
    feeds.extend(capi::start(shared));
    feeds
}

/// A storage or workload change may change what a pending pod needs (a claim that was missing,
/// a deduced selector): the provisioner looks again.
fn poke(s: &Shared, (): ()) {
    s.router.provisioner_poke();
}

/// The NodeClaims and the Pods, whose actors hear of every change.
fn claims_and_pods(
    shared: &Arc<Shared>,
    supervisor: Addr<Supervisor>,
    provisioner: Addr<Provisioner>,
) -> Vec<JoinHandle<()>> {
    vec![
        // Per-object decoding: one claim the types cannot read must not stop the watch.
        spawn(
            bound(
                shared,
                Watch::new(shared.api::<Lenient<NodeClaim>>(), "NodeClaims"),
            )
            .feed(
                |c: Lenient<NodeClaim>| c,
                &shared.state.claims,
                reports(shared),
                move |c| supervisor.do_send(ClaimsChanged(c)),
            ),
        ),
        // Decoded without managedFields and trimmed as they arrive. Pages of 100, not 500: the
        // pod list ends last, on top of every other index, and a page is held twice (its body
        // and its decoded pods) while it is cut down.
        spawn(
            Watch::new(Api::all(shared.workload.clone()), "Pods")
                .page_size(100)
                .feed(
                    |p: WatchedPod| {
                        let mut p = p.into_inner();
                        crate::state::trim::pod(&mut p);
                        p
                    },
                    &shared.state.pods,
                    reports(shared),
                    move |c| provisioner.do_send(PodsChanged(c)),
                ),
        ),
    ]
}

/// The workload cluster's other kinds: Nodes, DaemonSets, storage, Karpenter's objects (in the
/// management cluster with `--karpenter-objects management`), PodDisruptionBudgets and
/// VolumeAttachments, each telling whoever acts on its changes.
fn workload_cluster_feeds(shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};

    use crate::api::nodeclass::ClusterAPINodeClass;
    use crate::api::nodeoverlay::NodeOverlay;
    use crate::api::nodepool::NodePool;
    let storage = &shared.state.storage;
    // Besides `Ready`, the conditions node repair's policies watch.
    let kept: Vec<String> = (shared.settings.node_repair.iter())
        .flat_map(|p| p.condition_types())
        .collect();
    vec![
        // Decoded without what the index drops, and trimmed to the conditions it keeps.
        spawn_read_feed(
            shared,
            &shared.state.nodes,
            move |n: WatchedNode| {
                let mut n: Node = n.into_inner();
                crate::state::trim::node_keeping(&mut n, &kept);
                n
            },
            nodes_changed,
            "Nodes",
        ),
        // The solver counts DaemonSets' pods as each new node's overhead; a change waits for the
        // next solve.
        spawn_feed::<DaemonSet, _>(shared, &shared.state.daemonsets, |_, ()| {}, "DaemonSets"),
        spawn_feed::<PersistentVolumeClaim, _>(shared, storage, poke, "PersistentVolumeClaims"),
        spawn_feed::<PersistentVolume, _>(shared, storage, poke, "PersistentVolumes"),
        spawn_feed::<StorageClass, _>(shared, storage, poke, "StorageClasses"),
        spawn_feed::<CSINode, _>(shared, storage, poke, "CSINodes"),
        // Per-object decoding: one NodePool the types cannot read must not stop the watch.
        spawn_feed::<Lenient<NodePool>, _>(
            shared,
            &shared.state.nodepools,
            |s, _| {
                s.router.provisioner_poke();
                s.router.nodepools_changed();
                s.router.catalog_pools_changed();
            },
            "NodePools",
        ),
        spawn_feed::<Lenient<ClusterAPINodeClass>, _>(
            shared,
            &shared.state.nodeclasses,
            |s, _| s.router.catalog_changed(),
            "ClusterAPINodeClasses",
        ),
        // Only a new spec changes what the catalog applies (our status writes come back too).
        spawn_feed::<Lenient<NodeOverlay>, _>(
            shared,
            &shared.state.overlays,
            |s, spec_changed| {
                if spec_changed {
                    s.router.catalog_overlays_changed();
                }
            },
            "NodeOverlays",
        ),
        spawn_feed::<PodDisruptionBudget, _>(
            shared,
            &shared.state.pdbs,
            |s, ()| s.router.disruption_changed(),
            "PodDisruptionBudgets",
        ),
        // A drained node waits for its volumes to detach: the Terminator looks again.
        spawn_feed::<VolumeAttachment, _>(
            shared,
            &shared.state.volume_attachments,
            |s, nodes| {
                for node in nodes {
                    s.router.drain_node_changed(&node);
                }
            },
            "VolumeAttachments",
        ),
    ]
}

/// The workloads whose selectors default topology spread constraints deduce: watched only when
/// the scheduler configuration sets such constraints.
fn workload_feeds(shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
    use k8s_openapi::api::core::v1::{ReplicationController, Service};
    let Some(d) = &shared.settings.default_constraints else {
        return Vec::new();
    };
    tracing::info!(
        constraints = ?d.constraints(),
        "scheduler config sets default topology spread constraints: pods without their own are spread by them"
    );
    let w = &shared.state.workloads;
    vec![
        spawn_feed::<Service, _>(shared, w, poke, "Services"),
        spawn_feed::<ReplicaSet, _>(shared, w, poke, "ReplicaSets"),
        spawn_feed::<StatefulSet, _>(shared, w, poke, "StatefulSets"),
        spawn_feed::<ReplicationController, _>(shared, w, poke, "ReplicationControllers"),
    ]
}

/// The feeds behind a feature gate. They run on every replica like the others, though only the
/// leader's Quotas and Buffers actors act on them (the Router drops the message elsewhere): so
/// a replica's start-up waits for the quota list and its first solve as leader already caps by
/// them, and an actor that starts on election finds its index full. Nothing clears them while
/// the controller runs; they stop with it (`Actors::stop`).
fn gated_feeds(shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
    use k8s_openapi::api::core::v1::PodTemplate;

    use crate::api::capacity_buffer::CapacityBuffer;
    use crate::api::capacity_quota::CapacityQuota;
    use crate::state::referents::{Referent, Referents};
    let mut feeds = Vec::new();
    if shared.settings.capacity_quotas {
        // Per-object decoding: a quota that does not decode caps nothing and is named by the
        // Quotas actor. Only a new spec changes what a solve caps.
        feeds.push(spawn_feed::<Lenient<CapacityQuota>, _>(
            shared,
            &shared.state.quotas,
            |s, spec_changed| {
                if spec_changed {
                    s.router.provisioner_poke();
                }
                s.router.quotas_changed();
            },
            "CapacityQuotas",
        ));
    }
    if shared.settings.capacity_buffers {
        // The kinds a buffer may reference: a change resolves again the buffers that do. Their
        // own watch names, apart from the workload feeds' ReplicaSets and StatefulSets.
        let told: fn(&Shared, Option<Referent>) = |s, changed| {
            if let Some(r) = changed {
                s.router.buffer_referent_changed(r);
            }
        };
        let r = &Arc::new(parking_lot::RwLock::new(Referents::default()));
        feeds.extend([
            spawn_feed::<Lenient<CapacityBuffer>, _>(
                shared,
                &shared.state.capacity_buffers,
                |s, _| s.router.buffers_changed(),
                "CapacityBuffers",
            ),
            spawn_feed::<PodTemplate, _>(shared, r, told, "CapacityBuffer PodTemplates"),
            spawn_feed::<Deployment, _>(shared, r, told, "CapacityBuffer Deployments"),
            spawn_feed::<StatefulSet, _>(shared, r, told, "CapacityBuffer StatefulSets"),
            spawn_feed::<ReplicaSet, _>(shared, r, told, "CapacityBuffer ReplicaSets"),
        ]);
    }
    feeds
}

/// Nodes changed: each claim waiting on one of these provider IDs (registration,
/// initialization, termination) looks again, and disruption does.
fn nodes_changed(s: &Shared, provider_ids: Vec<Box<str>>) {
    for pid in provider_ids {
        let claim = (s.state.claims.read().by_provider_id(&pid))
            .map(|c| c.name_any())
            .or_else(|| {
                let m = s.state.machines.read().by_provider_id(&pid);
                m.and_then(|m| bound_claim(&m).map(str::to_string))
            });
        if let Some(c) = claim {
            s.router.kick_claim(&c);
        }
    }
    s.router.disruption_changed();
}

/// Where a feed reports: the shared `synced` notification, the metrics.
fn reports(shared: &Shared) -> Reports<'_> {
    Reports {
        synced: &shared.synced,
        metrics: &shared.metrics,
    }
}

/// Runs a feed on the actors' arbiter (its callbacks send to actors of this thread).
fn spawn(feed: impl std::future::Future<Output = ()> + 'static) -> JoinHandle<()> {
    actix::spawn(feed)
}

/// A watch of Karpenter's objects sees only this Cluster's when they are in the management
/// cluster (`view::binding`).
fn bound<K: Watchable<DynamicType = ()>>(shared: &Shared, watch: Watch<K>) -> Watch<K> {
    match shared.selector_for::<K>() {
        Some(selector) => watch.labels(&selector),
        None => watch,
    }
}

/// Feed `index` from a watch of every `K` of the cluster that holds them; `changed` after each
/// change.
fn spawn_feed<K, I>(
    shared: &Arc<Shared>,
    index: &Arc<parking_lot::RwLock<I>>,
    changed: fn(&Shared, I::Changed),
    what: &'static str,
) -> JoinHandle<()>
where
    K: Watchable<DynamicType = ()>,
    I: Index<K> + 'static,
{
    spawn_read_feed(shared, index, |o: K| o, changed, what)
}

/// [`spawn_feed`], each object read by `read` as it arrives, before the index keeps it (a
/// watched type decoded without what the index drops, or a cut that depends on the settings).
fn spawn_read_feed<K, T, I>(
    shared: &Arc<Shared>,
    index: &Arc<parking_lot::RwLock<I>>,
    read: impl FnMut(K) -> T + Send + 'static,
    changed: fn(&Shared, I::Changed),
    what: &'static str,
) -> JoinHandle<()>
where
    K: Watchable<DynamicType = ()>,
    T: 'static,
    I: Index<T> + 'static,
{
    let s = shared.clone();
    let watch = Watch::new(Api::all(shared.client_for::<K>()), what);
    spawn(bound(shared, watch).feed(read, index, reports(shared), move |said| changed(&s, said)))
}
