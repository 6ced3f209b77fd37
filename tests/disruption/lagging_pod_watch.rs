//! A drain whose pods someone else removed first (Cluster API drains a Machine its rollout
//! deletes before the claim's own drain starts) while the controller's pod watch lags, as on a
//! loaded machine: the API server answers each eviction 404, and the controller must take that
//! answer rather than ask again until its watch catches up.

use crate::common;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::json;

use common::*;
use karpenter_capi::app::USER_AGENT;

/// How far behind the API server the controller's pod watch runs.
const LAG: Duration = Duration::from_secs(8);

const PODS: [&str; 3] = ["gone-0", "gone-1", "gone-2"];

/// Before: every 404 forgot the pod, the next drain step evicted it again at once, and the
/// controller sent thousands of evictions of pods that were gone while its watch lagged.
#[actix::test]
async fn pods_removed_by_someone_else_are_evicted_once_while_the_pod_watch_lags() {
    let env = env().await;
    let (claim, node) = env.claim(None).await;
    for name in PODS {
        env.pod(
            name,
            &node,
            json!({"app": "gone"}),
            json!({"spec": {"terminationGracePeriodSeconds": 0}}),
        )
        .await;
    }
    let faults = env.sim.cluster().server().faults();
    faults.set_agent(Some(USER_AGENT));
    faults.set_watch_delay("pods", LAG);

    // Another client removes the pods; the controller's watch shows them for a while yet.
    let pods: Api<Pod> = Api::namespaced(env.client().await, NS);
    for name in PODS {
        pods.delete(name, &DeleteParams::default())
            .await
            .expect("delete pod");
    }
    env.wait("the pods gone from the API server", || {
        PODS.iter()
            .all(|p| env.get("pods", NS, p).is_none())
            .then_some(())
    })
    .await;
    let stats = env.sim.cluster().stats();
    let before = stats.requests("create", "pods", "eviction");
    env.delete_claim(&claim).await;
    env.gone(&claim, &node).await;

    let asked = stats.requests("create", "pods", "eviction") - before;
    assert!(
        asked <= PODS.len() as u64,
        "{asked} eviction requests for {} pods the API server had already removed (answered 404): each is asked once",
        PODS.len()
    );
    faults.clear();
    env.settle().await;
    env.invariants_hold();
}
