//! Claims on a MachinePool with MachinePool Machines, end to end in both Cluster API versions:
//! launch binds claims to the pool's Machines through the pool's Scaler, and deleting a claim
//! releases exactly its Machine (delete-machine, then the decrement).

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::{Api, DeleteParams};
use serde_json::Value;

use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::wellknown::*;
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::sim::cluster::{MachineDeploymentSeed, ServedVersions, SimClusterConfig};
use karpenter_capi::simulate::launch::seed_of;

use crate::common::Env;

fn cluster(version: CapiVersion) -> SimClusterConfig {
    SimClusterConfig {
        capi_version: version,
        served: match version {
            CapiVersion::V1Beta1 => ServedVersions::V1beta1,
            CapiVersion::V1Beta2 => ServedVersions::V1beta2,
        },
        provider_delay: Duration::from_millis(50),
        jitter: Duration::from_millis(50),
        node_ready_delay: Duration::from_millis(50),
        node_delete_delay: Duration::from_millis(20),
        ..SimClusterConfig::default()
    }
}

/// MachinePool `mp-0`: `seed_of(0)`'s instance type, shape and price, renamed.
fn pool_seed() -> MachineDeploymentSeed {
    MachineDeploymentSeed {
        name: "mp-0".into(),
        ..seed_of(0, 10)
    }
}

fn pool_machines(env: &Env) -> BTreeSet<String> {
    env.list("machines")
        .iter()
        .filter(|m| m["metadata"]["labels"][POOL_NAME_LABEL] == "mp-0")
        .filter(|m| m["metadata"]["deletionTimestamp"].is_null())
        .map(|m| format!("default/{}", m["metadata"]["name"].as_str().unwrap_or("")))
        .collect()
}

fn pool(env: &Env) -> Value {
    env.get("machinepools", "default", "mp-0")
        .expect("the MachinePool")
}

async fn launch_and_release(version: CapiVersion) {
    let env = Env::builder()
        .cluster(cluster(version))
        .seeds(Vec::new())
        .pools(vec![(pool_seed(), true)])
        .start()
        .await;
    let names = env.claims(3, 1).await;
    env.settle().await;

    let claims = env.list("nodeclaims");
    assert_eq!(claims.len(), 3);
    let mut bound = BTreeSet::new();
    for c in &claims {
        let ann = &c["metadata"]["annotations"];
        assert_eq!(
            ann[MACHINE_DEPLOYMENT_ANNOTATION],
            "MachinePool/default/mp-0"
        );
        let machine = ann[MACHINE_ANNOTATION]
            .as_str()
            .expect("claim names its Machine");
        bound.insert(machine.to_string());
        let initialized = c["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|x| x["type"] == "Initialized" && x["status"] == "True")
        });
        assert!(initialized, "{c:#}");
    }
    assert_eq!(
        bound,
        pool_machines(&env),
        "every pool Machine bound to one claim"
    );
    let mp = pool(&env);
    assert_eq!(mp["spec"]["replicas"], 3);
    assert_eq!(
        mp["metadata"]["annotations"][MANAGED_REPLICAS_ANNOTATION],
        "3"
    );
    assert_eq!(
        mp["spec"]["providerIDList"].as_array().map(Vec::len),
        Some(3)
    );

    // Release: only the deleted claim's Machine goes, marked first, then the decrement.
    let victim = names[1].clone();
    let victim_machine = env
        .get("nodeclaims", "", &victim)
        .and_then(|c| {
            c["metadata"]["annotations"][MACHINE_ANNOTATION]
                .as_str()
                .map(String::from)
        })
        .expect("victim's Machine");
    Api::<NodeClaim>::all(env.client().await)
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    env.settle().await;
    let mut expected = bound.clone();
    expected.remove(&victim_machine);
    assert_eq!(
        pool_machines(&env),
        expected,
        "only the deleted claim's Machine went"
    );
    let mp = pool(&env);
    assert_eq!(mp["spec"]["replicas"], 2);
    assert_eq!(
        mp["metadata"]["annotations"][MANAGED_REPLICAS_ANNOTATION],
        "2"
    );
    assert!(env.get("nodeclaims", "", &victim).is_none());
    env.invariants_hold();
}

#[actix::test]
async fn launch_and_release_on_pool_machines_v1beta2() {
    launch_and_release(CapiVersion::V1Beta2).await;
}

#[actix::test]
async fn launch_and_release_on_pool_machines_v1beta1() {
    launch_and_release(CapiVersion::V1Beta1).await;
}

/// A pool whose instances cannot be targeted (no MachinePool Machines) is left out of the
/// catalog with a Warning that says why, and its replicas are never touched: a claim that only
/// it could serve stays unlaunched rather than raise replicas that could only be lowered
/// blindly.
#[actix::test]
async fn a_pool_without_pool_machines_is_never_scaled() {
    let env = Env::builder()
        .cluster(cluster(CapiVersion::V1Beta2))
        .seeds(Vec::new())
        .pools(vec![(pool_seed(), false)])
        // The claim no offering can serve times out (and goes) quickly, so the cluster settles.
        .tune(|s| s.launch_timeout = Duration::from_secs(2))
        .start()
        .await;
    env.claims(1, 1).await;
    env.wait("the catalog's warning about the pool", || {
        env.events("InvalidMachineDeployment")
            .into_iter()
            .find(|e| {
                e["note"].as_str().is_some_and(|n| {
                    n.contains("MachinePool default/mp-0: no MachinePool Machines")
                })
            })
    })
    .await;
    env.settle().await;
    let mp = pool(&env);
    assert_eq!(mp["spec"]["replicas"], 0);
    assert!(mp["metadata"]["annotations"][MANAGED_REPLICAS_ANNOTATION].is_null());
    assert_eq!(env.controller_writes("machinepools"), 0);
    assert!(
        env.list("nodeclaims").is_empty(),
        "the unservable claim timed out"
    );
    env.invariants_hold();
}
