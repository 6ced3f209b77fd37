//! The chart's PrometheusRule (templates/prometheusrule.yaml) against the controller: it is off
//! by default; every metric its expressions read is on a live /metrics of a controller on the
//! simulated cluster, declared (HELP and TYPE) on a fresh one already, with the labels the
//! expressions match and group by; helm renders it, with the values' thresholds, `for`s and
//! labels, as a PrometheusRule of one alert per configurable rule; and promtool (when
//! `.ci/install-tools` could get it) accepts its rule groups.
//!
//! The expressions are read from the template itself (its actions blanked) for the /metrics
//! check, so that check runs without helm; the helm test shows the rendered expressions read
//! the same metrics.

use std::collections::{BTreeMap, BTreeSet};

use karpenter_capi::metrics::Metrics;
use serde_json::Value;

use crate::assets::{self, Asset, tool};
use crate::common::chart::{CHART, yaml_docs};
use crate::common::exposition::{Served, family_types, sampled, samples};
use crate::deploy::{assert_ok, helm_template, path, read, run_tool, values};

pub fn tests() -> Vec<assets::Test> {
    trials![
        prometheus_rule_is_optional_and_off_by_default,
        promql_metrics_functions_and_labels_are_told_apart,
        @actix every_metric_the_alerts_read_is_on_a_live_metrics,
        helm_renders_one_alert_per_rule_with_its_values needs [Helm],
        promtool_accepts_the_rendered_rules needs [Helm, Promtool],
    ]
}

const TEMPLATE: &str = "templates/prometheusrule.yaml";

/// Labels Prometheus adds to every series it scrapes (the ServiceMonitor's target labels): the
/// rules may group by them though the controller does not export them.
const TARGET_LABELS: [&str; 6] = ["namespace", "job", "instance", "pod", "service", "endpoint"];

/// The PromQL functions and aggregations the rules may call. A word followed by `(` that is not
/// here fails the test: a misspelt function would otherwise pass for a metric-free call.
const FUNCTIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "topk",
    "bottomk",
    "group",
    "rate",
    "irate",
    "increase",
    "delta",
    "changes",
    "resets",
    "absent",
    "absent_over_time",
    "max_over_time",
    "min_over_time",
    "avg_over_time",
    "histogram_quantile",
    "clamp_min",
    "clamp_max",
    "vector",
    "scalar",
    "time",
];

/// Operator keywords, and the clauses whose parenthesised list names labels.
const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset", "inf", "nan"];
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// What one expression reads: each metric with the labels its matchers name, and the labels
/// its grouping clauses name.
#[derive(Debug, Default, PartialEq)]
struct Reads {
    metrics: BTreeMap<String, BTreeSet<String>>,
    grouping: BTreeSet<String>,
}

fn reads(expr: &str) -> Reads {
    try_reads(expr).unwrap_or_else(|e| panic!("{e}"))
}

