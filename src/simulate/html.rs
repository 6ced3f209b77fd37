//! The HTML report: one self-contained page (no scripts, no external fonts, styles or links).
//! It opens with a summary of what a reader asks first (did the invariants hold, how many nodes
//! at what cost, how fast pods were bound), then a chart per series of the timeline, drawn by
//! `plotters` as inline SVG with a labelled line at each of the scenario's phase changes, then
//! every figure of the JSON report. Figures are rounded for reading (see [`figure`]); the JSON
//! report keeps them exact. The page is well-formed XML as well as HTML, so any XML parser can
//! check it.

use std::fmt::Write as _;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;
use serde_json::Value;

use super::timeline::{Mark, Timeline};

#[derive(Debug, thiserror::Error)]
#[error("drawing the chart {chart:?}: {reason}")]
pub struct ChartError {
    pub chart: String,
    pub reason: String,
}

/// One line of a chart: its legend and its points (seconds, value).
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

/// One chart: `counts` charts count things, so their axis has whole ticks only.
struct Chart {
    title: &'static str,
    y_desc: &'static str,
    counts: bool,
    series: Vec<Series>,
}

/// The charts' titles, in page order (tests look for them).
pub const CHARTS: [&str; 5] = [
    "Pending pods",
    "Nodes by phase",
    "NodeClaims by phase",
    "Replica writes per MachineDeployment",
    "Cost per hour",
];

const WIDTH: u32 = 900;
/// The margin right of the plot that holds the legend.
const LEGEND_PX: u32 = 170;
const HEIGHT: u32 = 340;
/// Rows of phase labels above a chart's plot, so labels of phases close in time do not overlap.
const MARK_ROWS: i32 = 3;
const MARK_ROW_PX: i32 = 15;
const MARK_FONT_PX: i32 = 12;
/// A generous average glyph width of sans-serif at `MARK_FONT_PX`, to keep labels apart.
const MARK_CHAR_PX: i32 = 7;
/// Tableau's ten colours: told apart on white, none as pale as yellow.
const COLORS: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

const STYLE: &str = "body{font-family:sans-serif;margin:2em auto;max-width:60em;padding:0 1em;color:#222}\
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em}\
figure{margin:1.5em 0}figcaption{font-weight:bold;margin-bottom:.3em}\
svg{width:100%;height:auto;border:1px solid #ddd}\
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}\
th{background:#f4f4f4;font-weight:normal}table.summary th{white-space:nowrap}\
td.v{font-family:monospace;text-align:right}.bad{color:#b00;font-weight:bold}.ok{color:#070;font-weight:bold}\
p.note{color:#555;font-size:.9em}";

