//! `SimCluster`: the in-process API server plus the Cluster API, kubelet and scheduler
//! stand-ins, and helpers to seed it with MachineDeployments, infrastructure templates and pods.
//! Tests, benchmarks and the `simulate` command start one of these and point the controller
//! at `client()` / `kubeconfig_path()`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use super::capi::{self, CapiConfig, CapiVersion, ProviderIdStyle};
use super::disruption_audit::DisruptionAudit;
use super::kubelet::KubeletConfig;
use super::real::{self, RealBackend};
use super::scheduler::{BindLog, BindRecord, SchedulerConfig};
use super::standin::{Clusters, ShutdownTrigger, shutdown_pair};
use super::{Faults, SimError, SimServer, Stats, Store, wellknown};

mod seed;
mod seed_pool;
mod start;
pub use seed::{
    PodShape, infra_template_resource, infrastructure_template, machine_deployment, machine_pool,
};
use start::{
    is_cluster_api_group, is_karpenter_group, join_management, spawn_standins, start_management,
    start_server,
};

/// Cluster name every seeded Cluster API object belongs to.
pub const CLUSTER_NAME: &str = "sim";
/// Infrastructure group and kind of the seeded machine templates (Cluster API's in-memory
/// "Dev" provider, whose template carries `status.capacity`).
pub const INFRA_GROUP: &str = "infrastructure.cluster.x-k8s.io";
pub const INFRA_VERSION: &str = "v1beta2";
pub const INFRA_TEMPLATE_KIND: &str = "DevMachineTemplate";
pub const BOOTSTRAP_GROUP: &str = "bootstrap.cluster.x-k8s.io";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("simulated API server: {0}")]
    Server(#[from] SimError),
    #[error("simulated cluster: {what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Real(#[from] real::Error),
    #[error("{0} exists only on the simulated backend, not on a real control plane")]
    NotOnRealBackend(&'static str),
    #[error("{0}")]
    Preload(String),
    #[error(
        "Cluster API {0:?} on a real control plane needs Cluster API's conversion webhook, which \
         is not run; use v1beta2"
    )]
    VersionOnRealBackend(CapiVersion),
    #[error("Cluster API's real manager needs the real control plane (--control-plane real)")]
    RealClusterApiNeedsRealControlPlane,
    #[error(
        "a ClusterClass topology needs Cluster API's real manager (--cluster-api real): the \
         stand-in has no topology controller"
    )]
    TopologyNeedsRealClusterApi,
}

/// Who plays Cluster API's controllers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ClusterApiBackend {
    /// The project's stand-in (`sim::capi`), on either backend.
    #[default]
    Simulated,
    /// Cluster API's real core manager of this release (real control plane only; module
    /// `controlplane::cluster_api`), the simulator playing only its providers
    /// (`sim::real::provider`) and the kubelets.
    Real { release: String },
}

impl ClusterApiBackend {
    pub fn is_real(&self) -> bool {
        matches!(self, ClusterApiBackend::Real { .. })
    }
}

/// Objects put into the simulated server's store after it starts and before any stand-in
/// does, so the stand-ins' first lists hold them all, as a real controller's informers do on a
/// cluster that is already there. Loaded while they run instead, a MachineSet could be seen
/// before its Machines (two watches keep no order between them) and scaled up a second time.
pub type Preload = Box<dyn FnOnce(&Store) -> Result<(), String> + Send>;

/// What serves the cluster's API.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The project's own API server (`SimServer`) and its scheduler stand-in.
    #[default]
    Simulated,
    /// A real control plane from `KUBEBUILDER_ASSETS` (module `real`): kube-scheduler binds
    /// pods, kube-controller-manager runs Deployments, ReplicaSets, PodDisruptionBudget status
    /// and garbage collection.
    Real,
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}

/// Which Cluster API versions the simulated server serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServedVersions {
    V1beta1,
    V1beta2,
    #[default]
    Both,
}

