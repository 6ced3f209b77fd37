//! A ClusterClass-managed cluster on Cluster API's real manager (v1.14.2 and v1.10.10, the
//! same body at both, its topology controller on; the ClusterClass and Cluster are written in
//! each version's shape by `sim::real::topology`): worker MachineDeployments made by the topology controller from a
//! ClusterClass, carrying the autoscaler's min/max annotations and the capacity annotations in
//! their topology metadata. An entry that leaves `replicas` unset is the controller's to scale,
//! and the topology controller never fights it (no replica write undone, no Machine deleted or
//! made behind the controller's back, through a re-applied topology and a scale-down); an entry
//! that sets `replicas` is held (never offered or written, the NodeClass names the field, and
//! `karpenter-capi explain nodepool` lists it as left out for that field while offering the
//! other), as
//! `tests/provisioning/autoscaler.rs::a_topology_that_sets_replicas_holds_its_machine_deployment`
//! checks on the stand-in.

use std::time::Duration;

use karpenter_capi::api::wellknown::{MAX_SIZE_ANNOTATION, MEMBER_LABEL, MIN_SIZE_ANNOTATION};
use karpenter_capi::capi::topology::DEPLOYMENT_NAME_LABEL;
use karpenter_capi::controlplane::cluster_api::{MANAGER_USER, RELEASE_V1BETA1, RELEASE_V1BETA2};
use karpenter_capi::sim::real::topology::WORKER_CLASS;
use serde_json::{Value, json};

use crate::assets;

pub fn tests() -> Vec<assets::Test> {
    trials![
        @actix a_clusterclass_topology_leaves_unset_replicas_to_the_controller_on_real_cluster_api
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        @actix a_clusterclass_topology_leaves_unset_replicas_to_the_controller_on_real_cluster_api_v1beta1
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApiV1beta1],
    ]
}

/// The topology-managed workload cluster's name (the plain one the backend makes is
/// `sim::cluster::CLUSTER_NAME`).
const CLUSTER: &str = "topology";

/// A worker entry of class [`WORKER_CLASS`] offering the `i`th simulated size, its replicas
/// set or left unset. Cluster API's webhook refuses an entry with replicas and the autoscaler's
/// min/max annotations, so one with replicas has no bounds (the controller needs none).
fn worker(name: &str, i: usize, replicas: Option<i64>) -> Value {
    let mut annotations = karpenter_capi::simulate::pods::seed_of(i, 20).annotations;
    if replicas.is_some() {
        annotations.remove(MAX_SIZE_ANNOTATION);
    } else {
        // With both bounds and no replicas, Cluster API's webhook starts the group at its min.
        annotations.insert(MIN_SIZE_ANNOTATION.to_string(), "0".to_string());
    }
    let mut entry = json!({
        "class": WORKER_CLASS, "name": name,
        "metadata": {"labels": {MEMBER_LABEL: ""}, "annotations": annotations},
    });
    if let Some(r) = replicas {
        entry["replicas"] = json!(r);
    }
    entry
}

/// The topology: `autoscaled` (medium, replicas unset) and `fixed` (small, the cheaper,
/// replicas 0 set by the topology).
fn workers() -> Value {
    json!([worker("autoscaled", 1, None), worker("fixed", 0, Some(0))])
}

/// The MachineDeployment the topology made for entry `name`.
fn topology_md<'a>(mds: &'a [Value], name: &str) -> Option<&'a Value> {
    mds.iter()
        .find(|md| md["metadata"]["labels"][DEPLOYMENT_NAME_LABEL] == name)
}

/// Writes to `md` by Cluster API's manager (its topology controller among them) since
/// `since_ms`, other than to its status.
fn manager_md_writes_since(
    cluster: &karpenter_capi::sim::cluster::SimCluster,
    md: &str,
    since_ms: u64,
) -> Vec<(u64, String)> {
    cluster
        .stats()
        .writes_for("machinedeployments", "")
        .into_iter()
        .filter(|w| w.at_ms > since_ms && w.name == md)
        .filter(|w| w.agent.starts_with(&format!("{MANAGER_USER} ")))
        .map(|w| (w.at_ms, w.verb))
        .collect()
}

