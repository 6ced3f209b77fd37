//! Pending pods to nodes through the whole product on the simulated cluster: the provisioner's
//! batching and packing, NodePool limits and status, Events for pods that cannot be placed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::resources::{Quantity, Resources};
use karpenter_capi::sim::cluster::{PodShape, SimClusterConfig};
use karpenter_capi::simulate::launch;
use karpenter_capi::simulate::pods::{SHAPES, seed_of};

use crate::common::claims::notes_about;
use crate::common::{DEADLINE, Env};

fn cluster() -> SimClusterConfig {
    SimClusterConfig {
        provider_delay: Duration::from_millis(30),
        jitter: Duration::from_millis(30),
        node_ready_delay: Duration::from_millis(30),
        node_delete_delay: Duration::from_millis(20),
        ..SimClusterConfig::default()
    }
}

/// Four MachineDeployment sizes, a NodeClass and the default NodePool (optionally with limits),
/// and the controller with short batching windows.
async fn env(limits: Option<Value>) -> Env {
    env_with(limits, |_| {}).await
}

/// [`env`], with the controller's settings edited.
async fn env_with(
    limits: Option<Value>,
    edit: impl FnOnce(&mut karpenter_capi::actors::Settings),
) -> Env {
    env_in(cluster(), limits, edit).await
}

/// [`env_with`] on a cluster of its own configuration.
async fn env_in(
    cluster: SimClusterConfig,
    limits: Option<Value>,
    edit: impl FnOnce(&mut karpenter_capi::actors::Settings),
) -> Env {
    let mut builder = Env::builder()
        .cluster(cluster)
        .seeds((0..4).map(|i| seed_of(i, 500)).collect())
        .short_batches()
        .tune(edit);
    if let Some(limits) = limits {
        builder = builder.limits(limits);
    }
    builder.start().await
}

impl Env {
    fn nodepool(&self) -> Value {
        self.list("nodepools")
            .into_iter()
            .next()
            .expect("the NodePool")
    }
}

fn condition(obj: &Value, ty: &str) -> Option<Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == ty).cloned())
}

