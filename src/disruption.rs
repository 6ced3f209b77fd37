//! Disruption decisions, pure (Karpenter core v1's disruption controller;
//! docs/disruption.md compares it rule by rule): given the candidates, a cluster snapshot and the budgets, pick at most one
//! command, trying the methods in upstream's order: repair (v1.15, when node repair is on and
//! not in its legacy mode), emptiness, drift, multi-node consolidation, single-node
//! consolidation. The `actors::disruption` actor gathers the inputs, validates the
//! command after a pause and carries it out. Expiration is not here: it is forceful and ignores
//! budgets, so the actor applies it directly.

mod allowed;
pub(crate) mod blocker;
pub(crate) mod budgets;
pub(crate) mod consolidation;
pub(crate) mod drift;
pub(crate) mod drift_backoff;
mod eligible;
pub(crate) mod pass;
pub(crate) mod pause;
pub(crate) mod repair;
mod revalidate;
pub(crate) mod spread;
mod terminate_first;
pub(crate) mod validation;

use std::collections::HashMap;
use std::sync::Arc;

use crate::api::nodepool::{ConsolidationPolicy, DisruptionReason};
use crate::scheduling::{NewClaim, Snapshot};

pub use allowed::Allowed;
pub use blocker::{Blocked, Blocker, Hold};
pub(crate) use consolidation::Outcome;
pub(crate) use drift::Drift;
pub(crate) use eligible::{REASONS, hold_underutilized};
pub(crate) use repair::RepairVerdict;
use revalidate::every_one_fresh;
pub(crate) use revalidate::revalidate;

/// At most this many candidates go into one multi-node consolidation (upstream's cap).
pub(crate) const MAX_MULTI_NODE_CANDIDATES: usize = 100;
/// At most this many single-node simulations per pass; the rest wait for a later pass (bounds a
/// pass's CPU on large clusters; upstream bounds it by time instead). The window moves on each
/// pass ([`Allowed::rotation`]).
pub(crate) const MAX_SINGLE_NODE_SIMULATIONS: usize = 50;

/// A node disruption may act on: an initialized claim with a Node that nothing protects.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub(crate) claim: String,
    pub(crate) node: String,
    pub(crate) nodepool: String,
    /// The hourly price of its offering (the MachineDeployment's price annotation).
    pub(crate) price: f64,
    pub(crate) capacity_type: String,
    /// Pods that must move when the node goes (`namespace/name`): the pod index's own keys,
    /// shared, since every pass makes a candidate of every node and so names every pod.
    pub(crate) pods: Vec<Arc<str>>,
    /// Upstream's disruption cost: the pods' eviction costs times the lifetime left.
    pub(crate) disruption_cost: f64,
    /// Upstream's reschedule disruption cost: 1 for the node, plus each moving pod's eviction
    /// cost where positive. Savings per unit of it order the candidates.
    pub(crate) reschedule_cost: f64,
    /// The claim's instance type (`node.kubernetes.io/instance-type`).
    pub(crate) instance_type: String,
    /// `namespace/name` of the MachineDeployment its Machine belongs to: the offering whose
    /// slot (under max-size, or on a full inventory) the node holds.
    pub(crate) machine_deployment: String,
    pub(crate) drift: Option<Drift>,
    /// When the claim's `Drifted` condition turned true (Unix seconds; None: this pass): the
    /// oldest drift goes first.
    pub(crate) drifted_since: Option<i64>,
    /// The pool's hourly cost and total reschedule disruption cost over all its nodes, which
    /// the `Balanced` policy weighs a move against.
    pub(crate) pool_cost: f64,
    pub(crate) pool_disruption: f64,
    /// `consolidateAfter` has passed since the node's last pod event, and the pool consolidates.
    pub(crate) consolidatable: bool,
    pub(crate) policy: ConsolidationPolicy,
    /// Its NodePool is static (`spec.replicas`): only drift and repair take it, and replace it
    /// by one claim of the pool's template whatever its pods need (upstream's static drift).
    pub(crate) static_pool: bool,
    /// Its Node is unhealthy past its toleration and nothing holds its repair back.
    pub(crate) repair: Option<RepairVerdict>,
    /// Why it is not `consolidatable`, when something holds consolidation back (for the
    /// blockers a pass records; None when consolidatable).
    pub(crate) hold: Option<Hold>,
}

