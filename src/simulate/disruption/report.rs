//! What a disruption scenario reports: its figures (decisions, nodes and cost before and after,
//! budget and drain violations, the rollout, the pause, the blockers, where the time went), in
//! JSON and in words.

use serde::Serialize;
use serde_json::Value;

use super::backoff::BackoffFigures;
use super::blockers::{BlockerCount, BlockerCounts};
use super::time_split::TimeSplit;
use crate::sim::disruption_audit::Decisions;
use crate::simulate::pods::PodReport;

/// The node group rolled out in the drift scenario's second phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RolloutFigures {
    /// A MachineDeployment's name, or `MachinePool/<name>`.
    pub machine_deployment: String,
    /// Live claims on that node group when the rollout began.
    pub claims_before: usize,
    /// Of those, the ones gone at the end.
    pub claims_replaced: usize,
    /// Live Machines of the node group at the end, and how many are up to date.
    pub machines: usize,
    pub machines_up_to_date: usize,
    /// During the rollout: the most claims being disrupted at once (Cluster API deleting
    /// Machines included), violations by the controller, and the excess counting everybody.
    pub max_disrupting: usize,
    pub budget_violations: usize,
    pub budget_excess_any: usize,
}

/// The drift scenario's pause (`--pause-disruption`): the NodePool's disruption paused from the
/// template change for `held_ms`, then lifted.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PauseFigures {
    pub held_ms: u64,
    /// Claims the controller decided to drift while the pause held (the goal: 0).
    pub drifted_while_paused: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct DisruptionFigures {
    /// Claims deleted, by why (counted by the server's disruption audit).
    pub decisions: Decisions,
    pub nodes_before: usize,
    pub nodes_after: usize,
    /// Total pod requests over the largest offering's allocatable, per resource, the largest,
    /// rounded up.
    pub nodes_lower_bound: usize,
    pub cost_per_hour_before: f64,
    pub cost_per_hour_after: f64,
    pub budget_violations: usize,
    /// The worst excess over a budget at any moment, counting claims deleted by others (a
    /// Cluster API rollout); informative, not a violation of the controller's.
    pub budget_excess_any: usize,
    /// The most claims of one pool being disrupted at once.
    pub max_disrupting: usize,
    /// The longest any pod stayed pending after the disruption phase began.
    pub pods_max_pending_ms: u64,
    /// Live claims when the disruption phase began, and how many of them are gone at the end.
    pub claims_before: usize,
    pub claims_replaced: usize,
    pub pods_unbound_at_end: usize,
    pub pdb_violations: usize,
    pub do_not_disrupt_violations: usize,
    /// The drift scenario's rollout of a MachineDeployment or MachinePool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutFigures>,
    /// Drift only: from the template change until the NodePool's `NodesUpToDate` condition,
    /// computed for the changed generation, turned True (the rollout's end as its users see it;
    /// polled every 250 ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes_up_to_date_after_ms: Option<u64>,
    /// Drift with `--pause-disruption`: how the pause held the drifted claims.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause: Option<PauseFigures>,
    /// Drift with `--fail-replacements`: how drift backed off against the failing launches and
    /// finished after the lift.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffFigures>,
    /// Nodes the controller's disruption passes held back during the phase, by blocker (its
    /// `karpenter_voluntary_disruption_blocked_nodes` gauge summed over the NodePools, sampled
    /// every second: see `blockers`).
    pub blocked_nodes: BlockerCounts,
    /// How long the disruption phase took, until stable.
    pub phase_ms: u64,
    /// From the controller's first disruption mark (its first Node taint of the phase, seen by
    /// the server) until the disruption settled (drift: its replacements done, before the
    /// rollout); 0 when nothing was disrupted.
    pub duration_ms: u64,
    /// The most disruption commands the controller had under way at once (its
    /// `karpenter_capi_disruption_commands_in_flight` gauge, sampled every 100 ms).
    pub commands_max_in_flight: i64,
    /// Where the phase's time went.
    pub time: TimeSplit,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct DisruptionReport {
    #[serde(flatten)]
    pub pods: PodReport,
    pub disruption: DisruptionFigures,
}

impl DisruptionReport {
    pub fn invariants_ok(&self) -> bool {
        self.pods.launch.invariants_ok
    }

    pub fn to_json(&self) -> String {
        self.pods.to_json_with(
            "disruption",
            serde_json::to_value(&self.disruption).unwrap_or(Value::Null),
            self.invariants_ok(),
        )
    }
}

impl std::fmt::Display for DisruptionReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.pods)?;
        let d = &self.disruption;
        writeln!(
            f,
            "  disruption: {:.1}s ({:.1}s from the first mark; at most {} commands at once); decided: {}; nodes {} -> {} (lower bound {}); cost/h {:.2} -> {:.2}",
            d.phase_ms as f64 / 1000.0,
            d.duration_ms as f64 / 1000.0,
            d.commands_max_in_flight,
            decided(&d.decisions),
            d.nodes_before,
            d.nodes_after,
            d.nodes_lower_bound,
            d.cost_per_hour_before,
            d.cost_per_hour_after,
        )?;
        write!(
            f,
            "              {} of the {} claims there at the start deleted; at most {} disrupted at once, {} budget violations; {} PodDisruptionBudget and {} do-not-disrupt violations; longest pending pod {} ms; {} pods not bound at the end",
            d.claims_replaced,
            d.claims_before,
            d.max_disrupting,
            d.budget_violations,
            d.pdb_violations,
            d.do_not_disrupt_violations,
            d.pods_max_pending_ms,
            d.pods_unbound_at_end,
        )?;
        write!(f, "\n{}", d.time)?;
        if let Some(ms) = d.nodes_up_to_date_after_ms {
            write!(
                f,
                "\n  NodesUpToDate True {:.1}s after the template change",
                ms as f64 / 1000.0
            )?;
        }
        if let Some(p) = &d.pause {
            write!(
                f,
                "\n  paused:   {:.1}s from the template change; {} claims drifted meanwhile",
                p.held_ms as f64 / 1000.0,
                p.drifted_while_paused
            )?;
        }
        if let Some(b) = &d.backoff {
            write!(
                f,
                "\n  failing:  launches failed {:.1}s (create timeout {:.1}s): {} replacements timed out, {} drift back-offs ({} DisruptionBackoff Events, longest {:.0}s); {} claims drifted meanwhile, {} after the lift; NodesUpToDate True {}",
                b.failing_ms as f64 / 1000.0,
                b.create_timeout_ms as f64 / 1000.0,
                b.failed_replacements,
                b.backoffs,
                b.backoff_events,
                b.longest_backoff_ms as f64 / 1000.0,
                b.drifted_while_failing,
                b.drifted_after_lift,
                b.up_to_date_after_lift_ms.map_or(
                    "never after the lift".to_string(),
                    |ms| format!("{:.1}s after the lift", ms as f64 / 1000.0)
                ),
            )?;
        }
        write!(f, "\n  blocked:  {}", blocked_in_words(&d.blocked_nodes))?;
        if let Some(r) = &d.rollout {
            write!(
                f,
                "\n  rollout:  {}: {} of the {} claims on it deleted, {} of {} Machines up to date; at most {} claims disrupted at once; {} budget violations by the controller's decisions",
                r.machine_deployment,
                r.claims_replaced,
                r.claims_before,
                r.machines_up_to_date,
                r.machines,
                r.max_disrupting,
                r.budget_violations
            )?;
            if r.budget_excess_any > 0 {
                write!(
                    f,
                    " (Cluster API's own rollout deleted Machines past the budget by {}: a rollout does not read Karpenter's budgets, so this is no violation)",
                    r.budget_excess_any
                )?;
            }
        }
        Ok(())
    }
}

/// The disruption decisions so far in words, the kinds that occurred only ("none" before any).
pub(super) fn decided(d: &Decisions) -> String {
    let kinds = [
        (d.empty, "empty"),
        (d.underutilized, "underutilized"),
        (d.drifted, "drifted"),
        (d.expired, "expired"),
        (d.other, "other"),
    ];
    let words: Vec<String> = kinds
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
    if words.is_empty() {
        "none".into()
    } else {
        words.join(", ")
    }
}

/// The blockers seen, the most nodes first: `budget 4 (0 at the end), ...`; "none" before any.
pub fn blocked_in_words(counts: &BlockerCounts) -> String {
    let mut seen: Vec<(&String, &BlockerCount)> = counts.iter().collect();
    seen.sort_by_key(|(_, c)| std::cmp::Reverse(c.max_nodes));
    let words: Vec<String> = seen
        .iter()
        .map(|(b, c)| {
            format!(
                "{b} at most {} nodes for {} s ({} at the end)",
                c.max_nodes, c.seconds_held, c.at_end
            )
        })
        .collect();
    if words.is_empty() {
        "none".into()
    } else {
        words.join(", ")
    }
}
