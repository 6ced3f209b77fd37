//! What the tests of `explain` and of the docs' tables share: the binary run with `-o json`, and
//! the check that each test a table cell names exists.

use std::path::Path;

use serde_json::Value;

/// Runs `karpenter-capi explain ARGS -o json --kubeconfig KUBECONFIG`; returns the parsed
/// report (a failed run or a report that is not JSON fails the test).
pub fn explain_json(kubeconfig: &Path, args: &[&str]) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
        .arg("explain")
        .args(args)
        .args(["-o", "json", "--kubeconfig"])
        .arg(kubeconfig)
        .output()
        .expect("running karpenter-capi explain");
    assert!(
        out.status.success(),
        "explain {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "explain {args:?} printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Every `file::test` a docs table cell names (in backquotes) is a test of that file, and there
/// is at least one; `row` names the row in failures.
pub fn assert_named_tests_exist(row: &str, cell: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tests: Vec<&str> = cell
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| t.contains("::"))
        .collect();
    assert!(!tests.is_empty(), "row {row} names no test");
    for t in tests {
        let (file, name) = t.rsplit_once("::").expect("file::test");
        let src = std::fs::read_to_string(root.join(file))
            .unwrap_or_else(|e| panic!("row {row}: {file}: {e}"));
        assert!(
            src.contains(&format!("fn {name}(")),
            "row {row}: no test {name} in {file}"
        );
    }
}
