//! The disruption audit's own reading of a NodePool's budgets, from its raw spec: independent of
//! the controller's budget code, which the audit grades.

use serde_json::Value;

use super::DisruptionReason;

/// One budget as the audit reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RawBudget {
    /// Nodes at once: a count, or a percentage of the pool's nodes.
    nodes: BudgetNodes,
    /// The reasons it applies to, as spelled in the spec; None: every reason.
    reasons: Option<Vec<String>>,
    /// In force at every moment: no schedule, or one that fires every minute and stays active
    /// at least a minute. Any other schedule may or may not be active now; the audit does not
    /// evaluate cron expressions, so such a budget is left out (see [`PoolBudgets::limit`]).
    always: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BudgetNodes {
    Count(usize),
    Percent(usize),
}

/// A pool's disruption budgets read from the NodePool's raw spec by the audit itself: a count is
/// that many nodes; a percentage is of the pool's nodes, rounded up (as Karpenter rounds, so 10 %
/// of 5 nodes lets one go); the most restrictive budget in force for a reason wins; no budgets
/// field at all is the API's default of one budget of 10 %; a `nodes` value the audit cannot
/// read fails the pool closed (no disruption for any reason), as Karpenter does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolBudgets {
    budgets: Vec<RawBudget>,
    malformed: bool,
}

impl PoolBudgets {
    /// From a NodePool as JSON (the whole object, or anything with its `spec`).
    pub fn of(pool: &Value) -> Self {
        let default = [serde_json::json!({"nodes": "10%"})];
        let listed = match pool.pointer("/spec/disruption/budgets") {
            None | Some(Value::Null) => &default[..],
            Some(Value::Array(list)) => &list[..],
            Some(_) => {
                return Self {
                    budgets: Vec::new(),
                    malformed: true,
                };
            }
        };
        let mut out = Self::default();
        for b in listed {
            let Some(nodes) = b
                .get("nodes")
                .and_then(Value::as_str)
                .and_then(budget_nodes)
            else {
                out.malformed = true;
                continue;
            };
            let reasons = b.get("reasons").and_then(Value::as_array).map(|rs| {
                rs.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            });
            let schedule = b.get("schedule").and_then(Value::as_str);
            let duration = b.get("duration").and_then(Value::as_str);
            let always = match (schedule, duration) {
                (None, None) => true,
                (Some(s), Some(d)) => {
                    s.split_whitespace().eq(["*"; 5]) && duration_secs(d).is_some_and(|d| d >= 60)
                }
                _ => false,
            };
            out.budgets.push(RawBudget {
                nodes,
                reasons,
                always,
            });
        }
        out
    }

    /// The most nodes of a pool of `nodes` that may be disrupting for `reason`, counting only
    /// the budgets the audit knows to be in force: None when none applies (no limit). Leaving
    /// out budgets whose schedule it cannot evaluate makes this the most permissive reading, so
    /// an excess over it is a violation whatever the schedules say.
    pub fn limit(&self, reason: DisruptionReason, nodes: usize) -> Option<usize> {
        if self.malformed {
            return Some(0);
        }
        self.budgets
            .iter()
            .filter(|b| b.always)
            .filter(|b| {
                b.reasons
                    .as_ref()
                    .is_none_or(|rs| rs.iter().any(|r| r == reason.as_str()))
            })
            .map(|b| match b.nodes {
                BudgetNodes::Count(n) => n,
                BudgetNodes::Percent(p) => (p * nodes).div_ceil(100),
            })
            .min()
    }
}

/// `"3"` or `"25%"` (at most 100 %); anything else is unreadable.
fn budget_nodes(v: &str) -> Option<BudgetNodes> {
    let digits = |s: &str| -> Option<usize> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    match v.strip_suffix('%') {
        Some(p) => digits(p).filter(|p| *p <= 100).map(BudgetNodes::Percent),
        None => digits(v).map(BudgetNodes::Count),
    }
}

/// Seconds of a Go duration made of hours, minutes and seconds (`1h`, `30m`, `1h30m0s`).
fn duration_secs(v: &str) -> Option<u64> {
    let mut total = 0u64;
    let mut number = String::new();
    for c in v.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        let n: u64 = number.parse().ok()?;
        total = total.checked_add(n.checked_mul(unit)?)?;
        number.clear();
    }
    (number.is_empty() && !v.is_empty()).then_some(total)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn budgets_are_read_from_the_raw_spec() {
        let of = |budgets| PoolBudgets::of(&json!({"spec": {"disruption": {"budgets": budgets}}}));
        use DisruptionReason::{Drifted, Empty};
        // No budgets field: the API's default of 10 %, rounded up.
        let default = PoolBudgets::of(&json!({"spec": {"disruption": {}}}));
        assert_eq!(default.limit(Empty, 30), Some(3));
        assert_eq!(default.limit(Empty, 5), Some(1));
        assert_eq!(default.limit(Empty, 0), Some(0));
        // An empty list: no budget, no limit.
        assert_eq!(of(json!([])).limit(Empty, 5), None);
        assert_eq!(of(json!([{"nodes": "3"}])).limit(Drifted, 100), Some(3));
        assert_eq!(of(json!([{"nodes": "100%"}])).limit(Drifted, 7), Some(7));
        // Every minute for an hour: always in force, for its reasons only.
        let frozen = of(json!([
            {"nodes": "50%"},
            {"nodes": "0", "schedule": "* * * * *", "duration": "1h", "reasons": ["Empty"]},
        ]));
        assert_eq!(frozen.limit(Empty, 4), Some(0));
        assert_eq!(frozen.limit(Drifted, 4), Some(2));
        // A schedule the audit does not evaluate is left out: the most permissive reading.
        let weekdays = of(json!([
            {"nodes": "100%"},
            {"nodes": "0", "schedule": "0 9 * * mon-fri", "duration": "8h"},
        ]));
        assert_eq!(weekdays.limit(Empty, 4), Some(4));
        // A value it cannot read fails the pool closed, for every reason.
        for bad in ["many", "150%", "-1", "%"] {
            let pool = of(json!([{"nodes": "100%"}, {"nodes": bad, "reasons": ["Drifted"]}]));
            assert_eq!(pool.limit(Empty, 10), Some(0), "{bad}");
        }
        assert_eq!(duration_secs("1h30m0s"), Some(5400));
        assert_eq!(duration_secs("10m"), Some(600));
        assert_eq!(duration_secs("30s"), Some(30));
        assert_eq!(duration_secs("1d"), None);
        assert_eq!(duration_secs("5"), None);
    }
}
