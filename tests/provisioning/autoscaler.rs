//! Cluster Autoscaler's clusterapi annotations through the whole product on the simulated
//! cluster: Cluster API's pause, and a ClusterClass topology that sets replicas, keep the
//! controller's hands off a MachineDeployment's replicas, `maxPods` bounds how many pods a new node takes, and a malformed driver annotation
//! entry is passed over and reported naming the MachineDeployment and the annotation.

use std::time::Duration;

use karpenter_capi::api::wellknown::MAX_PODS_ANNOTATION;
use karpenter_capi::capi::autoscaler::{CSI_DRIVER_ANNOTATION, PAUSED_ANNOTATION};
use karpenter_capi::sim::cluster::{PodShape, SimClusterConfig};
use karpenter_capi::simulate::launch;
use karpenter_capi::simulate::pods::seed_of;
use serde_json::Value;

use crate::common::{Env, condition};

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

/// The controller's writes to MachineDeployments (to `name` only, when given).
fn md_writes(env: &Env, name: Option<&str>) -> usize {
    env.sim
        .cluster()
        .stats()
        .writes()
        .into_iter()
        .filter(|w| {
            w.agent == karpenter_capi::app::USER_AGENT
                && w.resource == "machinedeployments"
                && name.is_none_or(|n| w.name == n)
        })
        .count()
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
    let writes_to_paused = md_writes(&env, Some("md-small"));
    assert_eq!(
        writes_to_paused, 0,
        "no write to the paused MachineDeployment"
    );
}

/// Cluster API's pause on the Cluster (`spec.paused`) holds every MachineDeployment of it, as
/// it holds every Cluster API controller: while it lasts nothing is offered, no replica is
/// written and the pods wait; once it lifts they launch.
#[actix::test]
async fn a_paused_cluster_holds_its_machine_deployments_until_it_resumes() {
    let seeds: Vec<_> = (0..2).map(|i| seed_of(i, 50)).collect();
    let env = Env::builder()
        .cluster(cluster())
        .seeds(seeds)
        .short_batches()
        .start()
        .await;
    env.set_cluster_paused(true).await;
    pods(&env, "web", 2, PodShape::new("100m", "128Mi")).await;
    // Several provisioning batches go by.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.bound_pods(), 0);
    assert_eq!(
        md_writes(&env, None),
        0,
        "a replica write while the Cluster is paused"
    );
    env.set_cluster_paused(false).await;
    env.until_quiet("the pods bound once the pause lifted", |e| {
        e.bound_pods() == 2
    })
    .await;
    assert!(md_writes(&env, None) > 0);
}

