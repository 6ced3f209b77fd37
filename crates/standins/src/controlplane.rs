//! A real Kubernetes control plane for tests: etcd, kube-apiserver, kube-scheduler and
//! kube-controller-manager started from a `KUBEBUILDER_ASSETS` directory (controller-runtime
//! envtest's convention), on loopback ports picked free, in a temporary directory.
//!
//! The simulated cluster (`sim`) is this project's own implementation of the API server and the
//! scheduler; this module is the reference it is measured against (docs/fidelity.md). What runs:
//! - etcd with `--unsafe-no-fsync` (its data is thrown away);
//! - kube-apiserver with client-certificate authentication and `--authorization-mode=Node,RBAC`,
//!   so permission mistakes fail as on a real cluster;
//! - kube-scheduler, which binds pods;
//! - kube-controller-manager with the controllers behind Deployments, ReplicaSets,
//!   PodDisruptionBudget status, garbage collection, service-account tokens and node lifecycle.
//!   As upstream, the `TaintNodesByCondition` admission plugin taints every new Node
//!   `node.kubernetes.io/not-ready` and the node lifecycle controller lifts it once the Node is
//!   Ready; whoever registers Nodes must renew their Leases in `kube-node-lease` as a kubelet
//!   does (the simulated cluster's kubelet stand-in does), or that controller marks the Node
//!   unreachable after its grace period.
//!
//! Certificates are made in-process (module `pki`); each component has its own user, so the
//! bootstrap RBAC roles apply as on a kubeadm cluster. Every process is stopped (and the
//! directory removed) when the [`ControlPlane`] is dropped, when its start fails, while a panic
//! unwinds, and on SIGINT/SIGTERM (module `process`).

pub mod audit;
pub mod cluster_api;
mod pki;
mod process;
pub mod rbac;
mod start;

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use parking_lot::Mutex;

use process::Processes;

/// The variable naming the directory that holds the binaries (envtest's convention).
pub const ASSETS_VARIABLE: &str = "KUBEBUILDER_ASSETS";

/// The binaries, in start order.
pub const BINARIES: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
];

/// The controller-manager's controllers. Pod garbage collection is among them because a real
/// cluster deletes the pods of a deleted Node through it, and the disruption flows delete Nodes;
/// node lifecycle because it lifts the not-ready taint every new Node is admitted with.
const CONTROLLERS: &str = "deployment-controller,replicaset-controller,disruption-controller,\
garbage-collector-controller,pod-garbage-collector-controller,serviceaccount-controller,\
serviceaccount-token-controller,namespace-controller,root-ca-certificate-publisher-controller,\
node-lifecycle-controller";

/// The user the controller's client certificate names, so the audit log tells its requests from
/// the stand-ins' (the administrator) and the control plane's own.
pub const CONTROLLER_USER: &str = "karpenter-capi-controller";

/// The user of Cluster API's manager's client certificate (module `cluster_api`).
pub const CLUSTER_API_USER: &str = "cluster-api-controller-manager";
/// The user of the `<cluster>-kubeconfig` Secret's certificate (the workload cluster's admin).
pub const CLUSTER_API_WORKLOAD_USER: &str = "cluster-api-workload-admin";

/// Lines of a binary's log quoted in an error.
const TAIL_LINES: usize = 30;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{ASSETS_VARIABLE} is not set: it names the directory holding etcd, kube-apiserver, \
         kube-scheduler and kube-controller-manager"
    )]
    AssetsUnset,
    #[error("{binary} is not in {} ({ASSETS_VARIABLE})", dir.display())]
    MissingBinary { binary: &'static str, dir: PathBuf },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("making the control plane's certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    #[error("starting {binary}: {source}")]
    Spawn {
        binary: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the control plane was stopped (signal) while starting")]
    Stopped,
    #[error(
        "{binary} exited ({status}) while the control plane was starting; its log ends:\n{tail}"
    )]
    Exited {
        binary: &'static str,
        status: ExitStatus,
        tail: String,
    },
    #[error("{binary} not ready after {waited:?} (last: {last}); its log ends:\n{tail}")]
    NotReady {
        binary: &'static str,
        waited: Duration,
        last: String,
        tail: String,
    },
    #[error("reading the admin kubeconfig: {0}")]
    Kubeconfig(#[from] KubeconfigError),
    #[error("a client for the control plane: {0}")]
    Client(#[from] kube::Error),
}

/// How many times a start whose port was taken meanwhile is made again.
const START_ATTEMPTS: u32 = 3;

impl Error {
    /// A binary could not listen on its port: taken by another process after it was picked.
    fn is_port_taken(&self) -> bool {
        matches!(self, Error::Exited { tail, .. } if tail.contains("address already in use"))
    }
}

/// How to start a control plane.
#[derive(Debug, Clone)]
pub struct Options {
    /// The directory holding the four binaries.
    pub assets: PathBuf,
    /// How long the whole start may take. A loaded two-core machine needs tens of seconds.
    pub startup_timeout: Duration,
}

impl Options {
    /// The binaries from [`ASSETS_VARIABLE`], with a two-minute start-up budget.
    pub fn from_env() -> Result<Self, Error> {
        let assets = std::env::var_os(ASSETS_VARIABLE)
            .filter(|v| !v.is_empty())
            .ok_or(Error::AssetsUnset)?;
        Ok(Options {
            assets: PathBuf::from(assets),
            startup_timeout: Duration::from_secs(120),
        })
    }
}

/// The ports one control plane listens on, all on 127.0.0.1.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub etcd_client: u16,
    pub etcd_peer: u16,
    pub apiserver: u16,
    pub scheduler: u16,
    pub controller_manager: u16,
}

