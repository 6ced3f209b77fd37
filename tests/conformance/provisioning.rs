//! Upstream provisioning suite (pkg/controllers/provisioning/suite_test.go): NodePool limits,
//! DaemonSet overhead, labels and taints on launched nodes, the NodeClaim written, multiple and
//! weighted NodePools, and minValues under both policies (Strict, upstream's default, and
//! BestEffort).

use k8s_openapi::api::core::v1::PodTemplateSpec;
use karpenter_capi::api::nodeclaim::Operator;
use karpenter_capi::api::resources::Resources;
use karpenter_capi::api::wellknown::{INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, ZONE_LABEL};
use karpenter_capi::scheduling::daemon_pod;

use crate::fixture::*;

/// Upstream's provisioning-suite pool: no requirements.
fn plain(name: &str) -> karpenter_capi::api::nodepool::NodePool {
    let mut np = nodepool(name);
    np.spec.template.spec.requirements.clear();
    np
}

fn env() -> Env {
    Env::new(plain("default"))
}

// --- top level ---

#[test]
fn provisions_a_node_for_a_pod() {
    assert!(env().provision(&[pod("p")]).node_of("p").is_some());
}

#[test]
fn provisions_nodes_for_many_pods() {
    let ps = pods("p", 10, |p| p);
    let out = env().provision(&ps);
    for i in 0..10 {
        out.scheduled(&format!("p-{i}"));
    }
}

#[test]
fn supported_node_selectors_are_provisioned() {
    let e =
        Env::new(plain("default").req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"]));
    let ok = [
        pod("a").node_selector(&[(NODEPOOL_LABEL, "default")]),
        pod("b").node_selector(&[(ZONE_LABEL, "test-zone-1")]),
        pod("c").node_selector(&[(INSTANCE_TYPE_LABEL, "default-instance-type")]),
    ];
    let bad = [
        pod("d").node_selector(&[(NODEPOOL_LABEL, "unknown")]),
        pod("e").node_selector(&[(ZONE_LABEL, "unknown")]),
        pod("f").node_selector(&[(INSTANCE_TYPE_LABEL, "unknown")]),
    ];
    for p in ok {
        let name = p.metadata.name.clone().unwrap();
        e.provision(&[p]).scheduled(&name);
    }
    for p in bad {
        let name = p.metadata.name.clone().unwrap();
        e.provision(&[p]).not_scheduled(&name);
    }
}

#[test]
fn accelerators_are_provisioned() {
    let p = pod("p").limits(&[(GPU_A, "1")]);
    let out = env().provision(&[p]);
    assert_eq!(
        out.scheduled("p").label(INSTANCE_TYPE_LABEL),
        Some("gpu-vendor-instance-type")
    );
}

#[test]
fn max_pods_splits_pods_over_nodes() {
    // The single-pod type holds one pod (its MachineDeployment's maxPods capacity).
    let np = plain("default").req(
        INSTANCE_TYPE_LABEL,
        Operator::In,
        &["single-pod-instance-type"],
    );
    let ps = pods("p", 3, |p| p);
    let out = Env::new(np).provision(&ps);
    assert_eq!(out.nodes.len(), 3);
    for i in 0..3 {
        out.scheduled(&format!("p-{i}"));
    }
}

#[test]
fn sidecar_and_init_container_requests_take_the_maximum() {
    let mut p = pod("p").requests(&[("cpu", "1"), ("memory", "1Gi")]);
    p = p.init_requests(&[("cpu", "2"), ("memory", "2Gi")]);
    let out = env().provision(&[p]);
    // 2 CPUs for the init container fit the 4-CPU type only (the 2-CPU one keeps 100m).
    assert_eq!(
        out.scheduled("p").label(INSTANCE_TYPE_LABEL),
        Some("default-instance-type")
    );
}

// --- Resource Limits ---

#[test]
fn pool_over_its_limit_schedules_nothing() {
    let mut e = Env::new(plain("default").limits(&[("cpu", "20")]));
    e.pools[0].usage = res(&[("cpu", "100")]);
    e.provision(&[pod("p")]).not_scheduled("p");
}

#[test]
fn pool_within_its_limit_schedules() {
    let e = Env::new(plain("default").limits(&[("cpu", "2")]));
    let out = e.provision(&[pod("p").requests(&[("cpu", "1.75")])]);
    out.scheduled("p");
}

#[test]
fn a_limit_lets_part_of_a_batch_through() {
    let e = Env::new(plain("default").limits(&[("cpu", "3")]));
    let foo = [("app", "foo")];
    let ps = pods("p", 2, |p| {
        p.labels(&foo)
            .pod_anti_affinity("kubernetes.io/hostname", &foo)
            .requests(&[("cpu", "1.5")])
    });
    let out = e.provision(&ps);
    let placed = (0..2)
        .filter(|i| out.is_scheduled(&format!("p-{i}")))
        .count();
    assert_eq!(placed, 1);
}

#[test]
fn a_pod_above_the_limit_is_not_scheduled() {
    let e = Env::new(plain("default").limits(&[("cpu", "2")]));
    e.provision(&[pod("p").requests(&[("cpu", "2.1")])])
        .not_scheduled("p");
}

#[test]
fn a_pods_limit_stops_a_gpu_pod() {
    let e = Env::new(plain("default").limits(&[("pods", "1")]));
    e.provision(&[pod("p").limits(&[(GPU_A, "1")])])
        .not_scheduled("p");
}

#[test]
fn the_limit_counts_nodes_from_earlier_rounds() {
    let mut e = Env::new(plain("default").limits(&[("cpu", "2")]));
    e.provision_and_bind(&[pod("a").requests(&[("cpu", "1.75")])]);
    // The first node (2 CPUs) uses the whole limit and has no room for another 1.75.
    let out = e.provision(&[pod("b").requests(&[("cpu", "1.75")])]);
    out.not_scheduled("b");
}

#[test]
fn a_node_count_limit_is_honoured() {
    let mut e = Env::new(plain("default").limits(&[("nodes", "2")]));
    let foo = [("app", "foo")];
    let mk = |name: &str| {
        pod(name)
            .labels(&foo)
            .pod_anti_affinity("kubernetes.io/hostname", &foo)
            .requests(&[("cpu", "1.5")])
    };
    for name in ["a", "b"] {
        let out = e.provision_and_bind(&[mk(name)]);
        out.scheduled(name);
    }
    e.provision(&[mk("c")]).not_scheduled("c");
}

// --- Daemonsets ---

fn it_cpu(out: &Outcome, pod: &str) -> Option<String> {
    out.scheduled(pod)
        .label(INSTANCE_TYPE_LABEL)
        .map(str::to_string)
}

const POD_1: [(&str, &str); 2] = [("cpu", "1"), ("memory", "1Gi")];
const DS_2: [(&str, &str); 2] = [("cpu", "2"), ("memory", "2Gi")];

#[test]
fn daemonset_overhead_picks_a_bigger_type() {
    let e = env().daemonset(daemon("ds", &DS_2));
    let out = e.provision(&[pod("p").requests(&POD_1)]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("default-instance-type"));
}

#[test]
fn daemonset_host_ports_conflict_with_the_pod() {
    let e = env().daemonset(daemon("ds", &DS_2).host_port(8080));
    let out = e.provision(&[pod("p").requests(&POD_1).host_port(8080)]);
    out.not_scheduled("p");
    assert!(out.nodes.is_empty());
}

#[test]
fn daemonset_host_ports_count_only_where_the_daemonset_runs() {
    let large = daemon("large-ds", &[("cpu", "4"), ("memory", "4Gi")])
        .required(vec![node_req(SIZE, "In", &["large"])])
        .host_port(8080);
    let small = daemon("small-ds", &DS_2)
        .required(vec![node_req(SIZE, "In", &["small"])])
        .host_port(8081);
    let p = pod("p")
        .requests(&POD_1)
        .required(vec![node_req(SIZE, "In", &["small"])])
        .host_port(8080);
    let out = env().daemonset(large).daemonset(small).provision(&[p]);
    let node = out.scheduled("p");
    assert_eq!(node.label(SIZE), Some("small"));
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("default-instance-type"));
}

