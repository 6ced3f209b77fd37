//! What a drain does next, as a pure function of the node's pods, the node's termination
//! deadline and the time (Karpenter core's rules, v1):
//!
//! - Pods that need not leave are ignored: finished pods, mirror (static) pods, pods that
//!   tolerate the `karpenter.sh/disrupted:NoSchedule` taint, and pods stuck terminating for over a
//!   minute past their deletion deadline.
//! - A pod whose own grace period would run past the node's deadline is deleted now, with the
//!   grace shortened so it is gone by the deadline (at least 1 s, never 0: a 0 would remove it from
//!   the API before its containers stopped). This bypasses its PodDisruptionBudget and
//!   `do-not-disrupt`, as upstream does, and happens in every tier at once.
//! - Every other pod is evicted through the Eviction API, tier by tier: non-critical before
//!   critical (`system-cluster-critical` / `system-node-critical`), and within each, non-DaemonSet
//!   before DaemonSet. A tier starts only when the ones before it are gone.
//! - A pod with an active `karpenter.sh/do-not-disrupt` is waited for, not evicted, until the
//!   deadline makes it a forced deletion.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::state::pods::{self, is_daemonset_pod, is_mirror_pod};

/// How long past its deletion deadline a terminating pod is waited for before the drain stops
/// counting it (its kubelet is gone or stuck; upstream's value).
const STUCK_TERMINATING_SECS: i64 = 60;

/// Kubernetes' default `terminationGracePeriodSeconds`.
const DEFAULT_POD_GRACE_SECS: i64 = 30;

/// A pod the drain acts on or waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodRef {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
}

impl PodRef {
    fn of(p: &Pod) -> Self {
        Self {
            namespace: p.namespace().unwrap_or_default(),
            name: p.name_any(),
            uid: p.uid().unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// POST pods/eviction (PodDisruptionBudgets apply).
    Evict(PodRef),
    /// DELETE with this grace period, because the node's deadline is near.
    Delete { pod: PodRef, grace_seconds: i64 },
}

/// Why a pod still on the node is not acted on now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// Already terminating; its kubelet removes it.
    Terminating(PodRef),
    /// `karpenter.sh/do-not-disrupt`: left alone until the deadline.
    DoNotDisrupt(PodRef),
    /// In a later tier than the one being drained.
    LaterTier(PodRef),
}

/// One drain step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) actions: Vec<Action>,
    pub(crate) waiting: Vec<Waiting>,
}

impl Plan {
    /// Nothing left to evict or wait for: the node is drained.
    #[cfg(test)]
    pub(crate) fn drained(&self) -> bool {
        self.actions.is_empty() && self.waiting.is_empty()
    }
}

/// The next drain step for `pods` (the pods bound to the node).
pub(crate) fn plan(pods: &[Pod], deadline: Option<jiff::Timestamp>, now: jiff::Timestamp) -> Plan {
    let mut plan = Plan::default();
    let mut tiers: [Vec<&Pod>; 4] = Default::default();
    for pod in pods.iter().filter(|p| must_leave(p, now)) {
        if let Some(grace_seconds) = forced_grace(pod, deadline, now) {
            plan.actions.push(Action::Delete {
                pod: PodRef::of(pod),
                grace_seconds,
            });
        } else {
            tiers[tier(pod)].push(pod);
        }
    }
    let Some(current) = tiers.iter().position(|t| !t.is_empty()) else {
        return plan;
    };
    for (i, tier) in tiers.iter().enumerate().skip(current) {
        for pod in tier {
            let r = PodRef::of(pod);
            if i > current {
                plan.waiting.push(Waiting::LaterTier(r));
            } else if is_terminating(pod) {
                plan.waiting.push(Waiting::Terminating(r));
            } else if pods::do_not_disrupt(pod, now) {
                plan.waiting.push(Waiting::DoNotDisrupt(r));
            } else {
                plan.actions.push(Action::Evict(r));
            }
        }
    }
    plan
}

