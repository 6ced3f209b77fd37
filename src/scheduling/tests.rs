//! Scenario tables for the solver: one test per constraint.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Affinity, ContainerPort, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    Pod, PodAffinity, PodAffinityTerm, PodAntiAffinity, PodSpec, PreferredSchedulingTerm,
    ResourceRequirements, Taint, Toleration, TopologySpreadConstraint, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::*;
use crate::api::nodeclaim::{NodeSelectorRequirementWithMinValues, Operator};
use crate::api::nodepool::TemplateMetadata;
use crate::api::wellknown::{
    ARCH_LABEL, CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, INSTANCE_TYPE_LABEL, ZONE_LABEL,
};
use crate::testing::{self, ZONES, app_selector as selector, nodepool, pool, resources as res};

/// (name, value) pairs: resource lists and limits in tables.
type Pairs<'a> = &'a [(&'a str, &'a str)];

fn q(s: &str) -> Quantity {
    s.parse().unwrap()
}

/// An instance type with `cpu` CPUs, `mem` GiB and 110 pods, on-demand in every zone at a price
/// proportional to its size.
fn it(name: &str, cpu: i64, mem: i64) -> InstanceType {
    it_in(name, cpu, mem, &ZONES, &["on-demand"])
}

fn it_in(name: &str, cpu: i64, mem: i64, zones: &[&str], cts: &[&str]) -> InstanceType {
    testing::instance_type(name, cpu, mem)
        .zones(zones)
        .capacity_types(cts)
        .build()
}

fn standard_types() -> Vec<InstanceType> {
    vec![it("small", 2, 4), it("medium", 4, 8), it("large", 8, 16)]
}

/// A pod labelled `app: <name>` requesting this much CPU and memory.
fn pod(name: &str, cpu: &str, mem: &str) -> Pod {
    testing::pod(name)
        .label("app", name)
        .requests(cpu, mem)
        .build()
}

fn labelled(mut p: Pod, app: &str) -> Pod {
    p.metadata.labels = Some([("app".to_string(), app.to_string())].into());
    p
}

fn spec(p: &mut Pod) -> &mut PodSpec {
    p.spec.as_mut().unwrap()
}

fn snapshot(pods: Vec<Pod>, pools: Vec<PoolInput>) -> Snapshot {
    Snapshot {
        pods,
        nodepools: pools,
        ..Default::default()
    }
}

fn one_pool(pods: Vec<Pod>) -> Results {
    solve(&snapshot(
        pods,
        vec![pool(nodepool("default"), standard_types())],
    ))
}

fn zone_of(c: &NewClaim) -> Vec<String> {
    c.requirements
        .values(ZONE_LABEL)
        .map(|v| v.iter().cloned().collect())
        .unwrap_or_default()
}

fn claim_of<'r>(r: &'r Results, pod: &str) -> &'r NewClaim {
    let key = format!("default/{pod}");
    r.new_claims
        .iter()
        .find(|c| c.pods.contains(&key))
        .unwrap_or_else(|| panic!("{pod} not on a claim: {r:#?}"))
}

fn node_req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: Some(values.iter().map(|v| v.to_string()).collect()),
    }
}

// ---------------------------------------------------------------------------------------------

#[test]
fn requests_pack_and_pick_the_cheapest_type() {
    // (pods as (cpu, memory), expected claims, expected cheapest type of the first claim)
    let cases: &[(Pairs, usize, &str)] = &[
        (&[("1", "1Gi")], 1, "small"),
        (&[("1", "1Gi"), ("500m", "1Gi")], 1, "small"),
        (&[("3", "1Gi")], 1, "medium"),
        (&[("7", "1Gi"), ("7", "1Gi")], 2, "large"),
        (&[("1", "10Gi")], 1, "large"),
    ];
    for (pods, claims, cheapest) in cases {
        let pods = pods
            .iter()
            .enumerate()
            .map(|(i, (c, m))| pod(&format!("p{i}"), c, m))
            .collect();
        let r = one_pool(pods);
        assert!(r.failures.is_empty(), "{r:?}");
        assert_eq!(r.new_claims.len(), *claims, "{r:#?}");
        assert_eq!(r.new_claims[0].instance_types[0], *cheapest, "{r:#?}");
    }
}

#[test]
fn a_type_without_pods_capacity_gets_the_default() {
    let mut t = it("bare", 64, 128);
    t.capacity.0.remove("pods");
    let pods = (0..111)
        .map(|i| pod(&format!("p{i:03}"), "10m", "10Mi"))
        .collect();
    let r = solve(&snapshot(pods, vec![pool(nodepool("default"), vec![t])]));
    assert_eq!(r.new_claims.len(), 2, "110 pods per node");
}

#[test]
fn every_pod_takes_a_pods_slot() {
    let mut t = it("tiny", 8, 16);
    t.capacity.set("pods", Quantity::from_units(2));
    let pods = (0..3)
        .map(|i| pod(&format!("p{i}"), "10m", "10Mi"))
        .collect();
    let r = solve(&snapshot(pods, vec![pool(nodepool("default"), vec![t])]));
    assert_eq!(r.new_claims.len(), 2);
    assert_eq!(
        r.new_claims[0].requests.get("pods"),
        Quantity::from_units(2)
    );
}

