//! The MachinePool controller and the infrastructure machine pool behind it (a `DevMachinePool`,
//! standing in for a cloud scaling group), in the two modes Cluster API knows:
//!
//! - **MachinePool Machines**: the infrastructure pool reports `status.infrastructureMachineKind`
//!   and every instance is surfaced as a Machine labelled `cluster.x-k8s.io/pool-name`, owned by
//!   the MachinePool. Scale-down deletes the owner Machine (so Cluster API drains its Node), the
//!   ones marked `cluster.x-k8s.io/delete-machine` first, as Cluster API's Docker pool does.
//! - **Without them** (the pool's `sim.karpenter.cluster.x-k8s.io/machine-pool-machines: "false"`
//!   annotation): instances live only in the pool's `status.instances` and `spec.providerIDList`;
//!   scale-down terminates an instance the "cloud" picks (still launching, else the oldest) and
//!   its Node goes with it, undrained, as a cloud's scale-in does. The cloud's rules are in
//!   `cloud_pool`, which the infrastructure pool beside real Cluster API shares.
//!
//! A rollout, as Cluster API's Docker pool does one: an instance is outdated once the pool's
//! Kubernetes version or the infrastructure pool's `spec.template` (what a container's image
//! follows) differs from what it was made from; the pool makes up-to-date instances until it
//! has `spec.replicas` of them, and deletes outdated Machines first while it has more ready
//! Machines than replicas. Only the provider knows what an instance was made from: every pool
//! Machine says `UpToDate=True` throughout, as Cluster API's MachinePool controller writes it.
//!
//! Both end in what Cluster API's MachinePool controller writes: `spec.providerIDList` copied
//! from the infrastructure pool, and `status` (replicas, ready replicas, phase, the version's
//! readiness fields).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

// The instance list is the cloud's (`cloud_pool`); `capi` hands it on to the kubelet stand-in
// and the tests, which read the pools through `capi`.
pub use super::cloud_pool::{Instance, instances};

use super::cloud_pool::{
    Cloud, Launches, infra_pool_status, instance_provider_ids, machine_provider_ids, pool_zone,
    write_report,
};
use super::machine_deployment::desired_md_replicas;
use super::machine_set::DeletionOrder;
use super::{
    Inner, Work, applied_or_deleted, controller_uid, dynamic, ignore_not_found, is_available,
    owner_ref,
};
use crate::capi_version::CapiVersion;
use crate::standin::{at, delete_quietly, spawn_watch, str_at};
use crate::wellknown::{CLUSTER_NAME_LABEL, MACHINE_POOL_KIND, POOL_NAME_LABEL};

/// A pool's infrastructure provider removes its surplus healthy instances oldest first, as
/// CAPD's pools do (marked and unhealthy ones before them, as in a MachineSet).
const POOL_ORDER: DeletionOrder = DeletionOrder::Oldest;

/// Annotation on an infrastructure pool: `"false"` makes it a pool without MachinePool Machines.
pub const POOL_MACHINES_ANNOTATION: &str = "sim.karpenter.cluster.x-k8s.io/machine-pool-machines";
/// Annotation on an infrastructure pool: `"false"` turns its rollouts off, as AWS's
/// `refreshPreferences.disable` does: outdated instances stay until something removes them.
pub const INSTANCE_REFRESH_ANNOTATION: &str = "sim.karpenter.cluster.x-k8s.io/instance-refresh";
/// The infrastructure machine kind the simulated pools report (Cluster API's in-memory "Dev"
/// provider's).
pub const INFRA_MACHINE_KIND: &str = "DevMachine";
/// Infrastructure group, version, kind and plural of the simulated infrastructure pools.
pub const INFRA_POOL_GROUP: &str = "infrastructure.cluster.x-k8s.io";
pub const INFRA_POOL_VERSION: &str = "v1beta2";
pub const INFRA_POOL_KIND: &str = "DevMachinePool";

