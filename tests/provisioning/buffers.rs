//! CapacityBuffers through the whole product on the simulated cluster: a buffer's placeholder
//! pods make the controller launch headroom that pods arriving later bind to without waiting for
//! a launch, the buffer is provisioned again once they take it, a `scalableRef` buffer follows
//! its Deployment's size, and a buffer naming a missing PodTemplate is reported (condition and
//! Event naming the field) without touching anything else.

use std::time::Duration;

use k8s_openapi::api::core::v1::PodTemplate;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use karpenter_capi::api::capacity_buffer::CapacityBuffer;
use karpenter_capi::sim::cluster::PodShape;
use karpenter_capi::simulate::launch;
use karpenter_capi::simulate::pods::seed_of;

use karpenter_capi::cli::{Scenario, SimulateArgs};

use crate::autoscaler::cluster;
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

async fn create(env: &Env, body: Value) {
    let client = env.client().await;
    match body["kind"].as_str() {
        Some("PodTemplate") => {
            let t: PodTemplate = serde_json::from_value(body).expect("a PodTemplate");
            Api::<PodTemplate>::namespaced(client, NS)
                .create(&PostParams::default(), &t)
                .await
                .expect("create PodTemplate");
        }
        _ => {
            let b: CapacityBuffer = serde_json::from_value(body).expect("a CapacityBuffer");
            Api::<CapacityBuffer>::namespaced(client, NS)
                .create(&PostParams::default(), &b)
                .await
                .expect("create CapacityBuffer");
        }
    }
}

/// A PodTemplate of `shape`'s pod.
fn template(name: &str) -> Value {
    let s = shape();
    json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": name, "namespace": NS},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": s.cpu, "memory": s.memory}},
            }]},
        },
    })
}

fn buffer(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    })
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

fn buffer_status(env: &Env, name: &str) -> Value {
    env.get("capacitybuffers", NS, name)
        .map(|b| b["status"].clone())
        .unwrap_or(Value::Null)
}

fn condition_of(env: &Env, name: &str, ty: &str) -> Option<(String, String, String)> {
    let b = env.get("capacitybuffers", NS, name)?;
    let c = condition(&b, ty)?;
    Some((
        c["status"].as_str()?.to_string(),
        c["reason"].as_str()?.to_string(),
        c["message"].as_str().unwrap_or_default().to_string(),
    ))
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
    create(
        &env,
        buffer(
            "headroom",
            json!({"podTemplateRef": {"name": "chunk"}, "replicas": 2}),
        ),
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
    create(
        &env,
        buffer(
            "api-headroom",
            json!({"scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "api"}, "percentage": 50}),
        ),
    )
    .await;
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
/// provisions. Once the template exists the buffer is provisioned.
#[actix::test]
async fn a_buffer_naming_a_missing_template_is_reported_and_nothing_else_is_affected() {
    let env = env().await;
    create(
        &env,
        buffer(
            "orphan",
            json!({"podTemplateRef": {"name": "nowhere"}, "replicas": 3}),
        ),
    )
    .await;
    env.until("the buffer is not ready", |e| {
        condition_of(e, "orphan", "ReadyForProvisioning").is_some_and(|c| c.0 == "False")
    })
    .await;
    let (_, reason, message) = condition_of(&env, "orphan", "ReadyForProvisioning").unwrap();
    assert_eq!(reason, "PodTemplateNotFound");
    assert!(message.contains("spec.podTemplateRef"), "{message}");
    let provisioning = condition_of(&env, "orphan", "Provisioning").expect("Provisioning");
    assert_eq!(
        (provisioning.0.as_str(), provisioning.1.as_str()),
        ("False", "NotReadyForProvisioning")
    );
    let events = env.events("PodTemplateNotFound");
    assert_eq!(events.len(), 1, "{events:#?}");
    assert!(
        events[0]["note"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.podTemplateRef")
    );

    deployment(&env, "web", 1).await;
    env.until_quiet("the pod bound", |e| e.bound_pods() == 1)
        .await;
    assert_eq!(
        env.list("nodeclaims").len(),
        1,
        "one claim, for the pod only"
    );

    create(&env, template("nowhere")).await;
    env.until("the buffer resolves once its template exists", |e| {
        condition_of(e, "orphan", "ReadyForProvisioning").is_some_and(|c| c.0 == "True")
            && buffer_status(e, "orphan")["replicas"] == 3
    })
    .await;

    // A spec the API server accepts but this controller cannot size: named, nothing launched.
    let api: Api<CapacityBuffer> = Api::namespaced(env.client().await, NS);
    api.patch(
        "orphan",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": null, "limits": {"nvidia.com/gpu": "2"}}})),
    )
    .await
    .expect("patch the buffer");
    env.until("limits the template does not request are named", |e| {
        condition_of(e, "orphan", "ReadyForProvisioning")
            .is_some_and(|c| c.0 == "False" && c.2.starts_with("spec.limits"))
    })
    .await;
    let status = buffer_status(&env, "orphan");
    assert!(
        status["replicas"].is_null() && status["podTemplateRef"].is_null(),
        "a buffer that no longer resolves keeps no chunk count nor template: {status:#}"
    );
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
    create(
        &env,
        buffer(
            "big",
            json!({"podTemplateRef": {"name": "pinned"}, "replicas": 20}),
        ),
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
    create(
        &env,
        buffer("jobs", json!({"scalableRef": {"apiGroup": "batch", "kind": "Job", "name": "j"}, "replicas": 1})),
    )
    .await;
    create(
        &env,
        buffer("ghost", json!({"scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "none"}, "replicas": 1})),
    )
    .await;
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
    create(
        &env,
        buffer(
            "sized",
            json!({"podTemplateRef": {"name": "chunk"}, "replicas": 3}),
        ),
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
