//! Disruption on MachinePools, end to end in both Cluster API versions: on a pool with
//! MachinePool Machines, consolidation removes exactly the emptied claim's Machine and drift
//! replaces a claim on the pool, as on a MachineDeployment. A pool without them (no instance can
//! be removed by name) is never chosen: its claims stay while a MachineDeployment's claim beside
//! them is consolidated or drifted away. A pool's own template and its infrastructure pool
//! edited in place drift its claims; a pool rolled out by its provider ends up all new.

use crate::common;

use std::collections::BTreeSet;

use serde_json::{Value, json};

use common::*;
use karpenter_capi::api::wellknown::*;
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::sim::capi::{INSTANCE_REFRESH_ANNOTATION, infra_pool_resource};
use karpenter_capi::sim::cluster::MachineDeploymentSeed;
use karpenter_capi::simulate::launch::seed_of;

/// MachinePool `name`: `seed_of(i)`'s instance type, shape and price, renamed.
fn pool_seed(name: &str, i: usize) -> MachineDeploymentSeed {
    MachineDeploymentSeed {
        name: name.into(),
        ..seed_of(i, 10)
    }
}

/// The disruption tests' cluster and settings, with MachineDeployments `seeds` and MachinePools
/// `pools` (with or without MachinePool Machines) in `version`'s shapes.
async fn env_of(
    version: CapiVersion,
    seeds: Vec<MachineDeploymentSeed>,
    pools: Vec<(MachineDeploymentSeed, bool)>,
) -> Env {
    Env::builder()
        .cluster(karpenter_capi::sim::cluster::SimClusterConfig {
            capi_version: version.into(),
            served: match version {
                CapiVersion::V1Beta1 => karpenter_capi::sim::cluster::ServedVersions::V1beta1,
                CapiVersion::V1Beta2 => karpenter_capi::sim::cluster::ServedVersions::V1beta2,
            },
            ..fast_cluster()
        })
        .settings(crate::disruption::fast())
        .seeds(seeds)
        .pools(pools)
        .start()
        .await
}

/// The live Machines of MachinePool `mp`, by `namespace/name`.
fn pool_machines(env: &Env, mp: &str) -> BTreeSet<String> {
    env.list("machines")
        .iter()
        .filter(|m| m["metadata"]["labels"][POOL_NAME_LABEL] == mp)
        .filter(|m| m["metadata"]["deletionTimestamp"].is_null())
        .map(|m| format!("{NS}/{}", m["metadata"]["name"].as_str().unwrap_or("")))
        .collect()
}

fn pool(env: &Env, mp: &str) -> Value {
    env.get("machinepools", NS, mp).expect("the MachinePool")
}

fn claim_annotation(env: &Env, claim: &str, key: &str) -> Option<String> {
    env.get("nodeclaims", "", claim)
        .and_then(|c| c["metadata"]["annotations"][key].as_str().map(String::from))
}

fn eligible(env: &Env, reason: &str) -> f64 {
    env.metric(&format!(
        "karpenter_voluntary_disruption_eligible_nodes{{reason=\"{reason}\"}}"
    ))
}

/// The end of a disruption on pool `mp-0`: one replica left, ours, one claim disrupted for
/// `reason`, and everything clean.
fn one_replica_left(env: &Env, reason: &str) {
    let mp = pool(env, "mp-0");
    assert_eq!(mp["spec"]["replicas"], 1);
    assert_eq!(
        mp["metadata"]["annotations"][MANAGED_REPLICAS_ANNOTATION],
        "1"
    );
    assert_eq!(
        env.metric(&format!(
            "karpenter_nodeclaims_disrupted_total{{reason=\"{reason}\""
        )),
        1.0
    );
    env.assert_clean();
}

/// Waits until `old` is gone and one initialized claim (also passing `check`) replaced it;
/// returns the replacement's name.
async fn replaced(env: &Env, old: &str, check: impl Fn(&Value) -> bool) -> String {
    env.wait("the old claim replaced by an initialized one", || {
        let claims = env.list("nodeclaims");
        let [c] = claims.as_slice() else {
            return None;
        };
        let name = c["metadata"]["name"].as_str()?;
        (name != old
            && check(c)
            && condition(c, "Initialized").is_some_and(|x| x["status"] == "True"))
        .then(|| name.to_string())
    })
    .await
}