pub fn infra_pool_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(INFRA_POOL_GROUP, INFRA_POOL_VERSION, INFRA_POOL_KIND),
        "devmachinepools",
    )
}

/// True when the infrastructure pool surfaces its instances as Machines.
pub fn has_pool_machines(infra_pool: &DynamicObject) -> bool {
    infra_pool
        .annotations()
        .get(POOL_MACHINES_ANNOTATION)
        .is_none_or(|v| v != "false")
}

/// What the infrastructure pool observed on one pass, for the MachinePool's status.
struct Observed {
    provider_ids: Vec<String>,
    replicas: i64,
    ready: i64,
}

/// What an instance of `mp` is made from now: the template's Kubernetes version and the
/// infrastructure pool's `spec.template` (Cluster API's Docker pool compares the container
/// image, which both choose).
fn instance_spec(mp: &DynamicObject, infra: &DynamicObject) -> Value {
    json!({
        "version": at(&mp.data, &["spec", "template", "spec", "version"]),
        "template": at(&infra.data, &["spec", "template"]),
    })
}

/// Watches the infrastructure pools, as the provider's controller and Cluster API's MachinePool
/// controller do: an edit of one's `spec.template` in place outdates its instances. Only such an
/// edit wakes the pools (the stand-in's own status writes do not). A control plane without the
/// simulated provider's CRD has no infrastructure pools to watch.
pub(super) fn watch_infra_pools(inner: Arc<Inner>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<DynamicObject> = crate::standin::watched(
            &inner.client,
            inner.scope.as_deref(),
            &infra_pool_resource(),
        );
        if let Err(kube::Error::Api(s)) = api.list(&ListParams::default().limit(1)).await
            && s.code == 404
        {
            tracing::debug!("no {INFRA_POOL_KIND} resource served: not watching them");
            return;
        }
        let me = inner.clone();
        let mut seen: HashMap<(String, String), Option<Value>> = HashMap::new();
        let watch = spawn_watch(
            "devmachinepools",
            api,
            inner.shutdown.clone(),
            move |event| {
                let Some(p) = applied_or_deleted(event) else {
                    return;
                };
                let key = (p.namespace().unwrap_or_default(), p.name_any());
                let template = at(&p.data, &["spec", "template"]).cloned();
                let before = seen.insert(key.clone(), template.clone());
                if before.is_some_and(|b| b != template) {
                    me.queue.push(Work::InfraPool {
                        ns: key.0,
                        name: key.1,
                    });
                }
            },
        );
        let _ = watch.await;
    })
}

impl Inner {
    pub(super) async fn reconcile_pool(
        self: &Arc<Self>,
        ns: &str,
        name: &str,
    ) -> Result<(), kube::Error> {
        let v = self.cfg.version;
        let pools = self.api(&v.machine_pool(), ns);
        let Some(mp) = pools.get_opt(name).await? else {
            return self.collect_pool(ns, name).await;
        };
        if mp.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        // Cluster API's pause, as for MachineSets: the pool's `Paused` condition says so and
        // no instance or Machine is made or removed until it lifts.
        let Some(mp) = self.unless_paused(ns, &pools, mp, "MachinePool").await? else {
            return Ok(());
        };
        let Some(infra_name) = str_at(
            &mp.data,
            &["spec", "template", "spec", "infrastructureRef", "name"],
        ) else {
            return Ok(());
        };
        let infra_api = self.api(&infra_pool_resource(), ns);
        let Some(infra) = infra_api.get_opt(infra_name).await? else {
            // As Cluster API: nothing happens until the infrastructure pool exists.
            self.requeue_later(ns, name, Duration::from_secs(1));
            return Ok(());
        };
        let desired = desired_md_replicas(&mp);
        let observed = if has_pool_machines(&infra) {
            self.reconcile_pool_machines(&mp, &infra, desired).await?
        } else {
            self.reconcile_instances(&mp, &infra, desired).await?
        };
        let infra_status = infra_pool_status(observed.replicas, has_pool_machines(&infra));
        let report = write_report(&infra_api, &infra, &observed.provider_ids, infra_status);
        ignore_not_found(report.await)?;
        if at(&mp.data, &["spec", "providerIDList"]) != Some(&json!(observed.provider_ids)) {
            let patch = json!({"spec": {"providerIDList": observed.provider_ids}});
            ignore_not_found(
                pools
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            )?;
        }
        let status = pool_status(v, &mp, desired, &observed);
        self.write_status_if_changed(&pools, &mp, status).await
    }

