//! Fleet mode (`run --fleet`): one process in the management cluster serves every Cluster API
//! Cluster that matches a label selector, each with the same controller a single release runs
//! (its own workload client, indexes and actors, scoped to its Cluster's name and namespace).
//!
//! Replicas share the Clusters through Kubernetes, not a protocol of ours: one
//! `coordination.k8s.io` Lease per Cluster in the release's namespace. A replica starts a
//! Cluster's controller only once it holds that Cluster's Lease (a cold standby: a replica that
//! serves nothing of a Cluster spends nothing on it), and stops it when the Lease is lost or the
//! Cluster leaves the selection. Each Cluster runs in a task of its own: a Cluster whose
//! kubeconfig Secret is missing or wrong, or whose API server does not answer, waits and retries
//! there and never delays the others.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};

use kube::{Client, ResourceExt};
use tokio::sync::watch;

use super::client::{ClientOptions, build_client_with};
use crate::actors::controller::{Controller, ControllerHandle};
use crate::actors::events::Events;
use crate::capi::version::{self, CapiVersion};
use crate::leader;
use crate::metrics::Metrics;
use crate::view::settings::Settings;
use crate::write_gate::WriteGate;

mod exported;
mod secret;
mod share;
pub use exported::{ClusterMetrics, FleetExposition, Turns};
pub use secret::KubeconfigSecret;
use secret::workload_config;
pub use share::{Share, fair_share, member_lease_name};

/// `run --fleet`: the management cluster's client configuration, the metrics and probes, and
/// [`run`] until a signal.
pub(crate) async fn run_fleet(args: crate::cli::RunArgs) -> Result<(), super::Error> {
    refuse_single_cluster_flags(&args)?;
    let signal = super::shutdown_signal();
    let management = management_config(&args.cluster_api).await?;
    let metrics = Metrics::new();
    let clusters = ClusterMetrics::default();
    let health = Arc::new(crate::http::Health::default());
    let (metrics_addr, health_addr) = crate::http::serve(
        std::net::SocketAddr::from(([0, 0, 0, 0], args.metrics_port)),
        std::net::SocketAddr::from(([0, 0, 0, 0], args.health_probe_port)),
        Arc::new(FleetExposition {
            own: metrics.clone(),
            clusters: clusters.clone(),
        }),
        health.clone(),
    )
    .await?;
    tracing::info!(%metrics_addr, %health_addr, "fleet mode: serving metrics and probes");
    health.set_ready();
    let fleet = Fleet {
        management,
        options: ClientOptions {
            throttled: Some(metrics.api_throttled.clone()),
            limits: super::client::Limits {
                qps: args.kube_client_qps,
                burst: args.kube_client_burst,
            },
            ..ClientOptions::default()
        },
        selector: args.fleet.selector.clone(),
        namespace: args.cluster_api.cluster_api_namespace.clone(),
        lease_namespace: args
            .leader_election_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "kube-system".to_string()),
        identity: leader::default_identity(),
        settings: super::settings(&args.controller, &args.cluster_api),
        capi_version: super::capi_version(args.cluster_api.cluster_api_version),
        kubeconfig_secret: KubeconfigSecret {
            name: args.fleet.kubeconfig_secret.clone(),
            key: args.fleet.kubeconfig_secret_key.clone(),
        },
        metrics: clusters,
        share_period: Duration::from_secs(5),
        retry: Duration::from_secs(30),
        start_within: Duration::from_secs(120),
    };
    run(fleet, signal).await.map_err(super::Error::Fleet)
}

/// Fleet mode serves many Clusters: a flag that names one workload cluster, or turns off what the
/// fleet relies on (its Leases, its writes), is refused with its name.
fn refuse_single_cluster_flags(args: &crate::cli::RunArgs) -> Result<(), super::Error> {
    let set = [
        ("--kubeconfig", args.kubeconfig.is_some()),
        ("--cluster-name", args.cluster_api.cluster_name.is_some()),
        ("--dry-run", args.dry_run),
        ("--disable-leader-election", args.disable_leader_election),
    ];
    match set.into_iter().find(|(_, on)| *on) {
        Some((flag, _)) => Err(super::Error::FleetWith(flag)),
        None => Ok(()),
    }
}

