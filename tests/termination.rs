//! Termination end to end against the simulated cluster: a deleted claim's Node is drained by the
//! Terminator before its Machine goes (Karpenter's order, PodDisruptionBudgets, do-not-disrupt,
//! forced deletion at the claim's deadline), and `kubectl delete node` runs the same flow. The
//! simulated server audits every pod removal; each test ends with no violation and the
//! DESIGN.md section 4 invariants.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use karpenter_capi::actors::ControllerHandle;
use karpenter_capi::api::duration::GoDuration;
use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::*;
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::metrics::Metrics;
use karpenter_capi::sim::cluster::SimClusterConfig;
use karpenter_capi::simulate::launch::{claim_for, seed_nodeclass_and_pool, seed_of, settle};
use karpenter_capi::simulate::{BackgroundSim, invariants, sim_settings, start_controller};

const DEADLINE: Duration = Duration::from_secs(90);
const NS: &str = "default";

struct Env {
    sim: BackgroundSim,
    pool: NodePool,
    metrics: std::sync::Arc<Metrics>,
    controller: Option<ControllerHandle>,
}

async fn env() -> Env {
    env_with(sim_settings(None)).await
}

async fn env_with(settings: karpenter_capi::actors::Settings) -> Env {
    env_cfg(fast_cluster(), settings).await
}

fn fast_cluster() -> SimClusterConfig {
    SimClusterConfig {
        capi_version: CapiVersion::V1Beta2,
        provider_delay: Duration::from_millis(30),
        jitter: Duration::from_millis(20),
        node_ready_delay: Duration::from_millis(30),
        node_delete_delay: Duration::from_millis(20),
        // Pods take a moment to exit, so evictions overlap and budgets matter.
        pod_exit_delay: Duration::from_millis(300),
        // The test places pods itself.
        scheduler: false,
        ..SimClusterConfig::default()
    }
}

async fn env_cfg(cfg: SimClusterConfig, settings: karpenter_capi::actors::Settings) -> Env {
    let sim = BackgroundSim::start(cfg).await.expect("simulated cluster");
    let pool = sim
        .run(|c| async move {
            c.create_machine_deployment_from(&seed_of(0, 10))
                .await
                .expect("MachineDeployment");
            seed_nodeclass_and_pool(c.client())
                .await
                .expect("NodeClass and NodePool")
        })
        .await
        .expect("seeding");
    let metrics = Metrics::new();
    let controller = start_controller(&sim, settings, metrics.clone())
        .await
        .expect("controller");
    Env {
        sim,
        pool,
        metrics,
        controller: Some(controller),
    }
}

impl Env {
    /// Kill the controller (in-flight work abandoned, as in a crash) and start a new one.
    async fn restart(&mut self) {
        if let Some(c) = self.controller.take() {
            c.stop();
        }
        self.controller = Some(
            start_controller(&self.sim, sim_settings(None), self.metrics.clone())
                .await
                .expect("controller restarts"),
        );
    }

    async fn client(&self) -> kube::Client {
        self.sim.client_here().await.expect("client")
    }

    /// One initialized claim (with this termination grace period); returns (claim, node).
    async fn claim(&self, grace: Option<Duration>) -> (String, String) {
        let mut claim = claim_for(&self.pool, "sim-0");
        claim.spec.termination_grace_period = grace.map(GoDuration);
        let api: Api<NodeClaim> = Api::all(self.client().await);
        let name = api
            .create(&PostParams::default(), &claim)
            .await
            .expect("create claim")
            .name_any();
        settle(&self.sim, DEADLINE).await.expect("settles");
        let node = self
            .wait("the claim's node", || {
                self.get("nodeclaims", "", &name)
                    .and_then(|c| c["status"]["nodeName"].as_str().map(String::from))
            })
            .await;
        (name, node)
    }

    fn get(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        self.sim.cluster().server().store().get(resource, ns, name)
    }

    fn list(&self, resource: &str) -> Vec<Value> {
        self.sim.cluster().server().store().list(resource, None)
    }

