//! Server-side audit of how the controller removes pods. Karpenter may evict a pod only through
//! the Eviction API (which enforces PodDisruptionBudgets) and must leave `karpenter.sh/do-not-disrupt`
//! pods alone, until the node's termination deadline (the claim's
//! `karpenter.sh/nodeclaim-termination-timestamp`) is so close that the pod's own grace period
//! would run past it: from then on upstream deletes the pod whatever its budget or annotation says.
//! Every removal that breaks those rules is counted here, by the server, so a report never takes
//! the controller's word for it.

use serde_json::Value;

use super::eviction::would_violate_budget;
use super::pdb_expected::WorkloadDefs;
use super::registry::{Registry, ResourceDef};
use super::store::Inner;
use crate::wellknown::{DO_NOT_DISRUPT_ANNOTATION, TERMINATION_TIMESTAMP_ANNOTATION};

/// How the pod is being removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    Eviction,
    Delete,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Violation {
    /// A pod deleted while its PodDisruptionBudget allowed no disruption, before the deadline.
    PdbViolation,
    /// A do-not-disrupt pod evicted or deleted before the deadline.
    DoNotDisrupt,
}

/// What removing `ns/name` now would break (nothing for pods that are gone or finished).
pub(crate) fn audit(
    inner: &Inner,
    registry: &Registry,
    pods: &ResourceDef,
    ns: &str,
    name: &str,
    how: Removal,
    asked: Asked<'_>,
) -> Vec<Violation> {
    let Some(pod) = inner.get(pods, ns, name) else {
        return Vec::new();
    };
    audit_pod(inner, registry, pods, ns, pod, how, asked)
}

/// When a removal was asked, and the store holding the NodeClaims when another server does
/// (Karpenter's objects in a management cluster apart): their termination deadlines decide
/// what a forced removal may break.
pub(crate) struct Asked<'a> {
    pub(crate) at: jiff::Timestamp,
    pub(crate) claims_elsewhere: Option<&'a super::store::Store>,
}

/// [`audit`] of a pod another API server removed (the real backend), against the mirror of
/// that server in `store`: `pod` is the pod as last mirrored, `now` when the removal was asked.
pub(crate) fn audit_removed_pod(
    store: &super::store::Store,
    pod: &Value,
    ns: &str,
    how: Removal,
    now: jiff::Timestamp,
) -> Vec<Violation> {
    let registry = store.registry();
    let Some(pods) = registry.lookup("", "v1", "pods") else {
        return Vec::new();
    };
    let inner = store.lock();
    let asked = Asked {
        at: now,
        claims_elsewhere: None,
    };
    audit_pod(&inner, registry, pods, ns, pod, how, asked)
}

fn audit_pod(
    inner: &Inner,
    registry: &Registry,
    pods: &ResourceDef,
    ns: &str,
    pod: &Value,
    how: Removal,
    asked: Asked<'_>,
) -> Vec<Violation> {
    let now = asked.at;
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    if matches!(phase, Some("Succeeded" | "Failed")) || past_deadline(inner, registry, pod, &asked)
    {
        return Vec::new();
    }
    let mut found = Vec::new();
    if do_not_disrupt_active(pod, now) {
        found.push(Violation::DoNotDisrupt);
    }
    if how == Removal::Delete
        && let Some(pdbs) = registry.lookup("policy", "v1", "poddisruptionbudgets")
        && would_violate_budget(inner, pods, pdbs, &WorkloadDefs::of(registry), ns, pod)
    {
        found.push(Violation::PdbViolation);
    }
    found
}

/// `karpenter.sh/do-not-disrupt`: "true", or a duration still running since the pod started.
/// Anything else is no protection (upstream treats an invalid value as absent).
fn do_not_disrupt_active(pod: &Value, now: jiff::Timestamp) -> bool {
    let Some(v) = pod
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(DO_NOT_DISRUPT_ANNOTATION))
        .and_then(Value::as_str)
    else {
        return false;
    };
    if v == "true" {
        return true;
    }
    let Some(d) = crate::duration::parse(v) else {
        return false;
    };
    let started = pod
        .pointer("/status/startTime")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    match started {
        None => true,
        Some(s) => jiff::SignedDuration::try_from(d)
            .ok()
            .and_then(|d| s.checked_add(d).ok())
            .is_none_or(|until| now < until),
    }
}

/// Upstream's rule for forced deletion: the node has a termination deadline and the pod's grace
/// period would run past it (one second of slack: timestamps have second precision).
fn past_deadline(inner: &Inner, registry: &Registry, pod: &Value, asked: &Asked<'_>) -> bool {
    let now = asked.at;
    let Some(node) = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    else {
        return false;
    };
    let deadline = match asked.claims_elsewhere {
        Some(store) => node_deadline(store.list("nodeclaims", None).iter(), node),
        None => {
            let Some(claims) = registry.lookup("karpenter.sh", "v1", "nodeclaims") else {
                return false;
            };
            node_deadline(inner.iter(claims, None).map(|(_, c)| c), node)
        }
    };
    let Some(deadline) = deadline else {
        return false;
    };
    let grace = pod
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(30);
    deadline
        .checked_sub(jiff::SignedDuration::from_secs(grace.saturating_add(1)))
        .is_ok_and(|from| now >= from)
}

/// The earliest termination deadline of the claims on `node`.
fn node_deadline<'c>(
    claims: impl Iterator<Item = &'c Value>,
    node: &str,
) -> Option<jiff::Timestamp> {
    claims
        .filter(|c| c.pointer("/status/nodeName").and_then(Value::as_str) == Some(node))
        .filter_map(|c| {
            c.pointer("/metadata/annotations")
                .and_then(|a| a.get(TERMINATION_TIMESTAMP_ANNOTATION))
                .and_then(Value::as_str)
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        })
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn do_not_disrupt_values() {
        let now: jiff::Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let pod = |v: &str, started: &str| {
            json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: v}},
                   "status": {"startTime": started}})
        };
        assert!(do_not_disrupt_active(
            &pod("true", "2026-01-01T00:00:00Z"),
            now
        ));
        assert!(!do_not_disrupt_active(
            &pod("false", "2026-01-01T00:00:00Z"),
            now
        ));
        assert!(!do_not_disrupt_active(
            &pod("nonsense", "2026-01-01T00:00:00Z"),
            now
        ));
        // 15m from 00:00 is still running at 00:10; 5m is over.
        assert!(do_not_disrupt_active(
            &pod("15m", "2026-01-01T00:00:00Z"),
            now
        ));
        assert!(!do_not_disrupt_active(
            &pod("5m", "2026-01-01T00:00:00Z"),
            now
        ));
        assert!(!do_not_disrupt_active(&json!({"metadata": {}}), now));
    }
}
