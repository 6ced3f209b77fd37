//! The launch path end to end against the simulated cluster: NodeClaims become Machines, Nodes
//! and initialized claims; concurrency, timeouts, max-size, deletion and both Cluster API
//! versions (a restart mid-burst runs on both backends, in the control_plane test binary). Every
//! test ends with the controller's invariants.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::wellknown::*;
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::sim::cluster::{MachineDeploymentSeed, ServedVersions, SimClusterConfig};
use karpenter_capi::simulate::launch::{self, seed_of};
use karpenter_capi::simulate::sim_settings;

use crate::common::{DEADLINE, Env};

/// Both Cluster API versions' cluster with short stand-in delays (the MachinePool tests too).
pub(crate) fn cluster(version: CapiVersion) -> SimClusterConfig {
    SimClusterConfig {
        capi_version: version.into(),
        served: match version {
            CapiVersion::V1Beta1 => ServedVersions::V1beta1,
            CapiVersion::V1Beta2 => ServedVersions::V1beta2,
        },
        provider_delay: Duration::from_millis(50),
        jitter: Duration::from_millis(50),
        node_ready_delay: Duration::from_millis(50),
        node_delete_delay: Duration::from_millis(20),
        ..SimClusterConfig::default()
    }
}

/// The burst tests are about serialised replica writes, not timeouts: on a machine loaded by
/// other builds a burst has taken close to the default 5-minute create timeout, and claims that
/// time out are deleted, which is right for the controller and wrong for these assertions.
const BURST_CREATE_TIMEOUT: Duration = Duration::from_secs(1800);

async fn env(
    cfg: SimClusterConfig,
    seeds: Vec<MachineDeploymentSeed>,
    create_timeout: Option<Duration>,
) -> Env {
    Env::builder()
        .cluster(cfg)
        .seeds(seeds)
        .settings(sim_settings(create_timeout))
        .start()
        .await
}

fn condition(c: &Value, ty: &str) -> bool {
    c.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|x| x["type"] == ty && x["status"] == "True"))
}

