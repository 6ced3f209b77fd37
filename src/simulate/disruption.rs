//! The disruption scenarios: `consolidate`, `drift` and `expire`. Each provisions pods as the pods
//! scenario does (Deployments kept at their replicas by the simulated cluster's Deployment
//! stand-in), then starts a disruption phase and waits until the cluster is stable again. The
//! figures come from the simulated cluster: its disruption audit (decisions, budgets), its drain
//! audit (PodDisruptionBudgets, do-not-disrupt), its write log (how long pods stayed pending),
//! its store (nodes, Machines, prices) and the invariants. The controller runs disruption faster
//! than in production (`fast_disruption`) so a scenario takes a minute or two.

mod backoff;
mod blockers;
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

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::launch::{self, progress_line};
use super::pods::{SIZES, provision_with};
use super::{BackgroundSim, Error, Kept};
use crate::actors::Settings;
use crate::api::wellknown::DISRUPTION_PAUSED_ANNOTATION;
use crate::cli::{Scenario, SimulateArgs};
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
        let api: kube::Api<crate::api::nodepool::NodePool> = kube::Api::all(c.client());
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
    let scenario = args.scenario;
    let expire = scenario == Scenario::Expire;
    let expire_after = expire_after_secs(args.pods);
    backoff::check(args)?;
    let p = provision_with(
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
    .await?;
    let deadline = args.deadline;
    let since_ms = p.sim.cluster().stats().now_ms();
    p.sim.cluster().disruption_audit().reset();
    let violations_before = p.sim.cluster().stats().violations().len();
    let claims_before = live_claims(&p.sim);
    let nodes_before = live_nodes(&p.sim);
    let cost_before = cost_per_hour(&p.sim);
    let phase = Instant::now();
    let mut rollout = None;
    let mut drift_phase = None;
    // The rollout's own audit, so a violation there names its moment too.
    let mut rollout_phase = None;
    let in_flight = InFlightSampler::start(&p.controller.shared.metrics);
    let blockers = blockers::BlockerSampler::start(&p.controller.shared.metrics);
    let baseline = time_split::Baseline::take(&p.controller.shared.metrics);
    let mut disruption_end_ms = None;
    let mut nodes_up_to_date_after_ms = None;
    let mut pause = None;
    let mut backoff = None;
    let mut scale_down = Duration::ZERO;
    let calm = match scenario {
        Scenario::Consolidate => CONSOLIDATE_CALM,
        Scenario::Drift => DRIFT_CALM,
        _ => EXPIRE_CALM,
    };
    match scenario {
        Scenario::Consolidate => {
            scale_down = consolidate(args, &p.sim, &p.controller.shared.metrics, deadline).await?
        }
        Scenario::Drift => {
            eprintln!(
                "changing the NodePool template: every one of the {} claims drifts",
                claims_before.len()
            );
            let mut change =
                json!({"spec": {"template": {"metadata": {"labels": {DRIFT_LABEL: "2"}}}}});
            if !args.pause_disruption.is_zero() {
                // In the same write, so no pass sees the change unpaused.
                change["metadata"] = json!({"annotations": {DISRUPTION_PAUSED_ANNOTATION: "true"}});
            }
            // Failing before the change, so no replacement launches in between.
            let failing =
                backoff::Failing::start(&p.sim, args, &p.controller.shared.metrics).await?;
            patch_nodepool(&p.sim, change).await?;
            p.sim.mark("template changed");
            let changed_ms = p.sim.cluster().stats().now_ms();
            pause = hold_paused(&p.sim, args.pause_disruption).await?;
            let lifted = match &failing {
                Some(f) => Some(f.lift(&p.sim, args.fail_replacements).await?),
                None => None,
            };
            let originals = claims_before.clone();
            // The phase ends only once the pool says so too: a rollout is over for its users
            // when `NodesUpToDate` is True, not when the old claims are gone.
            let up_to_date_ms = std::cell::Cell::new(None);
            wait_stable(&p.sim, "drift", deadline, DRIFT_CALM, |sim| {
                if up_to_date_ms.get().is_none() && pool_up_to_date(sim) {
                    up_to_date_ms.set(Some(sim.cluster().stats().now_ms()));
                    sim.mark("NodesUpToDate");
                }
                let left = live_or_deleting(sim, &originals);
                if left > 0 {
                    return Some(format!("{left} drifted claims left"));
                }
                up_to_date_ms
                    .get()
                    .is_none()
                    .then(|| "the NodePool's NodesUpToDate not True yet".to_string())
            })
            .await?;
            nodes_up_to_date_after_ms = up_to_date_ms.get().map(|t| t.saturating_sub(changed_ms));
            if let (Some(f), Some(lifted)) = (&failing, lifted) {
                backoff = Some(f.figures(&p, lifted, up_to_date_ms.get()).await?);
            }
            p.sim.mark("drifted claims replaced");
            disruption_end_ms = Some(p.sim.cluster().stats().now_ms());
            // The rollout is measured apart: Cluster API, not the controller, deletes its
            // Machines.
            drift_phase = Some(p.sim.cluster().disruption_audit().report());
            p.sim.cluster().disruption_audit().reset_worst();
            let mut r = rollout::roll_out(&p.sim, deadline).await?;
            let during = p.sim.cluster().disruption_audit().report();
            r.max_disrupting = during
                .pools
                .values()
                .map(|p| p.max_disrupting)
                .max()
                .unwrap_or(0);
            r.budget_violations = during.budget_violations;
            r.budget_excess_any = during
                .pools
                .values()
                .map(|p| p.max_excess_any.max(0) as usize)
                .sum();
            rollout_phase = Some(during.pools);
            rollout = Some(r);
        }
        Scenario::Expire => {
            eprintln!(
                "waiting for the {} claims to expire (expireAfter {expire_after}s)",
                claims_before.len()
            );
            let originals = claims_before.clone();
            // Expiry starts on the claims' own clocks: the chart shows when the first went.
            let expiring = std::cell::Cell::new(false);
            wait_stable(&p.sim, "expire", deadline, EXPIRE_CALM, |sim| {
                if !expiring.get()
                    && live_claims(sim).intersection(&originals).count() < originals.len()
                {
                    expiring.set(true);
                    sim.mark("first claim expired");
                }
                let left = live_or_deleting(sim, &originals);
                (left > 0).then(|| format!("{left} original claims left"))
            })
            .await?;
        }
        _ => unreachable!("not a disruption scenario"),
    }
    p.sim.mark("settled");
    let phase_ms = phase.elapsed().as_millis() as u64;
    let (commands_max_in_flight, paused) = in_flight.stop();
    let blocked_nodes = blockers.stop();
    let end_ms = disruption_end_ms.unwrap_or_else(|| p.sim.cluster().stats().now_ms());
    let first_mark_ms = p
        .sim
        .cluster()
        .stats()
        .writes()
        .iter()
        .filter(|w| w.at_ms >= since_ms && w.agent == crate::app::USER_AGENT)
        .filter(|w| w.resource == "nodes" && w.verb == "patch")
        .map(|w| w.at_ms)
        .min();
    let duration_ms = first_mark_ms.map_or(0, |first| end_ms.saturating_sub(first));
    let time = TimeSplit {
        scale_down_ms: scale_down.as_millis() as u64,
        first_mark_ms: first_mark_ms.map_or(0, |t| t.saturating_sub(since_ms)),
        calm_ms: calm.as_millis() as u64,
        consolidation_paused_ms: paused.as_millis() as u64,
        binds_before_taint: binds_before_taint(&p.sim, since_ms, 3000),
        ..TimeSplit::of_metrics(&baseline, &p.controller.shared.metrics)
    };

    let sim = &p.sim;
    let mut pods = p.measure();
    pods.launch.scenario = match scenario {
        Scenario::Consolidate => "consolidate",
        Scenario::Drift => "drift",
        _ => "expire",
    }
    .into();
    let unbound = unbound_pods(sim);
    pods.pods.unschedulable = unbound;
    // The drift scenario's budget figures are its drift phase's (the rollout's are apart);
    // its violations are both phases'.
    let end = sim.cluster().disruption_audit().report();
    let audit = drift_phase.clone().unwrap_or_else(|| end.clone());
    let all_violations = sim.cluster().stats().violations();
    let new_violations = &all_violations[violations_before.min(all_violations.len())..];
    let count = |v: Violation| new_violations.iter().filter(|r| r.violation == v).count();
    let mds = args.machine_deployments.clamp(1, SIZES.len());
    let (_, cpu, memory, _) = SIZES[mds - 1];
    let store = sim.cluster().store();
    let live = live_claims(sim);
    let figures = DisruptionFigures {
        decisions: end.decisions.clone(),
        nodes_before,
        nodes_after: live_nodes(sim),
        nodes_lower_bound: lower_bound(&store.list("pods", None), (cpu, memory, 110)),
        cost_per_hour_before: round2(cost_before),
        cost_per_hour_after: round2(cost_per_hour(sim)),
        budget_violations: audit.budget_violations
            + rollout.as_ref().map(|r| r.budget_violations).unwrap_or(0),
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
        pods_max_pending_ms: max_pending_ms(sim, since_ms),
        claims_before: claims_before.len(),
        claims_replaced: claims_before.iter().filter(|c| !live.contains(*c)).count(),
        pods_unbound_at_end: unbound,
        pdb_violations: count(Violation::PdbViolation),
        do_not_disrupt_violations: count(Violation::DoNotDisrupt),
        rollout,
        nodes_up_to_date_after_ms,
        pause,
        backoff,
        blocked_nodes,
        phase_ms,
        duration_ms,
        commands_max_in_flight,
        time,
    };
    let problems = &mut pods.launch.problems;
    if figures.budget_violations > 0 {
        problems.push(format!(
            "disruption budgets exceeded by {} (server's disruption audit: {:?}; during the rollout: {:?})",
            figures.budget_violations, audit.pools, rollout_phase
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
    pods.launch.invariants_ok = pods.launch.problems.is_empty();
    let report = DisruptionReport {
        pods,
        disruption: figures,
    };
    Ok((report, p.kept()))
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Keeps the NodePool's disruption paused (the caller set the annotation) for `held`, then
/// lifts it; what the controller decided meanwhile. Nothing when `held` is zero.
async fn hold_paused(sim: &BackgroundSim, held: Duration) -> Result<Option<PauseFigures>, Error> {
    if held.is_zero() {
        return Ok(None);
    }
    eprintln!("disruption paused on the NodePool for {held:?}");
    tokio::time::sleep(held).await;
    let drifted_while_paused = sim.cluster().disruption_audit().report().decisions.drifted;
    patch_nodepool(
        sim,
        json!({"metadata": {"annotations": {DISRUPTION_PAUSED_ANNOTATION: null}}}),
    )
    .await?;
    sim.mark("pause lifted");
    Ok(Some(PauseFigures {
        held_ms: held.as_millis() as u64,
        drifted_while_paused,
    }))
}

/// How many of `names` still exist (live or terminating).
fn live_or_deleting(sim: &BackgroundSim, names: &BTreeSet<String>) -> usize {
    let store = sim.cluster().store();
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
    eprintln!(
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
