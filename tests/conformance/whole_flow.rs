//! The few cases that need the whole controller on the simulated cluster (upstream's provisioning
//! suite drives its provisioner against a real API server for them): volume topology, which
//! reads PersistentVolumes the solve does not see, and NodePools being deleted, which the
//! snapshot leaves out before the solve, and the pods of a deleting node, planned for before
//! they are evicted; claims being deleted, which take no new pods; the NodePool hash a claim is
//! made with; a kubelet that reports GPUs as zero until its device plugin registers. The
//! controller settings that shape NodeClaims
//! (`--default-termination-grace-period`, `--min-values-policy`) are tested here too, through
//! the controller that reads them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use karpenter_capi::actors::Settings;
use karpenter_capi::api::drift_hash::nodepool_hash;
use karpenter_capi::api::duration::GoDuration;
use karpenter_capi::api::wellknown::{GPU_COUNT_ANNOTATION, GPU_TYPE_ANNOTATION};
use karpenter_capi::metrics::Metrics;
use karpenter_capi::scheduling::MinValuesPolicy;
use karpenter_capi::sim::cluster::{MachineDeploymentSeed, SimClusterConfig};
use karpenter_capi::simulate::launch::{self, seed_nodeclass_and_pool};
use karpenter_capi::simulate::pods::seed_of;
use karpenter_capi::simulate::{BackgroundSim, sim_settings, start_controller};

use crate::common::wait_for;

/// Four MachineDeployments (zones sim-zone-0, -1, -2, -0), the default NodeClass and NodePool,
/// and the controller.
async fn cluster() -> (
    BackgroundSim,
    karpenter_capi::actors::controller::ControllerHandle,
) {
    cluster_with(|_| {}, Metrics::new()).await
}

/// [`cluster`], with the controller's settings edited and its metrics in `metrics`.
async fn cluster_with(
    edit: impl FnOnce(&mut Settings),
    metrics: Arc<Metrics>,
) -> (
    BackgroundSim,
    karpenter_capi::actors::controller::ControllerHandle,
) {
    let seeds = (0..4).map(|i| seed_of(i, 50)).collect();
    cluster_of(SimClusterConfig::default(), seeds, edit, metrics).await
}

/// The simulated cluster (`config`, with short provider and kubelet delays) with `seeds` as its
/// MachineDeployments, the default NodeClass and NodePool, and the controller.
async fn cluster_of(
    config: SimClusterConfig,
    seeds: Vec<MachineDeploymentSeed>,
    edit: impl FnOnce(&mut Settings),
    metrics: Arc<Metrics>,
) -> (
    BackgroundSim,
    karpenter_capi::actors::controller::ControllerHandle,
) {
    crate::common::logs();
    let sim = BackgroundSim::start(SimClusterConfig {
        provider_delay: Duration::from_millis(30),
        jitter: Duration::from_millis(30),
        node_ready_delay: Duration::from_millis(30),
        ..config
    })
    .await
    .expect("simulated cluster");
    sim.run(|c| async move {
        for seed in &seeds {
            c.create_machine_deployment_from(seed).await.unwrap();
        }
        seed_nodeclass_and_pool(c.client()).await.unwrap();
    })
    .await
    .unwrap();
    let mut settings = sim_settings(None);
    settings.batching.idle = Duration::from_millis(200);
    settings.batching.max = Duration::from_secs(2);
    edit(&mut settings);
    let controller = start_controller(&sim, settings, metrics)
        .await
        .expect("controller");
    (sim, controller)
}

/// Waits for the first NodeClaim.
async fn first_claim(sim: &BackgroundSim) -> Value {
    let store = sim.cluster().server().store();
    wait_for("a NodeClaim", || {
        store.list("nodeclaims", None).into_iter().next()
    })
    .await
}

/// The zone the claim launched in (the chosen MachineDeployment's, which the claim is labelled
/// with).
fn claim_zone(claim: &Value) -> Option<&str> {
    claim["metadata"]["labels"]["topology.kubernetes.io/zone"].as_str()
}

