//! Static NodePools (`spec.replicas`) on the simulated cluster: the pool holds its count through
//! a node deletion, a drift, a scale-down and a controller restart, and is held at
//! `limits.nodes` when replicas ask for more.

use crate::common;

use kube::api::{Api, PostParams};
use serde_json::json;

use common::claims::fast_disruption;
use common::condition;
use common::scenario;
use common::static_pools::{self, env_static};
use karpenter_capi::actors::Settings;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::NODEPOOL_LABEL;
use karpenter_capi::simulate::sim_settings;

/// Upstream's static provisioning and drift: the pool launches its replicas with no pod
/// pending, replaces a Node deleted under it, and replaces drifted nodes one for one.
#[actix::test]
async fn a_static_pool_holds_its_count_through_a_node_deletion_and_a_drift() {
    let env = env_static().await;
    static_pools::holds_through_a_node_deletion_and_a_drift(&env).await;
    env.assert_clean();
}

/// Upstream's static deprovisioning: scaling `spec.replicas` down removes the nodes least costly
/// to disrupt first (an empty node before one running a pod).
#[actix::test]
async fn scaling_replicas_down_removes_the_empty_node_first() {
    let env = env_static().await;
    env.static_pool(2, None).await;
    let claims = env.holds(2).await;
    let busy = env.get("nodeclaims", "", &claims[0]).expect("claim");
    let busy_node = busy["status"]["nodeName"]
        .as_str()
        .expect("node")
        .to_string();
    env.pod("app", &busy_node, json!({"app": "app"}), json!({}))
        .await;
    env.patch_static_pool(json!({"spec": {"replicas": 1}}))
        .await;
    let left = env.holds(1).await;
    assert_eq!(
        left,
        [claims[0].clone()],
        "the empty node went, the busy one stayed"
    );
    assert_eq!(env.claims_created(), 2);
    env.assert_clean();
}

/// Bad input: replicas above `limits.nodes`. The pool is held at the limit and says so with a
/// Warning on the NodePool (on both backends in `tests/control_plane/flows.rs`).
#[actix::test]
async fn replicas_above_limits_nodes_are_held_at_the_limit() {
    let env = env_static().await;
    static_pools::replicas_above_limits_nodes_are_held_at_the_limit(&env).await;
    env.assert_clean();
}

/// Terminate-first drift (`--feature-gates TerminateFirstDrift=true`): a static pool whose
/// `limits.nodes` equals its replicas has no room for a replacement. Without the gate its
/// drifted nodes stay (nothing launched, nothing deleted); with it each drifted node is deleted
/// first and the pool's count refills it, one at a time (never two down at once), until every
/// node carries the new template.
#[actix::test]
async fn a_static_pool_at_its_limit_rolls_its_drift_terminating_first_with_the_gate() {
    for gate in [false, true] {
        let mut disruption = fast_disruption();
        disruption.terminate_first_drift = gate;
        let env = common::Env::builder()
            .settings(Settings {
                disruption,
                ..sim_settings(None)
            })
            .start()
            .await;
        env.static_pool(3, Some(json!({"nodes": "3"}))).await;
        let first = env.holds(3).await;
        env.patch_static_pool(
            json!({"spec": {"template": {"metadata": {"labels": {"team": "blue"}}}}}),
        )
        .await;
        if !gate {
            env.until("every node Drifted", |e| {
                first.iter().all(|n| {
                    e.get("nodeclaims", "", n).is_some_and(|c| {
                        condition(&c, "Drifted").is_some_and(|d| d["status"] == "True")
                    })
                })
            })
            .await;
            // Several disruption passes go by: no room, so nothing is replaced or deleted.
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            assert_eq!(env.claims_created(), 3, "without the gate nothing launches");
            assert!(first.iter().all(|n| {
                env.get("nodeclaims", "", n)
                    .is_some_and(|c| c["metadata"]["deletionTimestamp"].is_null())
            }));
            env.assert_clean();
            continue;
        }
        let mut fewest = usize::MAX;
        env.wait(
            "every drifted node replaced by one of the new template",
            || {
                let live = env.live_static_claims();
                let initialized = live
                    .iter()
                    .filter(|c| condition(c, "Initialized").is_some_and(|i| i["status"] == "True"))
                    .count();
                fewest = fewest.min(initialized);
                (live.len() == 3
                    && initialized == 3
                    && live
                        .iter()
                        .all(|c| c["metadata"]["labels"]["team"] == "blue")
                    && !first.iter().any(|n| env.get("nodeclaims", "", n).is_some()))
                .then_some(())
            },
        )
        .await;
        assert!(fewest >= 2, "two nodes down at once: {fewest} initialized");
        assert_eq!(env.claims_created(), 6, "one refill per drifted node");
        assert_eq!(
            env.metric(
                "karpenter_nodeclaims_disrupted_total{reason=\"drifted\",nodepool=\"fixed\""
            ),
            3.0
        );
        env.assert_clean();
    }
}

