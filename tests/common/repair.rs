//! Node repair's whole flows, written once for both backends: on a static pool, so the
//! replacement shows as the pool holding its count. Events are read through the API server
//! (the real backend's mirror keeps none).

use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use karpenter_capi::actors::Settings;
use karpenter_capi::sim::cluster::Backend;
use karpenter_capi::simulate::sim_settings;
use karpenter_capi::view::repair::RepairPolicies;

use super::claims::fast_disruption;
use super::{Env, eventually};

/// Node repair's toleration in tests (`--feature-gates NodeRepair=true` fills in upstream's 30
/// minutes): longer than any new Node stays `Ready=False` while it registers, even under load,
/// so only the Nodes a test sickens are ever due.
pub const TOLERATION: Duration = Duration::from_secs(60);
/// How long ago `Env::node_ready` dates the change: three seconds short of the toleration, so
/// a sickened Node's repair falls due three seconds later, time enough for a test to sicken
/// its other Nodes before the first is due, even under load.
pub const SICK_FOR: Duration = Duration::from_secs(57);

/// Node repair on with `TOLERATION`, disruption passes at test speed, on `backend`: repair as
/// a budgeted disruption method (Karpenter v1.15).
pub async fn env_repair_on(backend: Backend) -> Env {
    env_repair_mode(backend, false).await
}

/// The same with `--legacy-node-repair`: repair as Karpenter v1.14 did it.
pub async fn env_repair_legacy_on(backend: Backend) -> Env {
    env_repair_mode(backend, true).await
}

async fn env_repair_mode(backend: Backend, legacy_node_repair: bool) -> Env {
    env_repair_with(
        backend,
        RepairPolicies::ready(TOLERATION),
        legacy_node_repair,
    )
    .await
}

/// Node repair on with `policies` (`--repair-policies`), disruption passes at test speed.
pub async fn env_repair_with(
    backend: Backend,
    policies: RepairPolicies,
    legacy_node_repair: bool,
) -> Env {
    Env::builder()
        .backend(backend)
        .settings(Settings {
            disruption: fast_disruption(),
            node_repair: Some(policies),
            legacy_node_repair,
            ..sim_settings(None)
        })
        .start()
        .await
}

impl Env {
    /// Waits for Events of `reason` about `kind` objects until `enough` of them are there.
    pub async fn served_events_about(&self, reason: &str, kind: &str, enough: usize) -> Vec<Value> {
        eventually(&format!("{enough} {reason} Events on {kind}s"), || async {
            let mut e = self.served_events(reason).await;
            e.retain(|e| e["regarding"]["kind"] == kind);
            (e.len() >= enough).then_some(e)
        })
        .await
    }
}

/// Upstream's repair: the Node `Ready=False` past its toleration goes, counted and told, and the
/// static pool holds its count (v1.15: the replacement first; legacy: at once, then replaced).
pub async fn an_unhealthy_node_is_replaced_past_its_toleration(env: &Env) {
    env.static_pool(3, None).await;
    let claims = env.holds(3).await;
    let sick = claims[0].clone();
    let node = env.node_of(&sick);
    env.node_ready(&node, "False").await;
    env.gone(&sick, &node).await;
    let now = env.holds(3).await;
    assert!(!now.contains(&sick));
    let told = env.served_events_about("NodeRepair", "Node", 1).await;
    assert!(
        told.iter().all(|e| e["note"]
            .as_str()
            .is_some_and(|n| n.contains("Ready=False"))),
        "{told:#?}"
    );
    assert_eq!(
        env.metric(
            "karpenter_nodeclaims_unhealthy_disrupted_total{condition=\"ready\",nodepool=\"fixed\""
        ),
        1.0
    );
    assert_eq!(
        env.metric("karpenter_nodeclaims_disrupted_total{reason=\"unhealthy\",nodepool=\"fixed\""),
        1.0
    );
}

/// Upstream's guard: two of three Nodes unhealthy is more than 20 % (one, rounded up), so
/// neither is repaired and both say why.
pub async fn with_more_than_a_fifth_of_the_pool_unhealthy_nothing_is_repaired(env: &Env) {
    env.static_pool(3, None).await;
    let claims = env.holds(3).await;
    for c in &claims[..2] {
        env.node_ready(&env.node_of(c), "Unknown").await;
    }
    // Each look tells both; Events of one object and reason are counted as one.
    let blocked = env
        .served_events_about("NodeRepairBlocked", "NodeClaim", 2)
        .await;
    assert!(
        blocked.iter().all(|e| e["note"].as_str().is_some_and(
            |n| n.contains("more than 20% nodes are unhealthy in the nodepool (2 of 3)")
        )),
        "{blocked:#?}"
    );
    // And the NodePool is told, as upstream tells it.
    let pool = env
        .served_events_about("NodeRepairBlocked", "NodePool", 1)
        .await;
    assert!(
        pool.iter()
            .all(|e| e["regarding"]["name"] == super::static_pools::POOL
                && e["note"].as_str().is_some_and(
                    |n| n.contains("more than 20% nodes are unhealthy in the nodepool")
                )),
        "{pool:#?}"
    );
    assert_eq!(env.live_static_claims().len(), 3, "nothing repaired");
    assert_eq!(
        env.metric("karpenter_capi_nodes_repair_blocked{nodepool=\"fixed\"}"),
        2.0
    );
}

/// A Machine a MachineHealthCheck watches over (here asked to be remediated by the
/// `cluster.x-k8s.io/remediate-machine` annotation) is left to Cluster API's remediation.
pub async fn a_machine_a_health_check_watches_is_left_to_it(env: &Env) {
    env.static_pool(1, None).await;
    let claims = env.holds(1).await;
    let machine = env
        .get("nodeclaims", "", &claims[0])
        .and_then(|c| {
            c["metadata"]["annotations"]["cluster.x-k8s.io/machine"]
                .as_str()
                .map(String::from)
        })
        .expect("the claim's Machine");
    let (ns, name) = machine.split_once('/').expect("ns/name");
    let machines: Api<DynamicObject> = Api::namespaced_with(
        env.client().await,
        ns,
        &env.sim.cluster().capi_version().machine(),
    );
    machines
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "cluster.x-k8s.io/remediate-machine": ""}}})),
        )
        .await
        .expect("ask for remediation");
    env.node_ready(&env.node_of(&claims[0]), "False").await;
    let blocked = env
        .served_events_about("NodeRepairBlocked", "NodeClaim", 1)
        .await;
    assert!(
        blocked[0]["note"]
            .as_str()
            .is_some_and(|n| n.contains("MachineHealthCheck watches over Machine")),
        "{blocked:#?}"
    );
    assert_eq!(
        env.live_static_claims().len(),
        1,
        "left to the MachineHealthCheck"
    );
}
