//! The `simulate` subcommand's flags (the embedded simulated cluster, only with the `simulator`
//! feature): scenario, sizes, simulated provider behaviour, report and `--serve`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};

use super::{
    CapiVersionArg, Cli, Command, FeatureGates, LogArgs, duration_arg, feature_gates_arg,
    non_empty_path_arg,
};

/// A duration flag of `simulate` within `[min, max]`, in the same Go syntax as every `run` flag
/// (`2s`, `500ms`, `15m`).
fn duration_in(
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync {
    move |s: &str| {
        let d = duration_arg(s)?;
        if d < min || d > max {
            return Err(format!(
                "{s:?} is not between {} and {}",
                crate::api::duration::format(min),
                crate::api::duration::format(max)
            ));
        }
        Ok(d)
    }
}

/// A fraction in [0, 1].
fn fraction_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{s:?} is not between 0 and 1"));
    }
    Ok(v)
}

/// Faults the simulated API server injects into the controller's own requests (`--faults`), as
/// a proxy between the controller and a real API server would: the stand-ins and the
/// scenario's own requests are not touched.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultSpec {
    /// `errors`: fraction of requests answered 500 or 503 before anything is applied.
    pub(crate) errors: f64,
    /// `ambiguous`: fraction of writes applied and answered 500 or 504 anyway.
    pub(crate) ambiguous: f64,
    /// `throttle`: fraction of requests answered 429 with `Retry-After`.
    pub(crate) throttle: f64,
    /// `retry-after`: the wait a 429 asks for (whole seconds, at least 1 s).
    pub(crate) retry_after: Duration,
    /// `conflicts`: fraction of updates and patches answered 409 Conflict.
    pub(crate) conflicts: f64,
    /// `latency`: added to every request.
    pub(crate) latency: Duration,
    /// `watch-expire`: fraction of watches resumed from a resourceVersion answered 410.
    pub(crate) watch_expire: f64,
    /// `watch-cuts`: every open watch is cut this often.
    pub(crate) watch_cuts: Option<Duration>,
}

impl FaultSpec {
    /// No fault at all (`retry-after` alone injects nothing).
    pub(crate) fn is_none(&self) -> bool {
        *self
            == Self {
                retry_after: self.retry_after,
                ..Self::default()
            }
    }
}

/// `errors=15%,ambiguous=5%,throttle=2%,retry-after=1s,conflicts=0.01,latency=50ms,
/// watch-expire=10%,watch-cuts=3s`: fractions as `0.15` or `15%`, durations as every flag's.
fn faults_arg(s: &str) -> Result<Box<FaultSpec>, String> {
    let fraction = |v: &str| match v.strip_suffix('%') {
        Some(p) => p
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|x| (0.0..=100.0).contains(x))
            .map(|x| x / 100.0)
            .ok_or_else(|| format!("{v:?} is not a percentage from 0 to 100")),
        None => fraction_arg(v),
    };
    let mut spec = FaultSpec {
        retry_after: Duration::from_secs(1),
        ..FaultSpec::default()
    };
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((key, value)) = part.split_once('=') else {
            return Err(format!("{part:?} is not key=value"));
        };
        let value = value.trim();
        match key.trim() {
            "errors" => spec.errors = fraction(value)?,
            "ambiguous" => spec.ambiguous = fraction(value)?,
            "throttle" => spec.throttle = fraction(value)?,
            "conflicts" => spec.conflicts = fraction(value)?,
            "watch-expire" => spec.watch_expire = fraction(value)?,
            "retry-after" => spec.retry_after = duration_in(Duration::ZERO, HOUR)(value)?,
            "latency" => spec.latency = duration_in(Duration::ZERO, HOUR)(value)?,
            "watch-cuts" => {
                spec.watch_cuts = Some(duration_in(Duration::from_millis(100), HOUR)(value)?)
            }
            other => {
                return Err(format!(
                    "unknown fault {other:?}: errors, ambiguous, throttle, retry-after, conflicts, latency, watch-expire, watch-cuts"
                ));
            }
        }
    }
    Ok(Box::new(spec))
}

/// `--capacity-quota`: the limits of the quota scenario's CapacityQuota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaSpec {
    /// `cpu`: whole CPUs.
    pub(crate) cpu: Option<u64>,
    /// `nodes`: how many nodes.
    pub(crate) nodes: Option<u64>,
}

