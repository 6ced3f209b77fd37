//! Machines and MachineDeployments of the management cluster, indexed the ways the actors ask:
//! by MachineDeployment, by the NodeClaim a Machine is bound to, and by provider ID.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

pub(crate) mod feed;

use super::shared::Shared;
use super::versions::Freshness;
use crate::api::wellknown::NODECLAIM_ANNOTATION;
use crate::capi::model::{Machine, MachineDeployment};
use crate::capi::scalable::{ScalableKind, ScalableRef};

/// `namespace/name`, the one way this crate names a namespaced Cluster API object.
pub(crate) fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The NodeClaim a Machine is bound to, from the durable annotation (invariant 1).
pub(crate) fn bound_claim(m: &Machine) -> Option<&str> {
    m.annotations
        .get(NODECLAIM_ANNOTATION)
        .map(String::as_str)
        .filter(|c| !c.is_empty())
}

/// Carries the member label but no binding of ours: claimed by another provisioner (the Go
/// Cluster API provider labels the Machines it binds and names them on the claim).
pub(crate) fn claimed_elsewhere(m: &Machine) -> bool {
    m.labels.contains_key(crate::api::wellknown::MEMBER_LABEL) && bound_claim(m).is_none()
}

/// Claimed by another provisioner that has marked it `cluster.x-k8s.io/delete-machine`: the
/// Go provider marks, then decrements, so its replica is already gone (or about to go) and the
/// Machine is Cluster API's to remove; counting or marking it again would remove a second one.
pub(crate) fn released_elsewhere(m: &Machine) -> bool {
    claimed_elsewhere(m)
        && m.annotations
            .contains_key(crate::api::wellknown::DELETE_MACHINE_ANNOTATION)
}

/// The key of a Machine's MachineDeployment or MachinePool (`ScalableRef::key`), when it
/// belongs to one.
pub(crate) fn deployment_key(m: &Machine) -> Option<String> {
    m.scalable().map(|s| s.key())
}

#[derive(Default)]
pub(crate) struct Machines {
    by_key: HashMap<String, Arc<Machine>>,
    /// The Machines of each MachineDeployment (or MachinePool) in [`Turn`] order, kept so on
    /// every change: the Scaler and the disruption pass read them on every replan and pass,
    /// and sorting a copy each time was most of a burst's replan on a real control plane.
    by_md: HashMap<String, BTreeMap<Turn, Arc<Machine>>>,
    /// claim name -> machine keys naming it (more than one is an invariant violation).
    by_claim: HashMap<String, BTreeSet<String>>,
    by_provider_id: HashMap<String, String>,
    /// When each Machine's provider ID was first observed (for the provider-ID-to-claim metric).
    provider_id_seen: HashMap<String, Instant>,
    /// One copy of each label set the Machines carry (those of one MachineSet are alike).
    labels: Shared<BTreeMap<String, String>>,
    fresh: Freshness,
    synced: bool,
}

/// How many provider-ID times of Machines that are gone may be kept beyond the live ones'
/// before they are swept.
const PROVIDER_ID_SEEN_SLACK: usize = 64;

impl Machines {
    pub(crate) fn provider_id_seen(&self, key: &str) -> Option<Instant> {
        self.provider_id_seen.get(key).copied()
    }

