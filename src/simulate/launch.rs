//! The launch scenario: NodeClaims created directly, shaped as Karpenter's provisioner writes
//! them, spread over MachineDeployments; the report says how many launched, how many Machines
//! were created and bound, how many writes it took, and how long each step took.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::{Value, json};

use super::invariants::{SCALABLE_RESOURCES, scalable_of};
use super::observer::Observer;
use super::report::Report;
use super::{BackgroundSim, Error, Kept, sim_settings, start_controller};
use crate::api::nodeclaim::{
    NodeClaim, NodeClaimSpec, NodeClassReference, NodeSelectorRequirementWithMinValues, Operator,
    ResourceRequirements,
};
use crate::api::nodeclass::{ClusterAPINodeClass, ClusterAPINodeClassSpec};
use crate::api::nodepool::NodePool;
use crate::api::wellknown::*;
use crate::cli::SimulateArgs;
use crate::metrics::Metrics;
use crate::sim::cluster::{MachineDeploymentSeed, SimCluster};

mod measure;
pub use measure::measure;

pub const NAMESPACE: &str = "default";
pub const NODEPOOL: &str = "default";
pub const NODECLASS: &str = "default";

/// The instance type served by MachineDeployment `i`.
pub fn instance_type(i: usize) -> String {
    format!("sim-{i}")
}

/// MachineDeployment `i`: 4 CPUs / 16Gi, zone `sim-zone-{i % 3}`, price rising with `i`.
pub fn seed_of(i: usize, max_size: usize) -> MachineDeploymentSeed {
    let labels = format!(
        "{INSTANCE_TYPE_LABEL}={},{ZONE_LABEL}=sim-zone-{},{ARCH_LABEL}=amd64,{OS_LABEL}=linux,{CAPACITY_TYPE_LABEL}=on-demand",
        instance_type(i),
        i % 3
    );
    MachineDeploymentSeed {
        name: format!("md-{i}"),
        namespace: NAMESPACE.into(),
        replicas: 0,
        labels: BTreeMap::from([(MEMBER_LABEL.to_string(), String::new())]),
        template_labels: BTreeMap::from([(
            "node.cluster.x-k8s.io/pool".to_string(),
            format!("md-{i}"),
        )]),
        annotations: BTreeMap::from([
            (CPU_ANNOTATION.to_string(), "4".to_string()),
            (MEMORY_ANNOTATION.to_string(), "16Gi".to_string()),
            (MAX_PODS_ANNOTATION.to_string(), "110".to_string()),
            (LABELS_ANNOTATION.to_string(), labels),
            (
                PRICE_ANNOTATION.to_string(),
                format!("{:.2}", 0.2 + 0.01 * i as f64),
            ),
            (MIN_SIZE_ANNOTATION.to_string(), "0".to_string()),
            (MAX_SIZE_ANNOTATION.to_string(), max_size.to_string()),
        ]),
        ..Default::default()
    }
}

/// A NodeClass selecting every member MachineDeployment, and a NodePool using it (with
/// consolidation off).
pub async fn seed_nodeclass_and_pool(client: kube::Client) -> Result<NodePool, Error> {
    seed_labelled(client, BTreeMap::new()).await
}

/// [`seed_nodeclass_and_pool`] on the cluster that holds Karpenter's objects, bound to the
/// simulated Cluster there when that is the management cluster.
pub async fn seed_karpenter_objects(c: &SimCluster) -> Result<NodePool, Error> {
    seed_labelled(c.karpenter_client(), c.karpenter_labels()).await
}

