//! The simulated cluster's stand-ins (Cluster API, kubelet, scheduler) against the in-process
//! API server: MachineDeployment -> MachineSet -> Machines -> Nodes, scale-down order, stuck
//! providers, replacement of deleted Machines, both Cluster API versions, and pod binding.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use karpenter_capi::api::wellknown::{
    CLUSTER_NAME_LABEL, CPU_ANNOTATION, DEPLOYMENT_NAME_LABEL, LABELS_ANNOTATION, MEMBER_LABEL,
    MEMORY_ANNOTATION, SET_NAME_LABEL, UNREGISTERED_TAINT_KEY,
};
use karpenter_capi::sim::capi::CapiVersion;
use karpenter_capi::sim::cluster::{
    CLUSTER_NAME, MachineDeploymentSeed, PodShape, SimCluster, SimClusterConfig,
};
use karpenter_capi::sim::kubelet::node_ready;
use karpenter_capi::sim::standin::{merge_patch, str_at};
use kube::api::{DeleteParams, ListParams};
use kube::core::DynamicObject;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::common::{NS, eventually, mark_for_deletion, md_seed, standin_cluster as fast};

/// A stand-in MachineDeployment whose template also carries a label that is not propagated,
/// and node labels by annotation.
fn seed(name: &str, replicas: i64) -> MachineDeploymentSeed {
    let mut seed = md_seed(name, replicas);
    seed.template_labels
        .insert("app.example.com/not-propagated".into(), "x".into());
    seed.annotations.insert(
        LABELS_ANNOTATION.into(),
        "topology.kubernetes.io/zone=us-east-1b,node.kubernetes.io/instance-type=m-4".into(),
    );
    seed
}

async fn machines(cluster: &SimCluster, md: &str) -> Vec<DynamicObject> {
    cluster.machines_of(NS, md).await.unwrap()
}

fn node_ref(m: &DynamicObject) -> Option<&str> {
    str_at(&m.data, &["status", "nodeRef", "name"])
}

fn provider_id(m: &DynamicObject) -> Option<&str> {
    str_at(&m.data, &["spec", "providerID"])
}

/// Waits until `md` has exactly `n` live Machines, all with a Node, and returns them.
async fn running(cluster: &SimCluster, md: &str, n: usize) -> Vec<DynamicObject> {
    eventually(&format!("{n} running machines of {md}"), || async {
        let ms = machines(cluster, md).await;
        let all_running = ms.len() == n
            && ms.iter().all(|m| {
                m.metadata.deletion_timestamp.is_none()
                    && node_ref(m).is_some()
                    && str_at(&m.data, &["status", "phase"]) == Some("Running")
            });
        all_running.then_some(ms)
    })
    .await
}

