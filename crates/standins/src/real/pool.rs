//! The infrastructure provider's side of Cluster API's MachinePool contract for the Dev kinds
//! (`DevMachinePool`), as CAPD's DockerMachinePool plays it, when Cluster API's real manager
//! runs (`simulate --cluster-api real`). The "cloud" here is a scaling group whose size follows
//! the owning MachinePool's `spec.replicas` (the MachinePool found by ownerReference, which
//! Cluster API's MachinePool controller sets on the infrastructure pool).
//!
//! What the provider writes, and nothing else (contract `infra-machinepool.md`; read by
//! `core/reconcilers/machinepool/machinepool_controller_phases.go` at v1.14.2 and
//! `exp/internal/controllers/machinepool_controller_phases.go` at v1.10.10):
//! - `spec.providerIDList`: the provider IDs of its instances (sorted, as CAPD does);
//! - `status.replicas`: how many instances it has, launched or not;
//! - `status.ready` (v1beta1 contract, and what v1.14.2's MachinePool controller still reads
//!   through `external.IsReady`) and `status.initialization.provisioned` (v1beta2): the scaling
//!   group itself exists, so both are true from the first reconcile on;
//! - with MachinePool Machines, `status.infrastructureMachineKind: DevMachine`.
//!
//! Two kinds of pool, as the Cluster API stand-in offers (`sim::capi::machine_pool`; the
//! `sim.karpenter.cluster.x-k8s.io/machine-pool-machines: "false"` annotation picks the second):
//! - **With MachinePool Machines**: each instance is a DevMachine labelled
//!   `cluster.x-k8s.io/pool-name` and `cluster.x-k8s.io/cluster-name` and owned by the
//!   DevMachinePool; Cluster API's MachinePool controller makes a Machine for each (named after
//!   it) and its Machine controller copies the provider ID, which the provider's DevMachine loop
//!   (`provider`) sets after the scenario's delay. Scale-down follows the MachinePool Machines
//!   proposal ("InfraMachinePoolMachine deletion"): while more instances are ready than
//!   `spec.replicas`, the provider deletes the *owner Machine* of one (those whose Machine
//!   carries `cluster.x-k8s.io/delete-machine` first), never the DevMachine itself, so Cluster
//!   API's Machine controller drains and deletes the Node and then the DevMachine through the
//!   Machine's infrastructureRef; the instance leaves `providerIDList` and the count once its
//!   DevMachine is gone. Only ready instances are counted and removed, as CAPD does, so
//!   scale-down never leaves fewer ready instances than asked for. Deleting that owner Machine
//!   is the infrastructure pool's part of the contract (Cluster API's MachinePool controller
//!   only creates and updates pool Machines), as CAPD's `deleteMachinePoolMachine` does.
//! - **Without them**: instances live only in `status.instances` (name and, once launched,
//!   provider ID) and `spec.providerIDList`; a new one gets its provider ID after the provider
//!   delay, and a scale-down terminates the ones the cloud picks (still launching first, then
//!   the oldest). Their Nodes are the kubelet stand-in's; Cluster API's MachinePool controller
//!   deletes the Node of an instance that left `providerIDList` (`deleteRetiredNodes`). The
//!   cloud's rules are the stand-in's own (`sim::capi::cloud_pool`).
//!
//! It shares no code with the controller under test.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{ListParams, PostParams};
use kube::core::DynamicObject;
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::provider::{
    INFRA_GROUP, INFRA_VERSION, ProviderConfig, dev_machine_resource, infra_paused,
};
use crate::capi::cloud_pool::{
    Cloud, Instance, Launches, Launching, infra_pool_status, instance_provider_ids, instances,
    machine_provider_ids, pool_zone, write_report,
};
use crate::capi::{INFRA_MACHINE_KIND, INFRA_POOL_KIND, has_pool_machines, infra_pool_resource};
use crate::standin::{
    Shutdown, SimRng, WorkQueue, at, delete_quietly, log_retry, spawn_watch, str_at,
};
use crate::wellknown::{CLUSTER_NAME_LABEL, DELETE_MACHINE_ANNOTATION, POOL_NAME_LABEL};

/// Pools reconciled at once (CAPD's controller runs a few workers too).
const WORKERS: usize = 2;

/// How soon a pool that has not reached its size yet (instances launching or being removed) is
/// looked at again when no event comes first.
const RESYNC: Duration = Duration::from_secs(1);

/// A DevMachinePool: (namespace, name).
type Key = (String, String);

