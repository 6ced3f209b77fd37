//! Pod deletion cost management (`--feature-gates PodDeletionCostManagement=true`) on the
//! simulated cluster, through the real kube Client: the nodes ranked, the pods on them given
//! their `controller.kubernetes.io/pod-deletion-cost`, and a Deployment's scale-in (the
//! stand-in deletes in kube-controller-manager's ReplicaSet order) emptying the node ranked
//! first; a value someone else changes is released with a Warning Event; an owner's own value
//! is never touched. Without the gate nothing is written and the scale-in takes its pod from the
//! node with the most of the Deployment's pods, as a ReplicaSet does.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common;
use common::*;
use karpenter_capi::actors::Settings;
use karpenter_capi::api::wellknown::{
    MANAGED_DELETION_COST_ANNOTATION, POD_DELETION_COST_ANNOTATION,
};
use karpenter_capi::simulate::sim_settings;

/// One ranking pass every 300 ms (upstream's is a minute).
fn settings(gate: bool) -> Settings {
    Settings {
        pod_deletion_cost: gate.then_some(Duration::from_millis(300)),
        ..sim_settings(None)
    }
}

/// Two nodes of one price: `sparse` runs one pod of Deployment `web`, `crowded` three, so
/// consolidation's order (savings per unit of disruption) ranks `sparse` first. Disruption is
/// held by a budget of zero, so the nodes stay and only the ranking acts. The pods are placed
/// by the template's `nodeName`, changed between the two scale-ups (pods keep the template
/// they were made from). Returns (sparse, crowded).
async fn web_over_two_nodes(env: &Env) -> (String, String) {
    env.set_disruption(json!({"budgets": [{"nodes": "0"}]}))
        .await;
    let (_, sparse) = env.stamped_claim("sim-0").await;
    let (_, crowded) = env.stamped_claim("sim-0").await;
    let api: Api<Deployment> = Api::namespaced(env.client().await, NS);
    let web = json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"nodeName": sparse, "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    });
    api.create(
        &PostParams::default(),
        &serde_json::from_value(web).expect("a Deployment"),
    )
    .await
    .expect("create the Deployment");
    env.until("one web pod running on the sparse node", |e| {
        running_web_pods_on(e, &sparse) == 1
    })
    .await;
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 4,
            "template": {"spec": {"nodeName": crowded}}}})),
    )
    .await
    .expect("scale the Deployment up onto the crowded node");
    env.until("three web pods running on the crowded node", |e| {
        running_web_pods_on(e, &crowded) == 3
    })
    .await;
    (sparse, crowded)
}

fn running_web_pods_on(env: &Env, node: &str) -> usize {
    env.list("pods")
        .iter()
        .filter(|p| {
            p["metadata"]["labels"]["app"] == "web"
                && p["spec"]["nodeName"] == node
                && p["status"]["phase"] == "Running"
        })
        .count()
}

async fn scale(env: &Env, replicas: i32) {
    let api: Api<Deployment> = Api::namespaced(env.client().await, NS);
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": replicas}})),
    )
    .await
    .expect("scale the Deployment");
}

fn annotation(env: &Env, pod: &str, key: &str) -> Option<String> {
    env.get("pods", NS, pod)
        .and_then(|p| p["metadata"]["annotations"][key].as_str().map(String::from))
}

fn cost(env: &Env, pod: &str) -> Option<String> {
    annotation(env, pod, POD_DELETION_COST_ANNOTATION)
}

/// The active pods of `web` on `node`.
fn web_pods_on(env: &Env, node: &str) -> Vec<String> {
    env.list("pods")
        .into_iter()
        .filter(|p| {
            p["metadata"]["labels"]["app"] == "web"
                && p["spec"]["nodeName"] == node
                && p["metadata"]["deletionTimestamp"].is_null()
        })
        .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
        .collect()
}