/// The management cluster's configuration: the pod's own (in-cluster) or a kubeconfig file.
async fn management_config(
    capi: &crate::cli::ClusterApiArgs,
) -> Result<kube::Config, super::Error> {
    if capi.cluster_api_in_cluster {
        return kube::Config::incluster().map_err(|e| super::Error::ManagementConfig {
            flag: "--cluster-api-in-cluster",
            message: e.to_string(),
        });
    }
    let err = |message: String| super::Error::ManagementConfig {
        flag: "--cluster-api-kubeconfig",
        message,
    };
    let Some(path) = &capi.cluster_api_kubeconfig else {
        return Err(err(
            "fleet mode reaches the management cluster with --cluster-api-in-cluster or --cluster-api-kubeconfig".into(),
        ));
    };
    let kc = Kubeconfig::read_from(path).map_err(|e| err(format!("{}: {e}", path.display())))?;
    kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| err(format!("{}: {e}", path.display())))
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Cluster API on the management cluster: {0}")]
    Version(#[from] version::Error),
    #[error("the management cluster's client: {0}")]
    Client(#[from] kube::Error),
    #[error("the thread of the fleet's Lease elections: {0}")]
    ElectionThread(std::io::Error),
}

/// What every Cluster's controller shares, and how Clusters are chosen.
#[derive(Clone)]
pub struct Fleet {
    /// The management cluster's configuration: each Cluster gets clients of its own from it,
    /// behind its own write gate.
    pub management: kube::Config,
    /// Client limits and deadlines (the gate is made per Cluster).
    pub options: ClientOptions,
    /// Only Clusters with these labels (`key=value,...`; empty: every Cluster).
    pub selector: Option<String>,
    /// Only Clusters in this namespace (None: all namespaces).
    pub namespace: Option<String>,
    /// Where the Clusters' Leases are kept (the release's namespace).
    pub lease_namespace: String,
    pub identity: String,
    /// The settings of every Cluster's controller; each is scoped to its Cluster.
    pub settings: Settings,
    pub capi_version: Option<CapiVersion>,
    /// Where each Cluster's workload kubeconfig is read.
    pub kubeconfig_secret: KubeconfigSecret,
    /// The metrics of the Clusters served now, which /metrics exports.
    pub metrics: ClusterMetrics,
    /// How often the replicas are counted for each one's fair share.
    pub share_period: Duration,
    /// How long a Cluster that failed to start waits before the next try.
    pub retry: Duration,
    /// How long a Cluster's controller may take to start (its workload cluster answering and
    /// every cache synced) before the start counts as failed.
    pub start_within: Duration,
}

/// The Lease of Cluster `ns/name`: a name of at most 63 characters that no other Cluster
/// shares (a long name is cut and a hash of the whole keeps it apart).
pub fn lease_name(ns: &str, name: &str) -> String {
    let full = format!("karpenter-capi-{ns}.{name}");
    if full.len() <= 63 {
        return full;
    }
    let hash = format!(
        "{:08x}",
        crate::api::nodepool::fnv1a64(full.as_bytes()) as u32
    );
    let keep = full
        .char_indices()
        .take_while(|(i, _)| *i < 63 - hash.len() - 1)
        .map(|(_, c)| c)
        .collect::<String>();
    format!("{}-{hash}", keep.trim_end_matches(['-', '.']))
}

/// Why a Cluster is not served now, in words for its log line.
fn skip_reason(cluster: &DynamicObject) -> Option<&'static str> {
    if cluster.metadata.deletion_timestamp.is_some() {
        return Some("the Cluster is being deleted");
    }
    let paused = cluster.data["spec"]["paused"].as_bool() == Some(true)
        || cluster
            .annotations()
            .contains_key("cluster.x-k8s.io/paused");
    paused.then_some("the Cluster is paused")
}

