//! The disruption scenarios: `consolidate`, `drift` and `expire`. Each provisions pods as the pods
//! scenario does (Deployments kept at their replicas by the simulated cluster's Deployment
//! stand-in), then starts a disruption phase and waits until the cluster is stable again. The
//! figures come from the simulated cluster: its disruption audit (decisions, budgets), its drain
//! audit (PodDisruptionBudgets, do-not-disrupt), its write log (how long pods stayed pending),
//! its store (nodes, Machines, prices) and the invariants. The controller runs disruption faster
//! than in production (`fast_disruption`) so a scenario takes a minute or two.

mod backoff;
mod blockers;
mod drift;
mod ranked;
mod readings;
mod report;
mod rollout;
mod time_split;

pub use backoff::{BackoffFigures, FAILING_CREATE_TIMEOUT};
pub use blockers::{BlockerCount, BlockerCounts};
pub use readings::*;
use report::decided;
pub use report::*;
pub use time_split::TimeSplit;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::launch::{self, progress_line};
use super::pods::{Provisioned, SIZES, provision_with};
use super::{BackgroundSim, Error, Kept};
use crate::actors::Settings;
use crate::cli::{Scenario, SimulateArgs};
use crate::sim::disruption_audit::{DisruptionAuditReport, PoolAudit};
use crate::sim::drain_audit::Violation;

/// The claims' `expireAfter` in the expire scenario: 45 s, or a tenth of a second per pod when
/// that is longer, so the replacements are up well before they expire in turn (with 1,000 pods
/// and 30 s the cluster never settles: each generation expires while the next is launching; at
/// 100 pods 30 s was once too short on a machine loaded by other runs).
pub fn expire_after_secs(pods: usize) -> u64 {
    45.max(pods as u64 / 10)
}
/// The label the drift scenario adds to the NodePool's template.
pub const DRIFT_LABEL: &str = "example.com/revision";

/// Disruption timing for simulations: a pass every second, 200 ms of debounce, 2 s of
/// validation (production: 10 s, 1 s, 15 s).
pub fn fast_disruption(s: &mut Settings) {
    s.disruption.poll = Duration::from_secs(1);
    s.disruption.debounce = Duration::from_millis(200);
    s.disruption.validation = Duration::from_secs(2);
}

/// Wait until `done` holds, nothing is in flight (launch path quiet, no disruption under way,
/// every pod bound) and nothing changed for `calm`; bounded by `deadline`.
async fn wait_stable(
    sim: &BackgroundSim,
    what: &str,
    deadline: Duration,
    calm: Duration,
    done: impl Fn(&BackgroundSim) -> Option<String>,
) -> Result<(), Error> {
    let start = Instant::now();
    let mut last_change = Instant::now();
    let mut last_line = String::new();
    let printer = super::progress::Progress::new();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let decisions = sim.cluster().disruption_audit().report().decisions;
        let line = format!(
            "{} | cost/h {:.2} | decided: {}",
            progress_line(sim.cluster()),
            cost_per_hour(sim),
            decided(&decisions)
        );
        let mut waiting = done(sim);
        if waiting.is_none() {
            waiting = disruption_in_flight(sim);
        }
        if waiting.is_none() && !launch::quiet(sim.cluster()) {
            waiting = launch::unsettled(sim.cluster()).into_iter().next();
        }
        if waiting.is_none() {
            let n = unbound_pods(sim);
            if n > 0 {
                waiting = Some(format!("{n} pods unbound"));
            }
        }
        if line != last_line || waiting.is_some() {
            last_change = Instant::now();
            last_line = line.clone();
        }
        if printer.due() {
            printer.print(&format!(
                "{what}: {line}{}",
                waiting
                    .as_deref()
                    .map(|w| format!(" (waiting: {w})"))
                    .unwrap_or_default()
            ));
        }
        if waiting.is_none() && last_change.elapsed() >= calm {
            return Ok(());
        }
        if start.elapsed() > deadline {
            return Err(Error::NotSettled {
                after: deadline,
                why: format!("{what}: {}", waiting.unwrap_or(line)),
            });
        }
    }
}

