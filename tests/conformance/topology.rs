//! Upstream topology suite: topology spread (zone, hostname, capacity type, combinations, with
//! node affinity) and pod affinity / anti-affinity. Skews count bound pods labelled
//! `test=test`, as upstream's `ExpectSkew` does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use karpenter_capi::api::nodeclaim::Operator;
use karpenter_capi::api::wellknown::{ARCH_LABEL, CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, ZONE_LABEL};

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
    pods(prefix, n, |p| {
        p.labels(&[TEST]).spread(key, skew, true, &[TEST])
    })
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
    assert_eq!(
        bound_skew(env(), &spread_pods("p", 4, ZONE_LABEL, 1), ZONE_LABEL),
        vec![1, 1, 2]
    );
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
    assert_eq!(
        bound_skew(e, &spread_pods("p", 4, ZONE_LABEL, 1), ZONE_LABEL),
        vec![1, 1, 2]
    );
}

#[test]
fn zonal_balance_within_a_subset_of_zones_by_requirement() {
    let e = Env::new(topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"]));
    assert_eq!(
        bound_skew(e, &spread_pods("p", 4, ZONE_LABEL, 1), ZONE_LABEL),
        vec![2, 2]
    );
}

#[test]
fn zonal_balance_within_a_zone_set_by_pool_label() {
    let e = Env::new(topo_pool().labels(&[(ZONE_LABEL, "test-zone-1")]));
    assert_eq!(
        bound_skew(e, &spread_pods("p", 4, ZONE_LABEL, 1), ZONE_LABEL),
        vec![4]
    );
}

#[test]
fn zonal_balance_within_a_zone_set_by_pool_label_and_requirement() {
    let e = Env::new(
        topo_pool()
            .req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"])
            .labels(&[(ZONE_LABEL, "test-zone-1")]),
    );
    assert_eq!(
        bound_skew(e, &spread_pods("p", 4, ZONE_LABEL, 1), ZONE_LABEL),
        vec![4]
    );
}

#[test]
fn zonal_balance_across_pools_with_zone_labels() {
    let first = topo_pool()
        .req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"])
        .labels(&[(ZONE_LABEL, "test-zone-1")]);
    let second = nodepool("second").labels(&[(ZONE_LABEL, "test-zone-2")]);
    let e = Env::new(first).pool(second, default_types());
    assert_eq!(
        bound_skew(e, &spread_pods("p", 4, ZONE_LABEL, 1), ZONE_LABEL),
        vec![2, 2]
    );
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
    e.pools[0].nodepool =
        topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"]);
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
    e.pools[0].nodepool =
        topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-2", "test-zone-3"]);
    e.provision_and_bind(&cpu_spread_pods("b", 10, 1));
    assert_eq!(e.skew(ZONE_LABEL), vec![1, 2, 2]);
}

#[test]
fn max_skew_holds_when_do_not_schedule_with_discovered_domains() {
    let mut e = env();
    e.pools[0].nodepool = topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-1"]);
    e.provision_and_bind(&[pod("a").labels(&[TEST]).requests(&[("cpu", "1.1")])]);
    e.pools[0].nodepool =
        topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-2", "test-zone-3"]);
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
    let nodes: std::collections::BTreeSet<String> = (0..5)
        .map(|i| out.scheduled(&format!("p-{i}")).name.clone())
        .collect();
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
    assert_eq!(
        bound_skew(e, &min_domains_pods(3, 3), ZONE_LABEL),
        vec![1, 1]
    );
}

#[test]
fn min_domains_equal_to_the_zones_spreads_normally() {
    let e = Env::new(topo_pool().req(ZONE_LABEL, Operator::In, &ZONES));
    assert_eq!(
        bound_skew(e, &min_domains_pods(11, 3), ZONE_LABEL),
        vec![3, 4, 4]
    );
}

#[test]
fn min_domains_below_the_zones_spreads_normally() {
    let e = Env::new(topo_pool().req(ZONE_LABEL, Operator::In, &ZONES));
    assert_eq!(
        bound_skew(e, &min_domains_pods(11, 2), ZONE_LABEL),
        vec![3, 4, 4]
    );
}

// --- Hostname ---

#[test]
fn hostname_balance() {
    assert_eq!(
        bound_skew(
            env(),
            &spread_pods("p", 4, HOSTNAME_LABEL, 1),
            HOSTNAME_LABEL
        ),
        vec![1, 1, 1, 1]
    );
}

#[test]
fn hostname_balance_up_to_max_skew_on_one_node() {
    assert_eq!(
        bound_skew(
            env(),
            &spread_pods("p", 4, HOSTNAME_LABEL, 4),
            HOSTNAME_LABEL
        ),
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
        bound_skew(
            env(),
            &spread_pods("p", 4, CAPACITY_TYPE_LABEL, 1),
            CAPACITY_TYPE_LABEL
        ),
        vec![2, 2]
    );
}

#[test]
fn capacity_type_balance_within_pool_capacity_types() {
    let e = Env::new(topo_pool().req(CAPACITY_TYPE_LABEL, Operator::In, &[SPOT, ON_DEMAND]));
    assert_eq!(
        bound_skew(
            e,
            &spread_pods("p", 4, CAPACITY_TYPE_LABEL, 1),
            CAPACITY_TYPE_LABEL
        ),
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
    // One on-demand pod in zone 1, then five pods pinned to spot in zone 2 with a hard spread:
    // the on-demand node is outside their node requirements, so (nodeAffinityPolicy Honor)
    // it does not count and all five land on spot, upstream's (1, 5).
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
            .spread(CAPACITY_TYPE_LABEL, 1, true, &[TEST])
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
            .required(vec![node_req(
                ZONE_LABEL,
                "In",
                &["test-zone-1", "test-zone-2"],
            )])
            .spread(ZONE_LABEL, 1, true, &[TEST])
    });
    assert_eq!(bound_skew(env(), &ps, ZONE_LABEL), vec![5, 5]);
}

