//! The Cluster API watches' side of the indexes: Machines, the scalable kinds (one watch per
//! kind of `ScalableKind::ALL`, into one index), Clusters (their pause and topology, kept on the
//! node groups' index) and MachineSets (the preflight checks holding a scale-up). Each object
//! is read as it arrives, at the Cluster API version picked at start-up.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::api::DynamicObject;
use parking_lot::RwLock;

use super::{MachineDeployments, Machines, Unreadable, key};
use crate::capi::CapiVersion;
use crate::capi::model::{Machine, MachineDeployment, MachineSet};
use crate::capi::preflight::PreflightHold;
use crate::capi::scalable::{ScalableKind, ScalableRef};
use crate::capi::{autoscaler, topology};
use crate::state::feed::Index;
use crate::state::preflight::PreflightHolds;

fn object_key(o: &DynamicObject) -> String {
    key(
        o.metadata.namespace.as_deref().unwrap_or_default(),
        o.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// A watched Machine: its key, and the Machine when the model reads it (or why not).
pub(crate) struct WatchedMachine {
    key: String,
    machine: Result<Machine, String>,
}

/// Reads Machines at `v`, their label sets shared with `index`'s as they arrive (so a re-list's
/// buffer holds one copy of each).
pub(crate) fn read_machine(
    v: CapiVersion,
    index: Arc<RwLock<Machines>>,
) -> impl FnMut(DynamicObject) -> WatchedMachine + Send + 'static {
    move |o| {
        let machine = match Machine::from_dynamic(&o, v) {
            Ok(mut m) => {
                m.labels = index.write().share_labels(m.labels);
                Ok(m)
            }
            Err(e) => Err(e.to_string()),
        };
        WatchedMachine {
            key: object_key(&o),
            machine,
        }
    }
}

/// A Machine change, as the Scalers, the claims' actors and Disruption hear of it.
#[derive(Debug)]
pub(crate) enum MachineChange {
    /// A Machine was added or changed: what the index held before, and the new version.
    Applied {
        old: Option<Arc<Machine>>,
        new: Arc<Machine>,
    },
    /// A Machine is gone: the version the index held.
    Deleted(Option<Arc<Machine>>),
    /// A re-list was swapped in.
    Relisted,
    /// A Machine the model cannot read: ignored.
    Unread,
}

impl Index<WatchedMachine> for Machines {
    type Kept = WatchedMachine;
    type Listing = Vec<WatchedMachine>;
    type Changed = MachineChange;

    fn keep(m: WatchedMachine) -> WatchedMachine {
        m
    }

    fn apply(&mut self, w: WatchedMachine) -> MachineChange {
        match w.machine {
            Ok(m) => {
                let new = Arc::new(m.clone());
                let old = Machines::apply(self, m);
                MachineChange::Applied { old, new }
            }
            Err(error) => {
                tracing::warn!(%error, "ignoring malformed Machine");
                MachineChange::Unread
            }
        }
    }

    fn delete(&mut self, w: WatchedMachine) -> MachineChange {
        MachineChange::Deleted(self.remove(&w.key))
    }

    fn reset(&mut self, all: Vec<WatchedMachine>) -> MachineChange {
        let fresh = all.into_iter().filter_map(|w| {
            w.machine
                .map_err(|error| tracing::warn!(%error, "ignoring malformed Machine"))
                .ok()
        });
        self.replace_all(fresh.collect());
        MachineChange::Relisted
    }

    fn synced(&self) -> bool {
        Machines::synced(self)
    }
}

/// A watched MachineDeployment or MachinePool: its index key, and what the model reads of it.
pub(crate) struct WatchedScalable {
    key: String,
    read: Result<MachineDeployment, Unreadable>,
}

/// Reads objects of `kind` at `v`.
pub(crate) fn read_scalable(
    kind: ScalableKind,
    v: CapiVersion,
) -> impl FnMut(DynamicObject) -> WatchedScalable + Send + 'static {
    let parse = kind.parser();
    move |o| {
        let key = ScalableRef::new(
            kind,
            o.metadata.namespace.as_deref().unwrap_or_default(),
            o.metadata.name.as_deref().unwrap_or_default(),
        )
        .key();
        let read = parse(&o, v).map_err(|e| Unreadable {
            labels: o.metadata.labels.clone().unwrap_or_default(),
            error: e.to_string(),
        });
        WatchedScalable { key, read }
    }
}