/// Serve every selected Cluster until `stop` resolves; then every Cluster's controller stops
/// and its Lease is released.
pub async fn run(
    fleet: Fleet,
    stop: impl std::future::Future<Output = &'static str>,
) -> Result<(), Error> {
    let management = build_client_with(fleet.management.clone(), &fleet.options)?;
    let v = version::discover(&management, fleet.capi_version).await?;
    let api: Api<DynamicObject> = match &fleet.namespace {
        Some(ns) => Api::namespaced_with(management.clone(), ns, &v.cluster()),
        None => Api::all_with(management.clone(), &v.cluster()),
    };
    let config = match &fleet.selector {
        Some(s) => watcher::Config::default().labels(s),
        None => watcher::Config::default(),
    };
    let events = watcher(api, config).default_backoff();
    tokio::pin!(events, stop);
    let told = Events::new(management.clone(), fleet.identity.clone());
    let elections = Elections::start(&fleet)?;
    let member = leader::Config::new(
        fleet.lease_namespace.clone(),
        member_lease_name(&fleet.identity),
        fleet.identity.clone(),
    );
    let share = Share::new();
    let counting = elections.spawn(share.clone().count(
        elections.client.clone(),
        fleet.lease_namespace.clone(),
        member.lease_duration,
        fleet.share_period,
    ));
    let _counting = AbortOnDrop(counting);
    // Released when the fleet stops gracefully, so the other replicas' shares grow at their
    // next count; left to expire if this task is aborted (as a killed process leaves it).
    let (release_membership, released) = tokio::sync::oneshot::channel();
    let mut membership =
        AbortOnDrop(elections.spawn(keep_membership(elections.clone(), member, released)));
    let fleet = Arc::new(fleet);
    let mut served: BTreeMap<(String, String), Served> = BTreeMap::new();
    // The Clusters of a (re-)list in progress: once it completes, any served Cluster not in it
    // is gone.
    let mut listing: Vec<(String, String)> = Vec::new();
    loop {
        let event = tokio::select! {
            reason = &mut stop => {
                tracing::info!(reason, clusters = served.len(), "fleet stopping");
                // Side by side: each releases its Lease within RELEASE_BOUND; then this
                // replica stops counting as a member.
                futures::future::join_all(served.into_values().map(Served::stop)).await;
                let _ = release_membership.send(());
                let _ = (&mut membership.0).await;
                return Ok(());
            }
            next = events.next() => match next {
                Some(Ok(event)) => event,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watching Clusters failed; it will re-list");
                    continue;
                }
                None => return Ok(()),
            },
        };
        match event {
            watcher::Event::Init => listing.clear(),
            watcher::Event::InitApply(c) => {
                listing.push(key_of(&c));
                follow(&fleet, &mut served, (&elections, &told, &share), c).await;
            }
            watcher::Event::InitDone => {
                let gone: Vec<_> = (served.keys())
                    .filter(|k| !listing.contains(k))
                    .cloned()
                    .collect();
                for key in gone {
                    leave(&mut served, &key, "the Cluster is gone").await;
                }
            }
            watcher::Event::Apply(c) => {
                follow(&fleet, &mut served, (&elections, &told, &share), c).await
            }
            watcher::Event::Delete(c) => {
                leave(&mut served, &key_of(&c), "the Cluster is gone").await
            }
        }
        share.set_selected(served.len());
    }
}

fn key_of(c: &DynamicObject) -> (String, String) {
    (c.namespace().unwrap_or_default(), c.name_any())
}

/// Stop serving Cluster `key`, if served.
async fn leave(served: &mut BTreeMap<(String, String), Served>, key: &(String, String), why: &str) {
    if let Some(s) = served.remove(key) {
        tracing::info!(cluster = %format!("{}/{}", key.0, key.1), why, "no longer serving the Cluster");
        s.stop().await;
    }
}

