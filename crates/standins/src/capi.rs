//! Cluster API stand-in: MachineDeployment -> MachineSets (one per template revision, rolled
//! out by RollingUpdate or OnDelete as planned in `rollout.rs`) -> Machines, MachinePools (with
//! or without MachinePool Machines, `machine_pool`), a provider that assigns
//! provider IDs after a delay (with jitter and stuck Machines), MachineSet scale-down order and
//! Machine deletion behind the `machine.cluster.x-k8s.io` finalizer, and the provider's
//! templates publishing their machine size (`sim::machine_size`). One file per Cluster API
//! controller it stands in for: `machine_deployment`, `machine_set`, `machine_pool` and
//! `machine` (with the infrastructure provider).
//!
//! One reconcile worker handles MachineDeployments and MachineSets one at a time, reading fresh
//! state from the API server on every pass: a reconcile never acts on a stale cache, so it
//! never creates a Machine twice. Per-Machine provider work (the delay, the provider ID, the
//! deletion) runs in its own small task so a slow provider never blocks the worker.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

mod cache;
pub mod cloud_pool;
mod conditions;
mod machine;
mod machine_deployment;
mod machine_pool;
mod machine_set;
mod paused;
pub mod preflight;

pub use machine::{PROVIDER_ID_SET, provider_id, provider_id_for};
pub use machine_deployment::up_to_date;
pub use machine_pool::{
    INFRA_MACHINE_KIND, INFRA_POOL_KIND, INSTANCE_REFRESH_ANNOTATION, Instance,
    POOL_MACHINES_ANNOTATION, has_pool_machines, infra_pool_resource, instances,
};
pub use preflight::{CONTROL_PLANE_KIND, CONTROL_PLANE_UPGRADING_ANNOTATION};

use super::standin::{
    Clusters, Shutdown, SimRng, WorkQueue, at, is_not_found, log_retry, spawn_watch, str_at,
    watched,
};
use crate::wellknown::{DEPLOYMENT_NAME_LABEL, POOL_NAME_LABEL, SET_NAME_LABEL};

/// Finalizer Cluster API puts on every Machine.
pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
/// Label tying a MachineSet and its Machines to one template revision.
pub const TEMPLATE_HASH_LABEL: &str = "machine-template-hash";
/// Annotation on a MachineDeployment (carried to its MachineSets, as Cluster API carries the
/// MachineDeployment's annotations): while "true", the provider never finishes its new Machines
/// (no provider ID), as `fail_fraction` 1 would, for this offering alone and settable while the
/// cluster runs. A test's offering whose launches fail.
pub const FAIL_LAUNCHES_ANNOTATION: &str = "sim.karpenter.cluster.x-k8s.io/fail-launches";

pub use crate::capi_version::CapiVersion;

/// How the simulated infrastructure provider spells provider IDs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderIdStyle {
    /// `kubemark://<machine>`
    #[default]
    Kubemark,
    /// `aws:///<zone>/i-<17 hex>`
    Aws,
    /// `vsphere://<uuid>`
    Vsphere,
}

#[derive(Clone, Debug)]
pub struct CapiConfig {
    pub version: CapiVersion,
    /// Time from Machine creation to provider ID (before jitter).
    pub provider_delay: Duration,
    /// Uniform extra delay in `[0, jitter]`.
    pub jitter: Duration,
    /// Fraction of Machines the provider never finishes (stuck in Provisioning).
    pub fail_fraction: f64,
    /// Time from a Machine's deletionTimestamp to deleting its Node and releasing the finalizer.
    pub node_delete_delay: Duration,
    pub provider_id_style: ProviderIdStyle,
    pub seed: u64,
    /// Where to record "provider-id-set" milestones (the server's clock).
    pub stats: Option<crate::Stats>,
}

