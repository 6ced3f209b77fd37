//! `karpenter-capi simulate`: the embedded simulated cluster on its own runtime, the controller on
//! an actix System, a scenario that drives both, and a report measured by the simulated server.
//! Tests use the same pieces (`Harness`), so what the README shows is what the tests check.

/// A line of `simulate`'s narration on stderr, unless it is turned off
/// ([`progress::set_narrating`]). Results, warnings and errors use `eprintln!`.
macro_rules! say {
    ($($t:tt)*) => {
        if $crate::simulate::progress::narrating() {
            eprintln!($($t)*);
        }
    };
}

pub mod buffer;
pub mod cpu;
pub mod disruption;
pub mod drain;
pub mod events;
pub mod fleet;
pub mod from_cluster;
pub mod generate;
pub mod html;
pub mod invariants;
pub mod launch;
pub mod node_groups;
pub mod observer;
pub mod output;
pub mod overlay;
pub mod pods;
mod progress;
pub use progress::set_narrating;
pub mod quota;
pub mod report;
pub mod serve;
mod standins;
pub mod standup;
pub mod static_pool;
pub mod timeline;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::actors::Settings;
use crate::actors::controller::{Controller, ControllerHandle};
use crate::capi::version::CapiVersion;
use crate::cli::{CapiVersionArg, ClusterApiArg, ControlPlaneArg, Scenario, SimulateArgs};
use crate::controlplane::cluster_api;
use crate::metrics::Metrics;
use crate::sim::cluster::{
    Backend, ClusterApiBackend, ServedVersions, SimCluster, SimClusterConfig,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("simulated cluster: {0}")]
    Sim(#[from] crate::sim::cluster::Error),
    #[error("starting the simulated cluster's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("simulated cluster task failed: {0}")]
    Join(String),
    #[error("kube client for the simulated cluster: {0}")]
    Client(String),
    #[error("starting the controller: {0}")]
    Controller(#[from] crate::actors::controller::StartError),
    #[error("{what}: {source}")]
    Kube { what: String, source: kube::Error },
    #[error("scenario did not settle within {0:?}")]
    Deadline(Duration),
    #[error("scenario did not settle within {after:?}: {why}")]
    NotSettled { after: Duration, why: String },
    #[error(transparent)]
    Report(#[from] output::Error),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    FromCluster(Box<from_cluster::Error>),
}

/// The simulated cluster running on a runtime of its own (one worker thread), so that the
/// controller under test shares nothing with it but HTTP on 127.0.0.1.
pub struct BackgroundSim {
    cluster: Arc<SimCluster>,
    runtime: Option<tokio::runtime::Runtime>,
    /// Counts the cluster over time for the report's charts.
    sampler: timeline::Sampler,
    /// CPU of the controller's threads apart from this cluster's, from the start.
    cpu: cpu::CpuMeter,
}

impl BackgroundSim {
    /// Start the cluster on a new runtime. The runtime is built on a thread of its own so this
    /// works from inside another runtime (the controller's actix System).
    pub async fn start(cfg: SimClusterConfig) -> Result<Self, Error> {
        Self::start_preloaded(cfg, None).await
    }

    /// [`BackgroundSim::start`], with `preload` in the store before the stand-ins start
    /// ([`SimCluster::start_preloaded`]).
    pub async fn start_preloaded(
        cfg: SimClusterConfig,
        preload: Option<crate::sim::cluster::Preload>,
    ) -> Result<Self, Error> {
        let cpu = cpu::CpuMeter::start();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Named so the CPU meter counts the cluster's start (seeding its store) as the cluster's.
        let builder = std::thread::Builder::new().name(format!("{}-start", cpu::SIM_THREAD));
        let spawned = builder.spawn(move || {
            let started = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                // Every thread of this runtime (workers and blocking pool) carries this name.
                .thread_name(cpu::SIM_THREAD)
                .enable_all()
                .build()
                .map_err(Error::Runtime)
                .and_then(|rt| {
                    let cluster = rt.block_on(SimCluster::start_preloaded(cfg, preload))?;
                    Ok((rt, cluster))
                });
            let _ = tx.send(started);
        });
        spawned.map_err(Error::Runtime)?;
        let (runtime, cluster) = rx.await.map_err(|e| Error::Join(e.to_string()))??;
        let cluster = Arc::new(cluster);
        let sampler = timeline::Sampler::default();
        runtime.spawn(sampler.clone().run(Arc::downgrade(&cluster)));
        Ok(Self {
            cluster,
            runtime: Some(runtime),
            sampler,
            cpu,
        })
    }

    /// The cluster over time since it started, up to now.
    pub fn timeline(&self) -> timeline::Timeline {
        self.sampler.timeline(&self.cluster)
    }

    /// Record that the scenario moves to its next phase now (a labelled line on every chart).
    pub fn mark(&self, label: &str) {
        self.sampler.mark(self.cluster.stats().now_ms(), label);
    }

    /// CPU spent by the controller's threads and by this cluster's since it started.
    pub fn cpu_ms(&self, claims: usize) -> cpu::CpuMs {
        let mut ms = self.cpu.read(claims);
        let pids = self
            .cluster
            .with_control_plane(|p| p.pids().into_iter().map(|(_, pid)| pid).collect::<Vec<_>>());
        ms.control_plane = pids.and_then(|p| cpu::processes_ms(&p));
        ms
    }

    pub fn cluster(&self) -> &Arc<SimCluster> {
        &self.cluster
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.cluster.kubeconfig_path().to_path_buf()
    }

    /// Run `f` on the simulated cluster's runtime and wait for it from any runtime.
    pub async fn run<F, Fut, T>(&self, f: F) -> Result<T, Error>
    where
        F: FnOnce(Arc<SimCluster>) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let fut = f(self.cluster.clone());
        match &self.runtime {
            Some(rt) => rt.spawn(fut).await.map_err(|e| Error::Join(e.to_string())),
            None => Err(Error::Join("runtime stopped".into())),
        }
    }

    /// Start `f` on the simulated cluster's runtime and leave it running.
    pub fn spawn<F, Fut>(&self, f: F)
    where
        F: FnOnce(Arc<SimCluster>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        if let Some(rt) = &self.runtime {
            rt.spawn(f(self.cluster.clone()));
        }
    }

    /// A client for the simulated cluster, built on the caller's runtime (the controller's).
    pub async fn client_here(&self) -> Result<kube::Client, Error> {
        client_on_this_runtime(self.cluster.kubeconfig_path(), None).await
    }

    /// A client for the cluster holding Karpenter's objects (the management cluster's with
    /// `SimClusterConfig::karpenter_in_management`), built on the caller's runtime.
    pub async fn karpenter_client_here(&self) -> Result<kube::Client, Error> {
        let path = match self.cluster.karpenter_binding() {
            Some(_) => self.cluster.management_kubeconfig_path(),
            None => None,
        };
        client_on_this_runtime(path.unwrap_or(self.cluster.kubeconfig_path()), None).await
    }

    /// The controller's client, built on the caller's runtime, counting the requests the server
    /// throttled in `throttled`: on a real control plane it authenticates as the controller's
    /// own user (see `SimCluster::controller_kubeconfig_path`).
    pub async fn controller_client_here(
        &self,
        throttled: Option<crate::retry_after::Throttled>,
    ) -> Result<kube::Client, Error> {
        client_on_this_runtime(self.cluster.controller_kubeconfig_path(), throttled).await
    }
}

async fn client_on_this_runtime(
    kubeconfig: &std::path::Path,
    throttled: Option<crate::retry_after::Throttled>,
) -> Result<kube::Client, Error> {
    let options = crate::app::ClientOptions {
        throttled,
        ..crate::app::ClientOptions::default()
    };
    crate::app::client_from_kubeconfig_with(kubeconfig, &options)
        .await
        .map_err(Error::Client)
}

impl Drop for BackgroundSim {
    fn drop(&mut self) {
        // A real control plane's processes outlive this process unless stopped; the cluster
        // may still be referenced by tasks of the runtime stopped below.
        self.cluster.stop_processes();
        // The stand-ins and the server are tasks of this runtime; they end with it.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// A scenario's cluster and controller after its report: `simulate --serve` keeps them running;
/// dropping this stops both.
pub struct Kept {
    pub sim: BackgroundSim,
    pub controller: Option<ControllerHandle>,
}

impl Kept {
    pub fn new(sim: BackgroundSim, controller: Option<ControllerHandle>) -> Self {
        Self { sim, controller }
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        // The controller before the cluster, so it does not log the API server going away.
        if let Some(c) = self.controller.take() {
            c.stop();
        }
    }
}

/// Says the simulated cluster is up. Its kubeconfig is named only where it outlives the run
/// (`--serve`, `--kubeconfig-out`); otherwise it is a temporary file deleted at exit.
pub fn announce(sim: &BackgroundSim, args: &SimulateArgs, kinds: &str) {
    if args.serve.kubeconfig_out().is_some() {
        say!(
            "simulated cluster up; watch it with: kubectl --kubeconfig {} get {kinds}",
            sim.kubeconfig().display()
        );
    } else {
        say!(
            "simulated cluster up at {} until the scenario ends (--serve keeps it up for kubectl)",
            sim.cluster().url()
        );
    }
}

/// Settings tuned for simulations: the defaults of `run`, with the create timeout chosen by the
/// scenario.
pub fn sim_settings(create_timeout: Option<Duration>) -> Settings {
    let mut s = Settings {
        // Simulated pods start and stop in milliseconds; a second still catches pods bound
        // just before the disrupted taint landed.
        min_drain_time: Duration::from_secs(1),
        ..Settings::default()
    };
    if let Some(t) = create_timeout {
        s.create_timeout = t;
        // Keep failed offerings out only briefly so a short simulation can recover.
        s.unavailable_offering_ttl = t.min(s.unavailable_offering_ttl);
    }
    s
}

/// Start the controller against the simulated cluster on the current actix System.
pub async fn start_controller(
    sim: &BackgroundSim,
    settings: Settings,
    metrics: Arc<Metrics>,
) -> Result<ControllerHandle, Error> {
    start_controller_shadowed(sim, settings, metrics, None).await
}

/// The controller on `sim`, in shadow mode when `shadow` is given (its writes recorded there,
/// none sent).
pub async fn start_controller_shadowed(
    sim: &BackgroundSim,
    settings: Settings,
    metrics: Arc<Metrics>,
    shadow: Option<crate::shadow::Shadow>,
) -> Result<ControllerHandle, Error> {
    let mut settings = Settings {
        dry_run: shadow
            .as_ref()
            .is_some_and(crate::shadow::Shadow::refuses_writes),
        ..settings
    };
    // Karpenter's objects in the management cluster: the controller is bound to the Cluster
    // they name, as `--karpenter-objects management` with its --cluster-name would bind it.
    if let Some((cluster, namespace)) = sim.cluster.karpenter_binding() {
        settings.karpenter_objects = Some(crate::view::binding::Binding {
            cluster: cluster.to_string(),
            namespace: namespace.to_string(),
        });
    }
    let options = crate::app::ClientOptions {
        throttled: Some(metrics.api_throttled.clone()),
        shadow,
        ..crate::app::ClientOptions::default()
    };
    let client =
        crate::app::client_from_kubeconfig_with(sim.cluster.controller_kubeconfig_path(), &options)
            .await
            .map_err(Error::Client)?;
    // With the management cluster apart, Cluster API's objects are reached there, as
    // `--cluster-api-kubeconfig` does.
    let management = match sim.cluster.management_kubeconfig_path() {
        Some(path) => crate::app::client_from_kubeconfig_with(path, &options)
            .await
            .map_err(Error::Client)?,
        None => client.clone(),
    };
    let (_tx, rx) = watch::channel(true);
    let controller = Controller {
        workload: client,
        management,
        capi_version: None,
        settings,
        metrics,
        instance: "simulate".into(),
    };
    Ok(controller.start(rx).await?)
}

pub fn capi_version(arg: CapiVersionArg) -> CapiVersion {
    match arg {
        CapiVersionArg::V1beta1 => CapiVersion::V1Beta1,
        CapiVersionArg::V1beta2 => CapiVersion::V1Beta2,
    }
}

/// The simulated cluster of a scenario, with the faults `--faults` asks for.
pub async fn start_sim(args: &SimulateArgs) -> Result<BackgroundSim, Error> {
    check_cluster_api(args)?;
    let sim = BackgroundSim::start(cluster_config(args)).await?;
    inject(&sim, &args.faults)?;
    Ok(sim)
}

/// Faults on the controller's own requests only (its User-Agent), as a proxy in front of the
/// API server would inject them; the stand-ins and the scenario's own requests go through.
/// Only the simulated server injects faults: on a real control plane `--faults` is an error.
pub fn inject(sim: &BackgroundSim, spec: &crate::cli::FaultSpec) -> Result<(), Error> {
    if spec.is_none() {
        return Ok(());
    }
    let faults = sim.cluster().faults()?;
    faults.set_agent(Some(crate::app::USER_AGENT));
    faults.set_rule(
        "*",
        crate::sim::FaultRule {
            error_rate: spec.errors,
            latency: spec.latency,
            conflict_rate: spec.conflicts,
            throttle_rate: spec.throttle,
            retry_after: spec.retry_after,
            ambiguous_rate: spec.ambiguous,
            watch_expire_rate: spec.watch_expire,
            ..Default::default()
        },
    );
    faults.set_watch_cut_every(spec.watch_cuts);
    Ok(())
}

/// The release of Cluster API's real manager for `--cluster-api-version`.
pub fn cluster_api_release(arg: CapiVersionArg) -> &'static str {
    match arg {
        CapiVersionArg::V1beta1 => cluster_api::RELEASE_V1BETA1,
        CapiVersionArg::V1beta2 => cluster_api::RELEASE_V1BETA2,
    }
}

/// `--cluster-api real` needs the real control plane and the installed release: said before
/// anything starts, naming the variable and the script that installs it.
pub fn check_cluster_api(args: &SimulateArgs) -> Result<(), Error> {
    check_karpenter_objects(args)?;
    if args.cluster_api != ClusterApiArg::Real {
        return Ok(());
    }
    if args.control_plane != ControlPlaneArg::Real {
        return Err(Error::Usage(
            "--cluster-api real runs Cluster API's manager against a real API server: add \
             --control-plane real"
                .into(),
        ));
    }
    cluster_api::Options::from_env(cluster_api_release(args.cluster_api_version))
        .check()
        .map_err(|e| Error::Usage(e.to_string()))
}

/// `--karpenter-objects management` puts a second simulated server beside the workload cluster:
/// one cluster on the simulated control plane, in the scenarios whose readings follow it.
fn check_karpenter_objects(args: &SimulateArgs) -> Result<(), Error> {
    if args.karpenter_objects == crate::cli::KarpenterObjects::Workload {
        return Ok(());
    }
    let supported = matches!(
        args.scenario,
        Scenario::Launch | Scenario::Pods | Scenario::Drain | Scenario::Consolidate
    );
    if args.control_plane != ControlPlaneArg::Simulated || args.clusters > 1 || !supported {
        return Err(Error::Usage(
            "--karpenter-objects management runs on the simulated control plane, one cluster, \
             scenarios launch, pods, drain and consolidate"
                .into(),
        ));
    }
    Ok(())
}

/// The report's `backend`: what served the API and who played Cluster API.
pub fn backend_json(cluster: &SimCluster) -> serde_json::Value {
    let control_plane = match cluster.backend() {
        Backend::Simulated => "simulated",
        Backend::Real => "real",
    };
    let cluster_api = match cluster.cluster_api_release() {
        Some(version) => serde_json::json!({"kind": "real", "version": version}),
        None => serde_json::json!({"kind": "simulated"}),
    };
    serde_json::json!({
        "control_plane": {"kind": control_plane},
        "cluster_api": cluster_api,
    })
}

/// `json` (one report object) with `backend` added.
fn with_backend(json: String, cluster: &SimCluster) -> String {
    match serde_json::from_str::<serde_json::Value>(&json) {
        Ok(serde_json::Value::Object(mut o)) => {
            o.insert("backend".into(), backend_json(cluster));
            serde_json::Value::Object(o).to_string()
        }
        _ => json,
    }
}

/// The simulated cluster's configuration for a scenario.
pub fn cluster_config(args: &SimulateArgs) -> SimClusterConfig {
    let version = capi_version(args.cluster_api_version);
    SimClusterConfig {
        backend: match args.control_plane {
            ControlPlaneArg::Simulated => Backend::Simulated,
            ControlPlaneArg::Real => Backend::Real,
        },
        cluster_api: match args.cluster_api {
            ClusterApiArg::Simulated => ClusterApiBackend::Simulated,
            ClusterApiArg::Real => ClusterApiBackend::Real {
                release: cluster_api_release(args.cluster_api_version).to_string(),
            },
        },
        capi_version: version.into(),
        served: match version {
            CapiVersion::V1Beta1 => ServedVersions::V1beta1,
            CapiVersion::V1Beta2 => ServedVersions::V1beta2,
        },
        provider_delay: args.provider_delay,
        jitter: args.jitter,
        fail_fraction: args.fail_fraction.clamp(0.0, 1.0),
        node_ready_delay: Duration::from_millis(100),
        node_delete_delay: Duration::from_millis(50),
        seed: args.seed,
        port: args.serve.port,
        kubeconfig_out: args.serve.kubeconfig_out(),
        karpenter_in_management: args.karpenter_objects == crate::cli::KarpenterObjects::Management,
        ..SimClusterConfig::default()
    }
}

/// `karpenter-capi simulate`: returns whether the invariants held. With `--serve` the cluster
/// (and the controller, unless `--no-controller`) keeps running after the report until SIGINT
/// or SIGTERM.
pub fn run(args: SimulateArgs) -> Result<bool, Error> {
    let system = actix::System::new();
    system.block_on(async move {
        if args.clusters > 1 && args.serve.serve {
            return fleet::serve(&args).await.map(|()| true);
        }
        if args.clusters > 1 {
            let outcome = fleet::run(&args).await?.outcome();
            outcome.emit(args.report, args.report_out.as_deref())?;
            return Ok(outcome.invariants_ok);
        }
        if let Some(source) = &args.from.from_cluster {
            return what_if(source, &args).await;
        }
        if args.serve.no_controller || args.scenario == Scenario::None {
            return serve::without_report(&args).await.map(|()| true);
        }
        if !args.serve.serve {
            let (outcome, _) = run_scenario(&args).await?;
            outcome.emit(args.report, args.report_out.as_deref())?;
            return Ok(outcome.invariants_ok);
        }
        // Listen before the scenario starts: SIGINT or SIGTERM while it runs stops it cleanly.
        let signal = crate::app::shutdown_signal();
        tokio::pin!(signal);
        tokio::select! {
            done = run_scenario(&args) => {
                let (outcome, kept) = done?;
                outcome.emit(args.report, args.report_out.as_deref())?;
                serve::hold(kept, &mut signal).await;
                Ok(outcome.invariants_ok)
            }
            name = &mut signal => {
                eprintln!("{name}: stopped before the scenario finished; no report");
                Ok(true)
            }
        }
    })
}

/// `--from-cluster`: the what-if of a live cluster, reported in the form `--report` asks for;
/// with `--serve` the copy and its controller keep running after the report.
async fn what_if(source: &std::path::Path, args: &SimulateArgs) -> Result<bool, Error> {
    let fail = |e| Error::FromCluster(Box::new(e));
    let (r, kept) = from_cluster::what_if(
        source,
        args.from.from_cluster_api.as_deref(),
        args.from.duration,
        true,
    )
    .await
    .map_err(fail)?;
    let outcome = output::Outcome {
        text: r.to_string(),
        json: r.to_json(),
        invariants_ok: r.invariants_ok,
        timeline: r.timeline,
    };
    outcome.emit(args.report, args.report_out.as_deref())?;
    if args.serve.serve {
        serve::hold(kept, crate::app::shutdown_signal()).await;
    }
    Ok(outcome.invariants_ok)
}

/// Runs the scenario `args` names (not `none`), reports it in every form, and keeps its
/// cluster and controller (for `--serve`).
pub async fn run_scenario(args: &SimulateArgs) -> Result<(output::Outcome, Kept), Error> {
    let (mut outcome, kept) = run_scenario_unnamed(args).await?;
    let cluster = kept.sim.cluster();
    outcome.json = with_backend(outcome.json, cluster);
    if cluster.backend() == Backend::Real {
        let capi = match cluster.cluster_api_release() {
            Some(release) => format!("Cluster API {release} (real manager)"),
            None => "Cluster API stand-in".to_string(),
        };
        outcome.text = format!(
            "{}\n  backend:  real control plane, {capi}",
            outcome.text.trim_end()
        );
    }
    Ok((outcome, kept))
}

async fn run_scenario_unnamed(args: &SimulateArgs) -> Result<(output::Outcome, Kept), Error> {
    let outcome = |text: String, json: String, invariants_ok: bool, timeline| output::Outcome {
        text,
        json,
        invariants_ok,
        timeline,
    };
    Ok(match args.scenario {
        Scenario::Launch => {
            let (r, kept) = launch::run_kept(args).await?;
            let ok = r.invariants_ok;
            (outcome(r.to_string(), r.to_json(), ok, r.timeline), kept)
        }
        Scenario::Drain => {
            let (r, kept) = drain::run_kept(args).await?;
            let ok = r.invariants_ok();
            (
                outcome(r.to_string(), r.to_json(), ok, r.pods.launch.timeline),
                kept,
            )
        }
        Scenario::Consolidate | Scenario::Drift | Scenario::Expire => {
            let (r, kept) = disruption::run_kept(args).await?;
            let ok = r.invariants_ok();
            (
                outcome(r.to_string(), r.to_json(), ok, r.pods.launch.timeline),
                kept,
            )
        }
        Scenario::Buffer => {
            let (r, kept) = buffer::run_kept(args).await?;
            let ok = r.pods.launch.invariants_ok;
            (
                outcome(r.to_string(), r.to_json(), ok, r.pods.launch.timeline),
                kept,
            )
        }
        Scenario::Default | Scenario::Pods => {
            let (r, kept) = pods::run_kept(args).await?;
            let ok = r.launch.invariants_ok;
            (
                outcome(r.to_string(), r.to_json(), ok, r.launch.timeline),
                kept,
            )
        }
        Scenario::Overlay => {
            let (r, kept) = overlay::run_kept(args).await?;
            let text = r.to_string();
            (
                over_pods(text, r.to_json(), r.invariants_ok(), &r.pods),
                kept,
            )
        }
        Scenario::Quota => {
            let (r, kept) = quota::run_kept(args).await?;
            let text = r.to_string();
            (
                over_pods(text, r.to_json(), r.invariants_ok(), &r.pods),
                kept,
            )
        }
        Scenario::Generate => {
            let (r, kept) = generate::run_kept(args).await?;
            let text = r.to_string();
            (
                over_pods(text, r.to_json(), r.invariants_ok(), &r.pods),
                kept,
            )
        }
        Scenario::Static | Scenario::Repair | Scenario::FullPool => {
            let (r, kept) = static_pool::run_kept(args).await?;
            let ok = r.invariants_ok;
            (
                outcome(r.to_string(), r.to_json(), ok, r.timeline.clone()),
                kept,
            )
        }
        Scenario::None => {
            return Err(Error::Usage(
                "--scenario none has no workload to report on; it only serves (--serve)".into(),
            ));
        }
    })
}

/// The outcome of a report that adds a section to the pods report (its timeline is theirs).
fn over_pods(text: String, json: String, ok: bool, pods: &pods::PodReport) -> output::Outcome {
    output::Outcome {
        text,
        json,
        invariants_ok: ok,
        timeline: pods.launch.timeline.clone(),
    }
}