/// The controller builds each DaemonSet's pod with `daemon_pod`, from its newest running pod
/// when the pod index holds one (the index's side is unit-tested in `src/state/pods.rs`).
#[test]
fn daemonset_overhead_comes_from_its_running_pod() {
    let template = PodTemplateSpec {
        metadata: None,
        spec: daemon("ds", &[("cpu", "4"), ("memory", "4Gi")]).spec,
    };
    let mut running = daemon("ds-x7k2p", &DS_2);
    // What the DaemonSet controller adds: its node's name and a term pinning the pod there.
    let spec = running.spec.as_mut().unwrap();
    spec.node_name = Some("node-1".into());
    spec.affinity = Some(
        serde_json::from_value(serde_json::json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
            ]}
        }}))
        .unwrap(),
    );
    let ds = daemon_pod("default", "ds", &template, Some(&running));
    let out = env().daemonset(ds).provision(&[pod("p").requests(&POD_1)]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("default-instance-type"));
}

#[test]
fn daemonset_overhead_counts_with_a_startup_taint() {
    let np = plain("default").startup_taints(vec![taint("foo.com/taint", None, "NoSchedule")]);
    let e = Env::new(np).daemonset(daemon("ds", &DS_2));
    let out = e.provision(&[pod("p").requests(&POD_1)]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("default-instance-type"));
}

#[test]
fn a_daemonset_too_large_for_any_type_blocks_scheduling() {
    let e = env().daemonset(daemon("ds", &[("cpu", "10000"), ("memory", "10000Gi")]));
    e.provision(&[pod("p")]).not_scheduled("p");
}

#[test]
fn daemonset_limits_stand_in_for_requests() {
    let ds = pod("ds").limits(&[("cpu", "10000"), ("memory", "10000Gi")]);
    let e = env().daemonset(ds);
    e.provision(&[pod("p")]).not_scheduled("p");
}

#[test]
fn daemonset_init_containers_count_at_their_maximum() {
    let ds = pod("ds")
        .requests(&[("cpu", "1")])
        .limits(&[("cpu", "10000"), ("memory", "1Gi")])
        .init_requests(&[("cpu", "3"), ("memory", "3Gi")]);
    let mut ds = ds;
    ds.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0]
        .resources
        .as_mut()
        .unwrap()
        .limits = Some(
        [
            (
                "cpu".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("10000".into()),
            ),
            (
                "memory".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("3Gi".into()),
            ),
        ]
        .into(),
    );
    let e = env().daemonset(ds);
    let out = e.provision(&[pod("p")]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("default-instance-type"));
}

#[test]
fn daemonset_init_container_too_large_blocks_scheduling() {
    let ds = pod("ds").init_requests(&[("cpu", "10000"), ("memory", "10000Gi")]);
    env()
        .daemonset(ds)
        .provision(&[pod("p")])
        .not_scheduled("p");
}

#[test]
fn pods_without_requests_schedule_with_a_daemonset() {
    let e = env().daemonset(pod("ds"));
    assert!(e.provision(&[pod("p")]).node_of("p").is_some());
}

