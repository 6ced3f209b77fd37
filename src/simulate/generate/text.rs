//! The generate scenario's report as text: the pods report, then what was generated against
//! the baseline and how the scale to zero went.

use std::collections::BTreeMap;

use super::{GenerateReport, money};

/// Nodes by shape, the most first (then by name), so that two runs read alike.
fn shapes_line(m: &BTreeMap<String, usize>) -> String {
    let mut v: Vec<(&String, &usize)> = m.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.iter()
        .map(|(s, n)| format!("{n} {s}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl std::fmt::Display for GenerateReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.pods)?;
        let g = &self.generate;
        let ms = |v: Option<u64>| {
            v.map_or("never".to_string(), |ms| {
                format!("{:.1}s", ms as f64 / 1000.0)
            })
        };
        writeln!(
            f,
            "  generate: NodeClass {} from MachineDeployment {}: {} shapes offered, maxMachineDeployments {}, idleAfter {:.0}s",
            g.nodeclass,
            g.source,
            g.shapes_offered,
            g.max_machine_deployments,
            g.idle_after_ms as f64 / 1000.0
        )?;
        writeln!(
            f,
            "            {} groups generated, at most {} at once: {}",
            g.groups_generated,
            g.max_groups_at_once,
            g.groups.join(", ")
        )?;
        for (name, r) in [("generated", &g.generated), ("baseline ", &g.baseline)] {
            writeln!(
                f,
                "            {name}: {} nodes ({}), {} pods bound; {}/h; requests use {:.1}% of CPU, {:.1}% of memory",
                r.nodes,
                shapes_line(&r.nodes_by_shape),
                r.pods_bound,
                money(r.cost_per_hour),
                r.cpu_utilization * 100.0,
                r.memory_utilization * 100.0
            )?;
        }
        writeln!(
            f,
            "            generated / baseline ({}): cost {:.3}, CPU utilisation {:.3}",
            g.baseline_sizes.join(", "),
            g.cost_ratio,
            g.cpu_utilization_ratio
        )?;
        let s = &g.scale_down;
        writeln!(
            f,
            "            scaled to zero: nodes gone after {}, every generated group and template after {} ({} groups, {} templates left)",
            ms(s.nodes_removed_ms),
            ms(s.groups_removed_ms),
            s.groups_left.len(),
            s.templates_left.len()
        )?;
        let u = &g.untouched;
        write!(
            f,
            "            without the mark: {} ({} changed or gone, {} controller writes)",
            u.checked.join(", "),
            u.changed.len(),
            u.controller_writes
        )
    }
}
