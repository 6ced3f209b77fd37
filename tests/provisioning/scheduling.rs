//! A 500-pod mixed scenario through the public scheduling API: every pod placed, no NodePool
//! limit exceeded, constraints visible in the claims, and packing above a floor.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use karpenter_capi::api::nodeclaim::{NodeSelectorRequirementWithMinValues, Operator};
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::resources::{Quantity, Resources};
use karpenter_capi::api::validate_nodeclaim;
use karpenter_capi::api::wellknown::{CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, ZONE_LABEL};
use karpenter_capi::scheduling::{
    ExistingNode, InstanceType, NewClaim, PoolInput, Snapshot, nodeclaim_for, solve,
};
use karpenter_capi::testing;

/// `c<cpu>`: 4 GiB a CPU, 100m kept back, on-demand in every zone and spot in two at 40 %.
fn instance_type(cpu: i64) -> InstanceType {
    testing::instance_type(&format!("c{cpu}"), cpu, 4 * cpu)
        .offerings(&[
            ("zone-a", "on-demand"),
            ("zone-b", "on-demand"),
            ("zone-c", "on-demand"),
            ("zone-a", "spot"),
            ("zone-b", "spot"),
        ])
        .price(cpu as f64 * 0.5)
        .spot_factor(0.4)
        .overhead(Resources::new().with("cpu", Quantity::from_millis(100)))
        .namespace("capi")
        .build()
}

fn nodepool(
    name: &str,
    weight: Option<i32>,
    limits: &[(&str, &str)],
    on_demand_only: bool,
) -> NodePool {
    let mut np = testing::nodepool(name);
    if on_demand_only {
        np.spec.template.spec.requirements = vec![NodeSelectorRequirementWithMinValues::new(
            CAPACITY_TYPE_LABEL,
            Operator::In,
            &["on-demand"],
        )];
    }
    np.spec.limits = (!limits.is_empty()).then(|| {
        limits
            .iter()
            .map(|(k, v)| (k.to_string(), K8sQuantity(v.to_string())))
            .collect()
    });
    np.spec.weight = weight;
    np
}

fn mixed_pods(n: usize) -> Vec<Pod> {
    let mut rng = SmallRng::seed_from_u64(17);
    let classes = [
        "plain",
        "zonal-spread",
        "host-spread",
        "host-anti",
        "pinned",
    ];
    (0..n)
        .map(|i| {
            let class = classes[i % classes.len()];
            let cpu = ["100m", "250m", "500m", "1", "1500m"][rng.random_range(0..5)];
            let memory = ["128Mi", "512Mi", "1Gi", "2Gi"][rng.random_range(0..4)];
            let mut pod = testing::pod(&format!("pod-{i:03}"))
                .namespace("shop")
                .label("app", class)
                .requests(cpu, memory)
                .build();
            let spec = pod.spec.get_or_insert_with(Default::default);
            match class {
                "zonal-spread" => {
                    spec.topology_spread_constraints =
                        Some(vec![testing::spread(ZONE_LABEL, class)])
                }
                "host-spread" => {
                    spec.topology_spread_constraints =
                        Some(vec![testing::spread(HOSTNAME_LABEL, class)])
                }
                "host-anti" => spec.affinity = Some(testing::anti_affinity(HOSTNAME_LABEL, class)),
                "pinned" => {
                    spec.node_selector = Some(BTreeMap::from([(
                        ZONE_LABEL.to_string(),
                        "zone-c".to_string(),
                    )]))
                }
                _ => {}
            }
            pod
        })
        .collect()
}

fn scenario() -> Snapshot {
    let types: Vec<InstanceType> = [2, 4, 8, 16, 32].into_iter().map(instance_type).collect();
    let existing = ExistingNode {
        name: "old-1".into(),
        labels: BTreeMap::from([(ZONE_LABEL.to_string(), "zone-a".to_string())]),
        allocatable: Resources::new()
            .with("cpu", Quantity::from_units(4))
            .with("memory", Quantity::from_bytes(16 << 30))
            .with("pods", Quantity::from_units(110)),
        requested: Resources::new().with("cpu", Quantity::from_units(1)),
        daemon_requested: Default::default(),
        in_flight: false,
        nodepool: Some("general".into()),
        taints: vec![],
    };
    Snapshot {
        pods: mixed_pods(500),
        nodes: vec![existing],
        nodepools: vec![
            PoolInput {
                nodepool: nodepool("general", None, &[], false),
                instance_types: types.clone(),
                usage: Resources::new(),
            },
            PoolInput {
                nodepool: nodepool(
                    "reserved",
                    Some(10),
                    &[("cpu", "64"), ("nodes", "20")],
                    true,
                ),
                instance_types: types,
                usage: Resources::new()
                    .with("cpu", Quantity::from_units(8))
                    .with("nodes", Quantity::from_units(1)),
            },
        ],
        ..Default::default()
    }
}

fn cpu_millis(r: &Resources) -> i64 {
    r.get("cpu").as_millis()
}

