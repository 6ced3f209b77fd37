//! Cluster API's core controller manager, the real one, on a running [`ControlPlane`].
//!
//! The manager is built from Cluster API's published Go module by `.ci/install-cluster-api`,
//! which leaves, per version, `bin/manager`, the CRDs (`crds/`), which of them convert through
//! the webhook (`crd-patches/`), the admission webhooks (`webhook/manifests.yaml`) and the
//! manager's ClusterRole (`rbac/role.yaml`) under one directory, found through
//! [`VARIABLE`] (default `target/cluster-api`). [`ClusterApi::start`] then does what envtest
//! and upstream's kustomize do for a cluster:
//! - makes a CA and a serving certificate for 127.0.0.1 in-process;
//! - installs the CRDs (server-side apply) with the conversion webhook pointed at
//!   `https://127.0.0.1:<port>/convert` with that CA, and the Mutating/Validating
//!   WebhookConfigurations rewritten to the same local URL;
//! - binds upstream's ClusterRole (and one for the providers' groups the caller names) to the
//!   manager's own user, whose client certificate the control plane made
//!   ([`MANAGER_USER`]), so a permission upstream does not grant is refused as on a cluster;
//! - starts the manager on loopback ports (its webhook server takes no address and listens on
//!   every interface: Cluster API has no flag for it) with the feature gates MachinePool and
//!   ClusterTopology, and waits for its `/readyz`.
//!
//! The manager is stopped (SIGKILL, waited for) and its directory removed when the
//! [`ClusterApi`] is dropped, when its start fails, while a panic unwinds and on SIGINT/SIGTERM,
//! as the control plane's own processes (module `process`).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use parking_lot::Mutex;
use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, SanType};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::process::{self, Processes};
use super::{ControlPlane, pki};

/// The variable naming the directory `.ci/install-cluster-api` fills (one folder per version).
pub const VARIABLE: &str = "KARPENTER_CAPI_CLUSTER_API";

/// The release serving the v1beta2 contract (the current one).
pub const RELEASE_V1BETA2: &str = "v1.14.2";
/// The release serving only v1beta1 (what the Go provider's users run).
pub const RELEASE_V1BETA1: &str = "v1.10.10";

/// The user of the manager's client certificate (made with the control plane's).
pub use super::CLUSTER_API_USER as MANAGER_USER;
/// The user of the `<cluster>-kubeconfig` Secret's certificate (the workload cluster's admin).
pub use super::CLUSTER_API_WORKLOAD_USER as WORKLOAD_USER;

/// The feature gates both releases accept (v1.14 refuses the GA `ClusterResourceSet`).
const FEATURE_GATES: &str = "MachinePool=true,ClusterTopology=true";

/// Server-side apply's field manager for what is installed here.
const FIELD_MANAGER: &str = "karpenter-capi-sim";

/// Names of the objects granting the manager its permissions.
const MANAGER_ROLE: &str = "karpenter-capi-sim:cluster-api-manager";
const PROVIDERS_ROLE: &str = "karpenter-capi-sim:cluster-api-providers";

/// Lines of the manager's log quoted in an error.
const TAIL_LINES: usize = 40;

/// How many times a start whose port was taken meanwhile is made again.
const START_ATTEMPTS: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "Cluster API {version} is not installed: {} is missing (set {VARIABLE} to the directory \
         `.ci/install-cluster-api` prints; it builds the manager with Go from the module proxy)",
        path.display()
    )]
    Missing { version: String, path: PathBuf },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {}: {reason}", file.display())]
    Manifest { file: PathBuf, reason: String },
    #[error("making the webhook's certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("CRD {0} not Established after {1:?}")]
    NotEstablished(String, Duration),
    #[error("Cluster API's manager: {0}")]
    Process(#[from] super::Error),
}

impl Error {
    fn is_port_taken(&self) -> bool {
        matches!(self, Error::Process(e) if e.is_port_taken())
    }
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}

/// Which Cluster API to start, and what it is allowed.
#[derive(Debug, Clone)]
pub struct Options {
    /// The directory holding one folder per version (`.ci/install-cluster-api`'s output).
    pub root: PathBuf,
    /// The release, e.g. [`RELEASE_V1BETA2`].
    pub version: String,
    /// API groups of the providers' kinds (infrastructure, control plane) the manager reads and
    /// writes, as providers grant them through Cluster API's aggregated role.
    pub provider_groups: Vec<String>,
    /// How long the start may take, the CRDs' installation included.
    pub startup_timeout: Duration,
}

