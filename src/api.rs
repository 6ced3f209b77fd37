//! Karpenter-facing types: NodePool, NodeClaim, ClusterAPINodeClass, CapacityBuffer, well-known keys,
//! requirement algebra, resource arithmetic, validation and CRD generation.

pub mod capacity_buffer;
pub mod capacity_quota;
pub mod conditions;
pub mod crds;
pub mod cron;
pub mod decode;
pub mod drift_hash;
pub mod duration;
pub mod nodeclaim;
pub mod nodeclass;
pub mod nodeoverlay;
pub mod nodepool;
pub(crate) mod partial;
pub mod repair_policy;
pub mod requirements;
pub mod resource_list;
pub mod resources;
pub mod validation;
pub mod wellknown;

pub use conditions::{Condition, ConditionStatus};
pub use duration::{GoDuration, NillableDuration};
pub use nodeclaim::{
    NodeClaim, NodeClaimSpec, NodeClaimStatus, NodeClassReference,
    NodeSelectorRequirementWithMinValues, Operator,
};
pub use nodeclass::{ClusterAPINodeClass, ClusterAPINodeClassSpec, ClusterAPINodeClassStatus};
pub use nodeoverlay::{NodeOverlay, NodeOverlaySpec, NodeOverlayStatus};
pub use nodepool::{Budget, Disruption, NodeClaimTemplate, NodePool, NodePoolSpec, NodePoolStatus};
// The drift hash of a NodePool (upstream's), stamped on claims with the hash version `v3`.
pub use drift_hash::nodepool_hash;
pub use requirements::{Requirement, Requirements};
pub use validation::{
    ValidationErrors, validate_nodeclaim, validate_nodeclass, validate_nodeoverlay,
    validate_nodepool,
};
