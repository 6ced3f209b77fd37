//! `simulate --from-cluster`: a served simulated cluster (the source) is read once, read-only,
//! loaded into a second simulated cluster (the copy), and the controller runs on the copy. The
//! report says what it did there; the source counts every request it received by verb.
//! No timing assertions; deadlines only guard hangs.

use std::time::Duration;

use karpenter_capi::cli::{Scenario, ServeArgs, SimulateArgs};
use karpenter_capi::sim::cluster::PodShape;
use karpenter_capi::simulate::from_cluster::{self, read::AGENT};
use karpenter_capi::simulate::{BackgroundSim, cluster_config, html, launch, standup};
use serde_json::Value;

use crate::common::scenario;

const NODES: usize = 12;
const RUNNING: usize = 48;
const PENDING: usize = 20;

/// The source: `NODES` Nodes stood up as `simulate --serve --scenario none` does (their
/// claims, Machines and NodePool as the controller left them), `RUNNING` pods on them, and a
/// Deployment of `PENDING` pods of 2 CPUs nothing placed: the source has no scheduler and no
/// controller, so they stay pending there.
async fn source(dir: &std::path::Path) -> BackgroundSim {
    let a = SimulateArgs {
        nodes: NODES,
        pods: RUNNING,
        serve: ServeArgs {
            serve: true,
            no_controller: true,
            // Not the default `./simulated.kubeconfig`: another test or run in the same
            // directory would point this test's controller at its own cluster.
            kubeconfig_out: Some(dir.join("source.kubeconfig")),
            ..ServeArgs::default()
        },
        ..scenario(Scenario::None)
    };
    let mut cfg = cluster_config(&a);
    cfg.scheduler = false;
    let sim = BackgroundSim::start(cfg).await.expect("source cluster");
    standup::stand_up(&sim, &a, false).await.expect("stand up");
    sim.run(|c| async move {
        c.create_deployment(
            launch::NAMESPACE,
            "pending",
            PENDING,
            &PodShape::new("2", "1Gi"),
        )
        .await
    })
    .await
    .expect("the source's runtime")
    .expect("the pending Deployment");
    let all = RUNNING + PENDING;
    let created = launch::wait_until(&sim, Duration::from_secs(120), || async {
        Ok(sim.cluster().store().list("pods", None).len() == all)
    })
    .await
    .expect("wait");
    assert!(created, "the Deployment's pods exist in the source");
    sim
}

#[actix::test]
async fn a_what_if_reads_the_source_only_and_reports_what_the_controller_does_to_the_copy() {
    crate::common::logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let source = source(dir.path()).await;
    let claims_before = source.cluster().store().list("nodeclaims", None).len();
    let running = from_cluster::start(&source.kubeconfig(), None, false)
        .await
        .expect("read and load the source");
    let placed = launch::wait_until(running.sim(), Duration::from_secs(300), || async {
        let pods = running.sim().cluster().store().list("pods", None);
        Ok(pods.len() == RUNNING + PENDING
            && pods.iter().all(|p| p["spec"]["nodeName"].is_string()))
    })
    .await
    .expect("wait");
    // The report's invariants are for a quiet copy, not one mid-launch.
    running.quiesce(false).await.expect("wait");
    let (report, kept) = running.finish();
    println!("{report}");
    assert!(placed, "every pending pod placed in the copy: {report}");

    // What was read and what the controller did to the copy.
    let read = &report.source.objects;
    for (kind, n) in [
        ("nodes", NODES),
        ("machines", NODES),
        ("nodeclaims", NODES),
        ("pods", RUNNING + PENDING),
        ("machinedeployments", 3),
        ("nodepools", 1),
        ("clusterapinodeclasses", 1),
        ("devmachinetemplates", 3),
    ] {
        assert_eq!(read.get(kind).copied(), Some(n), "{kind} read: {read:?}");
    }
    assert_eq!(report.pods.pending_at_start, PENDING, "{report}");
    assert_eq!(report.pods.placed, PENDING, "{report}");
    assert_eq!(report.disruption.nodes_before, NODES, "{report}");
    // Twelve nodes hold one 2-CPU pod each at most: the rest needed new claims.
    assert!(report.claims.created >= 1, "{report}");
    assert!(
        report.disruption.nodes_after > NODES
            && report.disruption.cost_per_hour_after > report.disruption.cost_per_hour_before,
        "{report}"
    );
    assert!(report.invariants_ok, "{report}");
    let json: Value = serde_json::from_str(&report.to_json()).expect("JSON report");
    assert_eq!(json["scenario"], "from-cluster");
    assert_eq!(json["pods"]["placed"], PENDING);
    let page = html::render(&report.to_json(), &report.timeline).expect("HTML report");
    assert!(page.contains("from-cluster"), "the page names the what-if");
    drop(kept);

    // The source: only reads, none of a Secret, nothing changed.
    let stats = source.cluster().stats();
    let verbs = stats.requests_by_verb(AGENT);
    assert!(verbs.get("list").copied().unwrap_or(0) > 0, "{verbs:?}");
    for verb in verbs.keys() {
        assert!(
            matches!(verb.as_str(), "get" | "list" | "watch"),
            "the source received a {verb}: {verbs:?}"
        );
    }
    let written: Vec<String> = stats
        .writes()
        .into_iter()
        .filter(|w| w.agent == AGENT)
        .map(|w| w.target())
        .collect();
    assert!(written.is_empty(), "written to the source: {written:?}");
    for verb in ["get", "list", "watch"] {
        assert_eq!(stats.requests(verb, "secrets", ""), 0, "{verb} secrets");
    }
    let store = source.cluster().store();
    assert_eq!(store.list("nodeclaims", None).len(), claims_before);
    let pending = store
        .list("pods", None)
        .iter()
        .filter(|p| !p["spec"]["nodeName"].is_string())
        .count();
    assert_eq!(pending, PENDING, "the source's pods untouched");
}