#[test]
fn zonal_spread_not_limited_by_preferred_affinity() {
    let ps = pods("p", 6, |p| {
        p.labels(&[TEST])
            .preferred(
                10,
                vec![node_req(ZONE_LABEL, "In", &["test-zone-1", "test-zone-2"])],
            )
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
    let names: std::collections::BTreeSet<String> = (0..3)
        .map(|i| out.scheduled(&format!("p-{i}")).name.clone())
        .collect();
    assert_eq!(names.len(), 1);
}

#[test]
fn self_affinity_on_zone_puts_all_in_one_zone() {
    let ps = pods("p", 3, |p| {
        p.labels(&[("security", "s2")])
            .pod_affinity(ZONE_LABEL, &[("security", "s2")])
    });
    let out = env().provision(&ps);
    let zones: std::collections::BTreeSet<Option<&str>> = (0..3)
        .map(|i| out.scheduled(&format!("p-{i}")).label(ZONE_LABEL))
        .collect();
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
        assert_eq!(
            out.scheduled(&format!("p-{i}")).label(ZONE_LABEL),
            Some("test-zone-3")
        );
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
    let ps = pods("p", 10, |p| {
        p.pod_affinity(ZONE_LABEL, &[("security", "s1")])
    });
    let out = env().provision(&ps);
    for i in 0..10 {
        out.not_scheduled(&format!("p-{i}"));
    }
}

#[test]
fn zonal_anti_affinity_spreads_one_per_zone() {
    let batch = |round: usize| {
        pods(&format!("r{round}"), 3, |p| {
            p.labels(&[("security", "s1")])
                .pod_anti_affinity(ZONE_LABEL, &[("security", "s1")])
        })
    };
    let mut e = env();
    // Late committal: a new claim's zone stays open until its node exists, so the first pod
    // blocks every zone it may land in and each round places one pod.
    let rounds = [vec![1], vec![1, 1], vec![1, 1, 1], vec![1, 1, 1]];
    for (round, expected) in rounds.into_iter().enumerate() {
        e.provision_and_bind(&batch(round));
        assert_eq!(e.skew_of(ZONE_LABEL, &[("security", "s1")]), expected);
    }
}

#[test]
fn zonal_affinity_follows_a_constrained_target() {
    let target = pod("target")
        .labels(&[("security", "s1")])
        .node_selector(&[(ZONE_LABEL, "test-zone-1")]);
    let mut ps = vec![target];
    ps.extend(pods("p", 10, |p| {
        p.pod_affinity(ZONE_LABEL, &[("security", "s1")])
    }));
    let out = env().provision(&ps);
    for i in 0..10 {
        assert_eq!(
            out.scheduled(&format!("p-{i}")).label(ZONE_LABEL),
            Some("test-zone-1")
        );
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
        p.labels(&[("security", "s1")]).pod_anti_affinity_preferred(
            50,
            ZONE_LABEL,
            &[("security", "s1")],
        )
    });
    let out = env().provision(&ps);
    for i in 0..5 {
        out.scheduled(&format!("p-{i}"));
    }
}

// --- more Zonal / CapacityType ---

fn labelled_node(
    name: &str,
    labels: &[(&str, &str)],
    cpu: &str,
) -> karpenter_capi::scheduling::ExistingNode {
    let mut l: std::collections::BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.insert(HOSTNAME_LABEL.into(), name.into());
    karpenter_capi::scheduling::ExistingNode {
        name: name.into(),
        labels: l,
        taints: vec![],
        allocatable: res(&[("cpu", cpu), ("memory", "1Gi"), ("pods", "110")]),
        requested: res(&[]),
        daemon_requested: Default::default(),
        in_flight: false,
        nodepool: None,
    }
}

fn with_phase(mut p: Pod, phase: &str) -> Pod {
    p.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    p
}

/// Only bound, running pods that match the selector, in the pod's namespace, on nodes with the
/// topology key count.
fn only_matching_running_pods_count(key: &str, first: &str, second: &str, want: Vec<usize>) {
    let mut e = env()
        .node(labelled_node("first", &[(key, first)], "0"))
        .node(labelled_node("second", &[(key, second)], "0"))
        .node(labelled_node("third", &[], "0"));
    let mut terminating = pod("terminating").labels(&[TEST]);
    terminating.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
    );
    for p in [
        pod("no-labels").on_node("first"),
        pod("no-domain").labels(&[TEST]).on_node("third"),
        pod("other-ns")
            .labels(&[TEST])
            .namespace("other")
            .on_node("first"),
        terminating.on_node("first"),
        with_phase(pod("failed").labels(&[TEST]).on_node("first"), "Failed"),
        with_phase(
            pod("succeeded").labels(&[TEST]).on_node("first"),
            "Succeeded",
        ),
        pod("r1").labels(&[TEST]).on_node("first"),
        pod("r2").labels(&[TEST]).on_node("first"),
        pod("r3").labels(&[TEST]).on_node("second"),
    ] {
        e = e.bound(p);
    }
    let out = e.provision_and_bind(&spread_pods("p", 2, key, 1));
    assert!(out.is_scheduled("p-0") && out.is_scheduled("p-1"));
    // Count as upstream does: matching, running pods in "default" on nodes with the key.
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for p in &e.bound {
        let running = p
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|ph| ph == "Running");
        let ok = p.metadata.namespace.as_deref() == Some("default")
            && p.metadata.deletion_timestamp.is_none()
            && running
            && p.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.get("test").is_some());
        let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let v = node
            .and_then(|n| e.nodes.iter().find(|x| x.name == n))
            .and_then(|n| n.labels.get(key));
        if let (true, Some(v)) = (ok, v) {
            *counts.entry(v.clone()).or_insert(0) += 1;
        }
    }
    let mut got: Vec<usize> = counts.into_values().collect();
    got.sort();
    assert_eq!(got, want);
}

