//! Every metric in one place. Names follow Karpenter's where the meaning is the same (so existing
//! dashboards keep working) and add the Cluster API ones under `karpenter_capi_`.
//!
//! Counters are registered without the `_total` suffix: prometheus-client appends it.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry};

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub nodepool: String,
    pub machine_deployment: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CreatedLabels {
    pub reason: String,
    pub nodepool: String,
    /// Upstream's label: the claim's `karpenter.sh/nodeclaim-min-values-relaxed` ("false"
    /// when it has none).
    pub min_values_relaxed: String,
}

impl CreatedLabels {
    /// The labels of `claim`, created for `reason` in `nodepool`.
    pub fn of(
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
    pub machine_deployment: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub machine_deployment: String,
    pub result: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub method: String,
    pub error: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiErrorLabels {
    pub verb: String,
    pub resource: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodePoolLabels {
    pub nodepool: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub code: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UsageLabels {
    pub nodepool: String,
    pub resource_type: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub decision: String,
    pub reason: String,
    pub consolidation_type: String,
}

/// Upstream's labels of `karpenter_nodeclaims_unhealthy_disrupted_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnhealthyLabels {
    pub condition: String,
    pub nodepool: String,
    pub capacity_type: String,
    pub image_id: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DisruptedLabels {
    pub reason: String,
    pub nodepool: String,
    pub capacity_type: String,
}

/// Upstream's labels of `karpenter_nodeclaims_terminated_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimTerminatedLabels {
    pub nodepool: String,
    pub capacity_type: String,
    pub zone: String,
}

/// Upstream's labels of `karpenter_nodes_terminated_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeTerminatedLabels {
    pub nodepool: String,
    pub zone: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolDecisionLabels {
    pub nodepool: String,
    pub decision: String,
    pub reason: String,
    pub consolidation_type: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsolidationTypeLabels {
    pub consolidation_type: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvaluationLabels {
    pub reason: String,
    pub consolidation_type: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolReasonLabels {
    pub nodepool: String,
    pub reason: String,
}

/// The disruption methods' `reason` and `consolidation_type` labels with the decisions each can
/// take: (reason, consolidation type, decisions). Kept here, below `disruption` in the layers;
/// `disruption::tests` checks it against the methods.
pub const DISRUPTION_METHOD_SERIES: &[(&str, &str, &[&str])] = &[
    ("empty", "empty", &["delete"]),
    ("drifted", "", &["delete", "replace"]),
    ("underutilized", "multi", &["delete", "replace"]),
    ("underutilized", "single", &["delete", "replace"]),
];

/// Which write of a disruption command: taint, mark, create, delete.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteKindLabels {
    pub write: String,
}

/// A disruption command's stage: mark, launch, initialize, delete.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub stage: String,
}

/// Why an eviction is retried: budget (a PodDisruptionBudget refused it) or error.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: String,
}

/// One watch of the controller's indexes (by the kind it lists).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    pub watch: String,
}

/// A counter of seconds.
pub type Seconds = Counter<f64, std::sync::atomic::AtomicU64>;

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
    nodes_created: Family<NodePoolLabels, Counter>, "karpenter_nodes_created", "Nodes registered by NodeClaims";
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
    scaler_spent_decrements: Family<MdLabels, Counter>, "karpenter_capi_scaler_spent_decrements", "Replica decrements Cluster API spent on another Machine than the one we marked (made again)";
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
    nodepools_usage: Family<UsageLabels, Gauge<f64, std::sync::atomic::AtomicU64>>, "karpenter_nodepools_usage", "Resources used by each NodePool's nodes";
    nodepools_limit: Family<UsageLabels, Gauge<f64, std::sync::atomic::AtomicU64>>, "karpenter_nodepools_limit", "Resource limits of each NodePool";
    // High availability.
    leader: Gauge, "karpenter_capi_leader", "1 while this replica holds the leader-election Lease, else 0";
    // Termination (Karpenter's names).
    nodes_drained: Family<NodePoolLabels, Counter>, "karpenter_nodes_drained", "Nodes drained by the controller before their Machine was released";
    pods_eviction_requests: Family<CodeLabels, Counter>, "karpenter_pods_eviction_requests", "Pod eviction requests made by the controller, by response code";
    pods_drained: Family<ReasonLabels, Counter>, "karpenter_pods_drained", "Pods drained (evicted or, at the deadline, deleted) during node termination, by reason";
    nodes_termination_duration: HistogramFamily<NodePoolLabels> = Family::new_with_constructor(latency_histogram), "karpenter_nodes_termination_duration_seconds", "Time from a Node's deletion to the removal of the controller's finalizer";
    nodes_lifetime_duration: HistogramFamily<NodePoolLabels> = Family::new_with_constructor(lifetime_histogram), "karpenter_nodes_lifetime_duration_seconds", "Lifetime of Nodes from creation to the removal of the controller's finalizer";
    nodeclaims_termination_duration: HistogramFamily<NodePoolLabels> = Family::new_with_constructor(latency_histogram), "karpenter_nodeclaims_termination_duration_seconds", "Time from a NodeClaim's deletion to the removal of its finalizer";
    nodeclaims_instance_termination_duration: HistogramFamily<NodePoolLabels> = Family::new_with_constructor(latency_histogram), "karpenter_nodeclaims_instance_termination_duration_seconds", "Time from the release of a NodeClaim's Machine to the Machine being gone";
    // Disruption (Karpenter's names).
    disruption_decisions: Family<DecisionLabels, Counter>, "karpenter_voluntary_disruption_decisions", "Disruption commands started, by decision (delete, replace), reason and consolidation type";
    disruption_decisions_by_nodepool: Family<PoolDecisionLabels, Counter>, "karpenter_voluntary_disruption_decisions_by_nodepool", "Disruption commands started, by NodePool, decision, reason and consolidation type";
    disruption_failed_validations: Family<ConsolidationTypeLabels, Counter>, "karpenter_voluntary_disruption_failed_validations", "Candidates chosen for disruption that failed validation, by consolidation type";
    disruption_queue_failures: Family<DecisionLabels, Counter>, "karpenter_voluntary_disruption_queue_failures", "Disruption commands that failed once started (rolled back), by decision, reason and consolidation type";
    disruption_consolidation_timeouts: Family<ConsolidationTypeLabels, Counter>, "karpenter_voluntary_disruption_consolidation_timeouts", "Consolidation searches cut short by their time limit, by consolidation type";
    nodepools_nodes_consuming_budgets: Family<PoolReasonLabels, Gauge>, "karpenter_nodepools_nodes_consuming_budgets", "Nodes of each NodePool using up its disruption budget now, by reason";
    disruption_eligible_nodes: Family<ReasonLabels, Gauge>, "karpenter_voluntary_disruption_eligible_nodes", "Nodes eligible for disruption in the last pass, by reason";
    nodepools_allowed_disruptions: Family<PoolReasonLabels, Gauge>, "karpenter_nodepools_allowed_disruptions", "Nodes each NodePool may still start disrupting now, by reason";
    nodeclaims_disrupted: Family<DisruptedLabels, Counter>, "karpenter_nodeclaims_disrupted", "NodeClaims disrupted, by reason (empty, underutilized, drifted, expired, unhealthy), nodepool and capacity type";
    // Node repair (Karpenter's name, then ours).
    nodeclaims_unhealthy_disrupted: Family<UnhealthyLabels, Counter>, "karpenter_nodeclaims_unhealthy_disrupted", "Unhealthy NodeClaims node repair deleted, by the Node condition, nodepool, capacity type and image ID";
    nodes_repair_blocked: Family<NodePoolLabels, Gauge>, "karpenter_capi_nodes_repair_blocked", "Nodes past their repair toleration that node repair holds back now (over 20% of the NodePool unhealthy, or a MachineHealthCheck watches over the Machine), by NodePool";
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

    /// Creates, at zero, every series whose labels come from a fixed list, so that they are on
    /// /metrics before the first event: `rate()` and `increase()` count that event (Prometheus
    /// cannot count the step of a series that appears already at 1), dashboards draw a line from
    /// the start and the alerts of the chart's PrometheusRule see them. Families labelled by a
    /// NodePool, MachineDeployment, API verb and resource, watch or response code get series on
    /// first use only (docs/operations.md lists them); their HELP and TYPE lines are there from
    /// the start all the same.
    fn declare_bounded_series(&mut self) {
        // Both exist from the start, as upstream declares them: this controller bounds its
        // consolidation searches by count, not time, so they stay at zero.
        for t in ["multi", "single"] {
            self.disruption_consolidation_timeouts
                .get_or_create(&ConsolidationTypeLabels {
                    consolidation_type: t.into(),
                })
                .inc_by(0);
        }
        // The callers of `reconcile_timeout`: the NodeClaim actor and the scaler.
        for controller in ["nodeclaim", "scaler"] {
            self.reconcile_timeouts
                .get_or_create(&ControllerLabels {
                    controller: controller.into(),
                })
                .inc_by(0);
        }
        // The writes of a disruption command (`persist_counted`'s callers).
        for write in ["taint", "mark", "create", "delete"] {
            let labels = WriteKindLabels {
                write: write.into(),
            };
            self.disruption_write_retries
                .get_or_create(&labels)
                .inc_by(0);
            self.disruption_write_backoff
                .get_or_create(&labels)
                .inc_by(0.0);
        }
        for cause in ["budget", "error"] {
            self.eviction_backoff
                .get_or_create(&CauseLabels {
                    cause: cause.into(),
                })
                .inc_by(0.0);
        }
        // Histograms: creating the series is enough, every bucket starts at zero.
        for stage in ["mark", "launch", "initialize", "delete"] {
            drop(self.disruption_stage_seconds.get_or_create(&StageLabels {
                stage: stage.into(),
            }));
        }
        for method in ["Create", "Delete"] {
            drop(self.cloudprovider_duration.get_or_create(&MethodLabels {
                method: method.into(),
            }));
        }
        // What a disruption pass publishes for each reason (`publish_metrics`).
        for reason in ["empty", "drifted", "underutilized"] {
            self.disruption_eligible_nodes
                .get_or_create(&ReasonLabels {
                    reason: reason.into(),
                })
                .set(0);
        }
        // Every disruption method's labels with the decisions it can take (emptiness never
        // replaces); `disruption`'s tests hold this list to its methods.
        for (reason, consolidation_type, decisions) in DISRUPTION_METHOD_SERIES {
            let (reason, consolidation_type) = (reason.to_string(), *consolidation_type);
            for decision in decisions.iter() {
                let labels = DecisionLabels {
                    decision: (*decision).into(),
                    reason: reason.clone(),
                    consolidation_type: consolidation_type.into(),
                };
                self.disruption_decisions.get_or_create(&labels).inc_by(0);
                self.disruption_queue_failures
                    .get_or_create(&labels)
                    .inc_by(0);
            }
            drop(
                self.disruption_evaluation_seconds
                    .get_or_create(&EvaluationLabels {
                        reason: reason.clone(),
                        consolidation_type: consolidation_type.into(),
                    }),
            );
        }
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

    pub fn md(md: &str) -> MdLabels {
        MdLabels {
            machine_deployment: md.to_string(),
        }
    }

    pub fn pool(nodepool: &str, md: &str) -> PoolLabels {
        PoolLabels {
            nodepool: nodepool.to_string(),
            machine_deployment: md.to_string(),
        }
    }

    pub fn observe(h: &HistogramFamily<MdLabels>, md: &str, d: Duration) {
        h.get_or_create(&Self::md(md)).observe(d.as_secs_f64());
    }

    pub fn reconcile_timeout(&self, controller: &str) {
        self.reconcile_timeouts
            .get_or_create(&ControllerLabels {
                controller: controller.to_string(),
            })
            .inc();
    }

    /// Karpenter's cloud-provider latency for one method (Create, Delete).
    pub fn cloudprovider(&self, method: &str, d: Duration) {
        self.cloudprovider_duration
            .get_or_create(&MethodLabels {
                method: method.to_string(),
            })
            .observe(d.as_secs_f64());
    }

    /// One stage of a disruption command took `d`.
    pub fn disruption_stage(&self, stage: &str, d: Duration) {
        self.disruption_stage_seconds
            .get_or_create(&StageLabels {
                stage: stage.to_string(),
            })
            .observe(d.as_secs_f64());
    }

    /// A disruption command's `write` is sent again after waiting `waited`.
    pub fn disruption_write_retry(&self, write: &str, waited: Duration) {
        let labels = WriteKindLabels {
            write: write.to_string(),
        };
        self.disruption_write_retries.get_or_create(&labels).inc();
        self.disruption_write_backoff
            .get_or_create(&labels)
            .inc_by(waited.as_secs_f64());
    }

    pub fn api_error(&self, verb: &str, resource: &str) {
        self.api_errors
            .get_or_create(&ApiErrorLabels {
                verb: verb.to_string(),
                resource: resource.to_string(),
            })
            .inc();
    }
}

/// The registry being filled, remembering each family's series names as it goes.
struct Registering<'a> {
    registry: &'a mut Registry,
    declared: Vec<String>,
}

impl Registering<'_> {
    fn register(&mut self, name: &str, help: &str, metric: impl Metric) {
        let suffixes: &[&str] = match metric.metric_type() {
            MetricType::Counter => &["_total"],
            MetricType::Histogram => &["_bucket", "_sum", "_count"],
            MetricType::Info => &["_info"],
            _ => &[""],
        };
        self.declared
            .extend(suffixes.iter().map(|s| format!("{name}{s}")));
        self.registry.register(name, help, Declared(metric));
    }
}

