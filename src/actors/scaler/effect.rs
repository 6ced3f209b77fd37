//! Whether Cluster API has acted on the Scaler's last replica write, so that the next write
//! does not undo it unseen.
//!
//! Cluster API's controllers act on the replica count they read when they reconcile, not on
//! each write: a raise (a claim needs a Machine) followed within milliseconds by a decrement (a
//! drifted claim's marked Machine may go) reads as no change at all, so Cluster API creates
//! nothing and deletes nothing, and the marked Machine and the waiting claim stay as they were
//! (seen with Cluster API v1.14's manager: a drift that never finished). So a write in the
//! opposite direction waits until Cluster API has visibly acted on the last one: a raise once
//! as many Machines as it asked for exist and are not being deleted (status counts a Machine
//! being deleted too, so a raise made while an older Machine was on its way out read as done
//! before Cluster API made the new one: seen on real Cluster API as a static pool's replacement
//! waiting out `ACT_WAIT`; a pool without Machines falls back on its status), a decrement once every
//! Machine it removed is deleting or gone (or Cluster API settled without removing it, which
//! the spent-decrement check handles). Never longer than `ACT_WAIT`: a raise that Cluster API
//! holds (a preflight check, a paused Cluster) must not hold every decrement behind it.

use std::time::{Duration, Instant};

/// The longest a write waits for Cluster API to act on the opposite one before it.
pub(crate) const ACT_WAIT: Duration = Duration::from_secs(30);

/// The Scaler's last replica write that changed `spec.replicas`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LastWrite {
    pub(crate) raised: bool,
    pub(crate) to: i32,
    /// The MachineDeployment generation the write produced.
    pub(crate) generation: Option<i64>,
    /// The Machines a decrement removed.
    pub(crate) decrements: Vec<String>,
    pub(crate) at: Instant,
}

/// What the Scaler sees of Cluster API's side when it is about to write.
#[derive(Clone)]
pub(crate) struct Seen<'a> {
    pub(crate) spec_replicas: i32,
    pub(crate) observed_generation: Option<i64>,
    pub(crate) status_replicas: Option<i32>,
    /// Its Machines that are not being deleted (`None`: a pool without MachinePool Machines,
    /// whose instances only its status counts).
    pub(crate) live_machines: Option<i32>,
    /// Whether a Machine (by key) is deleting or gone.
    pub(crate) leaving: &'a dyn Fn(&str) -> bool,
}

/// Whether Cluster API has acted on `last` (or it no longer matters).
pub(crate) fn acted(last: &LastWrite, seen: &Seen<'_>, now: Instant) -> bool {
    if now.saturating_duration_since(last.at) >= ACT_WAIT || seen.spec_replicas != last.to {
        // Waited long enough, or someone else has written replicas since.
        return true;
    }
    if last.raised {
        let observed = match (seen.observed_generation, last.generation) {
            (Some(o), Some(g)) => o >= g,
            (_, None) => true,
            (None, Some(_)) => false,
        };
        let counted = seen.live_machines.or(seen.status_replicas);
        observed && counted.is_some_and(|r| r >= last.to)
    } else {
        last.decrements.iter().all(|m| (seen.leaving)(m))
    }
}

/// Whether a write of `delta` must wait for Cluster API to act on `last` first: only a write
/// in the opposite direction can undo it.
pub(crate) fn must_wait(
    last: Option<&LastWrite>,
    delta: i32,
    seen: &Seen<'_>,
    now: Instant,
) -> bool {
    let Some(last) = last else { return false };
    let opposite = if last.raised { delta < 0 } else { delta > 0 };
    opposite && !acted(last, seen, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raise(to: i32, generation: i64, at: Instant) -> LastWrite {
        LastWrite {
            raised: true,
            to,
            generation: Some(generation),
            decrements: Vec::new(),
            at,
        }
    }

    fn seen<'a>(
        spec: i32,
        observed: i64,
        status: i32,
        leaving: &'a dyn Fn(&str) -> bool,
    ) -> Seen<'a> {
        Seen {
            spec_replicas: spec,
            observed_generation: Some(observed),
            status_replicas: Some(status),
            live_machines: None,
            leaving,
        }
    }

    #[test]
    fn a_decrement_waits_until_the_raise_before_it_has_its_machines() {
        let now = Instant::now();
        let last = raise(9, 12, now);
        let none = |_: &str| false;
        // Not observed yet, then observed without the Machine, then with it.
        assert!(must_wait(Some(&last), -1, &seen(9, 11, 8, &none), now));
        assert!(must_wait(Some(&last), -1, &seen(9, 12, 8, &none), now));
        assert!(!must_wait(Some(&last), -1, &seen(9, 12, 9, &none), now));
    }

    #[test]
    fn a_machine_being_deleted_does_not_make_a_raise_look_done() {
        let now = Instant::now();
        let last = raise(10, 12, now);
        let none = |_: &str| false;
        // Status counts 10 (one of them deleting); only 9 live Machines: not acted on yet.
        let mut s = seen(10, 12, 10, &none);
        s.live_machines = Some(9);
        assert!(must_wait(Some(&last), -1, &s, now));
        s.live_machines = Some(10);
        assert!(!must_wait(Some(&last), -1, &s, now));
    }

    #[test]
    fn a_raise_waits_until_the_decremented_machines_are_leaving() {
        let now = Instant::now();
        let last = LastWrite {
            raised: false,
            to: 8,
            generation: Some(13),
            decrements: vec!["default/m-1".into()],
            at: now,
        };
        let staying = |_: &str| false;
        let leaving = |m: &str| m == "default/m-1";
        assert!(must_wait(Some(&last), 1, &seen(8, 13, 8, &staying), now));
        assert!(!must_wait(Some(&last), 1, &seen(8, 13, 9, &leaving), now));
    }

    #[test]
    fn a_write_in_the_same_direction_never_waits() {
        let now = Instant::now();
        let none = |_: &str| false;
        assert!(!must_wait(
            Some(&raise(9, 12, now)),
            2,
            &seen(9, 11, 8, &none),
            now
        ));
        assert!(!must_wait(None, -1, &seen(9, 11, 8, &none), now));
    }

    #[test]
    fn the_wait_ends_after_act_wait_or_when_someone_else_writes_replicas() {
        let then = Instant::now();
        let last = raise(9, 12, then);
        let none = |_: &str| false;
        assert!(!must_wait(
            Some(&last),
            -1,
            &seen(9, 11, 8, &none),
            then + ACT_WAIT
        ));
        assert!(!must_wait(Some(&last), -1, &seen(10, 11, 8, &none), then));
    }
}
