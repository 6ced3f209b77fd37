//! The drift scenario's phase: the NodePool's template changes, every claim drifts and is
//! replaced (optionally paused first, optionally with failing launches), then Cluster API rolls
//! out a node group, measured apart.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};

use super::{
    DRIFT_CALM, DRIFT_LABEL, PauseFigures, PhaseFigures, RolloutFigures, backoff, live_or_deleting,
    patch_nodepool, pool_up_to_date, rollout, wait_stable,
};
use crate::api::wellknown::DISRUPTION_PAUSED_ANNOTATION;
use crate::cli::SimulateArgs;
use crate::sim::disruption_audit::PoolAudit;
use crate::simulate::pods::Provisioned;
use crate::simulate::{BackgroundSim, Error};

/// Drifts every one of `originals` and waits until all are replaced, then rolls out a group.
pub(super) async fn run(
    args: &SimulateArgs,
    p: &Provisioned,
    originals: &BTreeSet<String>,
) -> Result<PhaseFigures, Error> {
    say!(
        "changing the NodePool template: every one of the {} claims drifts",
        originals.len()
    );
    // Failing before the change, so no replacement launches in between.
    let failing = backoff::Failing::start(&p.sim, args, &p.controller.shared.metrics).await?;
    patch_nodepool(&p.sim, template_change(args)).await?;
    p.sim.mark("template changed");
    let changed_ms = p.sim.cluster().stats().now_ms();
    let pause = hold_paused(&p.sim, args.pause_disruption).await?;
    let lifted = match &failing {
        Some(f) => Some(f.lift(&p.sim, args.fail_replacements).await?),
        None => None,
    };
    let up_to_date_ms = wait_replaced(&p.sim, args.deadline, originals).await?;
    let backoff = match (&failing, lifted) {
        (Some(f), Some(lifted)) => Some(f.figures(p, lifted, up_to_date_ms).await?),
        _ => None,
    };
    p.sim.mark("drifted claims replaced");
    let end_ms = p.sim.cluster().stats().now_ms();
    // The rollout is measured apart: Cluster API, not the controller, deletes its Machines.
    let drift_audit = p.sim.cluster().disruption_audit().report();
    p.sim.cluster().disruption_audit().reset_worst();
    let (rollout, rollout_pools) = roll_out(&p.sim, args.deadline).await?;
    Ok(PhaseFigures {
        end_ms: Some(end_ms),
        nodes_up_to_date_after_ms: up_to_date_ms.map(|t| t.saturating_sub(changed_ms)),
        pause,
        backoff,
        drift_audit: Some(drift_audit),
        rollout: Some(rollout),
        rollout_pools: Some(rollout_pools),
        ..PhaseFigures::default()
    })
}

/// The NodePool patch that drifts every claim, pausing disruption in the same write when asked
/// (so no pass sees the change unpaused).
fn template_change(args: &SimulateArgs) -> Value {
    let mut change = json!({"spec": {"template": {"metadata": {"labels": {DRIFT_LABEL: "2"}}}}});
    if !args.pause_disruption.is_zero() {
        change["metadata"] = json!({"annotations": {DISRUPTION_PAUSED_ANNOTATION: "true"}});
    }
    change
}

/// Waits until none of `originals` is left and the pool says so too: a rollout is over for its
/// users when `NodesUpToDate` is True, not when the old claims are gone. When it turned True.
async fn wait_replaced(
    sim: &BackgroundSim,
    deadline: Duration,
    originals: &BTreeSet<String>,
) -> Result<Option<u64>, Error> {
    let up_to_date_ms = std::cell::Cell::new(None);
    wait_stable(sim, "drift", deadline, DRIFT_CALM, |sim| {
        if up_to_date_ms.get().is_none() && pool_up_to_date(sim) {
            up_to_date_ms.set(Some(sim.cluster().stats().now_ms()));
            sim.mark("NodesUpToDate");
        }
        let left = live_or_deleting(sim, originals);
        if left > 0 {
            return Some(format!("{left} drifted claims left"));
        }
        up_to_date_ms
            .get()
            .is_none()
            .then(|| "the NodePool's NodesUpToDate not True yet".to_string())
    })
    .await?;
    Ok(up_to_date_ms.get())
}

/// Keeps the NodePool's disruption paused (the caller set the annotation) for `held`, then
/// lifts it; what the controller decided meanwhile. Nothing when `held` is zero.
async fn hold_paused(sim: &BackgroundSim, held: Duration) -> Result<Option<PauseFigures>, Error> {
    if held.is_zero() {
        return Ok(None);
    }
    say!("disruption paused on the NodePool for {held:?}");
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

/// Rolls out the largest node group; its figures with the budgets as the server's disruption
/// audit saw them during the rollout, and that audit's pools.
async fn roll_out(
    sim: &BackgroundSim,
    deadline: Duration,
) -> Result<(RolloutFigures, BTreeMap<String, PoolAudit>), Error> {
    let mut r = rollout::roll_out(sim, deadline).await?;
    let during = sim.cluster().disruption_audit().report();
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
    Ok((r, during.pools))
}
