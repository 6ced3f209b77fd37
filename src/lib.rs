//! karpenter-capi: just-in-time nodes for Cluster API clusters, with Karpenter's API.
//!
//! The map of this crate is docs/architecture.md: `api` (Karpenter-facing types), `capi` (the
//! Cluster API model), `scheduling` (pure bin-packing), `disruption` (pure disruption decisions),
//! `state` (indexes fed by watches), `view` (the read-side projections actors and tools share),
//! `actors` (behaviour), `sim` (the embedded simulated cluster) and `controlplane` (a real
//! kube-apiserver, etcd, kube-scheduler and kube-controller-manager for tests, docs/fidelity.md),
//! both re-exported from the stand-ins' own crate (crates/standins),
//! `explain` and `init` (read-only tools that answer with the controller's own code,
//! docs/tools.md).
//!
//! `sim`, `simulate` (its scenarios and reports) and `controlplane` exist only with the
//! default-on `simulator` feature: `--no-default-features` builds the controller alone, and the
//! compiler then refuses any controller code that reaches into the simulated cluster.

pub mod actors;
pub mod api;
pub mod app;
pub mod capi;
pub mod cli;
// The stand-ins live in their own crate (crates/standins), which cannot import this one; they
// keep their paths here for the simulator, its tests and benches.
#[cfg(feature = "simulator")]
pub use karpenter_capi_standins::controlplane;
pub mod disruption;
pub mod explain;
pub mod http;
pub mod init;
pub mod kubeconfig_watch;
#[cfg(test)]
mod layers;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod ratelimit;
pub mod retry_after;
pub mod scheduling;
pub mod shadow;
#[cfg(feature = "simulator")]
pub use karpenter_capi_standins as sim;
#[cfg(feature = "simulator")]
pub mod simulate;
pub mod state;
// Builders shared by unit tests, tests/ and benches/: compiled for the crate's own tests and
// through the `testing` feature, which only the crate's dev-dependency on itself turns on.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod thread_cache;
pub mod view;
pub mod write_gate;