/// Waits until every `web` pod carries a managed cost, the sparse node's the lowest; returns
/// one pod of the crowded node.
async fn ranked(env: &Env, sparse: &str, crowded: &str) -> String {
    let managed = |e: &Env, node: &str| {
        web_pods_on(e, node)
            .iter()
            .all(|p| annotation(e, p, MANAGED_DELETION_COST_ANNOTATION).as_deref() == Some("true"))
    };
    env.until("the web pods ranked", |e| {
        managed(e, sparse) && managed(e, crowded)
    })
    .await;
    let cost_on = |node: &str| -> (i32, String) {
        let pod = web_pods_on(env, node).pop().expect("a web pod");
        let c = cost(env, &pod)
            .and_then(|c| c.parse().ok())
            .expect("a cost");
        (c, pod)
    };
    let (a, _) = cost_on(sparse);
    let (b, pod) = cost_on(crowded);
    assert!(
        a < b && b < 0,
        "the sparse node first, below the default: {a} {b}"
    );
    pod
}

#[actix::test]
async fn a_scale_in_empties_the_node_ranked_first() {
    let env = env_with(settings(true)).await;
    let (sparse, crowded) = web_over_two_nodes(&env).await;
    ranked(&env, &sparse, &crowded).await;
    scale(&env, 3).await;
    env.until("the sparse node emptied", |e| {
        web_pods_on(e, &sparse).is_empty()
    })
    .await;
    assert_eq!(web_pods_on(&env, &crowded).len(), 3);
    env.assert_clean();
}

#[actix::test]
async fn a_changed_value_is_released_and_an_owners_value_is_never_touched() {
    let env = env_with(settings(true)).await;
    let (sparse, crowded) = web_over_two_nodes(&env).await;
    env.pod(
        "theirs",
        &sparse,
        json!({"app": "other"}),
        json!({"metadata": {"annotations": {POD_DELETION_COST_ANNOTATION: "1000"}}}),
    )
    .await;
    let web_b = ranked(&env, &sparse, &crowded).await;
    let web_b = web_b.as_str();
    let pods: Api<Pod> = Api::namespaced(env.client().await, NS);
    pods.patch(
        web_b,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {POD_DELETION_COST_ANNOTATION: "7"}}})),
    )
    .await
    .expect("another writer changes the cost");
    env.until("the changed pod released", |e| {
        annotation(e, web_b, MANAGED_DELETION_COST_ANNOTATION).is_none()
    })
    .await;
    assert_eq!(cost(&env, web_b).as_deref(), Some("7"), "their value stays");
    // The Event is written after the release it tells of (Events are sent on their own), so it
    // is waited for, not read at once.
    env.until("the conflict told by a Warning on the pod", |e| {
        e.events("PodDeletionCostThirdPartyConflict")
            .iter()
            .any(|e: &Value| e["regarding"]["name"] == web_b && e["type"] == "Warning")
    })
    .await;
    // A few more passes: the released pod and the owner's pod stay as their writers left them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cost(&env, web_b).as_deref(), Some("7"));
    assert_eq!(
        annotation(&env, web_b, MANAGED_DELETION_COST_ANNOTATION),
        None
    );
    assert_eq!(cost(&env, "theirs").as_deref(), Some("1000"));
    assert_eq!(
        annotation(&env, "theirs", MANAGED_DELETION_COST_ANNOTATION),
        None
    );
    env.assert_clean();
}

#[actix::test]
async fn without_the_gate_nothing_is_written_and_the_crowded_node_loses_the_pod() {
    let env = env_with(settings(false)).await;
    let (sparse, crowded) = web_over_two_nodes(&env).await;
    // Passes would have run several times by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for p in web_pods_on(&env, &sparse)
        .into_iter()
        .chain(web_pods_on(&env, &crowded))
    {
        assert_eq!(cost(&env, &p), None, "{p}");
    }
    scale(&env, 3).await;
    env.until("a crowded pod deleted", |e| {
        web_pods_on(e, &crowded).len() == 2
    })
    .await;
    assert_eq!(web_pods_on(&env, &sparse).len(), 1);
    env.assert_clean();
}