impl Options {
    /// `version` under [`VARIABLE`] (default `$CARGO_TARGET_DIR/cluster-api`, else the
    /// checkout's `target/cluster-api`).
    pub fn from_env(version: &str) -> Self {
        Options {
            root: root_from_env(),
            version: version.to_string(),
            provider_groups: Vec::new(),
            startup_timeout: Duration::from_secs(120),
        }
    }

    /// The version's folder.
    pub fn dir(&self) -> PathBuf {
        self.root.join(&self.version)
    }

    /// The manager binary.
    pub fn manager(&self) -> PathBuf {
        self.dir().join("bin/manager")
    }

    /// Whether everything the start reads is there; the first missing file otherwise.
    pub fn check(&self) -> Result<(), Error> {
        let dir = self.dir();
        for rel in [
            "bin/manager",
            "crds",
            "crd-patches",
            "webhook/manifests.yaml",
            "rbac/role.yaml",
        ] {
            let path = dir.join(rel);
            if !path.exists() {
                return Err(Error::Missing {
                    version: self.version.clone(),
                    path,
                });
            }
        }
        Ok(())
    }
}

/// [`VARIABLE`], else `$CARGO_TARGET_DIR/cluster-api`, else `<checkout>/target/cluster-api`.
pub fn root_from_env() -> PathBuf {
    if let Some(dir) = std::env::var_os(VARIABLE).filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    let repo = crate::repo_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target"));
    repo.join(target).join("cluster-api")
}

/// The loopback ports the manager serves on.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub webhook: u16,
    pub health: u16,
    pub diagnostics: u16,
}

impl Ports {
    pub fn all(&self) -> [u16; 3] {
        [self.webhook, self.health, self.diagnostics]
    }

    fn pick() -> Result<Self, Error> {
        let io = |source| Error::Io {
            what: "picking a free loopback port".into(),
            source,
        };
        let listeners = (0..3)
            .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io)?;
        let mut ports = Vec::new();
        for l in &listeners {
            ports.push(l.local_addr().map_err(io)?.port());
        }
        Ok(Ports {
            webhook: ports[0],
            health: ports[1],
            diagnostics: ports[2],
        })
    }
}

/// The running manager. Dropping it stops the process and removes its directory.
pub struct ClusterApi {
    processes: Arc<Mutex<Processes>>,
    version: String,
    dir: PathBuf,
    ports: Ports,
    startup: Duration,
}

impl std::fmt::Debug for ClusterApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterApi")
            .field("version", &self.version)
            .field("dir", &self.dir)
            .field("ports", &self.ports)
            .finish_non_exhaustive()
    }
}

