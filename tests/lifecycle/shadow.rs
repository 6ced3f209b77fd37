//! Shadow mode (`run --dry-run`): the controller runs its watches and decisions on the cluster
//! but the server sees no write from it (counted by the server, by verb), and its decision log
//! matches, decision for decision, the log of the same controller allowed to write from the same
//! state (recorded by the same layer, `Shadow::recording`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use karpenter_capi::api::wellknown::{
    DISRUPTED_TAINT_KEY, INSTANCE_TYPE_LABEL, MACHINE_DEPLOYMENT_ANNOTATION,
};
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::metrics::Metrics;
use karpenter_capi::shadow::{Intended, Shadow};
use karpenter_capi::sim::cluster::PodShape;
use karpenter_capi::simulate::launch::seed_of;
use karpenter_capi::simulate::{sim_settings, start_controller_shadowed};

use crate::common::claims::fast_disruption;
use crate::common::{Env, LAUNCH, NS, eventually_within, standin_cluster};

const PODS: usize = 1000;

/// One decision, without what differs between two runs by chance (generated names, times).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Decision {
    /// A claim: its MachineDeployment, instance type and the requests of the pods it is for.
    Claim {
        md: String,
        instance_type: String,
        requests: String,
    },
    /// A replica write on a MachineDeployment: from, to.
    Replicas { md: String, from: i64, to: i64 },
    /// A node tainted for disruption.
    Taint { node: String },
    /// A claim's disruption reason.
    Reason { claim: String, reason: String },
    /// A claim deleted.
    Delete { claim: String },
}

fn decision(i: &Intended) -> Option<Decision> {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    match (i.verb.as_str(), i.resource.as_str(), i.subresource.as_str()) {
        ("create", "nodeclaims", "") => Some(Decision::Claim {
            md: s(&i.body["metadata"]["annotations"][MACHINE_DEPLOYMENT_ANNOTATION]),
            instance_type: s(&i.body["metadata"]["labels"][INSTANCE_TYPE_LABEL]),
            requests: i.body["spec"]["resources"]["requests"].to_string(),
        }),
        ("patch", "machinedeployments", "") => {
            let ops = i.body.as_array()?;
            let at = |op: &str| {
                ops.iter()
                    .find(|o| o["path"] == "/spec/replicas" && o["op"] == op)
                    .and_then(|o| o["value"].as_i64())
            };
            Some(Decision::Replicas {
                md: i.name.clone(),
                from: at("test").unwrap_or(-1),
                to: at("replace").or_else(|| at("add"))?,
            })
        }
        ("patch", "nodes", "") if i.body.to_string().contains(DISRUPTED_TAINT_KEY) => {
            Some(Decision::Taint {
                node: i.name.clone(),
            })
        }
        ("patch" | "update", "nodeclaims", "status") => {
            let c = conditions(&i.body)
                .into_iter()
                .find(|c| c["type"] == "DisruptionReason" && c["status"] == "True")?;
            Some(Decision::Reason {
                claim: i.name.clone(),
                reason: s(&c["reason"]),
            })
        }
        ("delete", "nodeclaims", "") => Some(Decision::Delete {
            claim: i.name.clone(),
        }),
        _ => None,
    }
}

/// The conditions a status write sets: a merge patch's, or a JSON patch's (on
/// `/status/conditions` or the whole `/status`).
fn conditions(body: &Value) -> Vec<Value> {
    let of = |status: &Value| status["conditions"].as_array().cloned().unwrap_or_default();
    match body.as_array() {
        None => of(&body["status"]),
        Some(ops) => ops
            .iter()
            .flat_map(|o| match o["path"].as_str() {
                Some("/status/conditions") => o["value"].as_array().cloned().unwrap_or_default(),
                Some("/status") => of(&o["value"]),
                _ => Vec::new(),
            })
            .collect(),
    }
}