#[derive(Clone, Debug)]
pub struct SimClusterConfig {
    /// The simulated server or a real control plane.
    pub backend: Backend,
    /// Cluster API's stand-in or its real manager.
    pub cluster_api: ClusterApiBackend,
    /// The version the stand-ins (and the seeding helpers) write.
    pub capi_version: CapiVersion,
    /// The versions the server serves (must include `capi_version`).
    pub served: ServedVersions,
    pub provider_delay: Duration,
    pub jitter: Duration,
    pub fail_fraction: f64,
    pub node_ready_delay: Duration,
    /// See [`KubeletConfig::device_plugin_delay`].
    pub device_plugin_delay: Duration,
    /// See [`KubeletConfig::not_ready_taint`] (simulated backend only; a real control plane
    /// taints and untaints itself). On by default, as kube-apiserver and
    /// kube-controller-manager do it.
    pub not_ready_taint: bool,
    pub node_delete_delay: Duration,
    /// How long a pod takes to exit once deleted (per pod: the
    /// `sim.karpenter.cluster.x-k8s.io/exit-after` annotation); never past its grace period.
    pub pod_exit_delay: Duration,
    pub provider_id_style: ProviderIdStyle,
    pub seed: u64,
    /// Run the scheduler stand-in (off when a test wants to drive pod binding itself).
    pub scheduler: bool,
    pub scheduler_debounce: Duration,
    /// Port of the API server on 127.0.0.1 (0: any free port).
    pub port: u16,
    /// Also write the kubeconfig here (`simulate --kubeconfig-out`); the file is left in place
    /// when the cluster stops, unlike the server's own temporary one.
    pub kubeconfig_out: Option<PathBuf>,
    /// More kinds the simulated server serves (another cluster's infrastructure templates,
    /// `simulate --from-cluster`); those it serves already are kept as they are.
    pub extra_resources: Vec<super::ResourceDef>,
    /// Run Cluster API's objects in a management cluster of their own, a second simulated
    /// server, as Cluster API deploys them: Machines and MachineDeployments there, Nodes, Pods
    /// and Karpenter's objects in the workload cluster (`client`). The management cluster
    /// holds the Cluster and its `<cluster>-kubeconfig` Secret for the workload cluster, as
    /// Cluster API writes them. Simulated backend only.
    pub management_apart: bool,
    /// Karpenter's objects (NodePools, NodeClaims, NodeClasses, NodeOverlays) in the management
    /// cluster too, each bound to Cluster `sim` by its labels, as `--karpenter-objects
    /// management` keeps them; the workload cluster holds only Nodes, Pods and the like.
    /// Implies [`SimClusterConfig::management_apart`] unless the management cluster is shared.
    pub karpenter_in_management: bool,
    /// A management cluster shared with other workload clusters (a fleet), instead of one of
    /// its own: this cluster's Cluster `sim`, its kubeconfig Secret and Cluster API's objects
    /// go in the namespace given, and its stand-ins watch only there. Simulated backend only.
    pub shared_management: Option<SharedManagement>,
}

/// A management cluster several workload clusters share, each in a namespace of its own
/// ([`SimClusterConfig::shared_management`]).
#[derive(Clone)]
pub struct SharedManagement {
    pub server: Arc<SimServer>,
    pub namespace: String,
}

impl SharedManagement {
    /// The management cluster for workload clusters to share: a simulated server serving the
    /// Cluster API versions `cfg` says, holding nothing yet (each workload cluster adds its
    /// Cluster when it starts). It serves on a thread of its own, so any runtime may start it.
    pub async fn start_server(cfg: &SimClusterConfig) -> Result<Arc<SimServer>, Error> {
        let cfg = SimClusterConfig {
            port: 0,
            kubeconfig_out: None,
            ..cfg.clone()
        };
        Ok(Arc::new(start_server(&cfg).await?))
    }

    /// Workload cluster `namespace`'s part of the shared management cluster `server`.
    pub fn new(server: &Arc<SimServer>, namespace: &str) -> Self {
        Self {
            server: server.clone(),
            namespace: namespace.to_string(),
        }
    }
}