#[test]
fn zonal_spread_counts_only_running_matching_pods_on_zoned_nodes() {
    only_matching_running_pods_count(ZONE_LABEL, "test-zone-1", "test-zone-2", vec![1, 2, 2]);
}

#[test]
fn capacity_type_spread_counts_only_running_matching_pods() {
    only_matching_running_pods_count(CAPACITY_TYPE_LABEL, SPOT, ON_DEMAND, vec![2, 3]);
}

#[test]
fn capacity_type_spread_without_selector_counts_nothing() {
    let p = pod("p").spread_with(TopologySpreadConstraint {
        topology_key: CAPACITY_TYPE_LABEL.into(),
        max_skew: 1,
        when_unsatisfiable: "DoNotSchedule".into(),
        ..Default::default()
    });
    assert!(env().provision(&[p]).node_of("p").is_some());
}

fn pinned_then_spread(key: &str, first_req: (&str, &str), pool_value: &str) {
    let mut e = env();
    let first = pod("first")
        .labels(&[TEST])
        .node_selector(&[(
            karpenter_capi::api::wellknown::INSTANCE_TYPE_LABEL,
            "single-pod-instance-type",
        )])
        .required(vec![node_req(first_req.0, "In", &[first_req.1])]);
    e.provision_and_bind(&[first]);
    e.pools[0].nodepool = topo_pool().req(key, Operator::In, &[pool_value]);
    let ps = pods("p", 5, |p| {
        p.labels(&[TEST])
            .requests(&[("cpu", "2")])
            .spread(key, 1, true, &[TEST])
    });
    e.provision_and_bind(&ps);
    assert_eq!(e.skew(key), vec![1, 2]);
}

#[test]
fn capacity_type_spread_counts_a_domain_the_pool_no_longer_offers() {
    pinned_then_spread(CAPACITY_TYPE_LABEL, (CAPACITY_TYPE_LABEL, ON_DEMAND), SPOT);
}

#[test]
fn arch_spread_counts_a_domain_the_pool_no_longer_offers() {
    pinned_then_spread(ARCH_LABEL, (ARCH_LABEL, "amd64"), "arm64");
}

#[test]
fn spread_over_a_pool_requirement_label() {
    let key = "capacity.spread.4-1";
    let spot = nodepool("spot")
        .req(CAPACITY_TYPE_LABEL, Operator::In, &[SPOT])
        .req(key, Operator::In, &["2", "3", "4", "5"]);
    let od = nodepool("od")
        .req(CAPACITY_TYPE_LABEL, Operator::In, &[ON_DEMAND])
        .req(key, Operator::In, &["1"]);
    let mut e = Env::new(spot).pool(od, default_types());
    let out = e.provision_and_bind(&spread_pods("p", 20, key, 1));
    assert!((0..20).all(|i| out.is_scheduled(&format!("p-{i}"))));
    assert_eq!(e.skew(key), vec![4, 4, 4, 4, 4]);
    assert_eq!(e.skew(CAPACITY_TYPE_LABEL), vec![4, 16]);
}

