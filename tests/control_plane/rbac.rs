//! The controller on the real control plane under the Helm chart's RBAC only: the chart rendered
//! with helm and applied with kubectl, the controller started in-process (two replicas with leader
//! election, as the chart deploys it) with nothing but the chart's ServiceAccount token, the
//! project's Cluster API and kubelet stand-ins beside it as the administrator, and the real
//! kube-scheduler binding the pods. kube-apiserver's audit log is the witness: not one of the
//! ServiceAccount's requests may be refused (a missing permission), and every permission the
//! chart grants must be used by the flow or be on [`NOT_REACHED`] with the reason (an unused one).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use karpenter_capi::actors::Settings;
use karpenter_capi::actors::controller::Controller;
use karpenter_capi::api::capacity_buffer::CapacityBuffer;
use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::wellknown::{NODECLAIM_ANNOTATION, NODEPOOL_LABEL};
use karpenter_capi::app::{self, Campaign, ClientOptions, Replica};
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::controlplane::ControlPlane;
use karpenter_capi::controlplane::rbac::{self, Permission, ServiceAccountAccess};
use karpenter_capi::http::Health;
use karpenter_capi::leader;
use karpenter_capi::metrics::Metrics;
use karpenter_capi::scheduling::default_spread::DefaultConstraints;
use karpenter_capi::sim::cluster::CLUSTER_NAME;
use karpenter_capi::view::binding::Binding;
use karpenter_capi::write_gate::WriteGate;

use crate::assets;
use crate::eventually;

#[path = "rbac/setup.rs"]
pub(crate) mod setup;
use setup::{
    ControllerProcess, StandIns, chart_environment, install_chart, install_crds, not_reached, seed,
    start_audited,
};

pub fn tests() -> Vec<assets::Test> {
    trials![
        @actix the_controller_runs_under_the_charts_rbac_only
            needs [ControlPlane, Helm, Kubectl, Upstream],
        @actix the_management_topology_runs_under_the_charts_rbac_only
            needs [ControlPlane, Helm, Kubectl, Upstream],
        @actix karpenters_objects_in_the_management_cluster_run_under_the_charts_rbac_only
            needs [ControlPlane, Helm, Kubectl, Upstream],
        @actix the_controller_binary_runs_with_the_charts_environment_and_token
            needs [ControlPlane, Helm, Kubectl, Upstream],
    ]
}

/// How the chart is installed, and where the Cluster API objects are.
pub(crate) struct Topology {
    /// `helm template`'s arguments beyond the release and namespace.
    pub(crate) helm_args: &'static [&'static str],
    /// The MachineDeployments' namespace.
    pub(crate) machines: &'static str,
    /// Whether the controller reads only that namespace and that Cluster's MachineDeployments
    /// (`CLUSTER_API_NAMESPACE`, `CLUSTER_NAME`), as the chart sets them in the management
    /// topology.
    pub(crate) scoped: bool,
    /// Whether Karpenter's objects live beside the Machines (`karpenterObjects=management`),
    /// bound to the Cluster `sim` of `machines`: the chart grants them in its
    /// `<release>-karpenter-objects` ClusterRole instead of the workload cluster's.
    pub(crate) karpenter_objects: bool,
}

impl Topology {
    /// The Cluster Karpenter's objects are bound to, with `karpenter_objects`.
    pub(crate) fn binding(&self) -> Option<Binding> {
        self.karpenter_objects.then(|| Binding {
            cluster: CLUSTER_NAME.into(),
            namespace: self.machines.into(),
        })
    }
}

/// The chart's default values: the workload topology with Cluster API in the same cluster
/// (joined), every permission in ClusterRoles.
const JOINED: Topology = Topology {
    helm_args: &[],
    machines: "default",
    scoped: false,
    karpenter_objects: false,
};

