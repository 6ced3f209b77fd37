//! `simulate --report html`: one self-contained page that an XML parser reads, opening with a
//! summary of the key figures, then a titled chart per time series sampled during the run with a
//! labelled line per phase of the scenario, then the JSON report's every figure in its table,
//! every figure rounded for reading. `--report-out` writes any format to a file. Deadlines only
//! guard hangs.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use karpenter_capi::cli::{ReportFormat, Scenario, SimulateArgs};
use karpenter_capi::simulate::html::CHARTS;
use karpenter_capi::simulate::run_scenario;

use crate::common::scenario;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_karpenter-capi");

/// The JSON report's leaves as (dotted path, text) pairs, as a reader of the table sees them.
fn leaves(v: &Value, prefix: &str, out: &mut BTreeSet<(String, String)>) {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        Value::Object(o) if !o.is_empty() => o.iter().for_each(|(k, v)| leaves(v, &join(k), out)),
        Value::Array(a) if !a.is_empty() => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| leaves(v, &join(&i.to_string()), out)),
        Value::String(s) => {
            out.insert((prefix.to_string(), s.clone()));
        }
        other => {
            out.insert((prefix.to_string(), other.to_string()));
        }
    }
}

fn text_of(n: roxmltree::Node) -> String {
    n.descendants()
        .filter(|d| d.is_text())
        .filter_map(|d| d.text())
        .collect()
}

fn has_class(n: roxmltree::Node, class: &str) -> bool {
    n.attribute("class")
        .is_some_and(|c| c.split_whitespace().any(|c| c == class))
}

/// Every number written in `text` (runs of digits and dots starting with a digit; a sentence's
/// closing dot is not part of it).
fn numbers(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for c in text.chars().chain([' ']) {
        if c.is_ascii_digit() || (c == '.' && !current.is_empty()) {
            current.push(c);
        } else if !current.is_empty() {
            out.push(current.trim_end_matches('.').to_string());
            current.clear();
        }
    }
    out
}

/// A number as a person writes a measured figure: a fraction only below 100 and then to three
/// significant digits at most (`33.3`, `7.59`, `0.454`), never a trailing zero (`9`, not `9.0`).
fn rounded(n: &str) -> Result<(), String> {
    let Some((whole, fraction)) = n.split_once('.') else {
        return Ok(());
    };
    if fraction.ends_with('0') || fraction.contains('.') {
        return Err(format!("{n}: trailing zero or not one number"));
    }
    let digits = format!("{whole}{fraction}");
    let significant = digits.trim_start_matches('0').len();
    if significant > 3 {
        return Err(format!("{n}: {significant} significant digits"));
    }
    Ok(())
}

/// What a page is checked against: the labels of the phases the scenario recorded, in order.
struct Expected<'a> {
    phases: &'a [&'a str],
}

