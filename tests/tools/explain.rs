//! `karpenter-capi explain` against the simulated cluster with the controller running: the real
//! binary, its `--kubeconfig` and `-o json`, on pods the scheduler stand-in marks Unschedulable
//! or binds, on a claim whose Machine never gets a provider ID, and on a NodePool with one bad
//! MachineDeployment.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::{CPU_ANNOTATION, MEMBER_LABEL, MEMORY_ANNOTATION};
use karpenter_capi::sim::cluster::{MachineDeploymentSeed, SimClusterConfig};
use karpenter_capi::simulate::launch::claim_for;
use karpenter_capi::simulate::sim_settings;

use common::{NS, env_cfg, fast_cluster};

/// Runs the binary with `--kubeconfig` and `-o json`; returns the parsed report.
fn explain(kubeconfig: &Path, args: &[&str]) -> Value {
    common::explain::explain_json(kubeconfig, args)
}

fn pod(name: &str, cpu: &str, extra: Value) -> Pod {
    let mut body = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]},
    });
    common::merge(&mut body, extra);
    serde_json::from_value(body).expect("pod")
}

/// The verdict of `pool` / `instance_type` in an `explain pod` report.
fn ruled_out<'a>(report: &'a Value, pool: &str, instance_type: Option<&str>) -> &'a Value {
    let pools = report["pending"]["nodepools"]
        .as_array()
        .unwrap_or_else(|| panic!("no nodepools in {report:#}"));
    let p = pools
        .iter()
        .find(|p| p["nodepool"] == pool)
        .unwrap_or_else(|| panic!("no NodePool {pool} in {report:#}"));
    match instance_type {
        None => &p["ruled_out"],
        Some(t) => {
            let ts = p["instance_types"].as_array().expect("types");
            &ts.iter()
                .find(|x| x["instance_type"] == t)
                .unwrap_or_else(|| panic!("no type {t} in {p:#}"))["ruled_out"]
        }
    }
}