/// Upstream "Volume Topology Requirements": should schedule to volume zones if volume already
/// bound.
#[actix::test]
async fn a_pod_with_a_bound_zonal_volume_gets_a_claim_in_that_zone() {
    let (sim, _controller) = cluster().await;
    sim.run(|c| async move {
        let client = c.client();
        let pv: PersistentVolume = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "data"},
            "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "ebs.csi.example.com", "volumeHandle": "vol-1"},
                "claimRef": {"namespace": launch::NAMESPACE, "name": "data"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["sim-zone-1"]}
                ]}]}}
            }
        }))
        .unwrap();
        Api::<PersistentVolume>::all(client.clone())
            .create(&PostParams::default(), &pv)
            .await
            .unwrap();
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": launch::NAMESPACE,
                         "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                     "volumeName": "data", "storageClassName": ""}
        }))
        .unwrap();
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), launch::NAMESPACE)
            .create(&PostParams::default(), &pvc)
            .await
            .unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "db", "namespace": launch::NAMESPACE},
            "spec": {
                "containers": [{"name": "db", "image": "db",
                                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
            }
        }))
        .unwrap();
        Api::<Pod>::namespaced(client, launch::NAMESPACE)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    })
    .await
    .unwrap();
    let claim = first_claim(&sim).await;
    assert_eq!(claim_zone(&claim), Some("sim-zone-1"), "{claim:#}");
}

/// Upstream provisioning suite: should ignore NodePools that are deleting.
#[actix::test]
async fn a_deleting_nodepool_gets_no_claims() {
    let (sim, _controller) = cluster().await;
    sim.run(|c| async move {
        let client = c.client();
        let pools: Api<karpenter_capi::api::nodepool::NodePool> = Api::all(client.clone());
        let np = serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "leaving", "finalizers": ["example.com/hold"]},
            "spec": {"weight": 100, "template": {"spec": {
                "requirements": [],
                "nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass",
                                 "name": launch::NODECLASS}
            }}}
        }))
        .unwrap();
        pools.create(&PostParams::default(), &np).await.unwrap();
        pools.delete("leaving", &Default::default()).await.unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "wants-leaving", "namespace": launch::NAMESPACE},
            "spec": {
                "nodeSelector": {"karpenter.sh/nodepool": "leaving"},
                "containers": [{"name": "c", "image": "c",
                                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]
            }
        }))
        .unwrap();
        Api::<Pod>::namespaced(client, launch::NAMESPACE)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    })
    .await
    .unwrap();
    // The solve ran once the pod has its FailedScheduling Event; by then no claim may exist.
    let store = sim.cluster().server().store();
    let start = Instant::now();
    while !store
        .list("events.events.k8s.io", None)
        .iter()
        .any(|e| e["reason"] == "FailedScheduling" && e["regarding"]["name"] == "wants-leaving")
    {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no FailedScheduling Event"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(store.list("nodeclaims", None).is_empty());
}

/// A pod asking for 100m CPU and 128Mi, with `labels`.
fn small_pod_object(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": launch::NAMESPACE, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "c",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}
    }))
    .unwrap()
}

/// Creates a pod asking for 100m CPU and 128Mi.
async fn small_pod(sim: &BackgroundSim, name: &str) {
    create_pod(sim, small_pod_object(name, json!({}))).await;
}

async fn create_pod(sim: &BackgroundSim, pod: Pod) {
    sim.run(|c| async move {
        Api::<Pod>::namespaced(c.client(), launch::NAMESPACE)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    })
    .await
    .unwrap();
}

/// Upstream provisioning suite: should expect nodeclaim terminationGracePeriod to be the global
/// value when the nodepool terminationGracePeriod is not set.
#[actix::test]
async fn the_global_termination_grace_period_lands_on_claims_of_pools_without_one() {
    let grace = Duration::from_secs(98 * 3600);
    let (sim, _controller) = cluster_with(
        |s| s.default_termination_grace_period = Some(grace),
        Metrics::new(),
    )
    .await;
    small_pod(&sim, "p").await;
    let claim = first_claim(&sim).await;
    let written: GoDuration =
        serde_json::from_value(claim["spec"]["terminationGracePeriod"].clone())
            .unwrap_or_else(|e| panic!("{e}: {claim:#}"));
    assert_eq!(written.0, grace);
}

