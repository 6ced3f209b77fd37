//! CapacityBuffers through the whole product on the simulated cluster: a buffer's placeholder
//! pods make the controller launch headroom that pods arriving later bind to without waiting for
//! a launch, the buffer is provisioned again once they take it, a `scalableRef` buffer follows
//! its Deployment's size, and a buffer naming a missing PodTemplate is reported (condition and
//! Event naming the field) without touching anything else.

use std::time::Duration;

use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use karpenter_capi::api::capacity_buffer::CapacityBuffer;
use karpenter_capi::sim::cluster::PodShape;
use karpenter_capi::simulate::launch;
use karpenter_capi::simulate::pods::seed_of;

use karpenter_capi::cli::{Scenario, SimulateArgs};

use crate::autoscaler::cluster;
use crate::common::buffers::{self, buffer_status, condition_of, create, create_buffer, template};
use crate::common::{Env, condition, scenario};

const NS: &str = launch::NAMESPACE;

async fn env() -> Env {
    Env::builder()
        .cluster(cluster())
        .seeds((0..4).map(|i| seed_of(i, 50)).collect())
        .short_batches()
        .tune(|s| s.capacity_buffers = true)
        .start()
        .await
}

fn shape() -> PodShape {
    PodShape::new("1", "1Gi")
}

async fn deployment(env: &Env, name: &str, replicas: usize) {
    let name = name.to_string();
    env.sim
        .run(move |c| async move {
            c.create_deployment(NS, &name, replicas, &shape())
                .await
                .expect("a Deployment")
        })
        .await
        .expect("the simulated cluster");
}

fn initialized_nodes(env: &Env) -> Vec<String> {
    env.list("nodeclaims")
        .iter()
        .filter(|c| condition(c, "Initialized").is_some_and(|i| i["status"] == "True"))
        .filter_map(|c| c["status"]["nodeName"].as_str().map(String::from))
        .collect()
}

fn nodes_of_pods(env: &Env, app: &str) -> Vec<Option<String>> {
    env.list("pods")
        .iter()
        .filter(|p| p["metadata"]["labels"]["app"] == app)
        .map(|p| p["spec"]["nodeName"].as_str().map(String::from))
        .collect()
}

/// Two chunks of 1 CPU are held on launched capacity before any pod asks; two pods of that size
/// bind to it at once (on the node launched for the buffer, with no claim made for them), and
/// the buffer is provisioned again on a new claim.
#[actix::test]
async fn pods_that_arrive_within_the_buffer_bind_on_its_capacity_and_it_refills() {
    let env = env().await;
    create(&env, template("chunk")).await;
    create_buffer(
        &env,
        "headroom",
        json!({"podTemplateRef": {"name": "chunk"}, "replicas": 2}),
    )
    .await;
    env.until_quiet("the buffer's capacity launched and fits", |e| {
        !initialized_nodes(e).is_empty()
            && condition_of(e, "headroom", "Provisioning").is_some_and(|c| c.0 == "True")
    })
    .await;
    let status = buffer_status(&env, "headroom");
    assert_eq!(status["replicas"], 2);
    assert_eq!(status["podTemplateRef"]["name"], "chunk");
    assert_eq!(
        status["provisioningStrategy"],
        "buffer.x-k8s.io/active-capacity"
    );
    let ready =
        condition_of(&env, "headroom", "ReadyForProvisioning").expect("ReadyForProvisioning");
    assert_eq!((ready.0.as_str(), ready.1.as_str()), ("True", "Resolved"));
    let buffer_nodes = initialized_nodes(&env);
    let claims_before = env.list("nodeclaims").len();
    assert!(
        env.list("pods").is_empty(),
        "placeholders are never written to the cluster"
    );

    deployment(&env, "web", 2).await;
    env.until("both pods bound", |e| {
        let on = nodes_of_pods(e, "web");
        on.len() == 2 && on.iter().all(Option::is_some)
    })
    .await;
    for node in nodes_of_pods(&env, "web").into_iter().flatten() {
        assert!(
            buffer_nodes.contains(&node),
            "{node} was not launched for the buffer ({buffer_nodes:?})"
        );
    }
    assert!(
        env.events("Nominated").is_empty(),
        "the pods needed no plan: they bound on the buffer's room"
    );

    env.until_quiet("the buffer refilled on new capacity", |e| {
        e.list("nodeclaims").len() > claims_before
            && condition_of(e, "headroom", "Provisioning").is_some_and(|c| c.0 == "True")
    })
    .await;
    env.assert_clean();
}

