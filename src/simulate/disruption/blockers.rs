//! Why nodes were not disrupted during a disruption phase: the controller's
//! `karpenter_voluntary_disruption_blocked_nodes{nodepool,blocker}` gauge, summed over the
//! NodePools, read every second while the phase runs.
//!
//! Sampled rather than read once at the end: the gauge holds the last pass only (it is set whole
//! each pass), so at the end it shows what holds the settled cluster (`not_consolidatable`,
//! `no_feasible_schedule` on the nodes left), while a `budget` or `backoff` hold happens
//! mid-phase and is gone by then. One sample a second is one per pass at the scenarios' pace
//! (`fast_disruption`), and encoding the metrics that often costs little.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::time_split;

/// The gauge's name.
const BLOCKED_NODES: &str = "karpenter_voluntary_disruption_blocked_nodes";
const EVERY: Duration = Duration::from_secs(1);

/// One blocker over the phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlockerCount {
    /// The most nodes it held in one sampled pass.
    pub max_nodes: u64,
    /// Samples (one a second, and one at the end) in which it held at least one node: about
    /// the seconds it held any.
    pub seconds_held: u64,
    /// The nodes it held in the last pass before the report.
    pub at_end: u64,
}

/// Blocker label -> its counts; blockers never seen are absent.
pub type BlockerCounts = BTreeMap<String, BlockerCount>;

/// The gauge's nodes per blocker in one exposition (its empty-labelled default series left
/// out).
fn reading(exposition: &str) -> BTreeMap<String, u64> {
    time_split::by_label(exposition, BLOCKED_NODES, "blocker")
        .into_iter()
        .filter(|(blocker, n)| !blocker.is_empty() && *n > 0.0)
        .map(|(blocker, n)| (blocker, n as u64))
        .collect()
}

/// Adds one reading: maxima and seconds from it, `at_end` replaced by it.
fn add(counts: &mut BlockerCounts, now: &BTreeMap<String, u64>) {
    for c in counts.values_mut() {
        c.at_end = 0;
    }
    for (blocker, n) in now {
        let c = counts.entry(blocker.clone()).or_default();
        c.max_nodes = c.max_nodes.max(*n);
        c.seconds_held += 1;
        c.at_end = *n;
    }
}

/// Samples the gauge until stopped.
pub(super) struct BlockerSampler {
    metrics: Arc<crate::metrics::Metrics>,
    counts: Arc<parking_lot::Mutex<BlockerCounts>>,
    task: tokio::task::JoinHandle<()>,
}

impl BlockerSampler {
    pub(super) fn start(metrics: &Arc<crate::metrics::Metrics>) -> Self {
        let counts = Arc::new(parking_lot::Mutex::new(BlockerCounts::new()));
        let (m, held) = (metrics.clone(), counts.clone());
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(EVERY).await;
                let now = reading(&m.encode());
                add(&mut held.lock(), &now);
            }
        });
        Self {
            metrics: metrics.clone(),
            counts,
            task,
        }
    }

    /// The counts, with one last reading taken now (so `at_end` is the report's moment).
    pub(super) fn stop(self) -> BlockerCounts {
        self.task.abort();
        let mut counts = self.counts.lock().clone();
        add(&mut counts, &reading(&self.metrics.encode()));
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_sum_the_pools_and_keep_maxima_seconds_and_the_last() {
        let text = |budget: u64, other: u64| {
            format!(
                "{BLOCKED_NODES}{{nodepool=\"\",blocker=\"\"}} 0\n\
                 {BLOCKED_NODES}{{nodepool=\"a\",blocker=\"budget\"}} {budget}\n\
                 {BLOCKED_NODES}{{nodepool=\"b\",blocker=\"budget\"}} 1\n\
                 {BLOCKED_NODES}{{nodepool=\"a\",blocker=\"not_consolidatable\"}} {other}\n"
            )
        };
        let mut counts = BlockerCounts::new();
        add(&mut counts, &reading(&text(3, 0)));
        add(&mut counts, &reading(&text(0, 2)));
        let budget = counts["budget"];
        assert_eq!(
            (budget.max_nodes, budget.seconds_held, budget.at_end),
            (4, 2, 1)
        );
        let other = counts["not_consolidatable"];
        assert_eq!(
            (other.max_nodes, other.seconds_held, other.at_end),
            (2, 1, 2)
        );
        assert!(!counts.contains_key(""));
    }
}
