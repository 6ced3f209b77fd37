//! What a cloud plays when Cluster API's real manager runs (`simulate --cluster-api real`):
//! nothing Cluster API's own controllers do (no MachineSet or Machine is made, no nodeRef set,
//! no Node drained or deleted here), only its providers' side of the contracts. The one Machine
//! write is the infrastructure pool's own part of the MachinePool Machines contract: scaling a
//! DevMachinePool down deletes the owner Machine of the instance it removes (module `pool`).
//! The contracts played:
//! - the infrastructure and control-plane CRDs (CAPD's Dev* kinds, a minimal control plane),
//!   labelled with the contract labels that tell Cluster API which version implements which
//!   contract;
//! - per namespace a Cluster referring to a DevCluster (ready, with its endpoint) and to a
//!   control plane that reports initialized, its version and `externalManagedControlPlane`, and
//!   the `<cluster>-kubeconfig` Secret for the workload cluster (the same API server);
//! - an infrastructure provider that, for each DevMachine Cluster API clones from a template
//!   (or a DevMachinePool makes for an instance), after the scenario's provider delay sets
//!   `spec.providerID` and the provisioned status (or, for `--fail-fraction` of them, never
//!   does);
//! - the infrastructure side of the MachinePool contract for DevMachinePools (module `pool`);
//! - the template side of the scale-from-zero contract: a DevMachineTemplate carrying machine
//!   size annotations publishes that size in its `status.capacity` (`sim::machine_size`).
//!
//! The kubelets registering Nodes under those provider IDs are the kubelet stand-in's
//! (`sim::kubelet`, told Cluster API is real so it leaves nodeRef, label sync and Node deletion
//! to Cluster API). It shares no code with the controller under test.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::Stats;
use crate::capi::{CapiVersion, PROVIDER_ID_SET, ProviderIdStyle, provider_id_for};
use crate::controlplane::cluster_api::established;
use crate::standin::{Shutdown, SimRng, log_retry, retry, spawn_watch, str_at};
use crate::wellknown::CLUSTER_NAME_LABEL;

/// The infrastructure provider's group and version (Cluster API's in-memory "Dev" provider's,
/// as the seeded templates name them).
pub const INFRA_GROUP: &str = "infrastructure.cluster.x-k8s.io";
pub const INFRA_VERSION: &str = "v1beta2";

/// The minimal control-plane provider's group, version and kind.
pub const CONTROL_PLANE_GROUP: &str = "controlplane.sim.karpenter.cluster.x-k8s.io";
pub const CONTROL_PLANE_VERSION: &str = "v1beta2";
/// (The kind's name lives with the Cluster API stand-in, whose preflight message names it too.)
pub use crate::capi::CONTROL_PLANE_KIND;

/// The infrastructure kinds this provider serves besides DevMachineTemplate (upstream's CRD):
/// (kind, plural).
const INFRA_KINDS: [(&str, &str); 4] = [
    ("DevCluster", "devclusters"),
    ("DevMachine", "devmachines"),
    ("DevMachinePool", "devmachinepools"),
    ("DevMachinePoolTemplate", "devmachinepooltemplates"),
];

/// Server-side apply's field manager for the provider's objects.
const FIELD_MANAGER: &str = "karpenter-capi-sim-provider";

/// The contract labels: both contracts implemented by the provider's one version.
pub fn contract_labels() -> Value {
    json!({
        "cluster.x-k8s.io/v1beta1": INFRA_VERSION,
        "cluster.x-k8s.io/v1beta2": INFRA_VERSION,
    })
}

/// The API groups of the provider's kinds (granted to Cluster API's manager).
pub fn groups() -> Vec<String> {
    vec![INFRA_GROUP.to_string(), CONTROL_PLANE_GROUP.to_string()]
}

/// A contract-labelled CRD of one version that keeps any field (the provider's kinds carry no
/// schema of their own; a test may add others so).
pub fn crd(group: &str, version: &str, kind: &str, plural: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}"), "labels": contract_labels()},
        "spec": {
            "group": group,
            "names": {
                "kind": kind, "listKind": format!("{kind}List"), "plural": plural,
                "singular": kind.to_lowercase(), "categories": ["cluster-api"],
            },
            "scope": "Namespaced",
            "versions": [{
                "name": version, "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": true,
                }},
            }],
        },
    })
}

