//! Upstream "In-Flight Nodes" and "Existing Nodes": pods go to nodes and claims already there
//! before a new claim is made, as far as their labels, taints and room allow. The cluster-state
//! layer turns Nodes into [`ExistingNode`]s (leaving startup taints out while a node is in
//! flight); these cases start from that input.

use karpenter_capi::api::resources::Quantity;
use karpenter_capi::api::wellknown::{
    ARCH_LABEL, HOSTNAME_LABEL, INITIALIZED_LABEL, REGISTERED_LABEL, ZONE_LABEL,
};
use karpenter_capi::scheduling::ExistingNode;

use crate::fixture::*;

fn env() -> Env {
    Env::new(nodepool("default"))
}

fn small(name: &str) -> k8s_openapi::api::core::v1::Pod {
    pod(name).limits(&[("cpu", "10m")])
}

/// Provision `first`, bind it, and mark the nodes in flight (launched, not initialized).
fn with_in_flight(first: Vec<k8s_openapi::api::core::v1::Pod>) -> Env {
    let mut e = env();
    e.provision_and_bind(&first);
    for n in &mut e.nodes {
        n.in_flight = true;
    }
    e
}

#[test]
fn an_in_flight_node_with_room_takes_the_next_pod() {
    let e = with_in_flight(vec![small("a")]);
    let out = e.provision(&[small("b")]);
    assert_eq!(out.existing_of("b"), Some("node-0"));
    assert!(out.nodes.is_empty());
}

#[test]
fn an_in_flight_node_takes_pods_whose_selectors_it_satisfies() {
    let mut e = with_in_flight(vec![small("a").required(vec![node_req(
        ZONE_LABEL,
        "In",
        &["test-zone-2"],
    )])]);
    let b = small("b").required(vec![node_req(
        ZONE_LABEL,
        "In",
        &["test-zone-1", "test-zone-2"],
    )]);
    let out = e.provision_and_bind(&[b]);
    assert_eq!(out.existing_of("b"), Some("node-0"));
    let c = small("c").required(vec![node_req(
        ZONE_LABEL,
        "In",
        &["test-zone-1", "test-zone-3"],
    )]);
    let out = e.provision(&[c]);
    assert!(out.existing_of("c").is_none());
    assert!(out.node_of("c").is_some());
}

#[test]
fn a_pod_that_does_not_fit_the_in_flight_node_gets_a_new_one() {
    let e = with_in_flight(vec![pod("a").limits(&[("cpu", "1001m")])]);
    // The first pod took the 2-CPU type (1.9 allocatable); one more CPU does not fit.
    let out = e.provision(&[pod("b").limits(&[("cpu", "1")])]);
    assert!(out.existing_of("b").is_none());
    out.scheduled("b");
}

#[test]
fn a_pod_incompatible_with_the_in_flight_node_gets_a_new_one() {
    let e = with_in_flight(vec![small("a")]);
    let out = e.provision(&[pod("b").node_selector(&[(ARCH_LABEL, "arm64")])]);
    assert!(out.existing_of("b").is_none());
    out.scheduled("b");
}

#[test]
fn in_flight_nodes_keep_zonal_balance_without_new_nodes() {
    let foo = [("test", "test")];
    let spread = |prefix: &str, n: usize| {
        pods(prefix, n, |p| {
            p.labels(&foo).spread(ZONE_LABEL, 1, true, &foo)
        })
    };
    let mut e = env();
    e.provision_and_bind(&spread("a", 4));
    assert_eq!(e.skew(ZONE_LABEL), vec![1, 1, 2]);
    let before = e.nodes.len();
    for n in &mut e.nodes {
        n.in_flight = true;
    }
    e.provision_and_bind(&spread("b", 5));
    assert_eq!(e.skew(ZONE_LABEL), vec![3, 3, 3]);
    assert_eq!(e.nodes.len(), before);
}

#[test]
fn in_flight_nodes_keep_hostname_balance() {
    let foo = [("test", "test")];
    let spread = |prefix: &str, n: usize| {
        pods(prefix, n, |p| {
            p.labels(&foo).spread(HOSTNAME_LABEL, 1, true, &foo)
        })
    };
    let mut e = env();
    e.provision_and_bind(&spread("a", 4));
    e.provision_and_bind(&spread("b", 5));
    assert_eq!(e.skew(HOSTNAME_LABEL), vec![1; 9]);
}

fn big_first() -> Env {
    with_in_flight(vec![pod("a").limits(&[("cpu", "8")])])
}

#[test]
fn an_untainted_in_flight_node_takes_the_pod() {
    let out = big_first().provision(&[pod("b").limits(&[("cpu", "1")])]);
    assert_eq!(out.existing_of("b"), Some("node-0"));
}

