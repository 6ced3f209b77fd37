//! The command line: `run` (the controller), `simulate` (the embedded cluster, with the
//! `simulator` feature; its flags are in `cli::simulate`), `crds`, `version`.
//! Every `run` flag has an environment twin named as in Karpenter and the Go Cluster API provider,
//! so existing Helm values and manifests carry over.

use std::path::PathBuf;
use std::time::Duration;

use crate::scheduling::default_spread::DefaultConstraints;
use clap::{Args, Parser, Subcommand, ValueEnum};

mod fleet;
#[cfg(feature = "simulator")]
mod simulate;
mod values;

pub(crate) use fleet::{CLUSTER_API_KUBECONFIG_SECRET, CLUSTER_PLACEHOLDER, FleetArgs};
#[cfg(feature = "simulator")]
pub use simulate::{
    ClusterApiArg, ControlPlaneArg, DEFAULT_KUBECONFIG_OUT, FaultSpec, QuotaSpec, ReportFormat,
    ScalableArg, Scenario, ServeArgs, SimulateArgs,
};
pub(crate) use values::*;

#[derive(Debug, Parser)]
#[command(
    name = "karpenter-capi",
    version,
    about = "Just-in-time nodes for Cluster API clusters, with Karpenter's NodePool and NodeClaim API"
)]
#[cfg_attr(
    feature = "simulator",
    command(
        long_about = "karpenter-capi turns pending pods into right-sized nodes by scaling Cluster API \
                  MachineDeployments, and removes them again when they are empty, drifted or expired.\n\n\
                  Try it without a cluster: `karpenter-capi simulate` starts an embedded simulated \
                  cluster (API server, Cluster API, kubelets and scheduler) and runs the controller on it."
    )
)]
// A controller built without the simulator does not offer what it cannot run.
#[cfg_attr(
    not(feature = "simulator"),
    command(
        long_about = "karpenter-capi turns pending pods into right-sized nodes by scaling Cluster API \
                  MachineDeployments, and removes them again when they are empty, drifted or expired."
    )
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller against a real cluster (in-cluster config or KUBECONFIG).
    Run(Box<RunArgs>),
    /// Start the embedded simulated cluster and run the controller on it.
    #[cfg(feature = "simulator")]
    Simulate(Box<SimulateArgs>),
    /// Print the CustomResourceDefinitions (NodePool, NodeClaim, ClusterAPINodeClass, NodeOverlay,
    /// CapacityBuffer, CapacityQuota) as YAML.
    Crds(CrdsArgs),
    /// Explain, read-only, why a pod is pending or where it went, what a NodeClaim waits for,
    /// or what a NodePool can launch (docs/tools.md).
    #[command(subcommand)]
    Explain(Box<ExplainCommand>),
    /// Read the management cluster's MachineDeployments, say which can be offerings, and print
    /// a ClusterAPINodeClass and NodePool for the usable ones (docs/tools.md).
    Init(Box<InitArgs>),
    /// Print the version.
    Version,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// Where Karpenter's objects (NodePools, NodeClaims, NodeClasses, NodeOverlays) live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum KarpenterObjects {
    /// In the workload cluster, beside its Nodes and Pods.
    #[default]
    Workload,
    /// In the management cluster, beside the Cluster's Machines, bound to it by labels.
    Management,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CapiVersionArg {
    V1beta1,
    V1beta2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PreferencePolicy {
    /// Try preferred node affinity as required first, then relax it.
    Respect,
    /// Ignore preferred node affinity entirely.
    Ignore,
}

/// Upstream's `--min-values-policy` values, spelled as upstream spells them (any case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum MinValuesPolicy {
    /// A NodePool's minValues the instance types cannot meet leaves the pod unscheduled.
    #[value(name = "Strict")]
    Strict,
    /// Unmet minValues are lowered to what the instance types offer; the NodeClaim says so
    /// (annotation karpenter.sh/nodeclaim-min-values-relaxed).
    #[value(name = "BestEffort")]
    BestEffort,
}

