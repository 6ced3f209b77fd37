//! Upstream's provisioning suite, "Batching": when a batch of pending pods is solved. The
//! provisioner's window is a pure state machine (`actors::batch::Batch`) that the actor arms a
//! timer from, so these cases drive it with explicit instants, as upstream steps a fake clock:
//! no test here measures time.

use std::time::{Duration, Instant};

use karpenter_capi::actors::batch::Batch;
use karpenter_capi::actors::provisioner::Batching;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Upstream's window for the two timing cases: idle 5 s, max 10 s.
fn window() -> Batch {
    Batch::new(Batching {
        idle: secs(5),
        max: secs(10),
    })
}

#[test]
fn a_single_pod_is_solved_once_the_idle_window_passes() {
    let t0 = Instant::now();
    let mut b = Batch::new(Batching::default());
    let at = b.pod("default/p", t0).expect("a batch opens");
    assert_eq!(at, t0 + Batching::default().idle);
    assert_eq!(b.fire_at(), Some(at), "nothing else holds it open");
    b.fired();
    assert_eq!(b.fire_at(), None);
}

#[test]
fn the_same_pod_again_does_not_extend_the_window() {
    let t0 = Instant::now();
    let mut b = window();
    assert_eq!(b.pod("default/p", t0), Some(t0 + secs(5)));
    // Within the idle window the same pod is seen again (its status was rewritten).
    assert_eq!(b.pod("default/p", t0 + secs(3)), None);
    assert_eq!(
        b.fire_at(),
        Some(t0 + secs(5)),
        "fires at the first deadline"
    );
}

#[test]
fn a_new_pod_extends_the_window() {
    let t0 = Instant::now();
    let mut b = window();
    assert_eq!(b.pod("default/p", t0), Some(t0 + secs(5)));
    assert_eq!(b.pod("default/q", t0 + secs(3)), Some(t0 + secs(8)));
    assert_eq!(b.fire_at(), Some(t0 + secs(8)));
}
