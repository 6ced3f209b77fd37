//! "Why not?" (issue 43, ahead of upstream's RFC kubernetes-sigs/karpenter#3288 and issue
//! #711): `karpenter-capi explain node NAME [--remove]` against the simulated cluster with the
//! controller running. What explain predicts is then checked against what the controller does:
//! the node it says may go is the one the next pass removes, its pods land where it said, and
//! the blocker it names (PodDisruptionBudget, do-not-disrupt, budget) is the one on the
//! `karpenter_voluntary_disruption_blocked_nodes` gauge.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use common::*;
use karpenter_capi::api::wellknown::*;
use karpenter_capi::sim::cluster::{PodShape, SimClusterConfig};
use karpenter_capi::simulate::launch::{claim_for, settle};

use crate::disruption::fast;

/// `karpenter-capi explain node NODE [--remove] -o json` against the simulated cluster.
fn explain_node(kubeconfig: &Path, node: &str, remove: bool) -> Value {
    let mut args = vec!["node", node];
    if remove {
        args.push("--remove");
    }
    common::explain::explain_json(kubeconfig, &args)
}

/// A cluster whose scheduler stand-in binds pending pods, with disruption at test speed.
async fn env_scheduling() -> Env {
    let cfg = SimClusterConfig {
        scheduler: true,
        ..fast_cluster()
    };
    env_cfg(cfg, fast()).await
}

impl Env {
    /// Deployment `name` of `replicas` 1-CPU pods labelled `app: name`.
    async fn app(&self, name: &str, replicas: usize) {
        let shape = PodShape {
            labels: BTreeMap::from([("app".to_string(), name.to_string())]),
            ..PodShape::new("1", "1Gi")
        };
        self.deployment(name, replicas, shape).await;
    }

    /// The nodes the running pods of `app` are bound to, by pod name.
    fn placements(&self, app: &str) -> BTreeMap<String, String> {
        self.list("pods")
            .into_iter()
            .filter(|p| p["metadata"]["labels"]["app"] == app)
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| {
                let node = p["spec"]["nodeName"].as_str()?.to_string();
                Some((p["metadata"]["name"].as_str()?.to_string(), node))
            })
            .collect()
    }

    async fn annotate_node(&self, node: &str, annotations: Value) {
        Api::<Node>::all(self.client().await)
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            )
            .await
            .expect("annotate the node");
    }

    /// The gauge's value for the default pool and `blocker`.
    fn blocked_nodes(&self, blocker: &str) -> f64 {
        self.metric(&format!(
            "karpenter_voluntary_disruption_blocked_nodes{{nodepool=\"default\",blocker=\"{blocker}\"}}"
        ))
    }
}

/// The what-if in `report` saves `per_hour`.
fn assert_saves(report: &Value, per_hour: f64) {
    let saves = report["remove"]["savings_per_hour"].as_f64();
    assert!(
        saves.is_some_and(|s| (s - per_hour).abs() < 1e-9),
        "saves {per_hour}/h: {report:#}"
    );
}

/// The one destination in `removal` (its pods' nodes and new claims).
fn only_destination(report: &Value) -> &Value {
    let ds = report["remove"]["destinations"]
        .as_array()
        .unwrap_or_else(|| panic!("no destinations in {report:#}"));
    assert_eq!(ds.len(), 1, "{report:#}");
    &ds[0]
}

