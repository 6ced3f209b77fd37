use super::*;
use serde_json::json;

use crate::api::wellknown::{DISRUPTED_TAINT_KEY, DO_NOT_DISRUPT_ANNOTATION};

fn pod(extra: serde_json::Value) -> Pod {
    let mut v = json!({
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    });
    json_patch_merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn json_patch_merge(a: &mut serde_json::Value, b: serde_json::Value) {
    if let (Some(a), serde_json::Value::Object(b)) = (a.as_object_mut(), &b) {
        for (k, v) in b {
            match a.get_mut(k) {
                Some(existing) if existing.is_object() && v.is_object() => {
                    json_patch_merge(existing, v.clone())
                }
                _ => {
                    a.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

fn daemon(name: &str, uid: &str, created: &str) -> Pod {
    pod(json!({"metadata": {
        "name": name,
        "creationTimestamp": created,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": uid, "controller": true}]
    }}))
}

#[test]
fn daemonset_pods_are_summed_apart_on_their_node() {
    let mut idx = Pods::default();
    let on = |p: Pod, node: &str, cpu: &str| {
        let mut v = serde_json::to_value(p).unwrap();
        json_patch_merge(
            &mut v,
            json!({"spec": {"nodeName": node, "containers": [{"name": "c",
                    "resources": {"requests": {"cpu": cpu}}}]},
                   "status": {"phase": "Running"}}),
        );
        serde_json::from_value::<Pod>(v).unwrap()
    };
    idx.apply(on(daemon("ds", "u1", "2024-01-01T00:00:00Z"), "n1", "200m"));
    idx.apply(on(pod(json!({"metadata": {"name": "app"}})), "n1", "1"));
    let ds = idx.daemon_requested_on("n1");
    assert_eq!(ds.get("cpu"), "200m".parse().unwrap());
    assert_eq!(ds.get("pods"), Quantity::from_units(1));
    assert_eq!(idx.requested_on("n1").get("cpu"), "1200m".parse().unwrap());
    // The DaemonSet pod leaves: nothing of it is left on the node.
    assert!(idx.remove("ns/ds"));
    assert_eq!(idx.daemon_requested_on("n1"), Resources::new());
    assert_eq!(idx.requested_on("n1").get("cpu"), "1".parse().unwrap());
}

#[test]
fn the_newest_pod_of_each_daemonset_is_found() {
    let mut idx = Pods::default();
    let name = |p: Option<Arc<Pod>>| p.map(|p| p.name_any());
    idx.apply(daemon("a", "u1", "2024-01-01T00:00:00Z"));
    idx.apply(daemon("b", "u1", "2024-01-02T00:00:00Z"));
    idx.apply(daemon("c", "u1", "2024-01-01T12:00:00Z"));
    idx.apply(daemon("x", "u2", "2024-01-01T00:00:00Z"));
    assert_eq!(name(idx.daemonset_pod("u1")).as_deref(), Some("b"));
    assert_eq!(name(idx.daemonset_pod("u2")).as_deref(), Some("x"));
    // An update of the newest keeps it; its removal falls back to the next newest.
    idx.apply(daemon("b", "u1", "2024-01-02T00:00:00Z"));
    assert_eq!(name(idx.daemonset_pod("u1")).as_deref(), Some("b"));
    idx.remove("ns/b");
    assert_eq!(name(idx.daemonset_pod("u1")).as_deref(), Some("c"));
    idx.remove("ns/x");
    assert_eq!(idx.daemonset_pod("u2"), None);
    assert_eq!(idx.daemonset_pod("unknown"), None);
}

#[test]
fn provisionable_follows_karpenter() {
    assert!(is_provisionable(&pod(json!({}))));
    assert!(!is_provisionable(&pod(json!({"spec": {"nodeName": "n"}}))));
    assert!(!is_provisionable(&pod(
        json!({"status": {"nominatedNodeName": "n"}})
    )));
    assert!(!is_provisionable(&pod(
        json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}})
    )));
    assert!(!is_provisionable(&pod(
        json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]}})
    )));
    assert!(!is_provisionable(&pod(
        json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}]}})
    )));
}