/// Installs the provider's CRDs (contract-labelled) and waits until they are Established.
pub async fn install_crds(client: &Client) -> Result<(), super::Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut docs: Vec<Value> = INFRA_KINDS
        .iter()
        .map(|(kind, plural)| crd(INFRA_GROUP, INFRA_VERSION, kind, plural))
        .collect();
    docs.push(crd(
        CONTROL_PLANE_GROUP,
        CONTROL_PLANE_VERSION,
        CONTROL_PLANE_KIND,
        "simcontrolplanes",
    ));
    let mut names = Vec::new();
    for doc in &docs {
        let name = str_at(doc, &["metadata", "name"])
            .unwrap_or_default()
            .to_string();
        api.patch(&name, &apply_params(), &Patch::Apply(doc))
            .await
            .map_err(super::Error::Install)?;
        names.push(name);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    Ok(established(&api, &names, deadline).await?)
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub fn dev_machine_resource() -> ApiResource {
    resource(INFRA_GROUP, INFRA_VERSION, "DevMachine", "devmachines")
}

/// The workload cluster `cluster` as its providers present it in namespace `ns`: the
/// `<cluster>-kubeconfig` Secret, a DevCluster, a control plane and the Cluster referring to
/// both, every status a provider reports set. Idempotent.
pub async fn ensure_cluster(
    client: &Client,
    ns: &str,
    cluster: &str,
    version: CapiVersion,
    apiserver_port: u16,
    workload_kubeconfig: &str,
) -> Result<(), kube::Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": format!("{cluster}-kubeconfig"), "namespace": ns,
            "labels": {"cluster.x-k8s.io/cluster-name": cluster},
        },
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"value": workload_kubeconfig},
    });
    secrets
        .patch(
            &format!("{cluster}-kubeconfig"),
            &apply_params(),
            &Patch::Apply(&secret),
        )
        .await?;

    let infra = resource(INFRA_GROUP, INFRA_VERSION, "DevCluster", "devclusters");
    let endpoint = json!({"host": "127.0.0.1", "port": apiserver_port});
    apply_with_status(
        client,
        ns,
        cluster,
        &infra,
        json!({"spec": {"controlPlaneEndpoint": endpoint}}),
        json!({"status": {"ready": true, "initialization": {"provisioned": true}}}),
    )
    .await?;

    let k8s_version = client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .unwrap_or_else(|_| "v1.33.0".to_string());
    // Only the semantic version (kube-apiserver's build may carry a suffix).
    let k8s_version = k8s_version
        .split(['-', '+'])
        .next()
        .unwrap_or("v1.33.0")
        .to_string();
    let cp = resource(
        CONTROL_PLANE_GROUP,
        CONTROL_PLANE_VERSION,
        CONTROL_PLANE_KIND,
        "simcontrolplanes",
    );
    apply_with_status(
        client,
        ns,
        cluster,
        &cp,
        json!({"spec": {"version": k8s_version, "controlPlaneEndpoint": endpoint}}),
        json!({"status": {
            "initialized": true,
            "ready": true,
            "initialization": {"controlPlaneInitialized": true},
            "version": k8s_version,
            "externalManagedControlPlane": true,
        }}),
    )
    .await?;

    let (infra_ref, cp_ref) = match version {
        CapiVersion::V1Beta1 => (
            json!({"apiVersion": infra.api_version, "kind": infra.kind, "name": cluster, "namespace": ns}),
            json!({"apiVersion": cp.api_version, "kind": cp.kind, "name": cluster, "namespace": ns}),
        ),
        CapiVersion::V1Beta2 => (
            json!({"apiGroup": INFRA_GROUP, "kind": infra.kind, "name": cluster}),
            json!({"apiGroup": CONTROL_PLANE_GROUP, "kind": cp.kind, "name": cluster}),
        ),
    };
    let cluster_resource = resource(
        "cluster.x-k8s.io",
        match version {
            CapiVersion::V1Beta1 => "v1beta1",
            CapiVersion::V1Beta2 => "v1beta2",
        },
        "Cluster",
        "clusters",
    );
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &cluster_resource);
    let body = json!({
        "apiVersion": cluster_resource.api_version, "kind": "Cluster",
        "metadata": {"name": cluster, "namespace": ns},
        "spec": {
            "clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}},
            "infrastructureRef": infra_ref,
            "controlPlaneRef": cp_ref,
        },
    });
    clusters
        .patch(cluster, &apply_params(), &Patch::Apply(&body))
        .await?;
    Ok(())
}

