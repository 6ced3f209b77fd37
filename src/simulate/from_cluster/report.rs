//! The what-if report: what the controller did to the loaded copy of the source cluster, read
//! off the simulated server's store and its disruption audit, never off the controller.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::sim::disruption_audit::{Decisions, PoolAudit};
use crate::simulate::timeline::Timeline;

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Always `from-cluster` (the HTML report's title).
    pub scenario: &'static str,
    pub source: Source,
    /// How long the controller ran on the copy.
    pub duration_s: f64,
    /// From the first read of the source to the report.
    pub elapsed_ms: u64,
    pub pods: Pods,
    pub claims: Claims,
    pub disruption: Disruption,
    pub drifted: Drifted,
    pub invariants_ok: bool,
    pub problems: Vec<String>,
    #[serde(skip)]
    pub timeline: Timeline,
}

/// What was read, and how.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Source {
    /// Objects read by kind (plural).
    pub objects: BTreeMap<String, usize>,
    pub cluster_api_version: String,
    pub read_ms: u64,
    pub load_ms: u64,
    /// What could not be read and was left out.
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Pods {
    /// Pending when loaded.
    pub pending_at_start: usize,
    /// Of those, bound to a node at the end.
    pub placed: usize,
    /// Every pod bound at the end.
    pub bound: usize,
    /// Pending at the end.
    pub unschedulable: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Claims {
    pub at_start: usize,
    /// NodeClaims the controller created (with their NodePool).
    pub created: usize,
    pub created_by_pool: BTreeMap<String, usize>,
    /// NodeClaims deleted or being deleted at the end that were live at the start.
    pub deleted: usize,
    pub at_end: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Disruption {
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub cost_per_hour_before: f64,
    pub cost_per_hour_after: f64,
    /// Claims disrupted, by reason.
    pub decisions: Decisions,
    pub budget_violations: usize,
    /// Per NodePool: the most claims disrupted at once, and the budget then.
    pub budgets: BTreeMap<String, PoolAudit>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Drifted {
    /// Claims marked `Drifted=True` at the end (not yet replaced).
    pub at_end: Vec<String>,
    /// Claims replaced for drift during the run.
    pub replaced: usize,
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.source;
        let read: Vec<String> = s.objects.iter().map(|(k, n)| format!("{n} {k}")).collect();
        writeln!(
            f,
            "what-if of the source cluster (Cluster API {}), read in {:.1}s and loaded in {:.1}s: {}",
            s.cluster_api_version,
            s.read_ms as f64 / 1000.0,
            s.load_ms as f64 / 1000.0,
            read.join(", ")
        )?;
        for n in &s.notes {
            writeln!(f, "  left out: {n}")?;
        }
        let p = &self.pods;
        writeln!(
            f,
            "controller ran {:.0}s: pending pods {} -> {} placed ({} still pending)",
            self.duration_s, p.pending_at_start, p.placed, p.unschedulable
        )?;
        let c = &self.claims;
        let by_pool: Vec<String> = c
            .created_by_pool
            .iter()
            .map(|(k, n)| format!("{n} of {k}"))
            .collect();
        writeln!(
            f,
            "  NodeClaims: {} at start, {} created ({}), {} deleted, {} at end",
            c.at_start,
            c.created,
            if by_pool.is_empty() {
                "none".into()
            } else {
                by_pool.join(", ")
            },
            c.deleted,
            c.at_end
        )?;
        let d = &self.disruption;
        writeln!(
            f,
            "  nodes {} -> {}; cost/h {:.2} -> {:.2}; disrupted: {} empty, {} underutilized, {} drifted, {} expired, {} other",
            d.nodes_before,
            d.nodes_after,
            d.cost_per_hour_before,
            d.cost_per_hour_after,
            d.decisions.empty,
            d.decisions.underutilized,
            d.decisions.drifted,
            d.decisions.expired,
            d.decisions.other
        )?;
        for (pool, b) in &d.budgets {
            let budget = b.budget_then.map_or("none".into(), |n| n.to_string());
            writeln!(
                f,
                "  budget of NodePool {pool}: at most {} disrupted at once (budget then {budget})",
                b.max_disrupting
            )?;
        }
        writeln!(
            f,
            "  drifted: {} replaced, {} still marked{}",
            self.drifted.replaced,
            self.drifted.at_end.len(),
            match self.drifted.at_end.is_empty() {
                true => String::new(),
                false => format!(" ({})", self.drifted.at_end.join(", ")),
            }
        )?;
        match self.invariants_ok {
            true => write!(f, "invariants: ok"),
            false => write!(f, "invariants: VIOLATED: {}", self.problems.join("; ")),
        }
    }
}
