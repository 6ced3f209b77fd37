//! One exposition of several controllers' metrics: fleet mode runs a controller per Cluster,
//! each with a registry of its own (so a Cluster that stops takes its series with it), and
//! /metrics must still list every family once, with one HELP and TYPE, as Prometheus requires.
//! Each part's samples get a label naming their part (the Cluster), inserted first.

use std::collections::BTreeMap;

/// One metric family of a text exposition: its HELP/TYPE/UNIT lines and its samples.
#[derive(Default)]
struct Family {
    header: Vec<String>,
    /// The part whose header lines were kept: every part repeats them.
    declared_by: Option<usize>,
    samples: Vec<String>,
}

/// Merges OpenMetrics text expositions into one: `parts` are (label value, exposition); a part
/// whose label value is `None` keeps its samples as they are (the process's own metrics).
/// Families keep the order in which they first appear; each family's header is the first
/// part's that has it.
pub fn merge(label: &str, parts: &[(Option<&str>, &str)]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for (part, (value, text)) in parts.iter().enumerate() {
        let mut current = String::new();
        for line in text.lines() {
            if line == "# EOF" || line.is_empty() {
                continue;
            }
            if let Some(name) = header_name(line) {
                current = name.to_string();
                let family = families.entry(current.clone()).or_insert_with(|| {
                    order.push(current.clone());
                    Family::default()
                });
                if *family.declared_by.get_or_insert(part) == part {
                    family.header.push(line.to_string());
                }
                continue;
            }
            let sample = match value {
                Some(v) => with_label(line, label, v),
                None => line.to_string(),
            };
            families
                .entry(current.clone())
                .or_insert_with(|| {
                    order.push(current.clone());
                    Family::default()
                })
                .samples
                .push(sample);
        }
    }
    let mut out = String::new();
    for name in &order {
        if let Some(f) = families.get(name) {
            for line in f.header.iter().chain(&f.samples) {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

/// The family a `# HELP`, `# TYPE` or `# UNIT` line describes.
fn header_name(line: &str) -> Option<&str> {
    let rest = ["# HELP ", "# TYPE ", "# UNIT "]
        .iter()
        .find_map(|p| line.strip_prefix(p))?;
    rest.split(' ').next()
}

/// `line` (a sample) with `label="value"` as its first label.
fn with_label(line: &str, label: &str, value: &str) -> String {
    let escaped = value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    let pair = format!("{label}=\"{escaped}\"");
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let (name, rest) = line.split_at(name_end);
    match rest.strip_prefix('{') {
        Some(labels) if labels.starts_with('}') => format!("{name}{{{pair}{labels}"),
        Some(labels) => format!("{name}{{{pair},{labels}"),
        None => format!("{name}{{{pair}}}{rest}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "# HELP karpenter_nodeclaims_created_total Claims created.
# TYPE karpenter_nodeclaims_created_total counter
karpenter_nodeclaims_created_total{nodepool=\"default\"} 3
# HELP karpenter_pods_pending Pods pending.
# TYPE karpenter_pods_pending gauge
karpenter_pods_pending 2
# EOF
";
    const B: &str = "# HELP karpenter_nodeclaims_created_total Claims created.
# TYPE karpenter_nodeclaims_created_total counter
karpenter_nodeclaims_created_total{nodepool=\"gpu\"} 1
# HELP karpenter_pods_pending Pods pending.
# TYPE karpenter_pods_pending gauge
karpenter_pods_pending 0
# EOF
";

    #[test]
    fn every_family_once_with_each_parts_samples_labelled() {
        let merged = merge("cluster", &[(Some("ns/a"), A), (Some("ns/b"), B)]);
        assert_eq!(
            merged,
            "# HELP karpenter_nodeclaims_created_total Claims created.
# TYPE karpenter_nodeclaims_created_total counter
karpenter_nodeclaims_created_total{cluster=\"ns/a\",nodepool=\"default\"} 3
karpenter_nodeclaims_created_total{cluster=\"ns/b\",nodepool=\"gpu\"} 1
# HELP karpenter_pods_pending Pods pending.
# TYPE karpenter_pods_pending gauge
karpenter_pods_pending{cluster=\"ns/a\"} 2
karpenter_pods_pending{cluster=\"ns/b\"} 0
# EOF
"
        );
    }

    #[test]
    fn the_processs_own_samples_stay_unlabelled_and_families_without_samples_keep_their_header() {
        let own = "# HELP karpenter_fleet_clusters Clusters.
# TYPE karpenter_fleet_clusters gauge
karpenter_fleet_clusters{state=\"served\"} 1
# HELP karpenter_pods_pending Pods pending.
# TYPE karpenter_pods_pending gauge
# EOF
";
        let merged = merge("cluster", &[(None, own), (Some("x"), A)]);
        assert!(merged.contains("karpenter_fleet_clusters{state=\"served\"} 1\n"));
        assert_eq!(
            merged
                .matches("# TYPE karpenter_pods_pending gauge")
                .count(),
            1
        );
        assert!(merged.contains("karpenter_pods_pending{cluster=\"x\"} 2\n"));
        assert!(merged.ends_with("# EOF\n") && merged.matches("# EOF").count() == 1);
    }

    #[test]
    fn a_label_value_is_escaped_and_empty_label_sets_are_filled() {
        assert_eq!(with_label("m{} 1", "c", "a\"b"), "m{c=\"a\\\"b\"} 1");
        assert_eq!(
            with_label("m_bucket{le=\"1\"} 4", "c", "x"),
            "m_bucket{c=\"x\",le=\"1\"} 4"
        );
        assert_eq!(with_label("m 1 123", "c", "x"), "m{c=\"x\"} 1 123");
    }
}
