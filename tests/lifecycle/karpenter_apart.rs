//! Karpenter's objects in the management cluster (`--karpenter-objects management`): NodePools,
//! NodeClasses and NodeClaims beside the Cluster's Machines, each bound to Cluster `sim` by its
//! labels, and the workload cluster holding only Nodes and Pods. Claims launch, drain and
//! consolidate across the two clusters; no Node is owned by a claim it cannot see; objects
//! bound to another Cluster are not this controller's, nor a fleet's serving `sim`.

use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

use karpenter_capi::actors::Settings;
use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::{CLUSTER_NAME_LABEL, CLUSTER_NAMESPACE_LABEL};
use karpenter_capi::app::fleet::Fleet;
use karpenter_capi::sim::cluster::{PodShape, SimClusterConfig};
use karpenter_capi::simulate::launch::{claim_for, seed_of};
use karpenter_capi::simulate::sim_settings;
use karpenter_capi::view::binding::Binding;

use crate::common::claims::fast_disruption;
use crate::common::{Env, condition, fast_cluster};

const KARPENTER: [&str; 3] = ["nodeclaims", "nodepools", "clusterapinodeclasses"];

fn layout() -> SimClusterConfig {
    SimClusterConfig {
        karpenter_in_management: true,
        scheduler: true,
        ..fast_cluster()
    }
}

async fn env() -> Env {
    Env::builder()
        .cluster(layout())
        .seeds(vec![seed_of(0, 10)])
        .settings(Settings {
            disruption: fast_disruption(),
            ..sim_settings(None)
        })
        .short_batches()
        .start()
        .await
}

fn label<'a>(o: &'a Value, key: &str) -> Option<&'a str> {
    o["metadata"]["labels"][key].as_str()
}

/// Karpenter's and Cluster API's objects in the management cluster only, Nodes and Pods in the
/// workload cluster only; every claim bound to Cluster `sim` in `default`; no Node owned by a
/// claim (the workload cluster's garbage collector would delete it) or carrying the binding.
fn each_kind_in_its_cluster(env: &Env) {
    let cluster = env.sim.cluster();
    let (workload, management) = (cluster.store(), cluster.capi_store());
    for kind in KARPENTER.iter().chain(&["machines", "machinedeployments"]) {
        assert!(
            workload.list(kind, None).is_empty(),
            "no {kind} in the workload cluster"
        );
    }
    for kind in ["nodes", "pods"] {
        assert!(
            management.list(kind, None).is_empty(),
            "no {kind} in the management cluster"
        );
    }
    for c in management.list("nodeclaims", None) {
        assert_eq!(label(&c, CLUSTER_NAME_LABEL), Some("sim"), "{c:#}");
        assert_eq!(label(&c, CLUSTER_NAMESPACE_LABEL), Some("default"), "{c:#}");
    }
    for n in workload.list("nodes", None) {
        let owners = n["metadata"]["ownerReferences"].as_array().cloned();
        assert!(
            !owners.iter().flatten().any(|o| o["kind"] == "NodeClaim"),
            "a Node owned by a claim of another cluster: {n:#}"
        );
        assert_eq!(label(&n, CLUSTER_NAMESPACE_LABEL), None, "{n:#}");
    }
}

/// Two claims in the management cluster launch: Machines beside them, Nodes in the workload
/// cluster registered and initialized with no owner reference back to them.
#[actix::test]
async fn claims_in_the_management_cluster_launch_machines_and_nodes() {
    let env = env().await;
    env.claims(2, 1).await;
    env.settle().await;
    assert_eq!(env.list("machines").len(), 2, "two Machines");
    assert_eq!(env.sim.cluster().store().list("nodes", None).len(), 2);
    for c in env.list("nodeclaims") {
        assert!(
            condition(&c, "Initialized").is_some_and(|i| i["status"] == "True"),
            "{c:#}"
        );
    }
    each_kind_in_its_cluster(&env);
    env.invariants_hold();
}

/// A claim deleted in the management cluster drains its Node in the workload cluster (its pod
/// evicted), then the Node, the Machine and the claim go.
#[actix::test]
async fn a_deleted_claim_drains_its_node_in_the_workload_cluster() {
    let env = env().await;
    let (claim, node) = env.claim_in_layout().await;
    env.pod("app", &node, json!({"app": "app"}), json!({}))
        .await;
    Api::<NodeClaim>::all(env.karpenter_client().await)
        .delete(&claim, &DeleteParams::default())
        .await
        .expect("delete the claim");
    env.until("claim, Node, Machine and pod gone", |e| {
        e.get("nodeclaims", "", &claim).is_none()
            && e.get("nodes", "", &node).is_none()
            && e.list("machines").is_empty()
            && e.get("pods", "default", "app").is_none()
    })
    .await;
    each_kind_in_its_cluster(&env);
    env.invariants_hold();
}

