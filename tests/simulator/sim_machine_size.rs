//! Machine sizes on the simulated backend (the Cluster API stand-in and its provider): a
//! DevMachineTemplate created at run time with size annotations publishes them in its
//! `status.capacity`, and the Node of a MachineDeployment made from it at run time (POSTed at 0
//! replicas, scaled to 1 through the scale subresource) registers with that size, not the
//! MachineDeployment's scale-from-zero annotations; deleting the MachineDeployment removes its
//! MachineSets, Machines and Node (`common::machine_size`).

use karpenter_capi::sim::capi::CapiVersion;
use karpenter_capi::sim::cluster::SimCluster;

use crate::common::machine_size::a_sized_template_decides_the_node;
use crate::common::standin_cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sized_template_decides_the_node_of_a_run_time_machine_deployment() {
    let cluster = SimCluster::start(standin_cluster(CapiVersion::V1Beta2))
        .await
        .unwrap();
    a_sized_template_decides_the_node(&cluster).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sized_template_decides_the_node_of_a_run_time_machine_deployment_v1beta1() {
    let cluster = SimCluster::start(standin_cluster(CapiVersion::V1Beta1))
        .await
        .unwrap();
    a_sized_template_decides_the_node(&cluster).await;
    cluster.shutdown().await;
}
