//! Static NodePools (`spec.replicas`) on the simulated cluster: the pool holds its count through
//! a node deletion, a drift, a scale-down and a controller restart, and is held at
//! `limits.nodes` when replicas ask for more.

use crate::common;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use common::claims::fast_disruption;
use common::*;
use karpenter_capi::actors::Settings;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::NODEPOOL_LABEL;
use karpenter_capi::simulate::sim_settings;

const POOL: &str = "fixed";

async fn env_static() -> Env {
    Env::builder()
        .settings(Settings {
            disruption: fast_disruption(),
            ..sim_settings(None)
        })
        .start()
        .await
}

impl Env {
    /// A static NodePool `fixed` on the seeded pool's NodeClass, with these replicas and
    /// `limits` (created static: a pool cannot turn static later).
    async fn static_pool(&self, replicas: i64, limits: Option<Value>) {
        let mut spec = serde_json::to_value(&self.pool.spec).expect("spec");
        spec["replicas"] = json!(replicas);
        spec.as_object_mut().map(|s| s.remove("weight"));
        match limits {
            Some(l) => spec["limits"] = l,
            None => {
                spec.as_object_mut().map(|s| s.remove("limits"));
            }
        }
        let np: NodePool = serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": POOL}, "spec": spec,
        }))
        .expect("static NodePool");
        let api: Api<NodePool> = Api::all(self.client().await);
        api.create(&PostParams::default(), &np)
            .await
            .expect("create the static NodePool");
    }

    async fn patch_static_pool(&self, patch: Value) {
        let api: Api<NodePool> = Api::all(self.client().await);
        api.patch(POOL, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect("patch the static NodePool");
    }

    /// The static pool's claims that are not being deleted.
    fn live_static_claims(&self) -> Vec<Value> {
        self.list("nodeclaims")
            .into_iter()
            .filter(|c| c["metadata"]["labels"][NODEPOOL_LABEL] == POOL)
            .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
            .collect()
    }

    /// Waits until the pool holds exactly `n` initialized claims and nothing of it is deleting,
    /// and its `status.nodes` says so; returns their names.
    async fn holds(&self, n: usize) -> Vec<String> {
        self.wait(
            &format!("the static pool holds {n} initialized nodes"),
            || {
                let all: Vec<Value> = self
                    .list("nodeclaims")
                    .into_iter()
                    .filter(|c| c["metadata"]["labels"][NODEPOOL_LABEL] == POOL)
                    .collect();
                let ready = all
                    .iter()
                    .filter(|c| condition(c, "Initialized").is_some_and(|i| i["status"] == "True"))
                    .count();
                let nodes = self.get("nodepools", "", POOL)?["status"]["nodes"].as_i64();
                (all.len() == n && ready == n && nodes == Some(n as i64)).then(|| {
                    all.iter()
                        .filter_map(|c| c["metadata"]["name"].as_str().map(String::from))
                        .collect()
                })
            },
        )
        .await
    }

    /// NodeClaims the controller created.
    fn claims_created(&self) -> usize {
        let agent = karpenter_capi::app::USER_AGENT;
        self.sim
            .cluster()
            .stats()
            .writes()
            .iter()
            .filter(|w| w.agent == agent && w.resource == "nodeclaims" && w.verb == "create")
            .count()
    }
}

/// Upstream's static provisioning and drift: the pool launches its replicas with no pod
/// pending, replaces a Node deleted under it, and replaces drifted nodes one for one.
#[actix::test]
async fn a_static_pool_holds_its_count_through_a_node_deletion_and_a_drift() {
    let env = env_static().await;
    env.static_pool(2, None).await;
    let first = env.holds(2).await;
    assert_eq!(
        env.claims_created(),
        2,
        "no pod asked for them; nothing more"
    );

    // A Node deleted directly: its claim goes and the pool launches another.
    let gone = env.get("nodeclaims", "", &first[0]).expect("claim");
    let node = gone["status"]["nodeName"]
        .as_str()
        .expect("node")
        .to_string();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client().await);
    nodes
        .delete(&node, &DeleteParams::default())
        .await
        .expect("delete the Node");
    env.gone(&first[0], &node).await;
    let second = env.holds(2).await;
    assert!(!second.contains(&first[0]));
    assert_eq!(env.claims_created(), 3);

    // A template change drifts both; each is replaced by one claim of the new template.
    env.patch_static_pool(
        json!({"spec": {"template": {"metadata": {"labels": {"team": "blue"}}}}}),
    )
    .await;
    env.wait("both drifted nodes replaced", || {
        let live = env.live_static_claims();
        (live.len() == 2
            && live
                .iter()
                .all(|c| c["metadata"]["labels"]["team"] == "blue")
            && !second
                .iter()
                .any(|n| env.get("nodeclaims", "", n).is_some()))
        .then_some(())
    })
    .await;
    env.holds(2).await;
    assert_eq!(env.claims_created(), 5, "one replacement per drifted node");
    assert_eq!(
        env.metric("karpenter_nodeclaims_disrupted_total{reason=\"drifted\",nodepool=\"fixed\""),
        2.0
    );
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
