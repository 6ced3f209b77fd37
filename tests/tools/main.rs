//! The binary and what ships beside it: the command line, `explain`, the Grafana
//! dashboard.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod explain;
mod grafana_dashboard;