#[test]
fn daemonsets_that_do_not_tolerate_the_pool_taints_are_ignored() {
    let np = plain("default").taints(vec![taint("foo", Some("bar"), "NoSchedule")]);
    let e = Env::new(np).daemonset(daemon("ds", &DS_2));
    let p = pod("p")
        .requests(&POD_1)
        .tolerate(toleration("", "Exists", None, None));
    let mut p = p;
    p.spec.as_mut().unwrap().tolerations.as_mut().unwrap()[0].key = None;
    let out = e.provision(&[p]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("small-instance-type"));
}

#[test]
fn daemonsets_with_a_selector_no_node_matches_are_ignored() {
    let ds = daemon("ds", &DS_2).node_selector(&[("node", "invalid")]);
    let out = env().daemonset(ds).provision(&[pod("p").requests(&POD_1)]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("small-instance-type"));
}

#[test]
fn daemonsets_no_instance_type_suits_are_ignored() {
    let ds = daemon("ds", &DS_2).required(vec![node_req(
        INSTANCE_TYPE_LABEL,
        "In",
        &["non-existent-instance-type"],
    )]);
    let out = env().daemonset(ds).provision(&[pod("p").requests(&POD_1)]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("small-instance-type"));
}

#[test]
fn daemonsets_selecting_a_pool_label_count() {
    let np = plain("default").labels(&[("purpose", "monitoring")]);
    let ds = daemon("ds", &DS_2).node_selector(&[("purpose", "monitoring")]);
    let out = Env::new(np)
        .daemonset(ds)
        .provision(&[pod("p").requests(&POD_1)]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("default-instance-type"));
}

#[test]
fn daemonsets_count_only_on_the_types_they_select() {
    let small =
        daemon("small-ds", &[("cpu", "1")]).required(vec![node_req(SIZE, "In", &["small"])]);
    let large =
        daemon("large-ds", &[("cpu", "10")]).required(vec![node_req(SIZE, "In", &["large"])]);
    let out = env()
        .daemonset(small)
        .daemonset(large)
        .provision(&[pod("p").requests(&POD_1)]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("default-instance-type"));
}

#[test]
fn daemonsets_with_not_in_on_an_unknown_key_count() {
    let ds = daemon("ds", &DS_2).required(vec![node_req("foo", "NotIn", &["bar"])]);
    let p = pod("p")
        .requests(&POD_1)
        .required(vec![node_req(ZONE_LABEL, "In", &["test-zone-2"])]);
    let out = env().daemonset(ds).provision(&[p]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("default-instance-type"));
}

#[test]
fn daemonsets_with_several_affinity_terms_count_if_one_matches() {
    let ds = daemon("ds", &DS_2)
        .required_term(vec![node_req(ZONE_LABEL, "In", &["unknown-zone"])])
        .required_term(vec![node_req(ZONE_LABEL, "In", &ZONES)]);
    let out = env().daemonset(ds).provision(&[pod("p").requests(&POD_1)]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("default-instance-type"));
}

#[test]
fn daemonsets_with_an_unmet_preference_still_count() {
    let ds = daemon("ds", &DS_2).preferred(1, vec![node_req(ZONE_LABEL, "In", &["unknown-zone"])]);
    let out = env().daemonset(ds).provision(&[pod("p").requests(&POD_1)]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("default-instance-type"));
}

#[test]
fn daemonsets_count_on_a_prefer_no_schedule_pool() {
    let np = plain("default").taints(vec![taint("foo", Some("bar"), "PreferNoSchedule")]);
    let out = Env::new(np)
        .daemonset(daemon("ds", &DS_2))
        .provision(&[pod("p").requests(&POD_1)]);
    assert_eq!(it_cpu(&out, "p").as_deref(), Some("default-instance-type"));
}

// --- Labels / Taints ---

#[test]
fn pool_labels_land_on_nodes() {
    let np = plain("default").labels(&[
        ("test-key-1", "test-value-1"),
        ("test-key-2", "test-value-2"),
    ]);
    let out = Env::new(np).provision(&[pod("p")]);
    let n = out.scheduled("p");
    assert_eq!(n.label("test-key-1"), Some("test-value-1"));
    assert_eq!(n.label("test-key-2"), Some("test-value-2"));
    assert_eq!(n.label(NODEPOOL_LABEL), Some("default"));
}

#[test]
fn pool_labels_in_kubernetes_domains_land_on_nodes() {
    let np = plain("default").labels(&[("kubernetes.io/test", "v1"), ("k8s.io/test", "v2")]);
    let out = Env::new(np).provision(&[pod("p")]);
    let n = out.scheduled("p");
    assert_eq!(n.label("kubernetes.io/test"), Some("v1"));
    assert_eq!(n.label("k8s.io/test"), Some("v2"));
}

#[test]
fn pods_tolerating_pool_taints_schedule() {
    let np = plain("default").taints(vec![taint("nvidia.com/gpu", Some("true"), "NoSchedule")]);
    let e = Env::new(np);
    let ok = pod("ok").tolerate(toleration(
        "nvidia.com/gpu",
        "Equal",
        Some("true"),
        Some("NoSchedule"),
    ));
    let exists = pod("exists").tolerate(toleration(
        "nvidia.com/gpu",
        "Exists",
        None,
        Some("NoSchedule"),
    ));
    let wrong = pod("wrong").tolerate(toleration(
        "nvidia.com/gpu",
        "Equal",
        Some("false"),
        Some("NoSchedule"),
    ));
    let other_key = pod("other-key").tolerate(toleration("invalid", "Exists", None, None));
    let out = e.provision(&[ok, exists, wrong, other_key, pod("none")]);
    out.scheduled("ok");
    out.scheduled("exists");
    out.not_scheduled("wrong");
    out.not_scheduled("other-key");
    out.not_scheduled("none");
}

// --- Multiple NodePools ---

