//! Whole flows written once and run on both backends: each flow is an `async fn` taking the
//! backend, registered as `flows::simulated::<flow>` (always run) and `flows::real::<flow>`
//! (needs a control plane and the upstream CRDs, else ignored with the reason in one line).
//! The bodies read through `Env`, whose reads are the same store on the simulated backend and
//! the watch-kept mirror on the real one.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::sim::cluster::{Backend, PodShape};

use crate::common::claims::fast_disruption;
use crate::common::{Env, NS, condition, standin_cluster};

/// Registers every flow twice, once per backend: `simulated::<flow>` and `real::<flow>`, listed
/// by the module's `on_both()`. `needs [...]` adds what every flow of the list needs on both (the
/// real ones need a control plane, the upstream CRDs and the tools the chart's RBAC is installed
/// with besides).
macro_rules! on_both_backends {
    ($($flow:ident),* $(,)?) => { on_both_backends!(needs []; $($flow),*); };
    (needs $needs:tt; $($flow:ident),* $(,)?) => {
        pub mod simulated {
            use karpenter_capi::sim::cluster::Backend;
            $(async fn $flow() { super::$flow(Backend::Simulated).await })*
            pub fn tests() -> Vec<crate::assets::Test> {
                let mut all = Vec::new();
                $(all.extend(on_both_backends!(@simulated $flow $needs));)*
                all
            }
        }
        pub mod real {
            use karpenter_capi::sim::cluster::Backend;
            $(async fn $flow() { super::$flow(Backend::Real).await })*
            pub fn tests() -> Vec<crate::assets::Test> {
                let mut all = Vec::new();
                $(all.extend(on_both_backends!(@real $flow $needs));)*
                all
            }
        }
        fn on_both() -> Vec<crate::assets::Test> {
            let mut all = simulated::tests();
            all.extend(real::tests());
            all
        }
    };
    (@simulated $flow:ident [$($need:ident),*]) => {
        trials![@actix $flow needs [$($need),*]]
    };
    (@real $flow:ident [$($need:ident),*]) => {
        trials![@actix $flow needs [ControlPlane, Upstream, Helm, Kubectl $(, $need)*]]
    };
}

on_both_backends![
    pending_pods_get_claims_nodes_and_bindings,
    a_deleted_claim_drains_within_its_pdb,
    a_deployment_scaled_down_is_consolidated_within_budgets,
    a_changed_template_replaces_the_drifted_claims,
    a_static_pool_holds_its_count,
    static_replicas_above_limits_nodes_are_held_at_the_limit,
    an_unhealthy_node_is_replaced_past_its_toleration,
    with_more_than_a_fifth_of_the_pool_unhealthy_nothing_is_repaired,
    a_machine_a_health_check_watches_is_left_to_repair_by_it,
];

pub fn tests() -> Vec<crate::assets::Test> {
    on_both()
}

/// The controller on `backend` with the scheduler stand-in (kube-scheduler on the real backend),
/// short batches and disruption passes at test speed.
pub async fn env(backend: Backend) -> Env {
    Env::builder()
        .cluster(standin_cluster(CapiVersion::V1Beta2))
        .backend(backend)
        .short_batches()
        .tune(|s| s.disruption = fast_disruption())
        .start()
        .await
}

/// Deployment `web` of `replicas` pods of `cpu`, all bound and the cluster quiet.
pub async fn web(env: &Env, replicas: usize, cpu: &str) {
    env.deployment("web", replicas, PodShape::new(cpu, "256Mi"))
        .await;
    env.until_quiet(&format!("{replicas} pods bound"), |e| {
        e.bound_pods() == replicas
    })
    .await;
}

pub fn claim_names(env: &Env) -> BTreeSet<String> {
    env.list("nodeclaims")
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str().map(String::from))
        .collect()
}

/// No pool went over its disruption budget, and the drain rules and invariants held.
pub fn assert_within_budgets(env: &Env) {
    let audit = env.sim.cluster().disruption_audit().report();
    assert_eq!(audit.budget_violations, 0, "{:#?}", audit.pools);
    env.assert_clean();
}

