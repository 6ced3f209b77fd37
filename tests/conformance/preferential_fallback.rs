//! Upstream "Preferential Fallback" (scheduling suite): required terms are ORed and tried in
//! order, preferred terms are relaxed heaviest-last.

use karpenter_capi::api::nodeclaim::Operator;
use karpenter_capi::api::wellknown::{INSTANCE_TYPE_LABEL, ZONE_LABEL};

use crate::fixture::*;

#[test]
fn the_last_required_term_is_never_relaxed() {
    let np = nodepool("default")
        .req(ZONE_LABEL, Operator::In, &["test-zone-1"])
        .req(INSTANCE_TYPE_LABEL, Operator::In, &["default-instance-type"]);
    let p = pod("p").required_term(vec![node_req(ZONE_LABEL, "In", &["invalid"])]);
    Env::new(np).provision(&[p]).not_scheduled("p");
}

#[test]
fn required_terms_are_tried_in_order_until_one_fits() {
    let p = pod("p")
        .required_term(vec![node_req(ZONE_LABEL, "In", &["invalid"])])
        .required_term(vec![node_req(ZONE_LABEL, "In", &["invalid"])])
        .required_term(vec![node_req(ZONE_LABEL, "In", &["test-zone-1"])])
        .required_term(vec![node_req(ZONE_LABEL, "In", &["test-zone-2"])]);
    let out = Env::new(nodepool("default")).provision(&[p]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-1"));
}

#[test]
fn every_preferred_term_may_be_relaxed() {
    let p = pod("p")
        .preferred(1, vec![node_req(ZONE_LABEL, "In", &["invalid"])])
        .preferred(1, vec![node_req(INSTANCE_TYPE_LABEL, "In", &["invalid"])]);
    assert!(Env::new(nodepool("default")).provision(&[p]).node_of("p").is_some());
}

#[test]
fn heavier_preferences_are_relaxed_first_down_to_lighter_ones() {
    let np = nodepool("default").req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"]);
    let p = pod("p")
        .preferred(100, vec![node_req(INSTANCE_TYPE_LABEL, "In", &["test-zone-3"])])
        .preferred(50, vec![node_req(ZONE_LABEL, "In", &["test-zone-2"])])
        .preferred(1, vec![node_req(ZONE_LABEL, "In", &["test-zone-1"])]);
    let out = Env::new(np).provision(&[p]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-2"));
}

#[test]
fn a_preference_conflicting_with_the_requirement_is_dropped() {
    let p = pod("p")
        .preferred(1, vec![node_req(ZONE_LABEL, "NotIn", &["test-zone-3"])])
        .required(vec![node_req(ZONE_LABEL, "In", &["test-zone-3"])]);
    let out = Env::new(nodepool("default")).provision(&[p]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-3"));
}

#[test]
fn a_self_contradicting_preference_is_dropped() {
    let p = pod("p").preferred(
        1,
        vec![
            node_req(ZONE_LABEL, "In", &["invalid"]),
            node_req(ZONE_LABEL, "NotIn", &["invalid"]),
        ],
    );
    assert!(Env::new(nodepool("default")).provision(&[p]).node_of("p").is_some());
}
