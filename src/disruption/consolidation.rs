//! Consolidation by simulation, with the provisioner's own solver (no second scheduler): take
//! the candidates' nodes out of the cluster snapshot, make their pods pending, solve. The
//! candidates can go when every one of their pods lands on the remaining nodes plus at most one
//! new claim that is strictly cheaper than the candidates together (Karpenter core v1).

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Pod;

use super::{Blocker, Candidate, Hold, spread};
use crate::api::requirements::Requirement;
use crate::api::wellknown::{CAPACITY_TYPE_LABEL, CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_SPOT};
use crate::scheduling::{self, NewClaim, Snapshot};
use crate::state::pods;

/// What removing a set of candidates would take.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Outcome {
    /// Their pods fit on the other nodes: delete them.
    Delete,
    /// Their pods need this one new claim, cheaper than the candidates (instance types already
    /// cut to the cheaper ones).
    Replace(NewClaim, f64),
    /// Not worth it or not possible, with the reason (for Events, blockers and `explain`).
    No(Hold),
}

/// The snapshot with the candidates' nodes gone and their pods pending again (DaemonSet,
/// mirror and terminal pods stay behind: they go with their node).
pub(crate) fn without(base: &Snapshot, candidates: &[&Candidate]) -> Snapshot {
    let gone: HashSet<&str> = candidates.iter().map(|c| c.node.as_str()).collect();
    let mut s = base.clone();
    s.nodes.retain(|n| !gone.contains(n.name.as_str()));
    let mut staying = Vec::with_capacity(s.bound_pods.len());
    for p in std::mem::take(&mut s.bound_pods) {
        let on_candidate = pods::node_name(&p).is_some_and(|n| gone.contains(n));
        if !on_candidate {
            staying.push(p);
        } else if reschedulable(&p) {
            s.moved.insert(pods::key(&p));
            s.pods.push(pending(&p));
        }
    }
    s.bound_pods = staying;
    // Without inter-pod constraints anywhere (default spread constraints count), a bound pod
    // matters to the solve only for the host ports it holds: the rest need not be read (at
    // 50,000 pods, most of a solve).
    let terms = s.default_spread.is_some()
        || s.pods.iter().any(pods::has_pod_terms)
        || s.bound_pods.iter().any(|p| pods::has_pod_terms(p));
    if !terms {
        s.bound_pods.retain(|p| pods::has_host_ports(p));
    }
    s
}

/// A pod that must find a new home when its node goes (upstream's `IsReschedulable`: a
/// terminating pod does not, unless a StatefulSet owns it).
pub(crate) fn reschedulable(p: &Pod) -> bool {
    pods::is_reschedulable(p)
}

/// A copy of a bound pod as the scheduler would see it again (only the moved pods are copied).
fn pending(bound: &Pod) -> Pod {
    let mut p = bound.clone();
    if let Some(spec) = p.spec.as_mut() {
        spec.node_name = None;
    }
    p.status = None;
    p
}

/// Solves `snapshot` as disruption must read it: a moved pod (one of `moved`) the solver put on
/// an existing node that is not initialized (an in-flight claim, a Node not Ready yet or with its
/// startup taints) counts as not scheduled, with the reason. Upstream refuses such plans: the
/// pods must have somewhere to go the moment their node is gone, and capacity still launching
/// may never come (a launch or registration that times out would leave them pending).
pub(crate) fn simulate(
    snapshot: &Snapshot,
    moved: &HashSet<&str>,
) -> (scheduling::Results, Vec<String>) {
    let results = scheduling::solve(snapshot);
    let mut refused = Vec::new();
    for (pod, why) in &results.failures {
        if moved.contains(pod.as_str()) {
            refused.push(format!("pod {pod} would not schedule: {why}"));
        }
    }
    for (pod, node) in &results.placed_on_existing {
        let uninitialized = snapshot
            .nodes
            .iter()
            .find(|n| n.name == *node)
            .is_some_and(|n| !n.initialized());
        if uninitialized && moved.contains(pod.as_str()) {
            refused.push(format!(
                "pod {pod} would move to {node}, which is not initialized yet"
            ));
        }
    }
    (results, refused)
}