/// A node whose pod fits on another node: explain says it would be deleted and its pod would
/// move to that node; once consolidation is turned on the controller deletes that claim and the
/// pod's replacement lands on that node.
#[actix::test]
async fn explain_node_remove_predicts_the_delete_consolidation_makes() {
    let env = env_scheduling().await;
    let kubeconfig = env.sim.kubeconfig();
    let (going, going_node) = env.stamped_claim("sim-0").await;
    env.app("app", 1).await;
    env.wait("the app's pod bound", || {
        (env.placements("app").values().next() == Some(&going_node)).then_some(())
    })
    .await;
    let (kept, kept_node) = env.stamped_claim("sim-0").await;
    env.annotate_node(&kept_node, json!({DO_NOT_DISRUPT_ANNOTATION: "true"}))
        .await;

    // consolidateAfter: Never (the scenario pool's default) holds both for now.
    let now = explain_node(&kubeconfig, &going_node, true);
    assert_eq!(now["nodeclaim"], going.as_str(), "{now:#}");
    assert_eq!(now["nodepool"], "default", "{now:#}");
    assert_eq!(now["blocker"], "consolidation_disabled", "{now:#}");
    assert_eq!(now["remove"]["verdict"], "delete", "{now:#}");
    assert_eq!(
        only_destination(&now)["node"],
        kept_node.as_str(),
        "{now:#}"
    );
    assert_saves(&now, 0.2);
    let other = explain_node(&kubeconfig, &kept_node, false);
    assert_eq!(other["blocker"], "do_not_disrupt", "{other:#}");

    env.set_disruption(json!({"consolidationPolicy": "WhenEmptyOrUnderutilized",
                              "consolidateAfter": "0s", "budgets": [{"nodes": "100%"}]}))
        .await;
    env.wait("the claim explain named deleted", || {
        env.get("nodeclaims", "", &going).is_none().then_some(())
    })
    .await;
    env.wait("the app's pod on the node explain named", || {
        let at = env.placements("app");
        (at.len() == 1 && at.values().all(|n| *n == kept_node)).then_some(())
    })
    .await;
    assert!(env.get("nodeclaims", "", &kept).is_some());
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

/// A node on a pricier offering: explain says it would be replaced by a new claim of a cheaper
/// type, its pod going there, saving the difference; the controller replaces it so.
#[actix::test]
async fn explain_node_remove_predicts_the_replacement_consolidation_makes() {
    let env = env_scheduling().await;
    let kubeconfig = env.sim.kubeconfig();
    env.offer_pricier_sim_1().await;
    let mut claim = claim_for(&env.pool, "sim-1");
    claim.spec.expire_after = None;
    let (pricey, node) = env.create_and_wait(claim).await;
    env.app("app", 1).await;
    env.wait("the app's pod bound", || {
        (env.placements("app").values().next() == Some(&node)).then_some(())
    })
    .await;

    let now = explain_node(&kubeconfig, &node, true);
    assert_eq!(now["instance_type"], "sim-1", "{now:#}");
    assert_eq!(now["remove"]["verdict"], "replace", "{now:#}");
    let replacement = &now["remove"]["replacement"];
    assert_eq!(replacement["instance_types"], json!(["sim-0"]), "{now:#}");
    assert_eq!(only_destination(&now)["new_claim"], "default", "{now:#}");
    assert_saves(&now, 0.01);
    assert_eq!(
        now["remove"]["stopped_by"][0]["blocker"],
        "consolidation_disabled"
    );

    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s"}),
    )
    .await;
    let new_node = env
        .wait(
            "the pricey claim replaced by the type explain named",
            || {
                let claims = env.list("nodeclaims");
                let [only] = claims.as_slice() else {
                    return None;
                };
                (env.get("nodeclaims", "", &pricey).is_none()
                    && only["metadata"]["labels"][INSTANCE_TYPE_LABEL] == "sim-0")
                    .then(|| only["status"]["nodeName"].as_str().map(String::from))
                    .flatten()
            },
        )
        .await;
    env.wait("the app's pod on the replacement", || {
        let at = env.placements("app");
        (at.len() == 1 && at.values().all(|n| *n == new_node)).then_some(())
    })
    .await;
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

/// What stops a node is named by explain as the gauge counts it: a PodDisruptionBudget, then
/// (once it allows the eviction) a budget of 0; opened, the controller removes the node as
/// explain's what-if said.
#[actix::test]
async fn explain_node_names_the_pdb_and_the_budget_that_stop_it() {
    let env = env_with(fast()).await;
    let kubeconfig = env.sim.kubeconfig();
    let (guarded, guarded_node) = env.stamped_claim("sim-0").await;
    let (_, kept_node) = env.stamped_claim("sim-0").await;
    env.annotate_node(&kept_node, json!({DO_NOT_DISRUPT_ANNOTATION: "true"}))
        .await;
    env.pod(
        "guarded",
        &guarded_node,
        json!({"app": "guarded"}),
        json!({}),
    )
    .await;
    env.pdb("guarded", "guarded", 0).await;
    env.set_disruption(json!({"consolidationPolicy": "WhenEmptyOrUnderutilized",
                              "consolidateAfter": "0s", "budgets": [{"nodes": "100%"}]}))
        .await;
    env.until("the gauge counts the PDB and do-not-disrupt", |e| {
        e.blocked_nodes("pdb") == 1.0 && e.blocked_nodes("do_not_disrupt") == 1.0
    })
    .await;
    let held = explain_node(&kubeconfig, &guarded_node, true);
    assert_eq!(held["blocker"], "pdb", "{held:#}");
    assert!(
        held["why"]
            .as_str()
            .is_some_and(|w| w.contains("PodDisruptionBudget")),
        "{held:#}"
    );
    assert_eq!(held["remove"]["verdict"], "delete", "{held:#}");
    assert_eq!(
        held["remove"]["stopped_by"][0]["blocker"], "pdb",
        "{held:#}"
    );
    assert_eq!(
        only_destination(&held)["node"],
        kept_node.as_str(),
        "{held:#}"
    );
    // Text reads the same facts.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
        .args(["explain", "node", &guarded_node, "--remove", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .expect("text explain node");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("disruption: blocked (pdb)"), "{text}");
    assert!(
        text.contains(&format!("pod {NS}/guarded -> node {kept_node}")),
        "{text}"
    );
    assert!(text.contains("stopped by pdb"), "{text}");

    // The PDB allows the eviction, the pool's budget allows nothing.
    env.set_disruption(json!({"consolidationPolicy": "WhenEmptyOrUnderutilized",
                              "consolidateAfter": "0s", "budgets": [{"nodes": "0"}]}))
        .await;
    env.pdb_min_available("guarded", "guarded", 0).await;
    env.until("the gauge counts the budget", |e| {
        e.blocked_nodes("budget") == 1.0 && e.blocked_nodes("pdb") == 0.0
    })
    .await;
    let budget = explain_node(&kubeconfig, &guarded_node, true);
    assert_eq!(budget["blocker"], "budget", "{budget:#}");
    let stops: Vec<&Value> = budget["remove"]["stopped_by"]
        .as_array()
        .map(|s| s.iter().map(|x| &x["blocker"]).collect())
        .unwrap_or_default();
    assert!(stops.contains(&&json!("budget")), "{budget:#}");
    assert_eq!(budget["remove"]["verdict"], "delete", "{budget:#}");

    env.set_disruption(json!({"consolidationPolicy": "WhenEmptyOrUnderutilized",
                              "consolidateAfter": "0s", "budgets": [{"nodes": "100%"}]}))
        .await;
    env.wait("the node explain said may go, gone", || {
        env.get("nodeclaims", "", &guarded).is_none().then_some(())
    })
    .await;
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

/// docs/tools.md's blockers table has one row per `Blocker`, in `Blocker::ALL`'s order, and every
/// test a row names exists.
#[test]
fn the_blockers_table_names_every_value_and_tests_that_exist() {
    use karpenter_capi::disruption::Blocker;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/tools.md")).expect("docs/tools.md");
    let table = doc
        .split("| Blocker | Meaning | Produced by | Test |")
        .nth(1)
        .expect("the blockers table");
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with("| "))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    let values: Vec<&str> = rows.iter().map(|r| r[0].trim_matches('`')).collect();
    let labels: Vec<&str> = Blocker::ALL.iter().map(|b| b.label()).collect();
    assert_eq!(values, labels, "one row per blocker, in order");
    for row in &rows {
        assert_eq!(row.len(), 4, "row {}: four cells", row[0]);
        common::explain::assert_named_tests_exist(row[0], row[3]);
    }
}