#[test]
fn too_big_for_any_type_fails_with_the_resource() {
    let r = one_pool(vec![pod("huge", "64", "1Gi")]);
    assert!(r.new_claims.is_empty());
    let (key, err) = &r.failures[0];
    assert_eq!(key, "default/huge");
    match err {
        PodError::NoInstanceTypeFits { nodepool, details } => {
            assert_eq!(nodepool, "default");
            assert!(details.contains("cpu"), "{details}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn node_selector_and_required_affinity() {
    let mut zonal = pod("zonal", "1", "1Gi");
    spec(&mut zonal).node_selector = Some([(ZONE_LABEL.to_string(), "zone-b".to_string())].into());
    let mut affine = pod("affine", "1", "1Gi");
    spec(&mut affine).affinity = Some(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![node_req(INSTANCE_TYPE_LABEL, "In", &["large"])]),
                    match_fields: None,
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let mut nowhere = pod("nowhere", "1", "1Gi");
    spec(&mut nowhere).node_selector =
        Some([(ZONE_LABEL.to_string(), "zone-x".to_string())].into());
    let r = one_pool(vec![zonal, affine, nowhere]);
    assert_eq!(zone_of(claim_of(&r, "zonal")), ["zone-b"]);
    assert_eq!(claim_of(&r, "affine").instance_types, ["large"]);
    assert_eq!(r.failures.len(), 1, "{r:#?}");
    assert!(matches!(
        r.failures[0].1,
        PodError::NoInstanceTypeFits { .. } | PodError::NoNodePoolMatches { .. }
    ));
    assert!(
        r.failures[0].1.to_string().contains("zone-x"),
        "{}",
        r.failures[0].1
    );
}

#[test]
fn required_labels_must_be_provided() {
    let mut np = nodepool("team-a");
    np.spec.template.metadata = Some(TemplateMetadata {
        labels: Some([("team".to_string(), "a".to_string())].into()),
        annotations: None,
    });
    // (node selector, placed)
    let cases = [
        (("team", "a"), true),
        (("team", "b"), false),
        // Not defined anywhere: a node would not carry it.
        (("gpu", "yes"), false),
        // Well known: the provider sets it even though no type spells it out.
        ((ARCH_LABEL, "amd64"), true),
    ];
    for ((k, v), placed) in cases {
        let mut p = pod("p", "1", "1Gi");
        spec(&mut p).node_selector = Some([(k.to_string(), v.to_string())].into());
        let r = solve(&snapshot(vec![p], vec![pool(np.clone(), standard_types())]));
        assert_eq!(r.failures.is_empty(), placed, "{k}={v}: {r:?}");
        if k == "gpu" {
            assert!(
                r.failures[0]
                    .1
                    .to_string()
                    .contains("\"gpu\" is not provided"),
                "{:?}",
                r.failures
            );
        }
    }
}

#[test]
fn an_unknown_label_cannot_ride_on_a_claim_another_pod_opened() {
    // The plain pod opens a claim first (bigger, so it sorts first); the other may not join it
    // and smuggle its requirement onto the claim.
    let plain = pod("plain", "2", "1Gi");
    let mut picky = pod("picky", "1", "1Gi");
    spec(&mut picky).node_selector =
        Some([("example.com/team".to_string(), "x".to_string())].into());
    let r = solve(&snapshot(
        vec![plain, picky],
        vec![pool(nodepool("default"), standard_types())],
    ));
    assert_eq!(r.new_claims.len(), 1, "{r:?}");
    assert!(
        r.new_claims[0]
            .requirements
            .get("example.com/team")
            .is_none(),
        "{r:?}"
    );
    assert_eq!(r.failures.len(), 1, "{r:?}");
    assert!(r.failures[0].0.ends_with("picky"));
}

#[test]
fn ored_required_terms_fall_through() {
    let mut p = pod("p", "1", "1Gi");
    spec(&mut p).affinity = Some(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![
                    NodeSelectorTerm {
                        match_expressions: Some(vec![node_req(ZONE_LABEL, "In", &["zone-x"])]),
                        match_fields: None,
                    },
                    NodeSelectorTerm {
                        match_expressions: Some(vec![node_req(ZONE_LABEL, "In", &["zone-c"])]),
                        match_fields: None,
                    },
                ],
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let r = one_pool(vec![p]);
    assert_eq!(zone_of(claim_of(&r, "p")), ["zone-c"]);
}

#[test]
fn hostname_requirements_only_existing_nodes_meet() {
    let existing = ExistingNode {
        name: "red-node".into(),
        labels: [(HOSTNAME_LABEL.to_string(), "red-node".to_string())].into(),
        allocatable: res(&[("cpu", "4"), ("memory", "8Gi"), ("pods", "110")]),
        requested: res(&[("cpu", "0")]),
        ..Default::default()
    };
    let with_hostname = |name: &str, op: &str, values: &[&str]| {
        let mut p = pod(name, "1", "1Gi");
        spec(&mut p).affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![node_req(HOSTNAME_LABEL, op, values)]),
                        match_fields: None,
                    }],
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        p
    };
    let mut s = snapshot(
        vec![
            with_hostname("on-red", "In", &["red-node"]),
            with_hostname("elsewhere", "In", &["blue-node"]),
            with_hostname("not-red", "NotIn", &["red-node"]),
        ],
        vec![pool(nodepool("default"), standard_types())],
    );
    s.nodes = vec![existing];
    let r = solve(&s);
    assert_eq!(
        r.placed_on_existing,
        vec![("default/on-red".into(), "red-node".into())]
    );
    assert_eq!(claim_of(&r, "not-red").pods, ["default/not-red"]);
    assert_eq!(r.failures.len(), 1, "{r:?}");
    let (key, err) = &r.failures[0];
    assert_eq!(key, "default/elsewhere");
    assert!(
        matches!(err, PodError::RestrictedLabel { key, .. } if key == HOSTNAME_LABEL),
        "{err}"
    );
    assert!(err.to_string().contains("blue-node"), "{err}");
    // explain says the same at the pool level.
    let v = verdicts(
        with_hostname("elsewhere", "In", &["blue-node"]),
        s.nodepools,
    );
    let why = v[0].ruled_out.as_ref().expect("ruled out");
    assert_eq!(why.constraint, explain::Constraint::Requirements);
    assert!(why.message.contains("is restricted"), "{}", why.message);
}

fn preferring(zone: &str) -> Pod {
    let mut p = pod("pref", "1", "1Gi");
    spec(&mut p).affinity = Some(Affinity {
        node_affinity: Some(NodeAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                PreferredSchedulingTerm {
                    weight: 10,
                    preference: NodeSelectorTerm {
                        match_expressions: Some(vec![node_req(ZONE_LABEL, "In", &[zone])]),
                        match_fields: None,
                    },
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    });
    p
}

#[test]
fn preferred_node_affinity_is_tried_then_relaxed_or_ignored() {
    // (preferred zone, policy, expected zone requirement of the claim)
    let cases: &[(&str, PreferencePolicy, &[&str])] = &[
        ("zone-b", PreferencePolicy::Respect, &["zone-b"]),
        // Relaxed or ignored: the claim has no zone requirement at all.
        ("zone-x", PreferencePolicy::Respect, &[]),
        ("zone-b", PreferencePolicy::Ignore, &[]),
    ];
    for (zone, policy, want) in cases {
        let mut s = snapshot(
            vec![preferring(zone)],
            vec![pool(nodepool("default"), standard_types())],
        );
        s.preference_policy = *policy;
        let r = solve(&s);
        assert!(r.failures.is_empty(), "{r:?}");
        assert_eq!(zone_of(claim_of(&r, "pref")), *want, "{zone} {policy:?}");
    }
}

fn tainted_pool(name: &str, effect: &str) -> PoolInput {
    let mut np = nodepool(name);
    np.spec.template.spec.taints = Some(vec![Taint {
        key: "dedicated".into(),
        value: Some("gpu".into()),
        effect: effect.into(),
        time_added: None,
    }]);
    np.spec.template.spec.startup_taints = Some(vec![Taint {
        key: "init".into(),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    }]);
    pool(np, standard_types())
}

#[test]
fn tolerations_against_nodepool_taints() {
    let toleration = Toleration {
        key: Some("dedicated".into()),
        operator: Some("Equal".into()),
        value: Some("gpu".into()),
        effect: Some("NoSchedule".into()),
        toleration_seconds: None,
    };
    // (effect of the pool taint, pod tolerates, placed). The pool also has a startup taint the
    // pod never tolerates: it must not matter.
    let cases = [
        ("NoSchedule", false, false),
        ("NoSchedule", true, true),
        ("NoExecute", false, false),
        // A PreferNoSchedule taint is relaxed last, so the pod still lands.
        ("PreferNoSchedule", false, true),
    ];
    for (effect, tolerates, placed) in cases {
        let mut p = pod("p", "1", "1Gi");
        if tolerates {
            spec(&mut p).tolerations = Some(vec![toleration.clone()]);
        }
        let r = solve(&snapshot(vec![p], vec![tainted_pool("tainted", effect)]));
        assert_eq!(
            r.new_claims.len() == 1,
            placed,
            "{effect} {tolerates}: {r:?}"
        );
        if !placed {
            let msg = r.failures[0].1.to_string();
            assert!(
                msg.contains("dedicated") && msg.contains("tainted"),
                "{msg}"
            );
        }
    }
}

#[test]
fn prefer_no_schedule_taint_steers_to_another_pool() {
    let r = solve(&snapshot(
        vec![pod("p", "1", "1Gi")],
        vec![
            tainted_pool("a-tainted", "PreferNoSchedule"),
            pool(nodepool("b-clean"), standard_types()),
        ],
    ));
    assert_eq!(r.new_claims[0].nodepool, "b-clean");
}

#[test]
fn static_nodepools_are_left_out_of_provisioning() {
    let mut fixed = nodepool("fixed");
    fixed.spec.replicas = Some(2);
    // Heavier, so it would be tried first were it provisioning.
    fixed.spec.weight = Some(100);
    let r = solve(&snapshot(
        vec![pod("p", "1", "1Gi")],
        vec![pool(fixed.clone(), standard_types())],
    ));
    assert!(r.new_claims.is_empty(), "{r:?}");
    let err = r.failures[0].1.to_string();
    assert!(err.contains("\"fixed\": static"), "{err}");
    let r = solve(&snapshot(
        vec![pod("p", "1", "1Gi")],
        vec![
            pool(fixed.clone(), standard_types()),
            pool(nodepool("dynamic"), standard_types()),
        ],
    ));
    assert_eq!(claim_of(&r, "p").nodepool, "dynamic");
    let v = verdicts(pod("p", "1", "1Gi"), vec![pool(fixed, standard_types())]);
    let why = v[0].ruled_out.as_ref().expect("ruled out");
    assert_eq!(why.constraint, explain::Constraint::Nodepool);
}

#[test]
fn nodepools_are_tried_by_weight_then_name() {
    let mut heavy = nodepool("z-heavy");
    heavy.spec.weight = Some(50);
    // (pools, expected pool)
    let cases: Vec<(Vec<PoolInput>, &str)> = vec![
        (
            vec![
                pool(nodepool("b"), standard_types()),
                pool(nodepool("a"), standard_types()),
            ],
            "a",
        ),
        (
            vec![
                pool(nodepool("a"), standard_types()),
                pool(heavy, standard_types()),
            ],
            "z-heavy",
        ),
    ];
    for (pools, want) in cases {
        let r = solve(&snapshot(vec![pod("p", "1", "1Gi")], pools));
        assert_eq!(r.new_claims[0].nodepool, want);
    }
}

#[test]
fn nodepool_requirements_restrict_types_and_zones() {
    let mut np = nodepool("default");
    np.spec.template.spec.requirements = vec![
        NodeSelectorRequirementWithMinValues::new(
            INSTANCE_TYPE_LABEL,
            Operator::In,
            &["medium", "large"],
        ),
        NodeSelectorRequirementWithMinValues::new(ZONE_LABEL, Operator::NotIn, &["zone-a"]),
    ];
    let r = solve(&snapshot(
        vec![pod("p", "1", "1Gi")],
        vec![pool(np, standard_types())],
    ));
    let c = &r.new_claims[0];
    assert_eq!(c.instance_types, ["medium", "large"]);
    assert_eq!(zone_of(c), Vec::<String>::new(), "NotIn stays a complement");
    assert!(!c.requirements.get(ZONE_LABEL).unwrap().has("zone-a"));
    // A pod that insists on zone-a fits no pool.
    let mut p = pod("a", "1", "1Gi");
    spec(&mut p).node_selector = Some([(ZONE_LABEL.to_string(), "zone-a".to_string())].into());
    let mut np = nodepool("default");
    np.spec.template.spec.requirements = vec![NodeSelectorRequirementWithMinValues::new(
        ZONE_LABEL,
        Operator::NotIn,
        &["zone-a"],
    )];
    let r = solve(&snapshot(vec![p], vec![pool(np, standard_types())]));
    match &r.failures[0].1 {
        PodError::NoNodePoolMatches { details } => assert!(details.contains("zone"), "{details}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn limits_cap_new_claims() {
    // (limits, pods of 1.5 cpu, expected claims, expected failure resource)
    let cases: &[(Pairs, usize, usize, Option<&str>)] = &[
        (&[("cpu", "4")], 2, 2, None),
        // Each claim charges its cheapest type (2 cpu): the second claim is out of cpu.
        (&[("cpu", "3")], 2, 1, Some("cpu")),
        (&[("nodes", "1")], 2, 1, Some("nodes")),
        (&[("nodes", "3")], 3, 3, None),
    ];
    for (limits, pods, claims, failure) in cases {
        let mut np = nodepool("default");
        np.spec.limits = Some(
            limits
                .iter()
                .map(|(k, v)| (k.to_string(), K8sQuantity(v.to_string())))
                .collect(),
        );
        // Only the small type, so every pod pair needs its own node.
        let types = vec![it("small", 2, 4)];
        let pods = (0..*pods)
            .map(|i| pod(&format!("p{i}"), "1500m", "1Gi"))
            .collect();
        let r = solve(&snapshot(pods, vec![pool(np, types)]));
        assert_eq!(r.new_claims.len(), *claims, "{limits:?}: {r:#?}");
        match failure {
            None => assert!(r.failures.is_empty(), "{limits:?}: {r:?}"),
            Some(resource) => assert_eq!(
                r.failures[0].1,
                PodError::LimitReached {
                    nodepool: "default".into(),
                    resource: resource.to_string()
                }
            ),
        }
    }
}

#[test]
fn limits_count_existing_usage_and_exclude_big_types() {
    let mut np = nodepool("default");
    np.spec.limits = Some([("cpu".to_string(), K8sQuantity("10".into()))].into());
    let mut input = pool(np, standard_types());
    input.usage = res(&[("cpu", "4"), ("nodes", "1")]);
    // 6 cpu left: large (8) is excluded even though it would be the only fit for 5 cpu.
    let r = solve(&snapshot(
        vec![pod("p", "3", "1Gi"), pod("big", "5", "1Gi")],
        vec![input],
    ));
    assert_eq!(claim_of(&r, "p").instance_types, ["medium"]);
    assert_eq!(
        r.failures,
        vec![(
            "default/big".to_string(),
            PodError::LimitReached {
                nodepool: "default".into(),
                resource: "cpu".into()
            }
        )]
    );
}

fn quota(
    name: &str,
    match_labels: &[(&str, &str)],
    limits: Pairs,
    usage: Pairs,
) -> super::quota::QuotaInput {
    let sel = LabelSelector {
        match_labels: Some(
            match_labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    };
    super::quota::QuotaInput {
        name: name.into(),
        selector: super::selector::Selector::parse(Some(&sel), "spec.selector").unwrap(),
        limits: res(limits),
        usage: res(usage),
    }
}

#[test]
fn quotas_cap_new_claims_across_pools() {
    // (quota limits, its usage, pods of 1.5 cpu, expected claims, expected failure resource)
    let cases: &[(Pairs, Pairs, usize, usize, Option<&str>)] = &[
        (&[("cpu", "4")], &[], 2, 2, None),
        // Each claim charges its cheapest type (2 cpu): the third is out of cpu.
        (&[("cpu", "4")], &[], 3, 2, Some("cpu")),
        (&[("nodes", "2")], &[], 3, 2, Some("nodes")),
        // What the selected nodes use counts.
        (&[("nodes", "2")], &[("nodes", "1")], 3, 1, Some("nodes")),
        (&[("cpu", "6")], &[("cpu", "4")], 2, 1, Some("cpu")),
        // At or over the limit already: nothing.
        (&[("nodes", "2")], &[("nodes", "3")], 1, 0, Some("nodes")),
    ];
    for (limits, usage, pods, claims, failure) in cases {
        // Two pools the quota covers (by a template label both carry): its room is shared.
        let mut pools = Vec::new();
        for name in ["a", "b"] {
            let mut np = nodepool(name);
            np.spec.template.metadata = Some(TemplateMetadata {
                labels: Some([("team".to_string(), "x".to_string())].into()),
                ..Default::default()
            });
            pools.push(pool(np, vec![it("small", 2, 4)]));
        }
        let pods = (0..*pods)
            .map(|i| pod(&format!("p{i}"), "1500m", "1Gi"))
            .collect();
        let mut snap = snapshot(pods, pools);
        snap.quotas = vec![quota("team-x", &[("team", "x")], limits, usage)];
        let r = solve(&snap);
        assert_eq!(r.new_claims.len(), *claims, "{limits:?} {usage:?}: {r:#?}");
        match failure {
            None => assert!(r.failures.is_empty(), "{limits:?}: {r:?}"),
            Some(resource) => assert_eq!(
                r.failures[0].1,
                PodError::QuotaReached {
                    quota: "team-x".into(),
                    resource: resource.to_string()
                },
                "{limits:?} {usage:?}"
            ),
        }
    }
}

#[test]
fn a_quota_selecting_other_nodes_limits_nothing_and_a_limited_pool_gives_way() {
    let mut limited = nodepool("limited");
    limited.spec.weight = Some(10);
    limited.spec.template.metadata = Some(TemplateMetadata {
        labels: Some([("team".to_string(), "x".to_string())].into()),
        ..Default::default()
    });
    let free = nodepool("free");
    let pods: Vec<_> = (0..3)
        .map(|i| pod(&format!("p{i}"), "1500m", "1Gi"))
        .collect();
    // A quota on team y: no pool's nodes carry it, so all three launch in the heavier pool.
    let mut snap = snapshot(
        pods.clone(),
        vec![
            pool(limited.clone(), vec![it("small", 2, 4)]),
            pool(free.clone(), vec![it("small", 2, 4)]),
        ],
    );
    snap.quotas = vec![quota("team-y", &[("team", "y")], &[("nodes", "0")], &[])];
    let r = solve(&snap);
    assert!(r.failures.is_empty(), "{r:?}");
    assert!(
        r.new_claims.iter().all(|c| c.nodepool == "limited"),
        "{r:#?}"
    );
    // A quota of one node on team x: one claim there, the rest go to the other pool.
    snap.quotas = vec![quota("team-x", &[("team", "x")], &[("nodes", "1")], &[])];
    let r = solve(&snap);
    assert!(r.failures.is_empty(), "{r:?}");
    let in_limited = r
        .new_claims
        .iter()
        .filter(|c| c.nodepool == "limited")
        .count();
    assert_eq!((in_limited, r.new_claims.len()), (1, 3), "{r:#?}");
}

#[test]
fn min_values_keep_enough_types() {
    let mut np = nodepool("default");
    let mut req =
        NodeSelectorRequirementWithMinValues::new(INSTANCE_TYPE_LABEL, Operator::Exists, &[]);
    req.min_values = Some(2);
    np.spec.template.spec.requirements = vec![req];
    // (pods' cpu, placed): 3 cpu leaves medium and large; 5 cpu leaves only large.
    for (cpu, placed) in [("3", true), ("5", false)] {
        let r = solve(&snapshot(
            vec![pod("p", cpu, "1Gi")],
            vec![pool(np.clone(), standard_types())],
        ));
        assert_eq!(r.failures.is_empty(), placed, "{cpu}: {r:?}");
        if !placed {
            assert!(
                r.failures[0].1.to_string().contains("minValues"),
                "{}",
                r.failures[0].1
            );
        }
    }
}

#[test]
fn daemonset_overhead_per_instance_type() {
    let mut ds = pod("ds", "1", "1Gi");
    // Only on large nodes.
    spec(&mut ds).node_selector =
        Some([(INSTANCE_TYPE_LABEL.to_string(), "large".to_string())].into());
    let mut everywhere = pod("ds2", "500m", "100Mi");
    spec(&mut everywhere).tolerations = None;
    let mut s = snapshot(
        vec![pod("p", "1500m", "1Gi")],
        vec![pool(nodepool("default"), standard_types())],
    );
    s.daemonsets = vec![ds, everywhere];
    let r = solve(&s);
    // small (2 cpu) - 500m daemon = 1.5: fits exactly; the claim's requests include the daemon.
    let c = claim_of(&r, "p");
    assert_eq!(c.instance_types[0], "small");
    assert_eq!(c.requests.get("cpu"), q("2"));
    assert_eq!(c.requests.get("pods"), q("2"));
    // 6.5 cpu: large has 8 - 1 - 0.5 = 6.5, medium is too small.
    let mut s2 = s.clone();
    s2.pods = vec![pod("q", "6500m", "1Gi")];
    assert_eq!(solve(&s2).new_claims[0].instance_types, ["large"]);
    s2.pods = vec![pod("q", "6600m", "1Gi")];
    assert!(matches!(
        solve(&s2).failures[0].1,
        PodError::NoInstanceTypeFits { .. }
    ));
}

fn spread(mut p: Pod, key: &str, skew: i32, hard: bool) -> Pod {
    let app = p.metadata.labels.as_ref().unwrap()["app"].clone();
    spec(&mut p).topology_spread_constraints = Some(vec![TopologySpreadConstraint {
        max_skew: skew,
        topology_key: key.into(),
        when_unsatisfiable: if hard {
            "DoNotSchedule"
        } else {
            "ScheduleAnyway"
        }
        .into(),
        label_selector: selector(&app),
        ..Default::default()
    }]);
    p
}

#[test]
fn zonal_topology_spread_balances_zones() {
    let pods: Vec<Pod> = (0..6)
        .map(|i| {
            spread(
                labelled(pod(&format!("p{i}"), "100m", "100Mi"), "web"),
                ZONE_LABEL,
                1,
                true,
            )
        })
        .collect();
    let r = one_pool(pods);
    assert!(r.failures.is_empty(), "{r:?}");
    let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
    for c in &r.new_claims {
        let z = zone_of(c);
        assert_eq!(z.len(), 1, "each claim is pinned to one zone: {c:?}");
        *per_zone.entry(z[0].clone()).or_default() += c.pods.len();
    }
    assert_eq!(
        per_zone.values().copied().collect::<Vec<_>>(),
        [2, 2, 2],
        "{per_zone:?}"
    );
}

#[test]
fn zonal_spread_counts_bound_pods_and_respects_pod_zones() {
    // Two matching pods already run in zone-a: the next ones go to b and c first.
    let node = ExistingNode {
        name: "n1".into(),
        labels: [(ZONE_LABEL.to_string(), "zone-a".to_string())].into(),
        allocatable: res(&[("cpu", "0"), ("pods", "0")]),
        ..Default::default()
    };
    let bound: Vec<Pod> = (0..2)
        .map(|i| {
            let mut p = labelled(pod(&format!("old{i}"), "1", "1Gi"), "web");
            spec(&mut p).node_name = Some("n1".into());
            p
        })
        .collect();
    let pods = (0..2)
        .map(|i| {
            spread(
                labelled(pod(&format!("p{i}"), "100m", "100Mi"), "web"),
                ZONE_LABEL,
                1,
                true,
            )
        })
        .collect();
    let mut s = snapshot(pods, vec![pool(nodepool("default"), standard_types())]);
    s.nodes = vec![node];
    s.bound_pods = bound.into_iter().map(Arc::new).collect();
    let r = solve(&s);
    let mut zones: Vec<String> = r.new_claims.iter().flat_map(zone_of).collect();
    zones.sort();
    assert_eq!(zones, ["zone-b", "zone-c"], "{r:#?}");
    // Counts are now a=2, b=1, c=1: a third pod may not go to zone-a.
    s.pods.push(spread(
        labelled(pod("p2", "100m", "100Mi"), "web"),
        ZONE_LABEL,
        1,
        true,
    ));
    let r = solve(&s);
    assert!(r.failures.is_empty(), "{r:#?}");
    assert_eq!(zone_of(claim_of(&r, "p2")), ["zone-b"]);
    // nodeAffinityPolicy Honor: a pod pinned to zone-a only counts zone-a, so it may go there.
    let mut pinned = spread(
        labelled(pod("pinned", "100m", "100Mi"), "web"),
        ZONE_LABEL,
        1,
        true,
    );
    spec(&mut pinned).node_selector = Some([(ZONE_LABEL.to_string(), "zone-a".to_string())].into());
    s.pods = vec![pinned];
    let r = solve(&s);
    assert_eq!(zone_of(claim_of(&r, "pinned")), ["zone-a"]);
}

#[test]
fn hostname_spread_and_schedule_anyway() {
    // (maxSkew, hard, pods, expected claims)
    let cases = [(1, true, 4, 4), (2, true, 4, 2), (1, false, 4, 4)];
    for (skew, hard, n, claims) in cases {
        let pods = (0..n)
            .map(|i| {
                spread(
                    labelled(pod(&format!("p{i}"), "100m", "100Mi"), "web"),
                    HOSTNAME_LABEL,
                    skew,
                    hard,
                )
            })
            .collect();
        let r = one_pool(pods);
        assert!(r.failures.is_empty());
        assert_eq!(r.new_claims.len(), claims, "skew {skew} hard {hard}");
    }
    // ScheduleAnyway yields when it cannot be met (nodes limit 1), DoNotSchedule does not.
    for (hard, failures) in [(false, 0), (true, 1)] {
        let mut np = nodepool("default");
        np.spec.limits = Some([("nodes".to_string(), K8sQuantity("1".into()))].into());
        let pods = (0..2)
            .map(|i| {
                spread(
                    labelled(pod(&format!("p{i}"), "100m", "100Mi"), "web"),
                    HOSTNAME_LABEL,
                    1,
                    hard,
                )
            })
            .collect();
        let r = solve(&snapshot(pods, vec![pool(np, standard_types())]));
        assert_eq!(r.failures.len(), failures, "hard {hard}: {r:#?}");
    }
}

fn with_pod_affinity(mut p: Pod, app: &str, key: &str, anti: bool, required: bool) -> Pod {
    let term = PodAffinityTerm {
        label_selector: selector(app),
        topology_key: key.into(),
        ..Default::default()
    };
    let (req, pref) = if required {
        (Some(vec![term]), None)
    } else {
        (
            None,
            Some(vec![WeightedPodAffinityTerm {
                weight: 1,
                pod_affinity_term: term,
            }]),
        )
    };
    let affinity = spec(&mut p).affinity.get_or_insert_with(Default::default);
    if anti {
        affinity.pod_anti_affinity = Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: req,
            preferred_during_scheduling_ignored_during_execution: pref,
        });
    } else {
        affinity.pod_affinity = Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: req,
            preferred_during_scheduling_ignored_during_execution: pref,
        });
    }
    p
}

#[test]
fn hostname_anti_affinity_separates_pods() {
    let pods = (0..3)
        .map(|i| {
            with_pod_affinity(
                labelled(pod(&format!("p{i}"), "100m", "100Mi"), "db"),
                "db",
                HOSTNAME_LABEL,
                true,
                true,
            )
        })
        .collect();
    let r = one_pool(pods);
    assert_eq!(r.new_claims.len(), 3);
    assert!(r.new_claims.iter().all(|c| c.pods.len() == 1));
    // Symmetry: a plain "db" pod may not join a claim whose pod repels "db" pods.
    let mut pods: Vec<Pod> = vec![with_pod_affinity(
        labelled(pod("guard", "1", "1Gi"), "guard"),
        "db",
        HOSTNAME_LABEL,
        true,
        true,
    )];
    pods.push(labelled(pod("plain", "100m", "100Mi"), "db"));
    let r = one_pool(pods);
    assert_eq!(r.new_claims.len(), 2, "{r:#?}");
}

#[test]
fn zonal_anti_affinity_commits_late() {
    let pods = (0..4)
        .map(|i| {
            with_pod_affinity(
                labelled(pod(&format!("p{i}"), "100m", "100Mi"), "db"),
                "db",
                ZONE_LABEL,
                true,
                true,
            )
        })
        .collect();
    let r = one_pool(pods);
    // The first pod's claim keeps every zone open, and its anti-affinity blocks them all until
    // the node exists (upstream's late committal): one pod per round.
    assert_eq!(r.new_claims.len(), 1, "{r:#?}");
    assert_ne!(zone_of(&r.new_claims[0]).len(), 1, "{r:#?}");
    assert_eq!(r.failures.len(), 3, "{r:#?}");
}

#[test]
fn preferred_anti_affinity_relaxes() {
    let pods = (0..4)
        .map(|i| {
            with_pod_affinity(
                labelled(pod(&format!("p{i}"), "100m", "100Mi"), "db"),
                "db",
                ZONE_LABEL,
                true,
                false,
            )
        })
        .collect();
    let r = one_pool(pods);
    assert!(r.failures.is_empty(), "{r:?}");
}

#[test]
fn zonal_and_hostname_affinity_colocate() {
    for key in [ZONE_LABEL, HOSTNAME_LABEL] {
        let pods: Vec<Pod> = (0..4)
            .map(|i| {
                with_pod_affinity(
                    labelled(pod(&format!("p{i}"), "1500m", "1Gi"), "cache"),
                    "cache",
                    key,
                    false,
                    true,
                )
            })
            .collect();
        let r = one_pool(pods);
        assert!(r.failures.is_empty(), "{key}: {r:?}");
        let zones: BTreeSet<Vec<String>> = r.new_claims.iter().map(zone_of).collect();
        assert_eq!(zones.len(), 1, "{key}: one zone for all: {zones:?}");
        if key == HOSTNAME_LABEL {
            assert_eq!(r.new_claims.len(), 1);
        }
    }
    // Affinity to pods that do not exist (and not to itself) cannot be met.
    let lonely = with_pod_affinity(pod("lonely", "1", "1Gi"), "ghost", ZONE_LABEL, false, true);
    let r = one_pool(vec![lonely]);
    assert_eq!(r.failures.len(), 1);
}

#[test]
fn affinity_follows_bound_pods() {
    let node = ExistingNode {
        name: "n1".into(),
        labels: [(ZONE_LABEL.to_string(), "zone-c".to_string())].into(),
        allocatable: res(&[("cpu", "0"), ("pods", "0")]),
        ..Default::default()
    };
    let mut bound = labelled(pod("server", "1", "1Gi"), "server");
    spec(&mut bound).node_name = Some("n1".into());
    let client = with_pod_affinity(pod("client", "1", "1Gi"), "server", ZONE_LABEL, false, true);
    let mut s = snapshot(
        vec![client],
        vec![pool(nodepool("default"), standard_types())],
    );
    s.nodes = vec![node];
    s.bound_pods = vec![Arc::new(bound)];
    let r = solve(&s);
    assert_eq!(zone_of(claim_of(&r, "client")), ["zone-c"]);
}

#[test]
fn host_ports_conflict_on_one_node() {
    let with_port = |name: &str, port: i32, protocol: &str| {
        let mut p = pod(name, "100m", "100Mi");
        spec(&mut p).containers[0].ports = Some(vec![ContainerPort {
            container_port: 80,
            host_port: Some(port),
            protocol: Some(protocol.into()),
            ..Default::default()
        }]);
        p
    };
    // (pods, expected claims)
    let cases = [
        (
            vec![with_port("a", 80, "TCP"), with_port("b", 80, "TCP")],
            2,
        ),
        (
            vec![with_port("a", 80, "TCP"), with_port("b", 80, "UDP")],
            1,
        ),
        (
            vec![with_port("a", 80, "TCP"), with_port("b", 81, "TCP")],
            1,
        ),
    ];
    for (pods, claims) in cases {
        assert_eq!(one_pool(pods).new_claims.len(), claims);
    }
}

#[test]
fn existing_nodes_first_then_in_flight_then_new() {
    let node = |name: &str, cpu: &str, in_flight: bool| ExistingNode {
        name: name.into(),
        labels: [(ZONE_LABEL.to_string(), "zone-a".to_string())].into(),
        allocatable: res(&[("cpu", cpu), ("memory", "8Gi"), ("pods", "110")]),
        requested: res(&[("cpu", "0")]),
        in_flight,
        daemon_requested: Default::default(),
        nodepool: Some("default".into()),
        taints: vec![],
    };
    let mut s = snapshot(
        vec![
            pod("a", "2", "1Gi"),
            pod("b", "2", "1Gi"),
            pod("c", "2", "1Gi"),
        ],
        vec![pool(nodepool("default"), standard_types())],
    );
    s.nodes = vec![node("existing", "2", false), node("inflight", "2", true)];
    let r = solve(&s);
    assert_eq!(
        r.placed_on_existing,
        vec![
            ("default/a".into(), "existing".into()),
            ("default/b".into(), "inflight".into())
        ]
    );
    assert_eq!(claim_of(&r, "c").pods, ["default/c"]);
    // An untolerated taint or a mismatched selector keeps a pod off an existing node.
    let mut tainted = node("tainted", "8", false);
    tainted.taints = vec![Taint {
        key: "k".into(),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    }];
    let mut ephemeral = node("booting", "8", true);
    ephemeral.taints = vec![Taint {
        key: "karpenter.sh/unregistered".into(),
        value: None,
        effect: "NoExecute".into(),
        time_added: None,
    }];
    let mut picky = pod("picky", "1", "1Gi");
    spec(&mut picky).node_selector = Some([(ZONE_LABEL.to_string(), "zone-b".to_string())].into());
    s.nodes = vec![tainted, ephemeral];
    s.pods = vec![pod("x", "1", "1Gi"), picky];
    let r = solve(&s);
    assert_eq!(
        r.placed_on_existing,
        vec![("default/x".into(), "booting".into())]
    );
    assert_eq!(zone_of(claim_of(&r, "picky")), ["zone-b"]);
}

#[test]
fn cheapest_offering_orders_types_and_capacity_types_are_listed() {
    let types = vec![
        it_in("od-only", 4, 8, &ZONES, &["on-demand"]),
        it_in("spotty", 4, 8, &["zone-a"], &["on-demand", "spot"]),
    ];
    let r = solve(&snapshot(
        vec![pod("p", "1", "1Gi")],
        vec![pool(nodepool("default"), types.clone())],
    ));
    let c = &r.new_claims[0];
    assert_eq!(c.instance_types, ["spotty", "od-only"], "spot is cheaper");
    let ct: Vec<&String> = c
        .requirements
        .values(CAPACITY_TYPE_LABEL)
        .unwrap()
        .iter()
        .collect();
    assert_eq!(ct, ["on-demand", "spot"]);
    // A pod that needs on-demand in zone-b: spotty drops out.
    let mut p = pod("p", "1", "1Gi");
    spec(&mut p).node_selector = Some(
        [
            (ZONE_LABEL.to_string(), "zone-b".to_string()),
            (CAPACITY_TYPE_LABEL.to_string(), "on-demand".to_string()),
        ]
        .into(),
    );
    let r = solve(&snapshot(vec![p], vec![pool(nodepool("default"), types)]));
    assert_eq!(r.new_claims[0].instance_types, ["od-only"]);
    // An unavailable offering is not used.
    let mut gone = it("gone", 2, 4);
    for o in &mut gone.offerings {
        o.available = false;
    }
    let r = solve(&snapshot(
        vec![pod("p", "1", "1Gi")],
        vec![pool(nodepool("default"), vec![gone, it("big", 8, 16)])],
    ));
    assert_eq!(r.new_claims[0].instance_types, ["big"]);
}

#[test]
fn invalid_pods_are_reported_and_others_still_placed() {
    let mut bad = pod("bad", "1", "1Gi");
    spec(&mut bad).affinity = Some(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![node_req("k", "Near", &["x"])]),
                    match_fields: None,
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let r = one_pool(vec![bad, pod("good", "1", "1Gi")]);
    assert_eq!(r.new_claims.len(), 1);
    let (key, err) = &r.failures[0];
    assert_eq!(key, "default/bad");
    assert!(
        err.to_string().contains("nodeSelectorTerms[0]") && err.to_string().contains("Near"),
        "{err}"
    );
}

#[test]
fn an_empty_node_selector_term_matches_no_node() {
    let with_terms = |name: &str, terms: Vec<NodeSelectorTerm>| {
        let mut p = pod(name, "1", "1Gi");
        spec(&mut p).affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: terms,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        p
    };
    let empty = NodeSelectorTerm {
        match_expressions: Some(vec![]),
        match_fields: None,
    };
    // Only empty terms: kube-scheduler matches no node, so no claim is made for it.
    let r = one_pool(vec![with_terms(
        "only-empty",
        vec![empty.clone(), NodeSelectorTerm::default()],
    )]);
    assert!(r.new_claims.is_empty(), "{:?}", r.new_claims);
    let (key, err) = &r.failures[0];
    assert_eq!(key, "default/only-empty");
    assert!(err.to_string().contains("nodeSelectorTerms"), "{err}");
    // An empty term beside a real one adds nothing: the real one alone decides.
    let r = one_pool(vec![with_terms(
        "mixed",
        vec![
            empty,
            NodeSelectorTerm {
                match_expressions: Some(vec![node_req(ZONE_LABEL, "In", &[ZONES[1]])]),
                match_fields: None,
            },
        ],
    )]);
    assert_eq!(r.new_claims.len(), 1, "{:?}", r.failures);
    assert_eq!(zone_of(&r.new_claims[0]), [ZONES[1]]);
}

#[test]
fn a_types_csi_attach_limits_bound_the_volumes_a_new_claim_takes() {
    use crate::scheduling::volumes::{NodeVolumes, PodVolumes};
    let pods: Vec<Pod> = (0..5)
        .map(|i| pod(&format!("p{i}"), "100m", "128Mi"))
        .collect();
    let mut volumes = NodeVolumes::default();
    for p in &pods {
        let key = crate::scheduling::pod::pod_key(p);
        let v: PodVolumes = BTreeMap::from([(
            "ebs.csi.aws.com".to_string(),
            [format!("{key}-data")].into_iter().collect(),
        )]);
        volumes.by_pod.insert(key, v);
    }
    let limited = |limit: Option<usize>| {
        let mut types = standard_types();
        for t in &mut types {
            if let Some(l) = limit {
                t.csi_limits.insert("ebs.csi.aws.com".into(), l);
            }
        }
        solve_with_volumes(
            &snapshot(pods.clone(), vec![pool(nodepool("default"), types)]),
            &volumes,
        )
    };
    // Without a limit the five small pods share one claim.
    assert_eq!(limited(None).new_claims.len(), 1);
    // Two volumes per node: three claims, none with more than two pods.
    let r = limited(Some(2));
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.new_claims.len(), 3, "{:?}", r.new_claims);
    assert!(r.new_claims.iter().all(|c| c.pods.len() <= 2));
    // A limit of 0 volumes leaves no type for them.
    let r = limited(Some(0));
    assert!(r.new_claims.is_empty());
    assert_eq!(r.failures.len(), 5);
}

#[test]
fn pods_are_packed_largest_first() {
    // Two 1.5-cpu pods and two 0.5-cpu pods fill two small nodes exactly when sorted.
    let pods = vec![
        pod("s1", "500m", "1Gi"),
        pod("l1", "1500m", "1Gi"),
        pod("s2", "500m", "1Gi"),
        pod("l2", "1500m", "1Gi"),
    ];
    let mut np = nodepool("default");
    np.spec.template.spec.requirements = vec![NodeSelectorRequirementWithMinValues::new(
        INSTANCE_TYPE_LABEL,
        Operator::In,
        &["small"],
    )];
    let r = solve(&snapshot(pods, vec![pool(np, standard_types())]));
    assert_eq!(r.new_claims.len(), 2);
    assert!(r.new_claims.iter().all(|c| c.requests.get("cpu") == q("2")));
}

#[test]
fn nodeclaim_is_written_as_karpenter_does() {
    let mut np = nodepool("general");
    np.spec.template.metadata = Some(TemplateMetadata {
        labels: Some([("team".to_string(), "a".to_string())].into()),
        annotations: Some([("note".to_string(), "x".to_string())].into()),
    });
    np.spec.template.spec.taints = Some(vec![Taint {
        key: "t".into(),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    }]);
    let mut p = pod("p", "1", "1Gi");
    spec(&mut p).tolerations = Some(vec![Toleration {
        operator: Some("Exists".into()),
        ..Default::default()
    }]);
    spec(&mut p).node_selector = Some([(ZONE_LABEL.to_string(), "zone-a".to_string())].into());
    let r = solve(&snapshot(vec![p], vec![pool(np.clone(), standard_types())]));
    let claim = nodeclaim_for(&r.new_claims[0], &np);
    assert_eq!(claim.metadata.generate_name.as_deref(), Some("general-"));
    let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("NodePool", "general", "uid-general")
    );
    assert_eq!(owner.api_version, "karpenter.sh/v1");
    assert_eq!(owner.block_owner_deletion, Some(true));
    let labels = claim.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["karpenter.sh/nodepool"], "general");
    assert_eq!(labels["team"], "a");
    assert_eq!(labels[ZONE_LABEL], "zone-a");
    let annotations = claim.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations["note"], "x");
    assert_eq!(
        annotations["karpenter.sh/nodepool-hash"],
        crate::api::nodepool_hash(&np)
    );
    assert_eq!(annotations["karpenter.sh/nodepool-hash-version"], "v3");
    assert_eq!(
        annotations["karpenter.sh/nodeclaim-min-values-relaxed"],
        "false"
    );
    let reqs = &claim.spec.requirements;
    let it_req = reqs.iter().find(|r| r.key == INSTANCE_TYPE_LABEL).unwrap();
    assert_eq!(it_req.operator, Operator::In);
    assert_eq!(it_req.values(), ["large", "medium", "small"]);
    assert!(
        reqs.iter()
            .any(|r| r.key == CAPACITY_TYPE_LABEL && r.values() == ["on-demand"])
    );
    let requests = claim
        .spec
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    assert_eq!(requests.get("cpu").unwrap().0, "1");
    assert_eq!(requests.get("pods").unwrap().0, "1");
    assert_eq!(claim.spec.taints.as_ref().unwrap()[0].key, "t");
    assert_eq!(claim.spec.node_class_ref.name, "default");
    // The claim passes the API's own validation.
    crate::api::validate_nodeclaim(&claim).unwrap();
}

