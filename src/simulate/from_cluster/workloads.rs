//! What kube-controller-manager does for the loaded pods: a pod of a ReplicaSet, StatefulSet,
//! ReplicationController or unfinished Job that is deleted (evicted by a drain) comes back
//! pending, as its controller would recreate it. The workload controllers themselves are not
//! loaded (the simulated cluster runs none for them), so without this a consolidation would
//! look cheaper than it is: the pods it evicts would simply vanish.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};

use crate::simulate::BackgroundSim;

/// Owner kinds whose pods come back.
const RECREATED_BY: &[&str] = &["ReplicaSet", "StatefulSet", "ReplicationController", "Job"];

/// Starts recreating deleted pods on the simulated cluster's runtime (until it stops).
pub fn spawn(sim: &BackgroundSim) {
    sim.spawn(|c| async move {
        let client = c.client();
        let pods: Api<Pod> = Api::all(client.clone());
        let mut events = std::pin::pin!(watcher::watcher(pods, watcher::Config::default()));
        while let Some(event) = events.next().await {
            let Ok(Event::Delete(pod)) = event else {
                continue;
            };
            let Ok(old) = serde_json::to_value(&pod) else {
                continue;
            };
            let Some(new) = replacement(&old).and_then(|p| serde_json::from_value::<Pod>(p).ok())
            else {
                continue;
            };
            let ns = old["metadata"]["namespace"].as_str().unwrap_or("default");
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            if let Err(e) = api.create(&PostParams::default(), &new).await {
                tracing::debug!(error = %e, "from-cluster: recreating a deleted pod");
            }
        }
    });
}

/// The pending pod a workload controller makes for `old`, None when none does.
fn replacement(old: &Value) -> Option<Value> {
    let owner = old["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"] == true)?;
    let kind = owner["kind"].as_str()?;
    let finished = matches!(
        old["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    if !RECREATED_BY.contains(&kind) || (kind == "Job" && finished) {
        return None;
    }
    let mut meta = json!({
        "namespace": old["metadata"]["namespace"],
        "labels": old["metadata"]["labels"],
        "annotations": old["metadata"]["annotations"],
        "ownerReferences": [owner],
    });
    // A StatefulSet's pod keeps its name; the others get a new one.
    match kind {
        "StatefulSet" => meta["name"] = old["metadata"]["name"].clone(),
        _ => meta["generateName"] = json!(format!("{}-", owner["name"].as_str()?)),
    }
    let mut spec = old["spec"].clone();
    if let Some(s) = spec.as_object_mut() {
        s.remove("nodeName");
    }
    Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_set_pod_comes_back_pending_and_a_daemon_set_pod_does_not() {
        let pod = |kind: &str| {
            json!({"metadata": {"name": "web-abc", "namespace": "shop", "labels": {"app": "web"},
                   "ownerReferences": [{"kind": kind, "name": "web-5d", "controller": true}]},
                   "spec": {"nodeName": "n1", "containers": []}, "status": {"phase": "Running"}})
        };
        let new = replacement(&pod("ReplicaSet")).expect("recreated");
        assert_eq!(new["metadata"]["generateName"], "web-5d-");
        assert!(new["spec"]["nodeName"].is_null());
        assert_eq!(new["metadata"]["labels"]["app"], "web");
        assert_eq!(
            replacement(&pod("StatefulSet")).expect("recreated")["metadata"]["name"],
            "web-abc"
        );
        assert!(replacement(&pod("DaemonSet")).is_none());
    }
}
