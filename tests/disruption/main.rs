//! Disruption: the controller against the simulated cluster, and the `simulate`
//! disruption scenarios.

#[path = "../common/mod.rs"]
mod common;

mod buffers;
mod deletion_cost;
mod disruption;
mod lagging_pod_watch;
mod machine_pools;
mod pause;
mod repair;
mod rollout_status;
mod simulate_disruption;
mod static_pools;
mod terminate_first;
mod under_faults;
mod why_not;
