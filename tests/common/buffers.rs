//! CapacityBuffer helpers shared by the buffer tests: PodTemplates and buffers in the test
//! namespace, their status, and the flows written once for both backends. Events are read
//! through the API server (the real backend's mirror keeps none).

use k8s_openapi::api::core::v1::PodTemplate;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use karpenter_capi::api::capacity_buffer::CapacityBuffer;
use karpenter_capi::sim::cluster::PodShape;

use super::{Env, NS, condition, eventually};

/// Creates a PodTemplate or a CapacityBuffer (by `kind`) in the test namespace.
pub async fn create(env: &Env, body: Value) {
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

/// A PodTemplate of one 1-CPU, 1 GiB container, labelled `app: name`.
pub fn template(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": name, "namespace": NS},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
            }]},
        },
    })
}

pub fn buffer(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    })
}

/// Creates CapacityBuffer `name` of `spec` in the test namespace.
pub async fn create_buffer(env: &Env, name: &str, spec: Value) {
    create(env, buffer(name, spec)).await;
}

pub fn buffer_status(env: &Env, name: &str) -> Value {
    env.get("capacitybuffers", NS, name)
        .map(|b| b["status"].clone())
        .unwrap_or(Value::Null)
}

/// A buffer's condition `ty` as (status, reason, message).
pub fn condition_of(env: &Env, name: &str, ty: &str) -> Option<(String, String, String)> {
    let b = env.get("capacitybuffers", NS, name)?;
    let c = condition(&b, ty)?;
    Some((
        c["status"].as_str()?.to_string(),
        c["reason"].as_str()?.to_string(),
        c["message"].as_str().unwrap_or_default().to_string(),
    ))
}

/// Bad input: a buffer naming a PodTemplate that does not exist is not ready, with a condition
/// and one Warning Event naming `spec.podTemplateRef`; nothing launches for it and a pod still
/// provisions. Once the template exists the buffer resolves; a size its template cannot give
/// (limits on a resource it does not request) is named again.
pub async fn a_buffer_naming_a_missing_template_is_reported(env: &Env) {
    create_buffer(
        env,
        "orphan",
        json!({"podTemplateRef": {"name": "nowhere"}, "replicas": 3}),
    )
    .await;
    env.until("the buffer is not ready", |e| {
        condition_of(e, "orphan", "ReadyForProvisioning").is_some_and(|c| c.0 == "False")
    })
    .await;
    let (_, reason, message) =
        condition_of(env, "orphan", "ReadyForProvisioning").expect("ReadyForProvisioning");
    assert_eq!(reason, "PodTemplateNotFound");
    assert!(message.contains("spec.podTemplateRef"), "{message}");
    let provisioning = condition_of(env, "orphan", "Provisioning").expect("Provisioning");
    assert_eq!(
        (provisioning.0.as_str(), provisioning.1.as_str()),
        ("False", "NotReadyForProvisioning")
    );
    // The Event is written beside the status, not before it: wait for it.
    let told = eventually("the PodTemplateNotFound Warning", || async {
        let e = env.served_events("PodTemplateNotFound").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(told.len(), 1, "{told:#?}");
    assert!(
        told[0]["note"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.podTemplateRef")
    );

    env.deployment("web", 1, PodShape::new("1", "1Gi")).await;
    env.until_quiet("the pod bound", |e| e.bound_pods() == 1)
        .await;
    assert_eq!(
        env.list("nodeclaims").len(),
        1,
        "one claim, for the pod only"
    );

    create(env, template("nowhere")).await;
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
    let status = buffer_status(env, "orphan");
    assert!(
        status["replicas"].is_null() && status["podTemplateRef"].is_null(),
        "a buffer that no longer resolves keeps no chunk count nor template: {status:#}"
    );
    // What the resolved buffer launched finishes launching before the cluster is checked (a
    // real API server shows a Machine between its MachineDeployment's scale and its Node).
    env.until_quiet("the buffer's launches settled", |_| true)
        .await;
}
