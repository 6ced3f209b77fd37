//! Wiring of the actors: watches first (every replica), then, once the caches are warm and this
//! replica leads, the writers (Catalog, claim actors, Scalers).

use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::watch;

use super::catalog::{Catalog, Synced};
use super::events::Events;
use super::messages::Stop;
use super::nodepools::NodePools;
use super::provisioner::Provisioner;
use super::router::Router;
use super::supervisor::{Activate, Supervisor};
use super::{Settings, Shared};
use crate::capi::version::{self, CapiVersion};
use crate::metrics::Metrics;
use crate::state::State;
use crate::view::CatalogView;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("discovering the Cluster API version: {0}")]
    Discovery(#[from] version::Error),
}

pub struct Controller {
    pub workload: kube::Client,
    pub management: kube::Client,
    /// Forced Cluster API version (None: discover, preferring v1beta2).
    pub capi_version: Option<CapiVersion>,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    /// Identity for Events (the pod name in a cluster).
    pub instance: String,
}

/// What a running controller exposes (tests and the simulator read the shared state and talk to
/// its actors, through `Deref` to [`Actors`]).
pub struct ControllerHandle {
    actors: Actors,
    /// True while this replica's writers run (it leads and the catalog has synced).
    pub active: watch::Receiver<bool>,
    follower: tokio::task::JoinHandle<()>,
}

impl std::ops::Deref for ControllerHandle {
    type Target = Actors;
    fn deref(&self) -> &Actors {
        &self.actors
    }
}

/// The feeds' tasks (cheap to clone with the actors' addresses).
type Feeds = Arc<Vec<tokio::task::JoinHandle<()>>>;

/// The every-replica actors and the feeds of one controller (cheap clones of the addresses).
/// Every actor of which one runs is in the router's `Registry` too; the claim actors and
/// Scalers are the router's.
#[derive(Clone)]
pub struct Actors {
    pub shared: Arc<Shared>,
    pub(crate) supervisor: Addr<Supervisor>,
    pub provisioner: Addr<Provisioner>,
    /// The watch-to-index feeds (`state::feed`), aborted on stop.
    feeds: Feeds,
}

impl Actors {
    /// Stop every actor; in-flight work is abandoned, as it would be if the process died (every
    /// write is compare-and-swap or idempotent, so the next leader starts from the API state).
    fn stop(&self) {
        let router = &self.shared.router;
        router.set_inactive();
        for name in router.claim_names() {
            if let Some(a) = router.remove_claim(&name) {
                a.do_send(Stop);
            }
        }
        for (_, s) in router.scalers() {
            s.do_send(Stop);
        }
        for f in self.feeds.iter() {
            f.abort();
        }
        router.actors().stop_all();
    }
}

impl ControllerHandle {
    /// The Catalog, when this replica leads.
    pub fn catalog(&self) -> Option<Addr<Catalog>> {
        self.shared.router.actors().get::<Catalog>()
    }

    /// Stop every actor (a controller "crash" in tests, and the end of a graceful shutdown once
    /// the writes have drained): in-flight work is abandoned, as it would be if the process died.
    pub fn stop(self) {
        self.follower.abort();
        self.actors.stop();
    }

    /// Stop starting new work: the provisioner and NodePool writers check this before writing.
    pub(crate) fn deactivate(&self) {
        self.shared.router.set_inactive();
    }
}

