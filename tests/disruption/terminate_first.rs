//! Terminate-first drift in a dynamic NodePool (`--feature-gates TerminateFirstDrift=true`):
//! the NodePool's only MachineDeployment is at its `cluster-api-autoscaler-node-group-max-size`,
//! so a drifted node's replacement has no room beside it. Without the gate the drift waits; with
//! it each drifted node goes first within the budget, its pods wait pending, and the
//! provisioner launches into the slot it freed, never above the max size.

use std::time::Duration;

use crate::common;
use crate::disruption::fast;
use common::*;
use karpenter_capi::api::wellknown::NODEPOOL_LABEL;
use karpenter_capi::sim::cluster::PodShape;
use karpenter_capi::simulate::launch::seed_of;

const MAX_SIZE: usize = 2;

/// md-0 (4 CPUs, at most two), the scheduler on, and a Deployment of two 3-CPU pods: two
/// claims, the MachineDeployment full. Returns the claims.
async fn full_machine_deployment(gate: bool) -> (Env, Vec<String>) {
    let mut settings = fast();
    settings.disruption.terminate_first_drift = gate;
    let env = Env::builder()
        .cluster(karpenter_capi::sim::cluster::SimClusterConfig {
            scheduler: true,
            ..fast_cluster()
        })
        .seeds(vec![seed_of(0, MAX_SIZE)])
        .settings(settings)
        .start()
        .await;
    env.deployment("web", MAX_SIZE, PodShape::new("3", "256Mi"))
        .await;
    env.until("both pods bound", |e| e.bound_pods() == MAX_SIZE)
        .await;
    let claims = live_claims(&env);
    assert_eq!(claims.len(), MAX_SIZE, "one claim per pod");
    assert_eq!(env.replicas("md-0"), MAX_SIZE as i64);
    (env, claims)
}

fn live_claims(env: &Env) -> Vec<String> {
    env.list("nodeclaims")
        .iter()
        .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
        .filter(|c| !c["metadata"]["labels"][NODEPOOL_LABEL].is_null())
        .filter_map(|c| c["metadata"]["name"].as_str().map(String::from))
        .collect()
}

#[actix::test]
async fn without_the_gate_drift_waits_for_room_beside_the_node() {
    let (env, first) = full_machine_deployment(false).await;
    env.change_the_template().await;
    env.until("every claim Drifted", |e| {
        first.iter().all(|n| {
            e.get("nodeclaims", "", n)
                .is_some_and(|c| condition(&c, "Drifted").is_some_and(|d| d["status"] == "True"))
        })
    })
    .await;
    // Many disruption passes go by (every 200 ms): no room, so nothing is replaced or deleted.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.claims_created(), MAX_SIZE, "nothing launched");
    assert_eq!(live_claims(&env), first, "nothing deleted");
    env.assert_clean();
}

#[actix::test]
async fn with_the_gate_each_drifted_node_goes_first_and_is_replaced_in_its_slot() {
    let (env, first) = full_machine_deployment(true).await;
    env.change_the_template().await;
    let mut most_replicas = 0;
    let mut most_deleting = 0;
    let mut fewest_ready = usize::MAX;
    env.wait(
        "every drifted claim replaced by one of the new template",
        || {
            most_replicas = most_replicas.max(env.replicas("md-0"));
            let claims = env.list("nodeclaims");
            most_deleting = most_deleting.max(
                claims
                    .iter()
                    .filter(|c| !c["metadata"]["deletionTimestamp"].is_null())
                    .count(),
            );
            let live: Vec<_> = claims
                .iter()
                .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
                .collect();
            let ready = live
                .iter()
                .filter(|c| condition(c, "Initialized").is_some_and(|i| i["status"] == "True"))
                .count();
            fewest_ready = fewest_ready.min(ready);
            (live.len() == MAX_SIZE
                && live.iter().all(|c| {
                    c["metadata"]["labels"]["team"] == "blue"
                        && condition(c, "Initialized").is_some_and(|i| i["status"] == "True")
                })
                && !first.iter().any(|n| env.get("nodeclaims", "", n).is_some())
                && env.bound_pods() == MAX_SIZE)
                .then_some(())
        },
    )
    .await;
    assert!(
        most_replicas <= MAX_SIZE as i64,
        "md-0 went above its max size: {most_replicas}"
    );
    assert!(
        fewest_ready >= MAX_SIZE - 1,
        "two nodes down at once: {fewest_ready} initialized"
    );
    assert!(
        most_deleting <= 1,
        "the budget (10% of two) takes one at a time: {most_deleting}"
    );
    assert_eq!(
        env.claims_created(),
        2 * MAX_SIZE,
        "one launch per drifted node"
    );
    // Each node goes first, one at a time: replace-first never takes md-0's slot meanwhile
    // (it would be the refill's, or not there yet: `terminate_first::waits`).
    assert_eq!(
        env.metric(
            "karpenter_voluntary_disruption_decisions_total{decision=\"delete\",reason=\"drifted\""
        ),
        MAX_SIZE as f64
    );
    env.assert_clean();
}
