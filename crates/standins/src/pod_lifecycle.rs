//! The kubelet stand-in's pod side, and the pod garbage collector. A pod bound to a node starts
//! (`Running`, `startTime`, `Ready`), which is what makes it count as healthy for its
//! PodDisruptionBudget. kube-apiserver only marks a running pod deleted (`deletionTimestamp` = now + grace); the kubelet stops its containers and
//! then removes it. Here a pod stops `exit_after` after it was marked (how long the application
//! takes to exit on SIGTERM: the pod's `sim.karpenter.cluster.x-k8s.io/exit-after` annotation in
//! seconds, `never` for one that ignores SIGTERM, else the configured default), and never later
//! than its `deletionTimestamp`. Pods bound to a Node that is gone are removed at once, as the
//! pod GC controller does.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use serde_json::json;
use tokio::task::JoinHandle;

use super::standin::{Shutdown, is_conflict, is_not_found, merge_status, retry, spawn_watch};

/// How long a pod's application takes to exit after SIGTERM (seconds, or `never`).
pub const EXIT_AFTER_ANNOTATION: &str = "sim.karpenter.cluster.x-k8s.io/exit-after";

struct Inner {
    client: Client,
    default_exit: Duration,
    /// Pods (by uid) with a removal scheduled, and when.
    scheduled: Mutex<HashMap<String, jiff::Timestamp>>,
    /// Pods (by uid) this kubelet started.
    started: Mutex<HashSet<String>>,
    shutdown: Shutdown,
}

/// `pod_gc`: also stand in for the pod garbage collector (off where a real
/// kube-controller-manager runs one).
pub fn spawn(
    client: Client,
    default_exit: Duration,
    pod_gc: bool,
    shutdown: Shutdown,
) -> Vec<JoinHandle<()>> {
    let inner = Arc::new(Inner {
        client,
        default_exit,
        scheduled: Mutex::new(HashMap::new()),
        started: Mutex::new(HashSet::new()),
        shutdown,
    });
    let me = inner.clone();
    let pods = spawn_watch(
        "pods (kubelet)",
        Api::<Pod>::all(inner.client.clone()),
        inner.shutdown.clone(),
        move |event| match event {
            Event::Apply(pod) | Event::InitApply(pod) => me.on_pod(pod),
            Event::Delete(pod) => {
                let uid = pod.uid().unwrap_or_default();
                me.scheduled.lock().remove(&uid);
                me.started.lock().remove(&uid);
            }
            _ => {}
        },
    );
    if !pod_gc {
        return vec![pods];
    }
    let me = inner.clone();
    let nodes = spawn_watch(
        "nodes (pod gc)",
        Api::<Node>::all(inner.client.clone()),
        inner.shutdown.clone(),
        move |event| {
            if let Event::Delete(node) = event {
                let me = me.clone();
                tokio::spawn(async move { me.collect_pods_of(&node.name_any()).await });
            }
        },
    );
    vec![pods, nodes]
}

impl Inner {
    fn on_pod(self: &Arc<Self>, pod: Pod) {
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none()
        {
            return;
        }
        let Some(deleted) = pod.metadata.deletion_timestamp.as_ref().map(|t| t.0) else {
            self.start(pod);
            return;
        };
        let now = jiff::Timestamp::now();
        let exit = match exit_after(&pod, self.default_exit) {
            Some(d) => now
                .checked_add(jiff::SignedDuration::try_from(d).unwrap_or_default())
                .unwrap_or(now),
            None => deleted,
        };
        let at = exit.min(deleted);
        let uid = pod.uid().unwrap_or_default();
        {
            let mut scheduled = self.scheduled.lock();
            // A later event that shortens the deadline brings the removal forward; anything
            // else is already covered.
            if scheduled.get(&uid).is_some_and(|s| *s <= at) {
                return;
            }
            scheduled.insert(uid.clone(), at);
        }
        let me = self.clone();
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        tokio::spawn(async move {
            let wait = now.duration_until(at).unsigned_abs();
            let wait = if at > now { wait } else { Duration::ZERO };
            if !me.shutdown.sleep(wait).await {
                return;
            }
            me.remove(&ns, &name, &uid).await;
        });
    }

