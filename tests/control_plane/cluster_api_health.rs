//! Cluster API's own health checking and draining beside the controller's, on real Cluster API
//! v1.14.2 (v1beta2) and v1.10.10 (v1beta1), the same bodies at both (`simulate --control-plane
//! real --cluster-api real`'s cluster, the simulator playing only the infrastructure provider and
//! the kubelets):
//!
//! - a MachineHealthCheck and node repair both on: a Node gone `Ready=False` is replaced once,
//!   by Cluster API (its MHC marks the Machine, its MachineSet deletes it), the controller
//!   holding its own repair back and told why; without an MHC, node repair replaces it;
//! - one drain per pod: a claim the controller drained has its Machine deleted by Cluster API
//!   without Cluster API's drain (no pod evicted by Cluster API), and every pod is evicted once;
//!   a Machine Cluster API deletes first is drained by both (the claim follows its Machine), yet
//!   no pod is evicted twice.
//!
//! Who did what is read from kube-apiserver's audit (the write log): the controller's writes
//! carry its agent, the manager's `MANAGER_USER` (management cluster) or `WORKLOAD_USER` (its
//! workload cluster client, which drains).

use std::collections::BTreeMap;

use karpenter_capi::controlplane::cluster_api::{
    MANAGER_USER, RELEASE_V1BETA1, RELEASE_V1BETA2, WORKLOAD_USER,
};
use karpenter_capi::sim::cluster::{PodShape, SimCluster};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

use crate::assets;
use crate::common::claims::fast_disruption;
use crate::common::{Env, NS, condition};

pub fn tests() -> Vec<assets::Test> {
    trials![
        @actix a_machine_health_check_replaces_an_unhealthy_node_once_on_real_cluster_api
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        @actix a_machine_health_check_replaces_an_unhealthy_node_once_on_real_cluster_api_v1beta1
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApiV1beta1],
        @actix without_a_machine_health_check_node_repair_replaces_it_on_real_cluster_api
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        @actix without_a_machine_health_check_node_repair_replaces_it_on_real_cluster_api_v1beta1
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApiV1beta1],
        @actix a_claim_the_controller_drained_is_not_drained_again_by_cluster_api
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        @actix a_claim_the_controller_drained_is_not_drained_again_by_cluster_api_v1beta1
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApiV1beta1],
        @actix a_machine_cluster_api_deletes_first_is_drained_once
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        @actix a_machine_cluster_api_deletes_first_is_drained_once_v1beta1
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApiV1beta1],
    ]
}

/// Which Cluster API a test runs on: `--cluster-api-version` and the release it starts.
#[derive(Clone, Copy)]
struct At {
    version: &'static str,
    release: &'static str,
}

const V1BETA2: At = At {
    version: "v1beta2",
    release: RELEASE_V1BETA2,
};
const V1BETA1: At = At {
    version: "v1beta1",
    release: RELEASE_V1BETA1,
};

/// The Deployment whose pods the node under test carries.
const APP: &str = "web";
const PODS: usize = 3;

/// The MachineHealthCheck's unhealthy-node timeout: four seconds past the controller's repair
/// toleration (a Node `Env::node_ready` sickens is due for repair three seconds later, for the
/// MHC seven), so an MHC slower than repair must still be the one that acts.
const MHC_TIMEOUT_SECONDS: i64 = crate::common::repair::TOLERATION.as_secs() as i64 + 4;

/// The cluster `simulate --control-plane real --cluster-api real --cluster-api-version
/// <at.version>` runs, one MachineDeployment, the controller with short batches, disruption
/// passes at test speed and, when `repair`, node repair on with the tests' toleration.
async fn real_env(repair: bool, at: At) -> Env {
    use karpenter_capi::simulate::pods::seed_of;

    let args = super::real_args(at.version, &[]);
    let env = Env::builder()
        .cluster(karpenter_capi::simulate::cluster_config(&args))
        .seeds(vec![seed_of(0, 10)])
        .short_batches()
        .tune(|s| {
            s.disruption = fast_disruption();
            s.node_repair = repair.then(|| {
                karpenter_capi::view::repair::RepairPolicies::ready(
                    crate::common::repair::TOLERATION,
                )
            });
        })
        .start()
        .await;
    super::report_names_real_cluster_api(env.sim.cluster(), at.release);
    env
}