/// A figure as a person reads it: whole values without a fraction (`9`, not `9.0`), from 100
/// on to the unit (`594`), below that to three significant digits (`33.3`, `7.59`, `0.454`),
/// never with trailing zeros; `n/a` for what is not a number.
pub fn figure(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let s = if x.abs() >= 100.0 || x == x.trunc() {
        format!("{:.0}", x.round())
    } else {
        // Three significant digits: two decimals at 1.xx, one more per decade below.
        let decimals = (2 - x.abs().log10().floor() as i64).clamp(0, 12) as usize;
        let s = format!("{x:.decimals$}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    if s == "-0" { "0".into() } else { s }
}

/// Milliseconds as a latency reads best: `7.59 ms`, `594 ms`, `12.3 s` from ten seconds on.
fn duration_ms(ms: f64) -> String {
    durations_ms(&[ms]).join("")
}

/// Several milliseconds in one unit, seconds when the largest is ten seconds or more, so
/// `p50 6.23 s, p99 15 s` rather than `p50 6230 ms, p99 15 s`.
fn durations_ms(ms: &[f64]) -> Vec<String> {
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

/// Seconds on the charts' clock (since the simulated cluster started).
fn at_secs(ms: u64) -> String {
    format!("{} s", figure(ms as f64 / 1000.0))
}

/// The page for one scenario's report (`json` is the JSON report).
pub fn render(json: &str, timeline: &Timeline) -> Result<String, ChartError> {
    let report: Value = serde_json::from_str(json).unwrap_or(Value::Null);
    let scenario = report["scenario"].as_str().unwrap_or("simulation");
    let mut page = String::new();
    page.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n");
    let _ = write!(
        page,
        "<title>karpenter-capi simulate: {}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>karpenter-capi simulate: scenario {}</h1>\n",
        escape(scenario),
        escape(scenario)
    );
    page.push_str(&summary_section(&report, timeline));
    page.push_str("<section id=\"charts\">\n<h2>Over time</h2>\n");
    if !timeline.marks.is_empty() {
        page.push_str(
            "<p class=\"note\">Dashed lines mark where the scenario moved to its next phase.</p>\n",
        );
    }
    for c in chart_data(timeline) {
        let svg = chart(&c, &timeline.marks)?;
        let _ = write!(
            page,
            "<figure id=\"{}\">\n<figcaption>{}</figcaption>\n{}\n</figure>\n",
            slug(c.title),
            escape(c.title),
            with_title(&svg, c.title)
        );
    }
    page.push_str(
        "</section>\n<section id=\"all-figures\">\n<h2>Every figure</h2>\n\
         <p class=\"note\">The JSON report's figures by their dotted path, rounded for reading (<code>--report json</code> has them exact).</p>\n\
         <table id=\"figures\">\n<thead><tr><th>figure</th><th>value</th></tr></thead>\n<tbody>\n",
    );
    for (key, value) in flatten(&report) {
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td class=\"v\">{}</td></tr>",
            escape(&key),
            escape(&value)
        );
    }
    page.push_str("</tbody>\n</table>\n</section>\n</body>\n</html>\n");
    Ok(page)
}

/// One line of the summary: its id (`summary-<id>`, for tests and links), what, and the value.
struct Line {
    id: &'static str,
    what: &'static str,
    value: String,
    bad: bool,
}

/// The summary: what the scenario ended with, in the words of its own report, each line only
/// when the scenario has the figures.
fn summary_lines(r: &Value, t: &Timeline) -> Vec<Line> {
    let num = |path: &str| r.pointer(path).and_then(Value::as_f64);
    let count = |path: &str| num(path).map(figure);
    let mut lines = Vec::new();
    let mut add = |id, what, value: String, bad| {
        lines.push(Line {
            id,
            what,
            value,
            bad,
        })
    };
    let scenario = r["scenario"].as_str().unwrap_or("simulation");
    let ran = num("/elapsed_ms")
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

    let last = t.samples.last();
    let d = |k: &str| format!("/disruption/{k}");
    if let (Some(before), Some(after)) = (count(&d("nodes_before")), count(&d("nodes_after"))) {
        let bound = count(&d("nodes_lower_bound"))
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
        num(&d("cost_per_hour_before")),
        num(&d("cost_per_hour_after")),
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

    if let Some(bound) = count("/pods/bound") {
        let unbound = count("/pods/unschedulable").unwrap_or_else(|| "0".into());
        let created = count("/pods/pending_at_start")
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
    if let Some(requested) = count("/claims/requested") {
        let c = |k: &str| count(&format!("/claims/{k}")).unwrap_or_else(|| "0".into());
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
        num("/nodes/cpu_utilization"),
        num("/nodes/memory_utilization"),
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

    // Violations: the disruption or drain section's, and the Machines' invariants.
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
        push(num(&format!("{s}/budget_violations")), "budget");
        push(num(&format!("{s}/pdb_violations")), "PodDisruptionBudget");
        push(
            num(&format!("{s}/do_not_disrupt_violations")),
            "do-not-disrupt",
        );
    }
    push(num("/machines/leaked"), "Machines leaked");
    push(num("/machines/double_bound"), "Machines double-bound");
    if !violations.is_empty() {
        let mut value = violations.join(", ");
        if let Some(excess) = num(&d("budget_excess_any")).filter(|e| *e > 0.0) {
            let _ = write!(
                value,
                " (Cluster API's own deletions went {} over a budget: not the controller's)",
                figure(excess)
            );
        }
        add("violations", "Violations", value, any > 0.0);
    }

    if r.pointer("/disruption").is_some() {
        let decisions: Vec<String> = ["empty", "underutilized", "drifted", "expired", "other"]
            .into_iter()
            .filter_map(|k| {
                num(&format!("/disruption/decisions/{k}"))
                    .filter(|n| *n > 0.0)
                    .map(|n| format!("{} {k}", figure(n)))
            })
            .collect();
        let decided = if decisions.is_empty() {
            "no claims disrupted".to_string()
        } else {
            format!("claims disrupted: {}", decisions.join(", "))
        };
        let c = |k: &str| count(&d(k)).unwrap_or_else(|| "0".into());
        add(
            "disruption",
            "Disruption",
            format!(
                "{decided}; {} of the {} claims before it are gone; at most {} disrupted at once; took {}",
                c("claims_replaced"),
                c("claims_before"),
                c("max_disrupting"),
                duration_ms(num(&d("phase_ms")).unwrap_or(0.0))
            ),
            false,
        );
    }
    if let Some(ro) = r.pointer("/disruption/rollout") {
        let c = |k: &str| {
            ro.get(k)
                .and_then(Value::as_f64)
                .map(figure)
                .unwrap_or_else(|| "0".into())
        };
        add(
            "rollout",
            "Rollout",
            format!(
                "{}: {} of {} claims replaced, {} of {} Machines up to date, at most {} disrupted at once",
                ro["machine_deployment"].as_str().unwrap_or("?"),
                c("claims_replaced"),
                c("claims_before"),
                c("machines_up_to_date"),
                c("machines"),
                c("max_disrupting")
            ),
            false,
        );
    }
    if r.pointer("/termination").is_some() {
        let c = |k: &str| count(&format!("/termination/{k}")).unwrap_or_else(|| "0".into());
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

    // Latencies, each where the scenario measured some.
    let percentiles = |path: &str| {
        let p = |q: &str| num(&format!("{path}/{q}"));
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
        if num(measured).is_some_and(|n| n > 0.0)
            && let Some(v) = percentiles(path)
        {
            add(id, what, v, false);
        }
    }
    if let Some(ms) = num(&d("pods_max_pending_ms")) {
        add(
            "longest-pending",
            "Longest a pod waited during disruption",
            duration_ms(ms),
            false,
        );
    }
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

fn summary_section(r: &Value, t: &Timeline) -> String {
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

/// Every chart with its series.
fn chart_data(t: &Timeline) -> Vec<Chart> {
    let secs: Vec<f64> = t.samples.iter().map(|s| s.at_ms as f64 / 1000.0).collect();
    let line = |name: &str, f: &dyn Fn(usize) -> f64| Series {
        name: name.to_string(),
        points: secs.iter().enumerate().map(|(i, x)| (*x, f(i))).collect(),
    };
    let s = &t.samples;
    let n = |v: usize| v as f64;
    let counts = |title, y_desc, series| Chart {
        title,
        y_desc,
        counts: true,
        series,
    };
    vec![
        counts(
            CHARTS[0],
            "pods",
            vec![line("pending", &|i| n(s[i].pending_pods))],
        ),
        counts(
            CHARTS[1],
            "nodes",
            vec![
                line("ready", &|i| n(s[i].nodes.ready)),
                line("not ready", &|i| n(s[i].nodes.not_ready)),
                line("terminating", &|i| n(s[i].nodes.terminating)),
            ],
        ),
        counts(
            CHARTS[2],
            "claims",
            vec![
                line("launching", &|i| n(s[i].claims.launching)),
                line("launched", &|i| n(s[i].claims.launched)),
                line("registered", &|i| n(s[i].claims.registered)),
                line("initialized", &|i| n(s[i].claims.initialized)),
                line("terminating", &|i| n(s[i].claims.terminating)),
            ],
        ),
        counts(
            CHARTS[3],
            "writes (cumulative)",
            t.replica_writes
                .iter()
                .map(|(md, counts)| line(md, &|i| n(counts.get(i).copied().unwrap_or(0))))
                .collect(),
        ),
        Chart {
            title: CHARTS[4],
            y_desc: "price units per hour",
            counts: false,
            series: vec![line("cost/h", &|i| s[i].cost_per_hour)],
        },
    ]
}

/// Ticks from 0 past `max` (about six of them) on a 1-2-5 step; whole steps only for counts.
/// Odd maxima (NaN, zero, negative) get the ticks of 1.
fn ticks(max: f64, whole: bool) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / 6.0;
    let decade = 10f64.powf(raw.log10().floor());
    let mut step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * decade)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * decade);
    if whole {
        step = step.max(1.0).round();
    }
    let n = (max / step).ceil().max(1.0) as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

/// A linear axis from 0 to `end` with exactly the given ticks (plotters' own float axis picks
/// its ticks itself, fractional ones for small counts among them).
struct Ticked {
    end: f64,
    ticks: Vec<f64>,
}

impl Ticked {
    /// Ending at its last tick, past `max`: room above the highest value.
    fn past(max: f64, whole: bool) -> Self {
        let ticks = ticks(max, whole);
        let end = ticks.last().copied().unwrap_or(1.0);
        Self { end, ticks }
    }

    /// Ending at `max` itself (time: the run's end is the chart's right edge).
    fn to(max: f64) -> Self {
        let mut axis = Self::past(max, false);
        if max.is_finite() && max > 0.0 {
            axis.end = max;
            axis.ticks.retain(|t| *t <= max);
        }
        axis
    }
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let frac = if v.is_finite() { v / self.end } else { 0.0 };
        // `as` saturates: a value far off the axis stays at the chart's edge in i32.
        (f64::from(limit.0) + frac * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        // The ticks are the bold mesh lines; no light ones between them.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.end
    }
}

/// Where a phase line and its label go, in the chart's pixels.
struct Placed<'a> {
    mark: &'a Mark,
    x: i32,
    row: i32,
    /// The label's anchor: to the right of the line, or to its left near the chart's edge.
    right_of_line: bool,
}

/// Rows for the labels of `xs` (pixel positions of the phase lines, in time order): each label
/// goes in the first row where it overlaps no other, so phases close in time stay readable.
fn place<'a>(marks: &'a [Mark], xs: &[i32], right_edge: i32) -> Vec<Placed<'a>> {
    let mut rows: Vec<Vec<(i32, i32)>> = vec![Vec::new(); MARK_ROWS as usize];
    marks
        .iter()
        .zip(xs)
        .enumerate()
        .map(|(i, (mark, &x))| {
            let width = mark.label.chars().count() as i32 * MARK_CHAR_PX + 4;
            let right_of_line = x + width <= right_edge;
            let span = if right_of_line {
                (x, x + width)
            } else {
                (x - width, x)
            };
            let free = |row: &Vec<(i32, i32)>| {
                row.iter()
                    .all(|(a, b)| span.1 + 4 <= *a || *b + 4 <= span.0)
            };
            let row = rows.iter().position(free).unwrap_or(i % MARK_ROWS as usize);
            rows[row].push(span);
            Placed {
                mark,
                x,
                row: row as i32,
                right_of_line,
            }
        })
        .collect()
}

/// The phase lines and labels as SVG, one group per phase, drawn over the plot. Groups go
/// top row first: a line only crosses labels of rows below its own, which are drawn after it
/// on a white halo, so a line passing behind a label leaves it legible.
fn phase_svg(placed: &[Placed], plot_bottom: i32) -> String {
    let row_y = |row: i32| 4 + MARK_FONT_PX + row * MARK_ROW_PX;
    let mut order: Vec<&Placed> = placed.iter().collect();
    order.sort_by_key(|p| p.row);
    let mut out = String::new();
    for p in order {
        let y = row_y(p.row);
        let (text_x, anchor) = if p.right_of_line {
            (p.x + 3, "start")
        } else {
            (p.x - 3, "end")
        };
        let label = escape(&p.mark.label);
        let _ = writeln!(
            out,
            "<g class=\"phase\" data-at-ms=\"{at}\"><title>{label} at {secs}</title>\
             <line x1=\"{x}\" y1=\"{top}\" x2=\"{x}\" y2=\"{plot_bottom}\" stroke=\"#444\" stroke-width=\"1\" stroke-dasharray=\"5 3\"/>\
             <text x=\"{text_x}\" y=\"{y}\" text-anchor=\"{anchor}\" font-family=\"sans-serif\" font-size=\"{MARK_FONT_PX}\" fill=\"#222\" stroke=\"#fff\" stroke-width=\"3\" paint-order=\"stroke\">{label}</text></g>",
            at = p.mark.at_ms,
            secs = at_secs(p.mark.at_ms),
            x = p.x,
            top = y + 3,
        );
    }
    out
}

fn color(i: usize) -> RGBColor {
    let (r, g, b) = COLORS[i % COLORS.len()];
    RGBColor(r, g, b)
}

/// The legend, right of the plot in the margin kept for it (inside the plot it hid the lines;
/// plotters clips its own legend's box and swatches to the plot).
fn legend_svg(series: &[Series], plot_right: i32, plot_top: i32) -> String {
    let mut out = String::new();
    for (i, s) in series.iter().enumerate() {
        let RGBColor(r, g, b) = color(i);
        let y = plot_top + 8 + i as i32 * 18;
        let x = plot_right + 14;
        let _ = writeln!(
            out,
            "<g class=\"legend\"><line x1=\"{x}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"2\"/>\
             <text x=\"{}\" y=\"{y}\" dy=\"0.35em\" font-family=\"sans-serif\" font-size=\"13\" fill=\"#222\">{}</text></g>",
            x + 18,
            x + 24,
            escape(&s.name)
        );
    }
    out
}

/// One line chart as an SVG document, with a labelled dashed line per phase mark.
fn chart(spec: &Chart, marks: &[Mark]) -> Result<String, ChartError> {
    let fail = |e: &dyn std::fmt::Display| ChartError {
        chart: spec.title.to_string(),
        reason: e.to_string(),
    };
    let points = || spec.series.iter().flat_map(|s| s.points.iter());
    let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
    let x_max = points()
        .map(|p| finite(p.0))
        .chain(marks.iter().map(|m| m.at_ms as f64 / 1000.0))
        .fold(0.0, f64::max);
    let y_max = points().map(|p| finite(p.1)).fold(0.0, f64::max);
    let x_axis = Ticked::to(x_max);
    // Headroom above the highest value, so the top line clears the legend's edge.
    let y_axis = Ticked::past(y_max * 1.1, spec.counts);
    let top = if marks.is_empty() {
        12
    } else {
        8 + MARK_ROWS * MARK_ROW_PX
    };
    let mut svg = String::new();
    let (xs, right_edge, plot_y) = {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let mut c = ChartBuilder::on(&root)
            .margin(12)
            .margin_top(top)
            .margin_right(LEGEND_PX)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x_axis, y_axis)
            .map_err(|e| fail(&e))?;
        let label = |v: &f64| figure(*v);
        c.configure_mesh()
            .x_desc("seconds since the simulated cluster started")
            .y_desc(spec.y_desc)
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 13))
            .bold_line_style(BLACK.mix(0.12))
            .x_label_formatter(&label)
            .y_label_formatter(&label)
            .draw()
            .map_err(|e| fail(&e))?;
        for (i, s) in spec.series.iter().enumerate() {
            c.draw_series(LineSeries::new(
                s.points.iter().map(|&(x, y)| (finite(x), finite(y))),
                color(i).stroke_width(2),
            ))
            .map_err(|e| fail(&e))?;
        }
        let xs: Vec<i32> = marks
            .iter()
            .map(|m| c.backend_coord(&(m.at_ms as f64 / 1000.0, 0.0)).0)
            .collect();
        let (px, py) = c.plotting_area().get_pixel_range();
        root.present().map_err(|e| fail(&e))?;
        (xs, px.end, py)
    };
    let (plot_top, plot_bottom) = (plot_y.start, plot_y.end);
    let placed = place(marks, &xs, right_edge);
    let extra = phase_svg(&placed, plot_bottom) + &legend_svg(&spec.series, right_edge, plot_top);
    Ok(match svg.rfind("</svg>") {
        Some(end) => format!("{}{extra}{}", &svg[..end], &svg[end..]),
        None => svg,
    })
}