/// `cpu=16,nodes=4`: whole numbers, at least one of the two.
fn quota_arg(s: &str) -> Result<QuotaSpec, String> {
    let mut spec = QuotaSpec::default();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((key, value)) = part.split_once('=') else {
            return Err(format!("{part:?} is not key=value"));
        };
        let n: u64 = value
            .trim()
            .parse()
            .map_err(|_| format!("{value:?} is not a whole number"))?;
        match key.trim() {
            "cpu" => spec.cpu = Some(n),
            "nodes" => spec.nodes = Some(n),
            other => return Err(format!("unknown limit {other:?}: cpu, nodes")),
        }
    }
    if spec == QuotaSpec::default() {
        return Err("no limit: write cpu=N, nodes=M or both".into());
    }
    Ok(spec)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Pending pods become NodeClaims, Machines and Nodes (the full product).
    Default,
    /// NodeClaims created directly, as Karpenter's provisioner writes them: the launch path alone.
    Launch,
    /// Pending pods from Deployments through the provisioner.
    Pods,
    /// Provision pods (each Deployment with a PodDisruptionBudget, some do-not-disrupt), then
    /// delete a third of the claims at once: the drain, measured.
    Drain,
    /// Provision pods, enable consolidation, scale most Deployments down, and measure how the
    /// controller empties and replaces nodes (budgets, cost, nodes against a lower bound).
    Consolidate,
    /// Provision pods, change the NodePool template (every claim drifts and is replaced), then
    /// roll out the node group with the most Machines (a MachineDeployment's new infrastructure
    /// template, or a MachinePool's new Kubernetes version).
    Drift,
    /// Provision pods on claims with a short `expireAfter`; every claim expires and its pods
    /// move to new nodes.
    Expire,
    /// The pods scenario with a NodeOverlay that makes the largest size the cheapest (and one
    /// with a malformed price): provisioning picks the overlay-cheapest type.
    Overlay,
    /// Provision the pods once, then keep a CapacityBuffer of as many chunks of their shape and
    /// send the same burst again: pending -> bound with and without the buffer.
    Buffer,
    /// A static NodePool (`spec.replicas` from --pods, at least 5) holds its count through a
    /// Node deletion and a template drift.
    Static,
    /// The pods scenario under a CapacityQuota on the NodePool's nodes (--capacity-quota):
    /// provisioning stops at its limit, the pods left stay pending held by it, then the quota
    /// is deleted and they are bound.
    Quota,
    /// Node repair on (toleration 2 s): a Node gone `Ready=False` is replaced; with two of the
    /// static pool's Nodes `Unknown` (over 20 %) nothing is.
    Repair,
    /// A static NodePool at its `limits.nodes` drifts: replace-first stalls (no room for a
    /// replacement), then the controller restarted with `TerminateFirstDrift` rolls it one node
    /// at a time.
    FullPool,
    /// Node groups generated on demand (issue 44): --pods (default 1,000) pods of a seeded mix
    /// of sizes against one source MachineDeployment and a NodeClass's grid of shapes, then
    /// scaled to zero until every generated group is gone (--idle-after); the same pods on three
    /// fixed sizes first, for the cost and utilisation compared.
    Generate,
    /// No workload: the seeded MachineDeployments only, for your own manifests (with --serve).
    None,
}

/// What serves the simulated cluster's API.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ControlPlaneArg {
    /// The project's own API server and scheduler stand-in, in-process.
    #[default]
    Simulated,
    /// A real etcd, kube-apiserver, kube-scheduler and kube-controller-manager from
    /// `KUBEBUILDER_ASSETS`, with the upstream Cluster API CRDs from `KARPENTER_CAPI_UPSTREAM`.
    Real,
}

/// Who plays Cluster API's controllers (`--cluster-api`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ClusterApiArg {
    /// The project's Cluster API stand-in, in-process.
    #[default]
    Simulated,
    /// Cluster API's real core controller manager (v1.14.2 for v1beta2, v1.10.10 for v1beta1:
    /// --cluster-api-version), from KARPENTER_CAPI_CLUSTER_API (`.ci/install-cluster-api`);
    /// needs --control-plane real.
    Real,
}

