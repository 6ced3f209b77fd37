//! Node repair (upstream's node health controller with a cloud provider's repair policies): which
//! claims to replace because their Node has stayed unhealthy past its toleration, and which are
//! held back and why.
//!
//! The policies (`policy`) are the operator's: Cluster API reports no instance health of its own
//! that a Node condition does not already carry, so by default only the kubelet's `Ready`
//! counts, `False` or `Unknown` (the kubelet stopped reporting), each tolerated for the same
//! duration; `--repair-policies` adds the conditions a node problem detector writes, by reason.
//! Repair is held back in a NodePool where more than 20 % of the Nodes
//! (rounded up) are unhealthy, as upstream computes it, and for a Machine a MachineHealthCheck
//! watches over: Cluster API's own remediation owns it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;

use super::Inputs;
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::{
    CAPACITY_TYPE_LABEL, NODEPOOL_LABEL, TERMINATION_TIMESTAMP_ANNOTATION,
};
use crate::state::claims::recorded_machine;
use crate::state::compact::CompactNode;

use crate::api::repair_policy as policy;
pub use crate::api::repair_policy::RepairPolicies;

/// Upstream's threshold: at most this share of a NodePool's Nodes may be unhealthy for a repair.
pub(crate) const ALLOWED_UNHEALTHY_PERCENT: usize = 20;

/// One claim to replace.
#[derive(Clone, Debug)]
pub struct Repair {
    pub claim: Arc<NodeClaim>,
    pub(crate) node: String,
    pub(crate) nodepool: String,
    /// The condition, as upstream's `condition` label writes it (`ready`).
    pub(crate) condition: String,
    /// `Node x has been Ready=Unknown (NodeStatusUnknown) since 2026-…` (for the Event).
    pub(crate) why: String,
    /// How long past its toleration it is, and the dense rank of its policy's priority (which
    /// order repairs as a disruption method).
    pub(crate) overdue: Duration,
    pub(crate) rank: usize,
    /// How long its drain may take (zero: forceful).
    pub(crate) termination_grace_period: Duration,
}

/// What one look at the cluster decides.
#[derive(Debug, Default)]
pub struct Decision {
    pub repair: Vec<Repair>,
    /// (claim, node, why it is not repaired though its toleration has passed).
    pub blocked: Vec<(Arc<NodeClaim>, String, String)>,
    /// NodePools the unhealthy-fraction guard holds, with why (upstream tells the NodePool
    /// too).
    pub(crate) held_pools: BTreeMap<String, String>,
    /// The next time a toleration ends (look again then).
    pub next: Option<Timestamp>,
}

/// What the policies make of a Node now. A ready Node under policies that watch only `Ready`
/// is healthy without unpacking it (every Node is looked at on every pass).
fn assess(policies: &RepairPolicies, node: &CompactNode, now: Timestamp) -> policy::Assessment {
    if node.ready() && policies.ready_is_healthy() {
        return policy::Assessment::default();
    }
    let n = node.node();
    let conditions = n.status.as_ref().and_then(|s| s.conditions.as_deref());
    policies.assess(conditions.unwrap_or_default(), now)
}

/// Why the repair is made, for its Event and log line.
fn why(node: &str, due: &policy::Due) -> String {
    let reason = if due.reason.is_empty() {
        String::new()
    } else {
        format!(" ({})", due.reason)
    };
    let reboot = if due.reboot_asked {
        "; its policy asks a reboot, done as a replacement: Cluster API has no reboot"
    } else {
        ""
    };
    format!(
        "Node {node} has been {}={}{reason} since {}, past its toleration of {}s ({}){reboot}",
        due.condition,
        due.status,
        due.since,
        due.toleration.as_secs(),
        due.policy,
    )
}

/// Upstream's rounding: 20 % of `total`, rounded up (one of three may be unhealthy).
pub fn threshold(total: usize) -> usize {
    (total * ALLOWED_UNHEALTHY_PERCENT).div_ceil(100)
}

/// Upstream's guard: why repair is held back where `sick` of `total` Nodes are unhealthy, if
/// that is more than a fifth (rounded up). A mass failure is an outage, not sick nodes:
/// replacing them all at once would only add load.
pub(crate) fn guard(scope: &str, sick: usize, total: usize) -> Option<String> {
    (sick > threshold(total)).then(|| {
        format!(
            "more than {ALLOWED_UNHEALTHY_PERCENT}% nodes are unhealthy in the {scope} ({sick} of {total})"
        )
    })
}