/// The management topology: the release in its Cluster's namespace, Cluster API reached with a
/// Role in that namespace only. The workload cluster's ClusterRole (which the chart renders for
/// the workload cluster) is bound to the same ServiceAccount, as one control plane plays both
/// clusters.
const MANAGEMENT: Topology = Topology {
    helm_args: &[
        "--set",
        "topology=management",
        "--set",
        // The stand-ins' Cluster (`sim::cluster::CLUSTER_NAME`).
        "clusterAPI.clusterName=sim",
        "--set",
        "workloadCluster.rbac.render=true",
        "--set",
        "workloadCluster.rbac.subject.kind=ServiceAccount",
        "--set",
        "workloadCluster.rbac.subject.name=karpenter-capi",
        "--set",
        "workloadCluster.rbac.subject.namespace=karpenter-capi",
    ],
    machines: NAMESPACE,
    scoped: true,
    karpenter_objects: false,
};

/// The management topology with Karpenter's objects beside the Machines
/// (`karpenterObjects=management`): NodePools, NodeClaims, NodeClasses and NodeOverlays bound to
/// Cluster `sim` of the release namespace, and the workload cluster's ClusterRole without them.
const MANAGEMENT_OBJECTS: Topology = Topology {
    karpenter_objects: true,
    ..MANAGEMENT
};

async fn the_controller_runs_under_the_charts_rbac_only() {
    flow(&JOINED).await;
}

async fn the_management_topology_runs_under_the_charts_rbac_only() {
    flow(&MANAGEMENT).await;
}

async fn karpenters_objects_in_the_management_cluster_run_under_the_charts_rbac_only() {
    flow(&MANAGEMENT_OBJECTS).await;
}

/// The release as the chart's docs install it.
const RELEASE: &str = "karpenter-capi";
pub(crate) const NAMESPACE: &str = "karpenter-capi";
/// The chart's default `leaderElection.name`.
const LEASE: &str = "karpenter-capi-leader-election";
/// Where the workload is.
const WORKLOAD_NS: &str = "default";
const APP: &str = "web";
/// Pods of 1 CPU on 4-CPU nodes: more than one node's worth.
const REPLICAS: i32 = 5;

/// Cluster API's CRDs the flow needs, from the upstream folder.
const UPSTREAM_CRDS: [&str; 5] = [
    "crds/cluster.x-k8s.io_machinedeployments.yaml",
    "crds/cluster.x-k8s.io_machinepools.yaml",
    "crds/cluster.x-k8s.io_machinesets.yaml",
    "crds/cluster.x-k8s.io_machines.yaml",
    "crds/infrastructure.cluster.x-k8s.io_devmachinetemplates.yaml",
];

/// A permission granted and not used: (group, resource, verb, the path that needs it).
pub(crate) type Unreached = (&'static str, &'static str, &'static str, &'static str);

/// Permissions the chart grants that this flow does not exercise: (group, resource, verb, the
/// path that needs it), beside those of every flow here (`setup::not_reached`). A resource
/// `*suffix` stands for every granted resource with that suffix.
/// Anything else granted and unused fails the test: remove it from the chart, the manifests and
/// tests/deploy/deploy.rs's table.
const NOT_REACHED: &[Unreached] = &[
    (
        "cluster.x-k8s.io",
        "clusters",
        "list",
        "Cluster API's pause: Clusters are watched where discovery lists them; this control plane \
      has only the scalable kinds' CRDs (the real Cluster API backend serves them)",
    ),
    (
        "cluster.x-k8s.io",
        "clusters",
        "watch",
        "as list: watched only where served",
    ),
    (
        "",
        "nodes",
        "get",
        "a terminating claim whose Node the Node watch does not show yet: read by name before \
      draining (hardening::a_lagging_node_watch_never_skips_a_drain); this flow's watch keeps up",
    ),
    (
        "",
        "nodes",
        "delete",
        "a Node that outlives its Machine: Cluster API (and its stand-in) deletes the Node before \
      it releases the Machine, so only a provider that leaves one behind gets here",
    ),
    (
        "",
        "pods",
        "delete",
        "pods still on a node when its claim's terminationGracePeriod runs out; this NodePool sets \
      none and its pods leave as soon as they are evicted",
    ),
    (
        "",
        "persistentvolumeclaims",
        "get",
        "the volumes of pods a drain leaves in place, to tell their attachments from the drained \
      ones; these pods have no volumes",
    ),
    (
        "karpenter.sh",
        "nodeclaims",
        "get",
        "a claim re-reads itself after a conflicting write",
    ),
    (
        "cluster.x-k8s.io",
        "machinepools",
        "get",
        "a MachinePool is read back after a replica write; this flow scales MachineDeployments \
      only (the MachinePool CRD is installed, so the watch runs)",
    ),
    (
        "cluster.x-k8s.io",
        "machinepools",
        "patch",
        "a MachinePool's replica write; this flow has no MachinePools",
    ),
    (
        "cluster.x-k8s.io",
        "machines",
        "delete",
        "a Machine whose replica cannot be removed because its MachineDeployment is at min-size; \
      these are at min-size 0",
    ),
    (
        "events.k8s.io",
        "events",
        "patch",
        "an Event told again while the recorder still holds it (a series); each of this flow's \
      events is told once",
    ),
    (
        "",
        "podtemplates",
        "get",
        "a CapacityBuffer's podTemplateRef; this flow's buffer names a Deployment (its watch runs)",
    ),
    (
        "apps",
        "replicasets",
        "get",
        "a CapacityBuffer whose scalableRef is a ReplicaSet; this flow's names a Deployment",
    ),
    (
        "apps",
        "statefulsets",
        "get",
        "a CapacityBuffer whose scalableRef is a StatefulSet; this flow's names a Deployment",
    ),
];

