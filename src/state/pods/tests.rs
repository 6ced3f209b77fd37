use super::*;
use serde_json::json;

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
