//! `simulate --scenario generate` (issue 44, docs/generate.md): node groups generated on demand.
//!
//! First the baseline: `--pods` pods of a seeded mix of sizes on three fixed member
//! MachineDeployments (4c-16gi, 8c-32gi, 16c-64gi), on a simulated cluster of its own that is
//! stopped once the pods are bound. Then the same pods on a second cluster with one source
//! MachineDeployment and a NodeClass whose `spec.generate` offers a grid of shapes priced by the
//! same per-CPU and per-GiB rates: the controller generates the groups the pods need. Both are
//! measured once every pod is bound (nodes by shape, requested / allocatable CPU and memory,
//! the sum of the nodes' prices). Then the pods are scaled to zero with consolidation on, the
//! nodes go, and after `--idle-after` every generated group and its template must go too.
//!
//! The source is not a member: it is only copied, never offered, so the controller has no
//! reason to write to it (a member at a max size of 0 would be offered as a type nothing can
//! launch, and scaled by nobody). Every MachineDeployment and infrastructure template without
//! the generated mark is recorded before the controller starts and compared at the end, and the
//! controller's writes to them are counted from the server's write log.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use super::launch::{NAMESPACE, NODECLASS};
use super::pods::{self, PodReport};
use super::{BackgroundSim, Error, Kept};
use crate::api::nodeclass::{
    ClusterAPINodeClass, Generate, GenerateSource, ShapePrice, Shapes, TemplatePatch,
};
use crate::api::resources::Quantity;
use crate::api::wellknown::*;
use crate::capi::generate::{GENERATED_LABEL, validate};
use crate::cli::{ServeArgs, SimulateArgs};
use crate::sim::cluster::{MachineDeploymentSeed, PodShape, SimCluster};

mod scale_down;
mod text;
use scale_down::{GroupSampler, scale_to_zero};

/// The source MachineDeployment every generated group is copied from.
pub const SOURCE: &str = "source";
/// The price rates of both runs: a shape costs `cpu * PER_CPU_HOUR + GiB * PER_GIB_HOUR`.
pub const PER_CPU_HOUR: &str = "0.03";
pub const PER_GIB_HOUR: &str = "0.004";
/// The most generated groups at once.
pub const MAX_GROUPS: i32 = 8;
/// The grid: CPU counts and memory sizes (GiB), with 1 to 8 GiB per CPU.
pub const GRID_CPU: [i64; 6] = [2, 4, 6, 8, 12, 16];
pub const GRID_GIB: [i64; 9] = [4, 8, 12, 16, 24, 32, 48, 64, 96];
/// The baseline's three fixed sizes: (CPUs, GiB).
pub const FIXED: [(i64, i64); 3] = [(4, 16), (8, 32), (16, 64)];
/// Pod sizes the mix is drawn from (CPU, memory): between 4 and 8 GiB per CPU, so the fixed
/// sizes' 4 GiB per CPU leaves CPU idle that a generated shape need not buy.
pub const MIX: [(&str, &str); 8] = [
    ("250m", "1Gi"),
    ("500m", "3Gi"),
    ("1", "6Gi"),
    ("250m", "2Gi"),
    ("1500m", "8Gi"),
    ("2", "10Gi"),
    ("750m", "5Gi"),
    ("100m", "512Mi"),
];

/// One run's cluster once every pod was bound.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunFigures {
    pub pods_bound: usize,
    pub nodes: usize,
    /// Nodes by instance type (the shape's name, `16c-64gi`).
    pub nodes_by_shape: BTreeMap<String, usize>,
    /// The bound pods' requests over the nodes' allocatable.
    pub cpu_utilization: f64,
    pub memory_utilization: f64,
    /// The sum of the nodes' prices per hour.
    pub cost_per_hour: f64,
}

/// The scale-down after the pods went to zero.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScaleDown {
    /// From the scale to zero until no node and no claim was left; `None`: not within
    /// `--deadline`.
    pub nodes_removed_ms: Option<u64>,
    /// From the scale to zero until no generated MachineDeployment and no generated template
    /// was left.
    pub groups_removed_ms: Option<u64>,
    pub groups_left: Vec<String>,
    pub templates_left: Vec<String>,
}

