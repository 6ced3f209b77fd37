//! Compact forms of the watched objects the large indexes keep. A k8s-openapi value costs two
//! to three times its JSON: every label is two `String`s in a B-tree, every optional field takes
//! room when empty. Thousands of Nodes repeat the same label keys and values, and the same
//! quantities, so the compact forms share those strings ([`intern`]) and keep the rest of the
//! object (what no hot path reads field by field) as its JSON, decoded when the whole object is
//! asked for. Rebuilding gives back exactly the trimmed object that went in (the tests check
//! it), so every reader decides as before.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, LazyLock};

use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use parking_lot::Mutex;

use crate::api::resources::Resources;

/// The shared strings. Entries no object holds any more are dropped whenever the set has
/// doubled since the last sweep, so churn (pods come and go with their labels) cannot grow it
/// for ever.
struct Strings {
    set: HashSet<Arc<str>>,
    after_sweep: usize,
}

/// Below this many entries the set is never swept: a sweep costs a pass over it.
const SWEEP_FLOOR: usize = 4096;

static STRINGS: LazyLock<Mutex<Strings>> = LazyLock::new(|| {
    Mutex::new(Strings {
        set: HashSet::new(),
        after_sweep: 0,
    })
});

/// The one shared copy of `s`.
pub(crate) fn intern(s: &str) -> Arc<str> {
    let mut strings = STRINGS.lock();
    if let Some(shared) = strings.set.get(s) {
        return shared.clone();
    }
    if strings.set.len() >= (strings.after_sweep * 2).max(SWEEP_FLOOR) {
        strings.set.retain(|s| Arc::strong_count(s) > 1);
        strings.after_sweep = strings.set.len();
    }
    let shared: Arc<str> = Arc::from(s);
    strings.set.insert(shared.clone());
    shared
}

/// A string map (labels, annotations, resource lists) with shared keys and values, sorted by
/// key as the `BTreeMap` it came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StrMap(Box<[(Arc<str>, Arc<str>)]>);

impl StrMap {
    pub(crate) fn new(map: &BTreeMap<String, String>) -> StrMap {
        StrMap(map.iter().map(|(k, v)| (intern(k), intern(v))).collect())
    }