impl Candidate {
    /// Upstream's savings ratio: price per unit of disruption (higher goes first).
    pub(crate) fn savings_ratio(&self) -> f64 {
        if self.reschedule_cost > 0.0 {
            self.price / self.reschedule_cost
        } else {
            self.price
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Repair,
    Emptiness,
    Drift,
    MultiNodeConsolidation,
    SingleNodeConsolidation,
}

impl Method {
    pub(crate) fn reason(self) -> DisruptionReason {
        match self {
            Method::Repair => DisruptionReason::Unhealthy,
            Method::Emptiness => DisruptionReason::Empty,
            Method::Drift => DisruptionReason::Drifted,
            Method::MultiNodeConsolidation | Method::SingleNodeConsolidation => {
                DisruptionReason::Underutilized
            }
        }
    }

    /// Upstream's `consolidation_type` label.
    pub(crate) fn consolidation_type(self) -> &'static str {
        match self {
            Method::Emptiness => "empty",
            Method::Repair | Method::Drift => "",
            Method::MultiNodeConsolidation => "multi",
            Method::SingleNodeConsolidation => "single",
        }
    }
}

/// One decision: these candidates go, these claims replace them.
#[derive(Clone, Debug, PartialEq)]
pub struct Command {
    pub method: Method,
    pub candidates: Vec<Candidate>,
    pub replacements: Vec<NewClaim>,
}

impl Command {
    /// `delete` or `replace`, upstream's `decision` label.
    pub(crate) fn decision(&self) -> &'static str {
        if self.replacements.is_empty() {
            "delete"
        } else {
            "replace"
        }
    }

    /// The candidates' claim names, sorted (validation compares them).
    pub(crate) fn claim_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.candidates.iter().map(|c| c.claim.clone()).collect();
        names.sort();
        names
    }
}

/// The first command of upstream's order, or None.
pub fn decide(snapshot: &Snapshot, candidates: &[Candidate], allowed: &Allowed) -> Option<Command> {
    decide_explained(snapshot, candidates, allowed).command
}

/// A decision, why the candidates single-node consolidation looked at could not go, and what
/// stopped every other candidate.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Decision {
    pub(crate) command: Option<Command>,
    /// (claim, why it cannot be consolidated), for `Unconsolidatable` Events.
    pub(crate) unconsolidatable: Vec<(String, Hold)>,
    /// Every candidate not in the command, with the first thing that stopped it.
    pub blocked: Vec<Blocked>,
}

/// `decide`, keeping the reasons consolidation gave up on candidates and each other
/// candidate's first blocker.
pub(crate) fn decide_explained(
    snapshot: &Snapshot,
    candidates: &[Candidate],
    allowed: &Allowed,
) -> Decision {
    // Upstream v1.14's orders: the most savings per unit of disruption first for emptiness and
    // consolidation; the oldest drift first for drift.
    let mut sorted: Vec<&Candidate> = candidates.iter().collect();
    sorted.sort_by(|a, b| {
        b.savings_ratio()
            .total_cmp(&a.savings_ratio())
            .then_with(|| a.claim.cmp(&b.claim))
    });
    let mut by_drift = sorted.clone();
    by_drift.sort_by(|a, b| {
        a.drifted_since
            .unwrap_or(i64::MAX)
            .cmp(&b.drifted_since.unwrap_or(i64::MAX))
            .then_with(|| a.claim.cmp(&b.claim))
    });
    // What the methods that looked at a candidate and passed it by said, first method first.
    let mut refused: Vec<(String, Hold)> = Vec::new();
    let mut unconsolidatable = Vec::new();
    let command = repair::repair(snapshot, &sorted, allowed)
        .or_else(|| emptiness(&sorted, allowed))
        .or_else(|| static_drift(snapshot, &by_drift, allowed, &mut refused))
        .or_else(|| drift(snapshot, &by_drift, allowed, &mut refused))
        .or_else(|| multi_node(snapshot, &sorted, allowed))
        .or_else(|| {
            single_node(
                snapshot,
                &interleave_pools(&sorted),
                allowed,
                &mut unconsolidatable,
            )
        });
    refused.extend(unconsolidatable.iter().cloned());
    // The first method's word on each claim, looked up once per candidate (a pass may refuse
    // thousands of drifted nodes).
    let mut first_refusal: HashMap<&str, &Hold> = HashMap::with_capacity(refused.len());
    for (claim, hold) in &refused {
        first_refusal.entry(claim.as_str()).or_insert(hold);
    }
    let blocked = candidates
        .iter()
        .filter_map(|c| {
            let refusal = first_refusal.get(c.claim.as_str()).copied();
            blocker::first_blocker(c, allowed, command.as_ref(), refusal).map(|hold| Blocked {
                claim: c.claim.clone(),
                nodepool: c.nodepool.clone(),
                hold,
            })
        })
        .collect();
    Decision {
        command,
        unconsolidatable,
        blocked,
    }
}

