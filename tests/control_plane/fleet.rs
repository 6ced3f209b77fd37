//! Fleet mode (`run --fleet`) on the real control plane: kube-apiserver is the management
//! cluster (the Clusters, their kubeconfig Secrets, the Leases, the MachineDeployments and
//! Machines), the chart's `topology=fleet` RBAC is the only thing the replicas hold there, and
//! each Cluster's workload cluster is a simulated API server of its own (a real one per Cluster
//! would be six more kube-apiservers and etcds). Cluster API is the project's stand-in, one per
//! Cluster scoped to its namespace, as each Cluster's provider would act: Cluster API's real
//! manager would connect to every workload cluster and needs a control plane provider for each.
//!
//! Three replicas run as `karpenter-capi run` processes with the chart's environment; one is
//! killed (SIGKILL: no Lease released) or stopped (SIGTERM: its Leases released) in the middle of
//! a burst of NodeClaims in every Cluster. The survivors take its Clusters, every claim launches,
//! and no Machine is left without its claim nor bound to two. The audit log then holds every
//! request the replicas made: none refused, and every permission of the fleet topology used or
//! explained in [`NOT_REACHED`].

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::{NODECLAIM_ANNOTATION, NODEPOOL_LABEL};
use karpenter_capi::app::fleet::lease_name;
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::controlplane::ControlPlane;
use karpenter_capi::controlplane::rbac::ServiceAccountAccess;
use karpenter_capi::sim::cluster::CLUSTER_NAME;
use karpenter_capi::sim::standin::{Clusters, ShutdownTrigger, shutdown_pair};
use karpenter_capi::sim::{SimConfig, SimServer};
use karpenter_capi::simulate::launch::{claim_for, instance_type};
use karpenter_capi::view::binding::Binding;

use crate::assets::{self, Asset};
use crate::rbac::setup::{
    ControllerProcess, binding_labels, chart_environment, create_cluster, install_chart,
    install_crds, not_reached, seed_machine_deployment, seed_pool, spawn_standins, start_audited,
};
use crate::rbac::{NAMESPACE, Topology, Unreached, assert_granted_is_used, nothing_refused};

pub fn tests() -> Vec<assets::Test> {
    trials![
        @actix a_killed_replicas_clusters_move_with_no_claim_leaked_or_bound_twice
            needs [ControlPlane, Helm, Kubectl, Upstream, ClusterApi],
        @actix a_stopped_replica_releases_its_leases_and_its_clusters_move
            needs [ControlPlane, Helm, Kubectl, Upstream, ClusterApi],
        @actix karpenters_objects_in_the_management_cluster_move_with_a_killed_replicas_clusters
            needs [ControlPlane, Helm, Kubectl, Upstream, ClusterApi],
    ]
}

/// The chart's fleet topology with its default values (ClusterRoles: the Clusters are in many
/// namespaces).
const FLEET: Topology = Topology {
    helm_args: &["--set", "topology=fleet"],
    machines: "",
    scoped: false,
    karpenter_objects: false,
};

/// The fleet topology with Karpenter's objects beside the Machines (`karpenterObjects=management`):
/// each Cluster's NodeClass, NodePool and NodeClaims on kube-apiserver, bound to it by its
/// labels, under the chart's `<release>-karpenter-objects` ClusterRole.
const FLEET_OBJECTS: Topology = Topology {
    karpenter_objects: true,
    ..FLEET
};

/// Clusters in the management cluster, `fleet-<i>/sim`: two for each replica.
const CLUSTERS: usize = 6;
const REPLICAS: usize = 3;
/// NodeClaims made in every Cluster before the stop, and after it.
const BEFORE: usize = 4;
const AFTER: usize = 2;

