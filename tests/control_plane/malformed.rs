//! The malformed-input corpus (tests/fixtures/malformed/*.yaml) on both backends with the
//! controller running: no panic, everything else keeps working (a normal pod still gets a node),
//! and every object the API server accepted is reported on itself (a status condition) or by an
//! Event that names the object and the field given in its `expect` annotation. Both API servers
//! refuse exactly the objects in [`REFUSED_BY_THE_API_SERVER`] (the CRDs' schemas and CEL
//! rules, pod validation); the test holds each backend to that one list.
//!
//! To add a case, append a document to the file of its kind, with the annotation
//! `malformed.karpenter-capi.test/expect` set to the text (field path, label key, annotation) the
//! report must contain.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

use karpenter_capi::api::wellknown::MEMBER_LABEL;
use karpenter_capi::metrics::Metrics;
use karpenter_capi::sim::cluster::{Backend, MachineDeploymentSeed, SimClusterConfig};
use karpenter_capi::simulate::launch::seed_nodeclass_and_pool;
use karpenter_capi::simulate::pods::seed_of;
use karpenter_capi::simulate::{BackgroundSim, sim_settings, start_controller};

use crate::common::claims::served_events;

on_both_backends![the_corpus_is_reported_and_the_controller_keeps_serving];

pub fn tests() -> Vec<crate::assets::Test> {
    on_both()
}

/// The corpus objects kube-apiserver refuses (422 by the CRD's schema or the pod's validation, 400
/// for a pod that does not decode), and so does the simulated server: (name, why).
const REFUSED_BY_THE_API_SERVER: &[(&str, &str)] = &[
    ("nc-minvalues-text", "schema: type (integer)"),
    ("nc-operator", "schema: enum"),
    ("nc-ref-missing", "schema: required"),
    ("nc-requests", "schema: type (object)"),
    ("nc-taints", "schema: type (array)"),
    ("ncl-selector-list", "schema: type (object)"),
    ("ncl-timeout-forever", "schema: pattern"),
    ("ncl-timeout-negative", "schema: pattern"),
    ("ncl-timeout-number", "schema: type (string)"),
    ("np-bad-key", "schema: pattern"),
    ("np-budget-nodes", "schema: pattern"),
    ("np-budget-pct", "schema: pattern"),
    ("np-budget-schedule", "CEL: schedule needs duration"),
    ("np-grace-fraction", "schema: pattern"),
    ("np-gt-text", "CEL: Gt needs one integer"),
    ("np-hostname", "CEL: restricted label"),
    ("np-in-empty", "CEL: In needs a value"),
    ("np-karpenter-domain", "CEL: restricted domain"),
    ("np-label-long", "schema: maxLength"),
    ("np-label-restricted", "CEL: restricted label"),
    ("np-long-key", "schema: maxLength"),
    ("np-long-value", "schema: maxLength"),
    ("np-lt-two", "CEL: Lt needs one integer"),
    ("np-minvalues-high", "CEL: minValues over values"),
    ("np-minvalues-zero", "schema: minimum"),
    ("np-nodepool-key", "CEL: restricted label"),
    ("np-operator-unknown", "schema: enum"),
    ("np-ref-group", "schema: pattern"),
    ("np-ref-missing", "schema: required"),
    ("np-ref-name", "CEL: empty name"),
    ("np-taint-effect", "schema: enum"),
    ("np-taint-key", "schema: minLength"),
    ("np-too-many-reqs", "schema: maxItems"),
    ("np-value-64", "schema: maxLength"),
    ("np-value-space", "schema: pattern"),
    ("np-weight-high", "schema: maximum"),
    ("np-weight-text", "schema: type (integer)"),
    ("np-weight-zero", "schema: minimum"),
    ("pod-affinity-operator", "pod validation: selector operator"),
    ("pod-bad-quantity", "400: a quantity that does not parse"),
    (
        "pod-gpu",
        "pod validation: extended resource without a limit",
    ),
    ("pod-selector-long", "pod validation: label value over 63"),
];

