//! NodeClaims of the workload cluster: by name, by provider ID, the claims that recorded a
//! MachineDeployment but have no Machine yet (what each Scaler owes, rebuilt from the API), and
//! the claims holding a replica of each group (what its room is counted against, `capi::room`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;

mod feed;
pub(crate) use feed::ClaimChange;

use super::versions::Freshness;
use crate::api::conditions::{self, INSTANCE_TERMINATING};
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::{
    INSTANCE_ANNOTATION, MACHINE_ANNOTATION, MACHINE_DEPLOYMENT_ANNOTATION, NODECLASS_GROUP,
    NODECLASS_KIND,
};

/// True when the claim's NodeClass is ours (other providers' claims are left alone).
pub(crate) fn is_ours(c: &NodeClaim) -> bool {
    let r = &c.spec.node_class_ref;
    r.group == NODECLASS_GROUP && r.kind == NODECLASS_KIND
}

/// The MachineDeployment (`ns/name`) a claim recorded before asking for a replica.
pub(crate) fn recorded_deployment(c: &NodeClaim) -> Option<&str> {
    c.annotations()
        .get(MACHINE_DEPLOYMENT_ANNOTATION)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

/// The Machine (`ns/name`) a claim says it is bound to.
pub(crate) fn recorded_machine(c: &NodeClaim) -> Option<&str> {
    c.annotations()
        .get(MACHINE_ANNOTATION)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

/// The pool instance (provider ID) bound to a claim of a pool without MachinePool Machines.
pub(crate) fn recorded_instance(c: &NodeClaim) -> Option<&str> {
    c.annotations()
        .get(INSTANCE_ANNOTATION)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

pub(crate) fn provider_id(c: &NodeClaim) -> Option<&str> {
    c.status
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|s| !s.is_empty())
}

/// Whether a claim that recorded a group holds or waits for a replica of it, as its Scaler
/// counts: a live one, and a deleting one until its Machine or instance is let go
/// (`InstanceTerminating` written), after which its replica is on its way out.
fn holds_replica(c: &NodeClaim) -> bool {
    if c.metadata.deletion_timestamp.is_none() {
        return true;
    }
    let let_go = c
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .is_some_and(|cs| conditions::get(cs, INSTANCE_TERMINATING).is_some());
    (recorded_machine(c).is_some() || recorded_instance(c).is_some()) && !let_go
}

/// How long a claim expected to record a group (its create or launch write in flight) counts
/// without the index showing it: a write whose answer never came must not hold room for ever.
const EXPECTED_FOR: Duration = Duration::from_secs(30);

/// The claim as the index keeps it (`trim::meta`): the same `Arc` when there is nothing to
/// drop (a watched claim: its decode dropped `managedFields` already), else a trimmed copy.
pub(crate) fn trimmed(mut c: Arc<NodeClaim>) -> Arc<NodeClaim> {
    if c.metadata.managed_fields.is_some() {
        super::trim::meta(&mut Arc::make_mut(&mut c).metadata);
    }
    c
}

#[derive(Default)]
pub struct Claims {
    by_name: HashMap<String, Arc<NodeClaim>>,
    waiting_by_md: HashMap<String, BTreeSet<String>>,
    /// Claims holding or waiting for a replica, by the group they recorded ([`holds_replica`]).
    holding_by_md: HashMap<String, BTreeSet<String>>,
    /// Claims whose write recording a group is in flight, with the group and since when
    /// ([`Claims::expect`]).
    expected: HashMap<String, (String, Instant)>,
    /// Pool instances (provider ID -> claim) bound to claims, by MachinePool key (pools without
    /// MachinePool Machines).
    instances_by_md: HashMap<String, HashMap<String, String>>,
    by_provider_id: HashMap<String, String>,
    fresh: Freshness,
    synced: bool,
}

impl Claims {
    pub(crate) fn get(&self, name: &str) -> Option<Arc<NodeClaim>> {
        self.by_name.get(name).cloned()
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    pub(crate) fn synced(&self) -> bool {
        self.synced
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<NodeClaim>> {
        self.by_name.values()
    }

    /// Live claims that recorded this MachineDeployment and have no Machine yet.
    pub(crate) fn waiting_on(&self, md_key: &str) -> &BTreeSet<String> {
        static NONE: BTreeSet<String> = BTreeSet::new();
        self.waiting_by_md.get(md_key).unwrap_or(&NONE)
    }

    /// How many claims hold or wait for a replica of each group, the expected ones counted in:
    /// what its room is counted against (`capi::room`).
    pub(crate) fn holding(&self) -> HashMap<String, i32> {
        let mut counts: HashMap<String, i32> = self
            .holding_by_md
            .iter()
            .map(|(md, claims)| (md.clone(), claims.len() as i32))
            .collect();
        for (name, (md, since)) in &self.expected {
            let indexed = self.holding_by_md.get(md).is_some_and(|c| c.contains(name));
            if !indexed && since.elapsed() < EXPECTED_FOR {
                *counts.entry(md.clone()).or_default() += 1;
            }
        }
        counts
    }

    /// A write that records group `md` on claim `name` (its create, or its launch decision) is
    /// about to go: the claim holds room there from now, not from when the index sees it, so a
    /// plan made meanwhile does not count the slot as free. Until the index holds a copy that
    /// records that group, or [`Claims::unexpect`].
    pub(crate) fn expect(&mut self, name: &str, md: &str) {
        self.expected
            .retain(|_, (_, since)| since.elapsed() < EXPECTED_FOR);
        self.expected
            .insert(name.to_string(), (md.to_string(), Instant::now()));
    }

    /// [`Claims::expect`] for a claim about to be created, if it is named and records a group.
    pub(crate) fn expect_created(&mut self, c: &NodeClaim) {
        if let (Some(name), Some(md)) = (c.metadata.name.as_deref(), recorded_deployment(c)) {
            self.expect(name, md);
        }
    }

    /// The write [`Claims::expect`] announced failed.
    pub(crate) fn unexpect(&mut self, name: &str) {
        self.expected.remove(name);
    }

    /// The instances (provider ID -> claim) claims of this pool recorded.
    pub(crate) fn instances_of(&self, md_key: &str) -> Option<&HashMap<String, String>> {
        self.instances_by_md.get(md_key)
    }

    pub(crate) fn by_provider_id(&self, provider_id: &str) -> Option<Arc<NodeClaim>> {
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
    pub(crate) fn apply_response(&mut self, c: Arc<NodeClaim>) -> Option<Arc<NodeClaim>> {
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
    pub(crate) fn apply_own_response(&mut self, c: Arc<NodeClaim>) -> Option<Arc<NodeClaim>> {
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
        if let Some(md) = recorded_deployment(&c) {
            // Only the copy with the write expected ends the expectation: an older one may
            // still name the group a turned-away claim had before.
            if self.expected.get(&name).is_some_and(|(e, _)| e == md) {
                self.expected.remove(&name);
            }
            if holds_replica(&c) {
                self.holding_by_md
                    .entry(md.to_string())
                    .or_default()
                    .insert(name.clone());
            }
        }
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

    pub(crate) fn remove(&mut self, name: &str) -> Option<Arc<NodeClaim>> {
        self.fresh.forget(name);
        self.expected.remove(name);
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
        if let Some(md) = recorded_deployment(&old)
            && let Some(set) = self.holding_by_md.get_mut(md)
        {
            set.remove(name);
            if set.is_empty() {
                self.holding_by_md.remove(md);
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

    pub(crate) fn replace_all(&mut self, claims: Vec<NodeClaim>) -> Vec<Arc<NodeClaim>> {
        let mut old = std::mem::take(&mut self.by_name);
        self.waiting_by_md.clear();
        self.holding_by_md.clear();
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

    fn claim(name: &str, md: &str, deleting: bool, let_go: bool) -> Arc<NodeClaim> {
        let mut v = serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "resourceVersion": "1", "annotations": {
                MACHINE_DEPLOYMENT_ANNOTATION: md, MACHINE_ANNOTATION: format!("ns/m-{name}")}},
            "spec": {"nodeClassRef": {"group": NODECLASS_GROUP, "kind": NODECLASS_KIND,
                                      "name": "nc"}, "requirements": []}
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
            v["metadata"]["finalizers"] = serde_json::json!(["karpenter.sh/termination"]);
        }
        if let_go {
            v["status"] = serde_json::json!({"conditions": [{"type": INSTANCE_TERMINATING,
                "status": "True", "reason": "InstanceTerminating", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        }
        Arc::new(serde_json::from_value(v).expect("a NodeClaim"))
    }

    /// A deleting claim holds its replica until its Machine is let go; an expected write counts
    /// until the copy recording that group arrives, and not twice.
    #[test]
    fn claims_hold_a_replica_until_their_machine_is_let_go() {
        let mut idx = Claims::default();
        idx.apply(claim("a", "ns/md", false, false));
        idx.apply(claim("b", "ns/md", true, false));
        idx.apply(claim("c", "ns/md", true, true));
        assert_eq!(
            idx.holding().get("ns/md"),
            Some(&2),
            "a, and b still draining"
        );
        idx.expect("d", "ns/md");
        idx.expect("a", "ns/other");
        assert_eq!(idx.holding().get("ns/md"), Some(&3));
        assert_eq!(
            idx.holding().get("ns/other"),
            Some(&1),
            "a turned away, re-launching"
        );
        idx.apply(claim("d", "ns/md", false, false));
        assert_eq!(idx.holding().get("ns/md"), Some(&3), "d counted once");
        idx.unexpect("a");
        idx.remove("b");
        assert_eq!(idx.holding().get("ns/md"), Some(&2));
        assert_eq!(idx.holding().get("ns/other"), None);
    }

    fn claim_at(name: &str, version: &str, md: &str) -> Arc<NodeClaim> {
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
        claims.apply(claim_at("c", "1", "ns/md"));
        assert_eq!(claims.waiting_on("ns/md").len(), 1);
        claims.remove("c");
        claims.apply_response(claim_at("c", "2", "ns/md"));
        claims.apply_own_response(claim_at("c", "2", "ns/md"));
        assert!(!claims.contains("c"), "no ghost in the index");
        assert!(
            claims.waiting_on("ns/md").is_empty(),
            "nor a claim the MachineDeployment owes"
        );
    }
}
