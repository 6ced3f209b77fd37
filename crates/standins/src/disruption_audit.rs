//! Server-side audit of voluntary disruption, like `drain_audit`: the simulated cluster measures,
//! the controller reports nothing about itself. A watch on NodeClaims and NodePools (inside the
//! simulated cluster, on its own client) keeps, per NodePool:
//!
//! - the claims *being disrupted*: from the moment a claim carries the `DisruptionReason`
//!   condition or a `deletionTimestamp` until it is gone or its instance is terminating, except
//!   claims deleted because they expired (expiration ignores budgets);
//! - the pool's node count: its claims that are `Initialized`, being-deleted ones included, less
//!   those whose `InstanceTerminating` is True (Karpenter's accounting);
//! - whenever the controller starts disrupting a claim (sets its `DisruptionReason`), the excess
//!   of the claims being disrupted at that moment over the budget in force (over that node
//!   count, for the reasons of the marked claims). The audit reads the budgets from the
//!   NodePool's raw spec with arithmetic of its own (see [`PoolBudgets`]), never with the
//!   controller's budget code, so a bug there cannot pass its own audit.
//!   The worst excess of each pool, where positive, is a violation. Claims being deleted for
//!   other reasons (a Cluster API rollout deleting their Machines, a launch timeout, a user)
//!   count against the budget, as they do in the controller, but they are no decision of the
//!   controller, so the moments they push the count up are measured apart
//!   (`max_excess_any`: after every change, unmarked deletions held to the most permissive
//!   reason's budget) and not counted as violations.
//!
//! It also counts decisions: a claim whose deletion is first seen with a `DisruptionReason`
//! condition counts under that reason; one deleted without it once its `expireAfter` had run
//! out counts as expired; anything else (a Machine lost to a rollout, a launch timeout, a user)
//! as `other`. Everything is updated on watch events, never by scanning the store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kube::core::{ApiResource, DynamicObject};
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;
use tokio::task::JoinHandle;

use super::standin::{Shutdown, spawn_watch};
use crate::wellknown::NODEPOOL_LABEL;

mod budgets;
pub use budgets::PoolBudgets;

/// Karpenter's voluntary disruption reasons, as the `DisruptionReason` condition and the
/// budgets' `reasons` spell them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DisruptionReason {
    Underutilized,
    Empty,
    Drifted,
    Unhealthy,
}

impl DisruptionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DisruptionReason::Underutilized => "Underutilized",
            DisruptionReason::Empty => "Empty",
            DisruptionReason::Drifted => "Drifted",
            DisruptionReason::Unhealthy => "Unhealthy",
        }
    }
}

/// Karpenter's NodeClaim and NodePool at `karpenter.sh/v1`, read untyped: the audit reads what
/// is written, not what the controller's types make of it.
fn karpenter_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "karpenter.sh".into(),
        version: "v1".into(),
        api_version: "karpenter.sh/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The NodeClaim condition `type_`, where `c` carries it.
fn condition<'a>(c: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    c.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|x| x.get("type").and_then(Value::as_str) == Some(type_))
}

fn is_true(condition: Option<&Value>) -> bool {
    condition
        .and_then(|c| c.get("status"))
        .and_then(Value::as_str)
        == Some("True")
}

/// Why a claim is being disrupted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    Reason(DisruptionReason),
    Expired,
    /// Deleted without a reason and not expired.
    Other,
}

/// What the audit needs to know about one claim, at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimFacts {
    pub name: String,
    pub pool: String,
    /// Initialized and its instance not yet terminating: counts in the pool's node
    /// count, and only such a claim can use up the budget (upstream's accounting: a launch that
    /// never initialized, or a node whose instance is already going, is outside both).
    pub node: bool,
    /// The `DisruptionReason` condition's reason, when the claim carries it.
    pub marked: Option<DisruptionReason>,
    pub deleting: bool,
    /// Deleted once its `expireAfter` had run out (only meaningful when `deleting`).
    pub expired: bool,
}

