//! What the disruption pass reads of a bound pod, kept beside its compact form when the pod is
//! indexed. A pass weighs every node's pods once a second while the cluster changes; decoding
//! each pod again for it (merge patch, prototype clone, `Pod` from a `Value`) was the largest
//! cost of a 1,000-pod run on a real control plane (docs/benchmarks.md). Every fact here is the
//! answer of the function in `state::pods` that decides it, asked once per pod change, so the
//! rules stay there.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
#[cfg(test)]
use kube::ResourceExt;

use super::{
    Protection, do_not_disrupt_protection, evictable_unless_protected, is_active, is_daemonset_pod,
    is_reschedulable, not_ready, pod_eviction_cost,
};

pub(crate) struct PodSummary {
    /// `namespace/name` (shared with the index's key).
    key: Arc<str>,
    /// Shared by the pods of one template (see `state::shared`): PodDisruptionBudgets select
    /// by them.
    labels: Arc<BTreeMap<String, String>>,
    /// `karpenter.sh/do-not-disrupt`, when it protects at all.
    protection: Option<Protection>,
    /// Upstream's eviction cost ([`super::pod_eviction_cost`]).
    eviction_cost: f64,
    active: bool,
    reschedulable: bool,
    evictable_unless_protected: bool,
    daemonset: bool,
    not_ready: bool,
}

impl PodSummary {
    /// The summary of `p`, its key and labels not shared with anything.
    #[cfg(test)]
    pub(crate) fn of(p: &Pod) -> Self {
        Self::new(Arc::from(super::key(p)), p, Arc::new(p.labels().clone()))
    }

    /// The summary of `p`, whose key and (shared) labels the caller has already.
    pub(super) fn new(key: Arc<str>, p: &Pod, labels: Arc<BTreeMap<String, String>>) -> Self {
        Self {
            key,
            labels,
            protection: do_not_disrupt_protection(p),
            eviction_cost: pod_eviction_cost(p),
            active: is_active(p),
            reschedulable: is_reschedulable(p),
            evictable_unless_protected: evictable_unless_protected(p),
            daemonset: is_daemonset_pod(p),
            not_ready: not_ready(p),
        }
    }

    /// `namespace/name`, as [`super::key`] names a pod.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The key as the index holds it, to share instead of copying.
    pub(crate) fn shared_key(&self) -> &Arc<str> {
        &self.key
    }

    pub(crate) fn namespace(&self) -> &str {
        self.key.split_once('/').map_or("", |(ns, _)| ns)
    }

    pub(crate) fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// [`super::is_active`].
    pub(crate) fn is_active(&self) -> bool {
        self.active
    }

    /// [`super::is_reschedulable`].
    pub(crate) fn is_reschedulable(&self) -> bool {
        self.reschedulable
    }

    /// [`super::is_daemonset_pod`].
    pub(crate) fn is_daemonset(&self) -> bool {
        self.daemonset
    }

    /// [`super::do_not_disrupt`].
    pub(crate) fn do_not_disrupt(&self, now: Timestamp) -> bool {
        self.protection.is_some_and(|p| p.holds_at(now))
    }

    /// [`super::is_evictable`].
    pub(crate) fn is_evictable(&self, now: Timestamp) -> bool {
        self.evictable_unless_protected && !self.do_not_disrupt(now)
    }

    /// [`super::not_ready`].
    pub(crate) fn not_ready(&self) -> bool {
        self.not_ready
    }

    /// [`super::pod_eviction_cost`].
    pub(crate) fn eviction_cost(&self) -> f64 {
        self.eviction_cost
    }
}