/// Karpenter v1.15's #3120 stops counting a pod as undecided once it has a node or is finished,
/// whatever its `PodScheduled` condition still says (a binding lands before the kubelet flips
/// the condition; a pod can fail while pending). Here such a pod is no longer pending: no solve
/// plans for it and `karpenter_scheduler_unschedulable_pods_count` cannot count it.
#[test]
fn a_bound_or_finished_pod_is_not_pending_whatever_its_condition_says() {
    // The default pod below still reads `PodScheduled=False`, reason `Unschedulable`.
    assert!(is_provisionable(&pod(json!({}))));
    assert!(!is_provisionable(&pod(json!({"spec": {"nodeName": "n"}}))));
    for phase in ["Failed", "Succeeded"] {
        assert!(
            !is_provisionable(&pod(json!({"status": {"phase": phase}}))),
            "{phase}"
        );
    }
    let mut pods = Pods::default();
    pods.apply(pod(json!({})));
    assert_eq!(pods.provisionable_count(), 1);
    pods.apply(pod(json!({"status": {"phase": "Failed"}})));
    assert_eq!(pods.provisionable_count(), 0);
}

#[test]
fn index_tracks_binding() {
    let mut pods = Pods::default();
    assert!(pods.apply(pod(json!({}))));
    assert_eq!(pods.provisionable_count(), 1);
    pods.apply(pod(
        json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running", "conditions": []}}),
    ));
    assert_eq!(pods.provisionable_count(), 0);
    assert_eq!(pods.on_node("n1").len(), 1);
    pods.remove("ns/p");
    assert!(pods.on_node("n1").is_empty());
}

#[test]
fn bound_pods_read_back_whole_and_sum_per_node() {
    let mut pods = Pods::default();
    let bound = |name: &str, node: &str, cpu: &str| {
        let mut p = pod(json!({
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Running", "conditions": []},
            "metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}
        }));
        p.metadata.name = Some(name.into());
        p
    };
    let a = bound("a", "n1", "100m");
    pods.apply(a.clone());
    pods.apply(bound("b", "n1", "250m"));
    pods.apply(bound("c", "n2", "1"));
    // What comes back is the trimmed pod, field for field.
    let mut trimmed = a;
    crate::state::trim::pod(&mut trimmed);
    assert_eq!(pods.get("ns/a").as_deref(), Some(&trimmed));
    assert_eq!(pods.on_node("n1").len(), 2);
    assert_eq!(pods.bound().len(), 3);
    let sum = |node: &str| {
        pods.on_node(node)
            .iter()
            .filter_map(|p| adds(p))
            .fold(Resources::new(), |acc, r| acc.add(&r))
    };
    assert_eq!(pods.requested_on("n1"), sum("n1"));
    assert_eq!(pods.requested_on("n1").get("cpu"), "350m".parse().unwrap());
    assert_eq!(pods.requested_on("n1").get("pods"), Quantity::from_units(2));
    // An update and a removal move the sums with them.
    pods.apply(bound("b", "n2", "250m"));
    assert_eq!(pods.requested_on("n1").get("cpu"), "100m".parse().unwrap());
    assert_eq!(pods.requested_on("n2").get("pods"), Quantity::from_units(2));
    assert!(pods.remove("ns/a"));
    assert_eq!(pods.requested_on("n1"), Resources::new());
    assert!(pods.on_node("n1").is_empty());
    // A terminal pod no longer counts on its node.
    let mut done = bound("c", "n2", "1");
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    pods.apply(done);
    assert_eq!(pods.requested_on("n2").get("cpu"), "250m".parse().unwrap());
    assert!(pods.get("ns/c").is_some());
}

/// What the index stores of a packed pod, as JSON (the prototype with the patch applied).
fn stored_json(pods: &Pods, key: &str) -> serde_json::Value {
    match &pods.by_key[key].stored {
        Stored::Patched(p) => p.value().unwrap(),
        Stored::Packed(bytes) => serde_json::from_slice(bytes).unwrap(),
        Stored::Whole(_) => panic!("{key} is kept whole"),
    }
}

