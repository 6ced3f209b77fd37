//! The `simulate` report: counts and latencies measured by the simulated cluster (its write log,
//! its stand-ins' milestones and its NodeClaim observer), plus the invariant check.

use std::fmt;

use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
}

impl Percentiles {
    /// Percentiles of the histogram `name` in Prometheus text exposition (every label set of
    /// it summed), in milliseconds, interpolated linearly within the bucket a rank falls in.
    pub fn of_histogram(exposition: &str, name: &str) -> Self {
        let prefix = format!("{name}_bucket{{");
        let mut buckets: std::collections::BTreeMap<u64, (f64, u64)> = Default::default();
        for line in exposition.lines().filter(|l| l.starts_with(&prefix)) {
            let Some((labels, count)) = line.rsplit_once(' ') else {
                continue;
            };
            let Some(le) = labels
                .split("le=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
            else {
                continue;
            };
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                match le.parse::<f64>() {
                    Ok(b) => b,
                    Err(_) => continue,
                }
            };
            let Ok(count) = count.trim().parse::<u64>() else {
                continue;
            };
            let e = buckets.entry(bound.to_bits()).or_insert((bound, 0));
            e.1 += count;
        }
        // Keyed by the bounds' bits, which order as the (non-negative) bounds do, +Inf last.
        let cumulative: Vec<(f64, u64)> = buckets.into_values().collect();
        let Some(&(_, total)) = cumulative.last() else {
            return Self::default();
        };
        if total == 0 {
            return Self::default();
        }
        let at = |q: f64| {
            let rank = q * total as f64;
            let mut lower = (0.0, 0u64);
            for &(bound, count) in &cumulative {
                if count as f64 >= rank {
                    if bound.is_infinite() {
                        // Past the largest bound: that bound is all that can be said.
                        return lower.0 * 1000.0;
                    }
                    let within = (count - lower.1) as f64;
                    let frac = if within > 0.0 {
                        (rank - lower.1 as f64) / within
                    } else {
                        1.0
                    };
                    return (lower.0 + (bound - lower.0) * frac) * 1000.0;
                }
                lower = (bound, count);
            }
            lower.0 * 1000.0
        };
        Self {
            p50: at(0.50),
            p99: at(0.99),
        }
    }

