//! Who waits for what: the addresses of the per-claim and per-MachineDeployment actors, so that
//! watches can deliver a change straight to the one actor that cares.

use std::collections::HashMap;
use std::sync::Arc;

use actix::{Addr, Recipient};
use jiff::Timestamp;
use parking_lot::RwLock;

use std::sync::atomic::{AtomicBool, Ordering};

use super::buffers::{Buffers, BuffersChanged, Provisioned, ReferentChanged};
use super::catalog::{NodePoolsChanged, Rebuild};
use super::deletion_cost::DeletionCost;
use super::disruption::{ClusterChanged, Disruption};
use super::nodeclaim::NodeClaimActor;
use super::nodepools::Refresh;
use super::provisioner::Pending;
use super::repair::{Look, NodeRepair};
use super::scaler::Scaler;
use super::static_capacity::{Hold, StaticCapacity};
use super::terminator::{NodeChanged, Terminator};

#[derive(Clone, Default)]
pub struct Router {
    claims: Arc<RwLock<HashMap<String, Addr<NodeClaimActor>>>>,
    scalers: Arc<RwLock<HashMap<String, Addr<Scaler>>>>,
    catalog: Arc<RwLock<Option<Recipient<Rebuild>>>>,
    catalog_pools: Arc<RwLock<Option<Recipient<NodePoolsChanged>>>>,
    provisioner: Arc<RwLock<Option<Recipient<Pending>>>>,
    nodepools: Arc<RwLock<Option<Recipient<Refresh>>>>,
    terminator: Arc<RwLock<Option<Addr<Terminator>>>>,
    disruption: Arc<RwLock<Option<Addr<Disruption>>>>,
    buffers: Arc<RwLock<Option<Addr<Buffers>>>>,
    quotas: Arc<RwLock<Option<Addr<super::quotas::Quotas>>>>,
    static_capacity: Arc<RwLock<Option<Addr<StaticCapacity>>>>,
    repair: Arc<RwLock<Option<Addr<NodeRepair>>>>,
    deletion_cost: Arc<RwLock<Option<Addr<DeletionCost>>>>,
    generator: Arc<RwLock<Option<Addr<super::generator::Generator>>>>,
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

    /// The Terminator (leader only); `take_terminator` hands it over to be stopped.
    pub(crate) fn set_terminator(&self, t: Addr<Terminator>) {
        *self.terminator.write() = Some(t);
    }

    pub(crate) fn terminator(&self) -> Option<Addr<Terminator>> {
        self.terminator.read().clone()
    }

    pub(crate) fn take_terminator(&self) -> Option<Addr<Terminator>> {
        self.terminator.write().take()
    }

    /// The Disruption actor (leader only); `take_disruption` hands it over to be stopped.
    pub(crate) fn set_disruption(&self, d: Addr<Disruption>) {
        *self.disruption.write() = Some(d);
    }

    pub(crate) fn take_disruption(&self) -> Option<Addr<Disruption>> {
        self.disruption.write().take()
    }

    /// The CapacityBuffer actor (leader only, behind its feature gate); `take_buffers` hands it
    /// over to be stopped.
    pub(crate) fn set_buffers(&self, b: Addr<Buffers>) {
        *self.buffers.write() = Some(b);
    }

    pub(crate) fn take_buffers(&self) -> Option<Addr<Buffers>> {
        self.buffers.write().take()
    }

    /// The CapacityQuota actor (leader only, behind its feature gate); `take_quotas` hands it
    /// over to be stopped.
    pub(crate) fn set_quotas(&self, q: Addr<super::quotas::Quotas>) {
        *self.quotas.write() = Some(q);
    }

    pub(crate) fn take_quotas(&self) -> Option<Addr<super::quotas::Quotas>> {
        self.quotas.write().take()
    }

    /// The quota feed took a change: the Quotas actor catches up (when it runs here).
    pub fn quotas_changed(&self) {
        if let Some(q) = self.quotas.read().as_ref() {
            q.do_send(super::quotas::QuotasChanged);
        }
    }

    /// The CapacityBuffer feed took a change: the Buffers actor catches up (when it runs here).
    pub fn buffers_changed(&self) {
        if let Some(b) = self.buffers.read().as_ref() {
            b.do_send(BuffersChanged);
        }
    }

    /// An object a buffer may reference changed: the buffers that do are resolved again.
    pub fn buffer_referent_changed(&self, referent: crate::state::referents::Referent) {
        if let Some(b) = self.buffers.read().as_ref() {
            b.do_send(ReferentChanged(referent));
        }
    }

    /// A solve placed the buffers' placeholder pods: their `Provisioning` conditions follow.
    pub(crate) fn buffers_provisioned(
        &self,
        placed: std::collections::HashMap<String, crate::state::buffers::Placed>,
    ) {
        if let Some(b) = self.buffers.read().as_ref() {
            b.do_send(Provisioned(placed));
        }
    }