#[test]
fn an_explicitly_selected_pool_is_used() {
    let e = env().pool(plain("chosen"), default_types());
    let out = e.provision(&[pod("p").node_selector(&[(NODEPOOL_LABEL, "chosen")])]);
    assert_eq!(out.scheduled("p").label(NODEPOOL_LABEL), Some("chosen"));
}

#[test]
fn a_pool_is_chosen_by_its_labels() {
    let e = env().pool(plain("labelled").labels(&[("foo", "bar")]), default_types());
    let out = e.provision(&[pod("p").node_selector(&[("foo", "bar")])]);
    assert_eq!(out.scheduled("p").label(NODEPOOL_LABEL), Some("labelled"));
}

#[test]
fn a_prefer_no_schedule_pool_is_avoided_when_another_matches() {
    let tainted = plain("tainted").taints(vec![taint("foo", Some("bar"), "PreferNoSchedule")]);
    let e = Env::new(tainted).pool(plain("default"), default_types());
    let out = e.provision(&[pod("p")]);
    assert_ne!(out.scheduled("p").label(NODEPOOL_LABEL), Some("tainted"));
}

#[test]
fn the_heaviest_pool_always_wins() {
    let e = env()
        .pool(plain("w20").weight(20), default_types())
        .pool(plain("w100").weight(100), default_types());
    let ps = pods("p", 3, |p| p);
    let out = e.provision(&ps);
    for i in 0..3 {
        assert_eq!(
            out.scheduled(&format!("p-{i}")).label(NODEPOOL_LABEL),
            Some("w100")
        );
    }
}

#[test]
fn an_explicitly_selected_pool_beats_heavier_ones() {
    let e = Env::new(plain("target"))
        .pool(plain("w20").weight(20), default_types())
        .pool(plain("w100").weight(100), default_types());
    let out = e.provision(&[pod("p").node_selector(&[(NODEPOOL_LABEL, "target")])]);
    assert_eq!(out.scheduled("p").label(NODEPOOL_LABEL), Some("target"));
}

// --- MinValuesPolicy (Strict) ---

fn three_types() -> Vec<karpenter_capi::scheduling::InstanceType> {
    (1..=2)
        .map(|i| {
            itype(&format!("instance-type-{i}"))
                .resources(&[
                    ("cpu", &format!("{}", i * 2)),
                    ("memory", &format!("{}Gi", i * 4)),
                ])
                .build()
        })
        .collect()
}

#[test]
fn strict_min_values_not_met_schedules_nothing() {
    let np = plain("default").req_min(
        INSTANCE_TYPE_LABEL,
        Operator::In,
        &["instance-type-1", "instance-type-2", "instance-type-3"],
        3,
    );
    let out = Env::with_types(np, three_types()).provision(&[pod("p").requests(&[("cpu", "0.5")])]);
    out.not_scheduled("p");
}

// --- MinValuesPolicy (BestEffort) ---

use karpenter_capi::api::nodeclaim::{NodeClaim, NodeSelectorRequirementWithMinValues};
use karpenter_capi::scheduling::MinValuesPolicy;

const MIN_VALUES_RELAXED: &str = "karpenter.sh/nodeclaim-min-values-relaxed";
const THREE_TYPES: [&str; 3] = ["instance-type-1", "instance-type-2", "instance-type-3"];

fn best_effort(e: Env) -> Env {
    Env {
        min_values_policy: MinValuesPolicy::BestEffort,
        ..e
    }
}

/// The NodeClaim the provisioner writes for the claim `pod` got.
fn written_claim(e: &Env, out: &Outcome, pod: &str) -> NodeClaim {
    let claim = &out.scheduled(pod).claim;
    let pool = e
        .pools
        .iter()
        .find(|p| p.nodepool.metadata.name.as_deref() == Some(claim.nodepool.as_str()))
        .expect("the claim's pool");
    nodeclaim_for(claim, &pool.nodepool)
}

fn relaxed_annotation(nc: &NodeClaim) -> Option<&str> {
    nc.metadata
        .annotations
        .as_ref()?
        .get(MIN_VALUES_RELAXED)
        .map(String::as_str)
}

fn requirement(key: &str, values: &[&str], min: i64) -> NodeSelectorRequirementWithMinValues {
    let mut r = NodeSelectorRequirementWithMinValues::new(key, Operator::In, values);
    r.min_values = Some(min);
    r
}

/// Provisions upstream's pod (0.9 CPU, 0.9Gi) and asserts it went to instance-type-1 of `pool`
/// on a claim annotated as relaxed whose requirements include `want`.
fn assert_relaxed(e: &Env, pool: &str, want: &[NodeSelectorRequirementWithMinValues]) -> Outcome {
    let out = e.provision(&[pod("p").requests(&[("cpu", "0.9"), ("memory", "0.9Gi")])]);
    let pod = "p";
    let node = out.scheduled(pod);
    assert_eq!(node.instance_type, "instance-type-1");
    assert_eq!(node.label(NODEPOOL_LABEL), Some(pool));
    let nc = written_claim(e, &out, pod);
    assert_eq!(relaxed_annotation(&nc), Some("true"));
    for r in want {
        assert!(
            nc.spec.requirements.contains(r),
            "{r:?} not in {:#?}",
            nc.spec.requirements
        );
    }
    out
}

/// Upstream's BestEffort pool: the three instance types, minValues 3 (two exist).
fn wants_three_types(name: &str, weight: i32) -> karpenter_capi::api::nodepool::NodePool {
    plain(name)
        .weight(weight)
        .req_min(INSTANCE_TYPE_LABEL, Operator::In, &THREE_TYPES, 3)
}

/// The pod went to the pool "default" with its instance-type minValues lowered to the two types.
fn assert_relaxed_to_two_types(e: &Env) {
    let two = ["instance-type-1", "instance-type-2"];
    assert_relaxed(e, "default", &[requirement(INSTANCE_TYPE_LABEL, &two, 2)]);
}