/// A registered metric whose HELP and TYPE lines are encoded even while it has no series.
/// prometheus-client leaves a family without series out of the exposition altogether, so a
/// fresh controller's /metrics would not name it: dashboards would find nothing to query and an
/// alert could not tell "no controller" from "nothing happened yet". OpenMetrics allows a family
/// of no samples.
#[derive(Debug)]
struct Declared<M>(M);

impl<M: EncodeMetric> EncodeMetric for Declared<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }

    fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Something whose series a test can create with default labels, so that the exposition
    /// shows every family with its labels (and every histogram with its buckets).
    pub(super) trait Touch {
        fn touch(&self);
    }

    impl<L, M, C> Touch for Family<L, M, C>
    where
        L: Clone + std::hash::Hash + Eq + Default,
        C: prometheus_client::metrics::family::MetricConstructor<M>,
    {
        fn touch(&self) {
            drop(self.get_or_create(&L::default()));
        }
    }

    impl<N, A> Touch for Gauge<N, A> {
        fn touch(&self) {}
    }

    impl Touch for Counter {
        fn touch(&self) {}
    }

    impl Touch for Histogram {
        fn touch(&self) {}
    }

    pub(super) fn touch(metric: &impl Touch) {
        metric.touch();
    }

    /// The full exposition with one series in every family, then every declared series name:
    /// names, help texts, types, labels and buckets as a dashboard sees them.
    /// A family's series come out in hash order, so each family's are sorted.
    fn exposition(m: &Metrics) -> String {
        let text = m.encode().replace(env!("CARGO_PKG_VERSION"), "VERSION");
        let mut out = String::new();
        let mut series: Vec<&str> = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') {
                series.sort_unstable();
                for s in series.drain(..) {
                    out.push_str(s);
                    out.push('\n');
                }
                out.push_str(line);
                out.push('\n');
            } else {
                series.push(line);
            }
        }
        out.push_str("# declared\n");
        for name in m.series_names() {
            out.push_str(name);
            out.push('\n');
        }
        out
    }

    /// Every family keeps its name, help, type, labels and buckets: `tests/fixtures/metrics.txt`
    /// was written by the registration before it came from one table. Set
    /// `KARPENTER_CAPI_WRITE_FIXTURE=1` to rewrite it after a deliberate change.
    #[test]
    fn exposition_unchanged() {
        let m = Metrics::new();
        m.touch_all();
        let got = exposition(&m);
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/metrics.txt");
        if std::env::var_os("KARPENTER_CAPI_WRITE_FIXTURE").is_some() {
            if let Err(e) = std::fs::write(path, &got) {
                panic!("writing {path}: {e}");
            }
            return;
        }
        let want = include_str!("../tests/fixtures/metrics.txt");
        for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
            assert_eq!(g, w, "line {} of the exposition differs", i + 1);
        }
        assert_eq!(got.lines().count(), want.lines().count(), "{got}");
    }

    /// A fresh controller's /metrics names every family (HELP and TYPE), and every family
    /// whose labels come from a fixed list already has its series, at zero.
    #[test]
    fn every_family_is_declared_from_the_start() {
        let m = Metrics::new();
        let text = m.encode();
        let types: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .collect();
        // A series name is its family's plus the suffix of the family's type (a gauge's name,
        // `..._pods_count` among them, is its family's own).
        let suffixes = |ty: &str| -> &'static [&'static str] {
            match ty {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            }
        };
        for name in m.series_names() {
            assert!(
                types.iter().any(|(family, ty)| suffixes(ty)
                    .iter()
                    .any(|s| *name == format!("{family}{s}"))),
                "{name}: no family of its type on a fresh /metrics:\n{text}"
            );
        }
        for series in [
            "karpenter_capi_reconcile_timeouts_total{controller=\"nodeclaim\"} 0",
            "karpenter_capi_reconcile_timeouts_total{controller=\"scaler\"} 0",
            "karpenter_voluntary_disruption_decisions_total{decision=\"delete\",reason=\"empty\",consolidation_type=\"empty\"} 0",
            "karpenter_voluntary_disruption_decisions_total{decision=\"replace\",reason=\"drifted\",consolidation_type=\"\"} 0",
            "karpenter_voluntary_disruption_queue_failures_total{decision=\"replace\",reason=\"underutilized\",consolidation_type=\"single\"} 0",
            "karpenter_voluntary_disruption_eligible_nodes{reason=\"drifted\"} 0",
            "karpenter_capi_eviction_backoff_seconds_total{cause=\"budget\"} 0",
            "karpenter_capi_disruption_write_retries_total{write=\"taint\"} 0",
            "karpenter_cloudprovider_duration_seconds_count{method=\"Create\"} 0",
            "karpenter_capi_disruption_command_stage_duration_seconds_count{stage=\"initialize\"} 0",
        ] {
            assert!(
                text.contains(series),
                "{series} missing from a fresh /metrics:\n{text}"
            );
        }
        // Emptiness deletes only: no series for a decision it cannot take.
        assert!(
            !text.contains("decision=\"replace\",reason=\"empty\""),
            "{text}"
        );
    }

    #[test]
    fn exposes_karpenter_names() {
        let m = Metrics::new();
        m.nodeclaims_created
            .get_or_create(&CreatedLabels {
                reason: "provisioning".into(),
                nodepool: "default".into(),
                min_values_relaxed: "false".into(),
            })
            .inc();
        Metrics::observe(
            &m.claim_launch_seconds,
            "ns/md-a",
            Duration::from_millis(120),
        );
        let text = m.encode();
        assert!(
            text.contains(
                "karpenter_nodeclaims_created_total{reason=\"provisioning\",nodepool=\"default\",min_values_relaxed=\"false\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("karpenter_capi_nodeclaim_launch_duration_seconds_count{machine_deployment=\"ns/md-a\"} 1"), "{text}");
        assert!(text.contains("karpenter_build_info"), "{text}");
        // Every series the exposition carries is a declared one, and empty families are
        // declared too.
        let declared = m.series_names();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            assert!(declared.iter().any(|d| d == name), "{name} not declared");
        }
        assert!(
            declared
                .iter()
                .any(|d| d == "karpenter_nodeclaims_disrupted_total")
        );
        assert!(declared.iter().any(|d| d == "karpenter_nodepools_usage"));
    }
}