/// Simulate removing `candidates` and judge the result by consolidation's rules.
pub(crate) fn evaluate(base: &Snapshot, candidates: &[&Candidate]) -> Outcome {
    let moved: HashSet<&str> = candidates
        .iter()
        .flat_map(|c| c.pods.iter().map(|p| &**p))
        .collect();
    let snapshot = without(base, candidates);
    let planned = plan(&snapshot, &moved, candidates);
    let stranded = match &planned {
        Outcome::Delete => spread::stranded(&snapshot, &moved, None),
        Outcome::Replace(new, _) => spread::stranded(&snapshot, &moved, Some(new)),
        Outcome::No(_) => return planned,
    };
    let Some(why) = stranded else {
        return planned;
    };
    // The plan counts on room the scheduler would fill with other pods first. A replacement
    // that holds every moved pod on its own still may, when it is cheaper and the pods find
    // room however they come back.
    let why = Hold::new(Blocker::NoFeasibleSchedule, why);
    if !a_cheaper_type_holds(&snapshot, &moved, candidates) {
        return Outcome::No(why);
    }
    match plan(&own_room(&snapshot, &moved), &moved, candidates) {
        Outcome::Replace(new, price)
            if spread::stranded(&snapshot, &moved, Some(&new)).is_none() =>
        {
            Outcome::Replace(new, price)
        }
        _ => Outcome::No(why),
    }
}

/// Whether some instance type could hold all the moved pods for less than the candidates cost
/// (its cheapest offering; DaemonSets and constraints aside): without one, a replacement of
/// their own is not worth a solve.
fn a_cheaper_type_holds(
    snapshot: &Snapshot,
    moved: &HashSet<&str>,
    candidates: &[&Candidate],
) -> bool {
    let current: f64 = candidates.iter().map(|c| c.price).sum();
    let mut total = crate::api::resources::Resources::new();
    for p in snapshot
        .pods
        .iter()
        .filter(|p| moved.contains(pods::key(p).as_str()))
    {
        match p.spec.as_ref().map(scheduling::pod::pod_requests) {
            Some(Ok(r)) => total.add_assign(&r),
            _ => return false,
        }
    }
    snapshot
        .nodepools
        .iter()
        .flat_map(|p| &p.instance_types)
        .filter(|t| total.fits(&t.allocatable()))
        .flat_map(|t| &t.offerings)
        .any(|o| o.available && o.price < current)
}

/// `snapshot` (the cluster without some candidates) with only the moved pods pending and no
/// room on the existing nodes, which stay for their labels (topology domains): what the moved
/// pods need on new claims of their own.
pub(crate) fn own_room(snapshot: &Snapshot, moved: &HashSet<&str>) -> Snapshot {
    let mut s = snapshot.clone();
    for n in &mut s.nodes {
        n.requested = n.allocatable.clone();
    }
    s.pods.retain(|p| moved.contains(pods::key(p).as_str()));
    s
}

/// Marks the pending pods the cluster as it is has room for (`about_to_bind`): the scheduler
/// is about to bind them there, so a decision must not count that room as free. Pods a previous
/// command evicted are pending again for a moment; taken for the provisioner's, they were left
/// a new claim in the simulation while the candidates' pods took their room, then the
/// scheduler bound them first and the candidates' pods found none when their drain came, and
/// the provisioner launched for them. Pods that fit no existing node now are the provisioner's
/// either way; pods of leaving nodes and CapacityBuffer placeholders are judged on their own.
pub(crate) fn keep_room_of_pods_about_to_bind(snapshot: &mut Snapshot) {
    let pending: HashSet<String> = snapshot
        .pods
        .iter()
        .filter(|p| !crate::api::capacity_buffer::is_placeholder(p))
        .map(pods::key)
        .filter(|k| !snapshot.displaced.contains(k) && !snapshot.moved.contains(k))
        .collect();
    if pending.is_empty() {
        return;
    }
    snapshot.about_to_bind = scheduling::solve(snapshot)
        .placed_on_existing
        .into_iter()
        .map(|(pod, _)| pod)
        .filter(|pod| pending.contains(pod))
        .collect();
}

/// Pods on their way to a node now: those of nodes draining (deleting nodes, and the candidates
/// of commands under way, but for `not_draining_yet`: candidates whose replacement is still
/// launching) and the pending pods the cluster has room for ([`keep_room_of_pods_about_to_bind`]
/// marks them). kube-scheduler puts them on the least allocated nodes, cutting up the gaps a
/// decision made now would pack the moved pods into; its validation then solves the cluster as
/// they left it and drops it.
pub(crate) fn pods_on_their_way(snapshot: &Snapshot, not_draining_yet: &HashSet<String>) -> usize {
    let draining = snapshot
        .displaced
        .iter()
        .filter(|k| !not_draining_yet.contains(*k))
        .count();
    draining + snapshot.about_to_bind.len()
}