/// The candidates taken in turn from each pool (each pool in its own order), so that one pool
/// with many candidates that cannot move does not keep every other pool from being looked at.
fn interleave_pools<'a>(sorted: &[&'a Candidate]) -> Vec<&'a Candidate> {
    let mut pools: Vec<(&str, std::collections::VecDeque<&'a Candidate>)> = Vec::new();
    for c in sorted {
        match pools.iter_mut().find(|(p, _)| *p == c.nodepool) {
            Some((_, q)) => q.push_back(c),
            None => pools.push((&c.nodepool, [*c].into())),
        }
    }
    let mut out = Vec::with_capacity(sorted.len());
    while out.len() < sorted.len() {
        for (_, q) in pools.iter_mut() {
            if let Some(c) = q.pop_front() {
                out.push(c);
            }
        }
    }
    out
}

/// Upstream's `Balanced` policy: a move is worth it for a pool when the share of the pool's
/// cost it saves is at least half the share of the pool's disruption it causes (k = 2). Pools
/// with another policy always approve. Savings of a move across pools are split by each pool's
/// share of the candidates' cost.
fn balanced_approves(candidates: &[&Candidate], savings: f64) -> Result<(), Hold> {
    const K: f64 = 2.0;
    let total_cost: f64 = candidates.iter().map(|c| c.price).sum();
    let mut pools: Vec<&str> = candidates.iter().map(|c| c.nodepool.as_str()).collect();
    pools.sort_unstable();
    pools.dedup();
    for pool in &pools {
        let mine: Vec<&&Candidate> = candidates.iter().filter(|c| c.nodepool == *pool).collect();
        let Some(first) = mine.first() else { continue };
        if first.policy != ConsolidationPolicy::Balanced {
            continue;
        }
        let pool_cost: f64 = mine.iter().map(|c| c.price).sum();
        let share = if total_cost > 0.0 && pools.len() > 1 {
            savings * pool_cost / total_cost
        } else {
            savings
        };
        let disruption: f64 = mine.iter().map(|c| c.reschedule_cost).sum();
        let (savings_fraction, disruption_fraction) =
            if first.pool_cost > 0.0 && first.pool_disruption > 0.0 {
                (share / first.pool_cost, disruption / first.pool_disruption)
            } else {
                (0.0, 0.0)
            };
        let score = if savings_fraction <= 0.0 {
            0.0
        } else if disruption_fraction == 0.0 {
            f64::INFINITY
        } else {
            savings_fraction / disruption_fraction
        };
        if score < 1.0 / K {
            return Err(Hold::new(
                Blocker::Balanced,
                format!(
                    "NodePool {pool} consolidates Balanced: the move saves {:.1}% of its cost for {:.1}% of its disruption (score {score:.2}, below {:.2})",
                    savings_fraction * 100.0,
                    disruption_fraction * 100.0,
                    1.0 / K
                ),
            ));
        }
    }
    Ok(())
}