const EXPECT: &str = "malformed.karpenter-capi.test/expect";
const FILES: [&str; 5] = [
    "nodepools.yaml",
    "nodeclaims.yaml",
    "nodeclasses.yaml",
    "pods.yaml",
    "machinedeployments.yaml",
];

fn corpus() -> Vec<Value> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/malformed");
    let mut all = Vec::new();
    for f in FILES {
        let text = std::fs::read_to_string(dir.join(f)).expect("read a corpus file");
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("corpus YAML");
        for d in docs {
            assert!(
                d.pointer(&format!(
                    "/metadata/annotations/{}",
                    EXPECT.replace('/', "~1")
                ))
                .is_some(),
                "{f}: {} has no {EXPECT} annotation",
                d["metadata"]["name"]
            );
            all.push(d);
        }
    }
    all
}

fn name_of(o: &Value) -> String {
    o["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn expect_of(o: &Value) -> String {
    o["metadata"]["annotations"][EXPECT]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn plural(kind: &str) -> &'static str {
    match kind {
        "NodePool" => "nodepools",
        "NodeClaim" => "nodeclaims",
        "ClusterAPINodeClass" => "clusterapinodeclasses",
        "Pod" => "pods",
        other => panic!("no plural for {other}"),
    }
}

fn api_for(client: kube::Client, o: &Value) -> Api<DynamicObject> {
    let (group, version) = match o["apiVersion"].as_str().unwrap_or_default().split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), o["apiVersion"].as_str().unwrap().to_string()),
    };
    let kind = o["kind"].as_str().unwrap();
    let gvk = GroupVersionKind::gvk(&group, &version, kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural(kind));
    match o.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => Api::namespaced_with(client, ns, &ar),
        None => Api::all_with(client, &ar),
    }
}

