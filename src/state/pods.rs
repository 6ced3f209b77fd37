//! Pods of the workload cluster: the provisionable ones (what the provisioner packs) and the
//! bound ones by node (what already uses each node's room).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::compact::Patched;
use super::shared::Shared;
use crate::api::resources::{Quantity, Resources};

mod summary;
pub(crate) use summary::PodSummary;

mod feed;
pub(crate) use feed::PodChange;

mod watched;
pub(crate) use watched::WatchedPod;

mod rules;
use rules::daemonset_of;
pub(crate) use rules::*;

/// One pod as the index keeps it. Provisionable pods stay whole (every solve reads them, and
/// there are few); every other pod is kept as the difference of its trimmed JSON from the first
/// pod of its family (`family`), a fraction of the memory of a `Pod` value (whose many optional
/// fields take room even when empty), and decoded when read. What the hot paths ask of every
/// bound pod is kept beside it, so they never decode.
struct Entry {
    stored: Stored,
    /// What a disruption pass reads of it.
    summary: PodSummary,
    /// The node it names. Unless it is terminal, it counts there: its requests are in
    /// `requested`. The name is shared with `by_node`'s key (one copy per node, not per pod).
    node: Option<Arc<str>>,
    /// What its next version's pod event is decided by (so a change never decodes this one).
    events: EventFacts,
    /// What it adds to its node's requests while it counts there (`adds`), taken off again
    /// when it changes or goes without decoding it. Shared by the pods of one template.
    added: Option<Arc<Resources>>,
    host_ports: bool,
    pod_terms: bool,
    /// The stored JSON lacks the pod's name (the key's) and its node name (`node`'s), which
    /// every patch against a family's prototype would otherwise carry a second copy of.
    detached: bool,
    /// The controlling DaemonSet's uid and the pod's creation time, for DaemonSet pods (boxed:
    /// few pods have one, and every entry of the table would pay its room).
    daemonset: Option<Box<(Box<str>, Option<Timestamp>)>>,
}

enum Stored {
    Whole(Arc<Pod>),
    Patched(Patched),
    /// The trimmed JSON, for a pod a merge patch cannot describe.
    Packed(Box<[u8]>),
}

impl Entry {
    /// The node it counts on (bound and not terminal).
    fn counted_node(&self) -> Option<&Arc<str>> {
        self.node.as_ref().filter(|_| !self.events.terminal())
    }

    fn pod(&self) -> Option<Arc<Pod>> {
        let decoded = match &self.stored {
            Stored::Whole(p) => return Some(p.clone()),
            Stored::Patched(p) => p.value().and_then(serde_json::from_value::<Pod>),
            Stored::Packed(bytes) => serde_json::from_slice::<Pod>(bytes),
        };
        // Bytes this index wrote from a `Pod`: decoding them fails only on a bug, and then the
        // pod is left out rather than the controller stopped.
        match decoded {
            Ok(mut p) => {
                self.attach(&mut p);
                Some(Arc::new(p))
            }
            Err(e) => {
                tracing::error!(error = %e, "a pod in the index could not be decoded");
                None
            }
        }
    }

    /// Puts back what [`detach`] took out of the stored JSON.
    fn attach(&self, p: &mut Pod) {
        if !self.detached {
            return;
        }
        let name = self.summary.key().split_once('/').map_or("", |(_, n)| n);
        p.metadata.name = Some(name.to_string());
        if let (Some(node), Some(spec)) = (&self.node, p.spec.as_mut()) {
            spec.node_name = Some(node.to_string());
        }
    }
}

/// Takes out of a pod's JSON what its entry keeps anyway: the name (in the key) and the node
/// name (`Entry::node`). The pods of a family differ from its prototype in both, so each patch
/// held them again (about a third of a simulated pod's patch, 60 of some 190 bytes). Only a
/// named pod is detached: its key then ends in its name, so [`Entry::attach`] restores it
/// exactly; false when nothing was taken.
fn detach(p: &Pod, value: &mut serde_json::Value) -> bool {
    if p.metadata.name.is_none() {
        return false;
    }
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.remove("name");
    }
    // `node_name` is what `Entry::node` keeps: only a non-empty one is taken out.
    if node_name(p).is_some()
        && let Some(spec) = value.get_mut("spec").and_then(|s| s.as_object_mut())
    {
        spec.remove("nodeName");
    }
    true
}

