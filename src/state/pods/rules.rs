//! What a pod is, as the controller's rules ask it: its key and node, whether it is a
//! DaemonSet, mirror, terminal or active pod, whether it can be rescheduled or evicted, what
//! protects it from disruption and what evicting it costs, whether the provisioner packs it.
//! The indexes keep the answers (`PodSummary`); everything else asks these functions.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, Taint};
use kube::ResourceExt;

use crate::api::wellknown::{
    DISRUPTED_TAINT_KEY, DISRUPTION_COST_ANNOTATION, DO_NOT_DISRUPT_ANNOTATION,
    MANAGED_DELETION_COST_ANNOTATION, POD_DELETION_COST_ANNOTATION,
};
use crate::scheduling::selector::tolerates;

pub(crate) fn key(p: &Pod) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

pub(crate) fn node_name(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

pub(crate) fn is_daemonset_pod(p: &Pod) -> bool {
    daemonset_of(p).is_some()
}

/// The uid of the DaemonSet that controls a pod, if one does.
pub(super) fn daemonset_of(p: &Pod) -> Option<&str> {
    p.owner_references()
        .iter()
        .find(|o| o.kind == "DaemonSet" && o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

pub(crate) fn is_mirror_pod(p: &Pod) -> bool {
    p.annotations().contains_key("kubernetes.io/config.mirror")
}

pub(crate) fn is_terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Not terminal and not terminating: upstream's `IsActive`.
pub(crate) fn is_active(p: &Pod) -> bool {
    !is_terminal(p) && p.metadata.deletion_timestamp.is_none()
}

fn owned_by(p: &Pod, kind: &str) -> bool {
    p.owner_references().iter().any(|o| o.kind == kind)
}

/// Upstream's `IsReschedulable`: a pod that needs a new home when its node goes. Active pods, and
/// terminating StatefulSet pods (recreated only once gone, so their room is needed again); not
/// DaemonSet pods (they come with every node) nor static ones.
pub(crate) fn is_reschedulable(p: &Pod) -> bool {
    let terminating = p.metadata.deletion_timestamp.is_some();
    (is_active(p) || (terminating && owned_by(p, "StatefulSet")))
        && !is_daemonset_pod(p)
        && !is_mirror_pod(p)
        && !owned_by(p, "Node")
}

/// Upstream's `IsEvictable`: a pod a drain would evict, so a PodDisruptionBudget selecting it
/// matters: active, not tolerating the disrupted taint, not static, and not `do-not-disrupt` now
/// (those are waited for, not evicted).
#[cfg(test)]
pub(crate) fn is_evictable(p: &Pod, now: Timestamp) -> bool {
    evictable_unless_protected(p) && !do_not_disrupt(p, now)
}

/// [`is_evictable`] but for `do-not-disrupt`, the one part that changes with time alone.
pub(crate) fn evictable_unless_protected(p: &Pod) -> bool {
    is_active(p) && !tolerates_disrupted(p) && !is_mirror_pod(p) && !owned_by(p, "Node")
}

/// `karpenter.sh/do-not-disrupt`: "true", or a duration ("30m") still running since the pod
/// started. An invalid value protects nothing (as upstream treats it); see `invalid_do_not_disrupt`.
pub(crate) fn do_not_disrupt(pod: &Pod, now: Timestamp) -> bool {
    do_not_disrupt_protection(pod).is_some_and(|p| p.holds_at(now))
}

/// How long `karpenter.sh/do-not-disrupt` protects a pod: read from the pod alone, so the
/// index can keep it (see [`PodSummary`]) and only `now` is asked later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protection {
    /// "true"; or a duration on a pod not started yet (protected until it has run for the
    /// duration), or one too long to add to its start time.
    Always,
    /// A duration running since the pod started: protected before this instant.
    Until(Timestamp),
}

impl Protection {
    pub(crate) fn holds_at(self, now: Timestamp) -> bool {
        match self {
            Protection::Always => true,
            Protection::Until(until) => now < until,
        }
    }
}

/// The pod's [`Protection`], None when it has none (no annotation, or an invalid value).
pub(crate) fn do_not_disrupt_protection(pod: &Pod) -> Option<Protection> {
    let v = pod.annotations().get(DO_NOT_DISRUPT_ANNOTATION)?;
    if v == "true" {
        return Some(Protection::Always);
    }
    let d = crate::api::duration::parse(v).ok()?;
    let Some(started) = pod.status.as_ref().and_then(|s| s.start_time.as_ref()) else {
        return Some(Protection::Always);
    };
    let until = jiff::SignedDuration::try_from(d)
        .ok()
        .and_then(|d| started.0.checked_add(d).ok());
    Some(until.map_or(Protection::Always, Protection::Until))
}

/// Upstream's eviction cost of one pod: 1, moved by its deletion cost and priority, clamped.
pub(crate) fn eviction_cost(deletion_cost: Option<&str>, priority: Option<i32>) -> f64 {
    let mut cost = 1.0;
    if let Some(d) = deletion_cost.and_then(|d| d.trim().parse::<f64>().ok())
        && d.is_finite()
    {
        cost += d / 2f64.powi(27);
    }
    if let Some(p) = priority {
        cost += f64::from(p) / 2f64.powi(25);
    }
    cost.clamp(-10.0, 10.0)
}

/// Upstream's eviction cost of `p`, from its [`steering_cost`] and priority.
pub(crate) fn pod_eviction_cost(p: &Pod) -> f64 {
    eviction_cost(steering_cost(p), p.spec.as_ref().and_then(|s| s.priority))
}

/// The cost the pod's owner gave consolidation, as v1.15 reads it: `karpenter.sh/disruption-cost`
/// when set; else `controller.kubernetes.io/pod-deletion-cost`, unless that value is the
/// controller's own ranking ([`deletion_cost_managed`]), which says nothing of the pod's worth
/// and would otherwise feed the ranking back into the consolidation it follows.
pub(crate) fn steering_cost(p: &Pod) -> Option<&str> {
    let a = p.annotations();
    if let Some(v) = a.get(DISRUPTION_COST_ANNOTATION) {
        return Some(v);
    }
    if deletion_cost_managed(p) {
        return None;
    }
    a.get(POD_DELETION_COST_ANNOTATION).map(String::as_str)
}

/// The pod's deletion cost is the controller's (its sentinel says so), not its owner's.
pub(crate) fn deletion_cost_managed(p: &Pod) -> bool {
    p.annotations()
        .get(MANAGED_DELETION_COST_ANNOTATION)
        .is_some_and(|v| v == "true")
}

/// The pod's `Ready` condition is False (upstream's test for an unhealthy pod; Unknown is not).
pub(crate) fn not_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "False"))
}