    /// Claims, Nodes, Machines or pods changed: disruption looks again (debounced there), and so do
    /// the static pools (a disruption mark on a Node changes what they count) and node repair.
    pub(crate) fn disruption_changed(&self) {
        if let Some(d) = self.disruption.read().as_ref() {
            d.do_send(ClusterChanged::default());
        }
        self.static_changed();
        if let Some(r) = self.repair.read().as_ref() {
            r.do_send(Look);
        }
    }

    /// The NodeRepair actor (leader only, behind its feature gate); `take_repair` hands it
    /// over to be stopped.
    pub(crate) fn set_repair(&self, r: Addr<NodeRepair>) {
        *self.repair.write() = Some(r);
    }

    pub(crate) fn take_repair(&self) -> Option<Addr<NodeRepair>> {
        self.repair.write().take()
    }

    /// The Generator (leader only): creates and removes generated node groups.
    pub(crate) fn set_generator(&self, g: Addr<super::generator::Generator>) {
        *self.generator.write() = Some(g);
    }

    pub(crate) fn generator(&self) -> Option<Addr<super::generator::Generator>> {
        self.generator.read().clone()
    }

    pub(crate) fn take_generator(&self) -> Option<Addr<super::generator::Generator>> {
        self.generator.write().take()
    }

    /// The pod deletion cost actor (leader only, behind its feature gate); `take_deletion_cost`
    /// hands it over to be stopped.
    pub(crate) fn set_deletion_cost(&self, d: Addr<DeletionCost>) {
        *self.deletion_cost.write() = Some(d);
    }

    pub(crate) fn take_deletion_cost(&self) -> Option<Addr<DeletionCost>> {
        self.deletion_cost.write().take()
    }

    /// The StaticCapacity actor (leader only); `take_static_capacity` hands it over to be
    /// stopped.
    pub(crate) fn set_static_capacity(&self, s: Addr<StaticCapacity>) {
        *self.static_capacity.write() = Some(s);
    }

    pub(crate) fn take_static_capacity(&self) -> Option<Addr<StaticCapacity>> {
        self.static_capacity.write().take()
    }

    /// NodePools, claims or Nodes changed: static pools look at their counts again.
    pub(crate) fn static_changed(&self) {
        if let Some(s) = self.static_capacity.read().as_ref() {
            s.do_send(Hold);
        }
    }

    /// A pod on `node` changed; `at` is set when the change is a pod event (scheduled,
    /// terminating, terminal, gone), which restarts the node's `consolidateAfter` countdown.
    pub(crate) fn pod_changed(&self, node: &str, at: Option<Timestamp>) {
        if let Some(d) = self.disruption.read().as_ref() {
            d.do_send(ClusterChanged {
                pod_event: at.map(|at| (node.to_string(), at)),
            });
        }
    }

    /// Pods or volume attachments of `node` changed: a drain of it looks again.
    pub(crate) fn drain_node_changed(&self, node: &str) {
        if let Some(t) = self.terminator.read().as_ref() {
            t.do_send(NodeChanged(node.to_string()));
        }
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

    pub(crate) fn set_catalog(&self, r: Recipient<Rebuild>, pools: Recipient<NodePoolsChanged>) {
        *self.catalog.write() = Some(r);
        *self.catalog_pools.write() = Some(pools);
    }

    /// Tell the Catalog (if it runs here) that NodePools changed: overlays may see them anew.
    pub(crate) fn catalog_pools_changed(&self) {
        if let Some(r) = self.catalog_pools.read().as_ref() {
            r.do_send(NodePoolsChanged);
        }
    }

    /// Tell the Catalog (if it runs here) that MachineDeployments or NodeClasses changed.
    pub(crate) fn catalog_changed(&self) {
        if let Some(r) = self.catalog.read().as_ref() {
            r.do_send(Rebuild { overlays: false });
        }
    }

    /// Tell the Catalog (if it runs here) that a NodeOverlay's spec changed.
    pub(crate) fn catalog_overlays_changed(&self) {
        if let Some(r) = self.catalog.read().as_ref() {
            r.do_send(Rebuild { overlays: true });
        }
    }

    pub(crate) fn set_provisioner(&self, r: Recipient<Pending>) {
        *self.provisioner.write() = Some(r);
    }

    /// Something the provisioner packs against changed (pods, nodes, NodePools, the catalog).
    pub fn provisioner_poke(&self) {
        if let Some(r) = self.provisioner.read().as_ref() {
            r.do_send(Pending);
        }
    }

    pub(crate) fn set_nodepools(&self, r: Recipient<Refresh>) {
        *self.nodepools.write() = Some(r);
    }

    /// Claims or the catalog changed: NodePool statuses may too.
    pub(crate) fn nodepools_changed(&self) {
        if let Some(r) = self.nodepools.read().as_ref() {
            r.do_send(Refresh);
        }
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