    pub(crate) fn get(&self, key: &str) -> Option<Arc<Machine>> {
        self.by_key.get(key).cloned()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub(crate) fn synced(&self) -> bool {
        self.synced
    }

    /// Machines of one MachineDeployment, oldest first (ties by name), so FIFO binding is stable.
    pub(crate) fn of_deployment(&self, md_key: &str) -> Vec<&Machine> {
        self.keyed_of_deployment(md_key).map(|(_, m)| m).collect()
    }

    /// [`Machines::of_deployment`] with each Machine's key, borrowed from the index: the
    /// Scaler's plan reads them on every change, and formatting each key again was a good part
    /// of a burst's re-plans.
    pub(crate) fn keyed_of_deployment(
        &self,
        md_key: &str,
    ) -> impl Iterator<Item = (&str, &Machine)> {
        self.by_md
            .get(md_key)
            .into_iter()
            .flat_map(BTreeMap::iter)
            .map(|(turn, m)| (turn.key.as_str(), &**m))
    }

    /// The Machine bound to a claim, if exactly one is; `Err` lists them when several are.
    pub(crate) fn bound_to(&self, claim: &str) -> Result<Option<Arc<Machine>>, Vec<String>> {
        let Some(keys) = self.by_claim.get(claim) else {
            return Ok(None);
        };
        match keys.len() {
            0 => Ok(None),
            1 => Ok(keys.iter().next().and_then(|k| self.by_key.get(k).cloned())),
            _ => Err(keys.iter().cloned().collect()),
        }
    }

    pub(crate) fn by_provider_id(&self, provider_id: &str) -> Option<Arc<Machine>> {
        self.by_provider_id
            .get(provider_id)
            .and_then(|k| self.by_key.get(k).cloned())
    }

    /// Apply one watched object unless a write response of ours is ahead of it (see
    /// `versions`); returns the previous version.
    pub(crate) fn apply(&mut self, m: Machine) -> Option<Arc<Machine>> {
        let k = key(&m.namespace, &m.name);
        if !self.fresh.watched(&k, &m.resource_version) {
            return self.by_key.get(&k).cloned();
        }
        self.insert(k, m)
    }

    /// Apply the answer of our own write or read, unless the watch already delivered it (then
    /// the index may hold something newer).
    pub(crate) fn apply_response(&mut self, m: Machine) -> Option<Arc<Machine>> {
        let k = key(&m.namespace, &m.name);
        if !self.fresh.responded(&k, &m.resource_version) {
            return self.by_key.get(&k).cloned();
        }
        self.insert(k, m)
    }

    fn insert(&mut self, k: String, mut m: Machine) -> Option<Arc<Machine>> {
        m.labels = self.share_labels(m.labels);
        if m.provider_id.is_some() {
            self.provider_id_seen
                .entry(k.clone())
                .or_insert_with(Instant::now);
        }
        let old = self.detach(&k);
        let m = Arc::new(m);
        if let Some(md) = deployment_key(&m) {
            self.by_md
                .entry(md)
                .or_default()
                .insert(Turn::of(&m, &k), m.clone());
        }
        if let Some(claim) = bound_claim(&m) {
            self.by_claim
                .entry(claim.to_string())
                .or_default()
                .insert(k.clone());
        }
        if let Some(pid) = m.provider_id.as_deref() {
            self.by_provider_id.insert(pid.to_string(), k.clone());
        }
        self.by_key.insert(k, m);
        old
    }

    /// The index's copy of `labels`, kept from now on if it has none (see [`Shared`]).
    pub(crate) fn share_labels(
        &mut self,
        labels: Arc<BTreeMap<String, String>>,
    ) -> Arc<BTreeMap<String, String>> {
        self.labels.share(labels)
    }

    pub(crate) fn remove(&mut self, k: &str) -> Option<Arc<Machine>> {
        self.fresh.forget(k);
        self.detach(k)
    }

    /// Take a Machine out of every index (before re-inserting it, or for good).
    fn detach(&mut self, k: &str) -> Option<Arc<Machine>> {
        let old = self.by_key.remove(k)?;
        // Times of Machines that are gone are dropped in one pass once they are as many as
        // the live ones (and `k`'s kept: it may be re-inserted). A pass on every detach cost a
        // hash of every key on every Machine update once all had provider IDs: quadratic in a
        // burst.
        if self.provider_id_seen.len() > 2 * self.by_key.len() + PROVIDER_ID_SEEN_SLACK {
            self.provider_id_seen
                .retain(|key, _| key == k || self.by_key.contains_key(key));
        }
        if let Some(md) = deployment_key(&old)
            && let Some(of_md) = self.by_md.get_mut(&md)
        {
            of_md.remove(&Turn::of(&old, k));
            if of_md.is_empty() {
                self.by_md.remove(&md);
            }
        }
        if let Some(claim) = bound_claim(&old) {
            prune(&mut self.by_claim, claim, k);
        }
        if let Some(pid) = old.provider_id.as_deref()
            && self.by_provider_id.get(pid).map(String::as_str) == Some(k)
        {
            self.by_provider_id.remove(pid);
        }
        Some(old)
    }

    /// Replace everything after a (re-)list; returns the keys that disappeared.
    pub(crate) fn replace_all(&mut self, machines: Vec<Machine>) -> Vec<Arc<Machine>> {
        let mut old = std::mem::take(&mut self.by_key);
        self.by_md.clear();
        self.by_claim.clear();
        self.by_provider_id.clear();
        self.fresh.clear();
        for m in machines {
            old.remove(&key(&m.namespace, &m.name));
            self.apply(m);
        }
        self.synced = true;
        self.provider_id_seen
            .retain(|k, _| self.by_key.contains_key(k));
        // What the list left out was deleted meanwhile: late answers must not bring it back.
        for k in old.keys() {
            self.fresh.forget(k);
        }
        old.into_values().collect()
    }

    /// Objects the freshness bookkeeping tracks (tests check it shrinks with the index).
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.fresh.len()
    }
}

