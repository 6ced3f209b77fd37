//! The kube clients `run` builds, and the read-only tools and the simulator with it: our user
//! agent, socket deadlines, the client-side rate limit and the replica's write gate, from a
//! kubeconfig file, the Go provider's management-cluster flags or the in-cluster config.

use std::path::Path;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::Error;
use crate::cli::{ClusterApiArgs, RunArgs};
use crate::write_gate::WriteGate;

/// The user agent our writes carry, so API audit logs (and the simulated server's reports)
/// can tell the controller's writes from everyone else's.
pub const USER_AGENT: &str = concat!("karpenter-capi/", env!("CARGO_PKG_VERSION"));

pub fn with_user_agent(config: kube::Config) -> kube::Config {
    with_agent(config, USER_AGENT)
}

fn with_agent(mut config: kube::Config, agent: &str) -> kube::Config {
    let value = hyper::header::HeaderValue::from_str(agent)
        .unwrap_or_else(|_| hyper::header::HeaderValue::from_static(USER_AGENT));
    config.headers.push((hyper::header::USER_AGENT, value));
    config
}

/// Client-side limits (`KUBE_CLIENT_QPS`, `KUBE_CLIENT_BURST`); qps 0 means unlimited.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub(crate) qps: u32,
    pub(crate) burst: u32,
}

impl Limits {
    pub const UNLIMITED: Limits = Limits { qps: 0, burst: 0 };
}

/// Socket deadlines of every kube client, so no API call can hang for ever (kube 5 sets no read
/// timeout by default). The read timeout is an idle bound between two reads of one response, and
/// watches share these clients: kube's watcher asks the server to end a watch after 290 s and
/// gives up on a silent stream itself at 290 + 5 s, so the read timeout must be longer than that
/// or every quiet watch would fail instead of being renewed cleanly. Requests that need a tighter
/// bound (the election's renewals) carry their own deadline on top.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timeouts {
    pub connect: Duration,
    pub read: Duration,
    pub write: Duration,
}

/// kube's watcher gives up on a silent watch after this long (server-side 290 s + 5 s margin).
pub const WATCH_IDLE: Duration = Duration::from_secs(295);

impl Timeouts {
    pub const DEFAULT: Timeouts = Timeouts {
        connect: Duration::from_secs(10),
        read: Duration::from_secs(300),
        write: Duration::from_secs(30),
    };
}

impl Default for Timeouts {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How to build one client: limits, user agent, deadlines and the replica's write gate.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    pub limits: Limits,
    pub agent: String,
    pub timeouts: Timeouts,
    /// Shared by the replica's clients so a shutdown stops all of their writes at once.
    pub gate: WriteGate,
    /// Where requests the server throttled (`Retry-After`) are counted, when anywhere.
    pub throttled: Option<crate::retry_after::Throttled>,
    /// Shadow mode: writes are recorded here and never sent.
    pub shadow: Option<crate::shadow::Shadow>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            limits: Limits::UNLIMITED,
            agent: USER_AGENT.to_string(),
            timeouts: Timeouts::DEFAULT,
            gate: WriteGate::default(),
            throttled: None,
            shadow: None,
        }
    }
}

impl ClientOptions {
    pub(crate) fn limited(limits: Limits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    /// The config a client is built from: our user agent and the deadlines.
    pub(crate) fn apply(&self, config: kube::Config) -> kube::Config {
        let mut config = with_agent(config, &self.agent);
        // kube's built-in retry is off: it retries 429/503/504 up to 15 times with a backoff
        // that grows to minutes, inside one call. Every caller here retries with its own capped
        // backoff and must see a refusal at once: a PodDisruptionBudget's 429 on an eviction is
        // an answer to report and back off from, not a reason to block a drain (or a leader's
        // renewal) for minutes. Only an answer that says when to come back (`Retry-After`) is
        // sent again within the call (`RetryAfterLayer`).
        config.default_retry = false;
        config.connect_timeout = Some(self.timeouts.connect);
        config.read_timeout = Some(self.timeouts.read);
        config.write_timeout = Some(self.timeouts.write);
        // Count the read timeout from when a request is sent, not from when its pooled
        // connection went idle.
        config.reset_reader_on_write = true;
        config
    }
}

/// A client from a config: our user agent and deadlines, the rate limit in front of the HTTP
/// stack, and in front of that the retries the server asks for with `Retry-After` (each retry
/// waits for its own token, as client-go's do).
pub fn build_client(config: kube::Config, limits: Limits) -> Result<kube::Client, kube::Error> {
    build_client_with(config, &ClientOptions::limited(limits))
}

pub fn build_client_with(
    config: kube::Config,
    options: &ClientOptions,
) -> Result<kube::Client, kube::Error> {
    let builder = kube::client::ClientBuilder::try_from(options.apply(config))?
        .with_layer(&options.gate.layer())
        .with_layer(&crate::ratelimit::RateLimitLayer::new(
            options.limits.qps,
            options.limits.burst,
        ))
        .with_layer(&crate::retry_after::RetryAfterLayer::new(
            options.throttled.clone(),
        ));
    // Outermost, so that a refused write takes no rate-limit token and reaches no layer below.
    Ok(match &options.shadow {
        Some(shadow) => builder.with_layer(&shadow.layer()).build(),
        None => builder.build(),
    })
}

/// A client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path, limits: Limits) -> Result<kube::Client, String> {
    client_from_kubeconfig_with(path, &ClientOptions::limited(limits)).await
}

