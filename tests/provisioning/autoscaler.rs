//! Cluster Autoscaler's clusterapi annotations through the whole product on the simulated
//! cluster: Cluster API's pause keeps the controller's hands off a MachineDeployment's
//! replicas, `maxPods` bounds how many pods a new node takes, and malformed driver annotations
//! are reported naming the MachineDeployment and the annotation.

use std::time::Duration;

use karpenter_capi::api::wellknown::MAX_PODS_ANNOTATION;
use karpenter_capi::capi::autoscaler::{CSI_DRIVER_ANNOTATION, PAUSED_ANNOTATION};
use karpenter_capi::sim::cluster::{PodShape, SimClusterConfig};
use karpenter_capi::simulate::launch;
use karpenter_capi::simulate::pods::seed_of;
use serde_json::Value;

use crate::common::Env;

/// A quick simulated cluster with the scheduler stand-in (also the buffers tests').
pub fn cluster() -> SimClusterConfig {
    SimClusterConfig {
        provider_delay: Duration::from_millis(30),
        node_ready_delay: Duration::from_millis(30),
        node_delete_delay: Duration::from_millis(20),
        ..SimClusterConfig::default()
    }
}

async fn pods(env: &Env, name: &str, replicas: usize, shape: PodShape) {
    let name = name.to_string();
    env.sim
        .run(move |c| async move {
            c.create_deployment(launch::NAMESPACE, &name, replicas, &shape)
                .await
                .expect("a Deployment")
        })
        .await
        .expect("the simulated cluster");
}

fn launched_on(env: &Env) -> Vec<String> {
    env.list("nodeclaims")
        .iter()
        .filter_map(|c| {
            c["metadata"]["annotations"]["karpenter.cluster.x-k8s.io/machine-deployment"]
                .as_str()
                .map(String::from)
        })
        .collect()
}

/// The cheapest MachineDeployment (md-small) carries Cluster API's pause: its offering is not
/// used, its replicas are never written, and the pod launches on the next cheapest.
#[actix::test]
async fn a_paused_machine_deployment_is_neither_scaled_nor_launched_on() {
    let mut seeds: Vec<_> = (0..4).map(|i| seed_of(i, 50)).collect();
    seeds[0]
        .annotations
        .insert(PAUSED_ANNOTATION.to_string(), "true".to_string());
    let env = Env::builder()
        .cluster(cluster())
        .seeds(seeds)
        .short_batches()
        .start()
        .await;
    pods(&env, "web", 1, PodShape::new("100m", "128Mi")).await;
    env.until_quiet("the pod bound", |e| e.bound_pods() == 1)
        .await;
    let on = launched_on(&env);
    assert_eq!(
        on,
        [format!("{}/md-medium", launch::NAMESPACE)],
        "the next cheapest, not the paused md-small"
    );
    assert_eq!(env.replicas("md-small"), 0);
    let writes_to_paused = env
        .sim
        .cluster()
        .stats()
        .writes()
        .into_iter()
        .filter(|w| {
            w.agent == karpenter_capi::app::USER_AGENT
                && w.resource == "machinedeployments"
                && w.name == "md-small"
        })
        .count();
    assert_eq!(
        writes_to_paused, 0,
        "no write to the paused MachineDeployment"
    );
}

/// maxPods 3 on the only MachineDeployment offered: seven small pods need three nodes, though
/// their cpu and memory would fit on one.
#[actix::test]
async fn max_pods_bounds_the_pods_a_new_node_takes() {
    let mut seed = seed_of(3, 50);
    seed.annotations
        .insert(MAX_PODS_ANNOTATION.to_string(), "3".to_string());
    let env = Env::builder()
        .cluster(cluster())
        .seeds(vec![seed])
        .short_batches()
        .start()
        .await;
    pods(&env, "tiny", 7, PodShape::new("10m", "16Mi")).await;
    env.until_quiet("the pods bound", |e| e.bound_pods() == 7)
        .await;
    let claims = env.list("nodeclaims");
    assert_eq!(claims.len(), 3, "{:#?}", launched_on(&env));
    for c in &claims {
        assert_eq!(c["status"]["capacity"]["pods"], Value::from("3"), "{c:#}");
    }
}

/// A csi-driver annotation that is not `driver=limit` leaves the MachineDeployment out of the
/// catalog with an Event naming it and the annotation; the others keep serving.
#[actix::test]
async fn a_malformed_csi_driver_annotation_is_reported_and_the_rest_serve() {
    let mut seeds: Vec<_> = (0..2).map(|i| seed_of(i, 50)).collect();
    seeds[0].annotations.insert(
        CSI_DRIVER_ANNOTATION.to_string(),
        "ebs.csi.aws.com".to_string(),
    );
    let env = Env::builder()
        .cluster(cluster())
        .seeds(seeds)
        .short_batches()
        .start()
        .await;
    pods(&env, "web", 1, PodShape::new("100m", "128Mi")).await;
    env.until_quiet("the pod bound", |e| e.bound_pods() == 1)
        .await;
    assert_eq!(
        launched_on(&env),
        [format!("{}/md-medium", launch::NAMESPACE)]
    );
    env.wait("an Event naming md-small and the annotation", || {
        env.list("events.events.k8s.io").into_iter().find(|e| {
            let note = e["note"].as_str().unwrap_or_default();
            note.contains("md-small") && note.contains(CSI_DRIVER_ANNOTATION)
        })
    })
    .await;
}
