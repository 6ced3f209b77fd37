//! A decision's validation period, as upstream's disruption loop runs it. Emptiness and
//! consolidation decisions wait `period` before they are carried out; meanwhile nothing else is
//! decided, so a cluster that keeps moving cannot restart the clock. When the period is over the
//! decision is validated on the cluster as it is then: one whose candidates are still valid is
//! carried out with the clock it started with; only one that is no longer valid is replaced, by
//! what that pass decides instead, whose own clock starts then. Drift is carried out at once.

use std::time::{Duration, Instant};

use super::{Command, Method};

/// A decision waiting for its validation.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub(crate) command: Command,
    pub(crate) since: Instant,
}

/// What a pass does about the pending decision.
#[derive(Debug, PartialEq)]
pub(crate) enum Stage {
    /// Nothing pending: decide.
    Decide,
    /// A decision waits this much longer: decide nothing.
    Wait(Duration),
    /// Its period is over: validate it (and decide again only if it no longer holds).
    Validate(Command),
}

pub(crate) fn stage(pending: Option<&Pending>, now: Instant, period: Duration) -> Stage {
    match pending {
        None => Stage::Decide,
        Some(p) => match period.checked_sub(now.saturating_duration_since(p.since)) {
            Some(left) if !left.is_zero() => Stage::Wait(left),
            _ => Stage::Validate(p.command.clone()),
        },
    }
}

/// What follows from a pass's decision.
#[derive(Debug, PartialEq)]
pub(crate) enum Next {
    Execute(Command),
    /// A decision waits for its validation, `left` from now; `new` when its clock just started.
    Validating {
        left: Duration,
        new: bool,
    },
    Idle,
}

/// Fold a pass's decision (`validated` when it is the pending one that passed its validation)
/// into the pending one.
pub(crate) fn settle(
    pending: &mut Option<Pending>,
    decided: Option<(Command, bool)>,
    now: Instant,
    period: Duration,
) -> Next {
    // A decision still in its period keeps its clock, whatever a pass decided meanwhile.
    if let Stage::Wait(left) = stage(pending.as_ref(), now, period) {
        return Next::Validating { left, new: false };
    }
    let Some((command, validated)) = decided else {
        *pending = None;
        return Next::Idle;
    };
    // Drift and repair are carried out at once, as upstream does: their replacements launch
    // first, so nothing goes before the cluster has room for it.
    if validated || matches!(command.method, Method::Drift | Method::Repair) {
        if validated {
            *pending = None;
        }
        return Next::Execute(command);
    }
    *pending = Some(Pending {
        command,
        since: now,
    });
    Next::Validating {
        left: period,
        new: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::nodepool::ConsolidationPolicy;
    use crate::disruption::Candidate;

    const PERIOD: Duration = Duration::from_secs(15);

    fn command(method: Method, claims: &[&str]) -> Command {
        let candidates = claims
            .iter()
            .map(|c| Candidate {
                claim: c.to_string(),
                node: format!("node-{c}"),
                nodepool: "default".into(),
                price: 1.0,
                capacity_type: "on-demand".into(),
                pods: vec![format!("default/{c}-pod").into()],
                disruption_cost: 1.0,
                reschedule_cost: 2.0,
                instance_type: "m".into(),
                machine_deployment: "ns/m".into(),
                drift: None,
                drifted_since: None,
                pool_cost: 1.0,
                pool_disruption: 1.0,
                consolidatable: true,
                policy: ConsolidationPolicy::WhenEmptyOrUnderutilized,
                static_pool: false,
                repair: None,
                hold: None,
            })
            .collect();
        Command {
            method,
            candidates,
            replacements: Vec::new(),
        }
    }

    fn pending_at(t0: Instant, claims: &[&str]) -> Option<Pending> {
        Some(Pending {
            command: command(Method::SingleNodeConsolidation, claims),
            since: t0,
        })
    }

    #[test]
    fn a_pending_command_keeps_its_clock_while_it_waits() {
        let t0 = Instant::now();
        let mut pending = pending_at(t0, &["a"]);
        let late = t0 + Duration::from_millis(14_900);
        assert_eq!(
            stage(pending.as_ref(), late, PERIOD),
            Stage::Wait(Duration::from_millis(100)),
            "nothing is decided while it waits"
        );
        // Even a pass that decided something else meanwhile leaves it and its clock alone.
        for other in [
            Some((command(Method::SingleNodeConsolidation, &["b"]), false)),
            Some((command(Method::Emptiness, &["a"]), false)),
            None,
        ] {
            let next = settle(&mut pending, other, late, PERIOD);
            assert_eq!(
                next,
                Next::Validating {
                    left: Duration::from_millis(100),
                    new: false
                }
            );
            let kept = pending.as_ref().expect("still pending");
            assert_eq!(kept.since, t0);
            assert_eq!(kept.command.claim_names(), vec!["a".to_string()]);
        }
    }

    #[test]
    fn a_command_still_valid_when_due_is_carried_out() {
        let t0 = Instant::now();
        let mut pending = pending_at(t0, &["a"]);
        let due = t0 + PERIOD;
        let Stage::Validate(cmd) = stage(pending.as_ref(), due, PERIOD) else {
            panic!("due for validation");
        };
        assert_eq!(
            settle(&mut pending, Some((cmd.clone(), true)), due, PERIOD),
            Next::Execute(cmd)
        );
        assert!(pending.is_none());
    }

    #[test]
    fn only_a_command_no_longer_valid_is_replaced_and_its_successor_starts_a_clock() {
        let t0 = Instant::now();
        let mut pending = pending_at(t0, &["a"]);
        let due = t0 + PERIOD + Duration::from_millis(5);
        // The same candidates, decided again differently: the old plan no longer holds.
        let again = command(Method::MultiNodeConsolidation, &["a"]);
        assert_eq!(
            settle(&mut pending, Some((again, false)), due, PERIOD),
            Next::Validating {
                left: PERIOD,
                new: true
            }
        );
        let replaced = pending.as_ref().expect("pending");
        assert_eq!(replaced.since, due);
        assert_eq!(replaced.command.method, Method::MultiNodeConsolidation);
        // Nothing decided once it no longer holds: nothing pending.
        let later = due + PERIOD;
        assert_eq!(settle(&mut pending, None, later, PERIOD), Next::Idle);
        assert!(pending.is_none());
        assert_eq!(stage(None, later, PERIOD), Stage::Decide);
    }

    #[test]
    fn drift_is_carried_out_at_once() {
        let mut pending = None;
        let drift = command(Method::Drift, &["a"]);
        assert_eq!(
            settle(
                &mut pending,
                Some((drift.clone(), false)),
                Instant::now(),
                PERIOD
            ),
            Next::Execute(drift)
        );
        assert!(pending.is_none());
    }
}
