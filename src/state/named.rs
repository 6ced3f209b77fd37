//! Custom objects by name (NodePools, ClusterAPINodeClasses, NodeOverlays, CapacityQuotas;
//! CapacityBuffers by `namespace/name`), fed by a watch that decodes each one on its own: the
//! ones that decode are what the controller reads; the ones that do not are kept apart (nothing
//! is built from them) so the actor that owns the kind can say why on the object.

use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::sync::Arc;

use kube::Resource;
use kube::api::ObjectMeta;

use super::feed::Index;
use crate::api::capacity_buffer::CapacityBuffer;
use crate::api::capacity_quota::CapacityQuota;
use crate::api::decode::{Lenient, Malformed};
use crate::api::nodeclass::ClusterAPINodeClass;
use crate::api::nodeoverlay::NodeOverlay;
use crate::api::nodepool::NodePool;

/// A kind kept by [`Named`]: what of an object the controller acts on, so that a change of
/// anything else (our own status writes coming back) is not told as a change.
pub trait Acted: Resource<DynamicType = ()> + Send + Sync + 'static {
    /// The kind's CRD may be missing (an optional feature): a list that fails before the first
    /// one completed counts as an empty list, so that the catalog goes on without the kind
    /// rather than never activating.
    const OPTIONAL: bool = false;

    /// `old` and `new` differ only where the controller does not look.
    fn acts_alike(_old: &Self, _new: &Self) -> bool {
        false
    }

    /// The key an object is kept by: its name (a cluster-scoped kind).
    fn key(meta: &ObjectMeta) -> String {
        meta.name.clone().unwrap_or_default()
    }
}

/// NodePool status changes matter too (the NodePools actor compares what it wrote).
impl Acted for NodePool {}
impl Acted for ClusterAPINodeClass {}
/// The catalog applies an overlay's spec; its status is ours.
impl Acted for NodeOverlay {
    const OPTIONAL: bool = true;

    fn acts_alike(old: &Self, new: &Self) -> bool {
        old.spec == new.spec
    }
}
/// Only a new spec changes what a solve caps (the Quotas actor hears of every change anyway);
/// the CRD is optional, so a quota watch that cannot list does not hold the start-up.
impl Acted for CapacityQuota {
    const OPTIONAL: bool = true;

    fn acts_alike(old: &Self, new: &Self) -> bool {
        old.spec == new.spec
    }
}
/// Namespaced: kept by `namespace/name`; the Buffers actor compares what changed itself.
impl Acted for CapacityBuffer {
    fn key(meta: &ObjectMeta) -> String {
        let namespace = meta.namespace.as_deref().unwrap_or_default();
        format!("{namespace}/{}", meta.name.as_deref().unwrap_or_default())
    }
}

/// Objects of kind `K` by name: those that decode and, apart, those that do not.
pub struct Named<K> {
    ok: HashMap<String, Arc<K>>,
    malformed: BTreeMap<String, Malformed>,
    listed: bool,
    kind: PhantomData<K>,
}

pub(crate) type NodePoolIndex = Named<NodePool>;
pub(crate) type NodeClassIndex = Named<ClusterAPINodeClass>;
pub(crate) type NodeOverlayIndex = Named<NodeOverlay>;
pub(crate) type QuotaIndex = Named<CapacityQuota>;
pub(crate) type BufferIndex = Named<CapacityBuffer>;

impl<K> Default for Named<K> {
    fn default() -> Self {
        Self {
            ok: HashMap::new(),
            malformed: BTreeMap::new(),
            listed: false,
            kind: PhantomData,
        }
    }
}

impl<K> Named<K> {
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<K>> {
        self.ok.get(name)
    }

