//! Static NodePools and node repair on real Cluster API v1.14.2 (v1beta2) and v1.10.10
//! (v1beta1), the same scenario bodies at both: `simulate --control-plane real --cluster-api
//! real --scenario static` and `--scenario repair`, the simulator playing only the
//! infrastructure provider and the kubelets.

use k8s_openapi::api::events::v1::Event;
use karpenter_capi::controlplane::cluster_api::{MANAGER_USER, RELEASE_V1BETA1, RELEASE_V1BETA2};
use kube::Api;
use serde_json::Value;

use super::{
    assert_cluster_api_did_its_part, real_args, report_names_real_cluster_api,
    stops_leaving_nothing,
};
use crate::assets;

pub fn tests() -> Vec<assets::Test> {
    trials![
        @actix the_static_flow_runs_on_real_cluster_api
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        @actix the_static_flow_runs_on_real_cluster_api_v1beta1
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApiV1beta1],
        @actix the_repair_scenario_runs_on_real_cluster_api
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        @actix the_repair_scenario_runs_on_real_cluster_api_v1beta1
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApiV1beta1],
    ]
}

/// `simulate --control-plane real --cluster-api real --scenario static --pods 10` (v1.14.2): the
/// static NodePool launches its 10 claims, a Node deleted under it is replaced, then a template
/// change drifts every node and each is replaced within the Drifted budget (10 %: one node),
/// Cluster API making and removing the Machines. 56-160 s here: some runs stall 30-40 s once
/// to three times where a raise and a decrement cancel out in Cluster API (docs/fidelity.md).
/// By hand `--pods 100` passed too.
async fn the_static_flow_runs_on_real_cluster_api() {
    static_flow("v1beta2", RELEASE_V1BETA2).await;
}

/// The static flow on v1.10.10 (v1beta1 only).
async fn the_static_flow_runs_on_real_cluster_api_v1beta1() {
    static_flow("v1beta1", RELEASE_V1BETA1).await;
}

async fn static_flow(version: &str, release: &str) {
    use karpenter_capi::simulate::static_pool;

    const REPLICAS: usize = 10;
    crate::common::logs();
    let args = real_args(
        version,
        &["--scenario", "static", "--pods", "10", "--deadline", "300s"],
    );
    let (report, kept) = static_pool::run_kept(&args)
        .await
        .unwrap_or_else(|e| panic!("the static scenario on real Cluster API: {e}"));
    let cluster = kept.sim.cluster().clone();
    assert!(report.invariants_ok, "invariants: {:?}", report.problems);
    assert_eq!(report.replicas, REPLICAS, "{report}");
    let names: Vec<&str> = report.phases.iter().map(|p| p.phase.as_str()).collect();
    assert_eq!(
        names,
        [
            "launched",
            "a Node deleted",
            "every node drifted and replaced"
        ],
        "{report}"
    );
    let (launched, deleted, drifted) = (&report.phases[0], &report.phases[1], &report.phases[2]);
    // Each phase ends once the pool holds exactly its replicas, all initialized and none
    // deleting (the deleted Node's claim, still finalizing, is not one of them).
    for p in [launched, deleted, drifted] {
        assert_eq!((p.live, p.initialized), (REPLICAS, REPLICAS), "{report}");
    }
    // The deleted Node's claim goes and one replacement comes; the drifted ones are replaced
    // before they go, one at a time (10 % of 10 nodes).
    assert!(
        deleted.fewest_live >= REPLICAS - 1 && deleted.most_live == REPLICAS,
        "{report}"
    );
    assert!(
        drifted.fewest_live == REPLICAS && drifted.most_live <= REPLICAS + 1,
        "{report}"
    );
    assert_eq!(
        drifted.created,
        2 * REPLICAS + 1,
        "one launch per deletion and per drifted node: {report}"
    );
    report_names_real_cluster_api(&cluster, release);
    assert_cluster_api_did_its_part(&cluster, drifted.created).await;
    // Nothing leaked: one live Machine per live claim, each on a Node.
    let live_machines = cluster
        .store()
        .list("machines", None)
        .into_iter()
        .filter(|m| m.pointer("/metadata/deletionTimestamp").is_none())
        .count();
    assert_eq!(live_machines, REPLICAS, "{report}");
    stops_leaving_nothing(&cluster, kept);
}