impl ClusterApi {
    /// Installs Cluster API's CRDs, webhooks and RBAC on `plane` and starts its manager,
    /// returning once `/readyz` answers `ok`. A start whose port was taken between picking and
    /// binding is made again on new ports (the installation is idempotent).
    pub async fn start(plane: &ControlPlane, options: Options) -> Result<Self, Error> {
        options.check()?;
        let mut attempt = 1;
        loop {
            match Self::start_once(plane, &options).await {
                Err(e) if attempt < START_ATTEMPTS && e.is_port_taken() => {
                    tracing::warn!(error = %e, attempt, "a Cluster API port was taken; starting again on new ports");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(plane: &ControlPlane, options: &Options) -> Result<Self, Error> {
        let began = Instant::now();
        let deadline = began + options.startup_timeout;
        let (processes, dir) =
            process::in_temp_dir("karpenter-capi-cluster-api-", "Cluster API's directory")?;

        let certs = dir.join("webhook-certs");
        std::fs::create_dir_all(&certs).map_err(|source| Error::Io {
            what: format!("making {}", certs.display()),
            source,
        })?;
        let ca_bundle = webhook_certificates(&dir, &certs)?;
        let ports = Ports::pick()?;
        let client = plane.new_client().await?;
        let url = format!("https://127.0.0.1:{}", ports.webhook);
        let capi = options.dir();
        install_crds(&client, &capi, &url, &ca_bundle, deadline).await?;
        install_webhooks(&client, &capi, &url, &ca_bundle).await?;
        grant(&client, &capi, &options.provider_groups).await?;

        let bin = capi.join("bin");
        let kubeconfig = plane.cluster_api_kubeconfig().display().to_string();
        process::spawn(
            &processes,
            &bin,
            &dir,
            "manager",
            &[
                format!("--kubeconfig={kubeconfig}"),
                "--leader-elect=false".into(),
                format!("--webhook-port={}", ports.webhook),
                format!("--webhook-cert-dir={}", certs.display()),
                format!("--health-addr=127.0.0.1:{}", ports.health),
                format!("--diagnostics-address=127.0.0.1:{}", ports.diagnostics),
                "--insecure-diagnostics".into(),
                format!("--feature-gates={FEATURE_GATES}"),
            ],
        )?;
        let health = ports.health;
        super::wait_ready_tail(&processes, "manager", deadline, began, TAIL_LINES, || {
            readyz(health)
        })
        .await?;
        let startup = began.elapsed();
        tracing::info!(version = %options.version, ?startup, webhook = ports.webhook, "Cluster API's manager ready");
        Ok(ClusterApi {
            processes,
            version: options.version.clone(),
            dir,
            ports,
            startup,
        })
    }

    /// The release running.
    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn ports(&self) -> Ports {
        self.ports
    }

    /// The manager's process id (none once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.processes.lock().running.first().map(|r| r.child.id())
    }

    /// The directory holding the webhook's certificates and the manager's log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last `lines` lines of the manager's log.
    pub fn log_tail(&self, lines: usize) -> String {
        process::tail(&self.dir.join("manager.log"), lines)
    }

    /// How long [`ClusterApi::start`] took.
    pub fn startup(&self) -> Duration {
        self.startup
    }

    /// Stops the manager and removes its directory now (dropping does the same).
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for ClusterApi {
    fn drop(&mut self) {
        self.processes.lock().stop();
    }
}

/// A CA and the webhook server's certificate for 127.0.0.1 in `certs` (`tls.crt`, `tls.key`);
/// returns the CA certificate as base64, for `caBundle`.
fn webhook_certificates(dir: &Path, certs: &Path) -> Result<String, Error> {
    let ca_path = dir.join("webhook-ca.crt");
    let ca = pki::authority(&ca_path, "karpenter-capi-cluster-api-webhook-ca")?;
    let mut serving = CertificateParams::new(vec!["localhost".to_string()])?;
    serving
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    serving.distinguished_name = pki::name("cluster-api-webhook", None);
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let pair = pki::leaf(certs, "tls", serving, &ca)?;
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| Error::Io {
            what: format!("reading {}", p.display()),
            source,
        })
    };
    // The manager reads tls.crt and tls.key from its cert dir; `leaf` named them so.
    debug_assert!(pair.cert.ends_with("tls.crt"));
    Ok(super::base64(read(&ca_path)?))
}

/// Every YAML document of `file`.
fn documents(file: &Path) -> Result<Vec<Value>, Error> {
    let text = std::fs::read_to_string(file).map_err(|source| Error::Io {
        what: format!("reading {}", file.display()),
        source,
    })?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| Error::Manifest {
        file: file.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(docs.into_iter().filter(|d| d.is_object()).collect())
}

/// The YAML files of `dir`, sorted.
fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        what: format!("listing {}", dir.display()),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

fn name_of(doc: &Value) -> String {
    doc.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Server-side apply of `doc` (forced: this installer owns what it installs).
async fn apply<K>(api: &Api<K>, doc: &Value) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = name_of(doc);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(doc))
        .await
        .map(drop)
        .map_err(kube_err(format!("applying {name}")))
}

/// The CRDs, those upstream converts by webhook pointed at `url`/convert; waits until each is
/// Established.
async fn install_crds(
    client: &kube::Client,
    capi: &Path,
    url: &str,
    ca_bundle: &str,
    deadline: Instant,
) -> Result<(), Error> {
    let mut converted = BTreeSet::new();
    for file in yaml_files(&capi.join("crd-patches"))? {
        for doc in documents(&file)? {
            if doc
                .pointer("/spec/conversion/strategy")
                .and_then(Value::as_str)
                == Some("Webhook")
            {
                converted.insert(name_of(&doc));
            }
        }
    }
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for file in yaml_files(&capi.join("crds"))? {
        for mut crd in documents(&file)? {
            let name = name_of(&crd);
            if converted.contains(&name) {
                crd["spec"]["conversion"] = json!({
                    "strategy": "Webhook",
                    "webhook": {
                        "conversionReviewVersions": ["v1"],
                        "clientConfig": {"url": format!("{url}/convert"), "caBundle": ca_bundle},
                    },
                });
            }
            apply(&api, &crd).await?;
            names.push(name);
        }
    }
    established(&api, &names, deadline).await
}

/// Waits until every CRD of `names` is Established.
pub async fn established(
    api: &Api<CustomResourceDefinition>,
    names: &[String],
    deadline: Instant,
) -> Result<(), Error> {
    let began = Instant::now();
    for name in names {
        loop {
            let got = api
                .get(name)
                .await
                .map_err(kube_err(format!("reading CRD {name}")))?;
            let ok = got
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if ok {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::NotEstablished(name.clone(), began.elapsed()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// The admission webhooks, each pointed at `url` + its path with the CA.
async fn install_webhooks(
    client: &kube::Client,
    capi: &Path,
    url: &str,
    ca_bundle: &str,
) -> Result<(), Error> {
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    for mut doc in documents(&capi.join("webhook/manifests.yaml"))? {
        let name = format!("cluster-api-{}", name_of(&doc));
        doc["metadata"] = json!({"name": name});
        if let Some(hooks) = doc.get_mut("webhooks").and_then(Value::as_array_mut) {
            for hook in hooks {
                let path = hook
                    .pointer("/clientConfig/service/path")
                    .and_then(Value::as_str)
                    .unwrap_or("/")
                    .to_string();
                hook["clientConfig"] =
                    json!({"url": format!("{url}{path}"), "caBundle": ca_bundle});
            }
        }
        match doc.get("kind").and_then(Value::as_str) {
            Some("MutatingWebhookConfiguration") => apply(&mutating, &doc).await?,
            Some("ValidatingWebhookConfiguration") => apply(&validating, &doc).await?,
            _ => {}
        }
    }
    Ok(())
}

/// Upstream's ClusterRole, and one over the providers' groups, bound to [`MANAGER_USER`].
async fn grant(
    client: &kube::Client,
    capi: &Path,
    provider_groups: &[String],
) -> Result<(), Error> {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let mut rules = Vec::new();
    for doc in documents(&capi.join("rbac/role.yaml"))? {
        if doc.get("kind").and_then(Value::as_str) == Some("ClusterRole")
            && let Some(r) = doc.get("rules").and_then(Value::as_array)
        {
            rules.extend(r.iter().cloned());
        }
    }
    let role = |name: &str, rules: Vec<Value>| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": rules,
        })
    };
    apply(&roles, &role(MANAGER_ROLE, rules)).await?;
    let provider_rules = if provider_groups.is_empty() {
        Vec::new()
    } else {
        vec![json!({
            "apiGroups": provider_groups, "resources": ["*"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        })]
    };
    apply(&roles, &role(PROVIDERS_ROLE, provider_rules)).await?;
    for name in [MANAGER_ROLE, PROVIDERS_ROLE] {
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": MANAGER_USER}],
        });
        apply(&bindings, &binding).await?;
    }
    Ok(())
}

/// `GET /readyz` on the manager's health port (plain HTTP on 127.0.0.1).
async fn readyz(port: u16) -> Result<(), String> {
    let connect = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port));
    let mut stream = tokio::time::timeout(Duration::from_millis(500), connect)
        .await
        .map_err(|_| format!("port {port}: connect timed out"))?
        .map_err(|e| format!("port {port}: {e}"))?;
    stream
        .write_all(b"GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut answer))
        .await
        .map_err(|_| "readyz timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let answer = String::from_utf8_lossy(&answer);
    let ok = answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200");
    if ok && answer.trim_end().ends_with("ok") {
        Ok(())
    } else {
        Err(answer.lines().next().unwrap_or("no answer").to_string())
    }
}
