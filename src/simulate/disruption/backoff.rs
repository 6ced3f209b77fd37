//! The drift scenario's failing offerings (`--fail-replacements DURATION`): just before the
//! template change every MachineDeployment's launches start failing (the Cluster API stand-in's
//! `fail-launches` annotation: its Machines never get a provider ID), so each drift replacement
//! times out and the controller's drift back-off holds the pool; after DURATION the launches
//! work again and drift must resume and finish. Every MachineDeployment fails, not only the
//! cheapest: a replacement whose offering failed is retried on the next one.
//!
//! The figures come from the controller's own record of its back-offs (its
//! `karpenter_voluntary_disruption_drift_backoffs_total` counter and `DisruptionBackoff`
//! Events, read through the API) and from the server's (the claims that never launched, the
//! pool's `NodesUpToDate`).

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use crate::actors::Settings;
use crate::cli::ScalableArg;
use crate::cli::SimulateArgs;
use crate::sim::capi::FAIL_LAUNCHES_ANNOTATION;
use crate::simulate::launch::{self};
use crate::simulate::{BackgroundSim, Error};

use super::time_split;

/// Drift back-off in a simulation: 5 s doubling to 20 s (production: 1 min to 10 min), a
/// twelfth of production's as the disruption pass is a tenth of it, so a run of a minute or
/// two sees several windows.
const SIM_BACKOFF: Duration = Duration::from_secs(5);
const SIM_BACKOFF_CAP: Duration = Duration::from_secs(20);
/// The create timeout with `--fail-replacements` when `--create-timeout` is not given: the
/// default 5 minutes would outlast any failing window, and 10 s is still ten times what a
/// launch takes in the simulated cluster without `--provider-delay`.
pub const FAILING_CREATE_TIMEOUT: Duration = Duration::from_secs(10);
const BACKOFFS: &str = "karpenter_voluntary_disruption_drift_backoffs_total";

/// The drift scenario's `--fail-replacements` figures.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct BackoffFigures {
    /// How long launches failed (from just before the template change), and the controller's
    /// create timeout in the run.
    pub failing_ms: u64,
    pub create_timeout_ms: u64,
    /// Back-off windows the controller entered (its counter's increase over the phase), and its
    /// `DisruptionBackoff` Events on the NodePool.
    pub backoffs: u64,
    pub backoff_events: usize,
    /// The longest window an Event announced.
    pub longest_backoff_ms: u64,
    /// Claims created while launches failed that never launched and are gone: the replacements
    /// that timed out.
    pub failed_replacements: usize,
    /// Claims the controller drifted (deleted) while launches failed, and after the lift.
    pub drifted_while_failing: usize,
    pub drifted_after_lift: usize,
    /// From the lift until the NodePool's `NodesUpToDate` turned True: drift finished.
    pub up_to_date_after_lift_ms: Option<u64>,
}

/// Failing launches under way.
pub(super) struct Failing {
    start: Instant,
    start_ms: u64,
    backoffs_before: f64,
}

/// The controller's settings for the run: short back-off windows, and (unless
/// `--create-timeout` says otherwise) a short create timeout.
pub(super) fn tune(s: &mut Settings, args: &SimulateArgs) {
    if args.fail_replacements.is_zero() {
        return;
    }
    s.disruption.drift_backoff = SIM_BACKOFF;
    s.disruption.drift_backoff_cap = SIM_BACKOFF_CAP;
    if args.create_timeout.is_none() {
        s.create_timeout = FAILING_CREATE_TIMEOUT;
        // As `sim_settings` does for a given timeout: a failed offering kept out briefly.
        s.unavailable_offering_ttl = FAILING_CREATE_TIMEOUT.min(s.unavailable_offering_ttl);
    }
}

/// Refuses `--fail-replacements` where the switch does not reach: it is a MachineDeployment's.
pub(super) fn check(args: &SimulateArgs) -> Result<(), Error> {
    if !args.fail_replacements.is_zero() && args.scalable != ScalableArg::Machinedeployments {
        return Err(Error::Usage(
            "--fail-replacements fails MachineDeployments' launches: use it with --scalable machinedeployments".into(),
        ));
    }
    Ok(())
}

