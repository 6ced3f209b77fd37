//! Two `simulate` runs where something holds the controller back, through the scenario runner
//! (text, JSON and HTML reports): drift backing off while every offering's launches fail
//! (`--fail-replacements`), and a CapacityQuota holding pods pending (`--scenario quota`).

use std::time::Duration;

use karpenter_capi::cli::{Scenario, SimulateArgs};
use karpenter_capi::simulate::{html, output::Outcome, run_scenario};
use serde_json::Value;

use crate::common::scenario;

/// The JSON report, its HTML page rendered, and the timeline's phase marks.
fn read(outcome: &Outcome) -> (Value, String, Vec<String>) {
    let json: Value = serde_json::from_str(&outcome.json).expect("JSON report");
    let page = html::render(&outcome.json, &outcome.timeline).expect("the HTML report");
    let marks = outcome
        .timeline
        .marks
        .iter()
        .map(|m| m.label.clone())
        .collect();
    (json, page, marks)
}

/// Launches fail on every MachineDeployment for 30 s from the template change (create timeout
/// 10 s: three times over, so a loaded machine's slower drift still sees a replacement time out): the drift replacements time out, the pool's drift backs off (its counter and Events),
/// and once the failures lift every drifted claim is replaced and `NodesUpToDate` turns True.
#[actix::test]
async fn drift_backs_off_while_replacements_fail_and_finishes_after_the_lift() {
    let a = SimulateArgs {
        pods: 40,
        deployments: 4,
        fail_replacements: Duration::from_secs(30),
        deadline: Duration::from_secs(400),
        ..scenario(Scenario::Drift)
    };
    let (outcome, _kept) = run_scenario(&a).await.expect("the scenario runs");
    assert!(outcome.invariants_ok, "{}", outcome.text);
    let (json, page, marks) = read(&outcome);
    let d = &json["disruption"];
    let b = &d["backoff"];
    assert!(b["backoffs"].as_u64().is_some_and(|n| n > 0), "{b}");
    assert!(b["backoff_events"].as_u64().is_some_and(|n| n > 0), "{b}");
    assert!(
        b["failed_replacements"].as_u64().is_some_and(|n| n > 0),
        "{b}"
    );
    assert!(
        b["longest_backoff_ms"].as_u64().is_some_and(|n| n >= 5000),
        "{b}"
    );
    assert_eq!(b["create_timeout_ms"], 10_000, "{b}");
    assert!(
        b["up_to_date_after_lift_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0),
        "drift finished after the lift: {b}"
    );
    assert!(
        b["drifted_after_lift"].as_u64().is_some_and(|n| n > 0),
        "{b}"
    );
    assert_eq!(d["claims_replaced"], d["claims_before"], "{d}");
    assert_eq!(d["budget_violations"], 0, "{d}");
    // Not asserted: `blocked_nodes.backoff`, sampled once a second, can miss a 5 s window on a
    // loaded machine.
    for mark in ["launches failing", "failures lifted", "NodesUpToDate"] {
        assert!(marks.iter().any(|m| m == mark), "{mark}: {marks:?}");
    }
    assert!(outcome.text.contains("drift back-offs"), "{}", outcome.text);
    assert!(
        page.contains("id=\"summary-backoff\""),
        "the HTML summary says it"
    );
}

/// A quota of half the pods' CPUs on the NodePool's nodes: provisioning stops at exactly the
/// limit, never above it at any sample; the pods left pending are told the quota holds them;
/// its status counts the CPUs; once it is deleted every pod is bound.
#[actix::test]
async fn a_capacity_quota_holds_pods_at_its_limit_until_it_is_deleted() {
    let a = SimulateArgs {
        pods: 40,
        deployments: 4,
        ..scenario(Scenario::Quota)
    };
    let (outcome, _kept) = run_scenario(&a).await.expect("the scenario runs");
    assert!(outcome.invariants_ok, "{}", outcome.text);
    let (json, page, marks) = read(&outcome);
    let q = &json["quota"];
    // 10 pods each of 250m, 500m, 1 and 1500m: 32.5 CPUs, half rounded down to even: 16.
    assert_eq!(q["limit_cpu"], 16, "{q}");
    assert_eq!(q["provisioned_cpu"], 16.0, "{q}");
    assert_eq!(q["max_provisioned_cpu"], 16.0, "{q}");
    assert_eq!(q["status_used"]["cpu"], "16", "{q}");
    assert_eq!(q["reconciled"], "True", "{q}");
    let held = q["pods_held_by_quota"].as_u64().unwrap_or(0);
    assert!(held > 0 && Some(held) == q["pods_pending"].as_u64(), "{q}");
    assert!(
        q["held_message"].as_str().is_some_and(
            |m| m.contains("CapacityQuota \"sim-nodepool\" has reached its limit on \"cpu\"")
        ),
        "{q}"
    );
    assert_eq!(q["pods_bound_after_removal"], 40, "{q}");
    assert_eq!(json["pods"]["bound"], 40);
    for mark in ["quota held", "quota deleted", "pods bound"] {
        assert!(marks.iter().any(|m| m == mark), "{mark}: {marks:?}");
    }
    assert!(
        outcome.text.contains("held by the quota"),
        "{}",
        outcome.text
    );
    assert!(
        page.contains("id=\"summary-quota\""),
        "the HTML summary says it"
    );
}
