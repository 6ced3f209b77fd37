//! Upstream instance_selection_test.go: the launched node is one of the cheapest types that
//! satisfy the pool and the pod, every candidate written into the claim satisfies them too, and
//! minValues keeps enough candidates.

use karpenter_capi::api::nodeclaim::Operator;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::{
    ARCH_LABEL, CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, OS_LABEL, ZONE_LABEL,
};
use karpenter_capi::scheduling::InstanceType;

use crate::fixture::*;

type Reqs<'a> = &'a [(&'a str, &'a [&'a str])];

/// Upstream's selection pool: spot or on-demand, either arch.
fn selection_pool() -> NodePool {
    nodepool("default")
        .req(CAPACITY_TYPE_LABEL, Operator::In, &[SPOT, ON_DEMAND])
        .req(ARCH_LABEL, Operator::In, &["arm64", "amd64"])
}

fn offering_labels(it: &InstanceType) -> Vec<&std::collections::BTreeMap<String, String>> {
    it.offerings.iter().map(|o| &o.labels).collect()
}

/// Runs one "cheapest instances" case on the assorted catalog (minus arm64 types when
/// `drop_arm`): the node's price is the catalog's minimum and every candidate type carries the
/// required labels.
fn cheapest(pool: Reqs, pod_reqs: Reqs) {
    let types = assorted_types();
    let min_price = types
        .iter()
        .flat_map(|t| t.offerings.iter().map(|o| o.price))
        .fold(f64::INFINITY, f64::min);
    let mut np = selection_pool();
    for (k, v) in pool {
        np = np.req(k, Operator::In, v);
    }
    let p = pod("p").required(pod_reqs.iter().map(|(k, v)| node_req(k, "In", v)).collect());
    let env = Env::with_types(np, types.clone());
    let out = env.provision(&[p]);
    let n = out.scheduled("p");
    let launched = types.iter().find(|t| t.name == n.instance_type).unwrap();
    let price = launched
        .offerings
        .iter()
        .find(|o| o.labels.get(ZONE_LABEL) == n.labels.get(ZONE_LABEL))
        .unwrap()
        .price;
    assert_eq!(price, min_price, "{}", n.instance_type);
    for name in &n.claim.instance_types {
        let t = types.iter().find(|t| &t.name == name).unwrap();
        for (k, v) in pool.iter().chain(pod_reqs) {
            assert!(
                offering_labels(t)
                    .iter()
                    .all(|l| l.get(*k).is_some_and(|x| v.contains(&x.as_str()))),
                "{name} lacks {k} in {v:?}"
            );
        }
    }
}

#[test]
fn cheapest_unconstrained() {
    cheapest(&[], &[]);
}
#[test]
fn cheapest_pod_arch_amd64() {
    cheapest(&[], &[(ARCH_LABEL, &["amd64"])]);
}
#[test]
fn cheapest_pod_arch_arm64() {
    cheapest(&[], &[(ARCH_LABEL, &["arm64"])]);
}
#[test]
fn cheapest_pool_arch_amd64() {
    cheapest(&[(ARCH_LABEL, &["amd64"])], &[]);
}
#[test]
fn cheapest_pool_arch_arm64() {
    cheapest(&[(ARCH_LABEL, &["arm64"])], &[]);
}
#[test]
fn cheapest_pool_os_windows() {
    cheapest(&[(OS_LABEL, &["windows"])], &[]);
}
#[test]
fn cheapest_pod_os_windows() {
    cheapest(&[], &[(OS_LABEL, &["windows"])]);
}
#[test]
fn cheapest_pod_os_linux() {
    cheapest(&[], &[(OS_LABEL, &["linux"])]);
}
#[test]
fn cheapest_pool_zone_2() {
    cheapest(&[(ZONE_LABEL, &["test-zone-2"])], &[]);
}
#[test]
fn cheapest_pod_zone_2() {
    cheapest(&[], &[(ZONE_LABEL, &["test-zone-2"])]);
}
#[test]
fn cheapest_pool_spot() {
    cheapest(&[(CAPACITY_TYPE_LABEL, &[SPOT])], &[]);
}
#[test]
fn cheapest_pod_spot() {
    cheapest(&[], &[(CAPACITY_TYPE_LABEL, &[SPOT])]);
}
#[test]
fn cheapest_pool_on_demand_zone_1() {
    cheapest(
        &[
            (CAPACITY_TYPE_LABEL, &[ON_DEMAND]),
            (ZONE_LABEL, &["test-zone-1"]),
        ],
        &[],
    );
}
#[test]
fn cheapest_pod_spot_zone_1() {
    cheapest(
        &[],
        &[
            (CAPACITY_TYPE_LABEL, &[SPOT]),
            (ZONE_LABEL, &["test-zone-1"]),
        ],
    );
}
#[test]
fn cheapest_pool_spot_pod_zone_2() {
    cheapest(
        &[(CAPACITY_TYPE_LABEL, &[SPOT])],
        &[(ZONE_LABEL, &["test-zone-2"])],
    );
}
#[test]
fn cheapest_pool_on_demand_zone_1_arm64_windows() {
    cheapest(
        &[
            (ARCH_LABEL, &["arm64"]),
            (OS_LABEL, &["windows"]),
            (CAPACITY_TYPE_LABEL, &[ON_DEMAND]),
            (ZONE_LABEL, &["test-zone-1"]),
        ],
        &[],
    );
}
#[test]
fn cheapest_pool_amd64_linux_pod_spot_zone_2() {
    cheapest(
        &[(ARCH_LABEL, &["amd64"]), (OS_LABEL, &["linux"])],
        &[
            (CAPACITY_TYPE_LABEL, &[SPOT]),
            (ZONE_LABEL, &["test-zone-2"]),
        ],
    );
}
#[test]
fn cheapest_pod_spot_zone_2_amd64_linux() {
    cheapest(
        &[],
        &[
            (ARCH_LABEL, &["amd64"]),
            (OS_LABEL, &["linux"]),
            (CAPACITY_TYPE_LABEL, &[SPOT]),
            (ZONE_LABEL, &["test-zone-2"]),
        ],
    );
}

fn without_arm() -> Vec<InstanceType> {
    assorted_types()
        .into_iter()
        .filter(|t| t.offerings.iter().all(|o| o.labels[ARCH_LABEL] != "arm64"))
        .collect()
}

fn no_match(np: NodePool, pod_reqs: Reqs) {
    let p = pod("p").required(pod_reqs.iter().map(|(k, v)| node_req(k, "In", v)).collect());
    let out = Env::with_types(np, without_arm()).provision(&[p]);
    out.not_scheduled("p");
    assert!(out.nodes.is_empty());
}

#[test]
fn no_type_for_pod_arch_arm() {
    no_match(selection_pool(), &[(ARCH_LABEL, &["arm64"])]);
}
#[test]
fn no_type_for_pod_arch_arm_in_zone_2() {
    no_match(
        selection_pool(),
        &[(ARCH_LABEL, &["arm64"]), (ZONE_LABEL, &["test-zone-2"])],
    );
}
#[test]
fn no_type_for_pool_arch_arm_and_pod_zone_2() {
    no_match(
        selection_pool().req(ARCH_LABEL, Operator::In, &["arm64"]),
        &[(ZONE_LABEL, &["test-zone-2"])],
    );
}

#[test]
fn the_chosen_type_holds_every_pod_and_types_stay_unchanged() {
    let types = assorted_types();
    let before = types.clone();
    let ps = pods("p", 3, |p| p.requests(&[("cpu", "1"), ("memory", "1Gi")]));
    let e = Env::with_types(selection_pool(), types);
    let out = e.provision(&ps);
    let n = out.scheduled("p-0");
    assert!((0..3).all(|i| out.scheduled(&format!("p-{i}")).name == n.name));
    let it = before.iter().find(|t| t.name == n.instance_type).unwrap();
    assert!(it.capacity.get("cpu") > q("3"));
    assert!(it.capacity.get("memory") > q("3Gi"));
    assert_eq!(
        e.pools[0].instance_types, before,
        "the solve must not modify types"
    );
}

#[test]
fn cheaper_on_demand_wins_whatever_the_spot_order() {
    let t = |name: &str, od: f64, spot: f64| {
        itype(name)
            .os(&["linux"])
            .resources(&[("cpu", "1"), ("memory", "1Gi")])
            .priced(&[
                (ON_DEMAND, "test-zone-1a", od),
                (SPOT, "test-zone-1a", spot),
            ])
            .build()
    };
    let types = vec![t("test-instance1", 1.0, 0.2), t("test-instance2", 1.3, 0.1)];
    let np = selection_pool().req(CAPACITY_TYPE_LABEL, Operator::In, &[ON_DEMAND]);
    let out = Env::with_types(np, types).provision(&[pod("p")]);
    assert_eq!(
        out.scheduled("p").label(INSTANCE_TYPE_LABEL),
        Some("test-instance1")
    );
}

// --- MinValues ---

fn min_values_types() -> Vec<InstanceType> {
    vec![
        itype("instance-type-1")
            .arch("arm64")
            .os(&["linux"])
            .resources(&[("cpu", "1"), ("memory", "1Gi")])
            .priced(&[(SPOT, "test-zone-1-spot", 0.52)])
            .build(),
        itype("instance-type-2")
            .arch("arm64")
            .os(&["linux"])
            .resources(&[("cpu", "4"), ("memory", "4Gi")])
            .priced(&[(SPOT, "test-zone-1-spot", 1.0)])
            .build(),
    ]
}

fn two_small_pods() -> Vec<k8s_openapi::api::core::v1::Pod> {
    pods("p", 2, |p| {
        p.requests(&[("cpu", "0.9"), ("memory", "0.9Gi")])
    })
}

#[test]
fn min_values_on_instance_types_keeps_two_candidates_per_claim() {
    let np = nodepool("default").req_min(
        INSTANCE_TYPE_LABEL,
        Operator::In,
        &["instance-type-1", "instance-type-2"],
        2,
    );
    let out = Env::with_types(np, min_values_types()).provision(&two_small_pods());
    let (a, b) = (out.scheduled("p-0"), out.scheduled("p-1"));
    assert_ne!(a.name, b.name);
    assert!(a.claim.instance_types.len() >= 2);
}

#[test]
fn min_values_above_the_catalog_schedules_nothing() {
    let types: Vec<InstanceType> = default_types().into_iter().chain(sized_types(4)).collect();
    assert_eq!(types.len(), 10);
    let np = nodepool("default").req_min(INSTANCE_TYPE_LABEL, Operator::Exists, &[], 11);
    Env::with_types(np, types)
        .provision(&[pod("p")])
        .not_scheduled("p");
}

#[test]
fn min_values_on_several_keys_are_all_kept() {
    let types = vec![
        itype("instance-type-1")
            .os(&["linux"])
            .resources(&[("cpu", "1"), ("memory", "1Gi")])
            .priced(&[(SPOT, "test-zone-1-spot", 0.52)])
            .build(),
        itype("instance-type-2")
            .arch("arm64")
            .os(&["linux"])
            .resources(&[("cpu", "4"), ("memory", "4Gi")])
            .priced(&[(SPOT, "test-zone-1-spot", 1.0)])
            .build(),
    ];
    let np = nodepool("default")
        .req_min(ARCH_LABEL, Operator::Exists, &[], 2)
        .req_min(
            INSTANCE_TYPE_LABEL,
            Operator::In,
            &["instance-type-1", "instance-type-2"],
            1,
        );
    let out = Env::with_types(np, types).provision(&two_small_pods());
    let (a, b) = (out.scheduled("p-0"), out.scheduled("p-1"));
    assert_ne!(a.name, b.name);
    assert!(a.claim.instance_types.len() >= 2);
}

const GENERATION: &str = "karpenter/numerical-value";

/// (name, cpu, memory, price, generation)
fn generations(spec: &[(&str, &str, &str, f64, &str)]) -> Vec<InstanceType> {
    spec.iter()
        .map(|(name, cpu, mem, price, generation)| {
            itype(name)
                .arch("arm64")
                .os(&["linux"])
                .resources(&[("cpu", cpu), ("memory", mem)])
                .priced(&[(SPOT, "test-zone-1-spot", *price)])
                .label(GENERATION, generation)
                .build()
        })
        .collect()
}

fn small_pods(
    edit: impl Fn(k8s_openapi::api::core::v1::Pod) -> k8s_openapi::api::core::v1::Pod,
) -> Vec<k8s_openapi::api::core::v1::Pod> {
    pods("p", 2, |p| {
        edit(p.requests(&[("cpu", "0.9"), ("memory", "0.9Gi")]))
    })
}

fn two_nodes_two_candidates(out: &Outcome) {
    let (a, b) = (out.scheduled("p-0"), out.scheduled("p-1"));
    assert_ne!(a.name, b.name);
    assert!(a.claim.instance_types.len() >= 2);
}

#[test]
fn min_values_on_a_gt_requirement() {
    let types = generations(&[
        ("instance-type-1", "1", "1Gi", 0.52, "2"),
        ("instance-type-2", "1", "1Gi", 1.0, "3"),
        ("instance-type-3", "4", "4Gi", 1.2, "4"),
    ]);
    let np = nodepool("default").req_min(GENERATION, Operator::Gt, &["2"], 2);
    two_nodes_two_candidates(&Env::with_types(np, types).provision(&small_pods(|p| p)));
}

#[test]
fn min_values_unmet_after_a_pod_gt_requirement_schedules_nothing() {
    let types = generations(&[
        ("instance-type-1", "1", "1Gi", 0.52, "2"),
        ("instance-type-2", "4", "4Gi", 1.0, "3"),
    ]);
    let np = nodepool("default").req_min(GENERATION, Operator::Exists, &[], 2);
    let ps = small_pods(|p| p.required(vec![node_req(GENERATION, "Gt", &["2"])]));
    let out = Env::with_types(np, types).provision(&ps);
    out.not_scheduled("p-0");
    out.not_scheduled("p-1");
}

#[test]
fn min_values_on_an_lt_requirement() {
    let types = generations(&[
        ("instance-type-1", "1", "1Gi", 0.52, "2"),
        ("instance-type-2", "2", "2Gi", 1.0, "3"),
        ("instance-type-3", "4", "4Gi", 1.2, "4"),
    ]);
    let np = nodepool("default").req_min(GENERATION, Operator::Lt, &["4"], 2);
    two_nodes_two_candidates(&Env::with_types(np, types).provision(&small_pods(|p| p)));
}

#[test]
fn min_values_unmet_on_an_lt_requirement_schedules_nothing() {
    let types = generations(&[
        ("instance-type-1", "2", "2Gi", 0.52, "2"),
        ("instance-type-2", "4", "4Gi", 1.2, "4"),
    ]);
    let np = nodepool("default").req_min(GENERATION, Operator::Lt, &["4"], 2);
    let out = Env::with_types(np, types).provision(&small_pods(|p| p));
    out.not_scheduled("p-0");
    out.not_scheduled("p-1");
}

#[test]
fn min_values_of_in_and_not_in_on_one_key_take_the_larger() {
    let types = generations(&[
        ("instance-type-1", "1", "1Gi", 0.52, "1"),
        ("instance-type-2", "2", "2Gi", 1.0, "1"),
        ("instance-type-3", "4", "4Gi", 1.2, "1"),
    ]);
    let np = two_on_one_key(
        INSTANCE_TYPE_LABEL,
        (
            Operator::In,
            &["instance-type-1", "instance-type-2", "instance-type-3"],
            1,
        ),
        (Operator::NotIn, &["instance-type-3"], 2),
    );
    two_nodes_two_candidates(&Env::with_types(np, types).provision(&small_pods(|p| p)));
}

/// A NodePool with two requirements on one key, each with its own minValues.
fn two_on_one_key(key: &str, a: (Operator, &[&str], i64), b: (Operator, &[&str], i64)) -> NodePool {
    use karpenter_capi::api::nodeclaim::NodeSelectorRequirementWithMinValues as R;
    let mut np = nodepool("default");
    for (op, values, min) in [a, b] {
        let mut r = R::new(key, op, values);
        r.min_values = Some(min);
        np.spec.template.spec.requirements.push(r);
    }
    np
}

#[test]
fn min_values_of_gt_and_lt_on_one_key_take_the_larger() {
    let types = generations(&[
        ("instance-type-1", "1", "1Gi", 0.52, "2"),
        ("instance-type-2", "1", "1Gi", 1.0, "3"),
        ("instance-type-3", "4", "4Gi", 1.2, "4"),
        ("instance-type-4", "4", "4Gi", 1.2, "5"),
    ]);
    let np = two_on_one_key(
        GENERATION,
        (Operator::Gt, &["2"], 1),
        (Operator::Lt, &["5"], 2),
    );
    two_nodes_two_candidates(&Env::with_types(np, types).provision(&small_pods(|p| p)));
}

#[test]
fn min_values_of_exists_and_in_on_one_key_take_the_larger() {
    let types = generations(&[
        ("instance-type-1", "1", "1Gi", 0.52, "1"),
        ("instance-type-2", "4", "4Gi", 1.0, "1"),
    ]);
    let np = two_on_one_key(
        INSTANCE_TYPE_LABEL,
        (Operator::Exists, &[], 1),
        (Operator::In, &["instance-type-1", "instance-type-2"], 2),
    );
    two_nodes_two_candidates(&Env::with_types(np, types).provision(&small_pods(|p| p)));
}

#[test]
fn min_values_are_checked_after_truncating_to_the_instance_type_cap() {
    // Upstream lowers its cap to 1 for this case; ours is the constant 600, so the catalog has
    // more than 600 fitting types and minValues asks for one more than the cap.
    let types = assorted_types();
    assert!(types.len() > karpenter_capi::scheduling::MAX_INSTANCE_TYPES);
    let min = karpenter_capi::scheduling::MAX_INSTANCE_TYPES as i64 + 1;
    let np = nodepool("default").req_min(INSTANCE_TYPE_LABEL, Operator::Exists, &[], min);
    let out = Env::with_types(np, types).provision(&small_pods(|p| p));
    out.not_scheduled("p-0");
    out.not_scheduled("p-1");
}
