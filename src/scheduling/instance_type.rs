//! What the scheduler packs onto: instance types and their offerings. The catalog builds them
//! from MachineDeployments (`capi::offerings`); the scheduler only reads them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;

use crate::api::requirements::Requirements;
use crate::api::resources::{Quantity, Resources};
use crate::api::wellknown::{RESOURCE_MEMORY, WELL_KNOWN_LABELS};

/// One place a node of an instance type can come from: one MachineDeployment.
#[derive(Clone, Debug, PartialEq)]
pub struct Offering {
    /// `namespace/name` of the MachineDeployment.
    pub machine_deployment: String,
    pub zone: Option<String>,
    /// `on-demand`, `spot` or `reserved`.
    pub capacity_type: String,
    /// Price per hour, from the price annotation (0 when not annotated).
    pub price: f64,
    /// Below max-size and not recently failed.
    pub available: bool,
    /// Every label a node from this offering will carry (well-known ones included).
    pub labels: BTreeMap<String, String>,
    /// Taints a node from this offering will carry (from the taints annotation).
    pub taints: Vec<Taint>,
    pub replicas: i32,
    pub max_size: Option<i32>,
}

/// A node shape. MachineDeployments that share an instance-type label are one instance type
/// with one offering each.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceType {
    pub name: String,
    /// The labels every offering shares (instance type, arch, os, ...) plus zone and capacity
    /// type as `In [values of the offerings]`.
    pub requirements: Requirements,
    pub capacity: Resources,
    /// Reserved for system daemons (kube-reserved, system-reserved, eviction threshold).
    pub overhead: Resources,
    pub offerings: Vec<Offering>,
    /// CSI attach limits a node of this type declares, by driver (the smallest any offering
    /// states): how many volumes of that driver a new claim of this type may take.
    pub csi_limits: BTreeMap<String, usize>,
}

impl InstanceType {
    /// What pods may request on a node of this type: capacity less overhead, and less the
    /// memory pre-allocated as huge pages (the kubelet takes `hugepages-*` out of allocatable
    /// memory, and Karpenter's `computeAllocatable` does the same), never below zero.
    pub fn allocatable(&self) -> Resources {
        let mut allocatable = self.capacity.sub(&self.overhead);
        let huge_pages = self
            .capacity
            .iter()
            .filter(|(k, _)| k.starts_with(HUGE_PAGES_PREFIX))
            .fold(Quantity::ZERO, |sum, (_, q)| sum.saturating_add(*q));
        if !huge_pages.is_zero() {
            let memory = allocatable.get(RESOURCE_MEMORY).saturating_sub(huge_pages);
            allocatable.set(RESOURCE_MEMORY, memory.max(Quantity::ZERO));
        }
        allocatable
    }

    /// Whether some node of this type carries `key`: the type's requirements or one of its
    /// offerings' labels name it.
    pub(crate) fn carries(&self, key: &str) -> bool {
        self.requirements.has(key) || self.offerings.iter().any(|o| o.labels.contains_key(key))
    }

    /// The cheapest available offering that `reqs` allow, if any.
    pub fn cheapest(&self, reqs: &Requirements) -> Option<&Offering> {
        self.offerings
            .iter()
            .filter(|o| o.available && offering_allowed(o, reqs))
            .min_by(|a, b| a.price.total_cmp(&b.price))
    }

    /// Upstream's worst-case launch price: of the available offerings `reqs` allow, those of the
    /// capacity type a launch would use (reserved, then spot, then on-demand), the most
    /// expensive. None when no offering is allowed.
    pub(crate) fn worst_launch_price(&self, reqs: &Requirements) -> Option<f64> {
        use crate::api::wellknown::{
            CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_RESERVED, CAPACITY_TYPE_SPOT,
        };
        [
            CAPACITY_TYPE_RESERVED,
            CAPACITY_TYPE_SPOT,
            CAPACITY_TYPE_ON_DEMAND,
        ]
        .iter()
        .find_map(|ct| {
            self.offerings
                .iter()
                .filter(|o| o.available && o.capacity_type == *ct && offering_allowed(o, reqs))
                .map(|o| o.price)
                .max_by(f64::total_cmp)
        })
    }
}

