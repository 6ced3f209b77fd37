//! Node repair (`--feature-gates NodeRepair=true`) on the simulated cluster, on a static pool so
//! the replacement shows as the pool holding its count. By default as Karpenter v1.15 does it:
//! a disruption method within the NodePool's `Unhealthy` budget, the replacement initialized
//! before the unhealthy claim is deleted, `do-not-repair` a veto and `do-not-disrupt` none.
//! With `--legacy-node-repair` as v1.14 did it: deleted at once, whatever the budgets say. In
//! both, more than 20 % of the pool unhealthy, or a Machine a MachineHealthCheck watches over,
//! holds repair back.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::common;
use common::repair::{self, env_repair_legacy_on, env_repair_on};
use common::*;
use karpenter_capi::api::wellknown::{NODEPOOL_LABEL, TERMINATION_TIMESTAMP_ANNOTATION};
use karpenter_capi::sim::cluster::Backend;

async fn env_repair() -> Env {
    env_repair_on(Backend::Simulated).await
}

async fn env_legacy() -> Env {
    env_repair_legacy_on(Backend::Simulated).await
}

/// Upstream's repair: the Node `Ready=False` past its toleration goes, counted and told, and
/// the pool holds its count (on both backends in `tests/control_plane/flows.rs`).
#[actix::test]
async fn an_unhealthy_node_is_replaced_past_its_toleration() {
    let env = env_repair().await;
    repair::an_unhealthy_node_is_replaced_past_its_toleration(&env).await;
    env.assert_clean();
}

#[actix::test]
async fn legacy_repair_replaces_an_unhealthy_node_past_its_toleration() {
    let env = env_legacy().await;
    repair::an_unhealthy_node_is_replaced_past_its_toleration(&env).await;
    env.assert_clean();
}

/// Upstream's guard: two of three Nodes unhealthy is more than 20 % (one, rounded up), so
/// neither is repaired and both say why.
#[actix::test]
async fn with_more_than_a_fifth_of_the_pool_unhealthy_nothing_is_repaired() {
    let env = env_repair().await;
    repair::with_more_than_a_fifth_of_the_pool_unhealthy_nothing_is_repaired(&env).await;
    env.assert_clean();
}

#[actix::test]
async fn legacy_repair_keeps_the_unhealthy_fraction_guard() {
    let env = env_legacy().await;
    repair::with_more_than_a_fifth_of_the_pool_unhealthy_nothing_is_repaired(&env).await;
    env.assert_clean();
}

/// The sickened claim's first `op` write to the server (`create` or `delete`) and when.
fn write_at(env: &Env, verb: &str, claim: &str) -> Option<u64> {
    env.sim
        .cluster()
        .stats()
        .writes()
        .iter()
        .find(|w| w.resource == "nodeclaims" && w.verb == verb && w.name == claim)
        .map(|w| w.at_ms)
}

/// The time of a claim's `Initialized` condition, or of its deletion.
fn time_of(v: &Value) -> Option<jiff::Timestamp> {
    v.as_str().and_then(|t| t.parse().ok())
}

/// v1.15: the replacement is created and Initialized before the unhealthy claim is deleted,
/// and the claim's termination deadline (now: its drain waits for nothing) is stamped when it
/// is deleted, not when repair decided; counted once deleted.
#[actix::test]
async fn a_repair_initializes_its_replacement_before_the_unhealthy_claim_goes() {
    let env = env_repair().await;
    env.static_pool(3, None).await;
    let claims = env.holds(3).await;
    let sick = claims[0].clone();
    let node = env.node_of(&sick);
    env.node_ready(&node, "False").await;
    let deleting = env
        .wait("the unhealthy claim deleting", || {
            env.get("nodeclaims", "", &sick)
                .filter(|c| !c["metadata"]["deletionTimestamp"].is_null())
        })
        .await;
    let deleted_at = time_of(&deleting["metadata"]["deletionTimestamp"]).expect("a deletion time");
    let due = time_of(&deleting["metadata"]["annotations"][TERMINATION_TIMESTAMP_ANNOTATION])
        .expect("a termination deadline on the deleted claim");
    assert!(due <= deleted_at, "the drain waits for nothing");
    let replacement = env
        .list("nodeclaims")
        .into_iter()
        .filter(|c| c["metadata"]["labels"][NODEPOOL_LABEL] == common::static_pools::POOL)
        .find(|c| {
            let name = c["metadata"]["name"].as_str().unwrap_or_default();
            !claims.iter().any(|o| o == name)
        })
        .expect("a replacement claim exists when the unhealthy one is deleted");
    let name = replacement["metadata"]["name"].as_str().expect("a name");
    let initialized = condition(&replacement, "Initialized")
        .filter(|i| i["status"] == "True")
        .and_then(|i| time_of(&i["lastTransitionTime"]))
        .expect("the replacement Initialized when the unhealthy claim is deleted");
    assert!(
        initialized <= deleted_at,
        "{initialized} after {deleted_at}"
    );
    let (created, deleted) = (
        write_at(&env, "create", name),
        write_at(&env, "delete", &sick),
    );
    assert!(
        created.is_some() && created < deleted,
        "{created:?} {deleted:?}"
    );
    env.gone(&sick, &node).await;
    env.holds(3).await;
    assert_eq!(
        env.metric(
            "karpenter_nodeclaims_unhealthy_disrupted_total{condition=\"ready\",nodepool=\"fixed\""
        ),
        1.0
    );
    env.assert_clean();
}