/// Launch, failover, drain and consolidation with the chart installed as `t` says; then the
/// audit log's account of the ServiceAccount's requests.
async fn flow(t: &Topology) {
    let (cp, admin, access, standins) = prepare(t).await;

    let (a, b) = tokio::join!(replica(&access, "a", t), replica(&access, "b", t));
    let (leader, standby) = one_leader(&cp, a, b).await;
    say!("{} leads, {} stands by", leader.name, standby.name);

    launch(&cp, &admin, t).await;
    buffer(&cp, &admin).await;
    quota(&cp, &admin).await;
    let leader = fail_over(&cp, &access, leader, standby).await;
    drain(&cp, &admin, &access).await;
    consolidate(&cp, &admin, t).await;
    leader.replica.shutdown().await;
    standins.stop();
    let audited = nothing_refused(&cp, &access);
    assert_granted_is_used(&access, &audited.used, &not_reached(NOT_REACHED));
}

/// The controller binary as the chart's Deployment runs it: `run` with the container's
/// environment as rendered (the pod's name and namespace filled in as the downward API would,
/// the probe ports made free ones) and the ServiceAccount's token in place of the projected
/// one. It launches nodes for pending pods, and on SIGTERM it exits cleanly and releases the
/// Lease; nothing it asked for is refused.
async fn the_controller_binary_runs_with_the_charts_environment_and_token() {
    let t = &JOINED;
    let (cp, admin, access, standins) = prepare(t).await;
    let env = chart_environment(t);
    let mut controller = ControllerProcess::spawn(&cp, &access, &env);
    launch(&cp, &admin, t).await;
    controller.terminate();
    let lease = Api::<Lease>::namespaced(admin.clone(), NAMESPACE)
        .get(LEASE)
        .await
        .expect("the Lease")
        .spec
        .unwrap_or_default();
    assert_eq!(lease.holder_identity, None, "the Lease released on SIGTERM");
    standins.stop();
    let audited = nothing_refused(&cp, &access);
    let outside: Vec<String> = audited
        .used
        .difference(&access.granted())
        .map(ToString::to_string)
        .collect();
    assert!(
        outside.is_empty(),
        "used beyond the chart's grants: {outside:?}"
    );
}

/// A control plane with the CRDs, the chart's RBAC as `t` installs it, the stand-ins running and
/// the MachineDeployments, NodeClass and NodePool made.
async fn prepare(t: &Topology) -> (ControlPlane, Client, ServiceAccountAccess, StandIns) {
    let cp = start_audited().await;
    let admin = cp.client();
    install_crds(&cp, &admin, &[]).await;
    let access = install_chart(&cp, t).await;
    say!(
        "chart RBAC applied; {} permissions granted to {}",
        access.granted().len(),
        access.username()
    );
    let standins = StandIns::start(&admin);
    seed(&admin, t).await;
    (cp, admin, access, standins)
}

