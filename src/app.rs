//! Wiring for `karpenter-capi run`: logging, the two kube clients, leader election, the HTTP
//! endpoints and the actor system. Everything runs on one actix System; every kube Client is
//! created on it (a Client is bound to the runtime it was built on).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::watch;

use crate::actors::{Controller, Settings};
use crate::capi::version::CapiVersion;
use crate::cli::{CapiVersionArg, ClusterApiArgs, ControllerArgs, LogArgs, LogFormat, RunArgs};
use crate::http::{self, Health};
use crate::leader;
use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("workload cluster configuration: {0}")]
    WorkloadConfig(String),
    #[error("management cluster configuration ({flag}): {message}")]
    ManagementConfig { flag: &'static str, message: String },
    #[error("creating a kube client: {0}")]
    Client(#[from] kube::Error),
    #[error(transparent)]
    Http(#[from] http::Error),
    #[error(transparent)]
    Start(#[from] crate::actors::controller::StartError),
    #[error(transparent)]
    Leader(#[from] leader::Error),
    #[error("invalid logging configuration: {0}")]
    Logging(String),
}

/// Install the global tracing subscriber (text or JSON, filter from LOG_LEVEL).
pub fn init_logging(args: &LogArgs) -> Result<(), Error> {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(&args.log_level)
        .map_err(|e| Error::Logging(format!("LOG_LEVEL {:?}: {e}", args.log_level)))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match args.log_format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.with_target(false).try_init(),
    };
    // A second init (tests, simulate after run) keeps the first subscriber; that is fine.
    let _ = result;
    Ok(())
}

pub fn settings(c: &ControllerArgs, capi: &ClusterApiArgs) -> Settings {
    Settings {
        create_timeout: c.create_timeout,
        registration_timeout: c.registration_timeout,
        unavailable_offering_ttl: c.unavailable_offering_ttl,
        capi_namespace: capi.cluster_api_namespace.clone(),
        cluster_name: capi.cluster_name.clone(),
        batching: crate::actors::provisioner::Batching {
            idle: c.batch_idle_duration,
            max: c.batch_max_duration,
        },
        preference: match c.preference_policy {
            crate::cli::PreferencePolicy::Respect => crate::scheduling::PreferencePolicy::Respect,
            crate::cli::PreferencePolicy::Ignore => crate::scheduling::PreferencePolicy::Ignore,
        },
        ..Settings::default()
    }
}

pub fn capi_version(arg: Option<CapiVersionArg>) -> Option<CapiVersion> {
    arg.map(|v| match v {
        CapiVersionArg::V1beta1 => CapiVersion::V1Beta1,
        CapiVersionArg::V1beta2 => CapiVersion::V1Beta2,
    })
}

/// The user agent our writes carry, so API audit logs (and the simulated server's reports)
/// can tell the controller's writes from everyone else's.
pub const USER_AGENT: &str = concat!("karpenter-capi/", env!("CARGO_PKG_VERSION"));

pub fn with_user_agent(mut config: kube::Config) -> kube::Config {
    config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static(USER_AGENT),
    ));
    config
}

/// Client-side limits (`KUBE_CLIENT_QPS`, `KUBE_CLIENT_BURST`); qps 0 means unlimited.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub qps: u32,
    pub burst: u32,
}

impl Limits {
    pub const UNLIMITED: Limits = Limits { qps: 0, burst: 0 };
}

/// A client from a config: our user agent, and the rate limit in front of the HTTP stack.
pub fn build_client(config: kube::Config, limits: Limits) -> Result<kube::Client, kube::Error> {
    let builder = kube::client::ClientBuilder::try_from(with_user_agent(config))?;
    Ok(builder
        .with_layer(&crate::ratelimit::RateLimitLayer::new(
            limits.qps,
            limits.burst,
        ))
        .build())
}

/// A client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path, limits: Limits) -> Result<kube::Client, String> {
    let kc = Kubeconfig::read_from(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    build_client(config, limits).map_err(|e| e.to_string())
}