/// Logging flags, shared by `run` and `simulate`.
#[derive(Clone, Debug, Args)]
pub struct LogArgs {
    /// Log level or tracing filter (error, warn, info, debug, or e.g. "karpenter_capi=debug,kube=info").
    #[cfg_attr(
        feature = "simulator",
        doc = "Default: info for `run`; warn for `simulate`, whose progress and report are its output."
    )]
    #[cfg_attr(not(feature = "simulator"), doc = "Default: info.")]
    #[arg(long, env = "LOG_LEVEL", value_parser = log_level_arg)]
    pub(crate) log_level: Option<String>,
    /// Log format: text for people, json for log pipelines.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub(crate) log_format: LogFormat,
}

/// Controller tuning shared by `run` and `simulate`, so the simulation runs the same code paths
/// with the same knobs.
#[derive(Clone, Debug, Args)]
pub(crate) struct ControllerArgs {
    /// How long a NodeClaim may wait, from creation, for its Machine's provider ID before it is
    /// deleted and its offering marked unavailable. Raise it for slow providers (vSphere, bare
    /// metal). A ClusterAPINodeClass's spec.createTimeout overrides it.
    #[arg(long, env = "CREATE_TIMEOUT", default_value = "5m", value_parser = positive_duration_arg)]
    pub(crate) create_timeout: Duration,
    /// How long a launched NodeClaim may wait for its Node to register.
    #[arg(long, env = "REGISTRATION_TIMEOUT", default_value = "15m", value_parser = positive_duration_arg)]
    pub(crate) registration_timeout: Duration,
    /// How long an offering that failed or timed out stays unavailable to new NodeClaims.
    #[arg(long, env = "UNAVAILABLE_OFFERING_TTL", default_value = "3m", value_parser = duration_arg)]
    pub(crate) unavailable_offering_ttl: Duration,
    /// A provisioning batch ends after this long without a new pending pod.
    #[arg(long, env = "BATCH_IDLE_DURATION", default_value = "1s", value_parser = positive_duration_arg)]
    pub(crate) batch_idle_duration: Duration,
    /// A provisioning batch never lasts longer than this.
    #[arg(long, env = "BATCH_MAX_DURATION", default_value = "10s", value_parser = positive_duration_arg)]
    pub(crate) batch_max_duration: Duration,
    /// Whether preferred node affinity is tried as required before being relaxed.
    #[arg(long, env = "PREFERENCE_POLICY", value_enum, default_value = "respect")]
    pub(crate) preference_policy: PreferencePolicy,
    /// Whether a NodePool's minValues must be met (Strict) or may be lowered to what the
    /// instance types offer (BestEffort).
    #[arg(
        long,
        env = "MIN_VALUES_POLICY",
        value_enum,
        ignore_case = true,
        default_value = "Strict"
    )]
    pub(crate) min_values_policy: MinValuesPolicy,
    /// terminationGracePeriod of the NodeClaims whose NodePool sets none (default: none, so
    /// their nodes drain without a deadline).
    #[arg(long, env = "DEFAULT_TERMINATION_GRACE_PERIOD", value_parser = duration_arg)]
    pub(crate) default_termination_grace_period: Option<Duration>,
    /// The cluster's kube-scheduler settings the solve must mirror, as a YAML or JSON document:
    /// `podTopologySpread.defaultConstraints` (Karpenter's --scheduler-config), applied to pods
    /// without topologySpreadConstraints of their own, with a selector deduced from the
    /// Services and the ReplicaSet, StatefulSet or ReplicationController selecting each pod.
    /// Empty (the default): no default constraints.
    #[arg(long, env = "SCHEDULER_CONFIG", default_value = "", value_parser = scheduler_config_arg)]
    pub(crate) scheduler_config: SchedulerConfigArg,
    /// With `NodeRepair` on: the Node conditions that call for a repair, as a YAML or JSON
    /// document `policies: [{conditionType, conditionStatus, tolerationDuration, reasonRegex,
    /// priority, terminationGracePeriod, action}]` (docs/static-and-repair.md). Empty (the
    /// default): `Ready` False or Unknown for 30 minutes, replaced forcefully, as upstream.
    #[arg(long, env = "REPAIR_POLICIES", default_value = "", value_parser = repair_policies_arg)]
    pub(crate) repair_policies: RepairPoliciesArg,
    /// Optional features, as Karpenter's `Name=true|false,...`: `CapacityBuffer` keeps
    /// autoscaling.x-k8s.io CapacityBuffers as spare capacity (off by default, as upstream);
    /// `CapacityQuota` caps provisioning by autoscaling.x-k8s.io CapacityQuotas and writes their
    /// status (off by default, as Cluster Autoscaler's `capacity-quotas-enabled` option);
    /// `NodeRepair` replaces nodes whose `Ready` stays False or Unknown for 30 minutes (off by
    /// default, as upstream); `StaticCapacity` holds static NodePools at `spec.replicas` (on by
    /// default here); `NodeOverlay` applies NodeOverlays (on by default here: docs/limitations.md
    /// says why); `PodDeletionCostManagement` writes `controller.kubernetes.io/pod-deletion-cost`
    /// on the pods of the nodes so a ReplicaSet scale-in empties the nodes disruption would remove first (off by
    /// default, as upstream; alpha). Every other gate upstream's default string carries (`ReservedCapacity`,
    /// `SpotToSpotConsolidation`, ...) is accepted, so upstream's value can be copied as it is,
    /// and logged once at start as having no effect here.
    #[arg(long, env = "FEATURE_GATES", default_value = "CapacityBuffer=false,NodeRepair=false,StaticCapacity=true,NodeOverlay=true", value_parser = feature_gates_arg)]
    pub(crate) feature_gates: FeatureGates,
    /// Pause all voluntary disruption: no repair, drift, emptiness or consolidation decision is
    /// made while set (commands already under way finish; expiry, legacy node repair and
    /// provisioning go on). One NodePool alone: the karpenter.cluster.x-k8s.io/disruption-paused: "true"
    /// annotation.
    #[arg(long, env = "DISRUPTION_PAUSED", default_value_t = false)]
    pub(crate) disruption_paused: bool,
    /// With `NodeRepair` on: repair as Karpenter v1.14 did, deleting an unhealthy node's claim
    /// at once, outside the disruption budgets and with no replacement launched first. Off (the
    /// default): repair is a disruption method as in v1.15, first in each pass, within the
    /// NodePool's `Unhealthy` budget, its replacement initialized before the node goes.
    #[arg(long, env = "LEGACY_NODE_REPAIR", default_value_t = false)]
    pub(crate) legacy_node_repair: bool,
}