/// Upstream's early returns, whole flow: a static pool of another provider's NodeClass, and one
/// that is not Ready (its NodeClass does not exist), launch nothing; once the second is Ready it
/// launches, and a create the API server refuses is retried rather than given up or doubled.
#[actix::test]
async fn pools_not_ours_or_not_ready_launch_nothing_and_a_refused_create_is_retried() {
    let env = env_static().await;
    let api: Api<NodePool> = Api::all(env.client().await);
    let mut foreign = static_pools::static_pool_of(&env, "foreign", 1);
    let r = &mut foreign.spec.template.spec.node_class_ref;
    (r.group, r.kind, r.name) = (
        "test.group".into(),
        "UnmanagedNodeClass".into(),
        "test".into(),
    );
    api.create(&PostParams::default(), &foreign)
        .await
        .expect("create the foreign pool");
    let mut fixed = static_pools::static_pool_of(&env, static_pools::POOL, 2);
    fixed.spec.template.spec.node_class_ref.name = "missing".into();
    api.create(&PostParams::default(), &fixed)
        .await
        .expect("create the pool of a missing NodeClass");
    env.wait("the pool of a missing NodeClass is not Ready", || {
        env.get("nodepools", "", static_pools::POOL)
            .filter(|np| condition(np, "Ready").is_some_and(|c| c["status"] == "False"))
    })
    .await;
    let faults = env.sim.cluster().server().faults();
    faults.set_agent(Some(karpenter_capi::app::USER_AGENT));
    faults.fail_next("nodeclaims", "create", 500, 1);
    let class = env.pool.spec.template.spec.node_class_ref.name.clone();
    env.patch_static_pool(
        json!({"spec": {"template": {"spec": {"nodeClassRef": {"name": class}}}}}),
    )
    .await;
    env.holds(2).await;
    assert_eq!(faults.forced_left(), 0, "a create met the 500");
    assert_eq!(env.claims_created(), 2, "the refused create made nothing");
    assert!(
        env.list("nodeclaims")
            .iter()
            .all(|c| c["metadata"]["labels"][NODEPOOL_LABEL] == static_pools::POOL),
        "nothing for the foreign pool"
    );
    faults.clear();
    env.assert_clean();
}

/// Upstream's failed deletion on scale-down: the deletes the API server refuses are retried
/// after a backoff until the pool holds its new count, and nothing else is removed.
#[actix::test]
async fn a_refused_scale_down_delete_is_retried() {
    let env = env_static().await;
    env.static_pool(3, None).await;
    env.holds(3).await;
    let faults = env.sim.cluster().server().faults();
    faults.set_agent(Some(karpenter_capi::app::USER_AGENT));
    faults.fail_next("nodeclaims", "delete", 503, 2);
    env.patch_static_pool(json!({"spec": {"replicas": 1}}))
        .await;
    env.holds(1).await;
    assert_eq!(faults.forced_left(), 0, "the deletes met the 503s");
    assert_eq!(env.claims_created(), 3, "nothing relaunched");
    faults.clear();
    env.assert_clean();
}

/// A controller restart while the pool scales up neither makes a claim twice nor forgets one.
#[actix::test]
async fn a_restart_mid_scale_neither_overshoots_nor_leaks() {
    let mut env = env_static().await;
    env.static_pool(4, None).await;
    env.wait("the first static claim", || {
        (!env.live_static_claims().is_empty()).then_some(())
    })
    .await;
    env.restart_with(Settings {
        disruption: fast_disruption(),
        ..sim_settings(None)
    })
    .await;
    env.holds(4).await;
    assert_eq!(env.claims_created(), 4);
    env.assert_clean();
}

