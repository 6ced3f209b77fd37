//! MachinePools on real Cluster API (`simulate --control-plane real --cluster-api real`, the
//! manager's MachinePool controller on with the `MachinePool` gate), the simulator playing only
//! the infrastructure provider's side of the MachinePool contract (`sim::real::pool`) and the
//! kubelets, at v1.14.2 (v1beta2) and v1.10.10 (v1beta1):
//!
//! - a pool WITH MachinePool Machines (`mp-0`): the DevMachinePool reports
//!   `infrastructureMachineKind: DevMachine` and makes one DevMachine per instance; Cluster API
//!   makes a Machine for each and sets its nodeRef; claims bind to those Machines. Deleting a
//!   claim removes exactly its instance: the controller marks the Machine and lowers the
//!   replicas, the provider deletes that Machine (the marked one first, as the contract asks),
//!   Cluster API deletes its Node and its DevMachine, and the instance leaves
//!   `providerIDList`; no other Machine, DevMachine or Node is deleted by anyone;
//! - a pool WITHOUT them (`mp-1`): instances only in `providerIDList`; claims bind to provider
//!   IDs; deleting a claim hands its instance back to the pool (replicas kept), so no instance is
//!   removed at all.
//!
//! Then nothing of the run is left running or listening.

use std::collections::BTreeSet;
use std::time::Duration;

use karpenter_capi::api::wellknown::{
    INSTANCE_ANNOTATION, MACHINE_ANNOTATION, MACHINE_DEPLOYMENT_ANNOTATION, POOL_NAME_LABEL,
};
use karpenter_capi::controlplane::cluster_api::{MANAGER_USER, RELEASE_V1BETA1, RELEASE_V1BETA2};
use karpenter_capi::sim::capi::infra_pool_resource;
use karpenter_capi::sim::cluster::MachineDeploymentSeed;
use karpenter_capi::sim::real::provider::dev_machine_resource;
use karpenter_capi::simulate::launch::seed_of;
use kube::Api;
use kube::api::{DynamicObject, ListParams};
use serde_json::Value;

use crate::assets;
use crate::common::{Env, NS, condition};

pub fn tests() -> Vec<assets::Test> {
    trials![
        @actix claims_launch_on_machine_pools_and_release_exactly_their_instances_on_real_cluster_api
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        @actix claims_launch_on_machine_pools_and_release_exactly_their_instances_on_real_cluster_api_v1beta1
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApiV1beta1],
    ]
}

/// The pool with MachinePool Machines (instance type `sim-0`) and the one without (`sim-1`).
const WITH: &str = "mp-0";
const WITHOUT: &str = "mp-1";
/// Claims per pool.
const PER_POOL: usize = 3;

/// How long the cluster is watched after a release for a second, wrong removal: several of the
/// provider's resyncs and the manager's reconciles.
const STABLE_FOR: Duration = Duration::from_secs(8);

async fn claims_launch_on_machine_pools_and_release_exactly_their_instances_on_real_cluster_api() {
    launch_and_release(&[], RELEASE_V1BETA2).await;
}

async fn claims_launch_on_machine_pools_and_release_exactly_their_instances_on_real_cluster_api_v1beta1()
 {
    launch_and_release(&["--cluster-api-version", "v1beta1"], RELEASE_V1BETA1).await;
}

fn pool_seed(name: &str, i: usize) -> MachineDeploymentSeed {
    MachineDeploymentSeed {
        name: name.into(),
        ..seed_of(i, 10)
    }
}

