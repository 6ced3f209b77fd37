//! karpenter-capi: just-in-time nodes for Cluster API clusters, with Karpenter's API.
//!
//! The map of this crate is `DESIGN.md`: `api` (Karpenter-facing types), `capi` (the Cluster API
//! model), `scheduling` (pure bin-packing), `disruption` (pure disruption decisions), `actors` (behaviour), `state` (indexes fed by watches),
//! `sim` (the embedded simulated cluster), `controlplane` (a real kube-apiserver, etcd,
//! kube-scheduler and kube-controller-manager for tests, docs/fidelity.md), `explain` and `init`
//! (read-only tools that answer with the controller's own code, docs/tools.md).

pub mod actors;
pub mod api;
pub mod app;
pub mod capi;
pub mod cli;
pub mod controlplane;
pub mod disruption;
pub mod explain;
pub mod http;
pub mod init;
pub mod kubeconfig_watch;
pub mod leader;
pub mod metrics;
pub mod ratelimit;
pub mod scheduling;
pub mod sim;
pub mod simulate;
pub mod state;
#[cfg(test)]
mod test_support;
pub mod write_gate;
