//! Wiring for `karpenter-capi run`: logging, the two kube clients (`app::client`), leader
//! election, the HTTP endpoints, the actor system and shutdown. Everything runs on one actix
//! System; every kube Client is created on it (a Client is bound to the runtime it was built on).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;

mod client;
pub mod fleet;
pub use client::{
    ClientOptions, Limits, Timeouts, USER_AGENT, WATCH_IDLE, build_client, build_client_with,
    client_from_kubeconfig, client_from_kubeconfig_with, clients, with_user_agent,
};
use client::{client_options, management_client, workload_client};

use crate::actors::Settings;
use crate::actors::controller::{Controller, ControllerHandle};
use crate::capi::version::CapiVersion;
use crate::cli::{CapiVersionArg, ClusterApiArgs, ControllerArgs, LogArgs, LogFormat, RunArgs};
use crate::http::{self, Health};
use crate::leader;
use crate::metrics::Metrics;
use crate::write_gate::WriteGate;

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
    #[error(
        "--karpenter-objects management binds Karpenter's objects to one Cluster: {0} must name it (or use --fleet)"
    )]
    KarpenterObjects(&'static str),
    #[error("start-up was stopped")]
    Stopped,
    #[error("fleet mode: {0}")]
    Fleet(#[source] fleet::Error),
    #[error(
        "--fleet serves every selected Cluster: {0} names one cluster or turns off what the fleet relies on, and cannot be used with it"
    )]
    FleetWith(&'static str),
    #[error("opening the decision log {path}: {source}")]
    DecisionLog {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Install the global tracing subscriber (text or JSON, filter from LOG_LEVEL, `default_level`
/// when it is not set). Text is coloured only on a terminal, and never when `NO_COLOR` is set
/// (no-color.org), so redirected logs hold no escape codes. Repeated warnings and the kube
/// client's own errors are counted rather than printed (`logging`), unless the filter asks for
/// debug.
pub fn init_logging(args: &LogArgs, default_level: &str) -> Result<(), Error> {
    use tracing_subscriber::field::MakeExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{EnvFilter, Layer as _, filter::LevelFilter};
    let level = args.log_level.as_deref().unwrap_or(default_level);
    let filter = EnvFilter::try_new(level)
        .map_err(|e| Error::Logging(format!("LOG_LEVEL {level:?}: {e}")))?;
    let verbose = filter
        .max_level_hint()
        .is_none_or(|l| l >= LevelFilter::DEBUG);
    let quiet = crate::logging::Quiet::new(verbose);
    let format = match args.log_format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .fmt_fields(
                tracing_subscriber::fmt::format::debug_fn(crate::logging::write_field)
                    .delimited(" "),
            )
            .with_target(false)
            .with_ansi(colour(
                std::io::IsTerminal::is_terminal(&std::io::stderr()),
                std::env::var_os("NO_COLOR").as_deref(),
            ))
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(format.with_filter(quiet.clone()))
        .try_init();
    // A second init (tests, simulate after run) keeps the first subscriber and its counts.
    if installed.is_ok() {
        crate::logging::install(quiet);
    }
    Ok(())
}

/// Colour on a terminal unless `NO_COLOR` is set to anything but the empty string.
pub(crate) fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

pub(crate) fn settings(c: &ControllerArgs, capi: &ClusterApiArgs) -> Settings {
    Settings {
        create_timeout: c.create_timeout,
        registration_timeout: c.registration_timeout,
        unavailable_offering_ttl: c.unavailable_offering_ttl,
        capi_namespace: capi.cluster_api_namespace.clone(),
        cluster_name: capi.cluster_name.clone(),
        karpenter_objects: binding(capi),
        batching: crate::actors::provisioner::Batching {
            idle: c.batch_idle_duration,
            max: c.batch_max_duration,
        },
        preference: match c.preference_policy {
            crate::cli::PreferencePolicy::Respect => crate::scheduling::PreferencePolicy::Respect,
            crate::cli::PreferencePolicy::Ignore => crate::scheduling::PreferencePolicy::Ignore,
        },
        min_values_policy: match c.min_values_policy {
            crate::cli::MinValuesPolicy::Strict => crate::scheduling::MinValuesPolicy::Strict,
            crate::cli::MinValuesPolicy::BestEffort => {
                crate::scheduling::MinValuesPolicy::BestEffort
            }
        },
        default_termination_grace_period: c.default_termination_grace_period,
        default_constraints: c.scheduler_config.0.clone(),
        capacity_buffers: c.feature_gates.capacity_buffer,
        capacity_quotas: c.feature_gates.capacity_quota,
        node_repair: c
            .feature_gates
            .node_repair
            .then(|| c.repair_policies.0.clone()),
        legacy_node_repair: c.legacy_node_repair,
        static_capacity: c.feature_gates.static_capacity,
        node_overlay: c.feature_gates.node_overlay,
        pod_deletion_cost: c
            .feature_gates
            .pod_deletion_cost
            .then_some(crate::view::settings::DELETION_COST_PERIOD),
        disruption: crate::view::settings::DisruptionSettings {
            paused: c.disruption_paused,
            terminate_first_drift: c.feature_gates.terminate_first_drift,
            terminate_first_repair: c.feature_gates.terminate_first_repair,
            ..Default::default()
        },
        ..Settings::default()
    }
}

/// The binding `--karpenter-objects management` asks for: this Cluster's name and namespace,
/// empty until known (fleet mode fills them in per Cluster; `run` refuses them empty,
/// [`check_binding`]).
pub(crate) fn binding(capi: &ClusterApiArgs) -> Option<crate::view::binding::Binding> {
    (capi.karpenter_objects == crate::cli::KarpenterObjects::Management).then(|| {
        crate::view::binding::Binding {
            cluster: capi.cluster_name.clone().unwrap_or_default(),
            namespace: capi.cluster_api_namespace.clone().unwrap_or_default(),
        }
    })
}

/// A controller for one Cluster with its objects in the management cluster must know which
/// Cluster they are bound to.
pub(crate) fn check_binding(capi: &ClusterApiArgs) -> Result<(), Error> {
    let Some(b) = binding(capi) else {
        return Ok(());
    };
    let missing = [
        ("--cluster-name (CLUSTER_NAME)", b.cluster.is_empty()),
        (
            "--cluster-api-namespace (CLUSTER_API_NAMESPACE)",
            b.namespace.is_empty(),
        ),
    ];
    match missing.iter().find(|(_, m)| *m) {
        Some((flag, _)) => Err(Error::KarpenterObjects(flag)),
        None => Ok(()),
    }
}

pub(crate) fn capi_version(arg: Option<CapiVersionArg>) -> Option<CapiVersion> {
    arg.map(|v| match v {
        CapiVersionArg::V1beta1 => CapiVersion::V1Beta1,
        CapiVersionArg::V1beta2 => CapiVersion::V1Beta2,
    })
}

/// How long a graceful shutdown may take in all: well inside a pod's default 30 s grace period.
pub const SHUTDOWN_BOUND: Duration = Duration::from_secs(10);
/// How long writes already sent get to finish once the gate is closed.
pub(crate) const WRITE_DRAIN: Duration = Duration::from_secs(2);
/// How long releasing the Lease may take.
pub(crate) const RELEASE_BOUND: Duration = Duration::from_secs(3);

/// The cluster that holds the leader-election Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseCluster {
    Workload,
    Management,
}

/// The Lease lives where the pods run, in their namespace: that namespace exists there, the
/// chart's Role for it is there, and a workload kubeconfig need not grant Leases. Only with
/// `--cluster-api-in-cluster` do the pods run in the management cluster; everywhere else they
/// run in the workload cluster, or outside both, where the Lease stays in the workload cluster
/// as before.
pub(crate) fn lease_cluster(capi: &ClusterApiArgs) -> LeaseCluster {
    if capi.cluster_api_in_cluster {
        LeaseCluster::Management
    } else {
        LeaseCluster::Workload
    }
}

/// Where and how a replica campaigns: the client of the cluster holding the Lease, and the
/// election's settings.
pub struct Campaign {
    pub client: kube::Client,
    pub config: leader::Config,
}

/// The kubeconfig files `run` builds its clients from, whose change restarts it.
pub(crate) fn kubeconfig_files(args: &RunArgs) -> Vec<std::path::PathBuf> {
    args.kubeconfig
        .iter()
        .chain(&args.cluster_api.cluster_api_kubeconfig)
        .cloned()
        .collect()
}

/// One replica: the controller, its election and its write gate.
pub struct Replica {
    pub(crate) handle: ControllerHandle,
    /// True while this replica leads.
    pub leading: watch::Receiver<bool>,
    gate: WriteGate,
    election: Option<leader::Election>,
    /// Without leader election, the fixed "leader" value's sender (kept open).
    _always: Option<watch::Sender<bool>>,
    reporter: tokio::task::JoinHandle<()>,
}

/// Start a replica: campaign (unless `election` is None: then this replica leads at once), start
/// the watches, and mark `health` ready once the caches are synced, leader or not.
pub async fn start_replica(
    controller: Controller,
    gate: WriteGate,
    health: Arc<Health>,
    election: Option<Campaign>,
) -> Result<Replica, Error> {
    let never = std::future::pending::<&'static str>();
    let started = start_replica_until(controller, gate, health, election, never).await?;
    // `never` cannot resolve, so start-up was not stopped.
    started.ok_or(Error::Stopped)
}

/// [`start_replica`], unless `stop` resolves first (a signal during start-up, a changed
/// kubeconfig): then the Lease,
/// if already taken, is released as at shutdown, and None is returned. A start-up that fails
/// releases it too. Either way a standby need not wait for the Lease to expire.
pub async fn start_replica_until(
    controller: Controller,
    gate: WriteGate,
    health: Arc<Health>,
    election: Option<Campaign>,
    stop: impl std::future::Future<Output = &'static str>,
) -> Result<Option<Replica>, Error> {
    let (election, leading, always) = match election {
        Some(Campaign { client, config }) => {
            let e = leader::Election::spawn(client, config);
            let status = e.status.clone();
            (Some(e), status, None)
        }
        None => {
            let (tx, rx) = watch::channel(true);
            (None, rx, Some(tx))
        }
    };
    let reporter = tokio::spawn(report_leadership(
        leading.clone(),
        controller.metrics.clone(),
        health.clone(),
        gate.clone(),
    ));
    let give_up = |election: Option<leader::Election>,
                   gate: WriteGate,
                   reporter: tokio::task::JoinHandle<()>| async move {
        reporter.abort();
        gate.close();
        if let Some(e) = election {
            e.release(RELEASE_BOUND).await;
        }
    };
    let started = tokio::select! {
        r = controller.start_synced(leading.clone()) => r,
        s = stop => {
            tracing::info!(reason = s, "stopped during start-up; exiting");
            give_up(election, gate, reporter).await;
            return Ok(None);
        }
    };
    let handle = match started {
        Ok(h) => h,
        Err(e) => {
            give_up(election, gate, reporter).await;
            return Err(e.into());
        }
    };
    health.set_ready();
    Ok(Some(Replica {
        handle,
        leading,
        gate,
        election,
        _always: always,
        reporter,
    }))
}

/// Leadership as a metric, on the health struct and in the log; the gate closes when it is lost
/// (a replica that stops leading must not write again, whatever its actors are doing).
async fn report_leadership(
    mut leading: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    gate: WriteGate,
) {
    let mut was = false;
    loop {
        let now = *leading.borrow_and_update();
        if now != was {
            tracing::info!(leader = now, "leadership changed");
            if was && !now {
                gate.close();
            }
        }
        metrics.leader.set(i64::from(now));
        health.leader.store(now, Ordering::Release);
        was = now;
        if leading.changed().await.is_err() {
            return;
        }
    }
}

impl Replica {
    /// Resolves when the election ends on its own (leadership lost); never without election.
    pub(crate) async fn lost(&mut self) -> Result<(), leader::Error> {
        match self.election.as_mut() {
            Some(e) => e.finished().await,
            None => std::future::pending().await,
        }
    }

    /// Graceful stop (SIGTERM): stop writing, give writes on the wire a bounded moment, stop the
    /// actors, then release the Lease so a standby takes over at its next retry. Bounded by
    /// `SHUTDOWN_BOUND` in all.
    pub async fn shutdown(self) {
        let started = tokio::time::Instant::now();
        let Replica {
            handle,
            gate,
            election,
            reporter,
            ..
        } = self;
        let steps = async {
            gate.close();
            handle.deactivate();
            if !gate.drained(WRITE_DRAIN).await {
                tracing::warn!(
                    in_flight = gate.in_flight(),
                    "writes still in flight at shutdown; abandoning them"
                );
            }
            handle.stop();
            if let Some(e) = election {
                e.release(RELEASE_BOUND).await;
            }
        };
        if tokio::time::timeout(SHUTDOWN_BOUND, steps).await.is_err() {
            tracing::warn!(bound = ?SHUTDOWN_BOUND, "shutdown did not finish in time");
        }
        reporter.abort();
        tracing::info!(took = ?started.elapsed(), "shut down");
    }

    /// Stop as a killed process would: no release, writes abandoned mid-flight.
    pub fn abort(self) {
        if let Some(e) = self.election {
            e.abort();
        }
        self.reporter.abort();
        self.handle.stop();
    }
}

/// Resolves on SIGTERM (what Kubernetes sends) or SIGINT; names the signal. The handlers are
/// installed when this is called, not when the future is first polled, so a signal that arrives
/// during start-up is not lost to the default action (which would skip the shutdown path).
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = &'static str> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let handlers = signal(SignalKind::terminate())
            .and_then(|term| Ok((term, signal(SignalKind::interrupt())?)));
        async move {
            match handlers {
                Ok((mut term, mut int)) => tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                },
                Err(e) => {
                    tracing::warn!(error = %e, "cannot install signal handlers; Ctrl-C only");
                    let _ = tokio::signal::ctrl_c().await;
                    "SIGINT"
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
        "SIGINT"
    }
}

/// Resolves on a signal, or when a kubeconfig file changes: the restart that follows builds the
/// clients from the new file (a Client never reads its kubeconfig again). Names the reason.
async fn stop_reason(
    signal: impl std::future::Future<Output = &'static str>,
    files: crate::kubeconfig_watch::KubeconfigWatch,
) -> &'static str {
    tokio::select! {
        s = signal => s,
        path = files.changed() => {
            tracing::info!(
                path = %path.display(),
                "kubeconfig changed; shutting down so that the restart uses it"
            );
            "kubeconfig changed"
        }
    }
}

/// `karpenter-capi run`: returns when the process should exit.
pub async fn run(args: RunArgs) -> Result<(), Error> {
    if args.fleet.enabled {
        return fleet::run_fleet(args).await;
    }
    check_binding(&args.cluster_api)?;
    // Listen first: a signal during start-up must not kill the process before it can release.
    // The files' baseline is read before the clients are built from them, so a change in
    // between is not missed.
    let files = crate::kubeconfig_watch::KubeconfigWatch::new(
        kubeconfig_files(&args),
        args.kubeconfig_check_interval,
    );
    let signal = stop_reason(shutdown_signal(), files);
    tokio::pin!(signal);
    let metrics = Metrics::new();
    let health = Arc::new(Health::default());
    let gate = WriteGate::default();
    let mut options = client_options(&args, &gate, &metrics);
    if args.dry_run {
        let log = args.decision_log.as_deref();
        let shadow = crate::shadow::Shadow::new(log).map_err(|source| Error::DecisionLog {
            path: log.map(std::path::Path::to_path_buf).unwrap_or_default(),
            source,
        })?;
        tracing::info!(
            decision_log = log.map(|p| tracing::field::display(p.display())),
            "dry run: every watch and decision runs, no write is sent; leader election is skipped (it writes a Lease)"
        );
        options.shadow = Some(shadow);
    }
    let workload = workload_client(args.kubeconfig.as_deref(), &options).await?;
    let management = management_client(&args.cluster_api, &workload, &options).await?;
    let (metrics_addr, health_addr) = http::serve(
        SocketAddr::from(([0, 0, 0, 0], args.metrics_port)),
        SocketAddr::from(([0, 0, 0, 0], args.health_probe_port)),
        metrics.clone(),
        health.clone(),
    )
    .await?;
    tracing::info!(%metrics_addr, %health_addr, "serving metrics and probes");

    let identity = leader::default_identity();
    let election = (!args.disable_leader_election && !args.dry_run).then(|| {
        let namespace = args
            .leader_election_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "kube-system".to_string());
        let client = match lease_cluster(&args.cluster_api) {
            LeaseCluster::Workload => workload.clone(),
            LeaseCluster::Management => management.clone(),
        };
        let config = leader::Config::new(
            namespace,
            args.leader_election_name.clone(),
            identity.clone(),
        );
        Campaign { client, config }
    });
    for (gate, on, why) in &args.controller.feature_gates.no_effect {
        tracing::info!(gate = %gate, value = on, why = %why, "feature gate has no effect here");
    }
    let controller = Controller {
        workload,
        management,
        capi_version: capi_version(args.cluster_api.cluster_api_version),
        settings: Settings {
            dry_run: args.dry_run,
            ..settings(&args.controller, &args.cluster_api)
        },
        metrics,
        instance: identity,
    };
    let Some(mut replica) =
        start_replica_until(controller, gate, health, election, &mut signal).await?
    else {
        return Ok(());
    };
    tokio::select! {
        r = replica.lost() => {
            // A replica that lost the Lease exits (as controller-runtime does); its writes are
            // already refused by the gate. The restart comes back as a standby.
            replica.abort();
            r?;
            Ok(())
        }
        s = &mut signal => {
            tracing::info!(reason = s, "shutting down");
            replica.shutdown().await;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(
            colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR is unset"
        );
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None), "a file or pipe gets no escape codes");
    }

    #[test]
    fn the_lease_is_kept_in_the_cluster_the_pods_run_in() {
        let mut capi = ClusterApiArgs::default();
        assert_eq!(lease_cluster(&capi), LeaseCluster::Workload, "joined");
        capi.cluster_api_url = Some("https://mgmt.example:6443".into());
        assert_eq!(
            lease_cluster(&capi),
            LeaseCluster::Workload,
            "in the workload cluster, reaching a separate management cluster"
        );
        let capi = ClusterApiArgs {
            cluster_api_in_cluster: true,
            ..ClusterApiArgs::default()
        };
        assert_eq!(
            lease_cluster(&capi),
            LeaseCluster::Management,
            "beside Cluster API"
        );
    }

    #[tokio::test]
    async fn a_changed_kubeconfig_stops_the_controller_and_a_signal_still_does() {
        use crate::kubeconfig_watch::KubeconfigWatch;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("kubeconfig");
        std::fs::write(&file, "old").expect("write");
        let every = Duration::from_millis(20);
        let stop = tokio::spawn(stop_reason(
            std::future::pending(),
            KubeconfigWatch::new([file.clone()], every),
        ));
        tokio::time::sleep(every * 3).await;
        assert!(!stop.is_finished());
        std::fs::write(&file, "new").expect("write");
        let reason = tokio::time::timeout(Duration::from_secs(5), stop)
            .await
            .expect("the change is seen")
            .expect("task");
        assert_eq!(reason, "kubeconfig changed");
        let signalled = stop_reason(
            std::future::ready("SIGTERM"),
            KubeconfigWatch::new([file], every),
        )
        .await;
        assert_eq!(signalled, "SIGTERM");
    }
}
