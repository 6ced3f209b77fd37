//! `simulate --scenario quota`: the pods scenario under a CapacityQuota (`autoscaling.x-k8s.io`,
//! docs/capacity-quotas.md) on the NodePool's nodes, created before the controller starts (with
//! its `CapacityQuota` gate on). Provisioning stops at the quota's limit and the pods left stay
//! pending, each told so in a `FailedScheduling` Event naming the quota; then the quota is
//! deleted and they are bound. What the nodes hold is sampled from the store throughout the held
//! phase, so a moment over the limit is seen even if it passes; the quota's status and the
//! Events are read through the API, as a user reads them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::pods::{self, PodReport, SHAPES};
use super::{BackgroundSim, Error, Kept};
use crate::api::capacity_quota::CapacityQuota;
use crate::api::resources::Quantity;
use crate::cli::{QuotaSpec, SimulateArgs};

/// The quota's name.
pub const QUOTA: &str = "sim-nodepool";

#[derive(Clone, Debug, Default, Serialize)]
pub struct QuotaSection {
    pub name: String,
    /// Its `spec.limits.resources`: whole CPUs and nodes.
    pub limit_cpu: Option<u64>,
    pub limit_nodes: Option<u64>,
    /// What the launched claims' capacity (`status.capacity`, every claim of the NodePool in
    /// the store, terminating ones too) added up to when the quota held: CPUs and claims.
    pub provisioned_cpu: f64,
    pub provisioned_nodes: usize,
    /// The most of either at any sample (every 250 ms) from the controller's start until the
    /// quota was deleted: never above the limit, or the run's invariants fail.
    pub max_provisioned_cpu: f64,
    pub max_provisioned_nodes: usize,
    /// The quota's `status.used.resources` as the API served it when it held (the controller
    /// writes it every 2 s), and its `Reconciled` condition's status.
    pub status_used: BTreeMap<String, String>,
    pub reconciled: Option<String>,
    /// Pods pending when the quota held, and those of them the controller told, in a
    /// `FailedScheduling` Event, that this quota holds them; one such Event's note.
    pub pods_pending: usize,
    pub pods_held_by_quota: usize,
    pub held_message: Option<String>,
    /// After the quota was deleted: pods bound, and how long until every pod was.
    pub pods_bound_after_removal: usize,
    pub removal_to_all_bound_ms: u64,
}

pub struct QuotaReport {
    pub pods: PodReport,
    pub quota: QuotaSection,
}

impl QuotaReport {
    pub fn invariants_ok(&self) -> bool {
        self.pods.launch.invariants_ok
    }

    pub fn to_json(&self) -> String {
        let section = serde_json::to_value(&self.quota).unwrap_or(Value::Null);
        self.pods
            .to_json_with("quota", section, self.invariants_ok())
    }
}

impl std::fmt::Display for QuotaReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.pods)?;
        let q = &self.quota;
        let limit = |l: Option<u64>| l.map_or("-".to_string(), |n| n.to_string());
        writeln!(
            f,
            "  quota:    {} limits cpu {} nodes {}; provisioned {} CPUs on {} nodes (at most {} CPUs, {} nodes at any sample); status.used {:?}, Reconciled {}",
            q.name,
            limit(q.limit_cpu),
            limit(q.limit_nodes),
            q.provisioned_cpu,
            q.provisioned_nodes,
            q.max_provisioned_cpu,
            q.max_provisioned_nodes,
            q.status_used,
            q.reconciled.as_deref().unwrap_or("-"),
        )?;
        write!(
            f,
            "            {} pods pending, {} of them held by the quota ({}); after its deletion {} pods bound within {:.1}s",
            q.pods_pending,
            q.pods_held_by_quota,
            q.held_message.as_deref().unwrap_or("no Event"),
            q.pods_bound_after_removal,
            q.removal_to_all_bound_ms as f64 / 1000.0
        )
    }
}

/// The limits asked for, or half the CPUs the pods request, rounded down to an even number (the
/// sizes have 2, 4, 8 and 16 CPUs, so an even limit can be filled exactly), at least 2.
pub fn limits(args: &SimulateArgs) -> QuotaSpec {
    if let Some(spec) = args.capacity_quota {
        return spec;
    }
    let (n, k) = (args.pods, args.deployments.max(1));
    let millis: u64 = (0..k)
        .map(|d| {
            let count = n / k + usize::from(d < n % k);
            let cpu = SHAPES[d % SHAPES.len()].0.parse::<Quantity>();
            let each = cpu.map_or(0.0, |q| q.as_f64() * 1000.0) as u64;
            count as u64 * each
        })
        .sum();
    QuotaSpec {
        cpu: Some((millis / 2000 / 2 * 2).max(2)),
        nodes: None,
    }
}

