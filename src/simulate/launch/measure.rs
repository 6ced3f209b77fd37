//! What a launch scenario measured: claim counts and latencies, the controller's API use and the
//! invariants, read from the simulated cluster once the scenario is over.

use std::collections::{BTreeMap, HashMap};

use crate::app::USER_AGENT;
use crate::metrics::Metrics;
use crate::sim::capi::PROVIDER_ID_SET;
use crate::sim::{Stats, WriteRecord};
use crate::simulate::BackgroundSim;
use crate::simulate::invariants::{self, SCALABLE_RESOURCES};
use crate::simulate::observer::{ClaimTimes, Observer};
use crate::simulate::report::{
    ApiCounts, ClaimCounts, Latencies, MachineCounts, Percentiles, Report,
};

/// Everything the report needs, read from the simulated cluster after the scenario.
pub fn measure(
    sim: &BackgroundSim,
    observer: &Observer,
    requested: usize,
    since_ms: u64,
    scenario: &str,
    metrics: &Metrics,
) -> Report {
    let cluster = sim.cluster();
    let stats = cluster.stats();
    // Only the scenario's writes: those of the stand-up before it are not its cost.
    let writes: Vec<_> = stats
        .writes()
        .into_iter()
        .filter(|w| w.at_ms >= since_ms)
        .collect();
    // A fleet's shared management cluster logs its writes on a clock of its own: this
    // cluster's are those in its namespace (the controller writes none there before its
    // scenario), and they are its cost as much as the workload cluster's are.
    let management_writes: Vec<WriteRecord> =
        match (cluster.management_server(), cluster.capi_namespace()) {
            (Some(management), Some(ns)) => (management.stats().writes().into_iter())
                .filter(|w| w.namespace == ns)
                .collect(),
            _ => Vec::new(),
        };
    let machines_created = (writes.iter().chain(&management_writes))
        .filter(|w| w.resource == "machines" && w.verb == "create")
        .count();
    let mut counts = ClaimCounts {
        requested,
        ..Default::default()
    };
    let samples = claim_samples(
        &observer.snapshot(),
        &WriteTimes::of(&writes, &stats),
        &mut counts,
    );
    // Cluster API's objects where they are: in the management cluster when apart (this
    // cluster's namespace of it when a fleet shares it).
    let inv = invariants::check_in(
        cluster.karpenter_store(),
        cluster.capi_store(),
        cluster.capi_namespace(),
    );
    let mut problems = inv.problems;
    problems.extend(refused_requests(&stats));
    Report {
        scenario: scenario.into(),
        claims: counts,
        machines: MachineCounts {
            created: machines_created,
            bound: inv.bound,
            leaked: inv.leaked,
            double_bound: inv.double_bound,
        },
        api: api_counts(&[writes, management_writes].concat(), requested, &stats),
        latency_ms: Latencies {
            provider_id_to_claim: Percentiles::of(samples.pid_to_claim),
            provider_id_to_status_write: Percentiles::of(samples.pid_to_write),
            controller_provider_id_to_status_write: Percentiles::of_histogram(
                &metrics.encode(),
                "karpenter_capi_provider_id_to_claim_duration_seconds",
            ),
            claim_to_launched: Percentiles::of(samples.to_launched),
            claim_to_initialized: Percentiles::of(samples.to_initialized),
        },
        cpu_ms: sim.cpu_ms(requested),
        invariants_ok: problems.is_empty(),
        problems,
        elapsed_ms: stats.now_ms().saturating_sub(since_ms),
        timeline: sim.timeline(),
    }
}

/// The controller's writes (told apart by its user agent), what they were of, and how many
/// per claim requested: the API cost of provisioning.
fn api_counts(writes: &[WriteRecord], requested: usize, stats: &Stats) -> ApiCounts {
    let controller_writes = writes.iter().filter(|w| w.agent == USER_AGENT).count();
    let mut writes_by_target = BTreeMap::new();
    for w in writes.iter().filter(|w| w.agent == USER_AGENT) {
        *writes_by_target.entry(w.target()).or_insert(0) += 1;
    }
    let replica_writes = writes
        .iter()
        .filter(|w| {
            w.agent == USER_AGENT
                && SCALABLE_RESOURCES.iter().any(|(r, _)| w.resource == *r)
                && matches!(w.verb.as_str(), "patch" | "update")
        })
        .count();
    ApiCounts {
        writes: controller_writes,
        replica_writes,
        writes_per_claim: if requested == 0 {
            0.0
        } else {
            controller_writes as f64 / requested as f64
        },
        requests_by_verb: stats.requests_by_verb(USER_AGENT),
        writes_by_target,
    }
}