impl Controller {
    /// Start the controller on the current actix System and return once the caches are warm:
    /// a replica is Ready from then on, leader or not. The writers (Catalog, claim actors,
    /// Scalers) start when `leader` is or turns true, and stop for good when it turns false
    /// again (a replica that lost the Lease exits; it never leads twice). A closed `leader`
    /// channel keeps the last value.
    pub(crate) async fn start_synced(
        self,
        leader: watch::Receiver<bool>,
    ) -> Result<ControllerHandle, StartError> {
        let capi_version = version::discover(&self.management, self.capi_version).await?;
        tracing::info!(cluster_api_version = %capi_version, "using Cluster API version");
        let state = State::default();
        let karpenter = match &self.settings.karpenter_objects {
            Some(_) => self.management.clone(),
            None => self.workload.clone(),
        };
        let events = Events::new(self.workload.clone(), self.instance.clone())
            .with_karpenter(karpenter.clone(), self.settings.karpenter_objects.as_ref());
        let shared = Arc::new(Shared {
            events,
            workload: self.workload,
            management: self.management,
            karpenter,
            capi_version,
            // Offerings count the claims not in their group's replicas yet (`capi::room`).
            catalog: CatalogView::counting(state.claims.clone()),
            state,
            metrics: self.metrics,
            settings: self.settings,
            router: Router::default(),
            synced: Arc::new(tokio::sync::Notify::new()),
            deletion_gate: Default::default(),
        });
        let running = shared.router.actors();
        let supervisor = running.start(Supervisor::new(shared.clone()));
        let watch_workloads = shared.settings.default_constraints.is_some();
        running.start(NodePools::new(shared.clone()));
        let provisioner = running.start(Provisioner::new(
            shared.clone(),
            shared.settings.batching,
            shared.settings.preference,
        ));
        // The feeds run on this thread: the indexes pack tighter built without the thread cache.
        let cache = crate::thread_cache::set(false);
        let feeds = Feeds::new(super::watches::start(
            &shared,
            supervisor.clone(),
            provisioner.clone(),
        ));
        wait_for(&shared, |s| {
            s.machines.read().synced()
                && s.deployments.read().synced()
                && s.nodes.read().synced()
                && s.claims.read().synced()
                && s.pods.read().synced()
                && s.daemonsets.read().synced()
                && s.storage.read().synced()
                && s.pdbs.read().synced()
                && (!watch_workloads || s.workloads.read().synced())
                && s.nodepools.read().synced()
                && (!shared.settings.capacity_quotas || s.quotas.read().synced())
        })
        .await;
        if let Some(cache) = cache {
            crate::thread_cache::set(cache);
        }
        tracing::info!("caches synced");
        let actors = Actors {
            shared: shared.clone(),
            supervisor,
            provisioner,
            feeds,
        };
        let (active_tx, active) = watch::channel(false);
        // On the actix arbiter: the Catalog must start there.
        let follower = actix::spawn(follow(actors.clone(), leader, active_tx));
        Ok(ControllerHandle {
            actors,
            active,
            follower,
        })
    }

    /// `start_synced`, and when `leader` is already true, also wait until the writers run (a
    /// single leading controller: the simulator and most tests).
    #[cfg(feature = "simulator")]
    pub(crate) async fn start(
        self,
        leader: watch::Receiver<bool>,
    ) -> Result<ControllerHandle, StartError> {
        let leads = *leader.borrow();
        let handle = self.start_synced(leader).await?;
        if leads {
            let mut active = handle.active.clone();
            let _ = active.wait_for(|a| *a).await;
        }
        Ok(handle)
    }
}

/// Follow leadership: start the writers on election, stop every actor on loss.
async fn follow(actors: Actors, mut leader: watch::Receiver<bool>, active: watch::Sender<bool>) {
    if !*leader.borrow() {
        tracing::info!("caches synced; standing by until elected leader");
    }
    if leader.wait_for(|l| *l).await.is_err() {
        return;
    }
    activate(&actors).await;
    active.send_replace(true);
    if leader.wait_for(|l| !*l).await.is_err() {
        return;
    }
    tracing::warn!("no longer the leader: stopping the controller's actors");
    actors.stop();
    active.send_replace(false);
}

/// Start the writers, in this order: the Catalog (synced before anything resolves against it),
/// the leader's actors, then the claim actors (through the Supervisor) and a first look by the
/// Provisioner and NodePools. An actor's `start` checks its own feature gate.
async fn activate(actors: &Actors) {
    let shared = &actors.shared;
    let catalog = shared.router.actors().start(Catalog::new(shared.clone()));
    // Claims must not resolve against an empty catalog: wait for the NodeClass list (the
    // Catalog notifies once its first catalog after the list is published).
    loop {
        let notified = shared.synced.notified();
        if catalog.send(Synced).await.unwrap_or(true) {
            break;
        }
        notified.await;
    }
    super::terminator::start(shared);
    super::disruption::start(shared);
    super::generator::start(shared);
    super::static_capacity::start(shared);
    super::repair::start(shared);
    super::deletion_cost::start(shared);
    shared.router.set_active();
    super::buffers::start(shared);
    super::quotas::start(shared);
    super::bindings::start(shared);
    actors.supervisor.do_send(Activate);
    shared.router.provisioner_poke();
    shared.router.nodepools_changed();
    tracing::info!("controller active");
}

async fn wait_for(shared: &Shared, ready: impl Fn(&State) -> bool) {
    loop {
        let notified = shared.synced.notified();
        if ready(&shared.state) {
            return;
        }
        // Every feed says when a list completes; a `Notified` created before the check sees a
        // notification sent after it.
        notified.await;
    }
}