/// Parse the page and check what every HTML report must hold: a summary first, a titled SVG per
/// chart with a labelled line per phase and whole ticks on count axes, every number rounded,
/// nothing fetched from elsewhere, and the table's rows. Returns the summary's lines by id and
/// the table's rows.
fn check_page(
    html: &str,
    want: &Expected,
) -> (BTreeMap<String, String>, BTreeSet<(String, String)>) {
    // `<!DOCTYPE html>` is a (trivial) DTD.
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc =
        roxmltree::Document::parse_with_options(html, opts).expect("the report parses as XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "html");

    // The summary is the first section, before any chart or table.
    let body = root
        .children()
        .find(|n| n.tag_name().name() == "body")
        .expect("a body");
    let first_section = body
        .children()
        .find(|n| n.tag_name().name() == "section")
        .expect("sections");
    assert_eq!(first_section.attribute("id"), Some("summary"));
    assert!(
        !first_section
            .descendants()
            .any(|n| matches!(n.tag_name().name(), "svg" | "figure"))
            && first_section
                .prev_siblings()
                .all(|n| !n.descendants().any(|d| d.tag_name().name() == "svg")),
        "nothing drawn before the summary"
    );
    let summary: BTreeMap<String, String> = first_section
        .descendants()
        .filter(|n| n.tag_name().name() == "tr")
        .filter_map(|tr| {
            let id = tr.attribute("id")?.strip_prefix("summary-")?.to_string();
            let td = tr.children().find(|c| c.tag_name().name() == "td")?;
            Some((id, text_of(td)))
        })
        .collect();

    // Every number on the page, the charts' ticks and labels included, reads rounded.
    for text in root.descendants().filter(|n| n.is_text()) {
        for n in numbers(text.text().unwrap_or_default()) {
            if let Err(e) = rounded(&n) {
                panic!(
                    "unrounded figure in {:?}: {e}",
                    text.text().unwrap_or_default()
                );
            }
        }
    }

    let charts: Vec<roxmltree::Node> = root
        .descendants()
        .filter(|n| n.tag_name().name() == "svg")
        .collect();
    let mut titles = Vec::new();
    for svg in charts {
        let title = svg
            .first_element_child()
            .filter(|t| t.tag_name().name() == "title")
            .map(text_of)
            .expect("each chart's first child is its title");
        assert!(
            svg.descendants().any(|n| n.tag_name().name() == "polyline"),
            "chart {title:?} draws lines"
        );
        // One dashed line with its label per recorded phase, in time order.
        let mut phases: Vec<(u64, String)> = svg
            .descendants()
            .filter(|n| n.tag_name().name() == "g" && has_class(*n, "phase"))
            .map(|g| {
                assert!(
                    g.children().any(|c| c.tag_name().name() == "line"),
                    "phase marker on {title:?} draws its line"
                );
                let at = g
                    .attribute("data-at-ms")
                    .and_then(|a| a.parse().ok())
                    .expect("a phase marker's time");
                let label = g
                    .children()
                    .find(|c| c.tag_name().name() == "text")
                    .map(text_of)
                    .expect("a phase marker's label");
                (at, label)
            })
            .collect();
        phases.sort();
        let labels: Vec<&str> = phases.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, want.phases, "phase markers on {title:?}");
        // Counts tick in whole numbers (plotters writes the y axis' tick labels right-aligned
        // against the axis; the phase labels are not ticks).
        let y_ticks: Vec<String> = svg
            .descendants()
            .filter(|n| n.tag_name().name() == "text" && n.attribute("text-anchor") == Some("end"))
            .filter(|n| !n.ancestors().any(|a| has_class(a, "phase")))
            .map(text_of)
            .map(|t| t.trim().to_string())
            .collect();
        assert!(y_ticks.len() >= 2, "{title:?} has y ticks: {y_ticks:?}");
        if title != "Cost per hour" {
            assert!(
                y_ticks.iter().all(|t| t.parse::<u64>().is_ok()),
                "{title:?} counts, so its ticks are whole: {y_ticks:?}"
            );
        }
        titles.push(title);
    }
    assert_eq!(titles, CHARTS.map(String::from).to_vec());

    for n in root.descendants().filter(|n| n.is_element()) {
        assert!(
            !matches!(n.tag_name().name(), "script" | "link" | "img" | "iframe"),
            "nothing loaded from elsewhere: <{}>",
            n.tag_name().name()
        );
        for a in n.attributes() {
            if matches!(a.name(), "src" | "href") {
                assert!(
                    !a.value().contains("//"),
                    "no external reference: {}={:?}",
                    a.name(),
                    a.value()
                );
            }
        }
    }
    let table = root
        .descendants()
        .find(|n| n.attribute("id") == Some("figures"))
        .expect("the figures table");
    let rows = table
        .descendants()
        .filter(|n| n.tag_name().name() == "tr")
        .filter_map(|tr| {
            let cells: Vec<String> = tr
                .children()
                .filter(|c| c.tag_name().name() == "td")
                .map(text_of)
                .collect();
            match cells.as_slice() {
                [k, v] => Some((k.clone(), v.clone())),
                _ => None,
            }
        })
        .collect();
    (summary, rows)
}

/// The table holds the JSON report's every leaf by its path: strings and whole numbers as they
/// are, fractions rounded to within half a unit of their last shown digit.
fn assert_table_holds(rows: &BTreeSet<(String, String)>, json: &Value) {
    let mut want = BTreeSet::new();
    leaves(json, "", &mut want);
    let keys =
        |s: &BTreeSet<(String, String)>| s.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(rows), keys(&want), "the table names every figure");
    for ((key, shown), (_, exact)) in rows.iter().zip(&want) {
        match (shown.parse::<f64>(), exact.parse::<f64>()) {
            (Ok(s), Ok(e)) if exact.contains('.') || exact.contains('e') => {
                let tolerance = if e.abs() >= 100.0 {
                    0.5
                } else {
                    e.abs() * 0.005
                } + 1e-9;
                assert!((s - e).abs() <= tolerance, "{key}: {shown} for {exact}");
            }
            _ => assert_eq!(shown, exact, "{key}"),
        }
    }
}