/// v1.15: repair rides the budgets under the `Unhealthy` reason: `nodes: "0"` for it holds the
/// repair (the NodePool says so), and a zero budget for another reason alone does not.
#[actix::test]
async fn a_zero_unhealthy_budget_holds_repair_and_a_drifted_one_does_not() {
    let env = env_repair().await;
    env.static_pool(3, None).await;
    env.patch_static_pool(json!({"spec": {"disruption": {"budgets": [
        {"nodes": "0", "reasons": ["Unhealthy"]}]}}}))
        .await;
    let claims = env.holds(3).await;
    let sick = claims[0].clone();
    env.node_ready(&env.node_of(&sick), "False").await;
    let held = env
        .served_events_about("DisruptionBlocked", "NodePool", 1)
        .await;
    assert!(
        held.iter().any(|e| e["note"]
            .as_str()
            .is_some_and(|n| n.contains("reason Unhealthy"))),
        "{held:#?}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let still = env.get("nodeclaims", "", &sick).expect("the claim");
    assert!(
        still["metadata"]["deletionTimestamp"].is_null(),
        "held by the budget"
    );
    assert_eq!(env.live_static_claims().len(), 3, "no replacement either");
    env.patch_static_pool(json!({"spec": {"disruption": {"budgets": [
        {"nodes": "0", "reasons": ["Drifted"]}]}}}))
        .await;
    env.gone(&sick, &env.node_of(&sick)).await;
    env.holds(3).await;
    env.assert_clean();
}

async fn annotate_node(env: &Env, node: &str, key: &str) {
    let nodes: Api<Node> = Api::all(env.client().await);
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: "true"}}})),
        )
        .await
        .expect("annotate the Node");
}

