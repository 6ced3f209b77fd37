//! Shadow mode (`run --dry-run`): the controller runs its watches and decisions on the cluster
//! but the server sees no write from it (counted by the server, by verb), and what it would have
//! written matches what the same controller writes from the same state when allowed to.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use karpenter_capi::api::wellknown::{INSTANCE_TYPE_LABEL, MACHINE_DEPLOYMENT_ANNOTATION};
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::metrics::Metrics;
use karpenter_capi::shadow::Shadow;
use karpenter_capi::sim::cluster::PodShape;
use karpenter_capi::simulate::launch::seed_of;
use karpenter_capi::simulate::{sim_settings, start_controller_shadowed};

use crate::common::claims::fast_disruption;
use crate::common::{Env, NS, standin_cluster};

const PODS: usize = 1000;

/// Three MachineDeployments and `PODS` pending pods; no controller yet.
async fn pending() -> Env {
    let (sim, pool) = Env::builder()
        .cluster(standin_cluster(CapiVersion::V1Beta2))
        .seeds((0..3).map(|i| seed_of(i, 400)).collect())
        .seeded()
        .await;
    let env = Env {
        sim,
        pool,
        metrics: Metrics::new(),
        controller: None,
    };
    env.deployment("web", PODS, PodShape::new("100m", "128Mi"))
        .await;
    env
}

/// A claim's choice: its MachineDeployment and instance type.
fn choice(claim: &Value) -> (String, String) {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    (
        s(&claim["metadata"]["annotations"][MACHINE_DEPLOYMENT_ANNOTATION]),
        s(&claim["metadata"]["labels"][INSTANCE_TYPE_LABEL]),
    )
}

fn tally(choices: impl Iterator<Item = (String, String)>) -> BTreeMap<(String, String), usize> {
    let mut t = BTreeMap::new();
    for c in choices {
        *t.entry(c).or_default() += 1;
    }
    t
}

fn controller_writes(env: &Env) -> Vec<String> {
    env.sim
        .cluster()
        .stats()
        .writes()
        .iter()
        .filter(|w| w.agent == karpenter_capi::app::USER_AGENT)
        .map(|w| format!("{} {}/{} {}", w.verb, w.resource, w.subresource, w.name))
        .collect()
}

#[actix::test]
async fn a_shadow_run_writes_nothing_and_decides_what_a_real_run_does() {
    // Allowed to write: the claims it creates for the pending pods.
    let mut real = pending().await;
    real.controller = Some(
        karpenter_capi::simulate::start_controller(
            &real.sim,
            sim_settings(None),
            real.metrics.clone(),
        )
        .await
        .expect("controller"),
    );
    // Settled first with the launch path's own deadline: a thousand pods take a while when the
    // machine is shared.
    real.settle().await;
    real.until_quiet("every pod bound", |e| e.bound_pods() == PODS)
        .await;
    let wanted = tally(real.list("nodeclaims").iter().map(choice));
    let claims: usize = wanted.values().sum();
    drop(real);

    // The same state in shadow mode.
    let mut shadowed = pending().await;
    let shadow = Shadow::new(None).expect("shadow");
    shadowed.controller = Some(
        start_controller_shadowed(
            &shadowed.sim,
            sim_settings(None),
            shadowed.metrics.clone(),
            Some(shadow.clone()),
        )
        .await
        .expect("shadow controller"),
    );
    let creates = |s: &Shadow| -> Vec<Value> {
        s.intended()
            .into_iter()
            .filter(|i| i.verb == "create" && i.resource == "nodeclaims")
            .map(|i| i.body)
            .collect()
    };
    shadowed
        .wait("the shadow run's claims", || {
            (creates(&shadow).len() >= claims).then_some(())
        })
        .await;
    let mut by_verb: BTreeMap<String, usize> = BTreeMap::new();
    for i in shadow.intended() {
        *by_verb
            .entry(format!("{} {}/{}", i.verb, i.resource, i.subresource))
            .or_default() += 1;
    }
    println!("real run: {claims} claims; shadow run intended: {by_verb:#?}");
    let writes = controller_writes(&shadowed);
    assert!(writes.is_empty(), "the server saw writes: {writes:#?}");
    let decided = tally(creates(&shadow).iter().take(claims).map(choice));
    assert_eq!(
        decided, wanted,
        "the shadow run's claims are the real run's"
    );
    assert_eq!(shadowed.bound_pods(), 0, "no pod placed");
}

