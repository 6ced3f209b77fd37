//! The HTML report: one self-contained page (no scripts, no external fonts, styles or links)
//! with a chart per series of the timeline, drawn by `plotters` as inline SVG, and the JSON
//! report's figures in a table. The page is well-formed XML as well as HTML, so any XML parser
//! can check it.

use plotters::prelude::*;
use serde_json::Value;

use super::timeline::Timeline;

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

/// The charts' titles, in page order (tests look for them).
pub const CHARTS: [&str; 5] = [
    "Pending pods",
    "Nodes by phase",
    "NodeClaims by phase",
    "Replica writes per MachineDeployment",
    "Cost per hour",
];

const WIDTH: u32 = 760;
const HEIGHT: u32 = 300;

const STYLE: &str = "body{font-family:sans-serif;margin:2em auto;max-width:60em;color:#222}\
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em}\
figure{margin:1em 0}svg{max-width:100%;height:auto;border:1px solid #ddd}\
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}\
td.v{font-family:monospace}.bad{color:#b00}pre{background:#f6f6f6;padding:1em;overflow:auto}";

/// The page for one scenario's report (`json` is the JSON report, `text` the text one).
pub fn render(json: &str, text: &str, timeline: &Timeline) -> Result<String, ChartError> {
    let report: Value = serde_json::from_str(json).unwrap_or(Value::Null);
    let scenario = report["scenario"].as_str().unwrap_or("simulation");
    let ok = report["invariants_ok"].as_bool().unwrap_or(false);
    let mut page = String::new();
    page.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n");
    page.push_str(&format!(
        "<title>karpenter-capi simulate: {}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        escape(scenario)
    ));
    page.push_str(&format!(
        "<h1>karpenter-capi simulate: scenario {}</h1>\n<p>Invariants: {}. Every figure was measured by the simulated cluster (its store, write log and audits), not reported by the controller.</p>\n",
        escape(scenario),
        if ok {
            "ok"
        } else {
            "<strong class=\"bad\">VIOLATED</strong>"
        }
    ));
    page.push_str("<h2>Over time</h2>\n");
    for (title, y, series) in chart_data(timeline) {
        let svg = chart(title, y, &series)?;
        page.push_str(&format!(
            "<figure id=\"{}\">\n{}\n</figure>\n",
            slug(title),
            with_title(&svg, title)
        ));
    }
    page.push_str("<h2>Figures</h2>\n<table id=\"figures\">\n<thead><tr><th>figure</th><th>value</th></tr></thead>\n<tbody>\n");
    for (key, value) in flatten(&report) {
        page.push_str(&format!(
            "<tr><td>{}</td><td class=\"v\">{}</td></tr>\n",
            escape(&key),
            escape(&value)
        ));
    }
    page.push_str("</tbody>\n</table>\n<h2>Text report</h2>\n<pre>");
    page.push_str(&escape(text));
    page.push_str("</pre>\n</body>\n</html>\n");
    Ok(page)
}

/// Every chart: its title, its y axis and its series.
fn chart_data(t: &Timeline) -> Vec<(&'static str, &'static str, Vec<Series>)> {
    let secs: Vec<f64> = t.samples.iter().map(|s| s.at_ms as f64 / 1000.0).collect();
    let line = |name: &str, f: &dyn Fn(usize) -> f64| Series {
        name: name.to_string(),
        points: secs.iter().enumerate().map(|(i, x)| (*x, f(i))).collect(),
    };
    let s = &t.samples;
    let n = |v: usize| v as f64;
    vec![
        (
            CHARTS[0],
            "pods",
            vec![line("pending", &|i| n(s[i].pending_pods))],
        ),
        (
            CHARTS[1],
            "nodes",
            vec![
                line("ready", &|i| n(s[i].nodes.ready)),
                line("not ready", &|i| n(s[i].nodes.not_ready)),
                line("terminating", &|i| n(s[i].nodes.terminating)),
            ],
        ),
        (
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
        (
            CHARTS[3],
            "writes (cumulative)",
            t.replica_writes
                .iter()
                .map(|(md, counts)| line(md, &|i| n(counts.get(i).copied().unwrap_or(0))))
                .collect(),
        ),
        (
            CHARTS[4],
            "price units per hour",
            vec![line("cost/h", &|i| s[i].cost_per_hour)],
        ),
    ]
}

/// One line chart as an SVG document.
fn chart(title: &str, y_desc: &str, series: &[Series]) -> Result<String, ChartError> {
    let fail = |e: &dyn std::fmt::Display| ChartError {
        chart: title.to_string(),
        reason: e.to_string(),
    };
    let points = || series.iter().flat_map(|s| s.points.iter());
    let x_max = points().map(|p| p.0).fold(0.0, f64::max).max(1.0);
    let y_max = points().map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let mut c = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(|e| fail(&e))?;
        c.configure_mesh()
            .x_desc("seconds since the simulated cluster started")
            .y_desc(y_desc)
            .draw()
            .map_err(|e| fail(&e))?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            c.draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| fail(&e))?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        }
        if !series.is_empty() {
            c.configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .draw()
                .map_err(|e| fail(&e))?;
        }
        root.present().map_err(|e| fail(&e))?;
    }
    Ok(svg)
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

/// The report's leaves as (dotted path, value) rows: strings as they are, other values as JSON;
/// empty arrays and objects as `[]` and `{}`.
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
        let v = serde_json::json!({"a": {"b": 1, "c": "x"}, "p": [], "q": ["m"], "z": null});
        assert_eq!(
            flatten(&v),
            vec![
                ("a.b".to_string(), "1".to_string()),
                ("a.c".to_string(), "x".to_string()),
                ("p".to_string(), "[]".to_string()),
                ("q.0".to_string(), "m".to_string()),
                ("z".to_string(), "null".to_string()),
            ]
        );
    }

    #[test]
    fn an_empty_timeline_still_draws_every_chart() {
        let html = render("{\"scenario\":\"x<y\"}", "t & u", &Timeline::default()).unwrap();
        assert_eq!(html.matches("<svg").count(), CHARTS.len());
        assert!(html.contains("x&lt;y") && html.contains("t &amp; u"));
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
        let html = render("{}", "", &t).unwrap();
        assert!(html.contains("<title>Pending pods</title>"));
        assert!(
            html.contains("default/md-0"),
            "legend names the MachineDeployment"
        );
    }
}