    /// The MachinePool is gone: Cluster API deletes its Machines (the garbage collector, by owner
    /// reference); the instances of a pool without Machines go with the infrastructure pool.
    async fn collect_pool(&self, ns: &str, name: &str) -> Result<(), kube::Error> {
        let machines = self.api(&self.cfg.version.machine(), ns);
        let by_label = ListParams::default().labels(&format!("{POOL_NAME_LABEL}={name}"));
        for m in machines.list(&by_label).await?.items {
            ignore_not_found(
                machines
                    .delete(&m.name_any(), &DeleteParams::default())
                    .await,
            )?;
        }
        Ok(())
    }

    /// The MachinePools in `ns` whose template names infrastructure pool `name` reconcile.
    pub(super) async fn pools_of_infra_pool(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<(), kube::Error> {
        let pools = self.api(&self.cfg.version.machine_pool(), ns);
        for mp in pools.list(&ListParams::default()).await?.items {
            let infra = str_at(
                &mp.data,
                &["spec", "template", "spec", "infrastructureRef", "name"],
            );
            if infra == Some(name) {
                self.queue.push(Work::Pool {
                    ns: ns.to_string(),
                    name: mp.name_any(),
                });
            }
        }
        Ok(())
    }

    fn requeue_later(self: &Arc<Self>, ns: &str, name: &str, after: Duration) {
        let me = self.clone();
        let work = Work::Pool {
            ns: ns.to_string(),
            name: name.to_string(),
        };
        tokio::spawn(async move {
            if me.shutdown.sleep(after).await {
                me.queue.push(work);
            }
        });
    }

    /// With MachinePool Machines: one Machine per instance, created and deleted like a
    /// MachineSet's (deleting ones count until gone; scale-down takes the marked ones first),
    /// and rolled out as the module doc says.
    async fn reconcile_pool_machines(
        &self,
        mp: &DynamicObject,
        infra: &DynamicObject,
        desired: i64,
    ) -> Result<Observed, kube::Error> {
        let (ns, name) = (mp.namespace().unwrap_or_default(), mp.name_any());
        let uid = mp.uid().unwrap_or_default();
        let machines: Vec<Arc<DynamicObject>> =
            Self::cached(&self.machines, &ns, POOL_NAME_LABEL, &name)
                .into_iter()
                .filter(|m| controller_uid(m).as_deref() == Some(uid.as_str()))
                .collect();
        let spec_now = instance_spec(mp, infra);
        let refreshes = infra
            .annotations()
            .get(INSTANCE_REFRESH_ANNOTATION)
            .is_none_or(|v| v != "false");
        let outdated = |m: &DynamicObject| {
            refreshes
                && self
                    .pool_instance_specs
                    .lock()
                    .get(&(ns.clone(), m.name_any()))
                    .is_some_and(|made_from| *made_from != spec_now)
        };
        let current = machines.iter().filter(|m| !outdated(m)).count() as i64;
        let rolling_out = machines
            .iter()
            .any(|m| m.metadata.deletion_timestamp.is_none() && outdated(m));
        let api = self.api(&self.cfg.version.machine(), &ns);
        if current < desired {
            let bodies: Vec<DynamicObject> =
                (current..desired).map(|_| self.pool_machine(mp)).collect();
            {
                let mut specs = self.pool_instance_specs.lock();
                for b in &bodies {
                    specs.insert((ns.clone(), b.name_any()), spec_now.clone());
                }
            }
            self.create_machines(&ns, &api, bodies).await?;
        }
        if rolling_out || machines.len() as i64 > desired {
            // As Cluster API's pools do, the Machines' delete-machine marks are read fresh just
            // before choosing: a mark written right before the decrement may not be cached yet.
            let by_label = ListParams::default().labels(&format!("{POOL_NAME_LABEL}={name}"));
            let fresh: Vec<Arc<DynamicObject>> = api
                .list(&by_label)
                .await?
                .items
                .into_iter()
                .filter(|m| controller_uid(m).as_deref() == Some(uid.as_str()))
                .map(Arc::new)
                .collect();
            if rolling_out {
                // Never fewer ready Machines than replicas: an outdated one goes once a
                // surplus is ready, then a marked or surplus current one.
                let ready = fresh.iter().filter(|m| is_available(m)).count() as i64;
                let surplus = (ready - desired).max(0) as usize;
                let (old, new): (Vec<_>, Vec<_>) = fresh
                    .into_iter()
                    .filter(|m| m.metadata.deletion_timestamp.is_none())
                    .partition(|m| outdated(m));
                let from_old = surplus.min(old.len());
                self.delete_surplus(&ns, &api, &old, from_old, &name, POOL_ORDER)
                    .await?;
                self.delete_surplus(&ns, &api, &new, surplus - from_old, &name, POOL_ORDER)
                    .await?;
            } else {
                let surplus = (fresh.len() as i64 - desired).max(0) as usize;
                self.delete_surplus(&ns, &api, &fresh, surplus, &name, POOL_ORDER)
                    .await?;
            }
        }
        Ok(Observed {
            provider_ids: machine_provider_ids(machines.iter().map(Arc::as_ref)),
            replicas: machines.len() as i64,
            ready: machines.iter().filter(|m| is_available(m)).count() as i64,
        })
    }

    /// A MachinePool Machine as Cluster API's MachinePool controller builds it for a new
    /// infrastructure machine: named after it, owned by the pool, the template's labels and
    /// annotations plus the pool-name and cluster-name labels, no bootstrap of its own.
    fn pool_machine(&self, mp: &DynamicObject) -> DynamicObject {
        let v = self.cfg.version;
        let name = format!("{}-{}", mp.name_any(), self.rng.suffix());
        let template = at(&mp.data, &["spec", "template"]);
        let meta = |key: &str| super::string_map(template.and_then(|t| at(t, &["metadata", key])));
        let cluster = str_at(&mp.data, &["spec", "clusterName"]).unwrap_or_default();
        let mut labels = meta("labels");
        labels.insert(POOL_NAME_LABEL.into(), mp.name_any());
        labels.insert(CLUSTER_NAME_LABEL.into(), cluster.to_string());
        let infra_ref = match v {
            CapiVersion::V1Beta1 => json!({
                "apiVersion": format!("{INFRA_POOL_GROUP}/{INFRA_POOL_VERSION}"),
                "kind": INFRA_MACHINE_KIND, "name": name,
            }),
            CapiVersion::V1Beta2 => {
                json!({"apiGroup": INFRA_POOL_GROUP, "kind": INFRA_MACHINE_KIND, "name": name})
            }
        };
        let mut spec = json!({
            "clusterName": cluster,
            "bootstrap": {"dataSecretName": ""},
            "infrastructureRef": infra_ref,
        });
        if let Some(version) = template.and_then(|t| str_at(t, &["spec", "version"])) {
            spec["version"] = json!(version);
        }
        dynamic(json!({
            "apiVersion": v.api_version(),
            "kind": "Machine",
            "metadata": {
                "name": name,
                "namespace": mp.namespace(),
                "labels": labels,
                "annotations": meta("annotations"),
                "finalizers": [super::MACHINE_FINALIZER],
                "ownerReferences": [owner_ref(v, MACHINE_POOL_KIND, mp)],
            },
            "spec": spec,
        }))
    }

    /// Without MachinePool Machines: the cloud resizes the pool's instance list (`cloud_pool`),
    /// and, as Cluster API would once they leave `providerIDList`, the Nodes of the instances it
    /// terminates go with them. This reconcile is the only writer of the pool's instance list
    /// (the queue runs one pass per pool at a time).
    async fn reconcile_instances(
        self: &Arc<Self>,
        mp: &DynamicObject,
        infra: &DynamicObject,
        desired: i64,
    ) -> Result<Observed, kube::Error> {
        let (ns, name) = (mp.namespace().unwrap_or_default(), mp.name_any());
        let cloud = self.cloud(&ns);
        let mut list = instances(infra);
        let nodes: Api<Node> = Api::all(self.workload.clone());
        for gone in cloud.scale_in(&mut list, desired) {
            if gone.provider_id.is_some() {
                tracing::info!(pool = %name, instance = %gone.instance_name, "scale-in: terminating instance");
                delete_quietly(&nodes, &gone.instance_name).await?;
            }
        }
        for due_in in cloud.launch(&mut list, desired, &name) {
            self.requeue_later(&ns, &name, due_in);
        }
        cloud.finish_launches(&mut list, pool_zone(mp));
        self.write_instances(infra, &list).await?;
        let provider_ids = instance_provider_ids(&list);
        Ok(Observed {
            ready: provider_ids.len() as i64,
            provider_ids,
            replicas: list.len() as i64,
        })
    }

    /// The cloud behind this stand-in's pools, for one pass over a pool in `ns`.
    fn cloud(&self, ns: &str) -> Cloud<'_> {
        let launches = Launches {
            delay: self.cfg.provider_delay,
            jitter: self.cfg.jitter,
            fail_fraction: self.cfg.fail_fraction,
            provider_id_style: self.cfg.provider_id_style,
        };
        Cloud::new(&self.rng, &self.launching, launches, ns)
    }

