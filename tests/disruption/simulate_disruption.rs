//! The disruption scenarios of `simulate`, small: consolidation removes nodes and cost within
//! budgets, drift and expiration replace every claim, and nothing is left pending. Every figure
//! is measured by the simulated cluster (its disruption and drain audits, write log and store).
//! The `--deadline` only guards against hangs: the three scenarios run side by side on two cores
//! (65 s together when the machine is otherwise idle, over 150 s under load), so it is generous.

use std::time::Duration;

use karpenter_capi::cli::{CapiVersionArg, ScalableArg, Scenario, SimulateArgs};
use karpenter_capi::simulate::disruption::{self, DisruptionReport};
use serde_json::Value;

use crate::common::scenario;

/// A disruption scenario with a deadline long enough for three side by side under load.
fn args(kind: Scenario, pods: usize, deployments: usize) -> SimulateArgs {
    SimulateArgs {
        pods,
        deployments,
        deadline: Duration::from_secs(400),
        ..scenario(kind)
    }
}

fn common_checks(r: &DisruptionReport) {
    let d = &r.disruption;
    assert!(r.invariants_ok(), "{r}");
    assert_eq!(d.budget_violations, 0, "{r}");
    assert_eq!(d.pdb_violations + d.do_not_disrupt_violations, 0, "{r}");
    assert_eq!(d.pods_unbound_at_end, 0, "no pod left pending: {r}");
    let json: Value = serde_json::from_str(&r.to_json()).expect("JSON report");
    for key in [
        "decisions",
        "nodes_before",
        "nodes_after",
        "nodes_lower_bound",
        "cost_per_hour_before",
        "cost_per_hour_after",
        "budget_violations",
        "pods_max_pending_ms",
        "claims_replaced",
    ] {
        assert!(!json["disruption"][key].is_null(), "{key} in {json}");
    }
    for key in ["empty", "underutilized", "drifted", "expired"] {
        assert!(
            json["disruption"]["decisions"][key].is_u64(),
            "{key} in {json}"
        );
    }
    assert!(
        json["latency_ms"]["pod_pending_to_bound"].is_object(),
        "the pods report's fields are kept"
    );
    assert_eq!(json["invariants_ok"], true);
}

#[actix::test]
async fn consolidation_removes_nodes_and_cost_within_budgets() {
    let a = args(Scenario::Consolidate, 200, 10);
    let r = disruption::run(&a).await.expect("the scenario runs");
    common_checks(&r);
    let d = &r.disruption;
    assert!(d.nodes_after < d.nodes_before, "{r}");
    assert!(d.cost_per_hour_after < d.cost_per_hour_before, "{r}");
    assert!(d.nodes_after >= d.nodes_lower_bound, "{r}");
    let decided = d.decisions.empty + d.decisions.underutilized;
    assert!(decided > 0, "{r}");
    assert_eq!(d.decisions.drifted + d.decisions.expired, 0, "{r}");
    // The HTML report's timeline was sampled through the disruption phase: it saw claims
    // terminate and ends at the report's cost.
    let samples = &r.pods.launch.timeline.samples;
    assert!(
        samples.iter().any(|s| s.claims.terminating > 0),
        "{samples:?}"
    );
    let last = samples.last().expect("samples");
    assert!(
        (last.cost_per_hour - d.cost_per_hour_after).abs() < 0.01,
        "{last:?} {r}"
    );
    let peak = samples.iter().map(|s| s.cost_per_hour).fold(0.0, f64::max);
    assert!(peak >= d.cost_per_hour_before - 0.01, "{peak} {r}");
    // Its passes held some nodes back, and the report counts them by blocker.
    assert!(
        d.blocked_nodes
            .values()
            .any(|c| c.max_nodes > 0 && c.seconds_held > 0),
        "{r}"
    );
}

