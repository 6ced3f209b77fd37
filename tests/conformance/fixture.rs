//! The setup every conformance case shares, mirroring Karpenter core's test fixtures in terms a
//! Cluster API provider has: instance types as MachineDeployment offerings (one offering per
//! zone x capacity type x operating system, carrying the labels the node will have), NodePools,
//! pods, and a `provision` step that runs one solve and "launches" each claim the way the
//! controller does (cheapest instance type first, its cheapest offering the claim allows).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, Pod, PodAffinity, PodAffinityTerm, PodAntiAffinity, PodSpec,
    PreferredSchedulingTerm, ResourceRequirements, Taint, Toleration, TopologySpreadConstraint,
    WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ObjectMeta;

use karpenter_capi::api::nodeclaim::{NodeSelectorRequirementWithMinValues, Operator};
use karpenter_capi::api::nodepool::{NodePool, TemplateMetadata};
use karpenter_capi::api::requirements::{Requirement, Requirements};
use karpenter_capi::api::resources::{Quantity, Resources};
use karpenter_capi::api::wellknown::{
    ARCH_LABEL, CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, OS_LABEL, ZONE_LABEL,
};
use karpenter_capi::scheduling::default_spread::{
    DefaultConstraints, DefaultSpread, OwnerSelector, WorkloadKey, Workloads,
};
use karpenter_capi::scheduling::solve_with_volumes;
use karpenter_capi::scheduling::volumes::{CsiLimits, VolumeCatalog, prepare};
use karpenter_capi::scheduling::{
    ExistingNode, InstanceType, MinValuesPolicy, NewClaim, Offering, PoolInput, PreferencePolicy,
    Results, Snapshot, nodeclaim_for,
};

/// Upstream's fake provider labels: a size class, an optional "special" label on large types
/// and the CPU count as an integer label (for Gt/Lt).
pub const SIZE: &str = "size";
pub const SPECIAL: &str = "special";
pub const INTEGER: &str = "integer";
pub const GPU_A: &str = "fake.com/vendor-a";
pub const GPU_B: &str = "fake.com/vendor-b";
pub const ZONES: [&str; 3] = ["test-zone-1", "test-zone-2", "test-zone-3"];
pub const SPOT: &str = "spot";
pub const ON_DEMAND: &str = "on-demand";

pub fn q(s: &str) -> Quantity {
    s.parse().unwrap()
}

pub fn res(pairs: &[(&str, &str)]) -> Resources {
    pairs.iter().map(|(k, v)| (k.to_string(), q(v))).collect()
}

/// One offering as (capacity type, zone, available).
pub type OfferingSpec = (&'static str, &'static str, bool);

/// Upstream's default offerings: spot in zones 1-2, on-demand in zones 1-3.
pub const DEFAULT_OFFERINGS: [OfferingSpec; 5] = [
    (SPOT, "test-zone-1", true),
    (SPOT, "test-zone-2", true),
    (ON_DEMAND, "test-zone-1", true),
    (ON_DEMAND, "test-zone-2", true),
    (ON_DEMAND, "test-zone-3", true),
];

/// An instance type being described; `build` turns it into what the catalog makes of the
/// matching MachineDeployments.
#[derive(Clone)]
pub struct TypeSpec {
    pub name: String,
    pub resources: Resources,
    pub arch: String,
    pub os: Vec<String>,
    pub offerings: Vec<OfferingSpec>,
    /// Extra labels every offering carries.
    pub labels: BTreeMap<String, String>,
    /// Price override for every offering (otherwise upstream's price from resources).
    pub price: Option<f64>,
    /// Price override per (capacity type, zone).
    pub offering_prices: BTreeMap<(String, String), f64>,
}

pub fn itype(name: &str) -> TypeSpec {
    TypeSpec {
        name: name.into(),
        resources: Resources::new(),
        arch: "amd64".into(),
        os: vec!["linux".into(), "windows".into(), "darwin".into()],
        offerings: DEFAULT_OFFERINGS.to_vec(),
        labels: BTreeMap::new(),
        price: None,
        offering_prices: BTreeMap::new(),
    }
}

