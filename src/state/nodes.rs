//! Nodes of the workload cluster, by name and by provider ID (Cluster API matches provider IDs
//! exactly, so the index is exact too). Kept compact (`compact::CompactNode`): a Node asked for
//! by name or provider ID is rebuilt whole; a pass over all of them, and a reader that needs only
//! the fields kept in place, reads the compact form.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::compact::CompactNode;
use super::feed::Index;
use super::versions::Freshness;

mod watched;
pub(crate) use watched::WatchedNode;

#[cfg(test)]
pub(crate) fn provider_id(n: &Node) -> Option<&str> {
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
    /// Our write responses against the watch (see `versions`): a response that lost the race
    /// with the watch must not put back a Node the watch already moved past (a claim's
    /// registration answer landing after the kubelet lifted the not-ready taint left the index
    /// showing the taint until the Node changed again, and the claim waiting for it).
    fresh: Freshness,
}

impl Nodes {
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Node>> {
        self.by_name.get(name).map(|n| Arc::new(n.node()))
    }

    /// The compact form (nothing rebuilt).
    pub(crate) fn compact(&self, name: &str) -> Option<&Arc<CompactNode>> {
        self.by_name.get(name)
    }

    /// The compact form (nothing rebuilt).
    pub(crate) fn compact_by_provider_id(&self, pid: &str) -> Option<&Arc<CompactNode>> {
        self.by_provider_id.get(pid).and_then(|n| self.compact(n))
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    pub(crate) fn by_provider_id(&self, pid: &str) -> Option<Arc<Node>> {
        self.by_provider_id.get(pid).and_then(|n| self.get(n))
    }

    /// Every Node in its compact form (nothing rebuilt).
    pub(crate) fn all(&self) -> impl Iterator<Item = &CompactNode> {
        self.by_name.values().map(|n| &**n)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_name.len()
    }

    pub(crate) fn synced(&self) -> bool {
        self.synced
    }

    /// Apply one watched Node unless a write response of ours is ahead of it.
    pub fn apply(&mut self, n: Node) {
        let (version, n) = <Self as Index<Node>>::keep(n);
        self.apply_watched(&version, n);
    }

    fn apply_watched(&mut self, version: &str, n: CompactNode) {
        if self.fresh.watched(n.name(), version) {
            self.insert(n);
        }
    }

    /// Apply the answer of our own write, unless the watch already delivered it (then the
    /// index may hold something newer).
    pub(crate) fn apply_response(&mut self, n: Node) {
        let version = n.metadata.resource_version.clone().unwrap_or_default();
        if self.fresh.responded(&n.name_any(), &version) {
            self.insert(CompactNode::new(n));
        }
    }

    fn insert(&mut self, n: CompactNode) {
        self.take_out(n.name());
        if let Some(pid) = n.provider_id() {
            self.by_provider_id
                .insert(Box::from(pid), n.shared_name().clone());
        }
        self.by_name.insert(n.shared_name().clone(), Arc::new(n));
    }

    /// The Node is gone (a watch delete).
    pub(crate) fn remove(&mut self, name: &str) -> Option<Arc<CompactNode>> {
        self.fresh.forget(name);
        self.take_out(name)
    }

    fn take_out(&mut self, name: &str) -> Option<Arc<CompactNode>> {
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
    pub(crate) fn replace_all(&mut self, nodes: Vec<CompactNode>) -> Vec<Arc<CompactNode>> {
        let mut old = std::mem::take(&mut self.by_name);
        self.by_provider_id.clear();
        self.fresh.clear();
        for n in nodes {
            old.remove(n.name());
            self.insert(n);
        }
        self.synced = true;
        // What the list left out was deleted meanwhile: late answers must not bring it back.
        for k in old.keys() {
            self.fresh.forget(k);
        }
        old.into_values().collect()
    }
}

/// The Nodes watch. What changed is the provider IDs whose claims may be waiting on them: the
/// Node's on a change; after a re-list, every gone Node's and then every present one's.
impl Index<Node> for Nodes {
    /// The Node compacted, with its resourceVersion (against our write responses, `fresh`).
    type Kept = (String, CompactNode);
    type Listing = Vec<Self::Kept>;
    type Changed = Vec<Box<str>>;

    fn keep(n: Node) -> Self::Kept {
        let version = n.metadata.resource_version.clone().unwrap_or_default();
        (version, CompactNode::new(n))
    }

    fn apply(&mut self, (version, n): Self::Kept) -> Self::Changed {
        let pid = n.provider_id().map(Box::from);
        self.apply_watched(&version, n);
        pid.into_iter().collect()
    }

    fn delete(&mut self, (_, n): Self::Kept) -> Self::Changed {
        self.remove(n.name());
        n.provider_id().map(Box::from).into_iter().collect()
    }

    fn reset(&mut self, all: Vec<Self::Kept>) -> Self::Changed {
        let gone = self.replace_all(all.into_iter().map(|(_, n)| n).collect());
        (gone.iter().map(|n| &**n))
            .chain(self.all())
            .filter_map(|n| n.provider_id().map(Box::from))
            .collect()
    }

    fn synced(&self) -> bool {
        self.synced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(version: &str, tainted: bool) -> Node {
        let taints = if tainted {
            serde_json::json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}])
        } else {
            serde_json::json!([])
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "resourceVersion": version},
            "spec": {"providerID": "kubemark://n", "taints": taints},
        }))
        .expect("a Node")
    }

    fn tainted(nodes: &Nodes) -> bool {
        nodes
            .get("n")
            .and_then(|n| n.spec.clone())
            .and_then(|s| s.taints)
            .is_some_and(|t| !t.is_empty())
    }

    /// Our registration patch answered with version 1 (taint still on); the watch delivered 1
    /// and then 2 (the kubelet lifted the taint) before that answer was applied: the index
    /// keeps 2.
    #[test]
    fn a_write_answer_that_lost_the_race_with_the_watch_does_not_put_back_an_older_node() {
        let mut nodes = Nodes::default();
        nodes.apply(node("1", true));
        nodes.apply(node("2", false));
        nodes.apply_response(node("1", true));
        assert!(!tainted(&nodes), "the watch's newer Node stays");
    }

    /// The answer first: watch events older than it are skipped, its own version confirms it,
    /// newer ones are taken.
    #[test]
    fn a_write_answer_ahead_of_the_watch_holds_until_the_watch_reaches_it() {
        let mut nodes = Nodes::default();
        nodes.apply(node("1", true));
        nodes.apply_response(node("3", false));
        nodes.apply(node("2", true));
        assert!(!tainted(&nodes), "an older watch event is skipped");
        nodes.apply(node("3", false));
        nodes.apply(node("4", true));
        assert!(tainted(&nodes), "past our answer the watch is taken again");
        assert!(nodes.by_provider_id("kubemark://n").is_some());
        nodes.remove("n");
        assert!(nodes.get("n").is_none());
    }

    fn named(name: &str, pid: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"providerID": pid},
        }))
        .expect("a Node")
    }

    fn sorted(mut pids: Vec<Box<str>>) -> Vec<Box<str>> {
        pids.sort();
        pids
    }

    /// A re-list swaps the set in whole and names every gone Node's provider ID and every
    /// present one's; a change or a delete names its own.
    #[test]
    fn the_feed_swaps_a_relist_in_and_names_gone_and_present_provider_ids() {
        let mut nodes = Nodes::default();
        let said = Index::apply(&mut nodes, Nodes::keep(named("a", "p://a")));
        assert_eq!(said, vec![Box::from("p://a")]);
        Index::apply(&mut nodes, Nodes::keep(named("b", "p://b")));
        assert!(!Index::synced(&nodes), "no list yet");
        let fresh = ["b", "c"].map(|n| Nodes::keep(named(n, &format!("p://{n}"))));
        let said = Index::reset(&mut nodes, fresh.into());
        assert!(Index::synced(&nodes));
        assert_eq!(
            sorted(said),
            ["p://a", "p://b", "p://c"].map(Box::from).to_vec(),
            "a gone, b and c present"
        );
        assert!(nodes.get("a").is_none() && nodes.by_provider_id("p://a").is_none());
        assert!(nodes.contains("b") && nodes.by_provider_id("p://c").is_some());
        let said = Index::delete(&mut nodes, Nodes::keep(named("c", "p://c")));
        assert_eq!(said, vec![Box::from("p://c")]);
        assert_eq!(nodes.len(), 1);
    }
}
