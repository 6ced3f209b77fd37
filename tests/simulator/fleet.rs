//! Issue 45, "Simulated fleet": `simulate --clusters 3 --scenario pods --pods 30` stands up three
//! simulated workload clusters behind one management API server, one controller in fleet mode
//! serves them all, and the report holds one pods report per cluster and a summary that adds
//! them up. No timing assertions; the scenario's deadline only guards hangs.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use karpenter_capi::cli::SimulateArgs;
use karpenter_capi::simulate::{self, Error, fleet, pods};
use serde_json::Value;

#[actix::test]
async fn a_simulated_fleet_binds_every_pod_in_every_cluster() {
    let args = SimulateArgs::from_words(&["--clusters", "3", "--scenario", "pods", "--pods", "30"])
        .expect("simulate's arguments");
    let report = fleet::run(&args).await.expect("the fleet's scenario");

    assert_eq!(report.clusters.len(), 3, "one report per cluster");
    let names: BTreeSet<&str> = report.clusters.iter().map(|c| c.cluster.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["fleet-0/sim", "fleet-1/sim", "fleet-2/sim"])
    );
    for c in &report.clusters {
        let r = c
            .result
            .as_ref()
            .unwrap_or_else(|e| panic!("{}: {e}", c.cluster));
        assert_eq!(r.pods.pending_at_start, 30, "{}", c.cluster);
        assert_eq!(r.pods.bound, 30, "every pod bound in {}: {r}", c.cluster);
        assert!(
            r.launch.invariants_ok,
            "{}: {:?}",
            c.cluster, r.launch.problems
        );
        // The fleet's controller did the work in this cluster: its claims launched Machines
        // in this cluster's namespace of the management cluster, each bound to a claim.
        assert!(r.launch.api.writes > 0, "{}: {r}", c.cluster);
        // Its writes to the shared management cluster (the replicas it asked for, the Machines
        // it bound) are this cluster's cost too.
        let by_target = &r.launch.api.writes_by_target;
        assert!(
            r.launch.api.replica_writes > 0,
            "{}: {by_target:?}",
            c.cluster
        );
        assert!(by_target.contains_key("patch machines"), "{by_target:?}");
        assert!(r.launch.claims.initialized > 0, "{}: {r}", c.cluster);
        assert_eq!(r.launch.machines.created, r.launch.machines.bound, "{r}");
        assert!(c.cost_per_hour > 0.0, "{}", c.cluster);
        assert!(c.turns.starts >= 1, "the fleet served {}", c.cluster);
    }

    let s = report.summary();
    let ran: Vec<_> = report
        .clusters
        .iter()
        .filter_map(|c| c.result.as_ref().ok())
        .collect();
    assert_eq!((s.clusters, s.clusters_failed), (3, 0));
    assert!(s.invariants_ok && s.invariant_violations == 0, "{s:?}");
    assert_eq!(s.pods_pending_at_start, 90);
    assert_eq!(s.pods_bound, 90);
    let sum = |f: fn(&&karpenter_capi::simulate::pods::PodReport) -> usize| {
        ran.iter().map(f).sum::<usize>()
    };
    assert_eq!(s.claims_requested, sum(|r| r.launch.claims.requested));
    assert_eq!(s.claims_initialized, sum(|r| r.launch.claims.initialized));
    assert_eq!(s.nodes_created, sum(|r| r.nodes.created));
    assert_eq!(s.nodes_remaining, sum(|r| r.nodes.remaining));
    assert_eq!(s.machines_created, sum(|r| r.launch.machines.created));
    let cost: f64 = report.clusters.iter().map(|c| c.cost_per_hour).sum();
    assert!((s.cost_per_hour - cost).abs() < 0.01, "{s:?}");
    assert!(report.invariants_ok());

    // `--report json`: { "clusters": [...], "summary": {...} }.
    let json: Value = serde_json::from_str(&report.to_json()).expect("the JSON report");
    let clusters = json["clusters"].as_array().expect("clusters");
    assert_eq!(clusters.len(), 3);
    for c in clusters {
        assert_eq!(c["pods"]["bound"], 30, "{c}");
        assert_eq!(c["invariants_ok"], true, "{c}");
        assert!(c["cluster"].is_string() && c["backend"].is_object(), "{c}");
    }
    assert_eq!(json["summary"]["pods_bound"], 90, "{json}");
    assert_eq!(json["summary"]["clusters"], 3, "{json}");
}

/// A fleet's cluster is done when every pod is bound: pods that no controller acted on for a
/// while (here none runs) are not given up on, as the single-cluster scenario gives up on pods
/// that fit nowhere after 15 s without a change; the cluster fails at its deadline instead.
#[actix::test]
async fn a_fleet_cluster_does_not_give_up_on_pending_pods_before_its_deadline() {
    let args = SimulateArgs::from_words(&["--scenario", "pods", "--pods", "5"])
        .expect("simulate's arguments");
    let sim = simulate::start_sim(&args)
        .await
        .expect("a simulated cluster");
    pods::create_deployments(&sim, &args, |_, _| {})
        .await
        .expect("the Deployments");
    pods::wait_for_pods(&sim, 5, Duration::from_secs(30))
        .await
        .expect("their pods");
    let started = Instant::now();
    let settled = fleet::settle_every_pod(&sim, Duration::from_secs(20)).await;
    assert!(
        matches!(settled, Err(Error::Deadline(_))),
        "{settled:?} after {:?}",
        started.elapsed()
    );
}