impl TypeSpec {
    pub fn resources(mut self, pairs: &[(&str, &str)]) -> Self {
        for (k, v) in pairs {
            self.resources.set(k.to_string(), q(v));
        }
        self
    }
    pub fn arch(mut self, arch: &str) -> Self {
        self.arch = arch.into();
        self
    }
    pub fn os(mut self, os: &[&str]) -> Self {
        self.os = os.iter().map(|s| s.to_string()).collect();
        self
    }
    pub fn offerings(mut self, offerings: &[OfferingSpec]) -> Self {
        self.offerings = offerings.to_vec();
        self
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
    pub fn price(mut self, p: f64) -> Self {
        self.price = Some(p);
        self
    }
    /// Offerings with their own prices: (capacity type, zone, price).
    pub fn priced(mut self, offerings: &[(&'static str, &'static str, f64)]) -> Self {
        self.offerings = offerings.iter().map(|(ct, z, _)| (*ct, *z, true)).collect();
        self.offering_prices = offerings
            .iter()
            .map(|(ct, z, p)| ((ct.to_string(), z.to_string()), *p))
            .collect();
        self
    }

    /// Upstream's defaults (4 CPU, 4Gi, 5 pods) for what is not set; kube-reserved 100m/10Mi.
    pub fn build(mut self) -> InstanceType {
        for (k, v) in [("cpu", "4"), ("memory", "4Gi"), ("pods", "5")] {
            if self.resources.get(k).is_zero() {
                self.resources.set(k.to_string(), q(v));
            }
        }
        let cpu = self.resources.get("cpu");
        let mem = self.resources.get("memory");
        let large = cpu > q("4") && mem > q("8Gi");
        let mut shared = self.labels.clone();
        shared.insert(INSTANCE_TYPE_LABEL.into(), self.name.clone());
        shared.insert(ARCH_LABEL.into(), self.arch.clone());
        shared.insert(SIZE.into(), if large { "large" } else { "small" }.into());
        if large {
            shared.insert(SPECIAL.into(), "optional".into());
        }
        shared.insert(INTEGER.into(), cpu.as_units().to_string());
        let price = self.price.unwrap_or_else(|| price_from(&self.resources));
        let mut offerings = Vec::new();
        for (ct, zone, available) in &self.offerings {
            for os in &self.os {
                let mut labels = shared.clone();
                labels.insert(ZONE_LABEL.into(), zone.to_string());
                labels.insert(CAPACITY_TYPE_LABEL.into(), ct.to_string());
                labels.insert(OS_LABEL.into(), os.clone());
                let price = self
                    .offering_prices
                    .get(&(ct.to_string(), zone.to_string()))
                    .copied()
                    .unwrap_or(price);
                offerings.push(Offering {
                    machine_deployment: format!("capi/{}-{zone}-{ct}-{os}", self.name),
                    zone: Some(zone.to_string()),
                    capacity_type: ct.to_string(),
                    price,
                    available: *available,
                    labels,
                    taints: vec![],
                    replicas: 0,
                    max_size: None,
                });
            }
        }
        // As the catalog does: shared labels are `In [v]`, zone and capacity type list every
        // value, a label only some offerings carry (the OS here) is left to the offerings.
        let mut requirements = Requirements::from_labels(&shared);
        if self.os.len() == 1 {
            requirements.add(Requirement::is_in(OS_LABEL, &[self.os[0].as_str()]));
        }
        let zones: Vec<&str> = dedup(self.offerings.iter().map(|o| o.1));
        let cts: Vec<&str> = dedup(self.offerings.iter().map(|o| o.0));
        requirements.add(Requirement::is_in(ZONE_LABEL, &zones));
        requirements.add(Requirement::is_in(CAPACITY_TYPE_LABEL, &cts));
        InstanceType {
            name: self.name,
            requirements,
            capacity: self.resources,
            overhead: res(&[("cpu", "100m"), ("memory", "10Mi")]),
            offerings,
            csi_limits: Default::default(),
        }
    }
}

fn dedup<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = it.collect();
    v.sort();
    v.dedup();
    v
}

/// Upstream's fake price: 0.1 per CPU, 0.1 per GB of memory, 1.0 per GPU resource present.
pub fn price_from(r: &Resources) -> f64 {
    let mut p = r.get("cpu").as_f64() * 0.1;
    p += r.get("memory").as_f64() / 1e9 * 0.1;
    for gpu in [GPU_A, GPU_B] {
        if !r.get(gpu).is_zero() {
            p += 1.0;
        }
    }
    p
}

