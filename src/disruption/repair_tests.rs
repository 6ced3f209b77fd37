//! Node repair as a disruption method (Karpenter v1.15), on the same hand-built clusters as
//! the other methods' tests: one test per rule.

use super::tests::{Node, allow, cluster, full_at_max_size, it, types};
use super::*;

/// Due for repair, `score` past its toleration (in units of upstream's aging constant).
fn sick(c: &mut Candidate, score: f64) {
    c.repair = Some(RepairVerdict {
        condition: "ready".into(),
        score,
        why: format!("Node {} has been Ready=False", c.node),
        termination_grace_period: std::time::Duration::ZERO,
    });
    c.consolidatable = false;
}

fn node<'a>(name: &'a str, pods: &'a [(&'a str, &'a str)]) -> Node<'a> {
    Node {
        name,
        ty: "small",
        ct: "on-demand",
        pods,
    }
}

#[test]
fn repair_launches_the_replacement_before_the_unhealthy_node_goes() {
    let (s, mut c) = cluster(&types(), &[node("sick", &[("p", "1")])]);
    sick(&mut c[0], 1.0);
    let cmd = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(cmd.method, Method::Repair);
    assert_eq!(cmd.claim_names(), ["claim-sick"]);
    assert_eq!(cmd.decision(), "replace", "its pods get a node first");
    let held: Vec<&String> = cmd.replacements.iter().flat_map(|r| &r.pods).collect();
    assert_eq!(held, ["ns/p"], "{:?}", cmd.replacements);
    assert_eq!(cmd.method.reason(), DisruptionReason::Unhealthy);
    assert_eq!(revalidate(&s, &c, &allow(1), &cmd).ok(), Some(cmd.clone()));
}

#[test]
fn an_empty_unhealthy_node_is_deleted_without_a_replacement() {
    let (s, mut c) = cluster(&types(), &[node("sick", &[])]);
    sick(&mut c[0], 1.0);
    // Even where emptiness could take it: repair goes first, and says why.
    c[0].consolidatable = true;
    let cmd = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(cmd.method, Method::Repair);
    assert_eq!(cmd.decision(), "delete");
    assert!(cmd.replacements.is_empty());
}

#[test]
fn a_static_pools_unhealthy_node_is_replaced_by_its_template() {
    let (s, mut c) = cluster(&types(), &[node("sick", &[])]);
    sick(&mut c[0], 1.0);
    c[0].static_pool = true;
    let mut a = allow(1);
    assert_eq!(decide(&s, &c, &a), None, "no room for a replacement: wait");
    a.static_room.insert("default".into(), 1);
    let cmd = decide(&s, &c, &a).expect("a command");
    assert_eq!((cmd.method, cmd.decision()), (Method::Repair, "replace"));
    assert_eq!(cmd.replacements.len(), 1);
}

/// `TerminateFirstRepair`: a static pool at its limit has its unhealthy node deleted alone (its
/// count refills it), within the `Unhealthy` budget; terminate-first for drift alone does not.
#[test]
fn a_static_pool_at_its_limit_takes_an_unhealthy_node_first_with_the_gate() {
    let (s, mut c) = cluster(&types(), &[node("sick", &[("p", "1")])]);
    sick(&mut c[0], 1.0);
    c[0].static_pool = true;
    let mut a = allow(1);
    a.static_room.insert("default".into(), 0);
    a.terminate_first
        .insert(("default".into(), DisruptionReason::Drifted));
    assert_eq!(decide(&s, &c, &a), None, "drift's gate is not repair's");
    a.terminate_first
        .insert(("default".into(), DisruptionReason::Unhealthy));
    let cmd = decide(&s, &c, &a).expect("a command");
    assert_eq!((cmd.method, cmd.decision()), (Method::Repair, "delete"));
    assert!(cmd.replacements.is_empty(), "deleted first: {cmd:?}");
    assert_eq!(revalidate(&s, &c, &a, &cmd).ok(), Some(cmd.clone()));
    a.budgets
        .insert(("default".into(), DisruptionReason::Unhealthy), 0);
    assert_eq!(decide(&s, &c, &a), None, "the Unhealthy budget holds it");
}

