//! The simulated cluster itself: its API server, its Cluster API and kubelet stand-ins,
//! rollouts, and the `simulate` reports.

#[path = "../standins/mod.rs"]
mod standins;

mod measure_apart;
mod report_html;
mod sim_rollout;
mod sim_server;
mod sim_standins;