/// Whether the drain waits for this pod to be gone (upstream's "waiting eviction").
pub(crate) fn must_leave(pod: &Pod, now: jiff::Timestamp) -> bool {
    !is_terminal(pod)
        && !is_mirror_pod(pod)
        && !pods::tolerates_disrupted(pod)
        && !stuck_terminating(pod, now)
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn stuck_terminating(pod: &Pod, now: jiff::Timestamp) -> bool {
    pod.metadata.deletion_timestamp.as_ref().is_some_and(|t| {
        t.0.checked_add(jiff::SignedDuration::from_secs(STUCK_TERMINATING_SECS))
            .is_ok_and(|stuck| now > stuck)
    })
}

/// 0 non-critical non-DaemonSet, 1 non-critical DaemonSet, 2 critical, 3 critical DaemonSet.
fn tier(pod: &Pod) -> usize {
    let critical = matches!(
        pod.spec
            .as_ref()
            .and_then(|s| s.priority_class_name.as_deref()),
        Some("system-cluster-critical" | "system-node-critical")
    );
    usize::from(critical) * 2 + usize::from(is_daemonset_pod(pod))
}

/// Upstream's forced deletion: with a deadline, a pod whose grace period would end after it is
/// deleted now with the grace that is left (at least 1 s). A terminating pod qualifies when its
/// own deletion deadline lies past the node's.
fn forced_grace(pod: &Pod, deadline: Option<jiff::Timestamp>, now: jiff::Timestamp) -> Option<i64> {
    let deadline = deadline?;
    let due = match &pod.metadata.deletion_timestamp {
        // Deletion timestamps have second precision: one second past the deadline is on time.
        Some(t) => deadline
            .checked_add(jiff::SignedDuration::from_secs(1))
            .is_ok_and(|late| t.0 > late),
        None => {
            let grace = pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(DEFAULT_POD_GRACE_SECS);
            deadline
                .checked_sub(jiff::SignedDuration::from_secs(grace))
                .is_ok_and(|delete_from| now > delete_from)
        }
    };
    due.then(|| now.duration_until(deadline).as_secs().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::wellknown::{DISRUPTED_TAINT_KEY, DO_NOT_DISRUPT_ANNOTATION};
    use serde_json::json;

    fn t(s: &str) -> jiff::Timestamp {
        s.parse().expect("timestamp")
    }

    fn pod(name: &str, extra: serde_json::Value) -> Pod {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"nodeName": "n", "containers": []},
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"},
        });
        crate::testing::merge(&mut v, extra);
        serde_json::from_value(v).expect("pod")
    }

    fn daemon() -> serde_json::Value {
        json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "d", "controller": true}]}})
    }

    fn critical() -> serde_json::Value {
        json!({"spec": {"priorityClassName": "system-node-critical"}})
    }

    fn evicted(p: &Plan) -> Vec<String> {
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::Evict(r) => Some(r.name.clone()),
                Action::Delete { .. } => None,
            })
            .collect()
    }

    const NOW: &str = "2026-01-01T01:00:00Z";

    #[test]
    fn tiers_drain_in_order() {
        let mut critical_daemon = critical();
        crate::testing::merge(&mut critical_daemon, daemon());
        let pods = vec![
            pod("cd", critical_daemon),
            pod("c", critical()),
            pod("d", daemon()),
            pod("a", json!({})),
            pod("b", json!({})),
        ];
        let p = plan(&pods, None, t(NOW));
        assert_eq!(evicted(&p), vec!["a", "b"]);
        assert_eq!(p.waiting.len(), 3);
        // Once the first tier is gone, DaemonSet pods go; then critical ones; then critical
        // DaemonSet pods.
        assert_eq!(evicted(&plan(&pods[..3], None, t(NOW))), vec!["d"]);
        assert_eq!(evicted(&plan(&pods[..2], None, t(NOW))), vec!["c"]);
        assert_eq!(evicted(&plan(&pods[..1], None, t(NOW))), vec!["cd"]);
        assert!(plan(&[], None, t(NOW)).drained());
    }

    #[test]
    fn pods_that_need_not_leave_are_ignored() {
        let pods = vec![
            pod("done", json!({"status": {"phase": "Succeeded"}})),
            pod(
                "mirror",
                json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}),
            ),
            pod(
                "tolerates-all",
                json!({"spec": {"tolerations": [{"operator": "Exists"}]}}),
            ),
            pod(
                "tolerates",
                json!({"spec": {"tolerations": [{"key": DISRUPTED_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]}}),
            ),
            pod(
                "stuck",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:58:00Z"}}),
            ),
        ];
        assert!(plan(&pods, None, t(NOW)).drained());
        // A toleration of another effect does not count.
        let other = pod(
            "other-effect",
            json!({"spec": {"tolerations": [{"key": DISRUPTED_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}]}}),
        );
        assert_eq!(evicted(&plan(&[other], None, t(NOW))), vec!["other-effect"]);
    }

    #[test]
    fn terminating_and_do_not_disrupt_pods_are_waited_for() {
        let pods = vec![
            pod(
                "leaving",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T01:00:20Z"}}),
            ),
            pod(
                "keep",
                json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "true"}}}),
            ),
            pod(
                "keep-2h",
                json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "2h"}}}),
            ),
            pod(
                "kept-30m",
                json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "30m"}}}),
            ),
            pod(
                "bad-value",
                json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "yes"}}}),
            ),
        ];
        let p = plan(&pods, None, t(NOW));
        // 30 minutes since 00:00 are over at 01:00; an invalid value protects nothing.
        assert_eq!(evicted(&p), vec!["kept-30m", "bad-value"]);
        assert!(
            p.waiting
                .contains(&Waiting::Terminating(PodRef::of(&pods[0])))
        );
        assert!(
            p.waiting
                .contains(&Waiting::DoNotDisrupt(PodRef::of(&pods[1])))
        );
        assert!(
            p.waiting
                .contains(&Waiting::DoNotDisrupt(PodRef::of(&pods[2])))
        );
        assert!(pods::invalid_do_not_disrupt(&pods[4]).is_some());
        assert!(pods::invalid_do_not_disrupt(&pods[1]).is_none());
    }

    #[test]
    fn the_deadline_forces_deletion_in_every_tier_with_the_grace_left() {
        let deadline = t("2026-01-01T01:00:40Z");
        let mut critical_keep = critical();
        crate::testing::merge(
            &mut critical_keep,
            json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "true"}}, "spec": {"terminationGracePeriodSeconds": 60}}),
        );
        let pods = vec![
            // 60 s of grace would end after the deadline: deleted now with the 40 s left.
            pod("critical-keep", critical_keep),
            // 30 s (the default) still fit: evicted as usual, in its tier.
            pod("web", json!({})),
            // Terminating with a deadline past the node's: shortened.
            pod(
                "slow",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T01:05:00Z"}}),
            ),
        ];
        let p = plan(&pods, Some(deadline), t(NOW));
        assert!(p.actions.contains(&Action::Delete {
            pod: PodRef::of(&pods[0]),
            grace_seconds: 40
        }));
        assert!(p.actions.contains(&Action::Delete {
            pod: PodRef::of(&pods[2]),
            grace_seconds: 40
        }));
        assert_eq!(evicted(&p), vec!["web"]);
        // Past the deadline: everything goes, with at least 1 s.
        let late = plan(&pods[1..2], Some(deadline), t("2026-01-01T01:01:00Z"));
        assert_eq!(
            late.actions,
            vec![Action::Delete {
                pod: PodRef::of(&pods[1]),
                grace_seconds: 1
            }]
        );
    }
}