async fn node(cluster: &SimCluster, name: &str) -> Option<Node> {
    Api::<Node>::all(cluster.client())
        .get_opt(name)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_up_builds_the_owner_chain_and_ready_nodes_v1beta2() {
    let cluster = SimCluster::start(fast(CapiVersion::V1Beta2)).await.unwrap();
    let md = cluster
        .create_machine_deployment_from(&seed("md-a", 3))
        .await
        .unwrap();
    let ms = running(&cluster, "md-a", 3).await;

    // One MachineSet, controlled by the MachineDeployment.
    let sets: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), NS, &CapiVersion::V1Beta2.machine_set());
    let set_list = sets.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(set_list.len(), 1);
    let set = &set_list[0];
    assert!(set.name_any().starts_with("md-a-") && set.name_any().len() == "md-a-".len() + 5);
    let owner = &set.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("MachineDeployment", md.uid().unwrap().as_str(), Some(true))
    );
    assert_eq!(set.labels()[DEPLOYMENT_NAME_LABEL], "md-a");
    assert_eq!(set.labels()[CLUSTER_NAME_LABEL], CLUSTER_NAME);
    assert_eq!(set.data["spec"]["replicas"], 3);

    for m in &ms {
        let labels = m.labels();
        assert_eq!(labels[SET_NAME_LABEL], set.name_any());
        assert_eq!(labels[DEPLOYMENT_NAME_LABEL], "md-a");
        assert_eq!(labels[CLUSTER_NAME_LABEL], CLUSTER_NAME);
        assert!(labels.contains_key("node-role.kubernetes.io/worker"));
        assert!(m.name_any().starts_with(&format!("{}-", set.name_any())));
        let owner = &m.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("MachineSet", set.uid().unwrap().as_str(), Some(true))
        );
        assert!(
            m.finalizers()
                .iter()
                .any(|f| f == "machine.cluster.x-k8s.io")
        );
        assert_eq!(m.data["spec"]["clusterName"], CLUSTER_NAME);
        assert_eq!(m.data["spec"]["version"], "v1.33.0");
        assert_eq!(
            m.data["spec"]["infrastructureRef"]["apiGroup"],
            "infrastructure.cluster.x-k8s.io"
        );
        assert!(
            m.data["spec"]["infrastructureRef"]
                .get("apiVersion")
                .is_none()
        );
        assert_eq!(
            m.data["spec"]["bootstrap"]["configRef"]["kind"],
            "KubeadmConfigTemplate"
        );
        assert_eq!(m.data["status"]["nodeRef"], json!({"name": m.name_any()}));
        assert_eq!(
            provider_id(m),
            Some(format!("kubemark://{}", m.name_any()).as_str())
        );

        let n = node(&cluster, &m.name_any()).await.expect("node exists");
        let spec = n.spec.clone().unwrap();
        assert_eq!(spec.provider_id.as_deref(), provider_id(m));
        assert!(
            spec.taints
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == UNREGISTERED_TAINT_KEY && t.effect == "NoExecute")
        );
        let capacity = n.status.clone().unwrap().capacity.unwrap();
        assert_eq!(capacity["cpu"].0, "4");
        assert_eq!(capacity["memory"].0, "16Gi");
        assert_eq!(capacity["pods"].0, "110");
        let nl = n.labels();
        assert_eq!(nl["topology.kubernetes.io/zone"], "us-east-1b");
        assert_eq!(nl["node.kubernetes.io/instance-type"], "m-4");
        assert_eq!(nl["kubernetes.io/hostname"], m.name_any());
        assert_eq!(nl["kubernetes.io/arch"], "amd64");
        assert!(nl.contains_key("node-role.kubernetes.io/worker"));
        assert!(!nl.contains_key("app.example.com/not-propagated"));
    }
    for m in &ms {
        eventually("node ready", || async {
            node(&cluster, &m.name_any()).await.filter(node_ready)
        })
        .await;
    }
    // The MachineDeployment reports its Machines.
    let mds: Api<DynamicObject> = Api::namespaced_with(
        cluster.client(),
        NS,
        &CapiVersion::V1Beta2.machine_deployment(),
    );
    eventually("md status", || async {
        let md = mds.get("md-a").await.unwrap();
        (md.data["status"]["replicas"] == 3 && md.data["status"]["readyReplicas"] == 3)
            .then_some(())
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1beta1_shapes_references_and_node_ref() {
    let cluster = SimCluster::start(SimClusterConfig {
        provider_id_style: karpenter_capi::sim::capi::ProviderIdStyle::Aws,
        ..fast(CapiVersion::V1Beta1)
    })
    .await
    .unwrap();
    // No cpu annotation: the infrastructure template's status.capacity fills the gap, while
    // the memory annotation still wins over the template.
    cluster
        .create_machine_template(
            NS,
            "md-b",
            BTreeMap::from([("cpu".into(), "8".into()), ("memory".into(), "32Gi".into())]),
        )
        .await
        .unwrap();
    let mut s = seed("md-b", 1);
    s.annotations.remove(CPU_ANNOTATION);
    cluster.create_machine_deployment_from(&s).await.unwrap();
    let ms = running(&cluster, "md-b", 1).await;
    let m = &ms[0];
    assert_eq!(
        m.types.as_ref().unwrap().api_version,
        "cluster.x-k8s.io/v1beta1"
    );
    let infra = &m.data["spec"]["infrastructureRef"];
    assert_eq!(
        infra["apiVersion"],
        "infrastructure.cluster.x-k8s.io/v1beta2"
    );
    assert_eq!(infra["kind"], "DevMachine");
    assert!(infra.get("apiGroup").is_none());
    let nr = &m.data["status"]["nodeRef"];
    assert_eq!(
        (
            nr["apiVersion"].as_str(),
            nr["kind"].as_str(),
            nr["name"].as_str()
        ),
        (Some("v1"), Some("Node"), Some(m.name_any().as_str()))
    );
    let n = node(&cluster, &m.name_any()).await.unwrap();
    assert_eq!(nr["uid"].as_str(), n.metadata.uid.as_deref());
    let capacity = n.status.clone().unwrap().capacity.unwrap();
    assert_eq!(capacity["cpu"].0, "8");
    assert_eq!(capacity["memory"].0, "16Gi");
    let pid = provider_id(m).unwrap();
    assert!(pid.starts_with("aws:///us-east-1a/i-"), "{pid}");
    // A propagated label added to the Machine later (as the controller's binding does)
    // reaches the Node.
    let api: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), NS, &CapiVersion::V1Beta1.machine());
    merge_patch(
        &api,
        &m.name_any(),
        &json!({"metadata": {"labels": {MEMBER_LABEL: "bound"}}}),
    )
    .await
    .unwrap();
    eventually("member label on the node", || async {
        let n = node(&cluster, &m.name_any()).await?;
        (n.labels().get(MEMBER_LABEL).map(String::as_str) == Some("bound")).then_some(())
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_down_removes_the_annotated_machine() {
    let cluster = SimCluster::start(fast(CapiVersion::V1Beta2)).await.unwrap();
    cluster
        .create_machine_deployment_from(&seed("md-c", 3))
        .await
        .unwrap();
    let ms = running(&cluster, "md-c", 3).await;
    // Not the oldest: the annotation, not age, must decide.
    let victim = ms
        .iter()
        .max_by_key(|m| m.metadata.creation_timestamp.clone().map(|t| t.0))
        .unwrap()
        .name_any();
    mark_for_deletion(&cluster, &victim).await;
    cluster
        .scale_machine_deployment(NS, "md-c", 2)
        .await
        .unwrap();

    let left = eventually("victim gone", || async {
        let ms = machines(&cluster, "md-c").await;
        (ms.len() == 2 && ms.iter().all(|m| m.name_any() != victim)).then_some(ms)
    })
    .await;
    let before: Vec<String> = ms
        .iter()
        .map(|m| m.name_any())
        .filter(|n| *n != victim)
        .collect();
    let mut after: Vec<String> = left.iter().map(|m| m.name_any()).collect();
    after.sort();
    let mut before = before;
    before.sort();
    assert_eq!(before, after, "exactly the annotated Machine went");
    eventually("victim's node gone", || async {
        node(&cluster, &victim).await.is_none().then_some(())
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_down_removes_provisioning_machines_first() {
    // A provider so slow that nothing finishes on its own; the test plays provider for one Machine.
    let cluster = SimCluster::start(SimClusterConfig {
        provider_delay: Duration::from_secs(3600),
        ..fast(CapiVersion::V1Beta2)
    })
    .await
    .unwrap();
    cluster
        .create_machine_deployment_from(&seed("md-d", 3))
        .await
        .unwrap();
    let ms = eventually("3 provisioning machines", || async {
        let ms = machines(&cluster, "md-d").await;
        (ms.len() == 3
            && ms
                .iter()
                .all(|m| str_at(&m.data, &["status", "phase"]) == Some("Provisioning")))
        .then_some(ms)
    })
    .await;
    // The oldest gets a provider ID by hand, then a Node and nodeRef from the kubelet stand-in.
    let keeper = ms
        .iter()
        .min_by_key(|m| m.metadata.creation_timestamp.clone().map(|t| t.0))
        .unwrap()
        .name_any();
    let api: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), NS, &CapiVersion::V1Beta2.machine());
    merge_patch(
        &api,
        &keeper,
        &json!({"spec": {"providerID": format!("kubemark://{keeper}")}}),
    )
    .await
    .unwrap();
    eventually("keeper has a node", || async {
        let m = api.get(&keeper).await.unwrap();
        node_ref(&m).map(|_| ())
    })
    .await;

    cluster
        .scale_machine_deployment(NS, "md-d", 1)
        .await
        .unwrap();
    let left = eventually("two machines gone", || async {
        let ms = machines(&cluster, "md-d").await;
        (ms.len() == 1).then_some(ms)
    })
    .await;
    assert_eq!(left[0].name_any(), keeper, "the Machine with a Node stays");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_provider_leaves_machines_without_provider_id() {
    let cluster = SimCluster::start(SimClusterConfig {
        fail_fraction: 1.0,
        provider_delay: Duration::from_millis(1),
        jitter: Duration::ZERO,
        ..fast(CapiVersion::V1Beta2)
    })
    .await
    .unwrap();
    cluster
        .create_machine_deployment_from(&seed("md-e", 2))
        .await
        .unwrap();
    eventually("2 provisioning machines", || async {
        let ms = machines(&cluster, "md-e").await;
        (ms.len() == 2
            && ms
                .iter()
                .all(|m| str_at(&m.data, &["status", "phase"]) == Some("Provisioning")))
        .then_some(())
    })
    .await;
    // Far longer than the provider delay: a healthy provider would have finished by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ms = machines(&cluster, "md-e").await;
    assert_eq!(ms.len(), 2);
    for m in &ms {
        assert_eq!(provider_id(m), None);
        assert_eq!(str_at(&m.data, &["status", "phase"]), Some("Provisioning"));
        assert!(node(&cluster, &m.name_any()).await.is_none());
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directly_deleted_machine_is_replaced() {
    let cluster = SimCluster::start(fast(CapiVersion::V1Beta2)).await.unwrap();
    cluster
        .create_machine_deployment_from(&seed("md-f", 2))
        .await
        .unwrap();
    let ms = running(&cluster, "md-f", 2).await;
    let gone = ms[0].name_any();
    let api: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), NS, &CapiVersion::V1Beta2.machine());
    api.delete(&gone, &DeleteParams::default()).await.unwrap();

    let after = running(&cluster, "md-f", 2).await;
    let names: Vec<String> = after.iter().map(|m| m.name_any()).collect();
    assert!(!names.contains(&gone), "{names:?}");
    assert!(names.contains(&ms[1].name_any()));
    eventually("deleted machine's node gone", || async {
        node(&cluster, &gone).await.is_none().then_some(())
    })
    .await;
    // Replicas were not touched.
    let mds: Api<DynamicObject> = Api::namespaced_with(
        cluster.client(),
        NS,
        &CapiVersion::V1Beta2.machine_deployment(),
    );
    assert_eq!(mds.get("md-f").await.unwrap().data["spec"]["replicas"], 2);
    cluster.shutdown().await;
}

fn pod_scheduled(p: &Pod) -> Option<(String, Option<String>, Option<String>)> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_binds_fitting_pods_and_respects_the_unregistered_taint() {
    let cluster = SimCluster::start(fast(CapiVersion::V1Beta2)).await.unwrap();
    let mut s = seed("md-g", 1);
    s.annotations.insert(CPU_ANNOTATION.into(), "2".into());
    // Memory from the template, found through a v1beta2 apiGroup-only reference.
    s.annotations.remove(MEMORY_ANNOTATION);
    cluster
        .create_machine_template(
            NS,
            "md-g",
            BTreeMap::from([("memory".into(), "4Gi".into())]),
        )
        .await
        .unwrap();
    cluster.create_machine_deployment_from(&s).await.unwrap();
    let ms = running(&cluster, "md-g", 1).await;
    let node_name = ms[0].name_any();
    eventually("node ready", || async {
        node(&cluster, &node_name).await.filter(node_ready)
    })
    .await;
    let ready = node(&cluster, &node_name).await.unwrap();
    assert_eq!(ready.status.unwrap().capacity.unwrap()["memory"].0, "4Gi");

    let tolerate = vec![json!({"key": UNREGISTERED_TAINT_KEY, "operator": "Exists"})];
    let fitting = PodShape {
        tolerations: tolerate.clone(),
        ..PodShape::new("1", "1Gi")
    };
    let too_big = PodShape {
        tolerations: tolerate,
        ..PodShape::new("4", "1Gi")
    };
    let intolerant = PodShape::new("100m", "100Mi");
    cluster.create_pods(NS, "fits", 1, &fitting).await.unwrap();
    cluster.create_pods(NS, "big", 1, &too_big).await.unwrap();
    cluster
        .create_pods(NS, "needs-registration", 1, &intolerant)
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), NS);
    let bound = eventually("fitting pod bound", || async {
        pods.get("fits-0")
            .await
            .unwrap()
            .spec
            .and_then(|s| s.node_name)
    })
    .await;
    assert_eq!(bound, node_name);
    let big = eventually("big pod unschedulable", || async {
        pod_scheduled(&pods.get("big-0").await.unwrap())
    })
    .await;
    assert_eq!(
        (big.0.as_str(), big.1.as_deref()),
        ("False", Some("Unschedulable"))
    );
    assert!(big.2.unwrap_or_default().contains("Insufficient cpu"));
    let waiting = eventually("intolerant pod unschedulable", || async {
        pod_scheduled(&pods.get("needs-registration-0").await.unwrap())
    })
    .await;
    assert_eq!(waiting.1.as_deref(), Some("Unschedulable"));
    assert!(
        waiting
            .2
            .unwrap_or_default()
            .contains(UNREGISTERED_TAINT_KEY)
    );
    assert!(
        pods.get("needs-registration-0")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none()
    );

    // Registration (normally the controller) removes the taint: the pod binds.
    let nodes: Api<Node> = Api::all(cluster.client());
    merge_patch(&nodes, &node_name, &json!({"spec": {"taints": []}}))
        .await
        .unwrap();
    let bound = eventually("pod bound after registration", || async {
        pods.get("needs-registration-0")
            .await
            .unwrap()
            .spec
            .and_then(|s| s.node_name)
    })
    .await;
    assert_eq!(bound, node_name);
    assert!(
        pods.get("big-0")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none()
    );
    let names: Vec<String> = cluster.bindings().iter().map(|b| b.name.clone()).collect();
    assert_eq!(names, ["fits-0", "needs-registration-0"]);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stand_ins_converge_through_errors_conflicts_and_watch_cuts() {
    let cluster = SimCluster::start(fast(CapiVersion::V1Beta2)).await.unwrap();
    // The MachineDeployment is created cleanly (the test's own write is not under test); the
    // stand-ins then converge through the faults.
    cluster
        .create_machine_deployment_from(&seed("md-h", 3))
        .await
        .unwrap();
    let faults = cluster.server().faults();
    for resource in ["machines", "machinesets", "machinedeployments", "nodes"] {
        faults.set_error_rate(resource, 0.2);
        faults.set_conflict_rate(resource, 0.2);
    }
    faults.set_watch_cut_every(Some(Duration::from_millis(300)));
    // The test's own reads go through the same faulty server: retry them.
    let ms = eventually("3 running machines under faults", || async {
        let ms = cluster.machines_of(NS, "md-h").await.ok()?;
        (ms.len() == 3 && ms.iter().all(|m| node_ref(m).is_some())).then_some(ms)
    })
    .await;
    faults.clear();
    // No duplicates were created along the way: exactly 3 Machines and 3 Nodes exist.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(machines(&cluster, "md-h").await.len(), 3);
    let nodes = karpenter_capi::sim::kubelet::sim_nodes(&cluster.client())
        .await
        .unwrap();
    let mut node_names: Vec<String> = nodes.iter().map(|n| n.name_any()).collect();
    let mut machine_names: Vec<String> = ms.iter().map(|m| m.name_any()).collect();
    node_names.sort();
    machine_names.sort();
    assert_eq!(node_names, machine_names);
    cluster.shutdown().await;
}

// ---- pods: start, graceful termination, pod GC, and the server's drain audit ----

fn bound_pod(name: &str, node: &str, grace: i64, annotations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "web"}, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        },
    }))
    .unwrap()
}