impl ClaimFacts {
    pub fn of(c: &DynamicObject) -> Self {
        let marked = condition(c, "DisruptionReason")
            .filter(|x| is_true(Some(x)))
            .and_then(|x| x.get("reason").and_then(Value::as_str))
            .and_then(reason_of);
        let deleted_at = c.metadata.deletion_timestamp.as_ref().map(|t| t.0);
        // "Never" (or anything else that is not a duration) never expires.
        let expire_after = c
            .data
            .pointer("/spec/expireAfter")
            .and_then(Value::as_str)
            .and_then(crate::duration::parse);
        let expired = match (
            deleted_at,
            c.metadata.creation_timestamp.as_ref(),
            expire_after,
        ) {
            (Some(deleted), Some(created), Some(after)) => {
                let after = jiff::SignedDuration::try_from(after).unwrap_or_default();
                // Timestamps have second precision: one second of slack.
                created
                    .0
                    .checked_add(after)
                    .is_ok_and(|due| deleted.as_second() + 1 >= due.as_second())
            }
            _ => false,
        };
        Self {
            name: c.name_any(),
            pool: c.labels().get(NODEPOOL_LABEL).cloned().unwrap_or_default(),
            node: is_true(condition(c, "Initialized"))
                && !is_true(condition(c, "InstanceTerminating")),
            marked,
            deleting: deleted_at.is_some(),
            expired,
        }
    }
}

fn reason_of(s: &str) -> Option<DisruptionReason> {
    [
        DisruptionReason::Empty,
        DisruptionReason::Underutilized,
        DisruptionReason::Drifted,
        DisruptionReason::Unhealthy,
    ]
    .into_iter()
    .find(|r| r.as_str().eq_ignore_ascii_case(s))
}

/// Claims deleted, by why (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Decisions {
    pub empty: usize,
    pub underutilized: usize,
    pub drifted: usize,
    /// Repaired within the budgets (Karpenter v1.15's voluntary node repair).
    pub unhealthy: usize,
    pub expired: usize,
    pub other: usize,
}

/// One pool's worst moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PoolAudit {
    /// The most claims being disrupted at once.
    pub max_disrupting: usize,
    /// The largest excess over the budget in force when the controller started a disruption
    /// (negative: always within it).
    pub max_excess: i64,
    /// The largest excess at any moment, whoever deleted the claims.
    pub max_excess_any: i64,
    /// Node count and budget at the worst excess.
    pub nodes_then: usize,
    pub budget_then: Option<usize>,
    /// At the worst excess: the claim just marked and every claim being disrupted then, each
    /// with why (its mark's reason, or `deleting`), so a violation names its moment.
    pub disrupting_then: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DisruptionAuditReport {
    pub decisions: Decisions,
    /// Sum over pools of their worst excess over the budget, where positive.
    pub budget_violations: usize,
    pub pools: BTreeMap<String, PoolAudit>,
}

#[derive(Clone, Debug)]
struct Tracked {
    facts: ClaimFacts,
    /// Its deletion was counted as a decision.
    decided: Option<Cause>,
}

impl Tracked {
    /// Being disrupted, for the budget: marked, or deleting for any reason but expiry.
    fn disrupting(&self) -> bool {
        self.facts.node
            && (self.facts.marked.is_some()
                || (self.facts.deleting && self.decided != Some(Cause::Expired)))
    }
}

/// The audit's state; pure, so it can be tested without a cluster.
#[derive(Debug, Default)]
pub struct AuditState {
    pools: HashMap<String, PoolBudgets>,
    claims: HashMap<String, Tracked>,
    decisions: Decisions,
    worst: BTreeMap<String, PoolAudit>,
}

impl AuditState {
    /// A NodePool as it is now, as JSON.
    pub fn set_pool(&mut self, name: &str, pool: &Value) {
        self.pools.insert(name.to_string(), PoolBudgets::of(pool));
        self.evaluate(name, None);
    }

    pub fn remove_pool(&mut self, name: &str) {
        self.pools.remove(name);
    }

