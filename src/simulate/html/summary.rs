//! The report's opening summary: the answers a reader looks for first (invariants, nodes and
//! cost, how fast pods were bound), as a short list of lines.

use super::at_secs;
use super::escape;
use super::figure;
use std::fmt::Write as _;

use serde_json::Value;

use crate::simulate::timeline::Timeline;

/// Milliseconds as a latency reads best: `7.59 ms`, `594 ms`, `12.3 s` from ten seconds on.
pub(super) fn duration_ms(ms: f64) -> String {
    durations_ms(&[ms]).join("")
}

/// Several milliseconds in one unit, seconds when the largest is ten seconds or more, so
/// `p50 6.23 s, p99 15 s` rather than `p50 6230 ms, p99 15 s`.
pub(super) fn durations_ms(ms: &[f64]) -> Vec<String> {
    let seconds = ms.iter().any(|m| m.abs() >= 10_000.0);
    ms.iter()
        .map(|m| {
            if seconds {
                format!("{} s", figure(m / 1000.0))
            } else {
                format!("{} ms", figure(*m))
            }
        })
        .collect()
}

/// The report's `blocked_nodes` (blocker -> counts) the most nodes first: `budget: at most 4
/// nodes in a pass, for 12 s, 0 at the end; ...`.
fn blocked_words(blocked: &Value) -> String {
    let Some(o) = blocked.as_object().filter(|o| !o.is_empty()) else {
        return "none".into();
    };
    let n = |c: &Value, k: &str| c[k].as_f64().unwrap_or(0.0);
    let mut seen: Vec<(&String, &Value)> = o.iter().collect();
    seen.sort_by(|a, b| n(b.1, "max_nodes").total_cmp(&n(a.1, "max_nodes")));
    seen.iter()
        .map(|(blocker, c)| {
            format!(
                "{blocker}: at most {} nodes in a pass, for {} s, {} at the end",
                figure(n(c, "max_nodes")),
                figure(n(c, "seconds_held")),
                figure(n(c, "at_end"))
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// One line of the summary: its id (`summary-<id>`, for tests and links), what, and the value.
pub(super) struct Line {
    pub(super) id: &'static str,
    pub(super) what: &'static str,
    pub(super) value: String,
    pub(super) bad: bool,
}

/// The summary: what the scenario ended with, in the words of its own report, each line only
/// when the scenario has the figures.
pub(super) fn summary_lines(r: &Value, t: &Timeline) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut add = |id, what, value: String, bad| {
        lines.push(Line {
            id,
            what,
            value,
            bad,
        })
    };
    // In the order a reader asks: did it hold, what did it cost, what happened, how fast.
    headline_lines(r, &mut add);
    capacity_lines(r, t, &mut add);
    workload_lines(r, &mut add);
    violations_line(r, &mut add);
    disruption_lines(r, &mut add);
    scenario_lines(r, &mut add);
    if let Some(blocked) = r.pointer("/disruption/blocked_nodes") {
        add(
            "blocked",
            "Nodes held back, by blocker",
            blocked_words(blocked),
            false,
        );
    }
    drain_line(r, &mut add);
    latency_lines(r, &mut add);
    if !t.marks.is_empty() {
        let phases: Vec<String> = t
            .marks
            .iter()
            .map(|m| format!("{} at {}", m.label, at_secs(m.at_ms)))
            .collect();
        add("phases", "Phases", phases.join(" · "), false);
    }
    lines
}

/// A figure of the report by its JSON pointer.
fn num(r: &Value, path: &str) -> Option<f64> {
    r.pointer(path).and_then(Value::as_f64)
}

/// A count of the report by its JSON pointer, as it reads.
fn count(r: &Value, path: &str) -> Option<String> {
    num(r, path).map(figure)
}

/// A count of the report, 0 when the scenario has none: a line that lists several reads
/// better with a 0 than with a gap.
fn count_or_zero(r: &Value, path: &str) -> String {
    count(r, path).unwrap_or_else(|| "0".into())
}

/// Where the disruption section keeps `k`.
fn disruption(k: &str) -> String {
    format!("/disruption/{k}")
}

/// What ran and whether the invariants held: the first thing a reader checks.
fn headline_lines(r: &Value, add: &mut impl FnMut(&'static str, &'static str, String, bool)) {
    let scenario = r["scenario"].as_str().unwrap_or("simulation");
    let ran = num(r, "/elapsed_ms")
        .map(|ms| {
            format!(
                ", {} from the workload's start to the report",
                duration_ms(ms)
            )
        })
        .unwrap_or_default();
    add("scenario", "Scenario", format!("{scenario}{ran}"), false);

    let ok = r["invariants_ok"].as_bool().unwrap_or(false);
    let problems = r["problems"].as_array().map_or(0, Vec::len);
    let verdict = match (ok, problems) {
        (true, _) => "ok".to_string(),
        (false, 0) => "VIOLATED".to_string(),
        (false, n) => format!("VIOLATED ({n} listed below)"),
    };
    add("invariants", "Invariants", verdict, !ok);
}

/// Nodes and cost: before and after a disruption when the scenario measured both, else the
/// last sample of the timeline.
fn capacity_lines(
    r: &Value,
    t: &Timeline,
    add: &mut impl FnMut(&'static str, &'static str, String, bool),
) {
    let last = t.samples.last();
    if let (Some(before), Some(after)) = (
        count(r, &disruption("nodes_before")),
        count(r, &disruption("nodes_after")),
    ) {
        let bound = count(r, &disruption("nodes_lower_bound"))
            .map(|b| format!(" (the pods' requests need at least {b})"))
            .unwrap_or_default();
        add(
            "nodes",
            "Nodes before → after",
            format!("{before} → {after}{bound}"),
            false,
        );
    } else if let Some(s) = last {
        let n = s.nodes.ready + s.nodes.not_ready + s.nodes.terminating;
        add(
            "nodes",
            "Nodes at the end",
            format!("{n} ({} ready)", s.nodes.ready),
            false,
        );
    }
    if let (Some(before), Some(after)) = (
        num(r, &disruption("cost_per_hour_before")),
        num(r, &disruption("cost_per_hour_after")),
    ) {
        add(
            "cost",
            "Cost per hour before → after",
            format!("{} → {}", figure(before), figure(after)),
            false,
        );
    } else if let Some(s) = last {
        add(
            "cost",
            "Cost per hour at the end",
            figure(s.cost_per_hour),
            false,
        );
    }
}

/// Pods, NodeClaims and how much of the nodes the pods asked for.
fn workload_lines(r: &Value, add: &mut impl FnMut(&'static str, &'static str, String, bool)) {
    if let Some(bound) = count(r, "/pods/bound") {
        let unbound = count_or_zero(r, "/pods/unschedulable");
        let created = count(r, "/pods/pending_at_start")
            .map(|n| format!("{n} created pending; "))
            .unwrap_or_default();
        let bad = unbound != "0";
        add(
            "pods",
            "Pods",
            format!("{created}at the end {bound} bound, {unbound} unbound"),
            bad,
        );
    }
    if let Some(requested) = count(r, "/claims/requested") {
        let c = |k: &str| count_or_zero(r, &format!("/claims/{k}"));
        add(
            "claims",
            "NodeClaims",
            format!(
                "{requested} created: {} launched, {} initialized, {} deleted, {} timed out",
                c("launched"),
                c("initialized"),
                c("deleted"),
                c("timed_out")
            ),
            false,
        );
    }
    if let (Some(cpu), Some(memory)) = (
        num(r, "/nodes/cpu_utilization"),
        num(r, "/nodes/memory_utilization"),
    ) {
        add(
            "utilization",
            "Requested of allocatable",
            format!(
                "{} % CPU, {} % memory",
                figure(cpu * 100.0),
                figure(memory * 100.0)
            ),
            false,
        );
    }
}

/// Violations: the disruption or drain section's, and the Machines' invariants, on one line so
/// that a clean run shows them all at 0.
fn violations_line(r: &Value, add: &mut impl FnMut(&'static str, &'static str, String, bool)) {
    let section = ["/disruption", "/termination"]
        .into_iter()
        .find(|s| r.pointer(s).is_some());
    let mut violations = Vec::new();
    let mut any = 0.0;
    let mut push = |n: Option<f64>, what: &str| {
        if let Some(n) = n {
            any += n;
            violations.push(format!("{} {what}", figure(n)));
        }
    };
    if let Some(s) = section {
        push(num(r, &format!("{s}/budget_violations")), "budget");
        push(
            num(r, &format!("{s}/pdb_violations")),
            "PodDisruptionBudget",
        );
        push(
            num(r, &format!("{s}/do_not_disrupt_violations")),
            "do-not-disrupt",
        );
    }
    push(num(r, "/machines/leaked"), "Machines leaked");
    push(num(r, "/machines/double_bound"), "Machines double-bound");
    if violations.is_empty() {
        return;
    }
    let mut value = violations.join(", ");
    // Cluster API deleting on its own is no fault of the controller's, but worth seeing.
    if let Some(excess) = num(r, &disruption("budget_excess_any")).filter(|e| *e > 0.0) {
        let _ = write!(
            value,
            " (Cluster API's own deletions went {} over a budget: not the controller's)",
            figure(excess)
        );
    }
    add("violations", "Violations", value, any > 0.0);
}

/// What disruption decided and did, a rollout's progress, and how long a template change took
/// to reach the nodes.
fn disruption_lines(r: &Value, add: &mut impl FnMut(&'static str, &'static str, String, bool)) {
    if r.pointer("/disruption").is_some() {
        add("disruption", "Disruption", disruption_words(r), false);
    }
    if let Some(ro) = r.pointer("/disruption/rollout") {
        add("rollout", "Rollout", rollout_words(ro), false);
    }
    if let Some(ms) = num(r, &disruption("nodes_up_to_date_after_ms")) {
        add(
            "nodes-up-to-date",
            "NodesUpToDate",
            format!("True {} after the template change", duration_ms(ms)),
            false,
        );
    }
    if let Some(held) = num(r, &disruption("pause/held_ms")) {
        let drifted = num(r, &disruption("pause/drifted_while_paused")).unwrap_or(0.0);
        add(
            "pause",
            "Disruption paused",
            format!(
                "{} from the template change; {} claims drifted meanwhile",
                duration_ms(held),
                figure(drifted)
            ),
            drifted > 0.0,
        );
    }
}

/// The disruption section's decisions by reason (only those taken) and its pace.
fn disruption_words(r: &Value) -> String {
    let decisions: Vec<String> = ["empty", "underutilized", "drifted", "expired", "other"]
        .into_iter()
        .filter_map(|k| {
            num(r, &format!("/disruption/decisions/{k}"))
                .filter(|n| *n > 0.0)
                .map(|n| format!("{} {k}", figure(n)))
        })
        .collect();
    let decided = if decisions.is_empty() {
        "no claims disrupted".to_string()
    } else {
        format!("claims disrupted: {}", decisions.join(", "))
    };
    let c = |k: &str| count_or_zero(r, &disruption(k));
    format!(
        "{decided}; {} of the {} claims before it are gone; at most {} disrupted at once; took {}",
        c("claims_replaced"),
        c("claims_before"),
        c("max_disrupting"),
        duration_ms(num(r, &disruption("phase_ms")).unwrap_or(0.0))
    )
}

/// A rollout's section: how far the replacement of its MachineDeployment's claims got.
fn rollout_words(ro: &Value) -> String {
    let c = |k: &str| {
        ro.get(k)
            .and_then(Value::as_f64)
            .map(figure)
            .unwrap_or_else(|| "0".into())
    };
    format!(
        "{}: {} of {} claims replaced, {} of {} Machines up to date, at most {} disrupted at once",
        ro["machine_deployment"].as_str().unwrap_or("?"),
        c("claims_replaced"),
        c("claims_before"),
        c("machines_up_to_date"),
        c("machines"),
        c("max_disrupting")
    )
}

/// The drain section's counts, when the scenario drained.
fn drain_line(r: &Value, add: &mut impl FnMut(&'static str, &'static str, String, bool)) {
    if r.pointer("/termination").is_none() {
        return;
    }
    let c = |k: &str| count_or_zero(r, &format!("/termination/{k}"));
    add(
        "drain",
        "Drain",
        format!(
            "{} claims deleted, {} drained, {} Machines released; {} evictions, {} refused by a budget and retried",
            c("claims_deleted"),
            c("drained"),
            c("machines_released"),
            c("evictions"),
            c("eviction_retries_429")
        ),
        false,
    );
}

/// Latencies, each only where the scenario measured some: percentiles of nothing would read
/// as 0, a false good answer.
fn latency_lines(r: &Value, add: &mut impl FnMut(&'static str, &'static str, String, bool)) {
    let percentiles = |path: &str| {
        let p = |q: &str| num(r, &format!("{path}/{q}"));
        match durations_ms(&[p("p50")?, p("p99")?]).as_slice() {
            [p50, p99] => Some(format!("p50 {p50}, p99 {p99}")),
            _ => None,
        }
    };
    // (id, what, the count that says the scenario measured any, where the percentiles are)
    let latencies = [
        (
            "pending-to-bound",
            "Pod pending → bound",
            "/pods/bound",
            "/latency_ms/pod_pending_to_bound",
        ),
        (
            "claim-to-launched",
            "NodeClaim created → Launched",
            "/claims/launched",
            "/latency_ms/claim_to_launched",
        ),
        (
            "claim-to-initialized",
            "NodeClaim created → Initialized",
            "/claims/initialized",
            "/latency_ms/claim_to_initialized",
        ),
        (
            "drain-latency",
            "NodeClaim deleted → drained",
            "/termination/drained",
            "/termination/drain_ms",
        ),
    ];
    for (id, what, measured, path) in latencies {
        if num(r, measured).is_some_and(|n| n > 0.0)
            && let Some(v) = percentiles(path)
        {
            add(id, what, v, false);
        }
    }
    if let Some(ms) = num(r, &disruption("pods_max_pending_ms")) {
        add(
            "longest-pending",
            "Longest a pod waited during disruption",
            duration_ms(ms),
            false,
        );
    }
}

/// The lines of one scenario or flag: drift's back-off against failing launches
/// (`--fail-replacements`), the quota scenario's hold and release.
fn scenario_lines(r: &Value, add: &mut impl FnMut(&'static str, &'static str, String, bool)) {
    let num = |path: &str| r.pointer(path).and_then(Value::as_f64);
    let n = |path: &str| figure(num(path).unwrap_or(0.0));
    if r.pointer("/disruption/backoff").is_some() {
        let b = |k: &str| format!("/disruption/backoff/{k}");
        let finished = num(&b("up_to_date_after_lift_ms"));
        add(
            "backoff",
            "Drift back-off (launches failing)",
            format!(
                "launches failed for {}: {} replacements timed out, {} back-offs, the longest {}; drift finished {}",
                duration_ms(num(&b("failing_ms")).unwrap_or(0.0)),
                n(&b("failed_replacements")),
                n(&b("backoffs")),
                duration_ms(num(&b("longest_backoff_ms")).unwrap_or(0.0)),
                finished.map_or("never after the lift".to_string(), |ms| format!(
                    "{} after the lift",
                    duration_ms(ms)
                ))
            ),
            num(&b("backoffs")).unwrap_or(0.0) == 0.0 || finished.is_none_or(|ms| ms == 0.0),
        );
    }
    if r.pointer("/quota").is_some() {
        let limit = |k: &str| num(&format!("/quota/limit_{k}")).map_or("-".into(), figure);
        let held = num("/quota/pods_held_by_quota").unwrap_or(0.0);
        add(
            "quota",
            "CapacityQuota",
            format!(
                "limits cpu {}, nodes {}; provisioned {} CPUs on {} nodes (at most {} CPUs at any sample); {} of {} pending pods held by it; all bound {} after its deletion",
                limit("cpu"),
                limit("nodes"),
                n("/quota/provisioned_cpu"),
                n("/quota/provisioned_nodes"),
                n("/quota/max_provisioned_cpu"),
                figure(held),
                n("/quota/pods_pending"),
                duration_ms(num("/quota/removal_to_all_bound_ms").unwrap_or(0.0))
            ),
            held < num("/quota/pods_pending").unwrap_or(0.0),
        );
    }
    if r.pointer("/generate").is_some() {
        let g = |k: &str| format!("/generate/{k}");
        let pct = |path: &str| format!("{:.1}%", num(path).unwrap_or(0.0) * 100.0);
        let left = ["groups_left", "templates_left"].iter().any(|k| {
            r.pointer(&g(&format!("scale_down/{k}")))
                .and_then(Value::as_array)
                .is_none_or(|a| !a.is_empty())
        });
        let cost_ratio = num(&g("cost_ratio")).unwrap_or(0.0);
        add(
            "generate",
            "Generated node groups",
            format!(
                "{} groups generated (at most {} at once, max {}); cost {:.3}/h against {:.3}/h on three fixed sizes (x{:.3}), CPU utilisation {} against {}; every group gone {} after the scale to zero",
                n(&g("groups_generated")),
                n(&g("max_groups_at_once")),
                n(&g("max_machine_deployments")),
                num(&g("generated/cost_per_hour")).unwrap_or(0.0),
                num(&g("baseline/cost_per_hour")).unwrap_or(0.0),
                cost_ratio,
                pct(&g("generated/cpu_utilization")),
                pct(&g("baseline/cpu_utilization")),
                num(&g("scale_down/groups_removed_ms")).map_or("never".into(), duration_ms),
            ),
            left || cost_ratio >= 1.0,
        );
    }
}

pub(super) fn summary_section(r: &Value, t: &Timeline) -> String {
    let mut s = String::from(
        "<section id=\"summary\">\n<h2>Summary</h2>\n<table class=\"summary\">\n<tbody>\n",
    );
    for l in summary_lines(r, t) {
        let class = if l.bad { " class=\"bad\"" } else { "" };
        let _ = writeln!(
            s,
            "<tr id=\"summary-{}\"><th>{}</th><td{class}>{}</td></tr>",
            l.id,
            escape(l.what),
            escape(&l.value)
        );
    }
    s.push_str("</tbody>\n</table>\n");
    let problems: Vec<&str> = r["problems"]
        .as_array()
        .map(|ps| ps.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !problems.is_empty() {
        s.push_str("<ul id=\"problems\" class=\"bad\">\n");
        for p in problems {
            let _ = writeln!(s, "<li>{}</li>", escape(p));
        }
        s.push_str("</ul>\n");
    }
    s.push_str(
        "<p class=\"note\">Every figure was measured by the simulated cluster (its store, write log and audits), not reported by the controller.</p>\n</section>\n",
    );
    s
}