/// The objects without the mark, recorded before the controller started.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Untouched {
    /// `Kind namespace/name` of each.
    pub checked: Vec<String>,
    /// Those gone or whose spec changed by the end.
    pub changed: Vec<String>,
    /// The controller's writes to any of them (server's write log).
    pub controller_writes: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct GenerateSection {
    pub nodeclass: String,
    pub source: String,
    /// Shapes of the grid within the memory-per-CPU bounds.
    pub shapes_offered: usize,
    pub max_machine_deployments: i32,
    pub idle_after_ms: u64,
    /// The pod mix: (cpu, memory, pods) per Deployment.
    pub pod_mix: Vec<(String, String, usize)>,
    /// Generated MachineDeployments created by the controller over the run.
    pub groups_generated: usize,
    /// The most generated MachineDeployments in the store at any sample (every 250 ms).
    pub max_groups_at_once: usize,
    pub groups: Vec<String>,
    pub generated: RunFigures,
    /// The same pods on the three fixed sizes.
    pub baseline: RunFigures,
    pub baseline_sizes: Vec<String>,
    /// generated / baseline.
    pub cost_ratio: f64,
    pub cpu_utilization_ratio: f64,
    pub scale_down: ScaleDown,
    pub untouched: Untouched,
}

pub struct GenerateReport {
    /// The generated run's pods report, at the moment every pod was bound.
    pub pods: PodReport,
    pub generate: GenerateSection,
}

impl GenerateReport {
    pub fn invariants_ok(&self) -> bool {
        self.pods.launch.invariants_ok
    }

    pub fn to_json(&self) -> String {
        let section = serde_json::to_value(&self.generate).unwrap_or(Value::Null);
        self.pods
            .to_json_with("generate", section, self.invariants_ok())
    }
}

fn money(v: f64) -> String {
    format!("{v:.3}")
}

/// `spec.generate` of the scenario's NodeClass.
pub fn generate_spec(idle_after: Duration) -> Generate {
    let annotation = |key: &str, value: &str| TemplatePatch {
        op: "add".into(),
        path: format!("/metadata/annotations/{}", key.replace('/', "~1")),
        value: Some(json!(value)),
        value_type: None,
    };
    Generate {
        source: GenerateSource {
            namespace: NAMESPACE.into(),
            name: SOURCE.into(),
        },
        shapes: Shapes {
            cpu: GRID_CPU.to_vec(),
            memory: GRID_GIB.iter().map(|g| format!("{g}Gi")).collect(),
            gpus: Vec::new(),
            min_memory_per_cpu: Some("1Gi".into()),
            max_memory_per_cpu: Some("8Gi".into()),
        },
        zones: Vec::new(),
        // The simulated infrastructure's VM size: the copied DevMachineTemplate's own
        // annotations (the copy always has the map).
        patches: vec![
            annotation("sim.karpenter.cluster.x-k8s.io/cpu", "{{cpu}}"),
            annotation("sim.karpenter.cluster.x-k8s.io/memory", "{{memoryMiB}}Mi"),
        ],
        price: ShapePrice {
            per_cpu_hour: Some(PER_CPU_HOUR.into()),
            per_gib_hour: Some(PER_GIB_HOUR.into()),
            ..Default::default()
        },
        max_machine_deployments: MAX_GROUPS,
        on_source_change: None,
        idle_after: Some(idle_after.into()),
    }
}

/// A shape's price by the rates, as `spec.generate.price` computes it.
pub fn rate_price(cpu: f64, gib: f64) -> f64 {
    let rate = |s: &str| s.parse::<f64>().unwrap_or(0.0);
    rate(PER_CPU_HOUR) * cpu + rate(PER_GIB_HOUR) * gib
}

/// The pod size of each Deployment: drawn from [`MIX`] by `--seed` (splitmix64), so a seed
/// gives the same mix every run.
pub fn pod_mix(seed: u64, deployments: usize) -> Vec<(&'static str, &'static str)> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..deployments)
        .map(|_| MIX[(next() % MIX.len() as u64) as usize])
        .collect()
}

