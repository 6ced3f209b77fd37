//! Pure bin-packing: pods x NodePools x instance types -> new NodeClaims (no I/O).
//!
//! [`solve`] takes a [`Snapshot`] of the pending pods, the pods already bound, the existing and
//! in-flight nodes and the NodePools with their instance types, and decides in Karpenter's
//! order: existing nodes with room first (initialized ones before in-flight ones, then by
//! name), then claims opened earlier in the same solve (fewest pods first), then a new claim
//! from each NodePool by weight. [`nodeclaim_for`] turns a decided claim into the
//! NodeClaim object to create.
//!
//! Offering taints (a MachineDeployment's taints annotation) reach pods through their pool: a
//! pool uses an offering only when it declares every one of its taints (`taints`, which its pods
//! must tolerate, or `startupTaints`), see [`instance_type::taints_declared`].
//!
//! A pod placed on a claim whose zone is still open blocks every zone the claim may launch in
//! for the anti-affinity groups it matches (upstream's "Schrödinger" pods); spread and affinity
//! count it only once its zone is decided. A pod that carries zonal anti-affinity leaves its new
//! claim open to every free zone, as upstream commits late (see [`topology`]).

pub(crate) mod amounts;
mod claim_index;
pub(crate) mod csi_migration;
pub mod default_spread;
pub(crate) mod error;
pub(crate) mod explain;
pub(crate) mod instance_type;
pub(crate) mod nodeclaim;
pub mod pod;
pub(crate) mod quota;
pub(crate) mod selector;
mod solver;
pub(crate) mod topology;
pub mod volumes;

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec, Taint};

pub use error::PodError;
pub use instance_type::{InstanceType, Offering};
pub use nodeclaim::{nodeclaim_for, static_claim, with_default_termination_grace_period};
pub use solver::{nodepool_requirements, solve, solve_with_volumes};

use crate::api::nodepool::NodePool;
use crate::api::requirements::Requirements;
#[cfg(test)]
use crate::api::resources::Quantity;
use crate::api::resources::Resources;
use crate::api::wellknown::INITIALIZED_LABEL;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Upstream's cap on the instance types written into one claim.
pub const MAX_INSTANCE_TYPES: usize = 600;

/// Whether preferences (preferred affinities, ScheduleAnyway spreads, PreferNoSchedule taints)
/// are tried as requirements first (`Respect`, the default) or ignored (`Ignore`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PreferencePolicy {
    #[default]
    Respect,
    Ignore,
}

/// What a NodePool's minValues the candidate instance types cannot meet does to a claim:
/// `Strict` (upstream's default) opens none; `BestEffort` lowers each unmet minValues to what
/// the types offer and marks the claim relaxed (upstream's `--min-values-policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MinValuesPolicy {
    #[default]
    Strict,
    BestEffort,
}

/// Everything one solve looks at.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Provisionable pending pods.
    pub pods: Vec<Pod>,
    /// Pods already bound to nodes (`spec.nodeName` set), counted for topology, affinity and
    /// host ports.
    /// host ports. Shared with the pod index (a pass clones pointers, not 50,000 pods).
    pub bound_pods: Vec<Arc<Pod>>,
    /// Existing nodes and in-flight claims, tried before any new claim.
    pub nodes: Vec<ExistingNode>,
    pub nodepools: Vec<PoolInput>,
    /// One pod per DaemonSet (see [`daemon_pod`]): it lands on every new node whose labels and
    /// taints it accepts, so its requests are overhead on those instance types.
    pub daemonsets: Vec<Pod>,
    pub preference_policy: PreferencePolicy,
    pub min_values_policy: MinValuesPolicy,
    /// Namespace name -> labels, for the `namespaceSelector` of pod (anti-)affinity terms. A
    /// namespace missing here is taken as unlabelled (only an empty selector matches it).
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// Cluster-level default topology spread constraints (`--scheduler-config`): pending pods
    /// without constraints of their own are spread by them. None: no defaults (upstream's
    /// default).
    pub default_spread: Option<default_spread::DefaultSpread>,
    /// Pending pods' volume topology by pod key (see [`volumes::prepare`]): alternatives, one of
    /// which the node or claim a pod goes to must satisfy.
    pub volume_topology: volumes::VolumeTopology,
    /// Pod key -> the existing node or in-flight claim (by its name in `nodes`) an earlier solve
    /// planned it onto: it goes back there before any pod is placed, so solving the same pods
    /// again while their claims launch repacks nothing. A pod that no longer fits there, or
    /// whose node is not in `nodes`, is placed as any other.
    pub nominated: HashMap<String, String>,
    /// For a disruption simulation: the pods it moves off its candidates (by key), and the
    /// existing nodes still inside their pool's `consolidateAfter`, which take none of them
    /// (upstream: a node that just received pods is not packed further, so it can go idle).
    /// Pods pending anyway may still go there.
    pub moved: HashSet<String>,
    pub under_consolidate_after: HashSet<String>,
    /// Pods among `pods` that are bound to a node already leaving (being deleted, or a
    /// candidate of a disruption command under way), by key: not pending yet, but they will be,
    /// and the room they need was counted on when their node was given up.
    pub displaced: HashSet<String>,
    /// For a disruption simulation: pending pods among `pods` that the cluster as it is has
    /// room for, by key (see `disruption::consolidation::keep_room_of_pods_about_to_bind`):
    /// the scheduler is about to bind them there, so that room is not free for moved pods.
    pub about_to_bind: HashSet<String>,
    /// CapacityQuotas to enforce (valid ones only), with what their nodes use.
    pub quotas: Vec<quota::QuotaInput>,
}