/// Upstream's default catalog.
pub fn default_types() -> Vec<InstanceType> {
    vec![
        itype("default-instance-type").build(),
        itype("small-instance-type")
            .resources(&[("cpu", "2"), ("memory", "2Gi")])
            .build(),
        itype("gpu-vendor-instance-type")
            .resources(&[(GPU_A, "2")])
            .build(),
        itype("gpu-vendor-b-instance-type")
            .resources(&[(GPU_B, "2")])
            .build(),
        itype("arm-instance-type")
            .arch("arm64")
            .os(&["ios", "linux", "windows", "darwin"])
            .resources(&[("cpu", "16"), ("memory", "128Gi")])
            .build(),
        itype("single-pod-instance-type")
            .resources(&[("pods", "1")])
            .build(),
    ]
}

/// Upstream's `InstanceTypesAssorted()`: every CPU x memory size in each zone, capacity type,
/// OS and arch, one offering each (one MachineDeployment per type).
pub fn assorted_types() -> Vec<InstanceType> {
    let mut out = Vec::new();
    for cpu in [1, 2, 4, 8, 16, 32, 64] {
        for mem in [1, 2, 4, 8, 16, 32, 64, 128] {
            for zone in ZONES {
                for ct in [SPOT, ON_DEMAND] {
                    for os in ["linux", "windows"] {
                        for arch in ["amd64", "arm64"] {
                            out.push(
                                itype(&format!("{cpu}-cpu-{mem}-mem-{arch}-{os}-{zone}-{ct}"))
                                    .arch(arch)
                                    .os(&[os])
                                    .resources(&[
                                        ("cpu", &cpu.to_string()),
                                        ("memory", &format!("{mem}Gi")),
                                    ])
                                    .offerings(&[(ct, zone, true)])
                                    .build(),
                            );
                        }
                    }
                }
            }
        }
    }
    out
}

/// Upstream's `InstanceTypes(n)`: i+1 CPUs, 2(i+1) Gi, 10(i+1) pods.
pub fn sized_types(n: usize) -> Vec<InstanceType> {
    (0..n)
        .map(|i| {
            let i = i + 1;
            itype(&format!("fake-it-{}", i - 1))
                .resources(&[
                    ("cpu", &i.to_string()),
                    ("memory", &format!("{}Gi", 2 * i)),
                    ("pods", &(10 * i).to_string()),
                ])
                .build()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// NodePools

pub fn nodepool(name: &str) -> NodePool {
    let mut np = karpenter_capi::testing::nodepool(name);
    np.spec.template.spec.requirements = vec![NodeSelectorRequirementWithMinValues::new(
        CAPACITY_TYPE_LABEL,
        Operator::In,
        &[SPOT, ON_DEMAND],
    )];
    np
}

/// Builder-style edits on a NodePool.
pub trait PoolExt: Sized {
    fn np(&mut self) -> &mut NodePool;
    fn labels(mut self, pairs: &[(&str, &str)]) -> Self {
        let meta = self
            .np()
            .spec
            .template
            .metadata
            .get_or_insert_with(TemplateMetadata::default);
        let labels = meta.labels.get_or_insert_with(BTreeMap::new);
        for (k, v) in pairs {
            labels.insert(k.to_string(), v.to_string());
        }
        self
    }
    fn req(mut self, key: &str, op: Operator, values: &[&str]) -> Self {
        let reqs = &mut self.np().spec.template.spec.requirements;
        reqs.retain(|r| r.key != key);
        reqs.push(NodeSelectorRequirementWithMinValues::new(key, op, values));
        self
    }
    fn req_min(mut self, key: &str, op: Operator, values: &[&str], min: i64) -> Self {
        let reqs = &mut self.np().spec.template.spec.requirements;
        reqs.retain(|r| r.key != key);
        let mut r = NodeSelectorRequirementWithMinValues::new(key, op, values);
        r.min_values = Some(min);
        reqs.push(r);
        self
    }
    fn taints(mut self, taints: Vec<Taint>) -> Self {
        self.np().spec.template.spec.taints = Some(taints);
        self
    }
    fn startup_taints(mut self, taints: Vec<Taint>) -> Self {
        self.np().spec.template.spec.startup_taints = Some(taints);
        self
    }
    fn limits(mut self, pairs: &[(&str, &str)]) -> Self {
        self.np().spec.limits = Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), K8sQuantity(v.to_string())))
                .collect(),
        );
        self
    }
    fn weight(mut self, w: i32) -> Self {
        self.np().spec.weight = Some(w);
        self
    }
}