/// A ClusterClass topology entry that sets `replicas` holds its MachineDeployment (Cluster API's
/// topology controller applies that value on every reconcile): the controller neither offers
/// nor scales the group (md-small, the cheapest), the NodeClass's Ready message names the field
/// to unset, and the pod launches on the next cheapest. Once the entry leaves `replicas` unset,
/// as Cluster API advises for autoscalers, md-small is offered again and the next pod goes there.
#[actix::test]
async fn a_topology_that_sets_replicas_holds_its_machine_deployment() {
    use karpenter_capi::capi::topology::{DEPLOYMENT_NAME_LABEL, OWNED_LABEL};
    let mut seeds: Vec<_> = (0..4).map(|i| seed_of(i, 50)).collect();
    seeds[0]
        .labels
        .insert(OWNED_LABEL.to_string(), String::new());
    seeds[0]
        .labels
        .insert(DEPLOYMENT_NAME_LABEL.to_string(), "workers".to_string());
    // Cluster API's webhook refuses topology replicas beside the autoscaler's bounds.
    seeds[0]
        .annotations
        .remove(karpenter_capi::api::wellknown::MAX_SIZE_ANNOTATION);
    let env = Env::builder()
        .cluster(cluster())
        .seeds(seeds)
        .short_batches()
        .start()
        .await;
    env.set_cluster_topology(
        serde_json::json!([{"class": "default", "name": "workers", "replicas": 0}]),
    )
    .await;
    pods(&env, "web", 1, PodShape::new("100m", "128Mi")).await;
    env.until_quiet("the pod bound", |e| e.bound_pods() == 1)
        .await;
    assert_eq!(
        launched_on(&env),
        [format!("{}/md-medium", launch::NAMESPACE)],
        "the next cheapest, not md-small whose replicas the topology holds"
    );
    assert_eq!(md_writes(&env, Some("md-small")), 0, "a write to md-small");
    let field = "spec.topology.workers.machineDeployments[name=workers].replicas";
    let message = env
        .wait("the Ready message naming the topology's field", || {
            let nc = env.list("clusterapinodeclasses").into_iter().next()?;
            let message = crate::common::condition(&nc, "Ready")?["message"]
                .as_str()?
                .to_string();
            message.contains(field).then_some(message)
        })
        .await;
    assert!(
        message.contains(&format!("{}/md-small", launch::NAMESPACE)),
        "{message}"
    );

    env.set_cluster_topology(serde_json::json!([{"class": "default", "name": "workers"}]))
        .await;
    // A pod only md-small's nodes can take (the first node has room for it otherwise).
    let mut only_small = PodShape::new("100m", "128Mi");
    only_small.node_selector.insert(
        karpenter_capi::api::wellknown::INSTANCE_TYPE_LABEL.to_string(),
        "small".to_string(),
    );
    pods(&env, "api", 1, only_small).await;
    env.until_quiet("the second pod bound", |e| e.bound_pods() == 2)
        .await;
    assert!(
        launched_on(&env).contains(&format!("{}/md-small", launch::NAMESPACE)),
        "md-small offered again: {:?}",
        launched_on(&env)
    );
    assert!(md_writes(&env, Some("md-small")) > 0);
}

/// Cluster API's MachineSet preflight check `ControlPlaneIsStable` holds a scale-up (the
/// stand-in's switch makes the control plane "upgrading"): the replica raise lands, no Machine
/// is made, and the waiting claim's `Launched` condition (Unknown, reason `PreflightCheckFailed`)
/// names the MachineSet and quotes Cluster API's message, with one Event. Once the check
/// passes the same claim launches and the pod binds. Both API versions' condition shapes.
#[actix::test]
async fn a_preflight_check_holding_the_scale_up_is_named_on_the_claim_until_it_passes() {
    use karpenter_capi::capi::CapiVersion;
    use karpenter_capi::sim::capi::CONTROL_PLANE_UPGRADING_ANNOTATION;
    use karpenter_capi::sim::cluster::ServedVersions;
    use kube::api::{Api, DynamicObject, Patch, PatchParams};

    for version in [CapiVersion::V1Beta2, CapiVersion::V1Beta1] {
        let mut seed = seed_of(0, 50);
        seed.annotations.insert(
            CONTROL_PLANE_UPGRADING_ANNOTATION.to_string(),
            "true".to_string(),
        );
        let env = Env::builder()
            .cluster(SimClusterConfig {
                capi_version: version.into(),
                served: match version {
                    CapiVersion::V1Beta1 => ServedVersions::V1beta1,
                    CapiVersion::V1Beta2 => ServedVersions::V1beta2,
                },
                ..cluster()
            })
            .seeds(vec![seed])
            .short_batches()
            .start()
            .await;
        pods(&env, "web", 1, PodShape::new("100m", "128Mi")).await;
        let held = env
            .wait("the waiting claim names the preflight check", || {
                env.list("nodeclaims").into_iter().find(|c| {
                    condition(c, "Launched").is_some_and(|l| l["reason"] == "PreflightCheckFailed")
                })
            })
            .await;
        let launched = condition(&held, "Launched").expect("Launched");
        assert_eq!(launched["status"], "Unknown", "{version:?}: {held:#}");
        let sets = env.list("machinesets");
        let set = sets[0]["metadata"]["name"]
            .as_str()
            .expect("the MachineSet's name");
        let message = launched["message"].as_str().expect("a message");
        let ns = launch::NAMESPACE;
        for quoted in [
            format!("MachineSet {ns}/{set}"),
            format!(
                "SimControlPlane {ns}/sim is upgrading (\"ControlPlaneIsStable\" preflight check failed)"
            ),
        ] {
            assert!(
                message.contains(&quoted),
                "{version:?}: {quoted} not in {message}"
            );
        }
        // Held for a while: the raise landed, nothing was made.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            env.replicas("md-small"),
            1,
            "{version:?}: the replica raise"
        );
        assert!(
            env.list("machines").is_empty(),
            "{version:?}: a Machine while held"
        );
        assert_eq!(env.bound_pods(), 0);
        assert_eq!(
            env.events("PreflightCheckFailed").len(),
            1,
            "{version:?}: one Event"
        );

        // The upgrade done: the check passes, the same claim launches.
        let mds: Api<DynamicObject> = Api::namespaced_with(
            env.client().await,
            ns,
            &env.sim.cluster().capi_version().machine_deployment(),
        );
        let lift = serde_json::json!({"metadata": {"annotations": {CONTROL_PLANE_UPGRADING_ANNOTATION: "false"}}});
        mds.patch("md-small", &PatchParams::default(), &Patch::Merge(lift))
            .await
            .expect("lift the switch");
        env.until_quiet("the pod bound once the check passed", |e| {
            e.bound_pods() == 1
        })
        .await;
        let claims = env.list("nodeclaims");
        assert_eq!(claims.len(), 1, "{version:?}: {claims:#?}");
        assert_eq!(
            claims[0]["metadata"]["name"], held["metadata"]["name"],
            "{version:?}"
        );
        let launched = condition(&claims[0], "Launched").expect("Launched");
        assert_eq!(launched["status"], "True", "{version:?}: {launched:#}");
        env.invariants_hold();
    }
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

