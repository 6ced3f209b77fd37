//! Stand-in for kube-controller-manager's Deployment and ReplicaSet controllers, reduced to what
//! disruption needs: every Deployment keeps `spec.replicas` pods of its own (pods whose controller
//! owner reference carries the Deployment's uid) that are neither being deleted nor finished.
//! Missing pods are created from `spec.template` (named `<deployment>-<5 random characters>`),
//! surplus pods are deleted gracefully in the ReplicaSet controller's order ([`plan`]). A pod with a `deletionTimestamp` no longer counts, so an evicted pod is replaced at
//! once and its replacement waits, pending, for the scheduler stand-in. There is no ReplicaSet
//! object in between, no rollout of template changes and no status; pods already created keep
//! the template they were made from.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::standin::{Shutdown, SimRng, WorkQueue, is_conflict, is_not_found, spawn_watch};

/// A Deployment, by namespace and name.
type Key = (String, String);

struct Inner {
    client: Client,
    dirty: WorkQueue<Key>,
    rng: SimRng,
    /// Per pod uid: its Deployment and whether it counts towards the replicas, so only the
    /// events that change a count wake the worker (not every bind or status write).
    seen: Mutex<HashMap<String, (Key, bool)>>,
    shutdown: Shutdown,
}

pub fn spawn(client: Client, seed: u64, shutdown: Shutdown) -> Vec<JoinHandle<()>> {
    let inner = Arc::new(Inner {
        client,
        dirty: WorkQueue::default(),
        rng: SimRng::new(seed ^ 0xde91),
        seen: Mutex::new(HashMap::new()),
        shutdown,
    });
    let me = inner.clone();
    let pods = spawn_watch(
        "pods (deployment controller)",
        Api::<Pod>::all(inner.client.clone()),
        inner.shutdown.clone(),
        move |event| match event {
            Event::Apply(p) | Event::InitApply(p) => me.on_pod(&p, false),
            Event::Delete(p) => me.on_pod(&p, true),
            _ => {}
        },
    );
    let me = inner.clone();
    let deployments = spawn_watch(
        "deployments (deployment controller)",
        Api::<Deployment>::all(inner.client.clone()),
        inner.shutdown.clone(),
        move |event| match event {
            Event::Apply(d) | Event::InitApply(d) => me
                .dirty
                .push((d.namespace().unwrap_or_default(), d.name_any())),
            _ => {}
        },
    );
    let me = inner.clone();
    let worker = tokio::spawn(async move {
        while let Some(key) = me.dirty.pop(&me.shutdown).await {
            let synced = me.sync(&key).await;
            me.dirty.done(&key);
            if let Err(e) = synced {
                tracing::debug!(deployment = %format!("{}/{}", key.0, key.1), error = %e, "deployment sync failed; retrying");
                me.dirty.push(key);
                if !me.shutdown.sleep(Duration::from_millis(200)).await {
                    break;
                }
            }
        }
    });
    vec![pods, deployments, worker]
}

/// The Deployment that controls `pod` (name and uid), if any.
fn controller_deployment(pod: &Value) -> Option<(&str, &str)> {
    pod.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|o| {
            o["kind"] == "Deployment"
                && o["controller"] == true
                && o["apiVersion"]
                    .as_str()
                    .is_some_and(|v| v.starts_with("apps/"))
        })
        .and_then(|o| Some((o["name"].as_str()?, o["uid"].as_str()?)))
}

/// Counts towards its Deployment's replicas: not being deleted, not finished.
pub fn counts(pod: &Value) -> bool {
    let deleting = pod
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    !deleting && !matches!(phase, Some("Succeeded" | "Failed"))
}

fn bound(pod: &Value) -> bool {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty())
}

/// What a sync does: create `create` pods, delete the named pods.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub create: usize,
    pub delete: Vec<String>,
}

