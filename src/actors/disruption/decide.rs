//! A pass's decision, off the actor: the snapshot of the cluster, then on a blocking thread the
//! due command's validation or a new decision, then its metrics and `Unconsolidatable` Events.

use std::collections::HashSet;
use std::time::Instant;

use super::execute;
use crate::actors::Shared;
use crate::actors::events::Events;
use crate::disruption::{self, Allowed, Blocked, Candidate, Command, Hold};
use crate::metrics::{ConsolidationTypeLabels, EvaluationLabels, Metrics, PoolBlockerLabels};
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
    /// Nodes the pass held before any decision (the view's and the actor's holds), with their
    /// first blocker.
    pub(super) held: Vec<Blocked>,
}

/// What the decision came to.
#[derive(Default)]
struct Solved {
    command: Option<Command>,
    /// It is the due command, validated.
    validated: bool,
    /// The claims consolidation gave up on, with why.
    unconsolidatable: Vec<(String, Hold)>,
    /// Every candidate not taken, with its first blocker.
    blocked: Vec<Blocked>,
    /// The pods on their way to nodes (None: not looked at).
    on_their_way: Option<usize>,
}

/// The command the pass comes to, with whether it is the due one that passed its validation,
/// and the pods on their way to nodes (None: not looked at).
pub(super) async fn decide(
    shared: &Shared,
    mut q: Question,
) -> (Option<(Command, bool)>, Option<usize>) {
    let validating = q
        .due
        .as_ref()
        .map(|p| (p.method.consolidation_type(), p.candidates.len()));
    // No candidate is eligible for any method and no decision waits for validation: every
    // method would pass, so the snapshot (every Node's labels and room, every bound pod) is
    // not built for nothing.
    let undecidable = q.due.is_none()
        && !q
            .candidates
            .iter()
            .any(|c| c.eligible_reasons().next().is_some());
    let mut started = Instant::now();
    let mut held = std::mem::take(&mut q.held);
    let solved = if undecidable {
        Solved {
            blocked: disruption::pass::blocked_besides(&q.candidates, &q.allowed, None),
            ..Solved::default()
        }
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
    let Solved {
        command,
        validated,
        unconsolidatable,
        blocked,
        on_their_way,
    } = solved;
    count_failed_validations(m, validating, command.as_ref().filter(|_| validated));
    time_evaluation(m, command.as_ref(), started);
    announce_unconsolidatable(shared, &unconsolidatable);
    held.extend(blocked);
    publish_blockers(m, &held);
    (command.map(|c| (c, validated)), on_their_way)
}

/// `karpenter_voluntary_disruption_blocked_nodes`: this pass's nodes per pool and first
/// blocker. Set whole each pass, so a pool or blocker gone from the pass leaves no stale series.
fn publish_blockers(m: &Metrics, blocked: &[Blocked]) {
    let mut counts: std::collections::BTreeMap<(&str, &'static str), i64> = Default::default();
    for b in blocked {
        *counts
            .entry((b.nodepool.as_str(), b.hold.blocker.label()))
            .or_default() += 1;
    }
    m.disruption_blocked_nodes.clear();
    for ((nodepool, blocker), n) in counts {
        m.disruption_blocked_nodes
            .get_or_create(&PoolBlockerLabels {
                nodepool: nodepool.to_string(),
                blocker: blocker.to_string(),
            })
            .set(n);
    }
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
    let dropped = match q.due.as_ref().map(|pending| {
        (
            pending,
            validated(&snapshot, &q.candidates, &q.allowed, pending),
        )
    }) {
        Some((_, Ok(cmd))) => {
            return Solved {
                blocked: disruption::pass::blocked_besides(&q.candidates, &q.allowed, Some(&cmd)),
                command: Some(cmd),
                validated: true,
                ..Solved::default()
            };
        }
        Some((pending, Err(why))) => Some((pending, why)),
        None => None,
    };
    let (mut d, moving) = disruption::pass::settle_and_decide(
        &snapshot,
        q.candidates,
        &q.allowed,
        &q.not_draining_yet,
        q.may_settle,
    );
    if let Some((pending, why)) = dropped {
        disruption::pass::churned(pending, &why, &mut d);
    }
    Solved {
        command: d.command,
        validated: false,
        unconsolidatable: d.unconsolidatable,
        blocked: d.blocked,
        on_their_way: Some(moving),
    }
}

/// The pending command as it still holds (it goes on without candidates no longer valid), or
/// why it is dropped.
fn validated(
    snapshot: &Snapshot,
    candidates: &[Candidate],
    allowed: &Allowed,
    pending: &Command,
) -> Result<Command, String> {
    match disruption::revalidate(snapshot, candidates, allowed, pending) {
        Ok(validated) => {
            if validated.candidates.len() < pending.candidates.len() {
                tracing::debug!(
                    claims = ?pending.claim_names(),
                    kept = ?validated.claim_names(),
                    "disruption command goes on without candidates no longer valid"
                );
            }
            Ok(validated)
        }
        Err(why) => {
            tracing::debug!(
                claims = ?pending.claim_names(),
                why = %why,
                "disruption command dropped at validation"
            );
            Err(why)
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

fn announce_unconsolidatable(shared: &Shared, unconsolidatable: &[(String, Hold)]) {
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
