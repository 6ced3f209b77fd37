//! The Cluster API stand-in's MachinePools against the in-process API server: with MachinePool
//! Machines (one owned Machine per instance, targeted removal by `delete-machine` plus a
//! decrement) and without (instances only in `spec.providerIDList`, the "cloud" picks what a
//! decrement removes), in both Cluster API versions.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use karpenter_capi::api::wellknown::{
    CLUSTER_NAME_LABEL, DELETE_MACHINE_ANNOTATION, POOL_NAME_LABEL,
};
use karpenter_capi::sim::capi::{CapiVersion, infra_pool_resource, instances};
use karpenter_capi::sim::cluster::{CLUSTER_NAME, SimCluster};
use karpenter_capi::sim::kubelet::{NODE_MACHINE_ANNOTATION, node_ready};
use karpenter_capi::sim::standin::{merge_patch, str_at};
use kube::api::DeleteParams;
use kube::core::DynamicObject;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::common::{NS, eventually, md_seed, standin_cluster as fast};

fn pools(cluster: &SimCluster, v: CapiVersion) -> Api<DynamicObject> {
    Api::namespaced_with(cluster.client(), NS, &v.machine_pool())
}

fn provider_ids(mp: &DynamicObject) -> BTreeSet<String> {
    mp.data["spec"]["providerIDList"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

async fn node(cluster: &SimCluster, name: &str) -> Option<Node> {
    Api::<Node>::all(cluster.client())
        .get_opt(name)
        .await
        .unwrap()
}

/// Waits until pool `name` has `n` live Machines, all with a Node, and its providerIDList and
/// status say so; returns the Machines.
async fn settled(cluster: &SimCluster, v: CapiVersion, name: &str, n: usize) -> Vec<DynamicObject> {
    eventually(&format!("{n} running Machines of pool {name}"), || async {
        let ms = cluster.machines_of_pool(NS, name).await.unwrap();
        let mp = pools(cluster, v).get(name).await.unwrap();
        let pids: BTreeSet<String> = ms
            .iter()
            .filter_map(|m| str_at(&m.data, &["spec", "providerID"]))
            .map(str::to_string)
            .collect();
        let done = ms.len() == n
            && ms.iter().all(|m| {
                m.metadata.deletion_timestamp.is_none()
                    && str_at(&m.data, &["status", "nodeRef", "name"]).is_some()
            })
            && provider_ids(&mp) == pids
            && mp.data["status"]["readyReplicas"] == n
            && mp.data["status"]["replicas"] == n
            && mp.data["status"]["phase"] == "Running";
        done.then_some(ms)
    })
    .await
}

async fn pool_machines_end_to_end(v: CapiVersion) {
    let cluster = SimCluster::start(fast(v)).await.unwrap();
    let mp = cluster
        .create_machine_pool_from(&md_seed("mp-a", 3), true, None)
        .await
        .unwrap();
    let ms = settled(&cluster, v, "mp-a", 3).await;
    for m in &ms {
        let labels = m.labels();
        assert_eq!(labels[POOL_NAME_LABEL], "mp-a");
        assert_eq!(labels[CLUSTER_NAME_LABEL], CLUSTER_NAME);
        assert!(labels.contains_key("node-role.kubernetes.io/worker"));
        let owner = &m.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("MachinePool", mp.uid().unwrap().as_str(), Some(true))
        );
        assert_eq!(owner.api_version, v.api_version());
        assert!(
            m.finalizers()
                .iter()
                .any(|f| f == "machine.cluster.x-k8s.io")
        );
        let infra = &m.data["spec"]["infrastructureRef"];
        assert_eq!(infra["kind"], "DevMachine");
        assert_eq!(infra["name"], m.name_any());
        match v {
            CapiVersion::V1Beta1 => assert_eq!(
                infra["apiVersion"],
                "infrastructure.cluster.x-k8s.io/v1beta2"
            ),
            CapiVersion::V1Beta2 => {
                assert_eq!(infra["apiGroup"], "infrastructure.cluster.x-k8s.io")
            }
        }
        assert_eq!(m.data["spec"]["bootstrap"]["dataSecretName"], "");
        let n = node(&cluster, &m.name_any()).await.expect("node");
        assert_eq!(n.annotations()[NODE_MACHINE_ANNOTATION], m.name_any());
        assert_eq!(n.status.unwrap().capacity.unwrap()["cpu"].0, "4");
    }
    let mp = pools(&cluster, v).get("mp-a").await.unwrap();
    match v {
        CapiVersion::V1Beta1 => {
            assert_eq!(mp.data["status"]["infrastructureReady"], true);
            assert_eq!(mp.data["status"]["bootstrapReady"], true);
        }
        CapiVersion::V1Beta2 => assert_eq!(
            mp.data["status"]["initialization"]["infrastructureProvisioned"],
            true
        ),
    }
    let infra = Api::<DynamicObject>::namespaced_with(cluster.client(), NS, &infra_pool_resource())
        .get("mp-a")
        .await
        .unwrap();
    assert_eq!(
        infra.data["status"]["infrastructureMachineKind"],
        "DevMachine"
    );
    assert_eq!(
        infra.data["spec"]["providerIDList"],
        mp.data["spec"]["providerIDList"]
    );

    // Targeted removal: mark the newest Machine, then decrement.
    let victim = ms
        .iter()
        .max_by_key(|m| m.metadata.creation_timestamp.clone().map(|t| t.0))
        .unwrap()
        .name_any();
    let machines: Api<DynamicObject> = Api::namespaced_with(cluster.client(), NS, &v.machine());
    merge_patch(
        &machines,
        &victim,
        &json!({"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: "true"}}}),
    )
    .await
    .unwrap();
    cluster.scale_machine_pool(NS, "mp-a", 2).await.unwrap();
    let left = settled(&cluster, v, "mp-a", 2).await;
    assert!(
        left.iter().all(|m| m.name_any() != victim),
        "{victim} removed"
    );
    eventually("victim's node gone", || async {
        node(&cluster, &victim).await.is_none().then_some(())
    })
    .await;

    // A Machine deleted directly is replaced (its instance went with it).
    let gone = left[0].name_any();
    machines
        .delete(&gone, &DeleteParams::default())
        .await
        .unwrap();
    let replaced = settled(&cluster, v, "mp-a", 2).await;
    assert!(replaced.iter().all(|m| m.name_any() != gone));

    // Deleting the pool takes its Machines and their Nodes.
    pools(&cluster, v)
        .delete("mp-a", &DeleteParams::default())
        .await
        .unwrap();
    eventually("pool machines gone", || async {
        cluster
            .machines_of_pool(NS, "mp-a")
            .await
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_machines_v1beta2() {
    pool_machines_end_to_end(CapiVersion::V1Beta2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_machines_v1beta1() {
    pool_machines_end_to_end(CapiVersion::V1Beta1).await;
}

async fn instances_only_end_to_end(v: CapiVersion) {
    let cluster = SimCluster::start(fast(v)).await.unwrap();
    cluster
        .create_machine_pool_from(&md_seed("mp-b", 2), false, None)
        .await
        .unwrap();
    let infra_api =
        Api::<DynamicObject>::namespaced_with(cluster.client(), NS, &infra_pool_resource());
    let ready_nodes = |n: usize| {
        let (cluster, infra_api) = (&cluster, &infra_api);
        async move {
            eventually(&format!("{n} instances with Ready Nodes"), || async {
                let mp = pools(cluster, v).get("mp-b").await.unwrap();
                let infra = infra_api.get("mp-b").await.unwrap();
                let list = instances(&infra);
                let pids: BTreeSet<String> =
                    list.iter().filter_map(|i| i.provider_id.clone()).collect();
                if list.len() != n || pids.len() != n || provider_ids(&mp) != pids {
                    return None;
                }
                for i in &list {
                    let node = node(cluster, &i.instance_name).await.filter(node_ready)?;
                    assert_eq!(
                        node.spec.clone().unwrap().provider_id,
                        i.provider_id.clone()
                    );
                    assert!(!node.annotations().contains_key(NODE_MACHINE_ANNOTATION));
                    assert!(node.labels().contains_key("node-role.kubernetes.io/worker"));
                }
                (mp.data["status"]["replicas"] == n).then_some(list)
            })
            .await
        }
    };
    let before = ready_nodes(2).await;
    assert!(
        cluster
            .machines_of_pool(NS, "mp-b")
            .await
            .unwrap()
            .is_empty(),
        "no MachinePool Machines"
    );
    let infra = infra_api.get("mp-b").await.unwrap();
    assert!(
        infra.data["status"]
            .get("infrastructureMachineKind")
            .is_none()
    );

    // A decrement removes an instance the cloud picks (the oldest), and its Node.
    cluster.scale_machine_pool(NS, "mp-b", 1).await.unwrap();
    let after = ready_nodes(1).await;
    assert_eq!(after[0], before[1]);
    eventually("terminated instance's node gone", || async {
        node(&cluster, &before[0].instance_name)
            .await
            .is_none()
            .then_some(())
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_only_v1beta2() {
    instances_only_end_to_end(CapiVersion::V1Beta2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_only_v1beta1() {
    instances_only_end_to_end(CapiVersion::V1Beta1).await;
}