#[test]
fn best_effort_min_values_not_met_still_schedules() {
    let e = Env::with_types(wants_three_types("default", 100), three_types());
    assert_relaxed_to_two_types(&best_effort(e));
}

#[test]
fn best_effort_relaxes_before_falling_back_to_a_lighter_pool() {
    let light =
        plain("no-min-values")
            .weight(10)
            .req(INSTANCE_TYPE_LABEL, Operator::In, &THREE_TYPES);
    let e = Env::with_types(wants_three_types("default", 100), three_types())
        .pool(light, three_types());
    assert_relaxed_to_two_types(&best_effort(e));
}

#[test]
fn best_effort_relaxes_on_the_heavier_pool() {
    let e = Env::with_types(wants_three_types("default", 100), three_types())
        .pool(wants_three_types("light", 10), three_types());
    assert_relaxed_to_two_types(&best_effort(e));
}

/// Upstream's zone cases: one type, spot in two of the three zones.
fn two_zone_type() -> Vec<karpenter_capi::scheduling::InstanceType> {
    vec![
        itype("instance-type-1")
            .arch("arm64")
            .os(&["linux"])
            .priced(&[(SPOT, "test-zone-1", 0.52), (SPOT, "test-zone-2", 0.54)])
            .build(),
    ]
}

#[test]
fn best_effort_zone_min_values_not_met_still_schedules() {
    let np = plain("default").req_min(ZONE_LABEL, Operator::In, &ZONES, 3);
    let e = best_effort(Env::with_types(np, two_zone_type()));
    let out = assert_relaxed(&e, "default", &[requirement(ZONE_LABEL, &ZONES, 2)]);
    let zone = out.scheduled("p").label(ZONE_LABEL);
    assert!(
        matches!(zone, Some("test-zone-1" | "test-zone-2")),
        "{zone:?}"
    );
}

#[test]
fn best_effort_relaxes_instance_type_and_zone_min_values_together() {
    let np = wants_three_types("default", 100).req_min(ZONE_LABEL, Operator::In, &ZONES, 3);
    let e = best_effort(Env::with_types(np, two_zone_type()));
    assert_relaxed(
        &e,
        "default",
        &[
            requirement(INSTANCE_TYPE_LABEL, &["instance-type-1"], 1),
            requirement(ZONE_LABEL, &ZONES, 2),
        ],
    );
}

#[test]
fn strict_claims_are_annotated_as_not_relaxed() {
    let np = plain("default").req_min(INSTANCE_TYPE_LABEL, Operator::In, &THREE_TYPES, 2);
    let e = Env::with_types(np, three_types());
    let out = e.provision(&[pod("p")]);
    assert_eq!(
        relaxed_annotation(&written_claim(&e, &out, "p")),
        Some("false")
    );
}

#[test]
fn best_effort_keeps_met_min_values_and_a_joining_pod_cannot_lower_them() {
    // Two pods fill the cheaper type together: the second may not shrink the claim to one
    // type (joining is strict, as upstream's in-flight claims), so it opens its own claim.
    let np = plain("default").req_min(INSTANCE_TYPE_LABEL, Operator::In, &THREE_TYPES, 2);
    let e = best_effort(Env::with_types(np, three_types()));
    let out = e.provision(&[
        pod("a").requests(&[("cpu", "1.5")]),
        pod("b").requests(&[("cpu", "1.5")]),
    ]);
    assert_ne!(out.placement("a"), out.placement("b"));
    for p in ["a", "b"] {
        let nc = written_claim(&e, &out, p);
        assert_eq!(relaxed_annotation(&nc), Some("false"), "{p}");
    }
}

// --- NodeClaim Creation ---

use std::collections::BTreeSet;

use karpenter_capi::api::wellknown::{ARCH_LABEL, OS_LABEL};
use karpenter_capi::scheduling::nodeclaim_for;

fn claim_values(n: &Launched, key: &str) -> BTreeSet<String> {
    n.claim
        .requirements
        .values(key)
        .cloned()
        .unwrap_or_default()
}

fn all_default_type_names() -> BTreeSet<String> {
    default_types().into_iter().map(|t| t.name).collect()
}

#[test]
fn the_claim_lists_every_fitting_type_and_the_pool() {
    let out = env().provision(&[pod("p")]);
    let n = out.scheduled("p");
    assert_eq!(
        claim_values(n, INSTANCE_TYPE_LABEL),
        all_default_type_names()
    );
    assert_eq!(
        claim_values(n, NODEPOOL_LABEL),
        BTreeSet::from(["default".to_string()])
    );
}

#[test]
fn the_claim_carries_the_pool_custom_requirements() {
    let np = plain("default")
        .req("custom-requirement-key", Operator::In, &["value"])
        .req("custom-requirement-key2", Operator::In, &["value"]);
    let out = Env::new(np).provision(&[pod("p")]);
    let n = out.scheduled("p");
    assert_eq!(
        claim_values(n, INSTANCE_TYPE_LABEL),
        all_default_type_names()
    );
    for k in ["custom-requirement-key", "custom-requirement-key2"] {
        assert_eq!(claim_values(n, k), BTreeSet::from(["value".to_string()]));
    }
}

#[test]
fn the_claim_narrows_instance_types_by_arch() {
    let np = plain("default").req(ARCH_LABEL, Operator::In, &["arm64"]);
    let out = Env::new(np).provision(&[pod("p")]);
    let n = out.scheduled("p");
    assert_eq!(
        claim_values(n, ARCH_LABEL),
        BTreeSet::from(["arm64".to_string()])
    );
    assert_eq!(
        claim_values(n, INSTANCE_TYPE_LABEL),
        BTreeSet::from(["arm-instance-type".to_string()])
    );
}