fn control_plane_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let cp = resource(
        CONTROL_PLANE_GROUP,
        CONTROL_PLANE_VERSION,
        CONTROL_PLANE_KIND,
        "simcontrolplanes",
    );
    Api::namespaced_with(client.clone(), ns, &cp)
}

/// A control-plane upgrade begins, as a control-plane provider shows it: `spec.version` raised
/// (one patch release above `status.version`, which stays). Cluster API's MachineSet preflight
/// check `ControlPlaneIsStable` then holds every scale-up of the Cluster (the contract's
/// "upgrading": a spec version above the status version). Returns the version it upgrades to.
pub async fn begin_control_plane_upgrade(
    client: &Client,
    ns: &str,
    cluster: &str,
) -> Result<String, UpgradeError> {
    let api = control_plane_api(client, ns);
    let cp = api.get(cluster).await?;
    let current = str_at(&cp.data, &["status", "version"])
        .ok_or(UpgradeError::NoVersion)?
        .to_string();
    let to = next_patch_release(&current).ok_or(UpgradeError::Unparsable(current))?;
    api.patch(
        cluster,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"version": to}})),
    )
    .await?;
    Ok(to)
}

/// The upgrade is done: `status.version` reaches `spec.version`, and the preflight check passes.
pub async fn finish_control_plane_upgrade(
    client: &Client,
    ns: &str,
    cluster: &str,
) -> Result<(), UpgradeError> {
    let api = control_plane_api(client, ns);
    let cp = api.get(cluster).await?;
    let to = str_at(&cp.data, &["spec", "version"])
        .ok_or(UpgradeError::NoVersion)?
        .to_string();
    api.patch_status(
        cluster,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"version": to}})),
    )
    .await?;
    Ok(())
}

/// What went wrong starting or finishing a control-plane upgrade.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("the control plane reports no version")]
    NoVersion,
    #[error("the control plane's version {0:?} is not vMAJOR.MINOR.PATCH")]
    Unparsable(String),
}

/// `v1.36.2` -> `v1.36.3`.
fn next_patch_release(version: &str) -> Option<String> {
    let (head, patch) = version.rsplit_once('.')?;
    let patch: u64 = patch.parse().ok()?;
    Some(format!("{head}.{}", patch + 1))
}

/// `name` of `ar` in `ns` with `body`'s spec, then its status.
async fn apply_with_status(
    client: &Client,
    ns: &str,
    name: &str,
    ar: &ApiResource,
    body: Value,
    status: Value,
) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
    let mut doc = json!({
        "apiVersion": ar.api_version, "kind": ar.kind,
        "metadata": {"name": name, "namespace": ns},
    });
    if let (Some(d), Some(b)) = (doc.as_object_mut(), body.as_object()) {
        d.extend(b.clone());
    }
    api.patch(name, &apply_params(), &Patch::Apply(&doc))
        .await?;
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// How the infrastructure provider behaves.
#[derive(Clone, Debug)]
pub struct ProviderConfig {
    pub version: CapiVersion,
    pub provider_delay: Duration,
    pub jitter: Duration,
    pub fail_fraction: f64,
    pub provider_id_style: ProviderIdStyle,
    pub seed: u64,
    /// Where "provider-id-set" milestones go: taken when a Machine is first seen with a
    /// provider ID (Cluster API copies it from the DevMachine).
    pub stats: Option<Stats>,
}

