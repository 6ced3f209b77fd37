//! How often the NodePools actor writes a status: a change a reader acts on (a condition's
//! status or reason) at once, the counts alone at most every `COUNTS_EVERY` per object.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::api::conditions::{self, ConditionStatus};

/// The counts alone (`nodes`, `resources`, the rollout counts and the condition messages that
/// quote them) move with every claim of a burst, and on a slow API server a burst lasts
/// minutes: written at most this often per object, they cost a few writes a pool, not two a
/// second (nothing in the controller reads them back; its metrics are published every
/// refresh). A condition whose status or reason changes is written at once.
const COUNTS_EVERY: Duration = Duration::from_secs(5);

/// When each status (by kind and name) was last written.
#[derive(Default)]
pub(super) struct Paced(HashMap<String, Instant>);

impl Paced {
    /// Forgets the objects `keep` says are gone.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.0.retain(|key, _| keep(key));
    }

    /// A write of `key` at `now`: Ok (and remembered) when `urgent` or `COUNTS_EVERY` has
    /// passed since its last one; else Err with how long is left.
    pub(super) fn write(
        &mut self,
        key: String,
        urgent: bool,
        now: Instant,
    ) -> Result<(), Duration> {
        let since = self
            .0
            .get(&key)
            .map(|at| now.saturating_duration_since(*at));
        match since {
            Some(since) if !urgent && since < COUNTS_EVERY => Err(COUNTS_EVERY - since),
            _ => {
                self.0.insert(key, now);
                Ok(())
            }
        }
    }
}

/// What a condition list says, without the messages and times that follow the counts.
pub(super) fn verdicts(
    conds: Option<&[conditions::Condition]>,
) -> Vec<(&str, &ConditionStatus, &str)> {
    conds
        .unwrap_or_default()
        .iter()
        .map(|c| (c.type_.as_str(), &c.status, c.reason.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;

    use super::*;

    /// Counts alone are written at most every `COUNTS_EVERY` per object; an urgent change
    /// (a condition's status or reason, a new generation) and the first write go at once.
    #[test]
    fn counts_alone_are_paced_per_object() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut paced = Paced::default();
        assert_eq!(paced.write("NodePool/a".into(), false, at(0)), Ok(()));
        assert_eq!(
            paced.write("NodePool/a".into(), false, at(1_000)),
            Err(COUNTS_EVERY - Duration::from_millis(1_000))
        );
        assert_eq!(paced.write("NodePool/b".into(), false, at(1_000)), Ok(()));
        assert_eq!(paced.write("NodePool/a".into(), true, at(2_000)), Ok(()));
        assert!(paced.write("NodePool/a".into(), false, at(6_999)).is_err());
        assert_eq!(paced.write("NodePool/a".into(), false, at(7_000)), Ok(()));
    }

    /// A condition's message and times follow the counts; its status and reason do not.
    #[test]
    fn only_a_conditions_status_or_reason_makes_a_write_urgent() {
        let t = Timestamp::now();
        let mut conds = Vec::new();
        conditions::set(
            &mut conds,
            "NodesUpToDate",
            ConditionStatus::False,
            "RollingOut",
            "1 of 3",
            Some(1),
            t,
        );
        let mut counted = conds.clone();
        conditions::set(
            &mut counted,
            "NodesUpToDate",
            ConditionStatus::False,
            "RollingOut",
            "2 of 3",
            Some(1),
            t,
        );
        assert_eq!(verdicts(Some(&conds)), verdicts(Some(&counted)));
        let mut waiting = conds.clone();
        conditions::set(
            &mut waiting,
            "NodesUpToDate",
            ConditionStatus::False,
            "WaitingForReady",
            "3 of 3",
            Some(1),
            t,
        );
        assert_ne!(verdicts(Some(&conds)), verdicts(Some(&waiting)));
        assert_ne!(verdicts(None), verdicts(Some(&conds)));
    }
}
