//! Stand-in for kube-controller-manager's disruption controller: it keeps every
//! PodDisruptionBudget's status (`expectedPods`, `currentHealthy`, `desiredHealthy`,
//! `disruptionsAllowed`, `observedGeneration`) in step with its pods and their controllers' scale,
//! counted as the real one counts them (module `pdb_expected`: bare pods under `maxUnavailable`
//! allow no disruption). The controller reads `disruptionsAllowed` to leave protected nodes
//! alone; evictions are judged by the API server itself (`eviction.rs`) by the same count.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::eviction::healthy;
use super::pdb_expected::{Expectation, Workloads, expectation};
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
        let workloads = self.workloads(ns).await?;
        let reader = |kind: &str, name: &str| workloads.get(&(kind.into(), name.into())).cloned();
        for pdb in list {
            let raw = serde_json::to_value(&pdb).unwrap_or(Value::Null);
            let status = status_of(&raw, &pods, &reader);
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

    /// The namespace's Deployments, ReplicaSets and StatefulSets by (kind, name): the
    /// controllers whose scale a budget's expected pods are counted from.
    async fn workloads(&self, ns: &str) -> Result<HashMap<(String, String), Value>, kube::Error> {
        let mut out = HashMap::new();
        let mut keep = |kind: &str, name: String, obj: serde_json::Result<Value>| {
            if let Ok(obj) = obj {
                out.insert((kind.to_string(), name), obj);
            }
        };
        let lp = ListParams::default();
        for d in Api::<Deployment>::namespaced(self.client.clone(), ns)
            .list(&lp)
            .await?
        {
            keep("Deployment", d.name_any(), serde_json::to_value(&d));
        }
        for r in Api::<ReplicaSet>::namespaced(self.client.clone(), ns)
            .list(&lp)
            .await?
        {
            keep("ReplicaSet", r.name_any(), serde_json::to_value(&r));
        }
        for s in Api::<StatefulSet>::namespaced(self.client.clone(), ns)
            .list(&lp)
            .await?
        {
            keep("StatefulSet", s.name_any(), serde_json::to_value(&s));
        }
        Ok(out)
    }
}

/// The status the disruption controller writes for `pdb` over the namespace's `pods` and
/// `workloads`.
fn status_of(pdb: &Value, pods: &[Value], workloads: &Workloads<'_>) -> Value {
    let selector = LabelSelector::from_object(pdb.pointer("/spec/selector")).unwrap_or_default();
    let selected: Vec<&Value> = if selector.is_empty() {
        Vec::new()
    } else {
        pods.iter().filter(|p| selector.matches_object(p)).collect()
    };
    let current = selected.iter().filter(|p| healthy(p)).count() as i64;
    // An unreadable budget protects every pod it selects.
    let count = selected.len() as i64;
    let budget = expectation(pdb, &selected, workloads).unwrap_or(Expectation {
        expected: count,
        desired: count,
    });
    json!({
        "observedGeneration": pdb.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
        "expectedPods": budget.expected,
        "currentHealthy": current,
        "desiredHealthy": budget.desired,
        "disruptionsAllowed": budget.allowed(current),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(app: &str, running: bool, owned: bool) -> Value {
        let owners = match owned {
            true => json!([{"kind": "Deployment", "name": app, "controller": true}]),
            false => json!([]),
        };
        json!({"metadata": {"labels": {"app": app}, "ownerReferences": owners},
               "spec": {"nodeName": "n"},
               "status": {"phase": if running { "Running" } else { "Pending" }}})
    }

    fn three_replicas(kind: &str, _: &str) -> Option<Value> {
        (kind == "Deployment").then(|| json!({"spec": {"replicas": 3}}))
    }

    #[test]
    fn disruptions_allowed_follows_the_healthy_pods() {
        let pdb = json!({"metadata": {"generation": 2},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}});
        let pods = vec![
            pod("web", true, true),
            pod("web", true, true),
            pod("web", false, true),
            pod("db", true, true),
        ];
        let s = status_of(&pdb, &pods, &three_replicas);
        assert_eq!(s["expectedPods"], 3);
        assert_eq!(s["currentHealthy"], 2);
        assert_eq!(s["desiredHealthy"], 2);
        assert_eq!(s["disruptionsAllowed"], 0);
        assert_eq!(s["observedGeneration"], 2);
        let pods = vec![pod("web", true, true); 3];
        assert_eq!(
            status_of(&pdb, &pods, &three_replicas)["disruptionsAllowed"],
            1
        );
    }

    #[test]
    fn bare_pods_under_max_unavailable_allow_no_disruption() {
        let pdb =
            json!({"spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}});
        let s = status_of(&pdb, &vec![pod("web", true, false); 3], &three_replicas);
        // As kube-controller-manager reports it for three Running bare pods.
        assert_eq!(s["expectedPods"], 0);
        assert_eq!(s["currentHealthy"], 3);
        assert_eq!(s["desiredHealthy"], 0);
        assert_eq!(s["disruptionsAllowed"], 0);
    }
}