    /// Every object that decodes, by name.
    pub(crate) fn all(&self) -> &HashMap<String, Arc<K>> {
        &self.ok
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<K>> {
        self.ok.values()
    }

    pub(crate) fn len(&self) -> usize {
        self.ok.len() + self.malformed.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The objects the types cannot decode, by name.
    pub(crate) fn malformed(&self) -> &BTreeMap<String, Malformed> {
        &self.malformed
    }

    /// The first list has completed.
    pub(crate) fn synced(&self) -> bool {
        self.listed
    }
}

impl<K: Acted> Named<K> {
    /// Keeps one object; whether what the controller acts on changed.
    fn keep_one(&mut self, obj: Lenient<K>) -> bool {
        match obj {
            Lenient::Ok(obj) => {
                let name = K::key(obj.meta());
                self.malformed.remove(&name);
                let alike = self
                    .ok
                    .get(&name)
                    .is_some_and(|old| K::acts_alike(old, &obj));
                self.ok.insert(name, Arc::new(obj));
                !alike
            }
            Lenient::Bad(m) => {
                let name = K::key(&m.metadata);
                tracing::warn!(
                    kind = %K::kind(&()),
                    name = %name,
                    problem = %m,
                    "object cannot be decoded; it is not used until fixed"
                );
                // The last good version must not stay in use: the user changed it.
                self.ok.remove(&name);
                self.malformed.insert(name, *m);
                true
            }
        }
    }
}

/// A change: whether what the controller acts on changed (`false` for our own status write of
/// an overlay coming back, for instance).
impl<K: Acted> Index<Lenient<K>> for Named<K> {
    type Kept = Lenient<K>;
    type Listing = Vec<Self::Kept>;
    type Changed = bool;

    fn keep(obj: Lenient<K>) -> Self::Kept {
        obj
    }

    fn apply(&mut self, obj: Self::Kept) -> bool {
        self.keep_one(obj)
    }

    fn delete(&mut self, obj: Self::Kept) -> bool {
        let name = K::key(obj.meta());
        self.malformed.remove(&name);
        self.ok.remove(&name);
        true
    }

    fn reset(&mut self, all: Vec<Self::Kept>) -> bool {
        self.ok.clear();
        self.malformed.clear();
        for obj in all {
            self.keep_one(obj);
        }
        self.listed = true;
        true
    }

    fn synced(&self) -> bool {
        Named::synced(self)
    }

    fn failed(&mut self) -> Option<bool> {
        if !K::OPTIONAL || self.listed {
            return None;
        }
        self.listed = true;
        Some(true)
    }
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;

    use super::*;
    use crate::api::nodeoverlay::NodeOverlaySpec;

    fn overlay(name: &str, weight: Option<i32>, generation: i64) -> Lenient<NodeOverlay> {
        let mut o = NodeOverlay::new(
            name,
            NodeOverlaySpec {
                weight,
                ..Default::default()
            },
        );
        o.metadata.generation = Some(generation);
        Lenient::Ok(o)
    }

    fn bad(name: &str) -> Lenient<NodeOverlay> {
        Lenient::Bad(Box::new(Malformed {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            path: "spec.weight".into(),
            error: "invalid type".into(),
            conditions: None,
        }))
    }

    #[test]
    fn our_status_coming_back_is_no_change_a_new_spec_is() {
        let mut index = NodeOverlayIndex::default();
        assert!(index.apply(overlay("a", Some(1), 1)));
        assert!(!index.apply(overlay("a", Some(1), 1)), "same spec");
        assert!(index.apply(overlay("a", Some(2), 2)), "new spec");
        assert_eq!(index.get("a").and_then(|o| o.spec.weight), Some(2));
    }

    #[test]
    fn a_bad_version_replaces_the_good_one_and_a_fixed_one_comes_back() {
        let mut index = NodeOverlayIndex::default();
        index.apply(overlay("a", Some(1), 1));
        assert!(index.apply(bad("a")));
        assert!(
            index.get("a").is_none(),
            "the last good version is not used"
        );
        assert!(index.malformed().contains_key("a"));
        index.apply(overlay("a", Some(3), 3));
        assert!(index.malformed().is_empty());
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn a_relist_replaces_everything_and_marks_the_list_seen() {
        let mut index = NodeOverlayIndex::default();
        index.apply(overlay("gone", None, 1));
        assert!(!index.synced());
        index.reset(vec![overlay("b", None, 1), bad("c")]);
        assert!(index.synced());
        assert!(index.get("gone").is_none());
        assert!(index.get("b").is_some());
        assert!(index.malformed().contains_key("c"));
        index.delete(bad("c"));
        assert!(index.malformed().is_empty());
    }

    #[test]
    fn buffers_are_kept_by_namespace_and_name() {
        let buffer = |namespace: &str| -> Lenient<CapacityBuffer> {
            let mut b = CapacityBuffer::new("spare", Default::default());
            b.metadata.namespace = Some(namespace.into());
            Lenient::Ok(b)
        };
        let mut index = BufferIndex::default();
        index.apply(buffer("a"));
        index.apply(buffer("b"));
        assert!(index.get("a/spare").is_some() && index.get("b/spare").is_some());
        index.delete(buffer("a"));
        assert!(index.get("a/spare").is_none() && index.len() == 1);
    }

    #[test]
    fn an_optional_kind_that_cannot_be_listed_counts_as_an_empty_list() {
        let mut overlays = NodeOverlayIndex::default();
        assert_eq!(overlays.failed(), Some(true));
        assert!(overlays.synced() && overlays.is_empty());
        assert_eq!(overlays.failed(), None, "told once");
        let mut pools = NodePoolIndex::default();
        assert_eq!(pools.failed(), None, "NodePools are not optional");
        assert!(!pools.synced());
    }
}
