//! Termination end to end against the simulated cluster: a deleted claim's Node is drained by the
//! Terminator before its Machine goes (Karpenter's order, PodDisruptionBudgets, do-not-disrupt,
//! forced deletion at the claim's deadline), and `kubectl delete node` runs the same flow. The
//! simulated server audits every pod removal; each test ends with no violation and the
//! controller's invariants (`simulate::invariants`).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::wellknown::*;
use karpenter_capi::sim::cluster::SimClusterConfig;
use karpenter_capi::simulate::launch::{claim_for, settle};
use karpenter_capi::simulate::sim_settings;

use crate::common;

use common::*;

#[actix::test]
async fn drain_evicts_in_karpenters_order_and_waits_for_a_budget() {
    let env = env().await;
    let (claim, node) = env.claim(None).await;
    let daemon = json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "ds-uid", "controller": true}]}});
    let critical = json!({"spec": {"priorityClassName": "system-node-critical"}});
    env.pod("web-0", &node, json!({"app": "web"}), json!({}))
        .await;
    env.pod("web-1", &node, json!({"app": "web"}), json!({}))
        .await;
    env.pod("agent", &node, json!({"app": "agent"}), daemon)
        .await;
    env.pod("dns", &node, json!({"app": "dns"}), critical).await;
    // Karpenter leaves a pod that tolerates the disrupted taint; Cluster API's drain would not.
    env.pod(
        "tolerant",
        &node,
        json!({"app": "tolerant"}),
        json!({"spec": {"tolerations": [{"key": DISRUPTED_TAINT_KEY, "operator": "Exists"}]}}),
    )
    .await;
    // No disruption allowed for web at first.
    env.pdb("web", "web", 0).await;

    env.delete_claim(&claim).await;
    env.wait("a blocked eviction reported", || {
        (!env.events("FailedDraining").is_empty()).then_some(())
    })
    .await;
    let n = env.get("nodes", "", &node).expect("node still there");
    assert!(
        n["spec"]["taints"].as_array().is_some_and(|ts| ts
            .iter()
            .any(|t| t["key"] == DISRUPTED_TAINT_KEY && t["effect"] == "NoSchedule")),
        "node tainted: {n:#}"
    );
    let c = env.get("nodeclaims", "", &claim).expect("claim waits");
    assert_eq!(
        condition(&c, "Drained").expect("Drained")["status"],
        "Unknown"
    );
    // The Machine is not released while the node drains.
    assert_eq!(env.list("machines").len(), 1);
    assert!(env.get("pods", NS, "web-0").is_some() && env.get("pods", NS, "web-1").is_some());
    assert!(
        env.removals().iter().all(|(_, p)| p.starts_with("web")),
        "later tiers wait for the first: {:?}",
        env.removals()
    );

    // The budget is lifted (the pods have no controller, so only an integer minAvailable can
    // allow their disruption): the drain goes on by itself.
    env.pdb_min_available("web", "web", 0).await;
    env.gone(&claim, &node).await;

    let order: Vec<String> = env
        .removals()
        .into_iter()
        .filter(|(how, _)| how == "evict")
        .map(|(_, p)| p)
        .collect();
    let pos = |p: &str| order.iter().rposition(|x| x == p).expect(p);
    assert!(
        pos("web-0") < pos("agent") && pos("web-1") < pos("agent"),
        "{order:?}"
    );
    assert!(pos("agent") < pos("dns"), "{order:?}");
    let text = env.metrics.encode();
    assert!(
        text.contains("karpenter_pods_eviction_requests_total{code=\"429\"}"),
        "{text}"
    );
    assert!(
        text.contains("karpenter_nodes_drained_total{nodepool=\"default\"} 1"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l
            .starts_with("karpenter_nodes_terminated_total{nodepool=\"default\",zone=")
            && l.ends_with(" 1")),
        "{text}"
    );
    // Cluster API was told not to drain again: nobody evicted the tolerant pod (it went with
    // its Node, by pod GC).
    assert!(
        env.evictions_of("tolerant").is_empty(),
        "Cluster API drained a node the controller had drained: {:?}",
        env.evictions_of("tolerant")
    );
    // Pod GC removes it after its Node is gone, asynchronously (as on a real cluster).
    env.wait("the tolerant pod collected with its Node", || {
        env.get("pods", NS, "tolerant").is_none().then_some(())
    })
    .await;
    env.assert_clean();
}