/// While pods are on their way ([`pods_on_their_way`]) and `may_wait`, the candidates with pods
/// are not consolidated this pass: decided now, a move counts on gaps those pods are about to
/// cut up. Empty nodes and drift go on. Returns the pods on their way and the candidates held.
pub(crate) fn wait_for_pods_on_their_way(
    snapshot: &Snapshot,
    candidates: &mut [Candidate],
    not_draining_yet: &HashSet<String>,
    may_wait: bool,
) -> (usize, usize) {
    let moving = pods_on_their_way(snapshot, not_draining_yet);
    if moving == 0 || !may_wait {
        return (moving, 0);
    }
    let why = format!("consolidation waits for {moving} pod(s) on their way to other nodes");
    let held = super::hold_underutilized(candidates, &Hold::new(Blocker::PodsOnTheirWay, why));
    (moving, held)
}

/// Why the room `pod` needs was counted on before this decision, if it was: its node is
/// leaving, or it is pending with room now.
fn counted_on(snapshot: &Snapshot, pod: &str) -> Option<&'static str> {
    if snapshot.displaced.contains(pod) {
        Some("of a node already leaving")
    } else if snapshot.about_to_bind.contains(pod) {
        Some("(pending, with room now)")
    } else {
        None
    }
}

/// The solver's plan for the moved pods: delete, one cheaper replacement, or no.
fn plan(snapshot: &Snapshot, moved: &HashSet<&str>, candidates: &[&Candidate]) -> Outcome {
    let (results, refused) = simulate(snapshot, moved);
    if let Some(why) = refused.into_iter().next() {
        return Outcome::No(Hold::new(Blocker::NoFeasibleSchedule, why));
    }
    // Pods of nodes already leaving were counted on finding room when their node was given up:
    // room these candidates' pods would take from them is not free (upstream's simulation
    // requires every pod but the pending ones to schedule). Under a slow API server drains
    // overlap the next decisions, and such a plan made the provisioner launch for them.
    // Likewise pods pending now that the cluster as it is has room for: the scheduler binds
    // them before the candidates' pods come back.
    if let Some((pod, whose, why)) = results
        .failures
        .iter()
        .find_map(|(p, why)| counted_on(snapshot, p).map(|whose| (p, whose, why)))
    {
        return Outcome::No(Hold::new(
            Blocker::NoFeasibleSchedule,
            format!("pod {pod} {whose} would not schedule: {why}"),
        ));
    }
    // Claims opened only for pods that were pending anyway are the provisioner's business; but
    // a CapacityBuffer's placeholder or a leaving node's pod that needs a claim once the
    // candidates are gone means the candidates hold its room, which must not go (as upstream,
    // whose simulation counts every claim opened).
    let placeholders: HashSet<String> = snapshot
        .pods
        .iter()
        .filter(|p| crate::api::capacity_buffer::is_placeholder(p))
        .map(pods::key)
        .collect();
    let mut needed: Vec<NewClaim> = results
        .new_claims
        .into_iter()
        .filter(|n| {
            n.pods.iter().any(|p| {
                moved.contains(p.as_str())
                    || placeholders.contains(p)
                    || counted_on(snapshot, p).is_some()
            })
        })
        .collect();
    match needed.len() {
        0 => Outcome::Delete,
        1 => cheaper_replacement(snapshot, needed.remove(0), candidates),
        n => {
            let whose: Vec<String> = needed
                .iter()
                .flat_map(|c| &c.pods)
                .take(6)
                .map(|p| {
                    let why = if moved.contains(p.as_str()) {
                        "moved"
                    } else if let Some(whose) = counted_on(snapshot, p) {
                        whose
                    } else if placeholders.contains(p) {
                        "(a CapacityBuffer's placeholder)"
                    } else {
                        "(pending)"
                    };
                    format!("{p} {why}")
                })
                .collect();
            Outcome::No(Hold::new(
                Blocker::NoFeasibleSchedule,
                format!(
                    "its pods would need {n} new nodes (for {}{})",
                    whose.join(", "),
                    if needed.iter().map(|c| c.pods.len()).sum::<usize>() > 6 {
                        ", ..."
                    } else {
                        ""
                    }
                ),
            ))
        }
    }
}