/// A do-not-disrupt value that is neither "true" nor a duration: the reason to report on the pod.
#[cfg(test)]
pub(crate) fn invalid_do_not_disrupt(pod: &Pod) -> Option<String> {
    let v = pod.annotations().get(DO_NOT_DISRUPT_ANNOTATION)?;
    if v == "true" {
        return None;
    }
    crate::api::duration::parse(v).err().map(|e| {
        format!("annotation {DO_NOT_DISRUPT_ANNOTATION}={v:?} is neither \"true\" nor a duration ({e}); it is ignored")
    })
}

/// The pod tolerates `karpenter.sh/disrupted:NoSchedule`: a drain leaves it (it would only be
/// scheduled back).
pub(crate) fn tolerates_disrupted(pod: &Pod) -> bool {
    let taint = Taint {
        key: DISRUPTED_TAINT_KEY.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    };
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    tolerates(tolerations, &taint)
}

/// [`EventFacts::event_time`] of a change from `old` to `new`.
#[cfg(test)]
pub(crate) fn pod_event_time(old: Option<&Pod>, new: &Pod, now: Timestamp) -> Option<Timestamp> {
    let old = old.map(EventFacts::of);
    EventFacts::of(new).event_time(old.as_ref(), now)
}

/// What [`EventFacts::event_time`] reads of a pod: kept beside each indexed pod, so that a
/// change (or a re-list) compares with the previous version without decoding it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct EventFacts {
    /// It names a node.
    pub(crate) bound: bool,
    daemonset: bool,
    terminal: bool,
    terminating: bool,
    /// Its `PodScheduled=True` condition, if any, and that condition's transition time.
    scheduled: Option<Option<Timestamp>>,
}