/// The SVG with a `<title>` as its first child (what screen readers and tooltips show).
fn with_title(svg: &str, title: &str) -> String {
    match svg
        .find("<svg")
        .and_then(|at| svg[at..].find('>').map(|end| at + end + 1))
    {
        Some(end) => format!(
            "{}<title>{}</title>{}",
            &svg[..end],
            escape(title),
            &svg[end..]
        ),
        None => svg.to_string(),
    }
}

fn slug(title: &str) -> String {
    let s: String = title
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("chart-{s}")
}

/// The report's leaves as (dotted path, value) rows: strings as they are, numbers as
/// [`figure`]s (integers as they are), other values as JSON; empty arrays and objects as `[]`
/// and `{}`.
pub fn flatten(v: &Value) -> Vec<(String, String)> {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
        let key = |k: &str| {
            if prefix.is_empty() {
                k.to_string()
            } else {
                format!("{prefix}.{k}")
            }
        };
        match v {
            Value::Object(o) if !o.is_empty() => {
                for (k, v) in o {
                    walk(&key(k), v, out);
                }
            }
            Value::Array(a) if !a.is_empty() => {
                for (i, v) in a.iter().enumerate() {
                    walk(&key(&i.to_string()), v, out);
                }
            }
            Value::String(s) => out.push((prefix.to_string(), s.clone())),
            Value::Number(n) if n.is_f64() => {
                out.push((prefix.to_string(), figure(n.as_f64().unwrap_or(f64::NAN))))
            }
            other => out.push((prefix.to_string(), other.to_string())),
        }
    }
    let mut out = Vec::new();
    walk("", v, &mut out);
    out
}