/// Which scalable kind the scenario's node groups are (`--scalable`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ScalableArg {
    /// MachineDeployments only.
    #[default]
    Machinedeployments,
    /// MachinePools with MachinePool Machines only.
    Machinepools,
    /// Alternating: MachineDeployments first, then MachinePools.
    Mixed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    Text,
    Json,
    /// One self-contained HTML file: charts over time and the JSON report's figures.
    Html,
}

/// `--feature-gates` for a simulation: only the gates a simulation acts on may change.
fn simulation_gates_arg(s: &str) -> Result<FeatureGates, String> {
    let gates = feature_gates_arg(s)?;
    let defaults = FeatureGates::default();
    let acted_on = FeatureGates {
        pod_deletion_cost: gates.pod_deletion_cost,
        no_effect: gates.no_effect.clone(),
        ..defaults
    };
    if gates != acted_on {
        return Err("a simulation acts on PodDeletionCostManagement only; leave the other gates at their defaults".to_string());
    }
    Ok(gates)
}

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// The most claims or pods a simulation creates: more would only exhaust memory.
const MAX_SIM_OBJECTS: u64 = 100_000;

#[derive(Clone, Debug, Args)]
pub struct SimulateArgs {
    /// Which scenario to run.
    #[arg(long, value_enum, default_value = "default")]
    pub scenario: Scenario,
    /// Karpenter's feature gates, as `run --feature-gates` reads them. A simulation acts on
    /// `PodDeletionCostManagement` only (its ranking then runs every second, not every minute,
    /// and the consolidate scenario waits for it before scaling down); a value that changes
    /// another gate from its default is refused rather than silently ignored.
    #[arg(long, default_value = "", value_parser = simulation_gates_arg)]
    pub feature_gates: FeatureGates,
    /// Simulated workload clusters, a fleet (1: one cluster, as without the flag). Above 1, one
    /// management API server holds a Cluster per workload cluster (each in a namespace of its
    /// own), one controller in this process serves them all as `run --fleet` does, the scenario
    /// runs in every cluster at once, and the report has each cluster's report and a fleet
    /// summary. Scenarios `pods` and `default` only, on the simulated control plane.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=500))]
    pub clusters: usize,
    /// Where Karpenter's objects live, as `run --karpenter-objects` says: `management` keeps the
    /// NodePools, NodeClasses and NodeClaims in a simulated management cluster apart (beside
    /// Cluster API's objects, bound to Cluster `sim` by labels) and only Nodes and Pods in the
    /// workload cluster. Simulated control plane, one cluster; scenarios launch, pods, drain
    /// and consolidate.
    #[arg(long, value_enum, default_value = "workload")]
    pub karpenter_objects: crate::cli::KarpenterObjects,
    /// NodeClaims to create directly, without pods (launch scenario only).
    #[arg(long, default_value_t = 100, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=MAX_SIM_OBJECTS))]
    pub claims: usize,
    /// Pods to create, pending, in --deployments Deployments (every scenario but launch; with
    /// `--scenario none --nodes N`, running pods bound to those nodes). Default 100, 1,000 for
    /// `--scenario generate`.
    #[arg(long, default_value_t = 100, default_value_if("scenario", "generate", "1000"), value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=MAX_SIM_OBJECTS))]
    pub pods: usize,
    /// With `--scenario none`: stand up this many Nodes (each a NodeClaim launched, registered
    /// and initialized on its Machine) before serving, and bind `--pods` running pods to them.
    #[arg(long, default_value_t = 0, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=MAX_SIM_OBJECTS))]
    pub nodes: usize,
    /// Deployments the pods belong to (every scenario with pods).
    #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    pub deployments: usize,
    /// MachineDeployments in the simulated cluster (node groups, whatever their kind: see
    /// --scalable).
    #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100))]
    pub machine_deployments: usize,
    /// The kind of those node groups: MachineDeployments, MachinePools (with MachinePool
    /// Machines), or a mix (even-numbered MachineDeployments, odd-numbered MachinePools).
    #[arg(long, value_enum, default_value = "machinedeployments")]
    pub scalable: ScalableArg,
    /// Simulated provider delay before a Machine gets its provider ID (e.g. 2s; 0 to 1h).
    #[arg(long, default_value = "0s", value_parser = duration_in(Duration::ZERO, HOUR))]
    pub provider_delay: Duration,
    /// Uniform jitter added to the provider delay (e.g. 1s; 0 to 1h).
    #[arg(long, default_value = "0s", value_parser = duration_in(Duration::ZERO, HOUR))]
    pub jitter: Duration,
    /// Fraction of Machines that never get a provider ID (a stuck provider), 0 to 1.
    #[arg(long, default_value_t = 0.0, value_parser = fraction_arg)]
    pub fail_fraction: f64,
    /// The controller's create timeout (see `run --create-timeout`; e.g. 10s; 1ms to 24h).
    #[arg(long, value_parser = duration_in(Duration::from_millis(1), DAY))]
    pub create_timeout: Option<Duration>,
    /// Which Cluster API version the simulated cluster serves.
    #[arg(long, value_enum, default_value = "v1beta2")]
    pub cluster_api_version: CapiVersionArg,
    /// The API server behind the scenario: the simulated one, or a real control plane
    /// (binaries from KUBEBUILDER_ASSETS, Cluster API CRDs from KARPENTER_CAPI_UPSTREAM).
    #[arg(long, value_enum, default_value = "simulated")]
    pub control_plane: ControlPlaneArg,
    /// Who plays Cluster API: the project's stand-in, or Cluster API's real manager (needs
    /// --control-plane real; v1.14.2, or v1.10.10 with --cluster-api-version v1beta1).
    #[arg(long, value_enum, default_value = "simulated")]
    pub cluster_api: ClusterApiArg,
    /// The report: text, one JSON object, or one self-contained HTML page with charts.
    #[arg(long, value_enum, default_value = "text")]
    pub report: ReportFormat,
    /// Write the report to this file instead of standard output. The HTML report is always a
    /// file: without this flag it goes to `./simulate-report.html`.
    #[arg(long, value_name = "PATH")]
    pub report_out: Option<PathBuf>,
    /// Give up waiting for the scenario to settle after this long (e.g. 300s, 15m; 1s to 168h).
    #[arg(long, default_value = "5m", value_parser = duration_in(Duration::from_secs(1), 7 * DAY))]
    pub deadline: Duration,
    /// The drift scenario only: pause the NodePool's disruption (its
    /// `karpenter.cluster.x-k8s.io/disruption-paused` annotation) when its template changes and
    /// lift the pause after this long (e.g. 10s; 0s, the default: no pause), so the report shows
    /// the pause holding the drifted nodes (`disruption.pause`, blocker `paused`).
    #[arg(long, default_value = "0s", value_parser = duration_in(Duration::ZERO, HOUR))]
    pub pause_disruption: Duration,
    /// The drift scenario only: from just before the template change, every MachineDeployment's
    /// launches fail (the Cluster API stand-in's `sim.karpenter.cluster.x-k8s.io/fail-launches`)
    /// for this long, then work again (e.g. 30s; 0s, the default: none), so the report shows
    /// drift backing off against the failing offerings and finishing after the lift
    /// (`disruption.backoff`). Without --create-timeout the run's create timeout is then 10s, so
    /// a failed launch ends within the failing window. MachineDeployments only.
    #[arg(long, default_value = "0s", value_parser = duration_in(Duration::ZERO, HOUR))]
    pub fail_replacements: Duration,
    /// The quota scenario only: the CapacityQuota's limits on the NodePool's nodes, `cpu=N`,
    /// `nodes=M` or both (whole numbers; default: `cpu=` half the CPUs the pods request, rounded
    /// down to an even number, at least 2).
    #[arg(long, value_parser = quota_arg)]
    pub capacity_quota: Option<QuotaSpec>,
    /// The generate scenario only: the NodeClass's `spec.generate.idleAfter`, how long a
    /// generated MachineDeployment stays at zero replicas before it is removed (e.g. 20s; 1s to
    /// 1h).
    #[arg(long, default_value = "20s", value_parser = duration_in(Duration::from_secs(1), HOUR))]
    pub idle_after: Duration,
    /// Seed for the simulated cluster's randomness (jitter, failures, names) and the generate
    /// scenario's mix of pod sizes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Faults the simulated API server injects into the controller's own requests, e.g.
    /// `errors=15%,ambiguous=5%` (keys: errors, ambiguous, throttle, retry-after, conflicts,
    /// latency, watch-expire, watch-cuts).
    #[arg(long, value_parser = faults_arg, default_value = "")]
    pub faults: Box<FaultSpec>,
    #[command(flatten)]
    pub from: Box<FromClusterArgs>,
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

/// `simulate --from-cluster`: a what-if of a live cluster.
#[derive(Clone, Debug, Default, Args)]
pub struct FromClusterArgs {
    /// What-if of a live cluster: read it once, read-only (its Cluster API objects and their
    /// infrastructure templates, NodePools, NodeClasses, NodeOverlays, NodeClaims, Nodes, pods,
    /// PodDisruptionBudgets and DaemonSets; never a Secret), load it into the simulated cluster,
    /// run the controller there for --duration and report what it would do. Replaces
    /// --scenario.
    #[arg(long, value_name = "KUBECONFIG", value_parser = non_empty_path_arg)]
    pub(crate) from_cluster: Option<PathBuf>,
    /// With --from-cluster: the management cluster's kubeconfig, where the Cluster API objects
    /// are, when it is not the cluster --from-cluster names.
    #[arg(long = "cluster-api-kubeconfig", value_name = "KUBECONFIG", requires = "from_cluster", value_parser = non_empty_path_arg)]
    pub(crate) from_cluster_api: Option<PathBuf>,
    /// With --from-cluster: how long the controller runs on the loaded copy (e.g. 2m; 1s to
    /// 24h).
    #[arg(long, default_value = "1m", value_parser = duration_in(Duration::from_secs(1), DAY))]
    pub(crate) duration: Duration,
}

/// `simulate --serve`: keep the simulated cluster up for kubectl and a separate controller.
#[derive(Clone, Debug, Default, Args)]
pub struct ServeArgs {
    /// Keep the simulated cluster running after the scenario (and its report, with the
    /// controller) until SIGINT or SIGTERM, with its kubeconfig at --kubeconfig-out.
    #[arg(long, default_value_t = false, required_if_eq("scenario", "none"))]
    pub serve: bool,
    /// Run only the simulated cluster, no controller: point `karpenter-capi run --kubeconfig` at
    /// it from another process. Needs --serve.
    #[arg(long, default_value_t = false, requires = "serve")]
    pub no_controller: bool,
    /// Where to write the simulated cluster's kubeconfig (kept at exit). Default with --serve:
    /// ./simulated.kubeconfig.
    #[arg(long, value_parser = non_empty_path_arg)]
    pub kubeconfig_out: Option<PathBuf>,
    /// Port of the simulated API server on 127.0.0.1 (0: any free port), so the kubeconfig stays
    /// valid across runs.
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

/// The kubeconfig path `--serve` writes when --kubeconfig-out is not given.
pub const DEFAULT_KUBECONFIG_OUT: &str = "simulated.kubeconfig";

impl ServeArgs {
    /// Where the kubeconfig goes: the flag, else the default when serving, else nowhere extra.
    pub(crate) fn kubeconfig_out(&self) -> Option<PathBuf> {
        match (&self.kubeconfig_out, self.serve) {
            (Some(p), _) => Some(p.clone()),
            (None, true) => Some(PathBuf::from(DEFAULT_KUBECONFIG_OUT)),
            (None, false) => None,
        }
    }
}

impl SimulateArgs {
    /// `simulate`'s arguments from the words after `simulate`, parsed as the command line is
    /// (for embedding a simulation, and the tests).
    pub fn from_words(words: &[&str]) -> Result<Self, clap::Error> {
        let argv = ["karpenter-capi", "simulate"].iter().chain(words);
        match <Cli as Parser>::try_parse_from(argv)?.command {
            Command::Simulate(args) => Ok(*args),
            _ => Err(clap::Error::raw(
                clap::error::ErrorKind::InvalidSubcommand,
                "not the simulate subcommand",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One syntax for durations in every subcommand: `10s` works for `run` and `simulate`
    /// alike, and a bare `10` is refused by both with the same advice.
    #[test]
    fn durations_take_one_syntax_in_every_subcommand() {
        let Command::Run(run) =
            Cli::try_parse_from(["karpenter-capi", "run", "--create-timeout", "10s"])
                .unwrap()
                .command
        else {
            panic!("expected run")
        };
        assert_eq!(run.controller.create_timeout, Duration::from_secs(10));
        let sim = SimulateArgs::from_words(&[
            "--create-timeout",
            "10s",
            "--provider-delay",
            "1.5s",
            "--jitter",
            "500ms",
            "--deadline",
            "15m",
        ])
        .unwrap();
        assert_eq!(sim.create_timeout, Some(Duration::from_secs(10)));
        assert_eq!(sim.provider_delay, Duration::from_millis(1500));
        assert_eq!(sim.jitter, Duration::from_millis(500));
        assert_eq!(sim.deadline, Duration::from_secs(900));
        for argv in [
            vec!["karpenter-capi", "run", "--create-timeout", "10"],
            vec!["karpenter-capi", "simulate", "--create-timeout", "10"],
        ] {
            let err = Cli::try_parse_from(&argv).unwrap_err().to_string();
            assert!(
                err.contains("\"10\" has no unit: write it with one, e.g. 10s or 10m"),
                "{argv:?}: {err}"
            );
        }
    }

    #[test]
    fn a_fault_spec_takes_fractions_percentages_and_durations() {
        let sim = SimulateArgs::from_words(&[
            "--faults",
            "errors=15%,ambiguous=0.05,throttle=2%,retry-after=2s,watch-cuts=3s,watch-expire=10%",
        ])
        .unwrap();
        let f = sim.faults;
        assert!((f.errors - 0.15).abs() < 1e-9);
        assert!((f.ambiguous - 0.05).abs() < 1e-9);
        assert!((f.throttle - 0.02).abs() < 1e-9);
        assert!((f.watch_expire - 0.1).abs() < 1e-9);
        assert_eq!(f.retry_after, Duration::from_secs(2));
        assert_eq!(f.watch_cuts, Some(Duration::from_secs(3)));
        assert!(SimulateArgs::from_words(&[]).unwrap().faults.is_none());
        for bad in ["errors=150%", "errors", "typo=1", "latency=5"] {
            assert!(
                SimulateArgs::from_words(&["--faults", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_capacity_quota_takes_whole_cpus_and_nodes() {
        let q =
            |s: &str| SimulateArgs::from_words(&["--capacity-quota", s]).map(|a| a.capacity_quota);
        assert_eq!(
            q("cpu=16,nodes=4").unwrap(),
            Some(QuotaSpec {
                cpu: Some(16),
                nodes: Some(4)
            })
        );
        assert_eq!(q("nodes=3").unwrap().and_then(|s| s.cpu), None);
        for bad in ["", "cpu=1.5", "memory=4", "cpu"] {
            assert!(q(bad).is_err(), "{bad}");
        }
    }

    fn serve_args(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        let mut all = vec!["karpenter-capi", "simulate"];
        all.extend_from_slice(args);
        let Command::Simulate(sim) = Cli::try_parse_from(all)?.command else {
            panic!("expected simulate")
        };
        Ok(sim.serve)
    }

    #[test]
    fn serve_flags_default_and_depend_on_serve() {
        let plain = serve_args(&[]).unwrap();
        assert_eq!(plain.kubeconfig_out(), None, "no file without --serve");
        let served = serve_args(&["--serve"]).unwrap();
        assert_eq!(
            served.kubeconfig_out(),
            Some(PathBuf::from(DEFAULT_KUBECONFIG_OUT))
        );
        assert_eq!(served.port, 0);
        let err = serve_args(&["--no-controller"]).unwrap_err();
        assert!(err.to_string().contains("--serve"), "{err}");
        let err = serve_args(&["--scenario", "none"]).unwrap_err();
        assert!(err.to_string().contains("--serve"), "{err}");
        let none = serve_args(&[
            "--scenario",
            "none",
            "--serve",
            "--no-controller",
            "--port",
            "6443",
        ])
        .unwrap();
        assert!(none.no_controller);
        assert_eq!(none.port, 6443);
    }

    /// `simulate --clusters N`: one cluster unless told, at least one, and read as given.
    #[test]
    fn simulate_takes_a_number_of_clusters() {
        let parsed = |words: &[&str]| SimulateArgs::from_words(words).map(|a| a.clusters);
        assert_eq!(parsed(&[]).ok(), Some(1));
        assert_eq!(
            parsed(&["--clusters", "20", "--scenario", "pods", "--pods", "200"]).ok(),
            Some(20)
        );
        for bad in ["0", "-1", "many"] {
            assert!(parsed(&["--clusters", bad]).is_err(), "--clusters {bad}");
        }
    }
}