impl EventFacts {
    pub(crate) fn of(p: &Pod) -> Self {
        let scheduled = (p.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
            .filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.as_ref().map(|t| t.0));
        Self {
            bound: node_name(p).is_some(),
            daemonset: is_daemonset_pod(p),
            terminal: is_terminal(p),
            terminating: p.metadata.deletion_timestamp.is_some(),
            scheduled,
        }
    }

    pub(crate) fn terminal(&self) -> bool {
        self.terminal
    }

    /// When a change from `old` to this pod is a pod event on its node, as Karpenter core counts
    /// them for `status.lastPodEventTime` (the start of `consolidateAfter`): the pod was
    /// scheduled (the time of its `PodScheduled=True` transition), or it became terminal or
    /// terminating (`now`). DaemonSet pods are not events: they come and go with every node.
    pub(crate) fn event_time(&self, old: Option<&Self>, now: Timestamp) -> Option<Timestamp> {
        if !self.bound || self.daemonset {
            return None;
        }
        if (self.terminal && !old.is_some_and(|o| o.terminal))
            || (self.terminating && !old.is_some_and(|o| o.terminating))
        {
            return Some(now);
        }
        match (old.and_then(|o| o.scheduled), self.scheduled) {
            (_, None) => None,
            (before, Some(at)) if before == Some(at) => None,
            // A condition without a transition time: the event is now.
            (_, Some(at)) => Some(at.unwrap_or(now)),
        }
    }
}

/// The pod has inter-pod constraints (pod affinity or anti-affinity, topology spread): the
/// solver then counts the bound pods its selectors match, so it needs them all.
pub(crate) fn has_pod_terms(p: &Pod) -> bool {
    let Some(spec) = p.spec.as_ref() else {
        return false;
    };
    let affinity = spec.affinity.as_ref();
    let pod_affinity = affinity
        .and_then(|a| a.pod_affinity.as_ref())
        .is_some_and(|a| {
            any(&a.required_during_scheduling_ignored_during_execution)
                || any(&a.preferred_during_scheduling_ignored_during_execution)
        });
    let anti = affinity
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .is_some_and(|a| {
            any(&a.required_during_scheduling_ignored_during_execution)
                || any(&a.preferred_during_scheduling_ignored_during_execution)
        });
    let spread = any(&spec.topology_spread_constraints);
    pod_affinity || anti || spread
}

fn any<T>(terms: &Option<Vec<T>>) -> bool {
    terms.as_ref().is_some_and(|t| !t.is_empty())
}

/// The pod asks for a host port: it takes that port on its node from every other pod.
pub(crate) fn has_host_ports(p: &Pod) -> bool {
    p.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .flat_map(|c| c.ports.iter().flatten())
            .any(|port| port.host_port.is_some_and(|h| h > 0))
    })
}

/// Karpenter's definition: `PodScheduled=False` with reason `Unschedulable`, no node, not
/// nominated, not a DaemonSet or mirror pod, not terminating.
pub(crate) fn is_provisionable(p: &Pod) -> bool {
    let status = p.status.as_ref();
    let unschedulable = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
        });
    let nominated = status
        .and_then(|s| s.nominated_node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    unschedulable
        && node_name(p).is_none()
        && !nominated
        && !is_daemonset_pod(p)
        && !is_mirror_pod(p)
        && !is_terminal(p)
        && p.metadata.deletion_timestamp.is_none()
}