/// Samples the controller's in-flight disruption commands while a phase runs; `stop` gives the
/// most seen.
struct InFlightSampler {
    max: Arc<std::sync::atomic::AtomicI64>,
    /// Samples that found consolidation paused.
    paused: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

const SAMPLE_EVERY: Duration = Duration::from_millis(100);

impl InFlightSampler {
    fn start(metrics: &Arc<crate::metrics::Metrics>) -> Self {
        let max = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let paused = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (m, seen, pauses) = (metrics.clone(), max.clone(), paused.clone());
        let task = tokio::spawn(async move {
            loop {
                let now = m.disruption_commands_in_flight.get();
                seen.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
                if m.consolidation_paused.get() > 0 {
                    pauses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        });
        Self { max, paused, task }
    }

    /// The most commands at once, and how long consolidation was paused.
    fn stop(self) -> (i64, Duration) {
        self.task.abort();
        let paused = self.paused.load(std::sync::atomic::Ordering::Relaxed);
        (
            self.max.load(std::sync::atomic::Ordering::Relaxed),
            SAMPLE_EVERY * u32::try_from(paused).unwrap_or(u32::MAX),
        )
    }
}

pub(super) async fn patch_nodepool(sim: &BackgroundSim, patch: Value) -> Result<(), Error> {
    sim.run(move |c| async move {
        let api: kube::Api<crate::api::nodepool::NodePool> = kube::Api::all(c.karpenter_client());
        api.patch(
            launch::NODEPOOL,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
        .map_err(|source| Error::Kube {
            what: "patching the NodePool".into(),
            source,
        })
    })
    .await?
}

/// `simulate --scenario consolidate|drift|expire`.
pub async fn run(args: &SimulateArgs) -> Result<DisruptionReport, Error> {
    run_kept(args).await.map(|(report, _)| report)
}

/// `run`, handing back the cluster and the controller (`simulate --serve` keeps them running).
pub async fn run_kept(args: &SimulateArgs) -> Result<(DisruptionReport, Kept), Error> {
    let expire_after = expire_after_secs(args.pods);
    backoff::check(args)?;
    let p = provision(args, expire_after).await?;
    let before = Before::take(&p.sim);
    let phase = Instant::now();
    let samplers = Samplers::start(&p.controller.shared.metrics);
    let figures = match args.scenario {
        Scenario::Consolidate => PhaseFigures {
            scale_down: consolidate(args, &p.sim, &p.controller.shared.metrics, args.deadline)
                .await?,
            ..PhaseFigures::default()
        },
        Scenario::Drift => drift::run(args, &p, &before.claims).await?,
        Scenario::Expire => {
            expire(&p.sim, args.deadline, &before.claims, expire_after).await?;
            PhaseFigures::default()
        }
        _ => unreachable!("not a disruption scenario"),
    };
    p.sim.mark("settled");
    let phase_ms = phase.elapsed().as_millis() as u64;
    let sampled = samplers.stop(&p, args.scenario, &before, &figures, phase_ms);
    let mut pods = p.measure();
    pods.launch.scenario = match args.scenario {
        Scenario::Consolidate => "consolidate",
        Scenario::Drift => "drift",
        _ => "expire",
    }
    .into();
    let unbound = unbound_pods(&p.sim);
    pods.pods.unschedulable = unbound;
    let (disruption, problems) =
        disruption_figures(args, &p.sim, before, figures, sampled, unbound);
    pods.launch.problems.extend(problems);
    pods.launch.invariants_ok = pods.launch.problems.is_empty();
    let report = DisruptionReport { pods, disruption };
    Ok((report, p.kept()))
}

/// Provisions the scenario's pods, with the NodePool's `expireAfter` for the expire scenario and
/// disruption timed for a simulation.
async fn provision(args: &SimulateArgs, expire_after: u64) -> Result<Provisioned, Error> {
    let expire = args.scenario == Scenario::Expire;
    provision_with(
        args,
        move |pool| {
            if expire {
                *pool = json!({"spec": {"template": {"spec": {
                    "expireAfter": format!("{expire_after}s")}}}});
            }
        },
        |_, _| {},
        |s| {
            fast_disruption(s);
            backoff::tune(s, args);
        },
    )
    .await
}

/// The cluster as the disruption phase begins (the server's disruption audit reset then).
struct Before {
    since_ms: u64,
    violations: usize,
    claims: BTreeSet<String>,
    nodes: usize,
    cost: f64,
}

impl Before {
    fn take(sim: &BackgroundSim) -> Self {
        let since_ms = sim.cluster().stats().now_ms();
        sim.cluster().disruption_audit().reset();
        Before {
            since_ms,
            violations: sim.cluster().stats().violations().len(),
            claims: live_claims(sim),
            nodes: live_nodes(sim),
            cost: cost_per_hour(sim),
        }
    }
}

/// What a scenario's phase measured beyond the common figures: the consolidate scenario's
/// scale-down, the drift scenario's the rest.
#[derive(Default)]
struct PhaseFigures {
    scale_down: Duration,
    /// When the controller's part of the phase ended, when before the cluster settled.
    end_ms: Option<u64>,
    nodes_up_to_date_after_ms: Option<u64>,
    pause: Option<PauseFigures>,
    backoff: Option<BackoffFigures>,
    /// The drift phase's own audit (the rollout's is apart).
    drift_audit: Option<DisruptionAuditReport>,
    rollout: Option<RolloutFigures>,
    /// The rollout's own audit, so a violation there names its moment too.
    rollout_pools: Option<BTreeMap<String, PoolAudit>>,
}

/// Waits until every one of `originals` has expired and been replaced.
async fn expire(
    sim: &BackgroundSim,
    deadline: Duration,
    originals: &BTreeSet<String>,
    expire_after: u64,
) -> Result<(), Error> {
    say!(
        "waiting for the {} claims to expire (expireAfter {expire_after}s)",
        originals.len()
    );
    // Expiry starts on the claims' own clocks: the chart shows when the first went.
    let expiring = std::cell::Cell::new(false);
    wait_stable(sim, "expire", deadline, EXPIRE_CALM, |sim| {
        if !expiring.get() && live_claims(sim).intersection(originals).count() < originals.len() {
            expiring.set(true);
            sim.mark("first claim expired");
        }
        let left = live_or_deleting(sim, originals);
        (left > 0).then(|| format!("{left} original claims left"))
    })
    .await
}

/// What is sampled from the controller's metrics while the phase runs.
struct Samplers {
    in_flight: InFlightSampler,
    blockers: blockers::BlockerSampler,
    baseline: time_split::Baseline,
}

/// What the samplers saw, with the phase's timing.
struct Sampled {
    commands_max_in_flight: i64,
    blocked_nodes: BlockerCounts,
    phase_ms: u64,
    duration_ms: u64,
    time: TimeSplit,
}

impl Samplers {
    fn start(metrics: &Arc<crate::metrics::Metrics>) -> Self {
        Samplers {
            in_flight: InFlightSampler::start(metrics),
            blockers: blockers::BlockerSampler::start(metrics),
            baseline: time_split::Baseline::take(metrics),
        }
    }

    /// Stops sampling; the disruption's duration runs from the controller's first mark to the
    /// phase's end.
    fn stop(
        self,
        p: &Provisioned,
        scenario: Scenario,
        before: &Before,
        phase: &PhaseFigures,
        phase_ms: u64,
    ) -> Sampled {
        let (commands_max_in_flight, paused) = self.in_flight.stop();
        let blocked_nodes = self.blockers.stop();
        let end_ms = phase
            .end_ms
            .unwrap_or_else(|| p.sim.cluster().stats().now_ms());
        let since_ms = before.since_ms;
        let first_mark_ms = first_mark_ms(&p.sim, since_ms);
        let calm = match scenario {
            Scenario::Consolidate => CONSOLIDATE_CALM,
            Scenario::Drift => DRIFT_CALM,
            _ => EXPIRE_CALM,
        };
        let time = TimeSplit {
            scale_down_ms: phase.scale_down.as_millis() as u64,
            first_mark_ms: first_mark_ms.map_or(0, |t| t.saturating_sub(since_ms)),
            calm_ms: calm.as_millis() as u64,
            consolidation_paused_ms: paused.as_millis() as u64,
            binds_before_taint: binds_before_taint(&p.sim, since_ms, 3000),
            ..TimeSplit::of_metrics(&self.baseline, &p.controller.shared.metrics)
        };
        Sampled {
            commands_max_in_flight,
            blocked_nodes,
            phase_ms,
            duration_ms: first_mark_ms.map_or(0, |first| end_ms.saturating_sub(first)),
            time,
        }
    }
}

/// When the controller first marked a node (patched it) since `since_ms`.
fn first_mark_ms(sim: &BackgroundSim, since_ms: u64) -> Option<u64> {
    sim.cluster()
        .stats()
        .writes()
        .iter()
        .filter(|w| w.at_ms >= since_ms && w.agent == crate::app::USER_AGENT)
        .filter(|w| w.resource == "nodes" && w.verb == "patch")
        .map(|w| w.at_ms)
        .min()
}

/// The disruption figures from the server's audits and store, and the problems they show.
/// The drift scenario's budget figures are its drift phase's (the rollout's are apart); its
/// violations are both phases'.
fn disruption_figures(
    args: &SimulateArgs,
    sim: &BackgroundSim,
    before: Before,
    phase: PhaseFigures,
    sampled: Sampled,
    unbound: usize,
) -> (DisruptionFigures, Vec<String>) {
    let end = sim.cluster().disruption_audit().report();
    let audit = phase.drift_audit.unwrap_or_else(|| end.clone());
    let all_violations = sim.cluster().stats().violations();
    let new_violations = &all_violations[before.violations.min(all_violations.len())..];
    let count = |v: Violation| new_violations.iter().filter(|r| r.violation == v).count();
    let mds = args.machine_deployments.clamp(1, SIZES.len());
    let (_, cpu, memory, _) = SIZES[mds - 1];
    let store = sim.cluster().store();
    let live = live_claims(sim);
    let figures = DisruptionFigures {
        decisions: end.decisions,
        nodes_before: before.nodes,
        nodes_after: live_nodes(sim),
        nodes_lower_bound: lower_bound(&store.list("pods", None), (cpu, memory, 110)),
        cost_per_hour_before: round2(before.cost),
        cost_per_hour_after: round2(cost_per_hour(sim)),
        budget_violations: audit.budget_violations
            + phase
                .rollout
                .as_ref()
                .map(|r| r.budget_violations)
                .unwrap_or(0),
        budget_excess_any: audit
            .pools
            .values()
            .map(|p| p.max_excess_any.max(0) as usize)
            .sum(),
        max_disrupting: audit
            .pools
            .values()
            .map(|p| p.max_disrupting)
            .max()
            .unwrap_or(0),
        pods_max_pending_ms: max_pending_ms(sim, before.since_ms),
        claims_before: before.claims.len(),
        claims_replaced: before.claims.iter().filter(|c| !live.contains(*c)).count(),
        pods_unbound_at_end: unbound,
        pdb_violations: count(Violation::PdbViolation),
        do_not_disrupt_violations: count(Violation::DoNotDisrupt),
        rollout: phase.rollout,
        nodes_up_to_date_after_ms: phase.nodes_up_to_date_after_ms,
        pause: phase.pause,
        backoff: phase.backoff,
        blocked_nodes: sampled.blocked_nodes,
        phase_ms: sampled.phase_ms,
        duration_ms: sampled.duration_ms,
        commands_max_in_flight: sampled.commands_max_in_flight,
        time: sampled.time,
    };
    let problems = problems(&figures, &audit.pools, &phase.rollout_pools);
    (figures, problems)
}

/// What the figures show went wrong.
fn problems(
    figures: &DisruptionFigures,
    pools: &BTreeMap<String, PoolAudit>,
    rollout_pools: &Option<BTreeMap<String, PoolAudit>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    if figures.budget_violations > 0 {
        problems.push(format!(
            "disruption budgets exceeded by {} (server's disruption audit: {:?}; during the rollout: {:?})",
            figures.budget_violations, pools, rollout_pools
        ));
    }
    if let Some(p) = figures.pause.filter(|p| p.drifted_while_paused > 0) {
        problems.push(format!(
            "{} claims drifted while the NodePool's disruption was paused",
            p.drifted_while_paused
        ));
    }
    if let Some(b) = &figures.backoff {
        problems.extend(backoff::problems(b));
    }
    if figures.pdb_violations + figures.do_not_disrupt_violations > 0 {
        problems.push(format!(
            "{} PodDisruptionBudget and {} do-not-disrupt violations (see the server's drain audit)",
            figures.pdb_violations, figures.do_not_disrupt_violations
        ));
    }
    problems
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// How many of `names` still exist (live or terminating).
fn live_or_deleting(sim: &BackgroundSim, names: &BTreeSet<String>) -> usize {
    let store = sim.cluster().karpenter_store();
    names
        .iter()
        .filter(|n| store.get("nodeclaims", "", n).is_some())
        .count()
}

/// How long each scenario waits with nothing changing before it calls the cluster settled.
/// Consolidation waits for its validation (2 s) after every pass (1 s): 8 s without a change
/// means it found nothing more to do.
const CONSOLIDATE_CALM: Duration = Duration::from_secs(8);
const DRIFT_CALM: Duration = Duration::from_secs(3);
const EXPIRE_CALM: Duration = Duration::from_secs(1);

/// Enable consolidation, scale 70 % of the Deployments down to 20 % of their replicas, wait
/// until stable; how long the scale-down itself took.
async fn consolidate(
    args: &SimulateArgs,
    sim: &BackgroundSim,
    metrics: &Arc<crate::metrics::Metrics>,
    deadline: Duration,
) -> Result<Duration, Error> {
    // Before consolidation is on, so both runs (with and without the gate) start it alike.
    if args.feature_gates.pod_deletion_cost {
        ranked::wait_ranked(sim, deadline).await?;
    }
    let start = Instant::now();
    patch_nodepool(
        sim,
        json!({"spec": {"disruption": {
            "consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s"}}}),
    )
    .await?;
    let (n, k) = (args.pods, args.deployments.max(1));
    let count = |d: usize| n / k + usize::from(d < n % k);
    let scaled: Vec<(String, usize)> = (0..k)
        .filter(|d| d % 10 < 7)
        .map(|d| (format!("app-{d}"), count(d).div_ceil(5)))
        .collect();
    let remaining: usize = (0..k)
        .map(|d| match d % 10 < 7 {
            true => count(d).div_ceil(5),
            false => count(d),
        })
        .sum();
    say!(
        "consolidation on (WhenEmptyOrUnderutilized, consolidateAfter 0s); scaling {} of {k} Deployments to 20 % of their replicas",
        scaled.len()
    );
    sim.run(move |c| async move {
        for (name, replicas) in scaled {
            c.scale_deployment(launch::NAMESPACE, &name, replicas)
                .await?;
        }
        Ok::<_, crate::sim::cluster::Error>(())
    })
    .await??;
    sim.mark("scaled down");
    // The calm below is measured from the scale-down's end: on a real control plane the
    // ReplicaSet controller removes the pods at its own pace (its client's 20 requests a
    // second), and until they are gone the nodes are as full as before, so nothing changes.
    wait_pods_at_most(sim, remaining, deadline).await?;
    let scale_down = start.elapsed();
    // A pause after an overshoot (10 s doubling to 5 min) is
    // not waited out: the report shows where consolidation stands when it pauses, and a long
    // pause would make the scenario's length depend on luck
    // (`karpenter_capi_consolidation_paused` says when it does).
    // The calm counts only once two disruption passes have looked at the scaled-down cluster
    // (the first may have begun before the pods were gone): on a loaded machine the first
    // pass can take longer than the calm, and "nothing changed" would then mean "not looked".
    const PASSES: &str =
        "karpenter_voluntary_disruption_decision_evaluation_duration_seconds_count";
    let passes = || time_split::total(&metrics.encode(), PASSES);
    let before = passes();
    // Once seen, two passes stay seen: the metrics are not encoded again on every poll.
    let looked = std::cell::Cell::new(false);
    wait_stable(sim, "consolidate", deadline, CONSOLIDATE_CALM, |_| {
        if !looked.get() {
            looked.set(passes() >= before + 2.0);
        }
        (!looked.get()).then(|| "no disruption pass since the scale-down".to_string())
    })
    .await?;
    Ok(scale_down)
}

/// Waits until at most `n` pods exist (terminating ones included).
async fn wait_pods_at_most(sim: &BackgroundSim, n: usize, deadline: Duration) -> Result<(), Error> {
    let start = Instant::now();
    loop {
        let mut have = 0;
        sim.cluster().store().visit("pods", |_| have += 1);
        if have <= n {
            return Ok(());
        }
        if start.elapsed() >= deadline {
            return Err(Error::NotSettled {
                after: deadline,
                why: format!("{have} pods left after the scale-down to {n}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu: &str, memory: &str) -> Value {
        json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
            "status": {"phase": "Running"},
        })
    }

    #[test]
    fn the_lower_bound_is_the_tightest_resource_rounded_up() {
        // 10 pods of 1 CPU / 1Gi on 4 CPU / 16Gi nodes: CPU needs 2.5 -> 3.
        let pods: Vec<Value> = (0..10).map(|_| pod("1", "1Gi")).collect();
        assert_eq!(lower_bound(&pods, ("4", "16Gi", 110)), 3);
        // Memory-bound: 10 x 4Gi on 16Gi -> 3.
        let pods: Vec<Value> = (0..10).map(|_| pod("100m", "4Gi")).collect();
        assert_eq!(lower_bound(&pods, ("16", "16Gi", 110)), 3);
        // Pod-count-bound: 20 tiny pods, 10 per node -> 2; deleting ones do not count.
        let mut pods: Vec<Value> = (0..21).map(|_| pod("1m", "1Mi")).collect();
        pods[0]["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert_eq!(lower_bound(&pods, ("16", "64Gi", 10)), 2);
        // Exactly full is not one more.
        let pods: Vec<Value> = (0..8).map(|_| pod("500m", "1Gi")).collect();
        assert_eq!(lower_bound(&pods, ("2", "64Gi", 110)), 2);
        assert_eq!(lower_bound(&[], ("2", "8Gi", 110)), 0);
    }
}
