//! The simulated cluster itself: its API server, its Cluster API and kubelet stand-ins,
//! rollouts, and the `simulate` reports.

#[path = "../common/mod.rs"]
mod common;

mod fleet;
mod from_cluster;
mod generated_groups;
mod held_back;
mod karpenter_objects;
mod measure_apart;
mod report_html;
mod sim_machine_pool;
mod sim_machine_size;
mod sim_pause;
mod sim_rollout;
mod sim_server;
mod sim_standins;
