//! High availability against the simulated cluster: two replicas with leader election (short
//! timings), each with its own clients (told apart by User-Agent in the server's write log),
//! Health and metrics. Both are Ready, exactly one writes, and the standby takes over after the
//! leader is killed (within lease duration + 2 s) or stopped gracefully (within 2 s), and then
//! provisions from the API state. Also: a leader whose Lease requests hang steps down in time,
//! client deadlines end a hung request, and the binary releases the Lease on SIGTERM, also when
//! the signal comes during start-up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use karpenter_capi::actors::Controller;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::app::{self, Campaign, ClientOptions, Replica, Timeouts};
use karpenter_capi::http::{self, Health};
use karpenter_capi::leader;
use karpenter_capi::metrics::Metrics;
use karpenter_capi::sim::cluster::SimClusterConfig;
use karpenter_capi::simulate::launch::{create_claims, seed_of};
use karpenter_capi::simulate::{BackgroundSim, sim_settings};
use karpenter_capi::write_gate::WriteGate;

use crate::common::Env;

const LEASE: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(500);
const LEASE_NAME: &str = "karpenter-capi-ha";
/// Only to detect a hang; the bounds under test are asserted separately.
const PATIENCE: Duration = Duration::from_secs(60);

fn cluster() -> SimClusterConfig {
    SimClusterConfig {
        provider_delay: Duration::from_millis(50),
        jitter: Duration::from_millis(20),
        node_ready_delay: Duration::from_millis(50),
        node_delete_delay: Duration::from_millis(20),
        ..SimClusterConfig::default()
    }
}

fn election(identity: &str) -> leader::Config {
    let mut cfg = leader::Config::new("default".into(), LEASE_NAME.into(), identity.into());
    cfg.lease_duration = LEASE;
    cfg.renew_deadline = RENEW;
    cfg.retry_period = RETRY;
    cfg
}

fn agent(name: &str) -> String {
    format!("karpenter-capi-ha/{name}")
}

struct Member {
    name: &'static str,
    replica: Replica,
    metrics: Arc<Metrics>,
    health_addr: SocketAddr,
}

impl Member {
    fn leads(&self) -> bool {
        *self.replica.leading.borrow()
    }
}

async fn seeded() -> (BackgroundSim, NodePool) {
    Env::builder()
        .cluster(cluster())
        .seeds(vec![seed_of(0, 100)])
        .seeded()
        .await
}

/// One replica as `run` builds it, with its own clients, gate, Health and metrics.
async fn member(sim: &BackgroundSim, name: &'static str) -> Member {
    let gate = WriteGate::default();
    let options = ClientOptions {
        agent: agent(name),
        gate: gate.clone(),
        ..ClientOptions::default()
    };
    let client = app::client_from_kubeconfig_with(&sim.kubeconfig(), &options)
        .await
        .expect("client");
    let metrics = Metrics::new();
    let health = Arc::new(Health::default());
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let (_, health_addr) = http::serve(any, any, metrics.clone(), health.clone())
        .await
        .expect("probe endpoints");
    let campaign = Campaign {
        client: client.clone(),
        config: election(name),
    };
    let controller = Controller {
        workload: client.clone(),
        management: client,
        capi_version: None,
        settings: sim_settings(None),
        metrics: metrics.clone(),
        instance: name.into(),
    };
    let replica = tokio::time::timeout(
        PATIENCE,
        app::start_replica(controller, gate, health, Some(campaign)),
    )
    .await
    .expect("a replica starts (and is Ready) without waiting for the Lease")
    .expect("replica");
    Member {
        name,
        replica,
        metrics,
        health_addr,
    }
}

async fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

/// Start two replicas at once; returns (leader, standby) once one leads.
async fn pair(sim: &BackgroundSim) -> (Member, Member) {
    let (a, b) = tokio::join!(member(sim, "a"), member(sim, "b"));
    for m in [&a, &b] {
        let ready = get(m.health_addr, "/readyz").await;
        assert!(
            ready.starts_with("HTTP/1.1 200"),
            "{} not Ready: {ready}",
            m.name
        );
    }
    let deadline = Instant::now() + PATIENCE;
    while !(a.leads() ^ b.leads()) {
        assert!(Instant::now() < deadline, "no single leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (leader, standby) = if a.leads() { (a, b) } else { (b, a) };
    let gauge = |m: &Member| {
        m.metrics
            .encode()
            .lines()
            .find(|l| l.starts_with("karpenter_capi_leader "))
            .map(str::to_string)
    };
    assert_eq!(gauge(&leader).as_deref(), Some("karpenter_capi_leader 1"));
    assert_eq!(gauge(&standby).as_deref(), Some("karpenter_capi_leader 0"));
    (leader, standby)
}

/// Writes other than the Lease, by one replica, at or after `since_ms` (server clock).
fn writes_by(sim: &BackgroundSim, name: &str, since_ms: u64) -> Vec<(u64, String)> {
    let agent = agent(name);
    sim.cluster()
        .stats()
        .writes()
        .into_iter()
        .filter(|w| w.agent == agent && w.resource != "leases" && w.at_ms >= since_ms)
        .map(|w| (w.at_ms, format!("{} {}/{}", w.verb, w.resource, w.name)))
        .collect()
}

async fn claim(sim: &BackgroundSim, pool: &NodePool) -> String {
    let pool = pool.clone();
    sim.run(move |c| async move { create_claims(c.client(), &pool, 1, 1).await })
        .await
        .expect("sim")
        .expect("create claim")
        .remove(0)
}

fn launched(sim: &BackgroundSim, name: &str) -> bool {
    sim.cluster()
        .server()
        .store()
        .get("nodeclaims", "", name)
        .and_then(|c| c.pointer("/status/conditions").cloned())
        .and_then(|cs| cs.as_array().cloned())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Launched" && c["status"] == "True")
        })
}