/// A NodePool heavier than the default one whose minValues (5 instance types) the four
/// MachineDeployments cannot meet; the pod's claim under `policy`, once the controller counted
/// it in `karpenter_nodeclaims_created_total`, and that series.
async fn claim_with_unmet_min_values(policy: MinValuesPolicy) -> (Value, String) {
    let metrics = Metrics::new();
    let (sim, _controller) = cluster_with(|s| s.min_values_policy = policy, metrics.clone()).await;
    sim.run(|c| async move {
        let np = serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "wide"},
            "spec": {"weight": 100, "template": {"spec": {
                "requirements": [{"key": "node.kubernetes.io/instance-type",
                                  "operator": "Exists", "minValues": 5}],
                "nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass",
                                 "name": launch::NODECLASS}
            }}}
        }))
        .unwrap();
        Api::<karpenter_capi::api::nodepool::NodePool>::all(c.client())
            .create(&PostParams::default(), &np)
            .await
            .unwrap();
    })
    .await
    .unwrap();
    small_pod(&sim, "p").await;
    let claim = first_claim(&sim).await;
    let series = wait_for("the created claim to be counted", || {
        let text = metrics.encode();
        text.lines()
            .find(|l| l.starts_with("karpenter_nodeclaims_created_total{"))
            .map(str::to_string)
    })
    .await;
    // Registration copies the claim's annotations onto its Node, as upstream's does.
    let store = sim.cluster().server().store();
    let on_node = wait_for("a registered Node with the annotation", || {
        store
            .list("nodes", None)
            .iter()
            .map(|n| relaxed_annotation(n).clone())
            .find(|a| !a.is_null())
    })
    .await;
    assert_eq!(&on_node, relaxed_annotation(&claim));
    (claim, series)
}

fn relaxed_annotation(claim: &Value) -> &Value {
    &claim["metadata"]["annotations"]["karpenter.sh/nodeclaim-min-values-relaxed"]
}

/// Upstream provisioning suite, MinValuesPolicy BestEffort: should choose the NodePool with the
/// higher weight when relaxing minValues, through `--min-values-policy`.
#[actix::test]
async fn best_effort_min_values_give_the_heavier_pool_a_relaxed_claim() {
    let (claim, series) = claim_with_unmet_min_values(MinValuesPolicy::BestEffort).await;
    assert!(
        series.contains(r#"nodepool="wide",min_values_relaxed="true"}"#),
        "{series}"
    );
    assert_eq!(
        claim["metadata"]["labels"]["karpenter.sh/nodepool"], "wide",
        "{claim:#}"
    );
    assert_eq!(relaxed_annotation(&claim), "true");
    let types = claim["spec"]["requirements"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["key"] == "node.kubernetes.io/instance-type")
        .expect("an instance-type requirement");
    assert_eq!(types["minValues"], 4, "{claim:#}");
}

/// The same cluster under the default Strict policy: the heavier pool cannot launch, so the
/// pod's claim comes from the default one.
#[actix::test]
async fn strict_min_values_leave_the_heavier_pool_out() {
    let (claim, series) = claim_with_unmet_min_values(MinValuesPolicy::Strict).await;
    assert!(
        series.contains(r#"min_values_relaxed="false"}"#),
        "{series}"
    );
    assert_eq!(
        claim["metadata"]["labels"]["karpenter.sh/nodepool"],
        launch::NODEPOOL,
        "{claim:#}"
    );
    assert_eq!(relaxed_annotation(&claim), "false");
}

/// A pod labelled `app=web` asking for 100m CPU, and a PodDisruptionBudget over it with `spec`;
/// once the pod runs, its claim is deleted. The claims after the provisioner had time to plan
/// for the draining node's pod, with the pod still on that node.
/// Creates `n` small pods labelled `app=web` (`web-0`, ...) and a PodDisruptionBudget `web`
/// selecting them with `budget` (`minAvailable` or `maxUnavailable`).
async fn web_pods_with_budget(sim: &BackgroundSim, n: usize, budget: Value) {
    sim.run(move |c| async move {
        let pods = Api::<Pod>::namespaced(c.client(), launch::NAMESPACE);
        for i in 0..n {
            let pod = small_pod_object(&format!("web-{i}"), json!({"app": "web"}));
            pods.create(&PostParams::default(), &pod).await.unwrap();
        }
        let mut spec = json!({"selector": {"matchLabels": {"app": "web"}}});
        spec.as_object_mut()
            .unwrap()
            .extend(budget.as_object().unwrap().clone());
        let pdb: k8s_openapi::api::policy::v1::PodDisruptionBudget =
            serde_json::from_value(json!({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "web", "namespace": launch::NAMESPACE}, "spec": spec
            }))
            .unwrap();
        Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
            c.client(),
            launch::NAMESPACE,
        )
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    })
    .await
    .unwrap();
}