/// The live Machines of pool `mp` (mirror).
fn pool_machines(env: &Env, mp: &str) -> BTreeSet<String> {
    env.list("machines")
        .iter()
        .filter(|m| m["metadata"]["labels"][POOL_NAME_LABEL] == mp)
        .filter(|m| m["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|m| m["metadata"]["name"].as_str().map(String::from))
        .collect()
}

fn machine_pool(env: &Env, mp: &str) -> Value {
    env.get("machinepools", NS, mp).expect("the MachinePool")
}

fn provider_id_list(v: &Value) -> BTreeSet<String> {
    v["spec"]["providerIDList"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The DevMachines of pool `mp`, read from the API server (the mirror holds no Dev kinds).
async fn dev_machines(env: &Env, mp: &str) -> BTreeSet<String> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(env.client().await, NS, &dev_machine_resource());
    api.list(&ListParams::default().labels(&format!("{POOL_NAME_LABEL}={mp}")))
        .await
        .expect("list DevMachines")
        .items
        .into_iter()
        .filter(|d| d.metadata.deletion_timestamp.is_none())
        .filter_map(|d| d.metadata.name)
        .collect()
}

async fn dev_machine_pool(env: &Env, name: &str) -> DynamicObject {
    Api::<DynamicObject>::namespaced_with(env.client().await, NS, &infra_pool_resource())
        .get(name)
        .await
        .expect("the DevMachinePool")
}

/// Every claim: (name, its pool's record, its Machine or instance).
fn claims(env: &Env) -> Vec<(String, String, Option<String>, Option<String>)> {
    env.list("nodeclaims")
        .iter()
        .map(|c| {
            let ann = &c["metadata"]["annotations"];
            let s = |k: &str| ann[k].as_str().map(String::from);
            (
                c["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                s(MACHINE_DEPLOYMENT_ANNOTATION).unwrap_or_default(),
                s(MACHINE_ANNOTATION),
                s(INSTANCE_ANNOTATION),
            )
        })
        .collect()
}

fn all_initialized(env: &Env, n: usize) -> bool {
    let claims = env.list("nodeclaims");
    claims.len() == n
        && claims.iter().all(|c| {
            c["metadata"]["deletionTimestamp"].is_null()
                && condition(c, "Initialized").is_some_and(|x| x["status"] == "True")
        })
}

/// Names of the objects of `resource` deleted through the API server, by anyone.
fn deleted(env: &Env, resource: &str) -> BTreeSet<String> {
    env.sim
        .cluster()
        .stats()
        .writes_for(resource, "")
        .into_iter()
        .filter(|w| w.verb == "delete")
        .map(|w| w.name)
        .collect()
}

/// Nodes by provider ID (mirror).
fn node_of(env: &Env, pid: &str) -> Option<Value> {
    env.list("nodes")
        .into_iter()
        .find(|n| n["spec"]["providerID"] == pid)
}

async fn launch_and_release(version_args: &[&str], release: &str) {
    use karpenter_capi::cli::SimulateArgs;

    let mut words = vec!["--control-plane", "real", "--cluster-api", "real"];
    words.extend(version_args);
    let args = SimulateArgs::from_words(&words).expect("simulate's arguments");
    let env = Env::builder()
        .cluster(karpenter_capi::simulate::cluster_config(&args))
        .seeds(Vec::new())
        .pools(vec![
            (pool_seed(WITH, 0), true),
            (pool_seed(WITHOUT, 1), false),
        ])
        .short_batches()
        .start()
        .await;
    let cluster = env.sim.cluster().clone();
    super::report_names_real_cluster_api(&cluster, release);

    // Launch: claims alternate between instance types sim-0 (mp-0) and sim-1 (mp-1).
    env.claims(2 * PER_POOL, 2).await;
    env.until("every claim initialized", |e| {
        all_initialized(e, 2 * PER_POOL)
    })
    .await;
    let with_record = format!("MachinePool/{NS}/{WITH}");
    let without_record = format!("MachinePool/{NS}/{WITHOUT}");
    let all = claims(&env);
    let on_with: Vec<_> = all.iter().filter(|c| c.1 == with_record).collect();
    let on_without: Vec<_> = all.iter().filter(|c| c.1 == without_record).collect();
    assert_eq!(
        (on_with.len(), on_without.len()),
        (PER_POOL, PER_POOL),
        "claims per pool: {all:#?}"
    );

    // With MachinePool Machines: one DevMachine per instance, a Machine Cluster API made for
    // each (named after it), each bound to one claim and to its Node.
    let bound: BTreeSet<String> = on_with.iter().filter_map(|c| c.2.clone()).collect();
    let bound_machines: BTreeSet<String> = bound
        .iter()
        .map(|m| m.rsplit('/').next().unwrap_or(m).to_string())
        .collect();
    assert_eq!(bound.len(), PER_POOL, "one Machine per claim: {on_with:#?}");
    env.until("Cluster API set every pool Machine's nodeRef", |e| {
        e.list("machines")
            .iter()
            .filter(|m| m["metadata"]["labels"][POOL_NAME_LABEL] == WITH)
            .all(|m| m.pointer("/status/nodeRef/name").is_some())
    })
    .await;
    assert_eq!(pool_machines(&env, WITH), bound_machines);
    assert_eq!(dev_machines(&env, WITH).await, bound_machines);
    let made_by_manager: BTreeSet<String> = cluster
        .stats()
        .writes_for("machines", "")
        .into_iter()
        .filter(|w| w.verb == "create" && w.agent.starts_with(&format!("{MANAGER_USER} ")))
        .map(|w| w.name)
        .collect();
    assert_eq!(made_by_manager, bound_machines, "Machines Cluster API made");
    let infra = dev_machine_pool(&env, WITH).await;
    assert_eq!(
        infra.data["status"]["infrastructureMachineKind"], "DevMachine",
        "{infra:?}"
    );
    let mp = machine_pool(&env, WITH);
    assert_eq!(mp["spec"]["replicas"], PER_POOL);
    let with_pids = provider_id_list(&mp);
    assert_eq!(with_pids.len(), PER_POOL, "{mp:#}");
    assert_eq!(provider_id_list(&infra.data), with_pids);

    // Without: no Machine, each claim on its own listed instance.
    assert!(pool_machines(&env, WITHOUT).is_empty());
    assert!(dev_machines(&env, WITHOUT).await.is_empty());
    let held: BTreeSet<String> = on_without.iter().filter_map(|c| c.3.clone()).collect();
    let mp1 = machine_pool(&env, WITHOUT);
    let without_pids = provider_id_list(&mp1);
    assert_eq!(
        held.len(),
        PER_POOL,
        "one instance per claim: {on_without:#?}"
    );
    assert_eq!(
        held, without_pids,
        "every listed instance bound to one claim"
    );
    assert_eq!(mp1["spec"]["replicas"], PER_POOL);
    let infra1 = dev_machine_pool(&env, WITHOUT).await;
    assert!(infra1.data["status"]["infrastructureMachineKind"].is_null());
    assert_eq!(infra1.data["status"]["replicas"], PER_POOL);
    assert!(
        deleted(&env, "machines").is_empty(),
        "a Machine deleted at launch"
    );

    // Release one claim of each pool.
    let victim = on_with[1].clone();
    let victim_machine = bound_machines
        .iter()
        .find(|m| victim.2.as_deref().is_some_and(|b| b.ends_with(m.as_str())))
        .cloned()
        .expect("the victim's Machine");
    let victim_pid = env
        .get("machines", NS, &victim_machine)
        .and_then(|m| m["spec"]["providerID"].as_str().map(String::from))
        .expect("the victim's provider ID");
    let victim_node = node_of(&env, &victim_pid)
        .and_then(|n| n["metadata"]["name"].as_str().map(String::from))
        .expect("the victim's Node");
    let handed = on_without[0].clone();
    let handed_pid = handed.3.clone().expect("the instance");
    env.delete_claim(&victim.0).await;
    env.delete_claim(&handed.0).await;

    env.until(
        "the released claims gone and the pool at its new size",
        |e| {
            let names: BTreeSet<String> = claims(e).into_iter().map(|c| c.0).collect();
            !names.contains(&victim.0)
                && !names.contains(&handed.0)
                && !pool_machines(e, WITH).contains(&victim_machine)
                && provider_id_list(&machine_pool(e, WITH)).len() == PER_POOL - 1
                && node_of(e, &victim_pid).is_none()
        },
    )
    .await;
    // Give anyone who would remove a second instance the time to do it.
    tokio::time::sleep(STABLE_FOR).await;

    // Exactly the victim's instance went from the pool with MachinePool Machines.
    let mut expected = bound_machines.clone();
    expected.remove(&victim_machine);
    assert_eq!(
        pool_machines(&env, WITH),
        expected,
        "only the victim's Machine went"
    );
    assert_eq!(
        dev_machines(&env, WITH).await,
        expected,
        "only its DevMachine went"
    );
    let mp = machine_pool(&env, WITH);
    assert_eq!(mp["spec"]["replicas"], PER_POOL - 1);
    let mut pids_left = with_pids.clone();
    pids_left.remove(&victim_pid);
    assert_eq!(
        provider_id_list(&mp),
        pids_left,
        "only its instance left providerIDList"
    );
    let infra = dev_machine_pool(&env, WITH).await;
    assert_eq!(infra.data["status"]["replicas"], PER_POOL - 1);
    assert_eq!(
        deleted(&env, "machines"),
        BTreeSet::from([victim_machine.clone()]),
        "Machines deleted"
    );
    assert_eq!(
        deleted(&env, "devmachines"),
        BTreeSet::from([victim_machine.clone()]),
        "DevMachines deleted"
    );
    assert_eq!(
        deleted(&env, "nodes"),
        BTreeSet::from([victim_node.clone()]),
        "Nodes deleted"
    );

    // The pool without them kept every instance: handed back, its replica kept.
    let mp1 = machine_pool(&env, WITHOUT);
    assert_eq!(mp1["spec"]["replicas"], PER_POOL, "{mp1:#}");
    assert_eq!(provider_id_list(&mp1), without_pids, "no instance removed");
    assert!(
        node_of(&env, &handed_pid).is_some(),
        "the handed-back instance's Node"
    );

    // The other claims are untouched.
    assert!(
        all_initialized(&env, 2 * PER_POOL - 2),
        "{:#?}",
        claims(&env)
    );
    env.assert_clean();
    super::env_stops_leaving_nothing(env);
}
