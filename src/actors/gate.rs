//! One order between the controller's own NodeClaim deletions and a disruption command's start.
//!
//! A command checks its pool's budget on the server (one LIST of the pool's claims) and then
//! marks its candidates. A claim the controller deletes for another reason in between (its
//! Machine or Node went in a Cluster API rollout, a launch timed out, a repair) is not in that
//! LIST but counts against the budget once it lands, so the mark could start a disruption over
//! the budget the server would have shown a moment later. Upstream Karpenter has the same
//! window between its cluster state and its taints; here it is closed for the controller's own
//! writes: the command holds the gate from its LIST to its mark, and every other claim deletion
//! holds it for its DELETE. Whichever comes second sees the first on the server. Deletions by
//! others (a user, Cluster API itself) cannot be ordered and stay outside.
//!
//! Neither side waits long: a write stuck behind a slow server must not hold the other back,
//! so past `GATE_WAIT` each goes on without the gate (the order is then what it was before).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard};

/// The longest either side waits for the other.
pub const GATE_WAIT: Duration = Duration::from_secs(2);

/// Shared by every actor of one controller (cloned handles, one lock).
#[derive(Clone, Debug, Default)]
pub struct DeletionGate(Arc<Mutex<()>>);

/// The gate, held while this lives (unless the wait ran out).
pub struct Held<'a> {
    guard: Option<MutexGuard<'a, ()>>,
}

impl Held<'_> {
    /// Whether the gate is held (false when the wait ran out).
    pub fn is_held(&self) -> bool {
        self.guard.is_some()
    }
}

impl DeletionGate {
    /// Waits for the gate, at most `GATE_WAIT`.
    pub async fn hold(&self, why: &str) -> Held<'_> {
        match tokio::time::timeout(GATE_WAIT, self.0.lock()).await {
            Ok(guard) => Held { guard: Some(guard) },
            Err(_) => {
                tracing::debug!(why, wait = ?GATE_WAIT, "going on without the deletion gate: the other side held it too long");
                Held { guard: None }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_second_waits_for_the_first_and_then_holds() {
        let gate = DeletionGate::default();
        let first = gate.hold("first").await;
        assert!(first.is_held());
        let other = gate.clone();
        let second = tokio::spawn(async move { other.hold("second").await.is_held() });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !second.is_finished(),
            "the second waits while the first holds"
        );
        drop(first);
        assert!(second.await.unwrap_or(false), "then holds it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_past_the_limit_goes_on_without_it() {
        let gate = DeletionGate::default();
        let _first = gate.hold("first").await;
        let second = gate.hold("second").await;
        assert!(!second.is_held());
    }
}
