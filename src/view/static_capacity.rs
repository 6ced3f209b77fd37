//! Static NodePools (`spec.replicas`): what each one holds, read from the indexes, and what it
//! takes to hold its count (upstream's static provisioning and deprovisioning controllers).
//!
//! A pool's claims stand in one of three states, as upstream's NodePool state keeps them:
//! running (neither deleting nor under a disruption command), disrupting (a command has marked
//! it: its replacement is launching) and deleting. Scale-up fills `replicas` less the running
//! and disrupting claims, within `limits.nodes` counted over all three; scale-down removes the
//! running claims above `replicas`, the least costly to disrupt first.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use jiff::Timestamp;
use kube::ResourceExt;

use super::Inputs;
use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::NodePool;
use crate::api::resources::Quantity;
use crate::api::wellknown::{DISRUPTED_TAINT_KEY, NODECLASS_GROUP, NODECLASS_KIND, NODEPOOL_LABEL};
use crate::disruption;
use crate::state::claims::provider_id;
use crate::state::pods::PodSummary;

/// One running claim of a static pool, as scale-down weighs it.
#[derive(Clone, Debug)]
pub struct Member {
    pub claim: String,
    /// It has a provider ID (upstream's "resolved"): unlaunched claims go first.
    pub launched: bool,
    /// Its Node is initialized.
    pub initialized: bool,
    /// Only DaemonSet pods, none of them do-not-disrupt.
    pub empty: bool,
    /// A pod on it is do-not-disrupt: it goes last.
    pub do_not_disrupt: bool,
    /// Upstream's cost: the moving pods' eviction costs times the lifetime left.
    pub cost: f64,
}

/// A static pool's claims by state.
#[derive(Clone, Debug, Default)]
pub struct Count {
    pub running: Vec<Member>,
    pub disrupting: usize,
    pub deleting: usize,
}

impl Count {
    /// Every claim that counts against `limits.nodes`.
    pub(crate) fn total(&self) -> usize {
        self.running.len() + self.disrupting + self.deleting
    }
}

/// What a static pool needs now.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// It holds its count (or waits for claims under way).
    Hold,
    /// Launch this many claims. `capped` names `limits.nodes` when it kept the pool below
    /// `replicas` (upstream's "nodepool node limit reached").
    Create { count: usize, capped: Option<i64> },
    /// Delete these claims, the least costly to disrupt first.
    Remove(Vec<String>),
    /// Its `limits.nodes` cannot be read: nothing is launched (fails closed), and why.
    Broken(String),
}

/// Every static NodePool whose claims this controller makes, with its count. `marked` are
/// claims a disruption command or this pool's own scale-down has taken that the index may not
/// show yet (`disrupting` and `deleting`).
pub fn counts(
    inputs: Inputs<'_>,
    disrupting: &HashSet<String>,
    deleting: &HashSet<String>,
    now: Timestamp,
) -> BTreeMap<String, (Arc<NodePool>, Count)> {
    let st = inputs.state;
    let mut out: BTreeMap<String, (Arc<NodePool>, Count)> = st
        .nodepools
        .read()
        .all()
        .iter()
        .filter(|(_, np)| np.is_static() && ours(np) && np.metadata.deletion_timestamp.is_none())
        .map(|(name, np)| (name.clone(), (np.clone(), Count::default())))
        .collect();
    if out.is_empty() {
        return out;
    }
    let claims: Vec<Arc<NodeClaim>> = st.claims.read().all().cloned().collect();
    let nodes = st.nodes.read();
    let pod_index = st.pods.read();
    for c in claims {
        let Some((_, count)) = c.labels().get(NODEPOOL_LABEL).and_then(|p| out.get_mut(p)) else {
            continue;
        };
        let name = c.name_any();
        let node = c
            .status
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| nodes.compact(n));
        if c.metadata.deletion_timestamp.is_some() || deleting.contains(&name) {
            count.deleting += 1;
            continue;
        }
        let marked = node.is_some_and(|n| n.taints().iter().any(|t| t.key == DISRUPTED_TAINT_KEY))
            || conditions::get(c.conditions(), conditions::DISRUPTION_REASON).is_some();
        if marked || disrupting.contains(&name) {
            count.disrupting += 1;
            continue;
        }
        let on_node: Vec<&PodSummary> = node
            .map(|n| pod_index.summaries_on(n.name()))
            .unwrap_or_default();
        count.running.push(member(&c, &on_node, now));
    }
    out
}

fn ours(np: &NodePool) -> bool {
    let r = &np.spec.template.spec.node_class_ref;
    r.group == NODECLASS_GROUP && r.kind == NODECLASS_KIND
}