struct Inner {
    client: Client,
    cfg: ProviderConfig,
    rng: SimRng,
    /// DevMachines (by uid) whose provisioning has started.
    started: Mutex<HashSet<String>>,
    /// Machines (by uid) whose provider ID was seen.
    seen: Mutex<HashSet<String>>,
    /// Signalled on every Cluster event: a provisioning held by its Cluster's pause looks again.
    cluster_changed: Notify,
    shutdown: Shutdown,
}

/// Cluster API's pause annotation, which providers honour on their own objects.
const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

/// How often a held provisioning looks again without a Cluster event (its DevMachine's own
/// annotation may go, and its events do not reach the waiting task).
const PAUSE_RECHECK: Duration = Duration::from_secs(1);

/// Whether Cluster `name` in `ns` has `spec.paused` (a missing one does not), read fresh.
pub(super) async fn cluster_paused(
    client: &Client,
    version: CapiVersion,
    ns: &str,
    name: &str,
) -> Result<bool, kube::Error> {
    if name.is_empty() {
        return Ok(false);
    }
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &version.cluster());
    Ok(api
        .get_opt(name)
        .await?
        .is_some_and(|c| c.data.pointer("/spec/paused").and_then(Value::as_bool) == Some(true)))
}

/// Whether an infrastructure object is paused, as the provider contract asks providers to
/// honour it: its Cluster (the `cluster.x-k8s.io/cluster-name` label) has `spec.paused`, or the
/// object carries `cluster.x-k8s.io/paused`.
pub(super) async fn infra_paused(
    client: &Client,
    version: CapiVersion,
    obj: &DynamicObject,
    cluster: &str,
) -> Result<bool, kube::Error> {
    if obj.annotations().contains_key(PAUSED_ANNOTATION) {
        return Ok(true);
    }
    cluster_paused(
        client,
        version,
        &obj.namespace().unwrap_or_default(),
        cluster,
    )
    .await
}

/// Starts the infrastructure provider (and the provider-ID milestones) on the current runtime.
pub fn spawn(client: Client, cfg: ProviderConfig, shutdown: Shutdown) -> Vec<JoinHandle<()>> {
    let inner = Arc::new(Inner {
        rng: SimRng::new(cfg.seed ^ 0x5eed_ca91),
        client: client.clone(),
        cfg,
        started: Mutex::new(HashSet::new()),
        seen: Mutex::new(HashSet::new()),
        cluster_changed: Notify::new(),
        shutdown: shutdown.clone(),
    });
    let mut tasks = Vec::new();
    let me = inner.clone();
    tasks.push(spawn_watch(
        "clusters (infrastructure provider)",
        Api::<DynamicObject>::all_with(client.clone(), &inner.cfg.version.cluster()),
        shutdown.clone(),
        move |event| {
            if let Event::Apply(_) | Event::InitApply(_) | Event::Delete(_) = event {
                me.cluster_changed.notify_waiters();
            }
        },
    ));
    let me = inner.clone();
    tasks.push(spawn_watch(
        "devmachines (infrastructure provider)",
        Api::<DynamicObject>::all_with(client.clone(), &dev_machine_resource()),
        shutdown.clone(),
        move |event| {
            if let Event::Apply(m) | Event::InitApply(m) = event {
                me.on_dev_machine(m);
            }
        },
    ));
    // Templates publish the size of the machines they make, created when they may be.
    tasks.extend(crate::machine_size::spawn_publisher(
        client.clone(),
        None,
        shutdown.clone(),
    ));
    let me = inner.clone();
    tasks.push(spawn_watch(
        "machines (provider-ID milestones)",
        Api::<DynamicObject>::all_with(client, &inner.cfg.version.machine()),
        shutdown,
        move |event| {
            if let Event::Apply(m) | Event::InitApply(m) = event {
                me.on_machine(&m);
            }
        },
    ));
    tasks
}

