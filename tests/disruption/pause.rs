//! The disruption pause and drift back-off (issue 43) against the simulated cluster:
//! `--disruption-paused` holds drift and emptiness from the first pass and lifting it resumes
//! them; a NodePool's `karpenter.cluster.x-k8s.io/disruption-paused` annotation holds that pool
//! alone; both, and Cluster API's pause, show as the NodePool's `DisruptionPaused` condition
//! with one Event when a pause starts and one when it ends. A NodePool whose drift replacements
//! fail to launch backs off (no other drift launch in its window), counts it, says so in a
//! `DisruptionBackoff` Event, and starts its schedule over once a replacement initializes.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use common::*;
use karpenter_capi::actors::Settings;
use karpenter_capi::api::drift_hash::nodepool_hash;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::*;
use karpenter_capi::sim::capi::FAIL_LAUNCHES_ANNOTATION;
use karpenter_capi::simulate::launch::{claim_for, settle};

use crate::disruption::fast;

/// Empty nodes go at once, every node at a time may go.
fn eager() -> Value {
    json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s", "budgets": [{"nodes": "100%"}]})
}

impl Env {
    /// The `DisruptionPaused` condition of NodePool `pool`.
    fn pause_condition(&self, pool: &str) -> Option<Value> {
        let np = self.get("nodepools", "", pool)?;
        condition(&np, "DisruptionPaused").cloned()
    }

    /// Waits for `DisruptionPaused` on `pool` with this status and reason.
    async fn until_paused_says(&self, pool: &str, status: &str, reason: &str) {
        self.wait(
            &format!("{pool}: DisruptionPaused={status} ({reason})"),
            || {
                self.pause_condition(pool)
                    .filter(|c| c["status"] == status && c["reason"] == reason)
            },
        )
        .await;
    }

    /// The pause of `pool` over: the condition says so, one `DisruptionResumed` Event, and the
    /// cluster settles clean.
    async fn resumed_and_clean(&self, pool: &str) {
        self.until_paused_says(pool, "False", "NotPaused").await;
        self.until_pool_events("DisruptionResumed", pool, 1).await;
        settle(&self.sim, DEADLINE).await.expect("settles");
        self.assert_clean();
    }

    /// Events of `reason` about NodePool `pool`.
    fn pool_events(&self, reason: &str, pool: &str) -> Vec<Value> {
        self.events(reason)
            .into_iter()
            .filter(|e| e["regarding"]["kind"] == "NodePool" && e["regarding"]["name"] == pool)
            .collect()
    }

    /// Waits until NodePool `pool` has exactly `n` Events of `reason` (the Event writer
    /// publishes on its own, so an Event may land after the status that goes with it).
    async fn until_pool_events(&self, reason: &str, pool: &str, n: usize) {
        self.until(&format!("{n} {reason} Event(s) on {pool}"), |e| {
            e.pool_events(reason, pool).len() == n
        })
        .await;
    }

    /// Whether claim `name` exists and is not being deleted.
    fn stays(&self, name: &str) -> bool {
        self.get("nodeclaims", "", name)
            .is_some_and(|c| c["metadata"]["deletionTimestamp"].is_null())
    }

    /// Drift commands started so far (replacing and deleting).
    fn drift_decisions(&self) -> f64 {
        ["replace", "delete"]
            .iter()
            .map(|d| {
                self.metric(&format!(
                    "karpenter_voluntary_disruption_decisions_total{{decision=\"{d}\",reason=\"drifted\""
                ))
            })
            .sum()
    }

    fn claim_names(&self) -> BTreeSet<String> {
        self.list("nodeclaims")
            .iter()
            .filter_map(|c| c["metadata"]["name"].as_str().map(String::from))
            .collect()
    }

    /// A second NodePool like the seeded one (same NodeClass), disrupted eagerly.
    async fn second_pool(&self, name: &str) -> NodePool {
        let mut spec = serde_json::to_value(&self.pool.spec).expect("NodePool spec as JSON");
        spec["disruption"] = eager();
        let np: NodePool = serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": name}, "spec": spec
        }))
        .expect("a NodePool");
        Api::<NodePool>::all(self.client().await)
            .create(&PostParams::default(), &np)
            .await
            .expect("create the second NodePool")
    }

    /// An initialized claim of `pool`, stamped with its current hash; returns (claim, node).
    async fn stamped_claim_of(&self, pool: &NodePool) -> (String, String) {
        let mut claim = claim_for(pool, "sim-0");
        claim.annotations_mut().extend([
            (NODEPOOL_HASH_ANNOTATION.to_string(), nodepool_hash(pool)),
            (
                NODEPOOL_HASH_VERSION_ANNOTATION.to_string(),
                NODEPOOL_HASH_VERSION.to_string(),
            ),
        ]);
        self.create_and_wait(claim).await
    }

    /// Makes every new Machine of `md-0` fail to launch (no provider ID), or launch again, and
    /// waits until its MachineSet carries the change (the provider reads it there).
    async fn launches_fail(&self, fail: bool) {
        let value = if fail { "true" } else { "false" };
        self.patch_md(json!({"metadata": {"annotations": {FAIL_LAUNCHES_ANNOTATION: value}}}))
            .await;
        self.until("the MachineSet carries the launch failure switch", |e| {
            e.list("machinesets").iter().any(|ms| {
                ms["metadata"]["labels"][DEPLOYMENT_NAME_LABEL] == "md-0"
                    && ms["metadata"]["annotations"][FAIL_LAUNCHES_ANNOTATION] == value
            })
        })
        .await;
    }
}

