//! The simulated cluster (DESIGN.md section 6). (to be written)

// ---- stand-ins and scenarios (H4) ----
pub mod capi;
pub mod kubelet;
pub mod quantity;
pub mod scheduler;
pub mod standin;