/// A small PromQL reader: enough for the rules' expressions, not a parser. Strings, ranges and
/// matchers are skipped over as units; a word is a function (from [`FUNCTIONS`]), a keyword, a
/// label-list clause or a metric name.
fn try_reads(expr: &str) -> Result<Reads, String> {
    let chars: Vec<char> = expr.chars().collect();
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = Reads::default();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' {
            i = skip_string(&chars, i);
        } else if c == '[' {
            i += chars[i..]
                .iter()
                .position(|&c| c == ']')
                .map_or(chars.len(), |e| e + 1);
        } else if c == '{' {
            return Err(format!("{expr}: a selector without a metric name at {i}"));
        } else if c.is_ascii_digit() || c == '.' {
            // Numbers, and durations after `offset`.
            while i < chars.len() && (is_word(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if is_word(c) {
            let start = i;
            while i < chars.len() && is_word(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let opens = chars.get(next) == Some(&'(');
            if LABEL_LISTS.contains(&word.as_str()) {
                if opens {
                    let end = next
                        + chars[next..]
                            .iter()
                            .position(|&c| c == ')')
                            .ok_or_else(|| format!("{expr}: unclosed {word} ("))?;
                    let list: String = chars[next + 1..end].iter().collect();
                    out.grouping.extend(
                        list.split(',')
                            .map(str::trim)
                            .filter(|l| !l.is_empty())
                            .map(String::from),
                    );
                    i = end + 1;
                }
            } else if FUNCTIONS.contains(&word.as_str()) {
                // A call, or an aggregation whose `by (...)` comes first: nothing to take.
            } else if opens {
                return Err(format!(
                    "{expr}: {word}( is not a function the rules may call (FUNCTIONS)"
                ));
            } else if !KEYWORDS.contains(&word.as_str()) {
                let labels = out.metrics.entry(word).or_default();
                if chars.get(next) == Some(&'{') {
                    let end = matcher_end(&chars, next)
                        .ok_or_else(|| format!("{expr}: unclosed {{ at {next}"))?;
                    let inner: String = chars[next + 1..end].iter().collect();
                    labels.extend(matcher_labels(&inner));
                    i = end + 1;
                }
            }
        } else {
            i += 1;
        }
    }
    Ok(out)
}

/// The index after the string starting at `at`.
fn skip_string(chars: &[char], at: usize) -> usize {
    let quote = chars[at];
    let mut i = at + 1;
    while i < chars.len() && chars[i] != quote {
        if chars[i] == '\\' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// The index of the `}` closing the matchers opened at `at`, strings skipped.
fn matcher_end(chars: &[char], at: usize) -> Option<usize> {
    let mut i = at + 1;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' => i = skip_string(chars, i),
            '}' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// The label names of `a="x", b=~"y|z"`; text that is no matcher (a blanked template action)
/// is passed over.
fn matcher_labels(inner: &str) -> Vec<String> {
    let chars: Vec<char> = inner.chars().collect();
    let mut labels = Vec::new();
    let mut i = 0;
    let mut name = String::new();
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' => {
                if !name.is_empty() {
                    labels.push(std::mem::take(&mut name));
                }
                i = skip_string(&chars, i);
            }
            c if c.is_ascii_alphanumeric() || c == '_' => {
                name.push(c);
                i += 1;
            }
            '=' | '!' | '~' | ' ' => i += 1,
            _ => {
                name.clear();
                i += 1;
            }
        }
    }
    labels
}

/// The template with its actions blanked: a line holding only actions goes, every other action
/// becomes `0` (a number in an expression, a scalar elsewhere), so what is left is YAML.
fn blanked_template() -> String {
    let text = read(&path(&format!("{CHART}/{TEMPLATE}")));
    let mut out = String::new();
    for line in text.lines() {
        let mut kept = String::new();
        let mut only_actions = true;
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if chars[i] == '{' && chars.get(i + 1) == Some(&'{') {
                // An action ends at the first `}}` outside its string literals.
                i += 2;
                while i < chars.len() && !(chars[i] == '}' && chars.get(i + 1) == Some(&'}')) {
                    if chars[i] == '"' || chars[i] == '`' {
                        i = skip_string(&chars, i);
                    } else {
                        i += 1;
                    }
                }
                i += 2;
                kept.push('0');
            } else {
                if !chars[i].is_whitespace() {
                    only_actions = false;
                }
                kept.push(chars[i]);
                i += 1;
            }
        }
        if !only_actions || !line.contains("{{") {
            out.push_str(&kept);
            out.push('\n');
        }
    }
    out
}

/// The (alert, expr) pairs of a PrometheusRule document.
fn alerts(doc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for group in doc["spec"]["groups"].as_array().expect("spec.groups") {
        for rule in group["rules"].as_array().expect("a group's rules") {
            let alert = rule["alert"].as_str().expect("every rule is an alert");
            let expr = rule["expr"].as_str().expect("an alert's expr");
            out.push((alert.to_string(), expr.to_string()));
        }
    }
    out
}

fn template_alerts() -> Vec<(String, String)> {
    let docs = yaml_docs(&blanked_template(), &format!("{TEMPLATE} (blanked)"));
    assert_eq!(docs.len(), 1, "one PrometheusRule");
    alerts(&docs[0])
}

/// Every label each series carries, from the exposition with one series in every family
/// (`tests/fixtures/metrics.txt`, which src/metrics.rs's unit test keeps equal to the code).
fn exported_labels() -> BTreeMap<String, BTreeSet<String>> {
    let text = read(&path("tests/fixtures/metrics.txt"));
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, rest) in samples(&text) {
        let labels = out.entry(name.to_string()).or_default();
        if let Some(inner) = rest.strip_prefix('{') {
            let end = inner.rfind('}').expect("closing brace");
            labels.extend(matcher_labels(&inner[..end]));
        }
    }
    out
}

