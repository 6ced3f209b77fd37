//! The Machine controller and the infrastructure provider behind it: a provider ID after a
//! delay (with jitter and stuck Machines), and deletion behind the Machine finalizer after the
//! Node's drain.

use super::Inner;
use super::MACHINE_FINALIZER;
use super::ProviderIdStyle;
use super::ns_of;
use crate::capi_version::CapiVersion;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, PostParams};
use kube::core::DynamicObject;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::standin::{GaveUp, SimRng, delete_quietly, merge_patch, merge_status, retry, str_at};
use crate::wellknown::{EXCLUDE_NODE_DRAINING_ANNOTATION, SET_NAME_LABEL, ZONE_LABEL};

impl Inner {
    /// Whether the Machine's MachineSet (as the cache last saw it) says its launches fail
    /// (`FAIL_LAUNCHES_ANNOTATION`). Read from the cache: no request per Machine.
    fn launches_fail(&self, ns: &str, machine: &DynamicObject) -> bool {
        let Some(set) = machine.labels().get(SET_NAME_LABEL) else {
            return false;
        };
        self.sets
            .find(|s| s.name_any() == *set && s.namespace().as_deref() == Some(ns))
            .is_some_and(|s| {
                s.annotations()
                    .get(super::FAIL_LAUNCHES_ANNOTATION)
                    .is_some_and(|v| v == "true")
            })
    }

    pub(super) async fn provision(self: Arc<Self>, ns: String, machine: DynamicObject) {
        let name = machine.name_any();
        let api = self.api(&self.cfg.version.machine(), &ns);
        if !self.hold_while_paused(&ns, &machine).await {
            return;
        }
        // Phases go Pending -> Provisioning in this one task, so no other writer can reorder them.
        if str_at(&machine.data, &["status", "phase"]).is_none() {
            let pending = json!({"status": {"phase": "Pending"}});
            if retry("machine pending", &self.shutdown, || {
                merge_status(&api, &name, &pending)
            })
            .await
            .is_err()
            {
                return;
            }
        }
        let mut status = json!({"status": {"phase": "Provisioning"}});
        if self.cfg.version == CapiVersion::V1Beta1 {
            status["status"]["bootstrapReady"] = json!(true);
        } else {
            status["status"]["initialization"] = json!({"bootstrapDataSecretCreated": true});
        }
        let write = retry("machine provisioning", &self.shutdown, || {
            merge_status(&api, &name, &status)
        })
        .await;
        if write.is_err() {
            return;
        }
        if self.rng.chance(self.cfg.fail_fraction) || self.launches_fail(&ns, &machine) {
            tracing::info!(machine = %name, "simulated provider: this Machine never gets a providerID");
            return;
        }
        let delay = self.rng.delay(self.cfg.provider_delay, self.cfg.jitter);
        if !self.shutdown.sleep(delay).await {
            return;
        }
        let provider_id = provider_id(self.cfg.provider_id_style, &self.rng, &machine);
        let fresh = match retry("machine get", &self.shutdown, || api.get(&name)).await {
            Ok(m) => m,
            Err(_) => return,
        };
        if fresh.metadata.deletion_timestamp.is_some() {
            return;
        }
        // A pause that came during the launch holds the provider ID back too.
        if !self.hold_while_paused(&ns, &fresh).await {
            return;
        }
        let spec = json!({"spec": {"providerID": provider_id}});
        if retry("machine providerID", &self.shutdown, || {
            merge_patch(&api, &name, &spec)
        })
        .await
        .is_err()
        {
            return;
        }
        if let Some(stats) = &self.cfg.stats {
            stats.milestone(PROVIDER_ID_SET, &ns_of(&machine), &name);
        }
        // The kubelet stand-in may already have set nodeRef and phase Running; a read-modify-
        // write with the resourceVersion as precondition keeps that later phase.
        let v1beta1 = self.cfg.version == CapiVersion::V1Beta1;
        let _ = retry("machine provisioned", &self.shutdown, || async {
            let mut m = api.get(&name).await?;
            let mut status = m
                .data
                .get("status")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            if !status.contains_key("nodeRef") {
                status.insert("phase".into(), json!("Provisioned"));
            }
            if v1beta1 {
                status.insert("infrastructureReady".into(), json!(true));
            } else {
                let init = status.entry("initialization").or_insert_with(|| json!({}));
                if let Some(init) = init.as_object_mut() {
                    init.insert("infrastructureProvisioned".into(), json!(true));
                }
            }
            if let Some(data) = m.data.as_object_mut() {
                data.insert("status".into(), Value::Object(status));
            }
            api.replace_status(&name, &PostParams::default(), &m)
                .await
                .map(|_| ())
        })
        .await;
        tracing::debug!(machine = %name, %provider_id, "provider ID set");
    }

