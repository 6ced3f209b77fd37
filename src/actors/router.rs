//! Who waits for what: the addresses of the per-claim and per-MachineDeployment actors, and the
//! `Registry` of the others, so that watches can deliver a change straight to the one actor that
//! cares (dropped when it does not run here).

use std::collections::HashMap;
use std::sync::Arc;

use actix::Addr;
use jiff::Timestamp;
use parking_lot::RwLock;

use std::sync::atomic::{AtomicBool, Ordering};

use super::buffers::{Buffers, BuffersChanged, Provisioned, ReferentChanged};
use super::catalog::{Catalog, NodePoolsChanged, Rebuild};
use super::disruption::{ClusterChanged, Disruption};
use super::generator::Generator;
use super::nodeclaim::NodeClaimActor;
use super::nodepools::{NodePools, Refresh};
use super::provisioner::{Pending, Provisioner};
use super::quotas::{Quotas, QuotasChanged};
use super::registry::Registry;
use super::repair::{Look, NodeRepair};
use super::scaler::Scaler;
use super::static_capacity::{Hold, StaticCapacity};
use super::terminator::{NodeChanged, Terminator};

#[derive(Clone, Default)]
pub struct Router {
    claims: Arc<RwLock<HashMap<String, Addr<NodeClaimActor>>>>,
    scalers: Arc<RwLock<HashMap<String, Addr<Scaler>>>>,
    /// Every other actor, one of each type.
    actors: Arc<Registry>,
    /// This replica leads and its writers run.
    active: Arc<AtomicBool>,
}

impl Router {
    pub(crate) fn claim(&self, name: &str) -> Option<Addr<NodeClaimActor>> {
        self.claims
            .read()
            .get(name)
            .filter(|a| a.connected())
            .cloned()
    }

    /// Make a claim actor reconcile (something it waits for changed).
    pub(crate) fn kick_claim(&self, name: &str) {
        if let Some(a) = self.claim(name) {
            a.do_send(super::messages::Kick);
        }
    }

    /// The actors of which one runs each (the leader's writers among them), by type.
    pub(crate) fn actors(&self) -> &Registry {
        &self.actors
    }

    /// The Terminator (leader only).
    pub(crate) fn terminator(&self) -> Option<Addr<Terminator>> {
        self.actors.get::<Terminator>()
    }

    /// The quota feed took a change: the Quotas actor catches up (when it runs here).
    pub fn quotas_changed(&self) {
        self.actors.send::<Quotas, _>(QuotasChanged);
    }

    /// The CapacityBuffer feed took a change: the Buffers actor catches up (when it runs here).
    pub fn buffers_changed(&self) {
        self.actors.send::<Buffers, _>(BuffersChanged);
    }

    /// An object a buffer may reference changed: the buffers that do are resolved again.
    pub fn buffer_referent_changed(&self, referent: crate::state::referents::Referent) {
        self.actors.send::<Buffers, _>(ReferentChanged(referent));
    }

    /// A solve placed the buffers' placeholder pods: their `Provisioning` conditions follow.
    pub(crate) fn buffers_provisioned(
        &self,
        placed: std::collections::HashMap<String, crate::state::buffers::Placed>,
    ) {
        self.actors.send::<Buffers, _>(Provisioned(placed));
    }

    /// Claims, Nodes, Machines or pods changed: disruption looks again (debounced there), and so do
    /// the static pools (a disruption mark on a Node changes what they count) and node repair.
    pub(crate) fn disruption_changed(&self) {
        self.actors.send::<Disruption, _>(ClusterChanged::default());
        self.static_changed();
        self.actors.send::<NodeRepair, _>(Look);
    }

    /// The Generator (leader only): creates and removes generated node groups.
    pub(crate) fn generator(&self) -> Option<Addr<Generator>> {
        self.actors.get::<Generator>()
    }

    /// NodePools, claims or Nodes changed: static pools look at their counts again.
    pub(crate) fn static_changed(&self) {
        self.actors.send::<StaticCapacity, _>(Hold);
    }

    /// A pod on `node` changed; `at` is set when the change is a pod event (scheduled,
    /// terminating, terminal, gone), which restarts the node's `consolidateAfter` countdown.
    pub(crate) fn pod_changed(&self, node: &str, at: Option<Timestamp>) {
        self.actors.send::<Disruption, _>(ClusterChanged {
            pod_event: at.map(|at| (node.to_string(), at)),
        });
    }

    /// Pods or volume attachments of `node` changed: a drain of it looks again.
    pub(crate) fn drain_node_changed(&self, node: &str) {
        self.actors
            .send::<Terminator, _>(NodeChanged(node.to_string()));
    }

    pub(crate) fn add_claim(&self, name: String, addr: Addr<NodeClaimActor>) {
        self.claims.write().insert(name, addr);
    }

    pub(crate) fn remove_claim(&self, name: &str) -> Option<Addr<NodeClaimActor>> {
        self.claims.write().remove(name)
    }

    pub(crate) fn claim_names(&self) -> Vec<String> {
        self.claims.read().keys().cloned().collect()
    }

    pub fn scaler(&self, md_key: &str) -> Option<Addr<Scaler>> {
        self.scalers
            .read()
            .get(md_key)
            .filter(|a| a.connected())
            .cloned()
    }

    /// The Scaler of a MachineDeployment, started on first use. Must be called from the actor
    /// System's thread (actors start on the current arbiter).
    pub(crate) fn scaler_or_start(
        &self,
        md_key: &str,
        start: impl FnOnce() -> Addr<Scaler>,
    ) -> Addr<Scaler> {
        if let Some(a) = self.scaler(md_key) {
            return a;
        }
        let mut scalers = self.scalers.write();
        if let Some(a) = scalers.get(md_key).filter(|a| a.connected()) {
            return a.clone();
        }
        let addr = start();
        scalers.insert(md_key.to_string(), addr.clone());
        addr
    }

    /// A Scaler stopped: forget it, unless a newer one already took its place.
    pub(crate) fn remove_scaler(&self, md_key: &str, addr: &Addr<Scaler>) {
        let mut scalers = self.scalers.write();
        if scalers.get(md_key).is_some_and(|a| a == addr) {
            scalers.remove(md_key);
        }
    }

    pub fn scalers(&self) -> Vec<(String, Addr<Scaler>)> {
        self.scalers
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Tell the Catalog (if it runs here) that NodePools changed: overlays may see them anew.
    pub(crate) fn catalog_pools_changed(&self) {
        self.actors.send::<Catalog, _>(NodePoolsChanged);
    }

    /// Tell the Catalog (if it runs here) that MachineDeployments or NodeClasses changed.
    pub(crate) fn catalog_changed(&self) {
        self.actors.send::<Catalog, _>(Rebuild { overlays: false });
    }

    /// Tell the Catalog (if it runs here) that a NodeOverlay's spec changed.
    pub(crate) fn catalog_overlays_changed(&self) {
        self.actors.send::<Catalog, _>(Rebuild { overlays: true });
    }

    /// Something the provisioner packs against changed (pods, nodes, NodePools, the catalog).
    pub fn provisioner_poke(&self) {
        self.actors.send::<Provisioner, _>(Pending);
    }

    /// Claims or the catalog changed: NodePool statuses may too.
    pub(crate) fn nodepools_changed(&self) {
        self.actors.send::<NodePools, _>(Refresh);
        self.static_changed();
    }

    pub(crate) fn set_active(&self) {
        self.active.store(true, Ordering::Release);
    }

    pub(crate) fn set_inactive(&self) {
        self.active.store(false, Ordering::Release);
    }

    pub(crate) fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }
}
