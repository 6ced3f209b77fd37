//! `simulate --report html`: one self-contained page that an XML parser reads, with a titled
//! chart per time series sampled during the run, and the JSON report's every figure in its
//! table. `--report-out` writes any format to a file. Deadlines only guard hangs.

use std::collections::BTreeSet;
use std::process::Command;

use karpenter_capi::cli::{ReportFormat, SimulateArgs};
use karpenter_capi::simulate::html::CHARTS;
use karpenter_capi::simulate::run_scenario;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_karpenter-capi");

fn args(extra: &[&str]) -> SimulateArgs {
    let mut words = vec!["--deadline", "300s"];
    words.extend_from_slice(extra);
    SimulateArgs::from_words(&words).expect("arguments")
}

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

/// Parse the page and check what every HTML report must hold: a titled SVG per chart, nothing
/// fetched from elsewhere, and the table's rows. Returns the table's rows.
fn check_page(html: &str) -> BTreeSet<(String, String)> {
    // `<!DOCTYPE html>` is a (trivial) DTD.
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc =
        roxmltree::Document::parse_with_options(html, opts).expect("the report parses as XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "html");
    let titles: Vec<String> = root
        .descendants()
        .filter(|n| n.tag_name().name() == "svg")
        .map(|svg| {
            let title = svg
                .first_element_child()
                .filter(|t| t.tag_name().name() == "title")
                .expect("each chart's first child is its title");
            assert!(
                svg.descendants().any(|n| n.tag_name().name() == "polyline"),
                "chart {:?} draws lines",
                title.text()
            );
            text_of(title)
        })
        .collect();
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
    table
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
        .collect()
}

#[actix::test]
async fn the_html_report_charts_the_run_and_holds_the_json_figures() {
    let a = args(&["--scenario", "pods", "--pods", "40", "--deployments", "4"]);
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

    let html = outcome.render(ReportFormat::Html).expect("HTML");
    let rows = check_page(&html);
    let mut want = BTreeSet::new();
    leaves(&json, "", &mut want);
    assert_eq!(
        rows, want,
        "the table holds exactly the JSON report's figures"
    );
    assert!(rows.contains(&("scenario".to_string(), "pods".to_string())));
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
    let rows = check_page(&html);
    assert!(rows.contains(&("scenario".to_string(), "launch".to_string())));
    assert!(rows.contains(&("claims.requested".to_string(), "6".to_string())));
}
