//! What each NodePool's and ClusterAPINodeClass's status counts: per NodePool its usage (the
//! capacity of its live claims and how many there are, `view::usage`), per NodePool and per
//! ClusterAPINodeClass its rollout (`view::rollout`).
//!
//! The NodePools actor counts these on every refresh, every half second while claims change.
//! On a real API server a 1,000-claim burst lasts minutes, and reading every claim's capacity
//! and drift afresh on each refresh cost more controller CPU than the burst's own work. What a
//! claim counts for changes only when the claim does (a new `resourceVersion`) or its NodePool's
//! spec does (a new `generation`; drift reads nothing else of the pool), so [`Tally`] keeps each
//! claim's part and reads again only the claims whose part may have changed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kube::ResourceExt;

use super::rollout::{Rollout, Standing};
use super::usage;
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::NodePool;
use crate::api::resources::Resources;
use crate::api::wellknown::NODEPOOL_LABEL;
use crate::disruption::drift::PoolSpec;
use crate::state::State;

/// The counts of one refresh, keyed by NodePool (`usage`, `pools`) and ClusterAPINodeClass
/// (`classes`) name.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct PoolCounts {
    /// Per NodePool label: the summed capacity of its live claims and how many there are,
    /// whether or not the NodePool exists.
    pub(crate) usage: BTreeMap<Arc<str>, (Resources, i64)>,
    /// Per existing NodePool: its rollout.
    pub(crate) pools: BTreeMap<Arc<str>, Rollout>,
    /// Per ClusterAPINodeClass, over the claims of existing NodePools: its rollout.
    pub(crate) classes: BTreeMap<Arc<str>, Rollout>,
}

/// What one claim counts for.
#[derive(Clone, Debug)]
struct Part {
    /// Its `karpenter.sh/nodepool` label.
    pool: Option<Arc<str>>,
    class: Arc<str>,
    deleting: bool,
    /// Its capacity (or, before launch, its requests), when they parse.
    capacity: Option<Resources>,
    /// Its rollout standing; None when its NodePool does not exist (no spec to be up to date
    /// with).
    standing: Option<Standing>,
}

/// A claim's part and what it was read from.
struct Kept {
    claim_version: String,
    pool_version: Option<(String, i64)>,
    part: Part,
    /// The last count that saw the claim; parts of claims gone are dropped after each count.
    seen: u64,
}

/// Each claim's part, kept between counts (see the module's comment).
#[derive(Default)]
pub(crate) struct Tally {
    kept: HashMap<String, Kept>,
    counts: u64,
}

impl Tally {
    /// The counts over the indexes.
    pub(crate) fn count_state(&mut self, state: &State) -> PoolCounts {
        let pools = state.nodepools.read();
        let claims = state.claims.read();
        self.count(claims.all().map(Arc::as_ref), pools.all())
    }

    /// The counts over `claims`, whose NodePools are `pools` (by name).
    pub(crate) fn count<'c>(
        &mut self,
        claims: impl IntoIterator<Item = &'c NodeClaim>,
        pools: &HashMap<String, Arc<NodePool>>,
    ) -> PoolCounts {
        self.counts += 1;
        let mut specs: HashMap<&str, PoolSpec> = HashMap::new();
        let mut out = PoolCounts::default();
        for claim in claims {
            let np = claim
                .labels()
                .get(NODEPOOL_LABEL)
                .and_then(|p| pools.get(p));
            if let Some(part) = self.part(claim, np, &mut specs) {
                out.add(part);
            }
        }
        let now = self.counts;
        self.kept.retain(|_, k| k.seen == now);
        out
    }

    /// The claim's part: the one kept when neither the claim nor its NodePool's spec changed
    /// since, else read now (and kept, when both carry the versions that tell).
    fn part<'p>(
        &mut self,
        claim: &NodeClaim,
        np: Option<&'p Arc<NodePool>>,
        specs: &mut HashMap<&'p str, PoolSpec<'p>>,
    ) -> Option<&Part> {
        let claim_version = claim.metadata.resource_version.as_deref();
        let pool_version = np.and_then(|np| pool_version(np));
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        // A pool that exists but does not say its version is read every time.
        let pool_known = np.is_none() || pool_version.is_some();
        let fresh = match (self.kept.get(name), claim_version) {
            (Some(k), Some(v)) => {
                k.claim_version == v && k.pool_version == pool_version && pool_known
            }
            _ => false,
        };
        if !fresh {
            let part = read(claim, np, specs);
            let kept = Kept {
                claim_version: claim_version.unwrap_or_default().to_string(),
                pool_version,
                part,
                seen: self.counts,
            };
            self.kept.insert(name.to_string(), kept);
        }
        let now = self.counts;
        self.kept.get_mut(name).map(|k| {
            k.seen = now;
            &k.part
        })
    }
}

