//! The binary and what ships beside it: the command line, `explain`, the Grafana
//! dashboard.

#[path = "../common/mod.rs"]
mod common;
#[path = "../standins/mod.rs"]
mod standins;

mod cli;
mod explain;
mod grafana_dashboard;
