//! Real tools the tests drive (kubectl v1.35, helm v4), installed by `.ci/install-tools`.

use std::path::{Path, PathBuf};

/// A real tool binary: `$KARPENTER_CAPI_TOOLS/NAME`, `target/tools/bin/NAME` (where
/// `.ci/install-tools` puts it), `$CARGO_TARGET_DIR/tools/bin/NAME`, or NAME on PATH. Outside CI
/// a missing tool skips the check with a loud message; in CI (CI set) it fails the test, because
/// `.ci/run` installs both.
pub fn tool(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("KARPENTER_CAPI_TOOLS") {
        dirs.push(PathBuf::from(d));
    }
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tools/bin"));
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        dirs.push(Path::new(&d).join("tools/bin"));
    }
    if let Some(p) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    let found = dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file());
    if found.is_none() {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
        assert!(
            !ci,
            "{name} is not installed: CI must run .ci/install-tools (see docs/deploy.md)"
        );
        eprintln!(
            "\n!!! SKIPPED: {name} not found (run .ci/install-tools to install helm and kubectl \
             under target/tools/bin); the checks that need {name} did NOT run !!!\n"
        );
    }
    found
}
