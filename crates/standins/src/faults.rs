//! Fault injection, settable while the server runs: errors, throttling with `Retry-After`,
//! latency, conflicts from a phantom concurrent writer, writes that land but are answered with
//! an error, watches resumed into an expired history (410), and watch connections cut on a
//! period. Random choices come from one seeded
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
    /// Added before a POST/PUT/PATCH is applied: a write that hangs and has not landed (an
    /// etcd stall). Reads and watches are not delayed.
    pub write_latency: Duration,
    /// Added after a POST/PUT/PATCH was applied, before it is answered: a write that landed
    /// but whose answer is late or lost (the client's timeout makes its outcome unknown).
    pub write_response_delay: Duration,
    /// Live watch events reach the watcher this long after they were committed: an informer
    /// cache that lags behind the API server (a busy controller-manager), so one client acts
    /// on a view of these objects that misses the latest writes.
    pub watch_delay: Duration,
    /// Fraction of requests answered 429 with `Retry-After` (API Priority and Fairness
    /// shedding load) before the store is touched.
    pub throttle_rate: f64,
    /// The wait a throttled answer asks for, in whole seconds (at least 1, as kube-apiserver's).
    pub retry_after: Duration,
    /// Fraction of writes (create, update, patch, delete) that are applied and then answered
    /// 500 or 504 anyway: the write landed, the client cannot tell.
    pub ambiguous_rate: f64,
    /// Fraction of watches resumed from a resourceVersion that are told it expired (410 in the
    /// stream, as after a compaction), so the client must list again.
    pub watch_expire_rate: f64,
}

/// What the server does to one request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Decision {
    pub latency: Duration,
    /// Held back after a write was applied.
    pub response_delay: Duration,
    /// Some(500 or 503).
    pub error: Option<u16>,
    /// Some(seconds): answered 429 with `Retry-After`.
    pub throttle: Option<u64>,
    /// Some(500 or 504): the write is applied, then answered with this error.
    pub ambiguous: Option<u16>,
    /// A watch resumed from a resourceVersion is told it expired.
    pub expire_watch: bool,
    pub conflict: bool,
}

/// A failure forced on the next requests of one verb on one resource (tests aim it at one
/// write).
#[derive(Debug, Clone)]
struct Forced {
    resource: String,
    verb: String,
    code: u16,
    left: u32,
}

#[derive(Debug)]
struct Inner {
    rng: StdRng,
    rules: BTreeMap<String, FaultRule>,
    watch_cut_every: Option<Duration>,
    /// When set, only requests whose User-Agent starts with it meet faults (a slow path between
    /// one client and the server; the stand-ins keep working).
    agent: Option<String>,
    /// Resources whose faults hit every client even while `agent` is set.
    every_client: std::collections::BTreeSet<String>,
    forced: Vec<Forced>,
}

/// The server's fault switches.
#[derive(Debug)]
pub struct Faults {
    inner: Mutex<Inner>,
    cuts: watch::Sender<u64>,
    /// Some rule delays watch events: every live event of every watch asks `watch_delay`, so
    /// without one that question must not take the lock.
    delays_watches: std::sync::atomic::AtomicBool,
}