/// Pending pods in the workload cluster get claims the controller creates in the management
/// cluster, bound to the Cluster, and Nodes; once the pods go, the empty Nodes are
/// consolidated away.
#[actix::test]
async fn pending_pods_get_bound_claims_and_empty_nodes_are_consolidated() {
    let env = env().await;
    env.deployment("web", 4, PodShape::new("1", "1Gi")).await;
    env.until_launched(4).await;
    assert!(!env.list("nodeclaims").is_empty());
    each_kind_in_its_cluster(&env);
    env.invariants_hold();

    env.sim
        .run(|c| async move { c.scale_deployment("default", "web", 0).await })
        .await
        .expect("the simulated cluster")
        .expect("scale to zero");
    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s",
                              "budgets": [{"nodes": "100%"}]}),
    )
    .await;
    env.until_quiet("every empty node consolidated", |e| {
        e.list("nodeclaims").is_empty() && e.sim.cluster().store().list("nodes", None).is_empty()
    })
    .await;
    each_kind_in_its_cluster(&env);
    env.invariants_hold();
}

/// A NodePool and a claim bound to Cluster `other`, and a claim bound to a Cluster `sim` of
/// another namespace, sit in the same management cluster: this controller launches none of
/// them and writes no status on them, while its own claim launches.
#[actix::test]
async fn objects_bound_to_another_cluster_are_not_this_controllers() {
    let env = env().await;
    let mut pool = env.pool.clone();
    pool.metadata = kube::api::ObjectMeta {
        name: Some("other-default".into()),
        labels: Some(binding("other", "default")),
        ..Default::default()
    };
    Api::<NodePool>::all(env.karpenter_client().await)
        .create(&PostParams::default(), &pool)
        .await
        .expect("another Cluster's NodePool");
    for (name, (cluster, ns)) in [("other-1", ("other", "default")), ("sim-b", ("sim", "b"))] {
        env.foreign_claim(name, cluster, ns).await;
    }
    let (ours, _) = env.claim_in_layout().await;
    env.settle_ours(&ours).await;
    assert_eq!(
        env.list("machines").len(),
        1,
        "a Machine for our claim only"
    );
    for foreign in ["other-1", "sim-b"] {
        let c = env.get("nodeclaims", "", foreign).expect("still there");
        assert!(c["status"].is_null(), "{foreign} untouched: {c:#}");
    }
    let other = env.get("nodepools", "", "other-default").expect("the pool");
    assert!(
        other["status"].is_null(),
        "no status on another Cluster's pool: {other:#}"
    );
}

/// A fleet (`run --fleet`) serves Cluster `sim` with Karpenter's objects in the management
/// cluster: the Cluster's controller is bound to it, so the claims bound to `sim` launch while
/// a claim bound to Cluster `other`, in the same management cluster, is left untouched.
#[actix::test]
async fn a_fleet_serves_a_cluster_whose_objects_are_in_the_management_cluster() {
    let mut env = env().await;
    env.kill();
    // As `run --fleet --karpenter-objects management`: the binding filled in per Cluster.
    let unbound = Binding {
        cluster: String::new(),
        namespace: String::new(),
    };
    let fleet = Fleet {
        settings: Settings {
            karpenter_objects: Some(unbound),
            ..sim_settings(None)
        },
        ..crate::fleet::fleet_of(&env).await
    };
    let running = crate::fleet::spawn_until_pending(fleet);
    env.foreign_claim("other-1", "other", "default").await;
    for name in env.claims(2, 1).await {
        env.settle_ours(&name).await;
    }
    assert_eq!(env.list("machines").len(), 2, "a Machine for each of ours");
    let foreign = env.get("nodeclaims", "", "other-1").expect("still there");
    assert!(
        foreign["status"].is_null(),
        "other-1 untouched: {foreign:#}"
    );
    Api::<NodeClaim>::all(env.karpenter_client().await)
        .delete("other-1", &DeleteParams::default())
        .await
        .expect("delete the foreign claim");
    each_kind_in_its_cluster(&env);
    env.invariants_hold();
    running.abort();
}

/// NodePools that name Cluster `sim` but whose namespace label is missing or no namespace name
/// bind to no Cluster: a Warning Event in the management cluster names each, and the field.
#[actix::test]
async fn a_pool_naming_the_cluster_with_a_broken_binding_is_named_in_an_event() {
    let builder = Env::builder().cluster(layout()).seeds(vec![seed_of(0, 10)]);
    let (sim, pool) = builder.seeded().await;
    let client = sim.karpenter_client_here().await.expect("client");
    for (name, labels) in [
        ("unbound", json!({CLUSTER_NAME_LABEL: "sim"})),
        (
            "malformed",
            json!({CLUSTER_NAME_LABEL: "sim", CLUSTER_NAMESPACE_LABEL: "Team_A"}),
        ),
    ] {
        let mut np = pool.clone();
        np.metadata =
            serde_json::from_value(json!({"name": name, "labels": labels})).expect("metadata");
        Api::<NodePool>::all(client.clone())
            .create(&PostParams::default(), &np)
            .await
            .expect("a misbound NodePool");
    }
    let metrics = karpenter_capi::metrics::Metrics::new();
    let controller =
        karpenter_capi::simulate::start_controller(&sim, sim_settings(None), metrics.clone())
            .await
            .expect("controller");
    let env = Env {
        sim,
        pool,
        metrics,
        controller: Some(controller),
    };
    let field = format!("metadata.labels[\"{CLUSTER_NAMESPACE_LABEL}\"]");
    for (name, problem) in [
        ("unbound", "is missing"),
        ("malformed", "is \"Team_A\", not a namespace name"),
    ] {
        let note = env
            .wait(&format!("an Event naming NodePool {name}"), || {
                let events = env
                    .sim
                    .cluster()
                    .capi_store()
                    .list("events.events.k8s.io", None);
                events
                    .into_iter()
                    .find(|e| {
                        e["reason"] == "InvalidClusterBinding" && e["regarding"]["name"] == name
                    })
                    .and_then(|e| e["note"].as_str().map(String::from))
            })
            .await;
        assert!(
            note.starts_with(&format!("NodePool {name}: {field} {problem}")),
            "{note}"
        );
    }
    assert!(
        env.sim
            .cluster()
            .store()
            .list("events.events.k8s.io", None)
            .iter()
            .all(|e| e["reason"] != "InvalidClusterBinding"),
        "the Events are where the NodePools are"
    );
}