#[actix::test]
async fn do_not_disrupt_waits_for_the_deadline_then_the_pod_is_deleted_in_time() {
    let env = env().await;
    let (claim, node) = env.claim(Some(Duration::from_secs(6))).await;
    env.pod(
        "precious",
        &node,
        json!({"app": "precious"}),
        json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "true"}},
               "spec": {"terminationGracePeriodSeconds": 2}}),
    )
    .await;
    // It ignores SIGTERM: only the grace period ends it.
    let api: Api<Pod> = Api::namespaced(env.client().await, NS);
    api.patch(
        "precious",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"sim.karpenter.cluster.x-k8s.io/exit-after": "never"}}})),
    )
    .await
    .expect("annotate");
    env.pod("plain", &node, json!({"app": "plain"}), json!({}))
        .await;

    let deleted_at = Instant::now();
    env.delete_claim(&claim).await;
    let stamped = env
        .wait("the termination timestamp", || {
            env.get("nodeclaims", "", &claim).and_then(|c| {
                c["metadata"]["annotations"][TERMINATION_TIMESTAMP_ANNOTATION]
                    .as_str()
                    .map(String::from)
            })
        })
        .await;
    assert!(stamped.parse::<jiff::Timestamp>().is_ok(), "{stamped}");
    env.wait("the plain pod evicted", || {
        env.get("pods", NS, "plain").is_none().then_some(())
    })
    .await;
    // Well before the deadline, the do-not-disrupt pod is untouched.
    assert!(
        !env.removals().iter().any(|(_, p)| p == "precious"),
        "{:?}",
        env.removals()
    );
    env.gone(&claim, &node).await;
    // Deleted once its own grace would reach the deadline (6 s - 2 s), never evicted.
    let precious: Vec<(String, String)> = env
        .removals()
        .into_iter()
        .filter(|(_, p)| p == "precious")
        .collect();
    assert_eq!(
        precious,
        vec![("delete".to_string(), "precious".to_string())]
    );
    assert!(
        deleted_at.elapsed() >= Duration::from_secs(3),
        "not before the deadline"
    );
    assert!(!env.events("TerminationGracePeriodExpiring").is_empty());
    assert!(!env.events("Disrupted").is_empty());
    // Both drained pods count, the evicted one and the one deleted at the deadline (Karpenter
    // v1.15, #3063), with upstream's reason for a claim deleted without a disruption reason.
    let text = env.metrics.encode();
    assert!(
        text.contains("karpenter_pods_drained_total{reason=\"Forceful Termination\"} 2"),
        "{text}"
    );
    env.assert_clean();
}

#[actix::test]
async fn kubectl_delete_node_drains_and_releases_the_machine() {
    let env = env().await;
    let (claim, node) = env.claim(None).await;
    env.pod("web-0", &node, json!({"app": "web"}), json!({}))
        .await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client().await);
    nodes
        .delete(&node, &DeleteParams::default())
        .await
        .expect("delete node");
    // Our finalizer holds the Node while its claim terminates the usual way.
    env.wait("the claim deleted", || {
        env.get("nodeclaims", "", &claim)
            .filter(|c| !c["metadata"]["deletionTimestamp"].is_null())
            .map(|_| ())
            .or_else(|| env.get("nodeclaims", "", &claim).is_none().then_some(()))
    })
    .await;
    env.gone(&claim, &node).await;
    assert!(
        env.removals()
            .iter()
            .any(|(how, p)| how == "evict" && p == "web-0"),
        "the pod was evicted, not lost with the node: {:?}",
        env.removals()
    );
    env.assert_clean();
}

