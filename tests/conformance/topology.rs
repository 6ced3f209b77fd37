//! Upstream topology suite: topology spread (zone, hostname, capacity type, combinations, with
//! node affinity) and pod affinity / anti-affinity. Skews count bound pods labelled
//! `test=test`, as upstream's `ExpectSkew` does.

use k8s_openapi::api::core::v1::{Pod, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use karpenter_capi::api::nodeclaim::Operator;
use karpenter_capi::api::wellknown::{
    ARCH_LABEL, CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, ZONE_LABEL,
};

use crate::fixture::*;

const TEST: (&str, &str) = ("test", "test");

/// Upstream's topology pool: any capacity type.
fn topo_pool() -> karpenter_capi::api::nodepool::NodePool {
    nodepool("default").req(CAPACITY_TYPE_LABEL, Operator::Exists, &[])
}

fn env() -> Env {
    Env::new(topo_pool())
}

fn spread_pods(prefix: &str, n: usize, key: &str, skew: i32) -> Vec<Pod> {
    pods(prefix, n, |p| p.labels(&[TEST]).spread(key, skew, true, &[TEST]))
}

fn bound_skew(mut e: Env, pods: &[Pod], key: &str) -> Vec<usize> {
    e.provision_and_bind(pods);
    e.skew(key)
}

#[test]
fn unknown_topology_keys_are_not_schedulable_but_do_not_block_others() {
    let a = pod("a").labels(&[TEST]).spread("unknown", 1, true, &[TEST]);
    let out = env().provision(&[a, pod("b")]);
    out.not_scheduled("a");
    assert!(out.node_of("b").is_some());
}

#[test]
fn a_spread_without_selector_matches_nothing_and_does_not_spread() {
    let ps = pods("p", 2, |p| {
        p.labels(&[TEST]).spread_with(TopologySpreadConstraint {
            topology_key: ZONE_LABEL.into(),
            max_skew: 1,
            when_unsatisfiable: "DoNotSchedule".into(),
            ..Default::default()
        })
    });
    assert_eq!(bound_skew(env(), &ps, ZONE_LABEL), vec![2]);
}

// --- Zonal ---

#[test]
fn zonal_balance_with_match_labels() {
    assert_eq!(bound_skew(env(), &spread_pods("p", 4, ZONE_LABEL, 1), ZONE_LABEL), vec![1, 1, 2]);
}

#[test]
fn zonal_balance_with_match_expressions() {
    let ps = pods("p", 4, |p| {
        p.labels(&[TEST]).spread_with(TopologySpreadConstraint {
            topology_key: ZONE_LABEL.into(),
            max_skew: 1,
            when_unsatisfiable: "DoNotSchedule".into(),
            label_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "test".into(),
                    operator: "In".into(),
                    values: Some(vec!["test".into()]),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })
    });
    assert_eq!(bound_skew(env(), &ps, ZONE_LABEL), vec![1, 1, 2]);
}

#[test]
fn zonal_balance_within_pool_zones() {
    let e = Env::new(topo_pool().req(ZONE_LABEL, Operator::In, &ZONES));
    assert_eq!(bound_skew(e, &spread_pods("p", 4, ZONE_LABEL, 1), ZONE_LABEL), vec![1, 1, 2]);
}

#[test]
fn zonal_balance_within_a_subset_of_zones_by_requirement() {
    let e = Env::new(topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"]));
    assert_eq!(bound_skew(e, &spread_pods("p", 4, ZONE_LABEL, 1), ZONE_LABEL), vec![2, 2]);
}

#[test]
fn zonal_balance_within_a_zone_set_by_pool_label() {
    let e = Env::new(topo_pool().labels(&[(ZONE_LABEL, "test-zone-1")]));
    assert_eq!(bound_skew(e, &spread_pods("p", 4, ZONE_LABEL, 1), ZONE_LABEL), vec![4]);
}

#[test]
fn zonal_balance_within_a_zone_set_by_pool_label_and_requirement() {
    let e = Env::new(
        topo_pool()
            .req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"])
            .labels(&[(ZONE_LABEL, "test-zone-1")]),
    );
    assert_eq!(bound_skew(e, &spread_pods("p", 4, ZONE_LABEL, 1), ZONE_LABEL), vec![4]);
}

#[test]
fn zonal_balance_across_pools_with_zone_labels() {
    let first = topo_pool()
        .req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"])
        .labels(&[(ZONE_LABEL, "test-zone-1")]);
    let second = nodepool("second").labels(&[(ZONE_LABEL, "test-zone-2")]);
    let e = Env::new(first).pool(second, default_types());
    assert_eq!(bound_skew(e, &spread_pods("p", 4, ZONE_LABEL, 1), ZONE_LABEL), vec![2, 2]);
}

fn cpu_spread_pods(prefix: &str, n: usize, skew: i32) -> Vec<Pod> {
    pods(prefix, n, |p| {
        p.labels(&[TEST])
            .requests(&[("cpu", "1.1")])
            .spread(ZONE_LABEL, skew, true, &[TEST])
    })
}

#[test]
fn zonal_balance_counts_an_existing_pod_outside_the_pool_zones() {
    let mut e = env();
    let first = pod("first")
        .labels(&[TEST])
        .requests(&[("cpu", "1.1")])
        .node_selector(&[(ZONE_LABEL, "test-zone-3")]);
    e.provision_and_bind(&[first]);
    e.pools[0].nodepool = topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"]);
    e.provision_and_bind(&cpu_spread_pods("p", 6, 1));
    assert_eq!(e.skew(ZONE_LABEL), vec![1, 2, 2]);
}

#[test]
fn a_non_minimum_domain_is_used_when_it_is_all_there_is() {
    let mut e = env();
    for (round, zone) in ["test-zone-1", "test-zone-2"].iter().enumerate() {
        e.pools[0].nodepool = topo_pool().req(ZONE_LABEL, Operator::In, &[zone]);
        e.provision_and_bind(&cpu_spread_pods(&format!("r{round}"), 1, 5));
    }
    assert_eq!(e.skew(ZONE_LABEL), vec![1, 1]);
    e.pools[0].nodepool = topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-3"]);
    e.provision_and_bind(&cpu_spread_pods("r2", 10, 5));
    assert_eq!(e.skew(ZONE_LABEL), vec![1, 1, 6]);
}

#[test]
fn max_skew_holds_when_do_not_schedule() {
    let mut e = env();
    e.pools[0].nodepool = topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-1"]);
    e.provision_and_bind(&cpu_spread_pods("a", 1, 1));
    assert_eq!(e.skew(ZONE_LABEL), vec![1]);
    e.pools[0].nodepool = topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-2", "test-zone-3"]);
    e.provision_and_bind(&cpu_spread_pods("b", 10, 1));
    assert_eq!(e.skew(ZONE_LABEL), vec![1, 2, 2]);
}

#[test]
fn max_skew_holds_when_do_not_schedule_with_discovered_domains() {
    let mut e = env();
    e.pools[0].nodepool = topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-1"]);
    e.provision_and_bind(&[pod("a").labels(&[TEST]).requests(&[("cpu", "1.1")])]);
    e.pools[0].nodepool = topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-2", "test-zone-3"]);
    e.provision_and_bind(&cpu_spread_pods("b", 10, 1));
    assert_eq!(e.skew(ZONE_LABEL), vec![1, 2, 2]);
}

#[test]
fn a_spread_without_selector_counts_nothing() {
    let p = pod("p").spread_with(TopologySpreadConstraint {
        topology_key: ZONE_LABEL.into(),
        max_skew: 1,
        when_unsatisfiable: "DoNotSchedule".into(),
        ..Default::default()
    });
    let mut e = env();
    let out = e.provision_and_bind(&[p]);
    assert!(out.node_of("p").is_some());
}

#[test]
fn pods_not_matching_their_own_spread_share_a_node() {
    let ps = pods("p", 5, |p| p.spread(HOSTNAME_LABEL, 1, true, &[TEST]));
    let out = env().provision(&ps);
    let nodes: std::collections::BTreeSet<String> =
        (0..5).map(|i| out.scheduled(&format!("p-{i}")).name.clone()).collect();
    assert_eq!(nodes.len(), 1);
}

fn min_domains_pods(n: usize, min: i32) -> Vec<Pod> {
    pods("p", n, |p| {
        p.labels(&[TEST]).spread_with(TopologySpreadConstraint {
            topology_key: ZONE_LABEL.into(),
            max_skew: 1,
            when_unsatisfiable: "DoNotSchedule".into(),
            label_selector: selector(&[TEST]),
            min_domains: Some(min),
            ..Default::default()
        })
    })
}

#[test]
fn min_domains_above_the_available_zones_limits_each_zone_to_max_skew() {
    let e = Env::new(topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"]));
    assert_eq!(bound_skew(e, &min_domains_pods(3, 3), ZONE_LABEL), vec![1, 1]);
}

#[test]
fn min_domains_equal_to_the_zones_spreads_normally() {
    let e = Env::new(topo_pool().req(ZONE_LABEL, Operator::In, &ZONES));
    assert_eq!(bound_skew(e, &min_domains_pods(11, 3), ZONE_LABEL), vec![3, 4, 4]);
}

#[test]
fn min_domains_below_the_zones_spreads_normally() {
    let e = Env::new(topo_pool().req(ZONE_LABEL, Operator::In, &ZONES));
    assert_eq!(bound_skew(e, &min_domains_pods(11, 2), ZONE_LABEL), vec![3, 4, 4]);
}

// --- Hostname ---

#[test]
fn hostname_balance() {
    assert_eq!(
        bound_skew(env(), &spread_pods("p", 4, HOSTNAME_LABEL, 1), HOSTNAME_LABEL),
        vec![1, 1, 1, 1]
    );
}

#[test]
fn hostname_balance_up_to_max_skew_on_one_node() {
    assert_eq!(
        bound_skew(env(), &spread_pods("p", 4, HOSTNAME_LABEL, 4), HOSTNAME_LABEL),
        vec![4]
    );
}

fn app_spread(name: &str, app: &str) -> Pod {
    pod(name)
        .labels(&[("app", app)])
        .spread(HOSTNAME_LABEL, 1, true, &[("app", app)])
}

#[test]
fn two_deployments_with_hostname_spread_share_two_nodes() {
    let ps = vec![
        app_spread("a1", "app1"),
        app_spread("a2", "app1"),
        app_spread("b1", "app2"),
        app_spread("b2", "app2"),
    ];
    let out = env().provision(&ps);
    for p in ["a1", "a2", "b1", "b2"] {
        out.scheduled(p);
    }
    assert_eq!(out.nodes.len(), 2);
}

#[test]
fn two_deployments_with_hostname_spread_and_different_archs_need_four_nodes() {
    let with_arch = |name: &str, app: &str, arch: &str| {
        app_spread(name, app).required(vec![node_req(ARCH_LABEL, "In", &[arch])])
    };
    let ps = vec![
        with_arch("a1", "app1", "amd64"),
        with_arch("a2", "app1", "amd64"),
        with_arch("b1", "app2", "arm64"),
        with_arch("b2", "app2", "arm64"),
    ];
    let out = env().provision(&ps);
    for p in ["a1", "a2", "b1", "b2"] {
        out.scheduled(p);
    }
    assert_eq!(out.nodes.len(), 4);
}

// --- CapacityType ---

#[test]
fn capacity_type_balance() {
    assert_eq!(
        bound_skew(env(), &spread_pods("p", 4, CAPACITY_TYPE_LABEL, 1), CAPACITY_TYPE_LABEL),
        vec![2, 2]
    );
}

#[test]
fn capacity_type_balance_within_pool_capacity_types() {
    let e = Env::new(topo_pool().req(CAPACITY_TYPE_LABEL, Operator::In, &[SPOT, ON_DEMAND]));
    assert_eq!(
        bound_skew(e, &spread_pods("p", 4, CAPACITY_TYPE_LABEL, 1), CAPACITY_TYPE_LABEL),
        vec![2, 2]
    );
}

fn ct_cpu_pods(prefix: &str, n: usize, hard: bool) -> Vec<Pod> {
    pods(prefix, n, |p| {
        p.labels(&[TEST])
            .requests(&[("cpu", "1.1")])
            .spread(CAPACITY_TYPE_LABEL, 1, hard, &[TEST])
    })
}

#[test]
fn capacity_type_max_skew_holds_when_do_not_schedule() {
    let mut e = env();
    e.pools[0].nodepool = topo_pool().req(CAPACITY_TYPE_LABEL, Operator::In, &[SPOT]);
    e.provision_and_bind(&ct_cpu_pods("a", 1, true));
    assert_eq!(e.skew(CAPACITY_TYPE_LABEL), vec![1]);
    e.pools[0].nodepool = topo_pool().req(CAPACITY_TYPE_LABEL, Operator::In, &[ON_DEMAND]);
    e.provision_and_bind(&ct_cpu_pods("b", 5, true));
    assert_eq!(e.skew(CAPACITY_TYPE_LABEL), vec![1, 2]);
}

#[test]
fn capacity_type_max_skew_is_exceeded_when_schedule_anyway() {
    let mut e = env();
    e.pools[0].nodepool = topo_pool().req(CAPACITY_TYPE_LABEL, Operator::In, &[SPOT]);
    e.provision_and_bind(&ct_cpu_pods("a", 1, false));
    assert_eq!(e.skew(CAPACITY_TYPE_LABEL), vec![1]);
    e.pools[0].nodepool = topo_pool().req(CAPACITY_TYPE_LABEL, Operator::In, &[ON_DEMAND]);
    e.provision_and_bind(&ct_cpu_pods("b", 5, false));
    assert_eq!(e.skew(CAPACITY_TYPE_LABEL), vec![1, 5]);
}

#[test]
fn capacity_type_balance_with_pinned_existing_pods() {
    // One on-demand pod in zone 1, then five spot-pinned pods in zone 2: the spread cannot
    // be met on spot, so they stay unbalanced, upstream's (1, 5).
    let mut e = env();
    let first = pods("a", 1, |p| {
        p.labels(&[TEST]).required(vec![
            node_req(ZONE_LABEL, "In", &["test-zone-1"]),
            node_req(CAPACITY_TYPE_LABEL, "In", &[ON_DEMAND]),
        ])
    });
    e.provision_and_bind(&first);
    let rest = pods("b", 5, |p| {
        p.labels(&[TEST])
            .required(vec![
                node_req(ZONE_LABEL, "In", &["test-zone-2"]),
                node_req(CAPACITY_TYPE_LABEL, "In", &[SPOT]),
            ])
            .spread(CAPACITY_TYPE_LABEL, 1, false, &[TEST])
    });
    e.provision_and_bind(&rest);
    assert_eq!(e.skew(CAPACITY_TYPE_LABEL), vec![1, 5]);
}

// --- Combined ---

#[test]
fn hostname_and_zonal_spreads_hold_together() {
    let both = |prefix: &str, n: usize| {
        pods(prefix, n, |p| {
            p.labels(&[TEST])
                .spread(ZONE_LABEL, 1, true, &[TEST])
                .spread(HOSTNAME_LABEL, 3, true, &[TEST])
        })
    };
    let mut e = env();
    for (round, (n, want)) in [
        (2, vec![1, 1]),
        (3, vec![1, 2, 2]),
        (5, vec![3, 3, 4]),
        (11, vec![7, 7, 7]),
    ]
    .into_iter()
    .enumerate()
    {
        e.provision_and_bind(&both(&format!("r{round}"), n));
        assert_eq!(e.skew(ZONE_LABEL), want, "round {round}");
        assert!(e.skew(HOSTNAME_LABEL).iter().all(|c| *c <= 3));
    }
}

#[test]
fn zonal_spread_limited_by_node_selector() {
    let mut ps = pods("a", 5, |p| {
        p.labels(&[TEST])
            .node_selector(&[(ZONE_LABEL, "test-zone-1")])
            .spread(ZONE_LABEL, 1, false, &[TEST])
    });
    ps.extend(pods("b", 10, |p| {
        p.labels(&[TEST])
            .node_selector(&[(ZONE_LABEL, "test-zone-2")])
            .spread(ZONE_LABEL, 1, false, &[TEST])
    }));
    assert_eq!(bound_skew(env(), &ps, ZONE_LABEL), vec![5, 10]);
}

#[test]
fn zonal_spread_limited_by_node_requirements() {
    let ps = pods("p", 10, |p| {
        p.labels(&[TEST])
            .required(vec![node_req(ZONE_LABEL, "In", &["test-zone-1", "test-zone-2"])])
            .spread(ZONE_LABEL, 1, true, &[TEST])
    });
    assert_eq!(bound_skew(env(), &ps, ZONE_LABEL), vec![5, 5]);
}

#[test]
#[ignore = "fails: needs spread domains taken from required node affinity only, not from preferences being tried"]
fn zonal_spread_not_limited_by_preferred_affinity() {
    let ps = pods("p", 6, |p| {
        p.labels(&[TEST])
            .preferred(10, vec![node_req(ZONE_LABEL, "In", &["test-zone-1", "test-zone-2"])])
            .spread(ZONE_LABEL, 1, true, &[TEST])
    });
    assert_eq!(bound_skew(env(), &ps, ZONE_LABEL), vec![2, 2, 2]);
}

#[test]
fn capacity_type_spread_limited_by_node_selector() {
    let mut ps = pods("a", 5, |p| {
        p.labels(&[TEST])
            .node_selector(&[(CAPACITY_TYPE_LABEL, SPOT)])
            .spread(CAPACITY_TYPE_LABEL, 1, false, &[TEST])
    });
    ps.extend(pods("b", 5, |p| {
        p.labels(&[TEST])
            .node_selector(&[(CAPACITY_TYPE_LABEL, ON_DEMAND)])
            .spread(CAPACITY_TYPE_LABEL, 1, false, &[TEST])
    }));
    assert_eq!(bound_skew(env(), &ps, CAPACITY_TYPE_LABEL), vec![5, 5]);
}

// --- Pod Affinity/Anti-Affinity ---

#[test]
fn empty_pod_affinity_and_anti_affinity_schedule() {
    let mut p = pod("p");
    let a = p.spec().affinity.get_or_insert_with(Default::default);
    a.pod_affinity = Some(Default::default());
    a.pod_anti_affinity = Some(Default::default());
    assert!(env().provision(&[p]).node_of("p").is_some());
}

#[test]
#[ignore = "fails: needs pod affinity to a pod pending in the same batch (upstream retries the follower after its target is placed)"]
fn pod_affinity_on_hostname_co_locates() {
    let target = pod("target").labels(&[("security", "s2")]);
    let follower = pod("follower").pod_affinity(HOSTNAME_LABEL, &[("security", "s2")]);
    let out = env().provision(&[target, follower]);
    assert_eq!(out.scheduled("target").name, out.scheduled("follower").name);
}

#[test]
fn pod_affinity_on_arch_shares_the_arch_on_another_node() {
    let s2 = [("security", "s2")];
    let target = pod("target")
        .labels(&s2)
        .spread(HOSTNAME_LABEL, 1, true, &s2)
        .node_selector(&[(ARCH_LABEL, "arm64")])
        .requests(&[("cpu", "2")]);
    let follower = pod("follower")
        .labels(&s2)
        .spread(HOSTNAME_LABEL, 1, true, &s2)
        .pod_affinity(ARCH_LABEL, &s2)
        .requests(&[("cpu", "1")]);
    let out = env().provision(&[target, follower]);
    let (t, f) = (out.scheduled("target"), out.scheduled("follower"));
    assert_eq!(t.label(ARCH_LABEL), f.label(ARCH_LABEL));
    assert_ne!(t.name, f.name);
}

#[test]
fn self_affinity_on_hostname_puts_all_on_one_node() {
    let ps = pods("p", 3, |p| {
        p.labels(&[("security", "s2")])
            .pod_affinity(HOSTNAME_LABEL, &[("security", "s2")])
    });
    let out = env().provision(&ps);
    let names: std::collections::BTreeSet<String> =
        (0..3).map(|i| out.scheduled(&format!("p-{i}")).name.clone()).collect();
    assert_eq!(names.len(), 1);
}

#[test]
fn self_affinity_on_zone_puts_all_in_one_zone() {
    let ps = pods("p", 3, |p| {
        p.labels(&[("security", "s2")])
            .pod_affinity(ZONE_LABEL, &[("security", "s2")])
    });
    let out = env().provision(&ps);
    let zones: std::collections::BTreeSet<Option<&str>> =
        (0..3).map(|i| out.scheduled(&format!("p-{i}")).label(ZONE_LABEL)).collect();
    assert_eq!(zones.len(), 1);
}

#[test]
fn self_affinity_on_zone_honours_a_zone_constraint() {
    let ps = pods("p", 3, |p| {
        p.labels(&[("security", "s2")])
            .pod_affinity(ZONE_LABEL, &[("security", "s2")])
            .required(vec![node_req(ZONE_LABEL, "In", &["test-zone-3"])])
    });
    let out = env().provision(&ps);
    for i in 0..3 {
        assert_eq!(out.scheduled(&format!("p-{i}")).label(ZONE_LABEL), Some("test-zone-3"));
    }
}

#[test]
fn anti_affinity_on_hostname_separates() {
    let a = pod("a").labels(&[("security", "s1")]);
    let b = pod("b").pod_anti_affinity(HOSTNAME_LABEL, &[("security", "s1")]);
    let out = env().provision(&[a, b]);
    assert_ne!(out.scheduled("a").name, out.scheduled("b").name);
}

#[test]
fn anti_affinity_on_zone_blocks_when_every_zone_is_taken() {
    let zonal = |name: &str, zone: &'static str| {
        pod(name)
            .labels(&[("security", "s1")])
            .requests(&[("cpu", "2")])
            .node_selector(&[(ZONE_LABEL, zone)])
    };
    let aff = pod("aff").pod_anti_affinity(ZONE_LABEL, &[("security", "s1")]);
    let out = env().provision(&[
        zonal("z1", "test-zone-1"),
        zonal("z2", "test-zone-2"),
        zonal("z3", "test-zone-3"),
        aff,
    ]);
    out.not_scheduled("aff");
}

#[test]
fn anti_affinity_on_arch_takes_the_other_arch() {
    let target = pod("target")
        .labels(&[("security", "s2")])
        .node_selector(&[(ARCH_LABEL, "arm64")])
        .requests(&[("cpu", "8")]);
    let follower = pod("follower").pod_anti_affinity(ARCH_LABEL, &[("security", "s2")]);
    let out = env().provision(&[target, follower]);
    assert_ne!(
        out.scheduled("target").label(ARCH_LABEL),
        out.scheduled("follower").label(ARCH_LABEL)
    );
}

#[test]
fn affinity_to_a_missing_pod_is_not_schedulable() {
    let ps = pods("p", 10, |p| p.pod_affinity(ZONE_LABEL, &[("security", "s1")]));
    let out = env().provision(&ps);
    for i in 0..10 {
        out.not_scheduled(&format!("p-{i}"));
    }
}

#[test]
fn zonal_anti_affinity_spreads_one_per_zone() {
    let ps = pods("p", 5, |p| {
        p.labels(&[("security", "s1")])
            .pod_anti_affinity(ZONE_LABEL, &[("security", "s1")])
    });
    let out = env().provision(&ps);
    let placed: Vec<&str> = (0..5)
        .filter_map(|i| out.node_of(&format!("p-{i}")).and_then(|n| n.label(ZONE_LABEL)))
        .collect();
    let zones: std::collections::BTreeSet<&str> = placed.iter().copied().collect();
    assert_eq!(placed.len(), 3, "one per zone: {placed:?}");
    assert_eq!(zones.len(), 3);
}

#[test]
#[ignore = "fails: needs pod affinity to a pod pending in the same batch (upstream retries the follower after its target is placed)"]
fn zonal_affinity_follows_a_constrained_target() {
    let target = pod("target")
        .labels(&[("security", "s1")])
        .node_selector(&[(ZONE_LABEL, "test-zone-1")]);
    let mut ps = vec![target];
    ps.extend(pods("p", 10, |p| p.pod_affinity(ZONE_LABEL, &[("security", "s1")])));
    let out = env().provision(&ps);
    for i in 0..10 {
        assert_eq!(out.scheduled(&format!("p-{i}")).label(ZONE_LABEL), Some("test-zone-1"));
    }
}

#[test]
fn preferred_pod_affinity_may_be_violated() {
    let ps = pods("p", 3, |p| {
        p.labels(&[TEST])
            .pod_affinity_preferred(50, HOSTNAME_LABEL, &[("security", "s1")])
    });
    let out = env().provision(&ps);
    for i in 0..3 {
        out.scheduled(&format!("p-{i}"));
    }
}

#[test]
fn preferred_pod_anti_affinity_may_be_violated() {
    let ps = pods("p", 5, |p| {
        p.labels(&[("security", "s1")])
            .pod_anti_affinity_preferred(50, ZONE_LABEL, &[("security", "s1")])
    });
    let out = env().provision(&ps);
    for i in 0..5 {
        out.scheduled(&format!("p-{i}"));
    }
}