/// A consolidation outcome as the policies judge it: `Balanced` pools may turn it down.
fn judged(candidates: &[&Candidate], outcome: Outcome) -> Outcome {
    let source: f64 = candidates.iter().map(|c| c.price).sum();
    let savings = match &outcome {
        Outcome::Delete => source,
        Outcome::Replace(_, price) => source - price,
        Outcome::No(_) => return outcome,
    };
    match balanced_approves(candidates, savings) {
        Ok(()) => outcome,
        Err(why) => Outcome::No(why),
    }
}

/// Within each pool's budget for `reason`, in order.
fn within_budget<'a>(
    candidates: impl IntoIterator<Item = &'a Candidate>,
    reason: DisruptionReason,
    allowed: &Allowed,
) -> Vec<&'a Candidate> {
    let mut taken: HashMap<&str, usize> = HashMap::new();
    candidates
        .into_iter()
        .filter(|c| {
            let n = taken.entry(c.nodepool.as_str()).or_default();
            if *n < allowed.get(&c.nodepool, reason) {
                *n += 1;
                true
            } else {
                false
            }
        })
        .collect()
}

fn command(method: Method, candidates: Vec<&Candidate>, replacements: Vec<NewClaim>) -> Command {
    Command {
        method,
        candidates: candidates.into_iter().cloned().collect(),
        replacements,
    }
}

/// Empty, consolidatable nodes go together, as many as the budgets allow.
fn emptiness(sorted: &[&Candidate], allowed: &Allowed) -> Option<Command> {
    let empty = sorted
        .iter()
        .copied()
        .filter(|c| c.eligible_for(DisruptionReason::Empty));
    let chosen = within_budget(empty, DisruptionReason::Empty, allowed);
    (!chosen.is_empty()).then(|| command(Method::Emptiness, chosen, Vec::new()))
}

/// The oldest drifted node of a static NodePool whose budget and room allow a replacement,
/// replaced by one claim of the pool's template (its pods are not simulated: the pool holds its
/// count, the scheduler places them). Upstream's StaticDrift, which runs before drift. A pool
/// with no room that takes its nodes first (`Allowed::terminate_first`) has the node deleted
/// alone, and its own count launches the refill once it is gone.
fn static_drift(
    snapshot: &Snapshot,
    sorted: &[&Candidate],
    allowed: &Allowed,
    refused: &mut Vec<(String, Hold)>,
) -> Option<Command> {
    sorted
        .iter()
        .copied()
        .filter(|c| c.static_pool && c.drift.is_some())
        .filter(|c| allowed.get(&c.nodepool, DisruptionReason::Drifted) > 0)
        .find_map(|c| {
            if allowed.terminates_first(&c.nodepool, DisruptionReason::Drifted) {
                return Some(command(Method::Drift, vec![c], Vec::new()));
            }
            let room = allowed.static_room.get(&c.nodepool).is_some_and(|r| *r > 0);
            let replacement = room.then(|| static_replacement(snapshot, c)).flatten();
            if replacement.is_none() {
                let why = format!(
                    "static NodePool {} has no room under limits.nodes for its replacement",
                    c.nodepool
                );
                refused.push((c.claim.clone(), Hold::new(Blocker::StaticPool, why)));
            }
            Some(command(Method::Drift, vec![c], vec![replacement?]))
        })
}

fn static_replacement(snapshot: &Snapshot, c: &Candidate) -> Option<NewClaim> {
    snapshot
        .nodepools
        .iter()
        .find(|p| p.nodepool.metadata.name.as_deref() == Some(c.nodepool.as_str()))
        .and_then(|p| crate::scheduling::static_claim(&p.nodepool))
}