/// The plan for a Deployment of `replicas` over the pods it owns (`owned`, already filtered by
/// owner uid). Surplus pods go in kube-controller-manager's ReplicaSet order
/// (`ActivePodsWithRanks`): unbound first; then Pending, Unknown, Running; not Ready before
/// Ready; lower `controller.kubernetes.io/pod-deletion-cost` first; more of the Deployment's
/// pods on the same node first; then the newest (creation time, then name). Ready duration
/// and restart counts, which kube weighs before age, do not differ among this stand-in's pods.
pub fn plan(replicas: usize, owned: &[Value]) -> Plan {
    let mut active: Vec<&Value> = owned.iter().filter(|p| counts(p)).collect();
    if active.len() <= replicas {
        return Plan {
            create: replicas - active.len(),
            delete: Vec::new(),
        };
    }
    let mut on_node: HashMap<&str, usize> = HashMap::new();
    for p in &active {
        *on_node.entry(node_of(p)).or_default() += 1;
    }
    let related = |p: &Value| on_node.get(node_of(p)).copied().unwrap_or(0);
    active.sort_by(|a, b| {
        bound(a)
            .cmp(&bound(b))
            .then_with(|| phase_ordinal(a).cmp(&phase_ordinal(b)))
            .then_with(|| ready(a).cmp(&ready(b)))
            .then_with(|| deletion_cost(a).cmp(&deletion_cost(b)))
            .then_with(|| related(b).cmp(&related(a)))
            .then_with(|| {
                text(b, "/metadata/creationTimestamp").cmp(text(a, "/metadata/creationTimestamp"))
            })
            .then_with(|| text(b, "/metadata/name").cmp(text(a, "/metadata/name")))
    });
    let surplus = active.len() - replicas;
    Plan {
        create: 0,
        delete: active
            .iter()
            .take(surplus)
            .map(|p| text(p, "/metadata/name").to_string())
            .collect(),
    }
}

fn text<'a>(p: &'a Value, pointer: &str) -> &'a str {
    p.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn node_of(p: &Value) -> &str {
    text(p, "/spec/nodeName")
}

/// kube's `podPhaseToOrdinal`: Pending before Unknown before Running.
fn phase_ordinal(p: &Value) -> u8 {
    match text(p, "/status/phase") {
        "Unknown" => 1,
        "Running" => 2,
        _ => 0,
    }
}

fn ready(p: &Value) -> bool {
    p.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// The pod's deletion cost; 0 when unset or not an int32, as kube reads it.
fn deletion_cost(p: &Value) -> i32 {
    p.pointer("/metadata/annotations")
        .and_then(|a| a.get("controller.kubernetes.io/pod-deletion-cost"))
        .and_then(Value::as_str)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A pod body for Deployment `d` (its template, a generated name, the owner reference).
pub fn pod_from_template(d: &Value, name: &str) -> Value {
    let template = d.pointer("/spec/template").cloned().unwrap_or(json!({}));
    let mut meta = template.get("metadata").cloned().unwrap_or(json!({}));
    if !meta.is_object() {
        meta = json!({});
    }
    meta["name"] = json!(name);
    meta["namespace"] = d
        .pointer("/metadata/namespace")
        .cloned()
        .unwrap_or(json!(""));
    meta["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "kind": "Deployment",
        "name": d.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
        "uid": d.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
        "controller": true, "blockOwnerDeletion": true,
    }]);
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": meta,
        "spec": template.get("spec").cloned().unwrap_or(json!({})),
    })
}

impl Inner {
    fn on_pod(&self, pod: &Pod, gone: bool) {
        let uid = pod.uid().unwrap_or_default();
        let raw = serde_json::to_value(pod).unwrap_or(Value::Null);
        let Some((owner, _)) = controller_deployment(&raw) else {
            return;
        };
        let key = (pod.namespace().unwrap_or_default(), owner.to_string());
        let mut seen = self.seen.lock();
        if gone {
            seen.remove(&uid);
            drop(seen);
            self.dirty.push(key);
            return;
        }
        let now = counts(&raw);
        if seen.get(&uid).map(|(_, c)| *c) != Some(now) {
            seen.insert(uid, (key.clone(), now));
            drop(seen);
            self.dirty.push(key);
        }
    }

