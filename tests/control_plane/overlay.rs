//! NodeOverlay on both backends: a negotiated price steers provisioning to the overlaid type and
//! a change to it re-prices the catalog by watch, without a restart; a malformed price is
//! refused (by the CRD's pattern on a real API server) or reported on the overlay's status
//! naming the field, and never applied; two overlays of the same weight that price the same
//! offerings are reported as a conflict naming the one applied; an overlay that selects one
//! NodePool prices the offerings for that pool alone.

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use karpenter_capi::api::NodeOverlay;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::{INSTANCE_TYPE_LABEL, NODEPOOL_LABEL};
use karpenter_capi::sim::cluster::{Backend, PodShape, SimClusterConfig};
use karpenter_capi::simulate::pods::seed_of;
use karpenter_capi::testing::node_overlay as overlay;

use crate::common::{Env, eventually};

on_both_backends![
    an_overlay_price_steers_provisioning_and_a_change_reprices_it,
    a_malformed_price_is_refused_or_reported_and_never_applied,
    overlays_of_equal_weight_on_the_same_offerings_conflict,
    the_overlay_scenario_launches_on_the_overlay_cheapest_type,
    an_overlay_on_one_nodepool_prices_that_pool_alone,
];

pub fn tests() -> Vec<crate::assets::Test> {
    on_both()
}

/// Three sizes: small (2 CPUs, 0.10/h), medium (4, 0.19), large (8, 0.37).
async fn env(backend: Backend) -> Env {
    Env::builder()
        .cluster(SimClusterConfig {
            provider_delay: Duration::from_millis(30),
            jitter: Duration::from_millis(30),
            node_ready_delay: Duration::from_millis(30),
            node_delete_delay: Duration::from_millis(20),
            ..SimClusterConfig::default()
        })
        .backend(backend)
        .seeds((0..3).map(|i| seed_of(i, 500)).collect())
        .short_batches()
        .start()
        .await
}

fn on_type(t: &str) -> Value {
    json!([{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [t]}])
}

/// The overlay's Ready condition once it has one: (status, reason, message).
async fn ready_of(api: &Api<NodeOverlay>, name: &str) -> (String, String, String) {
    eventually(
        &format!("NodeOverlay {name} has a Ready condition"),
        || async {
            let o = api.get(name).await.ok()?;
            let c = o.conditions().iter().find(|c| c.type_ == "Ready")?.clone();
            Some((c.status.as_str().to_string(), c.reason, c.message))
        },
    )
    .await
}

/// The overlay's Ready condition once its status is `status`: an overlay created before the
/// one it conflicts with is applied (`True`) until the controller sees the other.
async fn ready_once(api: &Api<NodeOverlay>, name: &str, status: &str) -> (String, String, String) {
    eventually(&format!("NodeOverlay {name} is Ready={status}"), || async {
        let o = api.get(name).await.ok()?;
        let c = o.conditions().iter().find(|c| c.type_ == "Ready")?.clone();
        (c.status.as_str() == status).then(|| (c.status.as_str().to_string(), c.reason, c.message))
    })
    .await
}

/// The instance types of the Nodes the pods of Deployment `prefix` are bound to.
fn types_of(env: &Env, prefix: &str) -> Vec<String> {
    env.list("pods")
        .iter()
        .filter(|p| {
            p["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .filter_map(|p| {
            let node = env.get("nodes", "", p.pointer("/spec/nodeName")?.as_str()?)?;
            node["metadata"]["labels"][INSTANCE_TYPE_LABEL]
                .as_str()
                .map(String::from)
        })
        .collect()
}

/// One small pod (a small node, the cheapest, would hold it) lands on `large` while an overlay
/// prices large at 0.01; with the price raised to 5.0, the next pod (kept off that node) lands
/// on `small`, with the same controller.
async fn an_overlay_price_steers_provisioning_and_a_change_reprices_it(backend: Backend) {
    let env = env(backend).await;
    let api: Api<NodeOverlay> = Api::all(env.client().await);
    api.create(
        &PostParams::default(),
        &overlay(
            "negotiated",
            json!({"requirements": on_type("large"), "price": "0.01"}),
        ),
    )
    .await
    .expect("create the overlay");
    let (status, _, _) = ready_of(&api, "negotiated").await;
    assert_eq!(status, "True");
    env.deployment("before", 1, PodShape::new("500m", "256Mi"))
        .await;
    env.until_quiet("the first pod bound", |e| e.bound_pods() == 1)
        .await;
    assert_eq!(types_of(&env, "before-"), ["large"]);

    api.patch(
        "negotiated",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"price": "5.0"}})),
    )
    .await
    .expect("raise the price");
    // Kept off the first node (hostname anti-affinity), so the pod needs a new claim.
    let mut apart = PodShape::new("500m", "256Mi");
    apart.affinity = Some(
        json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"app": "before"}},
            "topologyKey": "kubernetes.io/hostname",
        }]}}),
    );
    env.deployment("after", 1, apart).await;
    env.until_quiet("the second pod bound", |e| e.bound_pods() == 2)
        .await;
    assert_eq!(types_of(&env, "after-"), ["small"]);
    env.invariants_hold();
}

