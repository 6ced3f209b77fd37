//! A claim's life against the simulated cluster: launch, termination, leader election
//! and faults.

#[path = "../common/mod.rs"]
mod common;

mod apart;
mod fleet;
mod ha;
mod hardening;
mod karpenter_apart;
mod launch;
mod machine_pool;
mod shadow;
mod status_writers;
mod termination;