/// The first label `reqs` needs on the node (any operator but NotIn and DoesNotExist) that a
/// node will not carry: not `carried` by its offering or type, not set by its NodePool
/// (`pool_reqs`: template requirements and labels, which become NodeClaim labels) and not well
/// known. A MachineDeployment's nodes carry only the labels it gives them, so such a key is
/// absent there; upstream's instance types say the same with `DoesNotExist` on the provider
/// labels they lack.
pub(crate) fn absent_label<'r>(
    reqs: &'r Requirements,
    pool_reqs: &Requirements,
    carried: impl Fn(&str) -> bool,
) -> Option<&'r str> {
    reqs.iter()
        .find(|r| {
            !r.allows_absent()
                && !pool_reqs.has(r.key())
                && !WELL_KNOWN_LABELS.contains(&r.key())
                && !carried(r.key())
        })
        .map(|r| r.key())
}

/// True when an offering's labels satisfy `reqs` on the keys the offering defines (a key the
/// offering does not define is for the node template to set, as in Karpenter).
pub(crate) fn offering_allowed(o: &Offering, reqs: &Requirements) -> bool {
    let mut own = Requirements::from_labels(&o.labels);
    // An offering in no zone makes nodes with no zone label: a claim that requires a zone is
    // not for it (as `capi::offerings` says of a type none of whose offerings has a zone).
    if !o.labels.contains_key(crate::api::wellknown::ZONE_LABEL) {
        own.add(crate::api::requirements::Requirement::does_not_exist(
            crate::api::wellknown::ZONE_LABEL,
        ));
    }
    own.compatible(reqs).is_ok()
}

/// How many distinct values of `key` these instance types offer within `reqs`: what a
/// `minValues` on `key` counts (the launch's check, and consolidation's after its price filter).
pub(crate) fn distinct_values(types: &[&InstanceType], reqs: &Requirements, key: &str) -> usize {
    let allowed = reqs.get(key);
    let mut values: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for t in types {
        if key == crate::api::wellknown::INSTANCE_TYPE_LABEL {
            values.insert(&t.name);
        } else if let Some(vs) = t.requirements.values(key) {
            values.extend(
                vs.iter()
                    .filter(|v| allowed.is_none_or(|r| r.has(v)))
                    .map(String::as_str),
            );
        }
    }
    values.len()
}

/// True when every taint a node from this offering carries (the MachineDeployment's taints
/// annotation) is one the NodePool declares in `taints` or `startupTaints`. Cluster API puts
/// those taints on the node whatever we ask, so only a pool that declares them (and whose pods
/// therefore tolerate them) may use the offering; otherwise pods would wait on a node they
/// cannot run on.
pub(crate) fn taints_declared(o: &Offering, declared: &[Taint]) -> bool {
    o.taints.iter().all(|t| {
        declared
            .iter()
            .any(|d| d.key == t.key && d.effect == t.effect && d.value == t.value)
    })
}

/// The instance types a pool may use: offerings whose taints the pool declares (types left with
/// no offering are dropped).
pub(crate) fn for_declared_taints(
    types: Vec<InstanceType>,
    declared: &[Taint],
) -> Vec<InstanceType> {
    types
        .into_iter()
        .filter_map(|mut t| {
            t.offerings.retain(|o| taints_declared(o, declared));
            (!t.offerings.is_empty()).then_some(t)
        })
        .collect()
}

/// Resource names of pre-allocated huge pages (`hugepages-2Mi`, `hugepages-1Gi`).
const HUGE_PAGES_PREFIX: &str = "hugepages-";

#[cfg(test)]
mod tests {
    use super::*;

