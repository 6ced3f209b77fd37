use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::*;
use crate::api::wellknown::DO_NOT_DISRUPT_ANNOTATION;

/// Why the claim may not be disrupted voluntarily, if anything protects it.
fn protected(
    c: &NodeClaim,
    node: &CompactNode,
    on_node: &[Arc<Pod>],
    pdbs: &PdbIndex,
    now: Timestamp,
) -> Option<crate::disruption::Hold> {
    let summaries: Vec<PodSummary> = on_node.iter().map(|p| PodSummary::of(p)).collect();
    let summaries: Vec<&PodSummary> = summaries.iter().collect();
    node_protected(c, node).or_else(|| pods_protected(&summaries, pdbs, now))
}

fn at(t: &str) -> Timestamp {
    t.parse().expect("a timestamp")
}

fn claim_with(conditions: serde_json::Value, deleting: bool) -> NodeClaim {
    let mut c: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": "c"},
        "spec": {"requirements": [], "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}},
        "status": {"conditions": conditions}
    }))
    .expect("a NodeClaim");
    if deleting {
        c.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            at("2026-01-01T09:00:00Z"),
        ));
    }
    c
}

fn node_with(ready: &str) -> CompactNode {
    CompactNode::new(
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}
        }))
        .expect("a Node"),
    )
}

fn cond(ty: &str) -> serde_json::Value {
    json!({"type": ty, "status": "True", "reason": ty, "lastTransitionTime": "2026-01-01T08:00:00Z"})
}

fn pod_of(extra: serde_json::Value) -> Arc<Pod> {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "a"}},
        "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "startTime": "2026-01-01T09:59:00Z"}
    });
    crate::testing::merge(&mut v, extra);
    Arc::new(serde_json::from_value(v).expect("a Pod"))
}

fn pdb_index(spec: serde_json::Value, allowed: i32) -> PdbIndex {
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "b", "namespace": "ns"},
        "spec": spec,
        "status": {"disruptionsAllowed": allowed, "currentHealthy": 0, "desiredHealthy": 0,
                   "expectedPods": 1}
    }))
    .expect("a PDB");
    PdbIndex::new(&BTreeMap::from([("ns/b".to_string(), Arc::new(pdb))]))
}

/// Audit rows 8, 9, 10 and 24: which pods protect their node from voluntary disruption.
#[test]
fn candidates_are_protected_as_upstream_protects_them() {
    let now = at("2026-01-01T10:00:00Z");
    let claim = claim_with(json!([]), false);
    let node = node_with("True");
    let none = pdb_index(json!({"selector": {"matchLabels": {"other": "x"}}}), 0);
    let protects = |p: Arc<Pod>, pdbs: &PdbIndex| protected(&claim, &node, &[p], pdbs, now);

    // do-not-disrupt as a duration: protects until the pod has run that long.
    let dnd =
        |v: &str| pod_of(json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: v}}}));
    assert!(
        protects(dnd("30m"), &none).is_some(),
        "started a minute ago"
    );
    assert!(protects(dnd("30s"), &none).is_none(), "ran past its 30s");
    assert!(protects(dnd("true"), &none).is_some());
    assert!(
        protects(dnd("soon"), &none).is_none(),
        "an invalid value protects nothing"
    );

    // A terminating pod protects nothing, do-not-disrupt or not.
    let terminating = pod_of(json!({"metadata": {
        "annotations": {DO_NOT_DISRUPT_ANNOTATION: "true"},
        "deletionTimestamp": "2026-01-01T09:59:30Z"}}));
    assert!(protects(terminating, &none).is_none());

    // A PDB that allows no disruption protects its pods, DaemonSet pods included...
    let blocking = pdb_index(json!({"selector": {"matchLabels": {"app": "a"}}}), 0);
    assert!(protects(pod_of(json!({})), &blocking).is_some());
    let daemon = pod_of(
        json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1",
        "kind": "DaemonSet", "name": "ds", "uid": "d", "controller": true}]}}),
    );
    assert!(protects(daemon, &blocking).is_some());
    // ...but not a pod that tolerates the disrupted taint (a drain leaves it).
    let tolerating = pod_of(json!({"spec": {"tolerations": [
        {"key": "karpenter.sh/disrupted", "operator": "Exists", "effect": "NoSchedule"}]}}));
    assert!(protects(tolerating, &blocking).is_none());

    // AlwaysAllow: an unhealthy pod may always be evicted; a healthy one is protected.
    let always = pdb_index(
        json!({"selector": {"matchLabels": {"app": "a"}},
               "unhealthyPodEvictionPolicy": "AlwaysAllow"}),
        0,
    );
    let unready = pod_of(json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}));
    assert!(protects(unready, &always).is_none());
    let ready = pod_of(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
    assert!(protects(ready, &always).is_some());
}