#[test]
fn a_zone_only_a_pool_at_its_limit_offers_still_counts_for_skew() {
    let a = topo_pool().req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"]);
    let b = nodepool("b")
        .req(ZONE_LABEL, Operator::In, &["test-zone-3"])
        .limits(&[("cpu", "0")]);
    let mut e = Env::new(a).pool(b, default_types());
    let ps = pods("p", 10, |p| {
        p.labels(&[TEST])
            .spread(ZONE_LABEL, 1, true, &[TEST])
            .spread(HOSTNAME_LABEL, 1, false, &[TEST])
    });
    e.provision_and_bind(&ps);
    assert_eq!(e.skew(ZONE_LABEL), vec![1, 1]);
    assert_eq!(e.skew(HOSTNAME_LABEL), vec![1, 1]);
}

#[test]
fn capacity_type_and_hostname_spreads_hold_together() {
    let both = |prefix: &str, n: usize| {
        pods(prefix, n, |p| {
            p.labels(&[TEST])
                .spread(CAPACITY_TYPE_LABEL, 1, true, &[TEST])
                .spread(HOSTNAME_LABEL, 3, true, &[TEST])
        })
    };
    let mut e = env();
    for (round, (n, want)) in [
        (2, vec![1, 1]),
        (3, vec![2, 3]),
        (5, vec![5, 5]),
        (11, vec![10, 11]),
    ]
    .into_iter()
    .enumerate()
    {
        e.provision_and_bind(&both(&format!("r{round}"), n));
        assert_eq!(e.skew(CAPACITY_TYPE_LABEL), want, "round {round}");
        assert!(e.skew(HOSTNAME_LABEL).iter().all(|c| *c <= 3));
    }
}

#[test]
fn zonal_and_capacity_type_spreads_hold_together() {
    let both = |prefix: &str, n: usize| {
        pods(prefix, n, |p| {
            p.labels(&[TEST])
                .spread(CAPACITY_TYPE_LABEL, 1, true, &[TEST])
                .spread(ZONE_LABEL, 1, true, &[TEST])
        })
    };
    let mut e = env();
    for (round, (n, max_ct, max_zone)) in [(2, 1, 1), (3, 3, 2), (3, 5, 4), (11, 11, 7)]
        .into_iter()
        .enumerate()
    {
        e.provision_and_bind(&both(&format!("r{round}"), n));
        assert!(
            e.skew(CAPACITY_TYPE_LABEL).iter().all(|c| *c <= max_ct),
            "round {round}"
        );
        assert!(
            e.skew(ZONE_LABEL).iter().all(|c| *c <= max_zone),
            "round {round}"
        );
    }
}

fn max_skew(v: &[usize]) -> usize {
    match (v.iter().min(), v.iter().max()) {
        (Some(lo), Some(hi)) => hi - lo,
        _ => 0,
    }
}

#[test]
fn hostname_zonal_and_capacity_type_spreads_hold_together() {
    let all = |prefix: &str, n: usize| {
        pods(prefix, n, |p| {
            p.labels(&[TEST])
                .spread(CAPACITY_TYPE_LABEL, 1, true, &[TEST])
                .spread(ZONE_LABEL, 2, true, &[TEST])
                .spread(HOSTNAME_LABEL, 3, true, &[TEST])
        })
    };
    let mut e = env();
    for i in 1..10 {
        e.provision_and_bind(&all(&format!("r{i}"), i));
        assert!(max_skew(&e.skew(CAPACITY_TYPE_LABEL)) <= 1, "round {i}");
        assert!(max_skew(&e.skew(ZONE_LABEL)) <= 2, "round {i}");
        assert!(max_skew(&e.skew(HOSTNAME_LABEL)) <= 3, "round {i}");
    }
}

#[test]
fn zonal_spread_limited_by_required_affinity_then_widened() {
    let mut e = Env::new(topo_pool());
    let pinned = |prefix: &str, n: usize, zones: &[&str]| {
        let zones: Vec<String> = zones.iter().map(|z| z.to_string()).collect();
        pods(prefix, n, move |p| {
            let zs: Vec<&str> = zones.iter().map(String::as_str).collect();
            p.labels(&[TEST])
                .required(vec![node_req(ZONE_LABEL, "In", &zs)])
                .spread(ZONE_LABEL, 1, true, &[TEST])
        })
    };
    e.provision_and_bind(&pinned("a", 6, &["test-zone-1", "test-zone-2"]));
    assert_eq!(e.skew(ZONE_LABEL), vec![3, 3]);
    e.pools[0].nodepool = topo_pool().req(ZONE_LABEL, Operator::In, &ZONES);
    e.provision_and_bind(&pinned("b", 1, &ZONES));
    assert_eq!(e.skew(ZONE_LABEL), vec![1, 3, 3]);
    e.provision_and_bind(&spread_pods("c", 5, ZONE_LABEL, 1));
    assert_eq!(e.skew(ZONE_LABEL), vec![4, 4, 4]);
}