/// Every report about `o` found in the cluster: its conditions' messages, and the notes of
/// Events about it (or naming it, for MachineDeployments reported on their NodeClass).
fn reports(events: &[Value], current: Option<&Value>, name: &str) -> Vec<String> {
    let mut out: Vec<String> = current
        .and_then(|c| c.pointer("/status/conditions"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c["status"] == "False")
        .filter_map(|c| c["message"].as_str().map(String::from))
        .collect();
    for e in events {
        let note = e["note"].as_str().unwrap_or_default();
        if e["regarding"]["name"] == name || note.contains(name) {
            out.push(format!(
                "[{}] {note}",
                e["reason"].as_str().unwrap_or_default()
            ));
        }
    }
    out
}

async fn the_corpus_is_reported_and_the_controller_keeps_serving(backend: Backend) {
    let corpus = corpus();
    assert!(
        corpus.len() >= 50,
        "the corpus has {} objects",
        corpus.len()
    );

    let sim = BackgroundSim::start(SimClusterConfig {
        backend,
        provider_delay: Duration::from_millis(30),
        node_ready_delay: Duration::from_millis(30),
        ..SimClusterConfig::default()
    })
    .await
    .expect("the cluster");
    sim.run(|c| async move {
        for i in 0..4 {
            c.create_machine_deployment_from(&seed_of(i, 50))
                .await
                .expect("seed MachineDeployment");
        }
        seed_nodeclass_and_pool(c.client())
            .await
            .expect("seed NodeClass and NodePool");
    })
    .await
    .expect("seeding");
    // The bad objects exist before the controller starts (the initial list) ...
    let (before, after) = corpus.split_at(corpus.len() / 2);
    let mut refused = create_all(&sim, before.to_vec()).await;
    let mut settings = sim_settings(None);
    settings.batching.idle = Duration::from_millis(200);
    settings.batching.max = Duration::from_secs(2);
    let _controller = start_controller(&sim, settings, Metrics::new())
        .await
        .expect("controller");
    // ... and arrive while it runs (watch events).
    refused.extend(create_all(&sim, after.to_vec()).await);
    for (name, why) in &refused {
        say!("refused: {name}: {why}");
    }
    let refused: BTreeSet<String> = refused.into_keys().collect();
    let want: BTreeSet<String> = REFUSED_BY_THE_API_SERVER
        .iter()
        .map(|(name, _)| name.to_string())
        .collect();
    assert_eq!(
        refused, want,
        "the objects the {backend:?} API server refused"
    );
    let corpus: Vec<Value> = corpus
        .into_iter()
        .filter(|o| !refused.contains(&name_of(o)))
        .collect();

    // A normal pod still gets a node.
    let client = sim.client_here().await.expect("client");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "default");
    let normal = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "normal", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &normal)
        .await
        .expect("create the normal pod");

    let start = Instant::now();
    let events = loop {
        let events = served_events(&client).await;
        let bound = sim
            .cluster()
            .store()
            .get("pods", "default", "normal")
            .and_then(|p| p.pointer("/spec/nodeName").cloned())
            .is_some_and(|n| n.is_string());
        let mut missing = Vec::new();
        for o in &corpus {
            let name = name_of(o);
            // Read through the API server: the real backend's mirror keeps no NodeClasses.
            let current = match o["kind"].as_str() {
                Some("MachineDeployment") | None => None,
                Some(_) => api_for(client.clone(), o)
                    .get_opt(&name)
                    .await
                    .expect("read a corpus object")
                    .and_then(|d| serde_json::to_value(d).ok()),
            };
            let expect = expect_of(o);
            let found = reports(&events, current.as_ref(), &name);
            if !found.iter().any(|r| r.contains(&expect)) {
                missing.push(format!(
                    "{} {name}: nothing names {expect:?}; reports: {:?}",
                    o["kind"],
                    found
                        .iter()
                        .map(|r| r.chars().take(300).collect::<String>())
                        .collect::<Vec<_>>()
                ));
            }
        }
        if bound && missing.is_empty() {
            break events;
        }
        if start.elapsed() > Duration::from_secs(120) {
            panic!(
                "after 120 s: normal pod bound: {bound}; {} of {} objects unreported:\n{}",
                missing.len(),
                corpus.len(),
                missing.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };

    // Messages quoting 10,000-character values still produced Events (cut to the API's limit).
    for (name, field) in [
        (
            "np-long-value",
            "spec.template.spec.requirements[0].values[0]",
        ),
        ("pod-selector-long", "team"),
    ] {
        if refused.contains(name) {
            continue;
        }
        let e = events
            .iter()
            .find(|e| e["regarding"]["name"] == name)
            .unwrap_or_else(|| panic!("no Event about {name}"));
        let note = e["note"].as_str().unwrap_or_default();
        assert!(note.len() <= 1024, "{name}: note of {} bytes", note.len());
        assert!(note.contains(field), "{name}: {note}");
    }
}

/// Creates `objects`; returns those the API server refused (422 `Invalid`, or 400 for what does
/// not even decode), with its message.
async fn create_all(sim: &BackgroundSim, objects: Vec<Value>) -> BTreeMap<String, String> {
    sim.run(move |c| async move {
        let mut refused = BTreeMap::new();
        for o in objects {
            let name = name_of(&o);
            if o["kind"] == "MachineDeployment" {
                let annotations: BTreeMap<String, String> =
                    serde_json::from_value(o["metadata"]["annotations"].clone())
                        .expect("annotations");
                let mut labels: BTreeMap<String, String> =
                    serde_json::from_value(o["metadata"]["labels"].clone()).unwrap_or_default();
                labels.insert(MEMBER_LABEL.to_string(), String::new());
                let infrastructure_template = o
                    .pointer("/spec/template/spec/infrastructureRef/name")
                    .and_then(Value::as_str)
                    .map(String::from);
                c.create_machine_deployment_from(&MachineDeploymentSeed {
                    name,
                    namespace: "default".into(),
                    labels,
                    annotations,
                    infrastructure_template,
                    ..Default::default()
                })
                .await
                .expect("create a corpus MachineDeployment");
                continue;
            }
            let obj: DynamicObject = serde_json::from_value(o.clone()).expect("object");
            match api_for(c.client(), &o)
                .create(&PostParams::default(), &obj)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 422 || e.code == 400 => {
                    refused.insert(name, e.message);
                }
                Err(e) => panic!("create {name}: {e}"),
            }
        }
        refused
    })
    .await
    .expect("creating the corpus")
}
