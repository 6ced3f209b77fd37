//! Disruption end to end against the simulated cluster: emptiness within budgets, nodes that
//! do-not-disrupt and PodDisruptionBudgets protect, drift replaced before it goes, cheaper
//! replacement, a failed replacement rolled back, and a controller killed mid-command whose marks
//! the next one rolls back (expiry and Cluster API rollouts run on both backends, in the
//! control_plane test binary). Each test ends with the controller's invariants
//! (`simulate::invariants`) and no drain rule broken.

use crate::common;

use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use common::claims::fast_disruption;
use common::*;
use karpenter_capi::actors::Settings;
use karpenter_capi::api::drift_hash::nodepool_hash;
use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::*;
use karpenter_capi::simulate::launch::{claim_for, seed_of, settle};
use karpenter_capi::simulate::sim_settings;

/// Disruption at test speed: passes every 200 ms, validation 300 ms.
pub(crate) fn fast() -> Settings {
    Settings {
        disruption: fast_disruption(),
        ..sim_settings(None)
    }
}

async fn env_fast() -> Env {
    env_with(fast()).await
}

impl Env {
    /// A claim running one pod, then a NodePool template change that drifts it.
    async fn drifting_claim_with_a_pod(&self) -> (String, String) {
        let (claim, node) = self.stamped_claim("sim-0").await;
        self.pod("app", &node, json!({"app": "app"}), json!({}))
            .await;
        self.change_the_template().await;
        (claim, node)
    }

    /// A NodePool template change: every claim stamped with the old hash drifts.
    pub(crate) async fn change_the_template(&self) {
        let api: Api<NodePool> = Api::all(self.client().await);
        api.patch(
            &self.pool.name_any(),
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"template": {"metadata": {"labels": {"team": "blue"}}}}}),
            ),
        )
        .await
        .expect("change the template");
    }

    /// Sample how many claims are being deleted at once until none is left; the most seen.
    async fn most_deleting_until_no_claims(&self) -> usize {
        let start = Instant::now();
        let mut most = 0;
        while !self.claim_objects().is_empty() {
            let deleting = self
                .claim_objects()
                .iter()
                .filter(|c| !c["metadata"]["deletionTimestamp"].is_null())
                .count();
            most = most.max(deleting);
            assert!(
                start.elapsed() < DEADLINE,
                "the claims were not all disrupted"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        most
    }

    fn claim_objects(&self) -> Vec<Value> {
        self.list("nodeclaims")
    }

    /// MachineDeployment `md-1` (`sim-1`, 0.21/h against `sim-0`'s 0.20/h, same shape), once
    /// the catalog offers it.
    pub(crate) async fn offer_pricier_sim_1(&self) {
        self.sim
            .run(|c| async move {
                c.create_machine_deployment_from(&seed_of(1, 10))
                    .await
                    .expect("a pricier MachineDeployment");
            })
            .await
            .expect("seeding");
        self.wait("the catalog offering sim-1", || {
            self.controller
                .as_ref()
                .and_then(|c| c.shared.catalog.offering("default/md-1"))
                .map(|_| ())
        })
        .await;
    }
}

fn tainted(node: &Value) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|ts| ts.iter().any(|t| t["key"] == DISRUPTED_TAINT_KEY))
}

#[actix::test]
async fn empty_nodes_go_one_at_a_time_under_a_budget_of_one() {
    let env = env_fast().await;
    for _ in 0..3 {
        env.stamped_claim("sim-0").await;
    }
    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s",
                              "budgets": [{"nodes": "1"}]}),
    )
    .await;
    let most = env.most_deleting_until_no_claims().await;
    assert_eq!(most, 1, "the budget allows one node at a time");
    settle(&env.sim, DEADLINE).await.expect("settles");
    assert_eq!(
        env.metric("karpenter_nodeclaims_disrupted_total{reason=\"empty\""),
        3.0
    );
    assert!(!env.events("DisruptionTerminating").is_empty());
    env.assert_clean();
}