impl Ports {
    /// Every port, for checks that nothing listens after a stop.
    pub fn all(&self) -> [u16; 5] {
        [
            self.etcd_client,
            self.etcd_peer,
            self.apiserver,
            self.scheduler,
            self.controller_manager,
        ]
    }

    /// Free ports from the kernel. All are held until all are chosen, so no two coincide;
    /// another process may still take one before the binary binds it, which then fails to
    /// start with a clear error rather than joining someone else's server.
    fn pick() -> Result<Self, Error> {
        let listeners = (0..5)
            .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| Error::Io {
                what: "picking a free loopback port".into(),
                source,
            })?;
        let ports = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| Error::Io {
                what: "reading a picked port".into(),
                source,
            })?;
        Ok(Ports {
            etcd_client: ports[0],
            etcd_peer: ports[1],
            apiserver: ports[2],
            scheduler: ports[3],
            controller_manager: ports[4],
        })
    }
}

/// A running control plane. Dropping it stops every process and removes its directory.
pub struct ControlPlane {
    processes: Arc<Mutex<Processes>>,
    client: kube::Client,
    kubeconfig: PathBuf,
    controller_kubeconfig: PathBuf,
    cluster_api_kubeconfig: PathBuf,
    pki: pki::Pki,
    audit_log: PathBuf,
    dir: PathBuf,
    ports: Ports,
    startup: Duration,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.dir)
            .field("ports", &self.ports)
            .field("startup", &self.startup)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager and returns once
    /// the API server answers `/readyz` and the controller-manager has made the `default`
    /// namespace's ServiceAccount (pods cannot be admitted before it exists).
    ///
    /// The ports are free when picked but are only bound by the binaries a moment later, so
    /// another process (another control plane, on a busy machine) can take one in between: a
    /// start that fails on a taken port is stopped and made again on new ports, a few times.
    pub async fn start(options: Options) -> Result<Self, Error> {
        let mut attempt = 1;
        loop {
            match Self::start_once(options.clone()).await {
                Err(e) if attempt < START_ATTEMPTS && e.is_port_taken() => {
                    tracing::warn!(error = %e, attempt, "a control plane port was taken; starting again on new ports");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    /// A client authenticated as the cluster administrator (group `system:masters`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A new administrator client bound to the caller's runtime (kube clients keep their
    /// connections on the runtime that made them).
    pub async fn new_client(&self) -> Result<kube::Client, Error> {
        client_for(&self.kubeconfig).await
    }

    /// The administrator's kubeconfig (for kubectl, helm or a controller process). It lives in
    /// the control plane's directory and goes with it.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kubeconfig as the user [`CONTROLLER_USER`], an administrator (in `system:masters`)
    /// whose requests the audit log names apart, for a test that wants the controller unbounded
    /// by RBAC. The simulated cluster's real backend gives its controller the Helm chart's
    /// ServiceAccount instead (`rbac`).
    pub fn controller_kubeconfig(&self) -> &Path {
        &self.controller_kubeconfig
    }

    /// A kubeconfig as Cluster API's controller manager ([`CLUSTER_API_USER`]), which
    /// holds only the RBAC [`cluster_api::ClusterApi::start`] grants it.
    pub fn cluster_api_kubeconfig(&self) -> &Path {
        &self.cluster_api_kubeconfig
    }

    /// A self-contained kubeconfig (certificates inline, as Cluster API reads it from the
    /// `<cluster>-kubeconfig` Secret) for this API server as the workload cluster's
    /// administrator, the user [`CLUSTER_API_WORKLOAD_USER`].
    pub fn workload_kubeconfig(&self) -> Result<String, Error> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| Error::Io {
                what: format!("reading {}", p.display()),
                source,
            })
        };
        let ca = base64(read(&self.pki.ca)?);
        let cert = base64(read(&self.pki.cluster_api_workload.cert)?);
        let key = base64(read(&self.pki.cluster_api_workload.key)?);
        Ok(format!(
            "apiVersion: v1
kind: Config
clusters:
- name: workload
  cluster:
    server: https://127.0.0.1:{port}
    certificate-authority-data: {ca}
users:
- name: cluster-api
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: workload
  context:
    cluster: workload
    user: cluster-api
current-context: workload
",
            port = self.ports.apiserver
        ))
    }

    /// kube-apiserver's audit log (JSON lines, module [`audit`]).
    pub fn audit_log(&self) -> &Path {
        &self.audit_log
    }

    /// The directory holding certificates, kubeconfigs, etcd's data and each binary's log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn ports(&self) -> Ports {
        self.ports
    }

    /// The process id of each binary, in start order.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.processes
            .lock()
            .running
            .iter()
            .map(|r| (r.binary, r.child.id()))
            .collect()
    }

    /// The last `lines` lines of `binary`'s log (stdout and stderr), for a failing test to show.
    pub fn log_tail(&self, binary: &str, lines: usize) -> String {
        process::tail(&self.dir.join(format!("{binary}.log")), lines)
    }

    /// How long [`ControlPlane::start`] took.
    pub fn startup(&self) -> Duration {
        self.startup
    }

    /// Stops every process and removes the directory now (dropping does the same).
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.processes.lock().stop();
    }
}