#[test]
fn solve_is_deterministic() {
    let pods: Vec<Pod> = (0..30)
        .map(|i| {
            let p = labelled(
                pod(&format!("p{i:02}"), ["100m", "700m", "1"][i % 3], "512Mi"),
                "web",
            );
            if i % 2 == 0 {
                spread(p, ZONE_LABEL, 1, true)
            } else {
                p
            }
        })
        .collect();
    let a = one_pool(pods.clone());
    let b = one_pool(pods.into_iter().rev().collect());
    assert_eq!(a, b);
}

#[test]
fn nodepool_usage_counts_nodes() {
    let caps = [res(&[("cpu", "2")]), res(&[("cpu", "4")])];
    let u = nodepool_usage(caps.iter());
    assert_eq!(u.get("cpu"), q("6"));
    assert_eq!(u.get("nodes"), q("2"));
}

use std::collections::BTreeSet;

// ---------------------------------------------------------------------------------------------
// explain::rule_out: the first constraint per NodePool and instance type
// ---------------------------------------------------------------------------------------------

fn verdicts(p: Pod, pools: Vec<PoolInput>) -> Vec<explain::PoolVerdict> {
    explain::rule_out(&p, &snapshot(vec![], pools)).expect("readable pod")
}

fn type_verdict<'v>(v: &'v explain::PoolVerdict, name: &str) -> &'v explain::TypeVerdict {
    v.instance_types
        .iter()
        .find(|t| t.instance_type == name)
        .unwrap_or_else(|| panic!("{name} not in {v:#?}"))
}

