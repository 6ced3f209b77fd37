//! Wiring of the actors: watches first (every replica), then, once the caches are warm and this
//! replica leads, the writers (Catalog, claim actors, Scalers).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::watch;

use super::capi_watcher::CapiWatcher;
use super::catalog::{Catalog, CatalogView, Synced};
use super::events::Events;
use super::node_watcher::NodeWatcher;
use super::nodepools::NodePools;
use super::provisioner::Provisioner;
use super::router::Router;
use super::supervisor::{Activate, Supervisor};
use super::{Settings, Shared};
use crate::capi::version::{self, CapiVersion};
use crate::metrics::Metrics;
use crate::state::State;

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

/// What a running controller exposes (tests and the simulator read the shared state).
pub struct ControllerHandle {
    pub shared: Arc<Shared>,
    pub supervisor: Addr<Supervisor>,
    pub capi_watcher: Addr<CapiWatcher>,
    pub node_watcher: Addr<NodeWatcher>,
    pub nodepools: Addr<NodePools>,
    pub provisioner: Addr<Provisioner>,
    pub catalog: Option<Addr<Catalog>>,
}

impl ControllerHandle {
    /// Stop every actor (a controller "crash" in tests: in-flight work is abandoned, as it would
    /// be if the process died).
    pub fn stop(self) {
        let router = &self.shared.router;
        for name in router.claim_names() {
            if let Some(a) = router.remove_claim(&name) {
                a.do_send(super::nodeclaim::Stop);
            }
        }
        for (_, s) in router.scalers() {
            s.do_send(super::scaler::Stop);
        }
        self.supervisor.do_send(super::StopActor);
        self.capi_watcher.do_send(super::StopActor);
        self.node_watcher.do_send(super::StopActor);
        self.nodepools.do_send(super::StopActor);
        self.provisioner.do_send(super::StopActor);
        if let Some(c) = self.catalog {
            c.do_send(super::StopActor);
        }
    }
}

impl Controller {
    /// Start the controller on the current actix System. Returns once the caches are warm and,
    /// if `leader` says so, the writers run; `leader` turning true later activates them then.
    pub async fn start(
        self,
        mut leader: watch::Receiver<bool>,
    ) -> Result<ControllerHandle, StartError> {
        let capi_version = version::discover(&self.management, self.capi_version).await?;
        tracing::info!(cluster_api_version = %capi_version, "using Cluster API version");
        let shared = Arc::new(Shared {
            events: Events::new(self.workload.clone(), self.instance.clone()),
            workload: self.workload,
            management: self.management,
            capi_version,
            state: State::default(),
            metrics: self.metrics,
            settings: self.settings,
            router: Router::default(),
            catalog: CatalogView::default(),
            synced: Arc::new(tokio::sync::Notify::new()),
        });
        let capi_watcher = CapiWatcher::new(shared.clone()).start();
        let node_watcher = NodeWatcher::new(shared.clone()).start();
        let supervisor = Supervisor::new(shared.clone()).start();
        let nodepools = NodePools::new(shared.clone()).start();
        shared.router.set_nodepools(nodepools.clone().recipient());
        let provisioner = Provisioner::new(
            shared.clone(),
            shared.settings.batching,
            shared.settings.preference,
        )
        .start();
        shared
            .router
            .set_provisioner(provisioner.clone().recipient());
        wait_for(&shared, |s| {
            s.machines.read().synced()
                && s.deployments.read().synced()
                && s.nodes.read().synced()
                && s.claims.read().synced()
                && s.pods.read().synced()
                && s.nodepools_synced
                    .load(std::sync::atomic::Ordering::Acquire)
        })
        .await;
        tracing::info!("caches synced");
        let mut handle = ControllerHandle {
            shared: shared.clone(),
            supervisor,
            capi_watcher,
            node_watcher,
            nodepools,
            provisioner,
            catalog: None,
        };
        if !*leader.borrow() {
            tracing::info!("waiting to become leader");
            if leader.wait_for(|l| *l).await.is_err() {
                return Ok(handle);
            }
        }
        let catalog = Catalog::new(shared.clone()).start();
        shared.router.set_catalog(catalog.clone().recipient());
        // Claims must not resolve against an empty catalog: wait for the NodeClass list.
        while !catalog.send(Synced).await.unwrap_or(true) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shared.router.set_active();
        handle.supervisor.do_send(Activate);
        shared.router.provisioner_poke();
        shared.router.nodepools_changed();
        handle.catalog = Some(catalog);
        tracing::info!("controller active");
        Ok(handle)
    }
}

async fn wait_for(shared: &Shared, ready: impl Fn(&State) -> bool) {
    loop {
        let notified = shared.synced.notified();
        if ready(&shared.state) {
            return;
        }
        // The timeout only guards against a missed notification; progress is event-driven.
        let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
    }
}