/// `priceAdjustment: "-15 percent"` on every type: a real API server refuses it (the CRD's
/// pattern); where it is stored, the overlay is `Ready=False` (`RuntimeValidation`) naming
/// `spec.priceAdjustment`; one whose weight is not a number likewise; neither is applied.
async fn a_malformed_price_is_refused_or_reported_and_never_applied(backend: Backend) {
    let env = env(backend).await;
    let api: Api<NodeOverlay> = Api::all(env.client().await);
    let bad = overlay(
        "bad-price",
        json!({
            "requirements": [{"key": INSTANCE_TYPE_LABEL, "operator": "Exists"}],
            "priceAdjustment": "-15 percent",
        }),
    );
    match api.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(e.message.contains("priceAdjustment"), "{}", e.message);
        }
        Err(e) => panic!("creating the overlay: {e}"),
        Ok(_) => {
            assert_eq!(backend, Backend::Simulated, "a real API server refuses it");
            let (status, reason, message) = ready_of(&api, "bad-price").await;
            assert_eq!(
                (status.as_str(), reason.as_str()),
                ("False", "RuntimeValidation")
            );
            assert!(message.contains("spec.priceAdjustment"), "{message}");
        }
    }
    // A weight the types cannot read: refused by a real API server's schema; where it is
    // stored, reported as not readable, naming the field.
    let dynamic: Api<kube::api::DynamicObject> = Api::all_with(
        env.client().await,
        &kube::api::ApiResource::erase::<NodeOverlay>(&()),
    );
    let unreadable: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1alpha1",
        "kind": "NodeOverlay",
        "metadata": {"name": "bad-weight"},
        "spec": {"requirements": [], "weight": "heavy", "price": "0.01"},
    }))
    .expect("an object");
    match dynamic.create(&PostParams::default(), &unreadable).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 422, "{e:?}"),
        Err(e) => panic!("creating the overlay: {e}"),
        Ok(_) => {
            assert_eq!(backend, Backend::Simulated, "a real API server refuses it");
            let message = eventually("bad-weight reported", || async {
                let o = dynamic.get("bad-weight").await.ok()?;
                let c = o
                    .data
                    .pointer("/status/conditions")?
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == "ValidationSucceeded" && c["status"] == "False")?;
                c["message"].as_str().map(String::from)
            })
            .await;
            assert!(message.contains("weight"), "{message}");
        }
    }
    // An overlay that would make large the cheapest, were the bad one applied after it, is
    // valid: large at 0.09 beats small at 0.10; a -15% on small (0.085) would not be applied.
    api.create(
        &PostParams::default(),
        &overlay(
            "fine",
            json!({"requirements": on_type("large"), "price": "0.09"}),
        ),
    )
    .await
    .expect("create the valid overlay");
    assert_eq!(ready_of(&api, "fine").await.0, "True");
    env.deployment("probe", 1, PodShape::new("500m", "256Mi"))
        .await;
    env.until_quiet("the pod bound", |e| e.bound_pods() == 1)
        .await;
    assert_eq!(types_of(&env, "probe-"), ["large"]);
    env.invariants_hold();
}