/// Pending pods make the controller raise `autoscaled`'s replicas: Cluster API makes the
/// Machines from the ClusterClass's templates (bootstrap configs included) and the pods bind;
/// `fixed`, cheaper but with topology replicas, is neither offered nor written, and the
/// NodeClass names its topology field. The topology re-applied (a user's edit of the Cluster)
/// leaves the controller's replicas as they are. Emptied, the nodes are consolidated away and
/// the topology does not bring their Machines back.
async fn a_clusterclass_topology_leaves_unset_replicas_to_the_controller_on_real_cluster_api() {
    topology_leaves_unset_replicas("v1beta2", RELEASE_V1BETA2).await;
}

async fn a_clusterclass_topology_leaves_unset_replicas_to_the_controller_on_real_cluster_api_v1beta1()
 {
    topology_leaves_unset_replicas("v1beta1", RELEASE_V1BETA1).await;
}

async fn topology_leaves_unset_replicas(version: &str, release: &str) {
    use crate::common::claims::fast_disruption;
    use crate::common::{Env, NS};
    use karpenter_capi::sim::cluster::PodShape;

    let args = super::real_args(version, &[]);
    let env = Env::builder()
        .cluster(karpenter_capi::simulate::cluster_config(&args))
        .seeds(Vec::new())
        .short_batches()
        .tune(|s| s.disruption = fast_disruption())
        .start()
        .await;
    let cluster = env.sim.cluster().clone();
    super::report_names_real_cluster_api(&cluster, release);
    let apply_topology = || async {
        env.sim
            .run(|c| async move { c.ensure_topology_cluster(NS, CLUSTER, workers()).await })
            .await
            .expect("the cluster's runtime")
            .expect("the ClusterClass and its Cluster");
    };
    apply_topology().await;
    env.until(
        "the topology controller made both MachineDeployments",
        |e| {
            let mds = e.list("machinedeployments");
            topology_md(&mds, "autoscaled").is_some() && topology_md(&mds, "fixed").is_some()
        },
    )
    .await;
    let name_of = |entry: &str| {
        let mds = env.list("machinedeployments");
        topology_md(&mds, entry)
            .and_then(|md| md["metadata"]["name"].as_str())
            .map(String::from)
            .expect("the topology's MachineDeployment")
    };
    let (autoscaled, fixed) = (name_of("autoscaled"), name_of("fixed"));
    let field = "spec.topology.workers.machineDeployments[name=fixed].replicas";
    let message = ready_message_naming(&env, field).await;
    assert!(message.contains(&format!("{NS}/{fixed}")), "{message}");
    explain_names_the_held_entry(&env, &autoscaled, &fixed, field);

    // Small pods: one node of `fixed`'s size holds them and is the cheapest choice, were it
    // offered.
    env.deployment("web", 2, PodShape::new("500m", "1Gi")).await;
    env.until_quiet("the pods bound on the topology's nodes", |e| {
        e.bound_pods() == 2
    })
    .await;
    let on: Vec<String> = env
        .list("nodeclaims")
        .iter()
        .filter_map(|c| {
            c["metadata"]["annotations"]["karpenter.cluster.x-k8s.io/machine-deployment"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert!(!on.is_empty(), "no claim");
    assert!(
        on.iter().all(|md| *md == format!("{NS}/{autoscaled}")),
        "claims only on the entry without replicas, never on {fixed}: {on:?}"
    );
    assert_eq!(
        super::controller_md_writes_since(&cluster, 0)
            .iter()
            .filter(|(_, _, name)| *name == fixed)
            .count(),
        0,
        "a write to {fixed}, whose replicas the topology holds"
    );
    let launched = on.len();
    super::assert_cluster_api_did_its_part(&cluster, launched).await;

    // A user edits the Cluster: the topology controller reconciles again, and leaves the
    // controller's replicas and Machines alone.
    let reapplied_at = cluster.stats().now_ms();
    let replicas_before = env.replicas(&autoscaled);
    apply_topology().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        env.replicas(&autoscaled),
        replicas_before,
        "the topology changed the controller's replicas; its writes: {:?}",
        manager_md_writes_since(&cluster, &autoscaled, reapplied_at)
    );
    assert_eq!(
        live_machines(&env),
        launched,
        "a Machine made or deleted behind the claims"
    );

    // Emptied: consolidated away, and the topology does not bring the Machines back.
    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s",
                              "budgets": [{"nodes": "100%"}]}),
    )
    .await;
    env.sim
        .run(|c| async move { c.scale_deployment(NS, "web", 0).await })
        .await
        .expect("the cluster's runtime")
        .expect("scale the Deployment to 0");
    env.until_quiet("the empty nodes consolidated away", |e| {
        e.list("nodeclaims").is_empty()
            && e.list("machines").is_empty()
            && e.list("nodes").is_empty()
    })
    .await;
    apply_topology().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(env.replicas(&autoscaled), 0, "replicas brought back");
    assert!(env.list("machines").is_empty(), "a Machine came back");
    env.invariants_hold();
    super::env_stops_leaving_nothing(env);
}

