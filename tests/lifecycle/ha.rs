//! High availability against the simulated cluster (the failover of two replicas runs on both
//! backends, in the control_plane test binary): a leader whose Lease requests hang steps down in
//! time, client deadlines end a hung request, and the binary releases the Lease on SIGTERM, also
//! when the signal comes during start-up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::Value;

use karpenter_capi::actors::controller::Controller;
use karpenter_capi::app::{self, Campaign, ClientOptions, Timeouts};
use karpenter_capi::http::Health;
use karpenter_capi::leader;
use karpenter_capi::metrics::Metrics;
use karpenter_capi::simulate::{BackgroundSim, sim_settings};
use karpenter_capi::write_gate::WriteGate;

use crate::common::replicas::*;
use karpenter_capi::sim::cluster::Backend;

#[actix::test]
async fn a_leader_whose_lease_requests_hang_steps_down_within_the_renew_deadline() {
    let (sim, _) = seeded(Backend::Simulated).await;
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
    let (sim, _) = seeded(Backend::Simulated).await;
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
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
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
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the binary");
    // Its log through the test's captured output (a spawned thread inherits the capture), so
    // it shows only when the test fails.
    if let Some(log) = child.stderr.take() {
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(log).lines().map_while(Result::ok) {
                eprintln!("{line}");
            }
        });
    }
    child
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
