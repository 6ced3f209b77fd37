//! `simulate --clusters N`: a simulated fleet. One management API server holds N Clusters, each
//! in a namespace of its own (`fleet-<i>/sim`) with the kubeconfig Secret of a simulated
//! workload cluster of its own; one controller in fleet mode, in this process and through
//! `run --fleet`'s code path ([`crate::app::fleet::run`]), serves them all; the pods scenario
//! runs in every cluster at once; the report holds each cluster's pods report and a fleet
//! summary. A cluster whose scenario fails is reported as failed; the others go on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use serde::Serialize;
use serde_json::Value;

use super::observer::Observer;
use super::pods::{self, PodReport};
use super::report::Percentiles;
use super::{BackgroundSim, Error};
use crate::app::fleet::{ClusterMetrics, Fleet, Turns};
use crate::cli::{ControlPlaneArg, ReportFormat, Scenario, SimulateArgs};
use crate::metrics::Metrics;
use crate::sim::SimServer;
use crate::sim::cluster::{CLUSTER_NAME, SharedManagement, SimClusterConfig};

/// The scenarios a fleet runs in every cluster.
pub const SCENARIOS: [Scenario; 2] = [Scenario::Default, Scenario::Pods];

/// The management cluster's namespace of cluster `i`.
pub fn namespace_of(i: usize) -> String {
    format!("fleet-{i}")
}

/// `--clusters` above 1 refuses what it does not do, naming the flag.
pub fn check(args: &SimulateArgs) -> Result<(), Error> {
    let n = args.clusters;
    if n <= 1 {
        return Ok(());
    }
    if args.serve.serve {
        return check_serve(args);
    }
    if !SCENARIOS.contains(&args.scenario) {
        let names: Vec<String> = SCENARIOS.iter().map(scenario_name).collect();
        return Err(Error::Usage(format!(
            "--clusters {n} runs --scenario {} in every cluster; --scenario {} is not supported with --clusters above 1",
            names.join(" or "),
            scenario_name(&args.scenario)
        )));
    }
    let refused = [
        (
            "--control-plane real",
            args.control_plane == ControlPlaneArg::Real,
        ),
        ("--from-cluster", args.from.from_cluster.is_some()),
        ("--kubeconfig-out", args.serve.kubeconfig_out.is_some()),
        ("--port", args.serve.port != 0),
        ("--report html", args.report == ReportFormat::Html),
    ];
    match refused.into_iter().find(|(_, on)| *on) {
        Some((flag, _)) => Err(Error::Usage(format!(
            "{flag} is not supported with --clusters above 1 (a fleet runs on simulated API servers, reports in text or JSON and does not serve after the report; --serve --no-controller serves one for controllers run apart)"
        ))),
        None => Ok(()),
    }
}

/// `--clusters N --serve`: only the simulated fleet, for controllers run apart.
fn check_serve(args: &SimulateArgs) -> Result<(), Error> {
    let n = args.clusters;
    let usage = |m: String| Err(Error::Usage(m));
    if !args.serve.no_controller {
        return usage(format!(
            "--clusters {n} --serve serves the simulated fleet for controllers run apart: add --no-controller"
        ));
    }
    if args.serve.kubeconfig_out.is_none() {
        return usage(format!(
            "--clusters {n} --serve writes its kubeconfigs into a directory: give it with --kubeconfig-out DIR"
        ));
    }
    if args.scenario != Scenario::None && !SCENARIOS.contains(&args.scenario) {
        return usage(format!(
            "--clusters {n} --serve seeds --scenario none (idle clusters), default or pods (pending pods in each); not --scenario {}",
            scenario_name(&args.scenario)
        ));
    }
    let refused = [
        (
            "--control-plane real",
            args.control_plane == ControlPlaneArg::Real,
        ),
        ("--from-cluster", args.from.from_cluster.is_some()),
        ("--port", args.serve.port != 0),
        ("--nodes", args.nodes != 0),
    ];
    match refused.into_iter().find(|(_, on)| *on) {
        Some((flag, _)) => usage(format!(
            "{flag} is not supported with --clusters {n} --serve"
        )),
        None => Ok(()),
    }
}

fn scenario_name(s: &Scenario) -> String {
    s.to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_else(|| format!("{s:?}"))
}