/// The NodeClass's Ready message once it contains `text`, read from the API server (the
/// real backend's mirror does not keep NodeClasses).
async fn ready_message_naming(env: &crate::common::Env, text: &str) -> String {
    use karpenter_capi::api::nodeclass::ClusterAPINodeClass;
    let api: kube::Api<ClusterAPINodeClass> = kube::Api::all(env.client().await);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while std::time::Instant::now() < deadline {
        let listed = api
            .list(&Default::default())
            .await
            .expect("list NodeClasses");
        let message = listed
            .items
            .first()
            .and_then(|nc| serde_json::to_value(nc).ok())
            .and_then(|nc| {
                crate::common::condition(&nc, "Ready")?["message"]
                    .as_str()
                    .map(String::from)
            })
            .unwrap_or_default();
        if message.contains(text) {
            return message;
        }
        last = message;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the NodeClass's Ready message never named {text:?}; last: {last:?}")
}

/// `karpenter-capi explain nodepool` (the real binary, `-o json`, the cluster's kubeconfig) as
/// a user asks it why a cheaper group is never used: `fixed` is left out, the reason naming its
/// topology field, and `autoscaled` is offered.
fn explain_names_the_held_entry(
    env: &crate::common::Env,
    autoscaled: &str,
    fixed: &str,
    field: &str,
) {
    use crate::common::NS;
    use kube::ResourceExt;
    let pool = env.pool.name_any();
    let explain = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
            .args(["explain", "nodepool", &pool])
            .args(extra)
            .arg("--kubeconfig")
            .arg(env.sim.kubeconfig())
            .output()
            .expect("running karpenter-capi explain");
        assert!(
            out.status.success(),
            "explain nodepool {pool} {extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let json = explain(&["-o", "json"]);
    let report: Value = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("explain printed no JSON ({e}): {json}"));
    let key = |md: &str| format!("{NS}/{md}");
    let left_out = report["left_out"].as_array().cloned().unwrap_or_default();
    let held = left_out
        .iter()
        .find(|l| l["machine_deployment"] == key(fixed).as_str())
        .unwrap_or_else(|| panic!("{fixed} not left out: {report:#}"));
    let reason = held["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(field) && reason.contains(&format!("Cluster {NS}/{CLUSTER}")),
        "the reason names the topology's field: {reason}"
    );
    let offered = |md: &str| {
        report["offerings"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|o| o["machine_deployment"] == key(md).as_str())
    };
    assert!(offered(autoscaled), "{autoscaled} offered: {report:#}");
    assert!(!offered(fixed), "{fixed} offered: {report:#}");
    assert!(
        left_out
            .iter()
            .all(|l| l["machine_deployment"] != key(autoscaled).as_str()),
        "{autoscaled} left out: {report:#}"
    );
    // The text a person reads says the same, on the held group's line.
    let text = explain(&[]);
    assert!(
        text.lines().any(
            |l| l.contains(&format!("MachineDeployment {}: ", key(fixed))) && l.contains(field)
        ),
        "{fixed} left out for its topology field in:\n{text}"
    );
}

/// Machines not being deleted.
fn live_machines(env: &crate::common::Env) -> usize {
    env.list("machines")
        .iter()
        .filter(|m| m.pointer("/metadata/deletionTimestamp").is_none())
        .count()
}