fn cheapest<'a>(claim: &NewClaim, snap: &'a Snapshot) -> &'a InstanceType {
    let pool = snap
        .nodepools
        .iter()
        .find(|p| p.nodepool.metadata.name.as_deref() == Some(claim.nodepool.as_str()))
        .unwrap();
    pool.instance_types
        .iter()
        .find(|t| t.name == claim.instance_types[0])
        .unwrap()
}

#[test]
fn five_hundred_mixed_pods() {
    let snap = scenario();
    let results = solve(&snap);
    assert!(results.failures.is_empty(), "{:?}", results.failures);

    // Every pod placed exactly once.
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for (pod, node) in &results.placed_on_existing {
        assert_eq!(node, "old-1");
        assert!(seen.insert(pod.clone()));
    }
    for c in &results.new_claims {
        for p in &c.pods {
            assert!(seen.insert(p.clone()), "{p} placed twice");
        }
    }
    assert_eq!(seen.len(), 500);
    // The existing node was used first (3 cpu free).
    assert!(!results.placed_on_existing.is_empty());

    // The heavier pool was used until its limits, which hold (the pool's charge per claim is
    // its cheapest type's capacity).
    let reserved: Vec<&NewClaim> = results
        .new_claims
        .iter()
        .filter(|c| c.nodepool == "reserved")
        .collect();
    assert!(!reserved.is_empty());
    let reserved_cpu: i64 = reserved
        .iter()
        .map(|c| cpu_millis(&cheapest(c, &snap).capacity))
        .sum();
    assert!(
        reserved_cpu + 8_000 <= 64_000,
        "cpu limit exceeded: {reserved_cpu}m"
    );
    assert!(reserved.len() < 20, "nodes limit exceeded");
    assert!(
        reserved_cpu + 8_000 > 48_000,
        "the limit, not preference, stopped the pool"
    );

    let key_class: HashMap<String, String> = snap
        .pods
        .iter()
        .map(|p| {
            (
                format!("shop/{}", p.metadata.name.as_deref().unwrap()),
                p.metadata.labels.as_ref().unwrap()["app"].clone(),
            )
        })
        .collect();
    let mut zonal: BTreeMap<String, usize> = BTreeMap::new();
    for c in &results.new_claims {
        let classes: Vec<&str> = c.pods.iter().map(|p| key_class[p].as_str()).collect();
        let count = |class: &str| classes.iter().filter(|c| **c == class).count();
        assert!(count("host-anti") <= 1, "anti-affinity broken: {c:?}");
        assert!(count("host-spread") <= 1, "hostname spread broken: {c:?}");
        let zones = c.requirements.values(ZONE_LABEL);
        if count("pinned") > 0 {
            assert_eq!(zones.unwrap().iter().collect::<Vec<_>>(), ["zone-c"]);
        }
        if count("zonal-spread") > 0 {
            let zones = zones.expect("zonal spread pins a zone");
            assert_eq!(zones.len(), 1);
            *zonal
                .entry(zones.iter().next().unwrap().clone())
                .or_default() += count("zonal-spread");
        }
        if c.nodepool == "reserved" {
            assert_eq!(
                c.requirements
                    .values(CAPACITY_TYPE_LABEL)
                    .unwrap()
                    .iter()
                    .collect::<Vec<_>>(),
                ["on-demand"]
            );
        }
        // The requests fit the cheapest type listed.
        let t = cheapest(c, &snap);
        let alloc = t.capacity.sub(&t.overhead);
        assert!(c.requests.fits(&alloc), "{c:?} does not fit {}", t.name);
        // And the claim is one the API accepts.
        let pool = &snap
            .nodepools
            .iter()
            .find(|p| p.nodepool.metadata.name.as_deref() == Some(c.nodepool.as_str()))
            .unwrap()
            .nodepool;
        validate_nodeclaim(&nodeclaim_for(c, pool)).unwrap();
    }
    let counts: Vec<usize> = zonal.values().copied().collect();
    assert_eq!(counts.len(), 3, "{zonal:?}");
    assert!(
        counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
        "{zonal:?}"
    );

    // Packing: 100 anti-affinity pods force at least 100 nodes; the other 400 pods should ride
    // along on them rather than open more, and fill well over half of the cheapest types'
    // allocatable cpu (this scenario measures about 69%).
    let requested: i64 = results
        .new_claims
        .iter()
        .map(|c| cpu_millis(&c.requests))
        .sum();
    let allocatable: i64 = results
        .new_claims
        .iter()
        .map(|c| {
            let t = cheapest(c, &snap);
            cpu_millis(&t.capacity.sub(&t.overhead))
        })
        .sum();
    let utilisation = requested as f64 / allocatable as f64;
    assert!(results.new_claims.len() >= 100);
    assert!(
        results.new_claims.len() <= 120,
        "{} claims",
        results.new_claims.len()
    );
    assert!(utilisation > 0.6, "utilisation {utilisation:.2}");
}