/// One cluster of the fleet: its pods report, or why its scenario failed.
pub struct FleetCluster {
    /// `namespace/name` of its Cluster in the management cluster.
    pub cluster: String,
    pub result: Result<PodReport, String>,
    /// The price of its live Machines per hour at the end.
    pub cost_per_hour: f64,
    /// Its report's `backend` section.
    pub backend: Value,
    /// How many times the fleet started its controller (above 1: it stopped and was started
    /// again), and how many times it lost the Cluster's Lease while the controller ran.
    pub turns: Turns,
}

impl FleetCluster {
    fn ok(&self) -> bool {
        self.result.as_ref().is_ok_and(|r| r.launch.invariants_ok)
    }

    fn to_json(&self) -> Value {
        let mut v = match &self.result {
            Ok(r) => serde_json::from_str(&r.to_json()).unwrap_or(Value::Null),
            Err(e) => serde_json::json!({"error": e, "invariants_ok": false}),
        };
        if let Some(o) = v.as_object_mut() {
            o.insert("cluster".into(), self.cluster.clone().into());
            o.insert("cost_per_hour".into(), round2(self.cost_per_hour).into());
            o.insert("controller_starts".into(), self.turns.starts.into());
            let restarts = self.turns.starts.saturating_sub(1);
            o.insert("controller_restarts".into(), restarts.into());
            o.insert("leases_lost".into(), self.turns.leases_lost.into());
            o.insert("backend".into(), self.backend.clone());
        }
        v
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The fleet's run: every cluster's outcome, in the order of their namespaces.
pub struct FleetReport {
    pub clusters: Vec<FleetCluster>,
    pub elapsed_ms: u64,
}

/// Lowest, median and highest of one figure over the clusters.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    fn of(mut xs: Vec<f64>) -> Self {
        xs.sort_by(f64::total_cmp);
        match (xs.first(), xs.last()) {
            (Some(&min), Some(&max)) => Self {
                min,
                median: xs[xs.len() / 2],
                max,
            },
            _ => Self::default(),
        }
    }
}

/// The fleet's totals: sums over the clusters that ran, and the spread of their pod latency.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub clusters: usize,
    pub clusters_failed: usize,
    pub pods_pending_at_start: usize,
    pub pods_bound: usize,
    /// Pods still pending when their cluster's scenario ended (each a problem of its cluster).
    pub pods_pending_at_end: usize,
    pub claims_requested: usize,
    pub claims_initialized: usize,
    pub nodes_created: usize,
    pub nodes_remaining: usize,
    pub machines_created: usize,
    pub cost_per_hour: f64,
    pub invariant_violations: usize,
    pub invariants_ok: bool,
    /// Controller starts beyond the first, over the clusters (a Lease lost and taken back, or a
    /// start that failed and was tried again).
    pub controller_restarts: u64,
    /// Leases lost while their Cluster's controller ran, over the clusters; 0 in a run where
    /// every renewal kept its deadline.
    pub leases_lost: u64,
    /// Clusters that lost their Lease at least once.
    pub clusters_that_lost_leases: usize,
    /// Each cluster's pending -> bound p50 and p99, spread over the clusters.
    pub pod_pending_to_bound_p50_ms: Spread,
    pub pod_pending_to_bound_p99_ms: Spread,
    pub elapsed_ms: u64,
}

impl FleetReport {
    pub fn invariants_ok(&self) -> bool {
        self.clusters.iter().all(FleetCluster::ok)
    }

    pub fn summary(&self) -> Summary {
        let ran: Vec<&PodReport> = self
            .clusters
            .iter()
            .filter_map(|c| c.result.as_ref().ok())
            .collect();
        let sum = |f: fn(&PodReport) -> usize| ran.iter().map(|r| f(r)).sum::<usize>();
        let latency = |f: fn(&Percentiles) -> f64| {
            Spread::of(
                ran.iter()
                    .map(|r| f(&r.pod_latency_ms.pod_pending_to_bound))
                    .collect(),
            )
        };
        let cost: f64 = self.clusters.iter().map(|c| c.cost_per_hour).sum();
        Summary {
            clusters: self.clusters.len(),
            clusters_failed: self.clusters.len() - ran.len(),
            pods_pending_at_start: sum(|r| r.pods.pending_at_start),
            pods_bound: sum(|r| r.pods.bound),
            pods_pending_at_end: sum(|r| r.pods.unschedulable),
            claims_requested: sum(|r| r.launch.claims.requested),
            claims_initialized: sum(|r| r.launch.claims.initialized),
            nodes_created: sum(|r| r.nodes.created),
            nodes_remaining: sum(|r| r.nodes.remaining),
            machines_created: sum(|r| r.launch.machines.created),
            cost_per_hour: round2(cost),
            invariant_violations: sum(|r| r.launch.problems.len()),
            invariants_ok: self.invariants_ok(),
            controller_restarts: (self.clusters.iter())
                .map(|c| c.turns.starts.saturating_sub(1))
                .sum(),
            leases_lost: self.clusters.iter().map(|c| c.turns.leases_lost).sum(),
            clusters_that_lost_leases: (self.clusters.iter())
                .filter(|c| c.turns.leases_lost > 0)
                .count(),
            pod_pending_to_bound_p50_ms: latency(|p| p.p50),
            pod_pending_to_bound_p99_ms: latency(|p| p.p99),
            elapsed_ms: self.elapsed_ms,
        }
    }