pub async fn client_from_kubeconfig_with(
    path: &Path,
    options: &ClientOptions,
) -> Result<kube::Client, String> {
    let kc = Kubeconfig::read_from(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    build_client_with(config, options).map_err(|e| e.to_string())
}

pub(super) fn client_options(
    args: &RunArgs,
    gate: &WriteGate,
    metrics: &crate::metrics::Metrics,
) -> ClientOptions {
    ClientOptions {
        throttled: Some(metrics.api_throttled.clone()),
        limits: Limits {
            qps: args.kube_client_qps,
            burst: args.kube_client_burst,
        },
        gate: gate.clone(),
        ..ClientOptions::default()
    }
}

pub(super) async fn workload_client(
    kubeconfig: Option<&Path>,
    options: &ClientOptions,
) -> Result<kube::Client, Error> {
    match kubeconfig {
        Some(path) => client_from_kubeconfig_with(path, options)
            .await
            .map_err(Error::WorkloadConfig),
        None => {
            let config = kube::Config::infer()
                .await
                .map_err(|e| Error::WorkloadConfig(e.to_string()))?;
            Ok(build_client_with(config, options)?)
        }
    }
}

/// The management cluster's client, from the Go provider's flags or the pod's own in-cluster
/// config; the workload client when none is given ("joined" topology).
pub(super) async fn management_client(
    args: &ClusterApiArgs,
    workload: &kube::Client,
    options: &ClientOptions,
) -> Result<kube::Client, Error> {
    if args.cluster_api_in_cluster {
        // kube reads the projected ServiceAccount token again as it nears expiry, so the
        // kubelet's rotation of it needs nothing from us.
        let config = kube::Config::incluster().map_err(|e| Error::ManagementConfig {
            flag: "--cluster-api-in-cluster",
            message: e.to_string(),
        })?;
        return Ok(build_client_with(config, options)?);
    }
    if let Some(path) = &args.cluster_api_kubeconfig {
        return client_from_kubeconfig_with(path, options)
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
    Ok(build_client_with(config, options)?)
}

/// The workload and management clients as `run` builds them (same flags, same deadlines), for
/// the read-only tools (`explain`, `init`).
pub async fn clients(
    kubeconfig: Option<&Path>,
    capi: &ClusterApiArgs,
) -> Result<(kube::Client, kube::Client), Error> {
    let options = ClientOptions::default();
    let workload = workload_client(kubeconfig, &options).await?;
    let management = management_client(capi, &workload, &options).await?;
    Ok((workload, management))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_client_gets_deadlines_that_outlast_a_quiet_watch() {
        let t = Timeouts::DEFAULT;
        assert!(
            t.read > WATCH_IDLE,
            "a read timeout under the watcher's own idle bound would break every quiet watch"
        );
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
        let applied = ClientOptions::default().apply(config);
        assert_eq!(applied.connect_timeout, Some(t.connect));
        assert_eq!(applied.read_timeout, Some(t.read));
        assert_eq!(applied.write_timeout, Some(t.write));
        assert!(applied.reset_reader_on_write);
        assert!(
            applied
                .headers
                .iter()
                .any(|(k, v)| k == hyper::header::USER_AGENT && v == USER_AGENT)
        );
    }
}
