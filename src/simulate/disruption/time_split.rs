//! Where a disruption phase's time went, so a slow run (under `--faults` above all) can be told
//! apart: the scenario's own waits, and what the controller's metrics counted over the phase
//! (its commands' stages, their writes' retries, validations, drains and their evictions, the
//! release of the Machines, watches behind the API server, launches the provisioner made
//! meanwhile). Durations of work that overlaps (commands, drains) are summed over it, so they
//! compare runs, not add up to the phase.

use std::collections::BTreeMap;

use serde::Serialize;

/// The controller's metrics at the phase's start, to count the phase's own share.
pub struct Baseline(String);

impl Baseline {
    pub fn take(metrics: &crate::metrics::Metrics) -> Self {
        Self(metrics.encode())
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct TimeSplit {
    /// The scenario's own waits: from the phase's start until the scaled-down pods are gone
    /// (the Deployment stand-in's pace; consolidate only), until the controller's first
    /// disruption mark, and the calm it waits out once nothing changes any more.
    pub scale_down_ms: u64,
    pub first_mark_ms: u64,
    pub calm_ms: u64,
    /// Commands started and rolled back.
    pub commands: u64,
    pub rollbacks: u64,
    /// Candidates whose decision did not hold at its validation (a new decision restarts the
    /// wait).
    pub failed_validations: u64,
    /// Each stage of the commands (mark, launch, initialize, delete), summed over them.
    pub stage_s: BTreeMap<String, f64>,
    /// The commands' writes sent again, and how long they waited first.
    pub write_retries: u64,
    pub write_backoff_s: f64,
    /// Nodes drained and their drains' time, summed.
    pub drains: u64,
    pub drain_s: f64,
    /// Eviction requests by answer, and the time evictions waited before they were sent again
    /// (budget: a PodDisruptionBudget's 429; error: a failed request).
    pub evictions: BTreeMap<String, u64>,
    pub eviction_backoff_s: BTreeMap<String, f64>,
    /// Claims terminated, and their deletion-to-finalizer-removal time, summed; of it, the
    /// Machines' release-to-gone time.
    pub terminations: u64,
    pub termination_s: f64,
    pub machine_release_s: f64,
    /// Watches that listed again, and how long their indexes were behind, summed.
    pub relists: u64,
    pub watch_stale_s: f64,
    /// Failed API requests of the controller (every verb and resource).
    pub api_errors: u64,
    /// Claims the provisioner created during the phase (not the commands' replacements), and
    /// how long consolidation of non-empty nodes was paused after such an overshoot.
    pub provisioner_launches: u64,
    pub consolidation_paused_ms: u64,
    /// Pods the scheduler bound onto a node in the 3 s before the controller's disruption
    /// taint on it (a decision's validation and the command's first writes): pods its
    /// candidates took after the decision, whose room it did not plan.
    pub binds_before_taint: u64,
}

impl TimeSplit {
    /// The controller's share: its metrics now, less `baseline`.
    pub fn of_metrics(baseline: &Baseline, metrics: &crate::metrics::Metrics) -> Self {
        let now = metrics.encode();
        let d = |name: &str| total(&now, name) - total(&baseline.0, name);
        let by = |name: &str, label: &str| {
            let mut m = by_label(&now, name, label);
            for (k, v) in by_label(&baseline.0, name, label) {
                *m.entry(k).or_default() -= v;
            }
            m.retain(|_, v| *v > 1e-9);
            m
        };
        let round = |m: BTreeMap<String, f64>| -> BTreeMap<String, f64> {
            m.into_iter().map(|(k, v)| (k, round1(v))).collect()
        };
        let counts = |m: BTreeMap<String, f64>| -> BTreeMap<String, u64> {
            m.into_iter().map(|(k, v)| (k, v.round() as u64)).collect()
        };
        Self {
            commands: d("karpenter_voluntary_disruption_decisions_total") as u64,
            rollbacks: d("karpenter_voluntary_disruption_queue_failures_total") as u64,
            failed_validations: d("karpenter_voluntary_disruption_failed_validations_total") as u64,
            stage_s: round(by(
                "karpenter_capi_disruption_command_stage_duration_seconds_sum",
                "stage",
            )),
            write_retries: d("karpenter_capi_disruption_write_retries_total") as u64,
            write_backoff_s: round1(d("karpenter_capi_disruption_write_backoff_seconds_total")),
            drains: d("karpenter_capi_node_drain_duration_seconds_count") as u64,
            drain_s: round1(d("karpenter_capi_node_drain_duration_seconds_sum")),
            evictions: counts(by("karpenter_pods_eviction_requests_total", "code")),
            eviction_backoff_s: round(by("karpenter_capi_eviction_backoff_seconds_total", "cause")),
            terminations: d("karpenter_nodeclaims_termination_duration_seconds_count") as u64,
            termination_s: round1(d("karpenter_nodeclaims_termination_duration_seconds_sum")),
            machine_release_s: round1(d(
                "karpenter_nodeclaims_instance_termination_duration_seconds_sum",
            )),
            relists: d("karpenter_capi_watch_relists_total") as u64,
            watch_stale_s: round1(d("karpenter_capi_watch_stale_seconds_total")),
            api_errors: d("karpenter_capi_api_errors_total") as u64,
            provisioner_launches: by("karpenter_nodeclaims_created_total", "reason")
                .get("provisioning")
                .map_or(0, |v| v.round() as u64),
            ..Self::default()
        }
    }
}

impl std::fmt::Display for TimeSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |ms: u64| ms as f64 / 1000.0;
        let stages: Vec<String> = self
            .stage_s
            .iter()
            .map(|(k, v)| format!("{k} {v:.1}s"))
            .collect();
        let map = |m: &BTreeMap<String, f64>| -> String {
            let v: Vec<String> = m.iter().map(|(k, v)| format!("{k} {v:.1}s")).collect();
            if v.is_empty() {
                "none".into()
            } else {
                v.join(", ")
            }
        };
        let evictions: Vec<String> = self
            .evictions
            .iter()
            .map(|(k, v)| format!("{v} x {k}"))
            .collect();
        write!(
            f,
            "  time:     scenario: scale-down {:.1}s, first mark at {:.1}s, calm {:.1}s; {} commands ({} rolled back, {} candidates failed validation), stages summed: {}; {} write retries waited {:.1}s\n            {} drains {:.1}s summed (evictions {}; backoff {}); {} terminations {:.1}s summed ({:.1}s Machine release); {} relists {:.1}s stale; {} API errors; {} provisioner launches; consolidation paused {:.1}s; {} pods bound onto candidates in the 3s before their taint",
            s(self.scale_down_ms),
            s(self.first_mark_ms),
            s(self.calm_ms),
            self.commands,
            self.rollbacks,
            self.failed_validations,
            if stages.is_empty() {
                "none".into()
            } else {
                stages.join(", ")
            },
            self.write_retries,
            self.write_backoff_s,
            self.drains,
            self.drain_s,
            if evictions.is_empty() {
                "none".into()
            } else {
                evictions.join(", ")
            },
            map(&self.eviction_backoff_s),
            self.terminations,
            self.termination_s,
            self.machine_release_s,
            self.relists,
            self.watch_stale_s,
            self.api_errors,
            self.provisioner_launches,
            s(self.consolidation_paused_ms),
            self.binds_before_taint,
        )
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The series of `name` in a Prometheus exposition: each line's labels and value.
fn series<'a>(exposition: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    exposition.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = rest.rsplit_once(' ')?;
        if !(labels.is_empty() || labels.starts_with('{')) {
            return None;
        }
        Some((labels, value.trim().parse().ok()?))
    })
}