struct Inner {
    client: Client,
    cfg: ProviderConfig,
    rng: SimRng,
    queue: WorkQueue<Key>,
    /// How the cloud behind the pools without MachinePool Machines launches (`cfg`'s).
    launches: Launches,
    /// Those pools' instances still launching. Only this module writes their instance lists,
    /// one reconcile per pool at a time.
    launching: Launching,
    /// Pools skipped because their Cluster or themselves are paused: a Cluster event in their
    /// namespace queues them again.
    held: Mutex<std::collections::HashSet<Key>>,
    shutdown: Shutdown,
}

/// Starts the infrastructure pool provider: watches of the DevMachinePools, the MachinePools
/// that own them and the pools' DevMachines, and its workers.
pub fn spawn(client: Client, cfg: ProviderConfig, shutdown: Shutdown) -> Vec<JoinHandle<()>> {
    let inner = Arc::new(Inner {
        rng: SimRng::new(cfg.seed ^ 0x9001_d00d),
        client: client.clone(),
        launches: Launches {
            delay: cfg.provider_delay,
            jitter: cfg.jitter,
            fail_fraction: cfg.fail_fraction,
            provider_id_style: cfg.provider_id_style,
        },
        cfg,
        queue: WorkQueue::default(),
        launching: Mutex::new(HashMap::new()),
        held: Mutex::new(Default::default()),
        shutdown: shutdown.clone(),
    });
    let mut tasks = Vec::new();
    let me = inner.clone();
    tasks.push(spawn_watch(
        "clusters (infrastructure pool provider)",
        Api::<DynamicObject>::all_with(client.clone(), &inner.cfg.version.cluster()),
        shutdown.clone(),
        move |event| {
            if let Event::Apply(c) | Event::InitApply(c) | Event::Delete(c) = event {
                let ns = c.namespace().unwrap_or_default();
                let mut held = me.held.lock();
                let again: Vec<Key> = held.iter().filter(|k| k.0 == ns).cloned().collect();
                for key in again {
                    held.remove(&key);
                    me.queue.push(key);
                }
            }
        },
    ));
    let me = inner.clone();
    tasks.push(spawn_watch(
        "devmachinepools (infrastructure provider)",
        Api::<DynamicObject>::all_with(client.clone(), &infra_pool_resource()),
        shutdown.clone(),
        move |event| {
            if let Event::Apply(p) | Event::InitApply(p) = event {
                me.queue
                    .push((p.namespace().unwrap_or_default(), p.name_any()));
            }
        },
    ));
    // The MachinePool's spec.replicas is the size asked for.
    let me = inner.clone();
    tasks.push(spawn_watch(
        "machinepools (infrastructure provider)",
        Api::<DynamicObject>::all_with(client.clone(), &inner.cfg.version.machine_pool()),
        shutdown.clone(),
        move |event| {
            if let Event::Apply(mp) | Event::InitApply(mp) | Event::Delete(mp) = event {
                let infra = at(&mp.data, &["spec", "template", "spec", "infrastructureRef"]);
                if infra.and_then(|r| r.get("kind")).and_then(Value::as_str)
                    == Some(INFRA_POOL_KIND)
                    && let Some(name) = infra.and_then(|r| r.get("name")).and_then(Value::as_str)
                {
                    me.queue
                        .push((mp.namespace().unwrap_or_default(), name.to_string()));
                }
            }
        },
    ));
    // A pool's DevMachines: provisioned (ready to count), given a Machine owner, or gone.
    let me = inner.clone();
    tasks.push(spawn_watch(
        "pool devmachines (infrastructure provider)",
        Api::<DynamicObject>::all_with(client, &dev_machine_resource()),
        shutdown,
        move |event| {
            if let Event::Apply(m) | Event::InitApply(m) | Event::Delete(m) = event
                && let Some(pool) = owner_named(&m, INFRA_POOL_KIND)
            {
                me.queue.push((m.namespace().unwrap_or_default(), pool));
            }
        },
    ));
    for _ in 0..WORKERS {
        let me = inner.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(key) = me.queue.pop(&me.shutdown).await {
                let result = me.reconcile(&key.0, &key.1).await;
                me.queue.done(&key);
                match result {
                    Ok(Some(after)) => me.requeue_after(key, after),
                    Ok(None) => {}
                    Err(err) => {
                        let subject = format!("{INFRA_POOL_KIND} {}/{}", key.0, key.1);
                        log_retry("infrastructure provider (pools)", &subject, &err);
                        me.requeue_after(key, Duration::from_millis(200));
                    }
                }
            }
        }));
    }
    tasks
}

/// The name of `obj`'s owner of `kind`, if any.
fn owner_named(obj: &DynamicObject, kind: &str) -> Option<String> {
    obj.owner_references()
        .iter()
        .find(|o| o.kind == kind)
        .map(|o| o.name.clone())
}

fn is_deleting(obj: &DynamicObject) -> bool {
    obj.metadata.deletion_timestamp.is_some()
}