/// `--disruption-paused`: the first pass already decides nothing (an empty node and a drifted
/// one stay, no replacement is made) while claims still launch; the NodePool says why. Lifted
/// (a controller started without it), both go, and the NodePool says so.
#[actix::test]
async fn the_setting_holds_drift_and_emptiness_until_it_is_lifted() {
    let mut paused = fast();
    paused.disruption.paused = true;
    let mut env = env_with(paused).await;
    let pool = env.pool.name_any();
    let (empty, _) = env.stamped_claim("sim-0").await;
    let (drifted, node) = env.stamped_claim("sim-0").await;
    env.pod("app", &node, json!({"app": "app"}), json!({}))
        .await;
    env.set_disruption(eager()).await;
    env.change_the_template().await;
    env.until_paused_says(&pool, "True", "Setting").await;
    // Many passes (every 200 ms) and validations (300 ms) go by.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(env.stays(&empty), "the empty node stays while paused");
    assert!(env.stays(&drifted), "the drifted node stays while paused");
    let (launched, _) = env.stamped_claim("sim-0").await;
    let claims = env.claim_names();
    assert_eq!(
        claims,
        BTreeSet::from([empty.clone(), drifted.clone(), launched.clone()]),
        "a claim launches, and no replacement was made"
    );
    env.until_pool_events("DisruptionPaused", &pool, 1).await;
    assert!(env.pool_events("DisruptionResumed", &pool).is_empty());

    env.restart_with(fast()).await;
    env.wait("the empty and the drifted node gone", || {
        (env.get("nodeclaims", "", &empty).is_none()
            && env.get("nodeclaims", "", &drifted).is_none())
        .then_some(())
    })
    .await;
    env.resumed_and_clean(&pool).await;
}

/// The annotation holds its own pool's empty node while another pool's goes; only the paused
/// pool gets the condition and the Event. Removed, the held node goes too.
#[actix::test]
async fn the_annotation_holds_only_its_own_pool() {
    let env = common::env_with(fast()).await;
    let pool = env.pool.name_any();
    env.set_disruption(eager()).await;
    env.patch_pool(json!({"metadata": {"annotations": {DISRUPTION_PAUSED_ANNOTATION: "true"}}}))
        .await;
    env.until_paused_says(&pool, "True", "Annotation").await;
    let other = env.second_pool("other").await;
    let (held, _) = env.stamped_claim("sim-0").await;
    let (goes, _) = env.stamped_claim_of(&other).await;
    env.wait("the other pool's empty node gone", || {
        env.get("nodeclaims", "", &goes).is_none().then_some(())
    })
    .await;
    assert!(env.stays(&held), "the paused pool's empty node stays");
    assert!(
        env.pause_condition("other").is_none(),
        "no condition on a pool never paused"
    );
    env.until_pool_events("DisruptionPaused", &pool, 1).await;
    assert!(env.pool_events("DisruptionPaused", "other").is_empty());

    env.patch_pool(json!({"metadata": {"annotations": {DISRUPTION_PAUSED_ANNOTATION: null}}}))
        .await;
    env.wait("the held node gone once the annotation is removed", || {
        env.get("nodeclaims", "", &held).is_none().then_some(())
    })
    .await;
    env.resumed_and_clean(&pool).await;
}

/// Cluster API's pause of the Cluster behind every node group of the pool shows on the same
/// condition, and its end too.
#[actix::test]
async fn a_paused_cluster_shows_on_the_nodepools_condition() {
    let env = common::env_with(fast()).await;
    let pool = env.pool.name_any();
    env.set_cluster_paused(true).await;
    env.until_paused_says(&pool, "True", "ClusterAPIPaused")
        .await;
    let c = env.pause_condition(&pool).expect("the condition");
    assert!(
        c["message"]
            .as_str()
            .is_some_and(|m| m.contains(karpenter_capi::sim::cluster::CLUSTER_NAME)),
        "names the Cluster: {c:#}"
    );
    env.set_cluster_paused(false).await;
    env.until_paused_says(&pool, "False", "NotPaused").await;
    env.until_pool_events("DisruptionPaused", &pool, 1).await;
    env.until_pool_events("DisruptionResumed", &pool, 1).await;
}