/// `PODS` pods of Deployment `APP`, one per node, bound on the controller's capacity, Cluster
/// API's part done (every Machine made by the manager and bound to its Node), and no claim
/// besides the pods' own; returns the claims.
///
/// One pod per node ([`POD_CPU`]) so the scenario does not depend on how provisioning batched
/// the pods: a pod the tests evict from its node fits on no other, so exactly one new node is
/// made for it. On a loaded machine provisioning has made a claim more than the pods needed
/// (three small pods came as two claims, three large ones as four: a finding of its own, on
/// issue 40); an empty one is deleted here, as an operator would, so every test starts from one
/// pod per node.
async fn pods_bound(env: &Env) -> Vec<String> {
    env.deployment(APP, PODS, PodShape::new(POD_CPU, "128Mi"))
        .await;
    env.until_quiet("the pods bound", |e| e.bound_pods() == PODS)
        .await;
    super::assert_cluster_api_did_its_part(env.sim.cluster(), env.claims_created()).await;
    for claim in claims_without_a_pod(env) {
        env.delete_claim(&claim).await;
    }
    env.until_quiet("one claim, Machine and Node per pod", |e| {
        e.bound_pods() == PODS
            && live(e, "nodeclaims") == PODS
            && live(e, "machines") == PODS
            && live(e, "nodes") == PODS
    })
    .await;
    names(&env.list("nodeclaims"))
}

/// Claims whose Node carries none of the Deployment's pods.
fn claims_without_a_pod(env: &Env) -> Vec<String> {
    let carrying: Vec<String> = env
        .list("pods")
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["app"] == APP)
        .filter_map(|p| p["spec"]["nodeName"].as_str().map(String::from))
        .collect();
    env.list("nodeclaims")
        .into_iter()
        .filter(|c| {
            c["status"]["nodeName"]
                .as_str()
                .is_none_or(|n| !carrying.iter().any(|m| m == n))
        })
        .filter_map(|c| c["metadata"]["name"].as_str().map(String::from))
        .collect()
}

/// More than half of a `small` node's two CPUs: two of the Deployment's pods never share a node.
const POD_CPU: &str = "1100m";

/// Objects of `resource` not being deleted.
fn live(env: &Env, resource: &str) -> usize {
    env.list(resource)
        .into_iter()
        .filter(|o| o["metadata"]["deletionTimestamp"].is_null())
        .count()
}

fn names(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(String::from))
        .collect()
}

/// The claim carrying most of the Deployment's pods, and its Node.
fn busiest(env: &Env) -> (String, String) {
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in env.list("pods") {
        if let Some(n) = p["spec"]["nodeName"].as_str() {
            *per_node.entry(n.to_string()).or_default() += 1;
        }
    }
    let (node, _) = per_node
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .expect("a Node with pods");
    let claim = env
        .list("nodeclaims")
        .into_iter()
        .find(|c| c["status"]["nodeName"] == node.as_str())
        .and_then(|c| c["metadata"]["name"].as_str().map(String::from))
        .expect("the Node's claim");
    (claim, node)
}

/// The Machine bound to `claim` (`namespace/name`, from the claim's annotation).
fn machine_of(env: &Env, claim: &str) -> String {
    env.get("nodeclaims", "", claim)
        .and_then(|c| {
            c["metadata"]["annotations"]["cluster.x-k8s.io/machine"]
                .as_str()
                .map(String::from)
        })
        .expect("the claim's Machine")
}