async fn claims_after_deleting_a_node_with_a_budgeted_pod(budget: Value) -> Vec<Value> {
    let (sim, _controller) = cluster().await;
    let store = sim.cluster().server().store();
    web_pods_with_budget(&sim, 1, budget).await;
    let node = wait_for("the pod running on a node", || {
        store
            .get("pods", launch::NAMESPACE, "web-0")
            .and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_string))
    })
    .await;
    let claim = first_claim(&sim).await;
    let name = claim["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    sim.run(move |c| async move {
        Api::<karpenter_capi::api::nodeclaim::NodeClaim>::all(c.client())
            .delete(&name, &Default::default())
            .await
            .unwrap();
    })
    .await
    .unwrap();
    // The drain is blocked by the budget (it allows no disruption with one pod), so the pod
    // stays; several batches pass.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pod = store
        .get("pods", launch::NAMESPACE, "web-0")
        .expect("the pod");
    assert_eq!(pod["spec"]["nodeName"].as_str(), Some(node.as_str()));
    assert!(pod["metadata"]["deletionTimestamp"].is_null(), "{pod:#}");
    store.list("nodeclaims", None)
}

/// Upstream "Deleting Nodes": should re-schedule pods from a deleting node when pods are active.
/// The budget (minAvailable 1) blocks the eviction for now but not for ever, so capacity for the
/// pod is launched while its node waits to drain.
#[actix::test]
async fn a_deleting_nodes_active_pod_gets_capacity_before_it_is_evicted() {
    let claims = claims_after_deleting_a_node_with_a_budgeted_pod(json!({"minAvailable": 1})).await;
    assert_eq!(claims.len(), 2, "the deleting claim and one for its pod");
    assert_eq!(
        claims
            .iter()
            .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
            .count(),
        1
    );
}

/// Upstream "Deleting Nodes": should not reschedule pods from a deleting node when pods are
/// blocked due to fully blocking PDBs (0 max unavailable): no capacity for a pod that cannot leave.
#[actix::test]
async fn a_deleting_nodes_pod_behind_a_fully_blocking_budget_gets_no_capacity() {
    let claims =
        claims_after_deleting_a_node_with_a_budgeted_pod(json!({"maxUnavailable": 0})).await;
    assert_eq!(claims.len(), 1, "only the deleting claim: {claims:#?}");
}

/// A pod asking for 100m CPU, 128Mi and one `nvidia.com/gpu`.
fn gpu_pod(name: &str) -> Pod {
    let resources = json!({"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": "1"});
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": launch::NAMESPACE},
        "spec": {"containers": [{"name": "c", "image": "c",
            "resources": {"requests": resources, "limits": resources}}]}
    }))
    .unwrap()
}