/// The features `--feature-gates` turns on, and the upstream gates it was given that change
/// nothing here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    pub(crate) capacity_buffer: bool,
    /// CapacityQuotas cap provisioning (`CapacityQuota`, off by default).
    pub(crate) capacity_quota: bool,
    pub(crate) node_repair: bool,
    pub(crate) static_capacity: bool,
    pub(crate) node_overlay: bool,
    pub(crate) pod_deletion_cost: bool,
    /// A static NodePool at its `limits.nodes`, or a dynamic one whose replacement can only
    /// launch in the node's own room, takes a drifted node before its replacement
    /// (`TerminateFirstDrift`, alpha and off, as upstream).
    pub(crate) terminate_first_drift: bool,
    /// The same for an unhealthy node node repair replaces (`TerminateFirstRepair`).
    pub(crate) terminate_first_repair: bool,
    /// Upstream gates named that have no effect here, with the value given and why.
    pub(crate) no_effect: Vec<(String, bool, &'static str)>,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            capacity_buffer: false,
            capacity_quota: false,
            node_repair: false,
            static_capacity: true,
            node_overlay: true,
            pod_deletion_cost: false,
            terminate_first_drift: false,
            terminate_first_repair: false,
            no_effect: Vec::new(),
        }
    }
}

/// Upstream Karpenter's gates (core v1.14 and v1.15, and `Drift` from before v1) that this
/// controller accepts without acting on, and why each changes nothing here.
const UPSTREAM_ONLY_GATES: &[(&str, &str)] = &[
    (
        "ReservedCapacity",
        "Cluster API offers no reserved capacity type; every offering is on-demand or spot as its labels say",
    ),
    (
        "SpotToSpotConsolidation",
        "spot offerings are consolidated like any other: no spot capacity pool list to keep wide here",
    ),
    (
        "Drift",
        "drift is always on (the gate was removed upstream in v1)",
    ),
];

