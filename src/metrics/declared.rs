//! What a fresh controller's /metrics shows before the first event: the HELP and TYPE lines of
//! every family, the name of every series it can carry, and, at zero, every series whose labels
//! come from a fixed list.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry};

use super::{
    CauseLabels, ConsolidationTypeLabels, ControllerLabels, DecisionLabels, EvaluationLabels,
    MethodLabels, Metrics, ReasonLabels, StageLabels, WriteKindLabels,
};

/// The disruption methods' `reason` and `consolidation_type` labels with the decisions each can
/// take: (reason, consolidation type, decisions). Kept in `metrics`, below `disruption` in the layers;
/// `disruption::tests` checks it against the methods.
pub(crate) const DISRUPTION_METHOD_SERIES: &[(&str, &str, &[&str])] = &[
    ("unhealthy", "", &["delete", "replace"]),
    ("empty", "empty", &["delete"]),
    ("drifted", "", &["delete", "replace"]),
    ("underutilized", "multi", &["delete", "replace"]),
    ("underutilized", "single", &["delete", "replace"]),
];

impl Metrics {
    /// Creates, at zero, every series whose labels come from a fixed list, so that they are on
    /// /metrics before the first event: `rate()` and `increase()` count that event (Prometheus
    /// cannot count the step of a series that appears already at 1), dashboards draw a line from
    /// the start and the alerts of the chart's PrometheusRule see them. Families labelled by a
    /// NodePool, MachineDeployment, API verb and resource, watch or response code get series on
    /// first use only (docs/operations.md lists them); their HELP and TYPE lines are there from
    /// the start all the same.
    pub(super) fn declare_bounded_series(&self) {
        self.declare_timeout_series();
        self.declare_backoff_series();
        self.declare_duration_series();
        self.declare_disruption_pass_series();
    }

    fn declare_timeout_series(&self) {
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
    }

    fn declare_backoff_series(&self) {
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
    }

    /// Histograms: creating the series is enough, every bucket starts at zero.
    fn declare_duration_series(&self) {
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
    }

    fn declare_disruption_pass_series(&self) {
        // What a disruption pass publishes for each reason (`publish_metrics`).
        for reason in ["unhealthy", "empty", "drifted", "underutilized"] {
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
}

/// The registry being filled, remembering each family's series names as it goes.
pub(super) struct Registering<'a> {
    pub(super) registry: &'a mut Registry,
    pub(super) declared: Vec<String>,
}

impl Registering<'_> {
    pub(super) fn register(&mut self, name: &str, help: &str, metric: impl Metric) {
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
    use super::Metrics;

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
}