/// `a-cheap` and `b-cheap`, both weight 5, both pricing `medium`: upstream evaluates `b-cheap`
/// first (at equal weight, the later name), so it applies and `a-cheap` is `Ready=False`
/// (`Conflict`) naming it; the pod lands on medium at b-cheap's price.
async fn overlays_of_equal_weight_on_the_same_offerings_conflict(backend: Backend) {
    let env = env(backend).await;
    let api: Api<NodeOverlay> = Api::all(env.client().await);
    for (name, price) in [("a-cheap", "0.02"), ("b-cheap", "0.03")] {
        api.create(
            &PostParams::default(),
            &overlay(
                name,
                json!({"weight": 5, "requirements": on_type("medium"), "price": price}),
            ),
        )
        .await
        .expect("create the overlay");
    }
    let (status, reason, message) = ready_once(&api, "a-cheap", "False").await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Conflict"));
    assert!(message.contains("b-cheap"), "{message}");
    assert_eq!(ready_of(&api, "b-cheap").await.0, "True");
    env.deployment("probe", 1, PodShape::new("500m", "256Mi"))
        .await;
    env.until_quiet("the pod bound", |e| e.bound_pods() == 1)
        .await;
    assert_eq!(types_of(&env, "probe-"), ["medium"]);
    let claim = env
        .list("nodeclaims")
        .into_iter()
        .next()
        .expect("one claim");
    assert_eq!(claim["metadata"]["labels"][INSTANCE_TYPE_LABEL], "medium");
    env.invariants_hold();
}

/// `simulate --scenario overlay`: every claim on the overlaid (largest) size, and the malformed
/// overlay refused, by the real API server's CRD pattern or on its status.
async fn the_overlay_scenario_launches_on_the_overlay_cheapest_type(backend: Backend) {
    use karpenter_capi::cli::{ControlPlaneArg, Scenario};
    let args = karpenter_capi::cli::SimulateArgs {
        pods: 40,
        control_plane: match backend {
            Backend::Simulated => ControlPlaneArg::Simulated,
            Backend::Real => ControlPlaneArg::Real,
        },
        ..crate::common::scenario(Scenario::Overlay)
    };
    let (report, _kept) = karpenter_capi::simulate::overlay::run_kept(&args)
        .await
        .expect("the scenario runs");
    let o = &report.overlay;
    assert!(o.picked_overlay_cheapest, "{:?}", o.claims_by_type);
    assert_eq!(o.overlaid_type, "large");
    assert!(o.malformed_refused, "{:?}", o.overlays);
    assert!(report.invariants_ok(), "{report}");
    let json: Value = serde_json::from_str(&report.to_json()).expect("JSON");
    assert_eq!(json["overlay"]["picked_overlay_cheapest"], true);
}

/// Two NodePools of the one NodeClass, `default` and `other`; an overlay that selects
/// `karpenter.sh/nodepool: default` and `large` prices large at 0.01 for that pool alone. A pod
/// kept to `default` lands on large, the cheapest there; a pod kept to `other` lands on small,
/// the cheapest at the annotated prices; the claims say which pool made them.
async fn an_overlay_on_one_nodepool_prices_that_pool_alone(backend: Backend) {
    let env = env(backend).await;
    let client = env.client().await;
    let mut other: NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": "other"},
        "spec": serde_json::to_value(&env.pool.spec).expect("the seeded pool's spec"),
    }))
    .expect("a NodePool");
    other.status = None;
    Api::<NodePool>::all(client.clone())
        .create(&PostParams::default(), &other)
        .await
        .expect("create the second NodePool");
    let api: Api<NodeOverlay> = Api::all(client);
    api.create(
        &PostParams::default(),
        &overlay(
            "default-pool-deal",
            json!({"requirements": [
                {"key": NODEPOOL_LABEL, "operator": "In", "values": [env.pool.metadata.name]},
                {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": ["large"]},
            ], "price": "0.01"}),
        ),
    )
    .await
    .expect("create the overlay");
    assert_eq!(ready_of(&api, "default-pool-deal").await.0, "True");
    for (deployment, pool) in [("in-default", "default"), ("in-other", "other")] {
        let mut shape = PodShape::new("500m", "256Mi");
        shape.node_selector = [(NODEPOOL_LABEL.to_string(), pool.to_string())].into();
        env.deployment(deployment, 1, shape).await;
    }
    env.until_quiet("both pods bound", |e| e.bound_pods() == 2)
        .await;
    assert_eq!(types_of(&env, "in-default-"), ["large"]);
    assert_eq!(types_of(&env, "in-other-"), ["small"]);
    let mut made: Vec<(String, String)> = env
        .list("nodeclaims")
        .iter()
        .map(|c| {
            let label = |k: &str| {
                c["metadata"]["labels"][k]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            };
            (label(NODEPOOL_LABEL), label(INSTANCE_TYPE_LABEL))
        })
        .collect();
    made.sort();
    assert_eq!(
        made,
        [
            ("default".to_string(), "large".to_string()),
            ("other".to_string(), "small".to_string())
        ]
    );
    env.invariants_hold();
}