#[actix::test]
async fn do_not_disrupt_and_a_blocking_pdb_protect_their_nodes() {
    let env = env_fast().await;
    let (kept_claim, kept_node) = env.stamped_claim("sim-0").await;
    let (pdb_claim, pdb_node) = env.stamped_claim("sim-0").await;
    let (empty_claim, _) = env.stamped_claim("sim-0").await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client().await);
    nodes
        .patch(
            &kept_node,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "true"}}}),
            ),
        )
        .await
        .expect("annotate the node");
    env.pod("guarded", &pdb_node, json!({"app": "guarded"}), json!({}))
        .await;
    env.pdb("guarded", "guarded", 0).await;
    env.set_disruption(json!({"consolidationPolicy": "WhenEmptyOrUnderutilized",
                              "consolidateAfter": "0s", "budgets": [{"nodes": "100%"}]}))
        .await;
    env.wait("the unprotected empty node consolidated", || {
        env.get("nodeclaims", "", &empty_claim)
            .is_none()
            .then_some(())
    })
    .await;
    // Several passes later the protected two are still there, and say why.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(env.get("nodeclaims", "", &kept_claim).is_some());
    assert!(env.get("nodeclaims", "", &pdb_claim).is_some());
    let blocked: Vec<String> = env
        .events("DisruptionBlocked")
        .iter()
        .filter_map(|e| e["note"].as_str().map(String::from))
        .collect();
    assert!(
        blocked
            .iter()
            .any(|n| n.contains(&kept_claim) && n.contains(DO_NOT_DISRUPT_ANNOTATION)),
        "{blocked:#?}"
    );
    assert!(
        blocked
            .iter()
            .any(|n| n.contains(&pdb_claim) && n.contains("PodDisruptionBudget")),
        "{blocked:#?}"
    );
    // Lift the budget: the pod's node may now go (its pod fits on the other node). The pod has
    // no controller, so only an integer minAvailable can allow its disruption.
    env.pdb_min_available("guarded", "guarded", 0).await;
    env.wait("the formerly guarded node consolidated", || {
        env.get("nodeclaims", "", &pdb_claim)
            .is_none()
            .then_some(())
    })
    .await;
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

#[actix::test]
async fn a_drifted_claim_is_replaced_before_it_goes() {
    let env = env_fast().await;
    let (old, _) = env.drifting_claim_with_a_pod().await;
    env.wait("Drifted=True on the old claim", || {
        let c = env.get("nodeclaims", "", &old)?;
        (condition(&c, "Drifted")?["reason"] == "NodePoolDrifted").then_some(())
    })
    .await;
    env.wait("the old claim replaced and gone", || {
        let claims = env.claim_objects();
        (env.get("nodeclaims", "", &old).is_none()
            && claims.len() == 1
            && claims[0]["metadata"]["labels"]["team"] == "blue"
            && condition(&claims[0], "Initialized").is_some_and(|c| c["status"] == "True"))
        .then_some(())
    })
    .await;
    settle(&env.sim, DEADLINE).await.expect("settles");
    assert_eq!(
        env.metric("karpenter_nodeclaims_disrupted_total{reason=\"drifted\""),
        1.0
    );
    // Drift is no consolidation: no policy (Karpenter v1.15's label left empty, as upstream's
    // queue leaves it), and the drifted node's one pod counted.
    let drift = ["reason=\"drifted\"", "consolidation_policy=\"\""];
    assert_eq!(
        series_sum(&env, "karpenter_nodeclaims_disrupted_total", &drift),
        1.0
    );
    assert_eq!(
        series_sum(&env, "karpenter_pods_disruption_initiated_total", &drift),
        1.0
    );
    assert_eq!(
        env.metric(
            "karpenter_voluntary_disruption_decisions_total{decision=\"replace\",reason=\"drifted\""
        ),
        1.0
    );
    env.assert_clean();
}

