//! Builders for what unit tests, integration tests and benches construct over and over
//! (NodePools, pods, instance types), so a change to one of these types is made once.
//!
//! Compiled for the crate's own unit tests and, through the `testing` feature, for `tests/` and
//! `benches/` (the crate dev-depends on itself with that feature); never in the controller.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, Node, Pod, PodAffinity, PodAffinityTerm, PodAntiAffinity, PodSpec,
    ResourceRequirements, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ObjectMeta;

use crate::api::nodeclaim::NodeClassReference;
use crate::api::nodepool::{ConsolidationPolicy, DisruptionReason};
use crate::api::nodepool::{NodeClaimTemplate, NodeClaimTemplateSpec, NodePool, NodePoolSpec};
use crate::api::requirements::{Requirement, Requirements};
use crate::api::resources::{Quantity, Resources};
use crate::api::wellknown::{CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, ZONE_LABEL};
use crate::disruption::{Allowed, Candidate};
use crate::scheduling::{InstanceType, Offering, PoolInput};

/// A NodeOverlay named `name` with `spec` as a user writes it.
pub fn node_overlay(name: &str, spec: serde_json::Value) -> crate::api::NodeOverlay {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.sh/v1alpha1",
        "kind": "NodeOverlay",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a NodeOverlay")
}

/// The zones instance types are offered in unless a test says otherwise.
pub const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

/// Merges `b` into `a`, objects key by key, anything else replaced (a JSON merge patch without
/// deletions).
pub fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// A resource list from `(name, quantity)` pairs; panics on a malformed quantity, which in a test
/// is a typo in the test.
pub fn resources(pairs: &[(&str, &str)]) -> Resources {
    pairs
        .iter()
        .map(|(k, v)| {
            let q: Quantity = v
                .parse()
                .unwrap_or_else(|e| panic!("quantity {k}={v}: {e}"));
            (k.to_string(), q)
        })
        .collect()
}