async fn wait_launched(sim: &BackgroundSim, name: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !launched(sim, name) {
        assert!(Instant::now() < deadline, "claim {name} never launched");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Milliseconds (server clock) until `name` first writes at or after `since_ms`.
async fn first_write_after(sim: &BackgroundSim, name: &str, since_ms: u64) -> u64 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some((at, what)) = writes_by(sim, name, since_ms).first() {
            println!(
                "replica {name}: first write {what} {} ms after the leader stopped",
                at - since_ms
            );
            return at - since_ms;
        }
        assert!(Instant::now() < deadline, "{name} never wrote");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Before the handover, only the leader writes.
async fn only_the_leader_writes(sim: &BackgroundSim, pool: &NodePool, l: &Member, s: &Member) {
    let first = claim(sim, pool).await;
    wait_launched(sim, &first).await;
    assert!(!writes_by(sim, l.name, 0).is_empty(), "the leader writes");
    assert_eq!(
        writes_by(sim, s.name, 0),
        vec![],
        "the standby must not write"
    );
}

#[actix::test]
async fn standby_is_ready_and_takes_over_after_the_leader_is_killed() {
    let (sim, pool) = seeded().await;
    let (l, s) = pair(&sim).await;
    only_the_leader_writes(&sim, &pool, &l, &s).await;

    // Kill: no release, in-flight work abandoned.
    let stopped = sim.cluster().stats().now_ms();
    l.replica.abort();
    let second = claim(&sim, &pool).await;
    let takeover = first_write_after(&sim, s.name, stopped).await;
    println!("takeover after kill: {takeover} ms (bound: lease {LEASE:?} + 2 s)");
    assert!(
        takeover <= (LEASE + Duration::from_secs(2)).as_millis() as u64,
        "standby wrote {takeover} ms after the leader was killed"
    );
    assert!(s.leads());
    // The new leader works from the API state: the claim made during the handover launches.
    wait_launched(&sim, &second).await;
    s.replica.shutdown().await;
}

#[actix::test]
async fn graceful_stop_hands_over_within_two_seconds() {
    let (sim, pool) = seeded().await;
    let (l, s) = pair(&sim).await;
    only_the_leader_writes(&sim, &pool, &l, &s).await;

    // The same path SIGTERM takes.
    let stopped = sim.cluster().stats().now_ms();
    let began = Instant::now();
    let second = claim(&sim, &pool).await;
    l.replica.shutdown().await;
    let shutdown = began.elapsed();
    let done = sim.cluster().stats().now_ms();
    let takeover = first_write_after(&sim, s.name, stopped).await;
    println!("graceful shutdown took {shutdown:?}; takeover: {takeover} ms (bound: 2 s)");
    assert!(shutdown < app::SHUTDOWN_BOUND);
    assert!(
        takeover <= 2000,
        "standby wrote {takeover} ms after the leader began shutting down"
    );
    assert_eq!(
        writes_by(&sim, l.name, done),
        vec![],
        "the old leader writes nothing after its shutdown"
    );
    assert!(s.leads());
    wait_launched(&sim, &second).await;
    s.replica.shutdown().await;
}

#[actix::test]
async fn a_leader_whose_lease_requests_hang_steps_down_within_the_renew_deadline() {
    let (sim, _) = seeded().await;
    let client = sim.client_here().await.expect("client");
    let mut e = leader::Election::spawn(client, election("hung"));
    let mut status = e.status.clone();
    tokio::time::timeout(PATIENCE, status.wait_for(|l| *l))
        .await
        .expect("elected")
        .expect("status");
    // Every Lease request from now on hangs (far longer than any bound here).
    sim.cluster()
        .server()
        .faults()
        .set_latency("leases", Duration::from_secs(600));
    let hung = Instant::now();
    tokio::time::timeout(PATIENCE, status.wait_for(|l| !*l))
        .await
        .expect("the leader steps down although its requests hang")
        .expect("status");
    let took = hung.elapsed();
    println!("stepped down {took:?} after the Lease requests began to hang");
    assert!(
        took <= RENEW + Duration::from_secs(1),
        "stepped down after {took:?} (renew deadline {RENEW:?})"
    );
    let end = tokio::time::timeout(Duration::from_secs(5), e.finished())
        .await
        .expect("the election ends");
    assert!(matches!(end, Err(leader::Error::Lost { .. })), "{end:?}");
    sim.cluster().server().faults().clear();
}

/// SIGTERM can arrive after the Lease is taken but before start-up is done (the caches are
/// still syncing): the Lease is released then too, or a standby waits a whole lease duration.
#[actix::test]
async fn a_signal_during_start_up_releases_a_lease_already_taken() {
    let (sim, _) = seeded().await;
    // Start-up cannot finish: listing Nodes hangs far longer than this test.
    sim.cluster()
        .server()
        .faults()
        .set_latency("nodes", Duration::from_secs(600));
    let client = sim.client_here().await.expect("client");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let campaign = Campaign {
        client: client.clone(),
        config: election("starting"),
    };
    let controller = Controller {
        workload: client.clone(),
        management: client,
        capi_version: None,
        settings: sim_settings(None),
        metrics: Metrics::new(),
        instance: "starting".into(),
    };
    let holder = |l: Option<Lease>| {
        l.and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .unwrap_or_default()
    };
    let leases_seen = leases.clone();
    let signal = async move {
        while holder(leases_seen.get_opt(LEASE_NAME).await.ok().flatten()) != "starting" {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        "SIGTERM"
    };
    let started = tokio::time::timeout(
        PATIENCE,
        app::start_replica_until(
            controller,
            WriteGate::default(),
            Arc::new(Health::default()),
            Some(campaign),
            signal,
        ),
    )
    .await
    .expect("start-up stops at the signal")
    .expect("no error");
    assert!(started.is_none(), "start-up was stopped");
    let lease = leases.get_opt(LEASE_NAME).await.expect("get Lease");
    assert_eq!(holder(lease), "", "the Lease is released");
    sim.cluster().server().faults().clear();
}

/// SIGTERM can arrive while the first acquire is in flight: the create has landed but its
/// answer has not. The release must wait for that answer and give the Lease up, or the next
/// replica waits a whole lease duration for a holder that is gone.
#[actix::test]
async fn a_release_during_an_acquire_whose_answer_is_late_gives_the_lease_up() {
    let sim = BackgroundSim::start(cluster())
        .await
        .expect("simulated cluster");
    let client = sim.client_here().await.expect("client");
    sim.cluster()
        .server()
        .faults()
        .set_write_response_delay("leases", Duration::from_millis(800));
    let e = leader::Election::spawn(client.clone(), election("late"));
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let deadline = Instant::now() + PATIENCE;
    while leases
        .get_opt(LEASE_NAME)
        .await
        .expect("get Lease")
        .is_none()
    {
        assert!(Instant::now() < deadline, "the Lease was never created");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !*e.status.borrow(),
        "the create's answer is still held back, so the replica does not know it leads"
    );
    e.release(Duration::from_secs(10)).await;
    let l = leases.get_opt(LEASE_NAME).await.expect("get Lease");
    let holder = l
        .as_ref()
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default();
    assert_eq!(holder, "", "Lease released: {:?}", l.map(|l| l.spec));
    sim.cluster().server().faults().clear();
}

#[actix::test]
async fn client_deadlines_end_a_hung_request() {
    let sim = BackgroundSim::start(cluster())
        .await
        .expect("simulated cluster");
    let options = ClientOptions {
        timeouts: Timeouts {
            read: Duration::from_secs(1),
            ..Timeouts::DEFAULT
        },
        ..ClientOptions::default()
    };
    let client = app::client_from_kubeconfig_with(&sim.kubeconfig(), &options)
        .await
        .expect("client");
    sim.cluster()
        .server()
        .faults()
        .set_latency("nodes", Duration::from_secs(600));
    let began = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        Api::<Node>::all(client).list(&Default::default()),
    )
    .await
    .expect("the read timeout ends the request; without it this hangs");
    assert!(r.is_err(), "a hung request fails");
    println!("hung request failed after {:?}", began.elapsed());
    sim.cluster().server().faults().clear();
}

/// The binary, run as a pod would run it, on `kubeconfig`, with the test's Lease.
fn spawn_binary(kubeconfig: &std::path::Path, extra: &[&str]) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
        .args(["run", "--kubeconfig"])
        .arg(kubeconfig)
        .args([
            "--metrics-port",
            "0",
            "--health-probe-port",
            "0",
            "--leader-election-namespace",
            "default",
            "--leader-election-name",
            LEASE_NAME,
        ])
        .args(extra)
        .env("LOG_LEVEL", "info")
        .spawn()
        .expect("start the binary")
}

fn lease_holder(l: &Option<Lease>) -> String {
    l.as_ref()
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default()
}

async fn wait_for_a_holder(leases: &Api<Lease>) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let l = leases.get_opt(LEASE_NAME).await.expect("get Lease");
        if !lease_holder(&l).is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "the binary never took the Lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for the binary to exit after `what` (at most 30 s, the default grace period), and
/// checks that it exited 0 within the shutdown bound, having released the Lease.
async fn exits_cleanly_releasing_the_lease(
    child: &mut std::process::Child,
    leases: &Api<Lease>,
    what: &str,
    bound: Duration,
) {
    let sent = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if sent.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the binary did not exit within 30 s of {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let took = sent.elapsed();
    println!("exited {took:?} after {what} with {status}");
    assert!(status.success(), "exit status after {what}: {status}");
    assert!(took < bound, "took {took:?}");
    let l = leases.get_opt(LEASE_NAME).await.expect("get Lease");
    assert_eq!(
        lease_holder(&l),
        "",
        "Lease released: {:?}",
        l.map(|l| l.spec)
    );
    let lease: Value = serde_json::to_value(l).expect("json");
    assert_eq!(
        lease.pointer("/spec/leaseDurationSeconds"),
        Some(&Value::from(1))
    );
}

/// SIGTERM makes the binary release the Lease and exit 0 well within the default 30 s grace
/// period.
#[actix::test]
async fn sigterm_releases_the_lease_and_exits_cleanly() {
    let sim = BackgroundSim::start(cluster())
        .await
        .expect("simulated cluster");
    let mut child = spawn_binary(&sim.kubeconfig(), &[]);
    let client = sim.client_here().await.expect("client");
    let leases: Api<Lease> = Api::namespaced(client, "default");
    wait_for_a_holder(&leases).await;
    let term = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    exits_cleanly_releasing_the_lease(&mut child, &leases, "SIGTERM", app::SHUTDOWN_BOUND).await;
}

/// A rotated kubeconfig (Cluster API rewrote the Secret, the kubelet updated the mounted file)
/// makes the binary shut down as on SIGTERM, so its restart reads the new credentials and a
/// standby takes the released Lease at once.
#[actix::test]
async fn a_changed_kubeconfig_releases_the_lease_and_exits_cleanly() {
    let sim = BackgroundSim::start(cluster())
        .await
        .expect("simulated cluster");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::copy(sim.kubeconfig(), &kubeconfig).expect("copy the kubeconfig");
    let mut child = spawn_binary(&kubeconfig, &["--kubeconfig-check-interval", "200ms"]);
    let client = sim.client_here().await.expect("client");
    let leases: Api<Lease> = Api::namespaced(client, "default");
    wait_for_a_holder(&leases).await;
    let mut text = std::fs::read_to_string(&kubeconfig).expect("read the kubeconfig");
    text.push_str("\n# rotated\n");
    std::fs::write(&kubeconfig, text).expect("rotate the kubeconfig");
    exits_cleanly_releasing_the_lease(
        &mut child,
        &leases,
        "the kubeconfig changed",
        app::SHUTDOWN_BOUND + Duration::from_secs(1),
    )
    .await;
}

/// A candidate watches the Lease: a released Lease is taken at once, not at the next retry
/// (here 5 s, so only the watch can meet the bound).
#[actix::test]
async fn a_released_lease_is_taken_at_once_not_at_the_next_retry() {
    let sim = BackgroundSim::start(cluster())
        .await
        .expect("simulated cluster");
    let slow = |name: &str| {
        let mut cfg = election(name);
        cfg.retry_period = Duration::from_secs(5);
        cfg.renew_deadline = Duration::from_secs(8);
        cfg.lease_duration = Duration::from_secs(10);
        cfg
    };
    let first = leader::Election::spawn(sim.client_here().await.expect("client"), slow("first"));
    let mut up = first.status.clone();
    tokio::time::timeout(PATIENCE, up.wait_for(|l| *l))
        .await
        .expect("elected")
        .expect("status");
    let second = leader::Election::spawn(sim.client_here().await.expect("client"), slow("second"));
    let mut next = second.status.clone();
    // Let the candidate make its first attempt (and start watching) before the release.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!*next.borrow());
    let began = Instant::now();
    first.release(Duration::from_secs(5)).await;
    tokio::time::timeout(PATIENCE, next.wait_for(|l| *l))
        .await
        .expect("the candidate takes over")
        .expect("status");
    let took = began.elapsed();
    println!("released Lease taken after {took:?} (retry period 5 s)");
    assert!(took < Duration::from_millis(1500), "took {took:?}");
    second.abort();
}