/// The NodeClass and NodePool, both carrying `labels`.
async fn seed_labelled(
    client: kube::Client,
    labels: BTreeMap<String, String>,
) -> Result<NodePool, Error> {
    let kube = |what: &str| {
        let what = what.to_string();
        move |source| Error::Kube { what, source }
    };
    let ncs: Api<ClusterAPINodeClass> = Api::all(client.clone());
    let mut nc = ClusterAPINodeClass::new(NODECLASS, ClusterAPINodeClassSpec::default());
    nc.metadata.labels = Some(labels.clone());
    ncs.create(&PostParams::default(), &nc)
        .await
        .map_err(kube("creating the ClusterAPINodeClass"))?;
    let pools: Api<NodePool> = Api::all(client);
    let np: NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": NODEPOOL, "labels": labels},
        "spec": {
            "template": {"spec": {
                "requirements": [{"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]}],
                "nodeClassRef": {"group": NODECLASS_GROUP, "kind": NODECLASS_KIND, "name": NODECLASS}
            }},
            // The launch, pods and drain scenarios measure provisioning and termination: no
            // consolidation moves their nodes (the disruption scenarios set their own policy).
            "disruption": {"consolidateAfter": "Never"}
        }
    }))
    .map_err(|e| Error::Client(format!("building the NodePool: {e}")))?;
    pools
        .create(&PostParams::default(), &np)
        .await
        .map_err(kube("creating the NodePool"))
}

/// A NodeClaim as Karpenter's provisioner writes it, for one instance type.
pub fn claim_for(pool: &NodePool, instance_type: &str) -> NodeClaim {
    let req = |key: &str, values: &[&str]| {
        NodeSelectorRequirementWithMinValues::new(key, Operator::In, values)
    };
    let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "karpenter.sh/v1".into(),
        kind: "NodePool".into(),
        name: pool.name_any(),
        uid: pool.metadata.uid.clone().unwrap_or_default(),
        block_owner_deletion: Some(true),
        controller: None,
    };
    NodeClaim {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", pool.name_any())),
            labels: Some(BTreeMap::from([(
                NODEPOOL_LABEL.to_string(),
                pool.name_any(),
            )])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: NodeClaimSpec {
            requirements: vec![
                req(NODEPOOL_LABEL, &[&pool.name_any()]),
                req(INSTANCE_TYPE_LABEL, &[instance_type]),
                req(CAPACITY_TYPE_LABEL, &[CAPACITY_TYPE_ON_DEMAND]),
            ],
            resources: Some(ResourceRequirements {
                requests: Some(crate::api::nodeclaim::ResourceList::from([
                    (
                        "cpu".to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
                    ),
                    (
                        "memory".to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()),
                    ),
                    (
                        "pods".to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
                    ),
                ])),
            }),
            node_class_ref: NodeClassReference {
                group: NODECLASS_GROUP.into(),
                kind: NODECLASS_KIND.into(),
                name: NODECLASS.into(),
            },
            ..Default::default()
        },
        status: None,
    }
}

/// Create `n` claims spread round-robin over `mds` instance types, 32 at a time.
pub async fn create_claims(
    client: kube::Client,
    pool: &NodePool,
    n: usize,
    mds: usize,
) -> Result<Vec<String>, Error> {
    create_labelled_claims(client, pool, n, mds, &BTreeMap::new()).await
}

/// [`create_claims`] on the cluster that holds Karpenter's objects, bound to the simulated
/// Cluster there when that is the management cluster.
pub async fn create_claims_in(
    c: &SimCluster,
    pool: &NodePool,
    n: usize,
    mds: usize,
) -> Result<Vec<String>, Error> {
    create_labelled_claims(c.karpenter_client(), pool, n, mds, &c.karpenter_labels()).await
}