/// Audit rows 5 and 19: NotReady Nodes use up the budget; only initialized claims count,
/// and not once their instance is terminating.
#[test]
fn budgets_count_as_upstream_does() {
    let now = at("2026-01-01T10:00:00Z");
    let initialized = claim_with(json!([cond("Initialized")]), false);
    let standing =
        |c: &NodeClaim, ready: &str| budget_standing(c, Some(&node_with(ready)), false, now);
    assert_eq!(
        standing(&initialized, "True"),
        BudgetStanding {
            counted: true,
            disrupting: false,
            down: false
        }
    );
    assert_eq!(
        standing(&initialized, "False"),
        BudgetStanding {
            counted: true,
            disrupting: true,
            down: true
        },
        "a NotReady node is disrupting"
    );
    assert_eq!(
        standing(&initialized, "Unknown"),
        BudgetStanding {
            counted: true,
            disrupting: true,
            down: true
        }
    );
    let failed_launch = claim_with(json!([]), true);
    assert_eq!(
        standing(&failed_launch, "True"),
        BudgetStanding {
            counted: false,
            disrupting: false,
            down: false
        },
        "a deleting claim that never initialized uses no budget"
    );
    let terminating = claim_with(
        json!([cond("Initialized"), cond("InstanceTerminating")]),
        true,
    );
    assert_eq!(
        standing(&terminating, "True"),
        BudgetStanding {
            counted: false,
            disrupting: false,
            down: false
        }
    );
    let leaving = claim_with(json!([cond("Initialized")]), true);
    assert_eq!(
        standing(&leaving, "True"),
        BudgetStanding {
            counted: true,
            disrupting: true,
            down: false
        }
    );
    // Its Node already gone while the claim is deleted: still counted, and disrupting.
    assert_eq!(
        budget_standing(&leaving, None, false, now),
        BudgetStanding {
            counted: true,
            disrupting: true,
            down: false
        }
    );

    // Marked by a command rolled back a moment ago (its marks not yet removed): disrupting
    // until they go, as the cluster shows it.
    let still_marked = claim_with(
        json!([cond("Initialized"), cond("DisruptionReason")]),
        false,
    );
    assert_eq!(
        standing(&still_marked, "True"),
        BudgetStanding {
            counted: true,
            disrupting: true,
            down: false
        },
        "a claim still marked uses the budget"
    );

    // 10 initialized claims, 3 of their Nodes NotReady, the default 10 % budget: nothing
    // more may be disrupted.
    let np: NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
        "spec": {"template": {"spec": {"requirements": [],
                    "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}}}}
    }))
    .expect("a NodePool");
    let (mut total, mut busy) = (0, 0);
    for i in 0..10 {
        let s = standing(&initialized, if i < 3 { "False" } else { "True" });
        total += usize::from(s.counted);
        busy += usize::from(s.disrupting);
    }
    // Two more claims deleting before they ever initialized: outside the count.
    for _ in 0..2 {
        let s = standing(&failed_launch, "True");
        total += usize::from(s.counted);
        busy += usize::from(s.disrupting);
    }
    let allowed = crate::disruption::budgets::allowed(
        &np,
        DisruptionReason::Underutilized,
        total,
        busy,
        now.as_second(),
    );
    assert_eq!((total, busy, allowed), (10, 3, 0));
}

#[test]
fn consolidate_after_never_counts_from_before_the_actor_started() {
    let np: NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
        "spec": {"template": {"spec": {"requirements": [],
                    "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}}},
                 "disruption": {"consolidateAfter": "60s"}}
    }))
    .expect("a NodePool");
    // Initialized an hour ago, no pod event seen since.
    let claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": "c"},
        "spec": {"requirements": [], "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}},
        "status": {"conditions": [{"type": "Initialized", "status": "True",
            "reason": "Initialized", "lastTransitionTime": "2026-01-01T09:00:00Z"}]}
    }))
    .expect("a NodeClaim");
    let pdbs = BTreeMap::new();
    let executing = HashSet::new();
    let mut pod_events = HashMap::new();
    let memory = |started: &str, pod_events: &HashMap<String, Timestamp>| -> bool {
        let mem = Memory {
            pdbs: &pdbs,
            pod_events,
            started: at(started),
            executing: &executing,
            nominated: &executing,
            now: at("2026-01-01T10:00:00Z"),
            keep_held: false,
        };
        consolidatable(
            &claim,
            &np,
            mem.pod_events.get("n").copied(),
            mem.started,
            mem.now,
        )
    };
    // The actor started 30 s ago: it waits, though the node was idle for an hour.
    assert!(!memory("2026-01-01T09:59:30Z", &pod_events));
    // Started long enough ago.
    assert!(memory("2026-01-01T09:58:00Z", &pod_events));
    // A pod event 10 s ago restarts the countdown.
    pod_events.insert("n".to_string(), at("2026-01-01T09:59:50Z"));
    assert!(!memory("2026-01-01T09:00:00Z", &pod_events));
}

