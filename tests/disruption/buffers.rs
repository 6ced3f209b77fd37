//! Disruption keeps the room a CapacityBuffer holds: a node the provisioner packed a buffer's
//! placeholders on is not empty, so consolidation leaves it, until the buffer goes.

use std::time::Duration;

use kube::api::{Api, DeleteParams};
use serde_json::json;

use crate::common::buffers::{condition_of, create, create_buffer, template};
use crate::common::claims::fast_disruption;
use crate::common::*;
use karpenter_capi::actors::Settings;
use karpenter_capi::api::capacity_buffer::CapacityBuffer;
use karpenter_capi::simulate::sim_settings;

fn live_claims(env: &Env) -> usize {
    env.list("nodeclaims")
        .iter()
        .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
        .count()
}

/// Upstream's "should not empty-consolidate nodes hosting buffer pods" and "should consolidate
/// buffer nodes after buffer is deleted": the node launched for a buffer has no pod, yet it is
/// kept while the buffer stands; once the buffer is deleted it is empty and goes.
#[actix::test]
async fn a_node_holding_a_buffers_room_is_kept_until_the_buffer_goes() {
    let env = env_with(Settings {
        disruption: fast_disruption(),
        capacity_buffers: true,
        ..sim_settings(None)
    })
    .await;
    env.capacity_buffer(NS, ("chunk", "500m", "256Mi"), "headroom", 1)
        .await;
    env.until("the buffer's node launched and the buffer fits it", |e| {
        let fits = e
            .get("capacitybuffers", NS, "headroom")
            .is_some_and(|b| condition(&b, "Provisioning").is_some_and(|c| c["status"] == "True"));
        let initialized = e
            .list("nodeclaims")
            .iter()
            .any(|c| condition(c, "Initialized").is_some_and(|i| i["status"] == "True"));
        fits && initialized
    })
    .await;
    assert_eq!(live_claims(&env), 1);
    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s",
                              "budgets": [{"nodes": "100%"}]}),
    )
    .await;
    // Several passes (200 ms) and validations (300 ms) go by.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(live_claims(&env), 1, "the buffer's node is kept");

    Api::<CapacityBuffer>::namespaced(env.client().await, NS)
        .delete("headroom", &DeleteParams::default())
        .await
        .expect("delete the buffer");
    env.until_quiet("the empty node consolidated once the buffer is gone", |e| {
        e.list("nodeclaims").is_empty()
    })
    .await;
    env.assert_clean();
}

async fn env_buffers() -> Env {
    env_with(Settings {
        disruption: fast_disruption(),
        capacity_buffers: true,
        ..sim_settings(None)
    })
    .await
}

fn provisioned(env: &Env, buffer: &str) -> bool {
    condition_of(env, buffer, "Provisioning").is_some_and(|c| c.0 == "True")
}

fn initialized_claims(env: &Env) -> Vec<String> {
    env.list("nodeclaims")
        .iter()
        .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
        .filter(|c| condition(c, "Initialized").is_some_and(|i| i["status"] == "True"))
        .filter_map(|c| c["metadata"]["name"].as_str().map(String::from))
        .collect()
}

async fn delete_buffer(env: &Env, name: &str) {
    Api::<CapacityBuffer>::namespaced(env.client().await, NS)
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete the buffer");
}

/// Upstream's "should not leak nodes on rapid buffer create and delete": a buffer provisions a
/// node and goes; five more are created and deleted one after another; once none is left, empty
/// consolidation removes every node launched for them.
#[actix::test]
async fn buffers_created_and_deleted_in_a_row_leak_no_node() {
    let env = env_buffers().await;
    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s",
                              "budgets": [{"nodes": "100%"}]}),
    )
    .await;
    create(&env, template("chunk")).await;
    create_buffer(
        &env,
        "seed",
        json!({"podTemplateRef": {"name": "chunk"}, "replicas": 1}),
    )
    .await;
    env.wait("a claim for the seed buffer", || {
        (!env.list("nodeclaims").is_empty()).then_some(())
    })
    .await;
    delete_buffer(&env, "seed").await;
    for i in 0..5 {
        let name = format!("rapid-{i}");
        create_buffer(
            &env,
            &name,
            json!({"podTemplateRef": {"name": "chunk"}, "replicas": 2}),
        )
        .await;
        env.until("the buffer resolved", |e| {
            condition_of(e, &name, "ReadyForProvisioning").is_some_and(|c| c.0 == "True")
        })
        .await;
        delete_buffer(&env, &name).await;
    }
    env.until_quiet("no buffer and no node left", |e| {
        e.list("capacitybuffers").is_empty() && e.list("nodeclaims").is_empty()
    })
    .await;
    env.assert_clean();
}

/// Upstream's "should allow drift to replace buffer nodes": a NodePool template change drifts
/// the nodes a buffer holds; they go (the buffer does not protect them from drift) and the
/// buffer is provisioned again on new ones.
#[actix::test]
async fn drift_replaces_a_buffers_nodes_and_the_buffer_is_provisioned_again() {
    let env = env_buffers().await;
    env.capacity_buffer(NS, ("chunk", "500m", "256Mi"), "headroom", 2)
        .await;
    env.until_quiet("the buffer's nodes launched", |e| {
        provisioned(e, "headroom") && !initialized_claims(e).is_empty()
    })
    .await;
    let original = initialized_claims(&env);
    env.patch_pool(
        json!({"spec": {"template": {"metadata": {"annotations": {"drift-trigger": "true"}}}}}),
    )
    .await;
    env.until_quiet(
        "the drifted nodes replaced and the buffer provisioned",
        |e| {
            original
                .iter()
                .all(|c| e.get("nodeclaims", "", c).is_none())
                && provisioned(e, "headroom")
                && !initialized_claims(e).is_empty()
        },
    )
    .await;
    assert!(
        env.metric("karpenter_nodeclaims_disrupted_total{reason=\"drifted\"") >= 1.0,
        "replaced by drift"
    );
    env.assert_clean();
}

/// Upstream's "should refill buffer after node expiry": a buffer's node expires (the NodePool's
/// `expireAfter`), and the buffer is provisioned again on a new node.
#[actix::test]
async fn an_expired_buffer_node_is_refilled() {
    let env = env_buffers().await;
    env.patch_pool(json!({"spec": {"template": {"spec": {"expireAfter": "20s"}}}}))
        .await;
    env.capacity_buffer(NS, ("chunk", "500m", "256Mi"), "headroom", 1)
        .await;
    let first = env
        .wait("the buffer's node launched", || {
            let c = initialized_claims(&env);
            (provisioned(&env, "headroom") && c.len() == 1).then(|| c[0].clone())
        })
        .await;
    env.wait("the node expired and the buffer refilled elsewhere", || {
        let now = initialized_claims(&env);
        (env.get("nodeclaims", "", &first).is_none()
            && provisioned(&env, "headroom")
            && !now.is_empty()
            && !now.contains(&first))
        .then_some(())
    })
    .await;
    assert!(env.metric("karpenter_nodeclaims_disrupted_total{reason=\"expired\"") >= 1.0);
    delete_buffer(&env, "headroom").await;
    env.until_quiet("the last launch settled", |_| true).await;
    env.assert_clean();
}