/// A `scalableRef` buffer is a percentage of its Deployment, rounded up, and follows it when
/// the Deployment scales.
#[actix::test]
async fn a_scalable_ref_buffer_follows_its_deployment() {
    let env = env().await;
    deployment(&env, "api", 3).await;
    create_buffer(&env, "api-headroom", json!({"scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "api"}, "percentage": 50})).await;
    env.until("2 chunks (50% of 3, rounded up)", |e| {
        buffer_status(e, "api-headroom")["replicas"] == 2
    })
    .await;
    env.sim
        .run(|c| async move { c.scale_deployment(NS, "api", 8).await.expect("scale") })
        .await
        .expect("the simulated cluster");
    env.until("4 chunks (50% of 8)", |e| {
        buffer_status(e, "api-headroom")["replicas"] == 4
    })
    .await;
    assert!(
        buffer_status(&env, "api-headroom")["podTemplateRef"].is_null(),
        "a scalableRef buffer names no PodTemplate"
    );
}

/// A buffer naming a PodTemplate that does not exist is not ready, with a condition and a
/// Warning Event naming `spec.podTemplateRef`; nothing launches for it and a pod still
/// provisions. Once the template exists the buffer is provisioned (on both backends in
/// `tests/control_plane/provisioning.rs`).
#[actix::test]
async fn a_buffer_naming_a_missing_template_is_reported_and_nothing_else_is_affected() {
    let env = env().await;
    buffers::a_buffer_naming_a_missing_template_is_reported(&env).await;
    env.assert_clean();
}

/// `simulate --scenario buffer`: with launches slow (a 2 s provider delay), every pod of the
/// burst that arrives within the buffer is bound before any launch made after it arrived, and
/// the buffer is provisioned again behind it.
#[actix::test]
async fn the_buffer_scenario_binds_its_burst_before_any_launch() {
    let args = SimulateArgs {
        pods: 20,
        provider_delay: Duration::from_secs(2),
        ..scenario(Scenario::Buffer)
    };
    let (report, _kept) = karpenter_capi::simulate::buffer::run_kept(&args)
        .await
        .expect("the scenario runs");
    let b = &report.buffer;
    assert!(report.pods.launch.invariants_ok, "{report}");
    assert_eq!(b.replicas, 20);
    assert!(b.nodes_for_buffer > 0, "{report}");
    assert_eq!(b.bound_before_a_launch, 20, "{report}");
    assert!(b.refill_claims > 0, "{report}");
    assert_eq!(b.provisioning_at_end, "True");
}

/// Upstream's "should not provision buffer capacity beyond NodePool CPU limit" and "should
/// respect nodeSelector from PodTemplate": a buffer of twenty 1-CPU chunks that must land on
/// `large` (8-CPU) nodes, under a NodePool limit of 8 CPUs, gets one such node and no more, and
/// says it needs new capacity.
#[actix::test]
async fn a_buffer_is_placed_as_its_template_says_and_within_the_pools_limits() {
    let env = Env::builder()
        .cluster(cluster())
        .seeds((0..4).map(|i| seed_of(i, 50)).collect())
        .short_batches()
        .limits(json!({"cpu": "8"}))
        .tune(|s| s.capacity_buffers = true)
        .start()
        .await;
    let mut t = template("pinned");
    t["template"]["spec"]["nodeSelector"] =
        json!({karpenter_capi::api::wellknown::INSTANCE_TYPE_LABEL: "large"});
    create(&env, t).await;
    create_buffer(
        &env,
        "big",
        json!({"podTemplateRef": {"name": "pinned"}, "replicas": 20}),
    )
    .await;
    env.until_quiet("one node launched and the buffer short of room", |e| {
        !initialized_nodes(e).is_empty()
            && condition_of(e, "big", "Provisioning")
                .is_some_and(|c| c.0 == "False" && c.1 == "RequiresNewCapacity")
    })
    .await;
    let claims = env.list("nodeclaims");
    assert_eq!(claims.len(), 1, "8 CPUs hold one large node: {claims:#?}");
    let node = env
        .get("nodes", "", &initialized_nodes(&env)[0])
        .expect("the node");
    assert_eq!(
        node["metadata"]["labels"][karpenter_capi::api::wellknown::INSTANCE_TYPE_LABEL],
        "large"
    );
    env.assert_clean();
}

/// A `scalableRef` this provider cannot read (another kind or group) or that does not exist is
/// not ready, naming `spec.scalableRef`; a buffer's size follows its spec down and up.
#[actix::test]
async fn scalable_refs_it_cannot_read_are_named_and_sizes_follow_the_spec() {
    let env = env().await;
    create_buffer(
        &env,
        "jobs",
        json!({"scalableRef": {"apiGroup": "batch", "kind": "Job", "name": "j"}, "replicas": 1}),
    )
    .await;
    create_buffer(&env, "ghost", json!({"scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "none"}, "replicas": 1})).await;
    env.until("both named as not ready", |e| {
        let jobs = condition_of(e, "jobs", "ReadyForProvisioning");
        let ghost = condition_of(e, "ghost", "ReadyForProvisioning");
        jobs.is_some_and(|c| c.1 == "ResolutionFailed" && c.2.starts_with("spec.scalableRef"))
            && ghost.is_some_and(|c| {
                c.1 == "ScalableRefNotFound" && c.2.starts_with("spec.scalableRef")
            })
    })
    .await;

    create(&env, template("chunk")).await;
    create_buffer(
        &env,
        "sized",
        json!({"podTemplateRef": {"name": "chunk"}, "replicas": 3}),
    )
    .await;
    env.until("3 chunks", |e| buffer_status(e, "sized")["replicas"] == 3)
        .await;
    let api: Api<CapacityBuffer> = Api::namespaced(env.client().await, NS);
    for (spec, want) in [
        (json!({"spec": {"replicas": 1}}), 1),
        (json!({"spec": {"replicas": 10, "limits": {"cpu": "5"}}}), 5),
    ] {
        api.patch("sized", &PatchParams::default(), &Patch::Merge(spec))
            .await
            .expect("patch the buffer");
        env.until(&format!("{want} chunks"), |e| {
            buffer_status(e, "sized")["replicas"] == want
        })
        .await;
    }
}

/// Creates `kind` (Deployment or StatefulSet) `name` of `replicas` pods of `shape`'s size,
/// labelled `app: name`, with `affinity` in its pod template.
async fn workload(env: &Env, kind: &str, name: &str, replicas: i32, affinity: Value) {
    let s = shape();
    let body = json!({
        "apiVersion": "apps/v1", "kind": kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "affinity": affinity,
                    "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": s.cpu, "memory": s.memory}}}],
                },
            },
        },
    });
    let client = env.client().await;
    let ar = kube::api::ApiResource {
        group: "apps".into(),
        version: "v1".into(),
        api_version: "apps/v1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    };
    let obj: kube::api::DynamicObject = serde_json::from_value(body).expect("a workload");
    Api::<kube::api::DynamicObject>::namespaced_with(client, NS, &ar)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create the workload");
}