    /// Nearest-rank percentiles of `samples` (milliseconds); zeros when there are none.
    pub fn of(mut samples: Vec<f64>) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_by(f64::total_cmp);
        let at = |p: f64| {
            let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
            samples[rank.clamp(1, samples.len()) - 1]
        };
        Self {
            p50: at(50.0),
            p99: at(99.0),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ClaimCounts {
    pub requested: usize,
    pub launched: usize,
    pub registered: usize,
    pub initialized: usize,
    pub timed_out: usize,
    pub deleted: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct MachineCounts {
    pub created: usize,
    pub bound: usize,
    pub leaked: usize,
    pub double_bound: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ApiCounts {
    /// Writes made by the controller (told apart by its user agent).
    pub writes: usize,
    /// Writes of MachineDeployment replicas.
    pub replica_writes: usize,
    pub writes_per_claim: f64,
    /// Every request the controller made, by verb (get, list, watch, create, update, patch,
    /// delete), counted by the server as they arrived (failed ones too) since it started.
    pub requests_by_verb: std::collections::BTreeMap<String, u64>,
    /// The controller's successful writes by `verb resource[/subresource]` (e.g.
    /// `patch nodeclaims/status`): where `writes_per_claim` goes.
    pub writes_by_target: std::collections::BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Latencies {
    /// Provider ID set -> the claim's Launched condition seen by the report's own NodeClaim
    /// watch (includes that watch's delivery).
    pub provider_id_to_claim: Percentiles,
    /// Provider ID set -> the controller's status write landing at the server (the server's
    /// write log: no observer in between).
    pub provider_id_to_status_write: Percentiles,
    /// The controller's own share of `provider_id_to_status_write`: from its Machine watch
    /// handing it the provider ID to its status write answered, read from its
    /// `karpenter_capi_provider_id_to_claim_duration_seconds` histogram (interpolated within a
    /// bucket, as Prometheus's `histogram_quantile` does; buckets grow by half from 1 ms).
    pub controller_provider_id_to_status_write: Percentiles,
    pub claim_to_launched: Percentiles,
    pub claim_to_initialized: Percentiles,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub scenario: String,
    pub claims: ClaimCounts,
    pub machines: MachineCounts,
    pub api: ApiCounts,
    pub latency_ms: Latencies,
    /// CPU time of the controller's threads apart from the simulated cluster's.
    pub cpu_ms: super::cpu::CpuMs,
    pub invariants_ok: bool,
    pub problems: Vec<String>,
    pub elapsed_ms: u64,
    /// The cluster over time, for the HTML report's charts (not part of the JSON report).
    #[serde(skip)]
    pub timeline: super::timeline::Timeline,
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.claims;
        let m = &self.machines;
        let l = &self.latency_ms;
        writeln!(
            f,
            "scenario {} finished in {:.1}s",
            self.scenario,
            self.elapsed_ms as f64 / 1000.0
        )?;
        writeln!(
            f,
            "  claims:   {} requested, {} launched, {} registered, {} initialized, {} timed out, {} deleted",
            c.requested, c.launched, c.registered, c.initialized, c.timed_out, c.deleted
        )?;
        writeln!(
            f,
            "  machines: {} created, {} bound, {} leaked, {} double-bound",
            m.created, m.bound, m.leaked, m.double_bound
        )?;
        writeln!(
            f,
            "  api:      {} controller writes ({:.2} per claim), {} replica writes",
            self.api.writes, self.api.writes_per_claim, self.api.replica_writes
        )?;
        let verbs: Vec<String> = self
            .api
            .requests_by_verb
            .iter()
            .map(|(verb, n)| format!("{n} {verb}"))
            .collect();
        writeln!(f, "            controller requests: {}", verbs.join(", "))?;
        let cpu = &self.cpu_ms;
        writeln!(
            f,
            "  cpu:      controller {:.0} ms ({:.2} ms per claim), simulated cluster {:.0} ms ({:.2} ms per claim), process {:.0} ms",
            cpu.controller,
            cpu.per_claim_controller,
            cpu.simulated_cluster,
            cpu.per_claim_simulated_cluster,
            cpu.process
        )?;
        if let Some(cp) = cpu.control_plane {
            writeln!(
                f,
                "            real control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) {cp:.0} ms; \
                 \"simulated cluster\" above is the stand-ins' and the mirror's only"
            )?;
        }
        writeln!(
            f,
            "  latency:  provider ID -> claim p50 {:.0} ms p99 {:.0} ms (status write landed p50 {:.0} ms p99 {:.0} ms, of which the controller's own p50 {:.1} ms p99 {:.1} ms); claim -> launched p50 {:.0} ms p99 {:.0} ms; claim -> initialized p50 {:.0} ms p99 {:.0} ms",
            l.provider_id_to_claim.p50,
            l.provider_id_to_claim.p99,
            l.provider_id_to_status_write.p50,
            l.provider_id_to_status_write.p99,
            l.controller_provider_id_to_status_write.p50,
            l.controller_provider_id_to_status_write.p99,
            l.claim_to_launched.p50,
            l.claim_to_launched.p99,
            l.claim_to_initialized.p50,
            l.claim_to_initialized.p99
        )?;
        write!(
            f,
            "  invariants: {}",
            if self.invariants_ok { "ok" } else { "VIOLATED" }
        )?;
        for p in &self.problems {
            write!(f, "\n    - {p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let p = Percentiles::of((1..=100).map(f64::from).collect());
        assert_eq!((p.p50, p.p99), (50.0, 99.0));
        let one = Percentiles::of(vec![7.0]);
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
        let none = Percentiles::of(vec![]);
        assert_eq!((none.p50, none.p99), (0.0, 0.0));
    }

    /// The controller's own histogram, as its /metrics serves it, two MachineDeployments
    /// summed: 98 observations of 2 ms and two of 40 ms put p50 in the (1.5, 2.25] ms bucket
    /// and p99 in the (34.2, 51.3] ms one.
    #[test]
    fn percentiles_of_the_controllers_histogram() {
        use std::time::Duration;
        let m = crate::metrics::Metrics::new();
        for i in 0..100 {
            let md = if i % 2 == 0 { "default/a" } else { "default/b" };
            let d = if i < 98 { 2 } else { 40 };
            crate::metrics::Metrics::observe(
                &m.provider_id_to_claim_seconds,
                md,
                Duration::from_millis(d),
            );
        }
        let p = Percentiles::of_histogram(
            &m.encode(),
            "karpenter_capi_provider_id_to_claim_duration_seconds",
        );
        assert!(p.p50 > 1.5 && p.p50 <= 2.25, "{p:?}");
        assert!(p.p99 > 34.1 && p.p99 <= 51.3, "{p:?}");
        let none = Percentiles::of_histogram(&m.encode(), "no_such_histogram");
        assert_eq!((none.p50, none.p99), (0.0, 0.0));
    }
}