/// A node the pods may go to without a new claim.
#[derive(Clone, Debug, Default)]
pub struct ExistingNode {
    pub name: String,
    /// For an in-flight claim: the single values of its requirements.
    pub labels: BTreeMap<String, String>,
    /// Taints pods must tolerate. Ephemeral taints (not-ready, unregistered...) are ignored
    /// until the node is [initialized](ExistingNode::initialized), as upstream: on an
    /// initialized node they mean it went bad. Leave startup taints of an uninitialized node out.
    pub taints: Vec<Taint>,
    /// Must include `pods`.
    pub allocatable: Resources,
    /// Sum of the requests of the pods on it (daemons included), `pods` included.
    pub requested: Resources,
    /// The part of `requested` that is DaemonSet pods': the DaemonSets that run here and have
    /// no pod on it yet keep room for theirs (upstream's remaining daemon resources).
    pub daemon_requested: Resources,
    pub in_flight: bool,
    pub nodepool: Option<String>,
}

impl ExistingNode {
    /// Upstream's `StateNode.Initialized`: a Karpenter node (one of a NodePool) once it carries
    /// `karpenter.sh/initialized=true`, any other node always; an in-flight claim never.
    pub(crate) fn initialized(&self) -> bool {
        !self.in_flight
            && (self.nodepool.is_none()
                || self
                    .labels
                    .get(INITIALIZED_LABEL)
                    .is_some_and(|v| v == "true"))
    }
}

/// A NodePool with what it may launch.
#[derive(Clone, Debug)]
pub struct PoolInput {
    pub nodepool: NodePool,
    /// Already filtered to the pool's node class.
    pub instance_types: Vec<InstanceType>,
    /// Resources of its existing nodes and in-flight claims, with `nodes` (see
    /// [`nodepool_usage`]).
    pub usage: Resources,
}

/// The outcome of one solve.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Results {
    pub new_claims: Vec<NewClaim>,
    /// (pod `namespace/name`, node name).
    pub placed_on_existing: Vec<(String, String)>,
    /// (pod `namespace/name`, why it got no node).
    pub failures: Vec<(String, PodError)>,
}

/// A claim decided by the solver, ready for [`nodeclaim_for`].
#[derive(Clone, Debug, PartialEq)]
pub struct NewClaim {
    pub nodepool: String,
    /// NodePool requirements ∩ pod requirements ∩ topology choices ∩ instance type In [...] ∩
    /// capacity type In [...].
    pub requirements: Requirements,
    /// Pods' requests plus the DaemonSet overhead of the cheapest instance type.
    pub requests: Resources,
    /// Pods (`namespace/name`) packed onto it.
    pub pods: Vec<String>,
    /// Instance types that can hold it, cheapest first, at most [`MAX_INSTANCE_TYPES`].
    pub instance_types: Vec<String>,
    /// Whether a minValues of its NodePool was lowered to fit (only under
    /// [`MinValuesPolicy::BestEffort`]); `requirements` carry the lowered values.
    pub(crate) min_values_relaxed: bool,
}

/// What a NodePool uses: the sum of its nodes' (and in-flight claims') capacities plus `nodes`.
#[cfg(test)]
pub(crate) fn nodepool_usage<'a>(capacities: impl IntoIterator<Item = &'a Resources>) -> Resources {
    let mut total = Resources::new();
    let mut nodes = 0i64;
    for c in capacities {
        total.add_assign(c);
        nodes += 1;
    }
    total.with("nodes", Quantity::from_units(nodes))
}

/// The pod a DaemonSet would run on a new node: like `running`, its newest pod, when it has one
/// (admission may have changed the template's requests, as upstream's provisioner allows for),
/// else from its pod template. The required node affinity is always the template's: the
/// DaemonSet controller pins each pod to its own node with an extra term.
pub fn daemon_pod(
    namespace: &str,
    name: &str,
    template: &PodTemplateSpec,
    running: Option<&Pod>,
) -> Pod {
    let mut metadata = template.metadata.clone().unwrap_or_default();
    metadata.namespace = Some(namespace.to_string());
    metadata.name = Some(name.to_string());
    let mut spec = match running.and_then(|p| p.spec.clone()) {
        None => template.spec.clone(),
        Some(mut spec) => {
            let required = template
                .spec
                .as_ref()
                .and_then(|s| s.affinity.as_ref())
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .clone()
                });
            if let Some(n) = spec
                .affinity
                .as_mut()
                .and_then(|a| a.node_affinity.as_mut())
            {
                n.required_during_scheduling_ignored_during_execution = required;
            } else if let Some(r) = required {
                let affinity = spec.affinity.get_or_insert_default();
                affinity
                    .node_affinity
                    .get_or_insert_default()
                    .required_during_scheduling_ignored_during_execution = Some(r);
            }
            Some(spec)
        }
    };
    if let Some(s) = spec.as_mut() {
        s.node_name = None;
    }
    Pod {
        metadata,
        spec,
        status: None,
    }
}

#[cfg(test)]
mod tests;
