//! Real kubectl against both backends: `get` of the project's resources shows the CRDs' printer
//! columns with their values (the simulated server renders the Table itself, kube-apiserver from
//! the CRD), `-o wide` adds the priority-1 ones, and `describe` shows a claim's conditions and a
//! pod's Events as the controller wrote them (events.k8s.io/v1, read back as core/v1), and
//! `kubectl wait --for=condition=NodesUpToDate` returns once a drift rollout has ended.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use karpenter_capi::sim::cluster::Backend;

use crate::assets::{self, Asset};
use crate::common::Env;
use crate::flows;

on_both_backends![needs [Kubectl];
    kubectl_gets_and_describes_the_projects_resources,
    kubectl_wait_for_nodes_up_to_date_returns_once_a_drift_rollout_ends,
];

pub fn tests() -> Vec<assets::Test> {
    on_both()
}

/// `kubectl ARGS` against the cluster as its administrator; its stdout, or the test fails.
fn kubectl(env: &Env, args: &[&str]) -> String {
    let out = Command::new(assets::tool(Asset::Kubectl))
        .arg("--kubeconfig")
        .arg(env.sim.kubeconfig())
        .args(args)
        .output()
        .expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl ARGS` that may take a while (`wait`), polled rather than blocked on: the controller
/// (and on the simulated backend the API server) run on this test's runtime.
async fn kubectl_async(env: &Env, args: &[&str]) -> std::process::Output {
    let mut child = Command::new(assets::tool(Asset::Kubectl))
        .arg("--kubeconfig")
        .arg(env.sim.kubeconfig())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running kubectl");
    while child.try_wait().expect("kubectl's status").is_none() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.wait_with_output().expect("kubectl's output")
}

/// A table's rows, each split on runs of spaces (no cell here holds a space).
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

async fn kubectl_gets_and_describes_the_projects_resources(backend: Backend) {
    let env = flows::env(backend).await;
    flows::web(&env, 2, "500m").await;
    // The pool's status is written half a second after its claims change.
    env.until(
        "the NodePool's status counts its claims and is Ready",
        |e| {
            e.list("nodepools").iter().any(|np| {
                np["status"]["nodes"].as_i64() == Some(e.list("nodeclaims").len() as i64)
                    && crate::common::condition(np, "Ready").is_some_and(|c| c["status"] == "True")
            })
        },
    )
    .await;
    let claims = env.list("nodeclaims");
    let claim = claims.first().expect("a claim");
    let name = claim["metadata"]["name"].as_str().expect("a name");
    let label = |key: &str| {
        claim["metadata"]["labels"][key]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let node = claim["status"]["nodeName"].as_str().expect("a node");

    let table = rows(&kubectl(&env, &["get", "nodeclaims"]));
    assert_eq!(
        table[0],
        ["NAME", "TYPE", "CAPACITY", "ZONE", "NODE", "READY", "AGE"],
        "{table:?}"
    );
    let row = table
        .iter()
        .find(|r| r[0] == name)
        .unwrap_or_else(|| panic!("{name} in {table:?}"));
    assert_eq!(
        row[1..6],
        [
            label("node.kubernetes.io/instance-type"),
            label("karpenter.sh/capacity-type"),
            label("topology.kubernetes.io/zone"),
            node.to_string(),
            "True".to_string(),
        ],
        "{row:?}"
    );
    let wide = rows(&kubectl(&env, &["get", "nodeclaims", "-o", "wide"]));
    assert_eq!(
        wide[0],
        [
            "NAME",
            "TYPE",
            "CAPACITY",
            "ZONE",
            "NODE",
            "READY",
            "AGE",
            "IMAGEID",
            "ID",
            "NODEPOOL",
            "NODECLASS",
            "DRIFTED"
        ],
        "{wide:?}"
    );
    let pools = rows(&kubectl(&env, &["get", "nodepools"]));
    assert_eq!(
        pools[0],
        ["NAME", "NODECLASS", "NODES", "READY", "AGE"],
        "{pools:?}"
    );
    let pool = pools
        .iter()
        .find(|r| r[0] == "default")
        .unwrap_or_else(|| panic!("the NodePool in {pools:?}"));
    let nodes = claims.len().to_string();
    assert_eq!(pool[1..4], ["default", nodes.as_str(), "True"], "{pool:?}");

    let described = kubectl(&env, &["describe", "nodeclaim", name]);
    for want in ["Name:", name, "Conditions:", "Initialized", node] {
        assert!(described.contains(want), "{want} in:\n{described}");
    }
    let pod = env
        .list("pods")
        .into_iter()
        .find_map(|p| p["metadata"]["name"].as_str().map(String::from))
        .expect("a pod");
    let described = kubectl(&env, &["describe", "pod", &pod]);
    assert!(
        described.contains("Events:")
            && described.contains("Nominated")
            && described.contains("Pod should schedule on: nodeclaim/"),
        "the controller's Nominated Event in:\n{described}"
    );
    let nominated: Value = serde_json::from_str(&kubectl(
        &env,
        &[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={pod},reason=Nominated"),
            "-o",
            "json",
        ],
    ))
    .expect("kubectl's JSON");
    assert_eq!(
        nominated["items"].as_array().map(Vec::len),
        Some(1),
        "{nominated:#}"
    );
}

/// Issue 43's "done when": after a change that drifts every node of `default`, the real
/// `kubectl wait --for=condition=NodesUpToDate nodepool/default` exits 0, and only once the old
/// claims are gone (asked of the API server with kubectl, not of the test's mirror). kubectl
/// holds the pre-change `True` as stale by its `observedGeneration`, so the wait may start at once.
async fn kubectl_wait_for_nodes_up_to_date_returns_once_a_drift_rollout_ends(backend: Backend) {
    let env = flows::env(backend).await;
    flows::web(&env, 2, "500m").await;
    let settled = [
        "wait",
        "--for=condition=NodesUpToDate",
        "nodepool/default",
        "--timeout=60s",
    ];
    let out = kubectl_async(&env, &settled).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = flows::claim_names(&env);
    assert!(!before.is_empty());

    env.set_disruption(json!({"consolidateAfter": "Never", "budgets": [{"nodes": "100%"}]}))
        .await;
    env.patch_pool(json!({"spec": {"template": {"metadata": {"labels": {"team": "blue"}}}}}))
        .await;
    let out = kubectl_async(
        &env,
        &[
            "wait",
            "--for=condition=NodesUpToDate",
            "nodepool/default",
            "--timeout=120s",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "kubectl wait: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let left = kubectl(&env, &["get", "nodeclaims", "-o", "name"]);
    for old in &before {
        assert!(
            !left.contains(&format!("nodeclaim.karpenter.sh/{old}")),
            "kubectl wait returned while {old} of the old rollout remains:\n{left}"
        );
    }
    let counts = kubectl(
        &env,
        &[
            "get",
            "nodepool",
            "default",
            "-o",
            "jsonpath={.status.nodes} {.status.upToDateNodes} {.status.readyNodes} {.status.upToDateAndReadyNodes}",
        ],
    );
    let counts: Vec<&str> = counts.split_whitespace().collect();
    assert_eq!(counts.len(), 4, "{counts:?}");
    assert!(
        counts.iter().all(|c| *c == counts[0]) && counts[0] != "0",
        "every node up to date and ready: {counts:?}"
    );
    for c in env.list("nodeclaims") {
        assert_eq!(c["metadata"]["labels"]["team"], "blue", "{c}");
    }
}