/// A MachineHealthCheck over the MachineDeployment's Machines, as a user writes one at API
/// version `version`: Ready False or Unknown for `MHC_TIMEOUT_SECONDS` is unhealthy,
/// remediation allowed while at most one Machine is. v1beta1 (v1.10.10 serves nothing newer)
/// names the conditions `unhealthyConditions` with a duration string and the limit
/// `maxUnhealthy`; v1beta2 moved them under `checks` (whole seconds) and `remediation.triggerIf`.
fn machine_health_check_of(version: &str, md: &str) -> Value {
    let selector = json!({"matchLabels": {"cluster.x-k8s.io/deployment-name": md}});
    let spec = if version == "v1beta1" {
        let timeout = format!("{MHC_TIMEOUT_SECONDS}s");
        json!({
            "clusterName": karpenter_capi::sim::cluster::CLUSTER_NAME,
            "selector": selector,
            "unhealthyConditions": [
                {"type": "Ready", "status": "False", "timeout": timeout},
                {"type": "Ready", "status": "Unknown", "timeout": timeout},
            ],
            "maxUnhealthy": 1,
        })
    } else {
        json!({
            "clusterName": karpenter_capi::sim::cluster::CLUSTER_NAME,
            "selector": selector,
            "checks": {"unhealthyNodeConditions": [
                {"type": "Ready", "status": "False", "timeoutSeconds": MHC_TIMEOUT_SECONDS},
                {"type": "Ready", "status": "Unknown", "timeoutSeconds": MHC_TIMEOUT_SECONDS},
            ]},
            "remediation": {"triggerIf": {"unhealthyLessThanOrEqualTo": 1}},
        })
    };
    json!({
        "apiVersion": format!("cluster.x-k8s.io/{version}"), "kind": "MachineHealthCheck",
        "metadata": {"name": APP, "namespace": NS},
        "spec": spec,
    })
}

/// Creates [`machine_health_check_of`] at `at`'s API version.
async fn machine_health_check(env: &Env, md: &str, at: At) {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", at.version, "MachineHealthCheck"),
        "machinehealthchecks",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(env.client().await, NS, &resource);
    let mhc: DynamicObject = serde_json::from_value(machine_health_check_of(at.version, md))
        .expect("a MachineHealthCheck");
    api.create(&PostParams::default(), &mhc)
        .await
        .expect("create the MachineHealthCheck");
}

/// Whether Cluster API's MHC has reported on every Machine (`HealthCheckSucceeded`, which
/// only an MHC sets; `status.conditions` carries it at both versions, as a v1beta1 condition at
/// v1.10.10 and a v1beta2 one at v1.14.2).
fn every_machine_health_checked(env: &Env) -> bool {
    let machines = env.list("machines");
    !machines.is_empty()
        && machines
            .iter()
            .all(|m| condition(m, "HealthCheckSucceeded").is_some_and(|c| c["status"] == "True"))
}

/// Whether Machine `name` (of `NS`) is seen marked by the MHC (`HealthCheckSucceeded=False`
/// and `OwnerRemediated`) before it is gone; waits for one or the other.
async fn marked_by_the_health_check(env: &Env, name: &str) -> bool {
    env.wait("the unhealthy Machine marked by the MHC, or gone", || {
        let Some(m) = env.get("machines", NS, name) else {
            return Some(false);
        };
        let failed = condition(&m, "HealthCheckSucceeded").is_some_and(|c| c["status"] == "False");
        (failed && condition(&m, "OwnerRemediated").is_some()).then_some(true)
    })
    .await
}

/// Writes to `resource` (main resource) after `since_ms` with `verb`, by agent: (the
/// controller's, the manager's).
fn writes_since(cluster: &SimCluster, resource: &str, verb: &str, since_ms: u64) -> (usize, usize) {
    let all: Vec<_> = cluster
        .stats()
        .writes_for(resource, "")
        .into_iter()
        .filter(|w| w.at_ms > since_ms && w.verb == verb)
        .collect();
    let controller = all
        .iter()
        .filter(|w| w.agent == karpenter_capi::app::USER_AGENT)
        .count();
    let manager = all.iter().filter(|w| by_manager(&w.agent)).count();
    (controller, manager)
}

fn by_manager(agent: &str) -> bool {
    agent.starts_with(&format!("{MANAGER_USER} "))
}

/// Cluster API's manager on either cluster: it drains through its workload cluster's client.
fn by_cluster_api(agent: &str) -> bool {
    by_manager(agent) || agent.starts_with(&format!("{WORKLOAD_USER} "))
}

/// The time (write log's clock) of the first `verb` of `resource` `name` by the manager (or,
/// with `manager` false, by the controller).
fn first_write(
    cluster: &SimCluster,
    resource: &str,
    name: &str,
    verb: &str,
    manager: bool,
) -> Option<u64> {
    cluster
        .stats()
        .writes_for(resource, "")
        .into_iter()
        .filter(|w| w.name == name && w.verb == verb)
        .filter(|w| {
            if manager {
                by_manager(&w.agent)
            } else {
                w.agent == karpenter_capi::app::USER_AGENT
            }
        })
        .map(|w| w.at_ms)
        .min()
}

