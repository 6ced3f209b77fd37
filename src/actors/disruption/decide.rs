//! A pass's decision, off the actor: the snapshot of the cluster, then on a blocking thread the
//! due command's validation or a new decision, then its metrics and `Unconsolidatable` Events.

use std::collections::HashSet;
use std::time::Instant;

use super::execute;
use crate::actors::Shared;
use crate::actors::events::Events;
use crate::disruption::{self, Allowed, Candidate, Command};
use crate::metrics::{ConsolidationTypeLabels, EvaluationLabels, Metrics};
use crate::scheduling::Snapshot;
use crate::view::disruption as view;

/// What a pass asks its decision.
pub(super) struct Question {
    /// The candidates a decision may take.
    pub(super) candidates: Vec<Candidate>,
    /// The candidates of the commands under way: their nodes are going.
    pub(super) leaving: Vec<Candidate>,
    pub(super) under_consolidate_after: HashSet<String>,
    pub(super) allowed: Allowed,
    /// The pending command whose validation period is over.
    pub(super) due: Option<Command>,
    /// Pods of the commands whose replacements are still launching.
    pub(super) not_draining_yet: HashSet<String>,
    /// Consolidation may still wait for pods on their way.
    pub(super) may_settle: bool,
}

/// A command, whether it is the due one validated, and the claims consolidation gave up on
/// (with why); then the pods on their way to nodes (None: not looked at).
type Solved = (
    (Option<Command>, bool, Vec<(String, String)>),
    Option<usize>,
);

/// The command the pass comes to, with whether it is the due one that passed its validation,
/// and the pods on their way to nodes (None: not looked at).
pub(super) async fn decide(
    shared: &Shared,
    q: Question,
) -> (Option<(Command, bool)>, Option<usize>) {
    let validating = q
        .due
        .as_ref()
        .map(|p| (p.method.consolidation_type(), p.candidates.len()));
    // No candidate is due for repair, drifted or consolidatable and no decision waits for
    // validation: every
    // method would pass, so the snapshot (every Node's labels and room, every bound pod) is
    // not built for nothing.
    let undecidable = q.due.is_none()
        && !q
            .candidates
            .iter()
            .any(|c| c.drift.is_some() || c.consolidatable || c.repair.is_some());
    let mut started = Instant::now();
    let ((command, validated, unconsolidatable), on_their_way) = if undecidable {
        Default::default()
    } else {
        let snapshot = view::snapshot(
            shared.view(),
            &q.candidates,
            &q.leaving,
            &q.under_consolidate_after,
        );
        started = Instant::now();
        tokio::task::spawn_blocking(move || solve(snapshot, q))
            .await
            .unwrap_or_default()
    };
    let m = &shared.metrics;
    count_failed_validations(m, validating, command.as_ref().filter(|_| validated));
    time_evaluation(m, command.as_ref(), started);
    announce_unconsolidatable(shared, &unconsolidatable);
    (command.map(|c| (c, validated)), on_their_way)
}

/// On a blocking thread: the due command validated, if it still holds; else a new decision,
/// once consolidation has waited for the pods on their way.
fn solve(mut snapshot: Snapshot, q: Question) -> Solved {
    disruption::consolidation::keep_room_of_pods_about_to_bind(&mut snapshot);
    if !snapshot.about_to_bind.is_empty() {
        tracing::debug!(
            pods = snapshot.about_to_bind.len(),
            "pending pods the cluster has room for now: their room is kept"
        );
    }
    if let Some(validated) = q
        .due
        .as_ref()
        .and_then(|pending| validated(&snapshot, &q.candidates, &q.allowed, pending))
    {
        return ((Some(validated), true, Vec::new()), None);
    }
    let mut candidates = q.candidates;
    let (moving, held) = disruption::consolidation::wait_for_pods_on_their_way(
        &snapshot,
        &mut candidates,
        &q.not_draining_yet,
        q.may_settle,
    );
    if held > 0 {
        tracing::debug!(
            pods = moving,
            candidates = held,
            "consolidation waits for pods on their way to land"
        );
    }
    let d = disruption::decide_explained(&snapshot, &candidates, &q.allowed);
    ((d.command, false, d.unconsolidatable), Some(moving))
}

/// The pending command as it still holds (it goes on without candidates no longer valid), or
/// None when it is dropped.
fn validated(
    snapshot: &Snapshot,
    candidates: &[Candidate],
    allowed: &Allowed,
    pending: &Command,
) -> Option<Command> {
    match disruption::revalidate(snapshot, candidates, allowed, pending) {
        Ok(validated) => {
            if validated.candidates.len() < pending.candidates.len() {
                tracing::debug!(
                    claims = ?pending.claim_names(),
                    kept = ?validated.claim_names(),
                    "disruption command goes on without candidates no longer valid"
                );
            }
            Some(validated)
        }
        Err(why) => {
            tracing::debug!(
                claims = ?pending.claim_names(),
                why = %why,
                "disruption command dropped at validation"
            );
            None
        }
    }
}

/// Candidates the validation left out: all of a command dropped, or the ones an emptiness
/// command goes on without.
fn count_failed_validations(
    m: &Metrics,
    validating: Option<(&'static str, usize)>,
    carried: Option<&Command>,
) {
    let Some((consolidation_type, n)) = validating else {
        return;
    };
    let failed = n.saturating_sub(carried.map_or(0, |c| c.candidates.len()));
    if failed > 0 {
        m.disruption_failed_validations
            .get_or_create(&ConsolidationTypeLabels {
                consolidation_type: consolidation_type.into(),
            })
            .inc_by(failed as u64);
    }
}

/// One pass tries the methods in order until one decides: the time is the deciding method's,
/// or the last method's when none did.
fn time_evaluation(m: &Metrics, command: Option<&Command>, started: Instant) {
    let method = command.map_or(disruption::Method::SingleNodeConsolidation, |c| c.method);
    m.disruption_evaluation_seconds
        .get_or_create(&EvaluationLabels {
            reason: method.reason().as_str().to_lowercase(),
            consolidation_type: method.consolidation_type().into(),
        })
        .observe(started.elapsed().as_secs_f64());
}

fn announce_unconsolidatable(shared: &Shared, unconsolidatable: &[(String, String)]) {
    for (claim, why) in unconsolidatable {
        tracing::debug!(nodeclaim = %claim, why = %why, "cannot be consolidated");
        let c = shared.state.claims.read().get(claim);
        if let Some(c) = c {
            execute::on_claim_and_node(shared, &c, Events::normal, "Unconsolidatable", |object| {
                format!("{object} cannot be consolidated: {why}")
            });
        }
    }
}
