//! Static NodePools (`spec.replicas`) on the simulated cluster: the pool holds its count through
//! a node deletion, a drift, a scale-down and a controller restart, and is held at
//! `limits.nodes` when replicas ask for more.

use crate::common;

use serde_json::json;

use common::claims::fast_disruption;
use common::scenario;
use common::static_pools::{self, env_static};
use karpenter_capi::actors::Settings;
use karpenter_capi::simulate::sim_settings;

/// Upstream's static provisioning and drift: the pool launches its replicas with no pod
/// pending, replaces a Node deleted under it, and replaces drifted nodes one for one.
#[actix::test]
async fn a_static_pool_holds_its_count_through_a_node_deletion_and_a_drift() {
    let env = env_static().await;
    static_pools::holds_through_a_node_deletion_and_a_drift(&env).await;
    env.assert_clean();
}

/// Upstream's static deprovisioning: scaling `spec.replicas` down removes the nodes least costly
/// to disrupt first (an empty node before one running a pod).
#[actix::test]
async fn scaling_replicas_down_removes_the_empty_node_first() {
    let env = env_static().await;
    env.static_pool(2, None).await;
    let claims = env.holds(2).await;
    let busy = env.get("nodeclaims", "", &claims[0]).expect("claim");
    let busy_node = busy["status"]["nodeName"]
        .as_str()
        .expect("node")
        .to_string();
    env.pod("app", &busy_node, json!({"app": "app"}), json!({}))
        .await;
    env.patch_static_pool(json!({"spec": {"replicas": 1}}))
        .await;
    let left = env.holds(1).await;
    assert_eq!(
        left,
        [claims[0].clone()],
        "the empty node went, the busy one stayed"
    );
    assert_eq!(env.claims_created(), 2);
    env.assert_clean();
}

/// Bad input: replicas above `limits.nodes`. The pool is held at the limit and says so with a
/// Warning on the NodePool.
#[actix::test]
async fn replicas_above_limits_nodes_are_held_at_the_limit() {
    let env = env_static().await;
    env.static_pool(3, Some(json!({"nodes": "2"}))).await;
    env.holds(2).await;
    let warned = env
        .wait("a NodePoolLimitReached Warning", || {
            env.events("NodePoolLimitReached").into_iter().next()
        })
        .await;
    assert!(
        warned["note"]
            .as_str()
            .is_some_and(|n| n.contains("spec.replicas 3 is above limits.nodes 2")),
        "{warned:#}"
    );
    assert_eq!(env.claims_created(), 2);
    // Raising the limit lets the pool reach its replicas.
    env.patch_static_pool(json!({"spec": {"limits": {"nodes": "5"}}}))
        .await;
    env.holds(3).await;
    env.assert_clean();
}

/// A controller restart while the pool scales up neither makes a claim twice nor forgets one.
#[actix::test]
async fn a_restart_mid_scale_neither_overshoots_nor_leaks() {
    let mut env = env_static().await;
    env.static_pool(4, None).await;
    env.wait("the first static claim", || {
        (!env.live_static_claims().is_empty()).then_some(())
    })
    .await;
    env.restart_with(Settings {
        disruption: fast_disruption(),
        ..sim_settings(None)
    })
    .await;
    env.holds(4).await;
    assert_eq!(env.claims_created(), 4);
    env.assert_clean();
}

/// `simulate --scenario static`: the pool holds its count through a Node deletion and a drift,
/// never more than one node short or over (its Drifted budget is one node).
#[actix::test]
async fn the_static_scenario_holds_the_count_through_a_deletion_and_a_drift() {
    use karpenter_capi::cli::{Scenario, SimulateArgs};
    let args = SimulateArgs {
        pods: 5,
        ..scenario(Scenario::Static)
    };
    let (r, _kept) = karpenter_capi::simulate::static_pool::run_kept(&args)
        .await
        .expect("the static scenario");
    assert!(r.invariants_ok, "{r}");
    let names: Vec<&str> = r.phases.iter().map(|p| p.phase.as_str()).collect();
    assert_eq!(
        names,
        [
            "launched",
            "a Node deleted",
            "every node drifted and replaced"
        ],
        "{r}"
    );
    assert!(
        r.phases.iter().all(|p| p.live == 5 && p.initialized == 5),
        "{r}"
    );
    // A deleted Node leaves the pool one short until its replacement; a drifted one is
    // replaced before it goes, one at a time.
    let (deleted, drifted) = (&r.phases[1], &r.phases[2]);
    assert!(deleted.fewest_live >= 4 && deleted.most_live == 5, "{r}");
    assert!(drifted.fewest_live == 5 && drifted.most_live <= 6, "{r}");
    assert_eq!(
        r.phases[2].created, 11,
        "one launch per deletion and per drifted node"
    );
}

/// `simulate --scenario repair`: one unhealthy Node replaced, then two of five held back.
#[actix::test]
async fn the_repair_scenario_replaces_one_node_and_holds_back_over_a_fifth() {
    use karpenter_capi::cli::{Scenario, SimulateArgs};
    let args = SimulateArgs {
        pods: 5,
        ..scenario(Scenario::Repair)
    };
    let (r, _kept) = karpenter_capi::simulate::static_pool::run_kept(&args)
        .await
        .expect("the repair scenario");
    assert!(r.invariants_ok, "{r}");
    assert_eq!((r.repaired, r.repair_blocked), (1, 2), "{r}");
    assert_eq!(r.phases.last().map(|p| p.created), Some(6), "{r}");
}