    /// A bound pod that has not started yet starts now: phase Running, startTime, Ready.
    fn start(self: &Arc<Self>, pod: Pod) {
        let status = pod.status.clone().unwrap_or_default();
        if status.phase.as_deref().is_some_and(|p| p != "Pending") {
            return;
        }
        let uid = pod.uid().unwrap_or_default();
        if !self.started.lock().insert(uid) {
            return;
        }
        let now = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let mut conditions: Vec<serde_json::Value> = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .filter(|c| {
                !matches!(
                    c.type_.as_str(),
                    "Initialized" | "ContainersReady" | "Ready"
                )
            })
            .filter_map(|c| serde_json::to_value(c).ok())
            .collect();
        for t in ["Initialized", "ContainersReady", "Ready"] {
            conditions.push(json!({"type": t, "status": "True", "lastTransitionTime": now}));
        }
        // The kubelet reports PodScheduled=True for every pod it runs, also for pods created
        // with spec.nodeName that no scheduler bound.
        if !conditions.iter().any(|c| c["type"] == "PodScheduled") {
            conditions
                .push(json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now}));
        }
        let patch =
            json!({"status": {"phase": "Running", "startTime": now, "conditions": conditions}});
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let name = pod.name_any();
        let me = self.clone();
        tokio::spawn(async move {
            let _ = retry("start pod", &me.shutdown, || {
                merge_status(&api, &name, &patch)
            })
            .await;
        });
    }

    /// The kubelet's final delete (grace 0, this pod's uid only).
    async fn remove(&self, ns: &str, name: &str, uid: &str) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let mut backoff = Duration::from_millis(20);
        loop {
            match api.delete(name, &params).await {
                Ok(_) => return,
                Err(e) if is_not_found(&e) || is_conflict(&e) => return,
                Err(e) => {
                    tracing::debug!(pod = %name, error = %e, "kubelet stand-in: pod removal failed, retrying");
                    if !self.shutdown.sleep(backoff).await {
                        return;
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Pod GC: pods bound to a Node that no longer exists are removed at once.
    async fn collect_pods_of(&self, node: &str) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let Ok(pods) = api.list(&lp).await else {
            return;
        };
        for pod in pods {
            let ns = pod.namespace().unwrap_or_default();
            self.remove(&ns, &pod.name_any(), &pod.uid().unwrap_or_default())
                .await;
        }
    }
}

/// The pod's exit time after SIGTERM; None for `never` (it runs until its deadline).
fn exit_after(pod: &Pod, default: Duration) -> Option<Duration> {
    let Some(v) = pod.annotations().get(EXIT_AFTER_ANNOTATION) else {
        return Some(default);
    };
    if v.trim() == "never" {
        return None;
    }
    Some(
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
            .unwrap_or(default),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotation: Option<&str>) -> Pod {
        let mut p = Pod::default();
        if let Some(a) = annotation {
            p.metadata.annotations =
                Some([(EXIT_AFTER_ANNOTATION.to_string(), a.to_string())].into());
        }
        p
    }

    #[test]
    fn exit_time_comes_from_the_annotation() {
        let d = Duration::from_millis(200);
        assert_eq!(exit_after(&pod(None), d), Some(d));
        assert_eq!(
            exit_after(&pod(Some("2.5")), d),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(exit_after(&pod(Some("never")), d), None);
        assert_eq!(exit_after(&pod(Some("soon")), d), Some(d));
        assert_eq!(exit_after(&pod(Some("-1")), d), Some(d));
        assert_eq!(exit_after(&pod(Some("inf")), d), Some(d));
    }
}