async fn one_claim_end_to_end(version: CapiVersion) {
    let env = env(cluster(version), vec![seed_of(0, 10)], None).await;
    let names = env.claims(1, 1).await;
    env.settle().await;

    let claims = env.list("nodeclaims");
    assert_eq!(claims.len(), 1);
    let claim = &claims[0];
    assert_eq!(claim["metadata"]["name"], names[0].as_str());
    for ty in ["Launched", "Registered", "Initialized", "Ready"] {
        assert!(condition(claim, ty), "{ty} not True: {claim:#}");
    }
    let machine_ref = claim["metadata"]["annotations"][MACHINE_ANNOTATION]
        .as_str()
        .expect("claim names its Machine");
    let machines = env.machines_of("md-0");
    assert_eq!(machines.len(), 1);
    let m = &machines[0];
    assert_eq!(
        format!("default/{}", m["metadata"]["name"].as_str().unwrap()),
        machine_ref
    );
    assert_eq!(
        m["metadata"]["annotations"][NODECLAIM_ANNOTATION],
        names[0].as_str()
    );
    assert_eq!(claim["status"]["providerID"], m["spec"]["providerID"]);
    assert_eq!(claim["metadata"]["labels"][INSTANCE_TYPE_LABEL], "sim-0");
    assert_eq!(claim["metadata"]["labels"][ZONE_LABEL], "sim-zone-0");
    assert_eq!(claim["status"]["capacity"]["cpu"], "4");
    assert!(
        claim["metadata"]["finalizers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == TERMINATION_FINALIZER)
    );

    let node_name = claim["status"]["nodeName"].as_str().expect("nodeName set");
    let client = env.sim.client_here().await.unwrap();
    let node = Api::<Node>::all(client).get(node_name).await.unwrap();
    let labels = node.labels();
    assert_eq!(
        labels.get(REGISTERED_LABEL).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        labels.get(INITIALIZED_LABEL).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        labels.get(NODEPOOL_LABEL).map(String::as_str),
        Some("default")
    );
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    assert!(
        !taints.iter().any(|t| t.key == UNREGISTERED_TAINT_KEY),
        "unregistered taint removed"
    );
    assert!(node.finalizers().iter().any(|f| f == TERMINATION_FINALIZER));
    assert!(
        node.owner_references()
            .iter()
            .any(|o| o.kind == "NodeClaim" && o.name == names[0])
    );
    assert_eq!(env.replicas("md-0"), 1);
    env.invariants_hold();

    let text = env.metrics.encode();
    assert!(text.contains("karpenter_nodeclaims_initialized_total{nodepool=\"default\",machine_deployment=\"default/md-0\"} 1"), "{text}");
}

#[actix::test]
async fn one_claim_end_to_end_v1beta2() {
    one_claim_end_to_end(CapiVersion::V1Beta2).await;
}

#[actix::test]
async fn one_claim_end_to_end_v1beta1() {
    one_claim_end_to_end(CapiVersion::V1Beta1).await;
}

/// A Node that is Ready by the time its claim registers it is registered and initialized
/// together: one Node patch (labels, taints, owner, finalizer and `initialized`) and one status
/// write setting `Registered` and `Initialized`. The Node is admitted without the not-ready
/// taint here: with it, whether the taint is lifted before the claim registers the Node is a
/// race (two Node patches when it is not), and this test is about the writes being coalesced
/// once the Node is fully ready.
#[actix::test]
async fn a_node_ready_at_registration_is_registered_and_initialized_in_one_write_each() {
    let cfg = SimClusterConfig {
        not_ready_taint: false,
        ..cluster(CapiVersion::V1Beta2)
    };
    let env = env(cfg, vec![seed_of(0, 10)], None).await;
    env.claims(1, 1).await;
    env.settle().await;
    let claims = env.list("nodeclaims");
    let claim = &claims[0];
    let time = |ty: &str| {
        claim["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == ty))
            .map(|c| (c["status"].clone(), c["lastTransitionTime"].clone()))
            .unwrap_or_else(|| panic!("no {ty} condition: {claim:#}"))
    };
    let (registered, at) = time("Registered");
    let (initialized, also_at) = time("Initialized");
    assert_eq!(
        (registered.as_str(), initialized.as_str()),
        (Some("True"), Some("True"))
    );
    assert_eq!(at, also_at, "one status write set both");
    assert_eq!(env.controller_writes("nodes"), 1, "one Node patch");
    let node = env
        .list("nodes")
        .into_iter()
        .find(|n| n["metadata"]["name"] == claim["status"]["nodeName"])
        .expect("the claim's Node");
    assert_eq!(node["metadata"]["labels"][INITIALIZED_LABEL], "true");
    assert_eq!(node["metadata"]["labels"][REGISTERED_LABEL], "true");
    // Before Initialized, the claim itself took: the launch decision, its Machine, Launched,
    // and Registered with Initialized.
    let status_writes = env
        .sim
        .cluster()
        .stats()
        .writes()
        .iter()
        .filter(|w| w.agent == karpenter_capi::app::USER_AGENT)
        .filter(|w| w.resource == "nodeclaims" && w.subresource == "status")
        .count();
    assert!(status_writes >= 2, "{status_writes} status writes");
    env.invariants_hold();
}

#[actix::test]
async fn two_hundred_concurrent_claims_on_one_machine_deployment() {
    let env = env(
        cluster(CapiVersion::V1Beta2),
        vec![seed_of(0, 1000)],
        Some(BURST_CREATE_TIMEOUT),
    )
    .await;
    env.claims(200, 1).await;
    env.settle().await;
    let machines = env.machines_of("md-0");
    assert_eq!(machines.len(), 200);
    assert_eq!(env.replicas("md-0"), 200);
    let bound: BTreeSet<&str> = machines
        .iter()
        .filter_map(|m| m["metadata"]["annotations"][NODECLAIM_ANNOTATION].as_str())
        .collect();
    assert_eq!(bound.len(), 200, "every Machine bound to a different claim");
    let inv = env.invariants_hold();
    assert_eq!(inv.bound, 200);
    let replica_writes = env.controller_writes("machinedeployments");
    assert!(
        replica_writes * 2 < 200,
        "replica writes are batched: {replica_writes} writes for 200 claims"
    );
}

#[actix::test]
async fn a_thousand_claims_over_ten_machine_deployments() {
    let seeds = (0..10).map(|i| seed_of(i, 1000)).collect();
    let env = env(
        cluster(CapiVersion::V1Beta2),
        seeds,
        Some(BURST_CREATE_TIMEOUT),
    )
    .await;
    env.claims(1000, 10).await;
    env.settle().await;
    for i in 0..10 {
        let md = format!("md-{i}");
        assert_eq!(env.machines_of(&md).len(), 100, "{md}");
        assert_eq!(env.replicas(&md), 100, "{md}");
    }
    let inv = env.invariants_hold();
    assert_eq!(inv.bound, 1000);
    // The Scaler holds scale-ups while the burst is under way: few replica writes per
    // MachineDeployment cover its hundred claims (13 in a release run, 32 in a debug test on
    // a 2-core machine at load 14; one per round trip, as before, was 45-80 in release).
    // How requests spread over time depends on the machine's load (a helper's loaded run
    // once saw 50+), so the test asserts only that writes were coalesced at all: fewer than
    // one per claim. The figures are measured in docs/benchmarks.md, not asserted here.
    let writes = env.sim.cluster().stats().writes();
    for i in 0..10 {
        let md = format!("md-{i}");
        let n = writes
            .iter()
            .filter(|w| w.agent == karpenter_capi::app::USER_AGENT)
            .filter(|w| w.resource == "machinedeployments" && w.name == md)
            .count();
        assert!(n < 100, "{n} replica writes for the 100 claims of {md}");
    }
}

#[actix::test]
async fn slow_provider_times_claims_out_without_leaking() {
    let mut cfg = cluster(CapiVersion::V1Beta2);
    cfg.fail_fraction = 0.3;
    cfg.seed = 7;
    let env = env(cfg, vec![seed_of(0, 1000)], Some(Duration::from_secs(3))).await;
    env.claims(30, 1).await;
    env.settle().await;
    let claims = env.list("nodeclaims");
    assert!(
        claims.len() < 30,
        "some claims timed out and were deleted ({} left)",
        claims.len()
    );
    assert!(!claims.is_empty());
    let live = env.machines_of("md-0").len() as i64;
    assert_eq!(
        env.replicas("md-0"),
        live,
        "replicas back to the live Machines"
    );
    assert_eq!(
        live as usize,
        claims.len(),
        "every live Machine belongs to a live claim"
    );
    env.invariants_hold();
    let text = env.metrics.encode();
    assert!(
        text.contains("karpenter_capi_nodeclaims_create_timeouts_total"),
        "{text}"
    );
}

#[actix::test]
async fn max_size_moves_claims_to_the_next_offering() {
    // md-0 is cheapest but holds 3; md-1 serves the same instance type at a higher price.
    let mut cheap = seed_of(0, 3);
    let mut dear = seed_of(1, 100);
    let labels =
        format!("{INSTANCE_TYPE_LABEL}=shared,{ZONE_LABEL}=z,{ARCH_LABEL}=amd64,{OS_LABEL}=linux");
    cheap
        .annotations
        .insert(LABELS_ANNOTATION.into(), labels.clone());
    dear.annotations.insert(LABELS_ANNOTATION.into(), labels);
    let env = env(cluster(CapiVersion::V1Beta2), vec![cheap, dear], None).await;
    let pool = env.pool.clone();
    env.sim
        .run(move |c| async move {
            let api: Api<NodeClaim> = Api::all(c.client());
            for _ in 0..6 {
                api.create(&Default::default(), &launch::claim_for(&pool, "shared"))
                    .await
                    .unwrap();
            }
        })
        .await
        .unwrap();
    env.settle().await;
    assert_eq!(
        env.replicas("md-0"),
        3,
        "the cheap MachineDeployment is filled to its max-size"
    );
    assert_eq!(env.replicas("md-1"), 3, "the rest go to the next offering");
    assert_eq!(env.list("nodeclaims").len(), 6);
    env.invariants_hold();
}

#[actix::test]
async fn deleting_a_claim_removes_only_its_machine() {
    let env = env(cluster(CapiVersion::V1Beta2), vec![seed_of(0, 10)], None).await;
    let names = env.claims(3, 1).await;
    env.settle().await;
    let victim = names[1].clone();
    let victim_machine = env
        .list("nodeclaims")
        .iter()
        .find(|c| c["metadata"]["name"] == victim.as_str())
        .and_then(|c| {
            c["metadata"]["annotations"][MACHINE_ANNOTATION]
                .as_str()
                .map(str::to_string)
        })
        .unwrap();
    let others: BTreeSet<String> = env
        .machines_of("md-0")
        .iter()
        .map(|m| format!("default/{}", m["metadata"]["name"].as_str().unwrap()))
        .filter(|k| *k != victim_machine)
        .collect();
    let client = env.sim.client_here().await.unwrap();
    Api::<NodeClaim>::all(client.clone())
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    env.settle().await;
    let left: BTreeSet<String> = env
        .machines_of("md-0")
        .iter()
        .map(|m| format!("default/{}", m["metadata"]["name"].as_str().unwrap()))
        .collect();
    assert_eq!(left, others, "only the deleted claim's Machine went");
    assert_eq!(env.replicas("md-0"), 2);
    assert!(
        !env.list("nodeclaims")
            .iter()
            .any(|c| c["metadata"]["name"] == victim.as_str())
    );
    // The release went through the annotation, never a blind decrement.
    let marked = env
        .sim
        .cluster()
        .stats()
        .writes()
        .iter()
        .filter(|w| {
            w.agent == karpenter_capi::app::USER_AGENT
                && w.resource == "machines"
                && format!("default/{}", w.name) == victim_machine
        })
        .count();
    assert!(
        marked >= 2,
        "bound, then annotated for deletion ({marked} writes)"
    );
    env.invariants_hold();
}

/// Most of a Machine's and a claim's updates on a slow API server are status (phase, nodeRef,
/// conditions) or metadata a plan does not read: their MachineDeployment's Scaler does not plan
/// again for them, only for a change it reads (issue 40: every event cost a full re-plan).
#[actix::test]
async fn status_and_unread_metadata_changes_cost_no_replan() {
    let env = env(cluster(CapiVersion::V1Beta2), vec![seed_of(0, 10)], None).await;
    let claims = env.claims(2, 1).await;
    env.settle().await;
    let machine = env.machines_of("md-0")[0]["metadata"]["name"]
        .as_str()
        .map(str::to_string)
        .expect("a Machine of md-0");
    let client = env.sim.client_here().await.expect("a client");
    let machines: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &env.sim.cluster().capi_version().machine(),
    );
    let nodeclaims: Api<NodeClaim> = Api::all(client);
    let replans = || {
        env.metrics
            .encode()
            .lines()
            .find(|l| {
                l.starts_with(
                    "karpenter_capi_scaler_replans_total{machine_deployment=\"default/md-0\"}",
                )
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = replans();
    let merge = |v: Value| Patch::Merge(v);
    for i in 0..5 {
        machines
            .patch_status(
                &machine,
                &PatchParams::default(),
                &merge(json!({"status": {"lastUpdated": format!("2026-01-01T00:00:0{i}Z")}})),
            )
            .await
            .expect("a Machine status update");
        nodeclaims
            .patch(
                &claims[0],
                &PatchParams::default(),
                &merge(json!({"metadata": {"labels": {"touched": i.to_string()}}})),
            )
            .await
            .expect("a claim label update");
        // Apart, so that each reaches the Scaler on its own (as on a slow server), not coalesced.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A change a plan reads: once its re-plan is counted, the updates before it were handled.
    machines
        .patch(
            &machine,
            &PatchParams::default(),
            &merge(json!({"metadata": {"annotations": {"touched": "1"}}})),
        )
        .await
        .expect("a Machine annotation update");
    env.until("the annotation's re-plan", |_| replans() > before)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The annotation's re-plan, and at most one resync.
    let made = replans() - before;
    assert!(made <= 2, "{made} re-plans for 10 updates no plan reads");
    env.invariants_hold();
}

#[actix::test]
async fn malformed_annotations_and_selectors_become_conditions_and_events() {
    // md-1 has a malformed CPU quantity, which refuses it; md-0 has a taint entry without an
    // effect, which is passed over (as Cluster Autoscaler passes it over) and leaves md-0
    // offered.
    let mut bad = seed_of(1, 10);
    bad.annotations.insert(CPU_ANNOTATION.into(), "four".into());
    let mut skipped = seed_of(0, 10);
    skipped
        .annotations
        .insert(TAINTS_ANNOTATION.into(), "dedicated=gpu".into());
    let env = env(cluster(CapiVersion::V1Beta2), vec![skipped, bad], None).await;

    // The NodeClass stays usable (md-0) and says nothing false; the refused MachineDeployment
    // is named in an Event with the annotation at fault, and so is md-0's ignored entry.
    let names = env.claims(1, 1).await;
    env.settle().await;
    assert_eq!(env.list("nodeclaims").len(), 1, "{names:?}");
    assert_eq!(env.machines_of("md-0").len(), 1, "md-0 is still offered");
    assert_eq!(env.replicas("md-0"), 1);
    let nc = env
        .list("clusterapinodeclasses")
        .into_iter()
        .next()
        .unwrap();
    assert!(condition(&nc, "Ready"), "{nc:#}");
    let notes: Vec<String> = env
        .list("events.events.k8s.io")
        .iter()
        .filter(|e| e["reason"] == "InvalidMachineDeployment")
        .filter_map(|e| e["note"].as_str().map(str::to_string))
        .collect();
    // (A start may also report a group once as "its infrastructure template has not been read
    // yet", which says nothing of its annotations: those notes are not counted here.)
    let refused: Vec<&String> = notes
        .iter()
        .filter(|n| n.contains("default/md-1") && n.contains("malformed annotation"))
        .collect();
    assert_eq!(refused.len(), 1, "{notes:#?}");
    assert!(
        refused[0].contains(&format!(
            "malformed annotation: annotation {CPU_ANNOTATION}: value \"four\""
        )),
        "{}",
        refused[0]
    );
    let ignored: Vec<&String> = notes
        .iter()
        .filter(|n| n.contains("default/md-0") && n.contains(TAINTS_ANNOTATION))
        .collect();
    assert_eq!(ignored.len(), 1, "{notes:#?}");
    assert!(
        ignored[0].contains(&format!(
            "annotation {TAINTS_ANNOTATION}: \"dedicated=gpu\" ignored: "
        )),
        "{}",
        ignored[0]
    );
    // md-0 is never refused.
    assert!(
        !notes
            .iter()
            .any(|n| n.contains("default/md-0") && n.contains("malformed annotation")),
        "{notes:#?}"
    );
    // The Ready message says both.
    let message = nc
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default();
    assert!(
        message.contains("left out: ")
            && message.contains("default/md-1")
            && message.contains("ignored: ")
            && message.contains("default/md-0"),
        "{message}"
    );
    // The node carries no taint from the ignored entry.
    let node = env.list("nodes").into_iter().next().expect("md-0's node");
    let taints = node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !taints.iter().any(|t| t["key"] == "dedicated"),
        "{taints:#?}"
    );

    // A NodeClass whose selector is malformed is not Ready, and says which field.
    let client = env.sim.client_here().await.unwrap();
    let api: Api<karpenter_capi::api::nodeclass::ClusterAPINodeClass> = Api::all(client);
    let broken: karpenter_capi::api::nodeclass::ClusterAPINodeClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.cluster.x-k8s.io/v1alpha1", "kind": "ClusterAPINodeClass",
        "metadata": {"name": "broken"},
        "spec": {"scalableResourceSelector": {"matchExpressions": [{"key": "a", "operator": "Near", "values": ["b"]}]}}
    }))
    .unwrap();
    api.create(&Default::default(), &broken).await.unwrap();
    let start = std::time::Instant::now();
    loop {
        let nc = env
            .list("clusterapinodeclasses")
            .into_iter()
            .find(|n| n["metadata"]["name"] == "broken")
            .unwrap();
        let ready = nc
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready").cloned());
        if let Some(r) = ready {
            assert_eq!(r["status"], "False");
            assert!(
                r["message"]
                    .as_str()
                    .unwrap()
                    .contains("spec.scalableResourceSelector"),
                "{r:#}"
            );
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no Ready condition on the broken NodeClass"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.invariants_hold();
}

#[actix::test]
async fn faults_errors_conflicts_and_watch_cuts_leak_nothing() {
    let seeds = (0..3).map(|i| seed_of(i, 1000)).collect();
    let env = env(cluster(CapiVersion::V1Beta2), seeds, None).await;
    // The claims are created cleanly; the controller then works through the faults.
    env.claims(90, 3).await;
    let faults = env.sim.cluster().server().faults();
    for resource in ["machines", "machinedeployments", "nodeclaims", "nodes"] {
        faults.set_error_rate(resource, 0.1);
        faults.set_conflict_rate(resource, 0.1);
        faults.set_latency(resource, Duration::from_millis(5));
    }
    faults.set_watch_cut_every(Some(Duration::from_millis(700)));
    // Let the faults bite while the burst is in flight, then let the cluster settle cleanly.
    tokio::time::sleep(Duration::from_secs(4)).await;
    faults.clear();
    env.settle().await;
    for md in ["md-0", "md-1", "md-2"] {
        assert_eq!(env.machines_of(md).len(), 30, "{md}");
        assert_eq!(env.replicas(md), 30, "{md}");
    }
    let inv = env.invariants_hold();
    assert_eq!(inv.bound, 90);
    let conflicts = env.metrics.encode();
    assert!(
        conflicts.contains("karpenter_capi_replica_writes_total"),
        "{conflicts}"
    );
}

/// A registered Node that is not Ready yet leaves its claim `Initialized=Unknown` with
/// upstream's reason, so `kubectl get nodeclaim` says why it waits.
#[actix::test]
async fn a_node_not_ready_after_registration_says_why_it_is_not_initialized() {
    let cfg = SimClusterConfig {
        node_ready_delay: Duration::from_secs(600),
        ..cluster(CapiVersion::V1Beta2)
    };
    let env = env(cfg, vec![seed_of(0, 10)], None).await;
    let names = env.claims(1, 1).await;
    let start = std::time::Instant::now();
    let initialized = loop {
        let found = env
            .list("nodeclaims")
            .into_iter()
            .find(|c| c["metadata"]["name"] == names[0].as_str())
            .filter(|c| condition(c, "Registered"))
            .and_then(|c| {
                c["status"]["conditions"]
                    .as_array()
                    .and_then(|cs| cs.iter().find(|x| x["type"] == "Initialized").cloned())
                    .filter(|x| x["reason"] == "NodeNotReady")
            });
        if let Some(x) = found {
            break x;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no Initialized=Unknown/NodeNotReady: {:#?}",
            env.list("nodeclaims")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(initialized["status"], "Unknown", "{initialized:#}");
}

/// Upstream's `InsufficientCapacityError` on the pods (kubernetes-sigs/karpenter#3143): a claim
/// whose Machine never gets a provider ID times out, and each pod a solve planned onto it is
/// told so, naming the claim and why, besides the claim's own `CreateTimeout`.
#[actix::test]
async fn a_launch_that_times_out_is_told_to_the_pods_waiting_for_it() {
    let mut cfg = cluster(CapiVersion::V1Beta2);
    cfg.fail_fraction = 1.0;
    let env = env(cfg, vec![seed_of(0, 10)], Some(Duration::from_secs(2))).await;
    env.deployment(
        "waits",
        2,
        karpenter_capi::sim::cluster::PodShape::new("100m", "128Mi"),
    )
    .await;
    let told = env
        .served_events_about("InsufficientCapacityError", "Pod", 2)
        .await;
    for e in &told {
        let note = e["note"].as_str().unwrap_or_default();
        assert!(
            note.starts_with("NodeClaim ")
                && note.contains(", nominated for this pod, failed to launch: ")
                && note
                    .contains("got no provider ID within 2s from MachineDeployment default/md-0"),
            "{note}"
        );
        assert_eq!(e["type"], "Warning");
    }
    let pods: std::collections::BTreeSet<&str> = told
        .iter()
        .filter_map(|e| e["regarding"]["name"].as_str())
        .collect();
    assert_eq!(pods.len(), 2, "each waiting pod is told: {told:#?}");
}
