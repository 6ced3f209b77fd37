//! Upstream "Custom Constraints": NodePool labels, well-known labels, restricted labels and the
//! operator logic of node selectors and affinities.

use karpenter_capi::api::nodeclaim::Operator;
use karpenter_capi::api::wellknown::{
    ARCH_LABEL, CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, INSTANCE_TYPE_LABEL, OS_LABEL, ZONE_LABEL,
};

use crate::fixture::*;

fn env() -> Env {
    Env::new(nodepool("default"))
}

fn labelled_pool() -> Env {
    Env::new(nodepool("default").labels(&[("test-key", "test-value")]))
}

fn test_key_pool(values: &[&str]) -> Env {
    Env::new(nodepool("default").req("test-key", Operator::In, values))
}

fn zone_pool(zones: &[&str]) -> Env {
    Env::new(nodepool("default").req(ZONE_LABEL, Operator::In, zones))
}

// --- NodePool with Labels ---

#[test]
fn pool_labels_land_on_nodes_of_unconstrained_pods() {
    let out = labelled_pool().provision(&[pod("p")]);
    assert_eq!(out.scheduled("p").label("test-key"), Some("test-value"));
}

#[test]
fn pool_labels_reject_a_conflicting_node_selector() {
    let p = pod("p").node_selector(&[("test-key", "different-value")]);
    labelled_pool().provision(&[p]).not_scheduled("p");
}

#[test]
fn undefined_custom_label_in_node_selector_is_not_schedulable() {
    let p = pod("p").node_selector(&[("test-key", "test-value")]);
    env().provision(&[p]).not_scheduled("p");
}

#[test]
fn pool_labels_satisfy_matching_requirements() {
    let p = pod("p").required(vec![node_req(
        "test-key",
        "In",
        &["test-value", "another-value"],
    )]);
    let out = labelled_pool().provision(&[p]);
    assert_eq!(out.scheduled("p").label("test-key"), Some("test-value"));
}

#[test]
fn pool_labels_reject_conflicting_requirements() {
    let p = pod("p").required(vec![node_req("test-key", "In", &["another-value"])]);
    labelled_pool().provision(&[p]).not_scheduled("p");
}

// --- Well Known Labels ---

