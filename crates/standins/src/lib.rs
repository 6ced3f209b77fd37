//! The stand-ins karpenter-capi is tested against. The simulated cluster
//! (docs/simulated-cluster.md): a real HTTP Kubernetes API server in-process on 127.0.0.1, which
//! the controller, tests and benchmarks reach through an ordinary `kube::Client`, with Cluster
//! API, kubelet and scheduler stand-ins; and `controlplane`, a launcher of a real kube-apiserver,
//! etcd, kube-scheduler and kube-controller-manager (docs/fidelity.md).
//!
//! This crate depends on Kubernetes types and never on the controller's crate: what the tests
//! judge the controller by is written apart from the controller, and the compiler keeps it so.
//! Upstream's names are stated here (`wellknown`), and the project's CRDs are read from the
//! files it ships (`project_crds`).

mod capi_defaults;
pub mod capi_version;
mod clock;
pub mod controlplane;
mod discovery;
pub mod drain_audit;
mod duration;
mod errors;
mod event_versions;
mod eviction;
mod faults;
mod kubeconfig;
mod managed_fields;
mod patch;
mod pdb_expected;
pub mod project_crds;
mod registry;
mod schema;
mod selectors;
mod server;
mod stats;
mod store;
mod table;
mod upstream;
mod validate;
mod validate_pod;
mod watch;
pub mod wellknown;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

pub use errors::{ApiError, SimError};
pub use faults::{FaultRule, Faults};
pub use patch::{PatchError, json_patch, merge_patch, strategic_merge};
pub use registry::{CapiVersions, Registry, ResourceDef};
pub use selectors::{FieldSelector, LabelSelector};
pub use stats::{Milestone, RequestCount, Stats, StatsSnapshot, ViolationRecord, WriteRecord};
pub use store::Store;

/// The user agent the controller's requests carry (`karpenter-capi/<version>`), by which the
/// reports tell its writes from everyone else's; the controller's crate tests that it states the
/// same.
pub const CONTROLLER_USER_AGENT: &str = concat!("karpenter-capi/", env!("CARGO_PKG_VERSION"));

/// The checkout this crate is built in (two folders up from crates/standins), where the chart,
/// the target folder and the shared assets beside the checkout are looked for.
pub(crate) fn repo_root() -> &'static Path {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().and_then(Path::parent).unwrap_or(manifest)
}

/// How to start the simulated server.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Change events kept for watch resumption; older resourceVersions get 410 Expired.
    pub history_size: usize,
    /// Events buffered per watch before a lagging watch is closed.
    pub watch_buffer: usize,
    /// Seed for generated names, uids and fault dice.
    pub seed: u64,
    pub served_capi_versions: CapiVersions,
    /// More kinds to serve, e.g. infrastructure machine templates.
    pub extra_resources: Vec<ResourceDef>,
    /// How often open watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// Port to listen on (0 = any free port).
    pub port: u16,
    /// Record requests and writes in this log instead of one of its own: a management cluster
    /// whose writes a report reads beside the workload cluster's, on one clock.
    pub stats: Option<Stats>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            history_size: 10_000,
            watch_buffer: 10_000,
            seed: 1,
            served_capi_versions: CapiVersions::Both,
            extra_resources: Vec::new(),
            bookmark_interval: Duration::from_secs(5),
            port: 0,
            stats: None,
        }
    }
}

impl SimConfig {
    /// Adds the infrastructure templates the project's tests use (Docker/Dev and Kubemark), the Dev
    /// infrastructure pool and the kubeadm bootstrap kinds MachineDeployments and MachinePools
    /// refer to, as a management cluster with
    /// those providers installed serves them (so `kubectl apply` of a provider's example works).
    pub fn with_infrastructure_templates(mut self) -> Self {
        let infra = "infrastructure.cluster.x-k8s.io";
        let v = ["v1beta2", "v1beta1", "v1alpha4"];
        for (kind, plural) in [
            ("DevMachineTemplate", "devmachinetemplates"),
            ("DockerMachineTemplate", "dockermachinetemplates"),
            ("KubemarkMachineTemplate", "kubemarkmachinetemplates"),
        ] {
            self.add_kind(ResourceDef::custom(infra, &v, kind, plural, true).with_status());
        }
        // The infrastructure pools MachinePools point at (the stand-in's cloud scaling group).
        self.add_kind(
            ResourceDef::custom(infra, &v, "DevMachinePool", "devmachinepools", true).with_status(),
        );
        let bootstrap = "bootstrap.cluster.x-k8s.io";
        self.add_kind(ResourceDef::custom(
            bootstrap,
            &v[..2],
            "KubeadmConfigTemplate",
            "kubeadmconfigtemplates",
            true,
        ));
        self.add_kind(
            ResourceDef::custom(bootstrap, &v[..2], "KubeadmConfig", "kubeadmconfigs", true)
                .with_status(),
        );
        self
    }

    /// Serves `def` unless a kind with its group and plural is already there.
    fn add_kind(&mut self, def: ResourceDef) {
        let known = self
            .extra_resources
            .iter()
            .any(|d| d.group == def.group && d.plural == def.plural);
        if !known {
            self.extra_resources.push(def);
        }
    }
}