#[actix::test]
async fn five_hundred_mixed_pods_are_all_bound_within_limits() {
    let env = env(Some(
        json!({"cpu": "400", "memory": "2000Gi", "nodes": "200"}),
    ))
    .await;
    for (i, (cpu, mem)) in SHAPES.iter().enumerate() {
        env.deployment(&format!("app-{i}"), 100, PodShape::new(cpu, mem))
            .await;
    }
    env.until_quiet("500 pods bound", |e| e.bound_pods() == 500)
        .await;
    env.invariants_hold();

    // Every pod on a node whose allocatable holds the requests bound to it.
    let nodes: BTreeMap<String, Resources> = env
        .list("nodes")
        .iter()
        .map(|n| {
            let a: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> =
                serde_json::from_value(n["status"]["allocatable"].clone()).unwrap();
            (
                n["metadata"]["name"].as_str().unwrap().to_string(),
                Resources::from_k8s(&a).unwrap(),
            )
        })
        .collect();
    let mut used: BTreeMap<String, Resources> = BTreeMap::new();
    for p in env.list("pods") {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(p).unwrap();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
        let r = karpenter_capi::scheduling::pod::pod_requests(pod.spec.as_ref().unwrap()).unwrap();
        used.entry(node).or_default().add_assign(&r);
    }
    let (mut cpu_used, mut cpu_total) = (0.0, 0.0);
    for (node, u) in &used {
        assert!(
            u.fits(&nodes[node]),
            "{node} overcommitted: {u:?} > {:?}",
            nodes[node]
        );
        cpu_used += u.get("cpu").as_f64();
    }
    for a in nodes.values() {
        cpu_total += a.get("cpu").as_f64();
    }
    assert!(
        cpu_used / cpu_total > 0.5,
        "packing leaves most CPU idle: {cpu_used} of {cpu_total}"
    );

    // The NodePool's status stays within its limits and counts its nodes.
    env.until_quiet("NodePool status", |e| {
        e.nodepool()["status"]["nodes"].as_i64() == Some(e.list("nodeclaims").len() as i64)
    })
    .await;
    let np = env.nodepool();
    let cpu: Quantity = np["status"]["resources"]["cpu"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(cpu <= "400".parse().unwrap(), "cpu {cpu} over the limit");
    assert_eq!(condition(&np, "Ready").unwrap()["status"], "True", "{np:#}");
    let text = env.metrics.encode();
    assert!(
        text.contains(
            "karpenter_nodeclaims_created_total{reason=\"provisioning\",nodepool=\"default\",min_values_relaxed=\"false\"}"
        ),
        "{text}"
    );
    let value = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(
        value("karpenter_pods_startup_duration_seconds_count") > 0.0,
        "{text}"
    );
    assert!(
        value("karpenter_scheduler_scheduling_duration_seconds_count") > 0.0,
        "{text}"
    );
    assert!(
        value("karpenter_nodepools_usage{nodepool=\"default\",resource_type=\"cpu\"}") > 0.0,
        "{text}"
    );
}

/// One pod selecting `key=value` next to two plain ones: once the plain ones are bound, the
/// FailedScheduling notes on the selecting pod (its Deployment is `name`).
async fn notes_for_a_pod_selecting(env: &Env, name: &str, key: &str, value: &str) -> Vec<String> {
    let mut shape = PodShape::new("100m", "128Mi");
    shape.node_selector.insert(key.into(), value.into());
    env.deployment(name, 1, shape).await;
    env.deployment("fine", 2, PodShape::new("100m", "128Mi"))
        .await;
    env.until_quiet("the good pods bound and an event for the other", |e| {
        e.bound_pods() == 2 && !e.events("FailedScheduling").is_empty()
    })
    .await;
    notes_about(&env.events("FailedScheduling"), name)
}

/// A pod the solve puts on a claim whose node is still coming up is nominated to it
/// (upstream's `Nominated` Event, as is the pod the claim was created for) and gets no claim of
/// its own.
#[actix::test]
async fn a_pod_placed_on_an_in_flight_claim_is_nominated_to_it() {
    // Long enough that the node is still not Ready when the second pod's solve runs, however
    // loaded the machine: a Ready node would take the pod through the scheduler, unnominated.
    let slow = SimClusterConfig {
        node_ready_delay: Duration::from_secs(20),
        ..cluster()
    };
    let env = env_in(slow, None, |_| {}).await;
    env.deployment("first", 1, PodShape::new("100m", "128Mi"))
        .await;
    // Launched (its allocatable known), its node not Ready yet.
    let start = Instant::now();
    while !env
        .list("nodeclaims")
        .iter()
        .any(|c| c.pointer("/status/allocatable").is_some())
    {
        assert!(start.elapsed() < DEADLINE, "no launched claim");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.deployment("second", 1, PodShape::new("100m", "128Mi"))
        .await;
    env.until_quiet("both pods bound", |e| e.bound_pods() == 2)
        .await;
    let claims = env.list("nodeclaims");
    assert_eq!(claims.len(), 1, "the second pod got no claim of its own");
    let claim = claims[0]["metadata"]["name"].as_str().unwrap_or_default();
    let nominated = |prefix: &str| notes_about(&env.events("Nominated"), prefix);
    let want = format!("Pod should schedule on: nodeclaim/{claim}");
    assert_eq!(nominated("first-"), vec![want.clone()]);
    // Before its Node registered the claim alone, after it the claim and the Node.
    let second = nominated("second-");
    assert_eq!(second.len(), 1, "{second:?}");
    assert!(second[0].starts_with(&want), "{second:?}");
    env.invariants_hold();
}

#[actix::test]
async fn a_pod_no_nodepool_can_serve_gets_an_event() {
    let env = env(None).await;
    let notes = notes_for_a_pod_selecting(&env, "orphan", "example.com/team", "nobody").await;
    assert!(!notes.is_empty(), "no event for the orphan");
    env.invariants_hold();
}

#[actix::test]
async fn a_pod_pinned_to_a_hostname_is_told_the_label_is_restricted() {
    let env = env(None).await;
    let notes =
        notes_for_a_pod_selecting(&env, "pinned", "kubernetes.io/hostname", "red-node").await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("label \"kubernetes.io/hostname\" is restricted")),
        "{notes:#?}"
    );
    // No claim was made for it.
    for c in env.list("nodeclaims") {
        let reqs = c["spec"]["requirements"].to_string();
        assert!(!reqs.contains("red-node"), "{c:#}");
    }
    env.invariants_hold();
}