    /// A claim as it is now.
    pub fn apply(&mut self, facts: ClaimFacts) {
        let pool = facts.pool.clone();
        let facts_name = facts.name.clone();
        let existed = self.claims.contains_key(&facts.name);
        let t = self
            .claims
            .entry(facts.name.clone())
            .or_insert_with(|| Tracked {
                facts: facts.clone(),
                decided: None,
            });
        let newly_marked = facts.marked.is_some() && (!existed || t.facts.marked.is_none());
        // A mark seen once stays the reason of the deletion even if a later write drops it.
        let marked = facts
            .marked
            .or(if facts.deleting { t.facts.marked } else { None });
        t.facts = ClaimFacts { marked, ..facts };
        if t.facts.deleting && t.decided.is_none() {
            let cause = match (t.facts.marked, t.facts.expired) {
                (Some(r), _) => Cause::Reason(r),
                (None, true) => Cause::Expired,
                (None, false) => Cause::Other,
            };
            t.decided = Some(cause);
            let d = &mut self.decisions;
            match cause {
                Cause::Reason(DisruptionReason::Empty) => d.empty += 1,
                Cause::Reason(DisruptionReason::Underutilized) => d.underutilized += 1,
                Cause::Reason(DisruptionReason::Drifted) => d.drifted += 1,
                Cause::Reason(DisruptionReason::Unhealthy) => d.unhealthy += 1,
                Cause::Expired => d.expired += 1,
                Cause::Other => d.other += 1,
            }
        }
        let name = facts_name.clone();
        self.evaluate(&pool, newly_marked.then_some(name.as_str()));
    }

    /// A claim is gone.
    pub fn remove(&mut self, name: &str) {
        if let Some(t) = self.claims.remove(name) {
            self.evaluate(&t.facts.pool, None);
        }
    }

    /// `decision`: the controller has just started disrupting a claim of `pool` (named).
    fn evaluate(&mut self, pool: &str, decision: Option<&str>) {
        let members = || self.claims.values().filter(|t| t.facts.pool == pool);
        let nodes = members().filter(|t| t.facts.node).count();
        let disrupting: Vec<&Tracked> = members().filter(|t| t.disrupting()).collect();
        let worst = self.worst.entry(pool.to_string()).or_insert(PoolAudit {
            max_excess: i64::MIN,
            max_excess_any: i64::MIN,
            ..Default::default()
        });
        worst.max_disrupting = worst.max_disrupting.max(disrupting.len());
        if disrupting.is_empty() {
            return;
        }
        let Some(budgets) = self.pools.get(pool) else {
            return;
        };
        let limit = |r: DisruptionReason| budgets.limit(r, nodes);
        let mut reasons: Vec<DisruptionReason> =
            disrupting.iter().filter_map(|t| t.facts.marked).collect();
        let budget = if reasons.is_empty() {
            // Only unmarked deletions: the most permissive reason's budget.
            let all = [
                DisruptionReason::Empty,
                DisruptionReason::Drifted,
                DisruptionReason::Underutilized,
                DisruptionReason::Unhealthy,
            ];
            if all.iter().any(|r| limit(*r).is_none()) {
                None
            } else {
                all.iter().filter_map(|r| limit(*r)).max()
            }
        } else {
            reasons.dedup();
            reasons.iter().filter_map(|r| limit(*r)).min()
        };
        let Some(budget) = budget else {
            return;
        };
        let excess = disrupting.len() as i64 - budget as i64;
        worst.max_excess_any = worst.max_excess_any.max(excess);
        if let Some(marked) = decision
            && excess > worst.max_excess
        {
            worst.max_excess = excess;
            worst.nodes_then = nodes;
            worst.budget_then = Some(budget);
            worst.disrupting_then = std::iter::once(format!("marked now: {marked}"))
                .chain(disrupting.iter().map(|t| {
                    let why = t.facts.marked.map_or("deleting", |r| r.as_str());
                    format!("{} ({why})", t.facts.name)
                }))
                .collect();
        }
    }

