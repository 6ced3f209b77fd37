//! The pods scenario (and the default one): Deployments of pending pods with mixed requests on a
//! cluster with a few MachineDeployment sizes. The provisioner packs them into NodeClaims, the
//! launch path turns those into Nodes, the simulated scheduler binds the pods. The report adds
//! pod and node figures to the launch report, all measured by the simulated cluster.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use super::launch::{self, progress_line};
use super::observer::Observer;
use super::report::{Percentiles, Report};
use super::{BackgroundSim, Error, Kept, sim_settings, start_controller};
use crate::api::resources::Resources;
use crate::api::wellknown::*;
use crate::cli::SimulateArgs;
use crate::metrics::Metrics;
use crate::sim::cluster::{MachineDeploymentSeed, PodShape, SimCluster};

/// (name, cpu, memory, price): the MachineDeployment sizes of the scenario.
pub const SIZES: [(&str, &str, &str, &str); 4] = [
    ("small", "2", "8Gi", "0.10"),
    ("medium", "4", "16Gi", "0.19"),
    ("large", "8", "32Gi", "0.37"),
    ("xlarge", "16", "64Gi", "0.72"),
];

/// Pod request shapes, cycled over the Deployments.
pub const SHAPES: [(&str, &str); 5] = [
    ("250m", "512Mi"),
    ("500m", "1Gi"),
    ("1", "2Gi"),
    ("1500m", "3Gi"),
    ("100m", "256Mi"),
];

pub fn seed_of(i: usize, max_size: usize) -> MachineDeploymentSeed {
    let (name, cpu, memory, price) = SIZES[i % SIZES.len()];
    let labels = format!(
        "{INSTANCE_TYPE_LABEL}={name},{ZONE_LABEL}=sim-zone-{},{ARCH_LABEL}=amd64,{OS_LABEL}=linux,{CAPACITY_TYPE_LABEL}=on-demand",
        i % 3
    );
    MachineDeploymentSeed {
        name: format!("md-{name}"),
        namespace: launch::NAMESPACE.into(),
        replicas: 0,
        labels: BTreeMap::from([(MEMBER_LABEL.to_string(), String::new())]),
        annotations: BTreeMap::from([
            (CPU_ANNOTATION.to_string(), cpu.to_string()),
            (MEMORY_ANNOTATION.to_string(), memory.to_string()),
            (MAX_PODS_ANNOTATION.to_string(), "110".to_string()),
            (LABELS_ANNOTATION.to_string(), labels),
            (PRICE_ANNOTATION.to_string(), price.to_string()),
            (MAX_SIZE_ANNOTATION.to_string(), max_size.to_string()),
        ]),
        ..Default::default()
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PodCounts {
    pub pending_at_start: usize,
    pub bound: usize,
    pub unschedulable: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct NodeCounts {
    /// Nodes created during the run (registered by the kubelet stand-in).
    pub created: usize,
    /// Nodes still there at the end.
    pub remaining: usize,
    pub cpu_utilization: f64,
    pub memory_utilization: f64,
}

/// Claims made twice for the same pods.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProvisioningCounts {
    /// Claims the controller created for a pod an earlier solve had planned onto another claim
    /// still in flight (its `karpenter_capi_extra_nodeclaims_total`: only the controller knows
    /// its plans).
    pub extra_claims: u64,
    /// Claims created for a pod an earlier solve had planned onto a claim whose Node the
    /// scheduler then filled with other pods (`karpenter_capi_replanned_nodeclaims_total`):
    /// the scheduler does not follow the controller's plan, upstream's neither.
    pub replanned_claims: u64,
    /// Nodes at the end that no pod is bound to, counted from the store: a claim made for pods
    /// that went elsewhere shows here whatever the controller's record says.
    pub nodes_without_pods: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PodReport {
    #[serde(flatten)]
    pub launch: Report,
    pub pods: PodCounts,
    pub nodes: NodeCounts,
    pub provisioning: ProvisioningCounts,
    pub pod_latency_ms: PodLatency,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PodLatency {
    pub pod_pending_to_bound: Percentiles,
}

impl PodReport {
    pub fn to_json(&self) -> String {
        // The shape: pod latency sits under latency_ms with the launch latencies.
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Some(obj) = v.as_object_mut() {
            let pod = obj
                .remove("pod_latency_ms")
                .and_then(|p| p.get("pod_pending_to_bound").cloned());
            if let (Some(p), Some(lat)) = (
                pod,
                obj.get_mut("latency_ms").and_then(Value::as_object_mut),
            ) {
                lat.insert("pod_pending_to_bound".into(), p);
            }
        }
        v.to_string()
    }

    /// This report's JSON with one more section (`key`) and the scenario's own
    /// `invariants_ok`: how the scenarios built on provisioning extend it.
    pub fn to_json_with(&self, key: &str, section: Value, invariants_ok: bool) -> String {
        let mut v: Value = serde_json::from_str(&self.to_json()).unwrap_or(Value::Null);
        if let Some(o) = v.as_object_mut() {
            o.insert(key.into(), section);
            o.insert("invariants_ok".into(), Value::Bool(invariants_ok));
        }
        v.to_string()
    }
}

impl std::fmt::Display for PodReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.launch)?;
        writeln!(
            f,
            "  pods:     {} pending at start; {} bound and {} not bound at the end; pending -> bound p50 {:.0} ms p99 {:.0} ms",
            self.pods.pending_at_start,
            self.pods.bound,
            self.pods.unschedulable,
            self.pod_latency_ms.pod_pending_to_bound.p50,
            self.pod_latency_ms.pod_pending_to_bound.p99
        )?;
        writeln!(
            f,
            "  nodes:    {} created, {} remaining; pod requests use {:.0}% of the remaining nodes' CPU and {:.0}% of their memory",
            self.nodes.created,
            self.nodes.remaining,
            self.nodes.cpu_utilization * 100.0,
            self.nodes.memory_utilization * 100.0
        )?;
        write!(
            f,
            "  claims:   {} made for pods already planned onto a claim in flight, {} for pods whose planned node took other pods; {} nodes with no pod at the end",
            self.provisioning.extra_claims,
            self.provisioning.replanned_claims,
            self.provisioning.nodes_without_pods
        )
    }
}

fn pod_bound(p: &Value) -> bool {
    p.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty())
}

