//! The simulated cluster's real backend: a real control plane (`controlplane`: etcd,
//! kube-apiserver, kube-scheduler, kube-controller-manager) in place of the simulated server,
//! with the Cluster API CRDs (upstream's), the project's CRDs and the infrastructure template
//! CRD installed.
//!
//! Reports read the cluster through the same two things as on the simulated backend, each fed
//! from the real API server and never from the controller:
//! - a mirror [`Store`] kept by watches (pods, Nodes, NodeClaims, NodePools, Cluster API objects,
//!   PodDisruptionBudgets), for counts, invariants and settlement;
//! - [`Stats`] fed by kube-apiserver's audit log: requests by verb, successful writes by target,
//!   and who made them. A request counts as the controller's when its user is the controller's
//!   (the Helm chart's ServiceAccount, module `chart`), whatever User-Agent it sends. Pod
//!   removals by the controller are checked against the drain rules (`drain_audit`) on the
//!   mirror, as the simulated server checks them, and its refused requests (403: a permission
//!   the chart lacks) are counted for the report.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::watcher::Event;
use kube::{Api, Client};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::task::JoinHandle;

use super::capi::CapiVersion;
use super::drain_audit::{self, Removal};
use super::registry::{CapiVersions, Registry, ResourceDef};
use super::standin::{Shutdown, spawn_watch};
use super::{SimConfig, Stats, Store};
use crate::controlplane::cluster_api::{self, ClusterApi};
use crate::controlplane::{self, ControlPlane, audit};

mod chart;
pub mod pool;
pub mod provider;
pub mod topology;
pub use chart::TOOLS_VARIABLE;

pub use super::upstream::UPSTREAM_VARIABLE;

/// The upstream CRDs installed besides Cluster API's core kinds: the Dev infrastructure
/// template the stand-ins' MachineDeployments point at.
const DEV_TEMPLATE_CRD: &str = "infrastructure.cluster.x-k8s.io_devmachinetemplates.yaml";