#[test]
fn explain_names_the_resource_that_rules_small_types_out() {
    let v = verdicts(
        pod("p", "3", "1Gi"),
        vec![pool(nodepool("default"), standard_types())],
    );
    assert_eq!(v.len(), 1);
    assert!(v[0].ruled_out.is_none(), "{v:#?}");
    let small = type_verdict(&v[0], "small")
        .ruled_out
        .as_ref()
        .expect("ruled out");
    assert_eq!(small.constraint, explain::Constraint::Resources);
    assert!(small.message.contains("cpu needs 3"), "{}", small.message);
    assert_eq!(v[0].eligible().collect::<Vec<_>>(), ["medium", "large"]);
}

#[test]
fn explain_names_an_untolerated_nodepool_taint() {
    let v = verdicts(
        pod("p", "1", "1Gi"),
        vec![tainted_pool("gpu", "NoSchedule")],
    );
    let r = v[0].ruled_out.as_ref().expect("pool ruled out");
    assert_eq!(r.constraint, explain::Constraint::Taints);
    assert!(
        r.message.contains("dedicated=gpu:NoSchedule"),
        "{}",
        r.message
    );
    // A PreferNoSchedule taint is a preference: it rules nothing out.
    let v = verdicts(
        pod("p", "1", "1Gi"),
        vec![tainted_pool("soft", "PreferNoSchedule")],
    );
    assert!(v[0].ruled_out.is_none(), "{v:#?}");
}