/// A DevMachine the provider has made ready (`provider::provision`).
fn is_ready(m: &DynamicObject) -> bool {
    at(&m.data, &["status", "ready"]).and_then(Value::as_bool) == Some(true)
        || at(&m.data, &["status", "initialization", "provisioned"]).and_then(Value::as_bool)
            == Some(true)
}

impl Inner {
    fn requeue_after(self: &Arc<Self>, key: Key, after: Duration) {
        let me = self.clone();
        tokio::spawn(async move {
            if me.shutdown.sleep(after).await {
                me.queue.push(key);
            }
        });
    }

    fn api(&self, ar: &kube::core::ApiResource, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, ar)
    }

    /// One pass over infrastructure pool `ns/name`; returns when to look again if it has not
    /// reached its size.
    async fn reconcile(&self, ns: &str, name: &str) -> Result<Option<Duration>, kube::Error> {
        let pools = self.api(&infra_pool_resource(), ns);
        let Some(infra) = pools.get_opt(name).await? else {
            // Its DevMachines go with it (ownerReference), its instance list with the object.
            return Ok(None);
        };
        if is_deleting(&infra) {
            return Ok(None);
        }
        // Cluster API's MachinePool controller sets itself as the owner when it first reconciles
        // the pool; until then the provider does not know the size asked for.
        let Some(mp_name) = owner_named(&infra, "MachinePool") else {
            return Ok(Some(RESYNC));
        };
        let Some(mp) = self
            .api(&self.cfg.version.machine_pool(), ns)
            .get_opt(&mp_name)
            .await?
        else {
            return Ok(None);
        };
        if is_deleting(&mp) {
            return Ok(None);
        }
        // A paused Cluster's pool (or a pool annotated paused) is left as it is: no instance
        // launched, reported or removed until the pause lifts, as real providers honour it.
        // Held before looking, so a Cluster event while we look still queues the pool again.
        let cluster = str_at(&mp.data, &["spec", "clusterName"]).unwrap_or_default();
        let key = (ns.to_string(), name.to_string());
        self.held.lock().insert(key.clone());
        if infra_paused(&self.client, self.cfg.version, &infra, cluster).await? {
            tracing::debug!(pool = %name, "infrastructure pool provider: paused");
            return Ok(None);
        }
        self.held.lock().remove(&key);
        let desired = at(&mp.data, &["spec", "replicas"])
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .max(0);
        let observed = if has_pool_machines(&infra) {
            self.reconcile_dev_machines(&mp, &infra, desired).await?
        } else {
            self.reconcile_instances(&mp, &infra, desired)
        };
        write_report(&pools, &infra, &observed.provider_ids, observed.status()).await?;
        Ok(observed.again)
    }

    /// With MachinePool Machines: one DevMachine per instance, created while fewer exist than
    /// asked for; a surplus of ready ones removed by deleting their owner Machines.
    async fn reconcile_dev_machines(
        &self,
        mp: &DynamicObject,
        infra: &DynamicObject,
        desired: i64,
    ) -> Result<Observed, kube::Error> {
        let ns = mp.namespace().unwrap_or_default();
        let pool_uid = infra.uid().unwrap_or_default();
        let cluster = str_at(&mp.data, &["spec", "clusterName"]).unwrap_or_default();
        let selector = format!(
            "{POOL_NAME_LABEL}={},{CLUSTER_NAME_LABEL}={cluster}",
            mp.name_any()
        );
        let dev_machines = self.api(&dev_machine_resource(), &ns);
        let mine: Vec<DynamicObject> = dev_machines
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .filter(|m| m.owner_references().iter().any(|o| o.uid == pool_uid))
            .collect();

        // Scale-up: every instance counts, deleting ones too (its instance is still there until
        // its DevMachine is gone, as a container is until its DockerMachine's finalizer ran).
        let missing = desired - mine.len() as i64;
        for _ in 0..missing.max(0) {
            self.create_dev_machine(mp, infra, cluster, &dev_machines)
                .await?;
        }

        // Scale-down: ready instances whose Machine is not already going, read fresh so a
        // delete-machine mark written just before the decrement is seen.
        let machines = self.api(&self.cfg.version.machine(), &ns);
        let by_name: HashMap<String, DynamicObject> = machines
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .map(|m| (m.name_any(), m))
            .collect();
        let owner = |d: &DynamicObject| owner_named(d, "Machine").and_then(|n| by_name.get(&n));
        let staying: Vec<&DynamicObject> = mine
            .iter()
            .filter(|d| !is_deleting(d) && is_ready(d))
            .filter(|d| owner(d).is_none_or(|m| !is_deleting(m)))
            .collect();
        let mut surplus = staying.len() as i64 - desired;
        let mut candidates: Vec<(&DynamicObject, &DynamicObject)> = staying
            .iter()
            .filter_map(|d| owner(d).map(|m| (*d, m)))
            .collect();
        // Marked first (Cluster API's rule for every pool that supports MachinePool Machines),
        // then in name order, as CAPD's stable sort leaves them.
        candidates.sort_by_key(|(d, m)| {
            (
                !m.annotations().contains_key(DELETE_MACHINE_ANNOTATION),
                d.name_any(),
            )
        });
        for (d, m) in candidates {
            if surplus <= 0 {
                break;
            }
            tracing::info!(pool = %infra.name_any(), devmachine = %d.name_any(), machine = %m.name_any(), "scale-down: deleting the instance's Machine");
            delete_quietly(&machines, &m.name_any()).await?;
            surplus -= 1;
        }

        let settled = mine.len() as i64 == desired && mine.iter().all(|m| !is_deleting(m));
        Ok(Observed {
            provider_ids: machine_provider_ids(&mine),
            replicas: mine.len() as i64,
            instances: None,
            machine_kind: true,
            again: (!settled).then_some(RESYNC),
        })
    }

    /// A new instance's DevMachine, as CAPD's `computeDesiredDockerMachine` shapes it: the
    /// pool's template, the pool-name and cluster-name labels Cluster API selects by, and the
    /// DevMachinePool as owner so it is not orphaned before its Machine exists.
    async fn create_dev_machine(
        &self,
        mp: &DynamicObject,
        infra: &DynamicObject,
        cluster: &str,
        api: &Api<DynamicObject>,
    ) -> Result<(), kube::Error> {
        let ns = mp.namespace().unwrap_or_default();
        let name = format!("{}-{}", mp.name_any(), self.rng.suffix());
        let mut spec = at(&infra.data, &["spec", "template"])
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        if let Some(zone) = pool_zone(mp) {
            spec["failureDomain"] = json!(zone);
        }
        let ar = dev_machine_resource();
        let body: DynamicObject = serde_json::from_value(json!({
            "apiVersion": ar.api_version, "kind": INFRA_MACHINE_KIND,
            "metadata": {
                "name": name, "namespace": ns,
                "labels": {POOL_NAME_LABEL: mp.name_any(), CLUSTER_NAME_LABEL: cluster},
                "ownerReferences": [{
                    "apiVersion": format!("{INFRA_GROUP}/{INFRA_VERSION}"),
                    "kind": INFRA_POOL_KIND,
                    "name": infra.name_any(),
                    "uid": infra.uid().unwrap_or_default(),
                }],
            },
            "spec": spec,
        }))
        .map_err(kube::Error::SerdeError)?;
        tracing::info!(pool = %infra.name_any(), devmachine = %name, "scale-up: new instance");
        api.create(&PostParams::default(), &body).await.map(drop)
    }

    /// Without MachinePool Machines: the cloud resizes the pool's instance list (`cloud_pool`);
    /// Cluster API's MachinePool controller deletes the Nodes of the instances it terminates.
    fn reconcile_instances(
        &self,
        mp: &DynamicObject,
        infra: &DynamicObject,
        desired: i64,
    ) -> Observed {
        let cloud = Cloud::new(
            &self.rng,
            &self.launching,
            self.launches,
            &mp.namespace().unwrap_or_default(),
        );
        let mut list = instances(infra);
        for gone in cloud.scale_in(&mut list, desired) {
            tracing::info!(pool = %infra.name_any(), instance = %gone.instance_name, "scale-in: terminating instance");
        }
        // The next pass is when the soonest launch is due (`next_due`), not one per launch.
        cloud.launch(&mut list, desired, &mp.name_any());
        cloud.finish_launches(&mut list, pool_zone(mp));
        Observed {
            provider_ids: instance_provider_ids(&list),
            replicas: list.len() as i64,
            again: cloud.next_due(&list),
            instances: Some(list),
            machine_kind: false,
        }
    }
}

/// What one pass found, for the pool's contract fields.
struct Observed {
    provider_ids: Vec<String>,
    replicas: i64,
    /// A pool without MachinePool Machines: its instance list.
    instances: Option<Vec<Instance>>,
    /// A pool with MachinePool Machines: report the machine kind.
    machine_kind: bool,
    /// When to look again, if the pool is not at its size yet.
    again: Option<Duration>,
}

impl Observed {
    /// The pool's contract status, with its instance list if it keeps one.
    fn status(&self) -> Value {
        let mut status = infra_pool_status(self.replicas, self.machine_kind);
        if let Some(list) = &self.instances {
            status["instances"] = json!(list);
        }
        status
    }
}