    async fn sync(&self, (ns, name): &Key) -> Result<(), kube::Error> {
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), ns);
        let d = match deployments.get(name).await {
            Ok(d) => d,
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(e),
        };
        if d.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let d = serde_json::to_value(&d).unwrap_or(Value::Null);
        let uid = d
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let replicas = d
            .pointer("/spec/replicas")
            .and_then(Value::as_u64)
            .unwrap_or(1) as usize;
        let selector = super::selectors::match_labels_query(&d);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let owned: Vec<Value> = pods
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .iter()
            .filter_map(|p| serde_json::to_value(p).ok())
            .filter(|p| controller_deployment(p).is_some_and(|(_, u)| u == uid))
            .collect();
        let plan = plan(replicas, &owned);
        if plan.create > 0 {
            let results: Vec<Result<(), kube::Error>> = stream::iter(0..plan.create)
                .map(|_| self.create_one(&pods, &d, name))
                .buffer_unordered(16)
                .collect()
                .await;
            results.into_iter().collect::<Result<Vec<()>, _>>()?;
        }
        for victim in &plan.delete {
            match pods.delete(victim, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn create_one(&self, pods: &Api<Pod>, d: &Value, name: &str) -> Result<(), kube::Error> {
        loop {
            let body = pod_from_template(d, &format!("{name}-{}", self.rng.suffix()));
            let pod: Pod = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
            match pods.create(&PostParams::default(), &pod).await {
                Ok(_) => return Ok(()),
                // The name is taken: draw another.
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, created: &str, node: Option<&str>, deleting: bool, phase: &str) -> Value {
        let mut p = json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {},
            "status": {"phase": phase},
        });
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        if deleting {
            p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:09Z");
        }
        p
    }

    #[test]
    fn pods_being_deleted_or_finished_are_replaced() {
        let owned = vec![
            pod("a", "2026-01-01T00:00:00Z", Some("n"), false, "Running"),
            pod("b", "2026-01-01T00:00:00Z", Some("n"), true, "Running"),
            pod("c", "2026-01-01T00:00:00Z", Some("n"), false, "Succeeded"),
            pod("d", "2026-01-01T00:00:00Z", None, false, "Pending"),
        ];
        assert_eq!(
            plan(4, &owned),
            Plan {
                create: 2,
                delete: vec![]
            }
        );
        assert_eq!(plan(2, &owned), Plan::default());
    }

    #[test]
    fn surplus_goes_unbound_first_then_newest() {
        let owned = vec![
            pod("old", "2026-01-01T00:00:00Z", Some("n"), false, "Running"),
            pod("new", "2026-01-01T00:00:05Z", Some("n"), false, "Running"),
            pod("mid", "2026-01-01T00:00:03Z", Some("n"), false, "Running"),
            pod("pending", "2026-01-01T00:00:01Z", None, false, "Pending"),
            pod("going", "2026-01-01T00:00:09Z", Some("n"), true, "Running"),
        ];
        assert_eq!(plan(2, &owned).delete, vec!["pending", "new"]);
        assert_eq!(plan(0, &owned).delete, vec!["pending", "new", "mid", "old"]);
    }

    fn with_cost(mut p: Value, cost: &str) -> Value {
        p["metadata"]["annotations"] = json!({"controller.kubernetes.io/pod-deletion-cost": cost});
        p
    }

    /// kube-controller-manager's ReplicaSet order: the deletion cost before co-location and
    /// age, after binding, phase and readiness.
    #[test]
    fn surplus_goes_by_deletion_cost_before_age() {
        let t = "2026-01-01T00:00:00Z";
        let owned = vec![
            with_cost(pod("cheap-old", t, Some("a"), false, "Running"), "-50"),
            pod(
                "plain-new",
                "2026-01-01T00:00:09Z",
                Some("b"),
                false,
                "Running",
            ),
            with_cost(
                pod("dear", "2026-01-01T00:00:09Z", Some("b"), false, "Running"),
                "100",
            ),
            with_cost(
                pod("bad", "2026-01-01T00:00:08Z", Some("b"), false, "Running"),
                "x",
            ),
            with_cost(pod("starting", t, Some("a"), false, "Pending"), "1000"),
        ];
        assert_eq!(
            plan(0, &owned).delete,
            vec!["starting", "cheap-old", "plain-new", "bad", "dear"]
        );
    }

    #[test]
    fn surplus_goes_from_the_node_with_most_of_the_pods_at_equal_cost() {
        let t = "2026-01-01T00:00:00Z";
        let owned = vec![
            pod("alone", "2026-01-01T00:00:09Z", Some("a"), false, "Running"),
            pod("crowded-1", t, Some("b"), false, "Running"),
            pod("crowded-2", t, Some("b"), false, "Running"),
        ];
        assert_eq!(plan(2, &owned).delete, vec!["crowded-2"]);
    }

    #[test]
    fn pods_come_from_the_template_with_an_owner() {
        let d = json!({
            "metadata": {"name": "web", "namespace": "apps", "uid": "u-1"},
            "spec": {"replicas": 2, "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            }},
        });
        let p = pod_from_template(&d, "web-x2b4z");
        assert_eq!(p["metadata"]["name"], "web-x2b4z");
        assert_eq!(p["metadata"]["namespace"], "apps");
        assert_eq!(p["metadata"]["labels"]["app"], "web");
        assert_eq!(p["metadata"]["annotations"]["a"], "b");
        assert_eq!(p["spec"]["containers"][0]["name"], "c");
        assert_eq!(controller_deployment(&p), Some(("web", "u-1")));
    }
}
