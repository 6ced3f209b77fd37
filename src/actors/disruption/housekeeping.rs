//! Steps 1 and 2 of a disruption pass, after the decision is taken: expirations, condition and
//! hash stamps, rollout replacements, stale marks rolled back, and the Events for candidates a
//! budget or a blocker holds.

use std::collections::HashSet;

use kube::{Resource, ResourceExt};

use super::execute;
use crate::actors::Shared;
use crate::actors::events::Events;
use crate::api::conditions;
use crate::view::disruption as view;

/// Step 1 and 2 of a pass: expirations, stamps, stale marks; Events for protected candidates.
/// Best effort: a failed write is logged and the next pass, which recomputes everything from
/// the indexes, tries again.
pub(super) async fn housekeeping(shared: &Shared, view: view::View) {
    for c in &view.expired {
        if let Err(e) = execute::expire(shared, c).await {
            tracing::warn!(nodeclaim = %c.name_any(), error = %e, "expiring failed");
        }
    }
    for s in &view.stamps {
        if let Err(e) = execute::stamp(shared, s).await {
            tracing::debug!(nodeclaim = %s.claim.name_any(), error = %e, "updating disruption conditions failed");
        }
    }
    for old in &view.rollout {
        if let Err(e) = execute::replace_for_rollout(shared, old).await {
            tracing::warn!(nodeclaim = %old.name_any(), error = %e, "creating a rollout replacement failed");
        }
    }
    for (c, at) in &view.pod_event_times {
        if let Err(e) = execute::record_pod_event(shared, c, *at).await {
            tracing::debug!(nodeclaim = %c.name_any(), error = %e, "recording the last pod event failed");
        }
    }
    for (c, np) in &view.restamp {
        if let Err(e) = execute::restamp(shared, c, np).await {
            tracing::debug!(nodeclaim = %c.name_any(), error = %e, "re-stamping the NodePool hash failed");
        }
    }
    for (node, claim) in &view.stale {
        tracing::info!(node = %node.name_any(), nodeclaim = %claim.name_any(), "{}", shared.settings.say("removing a disruption mark no command owns", "would remove a disruption mark no command owns"));
        if let Err(e) = execute::unmark(shared, claim, node).await {
            tracing::warn!(node = %node.name_any(), error = %e, "rolling back a disruption mark failed");
        }
    }
    for (np, reason) in &view.budget_blocked {
        shared.events.normal(
            np.object_ref(&()),
            "DisruptionBlocked",
            format!(
                "No allowed disruptions for reason {} due to blocking budget",
                reason.as_str()
            ),
        );
    }
    let interesting: HashSet<&str> = view
        .stamps
        .iter()
        .filter(|s| s.drift.is_some() || s.consolidatable)
        .map(|s| s.claim.metadata.name.as_deref().unwrap_or_default())
        .collect();
    for (c, why) in &view.unknown_group {
        // A repeat within the Events' window writes nothing, so once per pass is fine.
        execute::on_claim_and_node(
            shared,
            c,
            Events::warning,
            "MachineDeploymentUnknown",
            |object| {
                format!(
                    "Drift of {object} is not decided while its group cannot be read, and nothing new launches there: {why}"
                )
            },
        );
    }
    for (c, why) in &view.blocked {
        let drifted_or_idle = interesting.contains(c.name_any().as_str())
            || conditions::is_true(c.conditions(), conditions::DRIFTED)
            || conditions::is_true(c.conditions(), conditions::CONSOLIDATABLE);
        if drifted_or_idle {
            execute::on_claim_and_node(shared, c, Events::normal, "DisruptionBlocked", |object| {
                format!("Cannot disrupt {object}: {why}")
            });
        }
    }
}
