//! The view's holds, each under its blocker: one cluster with a claim held by every rule the
//! view checks, gathered as the pass gathers it.

use std::collections::HashSet;

use serde_json::{Value, json};

use super::*;
use crate::api::decode::Lenient;
use crate::api::wellknown::{
    DISRUPTION_PAUSED_ANNOTATION, DO_NOT_DISRUPT_ANNOTATION, INSTANCE_ANNOTATION,
    MACHINE_DEPLOYMENT_ANNOTATION, MIN_SIZE_ANNOTATION,
};
use crate::capi::CapiVersion;
use crate::capi::model::Machine;
use crate::state::feed::Index;

fn pool(name: &str, extra: Value) -> NodePool {
    let mut v = json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
        "spec": {"template": {"spec": {"requirements": [],
                    "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}}},
                 "disruption": {"consolidateAfter": "0s"}}
    });
    crate::testing::merge(&mut v, extra);
    serde_json::from_value(v).expect("a NodePool")
}

/// A claim of `pool` on Node `n-<name>` in MachineDeployment `md` (None: not recorded).
fn claim(name: &str, pool: &str, md: Option<&str>, extra: Value) -> NodeClaim {
    let annotations = match md {
        Some(md) => json!({MACHINE_DEPLOYMENT_ANNOTATION: md}),
        None => json!({}),
    };
    let mut v = json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": name, "labels": {NODEPOOL_LABEL: pool}, "annotations": annotations},
        "spec": {"requirements": [], "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}},
        "status": {"nodeName": format!("n-{name}"), "conditions": [{"type": "Initialized",
            "status": "True", "reason": "Initialized", "lastTransitionTime": "2026-01-01T08:00:00Z"}]}
    });
    crate::testing::merge(&mut v, extra);
    serde_json::from_value(v).expect("a NodeClaim")
}

fn node(name: &str, annotations: Value) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": format!("n-{name}"), "annotations": annotations},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .expect("a Node")
}

fn deployment(name: &str, replicas: i32, annotations: Value) -> MachineDeployment {
    let v = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": "1",
                     "annotations": annotations},
        "spec": {"clusterName": "c", "replicas": replicas,
                 "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": name}},
                 "template": {"spec": {"clusterName": "c", "bootstrap": {"dataSecretName": "x"},
                     "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                                           "kind": "DevMachineTemplate", "name": "t"}}}}
    });
    MachineDeployment::from_value(&v, CapiVersion::V1Beta1).expect("a MachineDeployment")
}

/// A Machine of MachineDeployment `md-roll` that a rollout has outdated.
fn outdated_machine() -> Machine {
    let v = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "old", "namespace": "ns", "uid": "old", "resourceVersion": "1",
                     "labels": {"cluster.x-k8s.io/deployment-name": "md-roll"}},
        "spec": {"clusterName": "c", "bootstrap": {},
                 "infrastructureRef": {"apiGroup": "infra", "kind": "K", "name": "old"}},
        "status": {"conditions": [{"type": "UpToDate", "status": "False"}]}
    });
    Machine::from_value(&v, CapiVersion::V1Beta2).expect("a Machine")
}

fn pod_on(node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "guarded", "namespace": "ns", "labels": {"app": "a"}},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "startTime": "2026-01-01T08:00:00Z",
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .expect("a Pod")
}

fn guarding_pdb() -> PodDisruptionBudget {
    serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "b", "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"app": "a"}}},
        "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1,
                   "expectedPods": 1}
    }))
    .expect("a PDB")
}

/// Claims held by each rule: (claim, pool, MachineDeployment, claim extras, Node annotations).
fn claims() -> Vec<(NodeClaim, Node)> {
    let md = Some("ns/md");
    let plain = |name: &str, pool: &str, md: Option<&str>| {
        (claim(name, pool, md, json!({})), node(name, json!({})))
    };
    vec![
        plain("ok", "p", md),
        plain("never", "never", md),
        plain("later", "later", md),
        plain("nominated", "p", md),
        plain("paused", "paused", md),
        plain("static", "static", md),
        (
            claim("dnd", "p", md, json!({})),
            node("dnd", json!({DO_NOT_DISRUPT_ANNOTATION: "true"})),
        ),
        plain("pdb", "p", md),
        plain("min", "p", Some("ns/md-min")),
        plain("roll", "p", Some("ns/md-roll")),
        plain("buffer", "p", md),
        (
            claim("new", "p", md, json!({"status": {"conditions": []}})),
            node("new", json!({})),
        ),
        plain("gone", "gone", md),
        plain("adopting", "p", None),
        (
            claim(
                "instance",
                "p",
                md,
                json!({"metadata": {"annotations": {INSTANCE_ANNOTATION: "i-1"}}}),
            ),
            node("instance", json!({})),
        ),
    ]
}