/// A Machine's place among its MachineDeployment's: oldest first, then by name. Its key
/// (`namespace/name`) orders as its name does, since a MachineDeployment's Machines share its
/// namespace, and is kept here for readers that need it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Turn {
    created: Option<jiff::Timestamp>,
    key: String,
}

impl Turn {
    fn of(m: &Machine, key: &str) -> Self {
        Self {
            created: m.creation_timestamp,
            key: key.to_string(),
        }
    }
}

fn prune(index: &mut HashMap<String, BTreeSet<String>>, bucket: &str, k: &str) {
    if let Some(set) = index.get_mut(bucket) {
        set.remove(k);
        if set.is_empty() {
            index.remove(bucket);
        }
    }
}

#[derive(Default)]
pub struct MachineDeployments {
    by_key: HashMap<String, Arc<MachineDeployment>>,
    /// MachineDeployments the model cannot read, by key: kept (not dropped with a log line) so
    /// a NodeClass that selects them can say so, and so an edit that breaks one removes what
    /// was read of it before.
    unreadable: BTreeMap<String, Unreadable>,
    fresh: Freshness,
    synced: bool,
    /// The kinds whose list has completed at least once: MachinePools are listed by a watch of
    /// their own, started after discovery, so `synced` (MachineDeployments) says nothing of them.
    listed: BTreeSet<ScalableKind>,
    /// Clusters (`namespace/name`) Cluster API's pause holds (see `autoscaler::cluster_paused`).
    paused_clusters: BTreeSet<String>,
    /// By Cluster (`namespace/name`), the topology entries that set replicas (see
    /// `capi::topology`).
    topology_replicas: BTreeMap<String, BTreeSet<crate::capi::topology::Entry>>,
}

/// A MachineDeployment the model could not read: its labels (what a NodeClass selects by) and
/// why.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Unreadable {
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) error: String,
}

impl MachineDeployments {
    pub(crate) fn get(&self, key: &str) -> Option<Arc<MachineDeployment>> {
        self.by_key.get(key).cloned()
    }

    /// Whether Cluster API leaves `md` alone: its own pause, or its Cluster's.
    pub(crate) fn paused(&self, md: &MachineDeployment) -> bool {
        crate::capi::autoscaler::paused(md) || self.cluster_paused(md)
    }

    /// Whether `md`'s Cluster is paused.
    pub fn cluster_paused(&self, md: &MachineDeployment) -> bool {
        !self.paused_clusters.is_empty()
            && self
                .paused_clusters
                .contains(&format!("{}/{}", md.namespace, md.cluster_name))
    }