/// One scalable kind's watch into the node groups' index (each kind is listed apart, so each
/// re-list replaces only its own kind).
pub(crate) struct ScalableFeed {
    kind: ScalableKind,
    index: Arc<RwLock<MachineDeployments>>,
}

impl ScalableFeed {
    pub(crate) fn new(kind: ScalableKind, index: Arc<RwLock<MachineDeployments>>) -> Self {
        Self { kind, index }
    }
}

/// A node group change: the key of the one that changed, or `None` after a re-list.
pub(crate) type ScalableChange = Option<String>;

impl Index<WatchedScalable> for ScalableFeed {
    type Kept = WatchedScalable;
    type Listing = Vec<WatchedScalable>;
    type Changed = ScalableChange;

    fn keep(w: WatchedScalable) -> WatchedScalable {
        w
    }

    fn apply(&mut self, w: WatchedScalable) -> ScalableChange {
        match w.read {
            Ok(md) => {
                self.index.write().apply(md);
            }
            Err(u) => {
                tracing::warn!(error = %u.error, "{} cannot be read", self.kind);
                self.index.write().mark_unreadable(w.key.clone(), u);
            }
        }
        Some(w.key)
    }

    fn delete(&mut self, w: WatchedScalable) -> ScalableChange {
        self.index.write().remove(&w.key);
        Some(w.key)
    }

    fn reset(&mut self, all: Vec<WatchedScalable>) -> ScalableChange {
        let mut fresh = Vec::new();
        let mut unreadable = BTreeMap::new();
        for w in all {
            match w.read {
                Ok(md) => fresh.push(md),
                Err(u) => {
                    tracing::warn!(error = %u.error, "{} cannot be read", self.kind);
                    unreadable.insert(w.key, u);
                }
            }
        }
        let mut index = self.index.write();
        index.replace_all(self.kind, fresh);
        index.replace_unreadable(self.kind, unreadable);
        None
    }

    fn synced(&self) -> bool {
        self.index.read().listed(self.kind)
    }
}

/// What the controller follows of a Cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ClusterView {
    /// Cluster API's pause holds it (`autoscaler::cluster_paused`).
    paused: bool,
    /// Its topology's entries that set replicas (`capi::topology`).
    topology_replicas: BTreeSet<topology::Entry>,
}

/// Reads a Cluster: its key and what the controller follows of it.
pub(crate) fn read_cluster(o: DynamicObject) -> (String, ClusterView) {
    let view = ClusterView {
        paused: autoscaler::cluster_paused(&o),
        topology_replicas: topology::entries_with_replicas(&o),
    };
    (object_key(&o), view)
}

/// The Clusters' watch: each Cluster's view, and their pause and topology set on the node
/// groups' index. A paused Cluster pauses its MachineDeployments for every Cluster API
/// controller, so it does here too; a topology entry that sets replicas takes its node group's
/// replicas from everyone else (`capi::topology`).
pub(crate) struct ClusterFeed {
    clusters: BTreeMap<String, ClusterView>,
    listed: bool,
    index: Arc<RwLock<MachineDeployments>>,
}

impl ClusterFeed {
    pub(crate) fn new(index: Arc<RwLock<MachineDeployments>>) -> Self {
        Self {
            clusters: BTreeMap::new(),
            listed: false,
            index,
        }
    }

    /// Sets what the Clusters say on the node groups' index; true when it changed.
    fn publish(&self) -> bool {
        let paused: BTreeSet<String> = (self.clusters.iter())
            .filter(|(_, c)| c.paused)
            .map(|(k, _)| k.clone())
            .collect();
        let topology = (self.clusters.iter())
            .filter(|(_, c)| !c.topology_replicas.is_empty())
            .map(|(k, c)| (k.clone(), c.topology_replicas.clone()))
            .collect();
        let mut index = self.index.write();
        let pause_changed = index.set_paused_clusters(paused.clone());
        let topology_changed = index.set_topology_replicas(topology);
        drop(index);
        if pause_changed {
            tracing::info!(paused = ?paused, "Cluster API pause changed");
        }
        if topology_changed {
            tracing::info!("ClusterClass topology replicas changed");
        }
        pause_changed || topology_changed
    }
}