/// `Name=bool` pairs, comma separated; a gate neither this controller nor upstream knows is
/// refused, so a typo never passes for a feature that is off.
fn feature_gates_arg(s: &str) -> Result<FeatureGates, String> {
    let mut gates = FeatureGates::default();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not Name=true or Name=false"))?;
        let on = match value.trim() {
            "true" => true,
            "false" => false,
            v => return Err(format!("{name}: {v:?} is not true or false")),
        };
        match name.trim() {
            "CapacityBuffer" => gates.capacity_buffer = on,
            "CapacityQuota" => gates.capacity_quota = on,
            "NodeRepair" => gates.node_repair = on,
            "StaticCapacity" => gates.static_capacity = on,
            "NodeOverlay" => gates.node_overlay = on,
            "PodDeletionCostManagement" => gates.pod_deletion_cost = on,
            "TerminateFirstDrift" => gates.terminate_first_drift = on,
            "TerminateFirstRepair" => gates.terminate_first_repair = on,
            other => match UPSTREAM_ONLY_GATES.iter().find(|(n, _)| *n == other) {
                Some((n, why)) => gates.no_effect.push((n.to_string(), on, why)),
                None => {
                    let upstream: Vec<&str> = UPSTREAM_ONLY_GATES.iter().map(|(n, _)| *n).collect();
                    return Err(format!(
                        "{other:?} is not a feature gate of this controller (known: CapacityBuffer, CapacityQuota, NodeRepair, StaticCapacity, NodeOverlay, PodDeletionCostManagement, TerminateFirstDrift, TerminateFirstRepair; accepted with no effect: {})",
                        upstream.join(", ")
                    ));
                }
            },
        }
    }
    Ok(gates)
}

/// A parsed `--scheduler-config`: the default constraints it sets, if any.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct SchedulerConfigArg(pub Option<DefaultConstraints>);

fn scheduler_config_arg(s: &str) -> Result<SchedulerConfigArg, String> {
    DefaultConstraints::parse(s)
        .map(SchedulerConfigArg)
        .map_err(|e| e.to_string())
}

/// A parsed `--repair-policies`.
#[derive(Clone, Debug)]
pub(crate) struct RepairPoliciesArg(pub crate::api::repair_policy::RepairPolicies);

fn repair_policies_arg(s: &str) -> Result<RepairPoliciesArg, String> {
    crate::api::repair_policy::RepairPolicies::parse(s)
        .map(RepairPoliciesArg)
        .map_err(|e| e.to_string())
}