/// [`create_claims`], each claim carrying `labels` too.
async fn create_labelled_claims(
    client: kube::Client,
    pool: &NodePool,
    n: usize,
    mds: usize,
    labels: &BTreeMap<String, String>,
) -> Result<Vec<String>, Error> {
    let api: Api<NodeClaim> = Api::all(client);
    let mds = mds.max(1);
    let results: Vec<Result<NodeClaim, kube::Error>> = stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let mut claim = claim_for(pool, &instance_type(i % mds));
            let own = claim.metadata.labels.get_or_insert_default();
            own.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            async move { api.create(&PostParams::default(), &claim).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results
        .into_iter()
        .map(|r| {
            r.map(|c| c.name_any()).map_err(|source| Error::Kube {
                what: "creating a NodeClaim".into(),
                source,
            })
        })
        .collect()
}

/// True once nothing is in flight: every claim initialized or gone, no Machine deleting, and every
/// managed MachineDeployment's replicas equal to its Machines. Reads the store in place (no
/// copies) and stops at the first thing in flight, so a look during a burst costs little.
pub fn quiet(cluster: &SimCluster) -> bool {
    let mut calm = true;
    (cluster.karpenter_store()).visit("nodeclaims", |c| calm = calm && claim_settled(c));
    if !calm {
        return false;
    }
    // Cluster API's objects, in the management cluster when it is apart (this cluster's
    // namespace of it when a fleet shares it).
    let store = cluster.capi_store();
    let mine = |obj: &Value| in_scope(cluster, obj);
    let mut machines_of: BTreeMap<(&str, String), i64> = BTreeMap::new();
    store.visit("machines", |m| {
        if !mine(m) {
            return;
        }
        calm = calm && !is_deleting(m);
        if let Some((resource, md)) = scalable_of(m) {
            *machines_of.entry((resource, md.to_string())).or_default() += 1;
        }
    });
    for (resource, _) in SCALABLE_RESOURCES {
        store.visit(resource, |md| {
            if !mine(md) {
                return;
            }
            let name = md["metadata"]["name"].as_str().unwrap_or_default();
            let replicas = md["spec"]["replicas"].as_i64().unwrap_or(0);
            let live = machines_of.get(&(resource, name.to_string())).copied();
            // A pool without MachinePool Machines counts its listed instances instead.
            let live = match live {
                None if resource == "machinepools" => md["spec"]["providerIDList"]
                    .as_array()
                    .map_or(0, |a| a.len() as i64),
                live => live.unwrap_or(0),
            };
            calm = calm && replicas == live;
        });
    }
    calm
}

/// Whether a Cluster API object is `cluster`'s: always, unless the management cluster is shared
/// by a fleet and the object is in another cluster's namespace.
fn in_scope(cluster: &SimCluster, obj: &Value) -> bool {
    cluster
        .capi_namespace()
        .is_none_or(|ns| obj["metadata"]["namespace"].as_str() == Some(ns))
}

fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// A claim is settled once Initialized and not being deleted.
fn claim_settled(c: &Value) -> bool {
    !is_deleting(c) && has_condition(c, "Initialized")
}

fn has_condition(obj: &Value, ty: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|x| x["type"] == ty && x["status"] == "True"))
}

/// What is still in flight, in words (empty when quiet).
/// Why a launched claim is not initialized yet, as far as the API shows: the controller's
/// Initialized condition, and its Node's Ready condition and taints.
fn node_state(store: &crate::sim::Store, claim: &Value) -> String {
    let initialized = claim
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Initialized"))
        .map(|c| format!("{} {} {}", c["status"], c["reason"], c["message"]))
        .unwrap_or_else(|| "no Initialized condition".into());
    let node = claim
        .pointer("/status/nodeName")
        .and_then(Value::as_str)
        .and_then(|n| store.get("nodes", "", n));
    let Some(node) = node else {
        return format!("Initialized: {initialized}; no Node");
    };
    let ready = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .map(|c| format!("{} {}", c["status"], c["reason"]))
        .unwrap_or_else(|| "none".into());
    format!(
        "Initialized: {initialized}; Node {} Ready {ready}, taints {}",
        node["metadata"]["name"], node["spec"]["taints"]
    )
}