/// What identifies the NodePool's spec: its uid (a pool deleted and made again starts its
/// generations over) and its generation (bumped by every spec change).
fn pool_version(np: &NodePool) -> Option<(String, i64)> {
    Some((np.metadata.uid.clone()?, np.metadata.generation?))
}

/// The claim's part, read afresh.
fn read<'p>(
    claim: &NodeClaim,
    np: Option<&'p Arc<NodePool>>,
    specs: &mut HashMap<&'p str, PoolSpec<'p>>,
) -> Part {
    let standing = np.map(|np| {
        let spec = specs
            .entry(np.metadata.name.as_deref().unwrap_or_default())
            .or_insert_with(|| PoolSpec::of(np));
        Standing::of(claim, spec)
    });
    Part {
        pool: claim
            .labels()
            .get(NODEPOOL_LABEL)
            .map(|p| Arc::from(p.as_str())),
        class: Arc::from(claim.spec.node_class_ref.name.as_str()),
        deleting: claim.metadata.deletion_timestamp.is_some(),
        capacity: usage::capacity(claim),
        standing,
    }
}

impl PoolCounts {
    fn add(&mut self, part: &Part) {
        let Some(pool) = &part.pool else {
            return;
        };
        if !part.deleting {
            let usage = self.usage.entry(pool.clone()).or_default();
            usage.1 += 1;
            if let Some(capacity) = &part.capacity {
                usage.0.add_assign(capacity);
            }
        }
        if let Some(standing) = part.standing {
            self.pools.entry(pool.clone()).or_default().count(standing);
            self.classes
                .entry(part.class.clone())
                .or_default()
                .count(standing);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::drift_hash::nodepool_hash;
    use crate::api::wellknown::{NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION_ANNOTATION};

    fn pool(team: &str, uid: &str, generation: Option<i64>) -> Arc<NodePool> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                "metadata": {"name": "default", "uid": uid, "generation": generation},
                "spec": {"template": {
                    "metadata": {"labels": {"team": team}},
                    "spec": {"requirements": [],
                             "nodeClassRef": {"group": "g", "kind": "K", "name": "nc"}}}}
            }))
            .expect("a NodePool"),
        )
    }

    /// A claim of pool "default" stamped with `stamped_by`'s hash, at `version`, with `cpu`.
    fn claim(
        name: &str,
        version: &str,
        stamped_by: &NodePool,
        cpu: &str,
        ready: bool,
    ) -> NodeClaim {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "resourceVersion": version,
                         "labels": {NODEPOOL_LABEL: "default"},
                         "annotations": {NODEPOOL_HASH_ANNOTATION: nodepool_hash(stamped_by),
                                         NODEPOOL_HASH_VERSION_ANNOTATION: "v3"}},
            "spec": {"requirements": [], "nodeClassRef": {"group": "g", "kind": "K", "name": "nc"}},
            "status": {"capacity": {"cpu": cpu},
                       "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"},
                                       "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "R"}]}
        }))
        .expect("a NodeClaim")
    }

    fn pools(np: &Arc<NodePool>) -> HashMap<String, Arc<NodePool>> {
        HashMap::from([("default".to_string(), np.clone())])
    }

    fn summary(counts: &PoolCounts) -> (String, i64, i64, i64) {
        let (usage, nodes) = counts.usage.get("default").cloned().unwrap_or_default();
        let rollout = counts.pools.get("default").copied().unwrap_or_default();
        let cpu = usage
            .iter()
            .map(|(k, q)| format!("{k}={}", q.as_f64()))
            .collect();
        (cpu, nodes, rollout.up_to_date, rollout.ready)
    }

    /// A claim's new version is read again, an unchanged one is not (what its part was read
    /// from says it cannot have changed), and a claim gone no longer counts.
    #[test]
    fn a_claim_is_read_again_when_its_version_changes() {
        let np = pool("a", "u1", Some(1));
        let mut tally = Tally::default();
        let a = claim("a", "10", &np, "2", false);
        let b = claim("b", "11", &np, "4", true);
        let counts = tally.count([&a, &b], &pools(&np));
        assert_eq!(summary(&counts), ("cpu=6".into(), 2, 2, 1));

        // The same version cannot carry other content on a real API server: kept, not read.
        let a_same_version = claim("a", "10", &np, "8", true);
        let counts = tally.count([&a_same_version, &b], &pools(&np));
        assert_eq!(summary(&counts), ("cpu=6".into(), 2, 2, 1));

        let a_new = claim("a", "12", &np, "8", true);
        let counts = tally.count([&a_new, &b], &pools(&np));
        assert_eq!(summary(&counts), ("cpu=12".into(), 2, 2, 2));

        let counts = tally.count([&b], &pools(&np));
        assert_eq!(summary(&counts), ("cpu=4".into(), 1, 1, 1));
        assert_eq!(tally.kept.len(), 1, "the gone claim's part is dropped");
    }

    /// A NodePool spec change (a new generation) drifts the claims stamped before it, read
    /// again though the claims did not change; so does a pool made again under the same name
    /// (a new uid, its generation starting over).
    #[test]
    fn a_nodepool_spec_change_reads_every_claim_of_it_again() {
        let red = pool("red", "u1", Some(1));
        let mut tally = Tally::default();
        let a = claim("a", "10", &red, "2", true);
        assert_eq!(summary(&tally.count([&a], &pools(&red))).2, 1);

        let blue = pool("blue", "u1", Some(2));
        assert_eq!(summary(&tally.count([&a], &pools(&blue))).2, 0, "drifted");

        let red_again = pool("red", "u2", Some(2));
        assert_eq!(summary(&tally.count([&a], &pools(&red_again))).2, 1);
        let blue_again = pool("blue", "u3", Some(2));
        assert_eq!(summary(&tally.count([&a], &pools(&blue_again))).2, 0);
    }

    /// A NodePool that does not say its generation, or a claim without a resourceVersion, is
    /// read on every count: nothing tells that it did not change.
    #[test]
    fn without_versions_every_count_reads_again() {
        let red = pool("red", "u1", None);
        let blue = pool("blue", "u1", None);
        let mut tally = Tally::default();
        let a = claim("a", "10", &red, "2", true);
        assert_eq!(summary(&tally.count([&a], &pools(&red))).2, 1);
        assert_eq!(summary(&tally.count([&a], &pools(&blue))).2, 0);

        let np = pool("red", "u1", Some(1));
        let mut unversioned = claim("b", "", &np, "2", true);
        unversioned.metadata.resource_version = None;
        assert_eq!(
            summary(&tally.count([&unversioned], &pools(&np))).0,
            "cpu=2"
        );
        unversioned.status.as_mut().expect("a status").capacity =
            serde_json::from_value(json!({"cpu": "3"})).expect("capacity");
        assert_eq!(
            summary(&tally.count([&unversioned], &pools(&np))).0,
            "cpu=3"
        );
    }

    /// The counts agree with the usage rule read over the indexes' claims: deleting claims and
    /// claims of a NodePool that does not exist count as it says, and only existing pools
    /// have a rollout.
    #[test]
    fn usage_counts_as_the_usage_rule_does() {
        let np = pool("a", "u1", Some(1));
        let live = claim("live", "1", &np, "2", true);
        let mut deleting = claim("deleting", "2", &np, "4", true);
        deleting.metadata.deletion_timestamp =
            Some(serde_json::from_value(json!("2026-01-01T00:00:00Z")).expect("a timestamp"));
        let mut elsewhere = claim("elsewhere", "3", &np, "8", true);
        elsewhere
            .metadata
            .labels
            .get_or_insert_default()
            .insert(NODEPOOL_LABEL.into(), "gone".into());
        let counts = Tally::default().count([&live, &deleting, &elsewhere], &pools(&np));
        assert_eq!(summary(&counts).0, "cpu=2");
        assert_eq!(summary(&counts).1, 1);
        let gone = counts.usage.get("gone").expect("usage of a pool not known");
        assert_eq!(gone.1, 1);
        assert!(!counts.pools.contains_key("gone"));
        let rollout = counts.pools.get("default").copied().unwrap_or_default();
        assert_eq!((rollout.nodes, rollout.terminating), (1, 1));
    }
}
