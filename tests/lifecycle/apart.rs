//! The management cluster apart from the workload cluster, as Cluster API deploys them: the
//! controller reaches Machines and MachineDeployments in one simulated API server and Nodes,
//! Pods and its own objects in another (`--cluster-api-kubeconfig`). Each object lives only
//! where it belongs, a launch and a termination cross between the two, and pending pods get
//! nodes.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::Value;

use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::wellknown::MACHINE_ANNOTATION;
use karpenter_capi::sim::cluster::{CLUSTER_NAME, PodShape, SimClusterConfig};
use karpenter_capi::simulate::launch::seed_of;

use crate::common::{Env, condition, fast_cluster};

fn apart() -> SimClusterConfig {
    SimClusterConfig {
        management_apart: true,
        scheduler: true,
        ..fast_cluster()
    }
}

async fn env() -> Env {
    Env::builder()
        .cluster(apart())
        .seeds(vec![seed_of(0, 10)])
        .start()
        .await
}

fn names(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(String::from))
        .collect()
}

/// Every kind in its own cluster only: Cluster API's in the management cluster, Nodes, Pods and
/// Karpenter's in the workload cluster.
fn each_kind_in_its_cluster(env: &Env) {
    let cluster = env.sim.cluster();
    let (workload, management) = (cluster.store(), cluster.capi_store());
    for capi in ["machines", "machinesets", "machinedeployments"] {
        assert!(
            workload.list(capi, None).is_empty(),
            "no {capi} in the workload cluster"
        );
    }
    for ours in ["nodes", "pods", "nodeclaims", "nodepools"] {
        assert!(
            management.list(ours, None).is_empty(),
            "no {ours} in the management cluster"
        );
    }
}

/// Two claims launch: their Machines in the management cluster, their Nodes in the workload
/// cluster, each claim bound to one of each. A deleted claim's Machine goes from the management
/// cluster and its Node from the workload cluster; the other claim stays as it was.
#[actix::test]
async fn claims_launch_and_terminate_across_the_two_clusters() {
    let env = env().await;
    let claims = env.claims(2, 1).await;
    env.settle().await;
    let machines = env.list("machines");
    assert_eq!(machines.len(), 2, "two Machines in the management cluster");
    let nodes = env.list("nodes");
    assert_eq!(names(&nodes).len(), 2, "two Nodes in the workload cluster");
    for c in env.list("nodeclaims") {
        assert!(
            condition(&c, "Initialized").is_some_and(|i| i["status"] == "True"),
            "{c:#}"
        );
        let machine = c["metadata"]["annotations"][MACHINE_ANNOTATION]
            .as_str()
            .and_then(|k| k.split_once('/'))
            .expect("the claim names its Machine");
        let m = env
            .get("machines", machine.0, machine.1)
            .expect("its Machine");
        assert_eq!(c["status"]["providerID"], m["spec"]["providerID"]);
        let node = c["status"]["nodeName"].as_str().expect("its Node");
        assert!(names(&nodes).contains(node));
    }
    each_kind_in_its_cluster(&env);

    let victim = env.get("nodeclaims", "", &claims[0]).expect("the claim");
    let node = victim["status"]["nodeName"].as_str().unwrap_or_default();
    Api::<NodeClaim>::all(env.client().await)
        .delete(&claims[0], &DeleteParams::default())
        .await
        .expect("delete the claim");
    env.settle().await;
    assert!(env.get("nodeclaims", "", &claims[0]).is_none());
    assert_eq!(env.list("machines").len(), 1, "its Machine went");
    assert!(env.get("nodes", "", node).is_none(), "its Node went");
    assert_eq!(env.replicas("md-0"), 1);
    each_kind_in_its_cluster(&env);
    env.invariants_hold();
}

/// Pending pods in the workload cluster get claims, Machines in the management cluster, and
/// Nodes they are bound to.
#[actix::test]
async fn pending_pods_get_nodes_from_the_management_clusters_machines() {
    let env = env().await;
    env.deployment("web", 6, PodShape::new("1", "1Gi")).await;
    env.until_launched(6).await;
    assert!(!env.list("machines").is_empty());
    assert_eq!(
        env.list("machines").len(),
        env.list("nodeclaims").len(),
        "one Machine a claim"
    );
    each_kind_in_its_cluster(&env);
    env.invariants_hold();
}

/// The management cluster holds the workload cluster's kubeconfig as Cluster API writes it
/// (`<cluster>-kubeconfig`, key `value`), and it reaches the workload cluster.
#[actix::test]
async fn the_management_cluster_holds_the_workload_clusters_kubeconfig() {
    let env = Env::builder().cluster(apart()).start().await;
    let secret = env
        .sim
        .run(|c| async move {
            Api::<Secret>::namespaced(c.management_client(), "default")
                .get(&format!("{CLUSTER_NAME}-kubeconfig"))
                .await
        })
        .await
        .expect("the simulated cluster")
        .expect("the kubeconfig Secret");
    let value = secret
        .data
        .and_then(|d| d.get("value").cloned())
        .expect("its value");
    let text = std::str::from_utf8(&value.0).expect("text");
    let kubeconfig = kube::config::Kubeconfig::from_yaml(text).expect("a kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("a client configuration");
    assert_eq!(
        config.cluster_url.to_string().trim_end_matches('/'),
        env.sim.cluster().url().trim_end_matches('/'),
        "it names the workload cluster"
    );
}