#[test]
fn the_claim_narrows_instance_types_by_os() {
    let np = plain("default").req(OS_LABEL, Operator::In, &["ios"]);
    let out = Env::new(np).provision(&[pod("p")]);
    let n = out.scheduled("p");
    assert_eq!(
        claim_values(n, OS_LABEL),
        BTreeSet::from(["ios".to_string()])
    );
    assert_eq!(
        claim_values(n, INSTANCE_TYPE_LABEL),
        BTreeSet::from(["arm-instance-type".to_string()])
    );
}

#[test]
fn the_claim_narrows_instance_types_by_requests() {
    let p = pod("p").requests(&[(GPU_A, "1")]).limits(&[(GPU_A, "1")]);
    let out = env().provision(&[p]);
    assert_eq!(
        claim_values(out.scheduled("p"), INSTANCE_TYPE_LABEL),
        BTreeSet::from(["gpu-vendor-instance-type".to_string()])
    );
}

#[test]
fn the_claim_is_owned_by_its_pool_and_names_its_node_class() {
    let e = env();
    let out = e.provision(&[pod("p")]);
    let nc = nodeclaim_for(&out.scheduled("p").claim, &e.pools[0].nodepool);
    let owners = nc.metadata.owner_references.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].kind, "NodePool");
    assert_eq!(owners[0].name, "default");
    assert_eq!(owners[0].uid, "uid-default");
    assert_eq!(owners[0].block_owner_deletion, Some(true));
    assert_eq!(
        nc.spec.node_class_ref,
        e.pools[0].nodepool.spec.template.spec.node_class_ref
    );
}

fn claim_requests(out: &Outcome, pod: &str) -> Resources {
    out.scheduled(pod).claim.requests.clone()
}

#[test]
fn the_claim_requests_what_its_pods_request() {
    let p = pod("p")
        .requests(&[("cpu", "1"), ("memory", "1Mi"), (GPU_A, "1")])
        .limits(&[(GPU_A, "1")]);
    let out = env().provision(&[p]);
    let r = claim_requests(&out, "p");
    assert_eq!(r.iter().count(), 4, "{r:?}");
    assert_eq!(
        r,
        res(&[("cpu", "1"), ("memory", "1Mi"), (GPU_A, "1"), ("pods", "1")])
    );
}

#[test]
fn the_claim_requests_include_daemon_overhead() {
    let e = env().daemonset(daemon("ds", &[("cpu", "1"), ("memory", "1Mi")]));
    let out = e.provision(&[pod("p").requests(&[("cpu", "1"), ("memory", "1Mi")])]);
    assert_eq!(
        claim_requests(&out, "p"),
        res(&[("cpu", "2"), ("memory", "2Mi"), ("pods", "2")])
    );
}

#[test]
fn daemon_overhead_is_counted_once_per_claim() {
    let e = env().daemonset(daemon("ds", &[("cpu", "1"), ("memory", "1Mi")]));
    let ps = pods("p", 2, |p| p.requests(&[("cpu", "1"), ("memory", "1Mi")]));
    let out = e.provision(&ps);
    assert_eq!(out.nodes.len(), 1);
    assert_eq!(
        claim_requests(&out, "p-0"),
        res(&[("cpu", "3"), ("memory", "3Mi"), ("pods", "3")])
    );
}

#[test]
fn requirement_only_labels_land_but_not_well_known_not_in() {
    let np = plain("default").req("foo", Operator::In, &["bar"]).req(
        "node.kubernetes.io/windows-build",
        Operator::NotIn,
        &["test-value"],
    );
    let out = Env::new(np).provision(&[pod("p")]);
    let n = out.scheduled("p");
    assert_eq!(n.label("foo"), Some("bar"));
    assert_ne!(
        n.label("node.kubernetes.io/windows-build"),
        Some("test-value")
    );
}

#[test]
fn pool_annotations_land_on_the_claim() {
    let mut np = plain("default");
    np.spec.template.metadata = Some(karpenter_capi::api::nodepool::TemplateMetadata {
        annotations: Some([("test-key".to_string(), "test-value".to_string())].into()),
        labels: None,
    });
    let e = Env::new(np);
    let out = e.provision(&[pod("p")]);
    let nc = nodeclaim_for(&out.scheduled("p").claim, &e.pools[0].nodepool);
    assert_eq!(
        nc.metadata
            .annotations
            .unwrap()
            .get("test-key")
            .map(String::as_str),
        Some("test-value")
    );
}

#[test]
fn the_pool_termination_grace_period_lands_on_the_claim() {
    let mut np = plain("default");
    np.spec.template.spec.termination_grace_period = Some("100s".parse().unwrap());
    let e = Env::new(np);
    let out = e.provision(&[pod("p")]);
    let nc = nodeclaim_for(&out.scheduled("p").claim, &e.pools[0].nodepool);
    assert_eq!(
        nc.spec.termination_grace_period,
        e.pools[0]
            .nodepool
            .spec
            .template
            .spec
            .termination_grace_period
    );
}

#[test]
fn restartable_init_containers_add_to_the_containers() {
    // A sidecar (restartPolicy Always) of 1 CPU runs next to the 1-CPU container; the 3-CPU
    // init container runs before both, so the pod needs 3 CPUs: the 4-CPU type.
    let mut p = pod("p").requests(&[("cpu", "1")]);
    p = p
        .init_requests(&[("cpu", "3")])
        .init_requests(&[("cpu", "1")]);
    p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[1].restart_policy =
        Some("Always".into());
    let out = env().provision(&[p]);
    assert_eq!(
        claim_requests(&out, "p").get("cpu"),
        q("3"),
        "max(init 3, sidecar 1 + container 1)"
    );
}

