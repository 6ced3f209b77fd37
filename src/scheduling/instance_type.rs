//! What the scheduler packs onto: instance types and their offerings. The catalog builds them
//! from MachineDeployments (`capi::offerings`); the scheduler only reads them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;

use crate::api::requirements::Requirements;
use crate::api::resources::Resources;

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
}

impl InstanceType {
    pub fn allocatable(&self) -> Resources {
        self.capacity.sub(&self.overhead)
    }

    /// The cheapest available offering that `reqs` allow, if any.
    pub fn cheapest(&self, reqs: &Requirements) -> Option<&Offering> {
        self.offerings
            .iter()
            .filter(|o| o.available && offering_allowed(o, reqs))
            .min_by(|a, b| a.price.total_cmp(&b.price))
    }
}

/// True when an offering's labels satisfy `reqs` on the keys the offering defines (a key the
/// offering does not define is for the node template to set, as in Karpenter).
pub fn offering_allowed(o: &Offering, reqs: &Requirements) -> bool {
    Requirements::from_labels(&o.labels)
        .compatible(reqs)
        .is_ok()
}
