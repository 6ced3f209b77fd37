//! Karpenter core's scheduling suite as our yardstick (issue 13): one module per upstream group,
//! each case in our own words with upstream's setup and expected outcome. docs/conformance.md
//! maps every upstream case to the test here, or says why it does not apply or what it needs.

#[path = "../common/mod.rs"]
mod common;
mod fixture;

mod batching;
mod binpacking;
mod buffers;
mod custom_constraints;
mod default_constraints;
mod doc_table;
mod in_flight;
mod instance_selection;
mod instance_type_compat;
mod node_repair;
mod nodeoverlay;
mod preferential_fallback;
mod provisioning;
mod static_capacity;
mod topology;
mod volumes;
mod whole_flow;