#[actix::test]
async fn the_html_report_charts_the_run_and_holds_the_json_figures() {
    let a = SimulateArgs {
        pods: 40,
        deployments: 4,
        ..scenario(Scenario::Pods)
    };
    let (outcome, _kept) = run_scenario(&a).await.expect("scenario");
    assert!(outcome.invariants_ok, "{}", outcome.text);

    // Sampled during the run, not only at the end.
    let t = &outcome.timeline;
    assert!(t.samples.len() > 2, "{:?}", t.samples);
    assert!(
        t.samples.iter().any(|s| s.pending_pods > 0),
        "pods were pending"
    );
    let last = t.samples.last().expect("a sample");
    assert_eq!(last.pending_pods, 0, "every pod bound at the end");
    assert!(last.claims.initialized > 0 && last.nodes.ready > 0);
    assert!(last.cost_per_hour > 0.0, "live Machines cost something");
    let json: Value = serde_json::from_str(&outcome.json).expect("JSON report");
    let writes: usize = t.replica_writes.values().filter_map(|c| c.last()).sum();
    assert_eq!(
        Some(writes as u64),
        json["api"]["replica_writes"].as_u64(),
        "the chart's replica writes add up to the report's"
    );

    let labels: Vec<&str> = t.marks.iter().map(|m| m.label.as_str()).collect();
    assert_eq!(labels, ["Deployments created", "provisioned"]);

    let html = outcome.render(ReportFormat::Html).expect("HTML");
    let (summary, rows) = check_page(&html, &Expected { phases: &labels });
    assert_table_holds(&rows, &json);
    assert!(rows.contains(&("scenario".to_string(), "pods".to_string())));
    let line = |id: &str| summary.get(id).cloned().unwrap_or_default();
    assert!(line("scenario").starts_with("pods"), "{summary:?}");
    assert_eq!(line("invariants"), "ok");
    assert_eq!(
        line("nodes"),
        format!(
            "{} ({} ready)",
            last.nodes.ready + last.nodes.not_ready + last.nodes.terminating,
            last.nodes.ready
        )
    );
    assert!(line("pods").contains(&format!("{} bound, 0 unbound", json["pods"]["bound"])));
    assert!(
        line("violations").contains("0 Machines leaked"),
        "{summary:?}"
    );
    let p99 = json["latency_ms"]["pod_pending_to_bound"]["p99"]
        .as_f64()
        .expect("pending -> bound p99");
    assert!(
        line("pending-to-bound").ends_with(&format!("p99 {p99:.0} ms")),
        "{summary:?}"
    );
    assert!(line("claim-to-launched").starts_with("p50 "), "{summary:?}");
    assert!(
        line("phases").starts_with("Deployments created at "),
        "{summary:?}"
    );
}

/// The case: consolidation's summary opens the page with the nodes and cost before and
/// after and no violations, and every chart marks provisioned -> scaled down -> settled; the
/// summary counts the nodes held back by blocker.
#[actix::test]
async fn the_consolidate_page_opens_with_its_summary_and_marks_its_phases() {
    let a = SimulateArgs {
        pods: 40,
        deployments: 10,
        ..scenario(Scenario::Consolidate)
    };
    let (outcome, _kept) = run_scenario(&a).await.expect("scenario");
    assert!(outcome.invariants_ok, "{}", outcome.text);
    let labels: Vec<&str> = outcome
        .timeline
        .marks
        .iter()
        .map(|m| m.label.as_str())
        .collect();
    assert_eq!(
        labels,
        [
            "Deployments created",
            "provisioned",
            "scaled down",
            "settled"
        ]
    );
    let json: Value = serde_json::from_str(&outcome.json).expect("JSON report");
    let html = outcome.render(ReportFormat::Html).expect("HTML");
    let (summary, rows) = check_page(&html, &Expected { phases: &labels });
    assert_table_holds(&rows, &json);
    let d = &json["disruption"];
    let line = |id: &str| summary.get(id).cloned().unwrap_or_default();
    assert!(
        line("nodes").starts_with(&format!("{} → {}", d["nodes_before"], d["nodes_after"])),
        "{summary:?}"
    );
    // The report rounds costs to cents; the page drops a cent figure's trailing zeros.
    let cents = |v: &Value| {
        let s = format!("{:.2}", v.as_f64().expect("a cost"));
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    assert_eq!(
        line("cost"),
        format!(
            "{} → {}",
            cents(&d["cost_per_hour_before"]),
            cents(&d["cost_per_hour_after"])
        )
    );
    assert_eq!(
        line("violations"),
        "0 budget, 0 PodDisruptionBudget, 0 do-not-disrupt, 0 Machines leaked, 0 Machines double-bound"
    );
    assert!(line("longest-pending").ends_with(" ms") || line("longest-pending").ends_with(" s"));
    // The blockers the controller's passes reported, counted in the summary as in the JSON.
    assert!(d["blocked_nodes"].is_object(), "{json}");
    assert!(!line("blocked").is_empty(), "{summary:?}");
}

#[test]
fn report_out_writes_the_report_to_a_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run = |extra: &[&str]| {
        let out = Command::new(BIN)
            .current_dir(dir.path())
            .args([
                "simulate",
                "--scenario",
                "launch",
                "--claims",
                "6",
                "--machine-deployments",
                "2",
                "--log-level",
                "warn",
            ])
            .args(extra)
            .output()
            .expect("run simulate");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    let json_path = dir.path().join("report.json");
    let stdout = run(&["--report", "json", "--report-out", "report.json"]);
    assert!(stdout.trim().is_empty(), "nothing on stdout: {stdout}");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).expect("file"))
        .expect("the file holds the JSON report");
    assert_eq!(json["claims"]["requested"], 6);

    // Without --report-out, the HTML report goes to ./simulate-report.html.
    let stdout = run(&["--report", "html"]);
    assert!(stdout.trim().is_empty(), "nothing on stdout: {stdout}");
    let html = std::fs::read_to_string(dir.path().join("simulate-report.html")).expect("file");
    let (summary, rows) = check_page(
        &html,
        &Expected {
            phases: &["claims created", "settled"],
        },
    );
    assert!(summary["claims"].starts_with("6 created"), "{summary:?}");
    assert!(rows.contains(&("scenario".to_string(), "launch".to_string())));
    assert!(rows.contains(&("claims.requested".to_string(), "6".to_string())));
}