/// Successful evictions after `since_ms`, per pod: who asked, in order ("controller",
/// "cluster-api" or the agent). A second eviction of a pod already terminating succeeds too,
/// so a pod two drains reached is listed twice.
fn evictions_since(cluster: &SimCluster, since_ms: u64) -> BTreeMap<String, Vec<String>> {
    let mut per_pod: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for w in cluster.stats().writes_for("pods", "eviction") {
        if w.at_ms <= since_ms {
            continue;
        }
        let who = if w.agent == karpenter_capi::app::USER_AGENT {
            "controller".to_string()
        } else if by_cluster_api(&w.agent) {
            "cluster-api".to_string()
        } else {
            w.agent.clone()
        };
        per_pod.entry(w.name).or_default().push(who);
    }
    per_pod
}

/// The Deployment's pods are all bound again, none on `node`; once that holds and nothing
/// changes for a moment.
async fn pods_bound_elsewhere(env: &Env, node: &str) {
    env.until_quiet("the pods bound on another node", |e| {
        let pods: Vec<Value> = e
            .list("pods")
            .into_iter()
            .filter(|p| p["metadata"]["labels"]["app"] == APP)
            .collect();
        pods.len() == PODS
            && pods.iter().all(|p| {
                p["metadata"]["deletionTimestamp"].is_null()
                    && p["spec"]["nodeName"].as_str().is_some_and(|n| n != node)
            })
    })
    .await;
}

/// One live Machine per live claim, each bound to its Node, and nothing else.
fn one_machine_per_claim(env: &Env) {
    let (claims, machines, nodes) = (
        live(env, "nodeclaims"),
        live(env, "machines"),
        live(env, "nodes"),
    );
    assert_eq!(
        (machines, nodes),
        (claims, claims),
        "live Machines and Nodes against live claims"
    );
}

/// Node repair on and a MachineHealthCheck over the Machines: the controller's Node goes
/// `Ready=False`. Cluster API's MHC (5 s) acts, not the controller's repair (1 s, held back with
/// `NodeRepairBlocked` naming the MHC): the manager deletes the Machine, the claim follows it,
/// the pods end bound on one new node, and exactly one replacement is made (one claim created,
/// one Machine created and one deleted, nothing counted as repaired). Each pod is evicted once
/// at most, by whichever drain reached it first.
async fn a_machine_health_check_replaces_an_unhealthy_node_once_on_real_cluster_api() {
    machine_health_check_replaces_once(V1BETA2).await;
}

async fn a_machine_health_check_replaces_an_unhealthy_node_once_on_real_cluster_api_v1beta1() {
    machine_health_check_replaces_once(V1BETA1).await;
}