#[actix::test]
async fn an_underutilized_node_is_replaced_by_a_cheaper_one() {
    let env = env_fast().await;
    env.offer_pricier_sim_1().await;
    // sim-1 costs 0.21/h, sim-0 0.20/h, same shape: moving the pod saves money.
    let mut claim = claim_for(&env.pool, "sim-1");
    claim.spec.expire_after = None;
    let (pricey, node) = env.create_and_wait(claim).await;
    env.pod("app", &node, json!({"app": "app"}), json!({}))
        .await;
    // The pod's scheduling is a pod event: the claim records it (Karpenter's lastPodEventTime).
    env.wait("the claim's lastPodEventTime", || {
        env.get("nodeclaims", "", &pricey)
            .filter(|c| c["status"]["lastPodEventTime"].is_string())
    })
    .await;
    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s"}),
    )
    .await;
    env.wait("the pricey claim replaced by a cheaper one", || {
        let claims = env.claim_objects();
        (env.get("nodeclaims", "", &pricey).is_none()
            && claims.len() == 1
            && claims[0]["metadata"]["labels"][INSTANCE_TYPE_LABEL] == "sim-0")
            .then_some(())
    })
    .await;
    settle(&env.sim, DEADLINE).await.expect("settles");
    assert_eq!(
        env.metric("karpenter_voluntary_disruption_decisions_total{decision=\"replace\",reason=\"underutilized\",consolidation_type=\"single\""),
        1.0
    );
    // Upstream's names and label sets, so its dashboards and alerts read these series.
    assert_eq!(
        env.metric("karpenter_voluntary_disruption_decisions_by_nodepool_total{nodepool=\"default\",decision=\"replace\",reason=\"underutilized\",consolidation_type=\"single\"}"),
        1.0
    );
    assert!(
        env.metric("karpenter_voluntary_disruption_decision_evaluation_duration_seconds_count{reason=\"underutilized\",consolidation_type=\"single\"}") >= 1.0
    );
    let text = env.metrics.encode();
    for series in [
        "karpenter_nodepools_allowed_disruptions{nodepool=\"default\",reason=\"Underutilized\"}",
        "karpenter_nodepools_allowed_disruptions{nodepool=\"default\",reason=\"Empty\"}",
        "karpenter_nodepools_nodes_consuming_budgets{nodepool=\"default\",reason=\"Drifted\"}",
        "karpenter_voluntary_disruption_consolidation_timeouts_total{consolidation_type=\"multi\"} 0",
        "karpenter_voluntary_disruption_consolidation_timeouts_total{consolidation_type=\"single\"} 0",
        "karpenter_nodeclaims_terminated_total{nodepool=\"default\",capacity_type=",
        "karpenter_nodes_terminated_total{nodepool=\"default\",zone=",
    ] {
        assert!(text.contains(series), "{series} in\n{text}");
    }
    assert!(!text.contains("method=\"all\""), "{text}");
    // Upstream's Events: the candidate's on its Node and its NodeClaim alike (`kubectl describe
    // node` shows them), the replacement's launch and wait on the replacement claim.
    let replacement = env.claim_objects()[0]["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for reason in ["ConsolidationCandidate", "DisruptionTerminating"] {
        for (kind, name) in [("Node", node.as_str()), ("NodeClaim", pricey.as_str())] {
            assert!(
                regarding(&env, reason).contains(&(kind.to_string(), name.to_string())),
                "{reason} on {kind} {name}: {:#?}",
                env.events(reason)
            );
        }
    }
    for reason in ["DisruptionLaunching", "DisruptionWaitingReadiness"] {
        assert!(
            regarding(&env, reason).contains(&("NodeClaim".to_string(), replacement.clone())),
            "{reason} on the replacement {replacement}: {:#?}",
            env.events(reason)
        );
    }
    env.assert_clean();
}