/// Parity row 30: Cluster Autoscaler's min size holds consolidation off a group at it.
#[test]
fn a_group_at_its_min_size_gives_up_no_node_to_consolidation() {
    let group = |replicas: i32, min: Option<&str>| {
        let mut annotations = json!({});
        if let Some(min) = min {
            annotations = json!({crate::api::wellknown::MIN_SIZE_ANNOTATION: min});
        }
        let v = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineDeployment",
            "metadata": {"name": "md", "namespace": "ns", "uid": "u", "resourceVersion": "1",
                         "annotations": annotations},
            "spec": {"clusterName": "c", "replicas": replicas,
                     "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": "md"}},
                     "template": {"spec": {"clusterName": "c", "bootstrap": {"dataSecretName": "x"},
                         "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                                               "kind": "DevMachineTemplate", "name": "t"}}}}
        });
        crate::capi::model::MachineDeployment::from_value(
            &v,
            crate::capi::version::CapiVersion::V1Beta1,
        )
        .expect("a MachineDeployment")
    };
    let why = at_min_size(&group(2, Some("2"))).expect("held at its min size");
    assert!(why.contains("min 2"), "{why}");
    assert!(at_min_size(&group(1, Some("+2"))).is_some());
    assert_eq!(at_min_size(&group(3, Some("2"))), None);
    assert_eq!(at_min_size(&group(0, Some("0"))), None);
    assert_eq!(at_min_size(&group(1, None)), None);
}

/// Repair's own budget does not count a node merely down: with the default 10 % of ten nodes,
/// the one NotReady node would otherwise use the only slot its repair needs. A repair under
/// way does count, and every other reason still counts the NotReady node.
#[test]
fn a_down_node_does_not_use_up_its_own_repair_budget() {
    let now = at("2026-01-01T10:00:00Z");
    let np = Arc::new(crate::testing::nodepool("default"));
    let pools: HashMap<String, Arc<NodePool>> = [("default".to_string(), np)].into();
    let initialized = claim_with(json!([cond("Initialized")]), false);
    let count = |down: usize, repairing: usize| {
        let mut count = BudgetCount::default();
        for i in 0..10 {
            let ready = if i < down + repairing {
                "False"
            } else {
                "True"
            };
            let executing = i >= down && i < down + repairing;
            count.add(budget_standing(
                &initialized,
                Some(&node_with(ready)),
                executing,
                now,
            ));
        }
        [("default".to_string(), count)].into()
    };
    let allowed = |counts: &HashMap<String, BudgetCount>, reason| {
        budget::allow(&pools, counts, now).0[&("default".to_string(), reason)]
    };
    let one_down = count(1, 0);
    assert_eq!(allowed(&one_down, DisruptionReason::Unhealthy), 1);
    assert_eq!(allowed(&one_down, DisruptionReason::Drifted), 0);
    let one_repairing = count(1, 1);
    assert_eq!(allowed(&one_repairing, DisruptionReason::Unhealthy), 0);
}

/// `karpenter.sh/do-not-repair: "true"` on the claim or its Node vetoes repair (no other value
/// does); `do-not-disrupt` does not; the operator's pause and a paused MachineDeployment hold it.
#[test]
fn do_not_repair_true_vetoes_and_do_not_disrupt_does_not() {
    use crate::api::wellknown::DO_NOT_REPAIR_ANNOTATION;
    let np = crate::testing::nodepool("default");
    let annotated = |key: &str, value: &str| {
        let mut c = claim_with(json!([cond("Initialized")]), false);
        c.metadata.annotations = Some([(key.to_string(), value.to_string())].into());
        c
    };
    let node = node_with("False");
    let held = |c: &NodeClaim, n: &CompactNode| repair::held(c, n, &np, false, None);
    assert!(
        held(&annotated(DO_NOT_REPAIR_ANNOTATION, "true"), &node)
            .is_some_and(|why| why.contains("on the NodeClaim"))
    );
    assert_eq!(
        held(&annotated(DO_NOT_REPAIR_ANNOTATION, "false"), &node),
        None
    );
    assert_eq!(
        held(&annotated(DO_NOT_DISRUPT_ANNOTATION, "true"), &node),
        None
    );
    let mut on_node = node.node();
    on_node.metadata.annotations = Some([(DO_NOT_REPAIR_ANNOTATION.into(), "true".into())].into());
    let on_node = CompactNode::new(on_node);
    let plain = claim_with(json!([cond("Initialized")]), false);
    assert!(held(&plain, &on_node).is_some_and(|why| why.contains("on the Node")));
    assert!(
        repair::held(&plain, &node, &np, true, None).is_some(),
        "operator pause"
    );
    assert_eq!(
        repair::held(&plain, &node, &np, false, Some("paused".into())).as_deref(),
        Some("paused")
    );
}

mod blockers;