fn state() -> crate::state::State {
    let state = crate::state::State::default();
    let (claims, nodes): (Vec<NodeClaim>, Vec<Node>) = claims().into_iter().unzip();
    state.claims.write().replace_all(claims);
    state
        .nodes
        .write()
        .replace_all(nodes.into_iter().map(CompactNode::new).collect());
    state.pods.write().replace_all(vec![pod_on("n-pdb")]);
    Index::reset(&mut *state.pdbs.write(), vec![Arc::new(guarding_pdb())]);
    let pools = vec![
        pool("p", json!({})),
        pool(
            "never",
            json!({"spec": {"disruption": {"consolidateAfter": "Never"}}}),
        ),
        pool(
            "later",
            json!({"spec": {"disruption": {"consolidateAfter": "1h"}}}),
        ),
        pool(
            "paused",
            json!({"metadata": {"annotations": {DISRUPTION_PAUSED_ANNOTATION: "true"}}}),
        ),
        pool("static", json!({"spec": {"replicas": 1}})),
    ];
    Index::reset(
        &mut *state.nodepools.write(),
        pools.into_iter().map(Lenient::Ok).collect(),
    );
    state.deployments.write().replace_all(
        crate::capi::ScalableKind::MachineDeployment,
        vec![
            deployment("md", 20, json!({})),
            deployment("md-min", 1, json!({MIN_SIZE_ANNOTATION: "1"})),
            deployment("md-roll", 20, json!({})),
        ],
    );
    state.machines.write().replace_all(vec![outdated_machine()]);
    let hosts = HashMap::from([("buf".to_string(), HashSet::from(["n-buffer".to_string()]))]);
    state.buffers.write().set_hosts(hosts);
    state
}

/// Every hold the view files names the blocker the docs' table gives it, whether the claim is
/// held whole (blocked), held from consolidation only (a candidate with a hold) or not weighed.
#[test]
fn the_views_holds_name_their_blockers() {
    let state = state();
    let catalog = crate::view::CatalogView::default();
    let settings = crate::view::Settings::default();
    let inputs = Inputs {
        state: &state,
        catalog: &catalog,
        settings: &settings,
    };
    let pdbs = state.pdbs.read().all().clone();
    let (none, nominated) = (HashSet::new(), HashSet::from(["nominated".to_string()]));
    let pod_events = HashMap::new();
    let mem = Memory {
        pdbs: &pdbs,
        pod_events: &pod_events,
        started: "2026-01-01T09:30:00Z".parse().expect("a time"),
        executing: &none,
        nominated: &nominated,
        now: "2026-01-01T10:00:00Z".parse().expect("a time"),
        keep_held: true,
    };
    let v = gather(inputs, &mem);
    let mut found: BTreeMap<String, Option<Blocker>> = BTreeMap::new();
    for (c, hold) in &v.blocked {
        found.insert(c.name_any(), Some(hold.blocker));
    }
    for c in &v.candidates {
        found.insert(c.claim.clone(), c.hold.as_ref().map(|h| h.blocker));
    }
    for (name, _, blocker) in &v.skipped {
        found.insert(name.clone(), *blocker);
    }
    let expected = BTreeMap::from([
        ("ok", None),
        ("never", Some(Blocker::ConsolidationDisabled)),
        ("later", Some(Blocker::NotConsolidatable)),
        ("nominated", Some(Blocker::Nominated)),
        ("paused", Some(Blocker::Paused)),
        ("static", Some(Blocker::StaticPool)),
        ("dnd", Some(Blocker::DoNotDisrupt)),
        ("pdb", Some(Blocker::Pdb)),
        ("min", Some(Blocker::MinSize)),
        ("roll", Some(Blocker::RollingOut)),
        ("buffer", Some(Blocker::BufferPods)),
        ("new", Some(Blocker::NotInitialized)),
        ("gone", Some(Blocker::Unmanaged)),
        ("adopting", Some(Blocker::Unmanaged)),
        ("instance", Some(Blocker::NotRemovable)),
    ]);
    let expected: BTreeMap<String, Option<Blocker>> = expected
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(found, expected, "blocked {:?}", v.blocked);
    // `explain node --remove` keeps the candidate of each claim held whole.
    assert_eq!(v.held_candidates.len(), v.blocked.len());
}
