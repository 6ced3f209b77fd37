//! Every metric in one place. Names follow Karpenter's where the meaning is the same (so existing
//! dashboards keep working) and add the Cluster API ones under `karpenter_capi_`.
//!
//! Counters are registered without the `_total` suffix: prometheus-client appends it. What a
//! fresh /metrics shows before the first event is `declared`'s.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

mod declared;
pub mod labelled;
#[cfg(test)]
pub(crate) use declared::DISRUPTION_METHOD_SERIES;
use declared::Registering;

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub(crate) nodepool: String,
    pub(crate) machine_deployment: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CreatedLabels {
    pub(crate) reason: String,
    pub(crate) nodepool: String,
    /// Upstream's label: the claim's `karpenter.sh/nodeclaim-min-values-relaxed` ("false"
    /// when it has none).
    pub(crate) min_values_relaxed: String,
}

impl CreatedLabels {
    /// The labels of `claim`, created for `reason` in `nodepool`.
    pub(crate) fn of(
        reason: impl Into<String>,
        nodepool: impl Into<String>,
        claim: &crate::api::nodeclaim::NodeClaim,
    ) -> CreatedLabels {
        let relaxed = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::api::wellknown::MIN_VALUES_RELAXED_ANNOTATION));
        CreatedLabels {
            reason: reason.into(),
            nodepool: nodepool.into(),
            min_values_relaxed: relaxed.map_or("false", String::as_str).to_string(),
        }
    }
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MdLabels {
    pub(crate) machine_deployment: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub(crate) machine_deployment: String,
    pub(crate) result: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub(crate) method: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub(crate) method: String,
    pub(crate) error: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiErrorLabels {
    pub(crate) verb: String,
    pub(crate) resource: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodePoolLabels {
    pub(crate) nodepool: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub(crate) result: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub(crate) code: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub(crate) reason: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub(crate) controller: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UsageLabels {
    pub(crate) nodepool: String,
    pub(crate) resource_type: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabels {
    pub(crate) capacity_quota: String,
    pub(crate) resource_type: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub(crate) decision: String,
    pub(crate) reason: String,
    pub(crate) consolidation_type: String,
}

/// Upstream's labels of `karpenter_nodeclaims_unhealthy_disrupted_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnhealthyLabels {
    pub(crate) condition: String,
    pub(crate) nodepool: String,
    pub(crate) capacity_type: String,
    pub(crate) image_id: String,
}

/// Upstream's labels of `karpenter_nodeclaims_disrupted_total` and
/// `karpenter_pods_disruption_initiated_total` (Karpenter v1.15 added the last two).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DisruptedLabels {
    pub(crate) reason: String,
    pub(crate) nodepool: String,
    pub(crate) capacity_type: String,
    /// The pool's policy in snake case (`when_empty`, `when_empty_or_underutilized`,
    /// `balanced`) when emptiness or consolidation disrupted the claim; empty for every other
    /// reason (drift, expiry, repair, timeouts), as upstream leaves it.
    pub(crate) consolidation_policy: String,
    /// How the claim's drain ends ([`termination_mode`]).
    pub(crate) termination_mode: String,
}

impl DisruptedLabels {
    /// The labels of `claim` disrupted for `reason` in `nodepool`; `policy` only for emptiness
    /// and consolidation.
    pub(crate) fn of(
        reason: impl Into<String>,
        nodepool: impl Into<String>,
        claim: &crate::api::nodeclaim::NodeClaim,
        policy: Option<crate::api::nodepool::ConsolidationPolicy>,
    ) -> DisruptedLabels {
        DisruptedLabels {
            reason: reason.into(),
            nodepool: nodepool.into(),
            capacity_type: claim
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(crate::api::wellknown::CAPACITY_TYPE_LABEL))
                .cloned()
                .unwrap_or_default(),
            consolidation_policy: policy.map_or("", consolidation_policy).to_string(),
            termination_mode: termination_mode(claim).to_string(),
        }
    }
}

/// Upstream's `consolidation_policy` label value: the policy's name in snake case.
pub(crate) fn consolidation_policy(
    policy: crate::api::nodepool::ConsolidationPolicy,
) -> &'static str {
    use crate::api::nodepool::ConsolidationPolicy;
    match policy {
        ConsolidationPolicy::WhenEmpty => "when_empty",
        ConsolidationPolicy::WhenEmptyOrUnderutilized => "when_empty_or_underutilized",
        ConsolidationPolicy::Balanced => "balanced",
    }
}

