//! Issue 12, "Measure apart": the report says which side spent what (CPU of the controller's
//! threads apart from the simulated cluster's, the controller's requests by verb), and
//! `--scenario none --nodes N --pods M` stands up a settled cluster a controller leaves alone.
//! No timing assertions; deadlines only guard hangs.

use karpenter_capi::cli::{Scenario, ServeArgs, SimulateArgs};
use karpenter_capi::simulate::run_scenario;
use serde_json::Value;

use crate::common::scenario;

#[actix::test]
async fn the_report_splits_cpu_and_counts_the_controllers_requests_by_verb() {
    let a = SimulateArgs {
        pods: 30,
        deployments: 3,
        ..scenario(Scenario::Pods)
    };
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

/// `--scenario none --nodes 50 --pods 200` stands up a settled cluster: a controller started
/// on it afterwards (as `karpenter-capi run` would be) finds nothing to launch or delete.
#[actix::test]
async fn a_stood_up_cluster_is_settled_for_a_new_controller() {
    use karpenter_capi::metrics::Metrics;
    use karpenter_capi::simulate::{
        BackgroundSim, cluster_config, invariants, launch, sim_settings, standup, start_controller,
    };
    use std::time::Duration;

    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("simulated.kubeconfig");
    let a = SimulateArgs {
        nodes: 50,
        pods: 200,
        serve: ServeArgs {
            serve: true,
            no_controller: true,
            kubeconfig_out: Some(kubeconfig.clone()),
            ..ServeArgs::default()
        },
        ..scenario(Scenario::None)
    };
    let sim = BackgroundSim::start(cluster_config(&a))
        .await
        .expect("cluster");
    standup::stand_up(&sim, &a, false).await.expect("stand up");

    let store = sim.cluster().server().store();
    assert_eq!(store.list("nodes", None).len(), 50);
    let pods = store.list("pods", None);
    assert_eq!(pods.len(), 200);
    for p in &pods {
        assert!(p["spec"]["nodeName"].is_string(), "unbound pod {p}");
        assert_eq!(p["status"]["phase"], "Running", "{p}");
    }
    let claims_before: Vec<Value> = store.list("nodeclaims", None);
    assert_eq!(claims_before.len(), 50);
    let replicas = |store: &karpenter_capi::sim::Store| -> Vec<(Value, Value)> {
        store
            .list("machinedeployments", None)
            .into_iter()
            .map(|md| {
                (
                    md["metadata"]["name"].clone(),
                    md["spec"]["replicas"].clone(),
                )
            })
            .collect()
    };
    let replicas_before = replicas(store);

    // A new controller on the stood-up cluster.
    let since = sim.cluster().stats().now_ms();
    let controller = start_controller(&sim, sim_settings(None), Metrics::new())
        .await
        .expect("controller");
    let mut active = controller.active.clone();
    tokio::time::timeout(Duration::from_secs(60), active.wait_for(|a| *a))
        .await
        .expect("the controller becomes active within 60 s")
        .expect("active");
    launch::settle(&sim, Duration::from_secs(60))
        .await
        .expect("settles");
    // Give it a few seconds to act on anything it would act on (not a timing assertion: what
    // is checked is that nothing was created or deleted).
    tokio::time::sleep(Duration::from_secs(3)).await;

    let agent = karpenter_capi::app::USER_AGENT;
    let acted: Vec<String> = sim
        .cluster()
        .stats()
        .writes()
        .into_iter()
        .filter(|w| w.at_ms >= since && w.agent == agent)
        .filter(|w| {
            w.verb == "create" && matches!(w.resource.as_str(), "nodeclaims" | "machines")
                || w.verb == "delete"
                || w.resource == "machinedeployments"
        })
        .map(|w| format!("{} {} {}/{}", w.verb, w.resource, w.namespace, w.name))
        .collect();
    assert!(acted.is_empty(), "the controller acted: {acted:?}");
    let store = sim.cluster().server().store();
    assert_eq!(store.list("nodeclaims", None).len(), 50);
    assert_eq!(replicas(store), replicas_before);
    let inv = invariants::check(store, sim.cluster().capi_version().into());
    assert!(inv.ok(), "{:?}", inv.problems);
    controller.stop();
}