#[test]
fn capacity_type_spread_limited_by_affinity_then_widened() {
    let mut e = env();
    let ct = |prefix: &str, n: usize, cts: &'static [&'static str]| {
        pods(prefix, n, move |p| {
            p.labels(&[TEST])
                .required(vec![node_req(CAPACITY_TYPE_LABEL, "In", cts)])
                .spread(CAPACITY_TYPE_LABEL, 1, true, &[TEST])
        })
    };
    e.provision_and_bind(&ct("a", 3, &[SPOT]));
    assert_eq!(e.skew(CAPACITY_TYPE_LABEL), vec![3]);
    e.provision_and_bind(&ct("b", 1, &[ON_DEMAND, SPOT]));
    assert_eq!(e.skew(CAPACITY_TYPE_LABEL), vec![1, 3]);
    e.provision_and_bind(&spread_pods("c", 5, CAPACITY_TYPE_LABEL, 1));
    assert_eq!(e.skew(CAPACITY_TYPE_LABEL), vec![4, 5]);
}

// --- MatchLabelKeys / NodeTaintsPolicy / NodeAffinityPolicy ---

#[test]
fn match_label_keys_split_the_spread_by_label_value() {
    let key = "test-label";
    let mk = |prefix: &str, value: &'static str| {
        pods(prefix, 2, move |p| {
            p.labels(&[TEST, (key, value)])
                .spread_with(TopologySpreadConstraint {
                    topology_key: HOSTNAME_LABEL.into(),
                    max_skew: 1,
                    when_unsatisfiable: "DoNotSchedule".into(),
                    label_selector: selector(&[TEST]),
                    match_label_keys: Some(vec![key.into()]),
                    ..Default::default()
                })
        })
    };
    let mut ps = mk("a", "value-a");
    ps.extend(mk("b", "value-b"));
    assert_eq!(bound_skew(env(), &ps, HOSTNAME_LABEL), vec![2, 2]);
}

#[test]
fn match_label_keys_the_pod_lacks_are_ignored() {
    let ps = pods("p", 4, |p| {
        p.labels(&[TEST]).spread_with(TopologySpreadConstraint {
            topology_key: HOSTNAME_LABEL.into(),
            max_skew: 1,
            when_unsatisfiable: "DoNotSchedule".into(),
            label_selector: selector(&[TEST]),
            match_label_keys: Some(vec!["test-label".into()]),
            ..Default::default()
        })
    });
    assert_eq!(bound_skew(env(), &ps, HOSTNAME_LABEL), vec![1, 1, 1, 1]);
}

const SPREAD: &str = "fake-label";

fn policy_pods(taints: Option<&str>, affinity: Option<&str>, node_selector: bool) -> Vec<Pod> {
    pods("p", 5, |p| {
        let p = p
            .labels(&[TEST])
            .requests(&[("cpu", "1")])
            .spread_with(TopologySpreadConstraint {
                topology_key: SPREAD.into(),
                max_skew: 1,
                when_unsatisfiable: "DoNotSchedule".into(),
                label_selector: selector(&[TEST]),
                node_taints_policy: taints.map(Into::into),
                node_affinity_policy: affinity.map(Into::into),
                ..Default::default()
            });
        if node_selector {
            p.node_selector(&[("selector", "value")])
        } else {
            p
        }
    })
}

fn tainted_domains_env() -> Env {
    let mut first = labelled_node("node-foo", &[(SPREAD, "foo")], "100m");
    let mut second = labelled_node("node-bar", &[(SPREAD, "bar")], "100m");
    for n in [&mut first, &mut second] {
        n.taints = vec![taint("taintname", Some("taintvalue"), "NoSchedule")];
    }
    Env::new(topo_pool().labels(&[(SPREAD, "baz")]))
        .node(first)
        .node(second)
}

#[test]
fn node_taints_policy_ignore_counts_tainted_domains() {
    let mut e = tainted_domains_env();
    e.provision_and_bind(&policy_pods(Some("Ignore"), None, false));
    assert_eq!(e.skew(SPREAD), vec![1]);
}

#[test]
fn node_taints_policy_honor_skips_tainted_domains() {
    let mut e = tainted_domains_env();
    e.provision_and_bind(&policy_pods(Some("Honor"), None, false));
    assert_eq!(e.skew(SPREAD), vec![5]);
}

/// The default pool offers `fake-label` foo; a pool tainted `taint-key` offers bar.
fn tainted_pool_domains_env() -> Env {
    let tainted = nodepool("tainted")
        .req(CAPACITY_TYPE_LABEL, Operator::Exists, &[])
        .req(SPREAD, Operator::In, &["bar"])
        .taints(vec![taint("taint-key", Some("taint-value"), "NoSchedule")]);
    Env::new(topo_pool().req(SPREAD, Operator::In, &["foo"])).pool(tainted, default_types())
}

fn taint_policy_pods(n: usize, policy: &str) -> Vec<Pod> {
    pods("p", n, |p| {
        p.labels(&[TEST]).spread_with(TopologySpreadConstraint {
            topology_key: SPREAD.into(),
            max_skew: 1,
            when_unsatisfiable: "DoNotSchedule".into(),
            label_selector: selector(&[TEST]),
            node_taints_policy: Some(policy.into()),
            ..Default::default()
        })
    })
}