/// Upstream's `termination_mode` label value, read from the claim's
/// `spec.terminationGracePeriod`: none is `graceful` (the drain waits for every
/// PodDisruptionBudget and do-not-disrupt pod), zero `forceful` (nothing is waited for), any
/// other `eventual` (waited for until the grace period ends).
pub(crate) fn termination_mode(claim: &crate::api::nodeclaim::NodeClaim) -> &'static str {
    match &claim.spec.termination_grace_period {
        None => "graceful",
        Some(d) if d.0.is_zero() => "forceful",
        Some(_) => "eventual",
    }
}

/// Upstream's labels of `karpenter_nodeclaims_terminated_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimTerminatedLabels {
    pub(crate) nodepool: String,
    pub(crate) capacity_type: String,
    pub(crate) zone: String,
}

/// Upstream's labels of `karpenter_nodes_created_total` and `karpenter_nodes_terminated_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeTerminatedLabels {
    pub(crate) nodepool: String,
    pub(crate) zone: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolDecisionLabels {
    pub(crate) nodepool: String,
    pub(crate) decision: String,
    pub(crate) reason: String,
    pub(crate) consolidation_type: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsolidationTypeLabels {
    pub(crate) consolidation_type: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvaluationLabels {
    pub(crate) reason: String,
    pub(crate) consolidation_type: String,
}

/// A NodePool and the first thing that stopped a node's voluntary disruption
/// (`disruption::Blocker`'s labels).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolBlockerLabels {
    pub(crate) nodepool: String,
    pub(crate) blocker: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolReasonLabels {
    pub(crate) nodepool: String,
    pub(crate) reason: String,
}

/// Which write of a disruption command: taint, mark, create, delete.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteKindLabels {
    pub(crate) write: String,
}

/// A disruption command's stage: mark, launch, initialize, delete.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub(crate) stage: String,
}

/// Why an eviction is retried: budget (a PodDisruptionBudget refused it) or error.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub(crate) cause: String,
}

/// One watch of the controller's indexes (by the kind it lists).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    pub(crate) watch: String,
}

/// A counter of seconds.
pub(crate) type Seconds = Counter<f64, std::sync::atomic::AtomicU64>;

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latency buckets from 5 ms to about 40 min: claims wait seconds on fast providers and many
/// minutes on slow ones (vSphere), and both ends matter.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 20))
}

/// Latencies measured in milliseconds: 1 ms to about 57 s in steps of half again, so a p99 of a
/// few milliseconds can be told from one of tens.
fn fine_latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 1.5, 28))
}

/// Node lifetimes: 15 minutes to about 3 months.
fn lifetime_histogram() -> Histogram {
    Histogram::new(exponential_buckets(900.0, 2.0, 14))
}

fn batch_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 12))
}