/// Required anti-affinity on the hostname among pods labelled `app: app`.
fn spread(app: &str) -> Value {
    json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"app": app}},
        "topologyKey": "kubernetes.io/hostname"}]}})
}

/// Upstream's "should resolve a StatefulSet" (20 % of 5 is one chunk) and "should provision
/// buffer capacity using scalableRef with fixed replicas" (a Deployment's buffer of 3 chunks,
/// whatever the Deployment's size): both resolve and are provisioned.
#[actix::test]
async fn a_statefulset_and_a_fixed_size_deployment_buffer_are_provisioned() {
    let env = env().await;
    workload(&env, "StatefulSet", "db", 5, json!({})).await;
    deployment(&env, "app", 2).await;
    create_buffer(&env, "db-headroom", json!({"scalableRef": {"apiGroup": "apps", "kind": "StatefulSet", "name": "db"}, "percentage": 20})).await;
    create_buffer(&env, "app-headroom", json!({"scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "app"}, "replicas": 3})).await;
    env.until_quiet("both buffers resolved and provisioned", |e| {
        buffer_status(e, "db-headroom")["replicas"] == 1
            && buffer_status(e, "app-headroom")["replicas"] == 3
            && ["db-headroom", "app-headroom"].iter().all(|b| {
                condition_of(e, b, "ReadyForProvisioning").is_some_and(|c| c.1 == "Resolved")
                    && condition_of(e, b, "Provisioning").is_some_and(|c| c.0 == "True")
            })
    })
    .await;
    env.assert_clean();
}

/// Upstream's "should provision capacity independently for multiple buffers": two buffers of
/// different templates (two 1-CPU chunks, three of 500m) each resolve to their own size and
/// each is provisioned.
#[actix::test]
async fn two_buffers_are_each_provisioned() {
    let env = env().await;
    create(&env, template("large-chunk")).await;
    let mut small = template("small-chunk");
    small["template"]["spec"]["containers"][0]["resources"]["requests"] =
        json!({"cpu": "500m", "memory": "256Mi"});
    create(&env, small).await;
    create_buffer(
        &env,
        "a",
        json!({"podTemplateRef": {"name": "large-chunk"}, "replicas": 2}),
    )
    .await;
    create_buffer(
        &env,
        "b",
        json!({"podTemplateRef": {"name": "small-chunk"}, "replicas": 3}),
    )
    .await;
    env.until_quiet("both buffers provisioned", |e| {
        buffer_status(e, "a")["replicas"] == 2
            && buffer_status(e, "b")["replicas"] == 3
            && ["a", "b"].iter().all(|b| {
                condition_of(e, b, "Provisioning")
                    .is_some_and(|c| c.0 == "True" && c.1 == "FitsExistingCapacity")
            })
    })
    .await;
    assert!(!initialized_nodes(&env).is_empty());
    env.assert_clean();
}

/// Upstream's "should respect pod anti-affinity between virtual buffer pods": three chunks that
/// may not share a host get three nodes, and then fit them.
#[actix::test]
async fn placeholders_keep_their_templates_anti_affinity() {
    let env = env().await;
    let mut t = template("spread-buffer");
    t["template"]["spec"]["affinity"] = spread("spread-buffer");
    create(&env, t).await;
    create_buffer(
        &env,
        "spread",
        json!({"podTemplateRef": {"name": "spread-buffer"}, "replicas": 3}),
    )
    .await;
    env.until_quiet("three nodes, one per chunk", |e| {
        initialized_nodes(e).len() == 3
            && condition_of(e, "spread", "Provisioning")
                .is_some_and(|c| c.0 == "True" && c.1 == "FitsExistingCapacity")
    })
    .await;
    assert_eq!(env.list("nodeclaims").len(), 3);
    env.assert_clean();
}

/// Upstream's "... using scalableRef": the chunks of a Deployment whose pods may not share a
/// host keep off each other and off the Deployment's own pod: four nodes in all.
#[actix::test]
async fn placeholders_of_a_deployment_keep_its_anti_affinity() {
    let env = env().await;
    workload(
        &env,
        "Deployment",
        "spread-deploy",
        1,
        spread("spread-deploy"),
    )
    .await;
    env.until_quiet("the Deployment's pod bound", |e| e.bound_pods() == 1)
        .await;
    create_buffer(&env, "spread", json!({"scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "spread-deploy"}, "replicas": 3})).await;
    env.until_quiet("four nodes: the pod's and one per chunk", |e| {
        initialized_nodes(e).len() == 4
            && condition_of(e, "spread", "Provisioning")
                .is_some_and(|c| c.0 == "True" && c.1 == "FitsExistingCapacity")
    })
    .await;
    assert_eq!(env.list("nodeclaims").len(), 4);
    env.assert_clean();
}
