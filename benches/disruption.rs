//! A consolidation decision at scale: 1,000 nodes of 8 CPUs / 32 GiB running 10,000 pods of
//! 700m / 2 GiB (eleven pods on four nodes in five, six on the fifth, so there is something to
//! consolidate), three instance types, all nodes candidates, a 10 % budget. Times
//! `disruption::decide` over the whole cluster (the goal: at most 1 s on this machine).
//!
//! `BENCH_NODES=200` shrinks the cluster (pods scale with it).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use kube::api::ObjectMeta;

use karpenter_capi::api::nodepool::{ConsolidationPolicy, DisruptionReason, NodePool};
use karpenter_capi::api::requirements::{Requirement, Requirements};
use karpenter_capi::api::resources::{Quantity, Resources};
use karpenter_capi::api::wellknown::{
    CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, ZONE_LABEL,
};
use karpenter_capi::disruption::{Allowed, Candidate, decide};
use karpenter_capi::scheduling::{ExistingNode, InstanceType, Offering, PoolInput, Snapshot};

fn res(cpu: i64, gib: i64, pods: i64) -> Resources {
    Resources::new()
        .with("cpu", Quantity::from_units(cpu))
        .with("memory", format!("{gib}Gi").parse().expect("quantity"))
        .with("pods", Quantity::from_units(pods))
}

fn instance_type(name: &str, cpu: i64, price: f64) -> InstanceType {
    let labels: BTreeMap<String, String> = [
        (INSTANCE_TYPE_LABEL, name),
        (ZONE_LABEL, "zone-a"),
        (CAPACITY_TYPE_LABEL, "on-demand"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut requirements = Requirements::new();
    requirements.add(Requirement::is_in(INSTANCE_TYPE_LABEL, &[name]));
    requirements.add(Requirement::is_in(ZONE_LABEL, &["zone-a"]));
    requirements.add(Requirement::is_in(CAPACITY_TYPE_LABEL, &["on-demand"]));
    InstanceType {
        name: name.into(),
        requirements,
        capacity: res(cpu, cpu * 4, 110),
        overhead: Resources::new(),
        offerings: vec![Offering {
            machine_deployment: format!("default/{name}"),
            zone: Some("zone-a".into()),
            capacity_type: "on-demand".into(),
            price,
            available: true,
            labels,
            taints: vec![],
            replicas: 0,
            max_size: None,
        }],
    }
}

fn nodepool() -> NodePool {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": "default", "uid": "u"},
        "spec": {"template": {"spec": {"requirements": [],
            "nodeClassRef": {"group": "karpenter.cluster.x-k8s.io",
                             "kind": "ClusterAPINodeClass", "name": "default"}}}}
    }))
    .expect("a NodePool")
}

fn pod(name: &str, node: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".to_string(), K8sQuantity("700m".into())),
                        ("memory".to_string(), K8sQuantity("2Gi".into())),
                    ])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

fn cluster(nodes: usize) -> (Snapshot, Vec<Candidate>, Allowed) {
    let types = vec![
        instance_type("small", 2, 1.0),
        instance_type("medium", 4, 2.0),
        instance_type("large", 8, 4.0),
    ];
    let mut snapshot = Snapshot {
        nodepools: vec![PoolInput {
            nodepool: nodepool(),
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
        candidates.push(Candidate {
            claim: format!("claim-{i:04}"),
            node,
            nodepool: "default".into(),
            price: 4.0,
            capacity_type: "on-demand".into(),
            disruption_cost: keys.len() as f64,
            reschedule_cost: 1.0 + keys.len() as f64,
            instance_type: "large".into(),
            pods: keys,
            drift: None,
            drifted_since: None,
            consolidatable: true,
            policy: ConsolidationPolicy::WhenEmptyOrUnderutilized,
            pool_cost: 0.0,
            pool_disruption: 0.0,
        });
    }
    let mut allowed = Allowed::default();
    for r in [
        DisruptionReason::Empty,
        DisruptionReason::Drifted,
        DisruptionReason::Underutilized,
    ] {
        allowed
            .budgets
            .insert(("default".into(), r), nodes.div_ceil(10));
    }
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
