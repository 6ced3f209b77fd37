//! When a scale-up may be written: at once at low load, held for a few milliseconds while a
//! burst of requests is under way so that one replica write covers many claims.
//!
//! A write in flight already batches the requests that arrive meanwhile, but a burst spread over
//! a second or two (claims arriving every few milliseconds, writes answering in about as long)
//! would still cost one write per round trip. So while requests keep arriving closely, a
//! scale-up is held until they pause (a few times their usual spacing, at least `MIN_IDLE`) or until the hold
//! reaches its cap. The cap doubles with each write of the same burst (the first write of a
//! burst goes out quickly; a long burst gets few writes) and is bounded, so no claim waits more
//! than `MAX_HOLD` for its replica. A lone request (none other within `BURST_GAP`) is written
//! at once: the window is zero at low load.

use std::time::{Duration, Instant};

/// Requests closer than this (on average) are a burst.
pub(crate) const BURST_GAP: Duration = Duration::from_millis(250);
/// The first hold of a burst.
pub(crate) const FIRST_HOLD: Duration = Duration::from_millis(100);
/// No scale-up is held longer than this.
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(1);
/// A pause this long ends a hold early (at least; more when requests are spaced wider). Claims
/// of a burst reach the Scaler in clumps (each as its actor gets a turn on a busy runtime), with
/// gaps of tens of milliseconds between clumps that are no end of the burst: a shorter floor
/// ended most holds early and cost a write per clump.
const MIN_IDLE: Duration = Duration::from_millis(50);

#[derive(Debug, Default)]
pub(crate) struct Coalescer {
    last_request: Option<Instant>,
    /// Moving average of the spacing between requests.
    spacing: Option<Duration>,
    /// When the scale-up now waiting was first held.
    held_since: Option<Instant>,
    /// Scale-up writes made in the current burst.
    streak: u32,
}

impl Coalescer {
    /// A claim asked for a Machine at `now`.
    pub(crate) fn requested(&mut self, now: Instant) {
        if let Some(last) = self.last_request {
            let gap = now.saturating_duration_since(last);
            self.spacing = Some(match self.spacing {
                Some(s) => (s * 3 + gap) / 4,
                None => gap,
            });
            if gap >= BURST_GAP {
                // A new burst (or none): its first write goes out quickly again.
                self.streak = 0;
                self.spacing = Some(gap);
            }
        }
        self.last_request = Some(now);
    }

    /// How much longer to hold the scale-up that is due at `now`; `None`: write it now.
    pub(crate) fn hold(&mut self, now: Instant) -> Option<Duration> {
        let (Some(last), Some(spacing)) = (self.last_request, self.spacing) else {
            return self.release();
        };
        let quiet = now.saturating_duration_since(last);
        if spacing >= BURST_GAP || quiet >= BURST_GAP {
            return self.release();
        }
        let since = *self.held_since.get_or_insert(now);
        let cap = FIRST_HOLD
            .saturating_mul(1 << self.streak.min(8))
            .min(MAX_HOLD);
        let idle = (spacing * 3).max(MIN_IDLE);
        let until = (last + idle).min(since + cap);
        match until.checked_duration_since(now) {
            Some(left) if !left.is_zero() => Some(left),
            _ => self.release(),
        }
    }

    fn release(&mut self) -> Option<Duration> {
        if self.held_since.take().is_some() {
            self.streak = self.streak.saturating_add(1);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_lone_request_is_written_at_once() {
        let t = Instant::now();
        let mut c = Coalescer::default();
        c.requested(t);
        assert_eq!(c.hold(t), None);
        c.requested(t + ms(400));
        assert_eq!(c.hold(t + ms(400)), None, "requests far apart are no burst");
    }

    /// Requests every 2 ms for two seconds, a write due whenever one is waiting: the holds
    /// grow, so the burst costs a handful of writes rather than hundreds.
    #[test]
    fn a_steady_burst_costs_few_writes() {
        let t = Instant::now();
        let mut c = Coalescer::default();
        let mut writes = Vec::new();
        let mut waiting = false;
        for i in 0..2000u64 {
            let now = t + ms(i);
            if i % 2 == 0 {
                c.requested(now);
                waiting = true;
            }
            if waiting && c.hold(now).is_none() {
                writes.push(i);
                waiting = false;
            }
        }
        assert_eq!(writes[0], 0, "the first request is written at once");
        assert!(writes[1] <= 2 + FIRST_HOLD.as_millis() as u64);
        assert!(writes.len() <= 6, "{writes:?}");
        let gaps: Vec<u64> = writes.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.iter().all(|g| *g <= MAX_HOLD.as_millis() as u64 + 2),
            "{gaps:?}"
        );
    }

    #[test]
    fn a_pause_ends_the_hold() {
        let t = Instant::now();
        let mut c = Coalescer::default();
        for i in 0..10 {
            c.requested(t + ms(i * 2));
        }
        assert!(c.hold(t + ms(18)).is_some());
        assert!(
            c.hold(t + ms(18) + ms(10)).is_some(),
            "a gap between clumps of one burst"
        );
        assert_eq!(c.hold(t + ms(18) + MIN_IDLE), None, "a pause");
    }

    #[test]
    fn no_hold_is_longer_than_the_cap() {
        let t = Instant::now();
        let mut c = Coalescer {
            streak: 30,
            ..Default::default()
        };
        c.requested(t);
        c.requested(t + ms(1));
        let left = c.hold(t + ms(1)).expect("held");
        assert!(left <= MAX_HOLD);
    }
}