impl PoolExt for NodePool {
    fn np(&mut self) -> &mut NodePool {
        self
    }
}

pub fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: value.map(Into::into),
        effect: effect.into(),
        time_added: None,
    }
}

pub fn toleration(key: &str, op: &str, value: Option<&str>, effect: Option<&str>) -> Toleration {
    Toleration {
        key: Some(key.into()),
        operator: Some(op.into()),
        value: value.map(Into::into),
        effect: effect.map(Into::into),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Pods

/// A pending pod with no requests, as upstream's `UnschedulablePod()`.
pub fn pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

pub fn pods(prefix: &str, n: usize, edit: impl Fn(Pod) -> Pod) -> Vec<Pod> {
    (0..n)
        .map(|i| edit(pod(&format!("{prefix}-{i}"))))
        .collect()
}

pub fn node_req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

pub fn selector(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    })
}

/// Builder-style edits on a Pod.
pub trait PodExt: Sized {
    fn p(&mut self) -> &mut Pod;
    fn spec(&mut self) -> &mut PodSpec {
        self.p().spec.as_mut().unwrap()
    }
    fn requests(mut self, pairs: &[(&str, &str)]) -> Self {
        let c = &mut self.spec().containers[0];
        let r = c
            .resources
            .get_or_insert_with(ResourceRequirements::default);
        let req = r.requests.get_or_insert_with(BTreeMap::new);
        for (k, v) in pairs {
            req.insert(k.to_string(), K8sQuantity(v.to_string()));
        }
        self
    }
    fn limits(mut self, pairs: &[(&str, &str)]) -> Self {
        let c = &mut self.spec().containers[0];
        let r = c
            .resources
            .get_or_insert_with(ResourceRequirements::default);
        let lim = r.limits.get_or_insert_with(BTreeMap::new);
        for (k, v) in pairs {
            lim.insert(k.to_string(), K8sQuantity(v.to_string()));
        }
        self
    }
    fn init_requests(mut self, pairs: &[(&str, &str)]) -> Self {
        let c = Container {
            name: "init".into(),
            resources: Some(ResourceRequirements {
                requests: Some(
                    pairs
                        .iter()
                        .map(|(k, v)| (k.to_string(), K8sQuantity(v.to_string())))
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.spec()
            .init_containers
            .get_or_insert_with(Vec::new)
            .push(c);
        self
    }
    fn labels(mut self, pairs: &[(&str, &str)]) -> Self {
        let labels = self.p().metadata.labels.get_or_insert_with(BTreeMap::new);
        for (k, v) in pairs {
            labels.insert(k.to_string(), v.to_string());
        }
        self
    }
    fn node_selector(mut self, pairs: &[(&str, &str)]) -> Self {
        let ns = self.spec().node_selector.get_or_insert_with(BTreeMap::new);
        for (k, v) in pairs {
            ns.insert(k.to_string(), v.to_string());
        }
        self
    }
    fn node_affinity(&mut self) -> &mut NodeAffinity {
        let a = self.spec().affinity.get_or_insert_with(Affinity::default);
        a.node_affinity.get_or_insert_with(NodeAffinity::default)
    }
    /// Adds the requirements to the first required term (creating it). None add nothing, as
    /// upstream's pod builder makes no affinity for no requirements (an empty term would match
    /// no node).
    fn required(mut self, reqs: Vec<NodeSelectorRequirement>) -> Self {
        if reqs.is_empty() {
            return self;
        }
        let sel = self
            .node_affinity()
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(|| NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm::default()],
            });
        sel.node_selector_terms[0]
            .match_expressions
            .get_or_insert_with(Vec::new)
            .extend(reqs);
        self
    }
    /// Adds one more OR-ed required term.
    fn required_term(mut self, reqs: Vec<NodeSelectorRequirement>) -> Self {
        let sel = self
            .node_affinity()
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(|| NodeSelector {
                node_selector_terms: vec![],
            });
        sel.node_selector_terms.push(NodeSelectorTerm {
            match_expressions: Some(reqs),
            match_fields: None,
        });
        self
    }
    fn preferred(mut self, weight: i32, reqs: Vec<NodeSelectorRequirement>) -> Self {
        self.node_affinity()
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(PreferredSchedulingTerm {
                weight,
                preference: NodeSelectorTerm {
                    match_expressions: Some(reqs),
                    match_fields: None,
                },
            });
        self
    }
    fn tolerate(mut self, t: Toleration) -> Self {
        self.spec().tolerations.get_or_insert_with(Vec::new).push(t);
        self
    }
    fn host_port(mut self, port: i32) -> Self {
        self.spec().containers[0]
            .ports
            .get_or_insert_with(Vec::new)
            .push(ContainerPort {
                container_port: port,
                host_port: Some(port),
                protocol: Some("TCP".into()),
                ..Default::default()
            });
        self
    }
    fn spread(mut self, key: &str, max_skew: i32, hard: bool, sel: &[(&str, &str)]) -> Self {
        self.spec()
            .topology_spread_constraints
            .get_or_insert_with(Vec::new)
            .push(TopologySpreadConstraint {
                topology_key: key.into(),
                max_skew,
                when_unsatisfiable: if hard {
                    "DoNotSchedule"
                } else {
                    "ScheduleAnyway"
                }
                .into(),
                label_selector: selector(sel),
                ..Default::default()
            });
        self
    }
    fn spread_with(mut self, c: TopologySpreadConstraint) -> Self {
        self.spec()
            .topology_spread_constraints
            .get_or_insert_with(Vec::new)
            .push(c);
        self
    }
    fn pod_affinity(self, key: &str, sel: &[(&str, &str)]) -> Self {
        self.pod_affinity_term(term(key, sel))
    }
    /// A required pod affinity term written out in full (namespaces, namespaceSelector).
    fn pod_affinity_term(mut self, t: PodAffinityTerm) -> Self {
        let a = self.spec().affinity.get_or_insert_with(Affinity::default);
        a.pod_affinity
            .get_or_insert_with(PodAffinity::default)
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(t);
        self
    }
    fn pod_affinity_preferred(mut self, weight: i32, key: &str, sel: &[(&str, &str)]) -> Self {
        let a = self.spec().affinity.get_or_insert_with(Affinity::default);
        a.pod_affinity
            .get_or_insert_with(PodAffinity::default)
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(WeightedPodAffinityTerm {
                weight,
                pod_affinity_term: term(key, sel),
            });
        self
    }
    fn pod_anti_affinity(mut self, key: &str, sel: &[(&str, &str)]) -> Self {
        let a = self.spec().affinity.get_or_insert_with(Affinity::default);
        a.pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default)
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(term(key, sel));
        self
    }
    fn pod_anti_affinity_preferred(mut self, weight: i32, key: &str, sel: &[(&str, &str)]) -> Self {
        let a = self.spec().affinity.get_or_insert_with(Affinity::default);
        a.pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default)
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(WeightedPodAffinityTerm {
                weight,
                pod_affinity_term: term(key, sel),
            });
        self
    }
    fn namespace(mut self, ns: &str) -> Self {
        self.p().metadata.namespace = Some(ns.into());
        self
    }
    /// Controlled by `kind/name` (`ReplicaSet` and `StatefulSet` are apps/v1, `Job` batch/v1).
    fn owned_by(mut self, kind: &str, name: &str) -> Self {
        let api_version = match kind {
            "ReplicaSet" | "StatefulSet" => "apps/v1",
            "Job" => "batch/v1",
            _ => "v1",
        };
        self.p().metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: name.into(),
                uid: format!("{name}-uid"),
                controller: Some(true),
                ..Default::default()
            },
        ]);
        self
    }
    fn on_node(mut self, node: &str) -> Self {
        self.spec().node_name = Some(node.into());
        self
    }
}