#[test]
fn ephemeral_taints_do_not_keep_pods_off_an_in_flight_node() {
    let mut e = big_first();
    e.nodes[0].taints = vec![taint("node.kubernetes.io/not-ready", None, "NoExecute")];
    let out = e.provision(&[pod("b").limits(&[("cpu", "1")])]);
    assert_eq!(out.existing_of("b"), Some("node-0"));
}

#[test]
fn ephemeral_taints_count_once_the_node_is_initialized() {
    let mut e = big_first();
    e.nodes[0].taints = vec![taint("node.kubernetes.io/not-ready", None, "NoExecute")];
    e.nodes[0].in_flight = false;
    e.nodes[0]
        .labels
        .insert(INITIALIZED_LABEL.into(), "true".into());
    let out = e.provision(&[pod("b").limits(&[("cpu", "1")])]);
    assert!(out.existing_of("b").is_none());
}

#[test]
fn a_real_taint_on_an_initialized_node_keeps_pods_off() {
    let mut e = big_first();
    e.nodes[0].in_flight = false;
    e.nodes[0].taints = vec![taint("foo.com/taint", None, "NoSchedule")];
    let out = e.provision(&[pod("b").limits(&[("cpu", "1")])]);
    assert!(out.existing_of("b").is_none());
    out.scheduled("b");
}

#[test]
fn startup_taints_left_out_of_in_flight_nodes_do_not_block() {
    let np = nodepool("default").startup_taints(vec![taint("foo.com/taint", None, "NoSchedule")]);
    let mut e = Env::new(np);
    e.provision_and_bind(&[pod("a").limits(&[("cpu", "8")])]);
    e.nodes[0].in_flight = true;
    e.nodes[0].taints.clear();
    let out = e.provision(&[pod("b").limits(&[("cpu", "1")])]);
    assert_eq!(out.existing_of("b"), Some("node-0"));
}

#[test]
fn startup_taints_still_present_after_initialization_block() {
    let mut e = big_first();
    e.nodes[0].in_flight = false;
    e.nodes[0].taints = vec![taint(
        "ignore-me",
        Some("nothing-to-see-here"),
        "NoSchedule",
    )];
    let out = e.provision(&[pod("b").limits(&[("cpu", "1")])]);
    assert!(out.existing_of("b").is_none());
}

#[test]
fn a_not_ready_tainted_node_counts_as_in_flight() {
    let mut e = with_in_flight(vec![pod("a").requests(&[("cpu", "10m")])]);
    e.nodes[0].taints = vec![
        taint("node.kubernetes.io/not-ready", None, "NoSchedule"),
        taint("node.kubernetes.io/unreachable", None, "NoSchedule"),
        taint(
            "node.cloudprovider.kubernetes.io/uninitialized",
            Some("true"),
            "NoSchedule",
        ),
    ];
    let out = e.provision(&[pod("b").requests(&[("cpu", "10m")])]);
    assert_eq!(out.existing_of("b"), Some("node-0"));
}

#[test]
fn in_flight_nodes_are_packed_before_new_ones() {
    let types = vec![
        itype("medium")
            .resources(&[("cpu", "4.25"), ("pods", "4")])
            .build(),
    ];
    let mut e = Env::with_types(nodepool("default"), types);
    let first = pods("a", 20, |p| p.requests(&[("cpu", "1")]));
    e.provision_and_bind(&first);
    for n in &mut e.nodes {
        n.in_flight = true;
    }
    let out = e.provision(&pods("b", 4, |p| p.requests(&[("cpu", "1")])));
    // Every node is full after the first round, so new pods need new nodes, and the first
    // round left at most one node with a free CPU.
    let free = e
        .nodes
        .iter()
        .filter(|n| {
            n.allocatable.get("cpu").as_millis() - n.requested.get("cpu").as_millis() >= 1000
        })
        .count();
    assert!(free <= 1);
    assert!((0..4).all(|i| out.is_scheduled(&format!("b-{i}"))));
}

#[test]
fn pods_sharing_a_host_port_get_different_nodes() {
    let out = env().provision(&[pod("a").host_port(8080), pod("b").host_port(8080)]);
    assert_ne!(out.scheduled("a").name, out.scheduled("b").name);
}

fn unowned(name: &str, cpu: &str, mem: &str, zone: &str) -> ExistingNode {
    ExistingNode {
        name: name.into(),
        labels: [
            (ZONE_LABEL.to_string(), zone.to_string()),
            (HOSTNAME_LABEL.to_string(), name.to_string()),
        ]
        .into(),
        taints: vec![],
        allocatable: res(&[("cpu", cpu), ("memory", mem), ("pods", "110")]),
        requested: res(&[]),
        daemon_requested: Default::default(),
        in_flight: false,
        nodepool: None,
    }
}