impl Failing {
    /// Every MachineDeployment's launches fail from now; nothing when `--fail-replacements` is 0.
    pub(super) async fn start(
        sim: &BackgroundSim,
        args: &SimulateArgs,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Option<Self>, Error> {
        if args.fail_replacements.is_zero() {
            return Ok(None);
        }
        say!(
            "launches fail on every MachineDeployment for {:?}",
            args.fail_replacements
        );
        set_failing(sim, true).await?;
        sim.mark("launches failing");
        Ok(Some(Self {
            start: Instant::now(),
            start_ms: sim.cluster().stats().now_ms(),
            backoffs_before: time_split::total(&metrics.encode(), BACKOFFS),
        }))
    }

    /// Waits out `held` from the start, then lifts the failures; the server's clock then, and
    /// the drift decisions so far.
    pub(super) async fn lift(&self, sim: &BackgroundSim, held: Duration) -> Result<Lifted, Error> {
        tokio::time::sleep(held.saturating_sub(self.start.elapsed())).await;
        let drifted = sim.cluster().disruption_audit().report().decisions.drifted;
        set_failing(sim, false).await?;
        sim.mark("failures lifted");
        Ok(Lifted {
            at_ms: sim.cluster().stats().now_ms(),
            drifted,
        })
    }

    /// The figures once drift has settled (`up_to_date_ms`: when `NodesUpToDate` turned True).
    pub(super) async fn figures(
        &self,
        p: &super::super::pods::Provisioned,
        lifted: Lifted,
        up_to_date_ms: Option<u64>,
    ) -> Result<BackoffFigures, Error> {
        let metrics = &p.controller.shared.metrics;
        let events = super::super::events::with_reason(&p.sim, "DisruptionBackoff").await?;
        let longest = events
            .iter()
            .filter_map(|e| window_of(e["note"].as_str().unwrap_or_default()))
            .max()
            .unwrap_or_default();
        let failed_replacements = p
            .observer
            .snapshot()
            .values()
            .filter(|t| {
                t.created_ms
                    .is_some_and(|c| c >= self.start_ms && c < lifted.at_ms)
            })
            .filter(|t| t.launched_ms.is_none() && t.deleted_ms.is_some())
            .count();
        let drifted = p
            .sim
            .cluster()
            .disruption_audit()
            .report()
            .decisions
            .drifted;
        let backoffs = time_split::total(&metrics.encode(), BACKOFFS) - self.backoffs_before;
        Ok(BackoffFigures {
            failing_ms: lifted.at_ms.saturating_sub(self.start_ms),
            create_timeout_ms: p.controller.shared.settings.create_timeout.as_millis() as u64,
            backoffs: backoffs.max(0.0) as u64,
            backoff_events: events.len(),
            longest_backoff_ms: longest.as_millis() as u64,
            failed_replacements,
            drifted_while_failing: lifted.drifted,
            drifted_after_lift: drifted.saturating_sub(lifted.drifted),
            up_to_date_after_lift_ms: up_to_date_ms.map(|t| t.saturating_sub(lifted.at_ms)),
        })
    }
}

/// The moment the failures were lifted.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lifted {
    at_ms: u64,
    drifted: usize,
}

/// What is wrong with a run: no back-off against the failures, or drift done before the lift
/// (the failures did not hold it) or never after it.
pub(super) fn problems(b: &BackoffFigures) -> Vec<String> {
    let mut out = Vec::new();
    if b.backoffs == 0 {
        out.push(format!(
            "drift did not back off while its replacements failed to launch ({} failed)",
            b.failed_replacements
        ));
    }
    match b.up_to_date_after_lift_ms {
        None => out.push("drift did not finish after the failures were lifted".into()),
        Some(0) => out.push("drift finished before the failures were lifted".into()),
        Some(_) => {}
    }
    out
}

/// The window a `DisruptionBackoff` Event's note announces ("... backs off for 10s (failed
/// window 2): ...").
fn window_of(note: &str) -> Option<Duration> {
    let rest = note.split(" backs off for ").nth(1)?;
    crate::api::duration::parse(rest.split_whitespace().next()?).ok()
}

/// Sets (or lifts, `"false"`: a removed annotation would stay on the MachineSets) the
/// stand-in's failure switch on every MachineDeployment.
async fn set_failing(sim: &BackgroundSim, fail: bool) -> Result<(), Error> {
    sim.run(move |c| async move {
        let api: kube::Api<kube::core::DynamicObject> = kube::Api::namespaced_with(
            c.client(),
            launch::NAMESPACE,
            &c.capi_version().machine_deployment(),
        );
        let kube_err = |what: String| move |source| Error::Kube { what, source };
        let mds = api
            .list(&Default::default())
            .await
            .map_err(kube_err("listing MachineDeployments".into()))?;
        let value = if fail { "true" } else { "false" };
        let patch = json!({"metadata": {"annotations": {FAIL_LAUNCHES_ANNOTATION: value}}});
        for md in mds.items {
            let name = kube::ResourceExt::name_any(&md);
            crate::sim::standin::merge_patch(&api, &name, &patch)
                .await
                .map_err(kube_err(format!("marking MachineDeployment {name}")))?;
        }
        Ok(())
    })
    .await?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_events_note_gives_its_window() {
        let note =
            "Drift of NodePool default backs off for 10s (failed window 2): replacement timed out";
        assert_eq!(window_of(note), Some(Duration::from_secs(10)));
        assert_eq!(window_of("something else"), None);
    }
}