/// `TerminateFirstRepair` in a dynamic pool: the unhealthy node's MachineDeployment is at its
/// max size and nothing else can launch, so its replacement can only take its slot; with the
/// gate it goes first, without it the repair waits.
#[test]
fn a_dynamic_pool_at_its_max_size_takes_an_unhealthy_node_first_with_the_gate() {
    let (s, mut c) = cluster(&full_at_max_size(), &[node("sick", &[("p", "1")])]);
    sick(&mut c[0], 1.0);
    let mut a = allow(1);
    a.terminate_first_gates.insert(DisruptionReason::Drifted);
    assert_eq!(decide(&s, &c, &a), None, "drift's gate is not repair's");
    a.terminate_first_gates.insert(DisruptionReason::Unhealthy);
    let cmd = decide(&s, &c, &a).expect("a command");
    assert_eq!((cmd.method, cmd.decision()), (Method::Repair, "delete"));
    assert_eq!(revalidate(&s, &c, &a, &cmd).ok(), Some(cmd.clone()));
}

#[test]
fn repair_runs_before_drift_and_consolidation() {
    let (s, mut c) = cluster(
        &types(),
        &[
            node("drifted", &[("p1", "1")]),
            node("idle", &[]),
            node("sick", &[("p2", "1")]),
        ],
    );
    c[0].drift = Some(Drift::NodePoolDrifted);
    c[0].drifted_since = Some(0);
    sick(&mut c[2], 0.0);
    let cmd = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(cmd.method, Method::Repair);
    assert_eq!(cmd.claim_names(), ["claim-sick"]);
    // Without it, drift would have gone first, then emptiness.
    c[2].repair = None;
    let cmd = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(cmd.method, Method::Emptiness);
}

#[test]
fn repair_rides_the_unhealthy_budget() {
    let (s, mut c) = cluster(&types(), &[node("sick", &[("p", "1")])]);
    sick(&mut c[0], 1.0);
    let mut closed = allow(1);
    closed
        .budgets
        .insert(("default".into(), DisruptionReason::Unhealthy), 0);
    assert_eq!(
        decide(&s, &c, &closed),
        None,
        "the Unhealthy budget holds it"
    );
    let mut drift_closed = allow(1);
    drift_closed
        .budgets
        .insert(("default".into(), DisruptionReason::Drifted), 0);
    let cmd = decide(&s, &c, &drift_closed).expect("a Drifted budget does not hold repair");
    assert_eq!(cmd.method, Method::Repair);
    // A budget closed since the decision: its validation refuses it.
    assert!(revalidate(&s, &c, &closed, &cmd).is_err());
}

#[test]
fn repair_orders_by_score_then_cost_then_name() {
    let (s, mut c) = cluster(
        &types(),
        &[
            node("a", &[("pa", "1")]),
            node("b", &[("pb", "1")]),
            node("c", &[("pc", "1")]),
            node("d", &[("pd", "1")]),
        ],
    );
    sick(&mut c[0], 1.0);
    sick(&mut c[1], 1.0);
    sick(&mut c[2], 1.0);
    sick(&mut c[3], 2.0);
    c[0].disruption_cost = 5.0;
    let first = |c: &[Candidate]| {
        decide(&s, c, &allow(1))
            .map(|cmd| cmd.claim_names())
            .unwrap_or_default()
    };
    assert_eq!(first(&c), ["claim-d"], "the most overdue first");
    c[3].repair = None;
    assert_eq!(
        first(&c),
        ["claim-b"],
        "then the cheaper to disrupt, then by name"
    );
    c[1].disruption_cost = 6.0;
    assert_eq!(first(&c), ["claim-c"]);
}

#[test]
fn a_node_whose_pods_cannot_be_placed_is_not_repaired_now() {
    // The pod needs more than any type offers: no replacement can hold it.
    let (s, mut c) = cluster(
        &[it("small", 2, 1.0, &["on-demand"])],
        &[node("sick", &[("huge", "1900m")])],
    );
    let mut s = s;
    s.nodepools[0].instance_types.clear();
    sick(&mut c[0], 1.0);
    assert_eq!(decide(&s, &c, &allow(1)), None);
}

#[test]
fn the_score_is_the_priority_rank_plus_time_past_the_toleration_over_half_an_hour() {
    use std::time::Duration;
    assert_eq!(repair::score(0, Duration::ZERO), 0.0);
    assert_eq!(repair::score(0, Duration::from_secs(45 * 60)), 1.5);
    assert_eq!(repair::score(2, Duration::from_secs(15 * 60)), 2.5);
    // A rank above is caught up by half an hour's wait.
    assert!(repair::score(0, Duration::from_secs(31 * 60)) > repair::score(1, Duration::ZERO));
}