fn member(c: &NodeClaim, on_node: &[&PodSummary], now: Timestamp) -> Member {
    let do_not_disrupt = on_node.iter().any(|p| p.do_not_disrupt(now));
    let moving: Vec<&PodSummary> = on_node
        .iter()
        .copied()
        .filter(|p| p.is_reschedulable())
        .collect();
    Member {
        claim: c.name_any(),
        launched: provider_id(c).is_some(),
        initialized: conditions::is_true(c.conditions(), conditions::INITIALIZED),
        empty: !do_not_disrupt && on_node.iter().all(|p| p.is_daemonset()),
        do_not_disrupt,
        cost: disruption::claim_disruption_cost(c, &moving, now),
    }
}

/// `limits.nodes`, when set (None: unlimited). Err when it cannot be read.
pub(crate) fn node_limit(np: &NodePool) -> Result<Option<i64>, String> {
    let Some(q) = np.spec.limits.as_ref().and_then(|l| l.get("nodes")) else {
        return Ok(None);
    };
    Quantity::from_k8s(q)
        .map(|q| Some(q.as_units()))
        .map_err(|e| format!("spec.limits.nodes {:?} cannot be read: {e}", q.0))
}

/// What the pool needs, `creating` claims being created and not yet in the index.
pub fn plan(np: &NodePool, count: &Count, creating: usize) -> Plan {
    let replicas = usize::try_from(np.spec.replicas.unwrap_or(0)).unwrap_or(0);
    let running = count.running.len() + creating;
    if running > replicas {
        return Plan::Remove(scale_down(&count.running, running - replicas));
    }
    let held = running + count.disrupting;
    if held >= replicas {
        return Plan::Hold;
    }
    let wanted = replicas - held;
    let limit = match node_limit(np) {
        Ok(l) => l,
        Err(why) => return Plan::Broken(why),
    };
    let Some(limit) = limit else {
        return Plan::Create {
            count: wanted,
            capped: None,
        };
    };
    let room = usize::try_from(limit)
        .unwrap_or(0)
        .saturating_sub(count.total() + creating);
    if room >= wanted {
        return Plan::Create {
            count: wanted,
            capped: None,
        };
    }
    Plan::Create {
        count: room,
        capped: Some(limit),
    }
}

/// How many drift replacements the pool may launch now: none while it holds more than
/// `replicas` (its scale-down goes first), else `limits.nodes` less every claim it has and
/// less the claims it is short of `replicas`: its own refills come first. Without that
/// reservation a claim gone (a terminate-first drift, a deleted Node) left room that drift and
/// the pool's scale-up both took, one claim over the limit each time (seen: 33 live claims
/// under `limits.nodes: 30` while `simulate --scenario full-pool --pods 30` rolled).
pub(crate) fn drift_room(np: &NodePool, count: &Count) -> usize {
    let replicas = usize::try_from(np.spec.replicas.unwrap_or(0)).unwrap_or(0);
    let held = count.running.len() + count.disrupting;
    if held > replicas {
        return 0;
    }
    match node_limit(np) {
        Ok(None) => usize::MAX,
        Ok(Some(limit)) => usize::try_from(limit)
            .unwrap_or(0)
            .saturating_sub(count.total() + (replicas - held)),
        Err(_) => 0,
    }
}

/// Whether drift takes the pool's drifted nodes before their replacements (terminate-first,
/// with `TerminateFirstDrift` on): its `limits.nodes` leaves no room for a replacement, it is
/// not scaling down (that goes first, as for [`drift_room`]), and nothing of it is under way:
/// no claim disrupting or deleting and every one initialized, so one node at a time is out
/// (a refill still launching does not count against the budget, which alone would let the next
/// go at once).
pub(crate) fn terminate_first(np: &NodePool, count: &Count) -> bool {
    let replicas = usize::try_from(np.spec.replicas.unwrap_or(0)).unwrap_or(0);
    let settled = count.disrupting == 0
        && count.deleting == 0
        && count.running.len() <= replicas
        && count.running.iter().all(|m| m.initialized);
    let full = matches!(node_limit(np), Ok(Some(limit)) if usize::try_from(limit).unwrap_or(0) <= count.total());
    settled && full
}