impl Faults {
    pub(crate) fn new(seed: u64) -> Self {
        let (cuts, _) = watch::channel(0);
        Self {
            inner: Mutex::new(Inner {
                rng: StdRng::seed_from_u64(seed),
                rules: BTreeMap::new(),
                watch_cut_every: None,
                agent: None,
                every_client: Default::default(),
                forced: Vec::new(),
            }),
            cuts,
            delays_watches: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn update(&self, resource: &str, f: impl FnOnce(&mut FaultRule)) {
        let mut inner = self.inner.lock();
        f(inner.rules.entry(resource.to_string()).or_default());
        self.note_watch_delays(&inner);
    }

    fn note_watch_delays(&self, inner: &Inner) {
        let any = inner.rules.values().any(|r| !r.watch_delay.is_zero());
        self.delays_watches
            .store(any, std::sync::atomic::Ordering::Relaxed);
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

    /// Writes to `resource` wait `latency` before they are applied (they hang, and have not
    /// landed while they do).
    pub fn set_write_latency(&self, resource: &str, latency: Duration) {
        self.update(resource, |r| r.write_latency = latency);
    }

    /// Writes to `resource` are applied, then answered only after `delay` (a lost answer).
    pub fn set_write_response_delay(&self, resource: &str, delay: Duration) {
        self.update(resource, |r| r.write_response_delay = delay);
    }

    /// Watches of `resource` deliver each live event `delay` after it was committed (in order;
    /// the initial list is not delayed).
    pub fn set_watch_delay(&self, resource: &str, delay: Duration) {
        self.update(resource, |r| r.watch_delay = delay);
    }

    /// A fraction of requests to `resource` is answered 429 with `Retry-After: after`.
    pub fn set_throttle(&self, resource: &str, rate: f64, after: Duration) {
        self.update(resource, |r| {
            r.throttle_rate = rate.clamp(0.0, 1.0);
            r.retry_after = after;
        });
    }

    /// A fraction of writes to `resource` lands and is answered with an error anyway.
    pub fn set_ambiguous_rate(&self, resource: &str, rate: f64) {
        self.update(resource, |r| r.ambiguous_rate = rate.clamp(0.0, 1.0));
    }

    /// A fraction of watches of `resource` resumed from a resourceVersion get 410.
    pub fn set_watch_expire_rate(&self, resource: &str, rate: f64) {
        self.update(resource, |r| r.watch_expire_rate = rate.clamp(0.0, 1.0));
    }

    /// The next `times` `verb` requests on `resource` (from the clients faults apply to) are
    /// answered `code` before the store is touched.
    pub fn fail_next(&self, resource: &str, verb: &str, code: u16, times: u32) {
        self.inner.lock().forced.push(Forced {
            resource: resource.to_string(),
            verb: verb.to_string(),
            code,
            left: times,
        });
    }

    /// Forced failures not spent yet.
    pub fn forced_left(&self) -> u32 {
        self.inner.lock().forced.iter().map(|f| f.left).sum()
    }

    pub fn set_rule(&self, resource: &str, rule: FaultRule) {
        self.update(resource, |r| *r = rule);
    }

    /// Only requests whose User-Agent starts with `agent` meet faults (None: every request).
    pub fn set_agent(&self, agent: Option<&str>) {
        self.inner.lock().agent = agent.map(str::to_string);
    }

    /// Faults on `resource` hit every client even while `set_agent` scopes the others (e.g. to
    /// slow down a stand-in while the controller's own requests misbehave differently).
    pub fn set_every_client(&self, resource: &str) {
        self.inner.lock().every_client.insert(resource.to_string());
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
        inner.agent = None;
        inner.every_client.clear();
        inner.forced.clear();
        self.note_watch_delays(&inner);
    }

    pub(crate) fn watch_cut_every(&self) -> Option<Duration> {
        self.inner.lock().watch_cut_every
    }

    pub(crate) fn subscribe_cuts(&self) -> watch::Receiver<u64> {
        self.cuts.subscribe()
    }

    /// How long a watch of `resource` opened by `agent` holds each live event back, read per
    /// event so a lag switched on (or off) reaches watches that are already open.
    pub(crate) fn watch_delay(&self, resource: &str, agent: &str) -> Duration {
        if !self
            .delays_watches
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Duration::ZERO;
        }
        let inner = self.inner.lock();
        if inner
            .agent
            .as_deref()
            .is_some_and(|a| !agent.starts_with(a))
            && !inner.every_client.contains(resource)
        {
            return Duration::ZERO;
        }
        inner
            .rules
            .get(resource)
            .or_else(|| inner.rules.get("*"))
            .map_or(Duration::ZERO, |r| r.watch_delay)
    }

    /// Rolls the dice for one request; `write` is true for PUT and PATCH.
    #[cfg(test)]
    pub(crate) fn decide(&self, resource: &str, write: bool) -> Decision {
        self.decide_for(resource, if write { "patch" } else { "get" }, "")
    }

    /// What happens to one `verb` request on `resource` from `agent` (its User-Agent).
    pub(crate) fn decide_for(&self, resource: &str, verb: &str, agent: &str) -> Decision {
        let write = matches!(verb, "update" | "patch");
        let mutating = write || verb == "create";
        let mut inner = self.inner.lock();
        if inner
            .agent
            .as_deref()
            .is_some_and(|a| !agent.starts_with(a))
            && !inner.every_client.contains(resource)
        {
            return Decision::default();
        }
        if let Some(f) = inner
            .forced
            .iter_mut()
            .find(|f| f.left > 0 && f.resource == resource && f.verb == verb)
        {
            f.left -= 1;
            let code = f.code;
            inner.forced.retain(|f| f.left > 0);
            return Decision {
                error: Some(code),
                ..Decision::default()
            };
        }
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
        if mutating {
            d.latency += rule.write_latency;
            d.response_delay = rule.write_response_delay;
        }
        let rng = &mut inner.rng;
        if rule.throttle_rate > 0.0 && rng.random_bool(rule.throttle_rate) {
            d.throttle = Some(rule.retry_after.as_secs().max(1));
        } else if rule.error_rate > 0.0 && rng.random_bool(rule.error_rate) {
            d.error = Some(if rng.random_bool(0.5) { 500 } else { 503 });
        } else if write && rule.conflict_rate > 0.0 && rng.random_bool(rule.conflict_rate) {
            d.conflict = true;
        } else if (mutating || verb == "delete")
            && rule.ambiguous_rate > 0.0
            && rng.random_bool(rule.ambiguous_rate)
        {
            d.ambiguous = Some(if rng.random_bool(0.5) { 500 } else { 504 });
        } else if verb == "watch"
            && rule.watch_expire_rate > 0.0
            && rng.random_bool(rule.watch_expire_rate)
        {
            d.expire_watch = true;
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
    fn a_watch_delay_applies_to_watches_only() {
        let f = Faults::new(1);
        f.set_watch_delay("machines", Duration::from_millis(300));
        assert_eq!(f.watch_delay("machines", "ctl"), Duration::from_millis(300));
        assert_eq!(f.decide_for("machines", "get", "ctl"), Decision::default());
        f.set_agent(Some("other"));
        assert_eq!(f.watch_delay("machines", "ctl"), Duration::ZERO);
        f.set_every_client("machines");
        assert_eq!(f.watch_delay("machines", "ctl"), Duration::from_millis(300));
    }

    #[test]
    fn throttles_ambiguous_writes_expired_watches_and_forced_failures() {
        let f = Faults::new(5);
        f.set_throttle("nodes", 1.0, Duration::from_millis(300));
        assert_eq!(
            f.decide("nodes", false).throttle,
            Some(1),
            "at least a second"
        );
        f.set_throttle("nodes", 0.0, Duration::ZERO);
        f.set_ambiguous_rate("nodes", 1.0);
        assert!(matches!(f.decide("nodes", true).ambiguous, Some(500 | 504)));
        assert!(f.decide_for("nodes", "delete", "").ambiguous.is_some());
        assert_eq!(
            f.decide("nodes", false).ambiguous,
            None,
            "reads are not writes"
        );
        f.set_watch_expire_rate("pods", 1.0);
        assert!(f.decide_for("pods", "watch", "").expire_watch);
        f.fail_next("nodes", "patch", 500, 1);
        assert_eq!(f.decide_for("nodes", "get", "").error, None);
        assert_eq!(f.decide_for("nodes", "patch", "").error, Some(500));
        assert_eq!(f.forced_left(), 0);
        assert_eq!(f.decide_for("nodes", "patch", "").error, None);
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

    #[test]
    fn write_latency_and_response_delay_touch_writes_only() {
        let f = Faults::new(1);
        f.set_write_latency("nodeclaims", Duration::from_secs(5));
        f.set_write_response_delay("machines", Duration::from_secs(7));
        assert_eq!(f.decide("nodeclaims", false), Decision::default());
        assert_eq!(f.decide("nodeclaims", true).latency, Duration::from_secs(5));
        assert_eq!(f.decide("machines", false), Decision::default());
        let w = f.decide("machines", true);
        assert_eq!(w.latency, Duration::ZERO);
        assert_eq!(w.response_delay, Duration::from_secs(7));
        f.set_agent(Some("karpenter-capi/"));
        assert_eq!(
            f.decide_for("machines", "patch", "sim-capi"),
            Decision::default()
        );
        assert_eq!(
            f.decide_for("machines", "create", "karpenter-capi/0.1.0")
                .response_delay,
            Duration::from_secs(7)
        );
        assert_eq!(
            f.decide_for("machines", "watch", "karpenter-capi/0.1.0"),
            Decision::default()
        );
        f.set_write_latency("machinesets", Duration::from_secs(2));
        assert_eq!(
            f.decide_for("machinesets", "patch", "sim-capi").latency,
            Duration::ZERO
        );
        f.set_every_client("machinesets");
        assert_eq!(
            f.decide_for("machinesets", "patch", "sim-capi").latency,
            Duration::from_secs(2)
        );
    }
}