/// A running simulated API server. Dropping it stops it.
pub struct SimServer {
    addr: SocketAddr,
    url: String,
    store: Arc<Store>,
    stats: Stats,
    /// See [`SimServer::read_claims_from`].
    claims_elsewhere: Arc<std::sync::OnceLock<Arc<Store>>>,
    faults: Arc<Faults>,
    kubeconfig: PathBuf,
    dir: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SimServer {
    /// Binds 127.0.0.1 and serves on a runtime of its own (a thread), so the server outlives
    /// the caller's runtime and any number of clients on other runtimes can use it.
    pub async fn start(config: SimConfig) -> Result<SimServer, SimError> {
        let registry = Arc::new(
            Registry::new(config.served_capi_versions, config.extra_resources.clone())
                .map_err(|e| SimError::Registry("extra_resources".into(), e))?,
        );
        let listener =
            std::net::TcpListener::bind(("127.0.0.1", config.port)).map_err(SimError::Bind)?;
        listener.set_nonblocking(true).map_err(SimError::Bind)?;
        let addr = listener.local_addr().map_err(SimError::Bind)?;
        let url = format!("http://{addr}");
        let store = Arc::new(Store::new(
            registry.clone(),
            config.history_size,
            config.watch_buffer,
            config.seed,
        ));
        let stats = config.stats.clone().unwrap_or_else(Stats::new);
        let claims_elsewhere = Arc::new(std::sync::OnceLock::new());
        let faults = Arc::new(Faults::new(config.seed));
        let shared = Arc::new(server::Shared {
            store: store.clone(),
            registry,
            stats: stats.clone(),
            faults: faults.clone(),
            address: addr.to_string(),
            bookmark_interval: config.bookmark_interval,
            claims_elsewhere: claims_elsewhere.clone(),
        });
        let dir = std::env::temp_dir().join(format!(
            "karpenter-capi-sim-{}-{}",
            std::process::id(),
            addr.port()
        ));
        let kubeconfig = kubeconfig::write(&dir, &url)?;
        let (stop, stopped) = oneshot::channel();
        let (ready_tx, ready_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("sim-apiserver-{}", addr.port()))
            .spawn(move || run_thread(listener, shared, stopped, ready_tx))
            .map_err(SimError::Runtime)?;
        ready_rx.await.map_err(|_| SimError::NotReady)?;
        Ok(SimServer {
            addr,
            url,
            store,
            stats,
            claims_elsewhere,
            faults,
            kubeconfig,
            dir,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The kube client configuration for this server, as `Config::new` makes it: like a client
    /// built from a kubeconfig, it retries 429, 503 and 504 answers with backoff.
    pub fn kube_config(&self) -> kube::Config {
        let uri: hyper::Uri = match self.url.parse() {
            Ok(u) => u,
            // The URL is built from a SocketAddr, so it always parses.
            Err(_) => hyper::Uri::from_static("http://127.0.0.1"),
        };
        kube::Config::new(uri)
    }

    /// A new client for this server, bound to the caller's runtime (build one per runtime).
    pub fn client(&self) -> kube::Client {
        client_from(self.kube_config(), &self.url)
    }

    /// A new client that surfaces 429/503 at once instead of retrying them (kube retries them
    /// by default for up to minutes), for tests that assert on those answers.
    pub fn client_without_retries(&self) -> kube::Client {
        let mut config = self.kube_config();
        config.default_retry = false;
        client_from(config, &self.url)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig for this server: `kubectl --kubeconfig <path> get nodes`.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }

    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The NodeClaims are in `other` (Karpenter's objects in a management cluster apart): the
    /// drain audit reads their termination deadlines there. Set once; later calls are ignored.
    pub fn read_claims_from(&self, other: &SimServer) {
        let _ = self.claims_elsewhere.set(other.store.clone());
    }

    /// Direct access to stored objects, bypassing HTTP.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Stops serving; open connections and watches close.
    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // The thread drops its runtime, which must not happen inside an async context; it runs on
        // its own thread, so detaching the handle here is enough.
        self.thread.take();
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        self.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn client_from(config: kube::Config, url: &str) -> kube::Client {
    match kube::Client::try_from(config) {
        Ok(c) => c,
        // A plain-HTTP config with no TLS or auth settings cannot fail to build; if kube ever
        // changes that, say which server it was.
        Err(e) => panic!("simulated API server: cannot build a kube client for {url}: {e}"),
    }
}

/// The API server runtime's thread name. It starts with `sim` so CPU meters count it as the
/// simulated cluster's (`simulate::cpu`).
pub const API_SERVER_THREAD: &str = "sim-apiserver-worker";

fn run_thread(
    listener: std::net::TcpListener,
    shared: Arc<server::Shared>,
    stopped: oneshot::Receiver<()>,
    ready: oneshot::Sender<()>,
) {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Named like every thread of the simulated cluster, so CPU meters (`simulate`'s
        // `cpu_ms`) count the API server as the cluster's and not as the controller's.
        .thread_name(API_SERVER_THREAD)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("simulated API server: cannot build its runtime: {e}");
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("simulated API server: cannot listen: {e}");
                return;
            }
        };
        let _ = ready.send(());
        let cutter = tokio::spawn(cut_watches_periodically(shared.faults.clone()));
        let mut connections = tokio::task::JoinSet::new();
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let shared = shared.clone();
                    connections.spawn(async move {
                        let service = hyper::service::service_fn(move |req| server::handle(shared.clone(), req));
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        cutter.abort();
        connections.abort_all();
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
}

/// Applies `Faults::set_watch_cut_every`: closes every open watch on that period.
async fn cut_watches_periodically(faults: Arc<Faults>) {
    loop {
        match faults.watch_cut_every() {
            Some(every) => {
                tokio::time::sleep(every).await;
                if faults.watch_cut_every().is_some() {
                    faults.cut_watches();
                }
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

// ---- stand-ins and scenarios (H4) ----
pub mod capi;
pub mod cluster;
pub mod deployments;
pub mod disruption_audit;
pub mod kubelet;
pub mod machine_size;
mod node_lease;
pub mod pdb_status;
pub mod pod_lifecycle;
pub mod quantity;
pub mod real;
pub mod rollout;
pub mod scheduler;
pub mod standin;