#[test]
fn node_taints_policy_ignore_counts_a_tainted_pools_domain() {
    let mut e = tainted_pool_domains_env();
    e.provision_and_bind(&taint_policy_pods(2, "Ignore"));
    // bar counts but no pod tolerates its pool: one pod in foo, the other waits.
    assert_eq!(e.skew(SPREAD), vec![1]);
}

#[test]
fn node_taints_policy_honor_skips_a_tainted_pools_domain() {
    let mut e = tainted_pool_domains_env();
    e.provision_and_bind(&taint_policy_pods(2, "Honor"));
    assert_eq!(e.skew(SPREAD), vec![2]);
}

#[test]
fn node_taints_policy_honor_spreads_each_group_over_the_pools_it_tolerates() {
    let pool = |i: usize, domains: &[&str]| {
        nodepool(&format!("pool-{i}"))
            .req(CAPACITY_TYPE_LABEL, Operator::Exists, &[])
            .req(SPREAD, Operator::In, domains)
            .taints(vec![taint(
                "taint-key",
                Some(&format!("nodepool-{i}")),
                "NoSchedule",
            )])
    };
    let mut e = Env::default()
        .pool(pool(0, &["foo", "bar"]), default_types())
        .pool(pool(1, &["foo", "baz"]), default_types());
    let mut ps = Vec::new();
    for i in 0..2usize {
        let value = format!("nodepool-{i}");
        ps.extend(pods(&format!("g{i}"), (i + 1) * 2, |p| {
            p.labels(&[TEST])
                .spread_with(TopologySpreadConstraint {
                    topology_key: SPREAD.into(),
                    max_skew: 1,
                    when_unsatisfiable: "DoNotSchedule".into(),
                    label_selector: selector(&[TEST]),
                    node_taints_policy: Some("Honor".into()),
                    ..Default::default()
                })
                .tolerate(toleration(
                    "taint-key",
                    "Equal",
                    Some(&value),
                    Some("NoSchedule"),
                ))
        }));
    }
    e.provision_and_bind(&ps);
    // foo 2 (either pool), bar 1 (pool 0 only), baz 3 (pool 1 only).
    assert_eq!(e.skew(SPREAD), vec![1, 2, 3]);
}

fn mismatched_domains_env() -> Env {
    let first = labelled_node(
        "node-foo",
        &[(SPREAD, "foo"), ("selector", "mismatch")],
        "100m",
    );
    let second = labelled_node(
        "node-bar",
        &[(SPREAD, "bar"), ("selector", "mismatch")],
        "100m",
    );
    Env::new(topo_pool().labels(&[(SPREAD, "baz"), ("selector", "value")]))
        .node(first)
        .node(second)
}

#[test]
fn node_affinity_policy_ignore_counts_every_domain() {
    let mut e = mismatched_domains_env();
    e.provision_and_bind(&policy_pods(None, Some("Ignore"), true));
    assert_eq!(e.skew(SPREAD), vec![1]);
}

#[test]
fn node_affinity_policy_honor_counts_only_matching_domains() {
    let mut e = mismatched_domains_env();
    e.provision_and_bind(&policy_pods(None, Some("Honor"), true));
    assert_eq!(e.skew(SPREAD), vec![5]);
}

// --- more Pod Affinity/Anti-Affinity ---

const S2: [(&str, &str); 1] = [("security", "s2")];

#[test]
fn self_hostname_affinity_fills_only_the_first_node() {
    let mk = |prefix: &str| {
        pods(prefix, 10, |p| {
            p.labels(&S2).pod_affinity(HOSTNAME_LABEL, &S2)
        })
    };
    let mut e = env();
    let first = mk("a");
    let out = e.provision_and_bind(&first);
    let placed: Vec<String> = (0..10)
        .filter_map(|i| out.placement(&format!("a-{i}")))
        .collect();
    let nodes: std::collections::BTreeSet<&String> = placed.iter().collect();
    assert_eq!(nodes.len(), 1);
    // Five pods fit the node (the default types hold 5 pods); the rest wait.
    assert_eq!(placed.len(), 5);
    let out = e.provision(&mk("b"));
    for i in 0..10 {
        out.not_scheduled(&format!("b-{i}"));
    }
}

#[test]
fn self_hostname_affinity_cannot_leave_a_zone_it_started_in() {
    let mut e = env();
    e.provision_and_bind(&[pod("first")
        .labels(&S2)
        .node_selector(&[(ZONE_LABEL, "test-zone-1")])
        .pod_affinity(HOSTNAME_LABEL, &S2)]);
    let ps = pods("p", 10, |p| {
        p.labels(&S2)
            .required(vec![node_req(
                ZONE_LABEL,
                "In",
                &["test-zone-2", "test-zone-3"],
            )])
            .pod_affinity(HOSTNAME_LABEL, &S2)
    });
    let out = e.provision(&ps);
    for i in 0..10 {
        out.not_scheduled(&format!("p-{i}"));
    }
}

