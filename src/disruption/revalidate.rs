//! A pending command after its pause (upstream's validation): still the same decision over
//! today's candidates, budgets and simulation, or why it no longer holds.

use super::{
    Allowed, Candidate, Command, DisruptionReason, Method, Outcome, command, consolidation,
    drift_replacements, finish, judged, repair, static_replacement, terminate_first, within_budget,
};
use crate::scheduling::Snapshot;

/// Upstream's validation: after the pause, the pending command's candidates must all still be
/// candidates for the same reason, within the budgets, and (for consolidation and drift with
/// pods) the simulation must still hold. Emptiness alone goes on with the candidates still
/// empty, as upstream's emptiness validator filters rather than refuses: a node a moved pod
/// landed on meanwhile stays, the others go. Returns the command refreshed with today's
/// candidates and replacements, or why it no longer holds.
pub(crate) fn revalidate(
    snapshot: &Snapshot,
    candidates: &[Candidate],
    allowed: &Allowed,
    pending: &Command,
) -> Result<Command, String> {
    match pending.method {
        Method::Repair => repair::revalidate(snapshot, candidates, allowed, pending),
        Method::Emptiness => still_empty(candidates, allowed, pending),
        Method::Drift => still_drifted(snapshot, candidates, allowed, pending),
        Method::MultiNodeConsolidation | Method::SingleNodeConsolidation => {
            still_consolidates(snapshot, candidates, allowed, pending)
        }
    }
}

/// `Err(why)` unless `ok`.
fn held(ok: bool, why: &str) -> Result<(), String> {
    ok.then_some(()).ok_or_else(|| why.to_string())
}

/// A drift command: every candidate still drifted, and its replacement (or terminate-first,
/// or an empty batch) still the plan.
fn still_drifted(
    snapshot: &Snapshot,
    candidates: &[Candidate],
    allowed: &Allowed,
    pending: &Command,
) -> Result<Command, String> {
    let fresh = every_one_fresh(candidates, allowed, pending)?;
    held(
        fresh.iter().all(|c| c.drift.is_some()),
        "a candidate is no longer drifted",
    )?;
    match fresh.as_slice() {
        // Terminate-first: still no room for a replacement.
        [one] if one.static_pool && pending.replacements.is_empty() => {
            held(
                allowed.terminates_first(&one.nodepool, DisruptionReason::Drifted)
                    || allowed
                        .static_room
                        .get(&one.nodepool)
                        .is_none_or(|r| *r == 0),
                "the static pool has room for a replacement now",
            )?;
            Ok(command(Method::Drift, fresh, Vec::new()))
        }
        [one] if one.static_pool => static_replacement(snapshot, one)
            .map(|r| command(Method::Drift, fresh, vec![r]))
            .ok_or_else(|| "no replacement for the static node".to_string()),
        // Terminate-first: still no room for a replacement beside it, and room once
        // it is gone.
        [one] if !one.is_empty() && pending.replacements.is_empty() => {
            held(
                drift_replacements(snapshot, one).is_none(),
                "there is room for a replacement beside it now",
            )?;
            held(
                terminate_first::goes_first(snapshot, one, allowed, DisruptionReason::Drifted),
                "its pods no longer fit even in the room it frees",
            )?;
            Ok(command(Method::Drift, fresh, Vec::new()))
        }
        [one] if !one.is_empty() => drift_replacements(snapshot, one)
            .map(|r| command(Method::Drift, fresh, r))
            .ok_or_else(|| "its pods no longer fit with replacements".to_string()),
        _ => {
            held(
                fresh.iter().all(|c| c.is_empty()),
                "a candidate of a batch is no longer empty",
            )?;
            Ok(command(Method::Drift, fresh, Vec::new()))
        }
    }
}

/// A consolidation: every candidate still consolidatable, and the simulation still giving the
/// plan it announced.
fn still_consolidates(
    snapshot: &Snapshot,
    candidates: &[Candidate],
    allowed: &Allowed,
    pending: &Command,
) -> Result<Command, String> {
    let fresh = every_one_fresh(candidates, allowed, pending)?;
    held(
        fresh
            .iter()
            .all(|c| c.eligible_for(DisruptionReason::Underutilized)),
        "a candidate is no longer consolidatable",
    )?;
    let now = match judged(&fresh, consolidation::evaluate(snapshot, &fresh)) {
        Outcome::No(hold) => {
            return Err(format!("the simulation no longer holds: {hold}"));
        }
        ok => finish(pending.method, fresh, ok),
    };
    // Upstream's validation carries out the plan it announced or none: a delete that now
    // needs a replacement (or the reverse) is a different decision, and so is a
    // replacement that could no longer launch every type the announced one named.
    let same_shape = now.replacements.len() == pending.replacements.len()
        && now
            .replacements
            .iter()
            .zip(&pending.replacements)
            .all(|(n, p)| {
                p.instance_types
                    .iter()
                    .all(|t| n.instance_types.contains(t))
            });
    held(
        same_shape,
        &format!(
            "it now takes {} replacement(s) where it announced {}, or fewer instance types",
            now.replacements.len(),
            pending.replacements.len()
        ),
    )?;
    Ok(Command {
        replacements: pending.replacements.clone(),
        ..now
    })
}

/// Today's view of each of the pending command's candidates, refused unless every one is still
/// a candidate and the budgets still allow them all.
pub(super) fn every_one_fresh<'a>(
    candidates: &'a [Candidate],
    allowed: &Allowed,
    pending: &Command,
) -> Result<Vec<&'a Candidate>, String> {
    let fresh: Vec<&Candidate> = pending
        .candidates
        .iter()
        .map(|p| {
            candidates
                .iter()
                .find(|c| c.claim == p.claim)
                .ok_or_else(|| format!("{} is no longer a candidate", p.claim))
        })
        .collect::<Result<_, _>>()?;
    if within_budget(fresh.iter().copied(), pending.method.reason(), allowed).len() != fresh.len() {
        return Err("the disruption budget no longer allows every candidate".into());
    }
    Ok(fresh)
}

/// The pending emptiness command's candidates that are still candidates, empty and
/// consolidatable, within the budgets; refused only when none is.
fn still_empty(
    candidates: &[Candidate],
    allowed: &Allowed,
    pending: &Command,
) -> Result<Command, String> {
    let mut why = Vec::new();
    let still: Vec<&Candidate> = pending
        .candidates
        .iter()
        .filter_map(|p| {
            let now = candidates.iter().find(|c| c.claim == p.claim);
            match now {
                None => why.push(format!("{} is no longer a candidate", p.claim)),
                Some(c) if !c.is_empty() => why.push(format!("{} has pods", p.claim)),
                Some(c) if !c.eligible_for(DisruptionReason::Empty) => {
                    why.push(format!("{} is no longer consolidatable", p.claim))
                }
                Some(_) => {}
            }
            now.filter(|c| c.eligible_for(DisruptionReason::Empty))
        })
        .collect();
    let kept = within_budget(still.iter().copied(), DisruptionReason::Empty, allowed);
    if kept.is_empty() {
        if !still.is_empty() {
            why.push("the disruption budget allows none".into());
        }
        return Err(format!("no candidate is still empty: {}", why.join(", ")));
    }
    Ok(command(Method::Emptiness, kept, Vec::new()))
}
