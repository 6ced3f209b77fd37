//! Issue 12, "Measure apart": the report says which side spent what (CPU of the controller's
//! threads apart from the simulated cluster's, the controller's requests by verb), and
//! `--scenario none --nodes N --pods M` stands up a settled cluster a controller leaves alone.
//! No timing assertions; deadlines only guard hangs.

use karpenter_capi::cli::{Cli, Command as Sub, SimulateArgs};
use karpenter_capi::simulate::run_scenario;
use serde_json::Value;

fn args(extra: &[&str]) -> SimulateArgs {
    let mut argv = vec!["karpenter-capi", "simulate", "--deadline", "300"];
    argv.extend_from_slice(extra);
    let cli = <Cli as clap::Parser>::try_parse_from(argv).expect("arguments");
    let Sub::Simulate(args) = cli.command else {
        panic!("simulate");
    };
    args
}

#[actix::test]
async fn the_report_splits_cpu_and_counts_the_controllers_requests_by_verb() {
    let a = args(&["--scenario", "pods", "--pods", "30", "--deployments", "3"]);
    let (outcome, _kept) = run_scenario(&a).await.expect("scenario");
    assert!(outcome.invariants_ok, "{}", outcome.text);
    let json: Value = serde_json::from_str(&outcome.json).expect("JSON report");

    let cpu = &json["cpu_ms"];
    for side in ["controller", "simulated_cluster", "process"] {
        let ms = cpu[side].as_f64().unwrap_or_default();
        assert!(ms > 0.0, "cpu_ms.{side} in {cpu}");
    }
    assert!(
        cpu["per_claim_controller"].as_f64().unwrap_or_default() > 0.0,
        "{cpu}"
    );

    let verbs = &json["api"]["requests_by_verb"];
    for verb in ["list", "watch", "create", "patch"] {
        let n = verbs[verb].as_u64().unwrap_or_default();
        assert!(n > 0, "api.requests_by_verb.{verb} in {verbs}");
    }
    // Only the verbs a kube-apiserver knows for these requests.
    let known = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    for verb in verbs.as_object().expect("an object").keys() {
        assert!(known.contains(&verb.as_str()), "unexpected verb {verb}");
    }
    assert!(outcome.text.contains("cpu:"), "{}", outcome.text);
    assert!(
        outcome.text.contains("controller requests:"),
        "{}",
        outcome.text
    );
}
