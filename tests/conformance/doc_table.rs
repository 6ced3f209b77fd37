//! docs/conformance.md and this target stay in step: every test a row names exists, a row that
//! passes names tests that run, and a row that fails on a test names an ignored one.

use std::collections::BTreeMap;

const MODULES: [(&str, &str); 15] = [
    ("custom_constraints", include_str!("custom_constraints.rs")),
    (
        "preferential_fallback",
        include_str!("preferential_fallback.rs"),
    ),
    (
        "instance_type_compat",
        include_str!("instance_type_compat.rs"),
    ),
    ("binpacking", include_str!("binpacking.rs")),
    ("topology", include_str!("topology.rs")),
    (
        "default_constraints",
        include_str!("default_constraints.rs"),
    ),
    ("provisioning", include_str!("provisioning.rs")),
    ("instance_selection", include_str!("instance_selection.rs")),
    ("in_flight", include_str!("in_flight.rs")),
    ("whole_flow", include_str!("whole_flow.rs")),
    ("volumes", include_str!("volumes.rs")),
    ("nodeoverlay", include_str!("nodeoverlay.rs")),
    ("buffers", include_str!("buffers.rs")),
    ("static_capacity", include_str!("static_capacity.rs")),
    ("node_repair", include_str!("node_repair.rs")),
];

/// `module::test` -> ignored?
fn tests() -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    for (module, src) in MODULES {
        let mut ignored = false;
        let mut after_test = false;
        for line in src.lines() {
            let line = line.trim();
            if line == "#[test]" || line == "#[actix::test]" {
                after_test = true;
                ignored = false;
            } else if after_test && line.starts_with("#[ignore") {
                ignored = true;
            } else if after_test
                && let Some(rest) = line.strip_prefix("fn ").or(line.strip_prefix("async fn "))
            {
                let name: String = rest
                    .chars()
                    .take_while(|c| *c == '_' || c.is_alphanumeric())
                    .collect();
                out.insert(format!("{module}::{name}"), ignored);
                after_test = false;
            }
        }
    }
    out
}

#[test]
fn the_table_matches_the_tests() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/conformance.md"))
        .expect("docs/conformance.md");
    let tests = tests();
    let mut rows = 0;
    for line in doc
        .lines()
        .filter(|l| l.starts_with("| ") && l.matches(" | ").count() >= 3)
    {
        let cells: Vec<&str> = line.split(" | ").collect();
        let status = cells[2];
        let named: Vec<&str> = cells[3]
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|s| s.contains("::") && !s.contains('/') && !s.contains(' '))
            .collect();
        let mut any_ignored = false;
        for name in &named {
            let module = name.split("::").next().unwrap_or_default();
            if !MODULES.iter().any(|(m, _)| *m == module) {
                continue;
            }
            rows += 1;
            let ignored = *tests
                .get(*name)
                .unwrap_or_else(|| panic!("docs/conformance.md names {name}, which is not a test"));
            any_ignored |= ignored;
            match status {
                "passes" | "differs" => {
                    assert!(!ignored, "{name} is ignored but its row says {status}")
                }
                "fails" => {}
                other => panic!("a row naming {name} says {other:?}"),
            }
        }
        if status == "fails" && !named.is_empty() {
            assert!(
                any_ignored,
                "{line}: says fails but every test it names runs"
            );
        }
    }
    assert!(rows > 200, "only {rows} rows name tests");
    let orphans: Vec<&String> = tests.keys().filter(|t| !doc.contains(t.as_str())).collect();
    assert!(orphans.is_empty(), "tests no row names: {orphans:?}");
}