    pub fn report(&self) -> DisruptionAuditReport {
        let pools: BTreeMap<String, PoolAudit> = self
            .worst
            .iter()
            .map(|(k, v)| {
                let mut v = v.clone();
                if v.max_excess == i64::MIN {
                    v.max_excess = 0;
                }
                if v.max_excess_any == i64::MIN {
                    v.max_excess_any = 0;
                }
                (k.clone(), v)
            })
            .collect();
        DisruptionAuditReport {
            decisions: self.decisions.clone(),
            budget_violations: pools.values().map(|p| p.max_excess.max(0) as usize).sum(),
            pools,
        }
    }

    /// Forget the worst moments so far, keep the decisions (a new step of a phase).
    pub fn reset_worst(&mut self) {
        self.worst.clear();
    }

    /// Forget the worst moments and decisions so far (a scenario's disruption phase starts).
    pub fn reset(&mut self) {
        self.decisions = Decisions::default();
        self.worst.clear();
    }
}

/// A handle onto the running audit (clones share it).
#[derive(Clone, Debug, Default)]
pub struct DisruptionAudit {
    state: Arc<Mutex<AuditState>>,
}

impl DisruptionAudit {
    pub fn report(&self) -> DisruptionAuditReport {
        self.state.lock().report()
    }

    pub fn reset(&self) {
        self.state.lock().reset();
    }

    pub fn reset_worst(&self) {
        self.state.lock().reset_worst();
    }
}

