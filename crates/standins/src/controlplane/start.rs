//! One attempt at starting the control plane ([`ControlPlane::start`] retries it): the files it
//! needs, then each binary in order, each waited for before the next depends on it.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ServiceAccount;
use parking_lot::Mutex;

use super::process::{self, Processes};
use super::{
    BINARIES, CONTROLLERS, ControlPlane, Error, Options, Ports, args, audit, client_for, path, pki,
    wait_ready, write_kubeconfig,
};

impl ControlPlane {
    pub(super) async fn start_once(options: Options) -> Result<Self, Error> {
        let began = Instant::now();
        let deadline = began + options.startup_timeout;
        check_binaries(&options.assets)?;
        // From here on, dropping `processes` (an early return included) stops what started.
        let (processes, dir) =
            process::in_temp_dir("karpenter-capi-cp-", "the control plane's directory")?;
        let pki = pki::write(&dir)?;
        let ports = Ports::pick()?;
        let server = format!("https://127.0.0.1:{}", ports.apiserver);
        let kubeconfigs = Kubeconfigs::write(&dir, &server, &pki)?;
        let audit_policy = write_audit_policy(&dir)?;
        let audit_log = dir.join("audit.log");

        let launch = Launch {
            processes: &processes,
            assets: &options.assets,
            dir: &dir,
            pki: &pki,
            ports,
        };
        let wait = Wait {
            processes: &processes,
            deadline,
            began,
        };
        launch.etcd()?;
        launch.apiserver(&audit_policy, &audit_log)?;
        let client = client_for(&kubeconfigs.admin).await?;
        wait.apiserver_ready(&client).await?;
        launch.scheduler(&kubeconfigs.scheduler)?;
        launch.controller_manager(&kubeconfigs.controller_manager)?;
        wait.ports_open(&ports).await?;
        wait.default_service_account(&client).await?;

        let startup = began.elapsed();
        tracing::info!(?startup, %server, dir = %dir.display(), "control plane ready");
        Ok(ControlPlane {
            processes,
            client,
            kubeconfig: kubeconfigs.admin,
            controller_kubeconfig: kubeconfigs.controller,
            cluster_api_kubeconfig: kubeconfigs.cluster_api,
            pki,
            audit_log,
            dir,
            ports,
            startup,
        })
    }
}