pub fn decide(inputs: Inputs<'_>, policies: &RepairPolicies, now: Timestamp) -> Decision {
    let st = inputs.state;
    let nodes = st.nodes.read();
    let machines = st.machines.read();
    // Per NodePool (by the Node's label, as upstream lists them): Nodes and unhealthy ones.
    let mut pools: HashMap<String, (usize, usize)> = HashMap::new();
    let mut cluster = (0usize, 0usize);
    // Each Node assessed once; only the unhealthy ones are kept (a Node no policy applies to has
    // nothing due and nothing to wait for).
    let mut unhealthy: HashMap<String, policy::Assessment> = HashMap::new();
    for n in nodes.all() {
        let assessment = assess(policies, n, now);
        let sick = assessment.unhealthy;
        if sick {
            unhealthy.insert(n.name().to_string(), assessment);
        }
        cluster.0 += 1;
        cluster.1 += usize::from(sick);
        if let Some(pool) = n.labels().get(NODEPOOL_LABEL) {
            let e = pools.entry(pool.to_string()).or_default();
            e.0 += 1;
            e.1 += usize::from(sick);
        }
    }
    let mut out = Decision::default();
    let claims: Vec<Arc<NodeClaim>> = st.claims.read().all().cloned().collect();
    for c in claims {
        if c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(node) = c
            .status
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| nodes.compact(n))
        else {
            continue;
        };
        if node.deleting() {
            continue;
        }
        let assessment = unhealthy.remove(node.name()).unwrap_or_default();
        if let Some(next) = assessment.next {
            out.next = Some(out.next.map_or(next, |n| n.min(next)));
        }
        let Some(due) = assessment.due else {
            continue;
        };
        let pool = c.labels().get(NODEPOOL_LABEL).cloned();
        let (total, sick) = match &pool {
            Some(p) => pools.get(p).copied().unwrap_or_default(),
            None => cluster,
        };
        let machine = recorded_machine(&c)
            .and_then(|m| machines.get(m))
            .or_else(|| machines.bound_to(&c.name_any()).ok().flatten());
        if let Some(m) = machine.filter(|m| m.health_checked) {
            out.blocked.push((
                c.clone(),
                node.name().to_string(),
                format!(
                    "a MachineHealthCheck watches over Machine {}: Cluster API's remediation is left to it",
                    m.key()
                ),
            ));
            continue;
        }
        let scope = if pool.is_some() {
            "nodepool"
        } else {
            "cluster"
        };
        if let Some(why) = guard(scope, sick, total) {
            if let Some(p) = &pool {
                out.held_pools.insert(p.clone(), why.clone());
            }
            out.blocked.push((c.clone(), node.name().to_string(), why));
            continue;
        }
        out.repair.push(Repair {
            node: node.name().to_string(),
            nodepool: pool.unwrap_or_default(),
            why: why(node.name(), &due),
            condition: due.condition.to_lowercase(),
            overdue: due.overdue,
            rank: due.rank,
            termination_grace_period: due.termination_grace_period,
            claim: c,
        });
    }
    out
}

/// The termination deadline a repair stamps on the claim before deleting it, when it must write
/// one: `grace` from now (now itself for a forceful repair, the default). A deadline already
/// sooner is kept; a later one, from the NodePool's `terminationGracePeriod`, is brought
/// forward, as upstream does, so the drain of an unhealthy node waits no longer than its
/// policy allows.
pub fn termination_stamp(c: &NodeClaim, now: Timestamp, grace: Duration) -> Option<String> {
    let deadline = jiff::SignedDuration::try_from(grace)
        .ok()
        .and_then(|g| now.checked_add(g).ok())
        .unwrap_or(now);
    let stamp = deadline.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    match c.annotations().get(TERMINATION_TIMESTAMP_ANNOTATION) {
        Some(due) if *due == stamp => None,
        Some(due) if due.parse::<Timestamp>().is_ok_and(|d| d < deadline) => None,
        _ => Some(stamp),
    }
}

/// The capacity type label of a claim (upstream's metric label).
pub(crate) fn capacity_type(c: &NodeClaim) -> String {
    c.labels()
        .get(CAPACITY_TYPE_LABEL)
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifth_rounded_up_may_be_unhealthy() {
        assert_eq!(threshold(0), 0);
        assert_eq!(threshold(1), 1);
        assert_eq!(threshold(3), 1);
        assert_eq!(threshold(5), 1);
        assert_eq!(threshold(6), 2);
        assert_eq!(threshold(10), 2);
        assert_eq!(threshold(11), 3);
    }

    #[test]
    fn the_unhealthy_fraction_guard_holds_a_pool() {
        assert_eq!(
            guard("nodepool", 3, 10).as_deref(),
            Some("more than 20% nodes are unhealthy in the nodepool (3 of 10)")
        );
        assert_eq!(guard("nodepool", 2, 10), None);
        assert_eq!(
            guard("nodepool", 1, 3),
            None,
            "one of three rounds up to allowed"
        );
        assert!(guard("cluster", 2, 3).is_some());
    }
}
