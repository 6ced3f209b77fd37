//! Upstream "Preferential Fallback" (scheduling suite): required terms are ORed and tried in
//! order, preferred terms are relaxed heaviest-last.

use karpenter_capi::api::nodeclaim::Operator;
use karpenter_capi::api::wellknown::{INSTANCE_TYPE_LABEL, ZONE_LABEL};

use crate::fixture::*;

#[test]
fn the_last_required_term_is_never_relaxed() {
    let np = nodepool("default")
        .req(ZONE_LABEL, Operator::In, &["test-zone-1"])
        .req(
            INSTANCE_TYPE_LABEL,
            Operator::In,
            &["default-instance-type"],
        );
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
    assert!(
        Env::new(nodepool("default"))
            .provision(&[p])
            .node_of("p")
            .is_some()
    );
}

#[test]
fn heavier_preferences_are_relaxed_first_down_to_lighter_ones() {
    let np = nodepool("default").req(ZONE_LABEL, Operator::In, &["test-zone-1", "test-zone-2"]);
    let p = pod("p")
        .preferred(
            100,
            vec![node_req(INSTANCE_TYPE_LABEL, "In", &["test-zone-3"])],
        )
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
    assert!(
        Env::new(nodepool("default"))
            .provision(&[p])
            .node_of("p")
            .is_some()
    );
}

// --- provisioning suite: Preferential Fallback ---

use karpenter_capi::scheduling::PreferencePolicy;

fn plain() -> karpenter_capi::api::nodepool::NodePool {
    let mut np = nodepool("default");
    np.spec.template.spec.requirements.clear();
    np
}

#[test]
fn prefer_no_schedule_is_tolerated_only_after_relaxing_affinity() {
    let np = plain().taints(vec![taint("foo", Some("bar"), "PreferNoSchedule")]);
    let p = pod("p")
        .preferred(1, vec![node_req(ZONE_LABEL, "In", &["invalid"])])
        .preferred(1, vec![node_req(INSTANCE_TYPE_LABEL, "In", &["invalid"])]);
    let out = Env::new(np).provision(&[p]);
    out.scheduled("p");
}

fn unmet_node_preference_packs_with_others(key: &str) {
    let a = pod("a").labels(&[("app", "foo")]).requests(&[("cpu", "2")]);
    let b = pod("b")
        .labels(&[("app", "baz")])
        .requests(&[("cpu", "1")])
        .preferred(1, vec![node_req(key, "In", &["value-1"])]);
    let out = Env::new(plain()).provision(&[a, b]);
    assert_eq!(out.scheduled("a").name, out.scheduled("b").name);
}

#[test]
fn an_unmet_zone_preference_still_packs_with_other_pods() {
    unmet_node_preference_packs_with_others(ZONE_LABEL);
}

#[test]
fn an_unmet_hostname_preference_still_packs_with_other_pods() {
    unmet_node_preference_packs_with_others("kubernetes.io/hostname");
}

fn ignoring(np: karpenter_capi::api::nodepool::NodePool) -> Env {
    let mut e = Env::new(np);
    e.preference_policy = PreferencePolicy::Ignore;
    e
}

#[test]
fn ignore_policy_drops_node_affinity_preferences() {
    let z1 = pod("z1")
        .labels(&[("app", "foo")])
        .node_selector(&[(ZONE_LABEL, "test-zone-1")])
        .requests(&[("cpu", "2")]);
    let z2 = pods("z2", 2, |p| {
        p.labels(&[("app", "bar")])
            .node_selector(&[(ZONE_LABEL, "test-zone-2")])
            .requests(&[("cpu", "3")])
    });
    let aff = pod("aff")
        .labels(&[("app", "baz")])
        .requests(&[("cpu", "1")])
        .preferred(1, vec![node_req(ZONE_LABEL, "In", &["test-zone-2"])]);
    let mut all = vec![z1];
    all.extend(z2);
    all.push(aff);
    let out = ignoring(plain()).provision(&all);
    assert_eq!(out.scheduled("aff").name, out.scheduled("z1").name);
    assert_ne!(out.scheduled("aff").name, out.scheduled("z2-0").name);
    out.scheduled("z2-1");
}

fn all_on_one_node(out: &Outcome, n: usize) {
    let names: std::collections::BTreeSet<String> = (0..n)
        .map(|i| out.scheduled(&format!("p-{i}")).name.clone())
        .collect();
    assert_eq!(names.len(), 1);
}

#[test]
fn ignore_policy_drops_zonal_schedule_anyway_spreads() {
    let foo = [("app", "foo")];
    let ps = pods("p", 5, |p| {
        p.labels(&foo).spread(ZONE_LABEL, 1, false, &foo)
    });
    all_on_one_node(&ignoring(plain()).provision(&ps), 5);
}

#[test]
fn ignore_policy_drops_hostname_schedule_anyway_spreads() {
    let foo = [("app", "foo")];
    let ps = pods("p", 5, |p| {
        p.labels(&foo)
            .spread("kubernetes.io/hostname", 1, false, &foo)
    });
    all_on_one_node(&ignoring(plain()).provision(&ps), 5);
}

#[test]
fn ignore_policy_drops_zonal_anti_affinity_preferences() {
    let foo = [("app", "foo")];
    let ps = pods("p", 5, |p| {
        p.labels(&foo)
            .pod_anti_affinity_preferred(1, ZONE_LABEL, &foo)
    });
    all_on_one_node(&ignoring(plain()).provision(&ps), 5);
}

#[test]
fn ignore_policy_drops_hostname_anti_affinity_preferences() {
    let foo = [("app", "foo")];
    let ps = pods("p", 5, |p| {
        p.labels(&foo)
            .pod_anti_affinity_preferred(1, "kubernetes.io/hostname", &foo)
    });
    all_on_one_node(&ignoring(plain()).provision(&ps), 5);
}

fn ignore_policy_drops_pod_affinity_preferences(key: &str) {
    let z1 = pod("z1")
        .labels(&[("app", "foo")])
        .node_selector(&[(ZONE_LABEL, "test-zone-1")])
        .requests(&[("cpu", "2")]);
    let z2 = pods("z2", 2, |p| {
        p.labels(&[("app", "bar")])
            .node_selector(&[(ZONE_LABEL, "test-zone-2")])
            .requests(&[("cpu", "3")])
    });
    let aff = pod("aff")
        .labels(&[("app", "baz")])
        .requests(&[("cpu", "1")])
        .pod_affinity_preferred(1, key, &[("app", "bar")]);
    let mut all = vec![z1];
    all.extend(z2);
    all.push(aff);
    let out = ignoring(plain()).provision(&all);
    assert_eq!(out.scheduled("aff").name, out.scheduled("z1").name);
    assert_ne!(out.scheduled("aff").name, out.scheduled("z2-0").name);
}

#[test]
fn ignore_policy_drops_zonal_pod_affinity_preferences() {
    ignore_policy_drops_pod_affinity_preferences(ZONE_LABEL);
}

#[test]
fn ignore_policy_drops_hostname_pod_affinity_preferences() {
    ignore_policy_drops_pod_affinity_preferences("kubernetes.io/hostname");
}