/// Quiet for pods: launch-quiet, and every pod bound (or none bound for a while with nothing in
/// flight, when some cannot be placed at all).
fn all_bound(cluster: &SimCluster) -> bool {
    cluster.store().all("pods", pod_bound)
}

/// Wait for every pod to be bound and the launch path to be quiet; give up on pods that stay
/// unbound when nothing else changes for `stall`. Woken by the store's writes
/// (`launch::wait_until`), not by polling.
pub(super) async fn settle(
    sim: &BackgroundSim,
    deadline: Duration,
    stall: Duration,
    progress: bool,
) -> Result<(), Error> {
    let printer = &super::progress::Progress::new();
    let last_change = &Cell::new(Instant::now());
    let last_line = &RefCell::new(String::new());
    let last_print = &Cell::new(Instant::now());
    let settled = launch::wait_until(sim, deadline, move || async move {
        // Read on the cluster's runtime, so the CPU meter counts the look as the
        // simulator's and not the controller's (whose System thread this loop runs on).
        // The progress line walks every pod: once a second is enough for the printout and
        // for noticing a stall (seconds long), and keeps the look from holding the store.
        let due = last_print.get().elapsed() >= Duration::from_secs(1);
        let (line, quiet, bound) = sim
            .run(|c| async move {
                let line = due.then(|| progress_line(&c));
                (line, launch::quiet(&c), all_bound(&c))
            })
            .await?;
        if let Some(line) = line {
            last_print.set(Instant::now());
            if line != *last_line.borrow() {
                last_change.set(Instant::now());
                last_line.replace(line.clone());
            }
            if progress && printer.due() {
                printer.print(&line);
            }
        }
        Ok(quiet && (bound || last_change.get().elapsed() > stall))
    })
    .await?;
    if settled {
        Ok(())
    } else {
        Err(Error::Deadline(deadline))
    }
}

