//! The Cluster API model: one internal Machine / MachineDeployment model read from v1beta1 or
//! v1beta2, scale-from-zero annotations, infrastructure template capacity, provider IDs and
//! version discovery.

pub mod annotations;
pub mod model;
pub mod provider_id;
pub mod template;
pub mod version;