/// The decisions of a log: claims as a multiset (they are made concurrently), and the rest
/// per object in the order first made (a status write repeated when the object changes again
/// is the same decision).
fn decisions(s: &Shadow) -> BTreeMap<String, Vec<Decision>> {
    let mut by: BTreeMap<String, Vec<Decision>> = BTreeMap::new();
    for d in s.intended().iter().filter_map(decision) {
        let again = !matches!(d, Decision::Claim { .. } | Decision::Replicas { .. })
            && by.values().flatten().any(|seen| *seen == d);
        if again {
            continue;
        }
        let key = match &d {
            Decision::Claim { .. } => "claims".to_string(),
            Decision::Replicas { md, .. } => format!("replicas {md}"),
            Decision::Taint { node } => format!("node {node}"),
            Decision::Reason { claim, .. } | Decision::Delete { claim } => {
                format!("claim {claim}")
            }
        };
        by.entry(key).or_default().push(d);
    }
    if let Some(claims) = by.get_mut("claims") {
        claims.sort();
    }
    by
}

fn controller_writes(env: &Env, since: u64) -> Vec<String> {
    env.sim
        .cluster()
        .stats()
        .writes()
        .iter()
        .filter(|w| w.at_ms >= since && w.agent == karpenter_capi::app::USER_AGENT)
        .map(|w| format!("{} {}/{} {}", w.verb, w.resource, w.subresource, w.name))
        .collect()
}

/// Three MachineDeployments and `PODS` pending pods; no controller yet.
async fn pending() -> Env {
    pending_pods(PODS).await
}

async fn pending_pods(pods: usize) -> Env {
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
    env.deployment("web", pods, PodShape::new("100m", "128Mi"))
        .await;
    env
}