/// Two claims on a pool with MachinePool Machines, one running a pod: consolidation removes
/// the empty one, its Machine marked and the replica lowered, and keeps the other.
async fn consolidation_on_pool_machines(version: CapiVersion) {
    let env = env_of(version, Vec::new(), vec![(pool_seed("mp-0", 0), true)]).await;
    let (busy, node) = env.stamped_claim("sim-0").await;
    let (idle, _) = env.stamped_claim("sim-0").await;
    env.pod("app", &node, json!({"app": "app"}), json!({}))
        .await;
    let busy_machine = claim_annotation(&env, &busy, MACHINE_ANNOTATION).expect("bound");
    assert_eq!(
        claim_annotation(&env, &idle, MACHINE_DEPLOYMENT_ANNOTATION).as_deref(),
        Some("MachinePool/default/mp-0")
    );
    assert_eq!(pool_machines(&env, "mp-0").len(), 2);

    env.set_disruption(json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s"}))
        .await;
    env.until_quiet("the empty claim consolidated and its Machine gone", |e| {
        e.get("nodeclaims", "", &idle).is_none()
            && pool_machines(e, "mp-0") == BTreeSet::from([busy_machine.clone()])
    })
    .await;
    env.settle().await;
    assert!(
        env.get("nodeclaims", "", &busy).is_some(),
        "the busy claim stays"
    );
    one_replica_left(&env, "empty");
}

#[actix::test]
async fn consolidation_removes_the_emptied_pool_machine_v1beta2() {
    consolidation_on_pool_machines(CapiVersion::V1Beta2).await;
}

#[actix::test]
async fn consolidation_removes_the_emptied_pool_machine_v1beta1() {
    consolidation_on_pool_machines(CapiVersion::V1Beta1).await;
}

/// A claim on a pool with MachinePool Machines, running a pod, drifts (NodePool template): a
/// replacement launches on a new Machine of the pool, the pod moves, and the old claim's Machine
/// goes with its replica.
async fn drift_on_pool_machines(version: CapiVersion) {
    let env = env_of(version, Vec::new(), vec![(pool_seed("mp-0", 0), true)]).await;
    let (old, node) = env.stamped_claim("sim-0").await;
    env.pod("app", &node, json!({"app": "app"}), json!({}))
        .await;
    let old_machine = claim_annotation(&env, &old, MACHINE_ANNOTATION).expect("bound");
    env.change_the_template().await;
    let replacement = replaced(&env, &old, |c| c["metadata"]["labels"]["team"] == "blue").await;
    env.settle().await;
    let new_machine = claim_annotation(&env, &replacement, MACHINE_ANNOTATION).expect("bound");
    assert_ne!(new_machine, old_machine);
    assert_eq!(
        pool_machines(&env, "mp-0"),
        BTreeSet::from([new_machine]),
        "the drifted claim's Machine went, the replacement's stays"
    );
    one_replica_left(&env, "drifted");
}

#[actix::test]
async fn a_drifted_claim_on_a_pool_is_replaced_on_the_pool_v1beta2() {
    drift_on_pool_machines(CapiVersion::V1Beta2).await;
}

#[actix::test]
async fn a_drifted_claim_on_a_pool_is_replaced_on_the_pool_v1beta1() {
    drift_on_pool_machines(CapiVersion::V1Beta1).await;
}

/// MachineDeployment `md-0` (sim-0) beside MachinePool `mp-1` (sim-1) without MachinePool
/// Machines: one claim on the MachineDeployment, two on the pool.
async fn beside_an_instance_pool() -> (Env, String, Vec<String>) {
    let env = env_of(
        CapiVersion::V1Beta2,
        vec![seed_of(0, 10)],
        vec![(pool_seed("mp-1", 1), false)],
    )
    .await;
    let (control, _) = env.stamped_claim("sim-0").await;
    let mut on_pool = Vec::new();
    for _ in 0..2 {
        let (c, _) = env.stamped_claim("sim-1").await;
        assert!(claim_annotation(&env, &c, INSTANCE_ANNOTATION).is_some());
        on_pool.push(c);
    }
    (env, control, on_pool)
}

/// The pool's claims are all still there, undisrupted, their instances kept.
fn untouched(env: &Env, on_pool: &[String]) {
    for c in on_pool {
        let claim = env
            .get("nodeclaims", "", c)
            .expect("the pool's claim stays");
        assert!(
            claim["metadata"]["deletionTimestamp"].is_null(),
            "{claim:#}"
        );
        for ty in ["Drifted", "Consolidatable"] {
            assert!(
                condition(&claim, ty).is_none_or(|x| x["status"] != "True"),
                "{ty} on {claim:#}"
            );
        }
    }
    let mp = pool(env, "mp-1");
    assert_eq!(mp["spec"]["replicas"], 2);
    assert_eq!(
        mp["metadata"]["annotations"][MANAGED_REPLICAS_ANNOTATION],
        "2"
    );
    assert!(mp["metadata"]["annotations"][HANDED_BACK_ANNOTATION].is_null());
}

/// Waits until the MachineDeployment's `control` claim was disrupted for `reason` and no
/// candidate for it is left, then checks the pool's claims were left alone.
async fn only_the_control_goes(env: &Env, control: &str, on_pool: &[String], reason: &str) {
    env.until_quiet(
        &format!("the MachineDeployment's claim disrupted ({reason}), nothing else eligible"),
        |e| e.get("nodeclaims", "", control).is_none() && eligible(e, reason) == 0.0,
    )
    .await;
    env.settle().await;
    untouched(env, on_pool);
    assert_eq!(
        env.metric(&format!(
            "karpenter_nodeclaims_disrupted_total{{reason=\"{reason}\""
        )),
        1.0
    );
    env.assert_clean();
}

/// Empty nodes on both: emptiness takes every empty candidate it may in one command (a budget
/// of 100 %), so the pool's would go with the MachineDeployment's if they were candidates.
#[actix::test]
async fn a_pool_without_pool_machines_is_never_consolidated() {
    let (env, control, on_pool) = beside_an_instance_pool().await;
    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s",
                              "budgets": [{"nodes": "100%"}]}),
    )
    .await;
    only_the_control_goes(&env, &control, &on_pool, "empty").await;
}