/// Start serving a Cluster that appeared, stop one that left (deleted, paused, no longer
/// selected). A re-listed Cluster already served stays as it is.
async fn follow(
    fleet: &Arc<Fleet>,
    served: &mut BTreeMap<(String, String), Served>,
    (elections, told, share): (&Elections, &Events, &Arc<Share>),
    cluster: DynamicObject,
) {
    let key = key_of(&cluster);
    match skip_reason(&cluster) {
        Some(why) => leave(served, &key, why).await,
        None if !served.contains_key(&key) => {
            tracing::info!(cluster = %format!("{}/{}", key.0, key.1), "serving the Cluster when its Lease is ours");
            let to = Telling {
                events: told.clone(),
                cluster: reference_of(&cluster),
                share: share.clone(),
            };
            let s = Served::start(fleet.clone(), elections.clone(), key.clone(), to);
            served.insert(key, s);
        }
        None => {}
    }
}

/// Where a Cluster's task tells the operator how serving it goes: Events on the Cluster in the
/// management cluster, so `kubectl describe cluster` says why a Cluster is not served.
struct Telling {
    events: Events,
    cluster: ObjectReference,
    /// This replica's share of the Clusters.
    share: Arc<Share>,
}

/// Where the fleet's Lease elections run: a thread and runtime of their own, and a management
/// client of their own built there, so that no Cluster's controller, however busy, delays a
/// renewal past its deadline (and its own client's rate limit is spent on Leases alone).
#[derive(Clone)]
struct Elections {
    thread: Arc<leader::ElectionThread>,
    client: Client,
}

impl Elections {
    fn start(fleet: &Fleet) -> Result<Self, Error> {
        let thread =
            leader::ElectionThread::start("fleet-elections").map_err(Error::ElectionThread)?;
        // Built on the thread's runtime: the client's own tasks (its buffer, its connections)
        // run there.
        let client = {
            let _on = thread.handle().enter();
            build_client_with(fleet.management.clone(), &fleet.options)?
        };
        Ok(Self {
            thread: Arc::new(thread),
            client,
        })
    }

    /// Campaign for `lease` on the elections' thread.
    fn campaign(&self, lease: leader::Config) -> leader::Election {
        leader::Election::spawn_on(self.thread.handle(), self.client.clone(), lease)
    }

    fn spawn(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        self.thread.handle().spawn(task)
    }
}