    async fn wait<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn pod(&self, name: &str, node: &str, labels: Value, extra: Value) {
        let mut body = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": {}},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 5,
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
            },
        });
        merge(&mut body, extra);
        let pod: Pod = serde_json::from_value(body).expect("pod");
        let api: Api<Pod> = Api::namespaced(self.client().await, NS);
        api.create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
        self.wait(&format!("pod {name} running"), || {
            self.get("pods", NS, name)
                .filter(|p| p["status"]["phase"] == "Running")
        })
        .await;
    }

    async fn pdb(&self, name: &str, app: &str, max_unavailable: i32) {
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": app}}},
        }))
        .expect("pdb");
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client().await, NS);
        match api.get_opt(name).await.expect("get pdb") {
            None => {
                api.create(&PostParams::default(), &pdb)
                    .await
                    .expect("create pdb");
            }
            Some(_) => {
                api.patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"maxUnavailable": max_unavailable}})),
                )
                .await
                .expect("patch pdb");
            }
        }
    }

    async fn delete_claim(&self, name: &str) {
        let api: Api<NodeClaim> = Api::all(self.client().await);
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete claim");
    }

    async fn gone(&self, claim: &str, node: &str) {
        self.wait("the claim, its Node and its Machine gone", || {
            (self.get("nodeclaims", "", claim).is_none()
                && self.get("nodes", "", node).is_none()
                && self.list("machines").is_empty())
            .then_some(())
        })
        .await;
    }

    /// Evictions (and deletions) by the controller, in order: (verb, pod).
    fn removals(&self) -> Vec<(String, String)> {
        let agent = karpenter_capi::app::USER_AGENT;
        self.sim
            .cluster()
            .stats()
            .writes()
            .into_iter()
            .filter(|w| w.agent == agent && w.resource == "pods")
            .filter_map(|w| match (w.verb.as_str(), w.subresource.as_str()) {
                ("create", "eviction") => Some(("evict".to_string(), w.name)),
                ("delete", "") => Some(("delete".to_string(), w.name)),
                _ => None,
            })
            .collect()
    }

    /// Every eviction of pod `name`, by anyone: the User-Agents that asked.
    fn evictions_of(&self, name: &str) -> Vec<String> {
        self.sim
            .cluster()
            .stats()
            .writes()
            .into_iter()
            .filter(|w| w.resource == "pods" && w.subresource == "eviction" && w.name == name)
            .map(|w| w.agent)
            .collect()
    }

    fn events(&self, reason: &str) -> Vec<Value> {
        // kube's Recorder writes events.k8s.io/v1 Events.
        let mut all = self.list("events.events.k8s.io");
        all.retain(|e| e["reason"] == reason);
        all
    }

    fn assert_clean(&self) {
        let violations = self.sim.cluster().stats().violations();
        assert!(violations.is_empty(), "drain rules broken: {violations:#?}");
        let inv = invariants::check(
            self.sim.cluster().server().store(),
            self.sim.cluster().capi_version(),
        );
        assert!(inv.ok(), "invariants violated: {:#?}", inv.problems);
    }
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn condition<'a>(c: &'a Value, ty: &str) -> Option<&'a Value> {
    c.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|x| x["type"] == ty))
}

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

    // The budget allows one at a time now: the drain goes on by itself.
    env.pdb("web", "web", 1).await;
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
        text.contains("karpenter_nodes_terminated_total{nodepool=\"default\"} 1"),
        "{text}"
    );
    // Cluster API was told not to drain again: nobody evicted the tolerant pod (it went with
    // its Node, by pod GC).
    assert!(
        env.evictions_of("tolerant").is_empty(),
        "Cluster API drained a node the controller had drained: {:?}",
        env.evictions_of("tolerant")
    );
    assert!(env.get("pods", NS, "tolerant").is_none());
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
    env.pdb("web", "web", 1).await;
    env.gone(&claim, &node).await;
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
    let events = env.events("LaunchTimeout");
    assert!(
        events.iter().any(|e| e["note"]
            .as_str()
            .is_some_and(|n| n.contains("does-not-exist"))),
        "{events:#?}"
    );
    assert!(env.list("machines").is_empty());
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