#[actix::test]
async fn explain_pods_and_nodepools_against_the_live_cluster() {
    let cfg = SimClusterConfig {
        scheduler: true,
        ..fast_cluster()
    };
    let env = env_cfg(cfg, sim_settings(None)).await;
    let kubeconfig = env.sim.kubeconfig();
    let client = env.client().await;
    // A member MachineDeployment with a malformed cpu annotation, and a tainted NodePool tried
    // first (weight 10).
    env.sim
        .run(|c| async move {
            c.create_machine_deployment_from(&MachineDeploymentSeed {
                name: "md-bad".into(),
                namespace: NS.into(),
                labels: BTreeMap::from([(MEMBER_LABEL.to_string(), String::new())]),
                annotations: BTreeMap::from([
                    (CPU_ANNOTATION.to_string(), "four".to_string()),
                    (MEMORY_ANNOTATION.to_string(), "16Gi".to_string()),
                ]),
                ..Default::default()
            })
            .await
            .expect("bad MachineDeployment");
        })
        .await
        .expect("seeding");
    let tainted: NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": "gpu"},
        "spec": {"weight": 10, "template": {"spec": {
            "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
            "requirements": [],
            "nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}
        }}}
    }))
    .expect("NodePool");
    Api::<NodePool>::all(client.clone())
        .create(&PostParams::default(), &tainted)
        .await
        .expect("create tainted NodePool");

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for p in [
        pod("big", "8", json!({})),
        pod(
            "elsewhere",
            "1",
            json!({"spec": {"nodeSelector": {"topology.kubernetes.io/zone": "nowhere"}}}),
        ),
        pod("small", "1", json!({})),
    ] {
        pods.create(&PostParams::default(), &p)
            .await
            .expect("create pod");
    }
    // The small pod gets a node; the others are marked Unschedulable and stay pending.
    env.wait("pod small bound", || {
        env.get("pods", NS, "small")
            .filter(|p| p["spec"]["nodeName"].is_string())
    })
    .await;
    for name in ["big", "elsewhere"] {
        env.wait(&format!("pod {name} marked Unschedulable"), || {
            env.get("pods", NS, name).filter(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["reason"] == "Unschedulable"))
            })
        })
        .await;
    }

    // Too big for the only instance type: resources, named; the tainted pool: its taint.
    let big = explain(&kubeconfig, &["pod", "default/big"]);
    assert_eq!(big["pending"]["provisionable"], true, "{big:#}");
    assert_eq!(big["pending"]["outcome"]["kind"], "failed", "{big:#}");
    let r = ruled_out(&big, "default", Some("sim-0"));
    assert_eq!(r["constraint"], "resources", "{big:#}");
    assert!(
        r["message"]
            .as_str()
            .is_some_and(|m| m.contains("cpu needs 8")),
        "{r:#}"
    );
    let t = ruled_out(&big, "gpu", None);
    assert_eq!(t["constraint"], "taints", "{big:#}");
    assert!(
        t["message"]
            .as_str()
            .is_some_and(|m| m.contains("dedicated=gpu:NoSchedule")),
        "{t:#}"
    );

    // A zone no offering has: requirements.
    let elsewhere = explain(&kubeconfig, &["pod", "default/elsewhere"]);
    let r = ruled_out(&elsewhere, "default", Some("sim-0"));
    assert_eq!(r["constraint"], "requirements", "{elsewhere:#}");

    // The scheduled pod: its claim, instance type and the offering chosen among those considered.
    let small = explain(&kubeconfig, &["pod", "default/small"]);
    let placed = &small["placed"];
    assert!(placed["nodeclaim"].is_string(), "{small:#}");
    assert_eq!(placed["instance_type"], "sim-0", "{small:#}");
    assert_eq!(placed["nodepool"], "default", "{small:#}");
    assert_eq!(placed["machine_deployment"], "default/md-0", "{small:#}");
    let considered = placed["offerings"].as_array().expect("offerings");
    let chosen: Vec<&Value> = considered.iter().filter(|o| o["chosen"] == true).collect();
    assert_eq!(chosen.len(), 1, "{small:#}");
    assert_eq!(chosen[0]["machine_deployment"], "default/md-0");
    assert_eq!(chosen[0]["fit"], "eligible", "{small:#}");
    assert!(
        chosen[0]["price"].as_f64().is_some_and(|p| p > 0.0),
        "{small:#}"
    );

    // Its claim: initialized, waiting for nothing, weighed by disruption (a candidate that
    // consolidateAfter: Never keeps from being consolidatable).
    let claim = placed["nodeclaim"].as_str().expect("claim name");
    // The pod binds once the Node is Ready; the claim's Initialized follows on its own turn.
    env.wait("the small pod's claim initialized", || {
        env.get("nodeclaims", "", claim).filter(|c| {
            c["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Initialized" && c["status"] == "True")
            })
        })
    })
    .await;
    let c = explain(&kubeconfig, &["nodeclaim", claim]);
    assert_eq!(c["phase"], "Initialized", "{c:#}");
    assert!(
        c["waiting_for"].is_null() && c["deadline"].is_null(),
        "{c:#}"
    );
    assert_eq!(c["node"], placed["node"], "{c:#}");
    assert_eq!(c["disruption"]["candidate"], true, "{c:#}");
    assert_eq!(c["disruption"]["consolidatable"], false, "{c:#}");

    // The NodePool: sim-0 usable, md-bad left out naming its annotation, usage counted.
    let np = explain(&kubeconfig, &["nodepool", "default"]);
    assert_eq!(np["instance_types"], json!(["sim-0"]), "{np:#}");
    let bad = np["left_out"]
        .as_array()
        .expect("left_out")
        .iter()
        .find(|l| l["machine_deployment"] == "default/md-bad")
        .unwrap_or_else(|| panic!("md-bad not left out: {np:#}"));
    assert!(
        bad["reason"]
            .as_str()
            .is_some_and(|r| r.contains(CPU_ANNOTATION)),
        "{bad:#}"
    );
    assert_eq!(np["usage"]["nodes"]["used"], "1", "{np:#}");

    // `--cluster-name` of another cluster: the filter is named as the cause, not the member
    // label (the simulated Cluster API labels MachineDeployments with their cluster, as its
    // webhook does).
    let other = explain(
        &kubeconfig,
        &["nodepool", "default", "--cluster-name", "prod"],
    );
    assert_eq!(other["nodeclass_ready"], false, "{other:#}");
    let problem = other["nodeclass_problem"].as_str().unwrap_or_default();
    assert!(
        problem.contains("--cluster-name leaves out all") && !problem.contains("karpenter-member"),
        "{other:#}"
    );
    let md0 = other["left_out"]
        .as_array()
        .expect("left_out")
        .iter()
        .find(|l| l["machine_deployment"] == "default/md-0")
        .unwrap_or_else(|| panic!("md-0 not left out: {other:#}"));
    assert!(
        md0["reason"]
            .as_str()
            .is_some_and(|r| r.contains("left out by --cluster-name prod")
                && r.contains("cluster.x-k8s.io/cluster-name label is \"sim\"")),
        "{md0:#}"
    );

    // Text output reads the same facts.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
        .args(["explain", "pod", "default/big", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .expect("text explain");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("sim-0: ruled out by resources: too small"),
        "{text}"
    );

    // A pod that does not exist: exit code 1 and the name in the error.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
        .args(["explain", "pod", "default/nope", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .expect("explain missing pod");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("default/nope"));
}

#[actix::test]
async fn explain_a_claim_waiting_for_its_provider_id() {
    // The provider never answers within the test: the Machine has no provider ID.
    let cfg = SimClusterConfig {
        provider_delay: Duration::from_secs(3600),
        ..fast_cluster()
    };
    let env = env_cfg(cfg, sim_settings(None)).await;
    let claim = claim_for(&env.pool, "sim-0");
    let name = Api::<NodeClaim>::all(env.client().await)
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim")
        .name_any();
    env.wait("the claim's Machine recorded", || {
        env.get("nodeclaims", "", &name)
            .filter(|c| c["metadata"]["annotations"]["cluster.x-k8s.io/machine"].is_string())
    })
    .await;
    let r = explain(
        &env.sim.kubeconfig(),
        &["nodeclaim", &name, "--create-timeout", "7m"],
    );
    assert_eq!(r["phase"], "Launching", "{r:#}");
    assert_eq!(r["machine_deployment"], "default/md-0", "{r:#}");
    assert!(r["machine"].is_string(), "{r:#}");
    assert!(
        r["waiting_for"]
            .as_str()
            .is_some_and(|w| w.contains("provider ID")),
        "{r:#}"
    );
    assert_eq!(r["deadline"]["kind"], "create", "{r:#}");
    assert_eq!(r["deadline"]["timeout"], "7m", "{r:#}");
    assert_eq!(r["deadline"]["source"], "--create-timeout", "{r:#}");
    assert_eq!(r["deadline"]["passed"], false, "{r:#}");
    assert_eq!(r["since"], r["created"], "{r:#}");
    assert_eq!(r["disruption"]["candidate"], false, "{r:#}");
    assert!(
        r["disruption"]["reason"]
            .as_str()
            .is_some_and(|w| w.contains("not initialized")),
        "{r:#}"
    );
}