/// Every series of `name` summed.
pub(super) fn total(exposition: &str, name: &str) -> f64 {
    series(exposition, name).map(|(_, v)| v).sum()
}

/// The series of `name` summed by the value of `label`.
pub(super) fn by_label(exposition: &str, name: &str, label: &str) -> BTreeMap<String, f64> {
    let key = format!("{label}=\"");
    let mut out = BTreeMap::new();
    for (labels, v) in series(exposition, name) {
        let value = labels
            .split(key.as_str())
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_default();
        *out.entry(value.to_string()).or_default() += v;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_summed_and_split_by_label() {
        let text = "# HELP x_total x\n\
            x_total{code=\"200\"} 3\n\
            x_total{code=\"500\"} 2\n\
            x_total_other 9\n\
            y_sum{stage=\"mark\",a=\"b\"} 1.5\n";
        assert_eq!(total(text, "x_total"), 5.0);
        let by = by_label(text, "x_total", "code");
        assert_eq!(by.get("500"), Some(&2.0));
        assert_eq!(by_label(text, "y_sum", "stage").get("mark"), Some(&1.5));
    }

    #[test]
    fn the_phase_counts_only_what_happened_since_the_baseline() {
        let m = crate::metrics::Metrics::new();
        m.disruption_write_retry("delete", std::time::Duration::from_secs(2));
        let base = Baseline::take(&m);
        m.disruption_write_retry("delete", std::time::Duration::from_millis(500));
        m.disruption_stage("mark", std::time::Duration::from_secs(1));
        let t = TimeSplit::of_metrics(&base, &m);
        assert_eq!(t.write_retries, 1);
        assert_eq!(t.write_backoff_s, 0.5);
        assert_eq!(t.stage_s.get("mark"), Some(&1.0));
    }
}
