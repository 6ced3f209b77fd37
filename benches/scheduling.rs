//! Scheduling benchmark in the shape of Karpenter's own: 400 instance types (type i has i+1
//! CPUs, 2(i+1) GiB and 10(i+1) pods; on-demand in three zones and spot in two; price 0.1 per
//! CPU plus 0.1 per GiB) and pod sets of 1,000, 5,000 and 20,000 in five equal classes (plain,
//! zonal topology spread, hostname topology spread, zonal self-affinity, hostname
//! anti-affinity), requests drawn with a fixed seed. Reports pods per second.
//!
//! `BENCH_PODS=1000,5000` limits the sizes (the default runs all three).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use karpenter_capi::api::resources::Resources;
use karpenter_capi::api::wellknown::{HOSTNAME_LABEL, ZONE_LABEL};
use karpenter_capi::scheduling::{InstanceType, PoolInput, Snapshot, solve};
use karpenter_capi::testing;

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
            let (cpu, gib, pods) = (i + 1, 2 * (i + 1), 10 * (i + 1));
            testing::instance_type(&format!("type-{i:03}"), cpu, gib)
                .pods(pods)
                .offerings(&offerings)
                .spot_factor(1.0)
                .namespace("default")
                .build()
        })
        .collect()
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
            let mut pod = testing::pod(&format!("pod-{i:05}"))
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
                "zonal-affinity" => spec.affinity = Some(testing::affinity(ZONE_LABEL, class)),
                "host-anti" => spec.affinity = Some(testing::anti_affinity(HOSTNAME_LABEL, class)),
                _ => {}
            }
            pod
        })
        .collect()
}

fn snapshot(n: usize) -> Snapshot {
    Snapshot {
        pods: pods(n),
        nodepools: vec![PoolInput {
            nodepool: testing::nodepool("default"),
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