#[test]
fn pool_zone_requirement_decides_the_zone() {
    let out = zone_pool(&["test-zone-2"]).provision(&[pod("p")]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-2"));
}

#[test]
fn node_selector_narrows_the_pool_zones() {
    let p = pod("p").node_selector(&[(ZONE_LABEL, "test-zone-2")]);
    let out = zone_pool(&["test-zone-1", "test-zone-2"]).provision(&[p]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-2"));
}

#[test]
fn hostname_node_selector_is_not_schedulable() {
    let p = pod("p").node_selector(&[(HOSTNAME_LABEL, "red-node")]);
    env().provision(&[p]).not_scheduled("p");
}

#[test]
fn unknown_zone_node_selector_is_not_schedulable() {
    let p = pod("p").node_selector(&[(ZONE_LABEL, "unknown")]);
    zone_pool(&["test-zone-1"])
        .provision(&[p])
        .not_scheduled("p");
}

#[test]
fn node_selector_outside_pool_zones_is_not_schedulable() {
    let p = pod("p").node_selector(&[(ZONE_LABEL, "test-zone-2")]);
    zone_pool(&["test-zone-1"])
        .provision(&[p])
        .not_scheduled("p");
}

#[test]
fn required_zone_in() {
    let p = pod("p").required(vec![node_req(ZONE_LABEL, "In", &["test-zone-3"])]);
    let out = env().provision(&[p]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-3"));
}

fn integer_pool(op: Operator, v: &str) -> Option<String> {
    let out = Env::new(nodepool("default").req(INTEGER, op, &[v])).provision(&[pod("p")]);
    out.node_of("p")
        .and_then(|n| n.label(INTEGER).map(str::to_string))
}

#[test]
fn pool_requirement_gt_on_an_integer_label() {
    assert_eq!(integer_pool(Operator::Gt, "8").as_deref(), Some("16"));
}

#[test]
fn pool_requirement_lt_on_an_integer_label() {
    assert_eq!(integer_pool(Operator::Lt, "8").as_deref(), Some("2"));
}

#[test]
fn pool_requirement_gte_on_an_integer_label() {
    assert_eq!(integer_pool(Operator::Gte, "16").as_deref(), Some("16"));
}

#[test]
fn pool_requirement_lte_on_an_integer_label() {
    assert_eq!(integer_pool(Operator::Lte, "2").as_deref(), Some("2"));
}

#[test]
fn required_zone_in_unknown_is_not_schedulable() {
    let p = pod("p").required(vec![node_req(ZONE_LABEL, "In", &["unknown"])]);
    env().provision(&[p]).not_scheduled("p");
}

#[test]
fn required_zone_not_in() {
    let p = pod("p").required(vec![node_req(
        ZONE_LABEL,
        "NotIn",
        &["test-zone-1", "test-zone-2", "unknown"],
    )]);
    let out = env().provision(&[p]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-3"));
}

#[test]
fn required_zone_not_in_every_zone_is_not_schedulable() {
    let p = pod("p").required(vec![node_req(
        ZONE_LABEL,
        "NotIn",
        &["test-zone-1", "test-zone-2", "test-zone-3", "unknown"],
    )]);
    env().provision(&[p]).not_scheduled("p");
}

const ALL_ZONES_AND_UNKNOWN: [&str; 4] = ["test-zone-1", "test-zone-2", "test-zone-3", "unknown"];

#[test]
fn compatible_preference_in_narrows_the_requirement() {
    let p = pod("p")
        .required(vec![node_req(ZONE_LABEL, "In", &ALL_ZONES_AND_UNKNOWN)])
        .preferred(
            1,
            vec![node_req(ZONE_LABEL, "In", &["test-zone-2", "unknown"])],
        );
    let out = env().provision(&[p]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-2"));
}

#[test]
fn incompatible_preference_in_is_relaxed() {
    let p = pod("p")
        .required(vec![node_req(ZONE_LABEL, "In", &ALL_ZONES_AND_UNKNOWN)])
        .preferred(1, vec![node_req(ZONE_LABEL, "In", &["unknown"])]);
    assert!(env().provision(&[p]).node_of("p").is_some());
}

#[test]
fn compatible_preference_not_in_narrows_the_requirement() {
    let p = pod("p")
        .required(vec![node_req(ZONE_LABEL, "In", &ALL_ZONES_AND_UNKNOWN)])
        .preferred(
            1,
            vec![node_req(
                ZONE_LABEL,
                "NotIn",
                &["test-zone-1", "test-zone-3"],
            )],
        );
    let out = env().provision(&[p]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-2"));
}

#[test]
fn incompatible_preference_not_in_is_relaxed() {
    let p = pod("p")
        .required(vec![node_req(ZONE_LABEL, "In", &ALL_ZONES_AND_UNKNOWN)])
        .preferred(1, vec![node_req(ZONE_LABEL, "NotIn", &ZONES)]);
    assert!(env().provision(&[p]).node_of("p").is_some());
}

#[test]
fn node_selector_requirement_and_preference_combine() {
    let p = pod("p")
        .node_selector(&[(ZONE_LABEL, "test-zone-3")])
        .required(vec![node_req(ZONE_LABEL, "In", &ZONES)])
        .preferred(1, vec![node_req(ZONE_LABEL, "In", &ZONES)]);
    let out = env().provision(&[p]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-3"));
}

#[test]
fn multidimensional_selectors_requirements_and_preferences_combine() {
    let p = pod("p")
        .node_selector(&[
            (ZONE_LABEL, "test-zone-3"),
            (INSTANCE_TYPE_LABEL, "arm-instance-type"),
        ])
        .required(vec![
            node_req(ZONE_LABEL, "In", &["test-zone-1", "test-zone-3"]),
            node_req(
                INSTANCE_TYPE_LABEL,
                "In",
                &["default-instance-type", "arm-instance-type"],
            ),
        ])
        .preferred(
            1,
            vec![
                node_req(ZONE_LABEL, "NotIn", &["unknown"]),
                node_req(INSTANCE_TYPE_LABEL, "NotIn", &["unknown"]),
            ],
        );
    let out = env().provision(&[p]);
    let n = out.scheduled("p");
    assert_eq!(n.label(ZONE_LABEL), Some("test-zone-3"));
    assert_eq!(n.label(INSTANCE_TYPE_LABEL), Some("arm-instance-type"));
}

// --- Constraints Validation ---

/// Upstream's restricted labels: only the hostname (it would pin a pod to a node that does not
/// exist yet).
const RESTRICTED_LABELS: [&str; 1] = [HOSTNAME_LABEL];

#[test]
fn restricted_labels_in_requirements_are_not_schedulable() {
    let e = env();
    for (i, label) in RESTRICTED_LABELS.iter().enumerate() {
        let name = format!("p{i}");
        let p = pod(&name).required(vec![node_req(label, "In", &["test"])]);
        e.provision(&[p]).not_scheduled(&name);
    }
}

#[test]
fn restricted_domains_in_requirements_are_not_schedulable() {
    let e = env();
    for (i, domain) in ["karpenter.sh"].iter().enumerate() {
        let name = format!("p{i}");
        let p = pod(&name).required(vec![node_req(&format!("{domain}/test"), "In", &["test"])]);
        e.provision(&[p]).not_scheduled(&name);
    }
}

fn domain_labels_land_on_nodes(prefix: &str) {
    let mut np = nodepool("default");
    let keys: Vec<String> = ["kubernetes.io", "k8s.io"]
        .iter()
        .map(|d| format!("{prefix}{d}/test"))
        .collect();
    for k in &keys {
        np = np.req(k, Operator::In, &["test-value"]);
    }
    let out = Env::new(np).provision(&[pod("p")]);
    let n = out.scheduled("p");
    for k in &keys {
        assert_eq!(n.label(k), Some("test-value"), "{k}");
    }
}

#[test]
fn pool_requirements_in_kubernetes_domains_become_node_labels() {
    domain_labels_land_on_nodes("");
}

#[test]
fn pool_requirements_in_kubernetes_subdomains_become_node_labels() {
    domain_labels_land_on_nodes("subdomain.");
}

#[test]
fn well_known_label_node_selectors_are_schedulable() {
    let e = env();
    for (i, (k, v)) in [
        (ZONE_LABEL, "test-zone-1"),
        (INSTANCE_TYPE_LABEL, "default-instance-type"),
        (ARCH_LABEL, "arm64"),
        (OS_LABEL, "linux"),
        (CAPACITY_TYPE_LABEL, "spot"),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("p{i}");
        let out = e.provision(&[pod(&name).node_selector(&[(k, v)])]);
        assert_eq!(out.scheduled(&name).label(k), Some(v));
    }
}

// --- Scheduling Logic ---

#[test]
fn undefined_key_with_in_is_not_schedulable() {
    let p = pod("p").required(vec![node_req("test-key", "In", &["test-value"])]);
    env().provision(&[p]).not_scheduled("p");
}

#[test]
fn undefined_key_with_not_in_is_schedulable() {
    let p = pod("p").required(vec![node_req("test-key", "NotIn", &["test-value"])]);
    let out = env().provision(&[p]);
    assert_ne!(out.scheduled("p").label("test-key"), Some("test-value"));
}

#[test]
fn undefined_key_with_exists_is_not_schedulable() {
    let p = pod("p").required(vec![node_req("test-key", "Exists", &[])]);
    env().provision(&[p]).not_scheduled("p");
}

#[test]
fn undefined_key_with_does_not_exist_is_schedulable() {
    let p = pod("p").required(vec![node_req("test-key", "DoesNotExist", &[])]);
    let out = env().provision(&[p]);
    assert_eq!(out.scheduled("p").label("test-key"), None);
}

#[test]
fn pool_requirement_labels_nodes_of_unconstrained_pods() {
    let out = test_key_pool(&["test-value"]).provision(&[pod("p")]);
    assert_eq!(out.scheduled("p").label("test-key"), Some("test-value"));
}

#[test]
fn matching_value_with_in_is_schedulable() {
    let p = pod("p").required(vec![node_req("test-key", "In", &["test-value"])]);
    let out = test_key_pool(&["test-value"]).provision(&[p]);
    assert_eq!(out.scheduled("p").label("test-key"), Some("test-value"));
}

#[test]
fn matching_value_with_not_in_is_not_schedulable() {
    let p = pod("p").required(vec![node_req("test-key", "NotIn", &["test-value"])]);
    test_key_pool(&["test-value"])
        .provision(&[p])
        .not_scheduled("p");
}

#[test]
fn defined_key_with_exists_is_schedulable() {
    let p = pod("p").required(vec![node_req("test-key", "Exists", &[])]);
    assert!(
        test_key_pool(&["test-value"])
            .provision(&[p])
            .node_of("p")
            .is_some()
    );
}

#[test]
fn defined_key_with_does_not_exist_is_not_schedulable() {
    let p = pod("p").required(vec![node_req("test-key", "DoesNotExist", &[])]);
    test_key_pool(&["test-value"])
        .provision(&[p])
        .not_scheduled("p");
}

#[test]
fn different_value_with_in_is_not_schedulable() {
    let p = pod("p").required(vec![node_req("test-key", "In", &["another-value"])]);
    test_key_pool(&["test-value"])
        .provision(&[p])
        .not_scheduled("p");
}

#[test]
fn different_value_with_not_in_is_schedulable() {
    let p = pod("p").required(vec![node_req("test-key", "NotIn", &["another-value"])]);
    let out = test_key_pool(&["test-value"]).provision(&[p]);
    assert_eq!(out.scheduled("p").label("test-key"), Some("test-value"));
}

#[test]
fn compatible_pods_share_a_node() {
    let a = pod("a").required(vec![node_req("test-key", "In", &["test-value"])]);
    let b = pod("b").required(vec![node_req("test-key", "NotIn", &["another-value"])]);
    let out = test_key_pool(&["test-value", "another-value"]).provision(&[a, b]);
    let (na, nb) = (out.scheduled("a"), out.scheduled("b"));
    assert_eq!(na.label("test-key"), Some("test-value"));
    assert_eq!(nb.label("test-key"), Some("test-value"));
    assert_eq!(na.name, nb.name);
}

#[test]
fn incompatible_pods_get_different_nodes() {
    let a = pod("a").required(vec![node_req("test-key", "In", &["test-value"])]);
    let b = pod("b").required(vec![node_req("test-key", "In", &["another-value"])]);
    let out = test_key_pool(&["test-value", "another-value"]).provision(&[a, b]);
    let (na, nb) = (out.scheduled("a"), out.scheduled("b"));
    assert_eq!(na.label("test-key"), Some("test-value"));
    assert_eq!(nb.label("test-key"), Some("another-value"));
    assert_ne!(na.name, nb.name);
}

#[test]
fn exists_does_not_widen_an_impossible_in() {
    let p = pod("p").required(vec![
        node_req(ZONE_LABEL, "In", &["non-existent-zone"]),
        node_req(ZONE_LABEL, "Exists", &[]),
    ]);
    env().provision(&[p]).not_scheduled("p");
}