/// Declares every metric from one table, one row each: `field: Type [= constructor], "name",
/// "help";` in the order /metrics lists them. The struct field, its construction (the type's
/// default unless a constructor is given, as histograms need for their buckets) and its
/// registration all come from that row; labels come from the label type.
macro_rules! metrics {
    ($( $(#[$attr:meta])* $field:ident: $ty:ty $(= $ctor:expr)?, $name:literal, $help:literal; )*) => {
        /// All metrics of one controller instance. Cheap to share behind an `Arc`.
        pub struct Metrics {
            registry: Registry,
            /// Every registered family's series names (see `series_names`).
            declared: Vec<String>,
            $( $(#[$attr])* pub $field: $ty, )*
        }

        impl Metrics {
            /// Every metric of the table, none registered yet.
            fn unregistered() -> Self {
                Self {
                    registry: Registry::default(),
                    declared: Vec::new(),
                    $( $field: metrics!(@new $($ctor)?), )*
                }
            }

            /// Registers every metric of the table, in its order.
            fn register_all(&self, r: &mut Registering) {
                $( r.register($name, $help, self.$field.clone()); )*
            }

            /// Gives every family of the table one series, so a test sees all their labels.
            #[cfg(test)]
            fn touch_all(&self) {
                $( tests::touch(&self.$field); )*
            }
        }
    };
    (@new) => { Default::default() };
    (@new $ctor:expr) => { $ctor };
}

metrics! {
    // NodeClaim lifecycle (Karpenter's names, plus the MachineDeployment).
    nodeclaims_created: Family<CreatedLabels, Counter>, "karpenter_nodeclaims_created", "NodeClaims created, by reason, nodepool and whether minValues were relaxed";
    nodeclaims_launched: Family<PoolLabels, Counter>, "karpenter_nodeclaims_launched", "NodeClaims whose Machine got a provider ID";
    nodeclaims_registered: Family<PoolLabels, Counter>, "karpenter_nodeclaims_registered", "NodeClaims whose Node registered";
    nodeclaims_initialized: Family<PoolLabels, Counter>, "karpenter_nodeclaims_initialized", "NodeClaims whose Node initialized";
    nodeclaims_terminated: Family<ClaimTerminatedLabels, Counter>, "karpenter_nodeclaims_terminated", "NodeClaims terminated";
    nodes_created: Family<NodeTerminatedLabels, Counter>, "karpenter_nodes_created", "Nodes registered by NodeClaims, by nodepool and zone";
    nodes_terminated: Family<NodeTerminatedLabels, Counter>, "karpenter_nodes_terminated", "Nodes deleted by NodeClaims";
    // Cluster API specifics.
    create_timeouts: Family<PoolLabels, Counter>, "karpenter_capi_nodeclaims_create_timeouts", "NodeClaims deleted because their Machine got no provider ID within the create timeout";
    registration_timeouts: Family<PoolLabels, Counter>, "karpenter_capi_nodeclaims_registration_timeouts", "NodeClaims deleted because no Node registered within the registration timeout";
    claim_launch_seconds: HistogramFamily<MdLabels> = Family::new_with_constructor(latency_histogram), "karpenter_capi_nodeclaim_launch_duration_seconds", "NodeClaim created to Launched (Machine has a provider ID)";
    provider_id_to_claim_seconds: HistogramFamily<MdLabels> = Family::new_with_constructor(fine_latency_histogram), "karpenter_capi_provider_id_to_claim_duration_seconds", "Machine provider ID observed to NodeClaim status updated";
    claim_initialized_seconds: HistogramFamily<MdLabels> = Family::new_with_constructor(latency_histogram), "karpenter_capi_nodeclaim_initialization_duration_seconds", "NodeClaim created to Initialized";
    binding_seconds: HistogramFamily<MdLabels> = Family::new_with_constructor(latency_histogram), "karpenter_capi_machine_binding_duration_seconds", "Machine request queued to Machine bound to its NodeClaim";
    replica_write_seconds: HistogramFamily<MdLabels> = Family::new_with_constructor(latency_histogram), "karpenter_capi_replica_write_duration_seconds", "Latency of one compare-and-swap write of a MachineDeployment's replicas";
    replica_write_batch: HistogramFamily<MdLabels> = Family::new_with_constructor(batch_histogram), "karpenter_capi_replica_write_batch_size", "Machine requests covered by one replica write";
    replica_writes: Family<WriteLabels, Counter>, "karpenter_capi_replica_writes", "Replica writes by result (ok, conflict, error)";
    scaler_queue_depth: Family<MdLabels, Gauge>, "karpenter_capi_scaler_queue_depth", "Machine requests waiting in a MachineDeployment's scaler";
    scaler_replans: Family<MdLabels, Counter>, "karpenter_capi_scaler_replans", "Plans a MachineDeployment's scaler made from the indexes (for a request, a change that can alter its plan, an answer to its own write, or its resync)";
    handed_back_instances: Family<MdLabels, Gauge>, "karpenter_capi_handed_back_instances", "Running instances of a MachinePool without MachinePool Machines that deleted claims handed back to it (the next claim on the pool takes one back)";
    handed_back_price: Family<MdLabels, Gauge<f64, std::sync::atomic::AtomicU64>>, "karpenter_capi_handed_back_instances_price", "Summed price (the pool's price annotation per instance) of the handed-back instances still running";
    scaler_spent_decrements: Family<MdLabels, Counter>, "karpenter_capi_scaler_spent_decrements", "Replica decrements Cluster API spent on another Machine than the one we marked (made again)";
    machine_index_behind: Counter, "karpenter_capi_machine_index_behind", "Times a claim found its bound Machine unbound in the Machine index and read the Machine from the API server (the index showed a version older than our bind)";
    api_errors: Family<ApiErrorLabels, Counter>, "karpenter_capi_api_errors", "Kubernetes API errors by verb and resource";
    api_throttled: Family<ApiErrorLabels, Counter>, "karpenter_capi_api_throttled_requests", "Kubernetes API requests the server answered 429 or 503 with Retry-After, by verb and resource";
    reconcile_timeouts: Family<ControllerLabels, Counter>, "karpenter_capi_reconcile_timeouts", "Reconciles or writes abandoned after their deadline, by controller (nodeclaim, scaler)";
    // Karpenter's cloud-provider view of the same work.
    cloudprovider_duration: HistogramFamily<MethodLabels> = Family::new_with_constructor(latency_histogram), "karpenter_cloudprovider_duration_seconds", "Duration of cloud provider operations (create, delete, get)";
    cloudprovider_errors: Family<ErrorLabels, Counter>, "karpenter_cloudprovider_errors", "Cloud provider errors by method and error";
    // Provisioning and disruption.
    scheduling_duration: Histogram = latency_histogram(), "karpenter_scheduler_scheduling_duration_seconds", "Duration of one scheduling solve";
    pods_startup_duration: Histogram = latency_histogram(), "karpenter_pods_startup_duration_seconds", "Pod created to running on a provisioned node";
    unschedulable_pods: Gauge, "karpenter_scheduler_unschedulable_pods_count", "Pods the last solve could not place";
    scheduler_queue_depth: Gauge, "karpenter_scheduler_queue_depth", "Provisionable pods waiting for the next solve";
    ignored_pods: Gauge, "karpenter_ignored_pod_count", "Pending pods ignored by the provisioner";
    extra_nodeclaims: Counter, "karpenter_capi_extra_nodeclaims", "NodeClaims created for pods an earlier solve planned onto another NodeClaim still in flight";
    replanned_nodeclaims: Counter, "karpenter_capi_replanned_nodeclaims", "NodeClaims created for pods an earlier solve planned onto a NodeClaim whose Node the scheduler filled with other pods";
    nodeclaims_not_created: Counter, "karpenter_capi_nodeclaims_not_created", "NodeClaims a solve planned that were not created: no offering had room for them any more (their pods are told and placed again)";
    nodepools_usage: Family<UsageLabels, Gauge<f64, std::sync::atomic::AtomicU64>>, "karpenter_nodepools_usage", "Resources used by each NodePool's nodes";
    nodepools_limit: Family<UsageLabels, Gauge<f64, std::sync::atomic::AtomicU64>>, "karpenter_nodepools_limit", "Resource limits of each NodePool";
    capacity_quota_usage: Family<QuotaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>, "karpenter_capi_capacity_quota_usage", "What the nodes and in-flight claims a CapacityQuota selects use, per resource its limits name (as its status.used, of enforced quotas)";
    capacity_quota_limit: Family<QuotaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>, "karpenter_capi_capacity_quota_limit", "The limits of each enforced CapacityQuota";
    // High availability.
    leader: Gauge, "karpenter_capi_leader", "1 while this replica holds the leader-election Lease, else 0";
    // Termination (Karpenter's names).
    nodes_drained: Family<NodePoolLabels, Counter>, "karpenter_nodes_drained", "Nodes drained by the controller before their Machine was released";
    pods_eviction_requests: Family<CodeLabels, Counter>, "karpenter_pods_eviction_requests", "Pod eviction requests made by the controller, by response code";
    pods_drained: Family<ReasonLabels, Counter>, "karpenter_pods_drained", "Pods drained during node termination, by reason: evicted, or deleted to meet the node's termination deadline";
    nodes_termination_duration: HistogramFamily<NodePoolLabels> = Family::new_with_constructor(latency_histogram), "karpenter_nodes_termination_duration_seconds", "Time from a Node's deletion to the removal of the controller's finalizer";
    nodes_lifetime_duration: HistogramFamily<NodePoolLabels> = Family::new_with_constructor(lifetime_histogram), "karpenter_nodes_lifetime_duration_seconds", "Lifetime of Nodes from creation to the removal of the controller's finalizer";
    nodeclaims_termination_duration: HistogramFamily<NodePoolLabels> = Family::new_with_constructor(latency_histogram), "karpenter_nodeclaims_termination_duration_seconds", "Time from a NodeClaim's deletion to the removal of its finalizer";
    nodeclaims_instance_termination_duration: HistogramFamily<NodePoolLabels> = Family::new_with_constructor(latency_histogram), "karpenter_nodeclaims_instance_termination_duration_seconds", "Time from the release of a NodeClaim's Machine to the Machine being gone";
    // Disruption (Karpenter's names).
    disruption_decisions: Family<DecisionLabels, Counter>, "karpenter_voluntary_disruption_decisions", "Disruption commands started, by decision (delete, replace), reason and consolidation type";
    disruption_decisions_by_nodepool: Family<PoolDecisionLabels, Counter>, "karpenter_voluntary_disruption_decisions_by_nodepool", "Disruption commands started, by NodePool, decision, reason and consolidation type";
    disruption_failed_validations: Family<ConsolidationTypeLabels, Counter>, "karpenter_voluntary_disruption_failed_validations", "Candidates chosen for disruption that failed validation, by consolidation type";
    disruption_drift_backoffs: Family<NodePoolLabels, Counter>, "karpenter_voluntary_disruption_drift_backoffs", "Drift back-off windows a NodePool entered because its drift replacements failed to launch (each window once, however many launches failed in it), by NodePool";
    disruption_queue_failures: Family<DecisionLabels, Counter>, "karpenter_voluntary_disruption_queue_failures", "Disruption commands that failed once started (rolled back), by decision, reason and consolidation type";
    disruption_consolidation_timeouts: Family<ConsolidationTypeLabels, Counter>, "karpenter_voluntary_disruption_consolidation_timeouts", "Consolidation searches cut short by their time limit, by consolidation type";
    nodepools_nodes_consuming_budgets: Family<PoolReasonLabels, Gauge>, "karpenter_nodepools_nodes_consuming_budgets", "Nodes of each NodePool using up its disruption budget now, by reason";
    disruption_eligible_nodes: Family<ReasonLabels, Gauge>, "karpenter_voluntary_disruption_eligible_nodes", "Nodes eligible for disruption in the last pass, by reason";
    nodepools_allowed_disruptions: Family<PoolReasonLabels, Gauge>, "karpenter_nodepools_allowed_disruptions", "Nodes each NodePool may still start disrupting now, by reason";
    disruption_blocked_nodes: Family<PoolBlockerLabels, Gauge>, "karpenter_voluntary_disruption_blocked_nodes", "Nodes the last disruption pass did not disrupt, by NodePool and the first thing that stopped each (its blocker, docs/tools.md)";
    nodeclaims_disrupted: Family<DisruptedLabels, Counter>, "karpenter_nodeclaims_disrupted", "NodeClaims disrupted, by reason (empty, underutilized, drifted, expired, unhealthy, launch_timeout, registration_timeout), nodepool, capacity type, consolidation policy (emptiness and consolidation only) and termination mode (graceful, eventual, forceful)";
    pods_disruption_initiated: Family<DisruptedLabels, Counter>, "karpenter_pods_disruption_initiated", "Pods whose disruption began, added when the NodeClaim of their node is disrupted: the node's reschedulable pods (not DaemonSet or static pods), with the labels of karpenter_nodeclaims_disrupted";
    // Node repair (Karpenter's name, then ours).
    nodeclaims_unhealthy_disrupted: Family<UnhealthyLabels, Counter>, "karpenter_nodeclaims_unhealthy_disrupted", "Unhealthy NodeClaims node repair deleted, by the Node condition, nodepool, capacity type and image ID";
    nodes_repair_blocked: Family<NodePoolLabels, Gauge>, "karpenter_capi_nodes_repair_blocked", "Nodes past their repair toleration that node repair holds back now (over 20% of the NodePool unhealthy, or a MachineHealthCheck watches over the Machine), by NodePool";
    // Pod deletion cost management (Karpenter v1.15's names).
    pod_deletion_cost_pods_updated: Family<ResultLabels, Counter>, "karpenter_pod_deletion_cost_pods_updated", "Pod deletion cost writes (a cost and its ownership marker set, cleared or released), by result (success, error)";
    pod_deletion_cost_nodes_ranked: Counter, "karpenter_pod_deletion_cost_nodes_ranked", "Nodes ranked by pod deletion cost management, summed over its passes";
    disruption_evaluation_seconds: HistogramFamily<EvaluationLabels> = Family::new_with_constructor(latency_histogram), "karpenter_voluntary_disruption_decision_evaluation_duration_seconds", "Duration of one disruption pass's decision, by the reason and consolidation type of the method that decided (the last one tried when none did)";
    disruption_commands_in_flight: Gauge, "karpenter_capi_disruption_commands_in_flight", "Disruption commands being carried out now (marked, replacements launching, candidates deleting)";
    consolidation_paused: Gauge, "karpenter_capi_consolidation_paused", "1 while consolidation of non-empty nodes pauses because pods it moved needed new nodes";
    // Where the time of disruption goes (a failing API server above all).
    disruption_write_retries: Family<WriteKindLabels, Counter>, "karpenter_capi_disruption_write_retries", "Writes of disruption commands sent again after a transient failure or a conflict, by write (taint, mark, create, delete)";
    disruption_write_backoff: Family<WriteKindLabels, Seconds>, "karpenter_capi_disruption_write_backoff_seconds", "Time the writes of disruption commands waited before they were sent again, by write";
    disruption_stage_seconds: HistogramFamily<StageLabels> = Family::new_with_constructor(latency_histogram), "karpenter_capi_disruption_command_stage_duration_seconds", "Duration of each stage of a disruption command: mark (taints and DisruptionReason), launch (replacements created), initialize (replacements Initialized), delete (candidates deleted)";
    drain_seconds: HistogramFamily<NodePoolLabels> = Family::new_with_constructor(latency_histogram), "karpenter_capi_node_drain_duration_seconds", "Time from a Node's first drain request to its pods being gone";
    eviction_backoff: Family<CauseLabels, Seconds>, "karpenter_capi_eviction_backoff_seconds", "Time evictions waited before they were sent again, by cause (budget: a PodDisruptionBudget refused; error: the request failed)";
    watch_relists: Family<WatchLabels, Counter>, "karpenter_capi_watch_relists", "Lists a watch made again after it failed, was cut or was told its resourceVersion expired, by watch";
    watch_stale_seconds: Family<WatchLabels, Seconds>, "karpenter_capi_watch_stale_seconds", "Time indexes spent behind the API server while their watch was down or re-listing (from the failure to the new list swapped in), by watch";
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut m = Self::unregistered();
        m.declare_bounded_series();
        let mut registry = Registry::default();
        let r = &mut Registering {
            registry: &mut registry,
            declared: Vec::new(),
        };
        m.register_all(r);
        let info = Info::new(BuildLabels {
            version: env!("CARGO_PKG_VERSION").to_string(),
        });
        r.register("karpenter_build", "Build information", info);
        m.declared = std::mem::take(&mut r.declared);
        m.registry = registry;
        Arc::new(m)
    }

    /// The names of every series /metrics can carry (`_total` of counters, `_bucket`, `_sum`
    /// and `_count` of histograms, `_info` of infos), families without series yet included:
    /// the text encoding gives those their HELP and TYPE lines only (under the family's name,
    /// without the suffixes), dashboards still query them.
    pub fn series_names(&self) -> &[String] {
        &self.declared
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error here would be a bug in the encoder.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    pub(crate) fn md(md: &str) -> MdLabels {
        MdLabels {
            machine_deployment: md.to_string(),
        }
    }

    pub(crate) fn pool(nodepool: &str, md: &str) -> PoolLabels {
        PoolLabels {
            nodepool: nodepool.to_string(),
            machine_deployment: md.to_string(),
        }
    }

    pub(crate) fn observe(h: &HistogramFamily<MdLabels>, md: &str, d: Duration) {
        h.get_or_create(&Self::md(md)).observe(d.as_secs_f64());
    }

    pub(crate) fn reconcile_timeout(&self, controller: &str) {
        self.reconcile_timeouts
            .get_or_create(&ControllerLabels {
                controller: controller.to_string(),
            })
            .inc();
    }

    /// Karpenter's cloud-provider latency for one method (Create, Delete).
    pub(crate) fn cloudprovider(&self, method: &str, d: Duration) {
        self.cloudprovider_duration
            .get_or_create(&MethodLabels {
                method: method.to_string(),
            })
            .observe(d.as_secs_f64());
    }

    /// One stage of a disruption command took `d`.
    pub(crate) fn disruption_stage(&self, stage: &str, d: Duration) {
        self.disruption_stage_seconds
            .get_or_create(&StageLabels {
                stage: stage.to_string(),
            })
            .observe(d.as_secs_f64());
    }

    /// A disruption command's `write` is sent again after waiting `waited`.
    pub(crate) fn disruption_write_retry(&self, write: &str, waited: Duration) {
        let labels = WriteKindLabels {
            write: write.to_string(),
        };
        self.disruption_write_retries.get_or_create(&labels).inc();
        self.disruption_write_backoff
            .get_or_create(&labels)
            .inc_by(waited.as_secs_f64());
    }

    /// A claim of `nodepool` asked `md` for a Machine: from now its launch and registration can
    /// time out or succeed, so the series the chart's alerts take `increase()` of start here, at
    /// zero (Prometheus cannot count the step of a series that appears already at 1, and a
    /// MachineDeployment's first timeouts are the ones an operator must hear about).
    pub(crate) fn claim_awaits_machine(
        &self,
        nodepool: &str,
        md: &str,
        claim: &crate::api::nodeclaim::NodeClaim,
    ) {
        let pool = Self::pool(nodepool, md);
        for family in [
            &self.nodeclaims_launched,
            &self.create_timeouts,
            &self.nodeclaims_registered,
            &self.registration_timeouts,
        ] {
            drop(family.get_or_create(&pool));
        }
        for reason in ["launch_timeout", "registration_timeout"] {
            let labels = DisruptedLabels::of(reason, nodepool, claim, None);
            drop(self.nodeclaims_disrupted.get_or_create(&labels));
        }
    }

    /// A Scaler starts on `md`: its replica writes' series start at zero (see
    /// [`Metrics::claim_awaits_machine`]).
    pub(crate) fn scaler_started(&self, md: &str) {
        for result in ["ok", "conflict", "error"] {
            drop(self.replica_writes.get_or_create(&WriteLabels {
                machine_deployment: md.to_string(),
                result: result.to_string(),
            }));
        }
    }

    pub(crate) fn api_error(&self, verb: &str, resource: &str) {
        self.api_errors
            .get_or_create(&ApiErrorLabels {
                verb: verb.to_string(),
                resource: resource.to_string(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests;
