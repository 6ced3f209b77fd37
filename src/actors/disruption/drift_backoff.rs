//! The actor's side of drift back-off per NodePool (`disruption::drift_backoff`): a drift
//! command whose replacements fail to launch backs its pools off; one whose replacements
//! initialized resets them; a pass leaves the drifted nodes of backed-off pools out of drift.

use std::collections::BTreeSet;
use std::time::Instant;

use kube::Resource;

use crate::disruption;
use crate::metrics::NodePoolLabels;

use super::{Disruption, Executing};

impl Disruption {
    /// Drifted nodes of a backed-off pool are no drift candidates this pass (they may still be
    /// consolidated: the back-off is about drift's launches only).
    pub(super) fn hold_backed_off_drift(&mut self, candidates: &mut [disruption::Candidate]) {
        {
            let pools = self.shared.state.nodepools.read();
            self.drift_backoff.retain(|p| pools.get(p).is_some());
        }
        let now = Instant::now();
        for c in candidates.iter_mut().filter(|c| c.drift.is_some()) {
            if self.drift_backoff.backed_off(&c.nodepool, now) {
                let why = format!(
                    "NodePool {}'s drift backs off after failed launches",
                    c.nodepool
                );
                let hold = disruption::Hold::new(disruption::Blocker::Backoff, why);
                disruption::blocker::hold_drift(c, hold);
            }
        }
    }

    /// The replacements of command `id` failed to launch (not created, gone, deleted, or not
    /// initialized in time): if it was drift, each of its pools backs off (once per window).
    pub(super) fn drift_launch_failed(&mut self, id: u64, why: &str) {
        let Some(e) = self.executing.get(&id) else {
            return;
        };
        if e.command.method != disruption::Method::Drift {
            return;
        }
        let pools: BTreeSet<String> = e
            .command
            .candidates
            .iter()
            .map(|c| c.nodepool.clone())
            .collect();
        let now = Instant::now();
        for pool in pools {
            if let Some(armed) = self.drift_backoff.fail(&pool, now) {
                self.tell_backoff(&pool, armed, why);
            }
        }
    }

    /// Command `id` is done: a drift command whose replacements initialized resets its pools.
    pub(super) fn drift_replaced(&mut self, e: &Executing) {
        if e.command.method != disruption::Method::Drift || e.replacements.is_empty() {
            return;
        }
        for c in &e.command.candidates {
            if self.drift_backoff.reset(&c.nodepool) {
                tracing::info!(nodepool = %c.nodepool, "a drift replacement initialized; drift back-off reset");
            }
        }
    }

    /// The counter, a Warning Event on the NodePool and a log line for a window just armed.
    fn tell_backoff(&self, pool: &str, armed: disruption::drift_backoff::Armed, why: &str) {
        let window = crate::api::duration::format(armed.window);
        tracing::info!(nodepool = %pool, level = armed.level, window = %window, reason = %why, "drift replacements failed to launch; drift of the NodePool backs off");
        self.shared
            .metrics
            .disruption_drift_backoffs
            .get_or_create(&NodePoolLabels {
                nodepool: pool.to_string(),
            })
            .inc();
        let Some(np) = self.shared.state.nodepools.read().get(pool).cloned() else {
            return;
        };
        self.shared.events.warning(
            np.object_ref(&()),
            "DisruptionBackoff",
            format!(
                "Drift of NodePool {pool} backs off for {window} (failed window {}): {why}",
                armed.level
            ),
        );
    }
}