/// Three nodes of two pods each, the Deployment scaled down to two pods and consolidation
/// switched on while no controller runs.
async fn consolidatable() -> Env {
    let mut env = Env::builder()
        .cluster(standin_cluster(CapiVersion::V1Beta2))
        .short_batches()
        .tune(|s| s.disruption = fast_disruption())
        .start()
        .await;
    env.deployment("web", 6, PodShape::new("1500m", "256Mi"))
        .await;
    env.until_quiet("6 pods bound", |e| e.bound_pods() == 6)
        .await;
    if let Some(c) = env.controller.take() {
        c.stop();
    }
    env.set_disruption(json!({"consolidationPolicy": "WhenEmptyOrUnderutilized",
                              "consolidateAfter": "0s", "budgets": [{"nodes": "1"}]}))
        .await;
    env.sim
        .run(|c| async move { c.scale_deployment(NS, "web", 2).await })
        .await
        .expect("the cluster's runtime")
        .expect("scale the Deployment down");
    env.until("two pods left", |e| e.list("pods").len() == 2)
        .await;
    env
}

fn settings() -> karpenter_capi::actors::Settings {
    let mut s = sim_settings(None);
    s.disruption = fast_disruption();
    s
}

#[actix::test]
async fn a_shadow_consolidation_writes_nothing_and_removes_what_a_real_run_removes() {
    let mut env = consolidatable().await;
    let since = env.sim.cluster().stats().now_ms();
    let shadow = Shadow::new(None).expect("shadow");
    env.controller = Some(
        start_controller_shadowed(
            &env.sim,
            settings(),
            env.metrics.clone(),
            Some(shadow.clone()),
        )
        .await
        .expect("shadow controller"),
    );
    let first_delete = |s: &Shadow| {
        s.intended()
            .into_iter()
            .find(|i| i.verb == "delete" && i.resource == "nodeclaims")
            .map(|i| i.name)
    };
    let shadowed = env
        .wait("the shadow run's first consolidation", || {
            first_delete(&shadow)
        })
        .await;
    let writes: Vec<String> = env
        .sim
        .cluster()
        .stats()
        .writes()
        .iter()
        .filter(|w| w.at_ms > since && w.agent == karpenter_capi::app::USER_AGENT)
        .map(|w| format!("{} {}/{} {}", w.verb, w.resource, w.subresource, w.name))
        .collect();
    assert!(writes.is_empty(), "the server saw writes: {writes:#?}");
    let tainted = shadow.intended().iter().any(|i| {
        i.verb == "patch"
            && i.resource == "nodes"
            && i.body.to_string().contains("karpenter.sh/disrupted")
    });
    assert!(
        tainted,
        "the command taints its node first: {:#?}",
        shadow.intended()
    );
    if let Some(c) = env.controller.take() {
        c.stop();
    }

    // The same state, allowed to write.
    let since = env.sim.cluster().stats().now_ms();
    env.controller = Some(
        karpenter_capi::simulate::start_controller(&env.sim, settings(), env.metrics.clone())
            .await
            .expect("controller"),
    );
    let real = env
        .wait("the real run's first consolidation", || {
            env.sim
                .cluster()
                .stats()
                .writes()
                .into_iter()
                .find(|w| {
                    w.at_ms > since
                        && w.agent == karpenter_capi::app::USER_AGENT
                        && w.verb == "delete"
                        && w.resource == "nodeclaims"
                })
                .map(|w| w.name)
        })
        .await;
    assert_eq!(
        shadowed, real,
        "the shadow run removes the claim the real run removes"
    );
}