pub fn spawn(client: Client, shutdown: Shutdown) -> (DisruptionAudit, Vec<JoinHandle<()>>) {
    let audit = DisruptionAudit::default();
    let state = audit.state.clone();
    let claims = spawn_watch(
        "nodeclaims (disruption audit)",
        Api::<DynamicObject>::all_with(
            client.clone(),
            &karpenter_resource("NodeClaim", "nodeclaims"),
        ),
        shutdown.clone(),
        move |event| match event {
            Event::Apply(c) | Event::InitApply(c) => state.lock().apply(ClaimFacts::of(&c)),
            Event::Delete(c) => {
                // The last state first, so a claim that went without being seen deleting
                // still counts as a decision.
                let mut facts = ClaimFacts::of(&c);
                facts.deleting = true;
                let mut st = state.lock();
                st.apply(facts);
                st.remove(&c.name_any());
            }
            _ => {}
        },
    );
    let state = audit.state.clone();
    // NodePools untyped: the audit reads the budgets as written, not as the controller's types
    // parse and default them.
    let pools = spawn_watch(
        "nodepools (disruption audit)",
        Api::<DynamicObject>::all_with(client, &karpenter_resource("NodePool", "nodepools")),
        shutdown,
        move |event| match event {
            Event::Apply(np) | Event::InitApply(np) => {
                state.lock().set_pool(&np.name_any(), &np.data)
            }
            Event::Delete(np) => state.lock().remove_pool(&np.name_any()),
            _ => {}
        },
    );
    (audit, vec![claims, pools])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pool(budgets: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "p"},
            "spec": {
                "template": {"spec": {"requirements": [],
                    "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}}},
                "disruption": {"budgets": budgets},
            }
        })
    }

    fn claim(name: &str) -> ClaimFacts {
        ClaimFacts {
            name: name.into(),
            pool: "p".into(),
            node: true,
            marked: None,
            deleting: false,
            expired: false,
        }
    }

    fn state_with(n: usize, budgets: serde_json::Value) -> AuditState {
        let mut s = AuditState::default();
        s.set_pool("p", &pool(budgets));
        for i in 0..n {
            s.apply(claim(&format!("c{i}")));
        }
        s
    }

    #[test]
    fn within_the_budget_is_no_violation() {
        // 20 nodes, 10 %: two at a time.
        let mut s = state_with(20, json!([{"nodes": "10%"}]));
        for i in 0..2 {
            s.apply(ClaimFacts {
                marked: Some(DisruptionReason::Empty),
                ..claim(&format!("c{i}"))
            });
        }
        for i in 0..2 {
            s.apply(ClaimFacts {
                marked: Some(DisruptionReason::Empty),
                deleting: true,
                ..claim(&format!("c{i}"))
            });
            s.remove(&format!("c{i}"));
        }
        let r = s.report();
        assert_eq!(r.budget_violations, 0);
        assert_eq!(r.pools["p"].max_disrupting, 2);
        assert_eq!(r.decisions.empty, 2);
    }

    #[test]
    fn the_worst_excess_counts_once_per_pool() {
        let mut s = state_with(10, json!([{"nodes": "1"}]));
        for i in 0..3 {
            s.apply(ClaimFacts {
                marked: Some(DisruptionReason::Drifted),
                ..claim(&format!("c{i}"))
            });
        }
        s.remove("c0");
        s.apply(ClaimFacts {
            marked: Some(DisruptionReason::Drifted),
            ..claim("c5")
        });
        let r = s.report();
        assert_eq!(r.budget_violations, 2);
        assert_eq!(r.pools["p"].budget_then, Some(1));
    }

    #[test]
    fn expired_claims_are_outside_the_budget_and_counted_apart() {
        let mut s = state_with(4, json!([{"nodes": "0"}]));
        for i in 0..4 {
            s.apply(ClaimFacts {
                deleting: true,
                expired: true,
                ..claim(&format!("c{i}"))
            });
        }
        let r = s.report();
        assert_eq!(r.budget_violations, 0);
        assert_eq!(r.decisions.expired, 4);
        // An unmarked deletion that is not expiry counts against the budget, but is no
        // decision of the controller: only a mark made while it is in progress is a violation.
        s.apply(ClaimFacts {
            deleting: true,
            ..claim("c9")
        });
        let r = s.report();
        assert_eq!(r.decisions.other, 1);
        assert_eq!(r.budget_violations, 0);
        assert_eq!(r.pools["p"].max_excess_any, 1);
        s.apply(ClaimFacts {
            marked: Some(DisruptionReason::Empty),
            ..claim("c8")
        });
        assert_eq!(s.report().budget_violations, 2);
    }

    #[test]
    fn a_mark_seen_before_deletion_names_the_decision() {
        let mut s = state_with(10, json!([{"nodes": "100%"}]));
        s.apply(ClaimFacts {
            marked: Some(DisruptionReason::Underutilized),
            ..claim("c1")
        });
        s.apply(ClaimFacts {
            deleting: true,
            ..claim("c1")
        });
        assert_eq!(s.report().decisions.underutilized, 1);
        assert_eq!(reason_of("Drifted"), Some(DisruptionReason::Drifted));
    }

    /// The controller starting one disruption more than the budget allows is a violation,
    /// graded by the audit's own arithmetic: 10 % of 11 nodes rounds up to 2, so a third
    /// claim marked at once is one too many; a reason whose own budget is 0 is over at once.
    #[test]
    fn an_over_budget_disruption_is_caught() {
        let mut s = state_with(
            11,
            json!([{"nodes": "10%"}, {"nodes": "0", "reasons": ["Drifted"]}]),
        );
        let mark = |s: &mut AuditState, name: &str, reason| {
            s.apply(ClaimFacts {
                marked: Some(reason),
                ..claim(name)
            })
        };
        mark(&mut s, "c0", DisruptionReason::Underutilized);
        mark(&mut s, "c1", DisruptionReason::Underutilized);
        assert_eq!(s.report().budget_violations, 0, "two of 11 at 10 %");
        mark(&mut s, "c2", DisruptionReason::Underutilized);
        let r = s.report();
        assert_eq!(r.budget_violations, 1);
        assert_eq!(r.pools["p"].nodes_then, 11);
        assert_eq!(r.pools["p"].budget_then, Some(2));

        let mut s = state_with(
            11,
            json!([{"nodes": "10%"}, {"nodes": "0", "reasons": ["Drifted"]}]),
        );
        mark(&mut s, "c0", DisruptionReason::Drifted);
        let r = s.report();
        assert_eq!(r.budget_violations, 1);
        assert_eq!(r.pools["p"].budget_then, Some(0));
    }
}