/// v1.15: `karpenter.sh/do-not-disrupt` on the Node does not hold its repair;
/// `karpenter.sh/do-not-repair: "true"` does, and says so.
#[actix::test]
async fn do_not_repair_holds_a_repair_and_do_not_disrupt_does_not() {
    let env = env_repair().await;
    env.static_pool(3, None).await;
    let claims = env.holds(3).await;
    let (vetoed, protected) = (claims[0].clone(), claims[1].clone());
    let vetoed_node = env.node_of(&vetoed);
    annotate_node(&env, &vetoed_node, "karpenter.sh/do-not-repair").await;
    env.node_ready(&vetoed_node, "False").await;
    let blocked = env
        .served_events_about("NodeRepairBlocked", "NodeClaim", 1)
        .await;
    assert!(
        blocked[0]["note"]
            .as_str()
            .is_some_and(|n| n.contains("karpenter.sh/do-not-repair")),
        "{blocked:#?}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let still = env.get("nodeclaims", "", &vetoed).expect("the claim");
    assert!(still["metadata"]["deletionTimestamp"].is_null(), "vetoed");
    // The vetoed Node healthy again, the do-not-disrupt one goes unhealthy: repaired.
    env.node_ready(&vetoed_node, "True").await;
    let protected_node = env.node_of(&protected);
    annotate_node(&env, &protected_node, "karpenter.sh/do-not-disrupt").await;
    env.node_ready(&protected_node, "False").await;
    env.gone(&protected, &protected_node).await;
    env.holds(3).await;
    env.assert_clean();
}

/// Legacy mode (`--legacy-node-repair`, v1.14): a budget of zero nodes and a
/// `karpenter.sh/do-not-disrupt` Node do not hold a repair back, and no replacement comes
/// first. The claim is stamped with its termination deadline before it is deleted.
#[actix::test]
async fn legacy_repair_ignores_budgets_and_do_not_disrupt() {
    let env = env_legacy().await;
    env.static_pool(3, None).await;
    env.patch_static_pool(json!({"spec": {"disruption": {"budgets": [{"nodes": "0"}]}}}))
        .await;
    let claims = env.holds(3).await;
    let sick = claims[0].clone();
    let node = env.node_of(&sick);
    annotate_node(&env, &node, "karpenter.sh/do-not-disrupt").await;
    env.node_ready(&node, "False").await;
    let stamped = env
        .wait("the claim stamped and deleting", || {
            env.get("nodeclaims", "", &sick).filter(|c| {
                !c["metadata"]["deletionTimestamp"].is_null()
                    && !c["metadata"]["annotations"][TERMINATION_TIMESTAMP_ANNOTATION].is_null()
            })
        })
        .await;
    let due = time_of(&stamped["metadata"]["annotations"][TERMINATION_TIMESTAMP_ANNOTATION])
        .expect("a readable deadline");
    assert!(due <= jiff::Timestamp::now(), "the drain waits for nothing");
    let created_before_delete = env
        .sim
        .cluster()
        .stats()
        .writes()
        .iter()
        .filter(|w| w.resource == "nodeclaims" && w.verb == "create")
        .filter(|w| Some(w.at_ms) < write_at(&env, "delete", &sick))
        .count();
    assert_eq!(
        created_before_delete, 3,
        "deleted at once: no replacement first"
    );
    env.gone(&sick, &node).await;
    env.holds(3).await;
    env.assert_clean();
}

/// A Machine a MachineHealthCheck watches over (here asked to be remediated by the
/// `cluster.x-k8s.io/remediate-machine` annotation) is left to Cluster API's remediation (on both
/// backends in `tests/control_plane/flows.rs`).
#[actix::test]
async fn a_machine_a_health_check_watches_is_left_to_it() {
    let env = env_repair().await;
    repair::a_machine_a_health_check_watches_is_left_to_it(&env).await;
    env.assert_clean();
}

#[actix::test]
async fn legacy_repair_leaves_a_machine_a_health_check_watches_to_it() {
    let env = env_legacy().await;
    repair::a_machine_a_health_check_watches_is_left_to_it(&env).await;
    env.assert_clean();
}

/// A node problem detector's condition, as `--repair-policies` names it by reason
/// (Karpenter's reason-aware repair policies, #3336): `KernelDeadlock=True` for a hung
/// container runtime is due after the tests' toleration and drained within its policy's
/// ten minutes, the Event naming the policy; the same condition with a reason no policy names
/// takes the fallback's hour and stays.
const KERNEL_POLICIES: &str = r#"
policies:
- {conditionType: Ready, conditionStatus: "False", tolerationDuration: 1h}
- {conditionType: KernelDeadlock, conditionStatus: "True", tolerationDuration: 1h}
- conditionType: KernelDeadlock
  conditionStatus: "True"
  reasonRegex: DockerHung|ContainerdHung
  tolerationDuration: 60s
  terminationGracePeriod: 10m
  priority: 50
"#;

/// Node `node` (let go of by the kubelet stand-in) with `KernelDeadlock=True` for `reason`,
/// since `repair::SICK_FOR` ago, beside a `Ready=True`.
async fn kernel_deadlock(env: &Env, node: &str, reason: &str) {
    let now = jiff::Timestamp::now();
    let since = now.checked_sub(repair::SICK_FOR).unwrap_or(now);
    let stamp = |t: jiff::Timestamp| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    env.node_conditions(
        node,
        json!([
            {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "lastHeartbeatTime": stamp(now), "lastTransitionTime": stamp(since)},
            {"type": "KernelDeadlock", "status": "True", "reason": reason,
             "message": "task blocked for more than 120 seconds",
             "lastHeartbeatTime": stamp(now), "lastTransitionTime": stamp(since)},
        ]),
    )
    .await;
}

#[actix::test]
async fn a_reason_policy_repairs_its_condition_and_bounds_the_drain() {
    use karpenter_capi::view::repair::RepairPolicies;
    let policies = RepairPolicies::parse(KERNEL_POLICIES).expect("valid policies");
    let env = repair::env_repair_with(Backend::Simulated, policies, false).await;
    env.static_pool(6, None).await;
    let claims = env.holds(6).await;
    let (hung, other) = (claims[0].clone(), claims[1].clone());
    let (hung_node, other_node) = (env.node_of(&hung), env.node_of(&other));
    kernel_deadlock(&env, &other_node, "KernelOops").await;
    kernel_deadlock(&env, &hung_node, "DockerHung").await;
    let deleting = env
        .wait("the hung node's claim deleting", || {
            env.get("nodeclaims", "", &hung)
                .filter(|c| !c["metadata"]["deletionTimestamp"].is_null())
        })
        .await;
    let deleted_at = time_of(&deleting["metadata"]["deletionTimestamp"]).expect("a deletion time");
    let due = time_of(&deleting["metadata"]["annotations"][TERMINATION_TIMESTAMP_ANNOTATION])
        .expect("a termination deadline on the deleted claim");
    let grace = due.duration_since(deleted_at);
    assert!(
        grace > jiff::SignedDuration::from_mins(9) && grace <= jiff::SignedDuration::from_mins(10),
        "the drain is given the policy's ten minutes, not forced: {grace:?}"
    );
    let told = env.served_events_about("NodeRepair", "Node", 1).await;
    assert!(
        told.iter().all(|e| e["note"]
            .as_str()
            .is_some_and(|n| n.contains("KernelDeadlock=True (DockerHung)")
                && n.contains("(KernelDeadlock=True (reason ~ DockerHung|ContainerdHung))"))),
        "{told:#?}"
    );
    env.gone(&hung, &hung_node).await;
    env.holds(6).await;
    assert_eq!(
        env.metric(
            "karpenter_nodeclaims_unhealthy_disrupted_total{condition=\"kerneldeadlock\",nodepool=\"fixed\""
        ),
        1.0
    );
    let kept = env.get("nodeclaims", "", &other).expect("the other claim");
    assert!(
        kept["metadata"]["deletionTimestamp"].is_null(),
        "an unnamed reason waits for the fallback's hour"
    );
    env.assert_clean();
}

/// Terminate-first repair (`--feature-gates TerminateFirstRepair=true`): a static pool whose
/// `limits.nodes` equals its replicas has no room for a replacement. Without the gate its
/// unhealthy node stays (nothing launched, nothing deleted); with it the node is deleted first,
/// within the `Unhealthy` budget, and the pool's count refills it.
#[actix::test]
async fn a_static_pool_at_its_limit_repairs_terminating_first_with_the_gate() {
    for gate in [false, true] {
        let mut disruption = common::claims::fast_disruption();
        disruption.terminate_first_repair = gate;
        let env = common::Env::builder()
            .settings(karpenter_capi::actors::Settings {
                disruption,
                node_repair: Some(karpenter_capi::view::repair::RepairPolicies::ready(
                    repair::TOLERATION,
                )),
                ..karpenter_capi::simulate::sim_settings(None)
            })
            .start()
            .await;
        env.static_pool(3, Some(json!({"nodes": "3"}))).await;
        let first = env.holds(3).await;
        let sick = first[0].clone();
        let node = env.node_of(&sick);
        env.node_ready(&node, "False").await;
        if !gate {
            // Due three seconds on; several passes go by: no room, so nothing happens.
            tokio::time::sleep(std::time::Duration::from_secs(6)).await;
            assert_eq!(env.claims_created(), 3, "without the gate nothing launches");
            let still = env.get("nodeclaims", "", &sick).expect("the claim");
            assert!(still["metadata"]["deletionTimestamp"].is_null(), "kept");
            env.assert_clean();
            continue;
        }
        let deleting = env
            .wait("the unhealthy claim deleting", || {
                env.get("nodeclaims", "", &sick)
                    .filter(|c| !c["metadata"]["deletionTimestamp"].is_null())
            })
            .await;
        assert_eq!(
            env.claims_created(),
            3,
            "deleted before any replacement was made: {deleting:#}"
        );
        env.gone(&sick, &node).await;
        let now = env.holds(3).await;
        assert!(!now.contains(&sick));
        assert_eq!(env.claims_created(), 4, "one refill");
        assert_eq!(
            env.metric(
                "karpenter_nodeclaims_disrupted_total{reason=\"unhealthy\",nodepool=\"fixed\""
            ),
            1.0
        );
        env.assert_clean();
    }
}
