//! A consolidation decision at scale: 1,000 nodes of 8 CPUs / 32 GiB running 10,000 pods of
//! 700m / 2 GiB (eleven pods on four nodes in five, six on the fifth, so there is something to
//! consolidate), three instance types, all nodes candidates, a 10 % budget. Times
//! `disruption::decide` over the whole cluster (the goal: at most 1 s on this machine).
//!
//! `BENCH_NODES=200` shrinks the cluster (pods scale with it).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;

use karpenter_capi::api::resources::{Quantity, Resources};
use karpenter_capi::api::wellknown::{
    CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, ZONE_LABEL,
};
use karpenter_capi::disruption::{Allowed, Candidate, decide};
use karpenter_capi::scheduling::{ExistingNode, InstanceType, PoolInput, Snapshot};
use karpenter_capi::testing;

/// An on-demand instance type of `cpu` CPUs and 4 GiB each, in one zone.
fn instance_type(name: &str, cpu: i64, price: f64) -> InstanceType {
    testing::instance_type(name, cpu, cpu * 4)
        .zones(&["zone-a"])
        .price(price)
        .namespace("default")
        .build()
}

fn pod(name: &str, node: &str) -> Pod {
    testing::pod(name)
        .label("app", "web")
        .node(node)
        .requests("700m", "2Gi")
        .build()
}

fn cluster(nodes: usize) -> (Snapshot, Vec<Candidate>, Allowed) {
    let types = vec![
        instance_type("small", 2, 1.0),
        instance_type("medium", 4, 2.0),
        instance_type("large", 8, 4.0),
    ];
    let mut snapshot = Snapshot {
        nodepools: vec![PoolInput {
            nodepool: testing::nodepool("default"),
            instance_types: types.clone(),
            usage: Resources::new(),
        }],
        ..Default::default()
    };
    let mut candidates = Vec::new();
    for i in 0..nodes {
        let node = format!("node-{i:04}");
        // Every fifth node is thinned to six pods.
        let count = if i % 5 == 0 { 6 } else { 11 };
        let mut keys = Vec::new();
        for j in 0..count {
            let name = format!("pod-{i:04}-{j}");
            keys.push(format!("default/{name}"));
            snapshot
                .bound_pods
                .push(std::sync::Arc::new(pod(&name, &node)));
        }
        let requested = Resources::new()
            .with("cpu", format!("{}m", 700 * count).parse().expect("q"))
            .with("memory", format!("{}Gi", 2 * count).parse().expect("q"))
            .with("pods", Quantity::from_units(count as i64));
        snapshot.nodes.push(ExistingNode {
            name: node.clone(),
            labels: [
                (INSTANCE_TYPE_LABEL, "large"),
                (ZONE_LABEL, "zone-a"),
                (CAPACITY_TYPE_LABEL, "on-demand"),
                (NODEPOOL_LABEL, "default"),
                (HOSTNAME_LABEL, node.as_str()),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            taints: vec![],
            allocatable: types[2].allocatable(),
            requested,
            daemon_requested: Default::default(),
            in_flight: false,
            nodepool: Some("default".into()),
        });
        candidates.push(testing::candidate(&node, "large", "on-demand", 4.0, keys));
    }
    let allowed = testing::allowed(nodes.div_ceil(10));
    (snapshot, candidates, allowed)
}

fn nodes() -> usize {
    std::env::var("BENCH_NODES")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1_000)
}

fn consolidation(c: &mut Criterion) {
    let n = nodes();
    let (snapshot, candidates, allowed) = cluster(n);
    let start = Instant::now();
    let cmd = decide(&snapshot, &candidates, &allowed);
    println!(
        "consolidation over {n} nodes / {} pods: {:.0} ms, {:?} of {} nodes, {} replacement(s)",
        snapshot.bound_pods.len(),
        start.elapsed().as_secs_f64() * 1000.0,
        cmd.as_ref().map(|c| c.method),
        cmd.as_ref().map_or(0, |c| c.candidates.len()),
        cmd.as_ref().map_or(0, |c| c.replacements.len()),
    );
    let mut group = c.benchmark_group("disruption");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(5));
    group.bench_function(format!("decide_{n}_nodes"), |b| {
        b.iter(|| black_box(decide(black_box(&snapshot), &candidates, &allowed)))
    });
    group.finish();
}

criterion_group!(benches, consolidation);
criterion_main!(benches);
