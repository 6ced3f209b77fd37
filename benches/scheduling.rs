//! Scheduling benchmark in the shape of Karpenter's own: 400 instance types (type i has i+1
//! CPUs, 2(i+1) GiB and 10(i+1) pods; on-demand in three zones and spot in two; price 0.1 per
//! CPU plus 0.1 per GiB) and pod sets of 1,000, 5,000 and 20,000 in five equal classes (plain,
//! zonal topology spread, hostname topology spread, zonal self-affinity, hostname
//! anti-affinity), requests drawn with a fixed seed. Reports pods per second.
//!
//! `BENCH_PODS=1000,5000` limits the sizes (the default runs all three).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{
    Affinity, Container, Pod, PodAffinity, PodAffinityTerm, PodAntiAffinity, PodSpec,
    ResourceRequirements, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ObjectMeta;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use karpenter_capi::api::nodeclaim::NodeClassReference;
use karpenter_capi::api::nodepool::{
    NodeClaimTemplate, NodeClaimTemplateSpec, NodePool, NodePoolSpec,
};
use karpenter_capi::api::requirements::{Requirement, Requirements};
use karpenter_capi::api::resources::{Quantity, Resources};
use karpenter_capi::api::wellknown::{
    CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, INSTANCE_TYPE_LABEL, ZONE_LABEL,
};
use karpenter_capi::scheduling::{InstanceType, Offering, PoolInput, Snapshot, solve};

const CPUS: [&str; 5] = ["100m", "250m", "500m", "1", "1500m"];
const MEMORY: [&str; 6] = ["100Mi", "256Mi", "512Mi", "1Gi", "2Gi", "4Gi"];

fn instance_types() -> Vec<InstanceType> {
    let offerings = [
        ("zone-a", "on-demand"),
        ("zone-b", "on-demand"),
        ("zone-c", "on-demand"),
        ("zone-a", "spot"),
        ("zone-b", "spot"),
    ];
    (0..400i64)
        .map(|i| {
            let name = format!("type-{i:03}");
            let (cpu, gib, pods) = (i + 1, 2 * (i + 1), 10 * (i + 1));
            let price = 0.1 * cpu as f64 + 0.1 * gib as f64;
            let mut requirements = Requirements::new();
            requirements.add(Requirement::is_in(INSTANCE_TYPE_LABEL, &[name.as_str()]));
            requirements.add(Requirement::is_in(
                ZONE_LABEL,
                &["zone-a", "zone-b", "zone-c"],
            ));
            requirements.add(Requirement::is_in(
                CAPACITY_TYPE_LABEL,
                &["on-demand", "spot"],
            ));
            InstanceType {
                requirements,
                capacity: Resources::new()
                    .with("cpu", Quantity::from_units(cpu))
                    .with("memory", Quantity::from_bytes(gib << 30))
                    .with("pods", Quantity::from_units(pods)),
                overhead: Resources::new(),
                offerings: offerings
                    .iter()
                    .map(|(zone, ct)| Offering {
                        machine_deployment: format!("default/{name}-{zone}-{ct}"),
                        zone: Some(zone.to_string()),
                        capacity_type: ct.to_string(),
                        price,
                        available: true,
                        labels: BTreeMap::from([
                            (ZONE_LABEL.to_string(), zone.to_string()),
                            (CAPACITY_TYPE_LABEL.to_string(), ct.to_string()),
                            (INSTANCE_TYPE_LABEL.to_string(), name.clone()),
                        ]),
                        taints: vec![],
                        replicas: 0,
                        max_size: None,
                    })
                    .collect(),
                name,
            }
        })
        .collect()
}

fn nodepool() -> NodePool {
    NodePool {
        metadata: ObjectMeta {
            name: Some("default".into()),
            ..Default::default()
        },
        spec: NodePoolSpec {
            template: NodeClaimTemplate {
                metadata: None,
                spec: NodeClaimTemplateSpec {
                    node_class_ref: NodeClassReference {
                        kind: "ClusterAPINodeClass".into(),
                        name: "default".into(),
                        group: "karpenter.cluster.x-k8s.io".into(),
                    },
                    ..Default::default()
                },
            },
            ..Default::default()
        },
        status: None,
    }
}

fn selector(app: &str) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
        ..Default::default()
    })
}

fn spread(key: &str, app: &str) -> Option<Vec<TopologySpreadConstraint>> {
    Some(vec![TopologySpreadConstraint {
        max_skew: 1,
        topology_key: key.into(),
        when_unsatisfiable: "DoNotSchedule".into(),
        label_selector: selector(app),
        ..Default::default()
    }])
}

fn term(key: &str, app: &str) -> Option<Vec<PodAffinityTerm>> {
    Some(vec![PodAffinityTerm {
        label_selector: selector(app),
        topology_key: key.into(),
        ..Default::default()
    }])
}

fn pods(n: usize) -> Vec<Pod> {
    let mut rng = SmallRng::seed_from_u64(5);
    (0..n)
        .map(|i| {
            let class = [
                "plain",
                "zonal-spread",
                "host-spread",
                "zonal-affinity",
                "host-anti",
            ][i % 5];
            let cpu = CPUS[rng.random_range(0..CPUS.len())];
            let memory = MEMORY[rng.random_range(0..MEMORY.len())];
            let mut spec = PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(BTreeMap::from([
                            ("cpu".to_string(), K8sQuantity(cpu.into())),
                            ("memory".to_string(), K8sQuantity(memory.into())),
                        ])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            };
            match class {
                "zonal-spread" => spec.topology_spread_constraints = spread(ZONE_LABEL, class),
                "host-spread" => spec.topology_spread_constraints = spread(HOSTNAME_LABEL, class),
                "zonal-affinity" => {
                    spec.affinity = Some(Affinity {
                        pod_affinity: Some(PodAffinity {
                            required_during_scheduling_ignored_during_execution: term(
                                ZONE_LABEL, class,
                            ),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                }
                "host-anti" => {
                    spec.affinity = Some(Affinity {
                        pod_anti_affinity: Some(PodAntiAffinity {
                            required_during_scheduling_ignored_during_execution: term(
                                HOSTNAME_LABEL,
                                class,
                            ),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                }
                _ => {}
            }
            Pod {
                metadata: ObjectMeta {
                    name: Some(format!("pod-{i:05}")),
                    namespace: Some("default".into()),
                    labels: Some(BTreeMap::from([("app".to_string(), class.to_string())])),
                    ..Default::default()
                },
                spec: Some(spec),
                status: None,
            }
        })
        .collect()
}

fn snapshot(n: usize) -> Snapshot {
    Snapshot {
        pods: pods(n),
        nodepools: vec![PoolInput {
            nodepool: nodepool(),
            instance_types: instance_types(),
            usage: Resources::new(),
        }],
        ..Default::default()
    }
}

fn sizes() -> Vec<usize> {
    std::env::var("BENCH_PODS")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 5_000, 20_000])
}

fn scheduling(c: &mut Criterion) {
    let mut group = c.benchmark_group("scheduling");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for n in sizes() {
        let snap = snapshot(n);
        // One timed run up front so the report has pods/s and the packing at a glance.
        let start = Instant::now();
        let results = solve(&snap);
        let secs = start.elapsed().as_secs_f64();
        println!(
            "scheduling {n} pods: {:.0} pods/s, {} claims, {} failures",
            n as f64 / secs,
            results.new_claims.len(),
            results.failures.len()
        );
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &snap, |b, snap| {
            b.iter(|| black_box(solve(black_box(snap))))
        });
    }
    group.finish();
}

criterion_group!(benches, scheduling);
criterion_main!(benches);
