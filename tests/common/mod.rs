//! The simulated cluster with one controller, as the termination and disruption tests use it:
//! one MachineDeployment (`sim-0`), the default NodeClass and NodePool, pods placed by the test
//! (no scheduler stand-in), and helpers to read the server's store and audit.
#![allow(dead_code)]

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
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::metrics::Metrics;
use karpenter_capi::sim::cluster::SimClusterConfig;
use karpenter_capi::simulate::launch::{claim_for, seed_nodeclass_and_pool, seed_of, settle};
use karpenter_capi::simulate::{BackgroundSim, invariants, sim_settings, start_controller};

pub const DEADLINE: Duration = Duration::from_secs(90);
pub const NS: &str = "default";

pub struct Env {
    pub sim: BackgroundSim,
    pub pool: NodePool,
    pub metrics: std::sync::Arc<Metrics>,
    pub controller: Option<ControllerHandle>,
}

pub async fn env() -> Env {
    env_with(sim_settings(None)).await
}

pub async fn env_with(settings: karpenter_capi::actors::Settings) -> Env {
    env_cfg(fast_cluster(), settings).await
}

pub fn fast_cluster() -> SimClusterConfig {
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

pub async fn env_cfg(cfg: SimClusterConfig, settings: karpenter_capi::actors::Settings) -> Env {
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
    pub async fn restart(&mut self) {
        self.restart_with(sim_settings(None)).await;
    }

    /// Kill the controller and start one with these settings.
    pub async fn restart_with(&mut self, settings: karpenter_capi::actors::Settings) {
        if let Some(c) = self.controller.take() {
            c.stop();
        }
        self.controller = Some(
            start_controller(&self.sim, settings, self.metrics.clone())
                .await
                .expect("controller restarts"),
        );
    }

    pub async fn client(&self) -> kube::Client {
        self.sim.client_here().await.expect("client")
    }

    /// One initialized claim (with this termination grace period); returns (claim, node).
    pub async fn claim(&self, grace: Option<Duration>) -> (String, String) {
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

    pub fn get(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        self.sim.cluster().server().store().get(resource, ns, name)
    }

    pub fn list(&self, resource: &str) -> Vec<Value> {
        self.sim.cluster().server().store().list(resource, None)
    }

    pub async fn wait<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub async fn pod(&self, name: &str, node: &str, labels: Value, extra: Value) {
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

    pub async fn pdb(&self, name: &str, app: &str, max_unavailable: i32) {
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

    pub async fn delete_claim(&self, name: &str) {
        let api: Api<NodeClaim> = Api::all(self.client().await);
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete claim");
    }

    /// The claim, its Node and its Machine are gone. (Other claims may exist: the provisioner
    /// launches capacity for a deleting node's pods before they are evicted.)
    pub async fn gone(&self, claim: &str, node: &str) {
        self.wait("the claim, its Node and its Machine gone", || {
            (self.get("nodeclaims", "", claim).is_none()
                && self.get("nodes", "", node).is_none()
                && !self.list("machines").iter().any(|m| {
                    m["metadata"]["annotations"]
                        [karpenter_capi::api::wellknown::NODECLAIM_ANNOTATION]
                        == claim
                }))
            .then_some(())
        })
        .await;
    }

    /// Evictions (and deletions) by the controller, in order: (verb, pod).
    pub fn removals(&self) -> Vec<(String, String)> {
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
    pub fn evictions_of(&self, name: &str) -> Vec<String> {
        self.sim
            .cluster()
            .stats()
            .writes()
            .into_iter()
            .filter(|w| w.resource == "pods" && w.subresource == "eviction" && w.name == name)
            .map(|w| w.agent)
            .collect()
    }

    pub fn events(&self, reason: &str) -> Vec<Value> {
        // kube's Recorder writes events.k8s.io/v1 Events.
        let mut all = self.list("events.events.k8s.io");
        all.retain(|e| e["reason"] == reason);
        all
    }

    pub fn assert_clean(&self) {
        let violations = self.sim.cluster().stats().violations();
        assert!(violations.is_empty(), "drain rules broken: {violations:#?}");
        let inv = invariants::check(
            self.sim.cluster().server().store(),
            self.sim.cluster().capi_version(),
        );
        assert!(inv.ok(), "invariants violated: {:#?}", inv.problems);
    }
}

pub fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

pub fn condition<'a>(c: &'a Value, ty: &str) -> Option<&'a Value> {
    c.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|x| x["type"] == ty))
}