#[test]
fn explain_names_requirements_at_pool_and_type_level() {
    // The pod selects a zone no offering has: every type is out on requirements.
    let mut p = pod("p", "1", "1Gi");
    spec(&mut p).node_selector = Some([(ZONE_LABEL.to_string(), "zone-x".to_string())].into());
    let v = verdicts(p, vec![pool(nodepool("default"), standard_types())]);
    assert!(
        v[0].instance_types.iter().all(|t| {
            t.ruled_out
                .as_ref()
                .is_some_and(|r| r.constraint == explain::Constraint::Requirements)
        }),
        "{v:#?}"
    );
    // The pod selects an instance type: the others are out on requirements, it is not.
    let mut p = pod("p", "1", "1Gi");
    spec(&mut p).node_selector =
        Some([(INSTANCE_TYPE_LABEL.to_string(), "large".to_string())].into());
    let v = verdicts(p, vec![pool(nodepool("default"), standard_types())]);
    assert_eq!(
        type_verdict(&v[0], "small")
            .ruled_out
            .as_ref()
            .map(|r| r.constraint),
        Some(explain::Constraint::Requirements)
    );
    assert_eq!(v[0].eligible().collect::<Vec<_>>(), ["large"]);
    // A label no node of the pool carries rules the whole pool out.
    let mut p = pod("p", "1", "1Gi");
    spec(&mut p).node_selector = Some([("team".to_string(), "a".to_string())].into());
    let v = verdicts(p, vec![pool(nodepool("default"), standard_types())]);
    let r = v[0].ruled_out.as_ref().expect("pool ruled out");
    assert_eq!(r.constraint, explain::Constraint::Requirements);
    assert!(r.message.contains("\"team\""), "{}", r.message);
}