/// Upstream's scale-down order: claims not launched yet, then empty nodes, then the rest with
/// do-not-disrupt pods last and the lowest disruption cost first.
pub fn scale_down(running: &[Member], n: usize) -> Vec<String> {
    let mut order: Vec<&Member> = running.iter().collect();
    order.sort_by(|a, b| {
        a.launched
            .cmp(&b.launched)
            .then_with(|| b.empty.cmp(&a.empty))
            .then_with(|| a.do_not_disrupt.cmp(&b.do_not_disrupt))
            .then_with(|| a.cost.total_cmp(&b.cost))
            .then_with(|| a.claim.cmp(&b.claim))
    });
    order.into_iter().take(n).map(|m| m.claim.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(replicas: i64, limit: Option<&str>) -> NodePool {
        let mut np = NodePool::default();
        np.metadata.name = Some("fixed".into());
        np.spec.replicas = Some(replicas);
        if let Some(l) = limit {
            np.spec.limits = Some(
                [(
                    "nodes".to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(l.into()),
                )]
                .into(),
            );
        }
        np
    }

    fn m(claim: &str, launched: bool, empty: bool, dnd: bool, cost: f64) -> Member {
        Member {
            claim: claim.into(),
            launched,
            initialized: launched,
            empty,
            do_not_disrupt: dnd,
            cost,
        }
    }

    fn running(n: usize) -> Count {
        Count {
            running: (0..n)
                .map(|i| m(&format!("c{i}"), true, false, false, 1.0))
                .collect(),
            ..Count::default()
        }
    }

    #[test]
    fn terminate_first_only_at_the_limit_and_with_nothing_under_way() {
        let at_limit = pool(3, Some("3"));
        assert!(terminate_first(&at_limit, &running(3)));
        // Room for a replacement: replace first.
        assert!(!terminate_first(&pool(3, Some("4")), &running(3)));
        assert!(!terminate_first(&pool(3, None), &running(3)));
        // One going (or its refill not yet initialized): the next waits.
        let mut going = running(2);
        going.deleting = 1;
        assert!(!terminate_first(&at_limit, &going));
        let mut disrupting = running(2);
        disrupting.disrupting = 1;
        assert!(!terminate_first(&at_limit, &disrupting));
        let mut refilling = running(3);
        refilling.running[2].initialized = false;
        assert!(!terminate_first(&at_limit, &refilling));
        // Scaling down (more than replicas): that goes first.
        assert!(!terminate_first(&pool(2, Some("3")), &running(3)));
    }

    #[test]
    fn scale_down_removes_the_least_costly_to_disrupt_first() {
        let members = [
            m("dnd", true, false, true, 0.0),
            m("busy", true, false, false, 5.0),
            m("light", true, false, false, 1.0),
            m("empty", true, true, false, 0.0),
            m("unlaunched", false, true, false, 0.0),
        ];
        assert_eq!(
            scale_down(&members, 5),
            ["unlaunched", "empty", "light", "busy", "dnd"]
        );
        assert_eq!(scale_down(&members, 2), ["unlaunched", "empty"]);
    }

    #[test]
    fn replicas_above_limits_nodes_are_held_at_the_limit() {
        let np = pool(5, Some("3"));
        assert_eq!(
            plan(&np, &running(1), 0),
            Plan::Create {
                count: 2,
                capped: Some(3)
            }
        );
        assert_eq!(
            plan(&np, &running(3), 0),
            Plan::Create {
                count: 0,
                capped: Some(3)
            }
        );
        // Deleting claims count against the limit until they are gone, as upstream's.
        let mut c = running(2);
        c.deleting = 1;
        assert_eq!(
            plan(&np, &c, 0),
            Plan::Create {
                count: 0,
                capped: Some(3)
            }
        );
        assert_eq!(
            plan(&pool(2, Some("3")), &running(0), 0),
            Plan::Create {
                count: 2,
                capped: None
            }
        );
    }

    #[test]
    fn claims_in_flight_are_counted_so_nothing_overshoots() {
        let np = pool(3, None);
        assert_eq!(plan(&np, &running(1), 2), Plan::Hold);
        assert_eq!(
            plan(&np, &running(1), 1),
            Plan::Create {
                count: 1,
                capped: None
            }
        );
        // A node under a disruption command holds its place while its replacement launches.
        let mut c = running(2);
        c.disrupting = 1;
        assert_eq!(plan(&np, &c, 0), Plan::Hold);
        assert_eq!(plan(&np, &running(4), 0), Plan::Remove(vec!["c0".into()]));
    }

    #[test]
    fn drift_replacements_wait_for_scale_down_and_fit_in_the_limit() {
        assert_eq!(drift_room(&pool(3, None), &running(3)), usize::MAX);
        assert_eq!(drift_room(&pool(3, Some("4")), &running(3)), 1);
        assert_eq!(drift_room(&pool(3, Some("3")), &running(3)), 0);
        assert_eq!(drift_room(&pool(2, None), &running(3)), 0);
        // A claim gone: the room it left is the pool's refill's, not drift's.
        assert_eq!(drift_room(&pool(3, Some("3")), &running(2)), 0);
        assert_eq!(drift_room(&pool(3, Some("4")), &running(2)), 1);
        assert_eq!(drift_room(&pool(3, Some("5")), &running(2)), 2);
        assert!(matches!(
            plan(&pool(3, Some("many")), &running(0), 0),
            Plan::Broken(_)
        ));
    }
}
