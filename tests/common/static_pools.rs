//! `Env`'s helpers for static NodePools (`spec.replicas`): a static pool `fixed` on the seeded
//! pool's NodeClass, and waits on the count it holds.

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use karpenter_capi::actors::Settings;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::NODEPOOL_LABEL;
use karpenter_capi::sim::cluster::Backend;
use karpenter_capi::simulate::sim_settings;

use super::claims::fast_disruption;
use super::{Env, condition, eventually};

pub const POOL: &str = "fixed";

/// The controller with disruption passes at test speed, on `backend`.
pub async fn env_static_on(backend: Backend) -> Env {
    Env::builder()
        .backend(backend)
        .settings(Settings {
            disruption: fast_disruption(),
            ..sim_settings(None)
        })
        .start()
        .await
}

pub async fn env_static() -> Env {
    env_static_on(Backend::Simulated).await
}

/// A static NodePool `name` of `replicas` on the seeded pool's NodeClass, without limits.
pub fn static_pool_of(env: &Env, name: &str, replicas: i64) -> NodePool {
    let mut spec = serde_json::to_value(&env.pool.spec).expect("spec");
    spec["replicas"] = json!(replicas);
    if let Some(s) = spec.as_object_mut() {
        s.remove("weight");
        s.remove("limits");
    }
    serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("static NodePool")
}

impl Env {
    /// A static NodePool `fixed` on the seeded pool's NodeClass, with these replicas and
    /// `limits` (created static: a pool cannot turn static later).
    pub async fn static_pool(&self, replicas: i64, limits: Option<Value>) {
        let mut np = static_pool_of(self, POOL, replicas);
        np.spec.limits = limits.map(|l| serde_json::from_value(l).expect("limits"));
        let api: Api<NodePool> = Api::all(self.client().await);
        api.create(&PostParams::default(), &np)
            .await
            .expect("create the static NodePool");
    }

    pub async fn patch_static_pool(&self, patch: Value) {
        let api: Api<NodePool> = Api::all(self.client().await);
        api.patch(POOL, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect("patch the static NodePool");
    }

    /// The static pool's claims that are not being deleted.
    pub fn live_static_claims(&self) -> Vec<Value> {
        self.list("nodeclaims")
            .into_iter()
            .filter(|c| c["metadata"]["labels"][NODEPOOL_LABEL] == POOL)
            .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
            .collect()
    }

    /// Waits until the pool holds exactly `n` initialized claims and nothing of it is deleting,
    /// and its `status.nodes` says so; returns their names.
    pub async fn holds(&self, n: usize) -> Vec<String> {
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
    pub fn claims_created(&self) -> usize {
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

/// The pool launches its replicas with no pod pending, replaces a Node deleted under it, and
/// replaces drifted nodes one for one (upstream's static provisioning and static drift).
pub async fn holds_through_a_node_deletion_and_a_drift(env: &Env) {
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
}

/// Bad input: replicas above `limits.nodes`. The pool is held at the limit and says so with a
/// Warning on the NodePool; raising the limit lets it reach its replicas.
pub async fn replicas_above_limits_nodes_are_held_at_the_limit(env: &Env) {
    env.static_pool(3, Some(json!({"nodes": "2"}))).await;
    env.holds(2).await;
    let warned = eventually("a NodePoolLimitReached Warning", || async {
        env.served_events("NodePoolLimitReached")
            .await
            .into_iter()
            .next()
    })
    .await;
    assert!(
        warned["note"]
            .as_str()
            .is_some_and(|n| n.contains("spec.replicas 3 is above limits.nodes 2")),
        "{warned:#}"
    );
    assert_eq!(env.claims_created(), 2);
    env.patch_static_pool(json!({"spec": {"limits": {"nodes": "5"}}}))
        .await;
    env.holds(3).await;
}

impl Env {
    /// Sets the Node's `Ready` condition to `status` (False or Unknown), dated `SICK_FOR` ago,
    /// as a kubelet failing that long or the node lifecycle controller would. The kubelet
    /// stand-in lets go of the Node first (it would report it Ready again).
    pub async fn node_ready(&self, node: &str, status: &str) {
        let now = jiff::Timestamp::now();
        let since = now.checked_sub(super::repair::SICK_FOR).unwrap_or(now);
        let stamp = |t: jiff::Timestamp| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        self.node_conditions(
            node,
            json!([{"type": "Ready", "status": status, "reason": "KubeletNotReady",
                "message": "container runtime is down",
                "lastHeartbeatTime": stamp(now), "lastTransitionTime": stamp(since)}]),
        )
        .await;
    }

    /// Node `node`'s conditions set to `conditions` (the whole list), the kubelet stand-in
    /// letting go of it first so it does not write them back.
    pub async fn node_conditions(&self, node: &str, conditions: Value) {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client().await);
        nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    karpenter_capi::sim::kubelet::SIM_NODE_ANNOTATION: null}}})),
            )
            .await
            .expect("the kubelet stand-in lets go of the Node");
        nodes
            .patch_status(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": conditions}})),
            )
            .await
            .expect("set the Node's conditions");
    }

    /// The Node of claim `claim`.
    pub fn node_of(&self, claim: &str) -> String {
        self.get("nodeclaims", "", claim)
            .and_then(|c| c["status"]["nodeName"].as_str().map(String::from))
            .expect("the claim's Node")
    }
}