fn limits(args: &RunArgs) -> Limits {
    Limits {
        qps: args.kube_client_qps,
        burst: args.kube_client_burst,
    }
}

async fn workload_client(args: &RunArgs) -> Result<kube::Client, Error> {
    match &args.kubeconfig {
        Some(path) => client_from_kubeconfig(path, limits(args))
            .await
            .map_err(Error::WorkloadConfig),
        None => {
            let config = kube::Config::infer()
                .await
                .map_err(|e| Error::WorkloadConfig(e.to_string()))?;
            Ok(build_client(config, limits(args))?)
        }
    }
}

/// The management cluster's client, from the Go provider's flags; the workload client when none
/// is given ("joined" topology).
async fn management_client(
    args: &ClusterApiArgs,
    workload: &kube::Client,
    limits: Limits,
) -> Result<kube::Client, Error> {
    if let Some(path) = &args.cluster_api_kubeconfig {
        return client_from_kubeconfig(path, limits)
            .await
            .map_err(|message| Error::ManagementConfig {
                flag: "--cluster-api-kubeconfig",
                message,
            });
    }
    let Some(url) = &args.cluster_api_url else {
        return Ok(workload.clone());
    };
    // Build an in-memory kubeconfig so kube handles the CA bundle and token exactly as it does
    // for files.
    let mut cluster = serde_json::json!({ "server": url });
    if let Some(ca) = &args.cluster_api_certificate_authority_data {
        cluster["certificate-authority-data"] = serde_json::json!(ca);
    }
    if args.cluster_api_skip_tls_verify {
        cluster["insecure-skip-tls-verify"] = serde_json::json!(true);
    }
    let mut user = serde_json::json!({});
    if let Some(token) = &args.cluster_api_token {
        user["token"] = serde_json::json!(token);
    }
    let kc = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "management", "cluster": cluster}],
        "users": [{"name": "karpenter-capi", "user": user}],
        "contexts": [{"name": "management", "context": {"cluster": "management", "user": "karpenter-capi"}}],
        "current-context": "management",
    });
    let err = |message: String| Error::ManagementConfig {
        flag: "--cluster-api-url",
        message,
    };
    let kc: Kubeconfig = serde_json::from_value(kc).map_err(|e| err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| err(e.to_string()))?;
    Ok(build_client(config, limits)?)
}

/// `karpenter-capi run`: returns when the process should exit.
pub async fn run(args: RunArgs) -> Result<(), Error> {
    let metrics = Metrics::new();
    let health = Arc::new(Health::default());
    let workload = workload_client(&args).await?;
    let management = management_client(&args.cluster_api, &workload, limits(&args)).await?;
    let (metrics_addr, health_addr) = http::serve(
        SocketAddr::from(([0, 0, 0, 0], args.metrics_port)),
        SocketAddr::from(([0, 0, 0, 0], args.health_probe_port)),
        metrics.clone(),
        health.clone(),
    )
    .await?;
    tracing::info!(%metrics_addr, %health_addr, "serving metrics and probes");

    let identity = leader::default_identity();
    let (leader_tx, leader_rx) = watch::channel(args.disable_leader_election);
    let election = if args.disable_leader_election {
        None
    } else {
        let namespace = args
            .leader_election_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "kube-system".to_string());
        let cfg = leader::Config::new(
            namespace,
            args.leader_election_name.clone(),
            identity.clone(),
        );
        Some(tokio::spawn(leader::run(workload.clone(), cfg, leader_tx)))
    };

    let controller = Controller {
        workload,
        management,
        capi_version: capi_version(args.cluster_api.cluster_api_version),
        settings: settings(&args.controller, &args.cluster_api),
        metrics,
        instance: identity,
    };
    let _handle = controller.start(leader_rx).await?;
    health.set_ready();

    match election {
        Some(task) => tokio::select! {
            r = task => if let Ok(Err(e)) = r { return Err(e.into()) },
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; shutting down"),
        },
        None => {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("interrupted; shutting down");
        }
    }
    Ok(())
}