/// The name and node name are the entry's already (its key, its node): the stored JSON holds
/// neither, and every pod still reads back exactly as it went in, trimmed, whether it had a
/// node, an empty node name, or no name at all (a key from `generateName`).
#[test]
fn packed_pods_store_no_second_name_and_read_back_whole() {
    let mut pods = Pods::default();
    let running = |extra: serde_json::Value| {
        let mut p = pod(json!({"status": {"phase": "Running", "conditions": []}}));
        let mut v = serde_json::to_value(&p).unwrap();
        json_patch_merge(&mut v, extra);
        p = serde_json::from_value(v).unwrap();
        p
    };
    let bound = running(json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n1"}}));
    let unbound = running(json!({"metadata": {"name": "b"}, "spec": {"nodeName": ""}}));
    let mut unnamed =
        running(json!({"metadata": {"generateName": "g-"}, "spec": {"nodeName": "n2"}}));
    unnamed.metadata.name = None;
    for p in [&bound, &unbound, &unnamed] {
        pods.apply(p.clone());
    }
    let a = stored_json(&pods, "ns/a");
    assert_eq!(a["metadata"].get("name"), None);
    assert_eq!(a["spec"].get("nodeName"), None);
    // An empty node name is not the entry's node: it stays in the JSON.
    assert_eq!(stored_json(&pods, "ns/b")["spec"]["nodeName"], "");
    // Without a name the key is not the name: nothing is taken out.
    assert_eq!(stored_json(&pods, "ns/g-")["spec"]["nodeName"], "n2");
    for (key, mut p) in [("ns/a", bound), ("ns/b", unbound), ("ns/g-", unnamed)] {
        crate::state::trim::pod(&mut p);
        assert_eq!(pods.get(key).as_deref(), Some(&p), "{key}");
    }
    assert_eq!(pods.on_node("n1").len(), 1);
    assert_eq!(pods.on_node("n1")[0].metadata.name.as_deref(), Some("a"));
}

#[test]
fn counts_pods_with_inter_pod_constraints_and_host_ports() {
    let mut pods = Pods::default();
    pods.apply(pod(
        json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}),
    ));
    assert!(!pods.any_with_pod_terms());
    assert!(pods.bound_with_host_ports().is_empty());
    let mut spread = pod(json!({"spec": {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]}}));
    spread.metadata.name = Some("s".into());
    pods.apply(spread);
    assert!(pods.any_with_pod_terms());
    pods.remove("ns/s");
    assert!(!pods.any_with_pod_terms());
    let mut ported = pod(
        json!({"spec": {"nodeName": "n1", "containers": [{"name": "c",
        "ports": [{"containerPort": 80, "hostPort": 80}]}]}, "status": {"phase": "Running"}}),
    );
    ported.metadata.name = Some("h".into());
    pods.apply(ported);
    assert_eq!(pods.bound_with_host_ports().len(), 1);
}

#[test]
fn pod_events_are_scheduling_and_termination() {
    let now: Timestamp = "2026-01-01T10:00:00Z".parse().unwrap();
    let sched = "2026-01-01T09:00:00Z";
    let bound = pod(
        json!({"spec": {"nodeName": "n"}, "status": {"phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": sched}]}}),
    );
    let pending = pod(json!({}));
    // Scheduled: the condition's transition time, once.
    assert_eq!(
        pod_event_time(Some(&pending), &bound, now),
        Some(sched.parse().unwrap())
    );
    assert_eq!(
        pod_event_time(None, &bound, now),
        Some(sched.parse().unwrap())
    );
    assert_eq!(pod_event_time(Some(&bound), &bound, now), None);
    // Terminating or terminal: now, once.
    let mut going = bound.clone();
    going.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    assert_eq!(pod_event_time(Some(&bound), &going, now), Some(now));
    assert_eq!(pod_event_time(Some(&going), &going, now), None);
    let mut done = bound.clone();
    if let Some(s) = done.status.as_mut() {
        s.phase = Some("Succeeded".into());
    }
    assert_eq!(pod_event_time(Some(&bound), &done, now), Some(now));
    // Not on a node, or a DaemonSet pod: no event.
    assert_eq!(pod_event_time(None, &pending, now), None);
    let mut ds = bound.clone();
    ds.metadata.owner_references = Some(vec![serde_json::from_value(json!(
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}
    )).unwrap()]);
    assert_eq!(pod_event_time(None, &ds, now), None);
}