#[test]
fn a_node_karpenter_does_not_own_takes_a_pod() {
    let e = env().node(unowned("mine", "10", "10Gi", "test-zone-1"));
    let out = e.provision(&[pod("p").requests(&[("cpu", "10m")])]);
    assert_eq!(out.existing_of("p"), Some("mine"));
}

#[test]
fn a_node_karpenter_does_not_own_takes_many_pods() {
    let e = env().node(unowned("mine", "10", "100Gi", "test-zone-1"));
    let ps = pods("p", 100, |p| p.requests(&[("cpu", "10m")]));
    let out = e.provision(&ps);
    assert!((0..100).all(|i| out.existing_of(&format!("p-{i}")) == Some("mine")));
}

#[test]
fn a_pod_incompatible_with_an_existing_node_gets_a_claim() {
    // The node has no zone label; the pod needs zone 1.
    let mut node = unowned("mine", "10", "10Gi", "test-zone-1");
    node.labels.remove(ZONE_LABEL);
    let p = pod("p").required(vec![node_req(ZONE_LABEL, "In", &["test-zone-1"])]);
    let without_pools = Env::default().node(node.clone());
    without_pools
        .provision(std::slice::from_ref(&p))
        .not_scheduled("p");
    let out = env().node(node).provision(&[p]);
    assert!(out.existing_of("p").is_none());
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-1"));
}

fn many_in_flight_one_initialized(in_flight_count: usize, elem: usize) -> Env {
    let mut e = env();
    for i in 0..in_flight_count {
        let mut n = unowned(&format!("n{i}"), "4", "4Gi", "test-zone-1");
        n.in_flight = i != elem;
        n.nodepool = Some("default".into());
        if i == elem {
            n.labels.insert(INITIALIZED_LABEL.into(), "true".into());
        }
        e = e.node(n);
    }
    e
}

#[test]
fn an_initialized_node_is_tried_before_in_flight_ones() {
    let e = many_in_flight_one_initialized(100, 37);
    let out = e.provision(&[pod("p")]);
    assert_eq!(out.existing_of("p"), Some("n37"));
}

#[test]
fn initialized_nodes_come_before_uninitialized_ones() {
    let e = many_in_flight_one_initialized(10, 9);
    let out = e.provision(&[pod("p")]);
    assert_eq!(out.existing_of("p"), Some("n9"));
}

#[test]
fn daemonsets_that_do_not_fit_an_existing_node_take_none_of_its_room() {
    // The node has no zone label, so the zone-1 DaemonSet is not strictly compatible with it.
    let mut node = unowned("existing", "1", "1Gi", "test-zone-1");
    node.labels.remove(ZONE_LABEL);
    let ds = daemon("ds", &[("cpu", "100"), ("memory", "100Gi")]).required(vec![node_req(
        ZONE_LABEL,
        "In",
        &["test-zone-1"],
    )]);
    let e = env().node(node).daemonset(ds);
    let mut e2 = e.clone();
    let out = e2.provision_and_bind(&[pod("a").requests(&[("cpu", "1"), ("memory", "1Gi")])]);
    assert_eq!(out.existing_of("a"), Some("existing"));
    // The node is full now; the pool may launch in zone 1, so its new nodes are modelled with
    // the DaemonSet's 100 CPUs and none can hold the pod.
    let out = e2.provision(&[pod("b").requests(&[("cpu", "1"), ("memory", "1Gi")])]);
    out.not_scheduled("b");
}

// --- No Pre-Binding ---

#[test]
fn a_second_pod_joins_the_node_launched_for_the_first_without_binding() {
    let mut e = env();
    let out = e.provision_no_binding(&[small("first")]);
    assert_eq!(out.nodes.len(), 1);
    assert!(e.bound.is_empty(), "the solve binds nothing");
    let out = e.provision_no_binding(&[small("second")]);
    assert_eq!(out.existing_of("second"), Some("node-0"));
    assert!(out.nodes.is_empty(), "no second node: {:?}", out.results);
    assert!(e.bound.is_empty());
}

