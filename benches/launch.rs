//! The launch path's pure decisions, which run on every event: the Scaler's plan for one
//! MachineDeployment, the catalog's rebuild from MachineDeployments, and resolving a claim to an
//! offering. End-to-end launch figures come from `simulate --scenario launch --report json`
//! (docs/benchmarks.md); these say how much of that is our own CPU.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

use karpenter_capi::actors::catalog::CatalogView;
use karpenter_capi::actors::scaler::plan::{MachineView, Snapshot, plan};
use karpenter_capi::api::Operator;
use karpenter_capi::api::requirements::{Requirement, Requirements};
use karpenter_capi::api::resources::Resources;
use karpenter_capi::api::wellknown::INSTANCE_TYPE_LABEL;
use karpenter_capi::capi::model::MachineDeployment;
use karpenter_capi::capi::offerings::{self, Context};
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::sim::cluster::machine_deployment;
use karpenter_capi::simulate::launch::seed_of;

fn bench_plan(c: &mut Criterion) {
    let mut g = c.benchmark_group("scaler_plan");
    for n in [100usize, 1_000, 10_000] {
        // Half the Machines bound, a quarter unbound (ours), a quarter still to come; as many
        // claims waiting as there will be Machines for them.
        let machines: Vec<MachineView> = (0..n * 3 / 4)
            .map(|i| MachineView {
                key: format!("default/m-{i:05}"),
                bound_to: (i < n / 2).then(|| format!("c-{i:05}")),
                marked: false,
                replaced: false,
            })
            .collect();
        let waiting: Vec<String> = (n / 2..n).map(|i| format!("c-{i:05}")).collect();
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| {
                black_box(plan(&Snapshot {
                    spec_replicas: n as i32,
                    managed: n as i32,
                    min_size: 0,
                    max_size: None,
                    set_aside: 0,
                    machines: &machines,
                    waiting: &waiting,
                    rolling_out: false,
                    unplaced: 0,
                }))
            })
        });
    }
    g.finish();
}

fn deployments(n: usize) -> Vec<Arc<MachineDeployment>> {
    (0..n)
        .map(|i| {
            let obj = machine_deployment(CapiVersion::V1Beta2.into(), &seed_of(i, 1000));
            let mut v = serde_json::to_value(&obj).expect("serialisable");
            // What the API server adds on create.
            v["metadata"]["uid"] = serde_json::json!(format!("uid-{i}"));
            v["metadata"]["resourceVersion"] = serde_json::json!("1");
            Arc::new(
                MachineDeployment::from_value(&v, CapiVersion::V1Beta2)
                    .expect("a valid MachineDeployment"),
            )
        })
        .collect()
}

/// The catalog of `n` MachineDeployments, without templates.
fn catalog_of(n: usize) -> offerings::Catalog {
    let mds = deployments(n);
    let templates = HashMap::new();
    let never = |_: &str| false;
    offerings::build(
        None,
        &mds,
        &Context {
            templates: &templates,
            unavailable: &never,
        },
    )
}

fn bench_catalog(c: &mut Criterion) {
    let mut g = c.benchmark_group("catalog_build");
    for n in [10usize, 100] {
        let mds = deployments(n);
        let templates = HashMap::new();
        let never = |_: &str| false;
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                black_box(offerings::build(
                    None,
                    &mds,
                    &Context {
                        templates: &templates,
                        unavailable: &never,
                    },
                ))
            })
        });
    }
    g.finish();

    // Resolving one claim against 100 MachineDeployments (the catalog's hot read).
    let cat = catalog_of(100);
    let mut reqs = Requirements::default();
    reqs.add(
        Requirement::new(INSTANCE_TYPE_LABEL, Operator::In, &["sim-42".to_string()])
            .expect("valid"),
    );
    let requests = Resources::from_k8s(&BTreeMap::from([
        (
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
        ),
        (
            "memory".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()),
        ),
    ]))
    .expect("valid");
    let view = CatalogView::default();
    view.insert("default", cat, None);
    let excluded = HashSet::new();
    c.bench_function("resolve_one_claim_100_mds", |b| {
        b.iter(|| {
            black_box(
                view.resolve("default", None, &reqs, &requests, &excluded, &[])
                    .map(|c| c.price),
            )
        })
    });
}

/// NodeOverlays on a catalog of 100 MachineDeployments shared by 10 NodePools: applying them on
/// a rebuild, and reading each pool's instance types as the solver's snapshot does. `shared`:
/// no overlay names a pool-level label, so every pool sees the NodeClass's catalog; `per_pool`:
/// one more overlay selects `karpenter.sh/nodepool`, so each pool gets a catalog of its own.
fn bench_overlay(c: &mut Criterion) {
    use karpenter_capi::api::NodeOverlay;
    use karpenter_capi::api::nodepool::NodePool;
    use karpenter_capi::view::catalog::apply_overlays;
    let cat = catalog_of(100);
    let overlay = |name: &str, spec: serde_json::Value| -> NodeOverlay {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay",
            "metadata": {"name": name}, "spec": spec,
        }))
        .expect("a NodeOverlay")
    };
    let types: Vec<String> = (0..50).map(|i| format!("sim-{i}")).collect();
    let shared = vec![
        overlay(
            "negotiated",
            serde_json::json!({"requirements": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": types}], "price": "0.05"}),
        ),
        overlay(
            "fuse",
            serde_json::json!({"requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}], "capacity": {"smarter-devices/fuse": "1"}}),
        ),
    ];
    let mut per_pool = shared.clone();
    per_pool.push(overlay(
        "pool-3-discount",
        serde_json::json!({"requirements": [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["pool-3"]}], "priceAdjustment": "-10%", "weight": 5}),
    ));
    let pools: Vec<Arc<NodePool>> = (0..10)
        .map(|i| {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                    "metadata": {"name": format!("pool-{i}")},
                    "spec": {"template": {"spec": {
                        "nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"},
                        "requirements": [],
                    }}},
                }))
                .expect("a NodePool"),
            )
        })
        .collect();
    for (case, overlays) in [("shared", &shared), ("per_pool", &per_pool)] {
        let refs: Vec<&NodeOverlay> = overlays.iter().collect();
        c.bench_function(&format!("overlay_apply_100_mds_10_pools/{case}"), |b| {
            b.iter(|| {
                let mut one = cat.clone();
                black_box(apply_overlays(&refs, vec![("default", &mut one)], &pools))
            })
        });
        let mut applied = cat.clone();
        let (_, by_pool) = apply_overlays(&refs, vec![("default", &mut applied)], &pools);
        let view = CatalogView::default();
        view.insert("default", applied, None);
        view.publish_pools(by_pool);
        c.bench_function(
            &format!("pool_instance_types_100_mds_10_pools/{case}"),
            |b| {
                b.iter(|| {
                    for p in &pools {
                        black_box(view.pool_instance_types("default", p.metadata.name.as_deref()));
                    }
                })
            },
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = bench_plan, bench_catalog, bench_overlay
}
criterion_main!(benches);