#[test]
fn strict_zone_min_values_not_met_schedules_nothing() {
    let np = plain("default").req_min(ZONE_LABEL, Operator::In, &ZONES, 3);
    let types = vec![
        itype("one-zone")
            .offerings(&[
                (ON_DEMAND, "test-zone-1", true),
                (ON_DEMAND, "test-zone-2", true),
            ])
            .build(),
    ];
    Env::with_types(np, types)
        .provision(&[pod("p")])
        .not_scheduled("p");
}

// --- StaticNodePool ---

fn static_pool(name: &str, replicas: i64) -> karpenter_capi::api::nodepool::NodePool {
    let mut np = plain(name);
    np.spec.replicas = Some(replicas);
    np
}

#[test]
fn a_static_pool_makes_no_claims_for_pending_pods() {
    Env::new(static_pool("static", 2))
        .provision(&[pod("p")])
        .not_scheduled("p");
}

#[test]
fn a_dynamic_pool_serves_pods_next_to_a_static_one() {
    let e = Env::new(static_pool("static", 1)).pool(plain("dynamic"), default_types());
    let out = e.provision(&[pod("p")]);
    assert_eq!(out.scheduled("p").label(NODEPOOL_LABEL), Some("dynamic"));
}

#[test]
fn no_pool_termination_grace_period_leaves_the_claim_without_one() {
    let e = env();
    let out = e.provision(&[pod("p")]);
    let nc = nodeclaim_for(&out.scheduled("p").claim, &e.pools[0].nodepool);
    assert_eq!(nc.spec.termination_grace_period, None);
}

#[test]
fn supported_node_affinities_are_provisioned() {
    let e =
        Env::new(plain("default").req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"]));
    let ok = [
        pod("a").required(vec![node_req(ZONE_LABEL, "In", &["test-zone-1"])]),
        pod("b").required(vec![node_req(ZONE_LABEL, "NotIn", &["test-zone-2"])]),
        pod("c").required(vec![node_req(
            INSTANCE_TYPE_LABEL,
            "In",
            &["default-instance-type"],
        )]),
        pod("d").required(vec![node_req(NODEPOOL_LABEL, "In", &["default"])]),
    ];
    let bad = [
        pod("e").required(vec![node_req(ZONE_LABEL, "In", &["unknown"])]),
        pod("f").required(vec![node_req(
            ZONE_LABEL,
            "NotIn",
            &["test-zone-1", "test-zone-2"],
        )]),
        pod("g").required(vec![node_req(NODEPOOL_LABEL, "In", &["unknown"])]),
    ];
    for p in ok {
        let name = p.metadata.name.clone().unwrap();
        e.provision(&[p]).scheduled(&name);
    }
    for p in bad {
        let name = p.metadata.name.clone().unwrap();
        e.provision(&[p]).not_scheduled(&name);
    }
}

#[test]
fn pod_level_resources_count() {
    let mut p = pod("p").requests(&[("cpu", "1")]);
    p.spec.as_mut().unwrap().resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(
            [(
                "cpu".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("3".into()),
            )]
            .into(),
        ),
        ..Default::default()
    });
    let out = env().provision(&[p]);
    assert_eq!(claim_requests(&out, "p").get("cpu"), q("3"));
}

// --- sidecar (restartable init container) requests ---

/// Default types plus three just around the expected fit, as upstream adds them.
fn around_eleven() -> Env {
    let mut types = default_types();
    for (cpu, mem) in [("10", "4Gi"), ("11", "5Gi"), ("12", "6Gi")] {
        types.push(
            itype(&format!("cpu-{cpu}"))
                .resources(&[("cpu", cpu), ("memory", mem)])
                .build(),
        );
    }
    Env::with_types(plain("default"), types)
}

/// `inits`: (cpu, memory, is a sidecar), in order.
fn with_inits(
    container: (&str, &str),
    inits: &[(&str, &str, bool)],
) -> k8s_openapi::api::core::v1::Pod {
    let mut p = pod("p").requests(&[("cpu", container.0), ("memory", container.1)]);
    for (cpu, mem, _) in inits {
        p = p.init_requests(&[("cpu", cpu), ("memory", mem)]);
    }
    let spec = p.spec.as_mut().unwrap();
    for (c, (_, _, sidecar)) in spec.init_containers.as_mut().unwrap().iter_mut().zip(inits) {
        if *sidecar {
            c.restart_policy = Some("Always".into());
        }
    }
    p
}

fn lands_on_cpu_11(p: k8s_openapi::api::core::v1::Pod) {
    let out = around_eleven().provision(&[p]);
    assert_eq!(
        out.scheduled("p").label(INSTANCE_TYPE_LABEL),
        Some("cpu-11")
    );
}

#[test]
fn sidecar_after_a_larger_init_container() {
    lands_on_cpu_11(with_inits(
        ("6", "2Gi"),
        &[("10", "4Gi", false), ("4.9", "2.9Gi", true)],
    ));
}

#[test]
fn sidecar_before_a_smaller_init_container() {
    lands_on_cpu_11(with_inits(
        ("6", "2Gi"),
        &[("4.9", "2.9Gi", true), ("5", "1Gi", false)],
    ));
}

#[test]
fn sidecar_before_a_larger_init_container() {
    lands_on_cpu_11(with_inits(
        ("5", "1Gi"),
        &[("4.9", "2.9Gi", true), ("6", "2Gi", false)],
    ));
}

// --- NodePool requirements instance filtering (scheduling suite) ---

/// Every pod is reported as a failure whose message names the pool that filtered it.
fn filtered_out(np: karpenter_capi::api::nodepool::NodePool, n: usize) {
    let ps = pods("p", n, |p| p);
    let out = Env::new(np).provision(&ps);
    assert!(out.nodes.is_empty());
    assert_eq!(out.results.failures.len(), n, "{:?}", out.results.failures);
    for (pod, err) in &out.results.failures {
        assert!(err.to_string().contains("\"default\""), "{pod}: {err}");
    }
}

