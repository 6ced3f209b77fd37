//! Karpenter-facing types: NodePool, NodeClaim, ClusterAPINodeClass, well-known keys,
//! requirement algebra, resource arithmetic, validation and CRD generation.

pub mod conditions;
pub mod crds;
pub mod cron;
pub mod duration;
pub mod nodeclaim;
pub mod nodeclass;
pub mod nodepool;
pub mod requirements;
pub mod resources;
pub mod validation;
pub mod wellknown;