/// How long the survivors may take to hold a stopped replica's Clusters: not the Leases' 15 s
/// alone, since the survivors hold their fair share until its membership Lease lapses (20 s
/// unrenewed, recounted every 5 s), and a campaign started then waits a full Lease duration
/// from its first read of a killed holder's Lease; the rest is margin for a loaded two-core
/// machine (docs/benchmarks.md has the times seen).
const TAKEOVER: Duration = Duration::from_secs(90);
/// Guards hangs in the setup and the settle.
const DEADLINE: Duration = Duration::from_secs(120);

/// Permissions of the fleet topology this flow does not exercise, each with the path that needs
/// it, beside those of every flow here (`setup::not_reached`).
const NOT_REACHED: &[Unreached] = &[
    (
        "cluster.x-k8s.io",
        "machines",
        "delete",
        "a Machine whose replica cannot be removed because its MachineDeployment is at min-size; \
      nothing is removed here",
    ),
    (
        "cluster.x-k8s.io",
        "machinepools",
        "get",
        "a MachinePool is read back after a replica write; this flow has no MachinePools",
    ),
    (
        "cluster.x-k8s.io",
        "machinepools",
        "patch",
        "a MachinePool's replica write; this flow has no MachinePools",
    ),
];

/// With Karpenter's objects in the management cluster ([`FLEET_OBJECTS`]), the permissions on
/// them this flow does not exercise, beside [`NOT_REACHED`].
const OBJECTS_NOT_REACHED: &[Unreached] = &[
    (
        "karpenter.sh",
        "nodeclaims",
        "create",
        "the provisioner's claims for pending pods; this flow's claims are the test's (the \
      workload clusters have no pods)",
    ),
    (
        "karpenter.sh",
        "nodeclaims",
        "delete",
        "a claim disruption or expiry removes; this flow removes none",
    ),
    (
        "karpenter.sh",
        "nodeclaims",
        "get",
        "a claim re-reads itself after a conflicting write",
    ),
    (
        "karpenter.sh",
        "nodeoverlays/status",
        "patch",
        "a NodeOverlay's conditions; this flow has no NodeOverlays (their watch runs)",
    ),
    (
        "events.k8s.io",
        "events",
        "patch",
        "an Event about Karpenter's objects told again while the recorder still holds it (a \
      series); each of this flow's is told once",
    ),
];

/// How a replica is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// SIGKILL: its Leases are left to expire.
    Kill,
    /// SIGTERM: it releases its Leases as it exits.
    Terminate,
}

async fn a_killed_replicas_clusters_move_with_no_claim_leaked_or_bound_twice() {
    fail_over(Stop::Kill, &FLEET).await;
}

async fn a_stopped_replica_releases_its_leases_and_its_clusters_move() {
    fail_over(Stop::Terminate, &FLEET).await;
}

async fn karpenters_objects_in_the_management_cluster_move_with_a_killed_replicas_clusters() {
    fail_over(Stop::Kill, &FLEET_OBJECTS).await;
}

/// The flow every test runs, with the chart installed as `layout` says: the fleet up and sharing
/// the Clusters, a burst in every Cluster, one replica stopped as `stop` says mid-burst, its
/// Clusters taken by the others, every claim launched once, and the audit log's account of the
/// replicas' requests.
async fn fail_over(stop: Stop, layout: &'static Topology) {
    let mut fleet = Management::start(layout).await;
    fleet.spawn_replicas();
    let holders = fleet.shared_fairly().await;

    fleet.claims(BEFORE).await;
    // The replica holding the most: its loss moves the most Clusters.
    let victim = held_by_pod(&holders)
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(pod, _)| pod.to_string())
        .expect("a held Cluster");
    let theirs: Vec<String> = holders
        .iter()
        .filter(|(_, h)| pod_of(h) == victim)
        .map(|(ns, _)| ns.clone())
        .collect();
    let stopped = Instant::now();
    fleet.stop(&victim, stop);
    if stop == Stop::Terminate {
        fleet.released(&victim, &theirs).await;
    }
    fleet.claims(AFTER).await;
    fleet.taken_over(&victim).await;
    say!(
        "{victim} held {theirs:?}; the survivors held every Cluster {:?} after its {stop:?}",
        stopped.elapsed()
    );
    fleet.settled(BEFORE + AFTER).await;
    fleet.audited();
}

