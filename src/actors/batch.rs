//! The provisioner's batching window as a pure state machine (Karpenter's
//! `BATCH_IDLE_DURATION` / `BATCH_MAX_DURATION`).
//!
//! Only a provisionable pod arriving extends the idle window: that is what the window waits for
//! (the rest of a burst of pods). Each pod extends it once per batch, as Karpenter's batcher
//! counts each triggering element once: a pending pod's own status updates (the scheduler
//! rewriting its `PodScheduled=False` message as nodes come and go) must not hold a batch open. Anything else that may change the answer (a catalog rebuild,
//! a NodePool status write, a claim deleted) opens a batch when none is open but never pushes an
//! open one's deadline out; otherwise our own writes, echoed by the watches, would keep a batch
//! open until `BATCH_MAX_DURATION` under load.

use std::collections::HashSet;
use std::time::Instant;

use crate::view::settings::Batching;

#[derive(Clone, Debug)]
pub struct Batch {
    window: Batching,
    opened: Option<Instant>,
    fire_at: Option<Instant>,
    /// The pods that opened or extended the open batch.
    seen: HashSet<String>,
}

impl Batch {
    pub fn new(window: Batching) -> Self {
        Self {
            window,
            opened: None,
            fire_at: None,
            seen: HashSet::new(),
        }
    }

    /// Provisionable pod `key` arrived or changed at `now`: open a batch or extend its idle
    /// deadline, never past the max deadline, once per pod and batch. Returns when the batch
    /// fires, or None when nothing changed (this pod already counted in the open batch).
    pub fn pod(&mut self, key: &str, now: Instant) -> Option<Instant> {
        if self.opened.is_some() && self.seen.contains(key) {
            return None;
        }
        self.seen.insert(key.to_string());
        Some(self.extend(now))
    }

    /// Pods may have arrived unseen (a watch re-list): open or extend as a new pod would.
    pub(crate) fn relisted(&mut self, now: Instant) -> Instant {
        self.extend(now)
    }

    fn extend(&mut self, now: Instant) -> Instant {
        let opened = *self.opened.get_or_insert(now);
        let at = (now + self.window.idle).min(opened + self.window.max);
        self.fire_at = Some(at);
        at
    }

    /// Something other than a pod changed at `now`: open a batch if none is open (returning when
    /// it fires); an open batch keeps its deadline (None: nothing to reschedule).
    pub(crate) fn other(&mut self, now: Instant) -> Option<Instant> {
        if self.opened.is_some() {
            return None;
        }
        self.opened = Some(now);
        let at = now + self.window.idle;
        self.fire_at = Some(at);
        Some(at)
    }

    /// The batch fired (its timer ran): the next event opens a new one.
    pub fn fired(&mut self) {
        self.opened = None;
        self.fire_at = None;
        self.seen.clear();
    }

    pub fn fire_at(&self) -> Option<Instant> {
        self.fire_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn window() -> Batching {
        Batching {
            idle: Duration::from_secs(1),
            max: Duration::from_secs(10),
        }
    }

    #[test]
    fn pods_extend_the_idle_window_up_to_the_max() {
        let t0 = Instant::now();
        let mut b = Batch::new(window());
        assert_eq!(b.pod("a", t0), Some(t0 + Duration::from_secs(1)));
        assert_eq!(
            b.pod("b", t0 + Duration::from_millis(900)),
            Some(t0 + Duration::from_millis(1900))
        );
        assert_eq!(
            b.pod("c", t0 + Duration::from_millis(9500)),
            Some(t0 + Duration::from_secs(10)),
            "never past the max deadline"
        );
        b.fired();
        let t1 = t0 + Duration::from_secs(11);
        assert_eq!(
            b.pod("a", t1),
            Some(t1 + Duration::from_secs(1)),
            "a new batch opens, for a pod seen in the last one too"
        );
    }

    #[test]
    fn other_changes_open_a_batch_but_never_extend_one() {
        let t0 = Instant::now();
        let mut b = Batch::new(window());
        assert_eq!(b.pod("a", t0), Some(t0 + Duration::from_secs(1)));
        // Our own status writes and catalog rebuilds echo back every few hundred ms.
        for i in 1..50 {
            assert_eq!(b.other(t0 + Duration::from_millis(100 * i)), None);
        }
        assert_eq!(b.fire_at(), Some(t0 + Duration::from_secs(1)));
        b.fired();
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(b.other(t1), Some(t1 + Duration::from_secs(1)));
        assert_eq!(b.other(t1 + Duration::from_millis(500)), None);
        // A pod still extends a batch that something else opened.
        assert_eq!(
            b.pod("a", t1 + Duration::from_millis(600)),
            Some(t1 + Duration::from_millis(1600))
        );
    }

    #[test]
    fn a_pod_extends_a_batch_once() {
        let t0 = Instant::now();
        let mut b = Batch::new(window());
        assert_eq!(b.pod("a", t0), Some(t0 + Duration::from_secs(1)));
        // The same pending pod rewritten (its PodScheduled message) keeps the deadline.
        for i in 1..20 {
            assert_eq!(b.pod("a", t0 + Duration::from_millis(100 * i)), None);
        }
        assert_eq!(b.fire_at(), Some(t0 + Duration::from_secs(1)));
        // A re-list extends as a new pod would.
        let t = t0 + Duration::from_millis(500);
        assert_eq!(b.relisted(t), t + Duration::from_secs(1));
    }
}