#[test]
fn self_zonal_affinity_without_binding_joins_the_node_of_the_first() {
    let affine = |name: &str| {
        pod(name)
            .labels(&[("security", "s2")])
            .pod_affinity(ZONE_LABEL, &[("security", "s2")])
    };
    let mut e = env();
    e.provision_no_binding(&[affine("first")]);
    assert_eq!(e.nodes.len(), 1);
    // No pod of the group is bound anywhere yet, so the second may start anywhere: the node
    // already there is taken before a new one.
    let out = e.provision_no_binding(&[affine("second")]);
    assert_eq!(
        out.existing_of("second"),
        Some("node-0"),
        "{:?}",
        out.results
    );
    assert_eq!(e.nodes.len(), 1);
}

// --- In-Flight Nodes / DaemonSets ---

#[test]
fn daemonsets_that_wait_for_registered_or_initialized_nodes_count_on_new_nodes() {
    let after = |label: &str| {
        daemon(label, &[("cpu", "1")]).required(vec![node_req(label, "In", &["true"])])
    };
    let e = env()
        .daemonset(after(INITIALIZED_LABEL))
        .daemonset(after(REGISTERED_LABEL));
    let out = e.provision(&[pod("p").limits(&[("cpu", "2")])]);
    let node = out.scheduled("p");
    // 2 CPUs for the pod and one for each DaemonSet do not fit the 4-CPU default type.
    assert_eq!(node.instance_type, "arm-instance-type");
    // The labels a node only gets later are assumed for the overhead, not required of it.
    for key in [REGISTERED_LABEL, INITIALIZED_LABEL] {
        assert!(node.claim.requirements.get(key).is_none(), "{key}");
        assert!(!node.labels.contains_key(key), "{key}");
    }
}

/// A node registered for a first pod that has since gone (nothing runs on it), with `ds` as the
/// cluster's DaemonSets; its allocatable CPU and memory in milli-units and bytes.
fn empty_node_with(ds: Vec<k8s_openapi::api::core::v1::Pod>) -> (Env, i64, i64) {
    let mut e = env();
    for d in ds {
        e = e.daemonset(d);
    }
    e.provision_no_binding(&[pod("first").limits(&[("cpu", "1")])]);
    let alloc = &e.nodes[0].allocatable;
    let (cpu, mem) = (
        alloc.get("cpu").as_millis(),
        alloc.get("memory").as_millis() / 1000,
    );
    (e, cpu, mem)
}

/// The DaemonSet pod `requests` now runs on node 0.
fn bind_daemon_pod(e: &mut Env, requests: &[(&str, &str)]) {
    let r = res(requests).with("pods", Quantity::from_units(1));
    e.nodes[0].requested.add_assign(&r);
    e.nodes[0].daemon_requested.add_assign(&r);
}

#[test]
fn a_daemonset_keeps_room_on_a_node_until_its_pod_runs_there() {
    let (mut e, cpu, _) = empty_node_with(vec![daemon("ds", &[("cpu", "1"), ("memory", "1Gi")])]);
    let cpus = |m: i64| pod("big").limits(&[("cpu", &format!("{m}m"))]);
    // Nothing runs on the node, but the DaemonSet's pod is still to come: it keeps 1 CPU.
    let out = e.provision(&[cpus(cpu - 500)]);
    assert_eq!(out.existing_of("big"), None, "{:?}", out.results);
    let out = e.provision(&[cpus(cpu - 1000)]);
    assert_eq!(out.existing_of("big"), Some("node-0"), "{:?}", out.results);
    // Once it runs there, what is left is known (upstream's case).
    bind_daemon_pod(&mut e, &[("cpu", "1"), ("memory", "2Gi")]);
    let out = e.provision(&[cpus(cpu - 1000)]);
    assert_eq!(out.existing_of("big"), Some("node-0"), "{:?}", out.results);
    let out = e.provision(&[cpus(cpu - 500)]);
    assert_eq!(out.existing_of("big"), None, "{:?}", out.results);
}

#[test]
fn an_unexpected_daemonset_pod_never_makes_room() {
    let (mut e, _, mem) = empty_node_with(vec![
        daemon("ds1", &[("cpu", "1"), ("memory", "1Gi")])
            .node_selector(&[("my-node-label", "value")]),
        daemon("ds2", &[("cpu", "1m")]),
    ]);
    // A label Karpenter did not expect appears, and ds1's pod, larger than its template,
    // runs there.
    e.nodes[0]
        .labels
        .insert("my-node-label".into(), "value".into());
    bind_daemon_pod(&mut e, &[("cpu", "1"), ("memory", "2Gi")]);
    // ds1 asked for 1Gi less than its pod takes: that is not room for anybody else.
    let more = format!("{}", mem - (2 << 30) + (512 << 20));
    let out = e.provision(&[pod("big").requests(&[("memory", &more)])]);
    assert_eq!(out.existing_of("big"), None, "{:?}", out.results);
    assert_eq!(out.nodes.len(), 1);
}