/// Upstream "No Pre-Binding": should handle resource zeroing of extended resources by kubelet.
/// The kubelet reports GPUs as zero until its device plugin registers (never, here), so the Node
/// is registered and not initialized; the claim's launched allocatable stands in for the zero,
/// and a second GPU pod waits for that Node instead of getting a second one.
#[actix::test]
async fn a_node_whose_kubelet_zeroes_its_gpus_still_takes_the_next_gpu_pod() {
    let mut seed = seed_of(0, 50);
    seed.annotations
        .insert(GPU_COUNT_ANNOTATION.to_string(), "2".to_string());
    seed.annotations.insert(
        GPU_TYPE_ANNOTATION.to_string(),
        "nvidia.com/gpu".to_string(),
    );
    let config = SimClusterConfig {
        device_plugin_delay: Duration::from_secs(3600),
        ..SimClusterConfig::default()
    };
    let (sim, _controller) = cluster_of(config, vec![seed], |_| {}, Metrics::new()).await;
    create_pod(&sim, gpu_pod("first")).await;
    let store = sim.cluster().server().store();
    wait_for("the first claim's Node, with its GPUs zeroed", || {
        store
            .list("nodes", None)
            .into_iter()
            .find(|n| n["status"]["allocatable"]["nvidia.com/gpu"] == "0")
    })
    .await;
    create_pod(&sim, gpu_pod("second")).await;
    wait_for("the second pod nominated", || {
        store
            .list("events.events.k8s.io", None)
            .into_iter()
            .find(|e| e["reason"] == "Nominated" && e["regarding"]["name"] == "second")
    })
    .await;
    assert_eq!(store.list("nodeclaims", None).len(), 1);
}

/// The claims in the store that are not being deleted.
fn live_claims(sim: &BackgroundSim) -> Vec<Value> {
    sim.cluster()
        .server()
        .store()
        .list("nodeclaims", None)
        .into_iter()
        .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
        .collect()
}

fn name_of(object: &Value) -> String {
    object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Deletes the claim, first holding it with a finalizer of somebody else's so it stays
/// terminating.
async fn delete_held(sim: &BackgroundSim, claim: String) {
    sim.run(move |c| async move {
        let claims: Api<karpenter_capi::api::nodeclaim::NodeClaim> = Api::all(c.client());
        let hold =
            json!({"metadata": {"finalizers": ["karpenter.sh/termination", "example.com/hold"]}});
        claims
            .patch(
                &claim,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&hold),
            )
            .await
            .unwrap();
        claims.delete(&claim, &Default::default()).await.unwrap();
    })
    .await
    .unwrap();
}

/// The claim a pod's `Nominated` Event names, once it has one.
fn nominated_to(sim: &BackgroundSim, pod: &str) -> Option<String> {
    sim.cluster()
        .server()
        .store()
        .list("events.events.k8s.io", None)
        .into_iter()
        .filter(|e| e["reason"] == "Nominated" && e["regarding"]["name"] == pod)
        .filter_map(|e| e["note"].as_str().map(str::to_string))
        .next_back()
}

/// The `Nominated` Event's note for a pod, or, once the scheduler bound it, the name of the
/// claim whose node it runs on.
fn placed_on(sim: &BackgroundSim, pod: &str) -> Option<String> {
    let store = sim.cluster().server().store();
    let node = store
        .get("pods", launch::NAMESPACE, pod)
        .and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_string));
    match node {
        Some(node) => store
            .list("nodeclaims", None)
            .iter()
            .find(|c| c["status"]["nodeName"] == node.as_str())
            .map(name_of),
        None => nominated_to(sim, pod),
    }
}

/// Upstream provisioning suite: should launch a second node if an in-flight node is terminating.
#[actix::test]
async fn a_terminating_claim_takes_no_new_pods() {
    let (sim, _controller) = cluster().await;
    small_pod(&sim, "first").await;
    let first = name_of(&first_claim(&sim).await);
    delete_held(&sim, first.clone()).await;
    small_pod(&sim, "second").await;
    let second = wait_for("a claim for the second pod", || {
        live_claims(&sim).into_iter().next()
    })
    .await;
    assert_ne!(name_of(&second), first);
    let note = wait_for("the second pod nominated", || nominated_to(&sim, "second")).await;
    assert!(note.contains(&name_of(&second)), "{note}");
}

