//! Starting a [`SimCluster`]: its API server (and, apart, its management cluster's) and the
//! stand-ins for what the API server itself does not do.

use tokio::task::JoinHandle;

use std::sync::Arc;

use super::{
    Backend, CLUSTER_NAME, Error, Served, ServedVersions, SharedManagement, SimClusterConfig, seed,
};
use crate::capi::{self, CapiConfig};
use crate::disruption_audit::{self, DisruptionAudit};
use crate::kubelet::{self, KubeletConfig};
use crate::real;
use crate::scheduler::{self, BindLog, SchedulerConfig};
use crate::standin::{Clusters, Shutdown};
use crate::{CapiVersions, SimConfig, SimError, SimServer, Stats};
use crate::{deployments, node_lease, pdb_status, pod_lifecycle};

/// Cluster API's group and its providers' (`infrastructure.cluster.x-k8s.io`, ...), not
/// Karpenter's own `karpenter.cluster.x-k8s.io`, which lives with the NodePools.
pub(super) fn is_cluster_api_group(group: &str) -> bool {
    const CAPI: &str = "cluster.x-k8s.io";
    group == CAPI || (group.ends_with(&format!(".{CAPI}")) && group != "karpenter.cluster.x-k8s.io")
}

/// Karpenter's API groups (NodePools, NodeClaims, NodeOverlays; NodeClasses).
pub(super) fn is_karpenter_group(group: &str) -> bool {
    group == "karpenter.sh" || group == "karpenter.cluster.x-k8s.io"
}

/// The simulated API server for `cfg`.
pub(super) async fn start_server(cfg: &SimClusterConfig) -> Result<SimServer, Error> {
    start_server_logging(cfg, None).await
}

/// [`start_server`], recording in `stats` when given.
async fn start_server_logging(
    cfg: &SimClusterConfig,
    stats: Option<Stats>,
) -> Result<SimServer, Error> {
    let served = match cfg.served {
        ServedVersions::V1beta1 => CapiVersions::V1Beta1,
        ServedVersions::V1beta2 => CapiVersions::V1Beta2,
        ServedVersions::Both => CapiVersions::Both,
    };
    let mut config = SimConfig {
        served_capi_versions: served,
        seed: cfg.seed,
        port: cfg.port,
        stats,
        ..SimConfig::default()
    }
    .with_infrastructure_templates();
    for def in &cfg.extra_resources {
        config.add_kind(def.clone());
    }
    let server = SimServer::start(config).await?;
    if let Some(out) = &cfg.kubeconfig_out {
        crate::kubeconfig::write_file(out, server.url())?;
    }
    Ok(server)
}

/// The management cluster apart from the workload cluster `served`: a second simulated server
/// holding Cluster `sim` and, as Cluster API writes it for every cluster it makes, the Secret
/// `sim-kubeconfig` whose `value` is a kubeconfig for the workload cluster.
pub(super) async fn start_management(
    cfg: &SimClusterConfig,
    served: &Served,
) -> Result<SimServer, Error> {
    let Served::Simulated(workload) = served else {
        return Err(Error::NotOnRealBackend("a management cluster apart"));
    };
    // With Karpenter's objects here, the claims' writes are logged with the workload cluster's
    // (one clock), where a report reads them.
    let stats = cfg.karpenter_in_management.then(|| workload.stats());
    let config = SimClusterConfig {
        port: 0,
        kubeconfig_out: None,
        ..cfg.clone()
    };
    let management = start_server_logging(&config, stats).await?;
    if cfg.karpenter_in_management {
        workload.read_claims_from(&management);
    }
    let client = management.client();
    let kubeconfig = std::fs::read(workload.kubeconfig_path()).map_err(|source| {
        Error::Server(SimError::Kubeconfig {
            path: workload.kubeconfig_path().display().to_string(),
            source,
        })
    })?;
    seed::create_cluster_with_kubeconfig(
        &client,
        cfg.capi_version,
        "default",
        CLUSTER_NAME,
        &kubeconfig,
    )
    .await?;
    Ok(management)
}