/// The ServiceAccount's requests in the audit log, none of them refused.
pub(crate) fn nothing_refused(cp: &ControlPlane, access: &ServiceAccountAccess) -> rbac::Audited {
    let audited = rbac::audited(cp, &access.username())
        .unwrap_or_else(|e| panic!("reading the audit log: {e}"));
    say!(
        "{} requests by the ServiceAccount audited",
        audited.requests
    );
    assert!(
        audited.forbidden.is_empty(),
        "the API server refused the controller (missing permissions): {:#?}",
        audited.forbidden
    );
    audited
}

/// One controller replica as `run` builds it in a chart's pod: its clients from the
/// ServiceAccount's kubeconfig, a write gate, and a campaign for the chart's Lease in the release
/// namespace.
struct Member {
    name: &'static str,
    replica: Replica,
}

impl Member {
    fn leads(&self) -> bool {
        *self.replica.leading.borrow()
    }
}

fn settings(t: &Topology) -> Settings {
    let mut s = Settings::default();
    if t.scoped {
        s.capi_namespace = Some(t.machines.into());
        s.cluster_name = Some(CLUSTER_NAME.into());
    }
    s.karpenter_objects = t.binding();
    s.batching.idle = Duration::from_millis(300);
    s.batching.max = Duration::from_secs(3);
    s.min_drain_time = Duration::from_secs(1);
    s.disruption.poll = Duration::from_secs(2);
    s.disruption.validation = Duration::from_secs(2);
    // Default topology spread constraints, so the workload watch (Services, ReplicaSets, ...)
    // runs and its permissions are exercised too.
    s.default_constraints = DefaultConstraints::parse(
        "podTopologySpread:
  defaultConstraints:
  - maxSkew: 3
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
",
    )
    .expect("default constraints");
    // CapacityBuffers on, so the buffer actor's watches, reads and status writes run too.
    s.capacity_buffers = true;
    // CapacityQuotas on, so the quota actor's watch and status writes run too.
    s.capacity_quotas = true;
    s
}

/// A replica's User-Agent, which tells the replicas apart in the audit log.
fn agent(name: &str) -> String {
    format!("karpenter-capi-rbac/{name}")
}

async fn replica(access: &ServiceAccountAccess, name: &'static str, t: &Topology) -> Member {
    let gate = WriteGate::default();
    let options = ClientOptions {
        agent: agent(name),
        gate: gate.clone(),
        ..ClientOptions::default()
    };
    let client = app::client_from_kubeconfig_with(&access.kubeconfig, &options)
        .await
        .unwrap_or_else(|e| panic!("replica {name}'s client: {e}"));
    // Short timings, so the standby takes over within seconds of the leader's death.
    let mut election = leader::Config::new(NAMESPACE.into(), LEASE.into(), name.into());
    election.lease_duration = Duration::from_secs(4);
    election.renew_deadline = Duration::from_secs(3);
    election.retry_period = Duration::from_millis(500);
    let controller = Controller {
        workload: client.clone(),
        management: client.clone(),
        capi_version: None,
        settings: settings(t),
        metrics: Metrics::new(),
        instance: name.into(),
    };
    let campaign = Campaign {
        client,
        config: election,
    };
    let replica = app::start_replica(
        controller,
        gate,
        Arc::new(Health::default()),
        Some(campaign),
    )
    .await
    .unwrap_or_else(|e| panic!("replica {name} starts: {e}"));
    Member { name, replica }
}

/// Waits for exactly one leader; returns (leader, standby).
async fn one_leader(cp: &ControlPlane, a: Member, b: Member) -> (Member, Member) {
    eventually(cp, "one replica leading", || {
        std::future::ready((a.leads() ^ b.leads()).then_some(()))
    })
    .await;
    let (leader, standby) = if a.leads() { (a, b) } else { (b, a) };
    assert_holds_lease(cp, &leader).await;
    (leader, standby)
}

/// The chart's Lease names `member` its holder.
async fn assert_holds_lease(cp: &ControlPlane, member: &Member) {
    let leases: Api<Lease> = Api::namespaced(cp.client(), NAMESPACE);
    let holder = leases
        .get(LEASE)
        .await
        .expect("the Lease")
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some(member.name), "the Lease's holder");
}

