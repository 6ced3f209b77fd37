//! The simulated cluster (DESIGN.md section 6). (to be written)