impl Default for CapiConfig {
    fn default() -> Self {
        Self {
            version: CapiVersion::default(),
            provider_delay: Duration::from_millis(200),
            jitter: Duration::from_millis(100),
            fail_fraction: 0.0,
            node_delete_delay: Duration::from_millis(50),
            provider_id_style: ProviderIdStyle::default(),
            seed: 1,
            stats: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Work {
    Deployment {
        ns: String,
        name: String,
    },
    Set {
        ns: String,
        name: String,
    },
    Pool {
        ns: String,
        name: String,
    },
    /// An infrastructure pool changed: its MachinePools reconcile (a rollout may be due).
    InfraPool {
        ns: String,
        name: String,
    },
}

struct Inner {
    /// The management cluster's (Cluster API's objects).
    client: Client,
    /// The workload cluster's (the Nodes Cluster API drains and deletes).
    workload: Client,
    /// The only namespace watched in the management cluster, when it is shared.
    scope: Option<String>,
    cfg: CapiConfig,
    rng: SimRng,
    queue: WorkQueue<Work>,
    /// Machines (by uid) whose provider task has started, so a Machine is provisioned once.
    provisioning: Mutex<HashSet<String>>,
    /// Machines (by uid) whose deletion task has started.
    deleting: Mutex<HashSet<String>>,
    /// Instances of pools without MachinePool Machines still launching, by (namespace, name):
    /// when their provider ID is due (`None`: never, a stuck instance).
    launching: Mutex<HashMap<(String, String), Option<tokio::time::Instant>>>,
    /// What each MachinePool Machine's instance was made from, by (namespace, Machine name):
    /// the provider's own record (a container's image), compared with the pool's current
    /// spec to find the outdated instances a rollout replaces.
    pool_instance_specs: Mutex<HashMap<(String, String), Value>>,
    /// Whether each Machine (by uid) was available when last seen: only a change of that (or
    /// a deletion) can let a rollout take its next step, so only that wakes the Deployment.
    available: Mutex<HashMap<String, bool>>,
    /// Cluster API's informer caches: Machines and MachineSets as the watches last saw them.
    /// Reconciles read these, not the API server, as the real controllers do.
    machines: Store<DynamicObject>,
    sets: Store<DynamicObject>,
    /// Signalled after either cache applied a watch event.
    cache_changed: Notify,
    /// Whether the API server serves Clusters (asked once): where it does not (a control plane
    /// with only the scalable kinds' CRDs), no Cluster is read on each reconcile.
    clusters_served: tokio::sync::OnceCell<bool>,
    /// Clusters with `spec.paused` as the Cluster watch last saw them, by (namespace, name):
    /// Machines' provider and deletion tasks hold on it without a request each.
    paused_clusters: Mutex<HashSet<(String, String)>>,
    /// Signalled when `paused_clusters` changes.
    pause_changed: Notify,
    shutdown: Shutdown,
}

/// MachineDeployment and MachineSet reconciles in flight at once.
const RECONCILE_WORKERS: usize = 4;

/// Writes of one reconcile (Machine creates, `UpToDate` conditions) in flight at once.
const WRITES_IN_FLIGHT: usize = 16;

/// What the stand-in's informer caches hold, read-only. A real Cluster API controller decides
/// from its cache, so a test whose outcome depends on it having seen a write (a
/// `delete-machine` mark before a scale-down) waits here rather than on the API server.
#[derive(Clone)]
pub struct Caches {
    machines: Store<DynamicObject>,
}

impl Caches {
    /// Caches that hold nothing (Cluster API's real manager runs instead of the stand-in).
    pub fn empty(version: CapiVersion) -> Self {
        Caches {
            machines: reflector::store::Writer::new(version.machine()).as_reader(),
        }
    }

    /// The Machine `ns/name` as the stand-in's cache last saw it.
    pub fn machine(&self, ns: &str, name: &str) -> Option<Arc<DynamicObject>> {
        self.machines
            .find(|m| m.name_any() == name && m.namespace().as_deref() == Some(ns))
    }
}

/// Starts the Cluster API stand-in on the current runtime; every task stops on `shutdown`.
pub fn spawn(
    clusters: Clusters,
    cfg: CapiConfig,
    shutdown: Shutdown,
) -> (Vec<JoinHandle<()>>, Caches) {
    let mut machine_cache = reflector::store::Writer::new(cfg.version.machine());
    let mut set_cache = reflector::store::Writer::new(cfg.version.machine_set());
    let inner = Arc::new(Inner::new(
        clusters,
        cfg,
        shutdown,
        machine_cache.as_reader(),
        set_cache.as_reader(),
    ));
    let caches = Caches {
        machines: inner.machines.clone(),
    };
    let v = inner.cfg.version;
    let mut tasks = Vec::new();

    let me = inner.clone();
    tasks.push(spawn_watch(
        "machinedeployments",
        watched(
            &inner.client,
            inner.scope.as_deref(),
            &v.machine_deployment(),
        ),
        inner.shutdown.clone(),
        move |event| {
            if let Some(md) = applied_or_deleted(event) {
                me.queue.push(Work::Deployment {
                    ns: md.namespace().unwrap_or_default(),
                    name: md.name_any(),
                });
            }
        },
    ));

    let me = inner.clone();
    tasks.push(spawn_watch(
        "machinesets",
        watched(&inner.client, inner.scope.as_deref(), &v.machine_set()),
        inner.shutdown.clone(),
        move |event| {
            set_cache.apply_watcher_event(&event);
            me.cache_changed.notify_waiters();
            if let Some(ms) = applied_or_deleted(event) {
                let ns = ms.namespace().unwrap_or_default();
                me.queue.push(Work::Set {
                    ns: ns.clone(),
                    name: ms.name_any(),
                });
                if let Some(md) = ms.labels().get(DEPLOYMENT_NAME_LABEL) {
                    me.queue.push(Work::Deployment {
                        ns,
                        name: md.clone(),
                    });
                }
            }
        },
    ));

    let me = inner.clone();
    tasks.push(spawn_watch(
        "machinepools",
        watched(&inner.client, inner.scope.as_deref(), &v.machine_pool()),
        inner.shutdown.clone(),
        move |event| {
            if let Some(mp) = applied_or_deleted(event) {
                me.queue.push(Work::Pool {
                    ns: mp.namespace().unwrap_or_default(),
                    name: mp.name_any(),
                });
            }
        },
    ));

    tasks.push(machine_pool::watch_infra_pools(inner.clone()));

    // The infrastructure provider's template controller: a DevMachineTemplate with machine
    // size annotations publishes that size in its `status.capacity`.
    tasks.extend(crate::machine_size::spawn_publisher(
        inner.client.clone(),
        inner.scope.clone(),
        inner.shutdown.clone(),
    ));

    // Cluster API's MachineDeployment and MachineSet controllers watch Clusters and reconcile a
    // Cluster's objects when its pause changes, so the `Paused` condition follows it.
    let me = inner.clone();
    tasks.push(tokio::spawn(async move {
        if !me.serves_clusters().await {
            return;
        }
        let api = watched(&me.client, me.scope.as_deref(), &me.cfg.version.cluster());
        let mut last: HashMap<(String, String), bool> = HashMap::new();
        let on = me.clone();
        let watch = spawn_watch("clusters", api, me.shutdown.clone(), move |event| {
            let gone = matches!(event, Event::Delete(_));
            let Some(cluster) = applied_or_deleted(event) else {
                return;
            };
            let key = (cluster.namespace().unwrap_or_default(), cluster.name_any());
            let paused = !gone
                && cluster.data.pointer("/spec/paused").and_then(Value::as_bool) == Some(true);
            on.note_cluster_pause(&key, paused);
            if last.insert(key.clone(), paused).unwrap_or(false) != paused {
                let on = on.clone();
                tokio::spawn(async move {
                    if let Err(err) = on.queue_cluster_objects(&key.0, &key.1).await {
                        tracing::warn!(cluster = %key.1, error = %err, "cluster api stand-in: could not queue a Cluster's objects after its pause changed");
                    }
                });
            }
        });
        let _ = watch.await;
    }));

    let me = inner.clone();
    tasks.push(spawn_watch(
        "machines",
        watched(&inner.client, inner.scope.as_deref(), &v.machine()),
        inner.shutdown.clone(),
        move |event| {
            machine_cache.apply_watcher_event(&event);
            me.cache_changed.notify_waiters();
            me.on_machine_event(event)
        },
    ));

    // Cluster API runs each controller with several workers (`--machineset-concurrency`,
    // `--machinedeployment-concurrency`, default 10); the queue never hands one object to
    // two workers at once.
    for _ in 0..RECONCILE_WORKERS {
        let me = inner.clone();
        tasks.push(tokio::spawn(async move {
            // As a controller waits for its informers to sync: an empty cache would read as
            // "no Machines" and create them all again.
            if !me.caches_synced().await {
                return;
            }
            while let Some(work) = me.queue.pop(&me.shutdown).await {
                me.reconcile(work.clone()).await;
                me.queue.done(&work);
            }
        }));
    }
    (tasks, caches)
}

/// The objects of an event that may need a reconcile (a relist re-delivers everything).
fn applied_or_deleted<K>(event: Event<K>) -> Option<K> {
    match event {
        Event::Apply(o) | Event::InitApply(o) | Event::Delete(o) => Some(o),
        Event::Init | Event::InitDone => None,
    }
}

impl Inner {
    /// The stand-in's state over the informer caches `machines` and `sets` (fed by `spawn`'s
    /// watches, or by a test).
    fn new(
        clusters: Clusters,
        cfg: CapiConfig,
        shutdown: Shutdown,
        machines: Store<DynamicObject>,
        sets: Store<DynamicObject>,
    ) -> Self {
        Inner {
            machines,
            sets,
            cache_changed: Notify::new(),
            rng: SimRng::new(cfg.seed),
            client: clusters.management,
            workload: clusters.workload,
            scope: clusters.scope,
            cfg,
            queue: WorkQueue::default(),
            provisioning: Mutex::new(HashSet::new()),
            deleting: Mutex::new(HashSet::new()),
            launching: Mutex::new(HashMap::new()),
            pool_instance_specs: Mutex::new(HashMap::new()),
            available: Mutex::new(HashMap::new()),
            clusters_served: tokio::sync::OnceCell::new(),
            paused_clusters: Mutex::new(HashSet::new()),
            pause_changed: Notify::new(),
            shutdown,
        }
    }

    fn api(&self, ar: &ApiResource, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, ar)
    }

    fn on_machine_event(self: &Arc<Self>, event: Event<DynamicObject>) {
        let (machine, deleted) = match event {
            Event::Apply(m) | Event::InitApply(m) => (m, false),
            Event::Delete(m) => (m, true),
            Event::Init | Event::InitDone => return,
        };
        let ns = machine.namespace().unwrap_or_default();
        if let Some(set) = machine.labels().get(SET_NAME_LABEL) {
            self.queue.push(Work::Set {
                ns: ns.clone(),
                name: set.clone(),
            });
        }
        if let Some(pool) = machine.labels().get(POOL_NAME_LABEL) {
            self.queue.push(Work::Pool {
                ns: ns.clone(),
                name: pool.clone(),
            });
        }
        let uid = machine.uid().unwrap_or_default();
        // A Machine becoming available (or going) may let a rollout take its next step; its
        // other changes cannot, and waking the Deployment on each would cost a list per event.
        let available =
            !deleted && machine.metadata.deletion_timestamp.is_none() && has_node_ref(&machine);
        let changed = if deleted {
            self.available.lock().remove(&uid);
            true
        } else {
            self.available.lock().insert(uid.clone(), available) != Some(available)
        };
        if changed && let Some(md) = machine.labels().get(DEPLOYMENT_NAME_LABEL) {
            self.queue.push(Work::Deployment {
                ns: ns.clone(),
                name: md.clone(),
            });
        }
        if deleted {
            self.provisioning.lock().remove(&uid);
            self.deleting.lock().remove(&uid);
            self.pool_instance_specs
                .lock()
                .remove(&(ns.clone(), machine.name_any()));
            return;
        }
        if machine.metadata.deletion_timestamp.is_some() {
            if machine.finalizers().iter().any(|f| f == MACHINE_FINALIZER)
                && self.deleting.lock().insert(uid)
            {
                let me = self.clone();
                tokio::spawn(async move { me.delete_machine(ns, machine.name_any()).await });
            }
            return;
        }
        let has_provider_id =
            str_at(&machine.data, &["spec", "providerID"]).is_some_and(|p| !p.is_empty());
        if !has_provider_id && self.provisioning.lock().insert(uid) {
            let me = self.clone();
            tokio::spawn(async move { me.provision(ns, machine).await });
        }
    }

    async fn reconcile(self: &Arc<Self>, work: Work) {
        let result = match &work {
            Work::Deployment { ns, name } => self.reconcile_deployment(ns, name).await,
            Work::Set { ns, name } => self.reconcile_set(ns, name).await,
            Work::Pool { ns, name } => self.reconcile_pool(ns, name).await,
            Work::InfraPool { ns, name } => self.pools_of_infra_pool(ns, name).await,
        };
        if let Err(err) = result {
            let subject = match &work {
                Work::Deployment { ns, name } => format!("MachineDeployment {ns}/{name}"),
                Work::Set { ns, name } => format!("MachineSet {ns}/{name}"),
                Work::Pool { ns, name } => format!("MachinePool {ns}/{name}"),
                Work::InfraPool { ns, name } => format!("{INFRA_POOL_KIND} {ns}/{name}"),
            };
            log_retry("cluster api stand-in: reconcile", &subject, &err);
            // A short pause so a persistent error does not spin; the key is queued again once
            // this worker is done with it.
            if self.shutdown.sleep(Duration::from_millis(50)).await {
                self.queue.push(work);
            }
        }
    }

    /// Writes `status` when it differs from what is stored, so a reconcile triggered by our
    /// own write converges instead of looping.
    async fn write_status_if_changed(
        &self,
        api: &Api<DynamicObject>,
        obj: &DynamicObject,
        status: Value,
    ) -> Result<(), kube::Error> {
        let current = obj.data.get("status").cloned().unwrap_or(json!({}));
        let changed = status
            .as_object()
            .into_iter()
            .flatten()
            .any(|(k, v)| current.get(k) != Some(v));
        if changed {
            let patch = json!({"status": status});
            ignore_not_found(
                api.patch_status(
                    &obj.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map(|_| ()),
            )?;
        }
        Ok(())
    }
}

fn ns_of(o: &DynamicObject) -> String {
    o.metadata.namespace.clone().unwrap_or_default()
}

fn set_replicas(ms: &DynamicObject) -> i64 {
    at(&ms.data, &["spec", "replicas"])
        .and_then(Value::as_i64)
        .unwrap_or(1)
        .max(0)
}

/// Available as the stand-in counts it: a Node, and not being deleted.
fn is_available(m: &DynamicObject) -> bool {
    m.metadata.deletion_timestamp.is_none() && has_node_ref(m)
}

fn set_annotation(obj: &mut DynamicObject, key: &str, value: String) {
    obj.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.to_string(), value);
}

fn has_node_ref(m: &DynamicObject) -> bool {
    str_at(&m.data, &["status", "nodeRef", "name"]).is_some_and(|n| !n.is_empty())
}

fn controller_uid(obj: &DynamicObject) -> Option<String> {
    obj.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
}

fn owner_ref(v: CapiVersion, kind: &str, owner: &DynamicObject) -> Value {
    json!({
        "apiVersion": v.api_version(),
        "kind": kind,
        "name": owner.name_any(),
        "uid": owner.uid().unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// `spec.selector.matchLabels` as the `k=v,k2=v2` string the scale subresource reports.
fn selector_string(obj: &DynamicObject) -> String {
    string_map(at(&obj.data, &["spec", "selector", "matchLabels"]))
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `v` as a JSON object, or an empty one when absent or of another type.
fn object(v: Option<&Value>) -> serde_json::Map<String, Value> {
    v.and_then(Value::as_object).cloned().unwrap_or_default()
}

pub(crate) fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// A DynamicObject from a full JSON body (apiVersion, kind, metadata, spec, ...).
pub(crate) fn dynamic(body: Value) -> DynamicObject {
    // DynamicObject flattens everything but metadata and types into `data`; a body we built
    // ourselves always fits, and the fallback keeps this total anyway.
    serde_json::from_value(body.clone()).unwrap_or_else(|_| DynamicObject {
        types: None,
        metadata: Default::default(),
        data: body,
    })
}

fn ignore_not_found(r: Result<impl Sized, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(err) if is_not_found(&err) => Ok(()),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::machine_deployment::desired_md_replicas;
    use super::*;
    use crate::wellknown::{DELETE_MACHINE_ANNOTATION, MIN_SIZE_ANNOTATION};

    /// A Machine as the stand-in sees it (also for `machine_set`'s tests).
    pub(super) fn machine(name: &str, created: &str, annotated: bool, node: bool) -> DynamicObject {
        let mut body = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {},
        });
        if annotated {
            body["metadata"]["annotations"] = json!({DELETE_MACHINE_ANNOTATION: ""});
        }
        if node {
            body["status"] = json!({"nodeRef": {"name": name}});
        }
        dynamic(body)
    }

    #[test]
    fn replicas_default_to_min_size_then_one() {
        let md = dynamic(json!({"metadata": {"name": "a"}, "spec": {}}));
        assert_eq!(desired_md_replicas(&md), 1);
        let md = dynamic(
            json!({"metadata": {"name": "a", "annotations": {MIN_SIZE_ANNOTATION: "3"}}, "spec": {}}),
        );
        assert_eq!(desired_md_replicas(&md), 3);
        let md = dynamic(json!({"metadata": {"name": "a"}, "spec": {"replicas": 0}}));
        assert_eq!(desired_md_replicas(&md), 0);
    }

    #[test]
    fn provider_ids_follow_style() {
        let m = machine("m-1", "2026-01-01T00:00:00Z", false, false);
        let rng = SimRng::new(3);
        assert_eq!(
            provider_id(ProviderIdStyle::Kubemark, &rng, &m),
            "kubemark://m-1"
        );
        let aws = provider_id(ProviderIdStyle::Aws, &rng, &m);
        let prefix = "aws:///us-east-1a/i-";
        assert!(
            aws.starts_with(prefix) && aws.len() == prefix.len() + 17,
            "{aws}"
        );
        let vs = provider_id(ProviderIdStyle::Vsphere, &rng, &m);
        assert!(
            vs.starts_with("vsphere://") && vs.len() == "vsphere://".len() + 36,
            "{vs}"
        );
    }
}