/// A Deployment of pending pods becomes NodeClaims, raised replicas, Machines and Nodes, and the
/// real scheduler binds every pod to a Node the controller launched.
async fn launch(cp: &ControlPlane, admin: &Client, t: &Topology) {
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": APP, "namespace": WORKLOAD_NS},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": APP}},
            "template": {
                "metadata": {"labels": {"app": APP}},
                "spec": {
                    // No kubelet runs the pods: an evicted pod must go at once, not wait for one.
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": APP, "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                    }],
                },
            },
        },
    }))
    .expect("a Deployment");
    Api::<Deployment>::namespaced(admin.clone(), WORKLOAD_NS)
        .create(&PostParams::default(), &deployment)
        .await
        .expect("creating the Deployment");

    let bound = eventually(cp, "every pod bound to a launched node", || {
        every_pod_bound(admin)
    })
    .await;
    let claims: Vec<NodeClaim> = Api::<NodeClaim>::all(admin.clone())
        .list(&Default::default())
        .await
        .expect("listing NodeClaims")
        .items;
    let nodes: BTreeSet<String> = bound.iter().map(|(_, n)| n.clone()).collect();
    say!(
        "launched: {} claims, pods on {} nodes: {bound:?}",
        claims.len(),
        nodes.len()
    );
    assert!(
        nodes.len() >= 2,
        "{REPLICAS} CPUs need two 4-CPU nodes: {bound:?}"
    );
    let replicas = machine_deployment_replicas(admin, t).await;
    assert_eq!(
        replicas.iter().sum::<i64>(),
        claims.len() as i64,
        "MachineDeployment replicas raised for each claim: {replicas:?}"
    );
    let machines = Api::<DynamicObject>::all_with(admin.clone(), &CapiVersion::V1Beta2.machine())
        .list(&Default::default())
        .await
        .expect("listing Machines")
        .items;
    assert_eq!(machines.len(), claims.len(), "a Machine per claim");
}

/// A CapacityBuffer of no chunks on the Deployment: the controller reads the Deployment and
/// writes the buffer's status (and launches nothing for it).
async fn buffer(cp: &ControlPlane, admin: &Client) {
    let buffer: CapacityBuffer = serde_json::from_value(json!({
        "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
        "metadata": {"name": "headroom", "namespace": WORKLOAD_NS},
        "spec": {"scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": APP}, "replicas": 0},
    }))
    .expect("a CapacityBuffer");
    let api = Api::<CapacityBuffer>::namespaced(admin.clone(), WORKLOAD_NS);
    api.create(&PostParams::default(), &buffer)
        .await
        .expect("creating the CapacityBuffer");
    eventually(cp, "the buffer's status written", || async {
        let b = api.get("headroom").await.ok()?;
        let ready = b
            .conditions()
            .iter()
            .any(|c| c.type_ == "ReadyForProvisioning" && c.is_true());
        (ready && b.status.as_ref()?.replicas == Some(0)).then_some(())
    })
    .await;
}

/// A CapacityQuota on every node: the controller watches it and writes its status.
async fn quota(cp: &ControlPlane, admin: &Client) {
    use karpenter_capi::api::capacity_quota::CapacityQuota;
    let quota: CapacityQuota = serde_json::from_value(json!({
        "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityQuota",
        "metadata": {"name": "everything"},
        "spec": {"limits": {"resources": {"cpu": "1000", "nodes": "100"}}},
    }))
    .expect("a CapacityQuota");
    let api = Api::<CapacityQuota>::all(admin.clone());
    api.create(&PostParams::default(), &quota)
        .await
        .expect("creating the CapacityQuota");
    eventually(cp, "the quota's status written", || async {
        let q = api.get("everything").await.ok()?;
        let reconciled = q
            .conditions()
            .iter()
            .any(|c| c.type_ == "Reconciled" && c.is_true());
        (reconciled && q.status.as_ref()?.used.is_some()).then_some(())
    })
    .await;
}