#[test]
fn matching_zonal_affinities_with_different_zones_make_two_nodes() {
    let s1 = [("security", "s1")];
    let a = pod("a")
        .labels(&s1)
        .pod_affinity(ZONE_LABEL, &s1)
        .required(vec![node_req(ZONE_LABEL, "In", &["test-zone-2"])]);
    let b = pod("b")
        .labels(&s1)
        .pod_affinity(ZONE_LABEL, &s1)
        .required(vec![node_req(ZONE_LABEL, "In", &["test-zone-3"])]);
    let out = env().provision(&[a, b]);
    let (na, nb) = (out.scheduled("a"), out.scheduled("b"));
    assert_eq!(na.label(ZONE_LABEL), Some("test-zone-2"));
    assert_eq!(nb.label(ZONE_LABEL), Some("test-zone-3"));
    assert_ne!(na.name, nb.name);
}

#[test]
fn zonal_anti_affinity_waits_while_the_other_pod_has_no_zone_yet() {
    let other = pod("other").labels(&S2).requests(&[("cpu", "2")]);
    let aff = pod("aff").pod_anti_affinity(ZONE_LABEL, &S2);
    let out = env().provision(&[other, aff]);
    out.scheduled("other");
    out.not_scheduled("aff");
}

fn zonal_pods_with_anti(required: bool) -> Vec<Pod> {
    ["test-zone-1", "test-zone-2", "test-zone-3"]
        .iter()
        .enumerate()
        .map(|(i, z)| {
            let p = pod(&format!("z{i}"))
                .requests(&[("cpu", "2")])
                .node_selector(&[(ZONE_LABEL, z)]);
            if required {
                p.pod_anti_affinity(ZONE_LABEL, &S2)
            } else {
                p.pod_anti_affinity_preferred(10, ZONE_LABEL, &S2)
            }
        })
        .collect()
}

#[test]
fn inverse_preferred_anti_affinity_may_be_violated() {
    let mut ps = zonal_pods_with_anti(false);
    ps.push(pod("aff").labels(&S2));
    let out = env().provision(&ps);
    for p in ["z0", "z1", "z2", "aff"] {
        assert!(out.is_scheduled(p), "{p}");
    }
}

#[test]
fn inverse_required_anti_affinity_holds() {
    let mut ps = zonal_pods_with_anti(true);
    ps.push(pod("aff").labels(&S2));
    let out = env().provision(&ps);
    for p in ["z0", "z1", "z2"] {
        assert!(out.is_scheduled(p), "{p}");
    }
    out.not_scheduled("aff");
}

#[test]
fn anti_affinity_with_an_undecided_zone_blocks_then_separates() {
    let anywhere = pod("anywhere")
        .requests(&[("cpu", "2")])
        .pod_anti_affinity(ZONE_LABEL, &S2);
    let aff = pod("aff").labels(&S2);
    let mut e = env();
    let out = e.provision_and_bind(&[anywhere, aff.clone()]);
    out.scheduled("anywhere");
    out.not_scheduled("aff");
    let out = e.provision(&[aff]);
    let zone = out.scheduled("aff").label(ZONE_LABEL).unwrap().to_string();
    let first = e.nodes.iter().find(|n| n.name == "node-0").unwrap();
    assert_ne!(first.labels.get(ZONE_LABEL), Some(&zone));
}

#[test]
fn inverse_required_anti_affinity_holds_against_existing_nodes() {
    let mut e = env();
    e.provision_and_bind(&zonal_pods_with_anti(true));
    assert_eq!(e.nodes.len(), 3);
    e.provision(&[pod("aff").labels(&S2)]).not_scheduled("aff");
}

#[test]
fn inverse_preferred_anti_affinity_yields_against_existing_nodes() {
    let mut e = env();
    e.provision_and_bind(&zonal_pods_with_anti(false));
    assert!(e.provision(&[pod("aff").labels(&S2)]).is_scheduled("aff"));
}

#[test]
fn a_preferred_affinity_conflicting_with_a_required_spread_yields() {
    let target = pod("target").labels(&S2);
    let mut ps = pods("p", 3, |p| {
        p.labels(&[TEST])
            .spread(HOSTNAME_LABEL, 1, true, &[TEST])
            .pod_affinity_preferred(50, HOSTNAME_LABEL, &S2)
    });
    ps.push(target);
    let mut e = env();
    let out = e.provision_and_bind(&ps);
    for p in ["p-0", "p-1", "p-2", "target"] {
        assert!(out.is_scheduled(p), "{p}");
    }
    assert_eq!(e.skew(HOSTNAME_LABEL), vec![1, 1, 1]);
}

#[test]
fn zonal_affinity_to_an_unconstrained_target_waits_a_round_then_follows() {
    let target = pod("target").labels(&S2);
    let followers = pods("p", 10, |p| p.pod_affinity(ZONE_LABEL, &S2));
    let mut e = env();
    let mut first = followers.clone();
    first.push(target);
    let out = e.provision_and_bind(&first);
    for i in 0..10 {
        out.not_scheduled(&format!("p-{i}"));
    }
    let zone = e.nodes[0].labels[ZONE_LABEL].clone();
    e.provision_and_bind(&followers);
    for i in 0..10 {
        let name = format!("p-{i}");
        let node = e
            .bound
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            .and_then(|p| p.spec.as_ref()?.node_name.clone())
            .unwrap_or_else(|| panic!("{name} not bound"));
        let labels = &e.nodes.iter().find(|n| n.name == node).unwrap().labels;
        assert_eq!(labels[ZONE_LABEL], zone);
    }
}