/// The (kind, name) of the objects the Events with `reason` are about.
fn regarding(env: &Env, reason: &str) -> Vec<(String, String)> {
    env.events(reason)
        .iter()
        .map(|e| {
            let r = &e["regarding"];
            (
                r["kind"].as_str().unwrap_or_default().to_string(),
                r["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[actix::test]
async fn a_failed_replacement_is_rolled_back() {
    let env = env_fast().await;
    let (old, old_node) = env.drifting_claim_with_a_pod().await;
    // The replacement appears; take it away before it is initialized.
    let replacement = env
        .wait("a replacement claim", || {
            env.claim_objects()
                .iter()
                .find(|c| c["metadata"]["name"] != old.as_str())
                .and_then(|c| c["metadata"]["name"].as_str().map(String::from))
        })
        .await;
    assert!(tainted(&env.get("nodes", "", &old_node).expect("node")));
    let claims: Api<NodeClaim> = Api::all(env.client().await);
    claims
        .delete(&replacement, &DeleteParams::default())
        .await
        .expect("delete the replacement");
    env.wait("the candidate untainted and unmarked", || {
        let node = env.get("nodes", "", &old_node)?;
        let claim = env.get("nodeclaims", "", &old)?;
        (!tainted(&node) && condition(&claim, "DisruptionReason").is_none()).then_some(())
    })
    .await;
    assert!(!env.events("DisruptionFailed").is_empty());
    assert!(
        env.get("nodeclaims", "", &old).is_some(),
        "the candidate stays"
    );
    // Counted when it started, as upstream counts it, and counted again as a failure.
    let drift = "{decision=\"replace\",reason=\"drifted\",consolidation_type=\"\"}";
    assert!(
        env.metric(&format!(
            "karpenter_voluntary_disruption_decisions_total{drift}"
        )) >= 1.0
    );
    assert!(
        env.metric(&format!(
            "karpenter_voluntary_disruption_queue_failures_total{drift}"
        )) >= 1.0
    );
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

#[actix::test]
async fn marks_left_by_a_killed_controller_are_rolled_back() {
    let mut env = env_fast().await;
    let (old, old_node) = env.drifting_claim_with_a_pod().await;
    env.wait("the candidate marked", || {
        let claim = env.get("nodeclaims", "", &old)?;
        condition(&claim, "DisruptionReason").map(|_| ())
    })
    .await;
    // Kill it mid-command. The next controller may start no command (the budget is closed
    // now; drift would otherwise act at once, without validation), so what it does is the
    // rollback.
    env.set_disruption(json!({"budgets": [{"nodes": "0"}]}))
        .await;
    env.restart_with(fast()).await;
    env.wait("the dead controller's marks rolled back", || {
        let node = env.get("nodes", "", &old_node)?;
        let claim = env.get("nodeclaims", "", &old)?;
        (!tainted(&node) && condition(&claim, "DisruptionReason").is_none()).then_some(())
    })
    .await;
    assert!(env.get("nodeclaims", "", &old).is_some());
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

#[actix::test]
async fn several_nodes_fold_into_the_one_that_stays() {
    let env = env_fast().await;
    let mut olds = Vec::new();
    for i in 0..3 {
        let (claim, node) = env.stamped_claim("sim-0").await;
        env.pod(&format!("app-{i}"), &node, json!({"app": "app"}), json!({}))
            .await;
        olds.push(claim);
    }
    // Every budget open, so they can go in one command. A replacement of the same type could
    // hold all three pods, but (upstream's rule) keeping one of them and deleting the other two
    // moves fewer pods, so that is the command.
    env.set_disruption(json!({"consolidationPolicy": "WhenEmptyOrUnderutilized",
                              "consolidateAfter": "0s", "budgets": [{"nodes": "100%"}]}))
        .await;
    env.wait("two nodes folded into the third", || {
        let claims = env.claim_objects();
        (claims.len() == 1
            && olds
                .iter()
                .any(|c| claims[0]["metadata"]["name"] == c.as_str()))
        .then_some(())
    })
    .await;
    settle(&env.sim, DEADLINE).await.expect("settles");
    assert_eq!(
        env.metric("karpenter_voluntary_disruption_decisions_total{decision=\"delete\",reason=\"underutilized\",consolidation_type=\"multi\""),
        1.0
    );
    assert_eq!(
        env.metric("karpenter_nodeclaims_disrupted_total{reason=\"underutilized\""),
        2.0
    );
    // Karpenter v1.15's labels: the pool's policy (a consolidation) and the claims' termination
    // mode (no grace period: graceful); and its pods counter, one pod on each deleted node.
    let v1_15 = [
        "reason=\"underutilized\"",
        "consolidation_policy=\"when_empty_or_underutilized\"",
        "termination_mode=\"graceful\"",
    ];
    assert_eq!(
        series_sum(&env, "karpenter_nodeclaims_disrupted_total", &v1_15),
        2.0
    );
    assert_eq!(
        series_sum(&env, "karpenter_pods_disruption_initiated_total", &v1_15),
        2.0
    );
    // Upstream's zone label on nodes created: the claims' zone, never left empty here.
    assert_eq!(
        series_sum(&env, "karpenter_nodes_created_total", &["zone=\"\""]),
        0.0
    );
    assert!(
        series_sum(
            &env,
            "karpenter_nodes_created_total",
            &["nodepool=\"default\",zone=\""]
        ) >= 3.0
    );
    env.assert_clean();
}

/// The sum of the series of `name` whose labels include each of `labels` (`key="value"`).
fn series_sum(env: &Env, name: &str, labels: &[&str]) -> f64 {
    env.metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[actix::test]
async fn percentage_scheduled_and_per_reason_budgets() {
    let env = env_fast().await;
    for _ in 0..4 {
        env.stamped_claim("sim-0").await;
    }
    // A window that is always open and allows nothing, only for Empty: it wins for emptiness.
    env.set_disruption(json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s",
        "budgets": [{"nodes": "50%"},
                    {"nodes": "0", "schedule": "* * * * *", "duration": "1h", "reasons": ["Empty"]}]}))
        .await;
    env.wait("the NodePool says its budget blocks", || {
        env.events("DisruptionBlocked")
            .iter()
            .any(|e| e["regarding"]["kind"] == "NodePool")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        env.claim_objects().len(),
        4,
        "the scheduled budget holds everything"
    );
    // A zero budget for another reason does not hold emptiness; 50 % of 4 nodes is 2 at a time.
    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s",
        "budgets": [{"nodes": "50%"}, {"nodes": "0", "reasons": ["Drifted", "Underutilized"]}]}),
    )
    .await;
    let most = env.most_deleting_until_no_claims().await;
    assert!((1..=2).contains(&most), "at most 50 % at once, saw {most}");
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

/// A cluster whose provider takes `delay` to give a Machine its provider ID, so a command's
/// replacement stays in flight that long.
async fn env_slow(delay: Duration) -> Env {
    env_cfg(
        karpenter_capi::sim::cluster::SimClusterConfig {
            provider_delay: delay,
            ..fast_cluster()
        },
        fast(),
    )
    .await
}

/// The most claims marked for disruption (`DisruptionReason`) at once while `until` is false.
async fn most_marked_until(env: &Env, mut until: impl FnMut(&Env) -> bool) -> usize {
    let start = Instant::now();
    let mut most = 0;
    while !until(env) {
        let marked = env
            .claim_objects()
            .iter()
            .filter(|c| condition(c, "DisruptionReason").is_some())
            .count();
        most = most.max(marked);
        assert!(start.elapsed() < DEADLINE, "the disruption did not finish");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    most
}

/// Audit row 4: commands run in parallel, bounded only by the budgets. Three drifted claims
/// under a 100 % budget are all being replaced at once, while their replacements launch.
#[actix::test]
async fn drifted_claims_are_replaced_in_parallel() {
    let env = env_slow(Duration::from_secs(2)).await;
    env.set_disruption(json!({"budgets": [{"nodes": "100%"}]}))
        .await;
    let mut originals = Vec::new();
    for i in 0..3 {
        let (claim, node) = env.stamped_claim("sim-0").await;
        env.pod(&format!("app-{i}"), &node, json!({"app": "app"}), json!({}))
            .await;
        originals.push(claim);
    }
    env.change_the_template().await;
    let most = most_marked_until(&env, |env| {
        originals
            .iter()
            .all(|c| env.get("nodeclaims", "", c).is_none())
    })
    .await;
    assert_eq!(most, 3, "every drifted claim is replaced at once");
    settle(&env.sim, DEADLINE).await.expect("settles");
    assert_eq!(
        env.metric("karpenter_nodeclaims_disrupted_total{reason=\"drifted\""),
        3.0
    );
    env.assert_clean();
}

/// Audit row 4: emptiness never waits behind a replacement. While a drifted claim's replacement
/// is still launching, an empty node of the pool goes.
#[actix::test]
async fn an_empty_node_goes_while_a_replacement_launches() {
    let env = env_slow(Duration::from_secs(4)).await;
    // Without the pool's hash stamp, a claim never drifts: this one only ever goes as empty.
    let (empty, _) = env.create_and_wait(claim_for(&env.pool, "sim-0")).await;
    let (drifted, _) = env.drifting_claim_with_a_pod().await;
    let replacement = env
        .wait("the drifted claim's replacement", || {
            env.claim_objects()
                .iter()
                .filter_map(|c| c["metadata"]["name"].as_str())
                .find(|n| *n != empty && *n != drifted)
                .map(String::from)
        })
        .await;
    env.set_disruption(json!({"consolidationPolicy": "WhenEmptyOrUnderutilized",
                              "consolidateAfter": "0s", "budgets": [{"nodes": "100%"}]}))
        .await;
    env.wait("the empty claim deleted", || {
        env.get("nodeclaims", "", &empty)
            .is_none_or(|c| !c["metadata"]["deletionTimestamp"].is_null())
            .then_some(())
    })
    .await;
    let launching = env
        .get("nodeclaims", "", &replacement)
        .is_some_and(|c| condition(&c, "Initialized").is_none_or(|i| i["status"] != "True"));
    assert!(
        launching,
        "the empty node went while the replacement was still launching"
    );
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

/// Audit row 2: a drifted claim with a terminationGracePeriod is replaced even though a
/// do-not-disrupt pod blocks its eviction (upstream's eventual disruption class); the drain then
/// waits for that pod until the grace period ends. Without the grace period it stays.
#[actix::test]
async fn a_drifted_claim_with_a_grace_period_is_replaced_despite_blocking_pods() {
    let env = env_fast().await;
    let mut claim = claim_for(&env.pool, "sim-0");
    claim.spec.termination_grace_period = Some(karpenter_capi::api::GoDuration::from_secs(300));
    claim.annotations_mut().extend([
        (
            NODEPOOL_HASH_ANNOTATION.to_string(),
            nodepool_hash(&env.pool),
        ),
        (
            NODEPOOL_HASH_VERSION_ANNOTATION.to_string(),
            NODEPOOL_HASH_VERSION.to_string(),
        ),
    ]);
    let (old, node) = env.create_and_wait(claim).await;
    env.pod(
        "pinned",
        &node,
        json!({"app": "pinned"}),
        json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "true"}}}),
    )
    .await;
    env.change_the_template().await;
    env.wait("the drifted claim replaced and being deleted", || {
        let c = env.get("nodeclaims", "", &old)?;
        let replaced = env.claim_objects().iter().any(|r| {
            r["metadata"]["name"] != old.as_str()
                && condition(r, "Initialized").is_some_and(|i| i["status"] == "True")
        });
        (replaced && !c["metadata"]["deletionTimestamp"].is_null()).then_some(())
    })
    .await;
    assert!(
        env.get("pods", NS, "pinned").is_some(),
        "the do-not-disrupt pod is not evicted before the grace period ends"
    );
}

/// Audit row 16: the nodes of a static NodePool (spec.replicas) are held, never consolidated.
/// The pool is static from its creation: the API server refuses to turn a dynamic pool static.
#[actix::test]
async fn a_static_pools_empty_node_is_not_consolidated() {
    let env = env_fast().await;
    let api: Api<NodePool> = Api::all(env.client().await);
    let mut pool = karpenter_capi::testing::nodepool("static");
    pool.metadata.uid = None;
    let mut pool = serde_json::to_value(&pool).expect("a NodePool");
    pool["spec"]["replicas"] = json!(1);
    pool["spec"]["disruption"] =
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s"});
    let pool = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(pool).expect("a NodePool"),
        )
        .await
        .expect("create the static pool");
    // A static pool's nodes come from elsewhere (this controller provisions none for it): a
    // claim of the pool, stamped with its hash, stands for one.
    let mut claim = claim_for(&pool, "sim-0");
    claim.annotations_mut().extend([
        (NODEPOOL_HASH_ANNOTATION.to_string(), nodepool_hash(&pool)),
        (
            NODEPOOL_HASH_VERSION_ANNOTATION.to_string(),
            NODEPOOL_HASH_VERSION.to_string(),
        ),
    ]);
    let (claim, _) = env.create_and_wait(claim).await;
    // Several passes (every 200 ms) and validations (300 ms) go by.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = env.get("nodeclaims", "", &claim).expect("the claim stays");
    assert!(c["metadata"]["deletionTimestamp"].is_null(), "{c:#}");
    env.assert_clean();
}

/// docs/disruption.md's parity table stays honest: one row per audit row (1 to 27, and 28 to 31
/// from the second, independent check), each with a status, and every test it names exists
/// where it says.
#[test]
fn the_parity_table_names_tests_that_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/disruption.md")).expect("docs/disruption.md");
    let rows: Vec<Vec<&str>> = doc
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| #") && !l.starts_with("|---"))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    let numbers: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    // 1-31: the v1.14.1 audit; 32-61: what changed on the way to v1.15 (49 and 50 ahead of it;
    // 54-61 the rest of upstream's code changes up to `2266468`); 62: a v1.14.1 rule the audit
    // missed.
    let want: Vec<String> = (1..=62).map(|n| n.to_string()).collect();
    assert_eq!(numbers, want, "one row per audit row, in order");
    for row in &rows {
        assert_eq!(row.len(), 5, "row {}: five cells", row[0]);
        assert!(
            ["matches", "differs", "not yet"].contains(&row[2]),
            "row {}: status {:?}",
            row[0],
            row[2]
        );
        common::explain::assert_named_tests_exist(row[0], row[4]);
    }
}

/// Audit row 17: a node the provisioner just planned pending pods onto (it nominated it) is not
/// disrupted meanwhile, empty as it is until the pods bind.
#[actix::test]
async fn a_node_nominated_for_pending_pods_is_not_emptied() {
    let env = env_fast().await;
    let (claim, _) = env.stamped_claim("sim-0").await;
    // A pending pod the scheduler found no node for (this cluster runs no scheduler stand-in:
    // the pod stays pending, as behind a slow scheduler).
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client().await, NS);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "waiting", "namespace": NS},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
    pods.patch_status(
        "waiting",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/1 nodes are available"}]}})),
    )
    .await
    .expect("mark it unschedulable");
    env.wait("the pod nominated to the existing node", || {
        env.events("Nominated")
            .iter()
            .any(|e| e["regarding"]["name"] == "waiting")
            .then_some(())
    })
    .await;
    assert_eq!(env.claim_objects().len(), 1, "no claim is created for it");
    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s",
                              "budgets": [{"nodes": "100%"}]}),
    )
    .await;
    // Several passes (200 ms) and validations (300 ms) go by.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = env.get("nodeclaims", "", &claim).expect("the claim stays");
    assert!(c["metadata"]["deletionTimestamp"].is_null(), "{c:#}");
}