    /// The paused Clusters become exactly `paused`; true when that changed anything.
    pub(crate) fn set_paused_clusters(&mut self, paused: BTreeSet<String>) -> bool {
        let changed = self.paused_clusters != paused;
        self.paused_clusters = paused;
        changed
    }

    /// Why `md`'s replicas belong to its Cluster's topology, not to the controller (None when
    /// they do not).
    pub fn replicas_held(&self, md: &MachineDeployment) -> Option<String> {
        let set = self
            .topology_replicas
            .get(&format!("{}/{}", md.namespace, md.cluster_name))?;
        crate::capi::topology::replicas_held(md, set)
    }

    /// Whether Cluster API leaves `md`'s replicas to the controller: not paused, and not held
    /// by a topology. The one rule every replica write asks.
    pub(crate) fn writable(&self, md: &MachineDeployment) -> bool {
        !self.paused(md) && self.replicas_held(md).is_none()
    }

    /// The topologies' entries that set replicas become exactly `entries` (Clusters without
    /// any left out); true when that changed anything.
    pub(crate) fn set_topology_replicas(
        &mut self,
        entries: BTreeMap<String, BTreeSet<crate::capi::topology::Entry>>,
    ) -> bool {
        let changed = self.topology_replicas != entries;
        self.topology_replicas = entries;
        changed
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<MachineDeployment>> {
        self.by_key.values()
    }

    pub(crate) fn synced(&self) -> bool {
        self.synced
    }

    /// The objects of `kind` have been listed at least once: one missing from the index is
    /// gone, not merely not listed yet.
    pub(crate) fn listed(&self, kind: ScalableKind) -> bool {
        self.listed.contains(&kind)
    }

    /// Apply a watched object unless a write response of ours is ahead of it.
    pub(crate) fn apply(&mut self, md: MachineDeployment) -> Arc<MachineDeployment> {
        let k = md.key();
        let take = self.fresh.watched(&k, &md.resource_version);
        self.take_if(take, k, md)
    }

    /// Apply the answer of the Scaler's own write or read: it sends one at a time, so each
    /// answer is newer than its last (see `Freshness::superseded`).
    pub(crate) fn apply_own_response(&mut self, md: MachineDeployment) -> Arc<MachineDeployment> {
        let k = md.key();
        let take = self.fresh.superseded(&k, &md.resource_version);
        self.take_if(take, k, md)
    }

    fn take_if(&mut self, take: bool, k: String, md: MachineDeployment) -> Arc<MachineDeployment> {
        if !take && let Some(cur) = self.by_key.get(&k) {
            return cur.clone();
        }
        self.unreadable.remove(&k);
        let md = Arc::new(md);
        self.by_key.insert(k, md.clone());
        md
    }

    pub(crate) fn remove(&mut self, k: &str) -> Option<Arc<MachineDeployment>> {
        self.fresh.forget(k);
        self.unreadable.remove(k);
        self.by_key.remove(k)
    }

    /// The watch delivered a version of `k` the model cannot read: what was read of it before
    /// no longer stands.
    pub(crate) fn mark_unreadable(
        &mut self,
        k: String,
        u: Unreadable,
    ) -> Option<Arc<MachineDeployment>> {
        self.fresh.forget(&k);
        let old = self.by_key.remove(&k);
        self.unreadable.insert(k, u);
        old
    }

    /// The MachineDeployments the model cannot read, by key.
    pub(crate) fn unreadable(&self) -> &BTreeMap<String, Unreadable> {
        &self.unreadable
    }

    /// After a re-list of `kind`: these are its unreadable ones now (the other kind's stand).
    pub(crate) fn replace_unreadable(
        &mut self,
        kind: ScalableKind,
        all: BTreeMap<String, Unreadable>,
    ) {
        self.unreadable
            .retain(|k, _| ScalableRef::parse(k).is_some_and(|r| r.kind != kind));
        self.unreadable.extend(all);
    }

    /// Replaces every object of `kind` (MachineDeployments and MachinePools are listed by
    /// separate watches); returns the ones that went.
    pub(crate) fn replace_all(
        &mut self,
        kind: ScalableKind,
        mds: Vec<MachineDeployment>,
    ) -> Vec<Arc<MachineDeployment>> {
        let (mut old, others): (HashMap<_, _>, HashMap<_, _>) = std::mem::take(&mut self.by_key)
            .into_iter()
            .partition(|(_, md)| md.kind == kind);
        self.by_key = others;
        for k in old.keys() {
            self.fresh.forget(k);
        }
        for md in mds {
            old.remove(&md.key());
            self.apply(md);
        }
        if kind == ScalableKind::MachineDeployment {
            self.synced = true;
        }
        self.listed.insert(kind);
        old.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::version::CapiVersion;
    use serde_json::json;

    fn machine(rv: &str, claim: Option<&str>) -> Machine {
        let mut annotations = serde_json::Map::new();
        if let Some(c) = claim {
            annotations.insert(NODECLAIM_ANNOTATION.to_string(), json!(c));
        }
        let v = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {
                "name": "m", "namespace": "ns", "uid": "u", "resourceVersion": rv,
                "labels": {"cluster.x-k8s.io/deployment-name": "md"},
                "annotations": annotations,
            },
            "spec": {"clusterName": "c", "bootstrap": {}, "infrastructureRef": {"apiGroup": "infra", "kind": "K", "name": "t"}},
        });
        Machine::from_value(&v, CapiVersion::V1Beta2).expect("test machine")
    }

