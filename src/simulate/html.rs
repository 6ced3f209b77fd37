//! The HTML report: one self-contained page (no scripts, no external fonts, styles or links).
//! It opens with a summary of what a reader asks first (did the invariants hold, how many nodes
//! at what cost, how fast pods were bound), then a chart per series of the timeline, drawn by
//! `plotters` as inline SVG with a labelled line at each of the scenario's phase changes, then
//! every figure of the JSON report. Figures are rounded for reading (see [`figure`]); the JSON
//! report keeps them exact. The page is well-formed XML as well as HTML, so any XML parser can
//! check it.

use charts::chart;
use charts::chart_data;
use charts::with_title;
use std::fmt::Write as _;
use summary::summary_section;

use serde_json::Value;

use super::timeline::Timeline;

mod charts;
mod summary;

pub use charts::CHARTS;

#[derive(Debug, thiserror::Error)]
#[error("drawing the chart {chart:?}: {reason}")]
pub struct ChartError {
    pub chart: String,
    pub reason: String,
}

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
    use super::charts::{Ticked, place, ticks};
    use super::summary::{duration_ms, durations_ms, summary_lines};
    use super::*;
    use crate::simulate::timeline::Mark;
    use crate::simulate::timeline::Sample;
    use crate::simulate::timeline::UpToDate;

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
    fn the_up_to_date_chart_draws_the_pools_counts() {
        let at = |at_ms, nodes, up_to_date| Sample {
            at_ms,
            pool_status: UpToDate { nodes, up_to_date },
            ..Sample::default()
        };
        let t = Timeline {
            samples: vec![at(0, 4, 4), at(1000, 4, 1), at(2000, 4, 4)],
            ..Timeline::default()
        };
        let up = chart_data(&t)
            .into_iter()
            .find(|c| c.title == "Up-to-date nodes (NodePool status)")
            .expect("the chart");
        let points = |name: &str| {
            up.series
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.points.iter().map(|p| p.1).collect::<Vec<_>>())
        };
        assert_eq!(points("nodes"), Some(vec![4.0, 4.0, 4.0]));
        assert_eq!(points("up to date"), Some(vec![4.0, 1.0, 4.0]));
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
                "nodes_up_to_date_after_ms": 7300,
                "blocked_nodes": {
                    "not_cheaper": {"max_nodes": 2, "seconds_held": 9, "at_end": 2},
                    "budget": {"max_nodes": 16, "seconds_held": 15, "at_end": 0},
                },
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
        assert_eq!(
            line("nodes-up-to-date"),
            "True 7300 ms after the template change"
        );
        assert_eq!(
            line("blocked"),
            "budget: at most 16 nodes in a pass, for 15 s, 0 at the end; \
             not_cheaper: at most 2 nodes in a pass, for 9 s, 2 at the end"
        );
    }
}