async fn create_node(cluster: &SimCluster, name: &str) {
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
    }))
    .unwrap();
    Api::<Node>::all(cluster.client())
        .create(&Default::default(), &node)
        .await
        .unwrap();
}

async fn running_pod(pods: &Api<Pod>, name: &str) -> Pod {
    eventually(&format!("pod {name} running"), || async {
        pods.get_opt(name).await.unwrap().filter(|p| {
            let s = p.status.clone().unwrap_or_default();
            s.phase.as_deref() == Some("Running") && s.start_time.is_some()
        })
    })
    .await
}

async fn gone(pods: &Api<Pod>, name: &str) {
    eventually(&format!("pod {name} gone"), || async {
        pods.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_pods_start_terminate_gracefully_and_are_collected_with_their_node() {
    let cluster = SimCluster::start(fast(CapiVersion::V1Beta2)).await.unwrap();
    create_node(&cluster, "n1").await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), NS);
    let quick = json!({"sim.karpenter.cluster.x-k8s.io/exit-after": "0.2"});
    let stubborn = json!({"sim.karpenter.cluster.x-k8s.io/exit-after": "never"});
    for (name, grace, ann) in [
        ("quick", 30, quick.clone()),
        ("stubborn", 30, stubborn),
        ("orphan", 30, quick),
    ] {
        pods.create(&Default::default(), &bound_pod(name, "n1", grace, ann))
            .await
            .unwrap();
    }
    for name in ["quick", "stubborn", "orphan"] {
        let p = running_pod(&pods, name).await;
        let ready = p.status.unwrap().conditions.unwrap_or_default();
        assert!(
            ready
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        );
    }

    // A running pod is only marked: it stays, terminating, until its application exits.
    pods.delete("quick", &DeleteParams::default())
        .await
        .unwrap();
    let marked = pods.get("quick").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
    gone(&pods, "quick").await;

    // One that ignores SIGTERM stays until its grace period runs out; a second delete with a
    // shorter grace brings that forward (never the other way).
    pods.delete("stubborn", &DeleteParams::default())
        .await
        .unwrap();
    let first = pods
        .get("stubborn")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp;
    // 5 s, not 1: the pod must still be there for the third delete below, however loaded the
    // machine running the test is.
    pods.delete("stubborn", &DeleteParams::default().grace_period(5))
        .await
        .unwrap();
    let second = pods
        .get("stubborn")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp;
    assert!(
        second < first,
        "a shorter grace period moves the deadline forward"
    );
    pods.delete("stubborn", &DeleteParams::default().grace_period(60))
        .await
        .unwrap();
    let third = pods
        .get("stubborn")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp;
    assert_eq!(third, second, "a longer grace period never extends it");
    gone(&pods, "stubborn").await;

    // An unbound pod goes at once.
    let mut unbound = bound_pod("unbound", "n1", 30, json!({}));
    unbound.spec.as_mut().unwrap().node_name = None;
    pods.create(&Default::default(), &unbound).await.unwrap();
    pods.delete("unbound", &DeleteParams::default())
        .await
        .unwrap();
    assert!(pods.get_opt("unbound").await.unwrap().is_none());

    // Pod GC: the pods of a Node that is gone are removed.
    Api::<Node>::all(cluster.client())
        .delete("n1", &DeleteParams::default())
        .await
        .unwrap();
    gone(&pods, "orphan").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_counts_drain_rule_violations_by_the_controller() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use karpenter_capi::api::wellknown::{
        DO_NOT_DISRUPT_ANNOTATION, TERMINATION_TIMESTAMP_ANNOTATION,
    };
    use karpenter_capi::sim::drain_audit::Violation;

    let cluster = SimCluster::start(fast(CapiVersion::V1Beta2)).await.unwrap();
    create_node(&cluster, "n1").await;
    create_node(&cluster, "n2").await;
    let admin: Api<Pod> = Api::namespaced(cluster.client(), NS);
    // The controller's own client (its User-Agent is what the server audits).
    let controller = karpenter_capi::app::client_from_kubeconfig(
        cluster.kubeconfig_path(),
        karpenter_capi::app::Limits::UNLIMITED,
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(controller.clone(), NS);
    let dnd = json!({DO_NOT_DISRUPT_ANNOTATION: "true"});
    for (name, node, ann) in [
        ("web-0", "n1", json!({})),
        ("web-1", "n1", json!({})),
        ("keep", "n1", dnd.clone()),
        ("keep-late", "n2", dnd),
    ] {
        let mut p = bound_pod(name, node, 5, ann);
        if name.starts_with("keep") {
            p.metadata.labels = Some([("app".to_string(), "keep".to_string())].into());
        }
        admin.create(&Default::default(), &p).await.unwrap();
        running_pod(&admin, name).await;
    }
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}},
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(cluster.client(), NS)
        .create(&Default::default(), &pdb)
        .await
        .unwrap();

    // The Eviction API refuses what the budget forbids: nothing was broken.
    let refused = pods.evict("web-0", &Default::default()).await.unwrap_err();
    assert!(matches!(refused, kube::Error::Api(s) if s.code == 429));
    assert!(cluster.stats().violations().is_empty());
    // A plain delete goes through, and the server counts it.
    pods.delete("web-0", &DeleteParams::default())
        .await
        .unwrap();
    // Evicting a do-not-disrupt pod before any deadline is a violation too.
    pods.evict("keep", &Default::default()).await.unwrap();
    // Past the node's termination deadline, upstream deletes whatever stands: not counted.
    let claim = json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": "c2", "annotations": {TERMINATION_TIMESTAMP_ANNOTATION: "2020-01-01T00:00:00Z"}},
        "spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"},
                 "requirements": []},
    });
    let claims: Api<DynamicObject> = Api::all_with(
        cluster.client(),
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim"),
            "nodeclaims",
        ),
    );
    claims
        .create(&Default::default(), &serde_json::from_value(claim).unwrap())
        .await
        .unwrap();
    merge_status_of(&claims, "c2", json!({"status": {"nodeName": "n2"}})).await;
    pods.delete("keep-late", &DeleteParams::default().grace_period(1))
        .await
        .unwrap();
    // The kubelet's own final delete (not the controller) is never audited.
    gone(&admin, "web-0").await;

    let mut seen: Vec<(Violation, String)> = cluster
        .stats()
        .violations()
        .into_iter()
        .map(|v| (v.violation, v.name))
        .collect();
    seen.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        seen,
        vec![
            (Violation::DoNotDisrupt, "keep".to_string()),
            (Violation::PdbViolation, "web-0".to_string()),
        ]
    );
}