pub fn unsettled(cluster: &SimCluster) -> Vec<String> {
    let (store, capi) = (cluster.store(), cluster.capi_store());
    let mut why = Vec::new();
    for c in cluster.karpenter_store().list("nodeclaims", None) {
        if c.pointer("/metadata/deletionTimestamp")
            .is_some_and(|v| !v.is_null())
        {
            // A claim being deleted is in flight until it is gone (draining, releasing).
            why.push(format!(
                "NodeClaim {} terminating (finalizers {})",
                c["metadata"]["name"], c["metadata"]["finalizers"]
            ));
            continue;
        }
        if !has_condition(&c, "Initialized") {
            let machine = c["metadata"]["annotations"][MACHINE_ANNOTATION]
                .as_str()
                .and_then(|k| k.split_once('/'));
            let machine_state = match machine.and_then(|(ns, n)| capi.get("machines", ns, n)) {
                None => "absent".to_string(),
                Some(m) => format!(
                    "present, annotations {}, providerID {}, deleting {}",
                    m["metadata"]["annotations"],
                    m["spec"]["providerID"],
                    m.pointer("/metadata/deletionTimestamp")
                        .is_some_and(|v| !v.is_null())
                ),
            };
            why.push(format!(
                "NodeClaim {} not initialized (deleting: {}, finalizers {}, machine {}: {machine_state}; {})",
                c["metadata"]["name"],
                c.pointer("/metadata/deletionTimestamp").is_some_and(|v| !v.is_null()),
                c["metadata"]["finalizers"],
                c["metadata"]["annotations"][MACHINE_ANNOTATION],
                node_state(store, &c)
            ));
        }
    }
    let scope = cluster.capi_namespace();
    let machines = capi.list("machines", scope);
    for m in machines.iter().filter(|m| {
        m.pointer("/metadata/deletionTimestamp")
            .is_some_and(|v| !v.is_null())
    }) {
        why.push(format!("Machine {} deleting", m["metadata"]["name"]));
    }
    for (resource, kind) in SCALABLE_RESOURCES {
        for md in capi.list(resource, scope) {
            let name = md
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let replicas = md
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let live = machines
                .iter()
                .filter(|m| scalable_of(m) == Some((resource, name)))
                .count() as i64;
            if replicas != live && !(resource == "machinepools" && live == 0) {
                why.push(format!(
                    "{kind} {name}: spec.replicas {replicas}, {live} Machines, managed {}",
                    md["metadata"]["annotations"][MANAGED_REPLICAS_ANNOTATION]
                ));
            }
        }
    }
    why
}

/// How long the cluster must have been quiet, with no write that broke it, to count as settled:
/// the next step of a claim or a Machine in flight comes well within it.
const QUIET_FOR: Duration = Duration::from_millis(400);
/// After a write wakes a waiter, how long it lets further writes gather before it looks again,
/// so a burst of writes costs one look, not one per write.
const GATHER: Duration = Duration::from_millis(100);
/// How often a waiter looks even without writes (progress lines, conditions on time).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Wait until `quiet` holds, woken by the store's writes rather than by polling.
pub async fn settle(sim: &BackgroundSim, deadline: Duration) -> Result<(), Error> {
    settle_with_progress(sim, deadline, false).await
}

/// `settle`, printing one progress line a second on stderr when asked.
pub async fn settle_with_progress(
    sim: &BackgroundSim,
    deadline: Duration,
    progress: bool,
) -> Result<(), Error> {
    let printer = &super::progress::Progress::new();
    let settled = wait_until(sim, deadline, move || async move {
        // Checked on the cluster's runtime, so the CPU meter counts the look as the
        // simulator's and not the controller's (whose System thread this loop runs on).
        let now_quiet = sim.run(|c| async move { quiet(&c) }).await?;
        if progress && printer.due() {
            let line = sim.run(|c| async move { progress_line(&c) }).await?;
            printer.print(&line);
        }
        Ok(now_quiet)
    })
    .await?;
    if settled {
        return Ok(());
    }
    Err(Error::NotSettled {
        after: deadline,
        why: unsettled(sim.cluster()).join("; "),
    })
}

/// Waits until `look` has said done for [`QUIET_FOR`] with no write in between that made it
/// say otherwise; false when `deadline` passes first. Woken by the store's change signal, not by
/// polling: `look` runs at the start, after writes (gathered for [`GATHER`]) and otherwise every
/// [`LOOK_EVERY`], so an idle cluster costs nothing and a busy one a few looks a second.
pub async fn wait_until<Fut>(
    sim: &BackgroundSim,
    deadline: Duration,
    mut look: impl FnMut() -> Fut,
) -> Result<bool, Error>
where
    Fut: Future<Output = Result<bool, Error>>,
{
    let start = Instant::now();
    let mut changes = sim.cluster().store().changes();
    let mut done_since: Option<Instant> = None;
    loop {
        // Marked before looking, so a write during the look wakes the next wait.
        changes.mark_unchanged();
        if look().await? {
            let since = *done_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= QUIET_FOR {
                return Ok(true);
            }
        } else {
            done_since = None;
        }
        let left = deadline.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Ok(false);
        }
        let wait = match done_since {
            Some(since) => QUIET_FOR.saturating_sub(since.elapsed()),
            None => LOOK_EVERY,
        }
        .min(left);
        match tokio::time::timeout(wait, changes.changed()).await {
            Ok(Ok(())) => tokio::time::sleep(GATHER).await,
            // The store is gone (cannot happen while `sim` lives): fall back to the clock.
            Ok(Err(_)) => tokio::time::sleep(wait).await,
            // Done, and nothing written since it was seen: settled.
            Err(_) if done_since.is_some() => return Ok(true),
            Err(_) => {}
        }
    }
}

