//! Provisioning end to end: pods to claims through the simulated cluster, the
//! solver on a mixed workload, the Cluster API model, and malformed objects.

#[path = "../common/mod.rs"]
mod common;

mod autoscaler;
mod capi;
mod malformed;
mod provisioning;
mod scheduling;