fn node_labels_annotation(instance_type: Option<&str>) -> String {
    let mut labels = format!(
        "{ZONE_LABEL}=sim-zone-0,{ARCH_LABEL}=amd64,{OS_LABEL}=linux,{CAPACITY_TYPE_LABEL}=on-demand"
    );
    if let Some(t) = instance_type {
        labels = format!("{INSTANCE_TYPE_LABEL}={t},{labels}");
    }
    labels
}

/// The baseline's member MachineDeployment of `cpu` CPUs and `gib` GiB.
fn fixed_seed(cpu: i64, gib: i64, max_size: usize) -> MachineDeploymentSeed {
    let name = format!("{cpu}c-{gib}gi");
    MachineDeploymentSeed {
        name: format!("fixed-{name}"),
        namespace: NAMESPACE.into(),
        replicas: 0,
        labels: BTreeMap::from([(MEMBER_LABEL.to_string(), String::new())]),
        annotations: BTreeMap::from([
            (CPU_ANNOTATION.to_string(), cpu.to_string()),
            (MEMORY_ANNOTATION.to_string(), format!("{gib}Gi")),
            (MAX_PODS_ANNOTATION.to_string(), "110".to_string()),
            (
                LABELS_ANNOTATION.to_string(),
                node_labels_annotation(Some(&name)),
            ),
            (
                PRICE_ANNOTATION.to_string(),
                format!("{}", rate_price(cpu as f64, gib as f64)),
            ),
            (MAX_SIZE_ANNOTATION.to_string(), max_size.to_string()),
        ]),
        ..Default::default()
    }
}

/// The source: not a member (never offered, only copied), at zero replicas.
fn source_seed() -> MachineDeploymentSeed {
    MachineDeploymentSeed {
        name: SOURCE.into(),
        namespace: NAMESPACE.into(),
        replicas: 0,
        annotations: BTreeMap::from([
            (MAX_PODS_ANNOTATION.to_string(), "110".to_string()),
            (LABELS_ANNOTATION.to_string(), node_labels_annotation(None)),
        ]),
        ..Default::default()
    }
}

/// The Deployments' pods: `--pods` split over `--deployments`, each Deployment's size from the
/// seeded mix.
fn shape_of(mix: Vec<(&'static str, &'static str)>) -> impl Fn(usize, &mut PodShape) + Send {
    move |d, s| {
        let (cpu, memory) = mix[d % mix.len()];
        s.cpu = cpu.into();
        s.memory = memory.into();
    }
}

fn quantity(v: &Value, path: &str) -> f64 {
    v.pointer(path)
        .and_then(Value::as_str)
        .and_then(|q| q.parse::<Quantity>().ok())
        .map_or(0.0, |q| q.as_f64())
}

/// Nodes by shape and their cost: each node's instance type priced from `prices`, or by the
/// rates from its capacity when the type is not listed.
fn figures(cluster: &SimCluster, report: &PodReport, prices: &BTreeMap<String, f64>) -> RunFigures {
    let nodes = cluster.store().list("nodes", None);
    let mut by_shape = BTreeMap::new();
    let mut cost = 0.0;
    for n in &nodes {
        let shape = n
            .pointer("/metadata/labels")
            .and_then(|l| l.get(INSTANCE_TYPE_LABEL))
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_string();
        cost += prices.get(&shape).copied().unwrap_or_else(|| {
            rate_price(
                quantity(n, "/status/capacity/cpu"),
                quantity(n, "/status/capacity/memory") / f64::from(1u32 << 30),
            )
        });
        *by_shape.entry(shape).or_insert(0) += 1;
    }
    RunFigures {
        pods_bound: report.pods.bound,
        nodes: nodes.len(),
        nodes_by_shape: by_shape,
        cpu_utilization: report.nodes.cpu_utilization,
        memory_utilization: report.nodes.memory_utilization,
        cost_per_hour: cost,
    }
}

fn marked(v: &Value) -> bool {
    v.pointer("/metadata/labels")
        .and_then(|l| l.get(GENERATED_LABEL))
        .is_some()
}

fn key(v: &Value) -> String {
    format!(
        "{}/{}",
        v.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        v.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    )
}

/// The node-group kinds the scenario watches: (store resource, kind).
const GROUP_KINDS: [(&str, &str); 2] = [
    ("machinedeployments", "MachineDeployment"),
    ("devmachinetemplates", "DevMachineTemplate"),
];

