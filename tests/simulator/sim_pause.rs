//! Cluster API's pause beyond MachineDeployments and MachineSets, as the stand-in plays it: a
//! paused Cluster's Machines are not deleted (finalizer held, Node kept) and its MachinePools
//! neither grow nor shrink, each reporting `Paused`, as Cluster API's Machine and MachinePool
//! controllers (and the infrastructure provider) stop at the pause; both go on once it lifts.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use karpenter_capi::sim::capi::CapiVersion;
use karpenter_capi::sim::cluster::{CLUSTER_NAME, SimCluster};
use karpenter_capi::sim::standin::{merge_patch, str_at};
use kube::api::{DeleteParams, PostParams};
use kube::core::DynamicObject;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::common::{NS, eventually, md_seed, standin_cluster as fast};

/// Live Machines with a Node, or `None` until there are exactly `n`.
fn running(ms: Vec<DynamicObject>, n: usize) -> Option<Vec<DynamicObject>> {
    let up = ms.len() == n
        && ms.iter().all(|m| {
            m.metadata.deletion_timestamp.is_none()
                && str_at(&m.data, &["status", "nodeRef", "name"]).is_some()
        });
    up.then_some(ms)
}

/// Sets the Cluster's `spec.paused`, creating the Cluster if need be.
async fn set_paused(cluster: &SimCluster, v: CapiVersion, paused: bool) {
    let clusters: Api<DynamicObject> = Api::namespaced_with(cluster.client(), NS, &v.cluster());
    let body = json!({"spec": {"paused": paused}});
    if clusters.get_opt(CLUSTER_NAME).await.unwrap().is_some() {
        merge_patch(&clusters, CLUSTER_NAME, &body).await.unwrap();
    } else {
        let c = DynamicObject::new(CLUSTER_NAME, &v.cluster())
            .within(NS)
            .data(body);
        clusters.create(&PostParams::default(), &c).await.unwrap();
    }
}

/// Whether `obj` reports Cluster API's `Paused` condition True (v1beta1 keeps it among the
/// v1beta2 conditions beside its own).
fn says_paused(obj: &DynamicObject, v: CapiVersion) -> bool {
    let at = match v {
        CapiVersion::V1Beta1 => "/status/v1beta2/conditions",
        CapiVersion::V1Beta2 => "/status/conditions",
    };
    obj.data
        .pointer(at)
        .and_then(|cs| cs.as_array())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Paused" && c["status"] == "True")
        })
}

async fn a_paused_cluster_holds_machine_deletion_and_machine_pools(v: CapiVersion) {
    let cluster = SimCluster::start(fast(v)).await.unwrap();
    cluster
        .create_machine_deployment_from(&md_seed("md-a", 1))
        .await
        .unwrap();
    cluster
        .create_machine_pool_from(&md_seed("mp-a", 1), true, None)
        .await
        .unwrap();
    let c = &cluster;
    let of_md = || async move { running(c.machines_of(NS, "md-a").await.unwrap(), 1) };
    let of_pool = |n| async move { running(c.machines_of_pool(NS, "mp-a").await.unwrap(), n) };
    let first = eventually("md-a's Machine running", of_md).await[0].clone();
    eventually("mp-a's Machine running", || of_pool(1)).await;

    set_paused(&cluster, v, true).await;
    let pools: Api<DynamicObject> = Api::namespaced_with(cluster.client(), NS, &v.machine_pool());
    eventually("the MachinePool reports Paused", || async {
        says_paused(&pools.get("mp-a").await.unwrap(), v).then_some(())
    })
    .await;
    let machines: Api<DynamicObject> = Api::namespaced_with(cluster.client(), NS, &v.machine());
    machines
        .delete(&first.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    merge_patch(&pools, "mp-a", &json!({"spec": {"replicas": 2}}))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let held = machines.get(&first.name_any()).await.unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "the Machine is being deleted"
    );
    let node = str_at(&held.data, &["status", "nodeRef", "name"]).unwrap();
    assert!(
        Api::<Node>::all(cluster.client())
            .get_opt(node)
            .await
            .unwrap()
            .is_some(),
        "a paused Cluster's Machine had its Node deleted"
    );
    assert_eq!(
        cluster.machines_of_pool(NS, "mp-a").await.unwrap().len(),
        1,
        "a paused Cluster's MachinePool grew"
    );

    set_paused(&cluster, v, false).await;
    eventually("the held Machine gone once the pause lifted", || async {
        machines
            .get_opt(&first.name_any())
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let replaced = eventually("md-a's replacement running", of_md).await;
    assert_ne!(replaced[0].name_any(), first.name_any());
    eventually("mp-a grown to 2 once the pause lifted", || of_pool(2)).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_cluster_holds_machine_deletion_and_machine_pools_v1beta2() {
    a_paused_cluster_holds_machine_deletion_and_machine_pools(CapiVersion::V1Beta2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_cluster_holds_machine_deletion_and_machine_pools_v1beta1() {
    a_paused_cluster_holds_machine_deletion_and_machine_pools(CapiVersion::V1Beta1).await;
}