async fn merge_status_of(api: &Api<DynamicObject>, name: &str, patch: serde_json::Value) {
    api.patch_status(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_api_drains_a_deleted_machine_unless_told_it_was_drained() {
    use karpenter_capi::api::wellknown::EXCLUDE_NODE_DRAINING_ANNOTATION;
    let cluster = SimCluster::start(fast(CapiVersion::V1Beta2)).await.unwrap();
    cluster
        .create_machine_deployment_from(&seed("md-d", 2))
        .await
        .unwrap();
    let ms = running(&cluster, "md-d", 2).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), NS);
    let api: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), NS, &cluster.capi_version().machine());
    for (i, m) in ms.iter().enumerate() {
        let node = node_ref(m).unwrap().to_string();
        pods.create(
            &Default::default(),
            &bound_pod(&format!("p{i}"), &node, 5, json!({})),
        )
        .await
        .unwrap();
        running_pod(&pods, &format!("p{i}")).await;
    }
    // Machine 0 is deleted plainly; machine 1 carries the exclusion annotation first.
    merge_patch(
        &api,
        &ms[1].name_any(),
        &json!({"metadata": {"annotations": {EXCLUDE_NODE_DRAINING_ANNOTATION: "test"}}}),
    )
    .await
    .unwrap();
    for m in &ms {
        api.delete(&m.name_any(), &DeleteParams::default())
            .await
            .unwrap();
    }
    gone(&pods, "p0").await;
    gone(&pods, "p1").await;
    let evicted: Vec<String> = cluster
        .stats()
        .writes()
        .into_iter()
        .filter(|w| w.resource == "pods" && w.subresource == "eviction")
        .map(|w| w.name)
        .collect();
    assert_eq!(
        evicted,
        vec!["p0".to_string()],
        "only the plain Machine's Node is drained"
    );
}