/// `explain` and `init` with `--karpenter-objects management` read and propose Karpenter's
/// objects in the management cluster, bound to the Cluster; without --cluster-name they refuse,
/// naming the flag.
#[actix::test]
async fn explain_and_init_read_and_propose_in_the_management_cluster() {
    let env = env().await;
    let (claim, node) = env.claim_in_layout().await;
    let cluster = env.sim.cluster();
    let management = cluster.management_kubeconfig_path().expect("apart");
    let layout = [
        "--cluster-api-kubeconfig",
        management.to_str().expect("a UTF-8 path"),
        "--karpenter-objects",
        "management",
        "--cluster-api-namespace",
        "default",
    ];
    let with_cluster = |args: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        a.extend(layout.iter().map(|s| s.to_string()));
        a.extend(["--cluster-name".to_string(), "sim".to_string()]);
        a
    };
    let kubeconfig = env.sim.kubeconfig();
    let args = with_cluster(&["nodeclaim", &claim]);
    let c = crate::common::explain::explain_json(&kubeconfig, &strs(&args));
    assert_eq!(c["phase"], "Initialized", "{c:#}");
    let args = with_cluster(&["nodepool", "default"]);
    let np = crate::common::explain::explain_json(&kubeconfig, &strs(&args));
    assert_eq!(np["instance_types"], json!(["sim-0"]), "{np:#}");

    let run = |args: Vec<String>| {
        std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
            .args(args)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .output()
            .expect("running karpenter-capi")
    };
    let init = run(with_cluster(&["init", "-o", "yaml"]));
    let yaml = String::from_utf8_lossy(&init.stdout);
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    assert_eq!(
        yaml.matches(&format!("{CLUSTER_NAMESPACE_LABEL}: default"))
            .count(),
        2,
        "{yaml}"
    );
    // Both objects' binding, and the NodeClass's selector of the Cluster's MachineDeployments.
    assert_eq!(
        yaml.matches(&format!("{CLUSTER_NAME_LABEL}: sim")).count(),
        3,
        "{yaml}"
    );

    let mut unnamed = with_cluster(&["explain", "node", &node]);
    unnamed.truncate(unnamed.len() - 2);
    let refused = run(unnamed);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--cluster-name"), "{stderr}");
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn binding(cluster: &str, namespace: &str) -> std::collections::BTreeMap<String, String> {
    [
        (CLUSTER_NAME_LABEL.to_string(), cluster.to_string()),
        (CLUSTER_NAMESPACE_LABEL.to_string(), namespace.to_string()),
    ]
    .into()
}

impl Env {
    /// One initialized claim, bound to the Cluster, in the management cluster; (claim, node).
    async fn claim_in_layout(&self) -> (String, String) {
        let name = self.claims(1, 1).await.remove(0);
        self.settle_ours(&name).await;
        let node = self
            .get("nodeclaims", "", &name)
            .and_then(|c| c["status"]["nodeName"].as_str().map(String::from))
            .expect("the claim's node");
        (name, node)
    }

    /// A claim named `name` in the management cluster, bound to Cluster `namespace/cluster`.
    async fn foreign_claim(&self, name: &str, cluster: &str, namespace: &str) {
        let mut c = claim_for(&self.pool, "sim-0");
        c.metadata.generate_name = None;
        c.metadata.name = Some(name.into());
        c.metadata
            .labels
            .get_or_insert_default()
            .extend(binding(cluster, namespace));
        Api::<NodeClaim>::all(self.karpenter_client().await)
            .create(&PostParams::default(), &c)
            .await
            .expect("a foreign claim");
    }

    /// Until claim `name` is initialized.
    async fn settle_ours(&self, name: &str) {
        self.until(&format!("{name} initialized"), |e| {
            e.get("nodeclaims", "", name).is_some_and(|c| {
                condition(&c, "Initialized").is_some_and(|i| i["status"] == "True")
            })
        })
        .await;
    }
}
