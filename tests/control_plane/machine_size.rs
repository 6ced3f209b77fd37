//! Machine sizes on the real control plane (`common::machine_size`): a DevMachineTemplate
//! created at run time with size annotations gets them in its `status.capacity` under the
//! upstream CRD's schema, and the Node of a MachineDeployment made from it at run time (scaled
//! through the scale subresource) registers with that size; deleting the MachineDeployment
//! removes its MachineSets, Machines and Node. With the Cluster API stand-in and its provider,
//! and with Cluster API's real manager beside the simulator's provider (`real::provider`).

use karpenter_capi::cli::SimulateArgs;
use karpenter_capi::sim::cluster::SimCluster;

use crate::assets;
use crate::common::machine_size::a_sized_template_decides_the_node;

pub fn tests() -> Vec<assets::Test> {
    trials![
        @tokio a_sized_template_decides_the_node_on_the_real_control_plane
            needs [ControlPlane, Upstream],
        @tokio a_sized_template_decides_the_node_on_real_cluster_api
            needs [ControlPlane, Upstream, ClusterApi],
    ]
}

async fn on(words: &[&str]) {
    let args = SimulateArgs::from_words(words).expect("simulate's arguments");
    let cluster = SimCluster::start(karpenter_capi::simulate::cluster_config(&args))
        .await
        .expect("the simulated cluster");
    a_sized_template_decides_the_node(&cluster).await;
    cluster.shutdown().await;
}

async fn a_sized_template_decides_the_node_on_the_real_control_plane() {
    on(&["--control-plane", "real"]).await;
}

async fn a_sized_template_decides_the_node_on_real_cluster_api() {
    on(&["--control-plane", "real", "--cluster-api", "real"]).await;
}