#[test]
fn a_pool_whose_requirements_match_no_instance_type_reports_each_pod() {
    let np = plain("default").req(
        INSTANCE_TYPE_LABEL,
        Operator::In,
        &["non-existent-instance-type"],
    );
    let e = env();
    e.provision(&[pod("normal")]).scheduled("normal");
    filtered_out(np, 1);
}

#[test]
fn several_pods_filtered_out_by_arch_each_get_an_error() {
    filtered_out(
        plain("default").req(ARCH_LABEL, Operator::In, &["non-existent-arch"]),
        3,
    );
}

#[test]
fn conflicting_pool_requirements_filter_out_every_type() {
    let mut np = plain("default");
    let reqs = &mut np.spec.template.spec.requirements;
    reqs.push(
        karpenter_capi::api::nodeclaim::NodeSelectorRequirementWithMinValues::new(
            ARCH_LABEL,
            Operator::In,
            &["amd64"],
        ),
    );
    reqs.push(
        karpenter_capi::api::nodeclaim::NodeSelectorRequirementWithMinValues::new(
            ARCH_LABEL,
            Operator::In,
            &["arm64"],
        ),
    );
    filtered_out(np, 1);
}

#[test]
fn pool_zones_no_type_offers_filter_out_every_type() {
    filtered_out(
        plain("default").req(
            ZONE_LABEL,
            Operator::In,
            &["non-existent-zone-1", "non-existent-zone-2"],
        ),
        1,
    );
}

#[test]
fn pool_taints_land_on_the_claim() {
    let t = taint("test", Some("bar"), "NoSchedule");
    let e = Env::new(plain("default").taints(vec![t.clone()]));
    let p = pod("p").tolerate(toleration("test", "Equal", Some("bar"), Some("NoSchedule")));
    let out = e.provision(&[p]);
    let nc = nodeclaim_for(&out.scheduled("p").claim, &e.pools[0].nodepool);
    assert_eq!(nc.spec.taints, Some(vec![t]));
}

#[test]
fn a_startup_taint_needs_no_toleration() {
    let t = taint("ignore-me", Some("nothing-to-see-here"), "NoSchedule");
    let e = Env::new(plain("default").startup_taints(vec![t.clone()]));
    let out = e.provision(&[pod("p")]);
    let nc = nodeclaim_for(&out.scheduled("p").claim, &e.pools[0].nodepool);
    assert_eq!(nc.spec.startup_taints, Some(vec![t]));
}

// --- Deleting Nodes: which pods of a deleting node the provisioner plans for ---
// The whole flow (claim deleted, capacity launched while the node drains) is in `whole_flow`;
// these cases decide pod by pod with the same rule the snapshot applies.

use karpenter_capi::state::reschedulable::{Pdbs, currently_reschedulable};

const NOW: jiff::Timestamp = jiff::Timestamp::UNIX_EPOCH;

/// A running pod labelled app=web on node-0, owned by `owner` (a kind) if given.
fn running_pod(owner: Option<&str>, terminating: bool) -> k8s_openapi::api::core::v1::Pod {
    let mut p = pod("p")
        .labels(&[("app", "web")])
        .requests(&[("memory", "100M")])
        .on_node("node-0");
    if let Some(kind) = owner {
        p = p.owned_by(kind, "owner");
    }
    if terminating {
        p.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(NOW));
    }
    p.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Running".into()),
        ..Default::default()
    });
    p
}

fn budgets(specs: &[serde_json::Value]) -> Pdbs {
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let mut s = serde_json::json!({"selector": {"matchLabels": {"app": "web"}}});
            s.as_object_mut()
                .unwrap()
                .extend(spec.as_object().unwrap().clone());
            let b: k8s_openapi::api::policy::v1::PodDisruptionBudget =
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("pdb-{i}"), "namespace": "default"},
                    "spec": s
                }))
                .unwrap();
            (format!("default/pdb-{i}"), std::sync::Arc::new(b))
        })
        .collect()
}

#[test]
fn a_terminating_pod_of_a_deleting_node_is_not_planned_for() {
    assert!(!currently_reschedulable(
        &running_pod(None, true),
        &Pdbs::new(),
        NOW
    ));
}

#[test]
fn a_daemonset_pod_of_a_deleting_node_is_not_planned_for() {
    let p = running_pod(Some("DaemonSet"), false);
    assert!(!currently_reschedulable(&p, &Pdbs::new(), NOW));
}

#[test]
fn a_terminating_replicaset_pod_of_a_deleting_node_is_not_planned_for() {
    let p = running_pod(Some("ReplicaSet"), true);
    assert!(!currently_reschedulable(&p, &Pdbs::new(), NOW));
}

#[test]
fn a_terminating_statefulset_pod_of_a_deleting_node_is_planned_for() {
    let p = running_pod(Some("StatefulSet"), true);
    assert!(currently_reschedulable(&p, &Pdbs::new(), NOW));
}

#[test]
fn fully_blocking_budgets_keep_a_deleting_nodes_pod_out() {
    let p = running_pod(None, false);
    assert!(currently_reschedulable(&p, &Pdbs::new(), NOW));
    for specs in [
        vec![serde_json::json!({"maxUnavailable": 0})],
        vec![serde_json::json!({"maxUnavailable": "0%"})],
        vec![serde_json::json!({"minAvailable": "100%"})],
        vec![
            serde_json::json!({"minAvailable": "100%"}),
            serde_json::json!({"minAvailable": "100%"}),
        ],
    ] {
        assert!(
            !currently_reschedulable(&p, &budgets(&specs), NOW),
            "{specs:?}"
        );
    }
}