    #[test]
    fn a_stale_watch_event_never_undoes_our_write_whatever_the_versions_look_like() {
        for (ours, stale) in [("x2", "x1"), ("9", "10")] {
            let mut idx = Machines::default();
            idx.apply(machine("1", None));
            idx.apply_response(machine(ours, Some("claim-a")));
            // The watch is still delivering what happened before our bind.
            idx.apply(machine(stale, None));
            assert_eq!(
                idx.bound_to("claim-a")
                    .ok()
                    .flatten()
                    .map(|m| m.resource_version.clone()),
                Some(ours.to_string()),
                "{ours} then stale {stale}"
            );
            idx.apply(machine(ours, Some("claim-a")));
            idx.apply(machine("newer", None));
            assert_eq!(
                idx.bound_to("claim-a"),
                Ok(None),
                "newer events apply again"
            );
        }
    }

    #[test]
    fn machines_with_the_same_labels_share_one_copy() {
        let mut idx = Machines::default();
        let mut other = machine("1", None);
        other.name = "m2".into();
        idx.apply(machine("1", None));
        idx.apply(other);
        let labels = |k: &str| idx.get(k).map(|m| m.labels.clone());
        let (a, b) = (labels("ns/m"), labels("ns/m2"));
        assert!(a.zip(b).is_some_and(|(a, b)| Arc::ptr_eq(&a, &b)));
        assert_eq!(
            idx.get("ns/m2").and_then(|m| m.deployment_name.clone()),
            Some("md".to_string())
        );
    }

    /// Provider-ID times of deleted Machines are swept, in bulk: updates of live Machines
    /// keep every time (the metric reads them once the claim learns its provider ID), and the
    /// times kept never outnumber twice the live Machines plus the slack.
    #[test]
    fn provider_id_times_survive_updates_and_are_swept_after_deletions() {
        let mut idx = Machines::default();
        let with_pid = |name: &str, rv: &str| {
            let mut m = member(name, "md", 1);
            m.resource_version = rv.into();
            m.provider_id = Some(format!("sim://{name}"));
            m
        };
        let n = 200;
        for i in 0..n {
            idx.apply(with_pid(&format!("m{i}"), "1"));
        }
        let first = idx.provider_id_seen("ns/m0");
        for i in 0..n {
            idx.apply(with_pid(&format!("m{i}"), "2"));
        }
        assert_eq!(
            idx.provider_id_seen("ns/m0"),
            first,
            "an update keeps the time"
        );
        assert_eq!(idx.provider_id_seen.len(), n);
        for i in 0..n - 10 {
            idx.remove(&format!("ns/m{i}"));
            assert!(
                idx.provider_id_seen.len() <= 2 * idx.by_key.len() + PROVIDER_ID_SEEN_SLACK + 1
            );
        }
        assert!(idx.provider_id_seen(&format!("ns/m{}", n - 1)).is_some());
    }