/// Upstream provisioning suite: should schedule all pods on one inflight node when node is in
/// deleting state. Three pods run on a claim being deleted (a budget holds their eviction); they
/// and two new pods all go to one new claim, none to the deleting one.
#[actix::test]
async fn pods_of_a_deleting_node_and_new_pods_share_one_new_claim() {
    let (sim, _controller) = cluster().await;
    web_pods_with_budget(&sim, 3, json!({"minAvailable": 3})).await;
    let store = sim.cluster().server().store();
    wait_for("the three pods running", || {
        let running = (0..3)
            .filter(|i| {
                store
                    .get("pods", launch::NAMESPACE, &format!("web-{i}"))
                    .is_some_and(|p| p["spec"]["nodeName"].is_string())
            })
            .count();
        (running == 3).then_some(())
    })
    .await;
    let old: Vec<String> = live_claims(&sim).iter().map(name_of).collect();
    assert_eq!(old.len(), 1, "one claim for the three pods");
    delete_held(&sim, old[0].clone()).await;
    // As upstream's case, the node is deleting before the new pods arrive: once it carries the
    // disrupted taint no scheduler binds them to it (before, one could, and they would never be
    // pending to be nominated).
    wait_for("the deleting node tainted", || {
        let claim = store.get("nodeclaims", "", &old[0])?;
        let node = store.get("nodes", "", claim["status"]["nodeName"].as_str()?)?;
        node["spec"]["taints"]
            .as_array()?
            .iter()
            .any(|t| t["key"] == karpenter_capi::api::wellknown::DISRUPTED_TAINT_KEY)
            .then_some(())
    })
    .await;
    small_pod(&sim, "new-0").await;
    small_pod(&sim, "new-1").await;
    // A new pod is nominated to the in-flight claim, or, when that claim's node is already
    // ready by the time the pod arrives, bound there by the scheduler without a nomination.
    let notes = wait_for("both new pods nominated or bound", || {
        Some((placed_on(&sim, "new-0")?, placed_on(&sim, "new-1")?))
    })
    .await;
    let new: Vec<String> = live_claims(&sim).iter().map(name_of).collect();
    assert_eq!(new.len(), 1, "one new claim: {new:?}");
    for note in [notes.0, notes.1] {
        assert!(note.contains(&new[0]), "{note}");
        assert!(!note.contains(&old[0]), "{note}");
    }
    // The deleting node's pods are still there, waiting for their budget.
    assert_eq!(store.list("nodeclaims", None).len(), 2);
}

/// Upstream provisioning suite: should not use a different NodePool hash on the NodeClaim if the
/// NodePool changes during scheduling. A claim carries the hash of the NodePool its solve saw;
/// a change to the NodePool afterwards changes the next claim's, not this one's.
#[actix::test]
async fn a_claim_keeps_the_nodepool_hash_its_solve_saw() {
    let (sim, _controller) = cluster().await;
    let store = sim.cluster().server().store();
    let pool = || -> karpenter_capi::api::nodepool::NodePool {
        serde_json::from_value(store.get("nodepools", "", launch::NODEPOOL).expect("pool"))
            .expect("a NodePool")
    };
    let hash = |claim: &Value| {
        claim["metadata"]["annotations"]["karpenter.sh/nodepool-hash"]
            .as_str()
            .map(str::to_string)
    };
    let before = nodepool_hash(&pool());
    small_pod(&sim, "first").await;
    let first = first_claim(&sim).await;
    assert_eq!(hash(&first).as_deref(), Some(before.as_str()));
    sim.run(|c| async move {
        let patch =
            json!({"spec": {"template": {"metadata": {"labels": {"new-label": "new-value"}}}}});
        Api::<karpenter_capi::api::nodepool::NodePool>::all(c.client())
            .patch(
                launch::NODEPOOL,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
    })
    .await
    .unwrap();
    let after = nodepool_hash(&pool());
    assert_ne!(before, after);
    // A pod too big to join the first claim (2 CPUs) gets a claim of its own, with the new hash.
    let big = small_pod_object("big", json!({}));
    let mut big = serde_json::to_value(big).unwrap();
    big["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("3");
    create_pod(&sim, serde_json::from_value(big).unwrap()).await;
    let second = wait_for("a second claim", || {
        store
            .list("nodeclaims", None)
            .into_iter()
            .find(|c| name_of(c) != name_of(&first))
    })
    .await;
    assert_eq!(hash(&second).as_deref(), Some(after.as_str()));
}