/// Text and attribute escaping for HTML and XML alike.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::timeline::Sample;

    #[test]
    fn flatten_names_every_leaf() {
        let v = serde_json::json!({"a": {"b": 1, "c": "x", "f": 33.333333333333336, "w": 9.0},
            "p": [], "q": ["m"], "z": null});
        assert_eq!(
            flatten(&v),
            vec![
                ("a.b".to_string(), "1".to_string()),
                ("a.c".to_string(), "x".to_string()),
                ("a.f".to_string(), "33.3".to_string()),
                ("a.w".to_string(), "9".to_string()),
                ("p".to_string(), "[]".to_string()),
                ("q.0".to_string(), "m".to_string()),
                ("z".to_string(), "null".to_string()),
            ]
        );
    }

    #[test]
    fn an_empty_timeline_still_draws_every_chart() {
        let html = render("{\"scenario\":\"x<y\"}", &Timeline::default()).unwrap();
        assert_eq!(html.matches("<svg").count(), CHARTS.len());
        assert!(html.contains("x&lt;y"));
    }

    #[test]
    fn a_chart_holds_its_title_and_legend() {
        let t = Timeline {
            samples: vec![
                Sample {
                    at_ms: 0,
                    pending_pods: 3,
                    ..Sample::default()
                },
                Sample {
                    at_ms: 1500,
                    ..Sample::default()
                },
            ],
            replica_writes: [("default/md-0".to_string(), vec![0, 2])].into(),
            ..Timeline::default()
        };
        let html = render("{}", &t).unwrap();
        assert!(html.contains("<title>Pending pods</title>"));
        assert!(
            html.contains("default/md-0"),
            "legend names the MachineDeployment"
        );
    }

    #[test]
    fn figures_read_as_a_person_writes_them() {
        let cases = [
            (33.333333333333336, "33.3"),
            (9.0, "9"),
            (720.0, "720"),
            (594.4, "594"),
            (1234.56, "1235"),
            (7.59375, "7.59"),
            (11.3146875, "11.3"),
            (0.45394736842105265, "0.454"),
            (0.9, "0.9"),
            (0.0015, "0.0015"),
            (99.96, "100"),
            (9.996, "10"),
            (2.5, "2.5"),
            (-0.0001, "-0.0001"),
            (-0.0, "0"),
            (0.0, "0"),
            (1e-20, "0"),
            (f64::NAN, "n/a"),
            (f64::INFINITY, "n/a"),
        ];
        for (x, want) in cases {
            assert_eq!(figure(x), want, "{x}");
        }
        assert_eq!(duration_ms(873.0), "873 ms");
        assert_eq!(duration_ms(29_970.0), "30 s");
        assert_eq!(durations_ms(&[6230.0, 15_000.0]), ["6.23 s", "15 s"]);
    }

    #[test]
    fn count_axes_tick_whole_numbers_and_odd_maxima_still_get_ticks() {
        assert_eq!(ticks(1.1, true), vec![0.0, 1.0, 2.0]);
        assert_eq!(ticks(11.0, true), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
        assert!(ticks(110.0, true).iter().all(|t| t.fract() == 0.0));
        assert_eq!(
            ticks(0.35, false),
            vec![0.0, 0.1, 0.2, 0.30000000000000004, 0.4]
        );
        for odd in [f64::NAN, 0.0, -3.0, f64::INFINITY] {
            assert_eq!(ticks(odd, true), vec![0.0, 1.0], "{odd}");
        }
        let x = Ticked::to(31.6);
        assert_eq!(x.end, 31.6);
        assert_eq!(x.ticks, vec![0.0, 10.0, 20.0, 30.0]);
    }

    #[test]
    fn phase_labels_close_in_time_take_separate_rows() {
        let mark = |label: &str| Mark {
            at_ms: 0,
            label: label.into(),
        };
        let marks = [mark("provisioned"), mark("scaled down"), mark("settled")];
        let placed = place(&marks, &[100, 104, 500], 800);
        let rows: Vec<i32> = placed.iter().map(|p| p.row).collect();
        assert_eq!(rows, vec![0, 1, 0]);
        // Near the right edge a label goes left of its line.
        let placed = place(&marks[2..], &[795], 800);
        assert!(!placed[0].right_of_line);
    }

    #[test]
    fn every_chart_marks_every_phase_and_odd_samples_do_not_break_it() {
        let t = Timeline {
            samples: vec![
                Sample {
                    at_ms: 0,
                    pending_pods: 9,
                    cost_per_hour: f64::NAN,
                    ..Sample::default()
                },
                Sample {
                    at_ms: 2000,
                    cost_per_hour: 3.15,
                    ..Sample::default()
                },
            ],
            marks: vec![
                Mark {
                    at_ms: 500,
                    label: "provisioned".into(),
                },
                Mark {
                    at_ms: 2500,
                    label: "settled".into(),
                },
            ],
            ..Timeline::default()
        };
        let html = render("{\"scenario\":\"consolidate\"}", &t).unwrap();
        assert_eq!(
            html.matches("<g class=\"phase\"").count(),
            2 * CHARTS.len(),
            "{html}"
        );
        assert!(html.contains("provisioned at 0.5 s · settled at 2.5 s"));
    }

    #[test]
    fn the_summary_reads_the_disruption_figures() {
        let report = serde_json::json!({
            "scenario": "consolidate",
            "elapsed_ms": 61_234,
            "invariants_ok": true,
            "problems": [],
            "pods": {"pending_at_start": 200, "bound": 88, "unschedulable": 0},
            "claims": {"requested": 11, "launched": 11, "initialized": 11, "deleted": 9, "timed_out": 0},
            "machines": {"leaked": 0, "double_bound": 0},
            "latency_ms": {
                "pod_pending_to_bound": {"p50": 512.0, "p99": 1234.5678},
                "claim_to_launched": {"p50": 33.333333333333336, "p99": 104.0},
                "claim_to_initialized": {"p50": 210.0, "p99": 218.0},
            },
            "disruption": {
                "nodes_before": 9, "nodes_after": 2, "nodes_lower_bound": 2,
                "cost_per_hour_before": 3.15, "cost_per_hour_after": 0.74,
                "budget_violations": 0, "pdb_violations": 0, "do_not_disrupt_violations": 0,
                "budget_excess_any": 0, "pods_max_pending_ms": 470, "phase_ms": 29_970,
                "claims_before": 9, "claims_replaced": 7, "max_disrupting": 1,
                "decisions": {"empty": 1, "underutilized": 6, "drifted": 0, "expired": 0, "other": 0},
            },
        });
        let lines = summary_lines(&report, &Timeline::default());
        let line = |id: &str| {
            lines
                .iter()
                .find(|l| l.id == id)
                .map(|l| l.value.clone())
                .unwrap_or_else(|| panic!("no summary line {id}"))
        };
        assert_eq!(lines[0].id, "scenario");
        assert!(line("scenario").starts_with("consolidate, 61.2 s"));
        assert_eq!(line("invariants"), "ok");
        assert!(line("nodes").starts_with("9 → 2"));
        assert_eq!(line("cost"), "3.15 → 0.74");
        assert!(line("pods").contains("88 bound, 0 unbound"));
        assert_eq!(
            line("violations"),
            "0 budget, 0 PodDisruptionBudget, 0 do-not-disrupt, 0 Machines leaked, 0 Machines double-bound"
        );
        assert_eq!(line("pending-to-bound"), "p50 512 ms, p99 1235 ms");
        assert_eq!(line("claim-to-launched"), "p50 33.3 ms, p99 104 ms");
        assert!(line("disruption").starts_with("claims disrupted: 1 empty, 6 underutilized"));
        assert_eq!(line("longest-pending"), "470 ms");
    }
}