#[test]
fn explain_names_unavailable_offerings_and_limits() {
    let mut full = it("small", 2, 4);
    for o in &mut full.offerings {
        o.available = false;
        o.replicas = 3;
        o.max_size = Some(3);
    }
    let mut np = nodepool("default");
    np.spec.limits = Some([("cpu".to_string(), K8sQuantity("6".into()))].into());
    let v = verdicts(
        pod("p", "1", "1Gi"),
        vec![pool(np, vec![full, it("medium", 4, 8), it("large", 8, 16)])],
    );
    let small = type_verdict(&v[0], "small")
        .ruled_out
        .as_ref()
        .expect("out");
    assert_eq!(small.constraint, explain::Constraint::Offerings);
    assert!(
        small.message.contains("max size (3 of 3"),
        "{}",
        small.message
    );
    let large = type_verdict(&v[0], "large")
        .ruled_out
        .as_ref()
        .expect("out");
    assert_eq!(large.constraint, explain::Constraint::Limits);
    assert!(large.message.contains("\"cpu\""), "{}", large.message);
    assert_eq!(v[0].eligible().collect::<Vec<_>>(), ["medium"]);
}

#[test]
fn explain_reports_topology_and_affinity_from_the_solver() {
    // The pool offers zone-a only, where two matching pods run; zone-b (a full node's zone)
    // has none: a required zonal spread of skew 1 cannot place the pod.
    let types = vec![it_in("small", 2, 4, &["zone-a"], &["on-demand"])];
    let p = spread(labelled(pod("p", "1", "1Gi"), "web"), ZONE_LABEL, 1, true);
    let bound: Vec<Pod> = (0..2)
        .map(|i| {
            let mut b = labelled(pod(&format!("b{i}"), "100m", "100Mi"), "web");
            spec(&mut b).node_name = Some("n-a".into());
            b
        })
        .collect();
    let node = |name: &str, zone: &str| ExistingNode {
        name: name.into(),
        labels: [(ZONE_LABEL.to_string(), zone.to_string())].into(),
        allocatable: res(&[("cpu", "2"), ("memory", "4Gi"), ("pods", "110")]),
        ..Default::default()
    };
    let snap = Snapshot {
        pods: vec![],
        bound_pods: bound.into_iter().map(Arc::new).collect(),
        nodes: vec![node("n-a", "zone-a"), node("n-b", "zone-b")],
        nodepools: vec![pool(nodepool("default"), types)],
        ..Default::default()
    };
    let v = explain::rule_out(&p, &snap).expect("readable");
    let r = type_verdict(&v[0], "small")
        .ruled_out
        .as_ref()
        .expect("out");
    assert_eq!(r.constraint, explain::Constraint::Topology, "{r:?}");
    // Required anti-affinity against a pod in the only zone.
    let p = with_pod_affinity(pod("p", "1", "1Gi"), "web", ZONE_LABEL, true, true);
    let v = explain::rule_out(&p, &snap).expect("readable");
    let r = type_verdict(&v[0], "small")
        .ruled_out
        .as_ref()
        .expect("out");
    assert_eq!(r.constraint, explain::Constraint::Affinity, "{r:?}");
}

/// A claim whose zone is still open may land in a zone's quota and is charged to it; once a
/// pod joining it fixes another zone, the quota gets its room back for a claim in its zone.
#[test]
fn a_claim_narrowed_out_of_a_quota_gives_its_room_back() {
    let mut snap = snapshot(
        vec![
            pod("any-zone", "1500m", "1Gi"),
            with_zone(pod("in-b", "400m", "1Gi"), "zone-b"),
            with_zone(pod("in-a", "300m", "1Gi"), "zone-a"),
        ],
        vec![pool(nodepool("default"), vec![it("medium", 4, 8)])],
    );
    snap.quotas = vec![quota(
        "zone-a",
        &[(ZONE_LABEL, "zone-a")],
        &[("nodes", "1")],
        &[],
    )];
    let r = solve(&snap);
    assert!(r.failures.is_empty(), "{r:#?}");
    assert_eq!(r.new_claims.len(), 2, "{r:#?}");
}

fn with_zone(mut p: Pod, zone: &str) -> Pod {
    spec(&mut p).node_selector = Some([(ZONE_LABEL.to_string(), zone.to_string())].into());
    p
}