/// A NodePool template change drifts every claim stamped with the old hash: the
/// MachineDeployment's is replaced, the pool's are not even marked drifted.
#[actix::test]
async fn a_pool_without_pool_machines_is_never_drifted() {
    let (env, control, on_pool) = beside_an_instance_pool().await;
    let node = env
        .get("nodeclaims", "", &control)
        .and_then(|c| c["status"]["nodeName"].as_str().map(String::from))
        .expect("the control's node");
    env.pod("app", &node, json!({"app": "app"}), json!({}))
        .await;
    env.set_disruption(json!({"budgets": [{"nodes": "100%"}]}))
        .await;
    env.change_the_template().await;
    only_the_control_goes(&env, &control, &on_pool, "drifted").await;
}

/// What a pool template drift test edits: the MachinePool or its infrastructure pool (a merge
/// patch each).
enum Edit {
    Pool(Value),
    InfraPool(Value),
}

/// A change of the pool's own template or of its infrastructure pool in place: its Machines
/// stay `UpToDate` (Cluster API sets that on every pool Machine), yet the claim bound under the
/// old template drifts and is replaced on the pool, as on a MachineDeployment under OnDelete.
/// The provider's instance refresh is off (as an AWS pool's may be), so the controller's drift
/// is the only thing that replaces the instance; `recorded` is the claim annotation that
/// changes.
async fn pool_template_drift(version: CapiVersion, edit: Edit, recorded: &str) {
    let env = env_of(version, Vec::new(), vec![(pool_seed("mp-0", 0), true)]).await;
    let infra_pools: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(env.client().await, NS, &infra_pool_resource());
    let params = kube::api::PatchParams::default();
    infra_pools
        .patch(
            "mp-0",
            &params,
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {INSTANCE_REFRESH_ANNOTATION: "false"}}}),
            ),
        )
        .await
        .expect("instance refresh off");
    let (old, node) = env.stamped_claim("sim-0").await;
    env.pod("app", &node, json!({"app": "app"}), json!({}))
        .await;
    let old_machine = claim_annotation(&env, &old, MACHINE_ANNOTATION).expect("bound");
    let bound_under = claim_annotation(&env, &old, recorded).expect("template recorded");
    env.set_disruption(json!({"budgets": [{"nodes": "100%"}]}))
        .await;
    let pools: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(env.client().await, NS, &version.machine_pool());
    let (api, patch) = match edit {
        Edit::Pool(patch) => (&pools, patch),
        Edit::InfraPool(patch) => (&infra_pools, patch),
    };
    api.patch("mp-0", &params, &kube::api::Patch::Merge(patch))
        .await
        .expect("change the pool's template");
    env.wait("Drifted=True on the old claim", || {
        let c = env.get("nodeclaims", "", &old)?;
        (condition(&c, "Drifted")?["reason"] == "MachineTemplateDrifted").then_some(())
    })
    .await;
    let replacement = replaced(&env, &old, |_| true).await;
    env.settle().await;
    let new_machine = claim_annotation(&env, &replacement, MACHINE_ANNOTATION).expect("bound");
    assert_ne!(new_machine, old_machine);
    assert_eq!(pool_machines(&env, "mp-0"), BTreeSet::from([new_machine]));
    let now = claim_annotation(&env, &replacement, recorded);
    assert!(
        now.is_some_and(|h| h != bound_under),
        "bound under the new template"
    );
    one_replica_left(&env, "drifted");
}

