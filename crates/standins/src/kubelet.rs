//! Kubelet stand-in: every Machine with a provider ID gets a Node that registers the way a real
//! kubelet plus Cluster API would make it look — provider ID, propagated Machine labels, the
//! capacity of the machine its template makes (`sim::machine_size`; else the MachineDeployment's
//! scale-from-zero capacity), the MachineDeployment's scale-from-zero labels, the
//! `karpenter.sh/unregistered` taint, `Ready=False` and then `Ready=True` after a delay. The
//! Machine gets its `nodeRef`. Instances of MachinePools without MachinePool Machines register
//! the same way (`pool`).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, PostParams};
use kube::core::DynamicObject;
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::capi::CapiVersion;
use super::standin::{
    Clusters, Shutdown, WorkQueue, delete_quietly, log_retry, merge_patch, merge_status, retry,
    spawn_watch, str_at, watched,
};
use crate::wellknown::{
    ARCH_LABEL, CLUSTER_NAME_LABEL, HOSTNAME_LABEL, NOT_READY_TAINT_KEY, OS_LABEL,
    UNREGISTERED_TAINT_KEY, capi_propagates,
};

mod allocatable;
mod pool;
mod shape;
pub use shape::{NodeShape, parse_labels, parse_taints};

/// Marks Nodes this stand-in registered (so it never touches anybody else's Nodes).
pub const SIM_NODE_ANNOTATION: &str = "sim.karpenter.cluster.x-k8s.io/kubelet";
/// The device plugins register after `delay`: the Node's extended resources take their real
/// values.
async fn register_devices(
    shutdown: &Shutdown,
    delay: Duration,
    nodes: &Api<Node>,
    name: &str,
    extended: &BTreeMap<String, String>,
) {
    if shutdown.sleep(delay).await {
        let patch = json!({"status": {"capacity": extended, "allocatable": extended}});
        let _ = retry("node devices", shutdown, || {
            merge_status(nodes, name, &patch)
        })
        .await;
    }
}

/// Cluster API's annotations on a Node naming its Machine.
pub const NODE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/machine";
pub const NODE_CLUSTER_NAMESPACE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-namespace";

#[derive(Clone, Debug)]
pub struct KubeletConfig {
    pub version: CapiVersion,
    /// Time from Node creation to `Ready=True`.
    pub node_ready_delay: Duration,
    /// Time from Node creation until device plugins register extended resources (names with a
    /// domain, such as `nvidia.com/gpu`): until then the Node reports them as zero, as a real
    /// kubelet does. Zero: registered with the Node.
    pub device_plugin_delay: Duration,
    /// Stand in for kube-apiserver's `TaintNodesByCondition` admission and the node lifecycle
    /// controller: register Nodes with the `node.kubernetes.io/not-ready` taint and lift it once
    /// the Node is Ready (the simulated backend; a real control plane does both itself).
    pub not_ready_taint: bool,
    /// Cluster API's real manager runs (`--cluster-api real`): the kubelet only registers its
    /// Node (with the pressure conditions a kubelet reports, which Cluster API's NodeHealthy
    /// waits for) and leaves to Cluster API what the stand-in otherwise plays of it: the
    /// Machine's nodeRef and phase, the Node's Machine annotations, syncing Machine labels to
    /// the Node, and deleting the Node of a deleted Machine.
    pub cluster_api_real: bool,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            version: CapiVersion::default(),
            node_ready_delay: Duration::from_millis(100),
            device_plugin_delay: Duration::ZERO,
            not_ready_taint: false,
            cluster_api_real: false,
        }
    }
}

struct Inner {
    /// The management cluster's (Machines, MachineDeployments, templates).
    client: Client,
    /// The workload cluster's (Nodes).
    workload: Client,
    /// The only namespace watched in the management cluster, when it is shared.
    scope: Option<String>,
    cfg: KubeletConfig,
    queue: WorkQueue<(String, String)>,
    /// Nodes whose "become Ready" timer is running.
    readying: Mutex<HashSet<String>>,
    shutdown: Shutdown,
}

/// Node registrations in flight at once.
const REGISTRATION_WORKERS: usize = 16;