/// The server's write log by claim and Machine. Both ends of the provider-ID latency come from
/// it (the observer's times add its own watch's delivery): the provider ID landed with the
/// Cluster API stand-in's last Machine write before its milestone (the milestone is taken when
/// that write's answer is back, by which time the controller may already have written the
/// claim), and the claim's first status write is its Launched write.
struct WriteTimes<'w> {
    /// When each NodeClaim was created, by name.
    created_at: BTreeMap<&'w str, u64>,
    /// When each Machine's provider ID was set, by `namespace/name`.
    provider_at: BTreeMap<String, u64>,
    /// The controller's writes of each NodeClaim's status, by name.
    status_writes: BTreeMap<&'w str, Vec<u64>>,
    /// The stand-in's writes of each Machine, by `namespace/name`.
    standin_machine_writes: BTreeMap<String, Vec<u64>>,
}

impl<'w> WriteTimes<'w> {
    fn of(writes: &'w [WriteRecord], stats: &Stats) -> Self {
        let created_at = writes
            .iter()
            .filter(|w| {
                w.resource == "nodeclaims" && w.verb == "create" && w.subresource.is_empty()
            })
            .map(|w| (w.name.as_str(), w.at_ms))
            .collect();
        let provider_at = stats
            .milestones(PROVIDER_ID_SET)
            .into_iter()
            .map(|m| (format!("{}/{}", m.namespace, m.name), m.at_ms))
            .collect();
        let mut status_writes: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        let mut standin_machine_writes: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for w in writes {
            if w.agent == USER_AGENT && w.resource == "nodeclaims" && w.subresource == "status" {
                status_writes
                    .entry(w.name.as_str())
                    .or_default()
                    .push(w.at_ms);
            } else if w.agent != USER_AGENT && w.resource == "machines" {
                standin_machine_writes
                    .entry(format!("{}/{}", w.namespace, w.name))
                    .or_default()
                    .push(w.at_ms);
            }
        }
        WriteTimes {
            created_at,
            provider_at,
            status_writes,
            standin_machine_writes,
        }
    }

    /// When the provider ID of `machine` landed: the stand-in's last write of it by the
    /// milestone.
    fn provider_landed(&self, machine: &str, milestone: u64) -> Option<u64> {
        self.standin_machine_writes
            .get(machine)
            .and_then(|ws| ws.iter().rev().find(|w| **w <= milestone).copied())
    }
}

/// Each latency's samples, in milliseconds.
#[derive(Default)]
struct Samples {
    to_launched: Vec<f64>,
    to_initialized: Vec<f64>,
    pid_to_claim: Vec<f64>,
    pid_to_write: Vec<f64>,
}

/// Every claim the observer saw, counted by how far it got, and its latencies sampled.
fn claim_samples(
    times: &HashMap<String, ClaimTimes>,
    log: &WriteTimes,
    counts: &mut ClaimCounts,
) -> Samples {
    let mut s = Samples::default();
    for (name, t) in times {
        count_claim(counts, t);
        // The write log's creation when it has one: the observer's adds its watch's delivery.
        let created = log.created_at.get(name.as_str()).copied().or(t.created_ms);
        if let (Some(c), Some(l)) = (created, t.launched_ms) {
            s.to_launched.push(l.saturating_sub(c) as f64);
        }
        if let (Some(c), Some(i)) = (created, t.initialized_ms) {
            s.to_initialized.push(i.saturating_sub(c) as f64);
        }
        let pid_at = t.machine.as_ref().and_then(|m| log.provider_at.get(m));
        if let (Some(m), Some(l)) = (pid_at, t.launched_ms) {
            s.pid_to_claim.push(l.saturating_sub(*m) as f64);
        }
        // The claim's first status write once the provider ID landed: its Launched write (a
        // claim that waited, e.g. for its template to be read, wrote its status before).
        if let (Some(machine), Some(m), Some(ws)) = (
            t.machine.as_deref(),
            pid_at,
            log.status_writes.get(name.as_str()),
        ) && let Some(landed) = log.provider_landed(machine, *m)
            && let Some(w) = ws.iter().find(|w| **w >= landed)
        {
            s.pid_to_write.push(w.saturating_sub(landed) as f64);
        }
    }
    s
}

/// One claim counted at every stage it reached; deleted before launching is timed out.
fn count_claim(counts: &mut ClaimCounts, t: &ClaimTimes) {
    counts.launched += usize::from(t.launched_ms.is_some());
    counts.registered += usize::from(t.registered_ms.is_some());
    counts.initialized += usize::from(t.initialized_ms.is_some());
    counts.deleted += usize::from(t.deleted_ms.is_some());
    counts.timed_out += usize::from(t.deleted_ms.is_some() && t.launched_ms.is_none());
}

/// The controller's requests the API server refused (on a real control plane, which authorizes
/// them against the Helm chart's RBAC), as a problem: a permission the chart lacks fails the run.
fn refused_requests(stats: &Stats) -> Option<String> {
    let refused = stats.refused();
    let total: u64 = refused.values().sum();
    (total > 0).then(|| {
        format!(
            "the API server refused {total} of the controller's requests (permissions the Helm \
             chart lacks): {refused:?}"
        )
    })
}
