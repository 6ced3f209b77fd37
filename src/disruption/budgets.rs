//! Disruption budgets (Karpenter core v1): per NodePool and reason, the most restrictive active
//! budget says how many of the pool's nodes may be disrupting at once. A percentage is of the
//! pool's nodes, rounded up; a budget with a `schedule` is active only for `duration` after each
//! cron hit (UTC); a budget without `reasons` applies to every reason. Nodes already being
//! disrupted count against the budget.

use std::time::Duration;

use crate::api::cron;
use crate::api::nodepool::{Budget, DisruptionReason, NodePool};

/// How many nodes a budget allows for a pool of `nodes`, or None when it is not active now.
pub fn budget_value(budget: &Budget, nodes: usize, now_unix: i64) -> Option<usize> {
    if let Some(schedule) = &budget.schedule {
        let duration = budget.duration.map(|d| d.0).unwrap_or(Duration::ZERO);
        // Validation refuses a bad schedule; one that slips through is never active.
        let parsed = cron::parse(schedule).ok()?;
        if !parsed.is_active(now_unix, duration) {
            return None;
        }
    }
    Some(nodes_value(&budget.nodes, nodes))
}

/// `"5"` is five nodes; `"10%"` is a tenth of `nodes`, rounded up. A value validation would
/// refuse counts as zero (blocks disruption rather than allowing it unbounded).
pub fn nodes_value(value: &str, nodes: usize) -> usize {
    let value = value.trim();
    match value.strip_suffix('%') {
        Some(pct) => match pct.parse::<u64>() {
            Ok(p) if p <= 100 => (p as usize * nodes).div_ceil(100),
            _ => 0,
        },
        None => value.parse::<usize>().unwrap_or(0),
    }
}

/// The most restrictive active budget for `reason` (None: no budget applies, unlimited).
pub fn limit(
    np: &NodePool,
    reason: DisruptionReason,
    nodes: usize,
    now_unix: i64,
) -> Option<usize> {
    np.disruption()
        .budgets()
        .iter()
        .filter(|b| b.reasons.as_ref().is_none_or(|rs| rs.contains(&reason)))
        .filter_map(|b| budget_value(b, nodes, now_unix))
        .min()
}

/// How many more of the pool's nodes may start being disrupted for `reason` now.
pub fn allowed(
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
        assert_eq!(nodes_value("10%", 5), 1);
        assert_eq!(nodes_value("10%", 0), 0);
        assert_eq!(nodes_value("10%", 11), 2);
        assert_eq!(nodes_value("100%", 7), 7);
        assert_eq!(nodes_value("0%", 7), 0);
        assert_eq!(nodes_value("3", 100), 3);
        assert_eq!(nodes_value("nonsense", 10), 0);
        assert_eq!(nodes_value("150%", 10), 0);
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
}
