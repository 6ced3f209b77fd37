//! Nodes of the workload cluster, by name and by provider ID (Cluster API matches provider IDs
//! exactly, so the index is exact too).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

pub fn provider_id(n: &Node) -> Option<&str> {
    n.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|s| !s.is_empty())
}

#[derive(Default)]
pub struct Nodes {
    by_name: HashMap<String, Arc<Node>>,
    by_provider_id: HashMap<String, String>,
    synced: bool,
}

impl Nodes {
    pub fn get(&self, name: &str) -> Option<Arc<Node>> {
        self.by_name.get(name).cloned()
    }

    pub fn by_provider_id(&self, pid: &str) -> Option<Arc<Node>> {
        self.by_provider_id
            .get(pid)
            .and_then(|n| self.by_name.get(n).cloned())
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<Node>> {
        self.by_name.values()
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

    pub fn apply(&mut self, mut n: Node) -> Option<Arc<Node>> {
        super::trim::node(&mut n);
        let name = n.name_any();
        let old = self.remove(&name);
        if let Some(pid) = provider_id(&n) {
            self.by_provider_id.insert(pid.to_string(), name.clone());
        }
        self.by_name.insert(name, Arc::new(n));
        old
    }

    pub fn remove(&mut self, name: &str) -> Option<Arc<Node>> {
        let old = self.by_name.remove(name)?;
        if let Some(pid) = provider_id(&old)
            && self.by_provider_id.get(pid).map(String::as_str) == Some(name)
        {
            self.by_provider_id.remove(pid);
        }
        Some(old)
    }

    pub fn replace_all(&mut self, nodes: Vec<Node>) -> Vec<Arc<Node>> {
        let mut old = std::mem::take(&mut self.by_name);
        self.by_provider_id.clear();
        for n in nodes {
            old.remove(&n.name_any());
            self.apply(n);
        }
        self.synced = true;
        old.into_values().collect()
    }
}
