//! Upstream "Binpacking": the cheapest type that holds the pods, packed tightly.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use karpenter_capi::api::wellknown::{ARCH_LABEL, INSTANCE_TYPE_LABEL};

use crate::fixture::*;

fn env() -> Env {
    Env::new(nodepool("default"))
}

fn types_of(out: &Outcome, pods: &[Pod]) -> BTreeSet<String> {
    pods.iter()
        .map(|p| {
            let n = out.scheduled(p.metadata.name.as_deref().unwrap());
            n.label(INSTANCE_TYPE_LABEL).unwrap_or_default().to_string()
        })
        .collect()
}

fn node_count(out: &Outcome, pods: &[Pod]) -> usize {
    pods.iter()
        .map(|p| {
            out.scheduled(p.metadata.name.as_deref().unwrap())
                .name
                .clone()
        })
        .collect::<BTreeSet<_>>()
        .len()
}

use k8s_openapi::api::core::v1::Pod;

#[test]
fn a_small_pod_gets_the_smallest_type() {
    let out = env().provision(&[pod("p").requests(&[("memory", "100M")])]);
    assert_eq!(
        out.scheduled("p").label(INSTANCE_TYPE_LABEL),
        Some("small-instance-type")
    );
}

#[test]
fn a_pod_gets_the_smallest_type_that_holds_it() {
    let out = env().provision(&[pod("p").requests(&[("memory", "2000M")])]);
    assert_eq!(
        out.scheduled("p").label(INSTANCE_TYPE_LABEL),
        Some("small-instance-type")
    );
}

#[test]
fn runtime_class_overhead_counts() {
    // The RuntimeClass admission plugin copies the class's podFixed overhead into the pod.
    let mut p = pod("p").requests(&[("cpu", "1")]);
    p.spec.as_mut().unwrap().overhead = Some([("cpu".to_string(), K8sQuantity("2".into()))].into());
    let out = env().provision(&[p]);
    assert_eq!(
        out.scheduled("p").label(INSTANCE_TYPE_LABEL),
        Some("default-instance-type")
    );
}

#[test]
fn small_pods_share_the_smallest_type() {
    let ps = pods("p", 5, |p| p.requests(&[("memory", "10M")]));
    let out = env().provision(&ps);
    assert_eq!(
        types_of(&out, &ps),
        BTreeSet::from(["small-instance-type".to_string()])
    );
    assert_eq!(node_count(&out, &ps), 1);
}

#[test]
fn new_nodes_when_a_node_is_full() {
    let ps = pods("p", 40, |p| {
        p.node_selector(&[(ARCH_LABEL, "amd64")])
            .requests(&[("memory", "1.8G")])
    });
    let out = env().provision(&ps);
    assert_eq!(
        types_of(&out, &ps),
        BTreeSet::from(["default-instance-type".to_string()])
    );
    assert_eq!(node_count(&out, &ps), 20);
}

#[test]
fn small_and_large_pods_pack_together() {
    let mut ps = pods("large", 40, |p| {
        p.node_selector(&[(ARCH_LABEL, "amd64")])
            .requests(&[("memory", "1.8G")])
    });
    ps.extend(pods("small", 20, |p| {
        p.node_selector(&[(ARCH_LABEL, "amd64")])
            .requests(&[("memory", "400M")])
    }));
    let out = env().provision(&ps);
    assert_eq!(
        types_of(&out, &ps),
        BTreeSet::from(["default-instance-type".to_string()])
    );
    assert_eq!(node_count(&out, &ps), 20);
}

#[test]
fn nodes_are_packed_tightly() {
    let a = pod("a").requests(&[("cpu", "4.5")]);
    let b = pod("b").requests(&[("cpu", "1")]);
    let out = Env::with_types(nodepool("default"), sized_types(5)).provision(&[a, b]);
    let (na, nb) = (out.scheduled("a"), out.scheduled("b"));
    assert_ne!(na.name, nb.name);
    assert_ne!(na.label(INSTANCE_TYPE_LABEL), nb.label(INSTANCE_TYPE_LABEL));
}

#[test]
fn zero_quantity_requests_of_unknown_resources_fit() {
    let p = pod("p")
        .requests(&[("foo.com/weird-resources", "0")])
        .limits(&[("foo.com/weird-resources", "0")]);
    assert!(env().provision(&[p]).node_of("p").is_some());
}

#[test]
fn more_memory_than_any_type_is_not_schedulable() {
    let p = pod("p").requests(&[("memory", "2Ti")]);
    env().provision(&[p]).not_scheduled("p");
}

#[test]
fn new_nodes_when_a_node_reaches_its_pod_count() {
    let ps = pods("p", 25, |p| {
        p.node_selector(&[(ARCH_LABEL, "amd64")])
            .requests(&[("memory", "1m"), ("cpu", "1m")])
    });
    let out = env().provision(&ps);
    assert_eq!(
        types_of(&out, &ps),
        BTreeSet::from(["small-instance-type".to_string()])
    );
    assert_eq!(node_count(&out, &ps), 5);
}

#[test]
fn init_container_requests_count() {
    let p = pod("p")
        .requests(&[("memory", "1Gi"), ("cpu", "1")])
        .init_requests(&[("memory", "1Gi"), ("cpu", "2")]);
    let out = env().provision(&[p]);
    assert_eq!(
        out.scheduled("p").label(INSTANCE_TYPE_LABEL),
        Some("default-instance-type")
    );
}

#[test]
fn init_container_larger_than_any_type_is_not_schedulable() {
    let p = pod("p")
        .requests(&[("memory", "1Gi"), ("cpu", "1")])
        .init_requests(&[("memory", "1Ti"), ("cpu", "2")]);
    env().provision(&[p]).not_scheduled("p");
}

#[test]
fn every_type_that_fits_is_a_candidate_whatever_its_price() {
    let one = |name: &str, cpu: &str, mem: &str, price: f64| {
        itype(name)
            .resources(&[("cpu", cpu), ("memory", mem)])
            .offerings(&[(ON_DEMAND, "test-zone-1a", true)])
            .price(price)
            .build()
    };
    let types = vec![
        one("medium", "2", "2Gi", 3.0),
        one("small", "1", "1Gi", 2.0),
        one("large", "4", "4Gi", 1.0),
    ];
    let p = pod("p").limits(&[("cpu", "1m"), ("memory", "1Mi")]);
    let out = Env::with_types(nodepool("default"), types).provision(&[p]);
    let n = out.scheduled("p");
    assert_eq!(n.label(INSTANCE_TYPE_LABEL), Some("large"));
    let candidates: BTreeSet<&str> = n.claim.instance_types.iter().map(String::as_str).collect();
    assert_eq!(candidates, BTreeSet::from(["small", "medium", "large"]));
}