impl Index<(String, ClusterView)> for ClusterFeed {
    type Kept = (String, ClusterView);
    type Listing = Vec<(String, ClusterView)>;
    /// Whether the pause or the topology replicas changed.
    type Changed = bool;

    fn keep(c: (String, ClusterView)) -> (String, ClusterView) {
        c
    }

    fn apply(&mut self, (key, view): (String, ClusterView)) -> bool {
        self.clusters.insert(key, view);
        self.publish()
    }

    fn delete(&mut self, (key, _): (String, ClusterView)) -> bool {
        self.clusters.remove(&key);
        self.publish()
    }

    fn reset(&mut self, all: Vec<(String, ClusterView)>) -> bool {
        self.clusters = all.into_iter().collect();
        self.listed = true;
        self.publish()
    }

    fn synced(&self) -> bool {
        self.listed
    }
}

/// A MachineSet of a MachineDeployment: its key, its MachineDeployment's key and the preflight
/// hold it reports. None for a set of no MachineDeployment, or one the model cannot read (a
/// set Cluster API could not read would hold nothing either).
pub(crate) type WatchedSet = Option<(String, String, Option<PreflightHold>)>;

/// Reads MachineSets at `v`.
pub(crate) fn read_set(v: CapiVersion) -> impl FnMut(DynamicObject) -> WatchedSet + Send {
    move |o| {
        let ms = match MachineSet::from_dynamic(&o, v) {
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
}

/// The preflight holds' change: the MachineDeployments whose hold changed.
impl Index<WatchedSet> for PreflightHolds {
    type Kept = WatchedSet;
    type Listing = Vec<WatchedSet>;
    type Changed = Vec<String>;

    fn keep(s: WatchedSet) -> WatchedSet {
        s
    }

    fn apply(&mut self, s: WatchedSet) -> Vec<String> {
        match s {
            Some((set, md, hold)) if self.set(&set, &md, hold.clone()) => vec![md],
            _ => Vec::new(),
        }
    }

    fn delete(&mut self, s: WatchedSet) -> Vec<String> {
        match s {
            Some((set, md, _)) if self.set(&set, &md, None) => vec![md],
            _ => Vec::new(),
        }
    }

    fn reset(&mut self, all: Vec<WatchedSet>) -> Vec<String> {
        let holding = all
            .into_iter()
            .flatten()
            .filter_map(|(set, md, hold)| Some((set, (md, hold?))))
            .collect();
        self.replace_all(holding)
    }

    fn synced(&self) -> bool {
        // Nothing waits on the preflight holds: a scale-up is held by them, never started.
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreadable() -> Unreadable {
        Unreadable {
            labels: BTreeMap::new(),
            error: "broken".into(),
        }
    }

    /// Each scalable kind's re-list replaces that kind alone, and says it was listed, even
    /// empty.
    #[test]
    fn a_kinds_relist_replaces_only_that_kind() {
        let index = Arc::new(RwLock::new(MachineDeployments::default()));
        let md = ScalableRef::new(ScalableKind::MachineDeployment, "ns", "md").key();
        let mp = ScalableRef::new(ScalableKind::MachinePool, "ns", "mp").key();
        index.write().mark_unreadable(md.clone(), unreadable());
        index.write().mark_unreadable(mp.clone(), unreadable());
        let mut pools = ScalableFeed::new(ScalableKind::MachinePool, index.clone());
        assert!(!Index::synced(&pools));
        assert_eq!(Index::reset(&mut pools, Vec::new()), None);
        assert!(Index::synced(&pools));
        assert!(index.read().unreadable().contains_key(&md));
        assert!(!index.read().unreadable().contains_key(&mp));
        let mut deployments = ScalableFeed::new(ScalableKind::MachineDeployment, index.clone());
        Index::reset(&mut deployments, Vec::new());
        assert!(index.read().unreadable().is_empty());
        assert!(index.read().synced());
    }
}