impl Inner {
    fn on_dev_machine(self: &Arc<Self>, m: DynamicObject) {
        let has_id = str_at(&m.data, &["spec", "providerID"]).is_some_and(|p| !p.is_empty());
        if has_id || m.metadata.deletion_timestamp.is_some() {
            return;
        }
        let uid = m.uid().unwrap_or_default();
        if !self.started.lock().insert(uid) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move { me.provision(m).await });
    }

    fn on_machine(&self, m: &DynamicObject) {
        let has_id = str_at(&m.data, &["spec", "providerID"]).is_some_and(|p| !p.is_empty());
        if !has_id {
            return;
        }
        if self.seen.lock().insert(m.uid().unwrap_or_default())
            && let Some(stats) = &self.cfg.stats
        {
            stats.milestone(
                PROVIDER_ID_SET,
                &m.namespace().unwrap_or_default(),
                &m.name_any(),
            );
        }
    }

    /// DevMachine `name` read fresh once neither it nor its Cluster is paused; None when it is
    /// gone or being deleted, or on shutdown.
    async fn await_unpaused(&self, api: &Api<DynamicObject>, name: &str) -> Option<DynamicObject> {
        let mut stop = self.shutdown.clone();
        let mut logged = false;
        loop {
            // Registered before reading, so a Cluster event meanwhile still wakes us.
            let changed = self.cluster_changed.notified();
            let fresh = retry("devmachine get", &self.shutdown, || api.get(name))
                .await
                .ok()?;
            if fresh.metadata.deletion_timestamp.is_some() {
                return None;
            }
            let cluster = fresh
                .labels()
                .get(CLUSTER_NAME_LABEL)
                .cloned()
                .unwrap_or_default();
            let paused = retry("paused check", &self.shutdown, || {
                infra_paused(&self.client, self.cfg.version, &fresh, &cluster)
            })
            .await
            .ok()?;
            if !paused {
                return Some(fresh);
            }
            if !logged {
                tracing::debug!(devmachine = %name, cluster, "simulated provider: paused, holding the instance");
                logged = true;
            }
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep(PAUSE_RECHECK) => {}
                _ = stop.wait() => return None,
            }
        }
    }

    /// The cloud makes the instance: after the delay, the DevMachine gets its provider ID and
    /// reports itself provisioned.
    async fn provision(&self, m: DynamicObject) {
        let ns = m.namespace().unwrap_or_default();
        let name = m.name_any();
        if self.rng.chance(self.cfg.fail_fraction) {
            tracing::info!(devmachine = %name, "simulated provider: this DevMachine never gets a providerID");
            return;
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &ns, &dev_machine_resource());
        // A paused Cluster's instances are not launched until it resumes, and one paused while
        // launching is not reported until then (real providers skip a paused object's
        // reconcile).
        if self.await_unpaused(&api, &name).await.is_none() {
            return;
        }
        let delay = self.rng.delay(self.cfg.provider_delay, self.cfg.jitter);
        if !self.shutdown.sleep(delay).await {
            return;
        }
        let Some(fresh) = self.await_unpaused(&api, &name).await else {
            return;
        };
        // The instance is named after its Machine (the kubelet names its Node so).
        let machine = fresh
            .owner_references()
            .iter()
            .find(|o| o.kind == "Machine")
            .map_or_else(|| name.clone(), |o| o.name.clone());
        let zone = str_at(&fresh.data, &["spec", "failureDomain"]).map(str::to_string);
        let provider_id = provider_id_for(
            self.cfg.provider_id_style,
            &self.rng,
            &machine,
            zone.as_deref(),
        );
        let spec = json!({"spec": {"providerID": provider_id}});
        let status = json!({"status": {
            "ready": true,
            "initialization": {"provisioned": true},
            "addresses": [{"type": "Hostname", "address": machine}],
        }});
        for (what, status_write) in [("providerID", false), ("status", true)] {
            let body = if status_write { &status } else { &spec };
            let wrote = retry(what, &self.shutdown, || async {
                let patch = Patch::Merge(body);
                let params = PatchParams::default();
                let result = if status_write {
                    api.patch_status(&name, &params, &patch).await
                } else {
                    api.patch(&name, &params, &patch).await
                };
                result.map(drop).inspect_err(|e| {
                    log_retry(
                        "infrastructure provider",
                        &format!("DevMachine {ns}/{name}"),
                        e,
                    )
                })
            })
            .await;
            if wrote.is_err() {
                return;
            }
        }
        tracing::debug!(devmachine = %name, %provider_id, "provider ID set");
    }
}

#[cfg(test)]
mod tests;
