//! Two controller replicas with leader election (short timings) on one cluster, each with its
//! own clients (told apart by User-Agent: in the simulated server's write log, or in
//! kube-apiserver's audit log on the real backend), Health and metrics.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use karpenter_capi::actors::controller::Controller;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::app::{self, Campaign, ClientOptions, Replica};
use karpenter_capi::http::{self, Health};
use karpenter_capi::leader;
use karpenter_capi::metrics::Metrics;
use karpenter_capi::sim::cluster::{Backend, SimClusterConfig};
use karpenter_capi::simulate::launch::{create_claims, seed_of};
use karpenter_capi::simulate::{BackgroundSim, sim_settings};
use karpenter_capi::write_gate::WriteGate;

use super::{Env, condition};

pub const LEASE: Duration = Duration::from_secs(3);
pub const RENEW: Duration = Duration::from_secs(2);
pub const RETRY: Duration = Duration::from_millis(500);
pub const LEASE_NAME: &str = "karpenter-capi-ha";
/// Only to detect a hang; the bounds under test are asserted separately.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub fn cluster() -> SimClusterConfig {
    SimClusterConfig {
        provider_delay: Duration::from_millis(50),
        jitter: Duration::from_millis(20),
        node_ready_delay: Duration::from_millis(50),
        node_delete_delay: Duration::from_millis(20),
        ..SimClusterConfig::default()
    }
}

pub fn election(identity: &str) -> leader::Config {
    let mut cfg = leader::Config::new("default".into(), LEASE_NAME.into(), identity.into());
    cfg.lease_duration = LEASE;
    cfg.renew_deadline = RENEW;
    cfg.retry_period = RETRY;
    cfg
}

pub fn agent(name: &str) -> String {
    format!("karpenter-capi-ha/{name}")
}

pub struct Member {
    pub name: &'static str,
    pub replica: Replica,
    pub metrics: Arc<Metrics>,
    pub health_addr: SocketAddr,
}

impl Member {
    pub fn leads(&self) -> bool {
        *self.replica.leading.borrow()
    }
}

pub async fn seeded(backend: Backend) -> (BackgroundSim, NodePool) {
    Env::builder()
        .cluster(cluster())
        .backend(backend)
        .seeds(vec![seed_of(0, 100)])
        .seeded()
        .await
}

/// One replica as `run` builds it, with its own clients, gate, Health and metrics.
pub async fn member(sim: &BackgroundSim, name: &'static str) -> Member {
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

pub async fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

/// Start two replicas at once; returns (leader, standby) once one leads.
pub async fn pair(sim: &BackgroundSim) -> (Member, Member) {
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

/// Writes other than the Lease, by one replica, at or after `since_ms` (server clock). The real
/// backend's audit feed names a writer `user (User-Agent)`.
pub fn writes_by(sim: &BackgroundSim, name: &str, since_ms: u64) -> Vec<(u64, String)> {
    let agent = agent(name);
    let audited = format!(" ({agent})");
    sim.cluster()
        .stats()
        .writes()
        .into_iter()
        .filter(|w| (w.agent == agent || w.agent.ends_with(&audited)) && w.resource != "leases")
        .filter(|w| w.at_ms >= since_ms)
        .map(|w| (w.at_ms, format!("{} {}/{}", w.verb, w.resource, w.name)))
        .collect()
}

pub async fn claim(sim: &BackgroundSim, pool: &NodePool) -> String {
    let pool = pool.clone();
    sim.run(move |c| async move { create_claims(c.client(), &pool, 1, 1).await })
        .await
        .expect("sim")
        .expect("create claim")
        .remove(0)
}

pub fn launched(sim: &BackgroundSim, name: &str) -> bool {
    sim.cluster()
        .store()
        .get("nodeclaims", "", name)
        .is_some_and(|c| condition(&c, "Launched").is_some_and(|l| l["status"] == "True"))
}

pub async fn wait_launched(sim: &BackgroundSim, name: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !launched(sim, name) {
        assert!(Instant::now() < deadline, "claim {name} never launched");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Milliseconds (server clock) until `name` first writes at or after `since_ms`.
pub async fn first_write_after(sim: &BackgroundSim, name: &str, since_ms: u64) -> u64 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some((at, _)) = writes_by(sim, name, since_ms).first() {
            return at - since_ms;
        }
        assert!(Instant::now() < deadline, "{name} never wrote");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Before the handover, only the leader writes.
pub async fn only_the_leader_writes(sim: &BackgroundSim, pool: &NodePool, l: &Member, s: &Member) {
    let first = claim(sim, pool).await;
    wait_launched(sim, &first).await;
    assert!(!writes_by(sim, l.name, 0).is_empty(), "the leader writes");
    assert_eq!(
        writes_by(sim, s.name, 0),
        vec![],
        "the standby must not write"
    );
}