/// What the mirror watches: (group, version, plural).
/// ReplicaSets because a budget's expected pods are counted from their Deployments' scale
/// (the drain audit checks removals against budgets on the mirror); Events because scenarios
/// and tests read what the controller told (the repair scenario waits for its
/// `NodeRepairBlocked` Events).
const MIRRORED: [(&str, &str, &str); 14] = [
    ("events.k8s.io", "v1", "events"),
    ("", "v1", "pods"),
    ("", "v1", "nodes"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("apps", "v1", "deployments"),
    ("apps", "v1", "replicasets"),
    ("karpenter.sh", "v1", "nodeclaims"),
    ("karpenter.sh", "v1", "nodepools"),
    ("cluster.x-k8s.io", CAPI_VERSION, "machinedeployments"),
    ("cluster.x-k8s.io", CAPI_VERSION, "machinesets"),
    ("cluster.x-k8s.io", CAPI_VERSION, "machines"),
    ("cluster.x-k8s.io", CAPI_VERSION, "machinepools"),
    ("autoscaling.x-k8s.io", "v1beta1", "capacitybuffers"),
    ("autoscaling.x-k8s.io", "v1beta1", "capacityquotas"),
];

/// Stands for the Cluster API version in use in [`MIRRORED`].
const CAPI_VERSION: &str = "(cluster-api)";

/// How often the audit log is read.
const AUDIT_POLL: Duration = Duration::from_millis(100);

/// How long a pod removal waits for its pod to reach the mirror before it is given up (and
/// said so).
const UNMIRRORED_WAIT: Duration = Duration::from_secs(60);

/// How long a deleted pod is remembered, so an audit line read after the mirror saw the pod go
/// can still be checked against the pod as it was.
const TOMBSTONE_TTL: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the real control plane: {0}")]
    ControlPlane(#[from] controlplane::Error),
    #[error(
        "the upstream Cluster API CRDs are not in {} (set {UPSTREAM_VARIABLE} to the directory \
         holding crds/, e.g. ../shared/upstream): {source}",
        dir.display()
    )]
    Upstream {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the CRD {}: {reason}", file.display())]
    Crd { file: PathBuf, reason: String },
    #[error("installing CRDs on the real control plane: {0}")]
    Install(#[source] kube::Error),
    #[error("CRD {0} not Established after {1:?}")]
    NotEstablished(String, Duration),
    #[error("the mirror's registry: {0}")]
    Registry(String),
    #[error(
        "{} is missing (set {TOOLS_VARIABLE} to the directory holding kubectl and helm; \
         .ci/install-tools fetches them): the controller runs under the Helm chart's RBAC",
        .0.display()
    )]
    Tool(PathBuf),
    #[error("the Helm chart is not at {}", .0.display())]
    Chart(PathBuf),
    #[error("the Helm chart's RBAC for the controller: {0}")]
    Rbac(#[from] controlplane::rbac::Error),
    #[error("Cluster API: {0}")]
    ClusterApi(#[from] cluster_api::Error),
    #[error("the workload cluster's objects for Cluster API: {0}")]
    Provider(#[source] kube::Error),
    #[error("{0}")]
    Topology(String),
}

/// The running real backend. Dropping it (or [`RealBackend::stop`]) stops the control plane.
pub struct RealBackend {
    plane: Mutex<Option<ControlPlane>>,
    /// Cluster API's real manager (`--cluster-api real`), stopped before the control plane.
    cluster_api: Mutex<Option<ClusterApi>>,
    /// The release of that manager (kept after it stopped, for reports).
    cluster_api_release: Option<String>,
    capi_version: CapiVersion,
    workload_kubeconfig: String,
    apiserver_port: u16,
    kubeconfig: PathBuf,
    controller_kubeconfig: PathBuf,
    url: String,
    store: Arc<Store>,
    stats: Stats,
    feed: Arc<Mutex<AuditFeed>>,
}

impl RealBackend {
    /// Checks the upstream CRDs, the tools and the chart are there, starts the control plane
    /// from `KUBEBUILDER_ASSETS`, installs the CRDs and the chart's RBAC (the controller's
    /// access) and starts the mirror and the audit reader (tasks ending on `shutdown`). With
    /// `cluster_api_release`, Cluster API's real manager of that release runs too (its CRDs in
    /// place of upstream's, module `controlplane::cluster_api`), with the providers' CRDs
    /// (module `provider`; the workload cluster's objects come with [`Self::ensure_cluster`]).
    pub async fn start(
        seed: u64,
        capi_version: CapiVersion,
        cluster_api_release: Option<String>,
        shutdown: Shutdown,
    ) -> Result<(Self, Client, Vec<JoinHandle<()>>), Error> {
        let capi_options = cluster_api_release
            .as_deref()
            .map(|release| cluster_api::Options {
                provider_groups: [provider::groups(), topology::groups()].concat(),
                ..cluster_api::Options::from_env(release)
            });
        if let Some(o) = &capi_options {
            o.check()?;
        }
        let crds = upstream_crds(capi_options.is_none())?;
        let chart = chart::Chart::locate()?;
        let options = controlplane::Options::from_env()?;
        let plane = ControlPlane::start(options).await?;
        let client = plane.new_client().await?;
        install(&client, crds, capi_options.is_some()).await?;
        let access = chart.install(&plane).await?;
        let workload_kubeconfig = plane.workload_kubeconfig()?;
        let apiserver_port = plane.ports().apiserver;
        let capi = match capi_options {
            Some(o) => {
                let capi = ClusterApi::start(&plane, o).await?;
                provider::install_crds(&client).await?;
                topology::install_crds(&client).await?;
                Some(capi)
            }
            None => None,
        };

        let served = match capi_version {
            CapiVersion::V1Beta1 => CapiVersions::V1Beta1,
            CapiVersion::V1Beta2 => CapiVersions::V1Beta2,
        };
        let registry = Arc::new(
            Registry::new(
                served,
                SimConfig::default()
                    .with_infrastructure_templates()
                    .extra_resources,
            )
            .map_err(Error::Registry)?,
        );
        let store = Arc::new(Store::new(registry, 1_000, 100_000, seed));
        let stats = Stats::new();
        let tombstones = Tombstones::default();
        let mut tasks = mirror(&client, &store, &tombstones, capi_version, &shutdown);
        let feed = Arc::new(Mutex::new(AuditFeed {
            tail: audit::Tail::new(plane.audit_log()),
            stats: stats.clone(),
            store: store.clone(),
            tombstones,
            controller_user: access.username(),
            unresolved: Vec::new(),
        }));
        tasks.push(tokio::spawn(read_audit(feed.clone(), shutdown)));
        let url = format!("https://127.0.0.1:{}", plane.ports().apiserver);
        let backend = RealBackend {
            kubeconfig: plane.kubeconfig().to_path_buf(),
            controller_kubeconfig: access.kubeconfig.clone(),
            url,
            plane: Mutex::new(Some(plane)),
            cluster_api: Mutex::new(capi),
            cluster_api_release,
            capi_version,
            workload_kubeconfig,
            apiserver_port,
            store,
            stats,
            feed,
        };
        Ok((backend, client, tasks))
    }

    /// The release of Cluster API's real manager, when one runs (or ran) here.
    pub fn cluster_api_release(&self) -> Option<&str> {
        self.cluster_api_release.as_deref()
    }

    /// `f` of Cluster API's running manager (None without one, or once stopped).
    pub fn with_cluster_api<R>(&self, f: impl FnOnce(&ClusterApi) -> R) -> Option<R> {
        self.cluster_api.lock().as_ref().map(f)
    }

    /// The workload cluster `cluster`'s objects for Cluster API in namespace `ns` (a Cluster,
    /// its providers' objects and its kubeconfig Secret), where Cluster API's real manager
    /// runs; nothing otherwise. Idempotent.
    pub async fn ensure_cluster(
        &self,
        client: &Client,
        ns: &str,
        cluster: &str,
    ) -> Result<(), Error> {
        if self.cluster_api_release.is_none() {
            return Ok(());
        }
        provider::ensure_cluster(
            client,
            ns,
            cluster,
            self.capi_version,
            self.apiserver_port,
            &self.workload_kubeconfig,
        )
        .await
        .map_err(Error::Provider)
    }

    /// A ClusterClass-managed workload cluster `cluster` in `ns` whose worker entries are
    /// `workers` (module `topology`), where Cluster API's real manager runs (either version).
    pub async fn ensure_topology_cluster(
        &self,
        client: &Client,
        ns: &str,
        cluster: &str,
        workers: Value,
    ) -> Result<(), Error> {
        if self.cluster_api_release.is_none() {
            return Err(Error::Topology(
                "a ClusterClass-managed cluster needs Cluster API's real manager".into(),
            ));
        }
        let version = topology::kubernetes_version(client).await;
        let spec = topology::TopologyCluster {
            namespace: ns,
            name: cluster,
            kubernetes_version: &version,
            workload_kubeconfig: &self.workload_kubeconfig,
            capi_version: self.capi_version,
        };
        topology::ensure_cluster(client, &spec, workers)
            .await
            .map_err(Error::Provider)
    }

    /// The API server's port (the workload clusters' control-plane endpoint).
    pub fn apiserver_port(&self) -> u16 {
        self.apiserver_port
    }

    /// The administrator's kubeconfig (the stand-ins, kubectl).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The controller's kubeconfig: the chart's ServiceAccount's token, so the controller holds
    /// the chart's permissions only and the audit log tells its requests apart.
    pub fn controller_kubeconfig_path(&self) -> &Path {
        &self.controller_kubeconfig
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The counters, with the audit log read up to now first, so a report taken right after
    /// the cluster settled counts its last requests.
    pub fn stats(&self) -> Stats {
        self.feed.lock().pump();
        self.stats.clone()
    }

    /// `f` of the running control plane (None once stopped): its processes, ports, logs.
    pub fn with_control_plane<R>(&self, f: impl FnOnce(&ControlPlane) -> R) -> Option<R> {
        self.plane.lock().as_ref().map(f)
    }

    /// Stops every process of the control plane and removes its directory (idempotent).
    pub fn stop(&self) {
        // Cluster API's manager first: it would only log the API server going away.
        if let Some(capi) = self.cluster_api.lock().take() {
            capi.stop();
        }
        if let Some(plane) = self.plane.lock().take() {
            plane.stop();
        }
    }
}

impl Drop for RealBackend {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The upstream CRD files, read before anything starts, so a missing directory is a clear error
/// and not a half-started control plane.
/// Cluster API's core CRDs are among them unless `with_capi` is false (Cluster API's real
/// manager installs its own).
fn upstream_crds(with_capi: bool) -> Result<Vec<(PathBuf, String)>, Error> {
    let dir = super::upstream::crds_dir();
    let capi: &[&str] = if with_capi {
        &super::upstream::CAPI_CRDS
    } else {
        &[]
    };
    capi.iter()
        .chain(std::iter::once(&DEV_TEMPLATE_CRD))
        .map(|f| {
            let file = dir.join(f);
            std::fs::read_to_string(&file)
                .map(|text| (file, text))
                .map_err(|source| Error::Upstream {
                    dir: dir.clone(),
                    source,
                })
        })
        .collect()
}

/// Creates the upstream and the project's CRDs and waits until each is Established. With
/// `contract_labels`, the infrastructure template's CRD carries the labels that tell Cluster
/// API's real manager its contract version (as a provider's CRDs do).
async fn install(
    client: &Client,
    upstream: Vec<(PathBuf, String)>,
    contract_labels: bool,
) -> Result<(), Error> {
    let mut crds = crate::project_crds::all().map_err(|reason| Error::Crd {
        file: PathBuf::from("deploy/crds"),
        reason,
    })?;
    for (file, text) in upstream {
        let mut crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).map_err(|e| Error::Crd {
                file: file.clone(),
                reason: e.to_string(),
            })?;
        if contract_labels && file.ends_with(DEV_TEMPLATE_CRD) {
            let labels = crd.metadata.labels.get_or_insert_with(Default::default);
            if let Some(map) = provider::contract_labels().as_object() {
                for (k, v) in map {
                    labels.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
                }
            }
        }
        crds.push(crd);
    }
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in &crds {
        api.create(&PostParams::default(), crd)
            .await
            .map_err(Error::Install)?;
    }
    let began = Instant::now();
    let limit = Duration::from_secs(60);
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let got = api.get(&name).await.map_err(Error::Install)?;
            let established = got
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if began.elapsed() > limit {
                return Err(Error::NotEstablished(name, limit));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// A pod as last mirrored, and when it was removed.
type Buried = (Value, Instant);

/// Pods removed from the mirror lately, by (namespace, name).
#[derive(Clone, Default)]
struct Tombstones(Arc<Mutex<HashMap<(String, String), Buried>>>);

impl Tombstones {
    fn bury(&self, ns: &str, name: &str, pod: Value) {
        let mut map = self.0.lock();
        map.retain(|_, (_, at)| at.elapsed() < TOMBSTONE_TTL);
        map.insert((ns.to_string(), name.to_string()), (pod, Instant::now()));
    }

    fn get(&self, ns: &str, name: &str) -> Option<Value> {
        self.0
            .lock()
            .get(&(ns.to_string(), name.to_string()))
            .map(|(v, _)| v.clone())
    }
}

/// One watch per mirrored kind, each keeping the store in step with the real API server.
fn mirror(
    client: &Client,
    store: &Arc<Store>,
    tombstones: &Tombstones,
    capi_version: CapiVersion,
    shutdown: &Shutdown,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    let capi = match capi_version {
        CapiVersion::V1Beta1 => "v1beta1",
        CapiVersion::V1Beta2 => "v1beta2",
    };
    for (group, version, plural) in MIRRORED {
        let version = if version == CAPI_VERSION {
            capi
        } else {
            version
        };
        let Some(def) = store.registry().lookup(group, version, plural).cloned() else {
            tracing::warn!(group, plural, "the mirror's registry lacks a mirrored kind");
            continue;
        };
        let ar = ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: def.api_version(version),
            kind: def.kind.clone(),
            plural: plural.into(),
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let store = store.clone();
        let tombstones = tombstones.clone();
        let mut relisted: HashSet<(String, String)> = HashSet::new();
        tasks.push(spawn_watch(
            "real-backend mirror",
            api,
            shutdown.clone(),
            move |e| on_event(&store, &def, &tombstones, &mut relisted, e),
        ));
    }
    tasks
}

fn on_event(
    store: &Store,
    def: &ResourceDef,
    tombstones: &Tombstones,
    relisted: &mut HashSet<(String, String)>,
    event: Event<DynamicObject>,
) {
    let keyed = |o: &DynamicObject| {
        let value = serde_json::to_value(o).unwrap_or(Value::Null);
        let ns = o.metadata.namespace.clone().unwrap_or_default();
        let name = o.metadata.name.clone().unwrap_or_default();
        (ns, name, value)
    };
    match event {
        Event::Init => relisted.clear(),
        Event::InitApply(o) => {
            let (ns, name, value) = keyed(&o);
            store.mirror_put(def, &ns, value);
            relisted.insert((ns, name));
        }
        Event::InitDone => {
            for (ns, name) in store.mirror_keys(def) {
                if !relisted.contains(&(ns.clone(), name.clone())) {
                    remove(store, def, tombstones, &ns, &name);
                }
            }
            relisted.clear();
        }
        Event::Apply(o) => {
            let (ns, _, value) = keyed(&o);
            store.mirror_put(def, &ns, value);
        }
        Event::Delete(o) => {
            let (ns, name, _) = keyed(&o);
            remove(store, def, tombstones, &ns, &name);
        }
    }
}

fn remove(store: &Store, def: &ResourceDef, tombstones: &Tombstones, ns: &str, name: &str) {
    if def.plural == "pods"
        && def.group.is_empty()
        && let Some(pod) = store.get("pods", ns, name)
    {
        tombstones.bury(ns, name, pod);
    }
    store.mirror_remove(def, ns, name);
}

/// The audit log's reader and what it feeds.
struct AuditFeed {
    tail: audit::Tail,
    stats: Stats,
    store: Arc<Store>,
    tombstones: Tombstones,
    controller_user: String,
    unresolved: Vec<(PodRemoval, Instant)>,
}

impl AuditFeed {
    /// Reads what the log gained since the last call into the counters.
    fn pump(&mut self) {
        // Removals read earlier whose pod the mirror had not seen yet (its watch lags the log).
        let waiting = std::mem::take(&mut self.unresolved);
        for (removal, since) in waiting {
            self.check(removal, since);
        }
        match self.tail.read_new() {
            Ok(events) => {
                for e in events {
                    if let Some(removal) = record(&self.stats, &self.controller_user, &e) {
                        self.check(removal, Instant::now());
                    }
                }
            }
            // Every time: the requests of a batch that fails to read are missing from the report.
            Err(e) => tracing::error!(error = %e, "reading the real API server's audit log"),
        }
    }

    /// Checks a pod removal against the drain rules once the mirror has (or had) the pod.
    fn check(&mut self, r: PodRemoval, since: Instant) {
        let pod = self
            .store
            .get("pods", &r.namespace, &r.name)
            .or_else(|| self.tombstones.get(&r.namespace, &r.name));
        let Some(pod) = pod else {
            if since.elapsed() < UNMIRRORED_WAIT {
                self.unresolved.push((r, since));
            } else {
                tracing::warn!(pod = %format!("{}/{}", r.namespace, r.name), "a pod the controller removed never reached the mirror; its removal is not audited");
            }
            return;
        };
        let found = drain_audit::audit_removed_pod(&self.store, &pod, &r.namespace, r.how, r.asked);
        for v in found {
            tracing::warn!(pod = %format!("{}/{}", r.namespace, r.name), violation = ?v, "real backend: drain rule broken");
            self.stats.record_violation_at(
                r.at_ms,
                v,
                &r.namespace,
                &r.name,
                crate::CONTROLLER_USER_AGENT,
            );
        }
    }
}

/// The controller removing a pod (a delete or an eviction that succeeded), to check.
struct PodRemoval {
    how: Removal,
    namespace: String,
    name: String,
    asked: jiff::Timestamp,
    at_ms: u64,
}

/// Reads the audit log into the counters every [`AUDIT_POLL`] until shutdown.
async fn read_audit(feed: Arc<Mutex<AuditFeed>>, mut shutdown: Shutdown) {
    loop {
        feed.lock().pump();
        tokio::select! {
            _ = shutdown.wait() => break,
            _ = tokio::time::sleep(AUDIT_POLL) => {}
        }
    }
}

/// A request of the controller's that RBAC refused: counted for the report (which fails on
/// it), and said at once, the first time, so a run that then stalls shows why.
fn refused(stats: &Stats, e: &audit::Event) {
    let uri = e.request_uri.as_str();
    let path = uri.split_once('?').map_or(uri, |(path, _)| path);
    let request = format!("{} {path}", e.verb);
    if !stats.refused().contains_key(&request) {
        tracing::error!(%request, user = %e.username, "the API server refused the controller (a permission the Helm chart lacks)");
    }
    stats.record_refused(request);
}

/// One audit event into the counters, as the simulated server counts the request itself; a pod
/// removal by the controller is handed back to be checked against the drain rules.
fn record(stats: &Stats, controller_user: &str, e: &audit::Event) -> Option<PodRemoval> {
    // The controller is told apart by its user; its requests carry the controller's agent so
    // the reports' filters read them as on the simulated backend.
    let agent = if e.username == controller_user {
        crate::CONTROLLER_USER_AGENT.to_string()
    } else {
        format!("{} ({})", e.username, e.user_agent)
    };
    if e.username == controller_user && e.code == Some(403) && e.is_request() {
        refused(stats, e);
    }
    if e.resource.is_empty() {
        return None;
    }
    if e.is_request() {
        stats.count_request(&e.verb, &e.resource, &e.subresource, &agent);
    }
    if !e.is_successful_write() {
        return None;
    }
    // A write is placed when the API server received it, not when its response completed: a
    // write it caused (a watcher acting on it) is received after it was committed, so always
    // after this, while the first write's response may complete a few milliseconds after the
    // second's (seen: a claim deleted "4 ms before" the Machine deletion it followed).
    let at_ms = stats.ms_at(e.received);
    // A server-side apply that made its object (answered 201, as Cluster API's manager makes
    // its Machines and MachineSets) is a create in the write log, as a POST is.
    let verb = if e.verb == "patch" && e.code == Some(201) {
        "create"
    } else {
        e.verb.as_str()
    };
    stats.record_write_at(
        at_ms,
        verb,
        &e.resource,
        &e.subresource,
        &e.namespace,
        &e.name,
        &agent,
    );
    let how = match (e.verb.as_str(), e.subresource.as_str()) {
        ("delete", "") => Removal::Delete,
        ("create", "eviction") => Removal::Eviction,
        _ => return None,
    };
    let controllers_pod =
        e.username == controller_user && e.resource == "pods" && e.api_group.is_empty();
    controllers_pod.then(|| PodRemoval {
        how,
        namespace: e.namespace.clone(),
        name: e.name.clone(),
        asked: e.received,
        at_ms,
    })
}