/// The family an exposed series name belongs to, and the TYPE its suffix needs; a gauge is its
/// own family whatever its name ends with (`..._pods_count`).
fn family<'a>(series: &'a str, types: &BTreeMap<String, String>) -> (&'a str, &'a str) {
    if types.get(series).is_some_and(|t| t == "gauge") {
        return (series, "gauge");
    }
    for (suffix, ty) in [
        ("_total", "counter"),
        ("_bucket", "histogram"),
        ("_sum", "histogram"),
        ("_count", "histogram"),
        ("_info", "info"),
    ] {
        if let Some(f) = series.strip_suffix(suffix) {
            return (f, ty);
        }
    }
    (series, "gauge")
}

fn prometheus_rule_is_optional_and_off_by_default() {
    assert_eq!(values()["prometheusRule"]["enabled"], false);
    let text = read(&path(&format!("{CHART}/{TEMPLATE}")));
    assert!(text.starts_with("{{- if .Values.prometheusRule.enabled }}"));
    assert!(text.trim_end().ends_with("{{- end }}"));
    // The template read the way the other tests read it, its actions blanked, has an alert for
    // every configurable rule.
    let names: BTreeSet<String> = template_alerts().into_iter().map(|(a, _)| a).collect();
    assert_eq!(
        names,
        alert_names_of_values(),
        "one alert per prometheusRule.rules entry"
    );
}

/// `KarpenterCapi` and the key of each rule in values.yaml, capitalised.
fn alert_names_of_values() -> BTreeSet<String> {
    values()["prometheusRule"]["rules"]
        .as_object()
        .expect("prometheusRule.rules")
        .keys()
        .map(|k| {
            let mut c = k.chars();
            let first = c.next().map(|f| f.to_ascii_uppercase()).unwrap_or_default();
            format!("KarpenterCapi{first}{}", c.as_str())
        })
        .collect()
}