impl PodExt for Pod {
    fn p(&mut self) -> &mut Pod {
        self
    }
}

pub fn term(key: &str, sel: &[(&str, &str)]) -> PodAffinityTerm {
    PodAffinityTerm {
        topology_key: key.into(),
        label_selector: selector(sel),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Provisioning

/// A cluster to provision into.
#[derive(Clone, Default)]
pub struct Env {
    pub pools: Vec<PoolInput>,
    pub nodes: Vec<ExistingNode>,
    pub bound: Vec<Pod>,
    pub daemonsets: Vec<Pod>,
    pub preference_policy: PreferencePolicy,
    pub min_values_policy: MinValuesPolicy,
    /// Claims, volumes and classes for volume topology (applied before the solve, as the
    /// provisioner does).
    pub volumes: VolumeCatalog,
    /// CSINode attach limits by node, then driver.
    pub csi_limits: CsiLimits,
    /// Namespace labels, for pod affinity namespaceSelectors.
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// Default topology spread constraints (`--scheduler-config`), none by default.
    pub default_constraints: Option<DefaultConstraints>,
    /// The Services' and controllers' selectors default constraints deduce from.
    pub workloads: Workloads,
}

impl Env {
    /// One pool on upstream's default catalog.
    pub fn new(np: NodePool) -> Env {
        Env::with_types(np, default_types())
    }
    pub fn with_types(np: NodePool, types: Vec<InstanceType>) -> Env {
        Env::default().pool(np, types)
    }
    pub fn pool(mut self, np: NodePool, types: Vec<InstanceType>) -> Env {
        self.pools.push(PoolInput {
            nodepool: np,
            instance_types: types,
            usage: Resources::new(),
        });
        self
    }
    pub fn daemonset(mut self, p: Pod) -> Env {
        self.daemonsets.push(p);
        self
    }
    pub fn node(mut self, n: ExistingNode) -> Env {
        self.nodes.push(n);
        self
    }
    pub fn bound(mut self, p: Pod) -> Env {
        self.bound.push(p);
        self
    }
    pub fn snapshot(&self, pods: &[Pod]) -> Snapshot {
        Snapshot {
            pods: pods.to_vec(),
            bound_pods: self
                .bound
                .iter()
                .cloned()
                .map(std::sync::Arc::new)
                .collect(),
            nodes: self.nodes.clone(),
            nodepools: self.pools.clone(),
            daemonsets: self.daemonsets.clone(),
            preference_policy: self.preference_policy,
            min_values_policy: self.min_values_policy,
            namespaces: self.namespaces.clone(),
            default_spread: self
                .default_constraints
                .clone()
                .map(|constraints| DefaultSpread {
                    constraints,
                    workloads: std::sync::Arc::new(self.workloads.clone()),
                }),
            // `provision` prepares it, as the provisioner does.
            volume_topology: Default::default(),
            nominated: Default::default(),
            moved: Default::default(),
            under_consolidate_after: Default::default(),
            displaced: Default::default(),
            about_to_bind: Default::default(),
            quotas: Default::default(),
        }
    }
    /// Configure default topology spread constraints, through the `--scheduler-config`
    /// document they would be given in.
    pub fn default_constraints(mut self, constraints: &[TopologySpreadConstraint]) -> Env {
        let doc = serde_json::json!({"podTopologySpread": {"defaultConstraints": constraints}});
        self.default_constraints =
            DefaultConstraints::parse(&doc.to_string()).expect("a valid scheduler config");
        self
    }
    /// A ReplicaSet in `default` selecting `labels` (upstream's `test.ReplicaSet`).
    pub fn replica_set(mut self, name: &str, labels: &[(&str, &str)]) -> Env {
        self.workloads.put_owner(
            WorkloadKey {
                kind: "ReplicaSet",
                namespace: "default".into(),
                name: name.into(),
            },
            OwnerSelector::from_label_selector(selector(labels).as_ref()),
        );
        self
    }
    /// A Service in `default` selecting `labels`.
    pub fn service(mut self, name: &str, labels: &[(&str, &str)]) -> Env {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.workloads.put_service("default", name, Some(&labels));
        self
    }
    pub fn provision(&self, pods: &[Pod]) -> Outcome {
        let mut snapshot = self.snapshot(pods);
        let (volumes, volume_failures) = prepare(&mut snapshot, &self.volumes, &self.csi_limits);
        let mut results = solve_with_volumes(&snapshot, &volumes);
        results.failures.extend(volume_failures);
        Outcome::new(self, results)
    }

    /// Provision, then make the launched nodes existing nodes and the placed pods bound pods,
    /// as the cluster looks once the nodes registered (upstream's successive
    /// `ExpectProvisioned` calls).
    pub fn provision_and_bind(&mut self, pods: &[Pod]) -> Outcome {
        self.provision_and_register(pods, true)
    }

    /// Provision, then make the launched nodes existing nodes without binding the pods to them
    /// (upstream's `ExpectProvisionedNoBinding`): the pods stay pending, and the nodes are
    /// registered with nothing on them yet.
    pub fn provision_no_binding(&mut self, pods: &[Pod]) -> Outcome {
        self.provision_and_register(pods, false)
    }

    fn provision_and_register(&mut self, pods: &[Pod], bind: bool) -> Outcome {
        let out = self.provision(pods);
        let mut names = BTreeMap::new();
        for n in &out.nodes {
            let name = format!("node-{}", self.nodes.len());
            names.insert(n.name.clone(), name.clone());
            let pool = self
                .pools
                .iter()
                .find(|p| p.nodepool.metadata.name.as_deref() == Some(n.claim.nodepool.as_str()))
                .expect("pool");
            let it = pool
                .instance_types
                .iter()
                .find(|t| t.name == n.instance_type)
                .expect("instance type");
            let mut labels = n.labels.clone();
            labels.insert("kubernetes.io/hostname".into(), name.clone());
            let capacity = it.capacity.clone();
            self.nodes.push(ExistingNode {
                name,
                labels,
                taints: pool
                    .nodepool
                    .spec
                    .template
                    .spec
                    .taints
                    .clone()
                    .unwrap_or_default(),
                allocatable: it.allocatable(),
                // Bound: its pods and its DaemonSets' pods run there (the claim's requests);
                // not bound: nothing runs there yet.
                requested: if bind {
                    n.claim.requests.clone()
                } else {
                    Resources::new()
                },
                daemon_requested: if bind {
                    daemon_part(&n.claim.requests, pods, &n.pods)
                } else {
                    Resources::new()
                },
                in_flight: false,
                nodepool: Some(n.claim.nodepool.clone()),
            });
            // The pool's usage grows by the node's capacity and one node, as the cluster state
            // reports it for limits.
            if let Some(pool) = self
                .pools
                .iter_mut()
                .find(|p| p.nodepool.metadata.name.as_deref() == Some(n.claim.nodepool.as_str()))
            {
                pool.usage
                    .add_assign(&capacity.with("nodes", Quantity::from_units(1)));
            }
        }
        for p in pods.iter().filter(|_| bind) {
            let name = p.metadata.name.clone().unwrap_or_default();
            let node = out
                .node_of(&name)
                .map(|n| names[&n.name].clone())
                .or_else(|| out.existing_of(&name).map(str::to_string));
            if let Some(node) = node {
                if out.existing_of(&name).is_some() {
                    // Count its requests on the existing node it joined.
                    let requests =
                        karpenter_capi::scheduling::pod::pod_requests(p.spec.as_ref().unwrap())
                            .unwrap()
                            .with("pods", Quantity::from_units(1));
                    if let Some(n) = self.nodes.iter_mut().find(|n| n.name == node) {
                        n.requested.add_assign(&requests);
                    }
                }
                self.bound.push(p.clone().on_node(&node));
            }
        }
        out
    }

    /// Sorted counts of bound pods labelled `test=test` per value of `key` on their nodes
    /// (upstream's `ExpectSkew`).
    pub fn skew(&self, key: &str) -> Vec<usize> {
        self.skew_of(key, &[("test", "test")])
    }

    /// [`Env::skew`] of the bound pods carrying all of `labels`.
    pub fn skew_of(&self, key: &str, labels: &[(&str, &str)]) -> Vec<usize> {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for p in &self.bound {
            let matches = p.metadata.labels.as_ref().is_some_and(|l| {
                labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            });
            let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
            let value = node
                .and_then(|n| self.nodes.iter().find(|x| x.name == n))
                .and_then(|n| n.labels.get(key));
            if let (true, Some(v)) = (matches, value) {
                *counts.entry(v.clone()).or_insert(0) += 1;
            }
        }
        let mut v: Vec<usize> = counts.into_values().collect();
        v.sort();
        v
    }
}

/// The DaemonSet pods' part of a claim's requests: what its own pods (`on`, by key, from
/// `pods`) do not request.
fn daemon_part(requests: &Resources, pods: &[Pod], on: &[String]) -> Resources {
    let mut left = requests.clone();
    for p in pods.iter().filter(|p| {
        let key = pod_key(p.metadata.name.as_deref().unwrap_or_default());
        on.contains(&key)
    }) {
        let r = karpenter_capi::scheduling::pod::pod_requests(p.spec.as_ref().unwrap())
            .unwrap()
            .with("pods", Quantity::from_units(1));
        left = left.sub(&r);
    }
    left
}

/// A launched node: the claim and the labels the node will carry.
#[derive(Clone, Debug)]
pub struct Launched {
    pub name: String,
    pub claim: NewClaim,
    pub instance_type: String,
    pub labels: BTreeMap<String, String>,
    pub pods: Vec<String>,
}

impl Launched {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

pub struct Outcome {
    pub results: Results,
    pub nodes: Vec<Launched>,
}

/// `namespace/name` of a pod named in an assertion (namespace default unless given).
fn pod_key(pod: &str) -> String {
    if pod.contains('/') {
        pod.to_string()
    } else {
        format!("default/{pod}")
    }
}

impl Outcome {
    fn new(env: &Env, results: Results) -> Outcome {
        let nodes = results
            .new_claims
            .iter()
            .enumerate()
            .map(|(i, c)| launch(env, c, i))
            .collect();
        Outcome { results, nodes }
    }

    /// The launched node a pod went to, if a new one (`name` in namespace default, or
    /// `namespace/name`).
    pub fn node_of(&self, pod: &str) -> Option<&Launched> {
        let key = pod_key(pod);
        self.nodes.iter().find(|n| n.pods.contains(&key))
    }

    /// Panics unless the pod got a new node.
    pub fn scheduled(&self, pod: &str) -> &Launched {
        self.node_of(pod).unwrap_or_else(|| {
            panic!(
                "{pod} not scheduled: failures {:?}, existing {:?}",
                self.results.failures, self.results.placed_on_existing
            )
        })
    }

    /// The existing node a pod went to.
    pub fn existing_of(&self, pod: &str) -> Option<&str> {
        let key = pod_key(pod);
        self.results
            .placed_on_existing
            .iter()
            .find(|(p, _)| *p == key)
            .map(|(_, n)| n.as_str())
    }

    pub fn is_scheduled(&self, pod: &str) -> bool {
        self.node_of(pod).is_some() || self.existing_of(pod).is_some()
    }

    /// Panics if the pod got any node.
    pub fn not_scheduled(&self, pod: &str) {
        assert!(
            !self.is_scheduled(pod),
            "{pod} should not be scheduled: {:#?}",
            self.nodes
        );
    }

    /// Node name (new or existing) per pod.
    pub fn placement(&self, pod: &str) -> Option<String> {
        self.node_of(pod)
            .map(|n| n.name.clone())
            .or_else(|| self.existing_of(pod).map(str::to_string))
    }
}

/// The node a claim becomes: its cheapest instance type and that type's cheapest offering the
/// claim allows; labels are the NodeClaim's labels plus the offering's.
fn launch(env: &Env, claim: &NewClaim, i: usize) -> Launched {
    let pool = env
        .pools
        .iter()
        .find(|p| p.nodepool.metadata.name.as_deref() == Some(claim.nodepool.as_str()))
        .expect("claim from a known pool");
    let nc = nodeclaim_for(claim, &pool.nodepool);
    let mut labels = nc.metadata.labels.clone().unwrap_or_default();
    let name = format!("{}-{i}", claim.nodepool);
    let mut instance_type = String::new();
    for t in claim.instance_types.iter() {
        let Some(it) = pool.instance_types.iter().find(|it| &it.name == t) else {
            continue;
        };
        if let Some(o) = it.cheapest(&claim.requirements) {
            labels.extend(o.labels.clone());
            instance_type = it.name.clone();
            break;
        }
    }
    labels.insert("kubernetes.io/hostname".into(), name.clone());
    Launched {
        name,
        claim: claim.clone(),
        instance_type,
        labels,
        pods: claim.pods.clone(),
    }
}

pub fn daemon(name: &str, requests: &[(&str, &str)]) -> Pod {
    pod(name).requests(requests)
}
