//! Provisioning end to end: pods to claims through the simulated cluster, the
//! solver on a mixed workload and the Cluster API model (the malformed corpus runs on both
//! backends, in the control_plane test binary).

#[path = "../common/mod.rs"]
mod common;

mod autoscaler;
mod buffers;
mod capi;
mod generate;
mod provisioning;
mod room;
mod scheduling;
