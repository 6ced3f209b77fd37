//! `karpenter-capi init` on both backends: usable and unusable MachineDeployments reported with
//! the commands that fix them, and `-o yaml` applied with the real kubectl, then seen by the
//! controller (its NodePool becomes Ready).

use crate::assets;
use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use karpenter_capi::api::wellknown::{CPU_ANNOTATION, MEMBER_LABEL, MEMORY_ANNOTATION};
use karpenter_capi::metrics::Metrics;
use karpenter_capi::sim::cluster::{Backend, MachineDeploymentSeed, SimClusterConfig};
use karpenter_capi::simulate::launch::seed_of;
use karpenter_capi::simulate::{BackgroundSim, sim_settings, start_controller};

use common::{NS, condition, fast_cluster};

fn init(kubeconfig: &Path, output: &str) -> (String, String) {
    init_with(kubeconfig, output, &[])
}

fn init_with(kubeconfig: &Path, output: &str, extra: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
        .args(["init", "-o", output, "--kubeconfig"])
        .arg(kubeconfig)
        .args(extra)
        .output()
        .expect("running karpenter-capi init");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "init failed: {stderr}\n{stdout}");
    (stdout, stderr)
}

on_both_backends![
    needs [Kubectl];
    init_reports_each_machine_deployment_with_its_fix,
    init_yaml_applies_with_kubectl_and_the_nodepool_becomes_ready,
];

pub fn tests() -> Vec<assets::Test> {
    let mut all = on_both();
    // Simulated only: the filter reads the cluster-name label Cluster API's defaulting webhook
    // writes, and no webhook runs on the real backend (docs/fidelity.md).
    all.extend(trials![@actix init_names_the_cluster_filter_that_leaves_machine_deployments_out]);
    all
}

/// A cluster on `backend` with one usable MachineDeployment and three that are not, each for
/// another reason.
async fn seeded(backend: Backend) -> BackgroundSim {
    let sim = BackgroundSim::start(SimClusterConfig {
        backend,
        ..fast_cluster()
    })
    .await
    .expect("the cluster");
    sim.run(|c| async move {
        let member = BTreeMap::from([(MEMBER_LABEL.to_string(), String::new())]);
        // Usable; usable but for the member label; a member with no capacity; a member with a
        // malformed cpu annotation.
        let mut unlabelled = seed_of(1, 10);
        unlabelled.name = "unlabelled".into();
        unlabelled.labels.clear();
        let seeds = [
            seed_of(0, 10),
            unlabelled,
            MachineDeploymentSeed {
                name: "empty".into(),
                namespace: NS.into(),
                labels: member.clone(),
                ..Default::default()
            },
            MachineDeploymentSeed {
                name: "bad".into(),
                namespace: NS.into(),
                labels: member,
                annotations: BTreeMap::from([
                    (CPU_ANNOTATION.to_string(), "four".to_string()),
                    (MEMORY_ANNOTATION.to_string(), "16Gi".to_string()),
                ]),
                ..Default::default()
            },
        ];
        for s in &seeds {
            c.create_machine_deployment_from(s)
                .await
                .expect("MachineDeployment");
        }
    })
    .await
    .expect("seeding");
    sim
}

async fn init_reports_each_machine_deployment_with_its_fix(backend: Backend) {
    let sim = seeded(backend).await;
    let kubeconfig = sim.kubeconfig();
    let (text, _) = init(&kubeconfig, "text");
    assert!(
        text.contains("1 of 4 MachineDeployments can serve as offerings"),
        "{text}"
    );
    assert!(
        text.contains("usable: default/md-0 (instance type sim-0, on-demand)"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "fix: kubectl label machinedeployment unlabelled -n default {MEMBER_LABEL}="
        )),
        "{text}"
    );
    assert!(
        text.contains("not usable: default/empty: no cpu capacity"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "fix: kubectl annotate machinedeployment empty -n default {CPU_ANNOTATION}=<CPUS>"
        )),
        "{text}"
    );
    assert!(
        text.contains("not usable: default/bad: malformed annotation")
            && text.contains(CPU_ANNOTATION),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "fix: kubectl annotate --overwrite machinedeployment bad -n default {CPU_ANNOTATION}=<VALID VALUE>"
        )),
        "{text}"
    );

    // -o yaml: only YAML on stdout (comments and documents), nothing else.
    let (yaml, _) = init(&kubeconfig, "yaml");
    for line in yaml.lines() {
        assert!(
            line.starts_with('#') || line == "---" || !line.trim().is_empty(),
            "not YAML: {line:?}"
        );
    }
    assert!(yaml.contains("kind: ClusterAPINodeClass") && yaml.contains("kind: NodePool"));
}

async fn init_yaml_applies_with_kubectl_and_the_nodepool_becomes_ready(backend: Backend) {
    let sim = seeded(backend).await;
    let kubeconfig = sim.kubeconfig();
    let (yaml, _) = init(&kubeconfig, "yaml");
    let kubectl = assets::tool(assets::Asset::Kubectl);
    // kubectl validates against the served OpenAPI v3 documents and the server's admission.
    let mut child = Command::new(&kubectl)
        .args(["apply", "-f", "-", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl apply");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(yaml.as_bytes())
        .expect("write YAML");
    let out = child.wait_with_output().expect("kubectl apply finished");
    let applied = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubectl apply failed: {}\n{applied}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        applied.contains("clusterapinodeclass.karpenter.cluster.x-k8s.io/default created"),
        "{applied}"
    );
    assert!(
        applied.contains("nodepool.karpenter.sh/default created"),
        "{applied}"
    );

    // The controller takes it from there: the NodeClass resolves md-0 and the NodePool is Ready.
    let _controller = start_controller(&sim, sim_settings(None), Metrics::new())
        .await
        .expect("controller");
    let store = sim.cluster().store();
    let deadline = std::time::Instant::now() + common::DEADLINE;
    loop {
        let np = store.get("nodepools", "", "default");
        if np
            .as_ref()
            .and_then(|np| condition(np, "Ready"))
            .is_some_and(|c| c["status"] == "True")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "NodePool never Ready: {np:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// `--cluster-name` filters on the `cluster.x-k8s.io/cluster-name` label Cluster API's webhook
/// sets: the right name finds the MachineDeployments, a wrong one is named as the cause instead
/// of an empty cluster or a missing member label.
async fn init_names_the_cluster_filter_that_leaves_machine_deployments_out() {
    let sim = seeded(Backend::Simulated).await;
    let kubeconfig = sim.kubeconfig();
    let (right, _) = init_with(&kubeconfig, "text", &["--cluster-name", "sim"]);
    assert!(
        right.contains("1 of 4 MachineDeployments can serve as offerings"),
        "{right}"
    );
    let (wrong, _) = init_with(&kubeconfig, "text", &["--cluster-name", "prod"]);
    assert!(
        wrong.contains("0 of 0 MachineDeployments can serve as offerings"),
        "{wrong}"
    );
    assert!(
        wrong.contains(
            "not considered: default/md-0: left out by --cluster-name prod: its cluster.x-k8s.io/cluster-name label is \"sim\""
        ),
        "{wrong}"
    );
    assert!(
        wrong.contains("belongs to another cluster than --cluster-name prod"),
        "{wrong}"
    );
    assert!(
        !wrong.contains("until the commands above are run"),
        "{wrong}"
    );
}