/// Pods alike enough to share a prototype: those of one controller (ReplicaSet, StatefulSet,
/// Job...), else those of one namespace with the same labels.
fn family(p: &Pod) -> String {
    let mut f = p.namespace().unwrap_or_default();
    f.push('\0');
    match p
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
    {
        Some(o) => f.push_str(&o.uid),
        None => {
            for (k, v) in p.labels() {
                f.push_str(k);
                f.push('=');
                f.push_str(v);
                f.push('\0');
            }
        }
    }
    f
}

/// What a pod adds to its node's requests: its effective requests and one `pods`.
fn adds(p: &Pod) -> Option<Resources> {
    let spec = p.spec.as_ref()?;
    let r = crate::scheduling::pod::pod_requests(spec).ok()?;
    Some(r.add(&Resources::new().with("pods", Quantity::from_units(1))))
}

/// A sum of requests per node, each kept as sorted pairs: a sum has a few resources, and a
/// `BTreeMap` takes room for eleven (at 5,000 nodes that room was a few MiB). The node's name is
/// the one `by_node` shares.
#[derive(Default)]
struct Sums(HashMap<Arc<str>, Box<[(String, Quantity)]>>);

impl Sums {
    fn get(&self, n: &str) -> Resources {
        self.0
            .get(n)
            .map(|pairs| Resources(pairs.iter().cloned().collect()))
            .unwrap_or_default()
    }

    fn add(&mut self, n: &Arc<str>, a: &Resources) {
        let mut sum = self.get(n);
        sum.add_assign(a);
        self.0.insert(n.clone(), sum.0.into_iter().collect());
    }

    /// Takes `a` from node `n`'s sum, dropping the sum once nothing is left.
    fn take(&mut self, n: &str, a: &Resources) {
        let Some(pairs) = self.0.get_mut(n) else {
            return;
        };
        let mut sum = Resources(pairs.iter().cloned().collect()).sub(a);
        sum.0.retain(|_, q| *q != Quantity::ZERO);
        if sum.0.is_empty() {
            self.0.remove(n);
        } else {
            *pairs = sum.0.into_iter().collect();
        }
    }