/// Whether a line of a replica's log (JSON, one event a line) is a warning or an error telling
/// of a refused request: a 403 (not digits within a port or a timestamp) or a Forbidden.
fn refusal(line: &str) -> bool {
    let quiet = ["\"level\":\"INFO\"", "\"level\":\"DEBUG\""];
    if quiet.iter().any(|q| line.contains(q)) {
        return false;
    }
    let digit = |i: Option<&u8>| i.is_some_and(u8::is_ascii_digit);
    let bytes = line.as_bytes();
    let code = line.match_indices("403").any(|(i, _)| {
        !digit(i.checked_sub(1).and_then(|j| bytes.get(j))) && !digit(bytes.get(i + 3))
    });
    code || line.to_lowercase().contains("forbidden")
}

/// The pod a Lease holder's identity names (`<pod>_<pid>_<random>`: a restarted pod is another
/// holder).
fn pod_of(holder: &str) -> &str {
    holder.split_once('_').map_or(holder, |(pod, _)| pod)
}

/// How many Clusters each pod holds, of `holders` (Cluster namespace to holder identity).
fn held_by_pod(holders: &BTreeMap<String, String>) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for h in holders.values() {
        *counts.entry(pod_of(h)).or_default() += 1;
    }
    counts
}

/// The management cluster on the real control plane, the workload clusters beside it, the
/// stand-ins and the fleet's replicas.
struct Management {
    /// First, so they are killed (and, when the test fails, their logs shown) before the control
    /// plane and its directory go.
    replicas: Vec<ControllerProcess>,
    /// How the chart is installed.
    layout: &'static Topology,
    cp: ControlPlane,
    admin: Client,
    access: ServiceAccountAccess,
    workloads: Vec<Workload>,
    /// Stops the stand-ins when the test ends.
    standins: ShutdownTrigger,
}

/// One Cluster's workload cluster, a simulated API server, and its NodePool: there, or in the
/// management cluster bound to the Cluster.
struct Workload {
    /// The Cluster's namespace in the management cluster.
    namespace: String,
    server: SimServer,
    pool: NodePool,
    /// Where its NodePool and NodeClaims are.
    karpenter: Client,
    /// The labels that bind its claims to it, in the management cluster.
    labels: BTreeMap<String, String>,
}

impl Drop for Management {
    fn drop(&mut self) {
        self.standins.trigger();
    }
}

impl Management {
    /// The control plane with Cluster API's CRDs (the Cluster's from Cluster API's release), the
    /// chart's fleet RBAC, and the Clusters with their workload clusters and stand-ins.
    async fn start(layout: &'static Topology) -> Self {
        let cp = start_audited().await;
        let admin = cp.client();
        let clusters_crd: PathBuf = Asset::ClusterApi
            .location()
            .join("crds/cluster.x-k8s.io_clusters.yaml");
        install_crds(&cp, &admin, &[clusters_crd]).await;
        let access = install_chart(&cp, layout).await;
        let (standins, shutdown) = shutdown_pair();
        let mut workloads = Vec::new();
        for i in 0..CLUSTERS {
            let workload = Workload::start(&admin, &format!("fleet-{i}"), layout).await;
            let clusters = Clusters {
                management: admin.clone(),
                workload: workload.server.client(),
                scope: Some(workload.namespace.clone()),
            };
            spawn_standins(clusters, shutdown.clone());
            workloads.push(workload);
        }
        say!("{CLUSTERS} Clusters, each with a workload cluster and its stand-ins");
        Management {
            replicas: Vec::new(),
            layout,
            cp,
            admin,
            access,
            workloads,
            standins,
        }
    }

