//! What a claim's own records say to a disruption pass: whether it expired, whether
//! `consolidateAfter` has passed since its last pod event, which of its records are behind
//! (last pod event, Drifted and Consolidatable conditions), whether a command is under way for
//! it, and whether it is bound under its MachinePool's current template.

use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;

use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::NodePool;
use crate::api::wellknown::{
    DISRUPTED_TAINT_KEY, INFRA_POOL_HASH_ANNOTATION, POOL_TEMPLATE_HASH_ANNOTATION,
};
use crate::disruption::{Blocker, Drift, Hold};
use crate::state::compact::CompactNode;

pub(super) fn expired(c: &NodeClaim, now: Timestamp) -> bool {
    let Some(after) = c.spec.expire_after.and_then(|d| d.duration()) else {
        return false;
    };
    let Some(created) = c.metadata.creation_timestamp.as_ref() else {
        return false;
    };
    since(created.0, now) >= after
}

fn since(t: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(t)).unwrap_or_default()
}

/// Pod events move `status.lastPodEventTime` in steps of at least this (Karpenter v1.0's dedupe):
/// a node filling up writes its claim a few times, not once per pod. The countdown itself uses
/// the exact time held in memory.
pub(crate) const POD_EVENT_WRITE_STEP: Duration = Duration::from_secs(10);

/// The time to record as the claim's last pod event, if the record is that far behind.
pub(super) fn pod_event_behind(c: &NodeClaim, seen: Option<&Timestamp>) -> Option<Timestamp> {
    let seen = *seen?;
    let recorded = c
        .status
        .as_ref()
        .and_then(|s| s.last_pod_event_time.as_ref())
        .map(|t| t.0);
    match recorded {
        Some(r) if seen <= r || since(r, seen) < POD_EVENT_WRITE_STEP => None,
        _ => Some(seen),
    }
}

/// `consolidateAfter` has passed since the node's last pod event (or its initialization), and
/// the pool consolidates at all.
pub(super) fn consolidatable(
    c: &NodeClaim,
    np: &NodePool,
    last_pod_event: Option<Timestamp>,
    started: Timestamp,
    now: Timestamp,
) -> bool {
    let Some(after) = np.disruption().consolidate_after().duration() else {
        return false;
    };
    let initialized = conditions::get(c.conditions(), conditions::INITIALIZED)
        .map(|i| i.last_transition_time.0)
        .unwrap_or(now);
    let recorded = c
        .status
        .as_ref()
        .and_then(|s| s.last_pod_event_time.as_ref())
        .map(|t| t.0);
    let last = [Some(initialized), recorded, last_pod_event]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(started);
    // Before this actor started we saw no pod events: assume one at start (never early).
    let last = if after.is_zero() {
        last
    } else {
        last.max(started)
    };
    since(last, now) >= after
}

/// Why the pool's `consolidateAfter` keeps consolidation off the node now, if it does: never
/// (`Never`), or not yet (`consolidatable` is [`consolidatable`]'s answer).
pub(super) fn consolidate_after_hold(np: &NodePool, consolidatable: bool) -> Option<Hold> {
    if consolidatable {
        return None;
    }
    let name = np.metadata.name.as_deref().unwrap_or_default();
    Some(match np.disruption().consolidate_after().duration() {
        None => Hold::new(
            Blocker::ConsolidationDisabled,
            format!("NodePool {name} has consolidateAfter: Never"),
        ),
        Some(after) => Hold::new(
            Blocker::NotConsolidatable,
            format!(
                "NodePool {name}'s consolidateAfter ({}) has not passed since the node's last pod event",
                crate::api::duration::format(after)
            ),
        ),
    })
}

pub(super) fn stamp_needed(c: &NodeClaim, drift: Option<Drift>, consolidatable: bool) -> bool {
    let conds = c.conditions();
    let drifted_now = conditions::get(conds, conditions::DRIFTED)
        .filter(|d| d.is_true())
        .map(|d| d.reason.as_str());
    let consolidatable_now = conditions::is_true(conds, conditions::CONSOLIDATABLE);
    drifted_now != drift.map(Drift::reason) || consolidatable_now != consolidatable
}

/// A disruption command has marked the claim (condition) or tainted its Node.
pub(in crate::view) fn under_way(c: &NodeClaim, node: Option<&CompactNode>) -> bool {
    node.is_some_and(|n| n.taints().iter().any(|t| t.key == DISRUPTED_TAINT_KEY))
        || conditions::get(c.conditions(), conditions::DISRUPTION_REASON).is_some()
}

/// Whether claim `c` on a MachinePool Machine is bound under the pool's current template
/// (`template_now`) and infrastructure pool (`infra_now`); None when it recorded neither.
pub(super) fn pool_up_to_date(
    c: &NodeClaim,
    template_now: &str,
    infra_now: Option<&str>,
) -> Option<bool> {
    let annotations = c.annotations();
    let template = annotations
        .get(POOL_TEMPLATE_HASH_ANNOTATION)
        .map(|bound_under| bound_under == template_now);
    let infra = match (annotations.get(INFRA_POOL_HASH_ANNOTATION), infra_now) {
        (Some(bound_under), Some(now)) => Some(bound_under == now),
        _ => None,
    };
    match (template, infra) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), _) | (None, Some(true)) => Some(true),
        (None, None) => None,
    }
}