/// The specs of every MachineDeployment and template without the mark, by `Kind ns/name`.
fn unmarked(cluster: &SimCluster) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (resource, kind) in GROUP_KINDS {
        for o in cluster.store().list(resource, None) {
            if !marked(&o) {
                out.insert(format!("{kind} {}", key(&o)), o["spec"].clone());
            }
        }
    }
    out
}

/// The marked objects of `resource` in the store.
fn marked_names(cluster: &SimCluster, resource: &str) -> Vec<String> {
    cluster
        .store()
        .list(resource, None)
        .iter()
        .filter(|o| marked(o))
        .map(key)
        .collect()
}

/// The baseline: the same pods on the three fixed sizes, on a cluster of its own, stopped once
/// measured.
async fn baseline(
    args: &SimulateArgs,
    mix: Vec<(&'static str, &'static str)>,
) -> Result<RunFigures, Error> {
    // Its own cluster on any port; `--serve` and `--kubeconfig-out` are the generated run's.
    let args = SimulateArgs {
        serve: ServeArgs::default(),
        ..args.clone()
    };
    say!("baseline: the pods on three fixed sizes");
    let sim = super::start_sim(&args).await?;
    let max_size = args.pods.max(10);
    sim.run(move |c| async move {
        for (cpu, gib) in FIXED {
            c.create_machine_deployment_from(&fixed_seed(cpu, gib, max_size))
                .await?;
        }
        Ok::<_, crate::sim::cluster::Error>(())
    })
    .await??;
    pods::seed_nodepool(&sim, |_| {}).await?;
    let p = pods::provision_on(sim, &args, shape_of(mix), |_| {}).await?;
    let report = p.measure();
    let prices = FIXED
        .iter()
        .map(|(c, g)| (format!("{c}c-{g}gi"), rate_price(*c as f64, *g as f64)))
        .collect();
    let figures = figures(p.sim.cluster(), &report, &prices);
    drop(p.kept());
    Ok(figures)
}