impl std::fmt::Debug for SharedManagement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedManagement")
            .field("url", &self.server.url())
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl Default for SimClusterConfig {
    fn default() -> Self {
        let capi = CapiConfig::default();
        Self {
            backend: Backend::default(),
            cluster_api: ClusterApiBackend::default(),
            capi_version: CapiVersion::default(),
            served: ServedVersions::default(),
            provider_delay: capi.provider_delay,
            jitter: capi.jitter,
            fail_fraction: capi.fail_fraction,
            node_ready_delay: KubeletConfig::default().node_ready_delay,
            device_plugin_delay: Duration::ZERO,
            not_ready_taint: true,
            node_delete_delay: capi.node_delete_delay,
            pod_exit_delay: Duration::from_millis(100),
            provider_id_style: capi.provider_id_style,
            seed: capi.seed,
            scheduler: true,
            scheduler_debounce: SchedulerConfig::default().debounce,
            port: 0,
            kubeconfig_out: None,
            extra_resources: Vec::new(),
            management_apart: false,
            karpenter_in_management: false,
            shared_management: None,
        }
    }
}

/// What a seeded MachineDeployment looks like.
#[derive(Clone, Debug, Default)]
pub struct MachineDeploymentSeed {
    pub name: String,
    pub namespace: String,
    pub replicas: i64,
    /// On the MachineDeployment itself (e.g. the karpenter-member label).
    pub labels: BTreeMap<String, String>,
    /// On the Machine template (propagated to Machines, and some of them to Nodes).
    pub template_labels: BTreeMap<String, String>,
    /// Scale-from-zero, size and price annotations.
    pub annotations: BTreeMap<String, String>,
    /// The infrastructure template it points at (defaults to the MD's name).
    pub infrastructure_template: Option<String>,
    pub kubernetes_version: Option<String>,
}

/// The API server behind a [`SimCluster`].
enum Served {
    Simulated(SimServer),
    Real {
        backend: Box<RealBackend>,
        /// The administrator's client configuration, for `new_client`.
        config: Box<kube::Config>,
    },
}

pub struct SimCluster {
    served: Served,
    /// The workload cluster's client.
    client: Client,
    /// With the management cluster apart, its server (shared with other workload clusters
    /// when [`SimClusterConfig::shared_management`] says).
    management_server: Option<Arc<SimServer>>,
    /// The management cluster's client (the workload cluster's when joined).
    management: Client,
    cfg: SimClusterConfig,
    trigger: ShutdownTrigger,
    tasks: Vec<JoinHandle<()>>,
    binds: BindLog,
    audit: DisruptionAudit,
    capi: capi::Caches,
}

impl SimCluster {
    /// Starts the API server (or the real control plane) and the stand-ins on the current
    /// runtime.
    pub async fn start(cfg: SimClusterConfig) -> Result<Self, Error> {
        Self::start_preloaded(cfg, None).await
    }