    fn remove(&mut self, n: &str) {
        self.0.remove(n);
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

#[derive(Default)]
pub(crate) struct Pods {
    /// Keys are shared by `by_key`, `provisionable` and `by_node` (one copy per pod).
    by_key: HashMap<Arc<str>, Entry>,
    provisionable: BTreeSet<Arc<str>>,
    by_node: HashMap<Arc<str>, BTreeSet<Arc<str>>>,
    /// Sum of `adds` of the pods counted on each node.
    requested: Sums,
    /// The DaemonSet pods' part of `requested`, for nodes that have any.
    daemon_requested: Sums,
    /// How many pods (pending or bound) have inter-pod constraints (`has_pod_terms`).
    with_terms: usize,
    /// Per DaemonSet uid, the key of its newest pod (upstream's `GetDaemonSetPod`).
    daemon_pods: HashMap<String, Arc<str>>,
    /// Per `family`, the JSON of its first pod, which its packed pods are stored against.
    prototypes: HashMap<Box<str>, Arc<serde_json::Value>>,
    /// How many prototypes were left by the last sweep of unused ones.
    prototypes_swept: usize,
    /// The label sets of the summaries, one copy each.
    labels: Shared<BTreeMap<String, String>>,
    /// The `added` requests of the entries, one copy each.
    requests: Shared<Resources>,
    synced: bool,
}

impl Pods {
    pub(crate) fn get(&self, key: &str) -> Option<Arc<Pod>> {
        self.by_key.get(key).and_then(Entry::pod)
    }

    pub(crate) fn contains(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    pub(crate) fn synced(&self) -> bool {
        self.synced
    }

    pub(crate) fn provisionable(&self) -> Vec<Arc<Pod>> {
        self.provisionable
            .iter()
            .filter_map(|k| self.get(k))
            .collect()
    }

    pub(crate) fn provisionable_count(&self) -> usize {
        self.provisionable.len()
    }

    /// Pods bound to a node and still running there.
    pub(crate) fn on_node(&self, node: &str) -> Vec<Arc<Pod>> {
        self.by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|k| self.get(k))
            .collect()
    }

    /// What [`Pods::on_node`] returns, as summaries (nothing decoded).
    pub(crate) fn summaries_on(&self, node: &str) -> Vec<&PodSummary> {
        self.by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|k| self.by_key.get(k))
            .map(|e| &e.summary)
            .collect()
    }

    /// How many pods on a node need a new home if it goes ([`is_reschedulable`]): what
    /// `karpenter_pods_disruption_initiated_total` adds when the node's claim is disrupted.
    pub(crate) fn reschedulable_on_node(&self, node: &str) -> usize {
        self.summaries_on(node)
            .iter()
            .filter(|p| p.is_reschedulable())
            .count()
    }

    /// The requests of the pods on a node (DaemonSet pods included), one `pods` each: what
    /// [`Pods::on_node`] would sum to, without decoding them.
    pub(crate) fn requested_on(&self, node: &str) -> Resources {
        self.requested.get(node)
    }

    /// The part of [`Pods::requested_on`] that is DaemonSet pods'.
    pub(crate) fn daemon_requested_on(&self, node: &str) -> Resources {
        self.daemon_requested.get(node)
    }

    pub(crate) fn bound(&self) -> Vec<Arc<Pod>> {
        self.bound_where(|_| true)
    }

    /// Bound pods holding host ports (decoding only those).
    pub(crate) fn bound_with_host_ports(&self) -> Vec<Arc<Pod>> {
        self.bound_where(|e| e.host_ports)
    }

    fn bound_where(&self, keep: impl Fn(&Entry) -> bool) -> Vec<Arc<Pod>> {
        self.by_node
            .values()
            .flatten()
            .filter_map(|k| self.by_key.get(k))
            .filter(|e| keep(e))
            .filter_map(Entry::pod)
            .collect()
    }

    /// The newest pod of the DaemonSet with this uid: what a new node will really run (a
    /// mutating webhook or LimitRange may have changed the template's requests).
    pub(crate) fn daemonset_pod(&self, uid: &str) -> Option<Arc<Pod>> {
        self.daemon_pods.get(uid).and_then(|k| self.get(k))
    }

    /// Re-points `uid`'s newest pod after one of its pods changed or went.
    fn newest_daemon_pod(&mut self, uid: &str) {
        let newest = self
            .by_key
            .iter()
            .filter_map(|(k, e)| {
                let (owner, created) = e.daemonset.as_deref()?;
                (**owner == *uid).then_some((created, k))
            })
            .max_by(|a, b| a.0.cmp(b.0).then_with(|| b.1.cmp(a.1)))
            .map(|(_, k)| k.clone());
        match newest {
            Some(k) => self.daemon_pods.insert(uid.to_string(), k),
            None => self.daemon_pods.remove(uid),
        };
    }

    /// Whether any pod has inter-pod constraints (then every bound pod matters to a solve).
    pub(crate) fn any_with_pod_terms(&self) -> bool {
        self.with_terms > 0
    }

    /// Apply one watched pod; true when it is (newly or still) provisionable.
    pub(crate) fn apply(&mut self, mut p: Pod) -> bool {
        super::trim::pod(&mut p);
        let k: Arc<str> = Arc::from(key(&p));
        let old = self.forget(&k).and_then(|e| e.daemonset);
        let provisionable = is_provisionable(&p);
        if provisionable {
            self.provisionable.insert(k.clone());
        }
        let events = EventFacts::of(&p);
        let named = node_name(&p).map(|n| self.node_key(n));
        let node = named.clone().filter(|_| !events.terminal());
        let daemonset = daemonset_of(&p).map(|uid| {
            let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            Box::new((Box::from(uid), created))
        });
        let added = node.as_ref().and_then(|_| adds(&p));
        let added = added.map(|a| self.requests.share(Arc::new(a)));
        if let Some(n) = &node {
            self.by_node.entry(n.clone()).or_default().insert(k.clone());
            if let Some(a) = &added {
                if daemonset.is_some() {
                    self.daemon_requested.add(n, a);
                }
                self.requested.add(n, a);
            }
        }
        let pod_terms = has_pod_terms(&p);
        self.with_terms += usize::from(pod_terms);
        let host_ports = has_host_ports(&p);
        let summary = PodSummary::new(k.clone(), &p, self.labels.share_ref(p.labels()));
        let (stored, detached) = match provisionable {
            true => (Stored::Whole(Arc::new(p)), false),
            false => self.pack(p),
        };
        if let Some((uid, created)) = daemonset.as_deref() {
            let newer = match self.daemon_pods.get::<str>(uid) {
                None => true,
                Some(known) if **known == *k => false,
                Some(known) => self
                    .by_key
                    .get(known)
                    .and_then(|e| e.daemonset.as_deref())
                    .is_none_or(|(_, at)| created > at),
            };
            if newer {
                self.daemon_pods.insert(uid.to_string(), k.clone());
            }
        }
        // The pod was its DaemonSet's newest and no longer belongs to it.
        let moved = old.filter(|o| daemonset.as_deref().is_none_or(|(u, _)| *u != o.0));
        self.by_key.insert(
            k.clone(),
            Entry {
                stored,
                summary,
                node: named,
                events,
                added,
                host_ports,
                pod_terms,
                detached,
                daemonset,
            },
        );
        if let Some(moved) = moved {
            self.newest_daemon_pod(&moved.0);
        }
        provisionable
    }

    /// A pod that is not provisionable, as the index stores it, and whether its name and node
    /// name were taken out ([`detach`]).
    fn pack(&mut self, p: Pod) -> (Stored, bool) {
        let Ok(mut value) = serde_json::to_value(&p) else {
            return (Stored::Whole(Arc::new(p)), false);
        };
        let detached = detach(&p, &mut value);
        if self.prototypes.len() >= (self.prototypes_swept * 2).max(64) {
            self.prototypes.retain(|_, v| Arc::strong_count(v) > 1);
            self.prototypes_swept = self.prototypes.len();
        }
        let proto = self
            .prototypes
            .entry(family(&p).into_boxed_str())
            .or_insert_with(|| Arc::new(value.clone()));
        match Patched::new(proto, &value) {
            Some(patched) => (Stored::Patched(patched), detached),
            None => match serde_json::to_vec(&value) {
                Ok(bytes) => (Stored::Packed(bytes.into_boxed_slice()), detached),
                Err(_) => (Stored::Whole(Arc::new(p)), false),
            },
        }
    }

    /// The shared name of a node: `by_node`'s key when the node has pods already.
    fn node_key(&self, n: &str) -> Arc<str> {
        self.by_node
            .get_key_value(n)
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| Arc::from(n))
    }

