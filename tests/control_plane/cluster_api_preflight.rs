//! A MachineSet preflight check holding a scale-up, on real Cluster API (issue 38): the
//! simulator's control-plane provider reports an upgrade in progress (`spec.version` one patch
//! release above `status.version`), so the real manager's `ControlPlaneIsStable` check holds
//! every scale-up. The controller's replica raise lands, no Machine is made, and the waiting
//! claim's `Launched` condition names the check and the MachineSet in Cluster API's words; once
//! the upgrade is done the manager makes the Machines, the same claims launch and the pods bind.
//! At v1.14.2 (v1beta2 condition shapes) and v1.10.10 (v1beta1).

use std::time::Duration;

use karpenter_capi::cli::SimulateArgs;
use karpenter_capi::controlplane::cluster_api::{RELEASE_V1BETA1, RELEASE_V1BETA2};
use karpenter_capi::sim::cluster::{CLUSTER_NAME, PodShape};
use karpenter_capi::sim::real::provider::{
    begin_control_plane_upgrade, finish_control_plane_upgrade,
};
use karpenter_capi::simulate::pods::seed_of;
use serde_json::Value;

use crate::assets;
use crate::common::{Env, NS, condition};

pub fn tests() -> Vec<assets::Test> {
    trials![
        @actix a_preflight_check_holding_the_scale_up_is_named_on_the_claim_on_real_cluster_api
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        @actix a_preflight_check_holding_the_scale_up_is_named_on_the_claim_on_real_cluster_api_v1beta1
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApiV1beta1],
    ]
}

const APP: &str = "web";
const PODS: usize = 3;

/// How long the held scale-up is watched for a Machine that must not come: longer than the
/// manager's 15 s preflight requeue, so it has checked again at least once.
const HELD_FOR: Duration = Duration::from_secs(20);

async fn a_preflight_check_holding_the_scale_up_is_named_on_the_claim_on_real_cluster_api() {
    held_then_launched(&[], RELEASE_V1BETA2).await;
}

async fn a_preflight_check_holding_the_scale_up_is_named_on_the_claim_on_real_cluster_api_v1beta1()
{
    held_then_launched(&["--cluster-api-version", "v1beta1"], RELEASE_V1BETA1).await;
}

async fn held_then_launched(version_args: &[&str], release: &str) {
    let mut words = vec!["--control-plane", "real", "--cluster-api", "real"];
    words.extend(version_args);
    let args = SimulateArgs::from_words(&words).expect("simulate's arguments");
    let env = Env::builder()
        .cluster(karpenter_capi::simulate::cluster_config(&args))
        .seeds(vec![seed_of(0, 10)])
        .short_batches()
        .start()
        .await;
    let cluster = env.sim.cluster().clone();
    super::report_names_real_cluster_api(&cluster, release);
    let md = seed_of(0, 10).name;

    // The upgrade begins before any pod is pending.
    let to = begin_control_plane_upgrade(&env.client().await, NS, CLUSTER_NAME)
        .await
        .expect("begin the control plane's upgrade");
    say!("control plane upgrading to {to}");
    env.deployment(APP, PODS, PodShape::new("100m", "128Mi"))
        .await;

    // Every waiting claim says why, in Cluster API's words, naming the MachineSet.
    let upgrading = format!(
        "SimControlPlane {NS}/{CLUSTER_NAME} is upgrading (\"ControlPlaneIsStable\" preflight check failed)"
    );
    let held = env
        .wait("every claim names the preflight check", || {
            let claims = env.list("nodeclaims");
            let all_held = !claims.is_empty()
                && claims.iter().all(|c| {
                    condition(c, "Launched").is_some_and(|l| l["reason"] == "PreflightCheckFailed")
                });
            all_held.then_some(claims)
        })
        .await;
    let sets = env.list("machinesets");
    assert_eq!(sets.len(), 1, "one MachineSet: {sets:#?}");
    let set = sets[0]["metadata"]["name"]
        .as_str()
        .expect("the MachineSet's name");
    for claim in &held {
        let launched = condition(claim, "Launched").expect("Launched");
        assert_eq!(launched["status"], "Unknown", "{claim:#}");
        let message = launched["message"].as_str().unwrap_or_default();
        for quoted in [format!("MachineSet {NS}/{set}"), upgrading.clone()] {
            assert!(message.contains(&quoted), "{quoted:?} not in {message:?}");
        }
    }

    // Held: the raise landed, the manager made no Machine and says why on its MachineSet.
    tokio::time::sleep(HELD_FOR).await;
    assert!(env.replicas(&md) >= 1, "no replica raise on {md}");
    assert_eq!(
        env.list("machines"),
        Vec::<Value>::new(),
        "a Machine while held"
    );
    assert_eq!(env.bound_pods(), 0, "a pod bound while held");
    let sets = env.list("machinesets");
    let said = serde_json::to_string(&sets[0]["status"]).unwrap_or_default();
    say!("the MachineSet's status while held: {said}");
    assert!(
        said.contains("PreflightCheckFailed") || said.contains("is blocked because"),
        "the MachineSet does not report the hold: {said}"
    );
    let names = |claims: &[Value]| -> Vec<String> {
        let mut n: Vec<String> = claims
            .iter()
            .filter_map(|c| c["metadata"]["name"].as_str().map(String::from))
            .collect();
        n.sort();
        n
    };
    let held_names = names(&held);
    assert_eq!(
        names(&env.list("nodeclaims")),
        held_names,
        "claims replaced while held"
    );

    // The upgrade done: the check passes, the manager makes the Machines, the same claims launch.
    finish_control_plane_upgrade(&env.client().await, NS, CLUSTER_NAME)
        .await
        .expect("finish the control plane's upgrade");
    env.until_quiet("the pods bound once the upgrade finished", |e| {
        e.bound_pods() == PODS
    })
    .await;
    let claims = env.list("nodeclaims");
    assert_eq!(
        names(&claims),
        held_names,
        "the held claims launched, not others"
    );
    for claim in &claims {
        let launched = condition(claim, "Launched").expect("Launched");
        assert_eq!(launched["status"], "True", "{claim:#}");
    }
    super::assert_cluster_api_did_its_part(&cluster, claims.len()).await;
    env.assert_clean();
    super::env_stops_leaving_nothing(env);
}