/// The leader dies without releasing the Lease (a killed pod); the standby takes the Lease and
/// carries on. Returns the new leader.
async fn fail_over(
    cp: &ControlPlane,
    access: &ServiceAccountAccess,
    leader: Member,
    standby: Member,
) -> Member {
    let writes = rbac::audited(cp, &access.username())
        .unwrap_or_else(|e| panic!("reading the audit log: {e}"))
        .writes;
    for (agent, permissions) in &writes {
        let listed: Vec<String> = permissions.iter().map(ToString::to_string).collect();
        say!("writes by {agent}: {}", listed.join(", "));
    }
    let by_standby: Vec<String> = writes
        .get(&agent(standby.name))
        .into_iter()
        .flatten()
        .filter(|p| p.resource != "leases")
        .map(ToString::to_string)
        .collect();
    assert!(
        by_standby.is_empty(),
        "the standby wrote while the leader led: {by_standby:?}"
    );
    assert!(
        writes
            .get(&agent(leader.name))
            .is_some_and(|w| w.contains(&Permission::new("karpenter.sh", "nodeclaims", "create"))),
        "the leader launched nothing: {writes:?}"
    );
    let dead = leader.name;
    leader.replica.abort();
    eventually(cp, "the standby leading", || {
        std::future::ready(standby.leads().then_some(()))
    })
    .await;
    assert_holds_lease(cp, &standby).await;
    say!("{dead} killed; {} leads", standby.name);
    standby
}

/// A deleted NodeClaim's node is drained through the Eviction API, its Machine deleted (and with
/// it the Node), and its pods land elsewhere.
async fn drain(cp: &ControlPlane, admin: &Client, access: &ServiceAccountAccess) {
    let claims: Api<NodeClaim> = Api::all(admin.clone());
    let bound = every_pod_bound(admin).await.expect("every pod bound");
    let victim = claims
        .list(&Default::default())
        .await
        .expect("listing NodeClaims")
        .items
        .into_iter()
        .find_map(|c| {
            let node = c.status.as_ref()?.node_name.clone()?;
            bound
                .iter()
                .any(|(_, n)| *n == node)
                .then(|| (c.name_any(), node))
        });
    let (claim, node) = victim.expect("a claim whose node has pods");
    claims
        .delete(&claim, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("deleting NodeClaim {claim}: {e}"));
    eventually(
        cp,
        &format!("NodeClaim {claim}, Node {node} and its Machine gone"),
        || gone(admin, &claim, &node),
    )
    .await;
    let placed = eventually(cp, "every pod bound again", || every_pod_bound(admin)).await;
    assert!(
        placed.iter().all(|(_, n)| *n != node),
        "a pod still on the drained node: {placed:?}"
    );
    let used = rbac::audited(cp, &access.username())
        .unwrap_or_else(|e| panic!("reading the audit log: {e}"))
        .used;
    assert!(
        used.contains(&Permission::new("", "pods/eviction", "create")),
        "the node's pods were not evicted through the Eviction API"
    );
    say!("drained {node} ({claim}); pods now on {placed:?}");
}

/// Whether the claim, its Node and its Machine are all gone.
async fn gone(admin: &Client, claim: &str, node: &str) -> Option<()> {
    let claim_left = Api::<NodeClaim>::all(admin.clone())
        .get_opt(claim)
        .await
        .ok()?;
    let node_left = Api::<Node>::all(admin.clone()).get_opt(node).await.ok()?;
    let machines = Api::<DynamicObject>::all_with(admin.clone(), &CapiVersion::V1Beta2.machine())
        .list(&Default::default())
        .await
        .ok()?;
    let machine_left = machines.items.iter().any(|m| {
        m.annotations()
            .get(NODECLAIM_ANNOTATION)
            .map(String::as_str)
            == Some(claim)
            || m.data["status"]["nodeRef"]["name"] == node
    });
    (claim_left.is_none() && node_left.is_none() && !machine_left).then_some(())
}

/// The Deployment shrinks to one pod; consolidation removes the nodes it no longer needs, down to
/// one claim, one Machine and one Node, and the MachineDeployments' replicas follow.
async fn consolidate(cp: &ControlPlane, admin: &Client, t: &Topology) {
    Api::<Deployment>::namespaced(admin.clone(), WORKLOAD_NS)
        .patch(
            APP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("scaling the Deployment down");
    Api::<DynamicObject>::all_with(
        admin.clone(),
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "karpenter.sh",
            "v1",
            "NodePool",
        )),
    )
    .patch(
        "default",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"disruption": {"consolidateAfter": "0s"}}})),
    )
    .await
    .expect("letting the NodePool consolidate");
    let left = eventually(cp, "consolidation down to one node", || async {
        let claims = Api::<NodeClaim>::all(admin.clone())
            .list(&Default::default())
            .await
            .ok()?;
        let nodes = launched_nodes(admin).await?;
        let replicas: i64 = machine_deployment_replicas(admin, t).await.iter().sum();
        let pods = every_pod_bound_n(admin, 1).await?;
        (claims.items.len() == 1 && nodes.len() == 1 && replicas == 1).then_some(pods)
    })
    .await;
    say!("consolidated to one node: {left:?}");
}

