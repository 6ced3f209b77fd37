//! Node repair (`--feature-gates NodeRepair=true`) on the simulated cluster, on a static pool so
//! the replacement shows as the pool holding its count: a Node whose `Ready` stays False past
//! the toleration is replaced; with more than 20 % of the pool unhealthy, or a Machine a
//! MachineHealthCheck watches over, nothing is.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::common;
use common::repair::{self, env_repair_on};
use common::*;
use karpenter_capi::api::wellknown::TERMINATION_TIMESTAMP_ANNOTATION;
use karpenter_capi::sim::cluster::Backend;

async fn env_repair() -> Env {
    env_repair_on(Backend::Simulated).await
}

/// Upstream's repair: the Node `Ready=False` past its toleration goes at once, counted and told,
/// and the static pool launches its replacement (on both backends in
/// `tests/control_plane/flows.rs`).
#[actix::test]
async fn an_unhealthy_node_is_replaced_past_its_toleration() {
    let env = env_repair().await;
    repair::an_unhealthy_node_is_replaced_past_its_toleration(&env).await;
    env.assert_clean();
}

/// Upstream's guard: two of three Nodes unhealthy is more than 20 % (one, rounded up), so
/// neither is repaired and both say why.
#[actix::test]
async fn with_more_than_a_fifth_of_the_pool_unhealthy_nothing_is_repaired() {
    let env = env_repair().await;
    repair::with_more_than_a_fifth_of_the_pool_unhealthy_nothing_is_repaired(&env).await;
    env.assert_clean();
}

/// Upstream's forceful termination: a budget of zero nodes and a `karpenter.sh/do-not-disrupt`
/// Node do not hold a repair back (they hold voluntary disruption only). The claim is stamped
/// with its termination deadline before it is deleted.
#[actix::test]
async fn a_repair_ignores_budgets_and_do_not_disrupt() {
    let env = env_repair().await;
    env.static_pool(3, None).await;
    env.patch_static_pool(json!({"spec": {"disruption": {"budgets": [{"nodes": "0"}]}}}))
        .await;
    let claims = env.holds(3).await;
    let sick = claims[0].clone();
    let node = env.node_of(&sick);
    let nodes: Api<Node> = Api::all(env.client().await);
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "karpenter.sh/do-not-disrupt": "true"}}})),
        )
        .await
        .expect("annotate the Node do-not-disrupt");
    env.node_ready(&node, "False").await;
    let stamped = env
        .wait("the claim stamped and deleting", || {
            env.get("nodeclaims", "", &sick).filter(|c| {
                !c["metadata"]["deletionTimestamp"].is_null()
                    && !c["metadata"]["annotations"][TERMINATION_TIMESTAMP_ANNOTATION].is_null()
            })
        })
        .await;
    let due = stamped["metadata"]["annotations"][TERMINATION_TIMESTAMP_ANNOTATION]
        .as_str()
        .and_then(|d| d.parse::<jiff::Timestamp>().ok())
        .expect("a readable deadline");
    assert!(due <= jiff::Timestamp::now(), "the drain waits for nothing");
    env.gone(&sick, &node).await;
    env.holds(3).await;
    env.assert_clean();
}

/// A Machine a MachineHealthCheck watches over (here asked to be remediated by the
/// `cluster.x-k8s.io/remediate-machine` annotation) is left to Cluster API's remediation (on both
/// backends in `tests/control_plane/flows.rs`).
#[actix::test]
async fn a_machine_a_health_check_watches_is_left_to_it() {
    let env = env_repair().await;
    repair::a_machine_a_health_check_watches_is_left_to_it(&env).await;
    env.assert_clean();
}
