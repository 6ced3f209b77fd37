//! A paused Cluster on real Cluster API v1.14.2 (v1beta2) and v1.10.10 (v1beta1), the same
//! body at both: while the pause holds, no replica write lands, no claim is made or deleted and
//! Cluster API makes or deletes no Machine; once it lifts, both go on.

use std::time::Duration;

use karpenter_capi::controlplane::cluster_api::{MANAGER_USER, RELEASE_V1BETA1, RELEASE_V1BETA2};
use karpenter_capi::sim::cluster::PodShape;
use karpenter_capi::simulate::pods::seed_of;
use serde_json::{Value, json};

use super::{
    assert_cluster_api_did_its_part, controller_md_writes_since, env_stops_leaving_nothing,
    real_args, report_names_real_cluster_api,
};
use crate::assets;
use crate::common::claims::fast_disruption;
use crate::common::{Env, NS};

pub fn tests() -> Vec<assets::Test> {
    trials![
        @actix a_paused_cluster_holds_launch_and_disruption_on_real_cluster_api
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        @actix a_paused_cluster_holds_launch_and_disruption_on_real_cluster_api_v1beta1
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApiV1beta1],
    ]
}

/// Whether every MachineDeployment carries Cluster API's own `Paused` condition at `status`
/// (`"True"` or `"False"`): the real manager's word that it sees the pause. v1.10 writes it
/// among the v1beta2 conditions it keeps beside the v1beta1 ones (`status.v1beta2`).
fn manager_says_paused(env: &Env, version: &str, status: &str) -> bool {
    let at = if version == "v1beta1" {
        "/status/v1beta2/conditions"
    } else {
        "/status/conditions"
    };
    let paused = |md: &Value| {
        md.pointer(at)
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Paused"))
            .is_some_and(|c| c["status"] == status)
    };
    let mds = env.list("machinedeployments");
    !mds.is_empty() && mds.iter().all(paused)
}

/// A paused Cluster (`spec.paused`) on real Cluster API v1.14.2, as
/// `tests/provisioning/autoscaler.rs::a_paused_cluster_holds_its_machine_deployments_until_it_resumes`
/// and `tests/disruption/disruption.rs::a_paused_clusters_empty_node_waits_for_the_pause_to_lift`
/// on the stand-in: while the real manager reports its MachineDeployments `Paused`, pending pods
/// get no claim, no replica write lands and no Machine is made; once it lifts, the manager makes
/// the Machines and the pods bind. Then, paused again, the emptied nodes stay (no claim deleted,
/// no replica write, no Machine deleted) until the pause lifts, when they are consolidated away
/// and Cluster API deletes their Machines.
async fn a_paused_cluster_holds_launch_and_disruption_on_real_cluster_api() {
    paused_cluster("v1beta2", RELEASE_V1BETA2).await;
}

/// The paused Cluster on v1.10.10 (v1beta1 only).
async fn a_paused_cluster_holds_launch_and_disruption_on_real_cluster_api_v1beta1() {
    paused_cluster("v1beta1", RELEASE_V1BETA1).await;
}

async fn paused_cluster(version: &str, release: &str) {
    // The cluster `simulate --control-plane real --cluster-api real` runs.
    let args = real_args(version, &[]);
    let env = Env::builder()
        .cluster(karpenter_capi::simulate::cluster_config(&args))
        .seeds((0..2).map(|i| seed_of(i, 50)).collect())
        .short_batches()
        .tune(|s| s.disruption = fast_disruption())
        .start()
        .await;
    let cluster = env.sim.cluster().clone();
    report_names_real_cluster_api(&cluster, release);

    // Paused: the controller and Cluster API's manager both see it.
    env.set_cluster_paused(true).await;
    env.until(
        "Cluster API's manager reports the MachineDeployments Paused",
        |e| manager_says_paused(e, version, "True"),
    )
    .await;
    let paused_at = cluster.stats().now_ms();
    env.deployment("web", 2, PodShape::new("100m", "128Mi"))
        .await;
    env.until("the pods exist, pending", |e| e.list("pods").len() == 2)
        .await;
    // Several provisioning batches (200 ms idle, 2 s at most) go by.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        env.bound_pods(),
        0,
        "a pod bound while the Cluster is paused"
    );
    assert_eq!(
        controller_md_writes_since(&cluster, paused_at),
        [],
        "a replica write while the Cluster is paused"
    );
    let claims = env.list("nodeclaims");
    assert!(
        claims.is_empty(),
        "a claim while the Cluster is paused (nothing is offered): {claims:#?}"
    );
    assert!(env.list("machines").is_empty(), "a Machine while paused");

    // Resumed: the controller writes replicas, Cluster API makes the Machines, the pods bind.
    env.set_cluster_paused(false).await;
    env.until_quiet("the pods bound once the pause lifted", |e| {
        e.bound_pods() == 2
    })
    .await;
    assert!(
        !controller_md_writes_since(&cluster, paused_at).is_empty(),
        "no replica write after the pause lifted"
    );
    let launched = env.list("nodeclaims").len();
    assert!(launched >= 1, "no claim for the pods");
    assert_cluster_api_did_its_part(&cluster, launched).await;
    assert!(
        manager_says_paused(&env, version, "False"),
        "the Paused condition lifted"
    );

    // Paused again, the Deployment emptied: its nodes are empty and consolidation may take
    // them, but not while the pause holds.
    env.set_cluster_paused(true).await;
    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s",
                              "budgets": [{"nodes": "100%"}]}),
    )
    .await;
    let paused_again_at = cluster.stats().now_ms();
    let machines_before: Vec<Value> = env.list("machines");
    env.sim
        .run(|c| async move { c.scale_deployment(NS, "web", 0).await })
        .await
        .expect("the cluster's runtime")
        .expect("scale the Deployment to 0");
    env.until("the pods gone", |e| e.list("pods").is_empty())
        .await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let claims = env.list("nodeclaims");
    assert_eq!(claims.len(), launched, "a claim went while paused");
    assert!(
        claims
            .iter()
            .all(|c| c.pointer("/metadata/deletionTimestamp").is_none()),
        "a claim deleted while the Cluster is paused: {claims:#?}"
    );
    assert_eq!(
        controller_md_writes_since(&cluster, paused_again_at),
        [],
        "a replica write while the Cluster is paused"
    );
    let machines = env.list("machines");
    assert_eq!(
        machines.len(),
        machines_before.len(),
        "a Machine went while paused"
    );
    assert!(
        machines
            .iter()
            .all(|m| m.pointer("/metadata/deletionTimestamp").is_none()),
        "a Machine deleted while the Cluster is paused"
    );

    // Resumed: the empty nodes go, Cluster API deleting their Machines and Nodes.
    env.set_cluster_paused(false).await;
    env.until_quiet("the empty nodes consolidated once the pause lifted", |e| {
        e.list("nodeclaims").is_empty()
            && e.list("machines").is_empty()
            && e.list("nodes").is_empty()
    })
    .await;
    assert!(
        !controller_md_writes_since(&cluster, paused_again_at).is_empty(),
        "no replica write after the pause lifted"
    );
    let by_manager = cluster
        .stats()
        .writes_for("machines", "")
        .into_iter()
        .filter(|w| w.at_ms > paused_again_at && w.verb == "delete")
        .filter(|w| w.agent.starts_with(&format!("{MANAGER_USER} ")))
        .count();
    assert_eq!(by_manager, launched, "Cluster API deleted the Machines");
    env.invariants_hold();
    env_stops_leaving_nothing(env);
}
