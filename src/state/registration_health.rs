//! Whether a NodePool's recent launches registered, for its `NodeRegistrationHealthy`
//! condition: the last four outcomes per pool (a claim registered, or timed out launching or
//! registering); half of them failed makes the pool unhealthy. The condition moves only on an
//! outcome (a failure can only make it False, a success only True) and goes back to Unknown,
//! forgetting the outcomes, when the NodePool's spec changes, so a fixed configuration starts
//! afresh.

use std::collections::{HashMap, VecDeque};

/// Outcomes remembered per pool.
const WINDOW: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Health {
    Unknown,
    Healthy,
    Unhealthy,
}

/// What the condition should say after the last outcome that moved it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) healthy: bool,
    pub(crate) reason: String,
    pub(crate) message: String,
}

#[derive(Default)]
struct Pool {
    outcomes: VecDeque<bool>,
    verdict: Option<Verdict>,
    /// The NodePool generation these outcomes were recorded under; None until the pool was
    /// first reconciled (outcomes recorded before then are kept).
    generation: Option<Option<i64>>,
}

fn health(outcomes: &VecDeque<bool>) -> Health {
    if outcomes.is_empty() {
        return Health::Unknown;
    }
    let failed = outcomes.iter().filter(|ok| !**ok).count();
    // Failures over the full window, so two failures are enough even before it fills.
    if failed * 2 >= WINDOW {
        Health::Unhealthy
    } else {
        Health::Healthy
    }
}

fn push(outcomes: &mut VecDeque<bool>, ok: bool) {
    if outcomes.len() == WINDOW {
        outcomes.pop_front();
    }
    outcomes.push_back(ok);
}

#[derive(Default)]
pub(crate) struct RegistrationHealth {
    pools: HashMap<String, Pool>,
}

impl RegistrationHealth {
    /// A claim of `pool` registered (`Ok`) or timed out (`Err((reason, message))`).
    pub(crate) fn record(&mut self, pool: &str, outcome: Result<(), (String, String)>) {
        let p = self.pools.entry(pool.to_string()).or_default();
        let ok = outcome.is_ok();
        let mut after = p.outcomes.clone();
        push(&mut after, ok);
        match (outcome, health(&after)) {
            (Ok(()), Health::Healthy) => {
                p.verdict = Some(Verdict {
                    healthy: true,
                    reason: String::new(),
                    message: String::new(),
                })
            }
            // The first failure that tipped the pool explains it; later ones do not rewrite
            // the message.
            (Err((reason, message)), Health::Unhealthy)
                if p.verdict.as_ref().is_none_or(|v| v.healthy) =>
            {
                p.verdict = Some(Verdict {
                    healthy: false,
                    reason,
                    message,
                });
            }
            _ => {}
        }
        p.outcomes = after;
    }

    #[cfg(test)]
    pub(crate) fn health(&self, pool: &str) -> Health {
        self.pools
            .get(pool)
            .map_or(Health::Unknown, |p| health(&p.outcomes))
    }

    /// Reconcile with the NodePool: `condition` is its current `NodeRegistrationHealthy`
    /// status and observed generation, `generation` the pool's. Returns the condition to write:
    /// `None` to leave it, `Some(None)` for Unknown (a changed spec starts afresh), or the
    /// verdict.
    pub(crate) fn desired(
        &mut self,
        pool: &str,
        generation: Option<i64>,
        condition: Option<(Option<bool>, Option<i64>)>,
    ) -> Option<Option<Verdict>> {
        let p = self.pools.entry(pool.to_string()).or_default();
        let stale = match condition {
            None => true,
            Some((_, observed)) => observed != generation,
        };
        if p.generation.is_some_and(|g| g != generation) {
            *p = Pool {
                generation: Some(generation),
                ..Pool::default()
            };
            return Some(None);
        }
        p.generation = Some(generation);
        if stale {
            // A new pool, or a change made while this controller was not running: what
            // happened since it started is the verdict.
            return Some(p.verdict.clone());
        }
        if p.outcomes.is_empty()
            && p.verdict.is_none()
            && let Some((Some(healthy), _)) = condition
        {
            // A restarted controller picks up where the condition says the pool was.
            let n = if healthy { 1 } else { WINDOW / 2 };
            p.outcomes = std::iter::repeat_n(healthy, n).collect();
        }
        p.verdict.clone().map(Some)
    }

    /// Keep only the pools that still exist.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.pools.retain(|pool, _| keep(pool));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail() -> Result<(), (String, String)> {
        Err(("RegistrationFailed".into(), "no Node".into()))
    }

    #[test]
    fn half_of_the_last_four_failing_makes_the_pool_unhealthy() {
        let mut h = RegistrationHealth::default();
        assert_eq!(h.health("p"), Health::Unknown);
        h.record("p", Ok(()));
        h.record("p", fail());
        assert_eq!(h.health("p"), Health::Healthy);
        h.record("p", fail());
        assert_eq!(h.health("p"), Health::Unhealthy);
        let v = h.desired("p", Some(1), Some((Some(true), Some(1))));
        assert_eq!(
            v.flatten().map(|v| (v.healthy, v.reason)),
            Some((false, "RegistrationFailed".to_string()))
        );
        // Two successes push two failures out of the window.
        h.record("p", Ok(()));
        assert_eq!(h.health("p"), Health::Unhealthy);
        h.record("p", Ok(()));
        h.record("p", Ok(()));
        assert_eq!(h.health("p"), Health::Healthy);
        let v = h.desired("p", Some(1), Some((Some(false), Some(1))));
        assert_eq!(v.flatten().map(|v| v.healthy), Some(true));
    }

    #[test]
    fn a_failure_never_makes_it_true_nor_a_success_false() {
        let mut h = RegistrationHealth::default();
        h.record("p", fail());
        assert_eq!(h.desired("p", Some(1), Some((None, Some(1)))), None);
        h.record("p", Ok(()));
        h.record("p", fail());
        h.record("p", Ok(()));
        assert_eq!(h.health("p"), Health::Unhealthy);
        assert_eq!(
            h.desired("p", Some(1), Some((None, Some(1))))
                .flatten()
                .map(|v| v.healthy),
            Some(false)
        );
    }

    #[test]
    fn a_changed_spec_goes_back_to_unknown_and_forgets() {
        let mut h = RegistrationHealth::default();
        // Outcomes recorded before the pool is first reconciled count.
        h.record("p", Ok(()));
        assert_eq!(
            h.desired("p", Some(1), None).flatten().map(|v| v.healthy),
            Some(true)
        );
        h.record("p", fail());
        h.record("p", fail());
        assert_eq!(h.health("p"), Health::Unhealthy);
        assert_eq!(
            h.desired("p", Some(2), Some((Some(false), Some(1)))),
            Some(None)
        );
        assert_eq!(h.health("p"), Health::Unknown);
        // Written Unknown at generation 2: nothing more until an outcome.
        assert_eq!(h.desired("p", Some(2), Some((None, Some(2)))), None);
    }

    #[test]
    fn a_restart_starts_from_the_condition() {
        let mut h = RegistrationHealth::default();
        assert_eq!(h.desired("p", Some(1), Some((Some(false), Some(1)))), None);
        assert_eq!(h.health("p"), Health::Unhealthy);
        // One success is not enough to clear two remembered failures.
        h.record("p", Ok(()));
        assert_eq!(h.health("p"), Health::Unhealthy);
    }
}