    /// The replicas, each `run` with the chart's environment, Cluster API reached with the
    /// ServiceAccount's kubeconfig (the chart's pods use their projected token in-cluster).
    fn spawn_replicas(&mut self) {
        let env: Vec<(String, String)> = chart_environment(self.layout)
            .into_iter()
            .filter(|(k, _)| k != "CLUSTER_API_IN_CLUSTER")
            .collect();
        let args = [
            OsStr::new("--cluster-api-kubeconfig"),
            self.access.kubeconfig.as_os_str(),
        ];
        self.replicas = (0..REPLICAS)
            .map(|i| ControllerProcess::spawn_as(&self.cp, &format!("fleet-{i}"), &args, &env))
            .collect();
    }

    /// Each Cluster's Lease holder (by Cluster namespace); an unheld one is absent.
    async fn holders(&self) -> BTreeMap<String, String> {
        let leases: Api<Lease> = Api::namespaced(self.admin.clone(), NAMESPACE);
        let mut holders = BTreeMap::new();
        for w in &self.workloads {
            let name = lease_name(&w.namespace, CLUSTER_NAME);
            let holder = leases
                .get_opt(&name)
                .await
                .unwrap_or_else(|e| panic!("reading Lease {name}: {e}"))
                .and_then(|l| l.spec?.holder_identity)
                .filter(|h| !h.is_empty());
            if let Some(h) = holder {
                holders.insert(w.namespace.clone(), h);
            }
        }
        holders
    }

    /// Waits until every Cluster is held and no replica holds more than its fair share and the
    /// margin it may keep (one more, at this size); returns the holders. A replica may hold none:
    /// two that took three each before it joined keep them.
    async fn shared_fairly(&self) -> BTreeMap<String, String> {
        let most = CLUSTERS.div_ceil(REPLICAS) + 1;
        let holders = self
            .until("every Cluster held, within the share", DEADLINE, || async {
                let holders = self.holders().await;
                let fair = held_by_pod(&holders).values().all(|n| *n <= most);
                (holders.len() == CLUSTERS && fair).then_some(holders)
            })
            .await;
        say!("Leases held: {holders:?}");
        holders
    }

    /// `n` NodeClaims for every Cluster at once.
    async fn claims(&self, n: usize) {
        let made = self.workloads.iter().map(|w| w.claims(n));
        futures::future::join_all(made).await;
    }

    /// Stops replica `name` as `stop` says; a terminated one must exit 0 (its grace).
    fn stop(&mut self, name: &str, stop: Stop) {
        let replica = self
            .replicas
            .iter_mut()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no replica {name}"));
        match stop {
            Stop::Kill => replica.kill(),
            Stop::Terminate => replica.terminate(),
        }
    }

    /// None of the Clusters in `namespaces` is held by `victim` once it exited: it released
    /// their Leases (another replica may have taken one since).
    async fn released(&self, victim: &str, namespaces: &[String]) {
        let held = self.holders().await;
        let kept: Vec<&String> = namespaces
            .iter()
            .filter(|ns| held.get(*ns).is_some_and(|h| pod_of(h) == victim))
            .collect();
        assert!(
            kept.is_empty(),
            "{victim} exited holding the Leases of {kept:?}"
        );
    }

    /// Waits (up to [`TAKEOVER`]) until every Cluster is held by a replica other than `victim`.
    async fn taken_over(&self, victim: &str) {
        self.until(
            &format!("every Cluster held by a survivor of {victim}"),
            TAKEOVER,
            || async {
                let holders = self.holders().await;
                let survivors = holders.values().all(|h| pod_of(h) != victim);
                (holders.len() == CLUSTERS && survivors).then_some(())
            },
        )
        .await;
    }

    /// Waits until every Cluster holds `per_cluster` launched claims and nothing is in flight,
    /// then checks that none leaked or was bound twice.
    async fn settled(&self, per_cluster: usize) {
        for w in &self.workloads {
            let what = format!(
                "{}: {per_cluster} claims launched, one Machine each",
                w.namespace
            );
            self.until(&what, DEADLINE, || async {
                let state = w.state(&self.admin).await?;
                state.settled(per_cluster).then_some(())
            })
            .await;
            let state = w.state(&self.admin).await.expect("the cluster's state");
            state.assert_one_to_one(&w.namespace);
        }
    }

