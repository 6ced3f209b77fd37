//! The simulated cluster with one controller, as every integration test uses it: one `Env`
//! (cluster, seeded MachineDeployments, NodeClass and NodePool, the controller, store reads and
//! writes) and one `eventually`. An `Env` runs on either backend ([`EnvBuilder::backend`]): its
//! reads go through `SimCluster::store()` (the real backend's mirror), and what only the
//! simulated server has fails loudly on the real one ([`Env::simulated_only`]). Pure builders (NodePool, pod, instance type) are in
//! `karpenter_capi::testing`.
#![allow(dead_code)] // each test binary uses a part of this module

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use karpenter_capi::actors::Settings;
use karpenter_capi::actors::controller::ControllerHandle;
use karpenter_capi::api::duration::GoDuration;
use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::cli::{Scenario, SimulateArgs};
use karpenter_capi::metrics::Metrics;
use karpenter_capi::sim::capi::CapiVersion as StandinVersion;
use karpenter_capi::sim::cluster::{Backend, MachineDeploymentSeed, SimClusterConfig};
use karpenter_capi::simulate::launch::{
    self, claim_for, create_claims_in, seed_karpenter_objects, seed_of, settle,
};
use karpenter_capi::simulate::{BackgroundSim, invariants, sim_settings, start_controller};

pub use karpenter_capi::testing::merge;

pub mod buffers;
pub mod chart;
pub mod claims;
pub mod explain;
pub mod exposition;
pub mod go_provider;
pub mod machine_size;
pub mod repair;
pub mod replicas;
pub mod static_pools;
pub mod unknown_groups;

/// How long a wait may take before the test fails: only a guard against hangs (nothing asserts
/// on durations), generous because the suite shares two cores with other builds.
pub const DEADLINE: Duration = Duration::from_secs(120);
/// How long a cluster may take to settle: the 1,000-claim launch settles in about 40 s on an
/// idle 2-core machine and took over 120 s once with other builds beside it.
pub const SETTLE: Duration = Duration::from_secs(300);
/// How long a launch for 1,000 pending pods may take from the Deployment's creation until
/// every pod is bound: under a minute on an idle 2-core machine, over 120 s at load 20, when
/// the controller's thread gets a tenth of a core.
pub const LAUNCH: Duration = Duration::from_secs(600);
pub const NS: &str = "default";

/// With `RUST_LOG` set (`RUST_LOG=karpenter_capi=debug cargo test ...`), the controller's and
/// the stand-ins' logs go to the test's output; without it, nothing is logged.
pub fn logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// Polls `check` until it returns Some, failing the test after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_explained(what, check, String::new).await
}

/// [`eventually`] for a check that needs no awaiting (a read of the simulated store).
pub async fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    eventually(what, || std::future::ready(check())).await
}

/// [`eventually`], with `explain`'s account of the state added to the failure.
pub async fn eventually_explained<T, F, Fut>(
    what: &str,
    check: F,
    explain: impl FnOnce() -> String,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(DEADLINE, Duration::from_millis(50), what, check, explain).await
}

/// [`eventually_explained`] with its own deadline, looking every `every`.
pub async fn eventually_within<T, F, Fut>(
    deadline: Duration,
    every: Duration,
    what: &str,
    mut check: F,
    explain: impl FnOnce() -> String,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out waiting for {what}\n{}", explain());
        }
        tokio::time::sleep(every).await;
    }
}

/// A `simulate` scenario as a typed spec: the command line's own defaults (so they are written
/// once), with a deadline that only guards hangs; a test names the fields it changes:
/// `SimulateArgs { pods: 40, ..scenario(Scenario::Pods) }`.
pub fn scenario(kind: Scenario) -> SimulateArgs {
    let mut args = SimulateArgs::from_words(&[]).expect("simulate's defaults parse");
    args.scenario = kind;
    args.deadline = Duration::from_secs(300);
    args
}

/// The simulated cluster with short provider and kubelet delays, its scheduler stand-in on; at
/// the controller's or the stand-ins' spelling of a Cluster API version.
pub fn standin_cluster(version: impl Into<StandinVersion>) -> SimClusterConfig {
    SimClusterConfig {
        capi_version: version.into(),
        provider_delay: Duration::from_millis(30),
        jitter: Duration::from_millis(20),
        node_ready_delay: Duration::from_millis(30),
        node_delete_delay: Duration::from_millis(10),
        ..SimClusterConfig::default()
    }
}