async fn machine_health_check_replaces_once(at: At) {
    let env = real_env(true, at).await;
    let cluster = env.sim.cluster().clone();
    pods_bound(&env).await;
    let md = env.list("machinedeployments")[0]["metadata"]["name"]
        .as_str()
        .expect("the MachineDeployment's name")
        .to_string();
    machine_health_check(&env, &md, at).await;
    env.until(
        "Cluster API's MHC reports every Machine healthy",
        every_machine_health_checked,
    )
    .await;

    let (sick, node) = busiest(&env);
    let machine = machine_of(&env, &sick);
    let machine_name = machine.split_once('/').map_or(machine.as_str(), |(_, n)| n);
    let before = cluster.stats().now_ms();
    let claims_before = env.claims_created();
    env.node_ready(&node, "False").await;

    // The controller's repair is due three seconds on and held back: the MHC owns it.
    let blocked = env
        .served_events_about("NodeRepairBlocked", "NodeClaim", 1)
        .await;
    assert!(
        blocked.iter().all(|e| e["note"]
            .as_str()
            .is_some_and(|n| n.contains("a MachineHealthCheck watches over Machine"))),
        "{blocked:#?}"
    );
    let marked = marked_by_the_health_check(&env, machine_name).await;
    assert!(
        marked,
        "Machine {machine} went without Cluster API's MHC marking it (HealthCheckSucceeded=False, OwnerRemediated)"
    );
    env.gone(&sick, &node).await;
    pods_bound_elsewhere(&env, &node).await;

    // Cluster API deleted the Machine, before the controller deleted the claim (which only
    // followed its Machine); nothing of the controller's repair ran.
    let machine_deleted = first_write(&cluster, "machines", machine_name, "delete", true)
        .expect("Cluster API's manager deleted the unhealthy Machine");
    let claim_deleted = first_write(&cluster, "nodeclaims", &sick, "delete", false)
        .expect("the controller deleted the claim whose Machine went");
    assert!(
        machine_deleted < claim_deleted,
        "the claim was deleted at {claim_deleted} ms, before Cluster API deleted its Machine at {machine_deleted} ms"
    );
    assert!(
        env.served_events("NodeRepair").await.is_empty(),
        "the controller repaired too"
    );
    assert_eq!(
        env.metric("karpenter_nodeclaims_disrupted_total{reason=\"unhealthy\""),
        0.0
    );
    // Exactly one replacement: one Machine deleted and one made, both by Cluster API, one
    // claim made for it.
    assert_eq!(
        writes_since(&cluster, "machines", "delete", before),
        (0, 1),
        "Machine deletes since the Node went Ready=False (controller, manager)"
    );
    assert_eq!(
        writes_since(&cluster, "machines", "create", before),
        (0, 1),
        "Machine creates since the Node went Ready=False (controller, manager)"
    );
    assert_eq!(env.claims_created() - claims_before, 1, "claims created");
    assert_eq!(
        super::controller_md_writes_since(&cluster, before),
        [],
        "a replica write: the new claim takes the MachineSet's new Machine"
    );
    one_machine_per_claim(&env);
    let evictions = evictions_since(&cluster, before);
    say!("evictions since the Node went Ready=False: {evictions:?}");
    let twice: Vec<_> = evictions.iter().filter(|(_, who)| who.len() > 1).collect();
    assert!(twice.is_empty(), "pods evicted more than once: {twice:?}");
    env.invariants_hold();
    super::env_stops_leaving_nothing(env);
}

/// The converse, on the same cluster without a MachineHealthCheck: the controller's repair
/// replaces the `Ready=False` Node (its `NodeRepair` Event and count), Cluster API deleting the
/// released Machine; one claim made for it.
async fn without_a_machine_health_check_node_repair_replaces_it_on_real_cluster_api() {
    node_repair_replaces_it(V1BETA2).await;
}

async fn without_a_machine_health_check_node_repair_replaces_it_on_real_cluster_api_v1beta1() {
    node_repair_replaces_it(V1BETA1).await;
}

async fn node_repair_replaces_it(at: At) {
    let env = real_env(true, at).await;
    let cluster = env.sim.cluster().clone();
    pods_bound(&env).await;
    let (sick, node) = busiest(&env);
    let before = cluster.stats().now_ms();
    let claims_before = env.claims_created();
    env.node_ready(&node, "False").await;
    env.gone(&sick, &node).await;
    pods_bound_elsewhere(&env, &node).await;
    let told = env.served_events_about("NodeRepair", "NodeClaim", 1).await;
    assert!(
        told.iter().all(|e| e["note"]
            .as_str()
            .is_some_and(|n| n.contains("Ready=False"))),
        "{told:#?}"
    );
    assert_eq!(
        env.metric("karpenter_nodeclaims_disrupted_total{reason=\"unhealthy\""),
        1.0
    );
    assert!(
        first_write(&cluster, "nodeclaims", &sick, "delete", false).is_some(),
        "the controller deleted the unhealthy claim"
    );
    assert_eq!(
        writes_since(&cluster, "machines", "delete", before),
        (0, 1),
        "Machine deletes since the Node went Ready=False (controller, manager)"
    );
    assert_eq!(env.claims_created() - claims_before, 1, "claims created");
    one_machine_per_claim(&env);
    env.invariants_hold();
    super::env_stops_leaving_nothing(env);
}

/// A pod the controller's drain leaves on its Node (it tolerates every taint, so also
/// `karpenter.sh/disrupted:NoSchedule`), which Cluster API's drain would evict.
const STAYS: &str = "tolerates-all";

/// The controller drains a deleted claim's Node itself (every pod of the Deployment evicted
/// once, by the controller) and marks the Machine `exclude-node-draining` before Cluster API
/// deletes it: Cluster API evicts nothing, not even the pod the controller's drain leaves (it
/// tolerates `karpenter.sh/disrupted`), which goes with its Node.
async fn a_claim_the_controller_drained_is_not_drained_again_by_cluster_api() {
    controller_drained_claim(V1BETA2).await;
}