#[actix::test]
async fn a_pool_version_change_drifts_its_claims_v1beta2() {
    pool_template_drift(
        CapiVersion::V1Beta2,
        Edit::Pool(json!({"spec": {"template": {"spec": {"version": "v1.34.0"}}}})),
        POOL_TEMPLATE_HASH_ANNOTATION,
    )
    .await;
}

#[actix::test]
async fn a_pool_bootstrap_change_drifts_its_claims_v1beta1() {
    pool_template_drift(
        CapiVersion::V1Beta1,
        Edit::Pool(
            json!({"spec": {"template": {"spec": {"bootstrap": {"configRef": {"name": "mp-0-v2"}}}}}}),
        ),
        POOL_TEMPLATE_HASH_ANNOTATION,
    )
    .await;
}

/// The infrastructure pool's instance template edited in place (as an AWSMachinePool's launch
/// template is): the MachinePool itself does not change.
fn infra_pool_edit() -> Edit {
    Edit::InfraPool(json!({"spec": {"template": {"backend": {"inMemory": {
        "vm": {"provisioning": {"startupDuration": "2s"}}
    }}}}}))
}

#[actix::test]
async fn an_infrastructure_pool_edit_drifts_its_claims_v1beta2() {
    pool_template_drift(
        CapiVersion::V1Beta2,
        infra_pool_edit(),
        INFRA_POOL_HASH_ANNOTATION,
    )
    .await;
}

#[actix::test]
async fn an_infrastructure_pool_edit_drifts_its_claims_v1beta1() {
    pool_template_drift(
        CapiVersion::V1Beta1,
        infra_pool_edit(),
        INFRA_POOL_HASH_ANNOTATION,
    )
    .await;
}

/// A pool rollout with the provider's instance refresh on (as Cluster API's Docker pool does
/// it): the provider replaces the outdated instances while the controller drifts their claims.
/// Whichever gets to an instance first, at the end every pool Machine runs the new version, no
/// claim of the old ones is left, and nothing leaked or was bound twice.
async fn pool_rollout(version: CapiVersion) {
    let env = env_of(version, Vec::new(), vec![(pool_seed("mp-0", 0), true)]).await;
    let mut originals = BTreeSet::new();
    for _ in 0..3 {
        let (claim, node) = env.stamped_claim("sim-0").await;
        env.pod(
            &format!("app-{claim}"),
            &node,
            json!({"app": "app"}),
            json!({}),
        )
        .await;
        originals.insert(claim);
    }
    env.set_disruption(json!({"budgets": [{"nodes": "100%"}]}))
        .await;
    let pools: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(env.client().await, NS, &version.machine_pool());
    pools
        .patch(
            "mp-0",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"spec": {"template": {"spec": {"version": "v1.34.0"}}}}),
            ),
        )
        .await
        .expect("roll the pool out");
    env.until_quiet("every pool Machine up to date, no old claim left", |e| {
        let machines: Vec<Value> = e
            .list("machines")
            .into_iter()
            .filter(|m| m["metadata"]["labels"][POOL_NAME_LABEL] == "mp-0")
            .collect();
        machines.iter().all(|m| m["spec"]["version"] == "v1.34.0")
            && originals
                .iter()
                .all(|c| e.get("nodeclaims", "", c).is_none())
    })
    .await;
    env.settle().await;
    for c in env.list("nodeclaims") {
        let machine = c["metadata"]["annotations"][MACHINE_ANNOTATION]
            .as_str()
            .expect("bound");
        let m = env
            .get("machines", NS, machine.rsplit('/').next().unwrap_or(""))
            .expect("its Machine");
        assert_eq!(m["spec"]["version"], "v1.34.0", "{machine}");
    }
    env.assert_clean();
}

#[actix::test]
async fn a_pool_rollout_replaces_every_instance_v1beta2() {
    pool_rollout(CapiVersion::V1Beta2).await;
}

#[actix::test]
async fn a_pool_rollout_replaces_every_instance_v1beta1() {
    pool_rollout(CapiVersion::V1Beta1).await;
}
