use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::*;
use crate::disruption::Drift;
use crate::testing::{candidate, pod};

const COST: &str = POD_DELETION_COST_ANNOTATION;
const MARK: &str = MANAGED_DELETION_COST_ANNOTATION;

fn rs_pod(name: &str, node: &str, annotations: &[(&str, &str)]) -> Pod {
    let mut p = pod(name).node(node).build();
    p.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "web-1".into(),
        uid: "rs-uid".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    if !annotations.is_empty() {
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }
    p
}

fn index(pods: Vec<Pod>) -> Pods {
    let mut idx = Pods::default();
    for p in pods {
        idx.apply(p);
    }
    idx
}

/// Per pod name, the action planned.
fn planned(ranking: &[&str], pods: Vec<Pod>, written: &[(&str, &str)]) -> HashMap<String, Action> {
    let ranking: Vec<String> = ranking.iter().map(|n| n.to_string()).collect();
    let written = written
        .iter()
        .map(|(k, v)| (format!("default/{k}"), v.to_string()))
        .collect();
    plan(&ranking, &index(pods), &written)
        .into_iter()
        .map(|w| (w.pod.name_any(), w.action))
        .collect()
}

fn drifted(mut c: Candidate, since: i64) -> Candidate {
    c.drift = Some(Drift::NodePoolDrifted);
    c.drifted_since = Some(since);
    c
}

#[test]
fn ranking_puts_disrupting_then_drifted_then_consolidation_order() {
    let cheap_busy = candidate("busy", "m", "on-demand", 1.0, vec!["a".into(); 9]);
    let dear_idle = candidate("idle", "m", "on-demand", 4.0, vec!["a".into()]);
    let old_drift = drifted(candidate("old", "m", "on-demand", 1.0, vec![]), 100);
    let new_drift = drifted(candidate("new", "m", "on-demand", 9.0, vec![]), 200);
    let ranked = ranking(
        vec!["going".into()],
        &[cheap_busy, new_drift, dear_idle, old_drift],
    );
    assert_eq!(ranked, ["going", "old", "new", "idle", "busy"]);
}

#[test]
fn ranking_is_capped_and_costs_rise_by_position_below_zero() {
    let many: Vec<Candidate> = (0..80)
        .map(|i| candidate(&format!("n{i:02}"), "m", "on-demand", 1.0, vec![]))
        .collect();
    let ranked = ranking(Vec::new(), &many);
    assert_eq!(ranked.len(), MAX_RANKED_NODES);
    assert_eq!(ranked[0], "n00");
    assert_eq!(cost_at(0), -50);
    assert!(cost_at(0) < cost_at(1));
    assert!(
        cost_at(MAX_RANKED_NODES - 1) < 0,
        "below an unranked pod's 0"
    );
}

#[test]
fn ranked_nodes_pods_get_the_cost_and_the_marker() {
    let mut ds = pod("ds").node("n1").build();
    ds.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "DaemonSet".into(),
        name: "d".into(),
        uid: "d".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    let mut mirror = pod("static").node("n1").build();
    mirror.metadata.annotations =
        Some([("kubernetes.io/config.mirror".to_string(), "x".to_string())].into());
    let got = planned(
        &["n1", "n2"],
        vec![
            rs_pod("a", "n1", &[]),
            rs_pod("b", "n2", &[]),
            rs_pod("c", "n3", &[]),
            ds,
            mirror,
        ],
        &[],
    );
    assert_eq!(got.get("a"), Some(&Action::Set(cost_at(0))));
    assert_eq!(got.get("b"), Some(&Action::Set(cost_at(1))));
    assert_eq!(
        got.len(),
        2,
        "unranked node, DaemonSet and static pods untouched: {got:?}"
    );
}

#[test]
fn a_customer_deletion_cost_is_never_touched() {
    let got = planned(
        &["n1"],
        vec![
            rs_pod("theirs", "n1", &[(COST, "1000")]),
            rs_pod("released", "n1", &[(COST, "7"), (MARK, "false")]),
        ],
        &[("theirs", "-50")],
    );
    assert!(got.is_empty(), "{got:?}");
}

#[test]
fn a_changed_managed_value_is_released() {
    let got = planned(
        &["n1"],
        vec![
            rs_pod("changed", "n1", &[(COST, "999"), (MARK, "true")]),
            rs_pod("emptied", "n1", &[(MARK, "true")]),
            rs_pod("kept", "n1", &[(COST, "-50"), (MARK, "true")]),
        ],
        &[("changed", "-50"), ("emptied", "-50"), ("kept", "-50")],
    );
    assert_eq!(got.get("changed"), Some(&Action::Release));
    assert_eq!(got.get("emptied"), Some(&Action::Set(cost_at(0))));
    assert_eq!(got.get("kept"), None);
}

#[test]
fn after_a_restart_the_marker_vouches_for_the_value() {
    let got = planned(
        &["n2", "n1"],
        vec![rs_pod("a", "n1", &[(COST, "-50"), (MARK, "true")])],
        &[],
    );
    assert_eq!(got.get("a"), Some(&Action::Set(cost_at(1))));
}

#[test]
fn pods_of_nodes_leaving_the_ranking_are_cleared() {
    let got = planned(
        &["n2"],
        vec![rs_pod("a", "n1", &[(COST, "-50"), (MARK, "true")])],
        &[("a", "-50")],
    );
    assert_eq!(got.get("a"), Some(&Action::Clear));
}

#[test]
fn an_unchanged_ranking_writes_nothing() {
    let ranking = ["n1", "n2"];
    let pods = || vec![rs_pod("a", "n1", &[]), rs_pod("b", "n2", &[])];
    let first = planned(&ranking, pods(), &[]);
    assert_eq!(first.len(), 2);
    // The pods as the writes leave them.
    let written: Vec<(String, String)> = first
        .iter()
        .map(|(name, a)| match a {
            Action::Set(cost) => (name.clone(), cost.to_string()),
            other => panic!("{other:?}"),
        })
        .collect();
    let after: Vec<Pod> = written
        .iter()
        .map(|(name, cost)| {
            let node = if name == "a" { "n1" } else { "n2" };
            rs_pod(name, node, &[(COST, cost), (MARK, "true")])
        })
        .collect();
    let memory: Vec<(&str, &str)> = written
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_str()))
        .collect();
    assert!(planned(&ranking, after, &memory).is_empty());
}