/// Starts the kubelet stand-in on the current runtime; every task stops on `shutdown`.
pub fn spawn(clusters: Clusters, cfg: KubeletConfig, shutdown: Shutdown) -> Vec<JoinHandle<()>> {
    let inner = Arc::new(Inner {
        client: clusters.management,
        workload: clusters.workload,
        scope: clusters.scope,
        cfg,
        queue: WorkQueue::default(),
        readying: Mutex::new(HashSet::new()),
        shutdown,
    });
    let mut tasks = Vec::new();

    let me = inner.clone();
    tasks.push(spawn_watch(
        "machines (kubelet)",
        watched(
            &inner.client,
            inner.scope.as_deref(),
            &inner.cfg.version.machine(),
        ),
        inner.shutdown.clone(),
        move |event| me.on_machine_event(event),
    ));

    tasks.extend(pool::spawn(&inner));

    let me = inner.clone();
    tasks.push(spawn_watch(
        "nodes (kubelet)",
        Api::<Node>::all(inner.workload.clone()),
        inner.shutdown.clone(),
        move |event| {
            if let Event::Apply(node) | Event::InitApply(node) = event {
                me.on_node(node);
            }
        },
    ));

    // Every real kubelet registers its own Node, so registrations run side by side; a single
    // worker would let one slow request chain hold back every Node behind it.
    for _ in 0..REGISTRATION_WORKERS {
        let me = inner.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(key) = me.queue.pop(&me.shutdown).await {
                let registered = me.register(&key.0, &key.1).await;
                me.queue.done(&key);
                if let Err(err) = registered {
                    log_retry(
                        "kubelet stand-in: registration",
                        &format!("Machine {}/{}", key.0, key.1),
                        &err,
                    );
                    if me.shutdown.sleep(Duration::from_millis(50)).await {
                        me.queue.push(key);
                    }
                }
            }
        }));
    }
    tasks
}

impl Inner {
    fn on_machine_event(self: &Arc<Self>, event: Event<DynamicObject>) {
        match event {
            Event::Apply(m) | Event::InitApply(m) => {
                if m.metadata.deletion_timestamp.is_none() && provider_id(&m).is_some() {
                    self.queue
                        .push((m.namespace().unwrap_or_default(), m.name_any()));
                }
            }
            Event::Delete(m) if !self.cfg.cluster_api_real => {
                let me = self.clone();
                tokio::spawn(async move { me.forget_machine(m).await });
            }
            Event::Delete(_) => {}
            Event::Init | Event::InitDone => {}
        }
    }

    fn on_node(self: &Arc<Self>, node: Node) {
        let ours = node.annotations().contains_key(SIM_NODE_ANNOTATION);
        if !ours || node.metadata.deletion_timestamp.is_some() || node_ready(&node) {
            return;
        }
        let name = node.name_any();
        if self.readying.lock().insert(name.clone()) {
            let me = self.clone();
            tokio::spawn(async move { me.become_ready(name).await });
        }
    }