    /// [`SimCluster::start`], with `preload` put into the store before the stand-ins start
    /// (simulated backend only).
    pub async fn start_preloaded(
        cfg: SimClusterConfig,
        preload: Option<Preload>,
    ) -> Result<Self, Error> {
        let (trigger, shutdown) = shutdown_pair();
        if cfg.cluster_api.is_real() && cfg.backend != Backend::Real {
            return Err(Error::RealClusterApiNeedsRealControlPlane);
        }
        let apart =
            cfg.management_apart || cfg.shared_management.is_some() || cfg.karpenter_in_management;
        if apart && (cfg.backend != Backend::Simulated || preload.is_some()) {
            return Err(Error::NotOnRealBackend(
                "a management cluster apart (simulated backend, nothing preloaded)",
            ));
        }
        let (served, client, mut tasks) = match cfg.backend {
            Backend::Simulated => {
                let server = start_server(&cfg).await?;
                if let Some(load) = preload {
                    load(server.store()).map_err(Error::Preload)?;
                }
                let client = server.client();
                (Served::Simulated(server), client, Vec::new())
            }
            Backend::Real if preload.is_some() => {
                return Err(Error::NotOnRealBackend(
                    "loading objects before the stand-ins",
                ));
            }
            Backend::Real => {
                // Without Cluster API's conversion webhook only the stand-in's version is served.
                let release = match &cfg.cluster_api {
                    ClusterApiBackend::Real { release } => Some(release.clone()),
                    ClusterApiBackend::Simulated => None,
                };
                if release.is_none() && cfg.capi_version != CapiVersion::V1Beta2 {
                    return Err(Error::VersionOnRealBackend(cfg.capi_version));
                }
                let (backend, client, tasks) =
                    RealBackend::start(cfg.seed, cfg.capi_version, release, shutdown.clone())
                        .await?;
                if let Some(out) = &cfg.kubeconfig_out {
                    std::fs::copy(backend.kubeconfig_path(), out).map_err(|source| {
                        Error::Server(SimError::Kubeconfig {
                            path: out.display().to_string(),
                            source,
                        })
                    })?;
                }
                let config = kube::Config::from_custom_kubeconfig(
                    kube::config::Kubeconfig::read_from(backend.kubeconfig_path())
                        .map_err(crate::controlplane::Error::from)
                        .map_err(real::Error::from)?,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await
                .map_err(crate::controlplane::Error::from)
                .map_err(real::Error::from)?;
                // The workload cluster's objects where Cluster API's real manager runs.
                backend
                    .ensure_cluster(&client, "default", CLUSTER_NAME)
                    .await?;
                let (backend, config) = (Box::new(backend), Box::new(config));
                (Served::Real { backend, config }, client, tasks)
            }
        };
        let milestones = match &served {
            Served::Simulated(server) => server.stats(),
            Served::Real { backend, .. } => backend.stats(),
        };
        let own_management = cfg.management_apart || cfg.karpenter_in_management;
        let management_server = match (&cfg.shared_management, own_management) {
            (Some(shared), _) => Some(join_management(&cfg, shared, &served).await?),
            (None, true) => Some(Arc::new(start_management(&cfg, &served).await?)),
            (None, false) => None,
        };
        let clusters = Clusters {
            management: management_server
                .as_deref()
                .map_or_else(|| client.clone(), SimServer::client),
            workload: client.clone(),
            scope: cfg.shared_management.as_ref().map(|s| s.namespace.clone()),
        };
        let (binds, audit, capi) =
            spawn_standins(&cfg, &clusters, milestones, shutdown.clone(), &mut tasks);
        if let Served::Real { backend, .. } = &served
            && cfg.cluster_api.is_real()
        {
            // The providers' side of ClusterClass-managed clusters (none unless one is made).
            tasks.extend(real::topology::spawn(
                client.clone(),
                backend.apiserver_port(),
                shutdown,
            ));
        }
        Ok(Self {
            served,
            client,
            management_server,
            management: clusters.management,
            cfg,
            trigger,
            tasks,
            binds,
            audit,
            capi,
        })
    }

    /// What Cluster API's stand-in caches hold (see [`capi::Caches`]).
    pub fn capi_caches(&self) -> &capi::Caches {
        &self.capi
    }

    /// A client for this cluster (the workload cluster, with the management cluster apart),
    /// built on the current runtime.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A client for the cluster holding Cluster API's objects: the management cluster when
    /// apart ([`SimClusterConfig::management_apart`]), else the same as [`SimCluster::client`].
    pub fn management_client(&self) -> Client {
        self.management.clone()
    }

    /// A client for the cluster holding Karpenter's objects: the management cluster's with
    /// [`SimClusterConfig::karpenter_in_management`], else the workload cluster's.
    pub fn karpenter_client(&self) -> Client {
        if self.cfg.karpenter_in_management {
            self.management_client()
        } else {
            self.client()
        }
    }

    /// The labels binding a Karpenter object to Cluster `sim` in the management cluster (none
    /// when Karpenter's objects are in the workload cluster).
    pub fn karpenter_labels(&self) -> BTreeMap<String, String> {
        let Some((cluster, namespace)) = self.karpenter_binding() else {
            return BTreeMap::new();
        };
        [
            (wellknown::CLUSTER_NAME_LABEL, cluster),
            (wellknown::CLUSTER_NAMESPACE_LABEL, namespace),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// The Cluster (name, namespace) Karpenter's objects are bound to in the management
    /// cluster, when they are there.
    pub fn karpenter_binding(&self) -> Option<(&str, &str)> {
        let namespace = self.capi_namespace().unwrap_or("default");
        self.cfg
            .karpenter_in_management
            .then_some((CLUSTER_NAME, namespace))
    }

    /// The management cluster's kubeconfig, when it is apart.
    pub fn management_kubeconfig_path(&self) -> Option<&Path> {
        self.management_server
            .as_deref()
            .map(SimServer::kubeconfig_path)
    }

    /// The management cluster's server, when it is apart.
    pub fn management_server(&self) -> Option<&SimServer> {
        self.management_server.as_deref()
    }

    /// The management cluster's namespace holding this cluster's Cluster API objects when the
    /// management cluster is shared ([`SimClusterConfig::shared_management`]); None when
    /// every namespace there is this cluster's.
    pub fn capi_namespace(&self) -> Option<&str> {
        self.cfg
            .shared_management
            .as_ref()
            .map(|s| s.namespace.as_str())
    }

    /// A client built fresh on the caller's runtime (a Client dies with the runtime it was
    /// built on, so a controller on another thread needs its own).
    pub fn new_client(&self) -> Result<Client, Error> {
        match &self.served {
            Served::Simulated(server) => Ok(server.client()),
            Served::Real { config, .. } => Client::try_from(kube::Config::clone(config))
                .map_err(kube_err("a client for the real control plane")),
        }
    }

    /// The kubeconfig to give users (an administrator's): `kubeconfig_out` when set, else the
    /// server's own.
    pub fn kubeconfig_path(&self) -> &Path {
        self.cfg
            .kubeconfig_out
            .as_deref()
            .unwrap_or_else(|| match &self.served {
                Served::Simulated(server) => server.kubeconfig_path(),
                Served::Real { backend, .. } => backend.kubeconfig_path(),
            })
    }

    /// The kubeconfig the controller under test is given. On the simulated backend, the same
    /// as [`SimCluster::kubeconfig_path`] (the controller is told apart by its User-Agent);
    /// on a real control plane, the Helm chart's ServiceAccount with the chart's RBAC and
    /// nothing else, so a missing permission is refused and the audit log tells its requests
    /// apart.
    pub fn controller_kubeconfig_path(&self) -> &Path {
        match &self.served {
            Served::Simulated(_) => self.kubeconfig_path(),
            Served::Real { backend, .. } => backend.controller_kubeconfig_path(),
        }
    }

    pub fn backend(&self) -> Backend {
        self.cfg.backend
    }

    /// The API server's URL.
    pub fn url(&self) -> &str {
        match &self.served {
            Served::Simulated(server) => server.url(),
            Served::Real { backend, .. } => backend.url(),
        }
    }

    /// The objects of the cluster, for reports and invariants: the simulated server's store, or
    /// on a real control plane a mirror of it kept by watches.
    pub fn store(&self) -> &Store {
        match &self.served {
            Served::Simulated(server) => server.store(),
            Served::Real { backend, .. } => backend.store(),
        }
    }

    /// The objects of the cluster holding Cluster API's (the management cluster when apart,
    /// else the same as [`SimCluster::store`]).
    pub fn capi_store(&self) -> &Store {
        self.management_server
            .as_deref()
            .map_or_else(|| self.store(), SimServer::store)
    }

    /// The objects of `resource`'s cluster: Cluster API's and its providers' kinds in the
    /// management cluster when it is apart, Karpenter's there too with
    /// [`SimClusterConfig::karpenter_in_management`], every other kind in the workload cluster.
    pub fn store_of(&self, resource: &str) -> &Store {
        let store = self.store();
        let apart = store.registry().by_name(resource).is_some_and(|d| {
            is_cluster_api_group(&d.group)
                || (self.cfg.karpenter_in_management && is_karpenter_group(&d.group))
        });
        if apart { self.capi_store() } else { store }
    }

    /// The objects of the cluster holding Karpenter's.
    pub fn karpenter_store(&self) -> &Store {
        if self.cfg.karpenter_in_management {
            self.capi_store()
        } else {
            self.store()
        }
    }

    /// The simulated server, for what exists only there (its fault injection, writing straight
    /// into its store).
    pub fn try_server(&self) -> Result<&SimServer, Error> {
        match &self.served {
            Served::Simulated(server) => Ok(server),
            Served::Real { .. } => Err(Error::NotOnRealBackend("the simulated API server")),
        }
    }

    /// The simulated server. Tests that inject faults call this; on a real control plane it
    /// panics (use [`SimCluster::try_server`] where both backends are possible).
    pub fn server(&self) -> &SimServer {
        match self.try_server() {
            Ok(server) => server,
            Err(e) => panic!("{e}"),
        }
    }

    /// Fault injection (the simulated server only).
    pub fn faults(&self) -> Result<&Faults, Error> {
        Ok(self.try_server()?.faults())
    }

    /// What the API server measured: counted by the simulated server itself, or read from the
    /// real kube-apiserver's audit log.
    pub fn stats(&self) -> Stats {
        match &self.served {
            Served::Simulated(server) => server.stats(),
            Served::Real { backend, .. } => backend.stats(),
        }
    }

    /// Cluster API's real manager's release, when one runs here (`--cluster-api real`).
    pub fn cluster_api_release(&self) -> Option<&str> {
        match &self.served {
            Served::Simulated(_) => None,
            Served::Real { backend, .. } => backend.cluster_api_release(),
        }
    }

    /// `f` of Cluster API's real manager (its process, ports, log); None without one.
    pub fn with_cluster_api<R>(
        &self,
        f: impl FnOnce(&crate::controlplane::cluster_api::ClusterApi) -> R,
    ) -> Option<R> {
        match &self.served {
            Served::Simulated(_) => None,
            Served::Real { backend, .. } => backend.with_cluster_api(f),
        }
    }

    /// `f` of the real control plane (its processes, ports, logs); None on the simulated
    /// backend and once stopped.
    pub fn with_control_plane<R>(
        &self,
        f: impl FnOnce(&crate::controlplane::ControlPlane) -> R,
    ) -> Option<R> {
        match &self.served {
            Served::Simulated(_) => None,
            Served::Real { backend, .. } => backend.with_control_plane(f),
        }
    }

    /// Stops the real control plane's processes now (idempotent; nothing on the simulated
    /// backend, whose server ends with its runtime). A cluster kept alive elsewhere (an `Arc`
    /// on a runtime shutting down) must not leave etcd and kube-apiserver running.
    pub fn stop_processes(&self) {
        if let Served::Real { backend, .. } = &self.served {
            // The stand-ins first, so they do not report the API server gone as failures.
            self.trigger.trigger();
            backend.stop();
        }
    }

    pub fn capi_version(&self) -> CapiVersion {
        self.cfg.capi_version
    }

    pub fn config(&self) -> &SimClusterConfig {
        &self.cfg
    }

    /// Pods the scheduler stand-in bound, in order, with the time of each binding (none on a
    /// real control plane, where kube-scheduler binds: read `spec.nodeName` there).
    pub fn bindings(&self) -> Vec<BindRecord> {
        self.binds.records()
    }

    /// The server-side audit of voluntary disruption (budgets, decisions).
    pub fn disruption_audit(&self) -> &DisruptionAudit {
        &self.audit
    }

    /// Stops the stand-ins, waits for them, then stops the server.
    pub async fn shutdown(mut self) {
        self.trigger.trigger();
        for task in std::mem::take(&mut self.tasks) {
            if let Err(err) = task.await {
                tracing::warn!(error = %err, "stand-in task ended abnormally");
            }
        }
        match &mut self.served {
            Served::Simulated(server) => server.shutdown(),
            Served::Real { backend, .. } => backend.stop(),
        }
        // A shared management cluster stops with its last workload cluster.
        if let Some(mut server) = self.management_server.take().and_then(Arc::into_inner) {
            server.shutdown();
        }
    }
}