/// `--name=value` flags.
fn args<const N: usize>(pairs: [(&str, &str); N]) -> Vec<String> {
    pairs.iter().map(|(k, v)| format!("--{k}={v}")).collect()
}

/// Standard base64 of `bytes` (as the API's byte fields and kubeconfigs' `*-data` spell them).
pub(crate) fn base64(bytes: Vec<u8>) -> String {
    // k8s-openapi's ByteString serializes as standard base64.
    match serde_json::to_value(k8s_openapi::ByteString(bytes)) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// Polls `probe` every 200 ms until it succeeds, failing early when any process has exited.
async fn wait_ready<F, Fut>(
    processes: &Mutex<Processes>,
    binary: &'static str,
    deadline: Instant,
    began: Instant,
    probe: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    wait_ready_tail(processes, binary, deadline, began, TAIL_LINES, probe).await
}

/// [`wait_ready`], quoting `tail_lines` of a log in its errors.
async fn wait_ready_tail<F, Fut>(
    processes: &Mutex<Processes>,
    binary: &'static str,
    deadline: Instant,
    began: Instant,
    tail_lines: usize,
    mut probe: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    loop {
        let exited = processes.lock().exited();
        if let Some((binary, status, log)) = exited {
            return Err(Error::Exited {
                binary,
                status,
                tail: process::tail(&log, tail_lines),
            });
        }
        let last = match probe().await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            let log = processes
                .lock()
                .running
                .iter()
                .find(|r| r.binary == binary)
                .map(|r| r.log.clone());
            return Err(Error::NotReady {
                binary,
                waited: began.elapsed(),
                last,
                tail: log.map_or_else(String::new, |l| process::tail(&l, tail_lines)),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn client_for(kubeconfig: &Path) -> Result<kube::Client, Error> {
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

/// A kubeconfig naming certificate files by absolute path, so it works from any directory.
fn write_kubeconfig(at: &Path, server: &str, ca: &Path, user: &pki::Pair) -> Result<(), Error> {
    // JSON strings are YAML strings: this quotes paths whatever characters they hold.
    let q = |p: &Path| serde_json::Value::String(path(p)).to_string();
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: karpenter-capi-control-plane
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: user
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: default
  context:
    cluster: karpenter-capi-control-plane
    user: user
current-context: default
",
        ca = q(ca),
        cert = q(&user.cert),
        key = q(&user.key),
    );
    std::fs::write(at, text).map_err(|source| Error::Io {
        what: format!("writing {}", at.display()),
        source,
    })
}

#[cfg(test)]
mod tests;