/// Launch: pending pods -> claims -> Machines and Nodes -> every pod bound to a claim's Node
/// (by the scheduler stand-in, or by kube-scheduler on the real backend).
async fn pending_pods_get_claims_nodes_and_bindings(backend: Backend) {
    let env = env(backend).await;
    let shape = PodShape::new("500m", "256Mi");
    env.sim
        .run(move |c| async move { c.create_pods(NS, "web", 6, &shape).await })
        .await
        .expect("the cluster's runtime")
        .expect("pending pods");

    env.until_quiet("6 pods bound", |e| e.bound_pods() == 6)
        .await;

    let claims = env.list("nodeclaims");
    assert!(!claims.is_empty(), "pods were bound with no claim");
    let mut claim_nodes = Vec::new();
    for c in &claims {
        let name = &c["metadata"]["name"];
        assert_eq!(
            condition(c, "Initialized").map(|x| x["status"].clone()),
            Some(json!("True")),
            "claim {name}"
        );
        let node = c["status"]["nodeName"]
            .as_str()
            .expect("an initialized claim's node");
        assert!(
            env.get("nodes", "", node).is_some(),
            "claim {name}'s node {node}"
        );
        claim_nodes.push(node.to_string());
    }
    for p in env.list("pods") {
        let on = p.pointer("/spec/nodeName").and_then(Value::as_str);
        assert!(
            on.is_some_and(|n| claim_nodes.iter().any(|c| c == n)),
            "pod {} on {on:?}, not on a claim's node {claim_nodes:?}",
            p["metadata"]["name"]
        );
    }
    assert_eq!(
        env.list("machines").len(),
        claims.len(),
        "one Machine a claim"
    );
    env.assert_clean();
}

/// Drain: deleting a claim evicts its pods within their PodDisruptionBudget (one at a time);
/// its Machine and Node go and the Deployment's pods are bound again elsewhere. The pods belong
/// to a Deployment because kube-controller-manager allows no disruption by `maxUnavailable` for
/// pods without a controller.
async fn a_deleted_claim_drains_within_its_pdb(backend: Backend) {
    let env = Env::builder()
        .cluster(standin_cluster(CapiVersion::V1Beta2))
        .backend(backend)
        .short_batches()
        .start()
        .await;
    env.pdb("web", "web", 1).await;
    env.deployment("web", 3, PodShape::new("500m", "256Mi"))
        .await;
    env.until_quiet("3 pods bound", |e| e.bound_pods() == 3)
        .await;

    let claim = env.list("nodeclaims").into_iter().next().expect("a claim");
    let name = claim["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_string();
    let node = claim["status"]["nodeName"]
        .as_str()
        .expect("a node")
        .to_string();
    let on_node: Vec<String> = env
        .list("pods")
        .into_iter()
        .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(&node))
        .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
        .collect();
    assert!(!on_node.is_empty(), "the claim's node runs the pods");

    env.delete_claim(&name).await;
    env.gone(&name, &node).await;
    env.until_quiet("3 pods bound again", |e| e.bound_pods() == 3)
        .await;

    let evicted: Vec<String> = env
        .removals()
        .into_iter()
        .filter(|(how, _)| how == "evict")
        .map(|(_, p)| p)
        .collect();
    for p in &on_node {
        assert!(evicted.contains(p), "{p} evicted: {evicted:?}");
    }
    // Every eviction was checked against the budget (by the simulated server, or on the real
    // backend by the drain audit of the mirror): assert_clean fails on any broken drain rule.
    env.assert_clean();
}