/// Joins the management cluster `shared` as one more workload cluster: Cluster `sim` in the
/// namespace given and its `sim-kubeconfig` Secret for the workload cluster `served`.
pub(super) async fn join_management(
    cfg: &SimClusterConfig,
    shared: &SharedManagement,
    served: &Served,
) -> Result<Arc<SimServer>, Error> {
    let Served::Simulated(workload) = served else {
        return Err(Error::NotOnRealBackend("a shared management cluster"));
    };
    let kubeconfig = std::fs::read(workload.kubeconfig_path()).map_err(|source| {
        Error::Server(SimError::Kubeconfig {
            path: workload.kubeconfig_path().display().to_string(),
            source,
        })
    })?;
    let client = shared.server.client();
    let namespace = k8s_openapi::api::core::v1::Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(shared.namespace.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    kube::Api::all(client.clone())
        .create(&Default::default(), &namespace)
        .await
        .map_err(|source| Error::Kube {
            what: format!("create Namespace {}", shared.namespace),
            source,
        })?;
    seed::create_cluster_with_kubeconfig(
        &client,
        cfg.capi_version,
        &shared.namespace,
        CLUSTER_NAME,
        &kubeconfig,
    )
    .await?;
    Ok(shared.server.clone())
}

/// The stand-ins for what neither backend's API server does (Cluster API and its provider, the
/// kubelet), and on the simulated backend for what kube-controller-manager and kube-scheduler
/// do on a real one (Deployments, PodDisruptionBudget status, pod garbage collection, binding
/// pods). The disruption
/// audit runs on both: it measures, it models nothing.
pub(super) fn spawn_standins(
    cfg: &SimClusterConfig,
    clusters: &Clusters,
    milestones: Stats,
    shutdown: Shutdown,
    tasks: &mut Vec<JoinHandle<()>>,
) -> (BindLog, DisruptionAudit, capi::Caches) {
    let real = cfg.backend == Backend::Real;
    let real_capi = cfg.cluster_api.is_real();
    // Pods, Nodes and the workload cluster's controllers.
    let client = &clusters.workload;
    let capi = if real_capi {
        // Cluster API's own controllers run; the simulator plays only its providers: the
        // machines' and the scaling groups' behind MachinePools (whose DevMachines the first
        // provisions like any other).
        let provider = real::provider::ProviderConfig {
            version: cfg.capi_version,
            provider_delay: cfg.provider_delay,
            jitter: cfg.jitter,
            fail_fraction: cfg.fail_fraction,
            provider_id_style: cfg.provider_id_style,
            seed: cfg.seed,
            stats: Some(milestones),
        };
        tasks.extend(real::pool::spawn(
            client.clone(),
            provider.clone(),
            shutdown.clone(),
        ));
        tasks.extend(real::provider::spawn(
            client.clone(),
            provider,
            shutdown.clone(),
        ));
        capi::Caches::empty(cfg.capi_version)
    } else {
        let (capi_tasks, capi) = capi::spawn(
            clusters.clone(),
            CapiConfig {
                version: cfg.capi_version,
                provider_delay: cfg.provider_delay,
                jitter: cfg.jitter,
                fail_fraction: cfg.fail_fraction,
                node_delete_delay: cfg.node_delete_delay,
                provider_id_style: cfg.provider_id_style,
                seed: cfg.seed,
                stats: Some(milestones),
            },
            shutdown.clone(),
        );
        tasks.extend(capi_tasks);
        capi
    };
    tasks.extend(kubelet::spawn(
        clusters.clone(),
        KubeletConfig {
            version: cfg.capi_version,
            node_ready_delay: cfg.node_ready_delay,
            device_plugin_delay: cfg.device_plugin_delay,
            not_ready_taint: cfg.not_ready_taint && !real,
            cluster_api_real: real_capi,
        },
        shutdown.clone(),
    ));
    if real {
        // A kubelet's Lease per Node, which the real node lifecycle controller reads (the
        // simulated server has none, so there the writes would only be load).
        tasks.extend(node_lease::spawn(client.clone(), shutdown.clone()));
    }
    // The audit reads Karpenter's objects, where they live.
    let karpenter = match cfg.karpenter_in_management {
        true => &clusters.management,
        false => client,
    };
    let (audit, t) = disruption_audit::spawn(karpenter.clone(), shutdown.clone());
    tasks.extend(t);
    tasks.extend(pod_lifecycle::spawn(
        client.clone(),
        cfg.pod_exit_delay,
        !real,
        shutdown.clone(),
    ));
    if real {
        return (BindLog::default(), audit, capi);
    }
    tasks.extend(pdb_status::spawn(client.clone(), shutdown.clone()));
    tasks.extend(deployments::spawn(
        client.clone(),
        cfg.seed,
        shutdown.clone(),
    ));
    if !cfg.scheduler {
        return (BindLog::default(), audit, capi);
    }
    let (log, t) = scheduler::spawn(
        client.clone(),
        SchedulerConfig {
            debounce: cfg.scheduler_debounce,
        },
        shutdown,
    );
    tasks.extend(t);
    (log, audit, capi)
}
