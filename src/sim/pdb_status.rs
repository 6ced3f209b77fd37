//! Stand-in for kube-controller-manager's disruption controller: it keeps every
//! PodDisruptionBudget's status (`expectedPods`, `currentHealthy`, `desiredHealthy`,
//! `disruptionsAllowed`, `observedGeneration`) in step with its pods, as the real one does. The
//! controller reads `disruptionsAllowed` to leave protected nodes alone; evictions are judged by
//! the API server itself (`eviction.rs`), from the pods, exactly as before.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::eviction::{desired_healthy, healthy};
use super::selectors::LabelSelector;
use super::standin::{Shutdown, WorkQueue, merge_status, spawn_watch};

struct Inner {
    client: Client,
    /// Namespaces whose budgets need a fresh look.
    dirty: WorkQueue<String>,
    shutdown: Shutdown,
}

pub fn spawn(client: Client, shutdown: Shutdown) -> Vec<JoinHandle<()>> {
    let inner = Arc::new(Inner {
        client,
        dirty: WorkQueue::default(),
        shutdown,
    });
    let me = inner.clone();
    let pods = spawn_watch(
        "pods (disruption controller)",
        Api::<Pod>::all(inner.client.clone()),
        inner.shutdown.clone(),
        move |event| match event {
            Event::Apply(p) | Event::InitApply(p) | Event::Delete(p) => {
                me.dirty.push(p.namespace().unwrap_or_default())
            }
            _ => {}
        },
    );
    let me = inner.clone();
    let pdbs = spawn_watch(
        "poddisruptionbudgets (disruption controller)",
        Api::<PodDisruptionBudget>::all(inner.client.clone()),
        inner.shutdown.clone(),
        move |event| match event {
            Event::Apply(p) | Event::InitApply(p) => {
                me.dirty.push(p.namespace().unwrap_or_default())
            }
            _ => {}
        },
    );
    let me = inner.clone();
    let worker = tokio::spawn(async move {
        while let Some(ns) = me.dirty.pop(&me.shutdown).await {
            let synced = me.sync(&ns).await;
            me.dirty.done(&ns);
            if let Err(e) = synced {
                tracing::debug!(namespace = %ns, error = %e, "PDB status sync failed; retrying");
                me.dirty.push(ns);
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    });
    vec![pods, pdbs, worker]
}

impl Inner {
    async fn sync(&self, ns: &str) -> Result<(), kube::Error> {
        let budgets: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), ns);
        let list = budgets.list(&ListParams::default()).await?.items;
        if list.is_empty() {
            return Ok(());
        }
        let pods: Vec<Value> = Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter_map(|p| serde_json::to_value(p).ok())
            .collect();
        for pdb in list {
            let raw = serde_json::to_value(&pdb).unwrap_or(Value::Null);
            let status = status_of(&raw, &pods);
            let current = raw.get("status").cloned().unwrap_or(Value::Null);
            let unchanged = [
                "expectedPods",
                "currentHealthy",
                "desiredHealthy",
                "disruptionsAllowed",
                "observedGeneration",
            ]
            .iter()
            .all(|k| current.get(k) == status.get(k));
            if !unchanged {
                merge_status(&budgets, &pdb.name_any(), &json!({ "status": status })).await?;
            }
        }
        Ok(())
    }
}

/// The status the disruption controller writes for `pdb` over the namespace's `pods`.
fn status_of(pdb: &Value, pods: &[Value]) -> Value {
    let selector = LabelSelector::from_object(pdb.pointer("/spec/selector")).unwrap_or_default();
    let selected: Vec<&Value> = if selector.is_empty() {
        Vec::new()
    } else {
        pods.iter().filter(|p| selector.matches_object(p)).collect()
    };
    let expected = selected.len() as i64;
    let current = selected.iter().filter(|p| healthy(p)).count() as i64;
    let desired = desired_healthy(pdb, expected).unwrap_or(expected);
    json!({
        "observedGeneration": pdb.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
        "expectedPods": expected,
        "currentHealthy": current,
        "desiredHealthy": desired,
        "disruptionsAllowed": (current - desired).max(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(app: &str, running: bool) -> Value {
        json!({"metadata": {"labels": {"app": app}},
               "spec": {"nodeName": "n"},
               "status": {"phase": if running { "Running" } else { "Pending" }}})
    }

    #[test]
    fn disruptions_allowed_follows_the_healthy_pods() {
        let pdb = json!({"metadata": {"generation": 2},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}});
        let pods = vec![
            pod("web", true),
            pod("web", true),
            pod("web", false),
            pod("db", true),
        ];
        let s = status_of(&pdb, &pods);
        assert_eq!(s["expectedPods"], 3);
        assert_eq!(s["currentHealthy"], 2);
        assert_eq!(s["desiredHealthy"], 2);
        assert_eq!(s["disruptionsAllowed"], 0);
        assert_eq!(s["observedGeneration"], 2);
        let pods = vec![pod("web", true), pod("web", true), pod("web", true)];
        assert_eq!(status_of(&pdb, &pods)["disruptionsAllowed"], 1);
    }
}
