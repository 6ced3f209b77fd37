//! Upstream "Instance Type Compatibility": pods only land on instance types whose labels and
//! resources suit them, and pods that need different types get different nodes.

use std::collections::BTreeSet;

use karpenter_capi::api::nodeclaim::Operator;
use karpenter_capi::api::wellknown::{ARCH_LABEL, INSTANCE_TYPE_LABEL, OS_LABEL, ZONE_LABEL};

use crate::fixture::*;

fn both_archs() -> Env {
    Env::new(nodepool("default").req(ARCH_LABEL, Operator::In, &["arm64", "amd64"]))
}

fn amd64_only() -> Env {
    Env::new(nodepool("default").req(ARCH_LABEL, Operator::In, &["amd64"]))
}

fn distinct_nodes(out: &Outcome, pods: &[&str]) -> usize {
    pods.iter()
        .map(|p| out.scheduled(p).name.clone())
        .collect::<BTreeSet<_>>()
        .len()
}

#[test]
fn more_cpu_than_any_type_is_not_schedulable() {
    let p = pod("p").requests(&[("cpu", "512")]);
    Env::new(nodepool("default"))
        .provision(&[p])
        .not_scheduled("p");
}

#[test]
fn different_archs_get_different_nodes() {
    let a = pod("a").node_selector(&[(ARCH_LABEL, "amd64")]);
    let b = pod("b").node_selector(&[(ARCH_LABEL, "arm64")]);
    let out = both_archs().provision(&[a, b]);
    assert_eq!(distinct_nodes(&out, &["a", "b"]), 2);
}

#[test]
fn instance_type_outside_the_pool_arch_is_excluded() {
    let p = pod("p").required(vec![node_req(
        INSTANCE_TYPE_LABEL,
        "In",
        &["arm-instance-type"],
    )]);
    amd64_only().provision(&[p]).not_scheduled("p");
}

#[test]
fn operating_system_outside_the_pool_arch_is_excluded() {
    let p = pod("p").required(vec![node_req(OS_LABEL, "In", &["ios"])]);
    amd64_only().provision(&[p]).not_scheduled("p");
}

#[test]
fn resources_only_an_excluded_arch_has_are_not_schedulable() {
    let p = pod("p").limits(&[("cpu", "14")]);
    amd64_only().provision(&[p]).not_scheduled("p");
}

#[test]
fn different_operating_systems_get_different_nodes() {
    let a = pod("a").node_selector(&[(OS_LABEL, "linux")]);
    let b = pod("b").node_selector(&[(OS_LABEL, "windows")]);
    let out = both_archs().provision(&[a, b]);
    assert_eq!(distinct_nodes(&out, &["a", "b"]), 2);
}

#[test]
fn different_instance_type_selectors_get_different_nodes() {
    // Upstream mixes the beta and the stable instance-type label here.
    let a = pod("a").node_selector(&[("beta.kubernetes.io/instance-type", "small-instance-type")]);
    let b = pod("b").node_selector(&[(INSTANCE_TYPE_LABEL, "default-instance-type")]);
    let out = both_archs().provision(&[a, b]);
    assert_eq!(distinct_nodes(&out, &["a", "b"]), 2);
}

#[test]
fn different_zone_selectors_get_different_nodes() {
    let a = pod("a").node_selector(&[(ZONE_LABEL, "test-zone-1")]);
    let b = pod("b").node_selector(&[(ZONE_LABEL, "test-zone-2")]);
    let out = both_archs().provision(&[a, b]);
    assert_eq!(distinct_nodes(&out, &["a", "b"]), 2);
}

const GPU1: &str = "karpenter.sh/super-great-gpu";
const GPU2: &str = "karpenter.sh/even-better-gpu";

fn two_gpu_catalog() -> Env {
    let mut types = sized_types(5);
    types[0].capacity.set(GPU1, q("25"));
    types[1].capacity.set(GPU2, q("25"));
    Env::with_types(nodepool("default"), types)
}

#[test]
fn resources_on_different_types_get_different_nodes() {
    let a = pod("a").limits(&[(GPU1, "1")]);
    let b = pod("b").limits(&[(GPU2, "1")]);
    let out = two_gpu_catalog().provision(&[a, b]);
    assert_eq!(distinct_nodes(&out, &["a", "b"]), 2);
}

#[test]
fn resources_no_single_type_has_are_not_schedulable() {
    let p = pod("p").limits(&[(GPU1, "1"), (GPU2, "1")]);
    two_gpu_catalog().provision(&[p]).not_scheduled("p");
}

// --- Provider Specific Labels ---

fn five_sizes() -> Env {
    Env::with_types(nodepool("default"), sized_types(5))
}

#[test]
fn provider_labels_filter_instance_types() {
    let a = pod("a").node_selector(&[(SIZE, "large")]);
    let b = pod("b").node_selector(&[(SIZE, "small")]);
    let out = five_sizes().provision(&[a, b]);
    assert_eq!(
        out.scheduled("a").label(INSTANCE_TYPE_LABEL),
        Some("fake-it-4")
    );
    assert_eq!(
        out.scheduled("b").label(INSTANCE_TYPE_LABEL),
        Some("fake-it-0")
    );
}

#[test]
fn incompatible_provider_labels_are_not_schedulable() {
    let a = pod("a").node_selector(&[(SIZE, "large"), (INSTANCE_TYPE_LABEL, "fake-it-0")]);
    let b = pod("b").node_selector(&[(SIZE, "small"), (INSTANCE_TYPE_LABEL, "fake-it-4")]);
    let out = five_sizes().provision(&[a, b]);
    out.not_scheduled("a");
    out.not_scheduled("b");
}

#[test]
fn optional_provider_labels_can_be_required() {
    let p = pod("p").required(vec![node_req(SPECIAL, "Exists", &[])]);
    let out = five_sizes().provision(&[p]);
    let n = out.scheduled("p");
    assert!(n.label(SPECIAL).is_some(), "{n:#?}");
    assert_eq!(n.label(INSTANCE_TYPE_LABEL), Some("fake-it-4"));
}

#[test]
fn optional_provider_labels_can_be_excluded() {
    let p = pod("p").required(vec![node_req(SPECIAL, "DoesNotExist", &[])]);
    let out = five_sizes().provision(&[p]);
    assert_eq!(out.scheduled("p").label(SPECIAL), None);
}