/// `simulate --scenario static`: the pool holds its count through a Node deletion and a drift,
/// never more than one node short or over (its Drifted budget is one node).
#[actix::test]
async fn the_static_scenario_holds_the_count_through_a_deletion_and_a_drift() {
    use karpenter_capi::cli::{Scenario, SimulateArgs};
    let args = SimulateArgs {
        pods: 5,
        ..scenario(Scenario::Static)
    };
    let (r, _kept) = karpenter_capi::simulate::static_pool::run_kept(&args)
        .await
        .expect("the static scenario");
    assert!(r.invariants_ok, "{r}");
    let names: Vec<&str> = r.phases.iter().map(|p| p.phase.as_str()).collect();
    assert_eq!(
        names,
        [
            "launched",
            "a Node deleted",
            "every node drifted and replaced"
        ],
        "{r}"
    );
    assert!(
        r.phases.iter().all(|p| p.live == 5 && p.initialized == 5),
        "{r}"
    );
    // A deleted Node leaves the pool one short until its replacement; a drifted one is
    // replaced before it goes, one at a time.
    let (deleted, drifted) = (&r.phases[1], &r.phases[2]);
    assert!(deleted.fewest_live >= 4 && deleted.most_live == 5, "{r}");
    assert!(drifted.fewest_live == 5 && drifted.most_live <= 6, "{r}");
    assert_eq!(
        r.phases[2].created, 11,
        "one launch per deletion and per drifted node"
    );
}

/// `simulate --scenario repair`: one unhealthy Node replaced, its replacement first, then over a
/// fifth held back (two of five, four of eleven, as a fifth rounds up: the scenario sickens
/// enough Nodes for any `--pods`).
#[actix::test]
async fn the_repair_scenario_replaces_one_node_and_holds_back_over_a_fifth() {
    use karpenter_capi::cli::{Scenario, SimulateArgs};
    for (pods, held) in [(5, 2), (11, 4)] {
        let args = SimulateArgs {
            pods,
            ..scenario(Scenario::Repair)
        };
        let (r, _kept) = karpenter_capi::simulate::static_pool::run_kept(&args)
            .await
            .expect("the repair scenario");
        assert!(r.invariants_ok, "{r}");
        assert_eq!((r.repaired, r.repair_blocked), (1, held), "{r}");
        assert_eq!(r.phases.last().map(|p| p.created), Some(pods + 1), "{r}");
        // v1.15's repair launches the replacement first: the pool never runs one short.
        assert!(
            r.phases
                .iter()
                .all(|p| p.phase == "launched" || p.fewest_live >= pods),
            "{r}"
        );
    }
}

/// `simulate --scenario full-pool` (issue 42's full pool): a static pool at its `limits.nodes`
/// drifts; replace-first stalls (nothing replaced or created over the window), then with
/// `TerminateFirstDrift` every drifted claim is replaced, never two nodes down at once (the
/// `Drifted` budget of one at five replicas).
#[actix::test]
async fn the_full_pool_scenario_stalls_replace_first_and_rolls_terminate_first() {
    use karpenter_capi::cli::Scenario;
    let args = karpenter_capi::cli::SimulateArgs {
        pods: 5,
        ..scenario(Scenario::FullPool)
    };
    let (r, _kept) = karpenter_capi::simulate::static_pool::run_kept(&args)
        .await
        .expect("the full-pool scenario");
    assert!(r.invariants_ok, "{r}");
    let stalled = r.stalled.as_ref().expect("what replace-first did");
    assert_eq!(
        (stalled.drifted, stalled.replaced, stalled.created),
        (5, 0, 0),
        "{r}"
    );
    let rolled = r.phases.last().expect("phases");
    assert_eq!(rolled.phase, "terminate-first rolled the drift", "{r}");
    assert_eq!(
        (rolled.live, rolled.initialized, rolled.created),
        (5, 5, 10),
        "{r}"
    );
    assert!(rolled.fewest_live >= 4 && rolled.most_live <= 5, "{r}");
    assert!(
        r.to_json().contains("\"stalled\":{\"drifted\":5"),
        "{}",
        r.to_json()
    );
    // The HTML report charts the run with each phase marked, and lists the stall.
    let html = karpenter_capi::simulate::html::render(&r.to_json(), &r.timeline).expect("HTML");
    for phase in ["replace-first stalled", "terminate-first rolled the drift"] {
        assert!(html.contains(phase), "{phase} marked in the HTML report");
    }
    assert!(
        html.contains("stalled.drifted</td><td class=\"v\">5"),
        "the stall in the HTML report's figures"
    );
    assert!(
        r.timeline.samples.len() > 1,
        "the charts have samples: {}",
        r.timeline.samples.len()
    );
}
