//! Exponential backoff with jitter, the one retry policy of every actor (claims, Scalers, the
//! provisioner's creates, status writers).
//!
//! The n-th retry waits a random time in `[d/2, d]` where `d = min(cap, base * 2^n)` ("equal
//! jitter"): it grows fast enough that a broken API server is not hammered, the jitter keeps
//! thousands of claim actors that failed together from retrying together, and the floor of `d/2`
//! keeps a retry from firing at once. A success resets it. A wait the server asked for
//! (`Retry-After`) is a floor under the delay.

use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Retry delays for one kind of work; pure apart from the random source.
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
    rng: SmallRng,
}

/// A different seed for every Backoff (jitter needs spread, not secrecy): the clock's nanoseconds
/// mixed with a process-wide counter.
pub(crate) fn seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    nanos ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Backoff {
    /// The policy for API calls that failed: 200 ms, doubling, at most 30 s.
    pub(crate) fn api() -> Self {
        Self::new(Duration::from_millis(200), Duration::from_secs(30))
    }

    /// The policy for a write on a path someone waits on (a disruption command's taint, mark,
    /// create and delete, each read back before it is sent again): 50 ms, doubling, at most
    /// 30 s. A 5xx without `Retry-After` does not ask for time, and a command's writes are its
    /// critical path. A server that asks for time still gets it (`Retry-After` is the floor),
    /// and controller-runtime's per-item requeue starts lower still (5 ms).
    pub(crate) fn write() -> Self {
        Self::new(Duration::from_millis(50), Duration::from_secs(30))
    }

    pub(crate) fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            attempt: 0,
            rng: SmallRng::seed_from_u64(seed()),
        }
    }

    /// How many delays were handed out since the last reset.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempt
    }

    /// The upper bound of the next delay, before jitter.
    pub(crate) fn ceiling(&self) -> Duration {
        // 2^attempt overflows a u32 quickly; past 2^20 the cap has long won.
        let factor = 1u32 << self.attempt.min(20);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The next delay, with jitter from the thread's random source.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let mut rng = self.rng.clone();
        let d = self.next_with(&mut rng);
        self.rng = rng;
        d
    }

    /// The next delay, but not shorter than the wait the server asked for (`Retry-After`, as
    /// `retry_after::retry_after` reads it from a refused call).
    pub(crate) fn next_delay_after(&mut self, asked: Option<Duration>) -> Duration {
        self.next_delay().max(asked.unwrap_or_default())
    }

    /// The next delay, with jitter from `rng` (tests pass a seeded one).
    pub(crate) fn next_with(&mut self, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        let half = ceiling / 2;
        let spread = (ceiling - half).as_nanos() as u64;
        let extra = if spread == 0 {
            0
        } else {
            rng.random_range(0..=spread)
        };
        half + Duration::from_nanos(extra)
    }

    /// The work succeeded: the next failure starts from `base` again.
    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let ceilings: Vec<Duration> = (0..7)
            .map(|_| {
                let c = b.ceiling();
                b.next_delay();
                c
            })
            .collect();
        let ms: Vec<u128> = ceilings.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(b.attempts(), 7);
    }

    #[test]
    fn jitter_stays_within_half_to_full_ceiling_and_varies() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
            for _ in 0..3 {
                b.next_with(&mut rng);
            }
            let ceiling = b.ceiling();
            let d = b.next_with(&mut rng);
            assert!(
                d >= ceiling / 2 && d <= ceiling,
                "{d:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
            seen.insert(d);
        }
        assert!(
            seen.len() > 100,
            "jitter spreads retries: {} distinct",
            seen.len()
        );
    }

    #[test]
    fn the_servers_wait_is_a_floor() {
        let mut b = Backoff::api();
        assert_eq!(
            b.next_delay_after(Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert!(b.next_delay_after(None) <= Duration::from_millis(400));
        assert_eq!(b.attempts(), 2);
    }

    #[test]
    fn reset_starts_over_and_huge_attempt_counts_do_not_overflow() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        for _ in 0..100 {
            assert!(b.next_delay() <= Duration::from_secs(5));
        }
        assert_eq!(b.ceiling(), Duration::from_secs(5));
        b.reset();
        assert_eq!(b.attempts(), 0);
        assert_eq!(b.ceiling(), Duration::from_millis(100));
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