/// Every binary is in `assets`.
fn check_binaries(assets: &Path) -> Result<(), Error> {
    for binary in BINARIES {
        if !assets.join(binary).is_file() {
            return Err(Error::MissingBinary {
                binary,
                dir: assets.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// The kubeconfig of each user, in the control plane's directory.
struct Kubeconfigs {
    admin: PathBuf,
    scheduler: PathBuf,
    controller_manager: PathBuf,
    controller: PathBuf,
    cluster_api: PathBuf,
}

impl Kubeconfigs {
    fn write(dir: &Path, server: &str, pki: &pki::Pki) -> Result<Self, Error> {
        let one = |file: &str, user: &pki::Pair| {
            let at = dir.join(file);
            write_kubeconfig(&at, server, &pki.ca, user).map(|()| at)
        };
        Ok(Kubeconfigs {
            admin: one("admin.kubeconfig", &pki.admin)?,
            scheduler: one("kube-scheduler.kubeconfig", &pki.scheduler)?,
            controller_manager: one(
                "kube-controller-manager.kubeconfig",
                &pki.controller_manager,
            )?,
            controller: one("controller.kubeconfig", &pki.controller)?,
            cluster_api: one("cluster-api.kubeconfig", &pki.cluster_api)?,
        })
    }
}

/// The API server's audit policy file.
fn write_audit_policy(dir: &Path) -> Result<PathBuf, Error> {
    let audit_policy = dir.join("audit-policy.yaml");
    std::fs::write(&audit_policy, audit::POLICY).map_err(|source| Error::Io {
        what: format!("writing {}", audit_policy.display()),
        source,
    })?;
    Ok(audit_policy)
}

/// Starts each binary with its flags.
struct Launch<'a> {
    processes: &'a Mutex<Processes>,
    assets: &'a Path,
    dir: &'a Path,
    pki: &'a pki::Pki,
    ports: Ports,
}

impl Launch<'_> {
    fn spawn(&self, binary: &'static str, args: &[String]) -> Result<(), Error> {
        process::spawn(self.processes, self.assets, self.dir, binary, args)
    }

    fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.etcd_client)
    }

    fn etcd(&self) -> Result<(), Error> {
        let etcd_url = self.etcd_url();
        let peer_url = format!("http://127.0.0.1:{}", self.ports.etcd_peer);
        self.spawn(
            "etcd",
            &args([
                ("name", "default"),
                ("data-dir", &path(&self.dir.join("etcd"))),
                ("listen-client-urls", &etcd_url),
                ("advertise-client-urls", &etcd_url),
                ("listen-peer-urls", &peer_url),
                ("initial-advertise-peer-urls", &peer_url),
                ("initial-cluster", &format!("default={peer_url}")),
                ("unsafe-no-fsync", "true"),
                ("log-level", "warn"),
            ]),
        )
    }

    fn apiserver(&self, audit_policy: &Path, audit_log: &Path) -> Result<(), Error> {
        let pki = self.pki;
        self.spawn(
            "kube-apiserver",
            &args([
                ("advertise-address", "127.0.0.1"),
                ("bind-address", "127.0.0.1"),
                ("secure-port", &self.ports.apiserver.to_string()),
                ("etcd-servers", &self.etcd_url()),
                ("cert-dir", &path(&self.dir.join("apiserver-certs"))),
                ("tls-cert-file", &path(&pki.serving.cert)),
                ("tls-private-key-file", &path(&pki.serving.key)),
                ("client-ca-file", &path(&pki.ca)),
                ("service-account-issuer", "https://kubernetes.default.svc"),
                ("service-account-key-file", &path(&pki.service_account_pub)),
                (
                    "service-account-signing-key-file",
                    &path(&pki.service_account_key),
                ),
                ("service-cluster-ip-range", pki::SERVICE_RANGE),
                ("authorization-mode", "Node,RBAC"),
                ("allow-privileged", "true"),
                // The front-proxy CA: without it the scheduler and controller-manager read an
                // empty request-header CA from the API server and log an error many times a
                // second, burying anything useful in their logs.
                ("requestheader-client-ca-file", &path(&pki.front_proxy_ca)),
                ("requestheader-allowed-names", "front-proxy-client"),
                ("requestheader-username-headers", "X-Remote-User"),
                ("requestheader-group-headers", "X-Remote-Group"),
                ("requestheader-extra-headers-prefix", "X-Remote-Extra-"),
                // Every request, one JSON line each: the real backend's reports count from it.
                ("audit-policy-file", &path(audit_policy)),
                ("audit-log-path", &path(audit_log)),
                ("audit-log-format", "json"),
                ("audit-log-mode", "blocking"),
            ]),
        )
    }

    fn scheduler(&self, kubeconfig: &Path) -> Result<(), Error> {
        self.spawn(
            "kube-scheduler",
            &component_args(kubeconfig, self.ports.scheduler),
        )
    }

    fn controller_manager(&self, kubeconfig: &Path) -> Result<(), Error> {
        let mut flags = component_args(kubeconfig, self.ports.controller_manager);
        flags.extend(args([
            ("controllers", CONTROLLERS),
            // Each controller acts as its own ServiceAccount with the bootstrap role made for
            // it, as on a kubeadm cluster, rather than with the manager's broad user.
            ("use-service-account-credentials", "true"),
            (
                "service-account-private-key-file",
                &path(&self.pki.service_account_key),
            ),
            ("root-ca-file", &path(&self.pki.ca)),
        ]));
        self.spawn("kube-controller-manager", &flags)
    }
}

/// The flags the scheduler and the controller-manager share: `kubeconfig` for everything, no
/// leader election, serving on `port`.
fn component_args(kubeconfig: &Path, port: u16) -> Vec<String> {
    args([
        ("kubeconfig", &path(kubeconfig)),
        ("authentication-kubeconfig", &path(kubeconfig)),
        ("authorization-kubeconfig", &path(kubeconfig)),
        ("leader-elect", "false"),
        ("bind-address", "127.0.0.1"),
        ("secure-port", &port.to_string()),
    ])
}

/// Waits for each binary to be ready, all against the start's one deadline.
struct Wait<'a> {
    processes: &'a Mutex<Processes>,
    deadline: Instant,
    began: Instant,
}

impl Wait<'_> {
    /// The API server answers `/readyz` with `ok`.
    async fn apiserver_ready(&self, client: &kube::Client) -> Result<(), Error> {
        wait_ready(
            self.processes,
            "kube-apiserver",
            self.deadline,
            self.began,
            || {
                let client = client.clone();
                async move {
                    let req = http::Request::get("/readyz")
                        .body(Vec::new())
                        .map_err(|e| e.to_string())?;
                    match client.request_text(req).await {
                        Ok(body) if body.trim() == "ok" => Ok(()),
                        Ok(body) => Err(body),
                        Err(e) => Err(e.to_string()),
                    }
                }
            },
        )
        .await
    }

    /// The scheduler and then the controller-manager listen on their ports.
    async fn ports_open(&self, ports: &Ports) -> Result<(), Error> {
        for (binary, port) in [
            ("kube-scheduler", ports.scheduler),
            ("kube-controller-manager", ports.controller_manager),
        ] {
            wait_ready(
                self.processes,
                binary,
                self.deadline,
                self.began,
                || async move {
                    TcpStream::connect_timeout(
                        &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                        Duration::from_millis(200),
                    )
                    .map(drop)
                    .map_err(|e| format!("port {port}: {e}"))
                },
            )
            .await?;
        }
        Ok(())
    }

    /// The controller-manager has made the `default` namespace's ServiceAccount.
    async fn default_service_account(&self, client: &kube::Client) -> Result<(), Error> {
        let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), "default");
        wait_ready(
            self.processes,
            "kube-controller-manager",
            self.deadline,
            self.began,
            || {
                let accounts = accounts.clone();
                async move {
                    match accounts.get_opt("default").await {
                        Ok(Some(_)) => Ok(()),
                        Ok(None) => Err("no ServiceAccount default/default yet".to_string()),
                        Err(e) => Err(e.to_string()),
                    }
                }
            },
        )
        .await
    }
}