    /// MachinePools are listed by a watch of their own, after MachineDeployments: until their
    /// list completes, no pool counts as gone.
    #[test]
    fn each_scalable_kind_says_when_it_was_listed() {
        let mut mds = MachineDeployments::default();
        mds.replace_all(ScalableKind::MachineDeployment, Vec::new());
        assert!(mds.synced() && mds.listed(ScalableKind::MachineDeployment));
        assert!(!mds.listed(ScalableKind::MachinePool));
        mds.replace_all(ScalableKind::MachinePool, Vec::new());
        assert!(mds.listed(ScalableKind::MachinePool));
    }

    /// A Machine of MachineDeployment `md`, created at `created` (seconds).
    fn member(name: &str, md: &str, created: i64) -> Machine {
        let mut m = machine("1", None);
        m.name = name.into();
        m.deployment_name = Some(md.into());
        m.creation_timestamp = jiff::Timestamp::from_second(created).ok();
        m
    }

    fn names(idx: &Machines, md: &str) -> Vec<String> {
        idx.of_deployment(md)
            .iter()
            .map(|m| m.name.clone())
            .collect()
    }

    #[test]
    fn machines_of_a_deployment_stay_oldest_first_through_apply_delete_and_relist() {
        let mut idx = Machines::default();
        for (name, created) in [("c", 20), ("b", 10), ("a", 20), ("d", 5)] {
            idx.apply(member(name, "md", created));
        }
        idx.apply(member("x", "other", 1));
        // Oldest first, ties by name.
        assert_eq!(names(&idx, "ns/md"), ["d", "b", "a", "c"]);
        // An update keeps one entry in its place, and reads back new.
        let mut updated = member("b", "md", 10);
        updated.resource_version = "2".into();
        updated.provider_id = Some("p://b".into());
        idx.apply(updated);
        assert_eq!(names(&idx, "ns/md"), ["d", "b", "a", "c"]);
        assert!(idx.of_deployment("ns/md")[1].provider_id.is_some());
        // A Machine that moves to another MachineDeployment leaves the first.
        idx.apply(member("a", "other", 20));
        assert_eq!(names(&idx, "ns/md"), ["d", "b", "c"]);
        assert_eq!(names(&idx, "ns/other"), ["x", "a"]);
        idx.remove("ns/d");
        assert_eq!(names(&idx, "ns/md"), ["b", "c"]);
        // A re-list keeps only what it lists, in order.
        idx.replace_all(vec![member("e", "md", 30), member("c", "md", 20)]);
        assert_eq!(names(&idx, "ns/md"), ["c", "e"]);
        assert!(idx.of_deployment("ns/other").is_empty());
        idx.remove("ns/c");
        idx.remove("ns/e");
        assert!(idx.by_md.is_empty(), "no empty MachineDeployment is kept");
    }

    #[test]
    fn removing_and_relisting_forget_the_version_bookkeeping() {
        let mut idx = Machines::default();
        idx.apply_response(machine("5", Some("c")));
        idx.remove("ns/m");
        assert_eq!(idx.tracked(), 0);
        idx.apply(machine("6", None));
        idx.replace_all(Vec::new());
        assert_eq!(idx.tracked(), 0);
        assert!(idx.is_empty());
    }
}