/// Consolidation: a Deployment scaled down leaves nodes it no longer needs; they are removed,
/// one at a time by the pool's budget, and the pods left stay bound within their PDB.
async fn a_deployment_scaled_down_is_consolidated_within_budgets(backend: Backend) {
    let env = env(backend).await;
    env.pdb("web", "web", 1).await;
    // Two pods a 4-CPU node: three nodes.
    web(&env, 6, "1500m").await;
    let before = claim_names(&env).len();
    assert!(before >= 3, "{before} claims for 6 pods of 1.5 CPUs");

    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s",
               "budgets": [{"nodes": "1"}]}),
    )
    .await;
    env.sim
        .run(|c| async move { c.scale_deployment(NS, "web", 2).await })
        .await
        .expect("the cluster's runtime")
        .expect("scale the Deployment down");
    env.until_quiet("the cluster consolidated to one node", |e| {
        e.list("nodeclaims").len() == 1 && e.list("pods").len() == 2 && e.bound_pods() == 2
    })
    .await;

    let audit = env.sim.cluster().disruption_audit().report();
    assert!(
        audit.decisions.empty + audit.decisions.underutilized >= 1,
        "{:?}",
        audit.decisions
    );
    assert_within_budgets(&env);
}

/// Drift: a changed NodePool template drifts every claim; each is replaced by a claim of the new
/// template and the pods end bound on the new nodes.
async fn a_changed_template_replaces_the_drifted_claims(backend: Backend) {
    let env = env(backend).await;
    env.pdb("web", "web", 1).await;
    web(&env, 2, "500m").await;
    let before = claim_names(&env);

    env.set_disruption(json!({"consolidateAfter": "Never", "budgets": [{"nodes": "100%"}]}))
        .await;
    env.patch_pool(json!({"spec": {"template": {"metadata": {"labels": {"team": "blue"}}}}}))
        .await;
    env.until_quiet("every drifted claim replaced", |e| {
        let now = claim_names(e);
        !now.is_empty() && now.is_disjoint(&before) && e.bound_pods() == 2
    })
    .await;

    for c in env.list("nodeclaims") {
        assert_eq!(
            c["metadata"]["labels"]["team"], "blue",
            "{}",
            c["metadata"]["name"]
        );
    }
    let audit = env.sim.cluster().disruption_audit().report();
    assert!(audit.decisions.drifted >= 1, "{:?}", audit.decisions);
    assert_within_budgets(&env);
}

/// Static NodePool: the pool holds `spec.replicas` through a Node deleted under it and a drift.
async fn a_static_pool_holds_its_count(backend: Backend) {
    let env = env(backend).await;
    crate::common::static_pools::holds_through_a_node_deletion_and_a_drift(&env).await;
    env.assert_clean();
}

/// Bad input: a static pool's `spec.replicas` above its `limits.nodes` is held at the limit and
/// told on the NodePool.
async fn static_replicas_above_limits_nodes_are_held_at_the_limit(backend: Backend) {
    let env = env(backend).await;
    crate::common::static_pools::replicas_above_limits_nodes_are_held_at_the_limit(&env).await;
    env.assert_clean();
}

/// Node repair: a Node `Ready=False` past the toleration is replaced.
async fn an_unhealthy_node_is_replaced_past_its_toleration(backend: Backend) {
    let env = crate::common::repair::env_repair_on(backend).await;
    crate::common::repair::an_unhealthy_node_is_replaced_past_its_toleration(&env).await;
    env.assert_clean();
}

/// Node repair's 20 % guard: two of three Nodes unhealthy, neither is replaced.
async fn with_more_than_a_fifth_of_the_pool_unhealthy_nothing_is_repaired(backend: Backend) {
    let env = crate::common::repair::env_repair_on(backend).await;
    crate::common::repair::with_more_than_a_fifth_of_the_pool_unhealthy_nothing_is_repaired(&env)
        .await;
    env.assert_clean();
}

/// Node repair beside Cluster API's: a Machine a MachineHealthCheck remediates is left to it.
async fn a_machine_a_health_check_watches_is_left_to_repair_by_it(backend: Backend) {
    let env = crate::common::repair::env_repair_on(backend).await;
    crate::common::repair::a_machine_a_health_check_watches_is_left_to_it(&env).await;
    env.assert_clean();
}