/// Empty drifted nodes go together; otherwise the first drifted node whose pods can be placed
/// (on other nodes and any number of new claims; drift does not ask for savings), or that goes
/// before its replacement because that can only launch in its own room
/// ([`terminate_first::goes_first`]).
fn drift(
    snapshot: &Snapshot,
    sorted: &[&Candidate],
    allowed: &Allowed,
    refused: &mut Vec<(String, Hold)>,
) -> Option<Command> {
    let drifted: Vec<&Candidate> = sorted
        .iter()
        .copied()
        .filter(|c| c.drift.is_some() && !c.static_pool)
        .collect();
    let empty = within_budget(
        drifted.iter().copied().filter(|c| c.is_empty()),
        DisruptionReason::Drifted,
        allowed,
    );
    if !empty.is_empty() {
        return Some(command(Method::Drift, empty, Vec::new()));
    }
    let open = drifted
        .into_iter()
        .filter(|c| allowed.get(&c.nodepool, DisruptionReason::Drifted) > 0);
    open.into_iter().find_map(|c| {
        if terminate_first::waits(snapshot, c, allowed, DisruptionReason::Drifted) {
            let why = "its MachineDeployment is at its limit and its NodePool's last launch, or pods already pending for its room, come first";
            refused.push((c.claim.clone(), Hold::new(Blocker::PodsOnTheirWay, why)));
            return None;
        }
        let replacements = drift_replacements(snapshot, c).or_else(|| {
            terminate_first::goes_first(snapshot, c, allowed, DisruptionReason::Drifted)
                .then(Vec::new)
        });
        if replacements.is_none() {
            let why = "its pods would not all schedule, even with replacements";
            refused.push((c.claim.clone(), Hold::new(Blocker::NoFeasibleSchedule, why)));
        }
        Some(command(Method::Drift, vec![c], replacements?))
    })
}

/// The claims a drifted node's pods need (drift asks for no savings), or None when some pod
/// would not schedule.
///
/// Like for like where possible: the replacements are sized to hold every pod of the drifted
/// node on their own, not only the pods that would not fit in other nodes' free room. The
/// scheduler, not the plan, decides where the moved pods go, and it sends them to the
/// least-allocated nodes first (often the fresh replacement); a replacement sized for part of
/// them then leaves some pod without room and the provisioner launches again (measured: 21
/// extra nodes in 93 drift replacements at 1,000 pods). Replacements that can hold them all
/// leave no such pod. When that cannot be solved (a topology or affinity rule needs the existing
/// nodes), the plain simulation decides.
fn drift_replacements(snapshot: &Snapshot, c: &Candidate) -> Option<Vec<NewClaim>> {
    let moved: std::collections::HashSet<&str> = c.pods.iter().map(|p| &**p).collect();
    let without = consolidation::without(snapshot, &[c]);
    let own_room = consolidation::own_room(&without, &moved);
    [own_room, without].iter().find_map(|s| {
        let (results, refused) = consolidation::simulate(s, &moved);
        refused.is_empty().then(|| {
            results
                .new_claims
                .into_iter()
                .filter(|n| n.pods.iter().any(|p| moved.contains(p.as_str())))
                .collect()
        })
    })
}

/// Upstream's search: the longest prefix (by disruption cost) of the consolidatable candidates
/// that can go for at most one cheaper replacement, found by binary search. When that order
/// finds nothing, the same search over the cheapest nodes first: small nodes that fold into
/// one larger node (two with one big pod each into a node twice their size) sit far apart in
/// the savings order, behind large nodes with few pods, so no prefix of it pairs them.
fn multi_node(snapshot: &Snapshot, sorted: &[&Candidate], allowed: &Allowed) -> Option<Command> {
    let eligible = || {
        let underutilized = |c: &&Candidate| c.eligible_for(DisruptionReason::Underutilized);
        sorted.iter().copied().filter(underutilized)
    };
    let mut cheapest_first: Vec<&Candidate> = eligible().collect();
    cheapest_first.sort_by(|a, b| a.price.total_cmp(&b.price));
    [eligible().collect(), cheapest_first]
        .into_iter()
        .find_map(|order: Vec<&Candidate>| {
            let mut pool = within_budget(order, DisruptionReason::Underutilized, allowed);
            pool.truncate(MAX_MULTI_NODE_CANDIDATES);
            longest_prefix(snapshot, &pool)
        })
}

