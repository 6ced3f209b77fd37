//! deploy/grafana/karpenter-capi.json against the controller: every metric any panel or variable
//! queries is one the controller exposes on /metrics (read over HTTP from a controller that
//! provisioned pods on the simulated cluster; families still without series, which /metrics
//! shows by their HELP and TYPE lines only, are checked against the registry's declared series
//! names), and the dashboard covers what operators watch.

use std::collections::BTreeSet;

use karpenter_capi::metrics::Metrics;
use serde_json::Value;

use crate::common::exposition::{Served, sampled};

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/deploy/grafana/karpenter-capi.json"
);

/// PromQL words that are not metric names.
const KEYWORDS: [&str; 10] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
];

/// The metric names a PromQL expression reads: identifiers outside strings, label matchers,
/// ranges and grouping clauses that are not functions (followed by `(`) or keywords.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Blank out strings, `{...}` and `[...]` so only names, functions and keywords remain.
    let mut plain = String::new();
    let (mut quote, mut depth) = (false, 0);
    let mut chars = expr.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quote => {
                chars.next();
            }
            '"' => quote = !quote,
            '{' | '[' if !quote => depth += 1,
            '}' | ']' if !quote => depth -= 1,
            c if !quote && depth == 0 => {
                plain.push(c);
                continue;
            }
            _ => {}
        }
        plain.push(' ');
    }
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    let mut rest = plain.as_str();
    let mut skip_group = false;
    while let Some(start) = rest.find(|c: char| is_word(c) || c == '(' || c == '$') {
        rest = &rest[start..];
        if rest.starts_with('(') {
            if skip_group {
                // `by (labels)`: label names, not metrics.
                rest = &rest[rest.find(')').map_or(rest.len(), |e| e + 1)..];
                skip_group = false;
            } else {
                rest = &rest[1..];
            }
            continue;
        }
        let end = rest[1..]
            .find(|c: char| !is_word(c))
            .map_or(rest.len(), |e| e + 1);
        let word = &rest[..end];
        rest = &rest[end..];
        let next = rest.trim_start();
        // A function call, or an aggregation with its grouping first: `sum by (le) (...)`.
        let called = next.starts_with('(')
            || ["by", "without"]
                .iter()
                .any(|k| next.starts_with(k) && next[k.len()..].trim_start().starts_with('('));
        skip_group = matches!(word, "by" | "without" | "on" | "ignoring");
        let numeric = word.starts_with(|c: char| c.is_ascii_digit());
        if !called && !numeric && !word.starts_with('$') && !KEYWORDS.contains(&word) {
            names.insert(word.to_string());
        }
    }
    names
}

/// Every metric the dashboard reads: panel targets and `label_values(metric, label)` variables.
fn dashboard_metrics(dashboard: &Value) -> BTreeSet<String> {
    let mut exprs = Vec::new();
    let mut stack = vec![dashboard];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                if let Some(e) = o.get("expr").and_then(Value::as_str) {
                    exprs.push(e.to_string());
                }
                stack.extend(o.values());
            }
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
    let mut names: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(q) = var["definition"].as_str() {
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|q| q.split(',').next())
                .unwrap_or_else(|| panic!("a label_values variable: {q}"));
            names.extend(metric_names(inner));
        }
    }
    names
}

#[test]
fn promql_names_are_told_from_functions_labels_and_keywords() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le, machine_deployment) (rate(a_bucket{x=~"$v", y="b c"}[$__rate_interval]))) / on (pod) b * 60 and max without(x) (c)"#,
    );
    assert_eq!(
        names,
        ["a_bucket", "b", "c"]
            .map(String::from)
            .into_iter()
            .collect()
    );
}

#[actix::test]
async fn every_metric_the_dashboard_queries_is_on_metrics() {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).expect("dashboard"))
            .expect("the dashboard is JSON");
    let queried = dashboard_metrics(&dashboard);

    // A controller that provisioned pods, so the launch path's series have samples.
    let metrics = Metrics::new();
    let declared: BTreeSet<String> = metrics.series_names().iter().cloned().collect();
    let served = Served::start(2, metrics).await;
    served.bind_pods(6).await;

    let text = served.scrape().await;
    let sampled = sampled(&text);
    // Families without series yet (no disruption happened here) show only their HELP and TYPE
    // lines, under the family's name, so the registry's declared series names stand in for
    // those; whatever has samples is declared.
    assert!(
        sampled.is_subset(&declared),
        "undeclared: {:?}",
        sampled.difference(&declared).collect::<Vec<_>>()
    );
    let missing: Vec<&String> = queried.difference(&declared).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics the controller does not expose: {missing:?}"
    );
    for name in &queried {
        assert!(name.starts_with("karpenter_"), "{name}: not ours");
    }
    // What operators watch is on the dashboard.
    for want in [
        "karpenter_nodeclaims_created_total",
        "karpenter_nodeclaims_launched_total",
        "karpenter_nodeclaims_registered_total",
        "karpenter_nodeclaims_initialized_total",
        "karpenter_nodeclaims_terminated_total",
        "karpenter_capi_nodeclaim_launch_duration_seconds_bucket",
        "karpenter_capi_provider_id_to_claim_duration_seconds_bucket",
        "karpenter_capi_replica_writes_total",
        "karpenter_capi_replica_write_batch_size_bucket",
        "karpenter_capi_nodeclaims_create_timeouts_total",
        "karpenter_capi_nodeclaims_registration_timeouts_total",
        "karpenter_scheduler_scheduling_duration_seconds_bucket",
        "karpenter_nodepools_usage",
        "karpenter_nodepools_limit",
        "karpenter_voluntary_disruption_decisions_total",
        "karpenter_voluntary_disruption_eligible_nodes",
        "karpenter_nodepools_allowed_disruptions",
        "karpenter_nodepools_nodes_consuming_budgets",
        "karpenter_voluntary_disruption_queue_failures_total",
        "karpenter_nodeclaims_disrupted_total",
    ] {
        assert!(queried.contains(want), "the dashboard shows {want}");
    }
    // The launch path ran, so its series carry samples, not only declarations.
    for live in [
        "karpenter_nodeclaims_created_total",
        "karpenter_nodeclaims_initialized_total",
        "karpenter_capi_nodeclaim_launch_duration_seconds_bucket",
        "karpenter_capi_replica_writes_total",
        "karpenter_capi_replica_write_batch_size_bucket",
        "karpenter_scheduler_scheduling_duration_seconds_bucket",
    ] {
        assert!(sampled.contains(live), "{live} has samples:\n{text}");
    }
}