// ---- the Deployment stand-in ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_replace_evicted_pods_and_scale_down() {
    use kube::api::{EvictParams, PostParams};

    let cluster = SimCluster::start(SimClusterConfig {
        scheduler: false,
        ..fast(CapiVersion::V1Beta2)
    })
    .await
    .unwrap();
    create_node(&cluster, "n1").await;
    let mut shape = PodShape::new("100m", "128Mi");
    shape.grace_seconds = 30;
    shape.annotations.insert(
        "sim.karpenter.cluster.x-k8s.io/exit-after".into(),
        "never".into(),
    );
    cluster
        .create_deployment(NS, "web", 2, &shape)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), NS);
    let live = || async {
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect::<Vec<Pod>>()
    };
    let first = eventually("two pods", || async {
        let l = live().await;
        (l.len() == 2).then_some(l)
    })
    .await;
    let deployment_uid =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(cluster.client(), NS)
            .get("web")
            .await
            .unwrap()
            .metadata
            .uid;
    for p in &first {
        assert!(p.name_any().starts_with("web-"), "{}", p.name_any());
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "Deployment");
        assert_eq!(Some(owner.uid.clone()), deployment_uid);
        assert_eq!(owner.controller, Some(true));
    }

    // Bind one, let it start, evict it: it terminates slowly (it ignores SIGTERM) and is
    // replaced at once.
    let victim = first[0].name_any();
    let binding = json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": victim}, "target": {"kind": "Node", "name": "n1"}});
    pods.create_subresource::<_, serde_json::Value>(
        "binding",
        &victim,
        &PostParams::default(),
        &binding,
    )
    .await
    .unwrap();
    running_pod(&pods, &victim).await;
    pods.evict(&victim, &EvictParams::default()).await.unwrap();
    let after = eventually("a replacement", || async {
        let l = live().await;
        (l.len() == 2 && l.iter().all(|p| p.name_any() != victim)).then_some(l)
    })
    .await;
    let terminating = pods.get(&victim).await.unwrap();
    assert!(
        terminating.metadata.deletion_timestamp.is_some(),
        "the evicted pod is still terminating while its replacement exists"
    );
    assert!(
        after
            .iter()
            .all(|p| p.spec.as_ref().unwrap().node_name.is_none())
    );

    // Scale up, then down: surplus pods are deleted.
    cluster.scale_deployment(NS, "web", 4).await.unwrap();
    eventually("four pods", || async {
        (live().await.len() == 4).then_some(())
    })
    .await;
    cluster.scale_deployment(NS, "web", 1).await.unwrap();
    eventually("one pod", || async {
        (live().await.len() == 1).then_some(())
    })
    .await;
    // And it stays at one (no flapping).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(live().await.len(), 1);
}