fn longest_prefix(snapshot: &Snapshot, pool: &[&Candidate]) -> Option<Command> {
    if pool.len() < 2 {
        return None;
    }
    let (mut lo, mut hi) = (2usize, pool.len());
    let mut best: Option<(usize, Outcome)> = None;
    while lo <= hi {
        let mid = (lo + hi) / 2;
        match judged(
            &pool[..mid],
            consolidation::evaluate(snapshot, &pool[..mid]),
        ) {
            Outcome::No(_) => hi = mid - 1,
            ok => {
                best = Some((mid, ok));
                lo = mid + 1;
            }
        }
    }
    let (n, outcome) = best?;
    Some(finish(
        Method::MultiNodeConsolidation,
        pool[..n].to_vec(),
        outcome,
    ))
}

/// The first consolidatable candidate that can go, deleted or replaced by a cheaper claim.
fn single_node(
    snapshot: &Snapshot,
    sorted: &[&Candidate],
    allowed: &Allowed,
    why_not: &mut Vec<(String, Hold)>,
) -> Option<Command> {
    // One node goes, so any candidate whose pool allows one more may be it.
    let eligible: Vec<&Candidate> = sorted
        .iter()
        .copied()
        .filter(|c| {
            c.eligible_for(DisruptionReason::Underutilized)
                && allowed.get(&c.nodepool, DisruptionReason::Underutilized) > 0
        })
        .collect();
    // A pass simulates at most MAX_SINGLE_NODE_SIMULATIONS of them, the window moving on with
    // `rotation` so that, pass after pass, every candidate is looked at.
    let n = eligible.len();
    let start = if n > MAX_SINGLE_NODE_SIMULATIONS {
        allowed.rotation % n
    } else {
        0
    };
    (0..n.min(MAX_SINGLE_NODE_SIMULATIONS))
        .map(|i| eligible[(start + i) % n])
        .find_map(|c| match removal(snapshot, c) {
            Outcome::No(why) => {
                why_not.push((c.claim.clone(), why));
                None
            }
            ok => Some(finish(Method::SingleNodeConsolidation, vec![c], ok)),
        })
}

/// What removing one candidate would take, as single-node consolidation judges it (and
/// `explain node --remove` repeats it).
pub(crate) fn removal(snapshot: &Snapshot, c: &Candidate) -> Outcome {
    judged(&[c], consolidation::evaluate(snapshot, &[c]))
}

fn finish(method: Method, candidates: Vec<&Candidate>, outcome: Outcome) -> Command {
    let replacements = match outcome {
        Outcome::Replace(new, _) => vec![new],
        _ => Vec::new(),
    };
    command(method, candidates, replacements)
}

// A pod's eviction cost is kept in the pod index's summaries, so its rule lives there.
#[cfg(test)]
pub(crate) use crate::state::pods::eviction_cost;

/// Upstream's disruption cost of a claim: the eviction costs of the pods that move, times the
/// share of the node's lifetime left.
pub(crate) fn claim_disruption_cost(
    c: &crate::api::nodeclaim::NodeClaim,
    moving: &[&crate::state::pods::PodSummary],
    now: jiff::Timestamp,
) -> f64 {
    let evictions: f64 = moving.iter().map(|p| p.eviction_cost()).sum();
    let age = c
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| std::time::Duration::try_from(now.duration_since(t.0)).unwrap_or_default())
        .unwrap_or_default();
    let expire = c.spec.expire_after.and_then(|d| d.duration());
    evictions * lifetime_remaining(age, expire)
}

/// The share of a node's lifetime left before it expires (1 when it never expires).
pub(crate) fn lifetime_remaining(
    age: std::time::Duration,
    expire_after: Option<std::time::Duration>,
) -> f64 {
    match expire_after {
        Some(total) if !total.is_zero() => {
            (1.0 - age.as_secs_f64() / total.as_secs_f64()).clamp(0.0, 1.0)
        }
        _ => 1.0,
    }
}

#[cfg(test)]
mod eligible_tests;
#[cfg(test)]
mod repair_tests;
#[cfg(test)]
mod savings_tests;
#[cfg(test)]
mod tests;