    /// `{ "clusters": [...], "summary": {...} }`.
    pub fn to_json(&self) -> String {
        let clusters: Vec<Value> = self.clusters.iter().map(FleetCluster::to_json).collect();
        serde_json::json!({"clusters": clusters, "summary": self.summary()}).to_string()
    }

    pub fn outcome(&self) -> super::output::Outcome {
        super::output::Outcome {
            text: self.to_string(),
            json: self.to_json(),
            invariants_ok: self.invariants_ok(),
            timeline: Default::default(),
        }
    }
}

impl std::fmt::Display for FleetReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for c in &self.clusters {
            writeln!(f, "cluster {}:", c.cluster)?;
            match &c.result {
                Ok(r) => writeln!(f, "{}", r.to_string().trim_end())?,
                Err(e) => writeln!(f, "  failed: {e}")?,
            }
        }
        let s = self.summary();
        writeln!(
            f,
            "fleet: {} clusters ({} failed) in {:.1}s, one controller process",
            s.clusters,
            s.clusters_failed,
            s.elapsed_ms as f64 / 1000.0
        )?;
        writeln!(
            f,
            "  pods:     {} pending at start, {} bound, {} still pending at the end; claims {} requested, {} initialized; nodes {} created, {} remaining; cost/h {:.2}",
            s.pods_pending_at_start,
            s.pods_bound,
            s.pods_pending_at_end,
            s.claims_requested,
            s.claims_initialized,
            s.nodes_created,
            s.nodes_remaining,
            s.cost_per_hour
        )?;
        let (p50, p99) = (s.pod_pending_to_bound_p50_ms, s.pod_pending_to_bound_p99_ms);
        writeln!(
            f,
            "  latency:  pending -> bound p50 {:.0}/{:.0}/{:.0} ms, p99 {:.0}/{:.0}/{:.0} ms (min/median/max over the clusters)",
            p50.min, p50.median, p50.max, p99.min, p99.median, p99.max
        )?;
        writeln!(
            f,
            "  invariants: {} ({} violations)",
            if s.invariants_ok {
                "held in every cluster"
            } else {
                "VIOLATED or a cluster failed"
            },
            s.invariant_violations,
        )?;
        write!(
            f,
            "  leases:   {} lost in {} clusters; {} controller restarts",
            s.leases_lost, s.clusters_that_lost_leases, s.controller_restarts
        )
    }
}

