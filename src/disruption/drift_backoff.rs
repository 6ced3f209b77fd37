//! Drift back-off per NodePool (upstream's RFC "per-NodePool exponential back-off for drift
//! disruption"): when a pool's drift replacements fail to launch, its drifted nodes are left
//! out of drift for a window that doubles with each failed window (1 minute to 10 minutes by
//! default), so a pool whose new nodes cannot come up neither burns launches every pass nor
//! holds the head of the drift order (oldest drift first) against the other pools. A
//! replacement that initializes resets the pool. Pure: the disruption actor reports outcomes and
//! asks before each decision; state is in memory, so a restart forgets it (at worst one more
//! failing launch before the pool backs off again).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One pool's back-off: how many windows failed in a row, and the end of the current one.
#[derive(Clone, Copy, Debug)]
struct Entry {
    level: u32,
    until: Instant,
}

/// A window a failure armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Armed {
    /// Failed windows in a row, this one included (1 for the first).
    pub(crate) level: u32,
    pub(crate) window: Duration,
}

/// Every pool's drift back-off.
#[derive(Debug)]
pub(crate) struct DriftBackoff {
    base: Duration,
    cap: Duration,
    pools: HashMap<String, Entry>,
}

impl DriftBackoff {
    pub(crate) fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            pools: HashMap::new(),
        }
    }

    /// The window of the `level`-th failure in a row: `base * 2^(level-1)`, at most `cap`.
    /// Without jitter, unlike upstream's: one disruption loop decides for every pool, so pools
    /// coming back together make no burst of requests, and the window an operator reads in the
    /// Event is the one that holds.
    pub(crate) fn window(&self, level: u32) -> Duration {
        // Past 2^20 the cap has long won; the shift never overflows.
        let factor = 1u32 << level.saturating_sub(1).min(20);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// Whether the pool's drift waits now.
    pub(crate) fn backed_off(&self, pool: &str, now: Instant) -> bool {
        self.pools.get(pool).is_some_and(|e| now < e.until)
    }

    /// A drift replacement of the pool failed. Within a window this changes nothing (the
    /// failures of one burst count once, so the level counts failed windows, not attempts);
    /// otherwise the next window starts and is returned.
    pub(crate) fn fail(&mut self, pool: &str, now: Instant) -> Option<Armed> {
        if self.backed_off(pool, now) {
            return None;
        }
        let level = self.pools.get(pool).map_or(0, |e| e.level) + 1;
        // The level stops growing once the window is at its cap: nothing to count beyond.
        let level = level.min(self.level_at_cap());
        let window = self.window(level);
        self.pools.insert(
            pool.to_string(),
            Entry {
                level,
                until: now + window,
            },
        );
        Some(Armed { level, window })
    }

    /// A drift replacement of the pool initialized: it drifts as any other again. True when it
    /// had backed off.
    pub(crate) fn reset(&mut self, pool: &str) -> bool {
        self.pools.remove(pool).is_some()
    }

    /// Pools that are gone keep no back-off.
    pub(crate) fn retain(&mut self, exists: impl Fn(&str) -> bool) {
        self.pools.retain(|pool, _| exists(pool));
    }

    /// The first level whose window is the cap.
    fn level_at_cap(&self) -> u32 {
        (1..=21).find(|l| self.window(*l) >= self.cap).unwrap_or(21)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn backoff() -> DriftBackoff {
        DriftBackoff::new(MINUTE, 10 * MINUTE)
    }

    #[test]
    fn windows_double_from_one_minute_to_ten() {
        let b = backoff();
        let windows: Vec<u64> = (1..=7).map(|l| b.window(l).as_secs() / 60).collect();
        assert_eq!(windows, [1, 2, 4, 8, 10, 10, 10]);
        assert_eq!(b.window(u32::MAX), 10 * MINUTE);
    }

    #[test]
    fn each_failed_window_escalates_and_failures_within_one_count_once() {
        let mut b = backoff();
        let t0 = Instant::now();
        assert!(!b.backed_off("a", t0));
        let first = b.fail("a", t0).expect("the first failure arms a window");
        assert_eq!(
            first,
            Armed {
                level: 1,
                window: MINUTE
            }
        );
        assert!(b.backed_off("a", t0 + MINUTE - Duration::from_secs(1)));
        // A second replacement of the same burst failing inside the window changes nothing.
        assert_eq!(b.fail("a", t0 + Duration::from_secs(10)), None);
        assert!(!b.backed_off("a", t0 + MINUTE), "the window ended");
        let mut at = t0 + MINUTE;
        let mut levels = Vec::new();
        for _ in 0..5 {
            let armed = b
                .fail("a", at)
                .expect("a failure after the window arms the next");
            levels.push((armed.level, armed.window.as_secs() / 60));
            at += armed.window;
        }
        assert_eq!(levels, [(2, 2), (3, 4), (4, 8), (5, 10), (5, 10)]);
        // Another pool is not held by this one.
        assert!(!b.backed_off("b", t0));
    }

    #[test]
    fn a_success_resets_the_pool() {
        let mut b = backoff();
        let t0 = Instant::now();
        b.fail("a", t0);
        b.fail("a", t0 + MINUTE);
        assert!(b.reset("a"));
        assert!(!b.backed_off("a", t0 + MINUTE));
        assert!(!b.reset("a"), "nothing to reset twice");
        let armed = b.fail("a", t0 + 2 * MINUTE).expect("armed");
        assert_eq!(armed.level, 1, "the schedule starts over");
    }

    #[test]
    fn pools_that_are_gone_are_forgotten() {
        let mut b = backoff();
        let t0 = Instant::now();
        b.fail("gone", t0);
        b.fail("kept", t0);
        b.retain(|p| p == "kept");
        assert!(!b.backed_off("gone", t0));
        assert!(b.backed_off("kept", t0));
    }
}