/// `simulate --control-plane real --cluster-api real --scenario repair --pods 5` (v1.14.2): a
/// static pool of 5 with node repair on (due three seconds after a Node is sickened). One Node
/// gone `Ready=False` is replaced (its claim deleted, Cluster API deleting its Machine and
/// making the new one); then more than a fifth of the pool `Unknown` is held back, each such
/// Node told by a `NodeRepairBlocked` Event the phase reads from the real backend's mirror,
/// which must therefore hold the Events the API server serves.
async fn the_repair_scenario_runs_on_real_cluster_api() {
    repair_scenario("v1beta2", RELEASE_V1BETA2).await;
}

/// The repair scenario on v1.10.10 (v1beta1 only).
async fn the_repair_scenario_runs_on_real_cluster_api_v1beta1() {
    repair_scenario("v1beta1", RELEASE_V1BETA1).await;
}

async fn repair_scenario(version: &str, release: &str) {
    use karpenter_capi::simulate::static_pool;

    const REPLICAS: usize = 5;
    let args = real_args(
        version,
        &["--scenario", "repair", "--pods", "5", "--deadline", "300s"],
    );
    let (report, kept) = static_pool::run_kept(&args)
        .await
        .unwrap_or_else(|e| panic!("the repair scenario on real Cluster API: {e}"));
    let cluster = kept.sim.cluster().clone();
    assert!(report.invariants_ok, "invariants: {:?}", report.problems);
    // The JSON report (what `--report json` prints) carries the same figures.
    let json: Value = serde_json::from_str(&report.to_json()).expect("the JSON report");
    assert_eq!(json["scenario"], "repair", "{json}");
    assert_eq!(json["invariants_ok"], true, "{json}");
    assert_eq!(report.replicas, REPLICAS, "{report}");
    let names: Vec<&str> = report.phases.iter().map(|p| p.phase.as_str()).collect();
    assert_eq!(
        names,
        [
            "launched",
            "one Node Ready=False, replaced",
            "over a fifth Unknown, held back"
        ],
        "{report}"
    );
    let (launched, replaced, held) = (&report.phases[0], &report.phases[1], &report.phases[2]);
    for p in [launched, replaced, held] {
        assert_eq!((p.live, p.initialized), (REPLICAS, REPLICAS), "{report}");
    }
    // Exactly one replacement, and none while the Unknown Nodes are held back.
    assert_eq!(launched.created, REPLICAS, "{report}");
    assert_eq!(replaced.created, REPLICAS + 1, "{report}");
    assert_eq!(held.created, REPLICAS + 1, "{report}");
    assert_eq!(
        held.fewest_live, REPLICAS,
        "a claim went while held back: {report}"
    );
    // Upstream's rule: a fifth of the pool rounded up may be repaired; the scenario sickens one
    // more, so every one of them is held back.
    let over_a_fifth = karpenter_capi::view::repair::threshold(REPLICAS) + 1;
    assert_eq!(
        (report.repaired, report.repair_blocked),
        (1, over_a_fifth),
        "(replaced, held back): {report}"
    );
    assert_eq!(
        (json["repaired"].as_u64(), json["repair_blocked"].as_u64()),
        (Some(1), Some(over_a_fifth as u64)),
        "{json}"
    );

    // The mirror's Events (what the phase read) are the API server's: the same NodeRepairBlocked
    // Nodes in both, one per held-back Node.
    let blocked_nodes = |events: Vec<Value>| -> std::collections::BTreeSet<String> {
        events
            .iter()
            .filter(|e| e["reason"] == "NodeRepairBlocked" && e["regarding"]["kind"] == "Node")
            .filter_map(|e| e["regarding"]["name"].as_str().map(String::from))
            .collect()
    };
    let mirrored = blocked_nodes(cluster.store().list("events.events.k8s.io", None));
    let served: Vec<Value> = Api::<Event>::all(cluster.new_client().expect("a client"))
        .list(&Default::default())
        .await
        .expect("list Events")
        .items
        .into_iter()
        .map(|e| serde_json::to_value(e).expect("an Event as JSON"))
        .collect();
    let served = blocked_nodes(served);
    assert_eq!(mirrored.len(), over_a_fifth, "mirrored: {mirrored:?}");
    assert_eq!(mirrored, served, "the mirror's NodeRepairBlocked Nodes");

    // Cluster API made every Machine (the replacement's too) and deleted the one released.
    report_names_real_cluster_api(&cluster, release);
    assert_cluster_api_did_its_part(&cluster, held.created).await;
    let deleted_by_manager = cluster
        .stats()
        .writes_for("machines", "")
        .into_iter()
        .filter(|w| w.verb == "delete" && w.agent.starts_with(&format!("{MANAGER_USER} ")))
        .count();
    assert_eq!(deleted_by_manager, 1, "Machines Cluster API deleted");
    stops_leaving_nothing(&cluster, kept);
}