/// A csi-driver entry that is not `driver=limit` is passed over, as Cluster Autoscaler passes
/// it over (issue 37): the MachineDeployment stays offered (and, cheapest, is launched on) with
/// its other limits, and the ignored entry is reported in an Event and in the NodeClass's Ready
/// message naming the MachineDeployment and the annotation.
#[actix::test]
async fn a_malformed_csi_driver_annotation_is_reported_and_the_rest_serve() {
    let mut seeds: Vec<_> = (0..2).map(|i| seed_of(i, 50)).collect();
    seeds[0].annotations.insert(
        CSI_DRIVER_ANNOTATION.to_string(),
        "ebs.csi.aws.com,efs.csi.aws.com=3".to_string(),
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
        [format!("{}/md-small", launch::NAMESPACE)],
        "md-small is still offered, and is the cheapest"
    );
    let ignored = format!("annotation {CSI_DRIVER_ANNOTATION}: \"ebs.csi.aws.com\" ignored: ");
    let names_it = |text: &str| {
        text.contains(&format!("{}/md-small", launch::NAMESPACE)) && text.contains(&ignored)
    };
    env.wait(
        "an InvalidMachineDeployment Event naming md-small and the ignored entry",
        || {
            env.events("InvalidMachineDeployment")
                .into_iter()
                .find(|e| names_it(e["note"].as_str().unwrap_or_default()))
        },
    )
    .await;
    // Ignored, never refused: no report says md-small was left out for the annotation (a
    // start reports each group once as not read yet, which says nothing of its annotations).
    for e in env.events("InvalidMachineDeployment") {
        let note = e["note"].as_str().unwrap_or_default();
        assert!(
            !note.contains("malformed annotation")
                && (!note.contains(CSI_DRIVER_ANNOTATION) || names_it(note)),
            "unexpected report: {note}"
        );
    }
    // The NodeClass stays Ready and its message says what was ignored.
    let message = env
        .wait("the Ready message naming the ignored entry", || {
            let nc = env.list("clusterapinodeclasses").into_iter().next()?;
            let ready = crate::common::condition(&nc, "Ready")?;
            let message = ready["message"].as_str()?.to_string();
            (ready["status"] == "True" && message.contains("; ignored: ")).then_some(message)
        })
        .await;
    assert!(
        names_it(&message) && !message.contains("left out"),
        "{message}"
    );
}