/// A command's write the server fails once is read back and sent again: an empty node whose
/// taint write is answered 500 still goes, and nothing is rolled back.
#[actix::test]
async fn a_taint_write_that_fails_once_is_retried_not_rolled_back() {
    let env = env_fast().await;
    let (claim, node) = env.stamped_claim("sim-0").await;
    let faults = env.sim.cluster().server().faults();
    // Only the controller's requests: the kubelet stand-in's Node writes go through.
    faults.set_agent(Some(karpenter_capi::app::USER_AGENT));
    faults.fail_next("nodes", "patch", 500, 1);
    env.set_disruption(json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s"}))
        .await;
    env.wait("the candidate gone", || {
        (env.get("nodeclaims", "", &claim).is_none() && env.get("nodes", "", &node).is_none())
            .then_some(())
    })
    .await;
    assert_eq!(faults.forced_left(), 0, "the taint write met the 500");
    assert!(env.events("DisruptionFailed").is_empty(), "no rollback");
    assert_eq!(
        env.metric("karpenter_voluntary_disruption_queue_failures_total"),
        0.0
    );
    assert_eq!(
        env.metric("karpenter_nodeclaims_disrupted_total{reason=\"empty\""),
        1.0
    );
    faults.clear();
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

/// Cluster API's pause on a MachineDeployment (`cluster.x-k8s.io/paused`) keeps its empty node:
/// Cluster API would act on no replica change, so none of its Machines could be given back. Once
/// the pause lifts, emptiness removes it.
#[actix::test]
async fn a_paused_machine_deployments_empty_node_waits_for_the_pause_to_lift() {
    use karpenter_capi::capi::autoscaler::PAUSED_ANNOTATION;
    let env = env_fast().await;
    let (claim, _) = env.stamped_claim("sim-0").await;
    env.patch_md(json!({"metadata": {"annotations": {PAUSED_ANNOTATION: "true"}}}))
        .await;
    env.set_disruption(json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s"}))
        .await;
    // Several passes (every 200 ms) and validations (300 ms) go by.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = env.get("nodeclaims", "", &claim).expect("the claim stays");
    assert!(c["metadata"]["deletionTimestamp"].is_null(), "{c:#}");
    env.patch_md(json!({"metadata": {"annotations": {PAUSED_ANNOTATION: null}}}))
        .await;
    env.wait("the empty node gone once the pause lifted", || {
        env.get("nodeclaims", "", &claim).is_none().then_some(())
    })
    .await;
    env.assert_clean();
}

/// The same for a paused Cluster (`spec.paused`): it pauses each of its MachineDeployments.
#[actix::test]
async fn a_paused_clusters_empty_node_waits_for_the_pause_to_lift() {
    let env = env_fast().await;
    let (claim, _) = env.stamped_claim("sim-0").await;
    env.set_cluster_paused(true).await;
    env.set_disruption(json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s"}))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = env.get("nodeclaims", "", &claim).expect("the claim stays");
    assert!(c["metadata"]["deletionTimestamp"].is_null(), "{c:#}");
    env.set_cluster_paused(false).await;
    env.wait("the empty node gone once the pause lifted", || {
        env.get("nodeclaims", "", &claim).is_none().then_some(())
    })
    .await;
    env.assert_clean();
}

/// A command's candidates are deleted side by side: one whose delete the server keeps failing
/// for a while is retried on its own, the other goes meanwhile, and nothing is rolled back.
#[actix::test]
async fn a_candidate_whose_delete_keeps_failing_holds_back_no_other() {
    let env = env_fast().await;
    let (a, _) = env.stamped_claim("sim-0").await;
    let (b, _) = env.stamped_claim("sim-0").await;
    let faults = env.sim.cluster().server().faults();
    faults.set_agent(Some(karpenter_capi::app::USER_AGENT));
    // Three failures: whichever delete meets them backs off three times (and reads back).
    faults.fail_next("nodeclaims", "delete", 503, 3);
    env.set_disruption(
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s",
                              "budgets": [{"nodes": "100%"}]}),
    )
    .await;
    env.wait("both candidates gone", || {
        (env.get("nodeclaims", "", &a).is_none() && env.get("nodeclaims", "", &b).is_none())
            .then_some(())
    })
    .await;
    assert_eq!(faults.forced_left(), 0, "the deletes met the 503s");
    assert!(env.events("DisruptionFailed").is_empty(), "no rollback");
    assert!(env.metric("karpenter_capi_disruption_write_retries_total{write=\"delete\"}") >= 1.0);
    faults.clear();
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

/// Issue 37: a selected MachineDeployment the catalog cannot read is unknown, not gone. Its
/// claims are not drifted (one annotation typo must not replace a node group), nothing new
/// launches on it, its claims say why (an Event), and once it reads again nothing has moved.
#[actix::test]
async fn a_machine_deployment_that_cannot_be_read_drifts_none_of_its_claims() {
    let env = env_fast().await;
    env.sim
        .run(|c| async move {
            c.create_machine_deployment_from(&seed_of(1, 10))
                .await
                .expect("a second MachineDeployment, so the NodeClass stays usable");
        })
        .await
        .expect("seeding");
    let (claim, _) = env.stamped_claim("sim-0").await;
    // A labels entry without `=` (Cluster Autoscaler skips it) and a cpu that is no quantity
    // (refused by both): either way md-0 must not be taken for gone.
    env.patch_md(json!({"metadata": {"annotations": {
        LABELS_ANNOTATION: "team=a,oops",
        CPU_ANNOTATION: "lots",
    }}}))
    .await;
    env.wait("md-0 unknown to the catalog", || {
        env.controller
            .as_ref()
            .and_then(|c| c.shared.catalog.unknown("default/md-0"))
    })
    .await;
    env.wait("the claim told why its drift is not decided", || {
        env.events("MachineDeploymentUnknown")
            .into_iter()
            .find(|e| e["regarding"]["name"] == claim.as_str())
    })
    .await;
    // Many disruption passes (every 200 ms) while md-0 stays unreadable.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let c = env
        .get("nodeclaims", "", &claim)
        .expect("the claim is kept");
    assert!(
        c["metadata"]["deletionTimestamp"].is_null(),
        "the claim was deleted"
    );
    assert!(
        condition(&c, "Drifted").is_none_or(|d| d["status"] != "True"),
        "the claim drifted: {c}"
    );
    let seeded = seed_of(0, 10).annotations;
    env.patch_md(json!({"metadata": {"annotations": {
        CPU_ANNOTATION: seeded[CPU_ANNOTATION],
        LABELS_ANNOTATION: seeded[LABELS_ANNOTATION],
    }}}))
    .await;
    env.wait("md-0 offered again", || {
        env.controller
            .as_ref()
            .and_then(|c| c.shared.catalog.offering("default/md-0"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let c = env
        .get("nodeclaims", "", &claim)
        .expect("the claim is kept");
    assert!(condition(&c, "Drifted").is_none_or(|d| d["status"] != "True"));
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

/// Issue 37, the restart half: md-0's capacity comes only from its infrastructure template, a
/// claim runs on it, and the controller restarts while every read of that template fails (the
/// server's faults: 500/503 for the controller). md-0 is unknown, not gone: its claim is not
/// drifted or deleted over many disruption passes, nothing launches on it (a new claim goes to
/// the dearer md-1), the claim and the NodeClass say why; once the reads succeed md-0 is offered
/// and launched on again, nothing drifted. The same body runs on kube-apiserver (the chart's
/// ClusterRole without the template kind) in the control_plane binary's lifecycle module.
#[actix::test]
async fn a_template_only_machine_deployment_unreadable_after_a_restart_drifts_and_launches_nothing()
{
    common::unknown_groups::template_reads_failing_after_a_restart_drift_and_launch_nothing(
        karpenter_capi::sim::cluster::Backend::Simulated,
    )
    .await;
}