    /// Forget a pod; true when the index held it.
    pub(crate) fn remove(&mut self, k: &str) -> bool {
        let Some(old) = self.forget(k) else {
            return false;
        };
        if let Some((uid, _)) = old.daemonset.as_deref()
            && self.daemon_pods.get::<str>(uid).is_some_and(|n| **n == *k)
        {
            self.newest_daemon_pod(uid);
        }
        true
    }

    /// Drops a pod from every index but the DaemonSet one, returning its entry.
    fn forget(&mut self, k: &str) -> Option<Entry> {
        let old = self.by_key.remove(k)?;
        self.with_terms -= usize::from(old.pod_terms);
        self.provisionable.remove(k);
        if let Some(n) = old.counted_node() {
            if let Some(set) = self.by_node.get_mut(n) {
                set.remove(k);
                if set.is_empty() {
                    self.by_node.remove(n);
                }
            }
            if self.by_node.contains_key(n) {
                if let Some(a) = old.added.as_deref() {
                    self.requested.take(n, a);
                    if old.daemonset.is_some() {
                        self.daemon_requested.take(n, a);
                    }
                }
            } else {
                self.requested.remove(n);
                self.daemon_requested.remove(n);
            }
        }
        Some(old)
    }

    /// What decides the pod events of the pod under `key` (nothing decoded).
    pub(crate) fn events_of(&self, key: &str) -> Option<&EventFacts> {
        self.by_key.get(key).map(|e| &e.events)
    }

    /// Every pod that names a node (terminal ones too), through `f` with its key, its node and
    /// what decides its pod events (nothing decoded).
    pub(crate) fn each_on_a_node<T>(
        &self,
        mut f: impl FnMut(&str, &str, &EventFacts) -> Option<T>,
    ) -> Vec<T> {
        self.by_key
            .iter()
            .filter_map(|(k, e)| f(k, e.node.as_deref()?, &e.events))
            .collect()
    }

    /// Take the contents of an index built from a fresh list (it is then synced).
    pub(crate) fn replace_with(&mut self, fresh: Pods) {
        *self = Pods {
            synced: true,
            ..fresh
        };
    }

    pub(crate) fn replace_all(&mut self, pods: Vec<Pod>) {
        self.by_key.clear();
        self.provisionable.clear();
        self.by_node.clear();
        self.requested.clear();
        self.daemon_requested.clear();
        self.with_terms = 0;
        self.daemon_pods.clear();
        self.prototypes.clear();
        self.prototypes_swept = 0;
        self.labels.clear();
        self.requests.clear();
        for p in pods {
            self.apply(p);
        }
        self.synced = true;
    }
}

#[cfg(test)]
mod tests;