/// Where the Cluster API objects live. With none of these set, the workload cluster is used
/// ("joined" topology). Names follow the Go provider's flags; `--cluster-api-in-cluster` is ours.
#[derive(Clone, Debug, Default, Args)]
pub struct ClusterApiArgs {
    /// Kubeconfig file of the management cluster holding Machines and MachineDeployments.
    #[arg(long, env = "CLUSTER_API_KUBECONFIG", value_parser = existing_file_arg)]
    pub(crate) cluster_api_kubeconfig: Option<PathBuf>,
    /// The management cluster is the one this pod runs in: reach it with the pod's own
    /// ServiceAccount (in-cluster config, projected token), while --kubeconfig names the workload
    /// cluster. The leader-election Lease is then kept in the management cluster too. For the
    /// controller run next to Cluster API, one per workload cluster.
    #[arg(
        long,
        env = "CLUSTER_API_IN_CLUSTER",
        default_value_t = false,
        conflicts_with_all = ["cluster_api_kubeconfig", "cluster_api_url"]
    )]
    pub(crate) cluster_api_in_cluster: bool,
    /// URL of the management cluster's API server (with --cluster-api-token).
    #[arg(long, env = "CLUSTER_API_URL", value_parser = url_arg)]
    pub(crate) cluster_api_url: Option<String>,
    /// Bearer token for the management cluster.
    #[arg(long, env = "CLUSTER_API_TOKEN", hide_env_values = true)]
    pub(crate) cluster_api_token: Option<String>,
    /// Base64 PEM CA bundle for the management cluster's API server.
    #[arg(
        long,
        env = "CLUSTER_API_CERTIFICATE_AUTHORITY_DATA",
        hide_env_values = true,
        value_parser = base64_arg
    )]
    pub(crate) cluster_api_certificate_authority_data: Option<String>,
    /// Skip TLS verification of the management cluster (testing only).
    #[arg(long, env = "CLUSTER_API_SKIP_TLS_VERIFY", default_value_t = false)]
    pub(crate) cluster_api_skip_tls_verify: bool,
    /// Only consider Cluster API objects in this namespace (default: all namespaces).
    #[arg(long, env = "CLUSTER_API_NAMESPACE", value_parser = dns_label_arg)]
    pub(crate) cluster_api_namespace: Option<String>,
    /// Only consider MachineDeployments of this Cluster (cluster.x-k8s.io/cluster-name label).
    #[arg(long, env = "CLUSTER_NAME", value_parser = label_value_arg)]
    pub(crate) cluster_name: Option<String>,
    /// Where Karpenter's objects live: `workload` (beside the Nodes and Pods), or `management`
    /// (beside the Cluster's Machines, each bound to its Cluster by the labels
    /// `cluster.x-k8s.io/cluster-name` and `karpenter.cluster.x-k8s.io/cluster-namespace`;
    /// needs --cluster-name and --cluster-api-namespace, or --fleet).
    #[arg(
        long,
        env = "KARPENTER_OBJECTS",
        value_enum,
        default_value = "workload"
    )]
    pub(crate) karpenter_objects: KarpenterObjects,
    /// Force a Cluster API version instead of discovering it (v1beta2 is preferred when served).
    #[arg(long, env = "CLUSTER_API_VERSION", value_enum)]
    pub(crate) cluster_api_version: Option<CapiVersionArg>,
}

#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    /// Kubeconfig of the workload cluster (default: KUBECONFIG, then in-cluster config).
    #[arg(long, value_parser = existing_file_arg)]
    pub(crate) kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) cluster_api: ClusterApiArgs,
    #[command(flatten)]
    pub(crate) controller: ControllerArgs,
    #[command(flatten)]
    pub log: LogArgs,
    /// Port of the Prometheus /metrics endpoint (0: any free port, logged at start-up; for
    /// several replicas on one host).
    #[arg(long, env = "METRICS_PORT", default_value_t = 8080)]
    pub(crate) metrics_port: u16,
    /// Port of the /healthz and /readyz endpoints (0: any free port, logged at start-up).
    #[arg(long, env = "HEALTH_PROBE_PORT", default_value_t = 8081)]
    pub(crate) health_probe_port: u16,
    /// Client-side limit on API requests per second to each cluster (0: no limit).
    #[arg(long, env = "KUBE_CLIENT_QPS", default_value_t = 200, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub(crate) kube_client_qps: u32,
    /// Burst allowed above the QPS limit.
    #[arg(long, env = "KUBE_CLIENT_BURST", default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) kube_client_burst: u32,
    /// Run without leader election (only safe with a single replica).
    #[arg(long, env = "DISABLE_LEADER_ELECTION", default_value_t = false)]
    pub(crate) disable_leader_election: bool,
    /// Shadow mode: run every watch and decision against the cluster but send no write (no
    /// object, status, Event or Lease); each write it would make goes to `--decision-log`.
    /// Skips leader election, so it may run beside another controller.
    #[arg(long, env = "DRY_RUN", default_value_t = false)]
    pub(crate) dry_run: bool,
    /// With `--dry-run`: the JSON-lines file of the writes it would have made.
    #[arg(long, env = "DECISION_LOG", requires = "dry_run")]
    pub(crate) decision_log: Option<PathBuf>,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "LEADER_ELECTION_NAME",
        default_value = "karpenter-capi-leader-election",
        value_parser = dns_subdomain_arg
    )]
    pub(crate) leader_election_name: String,
    /// Namespace of the leader-election Lease (default: the pod's namespace, else kube-system).
    /// The Lease is in the workload cluster, or in the management cluster with
    /// --cluster-api-in-cluster (the cluster the pods run in).
    #[arg(long, env = "LEADER_ELECTION_NAMESPACE", value_parser = dns_label_arg)]
    pub(crate) leader_election_namespace: Option<String>,
    /// How often the kubeconfig files (--kubeconfig, --cluster-api-kubeconfig) are read again.
    /// When one changes (a rotated Secret reaches its mounted file), the controller shuts down
    /// as on SIGTERM, releasing its Lease, so its restart uses the new credentials. 0: never.
    #[arg(long, env = "KUBECONFIG_CHECK_INTERVAL", default_value = "10s", value_parser = duration_arg)]
    pub(crate) kubeconfig_check_interval: Duration,
    /// Fleet mode (--fleet and its flags).
    #[command(flatten)]
    pub(crate) fleet: FleetArgs,
}