/// Drift back-off at test speed: windows of 4 s doubling to 8 s; a launch fails within 1 s
/// (no provider ID) and its offering is avoided for 300 ms only.
fn backoff_settings() -> Settings {
    let mut s = fast();
    s.create_timeout = Duration::from_secs(1);
    s.unavailable_offering_ttl = Duration::from_millis(300);
    s.disruption.drift_backoff = Duration::from_secs(4);
    s.disruption.drift_backoff_cap = Duration::from_secs(8);
    s
}

/// Two drifted nodes, one at a time, on an offering whose launches fail: the first
/// replacement's failure backs the pool off, so no drift is decided for the pool within the
/// window (without back-off the second node goes at once, as soon as the first command is
/// rolled back: its pod finds room on the first node); the counter and a `DisruptionBackoff`
/// Event say so. Once launches work, both are replaced; a later failure starts the schedule
/// over (window 1), since the success reset it.
#[actix::test]
async fn drift_backs_off_while_its_replacements_fail_and_starts_over_after_a_success() {
    let mut env = common::env_with(fast()).await;
    let pool = env.pool.name_any();
    let (a, node_a) = env.stamped_claim("sim-0").await;
    let (b, node_b) = env.stamped_claim("sim-0").await;
    // A pod on each, so drift replaces them (an empty drifted node is only deleted).
    env.pod("app-a", &node_a, json!({"app": "a"}), json!({}))
        .await;
    env.pod("app-b", &node_b, json!({"app": "b"}), json!({}))
        .await;
    // The short create timeout only once the claims are up: on a loaded machine their own
    // launch may take longer.
    env.restart_with(backoff_settings()).await;
    env.set_disruption(json!({"consolidateAfter": "Never", "budgets": [{"nodes": "1"}]}))
        .await;
    env.launches_fail(true).await;
    env.change_the_template().await;
    let event = env
        .wait("a DisruptionBackoff Event", || {
            env.pool_events("DisruptionBackoff", &pool)
                .into_iter()
                .next()
        })
        .await;
    let armed = Instant::now();
    assert!(
        event["note"]
            .as_str()
            .is_some_and(|n| n.contains("failed window 1")),
        "{event:#}"
    );
    let decided_then = env.drift_decisions();
    // Well inside the 4 s window: no drift decision at all for the pool (neither the other
    // node's replacement nor its deletion with its pod moved to the first node).
    while armed.elapsed() < Duration::from_millis(2500) {
        assert_eq!(
            env.drift_decisions(),
            decided_then,
            "drift decided inside the back-off window: {:?}",
            env.claim_names()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        env.metric("karpenter_voluntary_disruption_drift_backoffs_total{nodepool=\"default\"}"),
        1.0
    );

    env.launches_fail(false).await;
    env.wait("both drifted nodes replaced", || {
        (env.get("nodeclaims", "", &a).is_none() && env.get("nodeclaims", "", &b).is_none())
            .then_some(())
    })
    .await;
    settle(&env.sim, DEADLINE).await.expect("settles");
    let notes = |env: &Env| -> BTreeSet<String> {
        env.pool_events("DisruptionBackoff", &pool)
            .iter()
            .filter_map(|e| e["note"].as_str().map(String::from))
            .collect()
    };
    let seen = notes(&env);
    // The drained pods are not rescheduled here (no scheduler): one on each new node, so drift
    // replaces them too.
    for (i, c) in env.list("nodeclaims").iter().enumerate() {
        if let Some(node) = c["status"]["nodeName"].as_str() {
            env.pod(
                &format!("app-{i}"),
                node,
                json!({"app": i.to_string()}),
                json!({}),
            )
            .await;
        }
    }

    env.launches_fail(true).await;
    env.patch_pool(json!({"spec": {"template": {"metadata": {"labels": {"team": "green"}}}}}))
        .await;
    let fresh = env
        .wait("a DisruptionBackoff Event after the success", || {
            let fresh: Vec<String> = notes(&env).difference(&seen).cloned().collect();
            (!fresh.is_empty()).then_some(fresh)
        })
        .await;
    assert!(
        fresh.iter().all(|n| n.contains("failed window 1")),
        "the schedule started over: {fresh:#?}"
    );
    env.launches_fail(false).await;
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}
