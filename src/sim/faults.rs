//! Fault injection, settable while the server runs: errors, latency, conflicts from a phantom
//! concurrent writer, and watch connections cut on a period. Random choices come from one seeded
//! generator, so a run with the same seed and the same request order makes the same choices.

use std::collections::BTreeMap;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

/// Faults for one resource plural (or "*" for every resource without its own rule).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaultRule {
    /// Fraction of requests answered 500 or 503 before the store is touched.
    pub error_rate: f64,
    /// Added to every request's handling time.
    pub latency: Duration,
    /// Fraction of PUT/PATCH answered 409 Conflict (the object's resourceVersion is bumped too).
    pub conflict_rate: f64,
}

/// What the server does to one request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Decision {
    pub latency: Duration,
    /// Some(500 or 503).
    pub error: Option<u16>,
    pub conflict: bool,
}

#[derive(Debug)]
struct Inner {
    rng: StdRng,
    rules: BTreeMap<String, FaultRule>,
    watch_cut_every: Option<Duration>,
}

/// The server's fault switches.
#[derive(Debug)]
pub struct Faults {
    inner: Mutex<Inner>,
    cuts: watch::Sender<u64>,
}

impl Faults {
    pub(crate) fn new(seed: u64) -> Self {
        let (cuts, _) = watch::channel(0);
        Self {
            inner: Mutex::new(Inner {
                rng: StdRng::seed_from_u64(seed),
                rules: BTreeMap::new(),
                watch_cut_every: None,
            }),
            cuts,
        }
    }

    fn update(&self, resource: &str, f: impl FnOnce(&mut FaultRule)) {
        let mut inner = self.inner.lock();
        f(inner.rules.entry(resource.to_string()).or_default());
    }

    pub fn set_error_rate(&self, resource: &str, rate: f64) {
        self.update(resource, |r| r.error_rate = rate.clamp(0.0, 1.0));
    }

    pub fn set_latency(&self, resource: &str, latency: Duration) {
        self.update(resource, |r| r.latency = latency);
    }

    pub fn set_conflict_rate(&self, resource: &str, rate: f64) {
        self.update(resource, |r| r.conflict_rate = rate.clamp(0.0, 1.0));
    }

    pub fn set_rule(&self, resource: &str, rule: FaultRule) {
        self.update(resource, |r| *r = rule);
    }

    /// Close every open watch connection every `every` (None stops it).
    pub fn set_watch_cut_every(&self, every: Option<Duration>) {
        self.inner.lock().watch_cut_every = every;
    }

    /// Close every open watch connection now.
    pub fn cut_watches(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Remove every fault.
    pub fn clear(&self) {
        let mut inner = self.inner.lock();
        inner.rules.clear();
        inner.watch_cut_every = None;
    }

    pub(crate) fn watch_cut_every(&self) -> Option<Duration> {
        self.inner.lock().watch_cut_every
    }

    pub(crate) fn subscribe_cuts(&self) -> watch::Receiver<u64> {
        self.cuts.subscribe()
    }

    /// Rolls the dice for one request; `write` is true for PUT and PATCH.
    pub(crate) fn decide(&self, resource: &str, write: bool) -> Decision {
        let mut inner = self.inner.lock();
        let Some(rule) = inner
            .rules
            .get(resource)
            .or_else(|| inner.rules.get("*"))
            .copied()
        else {
            return Decision::default();
        };
        let mut d = Decision {
            latency: rule.latency,
            ..Decision::default()
        };
        if rule.error_rate > 0.0 && inner.rng.random_bool(rule.error_rate) {
            d.error = Some(if inner.rng.random_bool(0.5) { 500 } else { 503 });
        } else if write && rule.conflict_rate > 0.0 && inner.rng.random_bool(rule.conflict_rate) {
            d.conflict = true;
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specific_rule_beats_wildcard_and_rates_are_honoured() {
        let f = Faults::new(7);
        f.set_error_rate("*", 1.0);
        f.set_latency("pods", Duration::from_millis(5));
        let pods = f.decide("pods", false);
        assert_eq!(pods.error, None);
        assert_eq!(pods.latency, Duration::from_millis(5));
        assert!(matches!(f.decide("nodes", false).error, Some(500 | 503)));
        f.set_conflict_rate("nodes", 1.0);
        f.set_error_rate("nodes", 0.0);
        assert!(f.decide("nodes", true).conflict);
        assert!(!f.decide("nodes", false).conflict);
        f.clear();
        assert_eq!(f.decide("nodes", true), Decision::default());
    }

    #[test]
    fn same_seed_same_choices() {
        let (a, b) = (Faults::new(3), Faults::new(3));
        a.set_error_rate("*", 0.5);
        b.set_error_rate("*", 0.5);
        let ra: Vec<_> = (0..50).map(|_| a.decide("x", false).error).collect();
        let rb: Vec<_> = (0..50).map(|_| b.decide("x", false).error).collect();
        assert_eq!(ra, rb);
    }
}