/// What `karpenter_pods_disruption_initiated_total` adds for a node (upstream's
/// `ReschedulablePods`): its running pods, not its DaemonSet or static (mirror) pods, nor pods of
/// other nodes.
#[test]
fn reschedulable_pods_of_a_node_leave_daemonset_and_static_pods_out() {
    let mut idx = Pods::default();
    let on = |p: Pod, node: &str| {
        let mut v = serde_json::to_value(p).unwrap();
        json_patch_merge(
            &mut v,
            json!({"spec": {"nodeName": node}, "status": {"phase": "Running"}}),
        );
        serde_json::from_value::<Pod>(v).unwrap()
    };
    idx.apply(on(pod(json!({"metadata": {"name": "a"}})), "n1"));
    idx.apply(on(pod(json!({"metadata": {"name": "b"}})), "n1"));
    idx.apply(on(daemon("ds", "u1", "2024-01-01T00:00:00Z"), "n1"));
    idx.apply(on(
        pod(json!({"metadata": {"name": "static",
            "annotations": {"kubernetes.io/config.mirror": "x"}}})),
        "n1",
    ));
    idx.apply(on(pod(json!({"metadata": {"name": "elsewhere"}})), "n2"));
    assert_eq!(idx.on_node("n1").len(), 4);
    assert_eq!(idx.reschedulable_on_node("n1"), 2);
    assert_eq!(idx.reschedulable_on_node("n2"), 1);
    assert_eq!(idx.reschedulable_on_node("gone"), 0);
}

/// Every fact of `s` is what the rule in this module says of `p` (the summary's one promise).
fn assert_summarises(s: &PodSummary, p: &Pod, at: &[Timestamp]) {
    assert_eq!(s.key(), key(p));
    assert_eq!(s.namespace(), p.namespace().unwrap_or_default());
    assert_eq!(s.labels(), p.labels());
    assert_eq!(s.is_active(), is_active(p), "{}", s.key());
    assert_eq!(s.is_reschedulable(), is_reschedulable(p), "{}", s.key());
    assert_eq!(s.is_daemonset(), is_daemonset_pod(p), "{}", s.key());
    assert_eq!(s.not_ready(), not_ready(p), "{}", s.key());
    assert_eq!(s.eviction_cost(), pod_eviction_cost(p), "{}", s.key());
    for now in at {
        assert_eq!(
            s.do_not_disrupt(*now),
            do_not_disrupt(p, *now),
            "{} at {now}",
            s.key()
        );
        assert_eq!(
            s.is_evictable(*now),
            is_evictable(p, *now),
            "{} at {now}",
            s.key()
        );
    }
}

#[test]
fn summaries_follow_their_pods_through_updates_moves_and_deletes() {
    let at: Vec<Timestamp> = [
        "2026-01-01T10:00:00Z",
        "2026-01-01T10:29:00Z",
        "2026-01-01T11:00:00Z",
    ]
    .iter()
    .map(|t| t.parse().unwrap())
    .collect();
    let bound = |name: &str, node: &str, extra: serde_json::Value| {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {"app": "web"}},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "startTime": "2026-01-01T10:00:00Z",
                       "conditions": [{"type": "Ready", "status": "True"}]}
        });
        json_patch_merge(&mut v, extra);
        serde_json::from_value::<Pod>(v).unwrap()
    };
    let pods = [
        bound("plain", "n1", json!({})),
        bound(
            "for-30m",
            "n1",
            json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "30m"}}}),
        ),
        bound(
            "invalid",
            "n1",
            json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "soon"}}}),
        ),
        bound(
            "costly",
            "n1",
            json!({"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "100"}},
                                     "spec": {"priority": 1000}}),
        ),
        bound(
            "unready",
            "n1",
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        ),
        bound(
            "tolerant",
            "n1",
            json!({"spec": {"tolerations": [{"key": DISRUPTED_TAINT_KEY, "operator": "Exists"}]}}),
        ),
        bound(
            "ds",
            "n1",
            json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                 "name": "d", "uid": "u", "controller": true}]}}),
        ),
        bound(
            "sts-going",
            "n1",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T10:00:00Z",
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "s", "uid": "s"}]}}),
        ),
    ];
    let mut idx = Pods::default();
    for p in &pods {
        idx.apply(p.clone());
    }
    let check = |idx: &Pods, node: &str| {
        let summaries = idx.summaries_on(node);
        let decoded = idx.on_node(node);
        assert_eq!(summaries.len(), decoded.len(), "{node}");
        for p in decoded {
            let s = summaries.iter().find(|s| s.key() == key(&p));
            assert_summarises(s.expect("a summary for every pod"), &p, &at);
        }
    };
    check(&idx, "n1");
    assert_eq!(idx.summaries_on("n1").len(), pods.len());
    // Pods of one template share one copy of their labels.
    let summaries = idx.summaries_on("n1");
    assert!(
        summaries
            .windows(2)
            .all(|w| std::ptr::eq(w[0].labels(), w[1].labels()))
    );
    // An update: protected now, other labels, another node.
    idx.apply(bound(
        "plain",
        "n2",
        json!({"metadata": {"labels": {"app": "api"},
        "annotations": {DO_NOT_DISRUPT_ANNOTATION: "true"}}}),
    ));
    check(&idx, "n1");
    check(&idx, "n2");
    let moved = idx.summaries_on("n2");
    assert_eq!(moved.len(), 1);
    assert!(moved[0].do_not_disrupt(at[2]));
    assert_eq!(
        moved[0].labels().get("app").map(String::as_str),
        Some("api")
    );
    // A terminal pod leaves its node's summaries; a deleted one leaves them too.
    idx.apply(bound(
        "costly",
        "n1",
        json!({"status": {"phase": "Succeeded"}}),
    ));
    assert!(idx.remove("ns/ds"));
    check(&idx, "n1");
    assert_eq!(idx.summaries_on("n1").len(), pods.len() - 3);
    assert_eq!(idx.reschedulable_on_node("n1"), 5);
    idx.remove("ns/plain");
    assert!(idx.summaries_on("n2").is_empty());
}