/// Keep only the instance types whose worst-case launch price (the most expensive offering of
/// the capacity type a launch would use: reserved, then spot, then on-demand) is below the
/// candidates together, as upstream: a cheap offering that is unavailable at launch must not
/// leave a replacement dearer than what it replaces. Upstream's spot rules apply: no
/// spot-to-spot replacement (its feature gate is off by default, and it would churn spot nodes
/// on every price change), and a replacement that may be spot or on-demand is pinned to spot
/// (the prices were judged as spot; if spot is short the launch fails and the node stays).
fn cheaper_replacement(
    snapshot: &Snapshot,
    mut new: NewClaim,
    candidates: &[&Candidate],
) -> Outcome {
    let current: f64 = candidates.iter().map(|c| c.price).sum();
    let all_spot = candidates
        .iter()
        .all(|c| c.capacity_type == CAPACITY_TYPE_SPOT);
    let allows = |ct: &str| {
        new.requirements
            .get(CAPACITY_TYPE_LABEL)
            .is_none_or(|r| r.has(ct))
    };
    let (spot_allowed, on_demand_allowed) =
        (allows(CAPACITY_TYPE_SPOT), allows(CAPACITY_TYPE_ON_DEMAND));
    if all_spot && spot_allowed {
        return Outcome::No(Hold::new(
            Blocker::SpotToSpot,
            "spot-to-spot replacement is not enabled (as upstream's default)",
        ));
    }
    let Some(pool) = snapshot
        .nodepools
        .iter()
        .find(|p| p.nodepool.metadata.name.as_deref() == Some(new.nodepool.as_str()))
    else {
        let why = format!("NodePool {} is gone", new.nodepool);
        return Outcome::No(Hold::new(Blocker::NoFeasibleSchedule, why));
    };
    let price_of = |name: &str, reqs: &crate::api::requirements::Requirements| {
        pool.instance_types
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.worst_launch_price(reqs))
    };
    let requirements = new.requirements.clone();
    new.instance_types
        .retain(|name| price_of(name, &requirements).is_some_and(|p| p < current));
    // Multi-node: a replacement of a type some candidate already is must be cheaper than that
    // candidate, or deleting the others and keeping it disrupts less (upstream's
    // filterOutSameInstanceType).
    if candidates.len() > 1 {
        let same_type_ceiling = candidates
            .iter()
            .filter(|c| new.instance_types.contains(&c.instance_type))
            .map(|c| c.price)
            .min_by(f64::total_cmp);
        if let Some(ceiling) = same_type_ceiling {
            new.instance_types
                .retain(|name| price_of(name, &requirements).is_some_and(|p| p < ceiling));
        }
    }
    if new.instance_types.is_empty() {
        return Outcome::No(Hold::new(
            Blocker::NotCheaper,
            format!("no replacement is cheaper than the current {current:.4}/h"),
        ));
    }
    // The cheaper types alone must still meet the claim's minValues (as the solve left them,
    // lowered under BestEffort), or the replacement would launch from fewer options than its
    // NodePool asks for (upstream's RemoveInstanceTypeOptionsByPriceAndMinValues).
    let remaining: Vec<&crate::scheduling::InstanceType> = pool
        .instance_types
        .iter()
        .filter(|t| new.instance_types.contains(&t.name))
        .collect();
    if let Err(unmet) = requirements.check_min_values(|key| {
        crate::scheduling::instance_type::distinct_values(&remaining, &requirements, key)
    }) {
        return Outcome::No(Hold::new(
            Blocker::MinValues,
            format!(
                "the instance types cheaper than the current {current:.4}/h cannot meet minValues: {unmet}"
            ),
        ));
    }
    // The claim may launch only the cheaper types.
    let types: Vec<&str> = new.instance_types.iter().map(String::as_str).collect();
    new.requirements.add(Requirement::is_in(
        crate::api::wellknown::INSTANCE_TYPE_LABEL,
        &types,
    ));
    if spot_allowed && on_demand_allowed {
        new.requirements.add(Requirement::is_in(
            CAPACITY_TYPE_LABEL,
            &[CAPACITY_TYPE_SPOT],
        ));
    }
    let cheapest = new
        .instance_types
        .iter()
        .filter_map(|name| price_of(name, &new.requirements))
        .min_by(f64::total_cmp)
        .unwrap_or(current);
    Outcome::Replace(new, cheapest)
}
