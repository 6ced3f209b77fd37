//! NodeClaims of the workload cluster: by name, by provider ID, and the claims that recorded a
//! MachineDeployment but have no Machine yet (what each Scaler owes, rebuilt from the API).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use kube::ResourceExt;

use super::versions::Freshness;
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::{
    INSTANCE_ANNOTATION, MACHINE_ANNOTATION, MACHINE_DEPLOYMENT_ANNOTATION, NODECLASS_GROUP,
    NODECLASS_KIND,
};

/// True when the claim's NodeClass is ours (other providers' claims are left alone).
pub fn is_ours(c: &NodeClaim) -> bool {
    let r = &c.spec.node_class_ref;
    r.group == NODECLASS_GROUP && r.kind == NODECLASS_KIND
}

/// The MachineDeployment (`ns/name`) a claim recorded before asking for a replica.
pub fn recorded_deployment(c: &NodeClaim) -> Option<&str> {
    c.annotations()
        .get(MACHINE_DEPLOYMENT_ANNOTATION)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

/// The Machine (`ns/name`) a claim says it is bound to.
pub fn recorded_machine(c: &NodeClaim) -> Option<&str> {
    c.annotations()
        .get(MACHINE_ANNOTATION)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

/// The pool instance (provider ID) bound to a claim of a pool without MachinePool Machines.
pub fn recorded_instance(c: &NodeClaim) -> Option<&str> {
    c.annotations()
        .get(INSTANCE_ANNOTATION)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

pub fn provider_id(c: &NodeClaim) -> Option<&str> {
    c.status
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|s| !s.is_empty())
}

/// The claim as the index keeps it (`trim::meta`): the same `Arc` when there is nothing to
/// drop (a watched claim: its decode dropped `managedFields` already), else a trimmed copy.
pub fn trimmed(mut c: Arc<NodeClaim>) -> Arc<NodeClaim> {
    if c.metadata.managed_fields.is_some() {
        super::trim::meta(&mut Arc::make_mut(&mut c).metadata);
    }
    c
}

#[derive(Default)]
pub struct Claims {
    by_name: HashMap<String, Arc<NodeClaim>>,
    waiting_by_md: HashMap<String, BTreeSet<String>>,
    /// Pool instances (provider ID -> claim) bound to claims, by MachinePool key (pools without
    /// MachinePool Machines).
    instances_by_md: HashMap<String, HashMap<String, String>>,
    by_provider_id: HashMap<String, String>,
    fresh: Freshness,
    synced: bool,
}

impl Claims {
    pub fn get(&self, name: &str) -> Option<Arc<NodeClaim>> {
        self.by_name.get(name).cloned()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
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

    pub fn all(&self) -> impl Iterator<Item = &Arc<NodeClaim>> {
        self.by_name.values()
    }

    /// Live claims that recorded this MachineDeployment and have no Machine yet.
    pub fn waiting_on(&self, md_key: &str) -> BTreeSet<String> {
        self.waiting_by_md.get(md_key).cloned().unwrap_or_default()
    }

    /// The instances (provider ID -> claim) claims of this pool recorded.
    pub fn instances_of(&self, md_key: &str) -> Option<&HashMap<String, String>> {
        self.instances_by_md.get(md_key)
    }

    pub fn by_provider_id(&self, provider_id: &str) -> Option<Arc<NodeClaim>> {
        self.by_provider_id
            .get(provider_id)
            .and_then(|n| self.by_name.get(n).cloned())
    }

    /// Apply a watched claim unless a write response of ours is ahead of it (see `versions`).
    /// The index keeps the same `Arc` (trimmed first if it has anything to trim), so a claim
    /// actor handed it holds no second copy.
    pub fn apply(&mut self, c: Arc<NodeClaim>) -> Option<Arc<NodeClaim>> {
        let name = c.name_any();
        if !self
            .fresh
            .watched(&name, &c.resource_version().unwrap_or_default())
        {
            return self.by_name.get(&name).cloned();
        }
        self.insert(name, c)
    }

    /// Apply the answer of our own write, unless the watch already delivered it.
    pub fn apply_response(&mut self, c: Arc<NodeClaim>) -> Option<Arc<NodeClaim>> {
        let name = c.name_any();
        if !self
            .fresh
            .responded(&name, &c.resource_version().unwrap_or_default())
        {
            return self.by_name.get(&name).cloned();
        }
        self.insert(name, c)
    }

    /// Apply the answer of the claim's own reconcile, whose writes are sent one after another
    /// (see `Freshness::superseded`), unless the watch already delivered it.
    pub fn apply_own_response(&mut self, c: Arc<NodeClaim>) -> Option<Arc<NodeClaim>> {
        let name = c.name_any();
        if !self
            .fresh
            .superseded(&name, &c.resource_version().unwrap_or_default())
        {
            return self.by_name.get(&name).cloned();
        }
        self.insert(name, c)
    }

    fn insert(&mut self, name: String, c: Arc<NodeClaim>) -> Option<Arc<NodeClaim>> {
        let c = trimmed(c);
        let old = self.detach(&name);
        if c.metadata.deletion_timestamp.is_none()
            && recorded_machine(&c).is_none()
            && recorded_instance(&c).is_none()
            && let Some(md) = recorded_deployment(&c)
        {
            self.waiting_by_md
                .entry(md.to_string())
                .or_default()
                .insert(name.clone());
        }
        if let Some(pid) = provider_id(&c) {
            self.by_provider_id.insert(pid.to_string(), name.clone());
        }
        if let (Some(md), Some(pid)) = (recorded_deployment(&c), recorded_instance(&c)) {
            self.instances_by_md
                .entry(md.to_string())
                .or_default()
                .insert(pid.to_string(), name.clone());
        }
        self.by_name.insert(name, c);
        old
    }

    pub fn remove(&mut self, name: &str) -> Option<Arc<NodeClaim>> {
        self.fresh.forget(name);
        self.detach(name)
    }

    fn detach(&mut self, name: &str) -> Option<Arc<NodeClaim>> {
        let old = self.by_name.remove(name)?;
        if let Some(md) = recorded_deployment(&old)
            && let Some(set) = self.waiting_by_md.get_mut(md)
        {
            set.remove(name);
            if set.is_empty() {
                self.waiting_by_md.remove(md);
            }
        }
        if let Some(pid) = provider_id(&old)
            && self.by_provider_id.get(pid).map(String::as_str) == Some(name)
        {
            self.by_provider_id.remove(pid);
        }
        if let (Some(md), Some(pid)) = (recorded_deployment(&old), recorded_instance(&old))
            && let Some(held) = self.instances_by_md.get_mut(md)
        {
            if held.get(pid).map(String::as_str) == Some(name) {
                held.remove(pid);
            }
            if held.is_empty() {
                self.instances_by_md.remove(md);
            }
        }
        Some(old)
    }

    pub fn replace_all(&mut self, claims: Vec<NodeClaim>) -> Vec<Arc<NodeClaim>> {
        let mut old = std::mem::take(&mut self.by_name);
        self.waiting_by_md.clear();
        self.instances_by_md.clear();
        self.by_provider_id.clear();
        self.fresh.clear();
        for c in claims {
            old.remove(&c.name_any());
            self.apply(Arc::new(c));
        }
        self.synced = true;
        // What the list left out was deleted meanwhile: late answers must not bring it back.
        for k in old.keys() {
            self.fresh.forget(k);
        }
        old.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, version: &str, md: &str) -> Arc<NodeClaim> {
        let c: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "resourceVersion": version,
                         "annotations": {MACHINE_DEPLOYMENT_ANNOTATION: md}},
            "spec": {"requirements": [], "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}}
        }))
        .expect("a NodeClaim");
        Arc::new(c)
    }

    /// Karpenter #3176's race: the watch delivers a claim's deletion before the answer to a
    /// write sent earlier is handled.
    #[test]
    fn an_answer_after_the_watched_deletion_does_not_bring_the_claim_back() {
        let mut claims = Claims::default();
        claims.apply(claim("c", "1", "ns/md"));
        assert_eq!(claims.waiting_on("ns/md").len(), 1);
        claims.remove("c");
        claims.apply_response(claim("c", "2", "ns/md"));
        claims.apply_own_response(claim("c", "2", "ns/md"));
        assert!(!claims.contains("c"), "no ghost in the index");
        assert!(
            claims.waiting_on("ns/md").is_empty(),
            "nor a claim the MachineDeployment owes"
        );
    }
}