/// The `Paused` condition of `obj` as (status, reason, message), where Cluster API keeps its
/// v1beta2 conditions in `v`.
fn paused_condition(obj: &DynamicObject, v: CapiVersion) -> Option<(String, String, String)> {
    let path = match v {
        CapiVersion::V1Beta1 => "/status/v1beta2/conditions",
        CapiVersion::V1Beta2 => "/status/conditions",
    };
    let c = obj
        .data
        .pointer(path)?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Paused")?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

/// As Cluster API's controllers (`EnsurePausedCondition`): every MachineDeployment and
/// MachineSet reports `Paused` False (`NotPaused`); `spec.paused` on their Cluster turns it
/// True (`Paused`, "Cluster spec.paused is set to true") and holds them (raised replicas make
/// no Machine); lifting it turns it False again.
async fn paused_cluster_sets_and_clears_the_paused_condition(v: CapiVersion) {
    let cluster = SimCluster::start(fast(v)).await.unwrap();
    let client = cluster.client();
    cluster
        .create_machine_deployment_from(&seed("md-paused", 1))
        .await
        .unwrap();
    running(&cluster, "md-paused", 1).await;
    let mds: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &v.machine_deployment());
    let sets: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &v.machine_set());
    let by_md = ListParams::default().labels(&format!("{DEPLOYMENT_NAME_LABEL}=md-paused"));
    let conditions = || async {
        let md = mds.get("md-paused").await.unwrap();
        let mut all = vec![paused_condition(&md, v)];
        for ms in sets.list(&by_md).await.unwrap().items {
            all.push(paused_condition(&ms, v));
        }
        all
    };
    let all_are = |status: &'static str, reason: &'static str, message: &'static str| {
        let conditions = &conditions;
        async move {
            let all = conditions().await;
            let want = Some((status.to_string(), reason.to_string(), message.to_string()));
            (all.len() >= 2 && all.iter().all(|c| *c == want)).then_some(())
        }
    };
    eventually(
        "Paused False on the MachineDeployment and its MachineSet",
        || all_are("False", "NotPaused", ""),
    )
    .await;

    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &v.cluster());
    let pause = |paused: bool| {
        let clusters = &clusters;
        async move {
            let body = json!({"spec": {"paused": paused}});
            if clusters.get_opt(CLUSTER_NAME).await.unwrap().is_some() {
                merge_patch(clusters, CLUSTER_NAME, &body).await.unwrap();
            } else {
                let c = DynamicObject::new(CLUSTER_NAME, &v.cluster())
                    .within(NS)
                    .data(body);
                clusters
                    .create(&kube::api::PostParams::default(), &c)
                    .await
                    .unwrap();
            }
        }
    };
    pause(true).await;
    eventually(
        "Paused True on the MachineDeployment and its MachineSet",
        || all_are("True", "Paused", "Cluster spec.paused is set to true"),
    )
    .await;
    // Held: the set makes no Machine for replicas raised while the Cluster is paused.
    let set = sets.list(&by_md).await.unwrap().items[0].name_any();
    merge_patch(&sets, &set, &json!({"spec": {"replicas": 2}}))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        machines(&cluster, "md-paused").await.len(),
        1,
        "a paused Cluster's MachineSet made a Machine"
    );

    pause(false).await;
    eventually("Paused False again", || all_are("False", "NotPaused", "")).await;
    running(&cluster, "md-paused", 1).await;

    // The MachineDeployment's own annotation pauses it alone, in Cluster API's words.
    merge_patch(
        &mds,
        "md-paused",
        &json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}}),
    )
    .await
    .unwrap();
    eventually("Paused True on the annotated MachineDeployment", || async {
        let md = mds.get("md-paused").await.unwrap();
        (paused_condition(&md, v)
            == Some((
                "True".into(),
                "Paused".into(),
                "MachineDeployment has the cluster.x-k8s.io/paused annotation".into(),
            )))
        .then_some(())
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_cluster_sets_and_clears_the_paused_condition_v1beta2() {
    paused_cluster_sets_and_clears_the_paused_condition(CapiVersion::V1Beta2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_cluster_sets_and_clears_the_paused_condition_v1beta1() {
    paused_cluster_sets_and_clears_the_paused_condition(CapiVersion::V1Beta1).await;
}