/// Keeps this replica's membership Lease until `release` (then gives it up): an election that
/// ended (the Lease not renewed in time, as under a heavy load) is started again, or the other
/// replicas would stop counting this one while it still serves its Clusters.
async fn keep_membership(
    elections: Elections,
    member: leader::Config,
    mut release: tokio::sync::oneshot::Receiver<()>,
) {
    loop {
        let mut election = elections.campaign(member.clone());
        let released = tokio::select! {
            ended = election.finished() => {
                let error = ended.err().map(|e| e.to_string());
                tracing::warn!(?error, "this replica's membership Lease was lost; campaigning for it again");
                false
            }
            _ = &mut release => true,
        };
        if released {
            election.release(RELEASE_BOUND).await;
            return;
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A reference to the Cluster, as its watch delivered it.
fn reference_of(cluster: &DynamicObject) -> ObjectReference {
    let types = cluster.types.clone().unwrap_or_default();
    ObjectReference {
        api_version: Some(types.api_version),
        kind: Some("Cluster".to_string()),
        name: cluster.metadata.name.clone(),
        namespace: cluster.metadata.namespace.clone(),
        uid: cluster.metadata.uid.clone(),
        resource_version: None,
        ..ObjectReference::default()
    }
}

/// One Cluster's task and the means to stop it. Dropped without [`Served::stop`] (the fleet's
/// own task aborted), it aborts the Cluster's task as a killed process would end it: the
/// controller stops, the Lease is left to expire.
struct Served {
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Served {
    fn start(fleet: Arc<Fleet>, elections: Elections, key: (String, String), to: Telling) -> Self {
        let (stop, stopped) = watch::channel(false);
        let task = actix::spawn(serve(fleet, elections, key, to, stopped));
        Self {
            stop,
            task: Some(task),
        }
    }

    async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A Cluster's running controller: stopped, its writes refused, however its task ends (an
/// aborted task included).
struct Running {
    handle: Option<ControllerHandle>,
    gate: WriteGate,
    /// Where its metrics are exported, and under which Cluster.
    exported: (ClusterMetrics, String),
}

impl Drop for Running {
    fn drop(&mut self) {
        self.exported.0.remove(&self.exported.1);
        self.gate.close();
        if let Some(handle) = self.handle.take() {
            handle.deactivate();
            handle.stop();
        }
    }
}

/// How long a stopping Cluster's Lease release may take.
const RELEASE_BOUND: Duration = Duration::from_secs(5);

/// Campaign for the Cluster's Lease while this replica holds less than its share; while the
/// Lease is held, run the Cluster's controller ([`turn`]). A start that fails (its Secret, its
/// API server), or a Cluster let go because this replica holds more than its share, gives the
/// Lease up and tries again after `fleet.retry`, so another replica may serve it meanwhile.
async fn serve(
    fleet: Arc<Fleet>,
    elections: Elections,
    (ns, name): (String, String),
    to: Telling,
    mut stopped: watch::Receiver<bool>,
) {
    while !*stopped.borrow() {
        tokio::select! {
            _ = to.share.room() => {}
            _ = stopped.wait_for(|s| *s) => return,
        }
        let lease = leader::Config::new(
            fleet.lease_namespace.clone(),
            lease_name(&ns, &name),
            fleet.identity.clone(),
        );
        let mut election = elections.campaign(lease);
        let mut leading = election.status.clone();
        tokio::select! {
            r = leading.wait_for(|l| *l) => if r.is_err() { return; },
            // Another Cluster's win filled this replica's share: stop campaigning for this one.
            _ = to.share.full() => {
                election.release(RELEASE_BOUND).await;
                continue;
            }
            _ = stopped.wait_for(|s| *s) => {
                election.release(RELEASE_BOUND).await;
                return;
            }
        }
        let ended = turn(
            &fleet,
            (&ns, &name),
            &to,
            &mut election,
            leading,
            &mut stopped,
        );
        match ended.await {
            Turn::Lost => {}
            Turn::Stopped => {
                election.release(RELEASE_BOUND).await;
                return;
            }
            Turn::Failed | Turn::LetGo => {
                election.release(RELEASE_BOUND).await;
                let _ = tokio::time::timeout(fleet.retry, stopped.wait_for(|s| *s)).await;
            }
        }
    }
}

/// How holding a Cluster's Lease ended.
enum Turn {
    /// The Lease was lost (another replica may hold it now).
    Lost,
    /// The fleet stops.
    Stopped,
    /// The Cluster's controller could not start.
    Failed,
    /// This replica held more than its share and let the Cluster go.
    LetGo,
}

/// Holding the Cluster's Lease: start its controller and run it until the Lease is lost, the
/// fleet stops or this replica lets the Cluster go; the controller is stopped whichever comes.
async fn turn(
    fleet: &Fleet,
    (ns, name): (&str, &str),
    to: &Telling,
    election: &mut leader::Election,
    leading: watch::Receiver<bool>,
    stopped: &mut watch::Receiver<bool>,
) -> Turn {
    let cluster = format!("{ns}/{name}");
    tracing::info!(cluster = %cluster, "holding the Cluster's Lease; starting its controller");
    let mut holding = to.share.hold();
    let gate = WriteGate::default();
    let metrics = Metrics::new();
    let started = start_cluster(fleet, (ns, name), &gate, metrics.clone(), leading);
    let started = tokio::select! {
        h = started => h,
        _ = stopped.wait_for(|s| *s) => {
            gate.close();
            return Turn::Stopped;
        }
    };
    let handle = match started {
        Ok(handle) => handle,
        Err(why) => {
            tracing::warn!(cluster = %cluster, error = %why, retry_in = ?fleet.retry, "cannot serve the Cluster; giving its Lease up and trying again");
            let note = format!(
                "cannot serve the Cluster: {why}; trying again in {:?}",
                fleet.retry
            );
            to.events
                .warning(to.cluster.clone(), "ClusterNotServed", note);
            gate.close();
            return Turn::Failed;
        }
    };
    let note = format!("served by fleet replica {}", fleet.identity);
    to.events.normal(to.cluster.clone(), "ClusterServed", note);
    fleet.metrics.enter(&cluster, metrics);
    let running = Running {
        handle: Some(handle),
        gate,
        exported: (fleet.metrics.clone(), cluster.clone()),
    };
    let ended = tokio::select! {
        _ = election.finished() => Turn::Lost,
        _ = stopped.wait_for(|s| *s) => Turn::Stopped,
        _ = to.share.over(&mut holding) => Turn::LetGo,
    };
    drop(running);
    tell_end(fleet, to, &cluster, &ended);
    ended
}

/// Says how a turn ended where the operator looks, when it is news.
fn tell_end(fleet: &Fleet, to: &Telling, cluster: &str, ended: &Turn) {
    let me = &fleet.identity;
    match ended {
        Turn::Lost => {
            fleet.metrics.lease_lost(cluster);
            tracing::warn!(cluster, "lost the Cluster's Lease; its controller stopped");
            let note =
                format!("fleet replica {me} lost the Cluster's Lease; its controller stopped");
            to.events
                .warning(to.cluster.clone(), "ClusterLeaseLost", note);
        }
        Turn::LetGo => {
            tracing::info!(
                cluster,
                held = to.share.held(),
                "holding more than this replica's share; letting the Cluster go to another replica"
            );
            let note = format!(
                "fleet replica {me} holds more than its share of the Clusters; letting this one go to another replica"
            );
            to.events
                .normal(to.cluster.clone(), "ClusterHandedOver", note);
        }
        Turn::Stopped | Turn::Failed => {}
    }
}

/// The Cluster's controller, its workload reached through the Cluster's kubeconfig Secret, both
/// clients behind the Cluster's own write gate.
async fn start_cluster(
    fleet: &Fleet,
    (ns, name): (&str, &str),
    gate: &WriteGate,
    metrics: Arc<Metrics>,
    leading: watch::Receiver<bool>,
) -> Result<ControllerHandle, String> {
    let options = ClientOptions {
        gate: gate.clone(),
        ..fleet.options.clone()
    };
    let management = build_client_with(fleet.management.clone(), &options)
        .map_err(|e| format!("management client: {e}"))?;
    let workload = workload_config(&management, &fleet.kubeconfig_secret, ns, name).await?;
    let workload = build_client_with(workload, &options).map_err(|e| e.to_string())?;
    let mut settings = fleet.settings.clone();
    settings.cluster_name = Some(name.to_string());
    settings.capi_namespace = Some(ns.to_string());
    if let Some(b) = &mut settings.karpenter_objects {
        (b.cluster, b.namespace) = (name.to_string(), ns.to_string());
    }
    let controller = Controller {
        workload,
        management,
        capi_version: fleet.capi_version,
        settings,
        metrics,
        instance: fleet.identity.clone(),
    };
    let started = tokio::time::timeout(fleet.start_within, controller.start_synced(leading));
    match started.await {
        Ok(handle) => handle.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "the workload cluster did not answer, or its caches did not sync, within {:?}",
            fleet.start_within
        )),
    }
}

#[cfg(test)]
mod tests;