/// The scenario, handing back the cluster and the controller (`--serve` keeps them).
pub async fn run_kept(args: &SimulateArgs) -> Result<(QuotaReport, Kept), Error> {
    let sim = super::start_sim(args).await?;
    super::announce(&sim, args, "capacityquotas,pods,nodeclaims,nodes");
    pods::seed_machine_deployments(&sim, args).await?;
    pods::seed_nodepool(&sim, |_| {}).await?;
    let spec = limits(args);
    say!(
        "CapacityQuota {QUOTA} on the NodePool's nodes: cpu {:?}, nodes {:?}",
        spec.cpu,
        spec.nodes
    );
    put_quota(&sim, spec).await?;
    let sampler = Sampler::start(sim.cluster().clone());
    // Pods the quota holds stay pending: `provision_on` gives up on them once nothing has
    // changed for a while, which is the held state this scenario reports.
    let p = pods::provision_on(sim, args, |_, _| {}, |s| s.capacity_quotas = true).await?;
    let mut quota = held(&p.sim, spec).await?;
    (quota.max_provisioned_cpu, quota.max_provisioned_nodes) = sampler.stop();
    p.sim.mark("quota held");
    let removed = Instant::now();
    delete_quota(&p.sim).await?;
    p.sim.mark("quota deleted");
    pods::settle(&p.sim, args.deadline, Duration::from_secs(15), true).await?;
    quota.removal_to_all_bound_ms = removed.elapsed().as_millis() as u64;
    p.sim.mark("pods bound");
    let mut report = p.measure();
    report.launch.scenario = "quota".into();
    quota.pods_bound_after_removal = report.pods.bound;
    report.launch.problems.extend(problems(&quota, &report));
    report.launch.invariants_ok = report.launch.problems.is_empty();
    Ok((
        QuotaReport {
            pods: report,
            quota,
        },
        p.kept(),
    ))
}

/// What breaks the scenario's invariants: capacity over a limit at any sample, pods pending
/// while not told it is the quota, pods still unbound once the quota is gone.
fn problems(q: &QuotaSection, report: &PodReport) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(limit) = q.limit_cpu.filter(|l| q.max_provisioned_cpu > *l as f64) {
        out.push(format!(
            "the NodePool's nodes had {} CPUs at one sample, over the quota's {limit}",
            q.max_provisioned_cpu
        ));
    }
    if let Some(limit) = q
        .limit_nodes
        .filter(|l| q.max_provisioned_nodes as u64 > *l)
    {
        out.push(format!(
            "the NodePool had {} nodes at one sample, over the quota's {limit}",
            q.max_provisioned_nodes
        ));
    }
    if q.pods_held_by_quota < q.pods_pending {
        out.push(format!(
            "{} pending pods not told that the quota holds them",
            q.pods_pending - q.pods_held_by_quota
        ));
    }
    if report.pods.unschedulable > 0 {
        out.push(format!(
            "{} pods still unbound after the quota was deleted",
            report.pods.unschedulable
        ));
    }
    out
}

/// Creates the quota on the NodePool's nodes.
async fn put_quota(sim: &BackgroundSim, spec: QuotaSpec) -> Result<(), Error> {
    let mut resources = serde_json::Map::new();
    if let Some(cpu) = spec.cpu {
        resources.insert("cpu".into(), json!(cpu.to_string()));
    }
    if let Some(nodes) = spec.nodes {
        resources.insert("nodes".into(), json!(nodes.to_string()));
    }
    let body = json!({
        "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityQuota",
        "metadata": {"name": QUOTA},
        "spec": {
            "selector": {"matchLabels": {crate::api::wellknown::NODEPOOL_LABEL: super::launch::NODEPOOL}},
            "limits": {"resources": resources},
        },
    });
    let quota: CapacityQuota =
        serde_json::from_value(body).map_err(|e| Error::Usage(e.to_string()))?;
    on_quotas(sim, "creating", move |api| async move {
        api.create(&Default::default(), &quota).await.map(|_| ())
    })
    .await
}

async fn delete_quota(sim: &BackgroundSim) -> Result<(), Error> {
    on_quotas(sim, "deleting", |api| async move {
        api.delete(QUOTA, &Default::default()).await.map(|_| ())
    })
    .await
}

/// Runs `call` on the CapacityQuota API on the cluster's runtime; an error says it was `doing`
/// the quota.
async fn on_quotas<F, Fut>(sim: &BackgroundSim, doing: &str, call: F) -> Result<(), Error>
where
    F: FnOnce(kube::Api<CapacityQuota>) -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>> + Send + 'static,
{
    sim.run(move |c| call(kube::Api::all(c.client())))
        .await?
        .map_err(|source| Error::Kube {
            what: format!("{doing} CapacityQuota {QUOTA}"),
            source,
        })
}

