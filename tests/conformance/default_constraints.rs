//! Upstream topology suite, DefaultConstraints context: cluster-level default topology spread
//! constraints (`--scheduler-config`'s `podTopologySpread.defaultConstraints`) spread pods
//! that declare no constraints of their own, with a selector deduced from the Services and the
//! ReplicaSet (or StatefulSet, ReplicationController) selecting each pod. As upstream, every
//! case has a ReplicaSet selecting `test=test`; skews count bound pods by label.

use k8s_openapi::api::core::v1::{Pod, TopologySpreadConstraint};

use karpenter_capi::api::nodeclaim::Operator;
use karpenter_capi::api::wellknown::{CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, ZONE_LABEL};
use karpenter_capi::scheduling::ExistingNode;

use crate::fixture::*;

const TEST: (&str, &str) = ("test", "test");

fn topo_pool() -> karpenter_capi::api::nodepool::NodePool {
    nodepool("default").req(CAPACITY_TYPE_LABEL, Operator::Exists, &[])
}

/// Upstream's BeforeEach: the ReplicaSet the pods' selector is deduced from.
fn env_with(pool: karpenter_capi::api::nodepool::NodePool) -> Env {
    Env::new(pool).replica_set("rs", &[TEST])
}

fn env() -> Env {
    env_with(topo_pool())
}

fn constraint(key: &str, hard: bool, min_domains: Option<i32>) -> TopologySpreadConstraint {
    TopologySpreadConstraint {
        topology_key: key.into(),
        max_skew: 1,
        when_unsatisfiable: if hard {
            "DoNotSchedule"
        } else {
            "ScheduleAnyway"
        }
        .into(),
        min_domains,
        ..Default::default()
    }
}

fn zone_default() -> TopologySpreadConstraint {
    constraint(ZONE_LABEL, true, None)
}

fn hostname_default() -> TopologySpreadConstraint {
    constraint(HOSTNAME_LABEL, true, None)
}

/// `n` pending pods labelled `test=test` and controlled by the ReplicaSet.
fn owned(prefix: &str, n: usize) -> Vec<Pod> {
    pods(prefix, n, |p| {
        p.labels(&[TEST]).owned_by("ReplicaSet", "rs")
    })
}

fn bound_skew(mut e: Env, pods: &[Pod], key: &str) -> Vec<usize> {
    e.provision_and_bind(pods);
    e.skew(key)
}

/// Every pod scheduled, all on one new node: no default spread them.
fn sharing_one_node(e: Env, pods: &[Pod]) {
    let out = e.provision(pods);
    let nodes: std::collections::BTreeSet<String> = pods
        .iter()
        .map(|p| {
            out.scheduled(p.metadata.name.as_deref().unwrap())
                .name
                .clone()
        })
        .collect();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
}

#[test]
fn a_default_zonal_spread_spreads_a_pod_without_constraints() {
    let e = env().default_constraints(&[zone_default()]);
    assert_eq!(bound_skew(e, &owned("p", 4), ZONE_LABEL), vec![1, 1, 2]);
}

#[test]
fn a_default_hostname_spread_spreads_a_pod_without_constraints() {
    let e = env().default_constraints(&[hostname_default()]);
    assert_eq!(bound_skew(e, &owned("p", 3), HOSTNAME_LABEL), vec![1, 1, 1]);
}

#[test]
fn a_pod_with_its_own_constraints_is_not_defaulted() {
    // Same key, only maxSkew differs: the default would force one pod per node.
    let e = env().default_constraints(&[hostname_default()]);
    let ps = pods("p", 3, |p| {
        p.labels(&[TEST])
            .owned_by("ReplicaSet", "rs")
            .spread(HOSTNAME_LABEL, 3, true, &[TEST])
    });
    sharing_one_node(e, &ps);
}

#[test]
fn a_default_carries_min_domains() {
    let pool = topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"]);
    let e = env_with(pool).default_constraints(&[constraint(ZONE_LABEL, true, Some(3))]);
    assert_eq!(bound_skew(e, &owned("p", 3), ZONE_LABEL), vec![1, 1]);
}

/// One eligible zone and minDomains 3: the global minimum counts as 0, so a second pod in the
/// zone exceeds maxSkew.
fn single_zone_min_domains(hard: bool) -> Env {
    let pool = topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-1"]);
    env_with(pool).default_constraints(&[constraint(ZONE_LABEL, hard, Some(3))])
}