/// One line of what the simulated cluster holds right now.
pub fn progress_line(cluster: &SimCluster) -> String {
    let store = cluster.store();
    let (mut claims, mut launched, mut initialized) = (0, 0, 0);
    cluster.karpenter_store().visit("nodeclaims", |c| {
        claims += 1;
        launched += usize::from(has_condition(c, "Launched"));
        initialized += usize::from(has_condition(c, "Initialized"));
    });
    let count = |resource: &str| {
        let mut n = 0;
        store.visit(resource, |_| n += 1);
        n
    };
    let mut machines = 0;
    cluster.capi_store().visit("machines", |m| {
        machines += usize::from(in_scope(cluster, m))
    });
    let nodes = count("nodes");
    let mut pending = 0;
    store.visit("pods", |p| {
        pending += usize::from(p.pointer("/spec/nodeName").is_none_or(Value::is_null));
    });
    format!(
        "claims {claims} (launched {launched}, initialized {initialized}), machines {machines}, nodes {nodes}, pending pods {pending}"
    )
}

/// `simulate --scenario launch`.
pub async fn run(args: &SimulateArgs) -> Result<Report, Error> {
    run_kept(args).await.map(|(report, _)| report)
}

/// The scenario's MachineDeployments (`--machine-deployments` of [`seed_of`]), ClusterAPINodeClass
/// and NodePool; returns the NodePool its claims belong to.
pub async fn seed(sim: &BackgroundSim, args: &SimulateArgs) -> Result<NodePool, Error> {
    let mds = args.machine_deployments.max(1);
    let max_size = args.claims.max(1);
    let scalable = args.scalable;
    sim.run(move |c| async move {
        for i in 0..mds {
            super::node_groups::create(&c, scalable, i, seed_of(i, max_size)).await?;
        }
        seed_karpenter_objects(&c).await
    })
    .await?
}

/// `n` NodeClaims of `pool`, spread over `mds` MachineDeployments, created on the cluster's runtime.
pub async fn create_claims_on(
    sim: &BackgroundSim,
    pool: NodePool,
    n: usize,
    mds: usize,
) -> Result<(), Error> {
    let pool = Arc::new(pool);
    sim.run(move |c| async move { create_claims_in(&c, &pool, n, mds).await })
        .await?
        .map(|_| ())
}

/// `run`, handing back the cluster and the controller (`simulate --serve` keeps them running).
pub async fn run_kept(args: &SimulateArgs) -> Result<(Report, Kept), Error> {
    let sim = super::start_sim(args).await?;
    super::announce(&sim, args, "nodeclaims,nodes");
    let pool = seed(&sim, args).await?;
    let mds = args.machine_deployments.max(1);
    let observer = Observer::default();
    {
        let o = observer.clone();
        sim.spawn(move |c| o.run(c.karpenter_client(), c.stats()));
    }
    let create_timeout = args.create_timeout;
    let controller = start_controller(&sim, sim_settings(create_timeout), Metrics::new()).await?;
    let since = sim.cluster().stats().now_ms();
    let n = args.claims;
    say!(
        "creating {n} NodeClaims over {}",
        super::node_groups::named(args.scalable, mds)
    );
    create_claims_on(&sim, pool, n, mds).await?;
    sim.mark("claims created");
    say!("waiting for the cluster to settle");
    settle_with_progress(&sim, args.deadline, true).await?;
    sim.mark("settled");
    let report = measure(
        &sim,
        &observer,
        n,
        since,
        "launch",
        &controller.shared.metrics,
    );
    Ok((report, Kept::new(sim, Some(controller))))
}