/// A MachineDeployment without a zone label makes nodes without one, so a pod that requires a
/// zone none is in is never planned onto it (its instance type requires the zone label absent):
/// the pod gets a FailedScheduling Event naming the zone, no claim and no nomination, even though
/// the zone-less group is the cheapest (the malformed corpus's `pod-zone-nowhere` was sometimes
/// nominated onto a claim of such a group).
#[actix::test]
async fn a_pod_requiring_a_zone_is_not_planned_onto_a_zone_less_group() {
    use karpenter_capi::api::wellknown::{
        ARCH_LABEL, CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, LABELS_ANNOTATION, OS_LABEL,
        PRICE_ANNOTATION, ZONE_LABEL,
    };
    let mut zoneless = seed_of(0, 500);
    zoneless.name = "md-zoneless".into();
    zoneless.annotations.insert(
        LABELS_ANNOTATION.into(),
        format!(
            "{INSTANCE_TYPE_LABEL}=zoneless,{ARCH_LABEL}=amd64,{OS_LABEL}=linux,\
             {CAPACITY_TYPE_LABEL}=on-demand"
        ),
    );
    zoneless
        .annotations
        .insert(PRICE_ANNOTATION.into(), "0.01".into());
    let mut seeds: Vec<_> = (0..4).map(|i| seed_of(i, 500)).collect();
    seeds.push(zoneless);
    let env = Env::builder()
        .cluster(cluster())
        .seeds(seeds)
        .short_batches()
        .start()
        .await;
    let notes = notes_for_a_pod_selecting(&env, "nowhere", ZONE_LABEL, "nowhere").await;
    assert!(notes.iter().any(|n| n.contains(ZONE_LABEL)), "{notes:#?}");
    let nominated = notes_about(&env.events("Nominated"), "nowhere-");
    assert!(nominated.is_empty(), "{nominated:#?}");
    for c in env.list("nodeclaims") {
        let reqs = c["spec"]["requirements"].to_string();
        assert!(!reqs.contains("\"nowhere\""), "{c:#}");
    }
    // The zone-less group is offered: the plain pods went there, the cheapest.
    assert!(env.replicas("md-zoneless") >= 1);
    env.invariants_hold();
}

#[actix::test]
async fn an_invalid_nodepool_is_not_ready_and_not_used() {
    let env = env(None).await;
    env.sim
        .run(|c| async move {
            let api: Api<NodePool> = Api::all(c.client());
            let np: NodePool = serde_json::from_value(json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "broken"},
                // A budget schedule that is no cron schedule (minute 61): the CRD's pattern
                // lets it through on a real API server too, the controller refuses it.
                "spec": {"weight": 100, "template": {"spec": {
                    "requirements": [],
                    "nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}
                }}, "disruption": {"budgets": [{"nodes": "10%", "schedule": "61 * * * *", "duration": "1h"}]}}
            }))
            .unwrap();
            api.create(&PostParams::default(), &np).await.unwrap();
        })
        .await
        .unwrap();
    env.until_quiet("broken NodePool not ready", |e| {
        e.list("nodepools").iter().any(|np| {
            np["metadata"]["name"] == "broken"
                && condition(np, "Ready").is_some_and(|c| c["status"] == "False")
        })
    })
    .await;
    let broken = env
        .list("nodepools")
        .into_iter()
        .find(|np| np["metadata"]["name"] == "broken")
        .unwrap();
    let v = condition(&broken, "ValidationSucceeded").unwrap();
    assert_eq!(v["status"], "False");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("budgets[0].schedule"),
        "{v:#}"
    );
    env.deployment("app", 3, PodShape::new("100m", "128Mi"))
        .await;
    env.until_quiet("pods bound through the valid pool", |e| e.bound_pods() == 3)
        .await;
    assert!(
        env.list("nodeclaims")
            .iter()
            .all(|c| c["metadata"]["labels"]["karpenter.sh/nodepool"] == "default")
    );
}