/// The claim asks its Scaler once to release its Machine, then waits for the Machine to go; a
/// release the server fails (a 500, then a conflict) is the Scaler's to send again, read back
/// first, and the claim still ends cleanly.
#[actix::test]
async fn a_machine_release_the_server_fails_is_sent_again() {
    let env = env().await;
    let (claim, node) = env.claim(None).await;
    let faults = env.sim.cluster().server().faults();
    // Only the controller's requests: Cluster API's stand-in writes its Machines as usual.
    faults.set_agent(Some(karpenter_capi::app::USER_AGENT));
    faults.fail_next("machines", "patch", 500, 1);
    faults.fail_next("machines", "patch", 409, 1);
    env.delete_claim(&claim).await;
    env.gone(&claim, &node).await;
    assert_eq!(
        faults.forced_left(),
        0,
        "the release met the 500 and the 409"
    );
    faults.clear();
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

#[actix::test]
async fn a_controller_killed_mid_drain_finishes_after_restart() {
    let mut env = env().await;
    let (claim, node) = env.claim(None).await;
    env.pod("web-0", &node, json!({"app": "web"}), json!({}))
        .await;
    env.pod("other", &node, json!({"app": "other"}), json!({}))
        .await;
    env.pdb("web", "web", 0).await;
    env.delete_claim(&claim).await;
    env.wait("the drain under way and blocked", || {
        (env.get("pods", NS, "other").is_none() && !env.events("FailedDraining").is_empty())
            .then_some(())
    })
    .await;
    env.restart().await;
    // The new controller picks the drain up from the API: the claim is still deleting, the
    // Node still tainted and held, the Machine still there.
    assert!(env.get("nodeclaims", "", &claim).is_some());
    assert_eq!(env.list("machines").len(), 1);
    env.pdb_min_available("web", "web", 0).await;
    env.gone(&claim, &node).await;
    env.assert_clean();
}

/// A claim deleted before it learned its instance (its create timeout while Cluster API was
/// still provisioning, or a user) whose Node registered meanwhile: termination finds the Node
/// through the claim's Machine, drains it and releases the Machine, rather than waiting for
/// the claim's own provider ID that never comes.
#[actix::test]
async fn a_claim_deleted_before_it_learned_its_node_drains_the_node_its_machine_names() {
    let cfg = SimClusterConfig {
        provider_delay: Duration::from_secs(3),
        jitter: Duration::ZERO,
        ..fast_cluster()
    };
    let mut env = env_cfg(cfg, sim_settings(None)).await;
    let api: Api<NodeClaim> = Api::all(env.client().await);
    let claim = api
        .create(&PostParams::default(), &claim_for(&env.pool, "sim-0"))
        .await
        .expect("create claim")
        .name_any();
    let bound = |env: &Env| {
        env.list("machines")
            .into_iter()
            .find(|m| m["metadata"]["annotations"][NODECLAIM_ANNOTATION] == claim.as_str())
    };
    env.wait("a Machine bound to the claim", || bound(&env).map(|_| ()))
        .await;
    // The controller goes before the Machine has a provider ID; Cluster API and the kubelet
    // carry on: the Machine gets its instance, its Node registers and the nodeRef is set.
    env.kill();
    let node = env
        .wait("the Machine's Node registered and referenced", || {
            let m = bound(&env)?;
            let node = m["status"]["nodeRef"]["name"].as_str()?.to_string();
            env.get("nodes", "", &node).map(|_| node)
        })
        .await;
    let c = env.get("nodeclaims", "", &claim).expect("claim");
    assert!(
        c["status"]["providerID"].as_str().is_none_or(str::is_empty),
        "the claim never learned its instance: {c}"
    );
    env.pod("web-0", &node, json!({"app": "web"}), json!({}))
        .await;
    api.delete(&claim, &DeleteParams::default())
        .await
        .expect("delete claim");
    env.start_with(sim_settings(None)).await;
    env.gone(&claim, &node).await;
    assert!(
        !env.evictions_of("web-0").is_empty(),
        "the pod was evicted, not lost with its Node"
    );
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

#[actix::test]
async fn a_machine_deleted_by_someone_else_ends_its_claim_cleanly() {
    let env = env().await;
    let (claim, node) = env.claim(None).await;
    env.pod("web-0", &node, json!({"app": "web"}), json!({}))
        .await;
    let machine = env.list("machines").remove(0);
    let name = machine["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    // As a MachineHealthCheck remediation would: delete the Machine itself.
    let machines: Api<kube::core::DynamicObject> = Api::namespaced_with(
        env.client().await,
        NS,
        &env.sim.cluster().capi_version().machine(),
    );
    machines
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete Machine");
    env.wait("the claim and its Node gone", || {
        (env.get("nodeclaims", "", &claim).is_none() && env.get("nodes", "", &node).is_none())
            .then_some(())
    })
    .await;
    let event = env.events("MachineDeleted");
    assert!(!event.is_empty(), "the claim says why it went");
    // The pod was evicted (by the controller's drain or Cluster API's, whichever came first),
    // not lost with its node.
    assert!(!env.evictions_of("web-0").is_empty());
    // Cluster API replaces the Machine at the same replica count; the controller gives the
    // replacement back (nothing claims it), so nothing leaks.
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

#[actix::test]
async fn a_claim_that_cannot_launch_is_deleted_after_the_launch_timeout() {
    let mut settings = sim_settings(None);
    settings.launch_timeout = Duration::from_secs(2);
    let env = env_with(settings).await;
    let mut claim = claim_for(&env.pool, "sim-0");
    claim.spec.node_class_ref.name = "does-not-exist".into();
    let api: Api<NodeClaim> = Api::all(env.client().await);
    let name = api
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim")
        .name_any();
    env.wait("the claim deleted at its launch timeout", || {
        env.get("nodeclaims", "", &name).is_none().then_some(())
    })
    .await;
    // Events are recorded asynchronously: the one naming the missing class may land just
    // after the claim is gone.
    env.wait("a LaunchTimeout Event naming the missing class", || {
        env.events("LaunchTimeout")
            .iter()
            .any(|e| {
                e["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("does-not-exist"))
            })
            .then_some(())
    })
    .await;
    assert!(env.list("machines").is_empty());
    // Counted as upstream counts a liveness timeout, once the claim's actor is past its delete
    // (the claim can be seen gone a moment before).
    env.wait("the timeout counted as a disruption", || {
        env.metrics
            .encode()
            .contains(
                "karpenter_nodeclaims_disrupted_total{reason=\"launch_timeout\",nodepool=\"default\"",
            )
            .then_some(())
    })
    .await;
    env.assert_clean();
}

#[actix::test]
async fn a_failed_machine_fails_its_claim_at_once() {
    // Cluster API's deprecated failure fields (v1beta2 keeps them under deprecated.v1beta1).
    failed_machine_fails_its_claim(
        json!({"status": {"phase": "Failed", "deprecated": {"v1beta1": {
            "failureReason": "CreateError",
            "failureMessage": "quota exceeded in the simulated cloud"}}}}),
        "quota exceeded",
    )
    .await;
}

#[actix::test]
async fn a_machine_whose_infrastructure_was_deleted_fails_its_claim_at_once() {
    // v1beta2's own signal: InfrastructureReady=False with reason Deleted, no failure fields.
    failed_machine_fails_its_claim(
        json!({"status": {"conditions": [{
            "type": "InfrastructureReady", "status": "False", "reason": "Deleted",
            "message": "SimMachine sim/m-0 has been deleted",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
        "InfrastructureDeleted: SimMachine sim/m-0 has been deleted",
    )
    .await;
}

async fn failed_machine_fails_its_claim(status: Value, note: &str) {
    // A slow provider: the Machine has no provider ID for a minute, and the create timeout is
    // far away; only the failure can end the claim early.
    let cfg = SimClusterConfig {
        provider_delay: Duration::from_secs(60),
        ..fast_cluster()
    };
    let env = env_cfg(cfg, sim_settings(Some(Duration::from_secs(600)))).await;
    let api: Api<NodeClaim> = Api::all(env.client().await);
    let name = api
        .create(&PostParams::default(), &claim_for(&env.pool, "sim-0"))
        .await
        .expect("create claim")
        .name_any();
    let machine = env
        .wait("the claim bound to a Machine", || {
            env.get("nodeclaims", "", &name).and_then(|c| {
                c["metadata"]["annotations"][MACHINE_ANNOTATION]
                    .as_str()
                    .and_then(|k| k.split_once('/'))
                    .map(|(_, n)| n.to_string())
            })
        })
        .await;
    let machines: Api<kube::core::DynamicObject> = Api::namespaced_with(
        env.client().await,
        NS,
        &env.sim.cluster().capi_version().machine(),
    );
    machines
        .patch_status(&machine, &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("mark the Machine failed");
    env.wait("the claim gone and its Machine released", || {
        (env.get("nodeclaims", "", &name).is_none() && env.list("machines").is_empty())
            .then_some(())
    })
    .await;
    let events = env.events("MachineFailed");
    assert!(
        events
            .iter()
            .any(|e| e["note"].as_str().is_some_and(|n| n.contains(note))),
        "{events:#?}"
    );
    env.assert_clean();
}

/// The `drain` scenario of `simulate`, small: every deleted claim is drained and released, with
/// budgets refusing some evictions along the way and nothing broken.
#[actix::test]
async fn the_drain_scenario_runs_clean() {
    let cli = <karpenter_capi::cli::Cli as clap::Parser>::try_parse_from([
        "karpenter-capi",
        "simulate",
        "--scenario",
        "drain",
        "--pods",
        "60",
        "--deployments",
        "6",
        "--machine-deployments",
        "2",
    ])
    .expect("arguments");
    let karpenter_capi::cli::Command::Simulate(args) = cli.command else {
        panic!("simulate");
    };
    let r = karpenter_capi::simulate::drain::run(&args)
        .await
        .expect("the scenario runs");
    let t = &r.termination;
    assert!(t.claims_deleted > 0, "{r}");
    assert_eq!(t.drained, t.claims_deleted, "{r}");
    assert_eq!(t.machines_released, t.claims_deleted, "{r}");
    assert_eq!(t.pdb_violations + t.do_not_disrupt_violations, 0, "{r}");
    assert!(t.evictions > 0, "{r}");
    assert!(r.invariants_ok(), "{r}");
    let json: Value = serde_json::from_str(&r.to_json()).expect("JSON report");
    for key in [
        "claims_deleted",
        "drained",
        "evictions",
        "eviction_retries_429",
        "pdb_violations",
        "do_not_disrupt_violations",
        "machines_released",
        "nodes_left",
        "drain_ms",
    ] {
        assert!(!json["termination"][key].is_null(), "{key} in {json}");
    }
    assert!(
        json["latency_ms"]["pod_pending_to_bound"].is_object(),
        "existing fields kept"
    );
}

/// A Node whose kubelet stopped reporting (NotReady) and whose Machine is already gone has no
/// instance left: the claim ends without a drain, even under a budget that allows no eviction,
/// as Karpenter does when the cloud provider no longer finds the instance.
#[actix::test]
async fn a_dead_node_whose_machine_is_gone_is_not_drained() {
    let env = env().await;
    let (claim, node) = env.claim(None).await;
    env.pod("web-0", &node, json!({"app": "web"}), json!({}))
        .await;
    env.pdb("web", "web", 0).await;
    let client = env.client().await;
    // The kubelet is gone: the stand-in lets go of the Node and the node lifecycle controller
    // marks it Unknown.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                karpenter_capi::sim::kubelet::SIM_NODE_ANNOTATION: null}}})),
        )
        .await
        .expect("unmark the node");
    nodes
        .patch_status(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.",
                "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .expect("node NotReady");
    // The instance is gone: the Machine disappears at once (no Cluster API drain).
    let machine = env.list("machines").remove(0);
    let name = machine["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    let machines: Api<kube::core::DynamicObject> =
        Api::namespaced_with(client, NS, &env.sim.cluster().capi_version().machine());
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("drop the Machine's finalizers");
    machines
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete Machine");
    // Quickly: a drain would wait on the budget for ever.
    let start = Instant::now();
    while env.get("nodeclaims", "", &claim).is_some() || env.get("nodes", "", &node).is_some() {
        assert!(
            start.elapsed() < DEADLINE,
            "the claim still waits on a drain of a dead node"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        env.evictions_of("web-0").is_empty(),
        "nothing evicted from a dead node: {:?}",
        env.evictions_of("web-0")
    );
    settle(&env.sim, DEADLINE).await.expect("settles");
    env.assert_clean();
}

/// The NodePool's `NodeRegistrationHealthy` follows its launches as upstream's liveness keeps
/// it: True once one registers, False after half of the last four timed out, with the reason
/// of the failure that tipped it.
#[actix::test]
async fn launch_timeouts_make_the_nodepool_registration_unhealthy() {
    let mut settings = sim_settings(None);
    settings.launch_timeout = Duration::from_secs(1);
    let env = env_with(settings).await;
    let pool = env.pool.metadata.name.clone().expect("pool name");
    let health = || {
        env.get("nodepools", "", &pool).and_then(|np| {
            np["status"]["conditions"].as_array().and_then(|cs| {
                cs.iter()
                    .find(|c| c["type"] == "NodeRegistrationHealthy")
                    .cloned()
            })
        })
    };
    env.claim(None).await;
    env.wait("NodeRegistrationHealthy=True after a registration", || {
        health().filter(|c| c["status"] == "True")
    })
    .await;
    let api: Api<NodeClaim> = Api::all(env.client().await);
    for i in 0..2 {
        let mut claim = claim_for(&env.pool, "sim-0");
        claim.metadata.name = Some(format!("lost-{i}"));
        claim.spec.node_class_ref.name = "does-not-exist".into();
        api.create(&PostParams::default(), &claim)
            .await
            .expect("create claim");
    }
    let c = env
        .wait(
            "NodeRegistrationHealthy=False after two launch timeouts",
            || health().filter(|c| c["status"] == "False"),
        )
        .await;
    assert!(
        !c["reason"].as_str().unwrap_or_default().is_empty(),
        "{c:#}"
    );
    // A changed spec starts afresh.
    let pools: Api<karpenter_capi::api::nodepool::NodePool> = Api::all(env.client().await);
    pools
        .patch(
            &pool,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"weight": 7}})),
        )
        .await
        .expect("change the pool");
    env.wait(
        "NodeRegistrationHealthy=Unknown after a spec change",
        || health().filter(|c| c["status"] == "Unknown"),
    )
    .await;
}