    /// The infrastructure pool's `status.instances`, written when it changed.
    async fn write_instances(
        &self,
        infra: &DynamicObject,
        list: &[Instance],
    ) -> Result<(), kube::Error> {
        let patch = json!({"status": {"instances": list}});
        if at(&infra.data, &["status", "instances"]) == Some(&patch["status"]["instances"]) {
            return Ok(());
        }
        let api = self.api(
            &infra_pool_resource(),
            &infra.namespace().unwrap_or_default(),
        );
        ignore_not_found(
            api.patch_status(
                &infra.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await,
        )
    }
}

/// A MachinePool's status in `v`'s shape, as Cluster API's MachinePool controller reports it.
fn pool_status(v: CapiVersion, mp: &DynamicObject, desired: i64, o: &Observed) -> Value {
    let phase = if o.replicas == 0 && desired > 0 {
        "Provisioning"
    } else if desired > o.ready {
        "ScalingUp"
    } else if desired < o.ready {
        "ScalingDown"
    } else {
        "Running"
    };
    let mut status = json!({
        "replicas": o.replicas,
        "readyReplicas": o.ready,
        "availableReplicas": o.ready,
        "phase": phase,
        "observedGeneration": mp.metadata.generation.unwrap_or(0),
    });
    match v {
        CapiVersion::V1Beta1 => {
            status["bootstrapReady"] = json!(true);
            status["infrastructureReady"] = json!(true);
            status["unavailableReplicas"] = json!((o.replicas - o.ready).max(0));
        }
        CapiVersion::V1Beta2 => {
            status["initialization"] =
                json!({"bootstrapDataSecretCreated": true, "infrastructureProvisioned": true});
            status["upToDateReplicas"] = json!(o.replicas);
        }
    }
    status
}
