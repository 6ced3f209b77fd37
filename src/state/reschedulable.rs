//! Which pods of a node being deleted the provisioner plans for before they are evicted
//! (upstream's `GetCurrentlyReschedulablePods`): the capacity they will need is launched while the
//! node drains, instead of after each pod is evicted and pending again.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::pods;
use crate::scheduling::selector::Selector;

/// PodDisruptionBudgets by `namespace/name` (kept by the disruption actor's watch).
pub type Pdbs = BTreeMap<String, Arc<PodDisruptionBudget>>;

/// Upstream's rule: a pod of a deleting node is planned for when it will be recreated elsewhere
/// and can be evicted at all. Active pods (and terminating StatefulSet pods, which are
/// recreated only once gone), not DaemonSet or static pods, not `do-not-disrupt`, and not
/// selected by a PodDisruptionBudget that blocks every eviction (maxUnavailable 0 or 0 %,
/// minAvailable 100 %): capacity for a pod that cannot leave would only be wasted. One pod;
/// for many, build [`Budgets`] once.
pub fn currently_reschedulable(p: &Pod, pdbs: &Pdbs, now: jiff::Timestamp) -> bool {
    Budgets::new(pdbs).reschedulable(p, now)
}

/// The budgets that block every eviction, their selectors parsed once (a snapshot asks for
/// every pod of every deleting node).
pub(crate) struct Budgets {
    /// (namespace, selector) of each fully blocking budget.
    blocking: Vec<(String, Selector)>,
}

impl Budgets {
    pub(crate) fn new(pdbs: &Pdbs) -> Self {
        let blocking = pdbs
            .values()
            .filter_map(|b| {
                let spec = b.spec.as_ref()?;
                let zero = |v: &IntOrString| match v {
                    IntOrString::Int(n) => *n == 0,
                    IntOrString::String(s) => s.trim() == "0%",
                };
                let all =
                    |v: &IntOrString| matches!(v, IntOrString::String(s) if s.trim() == "100%");
                let fully = spec.max_unavailable.as_ref().is_some_and(zero)
                    || spec.min_available.as_ref().is_some_and(all);
                // A selector we cannot read blocks nothing we can name; the API validates them.
                let sel = Selector::parse(spec.selector.as_ref(), "PodDisruptionBudget").ok()?;
                fully.then(|| (b.namespace().unwrap_or_default(), sel))
            })
            .collect();
        Self { blocking }
    }

    /// [`currently_reschedulable`] against these budgets.
    pub(crate) fn reschedulable(&self, p: &Pod, now: jiff::Timestamp) -> bool {
        pods::is_reschedulable(p) && !pods::do_not_disrupt(p, now) && !self.fully_blocked(p)
    }

    fn fully_blocked(&self, p: &Pod) -> bool {
        let ns = p.namespace().unwrap_or_default();
        self.blocking
            .iter()
            .any(|(n, sel)| *n == ns && sel.matches(p.labels()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(extra: serde_json::Value) -> Pod {
        let mut v = json!({"metadata": {"name": "p", "namespace": "default",
                                        "labels": {"app": "web"}},
                           "spec": {"containers": [], "nodeName": "n1"},
                           "status": {"phase": "Running"}});
        if let (Some(base), Some(more)) = (v.as_object_mut(), extra.as_object()) {
            for (k, x) in more {
                let slot = base.entry(k.clone()).or_insert(json!({}));
                if let (Some(s), Some(x)) = (slot.as_object_mut(), x.as_object()) {
                    s.extend(x.clone());
                }
            }
        }
        serde_json::from_value(v).unwrap()
    }

    fn pdb(spec: serde_json::Value) -> Pdbs {
        let mut s = json!({"selector": {"matchLabels": {"app": "web"}}});
        s.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        let b: PodDisruptionBudget = serde_json::from_value(
            json!({"metadata": {"name": "b", "namespace": "default"}, "spec": s}),
        )
        .unwrap();
        [("default/b".to_string(), Arc::new(b))].into()
    }

    fn owner(kind: &str) -> serde_json::Value {
        json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": kind,
               "name": "o", "uid": "u", "controller": true}]}})
    }

    const NOW: jiff::Timestamp = jiff::Timestamp::UNIX_EPOCH;

    #[test]
    fn active_pods_are_planned_for_and_terminating_ones_only_from_a_statefulset() {
        let none = Pdbs::new();
        assert!(currently_reschedulable(&pod(json!({})), &none, NOW));
        let terminating = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
        assert!(!currently_reschedulable(
            &pod(terminating.clone()),
            &none,
            NOW
        ));
        let mut sts = owner("StatefulSet");
        sts["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(currently_reschedulable(&pod(sts), &none, NOW));
        let mut rs = owner("ReplicaSet");
        rs["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(!currently_reschedulable(&pod(rs), &none, NOW));
        assert!(!currently_reschedulable(
            &pod(owner("DaemonSet")),
            &none,
            NOW
        ));
        assert!(!currently_reschedulable(
            &pod(json!({"status": {"phase": "Succeeded"}})),
            &none,
            NOW
        ));
        assert!(!currently_reschedulable(
            &pod(json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}})),
            &none,
            NOW
        ));
    }

    #[test]
    fn only_fully_blocking_budgets_hold_a_pod_back() {
        let p = pod(json!({}));
        for blocking in [
            json!({"maxUnavailable": 0}),
            json!({"maxUnavailable": "0%"}),
            json!({"minAvailable": "100%"}),
        ] {
            assert!(
                !currently_reschedulable(&p, &pdb(blocking.clone()), NOW),
                "{blocking}"
            );
        }
        for open in [json!({"maxUnavailable": 1}), json!({"minAvailable": "50%"})] {
            assert!(
                currently_reschedulable(&p, &pdb(open.clone()), NOW),
                "{open}"
            );
        }
    }
}
