//! Disruption budgets (Karpenter core v1): per NodePool and reason, the most restrictive active
//! budget says how many of the pool's nodes may be disrupting at once. A percentage is of the
//! pool's nodes, rounded up; a budget with a `schedule` is active only for `duration` after each
//! cron hit (UTC); a budget without `reasons` applies to every reason. Nodes already being
//! disrupted count against the budget.

use std::time::Duration;

use crate::api::cron;
use crate::api::nodepool::{Budget, DisruptionReason, NodePool};

/// A budget that cannot be read: a schedule that does not parse, or a `nodes` value that is
/// neither a count nor a percentage. Validation refuses both, but one that slips through (an
/// object written before validation, a cron the CRD's pattern lets by) must not open the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed;

/// How many nodes a budget allows for a pool of `nodes`, or None when it is not active now.
pub(crate) fn budget_value(
    budget: &Budget,
    nodes: usize,
    now_unix: i64,
) -> Result<Option<usize>, Malformed> {
    if budget.schedule.is_some() || budget.duration.is_some() {
        let schedule = budget.schedule.as_deref().unwrap_or_default();
        let duration = budget.duration.map(|d| d.0).unwrap_or(Duration::ZERO);
        let parsed = cron::parse(schedule).map_err(|_| Malformed)?;
        if !parsed.is_active(now_unix, duration) {
            return Ok(None);
        }
    }
    nodes_value(&budget.nodes, nodes).map(Some)
}

/// `"5"` is five nodes; `"10%"` is a tenth of `nodes`, rounded up.
pub(crate) fn nodes_value(value: &str, nodes: usize) -> Result<usize, Malformed> {
    let value = value.trim();
    match value.strip_suffix('%') {
        Some(pct) => match pct.parse::<u64>() {
            Ok(p) if p <= 100 => Ok((p as usize * nodes).div_ceil(100)),
            _ => Err(Malformed),
        },
        None => value.parse::<usize>().map_err(|_| Malformed),
    }
}

/// The most restrictive active budget for `reason` (None: no budget applies, unlimited). As
/// upstream, one malformed budget of the pool, whatever its reasons, fails the pool closed: no
/// disruption for any reason until it is fixed.
pub(crate) fn limit(
    np: &NodePool,
    reason: DisruptionReason,
    nodes: usize,
    now_unix: i64,
) -> Option<usize> {
    let mut min: Option<usize> = None;
    for b in np.disruption().budgets().iter() {
        match budget_value(b, nodes, now_unix) {
            Err(Malformed) => return Some(0),
            Ok(Some(v)) if b.reasons.as_ref().is_none_or(|rs| rs.contains(&reason)) => {
                min = Some(min.map_or(v, |m| m.min(v)));
            }
            Ok(_) => {}
        }
    }
    min
}

/// How many more of the pool's nodes may start being disrupted for `reason` now.
pub(crate) fn allowed(
    np: &NodePool,
    reason: DisruptionReason,
    nodes: usize,
    disrupting: usize,
    now_unix: i64,
) -> usize {
    match limit(np, reason, nodes, now_unix) {
        Some(max) => max.saturating_sub(disrupting),
        None => nodes.saturating_sub(disrupting),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pool(budgets: serde_json::Value) -> NodePool {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "p"},
            "spec": {
                "template": {"spec": {"requirements": [],
                    "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}}},
                "disruption": {"budgets": budgets},
            }
        }))
        .expect("a NodePool")
    }

    // 2026-01-05 is a Monday; 10:30 UTC.
    const MONDAY_1030: i64 = 1_767_609_000;

    #[test]
    fn percentages_round_up_and_counts_are_counts() {
        assert_eq!(nodes_value("10%", 5), Ok(1));
        assert_eq!(nodes_value("10%", 0), Ok(0));
        assert_eq!(nodes_value("10%", 11), Ok(2));
        assert_eq!(nodes_value("100%", 7), Ok(7));
        assert_eq!(nodes_value("0%", 7), Ok(0));
        assert_eq!(nodes_value("3", 100), Ok(3));
        assert_eq!(nodes_value("nonsense", 10), Err(Malformed));
        assert_eq!(nodes_value("150%", 10), Err(Malformed));
    }

    #[test]
    fn the_default_budget_is_ten_percent() {
        let np: NodePool = serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
            "spec": {"template": {"spec": {"requirements": [],
                "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}}}}
        }))
        .expect("a NodePool");
        assert_eq!(allowed(&np, DisruptionReason::Empty, 30, 0, MONDAY_1030), 3);
        assert_eq!(allowed(&np, DisruptionReason::Empty, 30, 2, MONDAY_1030), 1);
        assert_eq!(allowed(&np, DisruptionReason::Empty, 30, 5, MONDAY_1030), 0);
    }

    #[test]
    fn the_most_restrictive_budget_for_the_reason_wins() {
        let np = pool(json!([
            {"nodes": "50%"},
            {"nodes": "1", "reasons": ["Drifted"]},
            {"nodes": "0", "reasons": ["Underutilized"]},
        ]));
        assert_eq!(allowed(&np, DisruptionReason::Empty, 10, 0, MONDAY_1030), 5);
        assert_eq!(
            allowed(&np, DisruptionReason::Drifted, 10, 0, MONDAY_1030),
            1
        );
        assert_eq!(
            allowed(&np, DisruptionReason::Underutilized, 10, 0, MONDAY_1030),
            0
        );
    }

    #[test]
    fn a_scheduled_budget_applies_only_inside_its_window() {
        // No disruption on weekdays from 09:00 for 8 hours.
        let np = pool(json!([
            {"nodes": "100%"},
            {"nodes": "0", "schedule": "0 9 * * mon-fri", "duration": "8h"},
        ]));
        assert_eq!(allowed(&np, DisruptionReason::Empty, 4, 0, MONDAY_1030), 0);
        // 18:30 the same Monday: the window closed at 17:00.
        assert_eq!(
            allowed(&np, DisruptionReason::Empty, 4, 0, MONDAY_1030 + 8 * 3600),
            4
        );
        // Sunday 10:30: the schedule does not fire at weekends.
        assert_eq!(
            allowed(&np, DisruptionReason::Empty, 4, 0, MONDAY_1030 - 86_400),
            4
        );
    }

    /// A freeze window with a typo in its schedule fails the whole pool closed, for every reason
    /// (upstream's rule), instead of being ignored.
    #[test]
    fn a_malformed_budget_fails_the_pool_closed() {
        let np = pool(json!([
            {"nodes": "100%"},
            {"nodes": "0", "schedule": "0 9 * * mon-fry", "duration": "8h"},
        ]));
        for reason in [
            DisruptionReason::Empty,
            DisruptionReason::Drifted,
            DisruptionReason::Underutilized,
        ] {
            assert_eq!(allowed(&np, reason, 10, 0, MONDAY_1030), 0, "{reason:?}");
        }
        let bad_nodes = pool(json!([
            {"nodes": "100%"},
            {"nodes": "many", "reasons": ["Drifted"]},
        ]));
        assert_eq!(
            allowed(&bad_nodes, DisruptionReason::Empty, 10, 0, MONDAY_1030),
            0
        );
    }
}
