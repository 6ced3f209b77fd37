//! Pure bin-packing: pods x NodePools x instance types -> new NodeClaims (no I/O).

pub mod instance_type;

pub use instance_type::{InstanceType, Offering};
