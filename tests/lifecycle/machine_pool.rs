//! Claims on a MachinePool with MachinePool Machines, end to end in both Cluster API versions:
//! launch binds claims to the pool's Machines through the pool's Scaler, and deleting a claim
//! releases exactly its Machine (delete-machine, then the decrement). On a pool without them,
//! claims bind to new provider IDs (restart-safe), and a deleted claim's instance is handed back,
//! never removed blindly. The pods scenario provisions on pools and on a mix of both kinds.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::{Api, DeleteParams};
use serde_json::Value;

use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::wellknown::*;
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::sim::cluster::{MachineDeploymentSeed, SimClusterConfig};
use karpenter_capi::simulate::launch::seed_of;

use crate::common::Env;
use crate::launch::cluster;

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

/// Claims on a pool without MachinePool Machines, bound by instance: (claim, provider ID).
fn instances(env: &Env) -> Vec<(String, String)> {
    env.list("nodeclaims")
        .iter()
        .filter_map(|c| {
            let pid = c["metadata"]["annotations"][INSTANCE_ANNOTATION].as_str()?;
            Some((c["metadata"]["name"].as_str()?.to_string(), pid.to_string()))
        })
        .collect()
}

fn listed(env: &Env) -> BTreeSet<String> {
    pool(env)["spec"]["providerIDList"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn initialized(c: &Value) -> bool {
    c["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|x| x["type"] == "Initialized" && x["status"] == "True")
    })
}

async fn instance_pool_env() -> Env {
    Env::builder()
        .cluster(cluster(CapiVersion::V1Beta2))
        .seeds(Vec::new())
        .pools(vec![(pool_seed(), false)])
        .start()
        .await
}

/// A pool whose instances cannot be targeted (no MachinePool Machines) is offered for scale-up:
/// each claim binds to a provider ID that newly appeared in `spec.providerIDList`, recorded on
/// the claim, one claim per instance, and launches and initializes on it.
#[actix::test]
async fn a_pool_without_pool_machines_scales_up_and_binds_new_instances() {
    let env = instance_pool_env().await;
    env.claims(3, 1).await;
    env.settle().await;
    let held = instances(&env);
    assert_eq!(held.len(), 3, "{:#?}", env.list("nodeclaims"));
    let pids: BTreeSet<String> = held.iter().map(|(_, p)| p.clone()).collect();
    assert_eq!(
        pids,
        listed(&env),
        "every listed instance bound to one claim"
    );
    for c in env.list("nodeclaims") {
        assert!(initialized(&c), "{c:#}");
        assert_eq!(
            c["status"]["providerID"].as_str(),
            c["metadata"]["annotations"][INSTANCE_ANNOTATION].as_str()
        );
    }
    let mp = pool(&env);
    assert_eq!(mp["spec"]["replicas"], 3);
    assert_eq!(
        mp["metadata"]["annotations"][MANAGED_REPLICAS_ANNOTATION],
        "3"
    );
    env.invariants_hold();
}

/// A controller killed in the middle of a burst on such a pool: the new one neither raises a
/// replica twice (no leak) nor gives one instance to two claims.
#[actix::test]
async fn a_restart_mid_burst_neither_leaks_nor_double_binds_instances() {
    let mut env = instance_pool_env().await;
    env.claims(6, 1).await;
    env.wait("a first instance bound", || {
        (!instances(&env).is_empty()).then_some(())
    })
    .await;
    env.restart().await;
    env.claims(4, 1).await;
    env.settle().await;
    let held = instances(&env);
    let pids: BTreeSet<String> = held.iter().map(|(_, p)| p.clone()).collect();
    assert_eq!(held.len(), 10, "every claim bound");
    assert_eq!(pids.len(), 10, "no instance bound twice: {held:?}");
    assert_eq!(pids, listed(&env));
    let mp = pool(&env);
    assert_eq!(mp["spec"]["replicas"], 10);
    assert_eq!(
        mp["metadata"]["annotations"][MANAGED_REPLICAS_ANNOTATION],
        "10"
    );
    env.invariants_hold();
}

/// Deleting a claim of such a pool never lowers replicas (the cloud would choose which instance
/// goes): its Node is drained, cordoned and cleared of the claim's labels and taints, the
/// instance handed back to the pool, and the claim's condition and an Event say why. The next
/// claim on the pool takes that instance back (capacity already paid for) instead of raising
/// replicas, and its registration lifts the cordon.
#[actix::test]
async fn deleting_a_claim_of_such_a_pool_hands_its_instance_back_for_the_next_claim() {
    let env = instance_pool_env().await;
    let names = env.claims(2, 1).await;
    env.settle().await;
    let victim = names[0].clone();
    let claim = env.get("nodeclaims", "", &victim).expect("the claim");
    let pid = claim["metadata"]["annotations"][INSTANCE_ANNOTATION]
        .as_str()
        .expect("bound")
        .to_string();
    let node = claim["status"]["nodeName"]
        .as_str()
        .expect("a node")
        .to_string();
    Api::<NodeClaim>::all(env.client().await)
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    env.wait("the InstanceNotRemovable event", || {
        env.events("InstanceNotRemovable")
            .into_iter()
            .find(|e| e["note"].as_str().is_some_and(|n| n.contains(&pid)))
    })
    .await;
    env.settle().await;
    assert!(
        env.get("nodeclaims", "", &victim).is_none(),
        "the claim went"
    );
    let mp = pool(&env);
    assert_eq!(mp["spec"]["replicas"], 2, "the replica was kept");
    assert_eq!(
        mp["metadata"]["annotations"][MANAGED_REPLICAS_ANNOTATION],
        "1"
    );
    assert_eq!(
        mp["metadata"]["annotations"][HANDED_BACK_ANNOTATION].as_str(),
        Some(pid.as_str())
    );
    assert!(listed(&env).contains(&pid), "the instance still runs");
    let n = env.get("nodes", "", &node).expect("the Node stays");
    assert_eq!(n["spec"]["unschedulable"], true, "cordoned");
    assert!(
        n["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.iter().all(|x| x != TERMINATION_FINALIZER)),
        "{n:#}"
    );
    for gone in [NODEPOOL_LABEL, REGISTERED_LABEL, INITIALIZED_LABEL] {
        assert!(n["metadata"]["labels"][gone].is_null(), "{gone}: {n:#}");
    }
    assert!(
        !n["metadata"]["labels"][INSTANCE_TYPE_LABEL].is_null(),
        "what describes the instance stays: {n:#}"
    );
    assert_eq!(
        n["metadata"]["annotations"][HANDED_BACK_NODE_ANNOTATION].as_str(),
        Some(victim.as_str())
    );
    assert!(no_karpenter_taint(&n), "{n:#}");
    let handed_back_metric =
        "karpenter_capi_handed_back_instances{machine_deployment=\"MachinePool/default/mp-0\"}";
    env.wait("the handed-back instance reported", || {
        (env.metric(handed_back_metric) == 1.0).then_some(())
    })
    .await;
    assert!(
        env.metric("karpenter_capi_handed_back_instances_price{") > 0.0,
        "priced at the pool's price"
    );
    let report = explain_nodepool(&env);
    assert_eq!(
        report["handed_back"],
        serde_json::json!([{"machine_deployment": "MachinePool/default/mp-0",
                            "instances": [pid.clone()],
                            "price_each": report["offerings"][0]["price"]}]),
        "{report:#}"
    );

    // The next claim takes the handed-back instance: no replica raised.
    let next = env.claims(1, 1).await;
    env.settle().await;
    let held = instances(&env);
    assert_eq!(held.len(), 2);
    assert!(
        held.contains(&(next[0].clone(), pid.clone())),
        "the new claim holds the handed-back instance: {held:?}"
    );
    let mp = pool(&env);
    assert_eq!(mp["spec"]["replicas"], 2, "no replica raised");
    assert_eq!(
        mp["metadata"]["annotations"][MANAGED_REPLICAS_ANNOTATION],
        "2"
    );
    assert!(
        mp["metadata"]["annotations"][HANDED_BACK_ANNOTATION]
            .as_str()
            .is_none_or(str::is_empty),
        "{mp:#}"
    );
    let c = env.get("nodeclaims", "", &next[0]).expect("the new claim");
    assert!(initialized(&c), "{c:#}");
    assert_eq!(c["status"]["nodeName"].as_str(), Some(node.as_str()));
    let n = env.get("nodes", "", &node).expect("the Node");
    assert_ne!(n["spec"]["unschedulable"], true, "the cordon lifted: {n:#}");
    assert!(n["metadata"]["annotations"][HANDED_BACK_NODE_ANNOTATION].is_null());
    assert_eq!(n["metadata"]["labels"][REGISTERED_LABEL], "true");
    env.wait("no handed-back instance reported", || {
        (env.metric(handed_back_metric) == 0.0).then_some(())
    })
    .await;
    env.invariants_hold();
}

/// A pool of four instances, two of them handed back by their deleted claims.
async fn two_handed_back() -> Env {
    let env = instance_pool_env().await;
    let names = env.claims(4, 1).await;
    env.settle().await;
    let api = Api::<NodeClaim>::all(env.client().await);
    for victim in &names[..2] {
        api.delete(victim, &DeleteParams::default()).await.unwrap();
    }
    env.wait("both instances handed back", || {
        let back = pool(&env)["metadata"]["annotations"][HANDED_BACK_ANNOTATION]
            .as_str()
            .map(|v| v.split(',').count());
        (back == Some(2) && instances(&env).len() == 2).then_some(())
    })
    .await;
    env.settle().await;
    env
}

/// Two handed-back instances taken back by two claims, the controller killed as soon as the
/// first take-back bind shows: the new controller finishes both take-backs, counts each instance
/// once (no replica raised, the managed count back to four), and binds no instance twice.
#[actix::test]
async fn a_restart_mid_take_back_counts_each_instance_once() {
    let mut env = two_handed_back().await;
    let before: BTreeSet<String> = listed(&env);
    let next = env.claims(2, 1).await;
    env.wait("a take-back bind shows", || {
        instances(&env)
            .iter()
            .any(|(c, _)| next.contains(c))
            .then_some(())
    })
    .await;
    env.restart().await;
    env.settle().await;
    let held = instances(&env);
    let pids: BTreeSet<String> = held.iter().map(|(_, p)| p.clone()).collect();
    assert_eq!(held.len(), 4, "every live claim bound: {held:?}");
    assert_eq!(pids.len(), 4, "no instance bound twice: {held:?}");
    assert_eq!(listed(&env), before, "no instance added");
    // The new controller's pool write (the managed count, the list struck) may land after the
    // launch path is quiet: wait for it rather than assume it came first (it once had not, on
    // a loaded machine); a wrong count never converges and fails the wait.
    let mp = env
        .wait(
            "the pool counts four instances as ours, none handed back",
            || four_ours_none_handed_back(&env),
        )
        .await;
    assert_eq!(mp["spec"]["replicas"], 4, "no replica raised: {mp:#}");
    env.invariants_hold();
}

/// The pool counts four instances as ours and none handed back (the take-backs written).
fn four_ours_none_handed_back(env: &Env) -> Option<Value> {
    let mp = pool(env);
    let annotations = &mp["metadata"]["annotations"];
    (mp["spec"]["replicas"] == 4
        && annotations[MANAGED_REPLICAS_ANNOTATION] == "4"
        && annotations[HANDED_BACK_ANNOTATION]
            .as_str()
            .is_none_or(str::is_empty))
    .then_some(mp)
}

/// Two take-backs bound on their claims whose pool write never landed (the controller's
/// MachinePool requests failing), then a restart: every claim is bound and initialized, so no
/// claim asks the pool's Scaler for anything, yet the pool still counts both instances as handed
/// back. The claims that hold them start the Scaler, which writes the take-backs (once this
/// test's failure, as a flake of `a_restart_mid_take_back_counts_each_instance_once` in CI:
/// the count stayed wrong for ever).
#[actix::test]
async fn take_backs_bound_but_not_counted_are_counted_after_a_restart() {
    use karpenter_capi::app::USER_AGENT;
    use karpenter_capi::sim::FaultRule;
    let mut env = two_handed_back().await;
    fn faults(env: &Env) -> &karpenter_capi::sim::Faults {
        env.sim.cluster().faults().expect("the simulated server")
    }
    faults(&env).set_agent(Some(USER_AGENT));
    let refused = FaultRule {
        error_rate: 1.0,
        ..FaultRule::default()
    };
    faults(&env).set_rule("machinepools", refused);
    let next = env.claims(2, 1).await;
    env.wait("both take-backs bound on their claims", || {
        let bound = instances(&env)
            .iter()
            .filter(|(c, _)| next.contains(c))
            .count();
        (bound == 2).then_some(())
    })
    .await;
    env.kill();
    faults(&env).clear();
    env.start_with(karpenter_capi::simulate::sim_settings(None))
        .await;
    let mp = env
        .wait(
            "the pool counts four instances as ours, none handed back",
            || four_ours_none_handed_back(&env),
        )
        .await;
    assert_eq!(mp["spec"]["replicas"], 4, "no replica raised: {mp:#}");
    env.invariants_hold();
}

/// `karpenter-capi explain nodepool default -o json` against the env's cluster.
fn explain_nodepool(env: &Env) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
        .args([
            "explain",
            "nodepool",
            "default",
            "-o",
            "json",
            "--kubeconfig",
        ])
        .arg(env.sim.kubeconfig())
        .output()
        .expect("running karpenter-capi explain");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("explain printed JSON")
}

/// No Karpenter taint (unregistered, disrupted) left on a Node.
fn no_karpenter_taint(n: &Value) -> bool {
    n["spec"]["taints"].as_array().is_none_or(|ts| {
        ts.iter()
            .all(|t| t["key"] != UNREGISTERED_TAINT_KEY && t["key"] != DISRUPTED_TAINT_KEY)
    })
}

/// A claim of such a pool deleted before its Node registered: the instance is handed back, and
/// its Node, whenever it joins, never keeps `karpenter.sh/unregistered:NoExecute` (it could never
/// run a pod): cordoned and, once Ready, free for the next claim, which takes it.
#[actix::test]
async fn an_instance_whose_claim_went_before_registration_keeps_no_unregistered_taint() {
    let env = Env::builder()
        .cluster(SimClusterConfig {
            node_ready_delay: Duration::from_secs(3),
            ..cluster(CapiVersion::V1Beta2)
        })
        .seeds(Vec::new())
        .pools(vec![(pool_seed(), false)])
        .start()
        .await;
    let names = env.claims(1, 1).await;
    let pid = env
        .wait("the claim bound to an instance", || {
            instances(&env).into_iter().next().map(|(_, p)| p)
        })
        .await;
    Api::<NodeClaim>::all(env.client().await)
        .delete(&names[0], &DeleteParams::default())
        .await
        .unwrap();
    env.wait("the claim gone", || {
        env.get("nodeclaims", "", &names[0]).is_none().then_some(())
    })
    .await;
    let node = env
        .wait("the instance's Node settled and Ready", || {
            env.list("nodes").into_iter().find(|n| {
                n["spec"]["providerID"] == pid.as_str()
                    && no_karpenter_taint(n)
                    && n["spec"]["unschedulable"] == true
                    && n["status"]["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
            })
        })
        .await;
    assert!(
        node["metadata"]["labels"][NODEPOOL_LABEL].is_null(),
        "{node:#}"
    );
    assert_eq!(
        pool(&env)["metadata"]["annotations"][HANDED_BACK_ANNOTATION].as_str(),
        Some(pid.as_str())
    );

    let next = env.claims(1, 1).await;
    env.settle().await;
    assert_eq!(instances(&env), vec![(next[0].clone(), pid.clone())]);
    assert_eq!(pool(&env)["spec"]["replicas"], 1, "no replica raised");
    let c = env.get("nodeclaims", "", &next[0]).expect("the new claim");
    assert!(initialized(&c), "{c:#}");
    env.invariants_hold();
}

/// The pods scenario (pending pods through the provisioner) on MachinePools only and on a mix
/// with MachineDeployments, in both Cluster API versions: every pod bound, every claim launched,
/// and the invariants (replicas equal live Machines, no leak, one-to-one binding) hold.
#[actix::test]
async fn the_pods_scenario_provisions_on_pools_and_a_mix_in_both_versions() {
    use karpenter_capi::cli::{CapiVersionArg, ScalableArg, Scenario, SimulateArgs};
    for scalable in [ScalableArg::Machinepools, ScalableArg::Mixed] {
        for version in [CapiVersionArg::V1beta2, CapiVersionArg::V1beta1] {
            let a = SimulateArgs {
                pods: 60,
                deployments: 4,
                scalable,
                cluster_api_version: version,
                ..crate::common::scenario(Scenario::Pods)
            };
            let r = karpenter_capi::simulate::pods::run(&a)
                .await
                .expect("the scenario runs");
            let what = format!("{scalable:?} {version:?}: {r}");
            let json: Value = serde_json::from_str(&r.to_json()).expect("JSON report");
            assert_eq!(json["invariants_ok"], true, "{what}");
            assert_eq!(json["pods"]["bound"], 60, "{what}");
            assert_eq!(json["machines"]["leaked"], 0, "{what}");
            assert_eq!(json["machines"]["double_bound"], 0, "{what}");
            assert!(
                json["claims"]["launched"].as_u64().unwrap_or(0) > 0,
                "{what}"
            );
            assert_eq!(
                json["claims"]["launched"], json["claims"]["requested"],
                "{what}"
            );
        }
    }
}