/// The names of the Nodes the controller launched (labelled with their NodePool).
async fn launched_nodes(admin: &Client) -> Option<BTreeSet<String>> {
    let nodes = Api::<Node>::all(admin.clone())
        .list(&kube::api::ListParams::default().labels(NODEPOOL_LABEL))
        .await
        .ok()?;
    Some(nodes.items.iter().map(|n| n.name_any()).collect())
}

/// (pod, node) of every pod of the Deployment once all are bound to Nodes of the NodePool.
async fn every_pod_bound(admin: &Client) -> Option<Vec<(String, String)>> {
    every_pod_bound_n(admin, REPLICAS as usize).await
}

/// (pod, node) of the Deployment's `n` pods once exactly `n` exist and all are bound to Nodes of
/// the NodePool.
async fn every_pod_bound_n(admin: &Client, n: usize) -> Option<Vec<(String, String)>> {
    let pods = Api::<Pod>::namespaced(admin.clone(), WORKLOAD_NS)
        .list(&kube::api::ListParams::default().labels(&format!("app={APP}")))
        .await
        .ok()?;
    let launched: BTreeSet<String> = launched_nodes(admin).await?;
    let bound: Vec<(String, String)> = pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            launched.contains(&node).then(|| (p.name_any(), node))
        })
        .collect();
    (bound.len() == n && pods.items.len() == n).then_some(bound)
}

async fn machine_deployment_replicas(admin: &Client, t: &Topology) -> Vec<i64> {
    Api::<DynamicObject>::namespaced_with(
        admin.clone(),
        t.machines,
        &CapiVersion::V1Beta2.machine_deployment(),
    )
    .list(&Default::default())
    .await
    .expect("listing MachineDeployments")
    .items
    .iter()
    .map(|md| md.data["spec"]["replicas"].as_i64().unwrap_or(-1))
    .collect()
}

/// Whether a [`NOT_REACHED`] entry covers `p`.
fn covers((group, resource, verb, _): &Unreached, p: &Permission) -> bool {
    p.group == *group
        && p.verb == *verb
        && match resource.strip_prefix('*') {
            Some(suffix) => p.resource.ends_with(suffix),
            None => p.resource == *resource,
        }
}

/// Every permission the chart grants is used by the flow or explained in `not_reached` (this
/// flow's: [`NOT_REACHED`]), every entry there is still granted, and nothing the controller used
/// came from outside the chart.
pub(crate) fn assert_granted_is_used(
    access: &ServiceAccountAccess,
    used: &BTreeSet<Permission>,
    not_reached: &[Unreached],
) {
    let granted = access.granted();
    let listed = |ps: &mut dyn Iterator<Item = &Permission>| -> Vec<String> {
        ps.map(ToString::to_string).collect()
    };
    say!(
        "{} of {} granted permissions used",
        used.intersection(&granted).count(),
        granted.len()
    );
    let unused = listed(
        &mut granted
            .difference(used)
            .filter(|p| !not_reached.iter().any(|e| covers(e, p))),
    );
    assert!(
        unused.is_empty(),
        "the chart grants permissions the controller did not use (remove them, or add the path \
         that needs them to NOT_REACHED): {unused:#?}"
    );
    let stale: Vec<String> = not_reached
        .iter()
        .filter(|entry| !granted.iter().any(|p| covers(entry, p)))
        .map(|(group, resource, verb, _)| format!("{verb} {group}/{resource}"))
        .collect();
    assert!(
        stale.is_empty(),
        "NOT_REACHED names permissions the chart no longer grants: {stale:?}"
    );
    let outside = listed(&mut used.difference(&granted));
    assert!(
        outside.is_empty(),
        "the controller used permissions the chart does not grant (a default role did): {outside:#?}"
    );
}