    /// Ensures the Node of Machine `ns/name` exists, carries the propagated labels, and that
    /// the Machine points at it.
    async fn register(&self, ns: &str, name: &str) -> Result<(), kube::Error> {
        let machines = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            ns,
            &self.cfg.version.machine(),
        );
        let Some(machine) = machines.get_opt(name).await? else {
            return Ok(());
        };
        let Some(pid) = provider_id(&machine) else {
            return Ok(());
        };
        if machine.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let nodes: Api<Node> = Api::all(self.workload.clone());
        // A Machine that has a Node already names it (a cluster loaded from elsewhere names its
        // Nodes as its cloud does); a new one gets a Node named after it.
        let node_name = str_at(&machine.data, &["status", "nodeRef", "name"]).unwrap_or(name);
        let node = match nodes.get_opt(node_name).await? {
            Some(node) if self.cfg.cluster_api_real => node,
            Some(node) => {
                self.sync_labels(&nodes, &machine, &node).await?;
                node
            }
            None => {
                let node = self.create_node(&nodes, &machine, pid).await?;
                // The Machine may have gone while its Node was created, and the Node's removal
                // with it (`forget_machine` found no Node yet): the cloud's node lifecycle
                // controller removes a Node whose instance is gone.
                let gone = machines
                    .get_opt(name)
                    .await?
                    .is_none_or(|m| m.metadata.deletion_timestamp.is_some());
                if gone {
                    delete_quietly(&nodes, name).await?;
                    return Ok(());
                }
                node
            }
        };
        if !self.cfg.cluster_api_real
            && str_at(&machine.data, &["status", "nodeRef", "name"]).is_none()
        {
            let node_ref = match self.cfg.version {
                CapiVersion::V1Beta1 => json!({
                    "apiVersion": "v1", "kind": "Node",
                    "name": node.name_any(), "uid": node.uid().unwrap_or_default(),
                }),
                CapiVersion::V1Beta2 => json!({"name": node.name_any()}),
            };
            let patch = json!({"status": {"nodeRef": node_ref, "phase": "Running"}});
            merge_status(&machines, name, &patch).await?;
            tracing::debug!(machine = %name, "nodeRef set");
        }
        Ok(())
    }

    async fn create_node(
        &self,
        nodes: &Api<Node>,
        machine: &DynamicObject,
        pid: &str,
    ) -> Result<Node, kube::Error> {
        let name = machine.name_any();
        let ns = machine.namespace().unwrap_or_default();
        let shape = self.shape_of(machine).await;
        let mut labels: BTreeMap<String, String> = machine
            .labels()
            .iter()
            .filter(|(k, _)| capi_propagates(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.extend(shape.labels.clone());
        labels.insert(HOSTNAME_LABEL.into(), name.clone());
        labels
            .entry(ARCH_LABEL.into())
            .or_insert_with(|| shape.arch.clone());
        labels
            .entry(OS_LABEL.into())
            .or_insert_with(|| shape.os.clone());
        let mut taints = vec![json!({"key": UNREGISTERED_TAINT_KEY, "effect": "NoExecute"})];
        taints.extend(shape.taints.iter().cloned());
        if self.cfg.not_ready_taint {
            // What kube-apiserver's TaintNodesByCondition admission adds to every new Node.
            taints.push(json!({"key": NOT_READY_TAINT_KEY, "effect": "NoSchedule"}));
        }
        let mut annotations =
            BTreeMap::from([(SIM_NODE_ANNOTATION.to_string(), "true".to_string())]);
        // Cluster API's annotations naming the Machine: the real manager writes its own.
        if !self.cfg.cluster_api_real {
            annotations.insert(NODE_CLUSTER_NAMESPACE_ANNOTATION.to_string(), ns);
            // An instance of a pool without MachinePool Machines has no Machine to name.
            if machine
                .types
                .as_ref()
                .is_none_or(|t| t.kind != pool::INSTANCE_KIND)
            {
                annotations.insert(NODE_MACHINE_ANNOTATION.to_string(), name.clone());
            }
            if let Some(cluster) = machine.labels().get(CLUSTER_NAME_LABEL) {
                annotations.insert("cluster.x-k8s.io/cluster-name".into(), cluster.clone());
            }
        }
        let body = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"providerID": pid, "taints": taints},
        });
        let node: Node = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
        let created = match nodes.create(&PostParams::default(), &node).await {
            Ok(n) => n,
            // Created by an earlier attempt whose response got lost.
            Err(kube::Error::Api(s)) if s.code == 409 => nodes.get(&name).await?,
            Err(err) => return Err(err),
        };
        let kubelet_version = str_at(&machine.data, &["spec", "version"])
            .unwrap_or("v1.33.0")
            .to_string();
        // Extended resources start at zero while a device plugin is still to register.
        let plugins_later = !self.cfg.device_plugin_delay.is_zero();
        let extended: BTreeMap<String, String> = shape
            .capacity
            .iter()
            .filter(|(k, _)| plugins_later && k.contains('/'))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut registered = shape.capacity.clone();
        for k in extended.keys() {
            registered.insert(k.clone(), "0".into());
        }
        let status = json!({"status": {
            "capacity": registered,
            "allocatable": allocatable::allocatable(&registered),
            "conditions": self.conditions(condition("False", "KubeletNotReady", "container runtime starting")),
            "nodeInfo": {
                "architecture": shape.arch, "operatingSystem": shape.os,
                "kubeletVersion": kubelet_version, "kubeProxyVersion": kubelet_version,
                "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                "osImage": "", "containerRuntimeVersion": "",
            },
            "addresses": [{"type": "Hostname", "address": name}],
            "phase": "Running",
        }});
        merge_status(nodes, &name, &status).await?;
        tracing::debug!(node = %name, provider_id = pid, "node registered");
        if !extended.is_empty() {
            let (shutdown, delay) = (self.shutdown.clone(), self.cfg.device_plugin_delay);
            let (nodes, name) = (nodes.clone(), name.clone());
            tokio::spawn(async move {
                register_devices(&shutdown, delay, &nodes, &name, &extended).await
            });
        }
        Ok(created)
    }

    /// The Node's conditions with `ready`: with Cluster API's real manager, also the pressure
    /// conditions a kubelet reports (False), without which Cluster API's NodeHealthy stays
    /// Unknown and no Machine becomes Available. (A merge patch replaces the whole list.)
    fn conditions(&self, ready: Value) -> Vec<Value> {
        let mut all = vec![ready];
        if self.cfg.cluster_api_real {
            let now = jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            for (kind, reason) in [
                ("MemoryPressure", "KubeletHasSufficientMemory"),
                ("DiskPressure", "KubeletHasNoDiskPressure"),
                ("PIDPressure", "KubeletHasSufficientPID"),
            ] {
                all.push(json!({
                    "type": kind, "status": "False", "reason": reason,
                    "message": format!("kubelet reports no {kind}"),
                    "lastHeartbeatTime": now, "lastTransitionTime": now,
                }));
            }
        }
        all
    }

    /// Cluster API keeps propagated Machine labels in sync on the Node (the controller's
    /// member label arrives after the Node exists).
    async fn sync_labels(
        &self,
        nodes: &Api<Node>,
        machine: &DynamicObject,
        node: &Node,
    ) -> Result<(), kube::Error> {
        let missing: BTreeMap<&String, &String> = machine
            .labels()
            .iter()
            .filter(|(k, v)| capi_propagates(k) && node.labels().get(*k) != Some(*v))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        merge_patch(
            nodes,
            &node.name_any(),
            &json!({"metadata": {"labels": missing}}),
        )
        .await
    }

    async fn become_ready(self: Arc<Self>, name: String) {
        if self.shutdown.sleep(self.cfg.node_ready_delay).await {
            let nodes: Api<Node> = Api::all(self.workload.clone());
            let patch = json!({"status": {
                "conditions": self.conditions(condition("True", "KubeletReady", "kubelet is posting ready status")),
            }});
            let _ = retry("node ready", &self.shutdown, || {
                merge_status(&nodes, &name, &patch)
            })
            .await;
            tracing::debug!(node = %name, "node Ready");
            if self.cfg.not_ready_taint {
                let _ = retry("node not-ready taint", &self.shutdown, || {
                    lift_not_ready(&nodes, &name)
                })
                .await;
            }
            self.readying.lock().remove(&name);
            // A Node marked not Ready by someone else (node lifecycle, when a lease was late)
            // while this ran got no new timer: its event found this one running. A kubelet
            // posts its own Ready again at its next status update, so look once more.
            if let Ok(Some(node)) = nodes.get_opt(&name).await {
                self.on_node(node);
            }
            return;
        }
        self.readying.lock().remove(&name);
    }

    /// The Machine is gone: its Node goes too (only the Node we registered for it).
    async fn forget_machine(self: Arc<Self>, machine: DynamicObject) {
        let Some(pid) = provider_id(&machine) else {
            return;
        };
        let name = str_at(&machine.data, &["status", "nodeRef", "name"])
            .map(str::to_string)
            .unwrap_or_else(|| machine.name_any());
        let nodes: Api<Node> = Api::all(self.workload.clone());
        let node = match retry("node get", &self.shutdown, || nodes.get(&name)).await {
            Ok(n) => n,
            Err(_) => return,
        };
        if node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(pid) {
            let _ = retry("node delete", &self.shutdown, || {
                delete_quietly(&nodes, &name)
            })
            .await;
        }
    }
}

fn provider_id(m: &DynamicObject) -> Option<&str> {
    str_at(&m.data, &["spec", "providerID"]).filter(|p| !p.is_empty())
}

pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn condition(status: &str, reason: &str, message: &str) -> Value {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    json!({
        "type": "Ready", "status": status, "reason": reason, "message": message,
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    })
}

/// Nodes this stand-in registered, by name (for tests and reports).
pub async fn sim_nodes(client: &Client) -> Result<Vec<Node>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|n| n.annotations().contains_key(SIM_NODE_ANNOTATION))
        .collect())
}

/// Removes the not-ready taint from a Ready Node, as the node lifecycle controller does. The
/// Node is replaced at the version read, so a concurrent taint change (the controller lifting
/// its unregistered taint) is a conflict to retry, never overwritten.
async fn lift_not_ready(nodes: &Api<Node>, name: &str) -> Result<(), kube::Error> {
    let mut node = nodes.get(name).await?;
    let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) else {
        return Ok(());
    };
    let before = taints.len();
    taints.retain(|t| t.key != NOT_READY_TAINT_KEY);
    if taints.len() == before {
        return Ok(());
    }
    nodes
        .replace(name, &PostParams::default(), &node)
        .await
        .map(drop)
}
