//! Pods of the workload cluster: the provisionable ones (what the provisioner packs) and the
//! bound ones by node (what already uses each node's room).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

pub fn key(p: &Pod) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

pub fn node_name(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

pub fn is_daemonset_pod(p: &Pod) -> bool {
    p.owner_references()
        .iter()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true))
}

pub fn is_mirror_pod(p: &Pod) -> bool {
    p.annotations().contains_key("kubernetes.io/config.mirror")
}

pub fn is_terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// When a change from `old` to `new` is a pod event on its node, as Karpenter core counts them
/// for `status.lastPodEventTime` (the start of `consolidateAfter`): the pod was scheduled (the
/// time of its `PodScheduled=True` transition), or it became terminal or terminating (`now`).
/// DaemonSet pods are not events: they come and go with every node.
pub fn pod_event_time(old: Option<&Pod>, new: &Pod, now: Timestamp) -> Option<Timestamp> {
    if node_name(new).is_none() || is_daemonset_pod(new) {
        return None;
    }
    let terminating = |p: &Pod| p.metadata.deletion_timestamp.is_some();
    if (is_terminal(new) && !old.is_some_and(is_terminal))
        || (terminating(new) && !old.is_some_and(terminating))
    {
        return Some(now);
    }
    let scheduled = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
            .filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.as_ref().map(|t| t.0))
    };
    match (old.and_then(scheduled), scheduled(new)) {
        (_, None) => None,
        (before, Some(at)) if before == Some(at) => None,
        // A condition without a transition time: the event is now.
        (_, Some(at)) => Some(at.unwrap_or(now)),
    }
}

/// Karpenter's definition: `PodScheduled=False` with reason `Unschedulable`, no node, not
/// nominated, not a DaemonSet or mirror pod, not terminating.
pub fn is_provisionable(p: &Pod) -> bool {
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

#[derive(Default)]
pub struct Pods {
    by_key: HashMap<String, Arc<Pod>>,
    provisionable: BTreeSet<String>,
    by_node: HashMap<String, BTreeSet<String>>,
    synced: bool,
}

impl Pods {
    pub fn get(&self, key: &str) -> Option<Arc<Pod>> {
        self.by_key.get(key).cloned()
    }

    pub fn synced(&self) -> bool {
        self.synced
    }

    pub fn provisionable(&self) -> Vec<Arc<Pod>> {
        self.provisionable
            .iter()
            .filter_map(|k| self.by_key.get(k).cloned())
            .collect()
    }

    pub fn provisionable_count(&self) -> usize {
        self.provisionable.len()
    }

    /// Pods bound to a node and still running there.
    pub fn on_node(&self, node: &str) -> Vec<Arc<Pod>> {
        self.by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|k| self.by_key.get(k).cloned())
            .collect()
    }

    pub fn bound(&self) -> Vec<Arc<Pod>> {
        self.by_node
            .values()
            .flatten()
            .filter_map(|k| self.by_key.get(k).cloned())
            .collect()
    }

    /// Apply one watched pod; true when it is (newly or still) provisionable.
    pub fn apply(&mut self, p: Pod) -> bool {
        let k = key(&p);
        self.remove(&k);
        let provisionable = is_provisionable(&p);
        if provisionable {
            self.provisionable.insert(k.clone());
        }
        if let Some(n) = node_name(&p).filter(|_| !is_terminal(&p)) {
            self.by_node
                .entry(n.to_string())
                .or_default()
                .insert(k.clone());
        }
        self.by_key.insert(k, Arc::new(p));
        provisionable
    }

    pub fn remove(&mut self, k: &str) -> Option<Arc<Pod>> {
        let old = self.by_key.remove(k)?;
        self.provisionable.remove(k);
        if let Some(n) = node_name(&old)
            && let Some(set) = self.by_node.get_mut(n)
        {
            set.remove(k);
            if set.is_empty() {
                self.by_node.remove(n);
            }
        }
        Some(old)
    }

    pub fn replace_all(&mut self, pods: Vec<Pod>) {
        self.by_key.clear();
        self.provisionable.clear();
        self.by_node.clear();
        for p in pods {
            self.apply(p);
        }
        self.synced = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(extra: serde_json::Value) -> Pod {
        let mut v = json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        });
        json_patch_merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn json_patch_merge(a: &mut serde_json::Value, b: serde_json::Value) {
        if let (Some(a), serde_json::Value::Object(b)) = (a.as_object_mut(), &b) {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        json_patch_merge(existing, v.clone())
                    }
                    _ => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
    }

    #[test]
    fn provisionable_follows_karpenter() {
        assert!(is_provisionable(&pod(json!({}))));
        assert!(!is_provisionable(&pod(json!({"spec": {"nodeName": "n"}}))));
        assert!(!is_provisionable(&pod(
            json!({"status": {"nominatedNodeName": "n"}})
        )));
        assert!(!is_provisionable(&pod(
            json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}})
        )));
        assert!(!is_provisionable(&pod(
            json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]}})
        )));
        assert!(!is_provisionable(&pod(
            json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}]}})
        )));
    }

    #[test]
    fn index_tracks_binding() {
        let mut pods = Pods::default();
        assert!(pods.apply(pod(json!({}))));
        assert_eq!(pods.provisionable_count(), 1);
        pods.apply(pod(
            json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running", "conditions": []}}),
        ));
        assert_eq!(pods.provisionable_count(), 0);
        assert_eq!(pods.on_node("n1").len(), 1);
        pods.remove("ns/p");
        assert!(pods.on_node("n1").is_empty());
    }

    #[test]
    fn pod_events_are_scheduling_and_termination() {
        let now: Timestamp = "2026-01-01T10:00:00Z".parse().unwrap();
        let sched = "2026-01-01T09:00:00Z";
        let bound = pod(
            json!({"spec": {"nodeName": "n"}, "status": {"phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": sched}]}}),
        );
        let pending = pod(json!({}));
        // Scheduled: the condition's transition time, once.
        assert_eq!(
            pod_event_time(Some(&pending), &bound, now),
            Some(sched.parse().unwrap())
        );
        assert_eq!(
            pod_event_time(None, &bound, now),
            Some(sched.parse().unwrap())
        );
        assert_eq!(pod_event_time(Some(&bound), &bound, now), None);
        // Terminating or terminal: now, once.
        let mut going = bound.clone();
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        assert_eq!(pod_event_time(Some(&bound), &going, now), Some(now));
        assert_eq!(pod_event_time(Some(&going), &going, now), None);
        let mut done = bound.clone();
        if let Some(s) = done.status.as_mut() {
            s.phase = Some("Succeeded".into());
        }
        assert_eq!(pod_event_time(Some(&bound), &done, now), Some(now));
        // Not on a node, or a DaemonSet pod: no event.
        assert_eq!(pod_event_time(None, &pending, now), None);
        let mut ds = bound.clone();
        ds.metadata.owner_references = Some(vec![serde_json::from_value(json!(
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}
        )).unwrap()]);
        assert_eq!(pod_event_time(None, &ds, now), None);
    }
}