    /// Karpenter's own two cases: huge pages come out of allocatable memory, down to zero.
    #[test]
    fn huge_pages_come_out_of_allocatable_memory() {
        let q = |s: &str| {
            Quantity::from_k8s(&k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                s.into(),
            ))
            .expect("a quantity")
        };
        let mut t = crate::testing::instance_type("huge", 5, 20).build();
        t.capacity.set("hugepages-2Mi", q("5Gi"));
        t.capacity.set("hugepages-1Gi", q("10Gi"));
        t.overhead = Resources::new()
            .with("cpu", q("125m"))
            .with(RESOURCE_MEMORY, q("1Gi"));
        let a = t.allocatable();
        assert_eq!(a.get(RESOURCE_MEMORY), q("4Gi"));
        assert_eq!(a.get("cpu"), q("4875m"));
        assert_eq!(
            a.get("hugepages-1Gi"),
            q("10Gi"),
            "huge pages stay requestable"
        );
        t.capacity.set("hugepages-2Mi", q("50Gi"));
        assert_eq!(t.allocatable().get(RESOURCE_MEMORY), Quantity::ZERO);
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn offering(md: &str, taints: Vec<Taint>) -> Offering {
        Offering {
            machine_deployment: md.into(),
            zone: None,
            capacity_type: "on-demand".into(),
            price: 1.0,
            available: true,
            labels: BTreeMap::new(),
            taints,
            replicas: 0,
            max_size: None,
        }
    }

    #[test]
    fn tainted_offerings_need_a_pool_that_declares_the_taint() {
        let gpu = taint("dedicated", Some("gpu"), "NoSchedule");
        let types = vec![
            InstanceType {
                name: "gpu".into(),
                requirements: Requirements::default(),
                capacity: Resources::default(),
                overhead: Resources::default(),
                offerings: vec![offering("ns/gpu", vec![gpu.clone()])],
                csi_limits: BTreeMap::new(),
            },
            InstanceType {
                name: "mixed".into(),
                requirements: Requirements::default(),
                capacity: Resources::default(),
                overhead: Resources::default(),
                offerings: vec![
                    offering("ns/plain", vec![]),
                    offering("ns/tainted", vec![gpu.clone()]),
                ],
                csi_limits: BTreeMap::new(),
            },
        ];
        let plain_pool = for_declared_taints(types.clone(), &[]);
        assert_eq!(plain_pool.len(), 1, "the gpu-only type is gone");
        assert_eq!(plain_pool[0].offerings.len(), 1);
        assert_eq!(plain_pool[0].offerings[0].machine_deployment, "ns/plain");
        let gpu_pool = for_declared_taints(types, &[gpu]);
        assert_eq!(gpu_pool.iter().map(|t| t.offerings.len()).sum::<usize>(), 3);
        // Value and effect must match too.
        let other = taint("dedicated", Some("cpu"), "NoSchedule");
        assert!(!taints_declared(
            &offering("x", vec![taint("dedicated", Some("gpu"), "NoSchedule")]),
            &[other]
        ));
    }

    /// An offering in no zone is not for a claim that requires one, even where other offerings
    /// of its instance type are in zones (the type then requires `zone In [...]`).
    #[test]
    fn a_zone_less_offering_is_not_allowed_for_a_zone() {
        use crate::api::wellknown::ZONE_LABEL;
        let zone_less = offering("ns/b", Vec::new());
        let mut zoned = offering("ns/a", Vec::new());
        zoned.labels.insert(ZONE_LABEL.into(), "z1".into());
        let in_z1 = Requirements::from_labels(&BTreeMap::from([(
            ZONE_LABEL.to_string(),
            "z1".to_string(),
        )]));
        assert!(offering_allowed(&zoned, &in_z1));
        assert!(!offering_allowed(&zone_less, &in_z1));
        assert!(offering_allowed(&zone_less, &Requirements::default()));
    }
}