/// What the controller logs on this thread (its actors run on the test's System), at info.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Captures until the guard is dropped.
    fn start(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// The lines of a dry run's log that read as done: a dry run must say what it would do.
fn said_as_done(log: &str) -> Vec<&str> {
    // Each as it follows the target (`...::writes: replicas written`).
    const DONE: &[&str] = &[
        ": created nodeclaim",
        ": replicas written",
        ": machine marked for deletion",
        ": disrupting",
        ": tainted node",
        "; deleting its NodeClaim",
        ": terminated",
        ": deleting",
        ": adopting",
    ];
    log.lines()
        .filter(|l| DONE.iter().any(|d| l.contains(d)))
        .collect()
}

#[actix::test]
async fn a_shadow_run_logs_its_decisions_as_not_carried_out() {
    let log = Captured::default();
    let _capture = log.start();
    let mut env = pending_pods(20).await;
    let shadow = Shadow::new(None).expect("shadow");
    env.controller = Some(
        start_controller_shadowed(
            &env.sim,
            sim_settings(None),
            env.metrics.clone(),
            Some(shadow.clone()),
        )
        .await
        .expect("shadow controller"),
    );
    eventually_within(
        LAUNCH,
        Duration::from_millis(200),
        "the shadow run's replica write in its log",
        || std::future::ready(log.text().contains("would write replicas").then_some(())),
        || log.text(),
    )
    .await;
    let text = log.text();
    assert!(text.contains("would create NodeClaim"), "{text}");
    let done = said_as_done(&text);
    assert!(
        done.is_empty(),
        "a dry run logged writes as made: {done:#?}"
    );
}

#[actix::test]
async fn a_shadow_run_writes_nothing_and_decides_what_a_real_run_does() {
    // Allowed to write, recorded: the claims it creates for the pending pods and the replica
    // writes that launch them.
    let mut real = pending().await;
    let recorded = Shadow::recording();
    real.controller = Some(
        start_controller_shadowed(
            &real.sim,
            sim_settings(None),
            real.metrics.clone(),
            Some(recorded.clone()),
        )
        .await
        .expect("controller"),
    );
    // The end of the launch itself, whatever the machine's load: a settle right after the
    // start finds nothing launched yet (no claim is quiet too).
    real.until_launched(PODS).await;
    // The claims the writing run kept, by offering. Its log holds more under load (claims
    // that timed out and were replaced, replica writes batched as the server's latency made
    // them), so the claims it ends with are what the dry run is held to.
    let offering = |c: &Value| {
        let s = |v: &Value| v.as_str().unwrap_or("").to_string();
        (
            s(&c["metadata"]["annotations"][MACHINE_DEPLOYMENT_ANNOTATION]),
            s(&c["metadata"]["labels"][INSTANCE_TYPE_LABEL]),
        )
    };
    let mut wanted: BTreeMap<(String, String), usize> = BTreeMap::new();
    for c in real.list("nodeclaims") {
        *wanted.entry(offering(&c)).or_default() += 1;
    }
    let claims: usize = wanted.values().sum();
    println!(
        "writing run: {:?}",
        decisions(&recorded).get("claims").map(Vec::len)
    );
    drop(real);

    // The same state in shadow mode: each claim decided once (its own creates come back to
    // it), on the offerings the writing run kept.
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
    let created = |s: &Shadow| -> Vec<Value> {
        s.intended()
            .into_iter()
            .filter(|i| i.verb == "create" && i.resource == "nodeclaims")
            .map(|i| i.body)
            .collect()
    };
    // Its pods reach it as slowly as the writing run's did: the same deadline.
    eventually_within(
        LAUNCH,
        Duration::from_millis(500),
        "the shadow run's claims",
        || std::future::ready((created(&shadow).len() >= claims).then_some(())),
        || format!("{} claims decided", created(&shadow).len()),
    )
    .await;
    shadowed.settle().await;
    let writes = controller_writes(&shadowed, 0);
    assert!(writes.is_empty(), "the server saw writes: {writes:#?}");
    let mut decided: BTreeMap<(String, String), usize> = BTreeMap::new();
    for c in created(&shadow) {
        *decided.entry(offering(&c)).or_default() += 1;
    }
    assert_eq!(
        decided, wanted,
        "the shadow run's claims are the real run's, each once"
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
async fn a_shadow_consolidation_writes_nothing_and_decides_what_a_real_run_does() {
    let mut env = consolidatable().await;
    let since = env.sim.cluster().stats().now_ms();
    let log = Captured::default();
    let capture = log.start();
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
    let deleted = |s: &Shadow| {
        decisions(s)
            .values()
            .flatten()
            .any(|d| matches!(d, Decision::Delete { .. }))
    };
    env.wait("the shadow run's consolidation", || {
        deleted(&shadow).then_some(())
    })
    .await;
    env.settle().await;
    let writes = controller_writes(&env, since);
    assert!(writes.is_empty(), "the server saw writes: {writes:#?}");
    if let Some(c) = env.controller.take() {
        c.stop();
    }
    drop(capture);
    let text = log.text();
    assert!(text.contains("would disrupt"), "{text}");
    let done = said_as_done(&text);
    assert!(
        done.is_empty(),
        "a dry run logged writes as made: {done:#?}"
    );
    let decided = decisions(&shadow);

    // The same state, allowed to write, recorded.
    let recorded = Shadow::recording();
    env.controller = Some(
        start_controller_shadowed(
            &env.sim,
            settings(),
            env.metrics.clone(),
            Some(recorded.clone()),
        )
        .await
        .expect("controller"),
    );
    // Every object the dry run decided about gets the same decisions, in the same order, in
    // the writing run. The writing run may go on past the point where the dry run stops:
    // after the first command's claim is gone, which only Cluster API and the kubelet make
    // happen, and they see no dry-run write.
    let same = |real: &BTreeMap<String, Vec<Decision>>| {
        decided.iter().all(|(k, v)| real.get(k) == Some(v))
    };
    env.wait("the real run's decisions", || {
        same(&decisions(&recorded)).then_some(())
    })
    .await;
    env.settle().await;
    let real = decisions(&recorded);
    println!("dry run: {decided:#?}\nwriting run: {real:#?}");
    assert!(same(&real), "dry run: {decided:#?}\nwriting run: {real:#?}");
    assert!(
        decided
            .values()
            .flatten()
            .any(|d| matches!(d, Decision::Reason { .. })),
        "the command records its reason: {decided:#?}"
    );
}