/// `simulate --clusters N` (N above 1): the fleet stood up, the scenario run in every cluster
/// at once, each measured while the fleet still serves it.
pub async fn run(args: &SimulateArgs) -> Result<FleetReport, Error> {
    check(args)?;
    let started = Instant::now();
    let base = super::cluster_config(args);
    let server = SharedManagement::start_server(&base).await?;
    let sims = futures::future::try_join_all(
        (0..args.clusters).map(|i| start_cluster(args, &base, &server, i)),
    )
    .await?;
    say!(
        "{} simulated workload clusters up, their Clusters in one management API server at {}",
        sims.len(),
        server.url()
    );
    let fleet = fleet_of(args, &server).await?;
    let metrics = fleet.metrics.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut running = actix::spawn(crate::app::fleet::run(fleet, async move {
        let _ = stopped.await;
        "the scenario ended"
    }));
    let each = sims
        .iter()
        .enumerate()
        .map(|(i, sim)| run_cluster(args, sim, &metrics, i));
    let clusters = tokio::select! {
        done = futures::future::join_all(each) => done,
        ended = &mut running => {
            let why = match ended {
                Ok(Ok(())) => "it ended".to_string(),
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            return Err(Error::Join(format!("the fleet stopped before the scenario ended: {why}")));
        }
    };
    let _ = stop.send(());
    if let Ok(Err(e)) = running.await {
        tracing::warn!(error = %e, "the fleet ended with an error after the scenario");
    }
    Ok(FleetReport {
        clusters,
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// Workload cluster `i`: started with its Cluster in the shared management cluster, its node
/// groups, NodeClass and NodePool seeded, faults injected as `--faults` says.
async fn start_cluster(
    args: &SimulateArgs,
    base: &SimClusterConfig,
    server: &Arc<SimServer>,
    i: usize,
) -> Result<BackgroundSim, Error> {
    let cfg = SimClusterConfig {
        shared_management: Some(SharedManagement::new(server, &namespace_of(i))),
        // `--kubeconfig-out` is the fleet's directory (served fleets only).
        kubeconfig_out: (base.kubeconfig_out.as_ref())
            .map(|dir| dir.join(format!("{}.kubeconfig", namespace_of(i)))),
        // Clusters apart from each other: their randomness too.
        seed: base.seed.wrapping_add(i as u64),
        ..base.clone()
    };
    let sim = BackgroundSim::start(cfg).await?;
    super::inject(&sim, &args.faults)?;
    pods::seed_machine_deployments(&sim, args).await?;
    pods::seed_nodepool(&sim, |_| {}).await?;
    Ok(sim)
}

/// `simulate --clusters N --serve --no-controller --kubeconfig-out DIR`: the simulated fleet
/// served until SIGINT or SIGTERM for controllers run apart (one `run --fleet` or N `run`s,
/// as `scripts/fleet-cost.sh` runs them): DIR holds `management.kubeconfig` and each workload
/// cluster's `fleet-<i>.kubeconfig`. Every cluster is seeded as the scenario seeds it, and with
/// `--scenario pods` its pending pods are created; nothing is reported.
pub async fn serve(args: &SimulateArgs) -> Result<(), Error> {
    check(args)?;
    let signal = crate::app::shutdown_signal();
    let Some(dir) = args.serve.kubeconfig_out.clone() else {
        return Err(Error::Usage("--kubeconfig-out DIR is needed".into()));
    };
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::Usage(format!("--kubeconfig-out {}: {e}", dir.display())))?;
    let base = super::cluster_config(args);
    let server = SharedManagement::start_server(&base).await?;
    let management = dir.join("management.kubeconfig");
    std::fs::copy(server.kubeconfig_path(), &management)
        .map_err(|e| Error::Usage(format!("{}: {e}", management.display())))?;
    let sims = futures::future::try_join_all(
        (0..args.clusters).map(|i| start_cluster(args, &base, &server, i)),
    )
    .await?;
    if args.scenario != Scenario::None {
        futures::future::try_join_all(
            sims.iter()
                .map(|sim| pods::create_deployments(sim, args, |_, _| {})),
        )
        .await?;
    }
    eprintln!(
        "serving the simulated fleet ({} clusters) until SIGINT or SIGTERM\n  \
         management: {}\n  \
         karpenter-capi run --fleet --cluster-api-kubeconfig {}",
        sims.len(),
        management.display(),
        management.display()
    );
    let name = signal.await;
    eprintln!("{name}: stopping the simulated fleet");
    Ok(())
}

/// The fleet as `run --fleet` runs it, on the shared management cluster, with the settings of
/// the single-cluster pods scenario.
async fn fleet_of(args: &SimulateArgs, server: &SimServer) -> Result<Fleet, Error> {
    let path = server.kubeconfig_path();
    let client = |e: String| Error::Client(format!("{}: {e}", path.display()));
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| client(e.to_string()))?;
    let management = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| client(e.to_string()))?;
    Ok(Fleet {
        management,
        options: crate::app::ClientOptions::default(),
        selector: None,
        namespace: None,
        lease_namespace: "default".into(),
        identity: "simulate".into(),
        settings: pods::provisioning_settings(args),
        capi_version: Some(super::capi_version(args.cluster_api_version)),
        kubeconfig_secret: Default::default(),
        metrics: ClusterMetrics::default(),
        // A simulation's single replica: counting replicas often costs little here.
        share_period: Duration::from_secs(1),
        retry: Duration::from_secs(2),
        start_within: Duration::from_secs(120),
    })
}

/// Cluster `i`'s scenario and its report, or why it failed.
async fn run_cluster(
    args: &SimulateArgs,
    sim: &BackgroundSim,
    metrics: &ClusterMetrics,
    i: usize,
) -> FleetCluster {
    let cluster = format!("{}/{CLUSTER_NAME}", namespace_of(i));
    let result = provision(args, sim, metrics, &cluster)
        .await
        .map(|(observer, since_ms)| {
            let m = metrics.of(&cluster).unwrap_or_else(Metrics::new);
            let mut report = pods::measure(sim, &observer, args.pods, since_ms, &m);
            fail_pending_pods(&mut report);
            report
        });
    let c = sim.cluster();
    FleetCluster {
        cost_per_hour: super::timeline::cost_per_hour_in(c.capi_store(), c.capi_namespace()),
        backend: super::backend_json(c),
        turns: metrics.turns(&cluster),
        result: result.map_err(|e| e.to_string()),
        cluster,
    }
}

/// Every pod of a fleet's scenario fits a node of its cluster (each group may grow to `--pods`
/// nodes), so a pod still pending when the scenario settled was left there: a problem of that
/// cluster, not a figure. (The single-cluster pods scenario only counts them as not bound, since
/// its flags can make pods that fit nowhere.)
fn fail_pending_pods(report: &mut PodReport) {
    let pending = report.pods.unschedulable;
    if pending == 0 {
        return;
    }
    report.launch.problems.push(format!(
        "{pending} of {} pods still pending at the end (nothing changed for them before the scenario gave up)",
        report.pods.pending_at_start
    ));
    report.launch.invariants_ok = false;
}

/// The pods scenario in one cluster once the fleet serves it: its pods created and bound.
/// Returns its claim observer and the server's clock when the pods were created.
async fn provision(
    args: &SimulateArgs,
    sim: &BackgroundSim,
    metrics: &ClusterMetrics,
    cluster: &str,
) -> Result<(Observer, u64), Error> {
    served(metrics, cluster, args.deadline).await?;
    let observer = Observer::default();
    {
        let o = observer.clone();
        sim.spawn(move |c| o.run(c.client(), c.stats()));
    }
    let since_ms = sim.cluster().stats().now_ms();
    pods::create_deployments(sim, args, |_, _| {}).await?;
    sim.mark("Deployments created");
    pods::wait_for_pods(sim, args.pods, args.deadline).await?;
    settle_every_pod(sim, args.deadline).await?;
    sim.mark("provisioned");
    Ok((observer, since_ms))
}

/// Waits until every pod of the cluster is bound and its launch path is quiet, or fails at
/// `deadline`. The single-cluster scenario gives up on pods after 15 s without a change (pods
/// that fit nowhere); a fleet's pods all fit, and under load one controller among many may take
/// longer than that to see the next pods (each pod seen unschedulable reaches it through a
/// lagging watch): giving up then reported a cluster whose controller was still at work as done,
/// its pods pending.
pub async fn settle_every_pod(sim: &BackgroundSim, deadline: Duration) -> Result<(), Error> {
    pods::settle(sim, deadline, deadline, false).await
}

/// Waits until the fleet serves `cluster` (its controller started, caches synced), so the
/// scenario's clock starts with a controller there and the stall guard does not count the
/// fleet's start.
async fn served(metrics: &ClusterMetrics, cluster: &str, deadline: Duration) -> Result<(), Error> {
    let start = Instant::now();
    while metrics.of(cluster).is_none() {
        if start.elapsed() > deadline {
            return Err(Error::NotSettled {
                after: deadline,
                why: format!("the fleet did not serve Cluster {cluster}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> SimulateArgs {
        SimulateArgs::from_words(words).expect("simulate's arguments")
    }

    /// What a fleet does not run is refused before anything starts, naming the flag (and the
    /// scenarios it does run).
    #[test]
    fn a_fleet_refuses_what_it_does_not_run() {
        assert!(check(&args(&["--clusters", "1", "--scenario", "drain"])).is_ok());
        assert!(check(&args(&["--clusters", "2", "--scenario", "pods"])).is_ok());
        assert!(
            check(&args(&["--clusters", "2"])).is_ok(),
            "the default scenario"
        );
        let refused = |words: &[&str]| match check(&args(words)) {
            Err(Error::Usage(m)) => m,
            other => panic!("{words:?}: {other:?}"),
        };
        let m = refused(&["--clusters", "2", "--scenario", "drain"]);
        assert!(
            m.contains("--scenario default or pods") && m.contains("drain"),
            "{m}"
        );
        let m = refused(&["--clusters", "2", "--control-plane", "real"]);
        assert!(m.starts_with("--control-plane real"), "{m}");
        let m = refused(&["--clusters", "3", "--serve"]);
        assert!(m.contains("add --no-controller"), "{m}");
        let m = refused(&["--clusters", "3", "--serve", "--no-controller"]);
        assert!(m.contains("--kubeconfig-out DIR"), "{m}");
        let served = [
            "--clusters",
            "3",
            "--serve",
            "--no-controller",
            "--kubeconfig-out",
            "d",
        ];
        assert!(check(&args(&served)).is_ok());
        let m = refused(&[&served[..], &["--scenario", "drain"]].concat());
        assert!(m.contains("not --scenario drain"), "{m}");
        let m = refused(&[&served[..], &["--port", "6443"]].concat());
        assert!(m.starts_with("--port"), "{m}");
        let m = refused(&["--clusters", "3", "--report", "html"]);
        assert!(m.starts_with("--report html"), "{m}");
    }

    /// A cluster whose scenario settled with pods still pending (the scenario gives up after a
    /// quiet spell) fails the fleet with a problem line; one with every pod bound does not.
    #[test]
    fn pods_left_pending_are_a_problem_of_their_cluster() {
        let cluster = |bound: usize| {
            let mut r = PodReport::default();
            r.launch.invariants_ok = true;
            (r.pods.pending_at_start, r.pods.bound) = (200, bound);
            r.pods.unschedulable = 200 - bound;
            fail_pending_pods(&mut r);
            r
        };
        let (stalled, done) = (cluster(40), cluster(200));
        assert!(!stalled.launch.invariants_ok);
        assert_eq!(
            stalled.launch.problems,
            [
                "160 of 200 pods still pending at the end (nothing changed for them before the scenario gave up)"
            ]
        );
        assert!(done.launch.invariants_ok && done.launch.problems.is_empty());
        let fleet = |r: PodReport| FleetReport {
            clusters: vec![FleetCluster {
                cluster: "fleet-0/sim".into(),
                result: Ok(r),
                cost_per_hour: 0.0,
                backend: Value::Null,
                turns: Turns::default(),
            }],
            elapsed_ms: 1,
        };
        let s = fleet(stalled).summary();
        assert!(!s.invariants_ok, "{s:?}");
        assert_eq!((s.pods_pending_at_end, s.invariant_violations), (160, 1));
        assert!(fleet(done).summary().invariants_ok);
    }

    /// A cluster whose scenario failed is counted as failed and fails the fleet; the others'
    /// figures still add up.
    #[test]
    fn a_failed_cluster_fails_the_fleet_and_the_others_still_count() {
        let mut ran = PodReport::default();
        ran.launch.invariants_ok = true;
        ran.pods.bound = 7;
        ran.pod_latency_ms.pod_pending_to_bound = Percentiles {
            p50: 10.0,
            p99: 20.0,
        };
        let cluster = |name: &str, result| FleetCluster {
            cluster: name.into(),
            result,
            cost_per_hour: 1.5,
            backend: Value::Null,
            turns: Turns {
                starts: 2,
                leases_lost: 1,
            },
        };
        let report = FleetReport {
            clusters: vec![
                cluster("fleet-0/sim", Ok(ran)),
                cluster("fleet-1/sim", Err("its Secret holds no kubeconfig".into())),
            ],
            elapsed_ms: 1,
        };
        let s = report.summary();
        assert_eq!((s.clusters, s.clusters_failed, s.pods_bound), (2, 1, 7));
        assert!(!s.invariants_ok && !report.invariants_ok());
        assert_eq!(s.pod_pending_to_bound_p99_ms.max, 20.0);
        assert_eq!(s.controller_restarts, 2, "one restart per cluster");
        assert_eq!((s.leases_lost, s.clusters_that_lost_leases), (2, 2));
        let json: Value = serde_json::from_str(&report.to_json()).expect("JSON");
        assert_eq!(
            json["clusters"][1]["error"],
            "its Secret holds no kubeconfig"
        );
        assert_eq!(json["summary"]["clusters_failed"], 1);
        assert_eq!(json["summary"]["leases_lost"], 2);
        assert_eq!(json["clusters"][0]["leases_lost"], 1);
        assert_eq!(json["clusters"][0]["controller_restarts"], 1);
        let text = report.to_string();
        assert!(
            text.contains("leases:   2 lost in 2 clusters; 2 controller restarts"),
            "{text}"
        );
    }
}