/// The held state: the capacity provisioned, the quota's status once it counts that capacity
/// (written every 2 s; waited for up to 20 s), and the pending pods told the quota holds them.
async fn held(sim: &BackgroundSim, spec: QuotaSpec) -> Result<QuotaSection, Error> {
    let (provisioned_cpu, provisioned_nodes) = provisioned(sim.cluster());
    let mut status = quota_status(sim).await?;
    let start = Instant::now();
    while !counts(&status.0, provisioned_cpu) && start.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        status = quota_status(sim).await?;
    }
    let pending: BTreeSet<String> = sim
        .cluster()
        .store()
        .list("pods", None)
        .iter()
        .filter(|p| p.pointer("/spec/nodeName").is_none_or(Value::is_null))
        .filter_map(|p| p.pointer("/metadata/name").and_then(Value::as_str))
        .map(String::from)
        .collect();
    let (held, held_message) = told_held(sim, &pending).await?;
    Ok(QuotaSection {
        name: QUOTA.into(),
        limit_cpu: spec.cpu,
        limit_nodes: spec.nodes,
        provisioned_cpu,
        provisioned_nodes,
        status_used: status.0,
        reconciled: status.1,
        pods_pending: pending.len(),
        pods_held_by_quota: held,
        held_message,
        ..Default::default()
    })
}

/// Whether the status's `cpu` is `cpu`.
fn counts(used: &BTreeMap<String, String>, cpu: f64) -> bool {
    used.get("cpu")
        .and_then(|q| q.parse::<Quantity>().ok())
        .is_some_and(|q| (q.as_f64() - cpu).abs() < 1e-9)
}

/// The quota's `status.used.resources` and its `Reconciled` condition's status, through the API.
async fn quota_status(
    sim: &BackgroundSim,
) -> Result<(BTreeMap<String, String>, Option<String>), Error> {
    let q = sim
        .run(move |c| async move {
            let api: kube::Api<kube::core::DynamicObject> = kube::Api::all_with(
                c.client(),
                &kube::core::ApiResource::erase::<CapacityQuota>(&()),
            );
            api.get_opt(QUOTA).await
        })
        .await?
        .map_err(|source| Error::Kube {
            what: format!("reading CapacityQuota {QUOTA}"),
            source,
        })?;
    let v = q
        .and_then(|q| serde_json::to_value(q).ok())
        .unwrap_or(Value::Null);
    let used = v
        .pointer("/status/used/resources")
        .and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter_map(|(k, q)| q.as_str().map(|q| (k.clone(), q.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let reconciled = v
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Reconciled"))
        .and_then(|c| c["status"].as_str())
        .map(String::from);
    Ok((used, reconciled))
}

/// How many of the `pending` pods a `FailedScheduling` Event names the quota for, and one note.
async fn told_held(
    sim: &BackgroundSim,
    pending: &BTreeSet<String>,
) -> Result<(usize, Option<String>), Error> {
    let says = format!("CapacityQuota \"{QUOTA}\"");
    let events = super::events::with_reason(sim, "FailedScheduling").await?;
    let about_quota: Vec<&Value> = events
        .iter()
        .filter(|e| e["note"].as_str().is_some_and(|n| n.contains(&says)))
        .collect();
    let held: BTreeSet<&str> = about_quota
        .iter()
        .filter_map(|e| e["regarding"]["name"].as_str())
        .filter(|n| pending.contains(*n))
        .collect();
    let note = about_quota
        .first()
        .and_then(|e| e["note"].as_str())
        .map(String::from);
    Ok((held.len(), note))
}

/// The launched claims of the NodePool in the store: their CPUs (`status.capacity`) and how
/// many there are.
fn provisioned(cluster: &crate::sim::cluster::SimCluster) -> (f64, usize) {
    let mut cpu = 0.0;
    let mut n = 0;
    cluster.store().visit("nodeclaims", |c| {
        if let Some(q) = c
            .pointer("/status/capacity/cpu")
            .and_then(Value::as_str)
            .and_then(|q| q.parse::<Quantity>().ok())
        {
            cpu += q.as_f64();
            n += 1;
        }
    });
    (cpu, n)
}

/// Samples `provisioned` every 250 ms until stopped; `stop` gives the most of each.
struct Sampler {
    cluster: Arc<crate::sim::cluster::SimCluster>,
    most: Arc<parking_lot::Mutex<(f64, usize)>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(cluster: Arc<crate::sim::cluster::SimCluster>) -> Self {
        let most = Arc::new(parking_lot::Mutex::new((0.0_f64, 0_usize)));
        let (seen, sampled) = (most.clone(), cluster.clone());
        let task = tokio::spawn(async move {
            loop {
                let (cpu, n) = provisioned(&sampled);
                {
                    let mut m = seen.lock();
                    *m = (m.0.max(cpu), m.1.max(n));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Self {
            cluster,
            most,
            task,
        }
    }

    /// The most seen, one last sample taken now.
    fn stop(self) -> (f64, usize) {
        self.task.abort();
        let (cpu, n) = provisioned(&self.cluster);
        let m = *self.most.lock();
        (m.0.max(cpu), m.1.max(n))
    }
}