/// How `explain` prints its report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ExplainOutput {
    Text,
    Json,
}

/// What every `explain` subcommand takes: the clients as `run` builds them, and the controller
/// settings whose values the answers depend on (timeouts, preference policy).
#[derive(Clone, Debug, Args)]
pub struct ExplainArgs {
    /// Kubeconfig of the workload cluster (default: KUBECONFIG, then in-cluster config).
    #[arg(long, value_parser = existing_file_arg)]
    pub(crate) kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) cluster_api: ClusterApiArgs,
    #[command(flatten)]
    pub(crate) controller: ControllerArgs,
    /// Text for people, JSON for tools.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub(crate) output: ExplainOutput,
}

#[derive(Clone, Debug, Subcommand)]
pub enum ExplainCommand {
    /// Why a pod is pending (per NodePool and instance type, the first constraint that rules
    /// it out), or the NodeClaim and offering it went to.
    Pod {
        /// NAMESPACE/NAME of the pod.
        target: String,
        #[command(flatten)]
        args: ExplainArgs,
    },
    /// A NodeClaim's phase, what it waits for and its deadline, and its disruption standing.
    Nodeclaim {
        name: String,
        #[command(flatten)]
        args: ExplainArgs,
    },
    /// The instance types and offerings a NodePool can use, those left out and why, and its
    /// usage against its limits.
    Nodepool {
        name: String,
        #[command(flatten)]
        args: ExplainArgs,
    },
    /// A Node's NodeClaim and NodePool, and what the disruption pass makes of it now: taken by
    /// which method, or the first thing that stops it (its blocker).
    Node {
        name: String,
        /// What if it went now: where each of its pods would go, what it would save per hour,
        /// and which budget, PodDisruptionBudget or do-not-disrupt would stop it (nothing is
        /// written).
        #[arg(long)]
        remove: bool,
        #[command(flatten)]
        args: ExplainArgs,
    },
}

/// How `init` prints its proposal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum InitOutput {
    /// The report, the YAML and the commands, for people.
    Text,
    /// Only applyable YAML on stdout (the report as YAML comments).
    Yaml,
}

#[derive(Clone, Debug, Args)]
pub struct InitArgs {
    /// Kubeconfig of the workload cluster (default: KUBECONFIG, then in-cluster config); also
    /// the management cluster unless the Cluster API flags say otherwise.
    #[arg(long, value_parser = existing_file_arg)]
    pub(crate) kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) cluster_api: ClusterApiArgs,
    /// Only MachineDeployments in this namespace (default: --cluster-api-namespace, else all).
    #[arg(long, value_parser = dns_label_arg)]
    pub(crate) namespace: Option<String>,
    /// Name of the ClusterAPINodeClass and NodePool to propose.
    #[arg(long, default_value = "default", value_parser = dns_subdomain_arg)]
    pub(crate) name: String,
    /// Text for people, or YAML only (applyable with `kubectl apply -f -`).
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub(crate) output: InitOutput,
}

#[derive(Clone, Debug, Args)]
pub struct CrdsArgs {
    /// Write one file per CRD into this directory instead of printing them.
    #[arg(long, value_parser = non_empty_path_arg)]
    pub output_dir: Option<PathBuf>,
}

#[cfg(test)]
mod tests;
