//! Hangs and lost work (issue 8): requests that never answer, writes whose outcome is unknown,
//! malformed bounds, stale templates, keys that must go away and maps that must shrink, all
//! against the simulated cluster through the real kube Client. Faults are scoped to the
//! controller's User-Agent so the Cluster API and kubelet stand-ins keep working.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use karpenter_capi::actors::Settings;
use karpenter_capi::actors::tracked::Tracked;
use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::*;
use karpenter_capi::app::USER_AGENT;
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::sim::cluster::{MachineDeploymentSeed, PodShape, SimClusterConfig};
use karpenter_capi::simulate::launch::{NAMESPACE, NODECLASS, claim_for, seed_of};

use crate::common::{DEADLINE, Env};

fn cluster() -> SimClusterConfig {
    SimClusterConfig {
        provider_delay: Duration::from_millis(50),
        jitter: Duration::from_millis(50),
        node_ready_delay: Duration::from_millis(50),
        node_delete_delay: Duration::from_millis(20),
        ..SimClusterConfig::default()
    }
}

/// The MachineDeployments, the NodeClass and NodePool, then the controller with `tune` applied to
/// the simulation settings (short deadlines, short batching windows).
async fn env(seeds: Vec<MachineDeploymentSeed>, tune: impl FnOnce(&mut Settings)) -> Env {
    let env = Env::builder()
        .cluster(cluster())
        .seeds(seeds)
        .short_batches()
        .tune(tune)
        .start()
        .await;
    // Faults below hit the controller only.
    env.sim
        .cluster()
        .server()
        .faults()
        .set_agent(Some(USER_AGENT));
    env
}

impl Env {
    fn faults(&self) -> &karpenter_capi::sim::Faults {
        self.sim.cluster().server().faults()
    }

    /// Machines through a client of the cluster's own (one faults do not reach).
    fn machine_api(&self) -> Api<DynamicObject> {
        self.machine_api_with(self.sim.cluster().new_client().expect("a client"))
    }

    fn machine_api_with(&self, client: kube::Client) -> Api<DynamicObject> {
        let v = self.sim.cluster().capi_version();
        Api::namespaced_with(
            client,
            NAMESPACE,
            &karpenter_capi::capi::version::machine_resource(v.into()),
        )
    }

    /// MachineDeployments through a client of the cluster's own (one faults do not reach).
    fn machine_deployment_api(&self) -> Api<DynamicObject> {
        let v = self.sim.cluster().capi_version();
        Api::namespaced_with(
            self.sim.cluster().new_client().expect("a client"),
            NAMESPACE,
            &karpenter_capi::capi::version::machine_deployment_resource(v.into()),
        )
    }

    async fn delete_claims(&self) {
        let names: Vec<String> = self
            .list("nodeclaims")
            .iter()
            .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        self.sim
            .run(move |c| async move {
                let api: Api<NodeClaim> = Api::all(c.client());
                for n in names {
                    let _ = api.delete(&n, &DeleteParams::default()).await;
                }
            })
            .await
            .expect("delete claims");
    }

