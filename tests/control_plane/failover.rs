//! Leader election and failover on both backends: two replicas, one Lease; both are Ready and
//! only the leader writes; the leader is killed (no release) or stopped gracefully (the path
//! SIGTERM takes) and the standby takes over and launches the claim made during the handover,
//! with no Machine bound twice. The replicas run as the administrator here, told apart by their
//! User-Agents; the same failover under the Helm chart's RBAC is the `rbac` module's flow.

use std::time::{Duration, Instant};

use karpenter_capi::app;
use karpenter_capi::sim::cluster::Backend;
use karpenter_capi::simulate::launch::settle;
use karpenter_capi::simulate::{BackgroundSim, invariants};

use crate::common::SETTLE;
use crate::common::replicas::*;

on_both_backends![
    standby_is_ready_and_takes_over_after_the_leader_is_killed,
    graceful_stop_hands_over_within_two_seconds,
];

pub fn tests() -> Vec<crate::assets::Test> {
    on_both()
}

/// The takeover bounds are held on the simulated server only: on the real backend the time
/// depends on kube-apiserver under the machine's load, and no duration is asserted against it.
fn within(backend: Backend, took_ms: u64, bound: Duration, what: &str) {
    if backend == Backend::Simulated {
        assert!(
            took_ms <= bound.as_millis() as u64,
            "{what} after {took_ms} ms"
        );
    }
}

/// Every claim launched and initialized, and no Machine bound to two claims or leaked.
async fn nothing_bound_twice(sim: &BackgroundSim) {
    settle(sim, SETTLE).await.expect("the cluster settles");
    let inv = invariants::check(sim.cluster().store(), sim.cluster().capi_version().into());
    assert!(inv.ok(), "invariants violated: {:#?}", inv.problems);
    assert_eq!(inv.bound, 2, "both claims bound: {inv:?}");
}

async fn standby_is_ready_and_takes_over_after_the_leader_is_killed(backend: Backend) {
    let (sim, pool) = seeded(backend).await;
    let (l, s) = pair(&sim).await;
    only_the_leader_writes(&sim, &pool, &l, &s).await;

    // Kill: no release, in-flight work abandoned.
    let stopped = sim.cluster().stats().now_ms();
    l.replica.abort();
    let second = claim(&sim, &pool).await;
    let takeover = first_write_after(&sim, s.name, stopped).await;
    say!("takeover after kill: {takeover} ms (bound: lease {LEASE:?} + 2 s)");
    within(
        backend,
        takeover,
        LEASE + Duration::from_secs(2),
        "the standby wrote",
    );
    assert!(s.leads());
    // The new leader works from the API state: the claim made during the handover launches.
    wait_launched(&sim, &second).await;
    nothing_bound_twice(&sim).await;
    s.replica.shutdown().await;
}

async fn graceful_stop_hands_over_within_two_seconds(backend: Backend) {
    let (sim, pool) = seeded(backend).await;
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
    say!("graceful shutdown took {shutdown:?}; takeover: {takeover} ms (bound: 2 s)");
    within(
        backend,
        u64::try_from(shutdown.as_millis()).unwrap_or(u64::MAX),
        app::SHUTDOWN_BOUND,
        "the shutdown ended",
    );
    within(
        backend,
        takeover,
        Duration::from_secs(2),
        "the standby wrote after the leader began shutting down",
    );
    assert_eq!(
        writes_by(&sim, l.name, done),
        vec![],
        "the old leader writes nothing after its shutdown"
    );
    assert!(s.leads());
    wait_launched(&sim, &second).await;
    nothing_bound_twice(&sim).await;
    s.replica.shutdown().await;
}
