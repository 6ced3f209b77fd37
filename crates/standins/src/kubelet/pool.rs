//! The kubelets of MachinePool instances that have no Machine (pools without MachinePool
//! Machines): each instance with a provider ID registers its Node, named after the instance, with
//! the pool template's propagated labels and the pool's scale-from-zero shape. The instance's
//! termination removes the Node (the pool stand-in does that, as a cloud's node lifecycle would).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::core::DynamicObject;
use kube::runtime::watcher::Event;
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;

use super::Inner;
use crate::capi::{dynamic, has_pool_machines, infra_pool_resource, instances, string_map};
use crate::standin::{WorkQueue, at, delete_quietly, log_retry, spawn_watch, str_at};
use crate::wellknown::{CLUSTER_NAME_LABEL, POOL_NAME_LABEL};

/// The kind of the stand-in object an instance's Node is registered from (never stored).
pub(super) const INSTANCE_KIND: &str = "PoolInstance";

/// Starts the watch of MachinePools and one registration worker.
pub(super) fn spawn(inner: &Arc<Inner>) -> Vec<JoinHandle<()>> {
    let queue: Arc<WorkQueue<(String, String)>> = Arc::new(WorkQueue::default());
    let q = queue.clone();
    let watch = spawn_watch(
        "machinepools (kubelet)",
        crate::standin::watched(
            &inner.client,
            inner.scope.as_deref(),
            &inner.cfg.version.machine_pool(),
        ),
        inner.shutdown.clone(),
        move |event| {
            if let Event::Apply(mp) | Event::InitApply(mp) = event {
                q.push((mp.namespace().unwrap_or_default(), mp.name_any()));
            }
        },
    );
    let me = inner.clone();
    let worker = tokio::spawn(async move {
        while let Some(key) = queue.pop(&me.shutdown).await {
            let result = me.register_instances(&key.0, &key.1).await;
            queue.done(&key);
            if let Err(err) = result {
                let subject = format!("MachinePool {}/{}", key.0, key.1);
                log_retry("kubelet stand-in: pool instances", &subject, &err);
                if me.shutdown.sleep(Duration::from_millis(50)).await {
                    queue.push(key);
                }
            }
        }
    });
    vec![watch, worker]
}

impl Inner {
    /// Registers a Node for each instance of pool `ns/name` that has a provider ID and none yet.
    async fn register_instances(&self, ns: &str, name: &str) -> Result<(), kube::Error> {
        let pools = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            ns,
            &self.cfg.version.machine_pool(),
        );
        let Some(mp) = pools.get_opt(name).await? else {
            return Ok(());
        };
        let infra_api =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &infra_pool_resource());
        let Some(infra_name) = str_at(
            &mp.data,
            &["spec", "template", "spec", "infrastructureRef", "name"],
        ) else {
            return Ok(());
        };
        let Some(infra) = infra_api.get_opt(infra_name).await? else {
            return Ok(());
        };
        if has_pool_machines(&infra) {
            return Ok(());
        }
        let nodes: Api<Node> = Api::all(self.workload.clone());
        for instance in instances(&infra) {
            let Some(pid) = instance.provider_id.as_deref() else {
                continue;
            };
            if nodes.get_opt(&instance.instance_name).await?.is_some() {
                continue;
            }
            let source = instance_source(&mp, &instance.instance_name, pid);
            self.create_node(&nodes, &source, pid).await?;
            // Terminated while its Node registered: the Node goes with it.
            let still_there = infra_api.get_opt(infra_name).await?.is_some_and(|i| {
                instances(&i)
                    .iter()
                    .any(|x| x.instance_name == instance.instance_name)
            });
            if !still_there {
                delete_quietly(&nodes, &instance.instance_name).await?;
            }
        }
        Ok(())
    }
}

/// What an instance's Node registers from: the pool template's labels (with the pool and
/// cluster names) and Kubernetes version, in a Machine-like shape `create_node` reads.
fn instance_source(mp: &DynamicObject, instance: &str, pid: &str) -> DynamicObject {
    let template = at(&mp.data, &["spec", "template"]);
    let mut labels = string_map(template.and_then(|t| at(t, &["metadata", "labels"])));
    labels.insert(POOL_NAME_LABEL.into(), mp.name_any());
    if let Some(cluster) = str_at(&mp.data, &["spec", "clusterName"]) {
        labels.insert(CLUSTER_NAME_LABEL.into(), cluster.to_string());
    }
    let version = template.and_then(|t| str_at(t, &["spec", "version"]));
    dynamic(json!({
        "apiVersion": "sim.karpenter.cluster.x-k8s.io/v1",
        "kind": INSTANCE_KIND,
        "metadata": {"name": instance, "namespace": mp.namespace(), "labels": labels},
        "spec": {"providerID": pid, "version": version},
    }))
}