pub(super) fn measure(
    sim: &BackgroundSim,
    observer: &Observer,
    pods_created: usize,
    since_ms: u64,
    metrics: &crate::metrics::Metrics,
) -> PodReport {
    let cluster = sim.cluster();
    let claims = observer.snapshot().len();
    let mut launch = launch::measure(sim, observer, claims, since_ms, "pods", metrics);
    launch.claims.requested = claims;
    let store = cluster.store();
    let pods = store.list("pods", None);
    let bound = pods.iter().filter(|p| pod_bound(p)).count();
    let nodes = store.list("nodes", None);
    let utilization = Utilization::of(&pods, &nodes);
    let writes = cluster.stats().writes();
    PodReport {
        launch,
        pods: PodCounts {
            pending_at_start: pods_created,
            bound,
            unschedulable: pods_created.saturating_sub(bound),
        },
        nodes: NodeCounts {
            created: writes
                .iter()
                .filter(|w| w.resource == "nodes" && w.verb == "create")
                .count(),
            remaining: nodes.len(),
            cpu_utilization: utilization.ratio("cpu"),
            memory_utilization: utilization.ratio("memory"),
        },
        provisioning: ProvisioningCounts {
            extra_claims: metrics.extra_nodeclaims.get(),
            replanned_claims: metrics.replanned_nodeclaims.get(),
            nodes_without_pods: nodes_without_pods(&pods, &nodes),
        },
        pod_latency_ms: PodLatency {
            pod_pending_to_bound: Percentiles::of(pending_to_bound(&writes)),
        },
    }
}

/// Nodes no pod names in its `spec.nodeName`.
fn nodes_without_pods(pods: &[Value], nodes: &[Value]) -> usize {
    let with_pods: std::collections::HashSet<&str> = pods
        .iter()
        .filter_map(|p| p.pointer("/spec/nodeName").and_then(Value::as_str))
        .collect();
    nodes
        .iter()
        .filter(|n| {
            n.pointer("/metadata/name")
                .and_then(Value::as_str)
                .is_none_or(|name| !with_pods.contains(name))
        })
        .count()
}

/// Utilisation: the bound pods' requests over the allocatable of the nodes they run on.
struct Utilization {
    used: Resources,
    total: Resources,
}

impl Utilization {
    fn of(pods: &[Value], nodes: &[Value]) -> Self {
        let mut used = Resources::new();
        for r in pods.iter().filter(|p| pod_bound(p)).filter_map(requests) {
            used.add_assign(&r);
        }
        let mut total = Resources::new();
        for r in nodes.iter().filter_map(allocatable) {
            total.add_assign(&r);
        }
        Utilization { used, total }
    }

    /// Used over allocatable of resource `k`; 0 without any allocatable.
    fn ratio(&self, k: &str) -> f64 {
        let t = self.total.get(k);
        if t.is_zero() {
            0.0
        } else {
            self.used.get(k).as_f64() / t.as_f64()
        }
    }
}

/// A pod's requests, as the scheduler counts them (None when it does not read).
fn requests(p: &Value) -> Option<Resources> {
    let pod = serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(p.clone()).ok()?;
    crate::scheduling::pod::pod_requests(pod.spec.as_ref()?).ok()
}

/// A Node's `status.allocatable` (None when missing or unreadable).
fn allocatable(n: &Value) -> Option<Resources> {
    let a = n.pointer("/status/allocatable")?;
    let quantities = serde_json::from_value::<
        BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >(a.clone())
    .ok()?;
    Resources::from_k8s(&quantities).ok()
}

/// Each bound pod's wait from its create to its binding, in milliseconds.
fn pending_to_bound(writes: &[crate::sim::WriteRecord]) -> Vec<f64> {
    let created: BTreeMap<String, u64> = writes
        .iter()
        .filter(|w| w.resource == "pods" && w.verb == "create" && w.subresource.is_empty())
        .map(|w| (format!("{}/{}", w.namespace, w.name), w.at_ms))
        .collect();
    writes
        .iter()
        .filter(|w| w.resource == "pods" && w.subresource == "binding")
        .filter_map(|w| {
            created
                .get(&format!("{}/{}", w.namespace, w.name))
                .map(|c| w.at_ms.saturating_sub(*c) as f64)
        })
        .collect()
}

