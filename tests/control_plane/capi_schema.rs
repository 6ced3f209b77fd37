//! Cluster API's kinds are checked against upstream's CRD schemas on both backends:
//! kube-apiserver does it with the CRDs installed, the simulated server compiles the same files
//! (`$KARPENTER_CAPI_UPSTREAM/crds`). Each malformed MachineDeployment is refused by both with
//! the same message, and a well-formed one is accepted by both.

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

use karpenter_capi::sim::cluster::{Backend, SimClusterConfig};
use karpenter_capi::simulate::BackgroundSim;

on_both_backends!(needs [Upstream]; malformed_machine_deployments_are_refused_alike);

pub fn tests() -> Vec<crate::assets::Test> {
    on_both()
}

/// A MachineDeployment every Cluster API version of the schema accepts (no Machines: 0 replicas).
fn well_formed(name: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "clusterName": "sim",
            "replicas": 0,
            "selector": {"matchLabels": {"md": name}},
            "template": {
                "metadata": {"labels": {"md": name}},
                "spec": {
                    "clusterName": "sim",
                    "bootstrap": {"dataSecretName": "bootstrap"},
                    "infrastructureRef": {
                        "apiGroup": "infrastructure.cluster.x-k8s.io",
                        "kind": "DevMachineTemplate",
                        "name": "template",
                    },
                },
            },
        },
    })
}

/// (name, the object, kube-apiserver's message, word for word).
fn malformed() -> Vec<(&'static str, Value, &'static str)> {
    let mut cases = Vec::new();
    let mut replicas = well_formed("md-replicas-text");
    replicas["spec"]["replicas"] = json!("three");
    cases.push((
        "md-replicas-text",
        replicas,
        r#"MachineDeployment.cluster.x-k8s.io "md-replicas-text" is invalid: [spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string", .spec.replicas: Invalid value: 0: .spec.replicas accessor error: three is of the type string, expected int64]"#,
    ));
    // The schema allows it; the scale subresource's own check does not.
    let mut negative = well_formed("md-replicas-negative");
    negative["spec"]["replicas"] = json!(-1);
    cases.push((
        "md-replicas-negative",
        negative,
        r#"MachineDeployment.cluster.x-k8s.io "md-replicas-negative" is invalid: .spec.replicas: Invalid value: -1: should be a non-negative integer"#,
    ));
    let mut strategy = well_formed("md-strategy");
    strategy["spec"]["rollout"] = json!({"strategy": {"type": "Sideways"}});
    cases.push((
        "md-strategy",
        strategy,
        r#"MachineDeployment.cluster.x-k8s.io "md-strategy" is invalid: spec.rollout.strategy.type: Unsupported value: "Sideways": supported values: "RollingUpdate", "OnDelete""#,
    ));
    let mut cluster = well_formed("md-no-cluster");
    if let Some(spec) = cluster["spec"].as_object_mut() {
        spec.remove("clusterName");
    }
    cases.push((
        "md-no-cluster",
        cluster,
        r#"MachineDeployment.cluster.x-k8s.io "md-no-cluster" is invalid: spec.clusterName: Required value"#,
    ));
    let mut long = well_formed("md-cluster-long");
    long["spec"]["template"]["spec"]["clusterName"] = json!("c".repeat(64));
    cases.push((
        "md-cluster-long",
        long,
        r#"MachineDeployment.cluster.x-k8s.io "md-cluster-long" is invalid: spec.template.spec.clusterName: Too long: may not be more than 63 bytes"#,
    ));
    cases
}

async fn malformed_machine_deployments_are_refused_alike(backend: Backend) {
    let sim = BackgroundSim::start(SimClusterConfig {
        backend,
        ..SimClusterConfig::default()
    })
    .await
    .expect("the cluster");
    let client = sim.client_here().await.expect("client");
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "machinedeployments");
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &ar);
    let create = |body: Value| {
        let api = api.clone();
        async move {
            let obj: DynamicObject = serde_json::from_value(body).expect("a MachineDeployment");
            api.create(&PostParams::default(), &obj).await
        }
    };

    create(well_formed("md-well-formed"))
        .await
        .unwrap_or_else(|e| {
            panic!("the {backend:?} API server refused a well-formed MachineDeployment: {e}")
        });
    let mut wrong = Vec::new();
    for (name, body, want) in malformed() {
        match create(body).await {
            Err(kube::Error::Api(s)) if s.code == 422 && s.message == want => {}
            Err(kube::Error::Api(s)) => wrong.push(format!(
                "{name}: {} {:?}\n    want 422 {want:?}",
                s.code, s.message
            )),
            Err(e) => wrong.push(format!("{name}: {e}")),
            Ok(_) => wrong.push(format!("{name}: accepted\n    want 422 {want:?}")),
        }
    }
    assert!(
        wrong.is_empty(),
        "the {backend:?} API server on malformed MachineDeployments:\n{}",
        wrong.join("\n")
    );
}
