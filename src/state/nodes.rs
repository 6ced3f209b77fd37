//! Nodes of the workload cluster, by name and by provider ID (Cluster API matches provider IDs
//! exactly, so the index is exact too). Kept compact (`compact::CompactNode`): a Node asked for
//! by name or provider ID is rebuilt whole; a pass over all of them, and a reader that needs only
//! the fields kept in place, reads the compact form.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::compact::CompactNode;

pub fn provider_id(n: &Node) -> Option<&str> {
    n.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|s| !s.is_empty())
}

#[derive(Default)]
pub struct Nodes {
    by_name: HashMap<Arc<str>, Arc<CompactNode>>,
    by_provider_id: HashMap<Box<str>, Arc<str>>,
    synced: bool,
}

impl Nodes {
    pub fn get(&self, name: &str) -> Option<Arc<Node>> {
        self.by_name.get(name).map(|n| Arc::new(n.node()))
    }

    /// The compact form (nothing rebuilt).
    pub fn compact(&self, name: &str) -> Option<&Arc<CompactNode>> {
        self.by_name.get(name)
    }

    /// The compact form (nothing rebuilt).
    pub fn compact_by_provider_id(&self, pid: &str) -> Option<&Arc<CompactNode>> {
        self.by_provider_id.get(pid).and_then(|n| self.compact(n))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    pub fn by_provider_id(&self, pid: &str) -> Option<Arc<Node>> {
        self.by_provider_id.get(pid).and_then(|n| self.get(n))
    }

    /// Every Node in its compact form (nothing rebuilt).
    pub fn all(&self) -> impl Iterator<Item = &CompactNode> {
        self.by_name.values().map(|n| &**n)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn synced(&self) -> bool {
        self.synced
    }

    pub fn apply(&mut self, n: Node) {
        self.insert(CompactNode::new(n));
    }

    fn insert(&mut self, n: CompactNode) {
        self.remove(n.name());
        if let Some(pid) = n.provider_id() {
            self.by_provider_id
                .insert(Box::from(pid), n.shared_name().clone());
        }
        self.by_name.insert(n.shared_name().clone(), Arc::new(n));
    }

    pub fn remove(&mut self, name: &str) -> Option<Arc<CompactNode>> {
        let old = self.by_name.remove(name)?;
        if let Some(pid) = old.provider_id()
            && self.by_provider_id.get(pid).is_some_and(|n| **n == *name)
        {
            self.by_provider_id.remove(pid);
        }
        Some(old)
    }

    /// Replace everything after a (re-)list (compacted as it arrived); returns the Nodes that
    /// disappeared.
    pub fn replace_all(&mut self, nodes: Vec<CompactNode>) -> Vec<Arc<CompactNode>> {
        let mut old = std::mem::take(&mut self.by_name);
        self.by_provider_id.clear();
        for n in nodes {
            old.remove(n.name());
            self.insert(n);
        }
        self.synced = true;
        old.into_values().collect()
    }
}
