//! Provisioning on both backends: pods selecting an offering's labels land on that offering, a
//! pod too large for every offering stays pending and is told why, and a NodePool limit stops
//! provisioning and says so, and so does a CapacityQuota. The offerings are the `pods` scenario's four MachineDeployment
//! sizes (2 to 16 CPUs) in three zones.

use std::time::Duration;

use serde_json::{Value, json};

use karpenter_capi::api::resources::Quantity;
use karpenter_capi::api::wellknown::{INSTANCE_TYPE_LABEL, ZONE_LABEL};
use karpenter_capi::sim::cluster::{Backend, PodShape, SimClusterConfig};
use karpenter_capi::simulate::pods::seed_of;

use crate::common::{Env, eventually};

on_both_backends![
    pods_selecting_an_offerings_labels_land_on_that_offering,
    a_pod_too_large_for_every_offering_stays_pending_and_is_told_why,
    a_limit_stops_provisioning_and_says_why,
    pods_arriving_within_a_capacity_buffer_bind_on_its_room,
    a_buffer_naming_a_missing_template_is_reported,
    a_capacity_quota_caps_provisioning_at_its_limit,
    a_malformed_capacity_quota_is_named_and_caps_nothing,
];

pub fn tests() -> Vec<crate::assets::Test> {
    on_both()
}

/// The four sizes (500 nodes each at most), the NodeClass and the default NodePool (with
/// `limits`), and the controller with short batching windows, on `backend`.
async fn env(backend: Backend, limits: Option<Value>) -> Env {
    env_tuned(backend, limits, |_| {}).await
}

async fn env_tuned(
    backend: Backend,
    limits: Option<Value>,
    tune: impl FnOnce(&mut karpenter_capi::actors::Settings),
) -> Env {
    let mut builder = Env::builder()
        .cluster(SimClusterConfig {
            provider_delay: Duration::from_millis(30),
            jitter: Duration::from_millis(30),
            node_ready_delay: Duration::from_millis(30),
            node_delete_delay: Duration::from_millis(20),
            ..SimClusterConfig::default()
        })
        .backend(backend)
        .seeds((0..4).map(|i| seed_of(i, 500)).collect())
        .short_batches()
        .tune(tune);
    if let Some(limits) = limits {
        builder = builder.limits(limits);
    }
    builder.start().await
}

/// The label `key` of the Node pod `pod` is bound to.
fn node_label(env: &Env, pod: &Value, key: &str) -> Option<String> {
    let node = pod.pointer("/spec/nodeName").and_then(Value::as_str)?;
    let node = env.get("nodes", "", node)?;
    node["metadata"]["labels"][key].as_str().map(String::from)
}

fn pods_of<'a>(pods: &'a [Value], prefix: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    pods.iter().filter(move |p| {
        p["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with(prefix))
    })
}

/// A nodeSelector on the instance type and a required node affinity on the zone: each pod is
/// bound (by the scheduler stand-in, or kube-scheduler) to a Node that carries the label.
async fn pods_selecting_an_offerings_labels_land_on_that_offering(backend: Backend) {
    let env = env(backend, None).await;
    let mut pinned = PodShape::new("500m", "256Mi");
    pinned
        .node_selector
        .insert(INSTANCE_TYPE_LABEL.into(), "large".into());
    env.deployment("pinned", 2, pinned).await;
    let mut zonal = PodShape::new("500m", "256Mi");
    zonal.affinity = Some(
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": ZONE_LABEL, "operator": "In", "values": ["sim-zone-1"]},
            ]}],
        }}}),
    );
    env.deployment("zonal", 2, zonal).await;
    env.until_quiet("4 pods bound", |e| e.bound_pods() == 4)
        .await;

    let pods = env.list("pods");
    for p in pods_of(&pods, "pinned-") {
        assert_eq!(
            node_label(&env, p, INSTANCE_TYPE_LABEL).as_deref(),
            Some("large"),
            "{}",
            p["metadata"]["name"]
        );
    }
    for p in pods_of(&pods, "zonal-") {
        assert_eq!(
            node_label(&env, p, ZONE_LABEL).as_deref(),
            Some("sim-zone-1"),
            "{}",
            p["metadata"]["name"]
        );
    }
    env.invariants_hold();
}