    fn of_quantities(map: &BTreeMap<String, K8sQuantity>) -> StrMap {
        StrMap(map.iter().map(|(k, v)| (intern(k), intern(&v.0))).collect())
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn to_map(&self) -> BTreeMap<String, String> {
        self.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn to_quantities(&self) -> BTreeMap<String, K8sQuantity> {
        self.iter()
            .map(|(k, v)| (k.to_string(), K8sQuantity(v.to_string())))
            .collect()
    }
}

/// What an absent map reads as.
static NO_STRINGS: LazyLock<StrMap> = LazyLock::new(StrMap::default);

/// JSON of what is left of an object once its compact fields are taken out; nothing when that
/// is the empty object itself (most Nodes and pods leave little). Compared as a value, so an
/// empty rest costs no serialising at all (this runs on every Node event).
fn pack<T: serde::Serialize + Default + PartialEq>(rest: &T) -> Option<Box<[u8]>> {
    if *rest == T::default() {
        return None;
    }
    serde_json::to_vec(rest).ok().map(Vec::into_boxed_slice)
}

/// Decodes what [`pack`] wrote. The bytes were written here from the same type, so a failure
/// is a bug: it is logged and the object rebuilt from its compact fields alone rather than the
/// controller stopped.
fn unpack<T: serde::de::DeserializeOwned + Default>(bytes: Option<&[u8]>, kind: &str) -> T {
    let Some(bytes) = bytes else {
        return T::default();
    };
    serde_json::from_slice(bytes).unwrap_or_else(|e| {
        tracing::error!(error = %e, kind, "a compact object in an index could not be decoded");
        T::default()
    })
}

/// A trimmed Node (`trim::node`) as the Node index keeps it: the fields the solver snapshot,
/// the disruption pass and a settled claim's reconcile read on every pass in place, the rest as
/// JSON.
#[derive(Debug)]
pub struct CompactNode {
    name: Arc<str>,
    /// Read from the rest, which keeps them too: the `Ready` condition is True; the finalizers;
    /// the UIDs of the owners.
    ready: bool,
    finalizers: Box<[Arc<str>]>,
    owner_uids: Box<[Box<str>]>,
    labels: Option<StrMap>,
    annotations: Option<StrMap>,
    provider_id: Option<Box<str>>,
    taints: Option<Box<[Taint]>>,
    unschedulable: Option<bool>,
    deletion_timestamp: Option<Time>,
    allocatable: Option<StrMap>,
    rest: Option<Box<[u8]>>,
}

impl CompactNode {
    /// Compacts a Node (trimmed first: the index keeps nothing `trim::node_body` drops; which
    /// conditions it keeps is the watch's choice, `trim::node_keeping`).
    pub(crate) fn new(mut n: Node) -> CompactNode {
        super::trim::node_body(&mut n);
        let meta = &mut n.metadata;
        let name = intern_or_new(meta.name.take().unwrap_or_default());
        let finalizers = meta
            .finalizers
            .iter()
            .flatten()
            .map(|f| intern(f))
            .collect();
        let owner_uids = (meta.owner_references.iter().flatten())
            .map(|o| Box::from(o.uid.as_str()))
            .collect();
        let labels = meta.labels.take().map(|m| StrMap::new(&m));
        let annotations = meta.annotations.take().map(|m| StrMap::new(&m));
        let deletion_timestamp = meta.deletion_timestamp.take();
        let (provider_id, taints, unschedulable) = match n.spec.as_mut() {
            Some(s) => (
                s.provider_id.take().map(String::into_boxed_str),
                s.taints.take().map(Vec::into_boxed_slice),
                s.unschedulable.take(),
            ),
            None => (None, None, None),
        };
        let allocatable = n
            .status
            .as_mut()
            .and_then(|s| s.allocatable.take())
            .map(|a| StrMap::of_quantities(&a));
        let ready = (n.status.as_ref().and_then(|s| s.conditions.as_ref()))
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        CompactNode {
            name,
            ready,
            finalizers,
            owner_uids,
            labels,
            annotations,
            provider_id,
            taints,
            unschedulable,
            deletion_timestamp,
            allocatable,
            rest: pack(&n),
        }
    }

    /// The trimmed Node that went in.
    pub(crate) fn node(&self) -> Node {
        let mut n: Node = unpack(self.rest.as_deref(), "Node");
        let meta = &mut n.metadata;
        meta.name = Some(self.name.to_string());
        meta.labels = self.labels.as_ref().map(StrMap::to_map);
        meta.annotations = self.annotations.as_ref().map(StrMap::to_map);
        meta.deletion_timestamp = self.deletion_timestamp.clone();
        if self.provider_id.is_some() || self.taints.is_some() || self.unschedulable.is_some() {
            let spec = n.spec.get_or_insert_default();
            spec.provider_id = self.provider_id.as_deref().map(String::from);
            spec.taints = self.taints.as_deref().map(<[Taint]>::to_vec);
            spec.unschedulable = self.unschedulable;
        }
        if let Some(a) = &self.allocatable {
            n.status.get_or_insert_default().allocatable = Some(a.to_quantities());
        }
        n
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The shared name (the index's key).
    pub(super) fn shared_name(&self) -> &Arc<str> {
        &self.name
    }

    pub(crate) fn labels(&self) -> &StrMap {
        self.labels.as_ref().unwrap_or(&NO_STRINGS)
    }

    pub(crate) fn annotations(&self) -> &StrMap {
        self.annotations.as_ref().unwrap_or(&NO_STRINGS)
    }

    /// `spec.providerID`, unless empty.
    pub(crate) fn provider_id(&self) -> Option<&str> {
        self.provider_id.as_deref().filter(|p| !p.is_empty())
    }

    pub(crate) fn taints(&self) -> &[Taint] {
        self.taints.as_deref().unwrap_or_default()
    }

    pub(crate) fn unschedulable(&self) -> bool {
        self.unschedulable.unwrap_or(false)
    }

    pub(crate) fn deleting(&self) -> bool {
        self.deletion_timestamp.is_some()
    }

    /// The `Ready` condition is True.
    pub(crate) fn ready(&self) -> bool {
        self.ready
    }

    pub(crate) fn has_finalizer(&self, finalizer: &str) -> bool {
        self.finalizers.iter().any(|f| **f == *finalizer)
    }

    pub(crate) fn owned_by(&self, uid: &str) -> bool {
        self.owner_uids.iter().any(|u| **u == *uid)
    }

    /// `status.allocatable`; empty when absent or unreadable, as the solver took it before.
    pub(crate) fn allocatable(&self) -> Resources {
        self.allocatable
            .as_ref()
            .and_then(|a| Resources::from_k8s(&a.to_quantities()).ok())
            .unwrap_or_default()
    }
}

/// An object kept as the JSON merge patch (RFC 7386) that turns a shared prototype into it:
/// the pods of one ReplicaSet (or of one set of labels) differ in a few fields (name, uid,
/// node, times), so each keeps only those, about a quarter of its JSON.
#[derive(Debug)]
pub(crate) struct Patched {
    proto: Arc<serde_json::Value>,
    patch: Box<[u8]>,
}

impl Patched {
    /// `value` against `proto`; None when a merge patch cannot say it: a `null` anywhere in
    /// the object, which a merge patch reads as "remove". Any other object is said exactly
    /// ([`merge_diff`] replaces what is not an object on either side and removes what `value`
    /// lacks), so the patch is not applied to check it: that cost a clone of the prototype on
    /// every pod change.
    pub(crate) fn new(
        proto: &Arc<serde_json::Value>,
        value: &serde_json::Value,
    ) -> Option<Patched> {
        if has_null(value) {
            return None;
        }
        let patch = merge_diff(proto, value).unwrap_or_else(|| serde_json::json!({}));
        Some(Patched {
            proto: proto.clone(),
            patch: serde_json::to_vec(&patch).ok()?.into_boxed_slice(),
        })
    }

    /// The object that went in.
    pub(crate) fn value(&self) -> Result<serde_json::Value, serde_json::Error> {
        let patch: serde_json::Value = serde_json::from_slice(&self.patch)?;
        let mut v = (*self.proto).clone();
        json_patch::merge(&mut v, &patch);
        Ok(v)
    }
}

/// Whether a `null` is anywhere in `v`.
fn has_null(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Null => true,
        Value::Array(items) => items.iter().any(has_null),
        Value::Object(map) => map.values().any(has_null),
        _ => false,
    }
}

/// The merge patch from `base` to `target`; None when they are equal.
fn merge_diff(base: &serde_json::Value, target: &serde_json::Value) -> Option<serde_json::Value> {
    use serde_json::Value;
    match (base, target) {
        (Value::Object(b), Value::Object(t)) => {
            let mut patch = serde_json::Map::new();
            for (k, tv) in t {
                let d = match b.get(k) {
                    Some(bv) => merge_diff(bv, tv),
                    None => Some(tv.clone()),
                };
                if let Some(d) = d {
                    patch.insert(k.clone(), d);
                }
            }
            for k in b.keys().filter(|k| !t.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ => (base != target).then(|| target.clone()),
    }
}

/// A name other objects repeat (a Node's, on every pod bound to it) shares its string with them
/// through the set; an empty one stays out of it.
fn intern_or_new(s: String) -> Arc<str> {
    if s.is_empty() {
        Arc::from(s)
    } else {
        intern(&s)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_node_comes_back_as_it_went_in() {
        let full = json!({
            "metadata": {"name": "n1", "uid": "u", "resourceVersion": "3",
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "deletionTimestamp": "2026-01-02T00:00:00Z",
                         "labels": {"karpenter.sh/nodepool": "p", "zone": "a"},
                         "annotations": {"karpenter.sh/do-not-disrupt": "true"},
                         "finalizers": ["karpenter.sh/termination"],
                         "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                                              "name": "c1", "uid": "c1-uid"}]},
            "spec": {"providerID": "sim://n1", "unschedulable": true, "podCIDR": "10.0.0.0/24",
                     "taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "lastTransitionTime": "2026-01-01T00:00:00Z"}]
            }
        });
        let bare = json!({"metadata": {"name": "n2"}});
        let empty_maps = json!({"metadata": {"name": "n3", "labels": {}, "annotations": {}},
                                "spec": {}, "status": {"allocatable": {}}});
        let mut compacted = Vec::new();
        for v in [full, bare, empty_maps] {
            let mut n: Node = serde_json::from_value(v).unwrap();
            crate::state::trim::node(&mut n);
            let c = CompactNode::new(n.clone());
            assert_eq!(c.node(), n);
            assert_eq!(c.name(), n.metadata.name.as_deref().unwrap());
            assert_eq!(c.provider_id(), crate::state::nodes::provider_id(&n));
            compacted.push(c);
        }
        let (full, bare) = (&compacted[0], &compacted[1]);
        assert!(full.ready() && !bare.ready());
        assert!(full.has_finalizer("karpenter.sh/termination") && !bare.has_finalizer("x"));
        assert!(full.owned_by("c1-uid") && !full.owned_by("other") && !bare.owned_by("c1-uid"));
    }

    #[test]
    fn the_hot_fields_read_in_place() {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"zone": "a", "arch": "amd64"}},
            "spec": {"providerID": "", "unschedulable": true,
                     "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "4", "pods": "110"}}
        }))
        .unwrap();
        let c = CompactNode::new(n);
        assert_eq!(c.labels().get("zone"), Some("a"));
        assert_eq!(c.labels().get("none"), None);
        assert_eq!(c.labels().len(), 2);
        assert_eq!(c.provider_id(), None, "an empty provider ID is none");
        assert!(c.unschedulable());
        assert!(!c.deleting());
        assert_eq!(c.taints().len(), 1);
        assert_eq!(c.allocatable().get("cpu"), "4".parse().unwrap());
        // Two Nodes share their label strings.
        let d = CompactNode::new(
            serde_json::from_value(json!({"metadata": {"name": "n2", "labels": {"zone": "a"}}}))
                .unwrap(),
        );
        assert!(Arc::ptr_eq(&c.labels().0[1].1, &d.labels().0[0].1));
    }

    #[test]
    fn a_patched_object_comes_back_as_it_went_in() {
        let proto = Arc::new(json!({"metadata": {"name": "a", "labels": {"app": "x"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}, "status": {"phase": "Running"}}));
        let same = Patched::new(&proto, &proto).unwrap();
        assert_eq!(same.value().unwrap(), *proto);
        assert_eq!(&*same.patch, b"{}");
        let other = json!({"metadata": {"name": "b", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c"}, {"name": "d"}]}, "status": {"phase": "Running",
            "startTime": "2026-01-01T00:00:00Z"}});
        let p = Patched::new(&proto, &other).unwrap();
        assert_eq!(p.value().unwrap(), other);
        assert!(p.patch.len() < serde_json::to_vec(&other).unwrap().len());
        // A null cannot be said by a merge patch: the caller keeps such an object whole.
        assert!(Patched::new(&proto, &json!({"metadata": {"name": null}})).is_none());
        assert!(Patched::new(&proto, &json!({"spec": {"containers": [null]}})).is_none());
    }

    /// Without applying its patch to check it, every object without a null comes back as it
    /// went in: kinds changing both ways, fields added and removed at every depth, arrays.
    #[test]
    fn every_object_without_a_null_is_said_exactly() {
        let proto = Arc::new(json!({"a": {"b": 1, "c": {"d": [1, {"e": 2}]}}, "f": "x",
            "g": {"h": true}, "i": [1, 2]}));
        let targets = [
            json!({}),
            json!({"a": 5}),
            json!({"a": {"c": 3}, "f": {"x": {"y": 1}}}),
            json!({"a": {"b": 1, "c": {"d": [2]}, "new": {"deep": {"er": []}}}, "g": {}}),
            json!({"g": {"h": {"now": "an object"}}, "i": {"was": "an array"}}),
            json!({"a": {"b": 1, "c": {"d": [1, {"e": 2}]}}, "f": "x", "g": {"h": true},
                   "i": [1, 2]}),
            json!({"f": [{"k": {}}], "i": [[], {}], "z": 0.5}),
        ];
        for target in targets {
            let p = Patched::new(&proto, &target).expect("no null");
            assert_eq!(p.value().unwrap(), target);
        }
    }
}