/// Marks Machine `name` for deletion and waits until Cluster API's stand-in cache has the
/// mark. Its MachineSet decides from that cache, as the real one does: a scale-down it sees
/// before the mark is spent on another Machine (the controller reads such spent decrements
/// back), so a test about the order once the mark is seen waits for it.
pub async fn mark_for_deletion(cluster: &karpenter_capi::sim::cluster::SimCluster, name: &str) {
    use karpenter_capi::api::wellknown::DELETE_MACHINE_ANNOTATION;
    use kube::ResourceExt;
    let api: kube::Api<kube::core::DynamicObject> =
        kube::Api::namespaced_with(cluster.client(), NS, &cluster.capi_version().machine());
    karpenter_capi::sim::standin::merge_patch(
        &api,
        name,
        &serde_json::json!({"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: "true"}}}),
    )
    .await
    .expect("mark the Machine");
    eventually("the mark in Cluster API's cache", || async {
        cluster
            .capi_caches()
            .machine(NS, name)
            .filter(|m| m.annotations().contains_key(DELETE_MACHINE_ANNOTATION))
            .map(|_| ())
    })
    .await;
}

/// MachineDeployment `name` of 4 CPUs and 16 GiB, a member of the autoscaled set, for the
/// stand-in tests.
pub fn md_seed(name: &str, replicas: i64) -> MachineDeploymentSeed {
    use karpenter_capi::api::wellknown::{CPU_ANNOTATION, MEMBER_LABEL, MEMORY_ANNOTATION};
    MachineDeploymentSeed {
        name: name.into(),
        namespace: NS.into(),
        replicas,
        labels: [(MEMBER_LABEL.into(), String::new())].into(),
        template_labels: [("node-role.kubernetes.io/worker".into(), String::new())].into(),
        annotations: [
            (CPU_ANNOTATION.into(), "4".into()),
            (MEMORY_ANNOTATION.into(), "16Gi".into()),
        ]
        .into(),
        ..Default::default()
    }
}

/// The cluster of termination and disruption tests: fast, pods placed by the test.
pub fn fast_cluster() -> SimClusterConfig {
    SimClusterConfig {
        capi_version: StandinVersion::V1Beta2,
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

/// The simulated cluster, seeded, and a controller on it.
pub struct Env {
    pub sim: BackgroundSim,
    pub pool: NodePool,
    pub metrics: std::sync::Arc<Metrics>,
    pub controller: Option<ControllerHandle>,
}

/// What an [`Env`] starts with; by default [`fast_cluster`], MachineDeployment `sim-0` (10 at
/// most), the NodeClass and NodePool `default`, and the simulation's controller settings.
pub struct EnvBuilder {
    cluster: SimClusterConfig,
    /// Applied over `cluster`'s, whichever is set first.
    backend: Option<Backend>,
    seeds: Vec<MachineDeploymentSeed>,
    /// MachinePools from the same seeds, with (true) or without MachinePool Machines.
    pools: Vec<(MachineDeploymentSeed, bool)>,
    settings: Settings,
    limits: Option<Value>,
}

impl EnvBuilder {
    pub fn cluster(mut self, cluster: SimClusterConfig) -> Self {
        self.cluster = cluster;
        self
    }

    /// Which API server the cluster runs on; the configuration's own otherwise.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// These MachineDeployments instead of `sim-0`.
    pub fn seeds(mut self, seeds: Vec<MachineDeploymentSeed>) -> Self {
        self.seeds = seeds;
        self
    }

    /// These MachinePools as well (a seed's fields as a MachineDeployment's; the flag: with
    /// MachinePool Machines).
    pub fn pools(mut self, pools: Vec<(MachineDeploymentSeed, bool)>) -> Self {
        self.pools = pools;
        self
    }

    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// Edits the controller's settings.
    pub fn tune(mut self, tune: impl FnOnce(&mut Settings)) -> Self {
        tune(&mut self.settings);
        self
    }

    /// Batching windows short enough for tests that provision pods.
    pub fn short_batches(self) -> Self {
        self.tune(|s| {
            s.batching.idle = Duration::from_millis(200);
            s.batching.max = Duration::from_secs(2);
        })
    }

    /// The NodePool's `spec.limits`.
    pub fn limits(mut self, limits: Value) -> Self {
        self.limits = Some(limits);
        self
    }

    /// The seeded cluster alone, for tests that start their own controllers.
    pub async fn seeded(mut self) -> (BackgroundSim, NodePool) {
        logs();
        if let Some(backend) = self.backend {
            self.cluster.backend = backend;
        }
        let sim = BackgroundSim::start(self.cluster)
            .await
            .expect("simulated cluster");
        let (seeds, pools, limits) = (self.seeds, self.pools, self.limits);
        let pool = sim
            .run(move |c| async move {
                for s in &seeds {
                    c.create_machine_deployment_from(s)
                        .await
                        .expect("seed MachineDeployment");
                }
                for (s, pool_machines) in &pools {
                    c.create_machine_pool_from(s, *pool_machines, None)
                        .await
                        .expect("seed MachinePool");
                }
                let pool = seed_karpenter_objects(&c)
                    .await
                    .expect("seed NodeClass and NodePool");
                let Some(limits) = limits else {
                    return pool;
                };
                let api: Api<NodePool> = Api::all(c.karpenter_client());
                api.patch(
                    &pool.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"limits": limits}})),
                )
                .await
                .expect("NodePool limits")
            })
            .await
            .expect("seeding");
        (sim, pool)
    }

    pub async fn start(self) -> Env {
        let settings = self.settings.clone();
        let (sim, pool) = self.seeded().await;
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
}

pub async fn env() -> Env {
    Env::builder().start().await
}

pub async fn env_with(settings: Settings) -> Env {
    Env::builder().settings(settings).start().await
}

pub async fn env_cfg(cfg: SimClusterConfig, settings: Settings) -> Env {
    Env::builder().cluster(cfg).settings(settings).start().await
}

impl Env {
    pub fn builder() -> EnvBuilder {
        EnvBuilder {
            cluster: fast_cluster(),
            backend: None,
            seeds: vec![seed_of(0, 10)],
            pools: Vec::new(),
            settings: sim_settings(None),
            limits: None,
        }
    }

    /// The running controller.
    pub fn controller(&self) -> &ControllerHandle {
        self.controller.as_ref().expect("a running controller")
    }

    /// Kill the controller (in-flight work abandoned, as in a crash) and start a new one.
    pub async fn restart(&mut self) {
        self.restart_with(sim_settings(None)).await;
    }

    /// Kill the controller and start one with these settings.
    pub async fn restart_with(&mut self, settings: Settings) {
        self.kill();
        self.start_with(settings).await;
    }

    /// Kill the controller (in-flight work abandoned, as in a crash); the cluster runs on.
    pub fn kill(&mut self) {
        if let Some(c) = self.controller.take() {
            c.stop();
        }
    }

    /// Start a controller with these settings (after `kill`).
    pub async fn start_with(&mut self, settings: Settings) {
        self.controller = Some(
            start_controller(&self.sim, settings, self.metrics.clone())
                .await
                .expect("controller restarts"),
        );
    }

    pub async fn client(&self) -> kube::Client {
        self.sim.client_here().await.expect("client")
    }

    /// A client for the cluster holding Karpenter's objects.
    pub async fn karpenter_client(&self) -> kube::Client {
        (self.sim.karpenter_client_here().await).expect("client")
    }

    /// One initialized claim (with this termination grace period); returns (claim, node).
    pub async fn claim(&self, grace: Option<Duration>) -> (String, String) {
        let mut claim = claim_for(&self.pool, "sim-0");
        claim.spec.termination_grace_period = grace.map(GoDuration);
        let name = self.create_claim(&claim).await;
        settle(&self.sim, DEADLINE).await.expect("settles");
        let node = self
            .wait("the claim's node", || {
                self.get("nodeclaims", "", &name)
                    .and_then(|c| c["status"]["nodeName"].as_str().map(String::from))
            })
            .await;
        (name, node)
    }

    /// Creates `claim`; returns its name.
    pub async fn create_claim(&self, claim: &NodeClaim) -> String {
        let api: Api<NodeClaim> = Api::all(self.client().await);
        api.create(&PostParams::default(), claim)
            .await
            .expect("create claim")
            .name_any()
    }

    pub fn backend(&self) -> Backend {
        self.sim.cluster().backend()
    }

    /// Fails the test on the real backend: for what exists only on the simulated server (its
    /// faults, Events in its store), so a test body shared by both backends cannot read an
    /// empty answer there as a pass.
    pub fn simulated_only(&self, what: &str) {
        assert_eq!(
            self.backend(),
            Backend::Simulated,
            "{what} exists only on the simulated backend"
        );
    }

    /// An object of the cluster that holds `resource` (Cluster API's kinds in the management
    /// cluster when it is apart).
    pub fn get(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        self.sim
            .cluster()
            .store_of(resource)
            .get(resource, ns, name)
    }

    pub fn list(&self, resource: &str) -> Vec<Value> {
        self.sim.cluster().store_of(resource).list(resource, None)
    }

    pub async fn wait<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        eventually_explained(what, || std::future::ready(f()), || self.explain()).await
    }

    /// Waits until `done` holds.
    pub async fn until(&self, what: &str, done: impl Fn(&Env) -> bool) {
        self.wait(what, || done(self).then_some(())).await
    }

    /// Waits until `done` holds and the launch path is quiet.
    pub async fn until_quiet(&self, what: &str, done: impl Fn(&Env) -> bool) {
        self.until(what, |e| done(e) && launch::quiet(e.sim.cluster()))
            .await
    }

    /// Waits, up to [`LAUNCH`], until `pods` pods are bound and the launch path is quiet: the
    /// end of a large launch, however long the machine's load makes it. Looked at on the
    /// cluster's runtime when the store changes, not polled from the controller's thread,
    /// which a loaded machine starves already.
    pub async fn until_launched(&self, pods: usize) {
        let sim = &self.sim;
        let done = launch::wait_until(sim, LAUNCH, || async move {
            sim.run(move |c| async move {
                let mut bound = 0;
                c.store().visit("pods", |p| {
                    bound += usize::from(p.pointer("/spec/nodeName").is_some_and(Value::is_string))
                });
                bound == pods && launch::quiet(&c)
            })
            .await
        })
        .await
        .expect("the cluster's runtime");
        assert!(
            done,
            "timed out waiting for {pods} pods bound\n{}",
            self.explain()
        );
    }

    /// Where the cluster stands, for a failed wait.
    fn explain(&self) -> String {
        let groups: Vec<(Value, Value, Value)> = ["machinedeployments", "machinepools"]
            .iter()
            .flat_map(|r| self.list(r))
            .map(|g| {
                (
                    g["metadata"]["name"].clone(),
                    g["spec"]["replicas"].clone(),
                    g["metadata"]["annotations"].clone(),
                )
            })
            .collect();
        format!(
            "{}\n{:#?}\ngroups (name, replicas, annotations): {groups:#?}\nclaims: {:#?}",
            launch::progress_line(self.sim.cluster()),
            launch::unsettled(self.sim.cluster()),
            self.list("nodeclaims")
                .iter()
                .map(|c| (c["metadata"].clone(), c["status"]["conditions"].clone()))
                .collect::<Vec<_>>()
        )
    }

    /// Every claim launched, registered and initialized, or gone.
    pub async fn settle(&self) {
        settle(&self.sim, SETTLE)
            .await
            .expect("the cluster settles");
    }

    /// `n` claims as Karpenter's provisioner writes them, over the first `mds` MachineDeployments.
    pub async fn claims(&self, n: usize, mds: usize) -> Vec<String> {
        let pool = self.pool.clone();
        self.sim
            .run(move |c| async move { create_claims_in(&c, &pool, n, mds).await })
            .await
            .expect("run")
            .expect("claims")
    }

    /// Pods bound to a node.
    pub fn bound_pods(&self) -> usize {
        self.list("pods")
            .iter()
            .filter(|p| {
                p.pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .is_some()
            })
            .count()
    }

    /// `spec.replicas` of MachineDeployment `md` (-1 when it has none).
    pub fn replicas(&self, md: &str) -> i64 {
        self.list("machinedeployments")
            .iter()
            .find(|m| m["metadata"]["name"] == md)
            .and_then(|m| m.pointer("/spec/replicas").and_then(Value::as_i64))
            .unwrap_or(-1)
    }

    /// The Machines of MachineDeployment `md`.
    pub fn machines_of(&self, md: &str) -> Vec<Value> {
        self.list("machines")
            .into_iter()
            .filter(|m| {
                m["metadata"]["labels"][karpenter_capi::api::wellknown::DEPLOYMENT_NAME_LABEL] == md
            })
            .collect()
    }

    /// Writes by the controller to `resource`.
    pub fn controller_writes(&self, resource: &str) -> usize {
        let agent = karpenter_capi::app::USER_AGENT;
        self.sim
            .cluster()
            .stats()
            .writes()
            .iter()
            .filter(|w| w.agent == agent && w.resource == resource)
            .count()
    }

    pub fn invariants_hold(&self) -> invariants::Invariants {
        let cluster = self.sim.cluster();
        let inv = invariants::check_apart(
            cluster.karpenter_store(),
            cluster.capi_store(),
            cluster.capi_version().into(),
        );
        assert!(inv.ok(), "invariants violated: {:#?}", inv.problems);
        inv
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

    /// A PodTemplate `template` of one container requesting `cpu`/`memory`, and a
    /// CapacityBuffer `buffer` of `replicas` chunks of it, in namespace `ns`.
    pub async fn capacity_buffer(
        &self,
        ns: &str,
        (template, cpu, memory): (&str, &str, &str),
        buffer: &str,
        replicas: i32,
    ) {
        use k8s_openapi::api::core::v1::PodTemplate;
        use karpenter_capi::api::capacity_buffer::CapacityBuffer;
        let client = self.client().await;
        let t: PodTemplate = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": template, "namespace": ns},
            "template": {"spec": {"containers": [{
                "name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": cpu, "memory": memory}},
            }]}},
        }))
        .expect("a PodTemplate");
        Api::<PodTemplate>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &t)
            .await
            .expect("create the PodTemplate");
        let b: CapacityBuffer = serde_json::from_value(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
            "metadata": {"name": buffer, "namespace": ns},
            "spec": {"podTemplateRef": {"name": template}, "replicas": replicas},
        }))
        .expect("a CapacityBuffer");
        Api::<CapacityBuffer>::namespaced(client, ns)
            .create(&PostParams::default(), &b)
            .await
            .expect("create the CapacityBuffer");
    }

    pub async fn pdb(&self, name: &str, app: &str, max_unavailable: i32) {
        self.budget(name, app, json!({"maxUnavailable": max_unavailable}))
            .await
    }

    /// A budget of `minAvailable: min_available` (none of `maxUnavailable`): the form that
    /// counts pods with no controller. Under `maxUnavailable` the disruption controller expects
    /// pods from their controllers' scale, so bare pods are never allowed a disruption.
    pub async fn pdb_min_available(&self, name: &str, app: &str, min_available: i32) {
        let budget = json!({"minAvailable": min_available, "maxUnavailable": null});
        self.budget(name, app, budget).await
    }

    /// Creates PodDisruptionBudget `name` over pods `app=<app>` with `budget`, or sets it.
    async fn budget(&self, name: &str, app: &str, budget: Value) {
        let mut spec = json!({"selector": {"matchLabels": {"app": app}}});
        merge(&mut spec, budget.clone());
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": NS},
            "spec": spec,
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
                    &Patch::Merge(json!({"spec": budget})),
                )
                .await
                .expect("patch pdb");
            }
        }
    }

    /// Deletes a claim; one already gone is no failure.
    pub async fn delete_claim(&self, name: &str) {
        let api: Api<NodeClaim> = Api::all(self.client().await);
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => panic!("delete claim {name}: {e}"),
        }
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
        // The real backend's mirror does not watch Events.
        self.simulated_only("Events in the store");
        // kube's Recorder writes events.k8s.io/v1 Events.
        let mut all = self.list("events.events.k8s.io");
        all.retain(|e| e["reason"] == reason);
        all
    }

    pub fn assert_clean(&self) {
        let violations = self.sim.cluster().stats().violations();
        assert!(violations.is_empty(), "drain rules broken: {violations:#?}");
        // On the real backend the controller runs under the Helm chart's RBAC: a refused request
        // is a permission the chart lacks (the simulated server refuses none).
        let refused = self.sim.cluster().stats().refused();
        assert!(
            refused.is_empty(),
            "the API server refused the controller: {refused:?}"
        );
        self.invariants_hold();
    }
}

pub fn condition<'a>(c: &'a Value, ty: &str) -> Option<&'a Value> {
    c.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|x| x["type"] == ty))
}