fn promql_metrics_functions_and_labels_are_told_apart() {
    let r = reads(
        r#"(sum by (namespace, reason) (a_total{reason=~"x|y}", b!="{c}"}[1h] offset 5m) and on (job) c == 1) > 0.5
            unless max without (le) (rate(d_bucket[$w])) or absent(e{ 0 }) * 2"#,
    );
    let want: BTreeMap<String, BTreeSet<String>> = [
        ("a_total", vec!["reason", "b"]),
        ("c", vec![]),
        ("d_bucket", vec![]),
        ("e", vec![]),
    ]
    .into_iter()
    .map(|(m, l)| (m.to_string(), l.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(r.metrics, want);
    assert_eq!(
        r.grouping,
        ["namespace", "reason", "job", "le"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    assert!(
        try_reads("sume(a)").is_err(),
        "an unknown function is refused"
    );
    assert!(
        try_reads("{job=\"x\"}").is_err(),
        "a selector without a name is refused"
    );
}

async fn every_metric_the_alerts_read_is_on_a_live_metrics() {
    let alerts = template_alerts();
    assert!(alerts.len() >= 10, "{alerts:?}");
    let labels = exported_labels();
    // Each expression's metrics and labels against what the controller exports (the labels of
    // every family, from the exposition with one series in each).
    let mut problems = Vec::new();
    let mut used: BTreeSet<String> = BTreeSet::new();
    for (alert, expr) in &alerts {
        let r = reads(expr);
        assert!(!r.metrics.is_empty(), "{alert}: reads no metric");
        let mut known: BTreeSet<&str> = TARGET_LABELS.into_iter().collect();
        for (metric, matched) in &r.metrics {
            used.insert(metric.clone());
            let Some(exported) = labels.get(metric) else {
                problems.push(format!(
                    "{alert}: {metric} is not a series the controller exports"
                ));
                continue;
            };
            known.extend(exported.iter().map(String::as_str));
            for l in matched {
                if !exported.contains(l) && !TARGET_LABELS.contains(&l.as_str()) {
                    problems.push(format!("{alert}: {metric} has no label {l}"));
                }
            }
        }
        for l in &r.grouping {
            if !known.contains(l.as_str()) {
                problems.push(format!(
                    "{alert}: groups by {l}, which none of its metrics has"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // The controller on the simulated cluster, /metrics served as in production.
    let served = Served::start(1, Metrics::new()).await;

    // Fresh: before any pod, every family the alerts read is declared with the right TYPE, so
    // a dashboard finds it and an alert does not mistake it for a missing controller.
    let fresh = served.scrape().await;
    let types = family_types(&fresh);
    for metric in &used {
        let (fam, ty) = family(metric, &types);
        assert_eq!(
            types.get(fam).map(String::as_str),
            Some(ty),
            "{metric}: a fresh /metrics declares {fam} as a {ty}:\n{fresh}"
        );
    }
    // Families whose labels are a fixed list carry their series, at zero, from the start: an
    // increase() counts their first event, and absent() means what it says.
    let fresh_samples = sampled(&fresh);
    for metric in [
        "karpenter_capi_leader",
        "karpenter_capi_reconcile_timeouts_total",
        "karpenter_voluntary_disruption_decisions_total",
        "karpenter_voluntary_disruption_queue_failures_total",
        "karpenter_voluntary_disruption_eligible_nodes",
    ] {
        assert!(used.contains(metric), "an alert reads {metric}");
        assert!(
            fresh_samples.contains(metric),
            "{metric} has samples on a fresh /metrics:\n{fresh}"
        );
    }

    // A tiny launch: the families labelled by NodePool and MachineDeployment get series.
    served.bind_pods(2).await;
    let text = served.scrape().await;
    let types = family_types(&text);
    let samples = sampled(&text);
    for metric in &used {
        let (fam, ty) = family(metric, &types);
        assert_eq!(
            types.get(fam).map(String::as_str),
            Some(ty),
            "{metric}:\n{text}"
        );
    }
    for metric in [
        "karpenter_nodeclaims_launched_total",
        "karpenter_capi_replica_writes_total",
    ] {
        assert!(used.contains(metric), "an alert reads {metric}");
        assert!(
            samples.contains(metric),
            "{metric} has samples after a launch:\n{text}"
        );
    }
    // The counters the failure alerts take increase() of have their series at zero before the
    // first failure, for the pool and MachineDeployment that launched: that first failure is
    // counted.
    for (metric, labels) in [
        (
            "karpenter_capi_nodeclaims_create_timeouts_total",
            "machine_deployment=",
        ),
        (
            "karpenter_capi_nodeclaims_registration_timeouts_total",
            "machine_deployment=",
        ),
        (
            "karpenter_nodeclaims_disrupted_total",
            "reason=\"launch_timeout\"",
        ),
        (
            "karpenter_nodeclaims_disrupted_total",
            "reason=\"registration_timeout\"",
        ),
        ("karpenter_capi_replica_writes_total", "result=\"error\""),
    ] {
        assert!(
            crate::common::exposition::samples(&text).any(|(name, rest)| name == metric
                && rest.contains(labels)
                && rest.ends_with(" 0")),
            "{metric} {{{labels}}} is at zero before any failure:\n{text}"
        );
    }
    // Whatever has samples is a series the exported-labels table knows, so the label checks
    // above judged the alerts against the controller's real families.
    let unknown: Vec<&String> = samples
        .iter()
        .filter(|s| !labels.contains_key(*s))
        .collect();
    assert!(
        unknown.is_empty(),
        "series missing from tests/fixtures/metrics.txt: {unknown:?}"
    );
}

/// The values the helm test sets: every kind of knob, one rule switched off.
const OVERRIDES: &[&str] = &[
    "--set",
    "prometheusRule.enabled=true",
    "--set",
    "prometheusRule.namespace=monitoring",
    "--set",
    "prometheusRule.additionalLabels.release=kube-prometheus-stack",
    "--set",
    "prometheusRule.alertLabels.team=platform",
    "--set",
    "prometheusRule.rules.apiErrors.threshold=0.5",
    "--set",
    "prometheusRule.rules.apiErrors.window=5m",
    "--set",
    "prometheusRule.rules.noLeader.for=2m",
    "--set",
    "prometheusRule.rules.noLeader.severity=page",
    "--set",
    "prometheusRule.rules.leadershipChanging.enabled=false",
    "--set-string",
    "prometheusRule.rules.controllerDown.selector=job=\"karpenter\"",
];

fn rendered_rule(helm: &std::path::Path, extra: &[&str]) -> Value {
    let text = helm_template(helm, extra);
    let mut rules: Vec<Value> = yaml_docs(&text, "helm template")
        .into_iter()
        .filter(|d| d["kind"] == "PrometheusRule")
        .collect();
    assert_eq!(rules.len(), 1, "one PrometheusRule for {extra:?}");
    rules.remove(0)
}

/// prometheus-operator's pattern for a rule's `for`.
fn is_duration(s: &str) -> bool {
    let units = ["y", "w", "d", "h", "m", "s", "ms"];
    if s == "0" {
        return true;
    }
    let mut rest = s;
    let mut last = None;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = if rest.starts_with("ms") {
            "ms"
        } else {
            &rest[..rest.len().min(1)]
        };
        let Some(pos) = units.iter().position(|u| *u == unit) else {
            return false;
        };
        if last.is_some_and(|l| pos <= l) {
            return false;
        }
        last = Some(pos);
        rest = &rest[unit.len()..];
    }
    last.is_some()
}

fn check_rule_document(rule: &Value, what: &str) {
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1", "{what}");
    assert!(
        rule["metadata"]["name"]
            .as_str()
            .is_some_and(|n| !n.is_empty()),
        "{what}: a name"
    );
    let groups = rule["spec"]["groups"].as_array().expect("spec.groups");
    assert!(!groups.is_empty(), "{what}: no rule group");
    let mut seen = BTreeSet::new();
    for group in groups {
        assert!(
            group["name"].as_str().is_some_and(|n| !n.is_empty()),
            "{what}: group name"
        );
        for r in group["rules"].as_array().expect("rules") {
            let alert = r["alert"].as_str().expect("an alert");
            assert!(seen.insert(alert.to_string()), "{what}: {alert} twice");
            assert!(
                r.get("record").is_none(),
                "{what}: {alert} is an alert, not a recording"
            );
            assert!(
                r["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "{what}: {alert}"
            );
            let f = r["for"]
                .as_str()
                .unwrap_or_else(|| panic!("{what}: {alert} has a for"));
            assert!(is_duration(f), "{what}: {alert} for {f:?} is no duration");
            assert!(
                r["labels"]["severity"].is_string(),
                "{what}: {alert} severity"
            );
            for a in ["summary", "description"] {
                assert!(
                    r["annotations"][a].as_str().is_some_and(|s| !s.is_empty()),
                    "{what}: {alert} has a {a}"
                );
            }
        }
    }
}

fn helm_renders_one_alert_per_rule_with_its_values() {
    let helm = tool(Asset::Helm);
    let chart = path(CHART).to_string_lossy().into_owned();
    for extra in [&["--set", "prometheusRule.enabled=true"][..], OVERRIDES] {
        let mut args = vec!["lint", "--strict", chart.as_str()];
        args.extend_from_slice(extra);
        let out = assert_ok(&run_tool(&helm, &args), &format!("helm lint {extra:?}"));
        assert!(
            out.contains("0 chart(s) failed"),
            "helm lint {extra:?}: {out}"
        );
    }
    // Off by default: nothing rendered.
    let default = helm_template(&helm, &[]);
    assert!(!default.contains("kind: PrometheusRule"), "off by default");

    // On with the defaults: every rule of values.yaml, reading what the template reads.
    let rule = rendered_rule(&helm, &["--set", "prometheusRule.enabled=true"]);
    check_rule_document(&rule, "defaults");
    assert_eq!(rule["metadata"]["namespace"], crate::deploy::NAMESPACE);
    let rendered = alerts(&rule);
    let names: BTreeSet<String> = rendered.iter().map(|(a, _)| a.clone()).collect();
    assert_eq!(names, alert_names_of_values());
    let template: BTreeMap<String, String> = template_alerts().into_iter().collect();
    for (alert, expr) in &rendered {
        assert_eq!(
            reads(expr).metrics.keys().collect::<Vec<_>>(),
            reads(&template[alert]).metrics.keys().collect::<Vec<_>>(),
            "{alert}: the rendered expression reads what the template's does"
        );
        assert!(
            !expr.contains("{{") && !expr.contains("<no value>"),
            "{alert}: {expr}"
        );
    }
    let values = values();
    for r in rule["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
    {
        let alert = r["alert"].as_str().expect("alert");
        let key = alert.trim_start_matches("KarpenterCapi");
        let key = format!("{}{}", key[..1].to_ascii_lowercase(), &key[1..]);
        let v = &values["prometheusRule"]["rules"][&key];
        assert_eq!(r["for"], v["for"], "{alert}: for from values");
        assert_eq!(
            r["labels"]["severity"], v["severity"],
            "{alert}: severity from values"
        );
        if let Some(w) = v["window"].as_str() {
            assert!(
                r["expr"]
                    .as_str()
                    .is_some_and(|e| e.contains(&format!("[{w}]"))),
                "{alert}"
            );
        }
    }

    // Every knob reaches the document.
    let rule = rendered_rule(&helm, OVERRIDES);
    check_rule_document(&rule, "overrides");
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    assert_eq!(
        rule["metadata"]["labels"]["app.kubernetes.io/name"],
        "karpenter-capi"
    );
    let by_name: BTreeMap<String, &Value> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| (r["alert"].as_str().unwrap_or_default().to_string(), r))
        .collect();
    assert!(
        !by_name.contains_key("KarpenterCapiLeadershipChanging"),
        "switched off"
    );
    assert_eq!(by_name.len(), alert_names_of_values().len() - 1);
    assert!(by_name.values().all(|r| r["labels"]["team"] == "platform"));
    let api = by_name["KarpenterCapiApiErrors"]["expr"]
        .as_str()
        .expect("expr");
    assert!(
        api.contains("[5m]") && api.trim_end().ends_with("> 0.5"),
        "{api}"
    );
    assert_eq!(by_name["KarpenterCapiNoLeader"]["for"], "2m");
    assert_eq!(
        by_name["KarpenterCapiNoLeader"]["labels"]["severity"],
        "page"
    );
    let down = by_name["KarpenterCapiControllerDown"]["expr"]
        .as_str()
        .expect("expr");
    assert_eq!(
        down.trim(),
        "absent(karpenter_capi_leader{job=\"karpenter\"})"
    );
}

fn promtool_accepts_the_rendered_rules() {
    let helm = tool(Asset::Helm);
    let promtool = tool(Asset::Promtool);
    let dir = tempfile::tempdir().expect("tempdir");
    for (what, extra) in [
        ("defaults", &["--set", "prometheusRule.enabled=true"][..]),
        ("overrides", OVERRIDES),
    ] {
        let rule = rendered_rule(&helm, extra);
        // A rule file is the PrometheusRule's spec; JSON is YAML, which promtool reads.
        let file = dir.path().join(format!("{what}.rules.yaml"));
        std::fs::write(&file, rule["spec"].to_string()).expect("writing the rule file");
        let file = file.to_string_lossy().into_owned();
        let out = assert_ok(
            &run_tool(&promtool, &["check", "rules", &file]),
            &format!("promtool check rules ({what})"),
        );
        let n = alerts(&rule).len();
        assert!(
            out.contains(&format!("SUCCESS: {n} rules found")),
            "{what}: {out}"
        );
    }
}