    fn initialized(&self) -> usize {
        self.list("nodeclaims")
            .iter()
            .filter(|c| {
                c.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|x| x["type"] == "Initialized" && x["status"] == "True")
                    })
            })
            .count()
    }

    /// Sample `md`'s spec.replicas in the background; returns (stop flag, max seen, whether it
    /// ever went up after `armed`).
    fn watch_replicas(&self, md: &'static str) -> ReplicaProbe {
        let probe = ReplicaProbe {
            stop: Arc::new(AtomicBool::new(false)),
            max: Arc::new(AtomicI64::new(i64::MIN)),
            rose: Arc::new(AtomicBool::new(false)),
        };
        let (stop, max, rose) = (probe.stop.clone(), probe.max.clone(), probe.rose.clone());
        let cluster = self.sim.cluster().clone();
        tokio::spawn(async move {
            let mut last: Option<i64> = None;
            while !stop.load(Ordering::Relaxed) {
                let r = cluster
                    .server()
                    .store()
                    .list("machinedeployments", None)
                    .iter()
                    .find(|m| m["metadata"]["name"] == md)
                    .and_then(|m| m.pointer("/spec/replicas").and_then(Value::as_i64));
                if let Some(r) = r {
                    max.fetch_max(r, Ordering::Relaxed);
                    if last.is_some_and(|l| r > l) {
                        rose.store(true, Ordering::Relaxed);
                    }
                    last = Some(r);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        probe
    }

    async fn tracked_catalog(&self) -> BTreeMap<&'static str, usize> {
        self.controller()
            .catalog()
            .expect("catalog runs here")
            .send(Tracked)
            .await
            .expect("catalog answers")
    }
}

struct ReplicaProbe {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicI64>,
    rose: Arc<AtomicBool>,
}

impl Drop for ReplicaProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Item 1: a claim whose write never answers is abandoned at the step deadline (an Event and a
/// metric say so) and reconciled again with backoff; once the API answers, it launches.
/// Before: a fixed 60 s deadline, silent.
#[actix::test]
async fn a_hung_claim_write_is_abandoned_at_its_deadline_and_retried() {
    let env = env(vec![seed_of(0, 10)], |s| {
        s.deadlines.claim_step = Duration::from_millis(800);
    })
    .await;
    env.faults()
        .set_write_latency("nodeclaims", Duration::from_secs(3600));
    let names = env.claims(1, 1).await;
    env.until("a ReconcileTimeout Event on the claim", |e| {
        e.events("ReconcileTimeout")
            .iter()
            .any(|ev| ev["regarding"]["name"] == names[0].as_str())
    })
    .await;
    let text = env.metrics.encode();
    assert!(
        metric(
            &text,
            "karpenter_capi_reconcile_timeouts_total{controller=\"nodeclaim\"}"
        ) >= 1.0,
        "{text}"
    );
    env.faults().clear();
    env.faults().set_agent(Some(USER_AGENT));
    env.until("the claim initialized once the API answers", |e| {
        e.initialized() == 1
    })
    .await;
    env.settle().await;
    env.invariants_hold();
}

/// Item 5: replica writes land but their answers never come. The Scaler must read the
/// MachineDeployment back instead of retrying blind: replicas only ever go down while claims
/// are deleted, and end equal to the Machines. Before: no answer meant a hang for 30 s, then a
/// replan from a stale index that could raise replicas again and decrement twice.
#[actix::test]
async fn an_ambiguous_decrement_is_read_back_and_never_repeated() {
    let env = env(vec![seed_of(0, 20)], |s| {
        s.deadlines.scaler_write = Duration::from_millis(500);
    })
    .await;
    env.claims(6, 1).await;
    env.settle().await;
    assert_eq!(env.replicas("md-0"), 6);
    env.faults()
        .set_write_response_delay("machinedeployments", Duration::from_secs(3600));
    // Cluster API takes a while to remove a Machine after a decrement (MachineSet first), as
    // on a real cluster: a Scaler that forgot its decrement sees the marked Machine still there.
    env.faults()
        .set_write_latency("machinesets", Duration::from_millis(1500));
    env.faults().set_every_client("machinesets");
    let probe = env.watch_replicas("md-0");
    env.delete_claims().await;
    env.until("every Machine gone and replicas at zero", |e| {
        e.machines_of("md-0").is_empty()
            && e.replicas("md-0") == 0
            && e.list("nodeclaims").is_empty()
    })
    .await;
    // Let any late retry show itself before looking.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !probe.rose.load(Ordering::Relaxed),
        "replicas went up again while claims were only deleted"
    );
    assert_eq!(env.replicas("md-0"), 0);
    assert_eq!(probe.max.load(Ordering::Relaxed), 6);
    let text = env.metrics.encode();
    assert!(
        metric(
            &text,
            "karpenter_capi_reconcile_timeouts_total{controller=\"scaler\"}"
        ) >= 1.0,
        "the writes did time out: {text}"
    );
    env.faults().clear();
    env.settle().await;
    env.invariants_hold();
}

/// A MachineSet whose Machine cache lags removes the wrong Machine: the decrement reaches it
/// before our delete-machine mark does, so it takes its oldest Machine instead of the marked one.
/// The Scaler must see the MachineDeployment settle with the marked Machine still there and lower
/// replicas for it again. Before: the marked Machine stayed, its claim never finished
/// terminating, and the replica it held kept the next claim from getting a Machine (the CI flake
/// in `expiration_replaces_every_claim`).
#[actix::test]
async fn a_decrement_cluster_api_spent_on_another_machine_is_made_again() {
    let env = env(vec![seed_of(0, 20)], |_| {}).await;
    // Cluster API's default order takes equal Machines by name; Oldest makes its choice of the
    // unmarked Machine (its cache lacks the mark) the old one, for certain.
    env.patch_md(match CapiVersion::from(env.sim.cluster().capi_version()) {
        CapiVersion::V1Beta1 => {
            json!({"spec": {"strategy": {"rollingUpdate": {"deletePolicy": "Oldest"}}}})
        }
        CapiVersion::V1Beta2 => json!({"spec": {"deletion": {"order": "Oldest"}}}),
    })
    .await;
    env.claims(1, 1).await;
    env.settle().await;
    // Creation timestamps have one-second resolution: the second Machine must be the younger.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let young = env.claims(1, 1).await;
    env.settle().await;
    assert_eq!(env.replicas("md-0"), 2);
    // Every Machine watch, the Cluster API stand-in's cache included, now lags 2 s behind.
    env.faults()
        .set_watch_delay("machines", Duration::from_secs(2));
    env.faults().set_every_client("machines");
    env.delete_claim(&young[0]).await;
    env.until("every claim and Machine gone, replicas at zero", |e| {
        e.machines_of("md-0").is_empty()
            && e.replicas("md-0") == 0
            && e.list("nodeclaims").is_empty()
    })
    .await;
    let text = env.metrics.encode();
    assert_eq!(
        metric(&text, "karpenter_capi_scaler_spent_decrements_total{"),
        1.0,
        "the stand-in took the old Machine, so the decrement was made again once: {text}"
    );
    env.until("the old claim's MachineDeleted Event", |e| {
        e.events("MachineDeleted").len() == 1
    })
    .await;
    env.faults().clear();
    env.settle().await;
    env.invariants_hold();
}

/// The controller's Machine watch lags 15 s behind the API server while the Machines keep being
/// written (as Cluster API's status writes do), as on a loaded machine. Should the index show
/// the Machine unbound (it did while a bind's answer shadowed the watch for a flat 10 s), a claim
/// must not take that for its Machine being gone. Before: every such claim was deleted
/// (`MachineDeleted`) and its Machine released, which in a 1,000-claim burst on a loaded machine
/// deleted hundreds of claims.
#[actix::test]
async fn a_lagging_machine_watch_never_ends_a_bound_claim() {
    let env = env(vec![seed_of(0, 20)], |_| {}).await;
    env.faults()
        .set_watch_delay("machines", Duration::from_secs(15));
    let (touched, stop) = touching(env.machine_api());
    let seen = Arc::new(AtomicI64::new(0));
    // A watch of our own under the controller's User-Agent lags as the controller's does: once
    // it shows a write, the controller's watch has shown everything before it.
    let lagging = karpenter_capi::app::client_from_kubeconfig_with(
        env.sim.cluster().controller_kubeconfig_path(),
        &karpenter_capi::app::ClientOptions::default(),
    )
    .await
    .expect("a client with the controller's User-Agent");
    tokio::spawn(last_touch_seen(
        env.machine_api_with(lagging),
        seen.clone(),
        stop.clone(),
    ));
    env.claims(2, 1).await;
    env.until("both claims initialized", |e| e.initialized() == 2)
        .await;
    let mark = touched.load(Ordering::Relaxed) + 1;
    env.until(
        "the lagging watch past every write before the claims initialized",
        |_| seen.load(Ordering::Relaxed) >= mark,
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    assert!(
        env.events("MachineDeleted").is_empty(),
        "a claim was deleted for a Machine that was there: {:#?}",
        env.events("MachineDeleted")
    );
    assert_eq!(env.initialized(), 2);
    assert_eq!(env.machines_of("md-0").len(), 2);
    env.faults().clear();
    env.settle().await;
    env.invariants_hold();
}

/// A burst while the controller's Machine, MachineDeployment and NodeClaim watches lag 15 s
/// behind the API server and the Machines keep being written, as a loaded fleet's watches did.
/// Every claim gets one Machine and the replicas never run past the claims. Before: our writes'
/// answers stopped shadowing the watches after a flat 10 s, both indexes went back to versions
/// from before the bind, the Scaler bound a launched claim to a second Machine, and a cluster
/// ended with 18 Machines for 17 claims.
#[actix::test]
async fn a_burst_under_lagging_cluster_api_watches_makes_one_machine_per_claim() {
    const CLAIMS: usize = 17;
    let env = env(vec![seed_of(0, 40)], |_| {}).await;
    for resource in ["machines", "machinedeployments", "nodeclaims"] {
        env.faults()
            .set_watch_delay(resource, Duration::from_secs(25));
    }
    let (_, stop) = touching(env.machine_api());
    env.claims(4, 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    env.claims(CLAIMS - 4, 1).await;
    let most = AtomicI64::new(0);
    env.until("every claim initialized", |e| {
        most.fetch_max(e.replicas("md-0"), Ordering::Relaxed);
        e.initialized() == CLAIMS
    })
    .await;
    // Long enough for the lagging watches to show everything, and a spare replica to be made.
    let deadline = Instant::now() + Duration::from_secs(40);
    while Instant::now() < deadline {
        most.fetch_max(env.replicas("md-0"), Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop.store(true, Ordering::Relaxed);
    assert_eq!(
        most.load(Ordering::Relaxed),
        CLAIMS as i64,
        "spec.replicas went past one per claim"
    );
    assert_eq!(env.machines_of("md-0").len(), CLAIMS);
    assert!(
        env.events("MachineDeleted").is_empty(),
        "a claim was deleted for a Machine that was there: {:#?}",
        env.events("MachineDeleted")
    );
    assert_eq!(
        metric(
            &env.metrics.encode(),
            "karpenter_capi_machine_index_behind_total"
        ),
        0.0,
        "the Machine index showed a bound Machine unbound (a version older than the bind)"
    );
    env.faults().clear();
    env.settle().await;
    assert_eq!(env.initialized(), CLAIMS);
    env.invariants_hold();
}

/// A claim deleted while the controller's Node watch lags (its Node joined and runs a pod, but
/// the index does not show it yet) drains the Node itself before letting its Machine go: a Node
/// missing from the index is not taken for no Node. Before: the claim released its Machine at
/// once, leaving the drain to Cluster API (no disrupted taint, no termination grace period, no
/// Karpenter eviction order).
#[actix::test]
async fn a_lagging_node_watch_never_skips_a_drain() {
    let env = env(vec![seed_of(0, 20)], |_| {}).await;
    env.faults()
        .set_watch_delay("nodes", Duration::from_secs(10));
    let name = env.create_claim(&claim_for(&env.pool, "sim-0")).await;
    let node = env
        .wait("the claim's Machine with its Node", || {
            env.machines_of("md-0")
                .iter()
                .find(|m| m["metadata"]["annotations"][NODECLAIM_ANNOTATION] == name.as_str())
                .and_then(|m| m["status"]["nodeRef"]["name"].as_str().map(String::from))
        })
        .await;
    env.pod("web-0", &node, json!({"app": "web"}), json!({}))
        .await;
    env.delete_claim(&name).await;
    env.until("the claim gone", |e| {
        e.get("nodeclaims", "", &name).is_none()
    })
    .await;
    assert_eq!(
        env.evictions_of("web-0"),
        vec![USER_AGENT.to_string()],
        "the controller drains, not Cluster API"
    );
    env.faults().clear();
    env.settle().await;
    env.invariants_hold();
}

/// Starts [`touch_machines`]: how many rounds it has made, and the flag that stops it.
fn touching(api: Api<DynamicObject>) -> (Arc<AtomicI64>, Arc<AtomicBool>) {
    let touched = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    tokio::spawn(touch_machines(api, touched.clone(), stop.clone()));
    (touched, stop)
}

/// Writes a counter into a label of every Machine, twice a second, until `stop`.
async fn touch_machines(api: Api<DynamicObject>, touched: Arc<AtomicI64>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let n = touched.fetch_add(1, Ordering::Relaxed) + 1;
        let patch = json!({"metadata": {"labels": {"touched": n.to_string()}}});
        for m in api
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let name = m.metadata.name.unwrap_or_default();
            let _ = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The highest `touched` label a watch through `api` has shown, until `stop`.
async fn last_touch_seen(api: Api<DynamicObject>, seen: Arc<AtomicI64>, stop: Arc<AtomicBool>) {
    use futures::StreamExt;
    let mut events = kube::runtime::watcher(api, Default::default()).boxed();
    while !stop.load(Ordering::Relaxed) {
        let Some(Ok(event)) = events.next().await else {
            continue;
        };
        let touched = |m: &DynamicObject| {
            if let Some(n) = m.labels().get("touched").and_then(|v| v.parse().ok()) {
                seen.fetch_max(n, Ordering::Relaxed);
            }
        };
        match event {
            kube::runtime::watcher::Event::Apply(m)
            | kube::runtime::watcher::Event::InitApply(m) => touched(&m),
            _ => {}
        }
    }
}

/// Item 5: binds land but their answers never come. No claim may end up with two Machines and
/// no Machine with two claims; every claim still launches. Before: a bind without an answer
/// hung its claim for good.
#[actix::test]
async fn a_bind_with_no_answer_never_binds_a_claim_twice() {
    let env = env(vec![seed_of(0, 20)], |s| {
        s.deadlines.scaler_write = Duration::from_millis(500);
    })
    .await;
    env.faults()
        .set_write_response_delay("machines", Duration::from_secs(3600));
    env.claims(8, 1).await;
    env.until("every claim initialized", |e| e.initialized() == 8)
        .await;
    env.invariants_hold();
    env.faults().clear();
    env.settle().await;
    assert_eq!(env.machines_of("md-0").len(), 8);
    env.invariants_hold();
}

/// A claim that already recorded MachineDeployment `md` (as a restarted controller finds it).
fn waiting_claim(pool: &NodePool, md: &str) -> NodeClaim {
    let mut c = claim_for(pool, "sim-0");
    c.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            MACHINE_DEPLOYMENT_ANNOTATION.to_string(),
            format!("{NAMESPACE}/{md}"),
        );
    c.metadata.finalizers = Some(vec![TERMINATION_FINALIZER.to_string()]);
    c
}

/// Items 6 and 9: md-0 has max-size 2 and a malformed CPU annotation; four claims already wait
/// on it. The Scaler keeps max-size (the two beyond it are turned down and go to md-1), and
/// once the claims and MachineDeployments are deleted, the Scalers stop and every per-object map
/// shrinks back. Before: a malformed capacity annotation switched max-size off.
#[actix::test]
async fn a_malformed_capacity_annotation_keeps_max_size_and_maps_shrink_back() {
    let mut broken = seed_of(0, 2);
    broken
        .annotations
        .insert(CPU_ANNOTATION.to_string(), "four".to_string());
    let mut healthy = seed_of(1, 20);
    // Same instance type, so the turned-down claims have somewhere to go.
    healthy.annotations = seed_of(0, 20).annotations;
    let env = env(vec![broken, healthy], |_| {}).await;
    let probe = env.watch_replicas("md-0");
    let pool = env.pool.clone();
    env.sim
        .run(move |c| async move {
            let api: Api<NodeClaim> = Api::all(c.client());
            for _ in 0..4 {
                api.create(&PostParams::default(), &waiting_claim(&pool, "md-0"))
                    .await
                    .expect("claim");
            }
        })
        .await
        .expect("claims");
    env.until("four claims initialized", |e| e.initialized() == 4)
        .await;
    env.settle().await;
    assert!(
        probe.max.load(Ordering::Relaxed) <= 2,
        "md-0 went above its max-size: {}",
        probe.max.load(Ordering::Relaxed)
    );
    assert_eq!(env.replicas("md-0"), 2);
    assert_eq!(env.replicas("md-1"), 2);
    env.invariants_hold();

    // Everything goes: claims, then the MachineDeployments.
    env.delete_claims().await;
    env.until("claims and Machines gone", |e| {
        e.list("nodeclaims").is_empty() && e.list("machines").is_empty()
    })
    .await;
    let scaler = env
        .controller()
        .shared
        .router
        .scaler("default/md-0")
        .expect("md-0 has a Scaler");
    // The Scaler forgets deleted claims (at the latest at its next resync).
    let start = Instant::now();
    loop {
        let maps = scaler.send(Tracked).await.expect("scaler answers");
        if maps.values().all(|n| *n == 0) {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the Scaler still holds {maps:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    env.sim
        .run(|c| async move {
            let ar = c.capi_version().machine_deployment();
            let api: Api<DynamicObject> = Api::namespaced_with(c.client(), NAMESPACE, &ar);
            for md in ["md-0", "md-1"] {
                api.delete(md, &DeleteParams::default())
                    .await
                    .expect("delete MachineDeployment");
            }
        })
        .await
        .expect("delete MachineDeployments");
    env.until("MachineDeployments gone", |e| {
        e.list("machinedeployments").is_empty()
    })
    .await;
    let start = Instant::now();
    loop {
        let scalers = env.controller().shared.router.scalers().len();
        let catalog = env.tracked_catalog().await;
        if scalers == 0 && catalog["templates"] == 0 && catalog["fetching"] == 0 {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "still {scalers} Scalers, catalog {catalog:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = env.metrics.encode();
    assert!(
        !text.contains("karpenter_capi_scaler_queue_depth{machine_deployment=\"default/md-0\"}"),
        "a stopped Scaler's gauge goes: {text}"
    );
    let provisioner = env
        .controller()
        .provisioner
        .send(Tracked)
        .await
        .expect("provisioner answers");
    assert!(provisioner.values().all(|n| *n == 0), "{provisioner:?}");
}

/// Item 8 (and 9 for metric series, 11 for the cloud-provider latency): NodePool
/// status.resources and the usage gauges drop keys that went to zero, and a deleted NodePool's
/// series go. Before: a merge patch kept the last cpu/memory values for ever, the gauges kept
/// exporting them, and karpenter_cloudprovider_duration_seconds was never observed.
#[actix::test]
async fn nodepool_resources_and_usage_series_drop_keys_that_went_to_zero() {
    let env = env(vec![seed_of(0, 10)], |_| {}).await;
    env.claims(2, 1).await;
    env.settle().await;
    let has_cpu = |e: &Env| {
        e.list("nodepools")
            .first()
            .is_some_and(|np| !np["status"]["resources"]["cpu"].is_null())
    };
    env.until("the NodePool counts cpu", has_cpu).await;
    let usage = "karpenter_nodepools_usage{nodepool=\"default\",resource_type=\"cpu\"}";
    assert!(env.metrics.encode().contains(usage));

    env.delete_claims().await;
    env.until("status.resources without cpu", |e| !has_cpu(e))
        .await;
    // Item 11: Karpenter's cloud-provider latency is observed for both methods.
    env.until("the claims and their Machines gone", |e| {
        e.list("nodeclaims").is_empty() && e.list("machines").is_empty()
    })
    .await;
    // The Delete is observed when the finalizer write answers, just after the claim goes.
    let start = Instant::now();
    loop {
        let text = env.metrics.encode();
        let count = |method: &str| {
            metric(
                &text,
                &format!("karpenter_cloudprovider_duration_seconds_count{{method=\"{method}\"}}"),
            )
        };
        if count("Create") == 2.0 && count("Delete") == 2.0 {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "cloud-provider durations: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let np = env.list("nodepools").remove(0);
    assert_eq!(np["status"]["nodes"], 0, "{np:#}");
    let start = Instant::now();
    while env.metrics.encode().contains(usage) {
        assert!(start.elapsed() < DEADLINE, "the cpu usage series stays");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    env.sim
        .run(|c| async move {
            Api::<NodePool>::all(c.client())
                .delete("default", &DeleteParams::default())
                .await
                .expect("delete NodePool")
        })
        .await
        .expect("delete NodePool");
    let start = Instant::now();
    while env
        .metrics
        .encode()
        .contains("karpenter_nodepools_usage{nodepool=\"default\"")
    {
        assert!(start.elapsed() < DEADLINE, "a deleted pool keeps series");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Item 3: NodeClaim creates that take seconds to answer still count as capacity: the
/// provisioner re-solves meanwhile (NodePool status writes, catalog rebuilds) but creates no
/// duplicate. Before: every solve during the wait created the same claims again.
#[actix::test]
async fn slow_creates_count_as_capacity_and_create_no_duplicates() {
    let env = env(vec![seed_of(0, 50)], |_| {}).await;
    env.faults()
        .set_write_latency("nodeclaims", Duration::from_secs(3));
    // 1.5 CPU each on 4-CPU nodes: two pods per claim.
    env.sim
        .run(|c| async move {
            c.create_pods(NAMESPACE, "slow", 10, &PodShape::new("1500m", "1Gi"))
                .await
                .expect("pods")
        })
        .await
        .expect("pods");
    // Keep poking the provisioner while the creates hang, as status writes would.
    for _ in 0..10 {
        env.controller().shared.router.provisioner_poke();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    env.faults().clear();
    env.faults().set_agent(Some(USER_AGENT));
    env.until("every pod bound", |e| e.bound_pods() == 10).await;
    env.settle().await;
    assert_eq!(
        env.list("nodeclaims").len(),
        5,
        "one claim per two pods, no duplicates"
    );
    env.invariants_hold();
}

/// Item 3: a create that fails is reported on its pods and the pods are solved again after a
/// backoff. Before: the failure was only logged and the pods waited for an unrelated event.
#[actix::test]
async fn a_failed_create_is_reported_on_its_pods_and_solved_again() {
    let env = env(vec![seed_of(0, 50)], |_| {}).await;
    env.faults().set_write_latency("nodeclaims", Duration::ZERO);
    env.faults().set_rule(
        "nodeclaims",
        karpenter_capi::sim::FaultRule {
            error_rate: 1.0,
            ..Default::default()
        },
    );
    env.sim
        .run(|c| async move {
            c.create_pods(NAMESPACE, "fail", 2, &PodShape::new("1", "1Gi"))
                .await
                .expect("pods")
        })
        .await
        .expect("pods");
    env.until("a FailedCreatingNodeClaim Event on a pod", |e| {
        e.events("FailedCreatingNodeClaim")
            .iter()
            .any(|ev| ev["regarding"]["kind"] == "Pod")
    })
    .await;
    env.faults().clear();
    env.until("both pods bound", |e| e.bound_pods() == 2).await;
    env.settle().await;
    env.invariants_hold();
}

/// Item 7: the template's status.capacity is read again when it could not be read (a transient
/// error is retried, not cached) and when the MachineDeployment changes after the template did.
/// Before: the first answer, or the first error, was kept for ever.
#[actix::test]
async fn template_capacity_is_retried_after_errors_and_reread_after_changes() {
    let mut seed = seed_of(0, 10);
    seed.annotations.remove(CPU_ANNOTATION);
    seed.annotations.remove(MEMORY_ANNOTATION);
    seed.infrastructure_template = Some("tmpl-0".into());
    let env = env(Vec::new(), |_| {}).await;
    env.faults().set_error_rate("devmachinetemplates", 1.0);
    env.sim
        .run(move |c| async move {
            c.create_machine_template(
                NAMESPACE,
                "tmpl-0",
                BTreeMap::from([
                    ("cpu".to_string(), "2".to_string()),
                    ("memory".to_string(), "8Gi".to_string()),
                ]),
            )
            .await
            .expect("template");
            c.create_machine_deployment_from(&seed)
                .await
                .expect("MachineDeployment");
        })
        .await
        .expect("seed");
    let cpu = |e: &Env| -> Option<String> {
        e.controller()
            .shared
            .catalog
            .instance_types(NODECLASS)
            .first()
            .and_then(|t| {
                t.capacity
                    .iter()
                    .find(|(k, _)| *k == "cpu")
                    .map(|(_, q)| q.to_string())
            })
    };
    // The catalog has the MachineDeployment (from annotations) before the template is read.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(cpu(&env), None, "the template could not be read yet");
    env.faults().clear();
    env.until("the template's capacity after the errors stop", |e| {
        cpu(e).as_deref() == Some("2")
    })
    .await;

    env.sim
        .run(|c| async move {
            let ar = karpenter_capi::sim::cluster::infra_template_resource();
            let api: Api<DynamicObject> = Api::namespaced_with(c.client(), NAMESPACE, &ar);
            api.patch_status(
                "tmpl-0",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"capacity": {"cpu": "8"}}})),
            )
            .await
            .expect("template status");
            let md_ar = c.capi_version().machine_deployment();
            let mds: Api<DynamicObject> = Api::namespaced_with(c.client(), NAMESPACE, &md_ar);
            mds.patch(
                "md-0",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"touched": "1"}}})),
            )
            .await
            .expect("touch MachineDeployment");
        })
        .await
        .expect("change template");
    env.until("the new capacity", |e| cpu(e).as_deref() == Some("8"))
        .await;
}

/// A NodeClass watch that lists again (its resourceVersion expired) while MachineDeployments
/// change: the catalog keeps every NodeClass through the list, because the list is swapped in
/// whole. Before: the Catalog's own watch handler cleared its NodeClasses at the list's start,
/// and a rebuild during the list unpublished them, so the NodePool said `NodeClassNotFound`
/// (and provisioning saw no offering) until the list completed.
#[actix::test]
async fn a_nodeclass_relist_never_unpublishes_the_catalog() {
    let env = env(vec![seed_of(0, 10)], |_| {}).await;
    let ready = |e: &Env| {
        e.get("nodepools", "", "default").and_then(|np| {
            crate::common::condition(&np, "NodeClassReady")
                .and_then(|c| c["status"].as_str().map(String::from))
        })
    };
    env.until("the NodePool's NodeClass ready", |e| {
        ready(e).as_deref() == Some("True")
    })
    .await;
    // The controller's next NodeClass list takes 2 s and its watch cannot resume.
    env.faults()
        .set_latency("clusterapinodeclasses", Duration::from_secs(2));
    env.faults()
        .set_watch_expire_rate("clusterapinodeclasses", 1.0);
    env.faults().cut_watches();
    // Meanwhile a MachineDeployment changes every 100 ms (each one a catalog rebuild), and the
    // NodePool's condition is sampled as often.
    let mds = env.machine_deployment_api();
    let mut seen = BTreeMap::new();
    let until = Instant::now() + Duration::from_secs(8);
    let mut i = 0;
    while Instant::now() < until {
        i += 1;
        let touch = json!({"metadata": {"annotations": {"test/touch": i.to_string()}}});
        mds.patch("md-0", &PatchParams::default(), &Patch::Merge(&touch))
            .await
            .expect("touch md-0");
        *seen.entry(ready(&env).unwrap_or_default()).or_insert(0) += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let relists = metric(
        &env.metrics.encode(),
        "karpenter_capi_watch_relists_total{watch=\"ClusterAPINodeClasses\"}",
    );
    assert!(
        relists >= 1.0,
        "the NodeClass watch listed again: {relists}"
    );
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        vec!["True"],
        "NodeClassReady while the NodeClasses were listed again (samples by status): {seen:?}"
    );
    env.faults().clear();
    env.settle().await;
    env.invariants_hold();
}