#[actix::test]
async fn drift_replaces_every_claim_and_a_rollout_completes() {
    let a = args(Scenario::Drift, 100, 5);
    let r = disruption::run(&a).await.expect("the scenario runs");
    common_checks(&r);
    let d = &r.disruption;
    assert!(d.claims_before > 0, "{r}");
    assert_eq!(
        d.claims_replaced, d.claims_before,
        "every drifted claim replaced: {r}"
    );
    assert!(d.decisions.drifted > 0, "{r}");
    let rollout = d.rollout.as_ref().expect("a rollout");
    assert!(rollout.claims_before > 0, "{r}");
    assert_eq!(rollout.claims_replaced, rollout.claims_before, "{r}");
    assert_eq!(rollout.machines_up_to_date, rollout.machines, "{r}");
    // The pool reported the rollout's end, after the change, within the drift phase.
    let after = d
        .nodes_up_to_date_after_ms
        .expect("NodesUpToDate turned True");
    assert!(after > 0 && after <= d.phase_ms, "{after} {r}");
    let json: Value = serde_json::from_str(&r.to_json()).expect("JSON report");
    assert!(json["disruption"]["nodes_up_to_date_after_ms"].is_u64());
    // The timeline saw the pools' status climb back: up to date below all nodes after the
    // change, equal when it ended.
    let t = &r.pods.launch.timeline;
    let marked = |label: &str| {
        t.marks
            .iter()
            .find(|m| m.label == label)
            .unwrap_or_else(|| panic!("{label} marked: {:?}", t.marks))
            .at_ms
    };
    let (changed, up_to_date_at) = (marked("template changed"), marked("NodesUpToDate"));
    let during: Vec<_> = t
        .samples
        .iter()
        .filter(|s| s.at_ms > changed && s.at_ms < up_to_date_at)
        .map(|s| s.pool_status)
        .collect();
    assert!(
        during.iter().any(|p| p.up_to_date < p.nodes),
        "some nodes out of date while it rolled out: {during:?}"
    );
    let last = t.samples.last().expect("samples").pool_status;
    assert!(last.nodes > 0 && last.up_to_date == last.nodes, "{last:?}");
    // Every claim drifts at once and the pool's budget (10 % of 10 nodes) lets one or two go
    // at a time: the report counts the others as held by the budget.
    let budget = d.blocked_nodes.get("budget").copied().unwrap_or_default();
    assert!(budget.max_nodes > 0 && budget.seconds_held > 0, "{r}");
    assert!(json["disruption"]["blocked_nodes"]["budget"]["max_nodes"].is_u64());
}

/// `--pause-disruption`: the NodePool's pause, set with the template change, holds every
/// drifted claim until it is lifted, the report counting them under `paused`; then drift
/// replaces them all.
#[actix::test]
async fn a_pause_holds_drift_until_it_is_lifted() {
    let a = SimulateArgs {
        pause_disruption: Duration::from_secs(5),
        ..args(Scenario::Drift, 40, 4)
    };
    let r = disruption::run(&a).await.expect("the scenario runs");
    common_checks(&r);
    let d = &r.disruption;
    let pause = d.pause.expect("the pause reported");
    assert_eq!(
        (pause.held_ms, pause.drifted_while_paused),
        (5000, 0),
        "{r}"
    );
    let paused = d.blocked_nodes.get("paused").copied().unwrap_or_default();
    assert!(paused.max_nodes > 0 && paused.seconds_held >= 3, "{r}");
    assert_eq!(paused.at_end, 0, "{r}");
    assert_eq!(d.claims_replaced, d.claims_before, "{r}");
    assert!(
        d.nodes_up_to_date_after_ms.is_some_and(|ms| ms > 5000),
        "{r}"
    );
    let marks: Vec<&str> = r
        .pods
        .launch
        .timeline
        .marks
        .iter()
        .map(|m| m.label.as_str())
        .collect();
    assert!(marks.contains(&"pause lifted"), "{marks:?}");
}

/// The drift scenario on MachinePools with MachinePool Machines: every drifted claim replaced,
/// then the largest pool rolled out to a new version by its provider while the controller drifts
/// the claims bound under the old template, every one replaced and every Machine on the new
/// version, invariants (no leak, no double binding) holding.
async fn drift_and_a_pool_rollout(version: CapiVersionArg) {
    let a = SimulateArgs {
        scalable: ScalableArg::Machinepools,
        cluster_api_version: version,
        ..args(Scenario::Drift, 100, 5)
    };
    let r = disruption::run(&a).await.expect("the scenario runs");
    common_checks(&r);
    let d = &r.disruption;
    assert!(d.claims_before > 0, "{r}");
    assert_eq!(d.claims_replaced, d.claims_before, "{r}");
    let rollout = d.rollout.as_ref().expect("a rollout");
    assert!(
        rollout.machine_deployment.starts_with("MachinePool/"),
        "{r}"
    );
    assert!(rollout.claims_before > 0, "{r}");
    assert_eq!(rollout.claims_replaced, rollout.claims_before, "{r}");
    // The drifted claims' replacements go to the cheapest room, which need not be this pool:
    // it may end with no Machine at all (seen on a loaded machine), and then none is outdated.
    assert_eq!(rollout.machines_up_to_date, rollout.machines, "{r}");
}

#[actix::test]
async fn drift_and_a_pool_rollout_complete_on_machine_pools_v1beta2() {
    drift_and_a_pool_rollout(CapiVersionArg::V1beta2).await;
}

#[actix::test]
async fn drift_and_a_pool_rollout_complete_on_machine_pools_v1beta1() {
    drift_and_a_pool_rollout(CapiVersionArg::V1beta1).await;
}

#[actix::test]
async fn expiration_replaces_every_claim() {
    let a = args(Scenario::Expire, 100, 5);
    let r = disruption::run(&a).await.expect("the scenario runs");
    common_checks(&r);
    let d = &r.disruption;
    assert!(d.claims_before > 0, "{r}");
    assert_eq!(
        d.claims_replaced, d.claims_before,
        "every claim expired: {r}"
    );
    assert_eq!(d.decisions.expired, d.claims_before, "{r}");
}
