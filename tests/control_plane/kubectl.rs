//! Real kubectl against both backends: `get` of the project's resources shows the CRDs' printer
//! columns with their values (the simulated server renders the Table itself, kube-apiserver from
//! the CRD), `-o wide` adds the priority-1 ones, and `describe` shows a claim's conditions and a
//! pod's Events as the controller wrote them (events.k8s.io/v1, read back as core/v1).

use std::process::Command;

use serde_json::Value;

use karpenter_capi::sim::cluster::Backend;

use crate::assets::{self, Asset};
use crate::common::Env;
use crate::flows;

on_both_backends![needs [Kubectl]; kubectl_gets_and_describes_the_projects_resources];

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