/// Merge-patches the scenario's NodeClass with `spec.generate`.
async fn put_generate(sim: &BackgroundSim, generate: &Generate) -> Result<(), Error> {
    let patch = json!({"spec": {"generate": generate}});
    sim.run(move |c| async move {
        kube::Api::<ClusterAPINodeClass>::all(c.client())
            .patch(
                NODECLASS,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
    })
    .await?
    .map_err(|source| Error::Kube {
        what: "setting the NodeClass's spec.generate".into(),
        source,
    })
}

/// `--scenario generate`, handing back the generated run's cluster and controller.
pub async fn run_kept(args: &SimulateArgs) -> Result<(GenerateReport, Kept), Error> {
    let k = args.deployments.max(1);
    let mix = pod_mix(args.seed, k);
    let base = baseline(args, mix.clone()).await?;

    say!("generated: the pods on groups generated from MachineDeployment {NAMESPACE}/{SOURCE}");
    let generate = generate_spec(args.idle_after);
    let valid = validate(&generate).map_err(|e| Error::Usage(e.to_string()))?;
    let prices: BTreeMap<String, f64> = valid.shapes.iter().map(|(s, p)| (s.name(), *p)).collect();
    let sim = start_generated(args, &generate).await?;
    // Recorded before the controller generates anything: what it must leave untouched.
    let before = unmarked(sim.cluster());
    let sampler = GroupSampler::start(sim.cluster().clone());
    let p = pods::provision_on(sim, args, shape_of(mix.clone()), |s| {
        super::disruption::fast_disruption(s)
    })
    .await?;
    let mut report = p.measure();
    report.launch.scenario = "generate".into();
    let generated = figures(p.sim.cluster(), &report, &prices);

    let cluster = p.sim.cluster().clone();
    let (nodes_removed, groups_removed) = scale_to_zero(&p.sim, args, k).await?;
    let (most, groups) = sampler.read();
    drop(sampler);
    let scale_down = ScaleDown {
        nodes_removed_ms: nodes_removed,
        groups_removed_ms: groups_removed,
        groups_left: marked_names(&cluster, "machinedeployments"),
        templates_left: marked_names(&cluster, "devmachinetemplates"),
    };
    let untouched = untouched(&cluster, &before);
    let groups_generated = groups_generated(&cluster);
    let ratio = |a: f64, b: f64| if b == 0.0 { 0.0 } else { a / b };
    let section = GenerateSection {
        nodeclass: NODECLASS.into(),
        source: format!("{NAMESPACE}/{SOURCE}"),
        shapes_offered: valid.shapes.len(),
        max_machine_deployments: MAX_GROUPS,
        idle_after_ms: args.idle_after.as_millis() as u64,
        pod_mix: pods_per_shape(&mix, args.pods, k),
        groups_generated,
        max_groups_at_once: most,
        groups,
        cost_ratio: ratio(generated.cost_per_hour, base.cost_per_hour),
        cpu_utilization_ratio: ratio(generated.cpu_utilization, base.cpu_utilization),
        generated,
        baseline: base,
        baseline_sizes: FIXED.iter().map(|(c, g)| format!("{c}c-{g}gi")).collect(),
        scale_down,
        untouched,
    };
    // The charts run to the end, the scale-down's phases marked.
    report.launch.timeline = p.sim.timeline();
    let inv = super::invariants::check(cluster.store(), cluster.capi_version().into());
    report.launch.problems.extend(inv.problems);
    report.launch.problems.extend(problems(&section, args.pods));
    report.launch.invariants_ok = report.launch.problems.is_empty();
    Ok((
        GenerateReport {
            pods: report,
            generate: section,
        },
        p.kept(),
    ))
}

/// The generated run's cluster: the source MachineDeployment, the NodePool and the NodeClass
/// told to generate, before any pod.
async fn start_generated(args: &SimulateArgs, generate: &Generate) -> Result<BackgroundSim, Error> {
    let sim = super::start_sim(args).await?;
    super::announce(
        &sim,
        args,
        "machinedeployments,devmachinetemplates,pods,nodeclaims,nodes",
    );
    sim.run(|c| async move { c.create_machine_deployment_from(&source_seed()).await })
        .await??;
    pods::seed_nodepool(&sim, |_| {}).await?;
    put_generate(&sim, generate).await?;
    Ok(sim)
}

/// Each of the `k` Deployments' pod shape and pod count, the remainder of `pods` spread over
/// the first ones.
fn pods_per_shape(
    mix: &[(&'static str, &'static str)],
    pods: usize,
    k: usize,
) -> Vec<(String, String, usize)> {
    (0..k)
        .map(|d| {
            let (cpu, memory) = mix[d];
            (
                cpu.into(),
                memory.into(),
                pods / k + usize::from(d < pods % k),
            )
        })
        .collect()
}

/// The MachineDeployments the controller created: the groups it generated.
fn groups_generated(cluster: &SimCluster) -> usize {
    cluster
        .stats()
        .writes()
        .iter()
        .filter(|w| {
            w.agent == crate::app::USER_AGENT
                && w.resource == "machinedeployments"
                && w.verb == "create"
                && w.subresource.is_empty()
        })
        .count()
}

/// The objects recorded `before` the controller started, compared now; and the controller's
/// writes to them.
fn untouched(cluster: &SimCluster, before: &BTreeMap<String, Value>) -> Untouched {
    let now = unmarked(cluster);
    let changed = before
        .iter()
        .filter(|(k, spec)| now.get(*k) != Some(*spec))
        .map(|(k, _)| k.clone())
        .collect();
    let names: BTreeSet<(&str, String)> = before
        .keys()
        .filter_map(|k| {
            let (kind, key) = k.split_once(' ')?;
            let resource = GROUP_KINDS.iter().find(|(_, n)| *n == kind)?.0;
            Some((resource, key.to_string()))
        })
        .collect();
    let controller_writes = cluster
        .stats()
        .writes()
        .iter()
        .filter(|w| w.agent == crate::app::USER_AGENT)
        .filter(|w| names.contains(&(w.resource.as_str(), format!("{}/{}", w.namespace, w.name))))
        .count();
    Untouched {
        checked: before.keys().cloned().collect(),
        changed,
        controller_writes,
    }
}

/// What fails the scenario: too many groups at once, a group or template left after the idle
/// period, an object without the mark changed or written, pods not bound in either run, and a
/// generated run not both cheaper and better utilised than the baseline.
pub fn problems(g: &GenerateSection, pods: usize) -> Vec<String> {
    let mut out = Vec::new();
    if g.max_groups_at_once > g.max_machine_deployments as usize {
        out.push(format!(
            "{} generated MachineDeployments existed at once, over maxMachineDeployments {}",
            g.max_groups_at_once, g.max_machine_deployments
        ));
    }
    if g.groups_generated == 0 {
        out.push("no MachineDeployment was generated".into());
    }
    let s = &g.scale_down;
    if s.nodes_removed_ms.is_none() {
        out.push("nodes were left after the pods were scaled to zero".into());
    }
    if !s.groups_left.is_empty() || !s.templates_left.is_empty() {
        out.push(format!(
            "generated objects left after the idle period: groups {:?}, templates {:?}",
            s.groups_left, s.templates_left
        ));
    }
    if !g.untouched.changed.is_empty() {
        out.push(format!(
            "objects without the generated mark changed or deleted: {:?}",
            g.untouched.changed
        ));
    }
    if g.untouched.controller_writes > 0 {
        out.push(format!(
            "the controller wrote {} times to objects without the generated mark",
            g.untouched.controller_writes
        ));
    }
    for (run, r) in [("generated", &g.generated), ("baseline", &g.baseline)] {
        if r.pods_bound < pods {
            out.push(format!("{run} run: {} of {pods} pods bound", r.pods_bound));
        }
    }
    if g.generated.cost_per_hour >= g.baseline.cost_per_hour {
        out.push(format!(
            "the generated run costs {}/h, not less than the baseline's {}/h",
            money(g.generated.cost_per_hour),
            money(g.baseline.cost_per_hour)
        ));
    }
    if g.generated.cpu_utilization <= g.baseline.cpu_utilization {
        out.push(format!(
            "the generated run's CPU utilisation {:.3} is not above the baseline's {:.3}",
            g.generated.cpu_utilization, g.baseline.cpu_utilization
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thousand_pods_unless_told() {
        let words = |w: &[&str]| SimulateArgs::from_words(w).expect("parses").pods;
        assert_eq!(words(&["--scenario", "generate"]), 1000);
        assert_eq!(words(&["--scenario", "generate", "--pods", "60"]), 60);
        assert_eq!(words(&["--scenario", "pods"]), 100);
    }

    #[test]
    fn the_mix_is_the_seeds() {
        assert_eq!(pod_mix(1, 8), pod_mix(1, 8));
        assert_ne!(pod_mix(1, 8), pod_mix(2, 8));
    }

    /// The grid and the baseline are priced by the same rates.
    #[test]
    fn the_grid_prices_the_fixed_sizes_as_the_baseline_does() {
        let valid = validate(&generate_spec(Duration::from_secs(20))).expect("valid");
        for (cpu, gib) in FIXED {
            let name = format!("{cpu}c-{gib}gi");
            let (_, price) = valid
                .shapes
                .iter()
                .find(|(s, _)| s.name() == name)
                .expect("the fixed size is in the grid");
            assert!((price - rate_price(cpu as f64, gib as f64)).abs() < 1e-12);
        }
        assert_eq!(valid.max_groups, MAX_GROUPS as usize);
    }

    #[test]
    fn problems_name_each_broken_rule() {
        let ok = GenerateSection {
            max_machine_deployments: 8,
            max_groups_at_once: 3,
            groups_generated: 3,
            generated: RunFigures {
                pods_bound: 10,
                cost_per_hour: 1.0,
                cpu_utilization: 0.9,
                ..Default::default()
            },
            baseline: RunFigures {
                pods_bound: 10,
                cost_per_hour: 2.0,
                cpu_utilization: 0.6,
                ..Default::default()
            },
            scale_down: ScaleDown {
                nodes_removed_ms: Some(1),
                groups_removed_ms: Some(2),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(problems(&ok, 10).is_empty());
        let mut bad = ok.clone();
        bad.max_groups_at_once = 9;
        bad.scale_down.groups_left = vec!["default/x".into()];
        bad.untouched.changed = vec!["MachineDeployment default/source".into()];
        bad.generated.cost_per_hour = 2.0;
        bad.generated.cpu_utilization = 0.5;
        assert_eq!(problems(&bad, 10).len(), 5, "{:?}", problems(&bad, 10));
    }
}