/// Wait until the Deployment stand-in has created `n` pods (not being deleted).
pub async fn wait_for_pods(sim: &BackgroundSim, n: usize, deadline: Duration) -> Result<(), Error> {
    let start = Instant::now();
    let mut changes = sim.cluster().store().changes();
    loop {
        changes.mark_unchanged();
        // Counted on the cluster's runtime (the simulator's CPU), woken by its writes.
        let have = sim.run(|c| async move { live_pods(&c) }).await?;
        if have >= n {
            return Ok(());
        }
        let left = deadline.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(Error::NotSettled {
                after: deadline,
                why: format!("the Deployments have {have} of {n} pods"),
            });
        }
        // A timeout only means the deadline is near: the loop checks it. Each count walks
        // every pod, so writes are gathered for a quarter second (pod latencies run from each
        // pod's own creation, so noticing the last one later changes no figure).
        let _ = tokio::time::timeout(left, changes.changed()).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Pods not being deleted.
pub fn live_pods(cluster: &SimCluster) -> usize {
    let mut n = 0;
    cluster.store().visit("pods", |p| {
        n += usize::from(
            p.pointer("/metadata/deletionTimestamp")
                .is_none_or(Value::is_null),
        );
    });
    n
}

/// A provisioned cluster: pods created from Deployments and bound (or given up on).
pub struct Provisioned {
    pub sim: BackgroundSim,
    pub observer: Observer,
    pub controller: crate::actors::controller::ControllerHandle,
    /// The server's clock when the pods were created.
    pub since_ms: u64,
    pub pods: usize,
}

impl Provisioned {
    /// The report on the pods and claims so far.
    pub fn measure(&self) -> PodReport {
        measure(
            &self.sim,
            &self.observer,
            self.pods,
            self.since_ms,
            &self.controller.shared.metrics,
        )
    }

    /// The cluster and the controller, for `--serve` to keep running.
    pub fn kept(self) -> Kept {
        Kept::new(self.sim, Some(self.controller))
    }
}

/// `simulate --scenario pods` (and the default scenario).
pub async fn run(args: &SimulateArgs) -> Result<PodReport, Error> {
    run_kept(args).await.map(|(report, _)| report)
}

/// `run`, handing back the cluster and the controller (`simulate --serve` keeps them running).
pub async fn run_kept(args: &SimulateArgs) -> Result<(PodReport, Kept), Error> {
    let p = provision(args, |_| {}, |_, _| {}).await?;
    let report = p.measure();
    Ok((report, p.kept()))
}

/// Seed the MachineDeployments, NodeClass and NodePool (`pool` may edit the NodePool first),
/// start the controller, create the Deployments' pods (`shape` may edit Deployment `d`'s pod
/// shape) and wait until they are bound.
pub async fn provision(
    args: &SimulateArgs,
    pool: impl FnOnce(&mut serde_json::Value) + Send + 'static,
    shape: impl Fn(usize, &mut PodShape) + Send + 'static,
) -> Result<Provisioned, Error> {
    provision_with(args, pool, shape, |_| {}).await
}

/// Pod deletion cost ranking in a simulation (`--feature-gates PodDeletionCostManagement=true`):
/// every second, as disruption passes are (production: a minute).
pub const SIM_DELETION_COST_PERIOD: Duration = Duration::from_secs(1);

/// `provision`, with `settings` editing the controller's settings before it starts.
pub async fn provision_with(
    args: &SimulateArgs,
    pool: impl FnOnce(&mut serde_json::Value) + Send + 'static,
    shape: impl Fn(usize, &mut PodShape) + Send + 'static,
    tweak: impl FnOnce(&mut crate::actors::Settings),
) -> Result<Provisioned, Error> {
    let sim = super::start_sim(args).await?;
    super::announce(&sim, args, "pods,nodeclaims,nodes");
    seed_machine_deployments(&sim, args).await?;
    seed_nodepool(&sim, pool).await?;
    provision_on(sim, args, shape, tweak).await
}

/// The second half of `provision_with`, on a cluster already seeded (a scenario may add objects
/// of its own before the controller starts).
pub async fn provision_on(
    sim: BackgroundSim,
    args: &SimulateArgs,
    shape: impl Fn(usize, &mut PodShape) + Send + 'static,
    tweak: impl FnOnce(&mut crate::actors::Settings),
) -> Result<Provisioned, Error> {
    let observer = Observer::default();
    {
        let o = observer.clone();
        sim.spawn(move |c| o.run(c.karpenter_client(), c.stats()));
    }
    let mut settings = provisioning_settings(args);
    tweak(&mut settings);
    let controller = start_controller(&sim, settings, Metrics::new()).await?;
    let since_ms = sim.cluster().stats().now_ms();
    let n = args.pods;
    create_deployments(&sim, args, shape).await?;
    sim.mark("Deployments created");
    wait_for_pods(&sim, n, args.deadline).await?;
    say!("waiting for every pod to be bound");
    settle(&sim, args.deadline, Duration::from_secs(15), true).await?;
    sim.mark("provisioned");
    Ok(Provisioned {
        sim,
        observer,
        controller,
        since_ms,
        pods: n,
    })
}

/// The controller's settings for the scenarios that provision pods.
pub(super) fn provisioning_settings(args: &SimulateArgs) -> crate::actors::Settings {
    let mut settings = sim_settings(args.create_timeout);
    settings.batching.idle = Duration::from_millis(300);
    settings.batching.max = Duration::from_secs(3);
    settings.pod_deletion_cost = args
        .feature_gates
        .pod_deletion_cost
        .then_some(SIM_DELETION_COST_PERIOD);
    settings
}

/// The scenario's MachineDeployments: `--machine-deployments` of the sizes in [`SIZES`], every
/// one a karpenter member, none with replicas yet.
pub async fn seed_machine_deployments(
    sim: &BackgroundSim,
    args: &SimulateArgs,
) -> Result<(), Error> {
    let mds = args.machine_deployments.clamp(1, SIZES.len());
    let max_size = args.pods.max(10);
    let scalable = args.scalable;
    sim.run(move |c| async move {
        for i in 0..mds {
            let mut seed = seed_of(i, max_size);
            // A fleet's clusters share one management cluster, each in a namespace of its own.
            if let Some(ns) = c.capi_namespace() {
                seed.namespace = ns.to_string();
            }
            super::node_groups::create(&c, scalable, i, seed).await?;
        }
        Ok::<_, crate::sim::cluster::Error>(())
    })
    .await??;
    Ok(())
}

/// The scenario's ClusterAPINodeClass and NodePool; `pool` may fill a merge patch for the NodePool.
pub async fn seed_nodepool(
    sim: &BackgroundSim,
    pool: impl FnOnce(&mut serde_json::Value) + Send + 'static,
) -> Result<(), Error> {
    sim.run(move |c| async move {
        let created = launch::seed_karpenter_objects(&c).await?;
        let mut edit = serde_json::json!({});
        pool(&mut edit);
        if edit.as_object().is_some_and(|o| !o.is_empty()) {
            let api: kube::Api<crate::api::nodepool::NodePool> =
                kube::Api::all(c.karpenter_client());
            api.patch(
                &kube::ResourceExt::name_any(&created),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&edit),
            )
            .await
            .map_err(|source| Error::Kube {
                what: "editing the NodePool".into(),
                source,
            })?;
        }
        Ok::<_, Error>(())
    })
    .await?
}

/// The scenario's workload: `--pods` pods in `--deployments` Deployments (`shape` may edit
/// Deployment `d`'s pod shape). Returns before the Deployment stand-in has created the pods.
pub async fn create_deployments(
    sim: &BackgroundSim,
    args: &SimulateArgs,
    shape: impl Fn(usize, &mut PodShape) + Send + 'static,
) -> Result<(), Error> {
    let mds = args.machine_deployments.clamp(1, SIZES.len());
    let (n, k) = (args.pods, args.deployments.max(1));
    say!(
        "creating {n} pending pods in {k} Deployments over {} (one size each)",
        super::node_groups::named(args.scalable, mds)
    );
    sim.run(move |c| async move {
        for d in 0..k {
            let count = n / k + usize::from(d < n % k);
            let (cpu, mem) = SHAPES[d % SHAPES.len()];
            let mut s = PodShape::new(cpu, mem);
            shape(d, &mut s);
            c.create_deployment(launch::NAMESPACE, &format!("app-{d}"), count, &s)
                .await?;
        }
        Ok::<_, crate::sim::cluster::Error>(())
    })
    .await??;
    Ok(())
}