fn typed(t: &'static str) -> [(&'static str, &'static str); 2] {
    [("type", t), ("spread", "spread")]
}

#[test]
fn a_chain_of_hostname_affinities_lands_together() {
    let ps = vec![
        pod("db").labels(&typed("db")),
        pod("web")
            .labels(&typed("web"))
            .pod_affinity(HOSTNAME_LABEL, &[("type", "db"), ("spread", "spread")]),
        pod("cache")
            .labels(&typed("cache"))
            .pod_affinity(HOSTNAME_LABEL, &[("type", "web"), ("spread", "spread")]),
        pod("ui")
            .labels(&typed("ui"))
            .pod_affinity(HOSTNAME_LABEL, &[("type", "cache"), ("spread", "spread")]),
    ];
    let out = env().provision(&ps);
    for p in ["db", "web", "cache", "ui"] {
        assert!(out.is_scheduled(p), "{p}");
    }
}

/// Ten hostname-spread pods open ten claims; the affinity target goes onto one of them and the
/// follower's term decides whether the target's namespace counts.
fn namespace_filter_case(
    target_ns: &str,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    edit: impl FnOnce(&mut PodAffinityTerm),
) -> Outcome {
    let s2 = [("security", "s2")];
    let mut ps = pods("spread", 10, |p| {
        p.labels(&[TEST]).spread(HOSTNAME_LABEL, 1, true, &[TEST])
    });
    ps.push(pod("target").labels(&s2).namespace(target_ns));
    let mut t = term(HOSTNAME_LABEL, &s2);
    edit(&mut t);
    ps.push(pod("follower").pod_affinity_term(t));
    let mut e = env();
    e.namespaces = namespaces;
    e.provision(&ps)
}

#[test]
fn affinity_ignores_a_target_in_another_namespace_not_selected() {
    let out = namespace_filter_case(
        "other-ns-no-match",
        [("other-ns-no-match".to_string(), BTreeMap::new())].into(),
        |_| {},
    );
    out.scheduled("other-ns-no-match/target");
    out.not_scheduled("follower");
}

#[test]
fn affinity_counts_a_target_in_a_listed_namespace() {
    let out = namespace_filter_case(
        "other-ns-list",
        [("other-ns-list".to_string(), BTreeMap::new())].into(),
        |t| t.namespaces = Some(vec!["other-ns-list".into()]),
    );
    assert_eq!(
        out.scheduled("other-ns-list/target").name,
        out.scheduled("follower").name
    );
}

#[test]
fn an_empty_namespace_selector_counts_targets_in_every_namespace() {
    let labels: BTreeMap<String, String> = [("foo".to_string(), "bar".to_string())].into();
    let out = namespace_filter_case(
        "empty-ns-selector",
        [("empty-ns-selector".to_string(), labels)].into(),
        |t| t.namespace_selector = Some(LabelSelector::default()),
    );
    assert_eq!(
        out.scheduled("empty-ns-selector/target").name,
        out.scheduled("follower").name
    );
}

#[test]
fn an_affinity_no_pod_can_satisfy_is_not_schedulable() {
    let p = pod("db")
        .labels(&typed("db"))
        .pod_affinity(HOSTNAME_LABEL, &[("type", "web"), ("spread", "spread")]);
    env().provision(&[p]).not_scheduled("db");
}

#[test]
fn an_exists_toleration_adds_no_taint_to_the_claim() {
    let p = pod("p").tolerate(toleration("test-key", "Exists", None, Some("NoExecute")));
    let e = env();
    let out = e.provision(&[p]);
    let nc =
        karpenter_capi::scheduling::nodeclaim_for(&out.scheduled("p").claim, &e.pools[0].nodepool);
    assert!(nc.spec.taints.unwrap_or_default().is_empty());
}

#[test]
fn a_skew_already_violated_only_fills_the_smallest_domains() {
    let mut e = env();
    e.provision_and_bind(&cpu_spread_pods("a", 9, 1));
    assert_eq!(e.skew(ZONE_LABEL), vec![3, 3, 3]);
    // Delete the pods outside zone 1.
    let nodes = e.nodes.clone();
    e.bound.retain(|p| {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        nodes
            .iter()
            .find(|n| n.name == node)
            .is_some_and(|n| n.labels.get(ZONE_LABEL).map(String::as_str) == Some("test-zone-1"))
    });
    for n in &mut e.nodes {
        if n.labels.get(ZONE_LABEL).map(String::as_str) != Some("test-zone-1") {
            n.requested = res(&[]);
        }
    }
    assert_eq!(e.skew(ZONE_LABEL), vec![3]);
    e.provision_and_bind(&cpu_spread_pods("b", 3, 1));
    assert_eq!(e.skew(ZONE_LABEL), vec![1, 2, 3]);
}