#[test]
fn an_unsatisfiable_do_not_schedule_default_holds() {
    let ps = owned("p", 3);
    let out = single_zone_min_domains(true).provision(&ps);
    let scheduled = (0..3)
        .filter(|i| out.is_scheduled(&format!("p-{i}")))
        .count();
    assert_eq!(scheduled, 1);
}

#[test]
fn an_unsatisfiable_schedule_anyway_default_is_relaxed() {
    let out = single_zone_min_domains(false).provision(&owned("p", 3));
    for i in 0..3 {
        out.scheduled(&format!("p-{i}"));
    }
}

#[test]
fn without_default_constraints_nothing_changes() {
    sharing_one_node(env(), &owned("p", 3));
}

#[test]
fn a_pod_nothing_selects_is_not_defaulted() {
    // No owner, no Service: an empty selector would count every pod in the namespace.
    let e = env().default_constraints(&[hostname_default()]);
    sharing_one_node(e, &pods("p", 3, |p| p.labels(&[TEST])));
}

#[test]
fn the_deduced_selector_counts_pods_already_in_the_cluster() {
    let pool = topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"]);
    let mut labels = std::collections::BTreeMap::new();
    labels.insert(ZONE_LABEL.to_string(), "test-zone-1".to_string());
    labels.insert(HOSTNAME_LABEL.to_string(), "existing".to_string());
    // Full: the new pods cannot join it, so where they go is the spread's choice alone.
    let existing = ExistingNode {
        name: "existing".into(),
        labels,
        taints: vec![],
        allocatable: res(&[("cpu", "1"), ("memory", "1Gi"), ("pods", "2")]),
        requested: res(&[("pods", "2")]),
        daemon_requested: Default::default(),
        in_flight: false,
        nodepool: None,
    };
    let mut e = env_with(pool)
        .default_constraints(&[zone_default()])
        .node(existing);
    for p in owned("old", 2) {
        e = e.bound(p.on_node("existing"));
    }
    let out = e.provision_and_bind(&owned("new", 2));
    for i in 0..2 {
        assert_eq!(
            out.scheduled(&format!("new-{i}")).label(ZONE_LABEL),
            Some("test-zone-2")
        );
    }
    assert_eq!(e.skew(ZONE_LABEL), vec![2, 2]);
}

#[test]
fn each_workload_spreads_on_its_own() {
    const OTHER: (&str, &str) = ("test", "other");
    let mut e = env()
        .replica_set("other", &[OTHER])
        .default_constraints(&[zone_default()]);
    let mut ps = owned("p", 3);
    ps.extend(pods("o", 3, |p| {
        p.labels(&[OTHER]).owned_by("ReplicaSet", "other")
    }));
    e.provision_and_bind(&ps);
    assert_eq!(e.bound.len(), 6);
    assert_eq!(e.skew_of(ZONE_LABEL, &[TEST]), vec![1, 1, 1]);
    assert_eq!(e.skew_of(ZONE_LABEL, &[OTHER]), vec![1, 1, 1]);
}

#[test]
fn each_deployment_revision_spreads_on_its_own() {
    // A ReplicaSet's selector carries pod-template-hash: the revisions are separate groups.
    let old = [TEST, ("pod-template-hash", "old")];
    let new = [TEST, ("pod-template-hash", "new")];
    let mut e = env()
        .replica_set("old", &old)
        .replica_set("new", &new)
        .default_constraints(&[zone_default()]);
    let mut ps = pods("old", 3, |p| p.labels(&old).owned_by("ReplicaSet", "old"));
    ps.extend(pods("new", 3, |p| {
        p.labels(&new).owned_by("ReplicaSet", "new")
    }));
    e.provision_and_bind(&ps);
    assert_eq!(e.bound.len(), 6);
    assert_eq!(e.skew_of(ZONE_LABEL, &old), vec![1, 1, 1]);
    assert_eq!(e.skew_of(ZONE_LABEL, &new), vec![1, 1, 1]);
}

#[test]
fn a_service_gives_a_selector_to_a_pod_of_an_unsupported_owner() {
    // A Job adds no selector; the Service selecting its pods does.
    let e = env()
        .service("svc", &[TEST])
        .default_constraints(&[zone_default()]);
    let ps = pods("p", 4, |p| p.labels(&[TEST]).owned_by("Job", "test-job"));
    assert_eq!(bound_skew(e, &ps, ZONE_LABEL), vec![1, 1, 2]);
}