/// A pod asking for 64 CPUs (the largest offering has 16) beside two that fit: those are bound,
/// it gets no claim, stays unscheduled (`PodScheduled=False`, by the scheduler) and the
/// controller says why in a `FailedScheduling` Event.
async fn a_pod_too_large_for_every_offering_stays_pending_and_is_told_why(backend: Backend) {
    let env = env(backend, None).await;
    env.deployment("huge", 1, PodShape::new("64", "1Gi")).await;
    env.deployment("fine", 2, PodShape::new("100m", "128Mi"))
        .await;
    env.until_quiet("the pods that fit bound", |e| e.bound_pods() == 2)
        .await;
    let notes = eventually("a FailedScheduling Event for the huge pod", || async {
        let notes = env.notes_about("FailedScheduling", "huge-").await;
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    say!("the huge pod's notes: {notes:?}");

    let pods = env.list("pods");
    let huge: Vec<&Value> = pods_of(&pods, "huge-").collect();
    assert_eq!(huge.len(), 1, "{pods:#?}");
    assert!(huge[0].pointer("/spec/nodeName").is_none(), "{:#}", huge[0]);
    let scheduled = crate::common::condition(huge[0], "PodScheduled");
    assert_eq!(
        scheduled.map(|c| (c["status"].clone(), c["reason"].clone())),
        Some((json!("False"), json!("Unschedulable"))),
        "{:#}",
        huge[0]
    );
    for c in env.list("nodeclaims") {
        let cpu: Quantity = c["spec"]["resources"]["requests"]["cpu"]
            .as_str()
            .unwrap_or("0")
            .parse()
            .expect("a claim's cpu request");
        assert!(
            cpu < "64".parse().expect("64"),
            "a claim for the huge pod: {c:#}"
        );
    }
    env.invariants_hold();
}

/// A NodePool limited to 4 CPUs and six pods of 1.5 CPUs: claims stop at the limit, the pods
/// left are told the limit is why.
async fn a_limit_stops_provisioning_and_says_why(backend: Backend) {
    let env = env(backend, Some(json!({"cpu": "4"}))).await;
    env.deployment("big", 6, PodShape::new("1500m", "1Gi"))
        .await;
    env.until_quiet("some pods bound", |e| e.bound_pods() > 0)
        .await;
    let notes = eventually("a FailedScheduling Event naming the limit", || async {
        let notes = env.notes_about("FailedScheduling", "big-").await;
        notes.iter().any(|n| n.contains("limit")).then_some(notes)
    })
    .await;
    say!("notes: {notes:?}");
    // Settle: no more claims appear.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let claims = env.list("nodeclaims");
    let cpu = claims_cpu(&env);
    assert!(
        cpu <= "4".parse().expect("4"),
        "{} claims with {cpu} CPU exceed the limit of 4",
        claims.len()
    );
    assert!(
        env.bound_pods() < 6,
        "not every pod can fit under the limit"
    );
    env.invariants_hold();
}

/// A CapacityBuffer of two 1-CPU chunks is launched before any pod asks; two pods of that size
/// then bind to the Node launched for it (kube-scheduler, or the stand-in, finds the room), and
/// the buffer is provisioned again.
async fn pods_arriving_within_a_capacity_buffer_bind_on_its_room(backend: Backend) {
    let env = env_tuned(backend, None, |s| s.capacity_buffers = true).await;
    let ns = karpenter_capi::simulate::launch::NAMESPACE;
    env.capacity_buffer(ns, ("chunk", "1", "1Gi"), "headroom", 2)
        .await;
    let fits = |e: &Env| {
        e.get("capacitybuffers", ns, "headroom").is_some_and(|b| {
            crate::common::condition(&b, "Provisioning").is_some_and(|c| c["status"] == "True")
        })
    };
    env.until_quiet("the buffer's capacity launched and fits", |e| {
        fits(e) && !e.list("nodes").is_empty()
    })
    .await;
    let buffer_nodes: Vec<String> = env
        .list("nodes")
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(String::from))
        .collect();
    let claims_before = env.list("nodeclaims").len();
    env.deployment("web", 2, PodShape::new("1", "1Gi")).await;
    env.until("both pods bound", |e| e.bound_pods() == 2).await;
    for p in pods_of(&env.list("pods"), "web") {
        let node = p["spec"]["nodeName"].as_str().unwrap_or_default();
        assert!(
            buffer_nodes.iter().any(|n| n == node),
            "{node} was not launched for the buffer ({buffer_nodes:?})"
        );
    }
    env.until_quiet("the buffer refilled", |e| {
        e.list("nodeclaims").len() > claims_before && fits(e)
    })
    .await;
    env.assert_clean();
}

/// Bad input: a CapacityBuffer naming a PodTemplate that does not exist is not ready, named in
/// its condition and a Warning; nothing launches for it and a pod still provisions.
async fn a_buffer_naming_a_missing_template_is_reported(backend: Backend) {
    let env = env_tuned(backend, None, |s| s.capacity_buffers = true).await;
    crate::common::buffers::a_buffer_naming_a_missing_template_is_reported(&env).await;
    env.assert_clean();
}

/// Creates (or, when it exists, replaces the spec of) CapacityQuota `name`.
async fn put_quota(env: &Env, name: &str, spec: Value) {
    use karpenter_capi::api::capacity_quota::CapacityQuota;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let api: Api<CapacityQuota> = Api::all(env.client().await);
    if env.get("capacityquotas", "", name).is_some() {
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": spec})),
        )
        .await
        .expect("patch the CapacityQuota");
        return;
    }
    let q: CapacityQuota = serde_json::from_value(json!({
        "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityQuota",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a CapacityQuota");
    api.create(&PostParams::default(), &q)
        .await
        .expect("create the CapacityQuota");
}

/// `status.used.resources` of quota `name`, when written, and whether `Reconciled` is True.
fn quota_used(env: &Env, name: &str) -> Option<(Value, bool)> {
    let q = env.get("capacityquotas", "", name)?;
    let reconciled =
        crate::common::condition(&q, "Reconciled").is_some_and(|c| c["status"] == "True");
    Some((q.pointer("/status/used/resources")?.clone(), reconciled))
}

/// `used` says `cpu` CPUs and as many nodes as there are.
fn counts(env: &Env, used: &Value, cpu: &str) -> bool {
    let q = |v: &Value| v.as_str().and_then(|s| s.parse::<Quantity>().ok());
    q(&used["cpu"]) == cpu.parse().ok()
        && q(&used["nodes"]) == Some(Quantity::from_units(env.list("nodes").len() as i64))
}

/// The summed CPU capacity (launched, else requested) of the claims.
fn claims_cpu(env: &Env) -> Quantity {
    let mut cpu = Quantity::ZERO;
    for c in env.list("nodeclaims") {
        let q: Quantity = c["status"]["capacity"]["cpu"]
            .as_str()
            .or(c["spec"]["resources"]["requests"]["cpu"].as_str())
            .expect("a claim's cpu")
            .parse()
            .expect("a quantity");
        cpu = cpu + q;
    }
    cpu
}

/// A CapacityQuota of 4 CPUs on the default NodePool's nodes and six pods of 1.5 CPUs (one
/// per 2-CPU node, or two per 4-CPU node): provisioning stops at exactly 4 CPUs of nodes, the
/// pods left stay pending told the quota and the resource, and the quota's status counts the
/// 4 CPUs and the nodes. A
/// quota selecting nodes no pool launches (at 0 nodes) holds nothing back. Raising the quota
/// to 12 CPUs launches the rest, and its status follows.
async fn a_capacity_quota_caps_provisioning_at_its_limit(backend: Backend) {
    let env = env_tuned(backend, None, |s| s.capacity_quotas = true).await;
    let pool_nodes = json!({"matchLabels": {"karpenter.sh/nodepool": "default"}});
    put_quota(
        &env,
        "default-pool",
        json!({"selector": pool_nodes, "limits": {"resources": {"cpu": "4", "nodes": "10"}}}),
    )
    .await;
    put_quota(
        &env,
        "elsewhere",
        json!({"selector": {"matchLabels": {"team": "other"}}, "limits": {"resources": {"nodes": "0"}}}),
    )
    .await;
    env.until("both quotas reconciled", |e| {
        quota_used(e, "default-pool").is_some_and(|(_, ok)| ok)
            && quota_used(e, "elsewhere").is_some_and(|(_, ok)| ok)
    })
    .await;
    env.deployment("big", 6, PodShape::new("1500m", "1Gi"))
        .await;
    env.until_quiet("two pods bound", |e| e.bound_pods() == 2)
        .await;
    let notes = eventually("a FailedScheduling Event naming the quota", || async {
        let notes = env.notes_about("FailedScheduling", "big-").await;
        notes
            .iter()
            .any(|n| n.contains("CapacityQuota \"default-pool\" has reached its limit on \"cpu\""))
            .then_some(notes)
    })
    .await;
    say!("notes: {notes:?}");
    // Settle: no more claims appear.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        claims_cpu(&env),
        "4".parse().expect("4"),
        "claims: {:#?}",
        env.list("nodeclaims")
    );
    assert_eq!(env.bound_pods(), 2);
    env.until("the quota's status counts the 4 CPUs and every node", |e| {
        quota_used(e, "default-pool").is_some_and(|(used, ok)| ok && counts(e, &used, "4"))
    })
    .await;
    assert_eq!(
        quota_used(&env, "elsewhere").map(|(u, _)| u),
        Some(json!({"nodes": "0"}))
    );
    let gauge = |family: &str, quota: &str, resource: &str| {
        env.metric(&format!(
            "karpenter_capi_capacity_quota_{family}{{capacity_quota=\"{quota}\",resource_type=\"{resource}\"}}"
        ))
    };
    assert_eq!(gauge("limit", "default-pool", "cpu"), 4.0);
    assert_eq!(gauge("usage", "default-pool", "cpu"), 4.0);
    assert!(
        env.metrics
            .encode()
            .contains("karpenter_capi_capacity_quota_limit{capacity_quota=\"elsewhere\",resource_type=\"nodes\"} 0"),
        "a quota limited to 0 nodes shows its limit"
    );
    explain_names_the_quota(&env);
    put_quota(
        &env,
        "default-pool",
        json!({"selector": pool_nodes, "limits": {"resources": {"cpu": "12", "nodes": "10"}}}),
    )
    .await;
    env.until_quiet("every pod bound", |e| e.bound_pods() == 6)
        .await;
    let cpu = claims_cpu(&env);
    assert!(cpu <= "12".parse().expect("12"), "{cpu} CPUs of claims");
    env.until("the quota's status follows", |e| {
        quota_used(e, "default-pool").is_some_and(|(used, _)| counts(e, &used, &cpu.to_string()))
    })
    .await;
    env.invariants_hold();
}

/// Bad input: a CapacityQuota whose selector has an operator no selector knows (the schema
/// lets any string through) is not enforced: `Reconciled` False, `ReconciliationFailed`,
/// naming the field, and one Warning Event on it; a pod it would have held launches.
async fn a_malformed_capacity_quota_is_named_and_caps_nothing(backend: Backend) {
    let env = env_tuned(backend, None, |s| s.capacity_quotas = true).await;
    put_quota(
        &env,
        "bad-selector",
        json!({
            "selector": {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "Near"}]},
            "limits": {"resources": {"nodes": "0"}},
        }),
    )
    .await;
    env.until("the quota's condition names the field", |e| {
        e.get("capacityquotas", "", "bad-selector")
            .and_then(|q| crate::common::condition(&q, "Reconciled").cloned())
            .is_some_and(|c| {
                c["status"] == "False"
                    && c["reason"] == "ReconciliationFailed"
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("spec.selector") && m.contains("Near"))
            })
    })
    .await;
    let notes = eventually("a Warning Event on the quota", || async {
        let notes = env
            .notes_about("ReconciliationFailed", "bad-selector")
            .await;
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    assert!(
        notes.iter().all(|n| n.contains("spec.selector")),
        "{notes:?}"
    );
    assert!(
        !env.metrics
            .encode()
            .contains("capacity_quota=\"bad-selector\""),
        "a quota that caps nothing shows no limit"
    );
    env.deployment("web", 1, PodShape::new("1", "1Gi")).await;
    env.until_quiet("the pod bound", |e| e.bound_pods() == 1)
        .await;
    env.invariants_hold();
}

/// `karpenter-capi explain pod` (the real binary, the gate on, the cluster's kubeconfig) on a
/// pod the quota holds names the quota and the resource.
fn explain_names_the_quota(env: &Env) {
    let pods = env.list("pods");
    let pending = pods_of(&pods, "big")
        .find(|p| p.pointer("/spec/nodeName").is_none())
        .expect("a pending pod");
    let target = format!(
        "{}/{}",
        pending["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default(),
        pending["metadata"]["name"].as_str().unwrap_or_default()
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
        .args([
            "explain",
            "pod",
            &target,
            "--feature-gates",
            "CapacityQuota=true",
        ])
        .arg("--kubeconfig")
        .arg(env.sim.kubeconfig())
        .output()
        .expect("running karpenter-capi explain");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "explain pod {target}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("CapacityQuota \"default-pool\" has reached its limit on \"cpu\""),
        "explain pod {target}:\n{text}"
    );
}