#[test]
fn explain_names_the_quota_that_holds_a_pod() {
    let mut snap = snapshot(
        vec![],
        vec![pool(nodepool("default"), vec![it("small", 2, 4)])],
    );
    snap.quotas = vec![quota(
        "pool-cap",
        &[(crate::api::wellknown::NODEPOOL_LABEL, "default")],
        &[("cpu", "4")],
        &[("cpu", "4")],
    )];
    let p = pod("p", "1", "1Gi");
    let v = explain::rule_out(&p, &snap).expect("readable");
    let r = type_verdict(&v[0], "small")
        .ruled_out
        .as_ref()
        .expect("held by the quota");
    assert_eq!(r.constraint, explain::Constraint::Limits, "{r:?}");
    assert_eq!(
        r.message,
        "CapacityQuota \"pool-cap\" has reached its limit on \"cpu\""
    );
}

#[test]
fn explain_rejects_an_unreadable_pod_as_the_solver_does() {
    let mut p = pod("p", "1", "1Gi");
    spec(&mut p).containers[0].resources = Some(ResourceRequirements {
        requests: Some([("cpu".to_string(), K8sQuantity("lots".into()))].into()),
        ..Default::default()
    });
    assert!(explain::rule_out(&p, &snapshot(vec![], vec![])).is_err());
}

// --- Spread and affinity fields, after Karpenter core's topology_test.go ---

/// Pods placed per value of `key` over the claims (a claim counts once it is pinned to one).
fn pods_per(r: &Results, key: &str) -> Vec<usize> {
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    for c in &r.new_claims {
        let vs = c.requirements.values(key).cloned().unwrap_or_default();
        assert_eq!(vs.len(), 1, "claim pinned to one {key}: {c:?}");
        *per.entry(vs.into_iter().next().unwrap()).or_default() += c.pods.len();
    }
    let mut counts: Vec<usize> = per.into_values().collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    counts
}

fn with_label(mut p: Pod, key: &str, value: &str) -> Pod {
    p.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(key.into(), value.into());
    p
}

fn edit_spread(mut p: Pod, edit: impl Fn(&mut TopologySpreadConstraint)) -> Pod {
    for c in spec(&mut p)
        .topology_spread_constraints
        .iter_mut()
        .flatten()
    {
        edit(c);
    }
    p
}

fn web_spread(name: &str, key: &str, edit: impl Fn(&mut TopologySpreadConstraint)) -> Pod {
    let p = spread(labelled(pod(name, "100m", "100Mi"), "web"), key, 1, true);
    edit_spread(p, edit)
}

#[test]
fn spread_match_label_keys_split_the_group_by_label_value() {
    let keys = |c: &mut TopologySpreadConstraint| c.match_label_keys = Some(vec!["rev".into()]);
    // Two "deployments" (rev a and rev b): one of each per host, so two claims of two pods.
    let pods = ["a", "b"]
        .iter()
        .flat_map(|rev| {
            (0..2).map(move |i| {
                with_label(
                    web_spread(&format!("{rev}{i}"), HOSTNAME_LABEL, keys),
                    "rev",
                    rev,
                )
            })
        })
        .collect();
    let r = one_pool(pods);
    assert!(r.failures.is_empty(), "{r:?}");
    let sizes: Vec<usize> = r.new_claims.iter().map(|c| c.pods.len()).collect();
    assert_eq!(sizes, [2, 2], "{r:#?}");
    // A key the pods do not carry is ignored: one pod per host.
    let pods = (0..4)
        .map(|i| web_spread(&format!("p{i}"), HOSTNAME_LABEL, keys))
        .collect();
    let r = one_pool(pods);
    let sizes: Vec<usize> = r.new_claims.iter().map(|c| c.pods.len()).collect();
    assert_eq!(sizes, [1, 1, 1, 1], "{r:#?}");
}

fn zonal_pool(zones: &[&str]) -> PoolInput {
    let mut np = nodepool("default");
    np.spec.template.spec.requirements = vec![NodeSelectorRequirementWithMinValues::new(
        ZONE_LABEL,
        Operator::In,
        zones,
    )];
    pool(np, standard_types())
}

#[test]
fn spread_min_domains_counts_missing_domains_as_empty() {
    // (zones the pool offers, minDomains, pods, expected pods per zone, failures)
    type Case<'c> = (&'c [&'c str], i32, usize, &'c [usize], usize);
    let cases: [Case; 3] = [
        // Two zones but minDomains 3: the global minimum stays 0, so one pod per zone.
        (&ZONES[..2], 3, 3, &[1, 1], 1),
        (&ZONES, 3, 11, &[4, 4, 3], 0),
        (&ZONES, 2, 11, &[4, 4, 3], 0),
    ];
    for (zones, min_domains, n, want, failures) in cases {
        let pods = (0..n)
            .map(|i| {
                web_spread(&format!("p{i}"), ZONE_LABEL, |c| {
                    c.min_domains = Some(min_domains)
                })
            })
            .collect();
        let r = solve(&snapshot(pods, vec![zonal_pool(zones)]));
        assert_eq!(
            pods_per(&r, ZONE_LABEL),
            want,
            "{zones:?} {min_domains}: {r:#?}"
        );
        assert_eq!(r.failures.len(), failures, "{r:?}");
    }
    // minDomains only binds DoNotSchedule spreads.
    let pods = (0..3)
        .map(|i| {
            let p = spread(
                labelled(pod(&format!("p{i}"), "100m", "100Mi"), "web"),
                ZONE_LABEL,
                1,
                false,
            );
            edit_spread(p, |c| c.min_domains = Some(3))
        })
        .collect();
    let r = solve(&snapshot(pods, vec![zonal_pool(&ZONES[..2])]));
    assert!(r.failures.is_empty(), "{r:?}");
}

const SPREAD_LABEL: &str = "fake-label";

fn labelled_pool(name: &str, value: &str, taint: bool) -> PoolInput {
    let mut input = if taint {
        tainted_pool(name, "NoSchedule")
    } else {
        pool(nodepool(name), standard_types())
    };
    input.nodepool.spec.template.spec.requirements =
        vec![NodeSelectorRequirementWithMinValues::new(
            SPREAD_LABEL,
            Operator::In,
            &[value],
        )];
    input
}

#[test]
fn spread_node_taints_policy_decides_whether_tainted_pools_domains_count() {
    // (policy, pods per domain, failures): "bar" comes only from a pool the pods do not
    // tolerate. Ignored (the default), it holds the minimum at 0 and the second pod has
    // nowhere to go; honoured, only "foo" counts.
    for (policy, want, failures) in [
        (None, &[1][..], 1),
        (Some("Ignore"), &[1][..], 1),
        (Some("Honor"), &[2][..], 0),
    ] {
        let pods = (0..2)
            .map(|i| {
                web_spread(&format!("p{i}"), SPREAD_LABEL, |c| {
                    c.node_taints_policy = policy.map(String::from)
                })
            })
            .collect();
        let pools = vec![
            labelled_pool("plain", "foo", false),
            labelled_pool("tainted", "bar", true),
        ];
        let r = solve(&snapshot(pods, pools));
        assert_eq!(pods_per(&r, SPREAD_LABEL), want, "{policy:?}: {r:#?}");
        assert_eq!(r.failures.len(), failures, "{policy:?}: {r:?}");
    }
}

#[test]
fn spread_node_affinity_policy_decides_whether_unselected_nodes_domains_count() {
    // Two full nodes offer "foo" and "bar" but not the label the pods select; the pool offers
    // "baz". Honoured (the default), the nodes' domains do not count and all five pods go to
    // baz; ignored, foo and bar hold the minimum at 0 and only one pod may go.
    let node = |name: &str, value: &str| ExistingNode {
        name: name.into(),
        labels: [
            (SPREAD_LABEL.to_string(), value.to_string()),
            ("selector".to_string(), "mismatch".to_string()),
        ]
        .into(),
        allocatable: res(&[("cpu", "100m"), ("pods", "110")]),
        ..Default::default()
    };
    for (policy, want, failures) in [
        (None, &[5][..], 0),
        (Some("Honor"), &[5][..], 0),
        (Some("Ignore"), &[1][..], 4),
    ] {
        let mut np = nodepool("default");
        np.spec.template.metadata = Some(TemplateMetadata {
            labels: Some(
                [
                    (SPREAD_LABEL.to_string(), "baz".to_string()),
                    ("selector".to_string(), "value".to_string()),
                ]
                .into(),
            ),
            annotations: None,
        });
        let pods = (0..5)
            .map(|i| {
                let mut p = spread(
                    labelled(pod(&format!("p{i}"), "1", "100Mi"), "web"),
                    SPREAD_LABEL,
                    1,
                    true,
                );
                spec(&mut p).node_selector =
                    Some([("selector".to_string(), "value".to_string())].into());
                edit_spread(p, |c| c.node_affinity_policy = policy.map(String::from))
            })
            .collect();
        let mut s = snapshot(pods, vec![pool(np, standard_types())]);
        s.nodes = vec![node("n1", "foo"), node("n2", "bar")];
        let r = solve(&s);
        assert!(r.placed_on_existing.is_empty(), "{r:?}");
        assert_eq!(pods_per(&r, SPREAD_LABEL), want, "{policy:?}: {r:#?}");
        assert_eq!(r.failures.len(), failures, "{policy:?}: {r:?}");
    }
}

#[test]
fn spread_policy_must_be_honor_or_ignore() {
    let p = web_spread("p", ZONE_LABEL, |c| {
        c.node_taints_policy = Some("Sometimes".into())
    });
    let r = one_pool(vec![p]);
    match &r.failures[0].1 {
        PodError::InvalidPod { details } => assert!(
            details.contains("spec.topologySpreadConstraints[0].nodeTaintsPolicy"),
            "{details}"
        ),
        other => panic!("{other:?}"),
    }
}