async fn a_claim_the_controller_drained_is_not_drained_again_by_cluster_api_v1beta1() {
    controller_drained_claim(V1BETA1).await;
}

async fn controller_drained_claim(at: At) {
    let env = real_env(false, at).await;
    let cluster = env.sim.cluster().clone();
    pods_bound(&env).await;
    let (claim, node) = busiest(&env);
    let on_node: Vec<String> = env
        .list("pods")
        .into_iter()
        .filter(|p| p["spec"]["nodeName"] == node.as_str())
        .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
        .collect();
    env.pod(
        STAYS,
        &node,
        json!({"app": STAYS}),
        json!({"spec": {"tolerations": [{"operator": "Exists"}]}}),
    )
    .await;
    let machine = machine_of(&env, &claim);
    let machine_name = machine.split_once('/').map_or(machine.as_str(), |(_, n)| n);
    let before = cluster.stats().now_ms();
    env.delete_claim(&claim).await;
    env.gone(&claim, &node).await;
    pods_bound_elsewhere(&env, &node).await;

    let evictions = evictions_since(&cluster, before);
    let by_manager: Vec<_> = evictions
        .iter()
        .filter(|(_, who)| who.iter().any(|w| w == "cluster-api"))
        .collect();
    assert!(
        by_manager.is_empty(),
        "Cluster API drained a Node the controller drained: {by_manager:?}"
    );
    for pod in &on_node {
        assert_eq!(
            evictions.get(pod).map(Vec::as_slice),
            Some(["controller".to_string()].as_slice()),
            "pod {pod}: evicted once, by the controller ({evictions:?})"
        );
    }
    assert_eq!(evictions.get(STAYS), None, "{evictions:?}");
    assert!(
        first_write(&cluster, "machines", machine_name, "delete", true).is_some(),
        "Cluster API deleted the released Machine"
    );
    env.invariants_hold();
    super::env_stops_leaving_nothing(env);
}

/// Cluster API deletes a claim's Machine first (a user's `kubectl delete machine`): its drain
/// starts, and so does the controller's termination of the claim, which follows its Machine.
/// Both skip a pod already terminating, so each pod is evicted once at most; the Machine is
/// replaced once (the MachineSet's new Machine taken by the claim made for the pods).
async fn a_machine_cluster_api_deletes_first_is_drained_once() {
    machine_deleted_first(V1BETA2).await;
}

async fn a_machine_cluster_api_deletes_first_is_drained_once_v1beta1() {
    machine_deleted_first(V1BETA1).await;
}

async fn machine_deleted_first(at: At) {
    let env = real_env(false, at).await;
    let cluster = env.sim.cluster().clone();
    pods_bound(&env).await;
    let (claim, node) = busiest(&env);
    // Cluster API's drain evicts it, the controller's would not: who drained shows.
    env.pod(
        STAYS,
        &node,
        json!({"app": STAYS}),
        json!({"spec": {"tolerations": [{"operator": "Exists"}]}}),
    )
    .await;
    let machine = machine_of(&env, &claim);
    let (ns, machine_name) = machine.split_once('/').expect("namespace/name");
    let before = cluster.stats().now_ms();
    let claims_before = env.claims_created();
    let machines: Api<DynamicObject> =
        Api::namespaced_with(env.client().await, ns, &cluster.capi_version().machine());
    machines
        .delete(machine_name, &Default::default())
        .await
        .expect("delete the Machine");
    env.gone(&claim, &node).await;
    pods_bound_elsewhere(&env, &node).await;

    let evictions = evictions_since(&cluster, before);
    say!("evictions since the Machine was deleted: {evictions:?}");
    let twice: Vec<_> = evictions.iter().filter(|(_, who)| who.len() > 1).collect();
    assert!(twice.is_empty(), "pods evicted more than once: {twice:?}");
    assert_eq!(
        writes_since(&cluster, "machines", "create", before),
        (0, 1),
        "Machine creates since the Machine was deleted (controller, manager)"
    );
    assert_eq!(env.claims_created() - claims_before, 1, "claims created");
    assert_eq!(
        super::controller_md_writes_since(&cluster, before),
        [],
        "a replica write: the new claim takes the MachineSet's new Machine"
    );
    one_machine_per_claim(&env);
    env.invariants_hold();
    super::env_stops_leaving_nothing(env);
}