/// An env whose controller runs with a default zonal spread (`--scheduler-config`).
async fn env_with_zonal_default() -> Env {
    use karpenter_capi::scheduling::default_spread::DefaultConstraints;
    let defaults = DefaultConstraints::parse(
        "podTopologySpread:\n  defaultConstraints:\n    - maxSkew: 1\n      topologyKey: topology.kubernetes.io/zone\n      whenUnsatisfiable: DoNotSchedule\n",
    )
    .unwrap();
    env_with(None, |s| s.default_constraints = defaults).await
}

/// Three small pods labelled `app=web`, controlled by `owner` (apiVersion, kind, name, uid):
/// they would share one node. Created once the workload watch has seen what selects them, so
/// the first solve already spreads them.
async fn three_web_pods(env: &Env, owner: Value) {
    let probe: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "probe", "namespace": launch::NAMESPACE,
            "labels": {"app": "web"}, "ownerReferences": [owner.clone()],
        },
    }))
    .unwrap();
    env.until_quiet("the workload watch to see the selector", |e| {
        let workloads = e.controller().shared.state.workloads.read().selectors();
        workloads.deduce(&probe).is_some()
    })
    .await;
    env.sim
        .run(move |c| async move {
            let pods: Api<k8s_openapi::api::core::v1::Pod> =
                Api::namespaced(c.client(), launch::NAMESPACE);
            for i in 0..3 {
                let pod = json!({
                    "metadata": {
                        "name": format!("web-{i}"),
                        "labels": {"app": "web"},
                        "ownerReferences": [owner],
                    },
                    "spec": {"containers": [{
                        "name": "c", "image": "web",
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                    }]},
                });
                pods.create(
                    &PostParams::default(),
                    &serde_json::from_value(pod).unwrap(),
                )
                .await
                .unwrap();
            }
        })
        .await
        .unwrap();
}

/// Once the three pods are bound: three claims, each in its own single zone.
async fn assert_one_claim_per_zone(env: &Env) {
    env.until_quiet("the three pods bound", |e| e.bound_pods() == 3)
        .await;
    let zone_of = |c: &Value| {
        c["spec"]["requirements"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["key"] == "topology.kubernetes.io/zone")
            .map(|r| r["values"].to_string())
    };
    let claims = env.list("nodeclaims");
    let zones: std::collections::BTreeSet<Option<String>> = claims.iter().map(zone_of).collect();
    assert_eq!(claims.len(), 3, "one claim per pod");
    assert_eq!(zones.len(), 3, "one zone per claim: {zones:?}");
    assert!(
        zones
            .iter()
            .all(|z| z.as_ref().is_some_and(|z| !z.contains(','))),
        "{zones:?}"
    );
    env.invariants_hold();
}

/// `--scheduler-config` default constraints through the whole product: the workload watch
/// finds the ReplicaSet whose selector the pods' default zonal spread is given.
#[actix::test]
async fn default_spread_constraints_spread_a_replica_sets_pods_over_the_zones() {
    let env = env_with_zonal_default().await;
    let uid = env
        .sim
        .run(|c| async move {
            let sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
                Api::namespaced(c.client(), launch::NAMESPACE);
            let rs = json!({
                "metadata": {"name": "web"},
                "spec": {
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "c", "image": "web"}]},
                    },
                },
            });
            sets.create(&PostParams::default(), &serde_json::from_value(rs).unwrap())
                .await
                .unwrap()
                .metadata
                .uid
        })
        .await
        .unwrap();
    three_web_pods(
        &env,
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": uid, "controller": true}),
    )
    .await;
    assert_one_claim_per_zone(&env).await;
}

/// A Job adds no selector, but the Service selecting its pods does (through the Service watch).
#[actix::test]
async fn default_spread_constraints_spread_a_services_pods_over_the_zones() {
    let env = env_with_zonal_default().await;
    env.sim
        .run(|c| async move {
            let services: Api<k8s_openapi::api::core::v1::Service> =
                Api::namespaced(c.client(), launch::NAMESPACE);
            let svc = json!({
                "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
            });
            services
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(svc).unwrap(),
                )
                .await
                .unwrap();
        })
        .await
        .unwrap();
    three_web_pods(
        &env,
        json!({"apiVersion": "batch/v1", "kind": "Job", "name": "web", "uid": "9d1c2f64-7a53-4b0e-8f3e-2a6b3c4d5e6f", "controller": true}),
    )
    .await;
    assert_one_claim_per_zone(&env).await;
}