    /// Cluster API's drain of a deleted Machine's Node: cordon it, evict (PodDisruptionBudgets
    /// apply) every pod but DaemonSet and mirror pods, and wait until they are gone, at most
    /// `timeout` (`nodeDrainTimeout`; without one, Cluster API waits for ever, the stand-in 2
    /// minutes). Without the cordon the scheduler binds the evicted pods' replacements back onto
    /// the Node, and the drain runs until its timeout deletes the Node under them.
    async fn drain_node(&self, node: &str, timeout: Option<Duration>) {
        use k8s_openapi::api::core::v1::Pod;
        let pods: Api<Pod> = Api::all(self.workload.clone());
        let nodes: Api<Node> = Api::all(self.workload.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let until = tokio::time::Instant::now() + timeout.unwrap_or(Duration::from_secs(120));
        let mut cordoned = false;
        while tokio::time::Instant::now() < until {
            if !cordoned {
                let cordon = json!({"spec": {"unschedulable": true}});
                match merge_patch(&nodes, node, &cordon).await {
                    Ok(()) => cordoned = true,
                    // Deleted by someone else: nothing is left to drain.
                    Err(kube::Error::Api(s)) if s.code == 404 => return,
                    // Retried on the next round, as Cluster API requeues a failed cordon.
                    Err(_) => {}
                }
            }
            let Ok(list) = pods.list(&lp).await else {
                if !self.shutdown.sleep(Duration::from_millis(200)).await {
                    return;
                }
                continue;
            };
            let left: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| {
                    let daemon = p
                        .owner_references()
                        .iter()
                        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
                    let mirror = p.annotations().contains_key("kubernetes.io/config.mirror");
                    let finished = matches!(
                        p.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded" | "Failed")
                    );
                    !daemon && !mirror && !finished
                })
                .collect();
            if left.is_empty() {
                return;
            }
            for p in left
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
            {
                let ns = p.namespace().unwrap_or_default();
                let body = json!({
                    "apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": p.name_any(), "namespace": ns},
                });
                // A budget's 429 is retried on the next round, as Cluster API does.
                let _ = Api::<Pod>::namespaced(self.workload.clone(), &ns)
                    .create_subresource::<Value, Value>(
                        "eviction",
                        &p.name_any(),
                        &PostParams::default(),
                        &body,
                    )
                    .await;
            }
            if !self.shutdown.sleep(Duration::from_millis(200)).await {
                return;
            }
        }
        tracing::debug!(node = %node, "cluster api stand-in: drain timed out; deleting the node anyway");
    }

    pub(super) async fn delete_machine(self: Arc<Self>, ns: String, name: String) {
        let api = self.api(&self.cfg.version.machine(), &ns);
        // Cluster API deletes nothing of a paused Machine: it stays, finalizer and all.
        match retry("machine get", &self.shutdown, || api.get(&name)).await {
            Ok(m) if self.hold_while_paused(&ns, &m).await => {}
            _ => return,
        }
        let deleting = json!({"status": {"phase": "Deleting"}});
        if retry("machine deleting", &self.shutdown, || {
            merge_status(&api, &name, &deleting)
        })
        .await
        .is_err()
        {
            return;
        }
        if !self.shutdown.sleep(self.cfg.node_delete_delay).await {
            return;
        }
        let nodes: Api<Node> = Api::all(self.workload.clone());
        let machine = match retry("machine get", &self.shutdown, || api.get(&name)).await {
            Ok(m) => m,
            Err(_) => return,
        };
        if let Some(node) = str_at(&machine.data, &["status", "nodeRef", "name"]) {
            // Cluster API drains the Node first, unless told the drain was done already.
            if !machine
                .annotations()
                .contains_key(EXCLUDE_NODE_DRAINING_ANNOTATION)
            {
                self.drain_node(node, drain_timeout(&machine.data)).await;
            }
            let deleted = retry("node delete", &self.shutdown, || {
                delete_quietly(&nodes, node)
            })
            .await;
            if deleted == Err(GaveUp::Shutdown) {
                return;
            }
        }
        // Remove only our finalizer, with the resourceVersion as precondition (409 => re-read).
        let _ = retry("machine finalizer", &self.shutdown, || async {
            let mut m = api.get(&name).await?;
            let before = m.finalizers().len();
            m.finalizers_mut().retain(|f| f != MACHINE_FINALIZER);
            if m.finalizers().len() != before {
                api.replace(&name, &PostParams::default(), &m).await?;
            }
            Ok(())
        })
        .await;
        tracing::debug!(machine = %name, "Machine finalizer removed");
    }
}

/// A Machine's drain timeout: v1beta1 `spec.nodeDrainTimeout` (a duration), v1beta2
/// `spec.deletion.nodeDrainTimeoutSeconds`.
fn drain_timeout(machine: &Value) -> Option<Duration> {
    if let Some(secs) = machine
        .pointer("/spec/deletion/nodeDrainTimeoutSeconds")
        .and_then(Value::as_u64)
    {
        return Some(Duration::from_secs(secs));
    }
    machine
        .pointer("/spec/nodeDrainTimeout")
        .and_then(Value::as_str)
        .and_then(crate::duration::parse)
}

/// A provider ID in the configured provider's spelling.
/// Milestone recorded when the simulated provider sets a Machine's provider ID.
pub const PROVIDER_ID_SET: &str = "provider-id-set";

pub fn provider_id(style: ProviderIdStyle, rng: &SimRng, machine: &DynamicObject) -> String {
    let zone = str_at(&machine.data, &["spec", "failureDomain"])
        .or_else(|| machine.labels().get(ZONE_LABEL).map(String::as_str));
    provider_id_for(style, rng, &machine.name_any(), zone)
}

/// The provider ID of instance `name` in zone `zone` (AWS's spelling needs one; default
/// `us-east-1a`).
pub fn provider_id_for(
    style: ProviderIdStyle,
    rng: &SimRng,
    name: &str,
    zone: Option<&str>,
) -> String {
    match style {
        ProviderIdStyle::Kubemark => format!("kubemark://{name}"),
        ProviderIdStyle::Aws => {
            let zone = zone.unwrap_or("us-east-1a");
            format!("aws:///{zone}/i-{}", rng.hex(17))
        }
        ProviderIdStyle::Vsphere => {
            let h = rng.hex(32);
            format!(
                "vsphere://{}-{}-4{}-a{}-{}",
                &h[0..8],
                &h[8..12],
                &h[13..16],
                &h[17..20],
                &h[20..32]
            )
        }
    }
}
