//! The `simulate` scenarios with the simulated API server failing the controller's own
//! requests (`--faults`): errors before anything is applied, writes that land but are answered
//! with an error, 429s with `Retry-After`, watches cut and resumed into a 410. Consolidation
//! still removes nodes, the drain still drains, a launch burst still launches, and the durable
//! invariants (one Machine per claim, none leaked, replicas equal to live Machines) hold in
//! each. The deadline only guards against hangs.

use std::time::Duration;

use karpenter_capi::cli::{Scenario, SimulateArgs};
use karpenter_capi::simulate::{disruption, drain, launch};

const FAULTS: &str = "errors=15%,ambiguous=5%,throttle=2%,watch-expire=10%,watch-cuts=5s";

fn under_faults(kind: Scenario, words: &[&str]) -> SimulateArgs {
    let mut all = vec!["--faults", FAULTS];
    all.extend_from_slice(words);
    let mut args = SimulateArgs::from_words(&all).expect("arguments");
    args.scenario = kind;
    args.deadline = Duration::from_secs(600);
    args
}

#[actix::test]
async fn consolidation_removes_nodes_under_faults() {
    let args = under_faults(
        Scenario::Consolidate,
        &["--pods", "200", "--deployments", "10"],
    );
    let r = disruption::run(&args).await.expect("the scenario runs");
    let d = &r.disruption;
    assert!(r.invariants_ok(), "{r}");
    assert!(d.nodes_after < d.nodes_before, "{r}");
    assert!(d.nodes_after >= d.nodes_lower_bound, "{r}");
    assert_eq!(d.budget_violations, 0, "{r}");
    assert_eq!(d.pdb_violations + d.do_not_disrupt_violations, 0, "{r}");
    assert_eq!(d.pods_unbound_at_end, 0, "{r}");
    // The report says where the phase's time went: the commands, their drains, the releases.
    let t = &d.time;
    assert!(t.commands > 0 && t.stage_s.contains_key("mark"), "{r}");
    assert!(t.drains > 0 && t.terminations > 0, "{r}");
    assert!(
        t.api_errors > 0,
        "the controller's own requests met the faults: {r}"
    );
}

#[actix::test]
async fn the_drain_drains_under_faults() {
    let args = under_faults(
        Scenario::Drain,
        &[
            "--pods",
            "60",
            "--deployments",
            "6",
            "--machine-deployments",
            "2",
        ],
    );
    let r = drain::run(&args).await.expect("the scenario runs");
    let t = &r.termination;
    assert!(r.invariants_ok(), "{r}");
    assert!(t.claims_deleted > 0, "{r}");
    assert_eq!(t.drained, t.claims_deleted, "{r}");
    assert_eq!(t.machines_released, t.claims_deleted, "{r}");
    assert_eq!(t.pdb_violations + t.do_not_disrupt_violations, 0, "{r}");
}

#[actix::test]
async fn a_launch_burst_launches_under_faults() {
    let args = under_faults(Scenario::Launch, &["--claims", "100"]);
    let r = launch::run(&args).await.expect("the scenario runs");
    assert!(r.invariants_ok, "{r}");
    assert_eq!(r.machines.leaked + r.machines.double_bound, 0, "{r}");
    assert_eq!(r.claims.initialized, r.claims.requested, "{r}");
}