    /// The replicas' requests in the audit log: none refused, none logged as forbidden, and every
    /// permission granted used or explained.
    fn audited(&self) {
        for r in &self.replicas {
            let log = r.log();
            let refused: Vec<&str> = log.lines().filter(|l| refusal(l)).collect();
            assert!(refused.is_empty(), "{} was refused: {refused:#?}", r.name);
        }
        let audited = nothing_refused(&self.cp, &self.access);
        let unused: Vec<String> = self
            .access
            .granted()
            .difference(&audited.used)
            .filter(|p| !p.resource.ends_with("machinetemplates"))
            .map(ToString::to_string)
            .collect();
        say!("granted and not used (templates aside): {unused:?}");
        let mut own = NOT_REACHED.to_vec();
        if self.layout.karpenter_objects {
            own.extend(OBJECTS_NOT_REACHED);
        }
        assert_granted_is_used(&self.access, &audited.used, &not_reached(&own));
    }

    /// Polls `check` every 250 ms until it returns `Some`, panicking with `what` after `bound`.
    async fn until<T, F, Fut>(&self, what: &str, bound: Duration, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let start = Instant::now();
        loop {
            if let Some(v) = check().await {
                return v;
            }
            assert!(
                start.elapsed() < bound,
                "timed out after {bound:?} waiting for {what}; Leases: {:?}",
                self.holders().await
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Workload {
    /// Cluster `namespace/sim` in the management cluster, with its MachineDeployment there, and
    /// its workload cluster (a simulated API server) named in its `sim-kubeconfig` Secret and
    /// seeded with the NodeClass and NodePool, or those in the management cluster bound to the
    /// Cluster, as `layout` says.
    async fn start(admin: &Client, namespace: &str, layout: &Topology) -> Self {
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": namespace}})).expect("a Namespace");
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating Namespace {namespace}: {e}"));
        let server = SimServer::start(SimConfig::default())
            .await
            .unwrap_or_else(|e| panic!("the workload cluster of {namespace}: {e}"));
        let kubeconfig = std::fs::read(server.kubeconfig_path())
            .unwrap_or_else(|e| panic!("the workload cluster's kubeconfig: {e}"));
        create_cluster(admin, namespace, CLUSTER_NAME, &kubeconfig).await;
        seed_machine_deployment(admin, namespace, 0).await;
        let binding = layout.karpenter_objects.then(|| Binding {
            cluster: CLUSTER_NAME.into(),
            namespace: namespace.into(),
        });
        let karpenter = match binding {
            Some(_) => admin.clone(),
            None => server.client(),
        };
        // Cluster-scoped: in the management cluster each Cluster's pool needs a name of its own.
        seed_pool(&karpenter, namespace, binding.as_ref()).await;
        let pool = Api::<NodePool>::all(karpenter.clone())
            .get(namespace)
            .await
            .unwrap_or_else(|e| panic!("NodePool {namespace}: {e}"));
        Workload {
            namespace: namespace.to_string(),
            server,
            pool,
            karpenter,
            labels: binding_labels(binding.as_ref()),
        }
    }

    /// `n` NodeClaims of its NodePool, as the provisioner makes them: its NodeClass, and its
    /// binding labels in the management cluster.
    async fn claims(&self, n: usize) {
        let api = Api::<NodeClaim>::all(self.karpenter.clone());
        let mut claim = claim_for(&self.pool, &instance_type(0));
        claim.spec.node_class_ref = self.pool.spec.template.spec.node_class_ref.clone();
        let labels = claim.metadata.labels.get_or_insert_default();
        labels.extend(self.labels.clone());
        // At once, as a burst of the provisioner's.
        let params = PostParams::default();
        let made = (0..n).map(|_| api.create(&params, &claim));
        for made in futures::future::join_all(made).await {
            made.unwrap_or_else(|e| panic!("creating a NodeClaim of {}: {e}", self.namespace));
        }
    }

    /// Its claims, its Nodes (workload cluster) and its Machines and MachineDeployment replicas
    /// (management cluster); None when a read fails.
    async fn state(&self, admin: &Client) -> Option<State> {
        let pool = format!("{NODEPOOL_LABEL}={}", self.pool.name_any());
        let claims = Api::<NodeClaim>::all(self.karpenter.clone())
            .list(&ListParams::default().labels(&pool))
            .await
            .ok()?
            .items;
        let nodes = Api::<Node>::all(self.server.client())
            .list(&Default::default())
            .await
            .ok()?;
        let v = CapiVersion::V1Beta2;
        let machines =
            Api::<DynamicObject>::namespaced_with(admin.clone(), &self.namespace, &v.machine())
                .list(&Default::default())
                .await
                .ok()?
                .items;
        let replicas = Api::<DynamicObject>::namespaced_with(
            admin.clone(),
            &self.namespace,
            &v.machine_deployment(),
        )
        .list(&Default::default())
        .await
        .ok()?
        .items
        .iter()
        .map(|md| md.data["spec"]["replicas"].as_i64().unwrap_or(-1))
        .sum();
        Some(State {
            claims,
            nodes: nodes.items.iter().map(|n| n.name_any()).collect(),
            machines,
            replicas,
        })
    }
}

/// What one Cluster holds at a look.
struct State {
    claims: Vec<NodeClaim>,
    nodes: BTreeSet<String>,
    machines: Vec<DynamicObject>,
    /// The MachineDeployments' `spec.replicas`, summed.
    replicas: i64,
}

impl State {
    /// `n` claims, all Initialized, and as many Machines as claims and replicas (nothing in
    /// flight).
    fn settled(&self, n: usize) -> bool {
        let initialized = self.claims.iter().all(|c| {
            c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Initialized" && c.is_true())
            })
        });
        self.claims.len() == n
            && initialized
            && self.machines.len() == n
            && self.replicas == n as i64
            && self
                .machines
                .iter()
                .all(|m| m.metadata.deletion_timestamp.is_none())
    }

    /// One Machine per claim and one claim per Machine, each claim on a Node of its own.
    fn assert_one_to_one(&self, cluster: &str) {
        let claims: BTreeSet<String> = self.claims.iter().map(|c| c.name_any()).collect();
        let mut bound: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for m in &self.machines {
            let claim = m.annotations().get(NODECLAIM_ANNOTATION).cloned();
            let claim = claim.unwrap_or_else(|| {
                panic!("{cluster}: Machine {} has no claim (leaked)", m.name_any())
            });
            assert!(
                claims.contains(&claim),
                "{cluster}: Machine {} names claim {claim}, which is not there (leaked)",
                m.name_any()
            );
            bound.entry(claim).or_default().push(m.name_any());
        }
        let twice: Vec<_> = bound.iter().filter(|(_, ms)| ms.len() > 1).collect();
        assert!(
            twice.is_empty(),
            "{cluster}: claims bound to two Machines: {twice:?}"
        );
        let without: Vec<&String> = claims.iter().filter(|c| !bound.contains_key(*c)).collect();
        assert!(
            without.is_empty(),
            "{cluster}: claims without a Machine: {without:?}"
        );
        let mut on: BTreeMap<String, String> = BTreeMap::new();
        for c in &self.claims {
            let node = c.status.as_ref().and_then(|s| s.node_name.clone());
            let node =
                node.unwrap_or_else(|| panic!("{cluster}: claim {} has no Node", c.name_any()));
            assert!(
                self.nodes.contains(&node),
                "{cluster}: claim {}'s Node {node} is not there",
                c.name_any()
            );
            if let Some(other) = on.insert(node.clone(), c.name_any()) {
                panic!(
                    "{cluster}: Node {node} is both {other}'s and {}'s",
                    c.name_any()
                );
            }
        }
    }
}
