//! CapacityBuffers as the provisioner packs them: each ready buffer's placeholder pods (never
//! written to the cluster), and where the last solve put them. The buffer actor fills the pods;
//! the provisioner records the placements, which keep a node holding only buffer room from
//! counting as empty.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

/// Where one buffer's pods went in a solve.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placed {
    /// On a Node or a claim that exists.
    pub(crate) existing: usize,
    /// On claims the solve opened.
    pub(crate) new_claims: usize,
    /// Nowhere.
    pub(crate) failed: usize,
}

#[derive(Default)]
pub(crate) struct BufferPods {
    /// Buffer key (`namespace/name`) -> its placeholder pods.
    pods: BTreeMap<String, Arc<Vec<Pod>>>,
    /// Placeholder pod key -> its buffer's key.
    owner: HashMap<String, String>,
    /// Buffer key -> the nodes the last solve put its placeholder pods on.
    hosts: HashMap<String, HashSet<String>>,
}

impl BufferPods {
    /// Sets (or with no pods, clears) a buffer's placeholder pods; true when they changed.
    pub(crate) fn set(&mut self, buffer: &str, pods: Vec<Pod>) -> bool {
        let old = self.pods.get(buffer).map(|p| p.as_slice()).unwrap_or(&[]);
        if old == pods.as_slice() {
            return false;
        }
        self.owner.retain(|_, b| b != buffer);
        // Where the old pods were packed says nothing about the new ones.
        self.hosts.remove(buffer);
        if pods.is_empty() {
            self.pods.remove(buffer);
            return true;
        }
        for p in &pods {
            self.owner
                .insert(crate::state::pods::key(p), buffer.to_string());
        }
        self.pods.insert(buffer.to_string(), Arc::new(pods));
        true
    }

    /// Every placeholder pod, buffer by buffer.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Pod> {
        self.pods.values().flat_map(|p| p.iter())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The buffer a pod key belongs to, when it is a placeholder.
    pub(crate) fn owner(&self, pod: &str) -> Option<&str> {
        self.owner.get(pod).map(String::as_str)
    }

    /// The buffers that have placeholder pods.
    pub(crate) fn buffers(&self) -> impl Iterator<Item = &str> {
        self.pods.keys().map(String::as_str)
    }

    /// Records the nodes the last solve put each buffer's placeholder pods on.
    pub(crate) fn set_hosts(&mut self, hosts: HashMap<String, HashSet<String>>) {
        self.hosts = hosts;
    }

    /// Whether the last solve put placeholder pods on `node`: it holds buffer room, so it is
    /// not empty.
    pub(crate) fn hosts(&self, node: &str) -> bool {
        self.hosts.values().any(|nodes| nodes.contains(node))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placeholder(name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        p
    }

    /// Karpenter v1.15's #3137 caches each buffer's virtual pods, built when the buffer is
    /// reconciled, not on every solve. Here they always were: the buffer actor sets them once per
    /// resolution, every solve reads them as set, the same pods set again change nothing (no new
    /// solve), and a buffer deleted or no longer ready clears its own alone.
    #[test]
    fn a_buffers_placeholders_are_kept_until_it_changes_or_goes() {
        let mut b = BufferPods::default();
        assert!(b.set("ns/a", vec![placeholder("a-1"), placeholder("a-2")]));
        assert!(b.set("ns/b", vec![placeholder("b-1")]));
        assert!(!b.set("ns/a", vec![placeholder("a-1"), placeholder("a-2")]));
        assert_eq!(b.all().count(), 3);
        assert_eq!(b.owner("ns/a-2"), Some("ns/a"));
        b.set_hosts([("ns/a".to_string(), HashSet::from(["n1".to_string()]))].into());
        assert!(b.hosts("n1"));
        assert!(b.set("ns/a", Vec::new()));
        assert_eq!(b.buffers().collect::<Vec<_>>(), ["ns/b"]);
        assert_eq!(b.owner("ns/a-2"), None);
        // Where its old pods were packed goes with them.
        assert!(!b.hosts("n1"));
        assert!(!b.is_empty());
    }
}