#[test]
fn do_not_disrupt_protects_for_its_duration_from_the_pod_start() {
    let dnd = |value: &str, started: Option<&str>| {
        let mut p = pod(json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: value}}}));
        if let (Some(s), Some(t)) = (p.status.as_mut(), started) {
            s.start_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                t.parse().unwrap(),
            ));
        }
        do_not_disrupt_protection(&p)
    };
    let t = |s: &str| s.parse::<Timestamp>().unwrap();
    assert_eq!(dnd("true", None), Some(Protection::Always));
    assert_eq!(dnd("30m", None), Some(Protection::Always));
    assert_eq!(
        dnd("30m", Some("2026-01-01T10:00:00Z")),
        Some(Protection::Until(t("2026-01-01T10:30:00Z")))
    );
    assert_eq!(dnd("false", Some("2026-01-01T10:00:00Z")), None);
    let until = Protection::Until(t("2026-01-01T10:30:00Z"));
    assert!(until.holds_at(t("2026-01-01T10:29:59Z")));
    assert!(!until.holds_at(t("2026-01-01T10:30:00Z")));
}

fn with_annotations(annotations: serde_json::Value) -> Pod {
    pod(json!({"metadata": {"annotations": annotations}}))
}

#[test]
fn disruption_cost_annotation_wins() {
    let p = with_annotations(json!({
        "karpenter.sh/disruption-cost": "-1000000000",
        "controller.kubernetes.io/pod-deletion-cost": "1000000000",
    }));
    assert_eq!(steering_cost(&p), Some("-1000000000"));
    assert!(pod_eviction_cost(&p) < 1.0);
    // And over a managed deletion cost too.
    let p = with_annotations(json!({
        "karpenter.sh/disruption-cost": "1000000000",
        "controller.kubernetes.io/pod-deletion-cost": "-5",
        "karpenter.sh/managed-deletion-cost": "true",
    }));
    assert!(pod_eviction_cost(&p) > 1.0);
}

#[test]
fn a_managed_deletion_cost_is_ignored_for_consolidation() {
    let users =
        with_annotations(json!({"controller.kubernetes.io/pod-deletion-cost": "1000000000"}));
    assert!(
        pod_eviction_cost(&users) > 1.0,
        "the owner's deletion cost steers"
    );
    let managed = with_annotations(json!({
        "controller.kubernetes.io/pod-deletion-cost": "1000000000",
        "karpenter.sh/managed-deletion-cost": "true",
    }));
    assert!(deletion_cost_managed(&managed));
    assert_eq!(steering_cost(&managed), None);
    assert_eq!(pod_eviction_cost(&managed), 1.0);
    // Only "true" marks it managed.
    let released = with_annotations(json!({
        "controller.kubernetes.io/pod-deletion-cost": "1000000000",
        "karpenter.sh/managed-deletion-cost": "false",
    }));
    assert!(!deletion_cost_managed(&released));
    assert!(pod_eviction_cost(&released) > 1.0);
}
