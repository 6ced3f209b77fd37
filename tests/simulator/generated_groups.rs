//! `simulate --scenario generate` small (issue 44): the same pods on groups generated from one
//! source MachineDeployment and on three fixed sizes, then scaled to zero until every generated
//! group is gone; through the scenario runner (text, JSON and HTML reports).

use std::time::Duration;

use karpenter_capi::cli::{Scenario, SimulateArgs};
use karpenter_capi::simulate::{html, run_scenario};
use serde_json::Value;

use crate::common::scenario;

/// 60 pods, idleAfter 3 s: at most maxMachineDeployments groups at once, every one gone after
/// the scale-down, the source untouched, and the generated run cheaper and better utilised
/// (requested / allocatable CPU) than the fixed sizes.
#[actix::test]
async fn generated_groups_beat_three_fixed_sizes_and_go_when_idle() {
    let a = SimulateArgs {
        pods: 60,
        idle_after: Duration::from_secs(3),
        ..scenario(Scenario::Generate)
    };
    let (outcome, _kept) = run_scenario(&a).await.expect("the scenario runs");
    assert!(outcome.invariants_ok, "{}", outcome.text);
    let json: Value = serde_json::from_str(&outcome.json).expect("JSON report");
    let g = &json["generate"];
    let max = g["max_machine_deployments"].as_u64().expect("max");
    let generated = g["groups_generated"].as_u64().expect("groups generated");
    assert!(generated >= 1, "{g}");
    assert!(
        g["max_groups_at_once"]
            .as_u64()
            .is_some_and(|n| n >= 1 && n <= max),
        "{g}"
    );
    let s = &g["scale_down"];
    assert_eq!(s["groups_left"], serde_json::json!([]), "{s}");
    assert_eq!(s["templates_left"], serde_json::json!([]), "{s}");
    assert!(
        s["groups_removed_ms"].as_u64().is_some_and(|ms| ms >= 3000),
        "{s}"
    );
    let u = &g["untouched"];
    assert!(
        u["checked"]
            .as_array()
            .is_some_and(|c| c.iter().any(|k| k == "MachineDeployment default/source")),
        "{u}"
    );
    assert_eq!(u["changed"], serde_json::json!([]), "{u}");
    assert_eq!(u["controller_writes"], 0, "{u}");
    let (gen_run, base) = (&g["generated"], &g["baseline"]);
    assert_eq!(gen_run["pods_bound"], 60, "{g}");
    assert_eq!(base["pods_bound"], 60, "{g}");
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    assert!(
        f(gen_run, "cost_per_hour") < f(base, "cost_per_hour"),
        "cheaper than the fixed sizes: {g}"
    );
    assert!(
        f(gen_run, "cpu_utilization") > f(base, "cpu_utilization"),
        "better utilised than the fixed sizes: {g}"
    );
    assert!(f(g, "cost_ratio") < 1.0, "{g}");
    let shapes = gen_run["nodes_by_shape"].as_object().expect("shapes");
    assert!(!shapes.is_empty(), "{g}");
    assert!(
        outcome.text.contains("groups generated"),
        "{}",
        outcome.text
    );
    let page = html::render(&outcome.json, &outcome.timeline).expect("the HTML report");
    assert!(
        page.contains("id=\"summary-generate\""),
        "the HTML summary says it"
    );
    let marks: Vec<&str> = outcome
        .timeline
        .marks
        .iter()
        .map(|m| m.label.as_str())
        .collect();
    for mark in [
        "scaled to zero",
        "nodes removed",
        "generated groups removed",
    ] {
        assert!(marks.contains(&mark), "{mark}: {marks:?}");
    }
}