/// A pod with required hostname affinity to pods labelled security=s2, in the namespaces
/// `namespace_selector` picks.
fn affine_to_s2(name: &str, namespace_selector: Option<LabelSelector>) -> Pod {
    let mut p = pod(name, "100m", "100Mi");
    spec(&mut p).affinity = Some(Affinity {
        pod_affinity: Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: Some([("security".to_string(), "s2".to_string())].into()),
                    ..Default::default()
                }),
                namespace_selector,
                topology_key: HOSTNAME_LABEL.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });
    p
}

#[test]
fn affinity_namespace_selector_picks_the_namespaces_counted() {
    // The target runs in namespace "other" (bigger, so it is placed first).
    let mut target = with_label(pod("target", "1", "1Gi"), "security", "s2");
    target.metadata.namespace = Some("other".into());
    let team = |t: &str| LabelSelector {
        match_labels: Some([("team".to_string(), t.to_string())].into()),
        ..Default::default()
    };
    // (namespace selector, Namespace labels known, joins the target)
    let cases = [
        (None, false, false),
        (Some(LabelSelector::default()), false, true),
        (Some(team("x")), true, true),
        (Some(team("x")), false, false),
        (Some(team("y")), true, false),
    ];
    for (ns_selector, labelled_ns, joins) in cases {
        let mut s = snapshot(
            vec![
                target.clone(),
                affine_to_s2("follower", ns_selector.clone()),
            ],
            vec![pool(nodepool("default"), standard_types())],
        );
        if labelled_ns {
            s.namespaces = [(
                "other".to_string(),
                [("team".to_string(), "x".to_string())].into(),
            )]
            .into();
        }
        let r = solve(&s);
        let placed = r
            .new_claims
            .iter()
            .find(|c| c.pods.contains(&"other/target".to_string()));
        let together = placed.is_some_and(|c| c.pods.contains(&"default/follower".to_string()));
        assert_eq!(together, joins, "{ns_selector:?} {labelled_ns}: {r:#?}");
        assert_eq!(r.failures.is_empty(), joins, "{r:?}");
    }
}

#[test]
fn affinity_match_and_mismatch_label_keys() {
    // Anti-affinity per rev (matchLabelKeys): one pod of each rev per host.
    let anti = |name: &str, rev: &str, edit: &dyn Fn(&mut PodAffinityTerm)| {
        let mut p = with_label(labelled(pod(name, "100m", "100Mi"), "web"), "rev", rev);
        let mut term = PodAffinityTerm {
            label_selector: selector("web"),
            topology_key: HOSTNAME_LABEL.into(),
            ..Default::default()
        };
        edit(&mut term);
        spec(&mut p).affinity = Some(Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![term]),
                ..Default::default()
            }),
            ..Default::default()
        });
        p
    };
    let by_rev = |t: &mut PodAffinityTerm| t.match_label_keys = Some(vec!["rev".into()]);
    let pods = vec![
        anti("a0", "a", &by_rev),
        anti("a1", "a", &by_rev),
        anti("b0", "b", &by_rev),
        anti("b1", "b", &by_rev),
    ];
    let r = one_pool(pods);
    let sizes: Vec<usize> = r.new_claims.iter().map(|c| c.pods.len()).collect();
    assert_eq!(sizes, [2, 2], "{r:#?}");
    for c in &r.new_claims {
        assert!(
            c.pods
                .iter()
                .any(|p| p.ends_with("/a0") || p.ends_with("/a1")),
            "{c:?}"
        );
    }
    // Anti-affinity against other revs (mismatchLabelKeys): each rev keeps a host to itself.
    let other_revs = |t: &mut PodAffinityTerm| t.mismatch_label_keys = Some(vec!["rev".into()]);
    let pods = vec![
        anti("a0", "a", &other_revs),
        anti("a1", "a", &other_revs),
        anti("b0", "b", &other_revs),
        anti("b1", "b", &other_revs),
    ];
    let r = one_pool(pods);
    assert_eq!(r.new_claims.len(), 2, "{r:#?}");
    for c in &r.new_claims {
        let revs: std::collections::BTreeSet<char> =
            c.pods.iter().filter_map(|p| p.chars().nth(8)).collect();
        assert_eq!(revs.len(), 1, "one rev per host: {c:?}");
    }
}

#[test]
fn spread_node_taints_policy_decides_whether_pods_on_tainted_nodes_count() {
    // Two matching pods run on a tainted node in "foo"; the pool offers foo and bar. Ignored,
    // they count (foo=2), so both new pods go to bar; honoured, the node is outside the
    // spread's filter, its pods do not count, and the two pods go one per domain.
    let node = ExistingNode {
        name: "n1".into(),
        labels: [(SPREAD_LABEL.to_string(), "foo".to_string())].into(),
        taints: vec![Taint {
            key: "dedicated".into(),
            value: Some("other".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        }],
        allocatable: res(&[("cpu", "0"), ("pods", "0")]),
        ..Default::default()
    };
    let bound: Vec<Pod> = (0..2)
        .map(|i| {
            let mut p = labelled(pod(&format!("old{i}"), "100m", "100Mi"), "web");
            spec(&mut p).node_name = Some("n1".into());
            p
        })
        .collect();
    for (policy, want, failures) in [(None, &[2][..], 0), (Some("Honor"), &[1, 1][..], 0)] {
        let pods = (0..2)
            .map(|i| {
                web_spread(&format!("p{i}"), SPREAD_LABEL, |c| {
                    c.node_taints_policy = policy.map(String::from)
                })
            })
            .collect();
        let mut np = nodepool("default");
        np.spec.template.spec.requirements = vec![NodeSelectorRequirementWithMinValues::new(
            SPREAD_LABEL,
            Operator::In,
            &["foo", "bar"],
        )];
        let mut s = snapshot(pods, vec![pool(np, standard_types())]);
        s.nodes = vec![node.clone()];
        s.bound_pods = bound.iter().cloned().map(Arc::new).collect();
        let r = solve(&s);
        assert_eq!(pods_per(&r, SPREAD_LABEL), want, "{policy:?}: {r:#?}");
        assert_eq!(r.failures.len(), failures, "{policy:?}: {r:?}");
    }
}

/// A claim of `r` in flight, as the provisioner's snapshot shows it: its single-valued
/// requirements as labels, the allocatable of the cheapest type it allows (the offering launch
/// chooses), and a name of the server's choosing.
fn in_flight_claim(claim: &NewClaim, types: &[InstanceType], name: String) -> ExistingNode {
    let labels = claim
        .requirements
        .keys()
        .filter_map(|k| {
            let values = claim.requirements.values(k)?;
            let only = values.iter().next().filter(|_| values.len() == 1)?;
            Some((k.to_string(), only.clone()))
        })
        .collect();
    let chosen = types
        .iter()
        .find(|t| Some(&t.name) == claim.instance_types.first())
        .map(InstanceType::allocatable)
        .unwrap_or_default();
    ExistingNode {
        name,
        labels,
        allocatable: chosen,
        in_flight: true,
        nodepool: Some(claim.nodepool.clone()),
        ..Default::default()
    }
}

#[test]
fn solving_the_same_pods_again_before_their_claims_launch_makes_no_claim() {
    let shapes = [
        ("250m", "512Mi"),
        ("500m", "1Gi"),
        ("1", "2Gi"),
        ("1500m", "3Gi"),
        ("100m", "256Mi"),
        ("700m", "3Gi"),
        ("1200m", "1Gi"),
    ];
    let picks = [2, 0, 3, 6, 3, 3, 6, 6, 0, 5, 6, 5, 1, 4, 5, 1, 5];
    let pods: Vec<Pod> = picks
        .iter()
        .enumerate()
        .map(|(i, &j)| pod(&format!("p{i}"), shapes[j].0, shapes[j].1))
        .collect();
    let types = standard_types();
    let s = snapshot(pods, vec![pool(nodepool("default"), types.clone())]);
    let first = solve(&s);
    assert_eq!(first.new_claims.len(), 2, "{:?}", first.new_claims);
    // The claims in flight, named so that by name they come in the other order than the solve
    // opened them (names are the server's, not the solver's).
    let n = first.new_claims.len();
    let name = |i: usize| format!("claim-{}", n - i);
    let mut again = s.clone();
    again.nodes = first
        .new_claims
        .iter()
        .enumerate()
        .map(|(i, c)| in_flight_claim(c, &types, name(i)))
        .collect();
    // Without the plans, first fit over the same pods leaves one over: a claim too many.
    assert_eq!(solve(&again).new_claims.len(), 1);

    let planned: BTreeMap<String, String> = first
        .new_claims
        .iter()
        .enumerate()
        .flat_map(|(i, c)| c.pods.iter().map(move |p| (p.clone(), name(i))))
        .collect();
    again.nominated = planned.clone().into_iter().collect();
    let r = solve(&again);
    assert!(r.new_claims.is_empty(), "{:?}", r.new_claims);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    let placed: BTreeMap<String, String> = r.placed_on_existing.into_iter().collect();
    assert_eq!(
        placed, planned,
        "every pod back on the claim it was planned onto"
    );

    // Even a claim counted at its requests only (zero slack) takes its own pods back.
    for (node, c) in again.nodes.iter_mut().zip(&first.new_claims) {
        node.allocatable = c.requests.clone();
    }
    let r = solve(&again);
    assert!(r.new_claims.is_empty(), "{:?}", r.new_claims);
    // A new pod goes where room is left, or to a claim of its own; the planned pods stay put.
    again.pods.push(pod("late", "1", "1Gi"));
    let r = solve(&again);
    let placed: BTreeMap<String, String> = r.placed_on_existing.iter().cloned().collect();
    assert!(planned.iter().all(|(p, n)| placed.get(p) == Some(n)));
    assert_eq!(claim_of(&r, "late").pods, ["default/late"]);
}