/// The provisioner creates a claim already launched: the finalizer, the chosen MachineDeployment
/// and the offering's labels are in the create, and the controller's only metadata write to the
/// claim afterwards is its Machine's key (issue 12's writes per claim).
#[actix::test]
async fn a_provisioned_claim_is_created_with_its_launch_decision() {
    let env = env(None).await;
    env.deployment("one", 1, PodShape::new("100m", "128Mi"))
        .await;
    env.until_quiet("the pod bound", |e| e.bound_pods() == 1)
        .await;
    let claims = env.list("nodeclaims");
    let [claim] = claims.as_slice() else {
        panic!("one claim: {claims:#?}");
    };
    assert!(
        claim["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == "karpenter.sh/termination")),
        "{claim:#}"
    );
    assert!(
        claim["metadata"]["annotations"]["karpenter.cluster.x-k8s.io/machine-deployment"]
            .is_string(),
        "{claim:#}"
    );
    let name = claim["metadata"]["name"].as_str().unwrap_or_default();
    let patches: Vec<String> = env
        .sim
        .cluster()
        .stats()
        .writes()
        .into_iter()
        .filter(|w| w.agent == karpenter_capi::app::USER_AGENT && w.name == name)
        .map(|w| w.target())
        .filter(|t| t == "patch nodeclaims")
        .collect();
    assert_eq!(patches.len(), 1, "only the Machine's key: {patches:?}");
}

/// Pending pods solved again while the claims made for them are still launching (a slow
/// provider) get no claim of their own: each goes back to the claim it was planned onto, and a
/// new pod that fits takes the room those claims have left. Every claim the first solve made
/// gets a pod, and no other claim is made.
#[actix::test]
async fn solving_pending_pods_again_before_their_claims_launch_makes_no_claim() {
    // Slow enough that no claim launches before the last solve below, however loaded the
    // machine running the test is.
    let slow = SimClusterConfig {
        provider_delay: Duration::from_secs(30),
        jitter: Duration::ZERO,
        ..cluster()
    };
    let env = env_in(slow, None, |_| {}).await;
    for (i, (cpu, mem)) in SHAPES.iter().enumerate() {
        env.deployment(&format!("app-{i}"), 8, PodShape::new(cpu, mem))
            .await;
    }
    // The first solve's claims: some made, and no more for two seconds (the batch window is
    // one second of quiet). Nominated Events cannot tell when it is done: they are rate-limited.
    let mut planned = 0;
    let mut since = Instant::now();
    while planned == 0 || since.elapsed() < Duration::from_secs(2) {
        let n = env.list("nodeclaims").len();
        if n != planned {
            (planned, since) = (n, Instant::now());
        }
        assert!(since.elapsed() < DEADLINE, "no claim made");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(planned > 1, "{planned} claims");
    let launched = |e: &Env| {
        e.list("nodeclaims")
            .iter()
            .any(|c| c.pointer("/status/providerID").is_some())
    };
    assert!(!launched(&env), "a claim launched before the second solve");
    // Two more solves over the same pending pods, each woken by a small pod that fits.
    for name in ["late-a", "late-b"] {
        env.deployment(name, 1, PodShape::new("10m", "16Mi")).await;
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    assert!(!launched(&env), "a claim launched before the last solve");
    env.until_quiet("every pod bound", |e| e.bound_pods() == 42)
        .await;
    let claims = env.list("nodeclaims");
    assert_eq!(claims.len(), planned, "claims made twice for the same pods");
    let with_pods: std::collections::BTreeSet<String> = env
        .list("pods")
        .iter()
        .filter_map(|p| p.pointer("/spec/nodeName")?.as_str().map(str::to_string))
        .collect();
    for c in &claims {
        let node = c.pointer("/status/nodeName").and_then(Value::as_str);
        assert!(
            node.is_some_and(|n| with_pods.contains(n)),
            "claim {} got no pod",
            c["metadata"]["name"]
        );
    }
    let text = env.metrics.encode();
    assert!(
        text.contains("karpenter_capi_extra_nodeclaims_total 0"),
        "{text}"
    );
    env.invariants_hold();
}
