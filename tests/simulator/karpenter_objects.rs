//! `simulate --karpenter-objects management`: the launch, drain and consolidate scenarios with
//! Karpenter's objects in the management cluster apart, small. The invariants hold, the
//! report's counts read the servers where the claims and Machines are, and the workload
//! cluster holds none of Karpenter's objects.

use karpenter_capi::cli::{KarpenterObjects, Scenario, SimulateArgs};
use karpenter_capi::simulate::run_scenario;
use serde_json::Value;

use crate::common::scenario;

/// Runs `args` in the management-cluster layout: the report's JSON, once the invariants held
/// and the workload cluster was seen to hold no Karpenter object.
async fn run(args: SimulateArgs) -> Value {
    let args = SimulateArgs {
        karpenter_objects: KarpenterObjects::Management,
        ..args
    };
    let (outcome, kept) = run_scenario(&args).await.expect("scenario");
    assert!(outcome.invariants_ok, "{}", outcome.text);
    let cluster = kept.sim.cluster();
    for kind in ["nodeclaims", "nodepools", "clusterapinodeclasses"] {
        assert!(
            cluster.store().list(kind, None).is_empty(),
            "no {kind} in the workload cluster"
        );
    }
    assert!(!cluster.capi_store().list("nodepools", None).is_empty());
    serde_json::from_str(&outcome.json).expect("JSON report")
}

fn count(json: &Value, pointer: &str) -> u64 {
    json.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_default()
}

#[actix::test]
async fn launch_counts_the_claims_and_machines_in_the_management_cluster() {
    let json = run(SimulateArgs {
        claims: 12,
        ..scenario(Scenario::Launch)
    })
    .await;
    assert_eq!(count(&json, "/claims/initialized"), 12, "{json:#}");
    assert_eq!(count(&json, "/machines/created"), 12, "{json:#}");
    assert_eq!(count(&json, "/machines/bound"), 12, "{json:#}");
    let targets = &json["api"]["writes_by_target"];
    assert!(count(targets, "/patch nodeclaims~1status") > 0, "{targets}");
}

#[actix::test]
async fn drain_deletes_claims_in_the_management_cluster_and_drains_their_nodes() {
    let json = run(SimulateArgs {
        pods: 30,
        ..scenario(Scenario::Drain)
    })
    .await;
    let deleted = count(&json, "/termination/claims_deleted");
    assert!(deleted > 0, "{json:#}");
    assert_eq!(count(&json, "/termination/drained"), deleted, "{json:#}");
    assert_eq!(count(&json, "/termination/machines_released"), deleted);
    assert_eq!(count(&json, "/termination/pdb_violations"), 0);
}

#[actix::test]
async fn consolidate_removes_nodes_whose_claims_are_in_the_management_cluster() {
    let json = run(SimulateArgs {
        pods: 30,
        ..scenario(Scenario::Consolidate)
    })
    .await;
    assert!(count(&json, "/claims/deleted") > 0, "{json:#}");
    assert!(
        count(&json, "/machines/created") > count(&json, "/machines/bound"),
        "fewer Machines after consolidation: {json:#}"
    );
}
