//! Disruption keeps the room a CapacityBuffer holds: a node the provisioner packed a buffer's
//! placeholders on is not empty, so consolidation leaves it, until the buffer goes.

use std::time::Duration;

use kube::api::{Api, DeleteParams};
use serde_json::json;

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