/// A NodePool named `name` (uid `uid-<name>`) whose template points at the default
/// `ClusterAPINodeClass`, with nothing else set; tests change the fields they exercise.
pub fn nodepool(name: &str) -> NodePool {
    NodePool {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
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

/// A NodePool with its instance types and no usage, as the solver takes it.
pub fn pool(nodepool: NodePool, instance_types: Vec<InstanceType>) -> PoolInput {
    PoolInput {
        nodepool,
        instance_types,
        usage: Resources::new(),
    }
}

/// Starts an instance type of `cpu` CPUs, `memory_gib` GiB and 110 pods, offered on-demand in
/// [`ZONES`] at `0.1 × (cpu + GiB)` an hour (spot at half that).
pub fn instance_type(name: &str, cpu: i64, memory_gib: i64) -> InstanceTypeBuilder {
    InstanceTypeBuilder {
        name: name.to_string(),
        cpu,
        memory_gib,
        pods: 110,
        overhead: Resources::new(),
        zones: ZONES.iter().map(|z| z.to_string()).collect(),
        capacity_types: vec!["on-demand".to_string()],
        offerings: None,
        price: 0.1 * (cpu + memory_gib) as f64,
        spot_factor: 0.5,
        namespace: "ns".to_string(),
    }
}

/// An instance type under construction; see [`instance_type`].
#[derive(Clone, Debug)]
pub struct InstanceTypeBuilder {
    name: String,
    cpu: i64,
    memory_gib: i64,
    pods: i64,
    overhead: Resources,
    zones: Vec<String>,
    capacity_types: Vec<String>,
    /// Explicit (zone, capacity type) pairs, instead of every zone with every capacity type.
    offerings: Option<Vec<(String, String)>>,
    price: f64,
    spot_factor: f64,
    namespace: String,
}

impl InstanceTypeBuilder {
    /// Offered in these zones (with every capacity type).
    pub fn zones(mut self, zones: &[&str]) -> Self {
        self.zones = zones.iter().map(|z| z.to_string()).collect();
        self
    }

    /// Offered as these capacity types (in every zone).
    pub fn capacity_types(mut self, capacity_types: &[&str]) -> Self {
        self.capacity_types = capacity_types.iter().map(|c| c.to_string()).collect();
        self
    }

    /// Exactly these (zone, capacity type) offerings.
    pub fn offerings(mut self, pairs: &[(&str, &str)]) -> Self {
        self.offerings = Some(
            pairs
                .iter()
                .map(|(z, c)| (z.to_string(), c.to_string()))
                .collect(),
        );
        self
    }

    /// The on-demand price an hour.
    pub fn price(mut self, price: f64) -> Self {
        self.price = price;
        self
    }

    /// Spot's price as a fraction of on-demand's.
    pub fn spot_factor(mut self, factor: f64) -> Self {
        self.spot_factor = factor;
        self
    }

    pub fn pods(mut self, pods: i64) -> Self {
        self.pods = pods;
        self
    }

    pub fn overhead(mut self, overhead: Resources) -> Self {
        self.overhead = overhead;
        self
    }

    /// The namespace of the MachineDeployments behind the offerings (named
    /// `<type>-<zone>-<capacity type>`).
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.to_string();
        self
    }

    pub fn build(self) -> InstanceType {
        let pairs: Vec<(String, String)> = self.offerings.clone().unwrap_or_else(|| {
            self.zones
                .iter()
                .flat_map(|z| self.capacity_types.iter().map(|c| (z.clone(), c.clone())))
                .collect()
        });
        let offerings = pairs
            .iter()
            .map(|(zone, ct)| Offering {
                machine_deployment: format!("{}/{}-{zone}-{ct}", self.namespace, self.name),
                zone: Some(zone.clone()),
                capacity_type: ct.clone(),
                price: if ct == "spot" {
                    self.price * self.spot_factor
                } else {
                    self.price
                },
                available: true,
                labels: BTreeMap::from([
                    (ZONE_LABEL.to_string(), zone.clone()),
                    (CAPACITY_TYPE_LABEL.to_string(), ct.clone()),
                    (INSTANCE_TYPE_LABEL.to_string(), self.name.clone()),
                ]),
                taints: vec![],
                replicas: 0,
                max_size: None,
            })
            .collect();
        let mut requirements = Requirements::new();
        requirements.add(Requirement::is_in(
            INSTANCE_TYPE_LABEL,
            &[self.name.as_str()],
        ));
        requirements.add(Requirement::is_in(ZONE_LABEL, &distinct(&pairs, |p| &p.0)));
        requirements.add(Requirement::is_in(
            CAPACITY_TYPE_LABEL,
            &distinct(&pairs, |p| &p.1),
        ));
        InstanceType {
            requirements,
            capacity: Resources::new()
                .with("cpu", Quantity::from_units(self.cpu))
                .with("memory", Quantity::from_bytes(self.memory_gib << 30))
                .with("pods", Quantity::from_units(self.pods)),
            overhead: self.overhead,
            offerings,
            name: self.name,
            csi_limits: Default::default(),
        }
    }
}

/// The values `key` picks from `pairs`, each once, in order of first appearance.
fn distinct<'a>(
    pairs: &'a [(String, String)],
    key: impl Fn(&'a (String, String)) -> &'a String,
) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for p in pairs {
        let v = key(p).as_str();
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// Starts a pod `name` in namespace `default`, with one container and nothing requested.
pub fn pod(name: &str) -> PodBuilder {
    PodBuilder {
        name: name.to_string(),
        namespace: "default".to_string(),
        labels: BTreeMap::new(),
        requests: BTreeMap::new(),
        node: None,
    }
}

/// A pod under construction; see [`pod`].
#[derive(Clone, Debug)]
pub struct PodBuilder {
    name: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    requests: BTreeMap<String, String>,
    node: Option<String>,
}

impl PodBuilder {
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.to_string();
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    /// Requests this much CPU and memory (Kubernetes quantities: `500m`, `1Gi`).
    pub fn requests(mut self, cpu: &str, memory: &str) -> Self {
        self.requests.insert("cpu".to_string(), cpu.to_string());
        self.requests
            .insert("memory".to_string(), memory.to_string());
        self
    }

    /// Bound to this node.
    pub fn node(mut self, node: &str) -> Self {
        self.node = Some(node.to_string());
        self
    }

    pub fn build(self) -> Pod {
        let requests: BTreeMap<String, K8sQuantity> = self
            .requests
            .into_iter()
            .map(|(k, v)| (k, K8sQuantity(v)))
            .collect();
        Pod {
            metadata: ObjectMeta {
                name: Some(self.name),
                namespace: Some(self.namespace),
                labels: (!self.labels.is_empty()).then_some(self.labels),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: self.node,
                containers: vec![Container {
                    name: "c".into(),
                    resources: (!requests.is_empty()).then(|| ResourceRequirements {
                        requests: Some(requests),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }
}

/// Selects the pods labelled `app: <app>`.
pub fn app_selector(app: &str) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
        ..Default::default()
    })
}

/// A hard topology spread (skew 1) of the pods labelled `app: <app>` over `key`.
pub fn spread(key: &str, app: &str) -> TopologySpreadConstraint {
    TopologySpreadConstraint {
        max_skew: 1,
        topology_key: key.into(),
        when_unsatisfiable: "DoNotSchedule".into(),
        label_selector: app_selector(app),
        ..Default::default()
    }
}

/// Required pod affinity to the pods labelled `app: <app>` over `key`.
pub fn affinity(key: &str, app: &str) -> Affinity {
    Affinity {
        pod_affinity: Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![term(key, app)]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Required pod anti-affinity to the pods labelled `app: <app>` over `key`.
pub fn anti_affinity(key: &str, app: &str) -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![term(key, app)]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn term(key: &str, app: &str) -> PodAffinityTerm {
    PodAffinityTerm {
        label_selector: app_selector(app),
        topology_key: key.into(),
        ..Default::default()
    }
}

/// A consolidation candidate of pool `default` (claim `claim-<node>`), consolidatable, whose pods
/// cost one each to disrupt.
pub fn candidate(
    node: &str,
    instance_type: &str,
    capacity_type: &str,
    price: f64,
    pods: Vec<String>,
) -> Candidate {
    Candidate {
        claim: format!("claim-{node}"),
        node: node.into(),
        nodepool: "default".into(),
        price,
        capacity_type: capacity_type.into(),
        disruption_cost: pods.len() as f64,
        reschedule_cost: 1.0 + pods.len() as f64,
        instance_type: instance_type.into(),
        // As `instance_type(..).zones(&["z"])` names its offerings' MachineDeployments.
        machine_deployment: format!("ns/{instance_type}-z-{capacity_type}"),
        pods: pods.into_iter().map(std::sync::Arc::from).collect(),
        drift: None,
        drifted_since: None,
        consolidatable: true,
        policy: ConsolidationPolicy::WhenEmptyOrUnderutilized,
        static_pool: false,
        repair: None,
        hold: None,
        pool_cost: 0.0,
        pool_disruption: 0.0,
    }
}

/// A budget of `nodes` for emptiness, drift, consolidation and repair in pool `default`.
pub fn allowed(nodes: usize) -> Allowed {
    let mut allowed = Allowed::default();
    for reason in [
        DisruptionReason::Empty,
        DisruptionReason::Drifted,
        DisruptionReason::Underutilized,
        DisruptionReason::Unhealthy,
    ] {
        allowed.budgets.insert(("default".into(), reason), nodes);
    }
    allowed
}

/// A pod's JSON decoded as the pod watch decodes it (`state::pods::WatchedPod`) and trimmed as
/// the index keeps it, for the decode bench.
pub fn watched_pod(json: &[u8]) -> serde_json::Result<Pod> {
    let mut p = serde_json::from_slice::<crate::state::pods::WatchedPod>(json)?.into_inner();
    crate::state::trim::pod(&mut p);
    Ok(p)
}

/// The same JSON decoded as a whole k8s-openapi `Pod`, then trimmed: what the watch did before
/// it skipped fields while parsing.
pub fn whole_pod(json: &[u8]) -> serde_json::Result<Pod> {
    let mut p = serde_json::from_slice::<Pod>(json)?;
    crate::state::trim::pod(&mut p);
    Ok(p)
}

/// A Node's JSON decoded as the Node watch decodes it (`state::nodes::WatchedNode`) and
/// trimmed as the index keeps it (no condition but `Ready`), for the decode bench.
pub fn watched_node(json: &[u8]) -> serde_json::Result<Node> {
    let mut n = serde_json::from_slice::<crate::state::nodes::WatchedNode>(json)?.into_inner();
    crate::state::trim::node_keeping(&mut n, &[]);
    Ok(n)
}

/// The same JSON decoded as a whole k8s-openapi `Node`, then trimmed: what the watch did before
/// it skipped fields while parsing.
pub fn whole_node(json: &[u8]) -> serde_json::Result<Node> {
    let mut n = serde_json::from_slice::<Node>(json)?;
    crate::state::trim::node_keeping(&mut n, &[]);
    Ok(n)
}

/// The controller's pod index (`state::pods::Pods`), for benches that time a pod change.
#[derive(Default)]
pub struct PodIndex(crate::state::pods::Pods);

impl PodIndex {
    /// Index one watched (and trimmed) pod, as the pod watch's feed does on each event.
    pub fn apply(&mut self, p: Pod) -> bool {
        self.0.apply(p)
    }
}
