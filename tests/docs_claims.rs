//! The countable claims of README.md, CHANGELOG.md and docs/*.md against the code, as
//! tests/disruption/disruption.rs holds docs/disruption.md's parity table to the tests it names:
//!
//! - the CRDs: where a sentence speaks of `karpenter-capi crds`, `deploy/crds` or the chart's
//!   `crds/`, a count of CRDs it gives is the number `crds` prints, and a list of their kinds (three
//!   or more named) names every one (and so does `crds --help`);
//! - test counts: a line that runs `cargo test --test NAME` and says `N tests` states the number
//!   of tests binary NAME registers, counted from its sources (see [`registered_tests`]), and the
//!   README's list of what `cargo test` runs names every test binary;
//! - flags: every `--flag` the docs write is a flag of the CLI (clap's definition), or of another
//!   tool in [`OTHER_TOOLS`], or of `scripts/build-image` or `scripts/image-rootfs`; where a command line runs
//!   `karpenter-capi SUBCOMMAND` or `cargo run -- SUBCOMMAND`, its flags are that subcommand's;
//!   the README's configuration table names `run` flags with their environment twins;
//! - RBAC: docs/deploy.md's five RBAC tables list exactly the rules the chart grants;
//! - no absolute path of a developer's machine (`/work/`, `/home/`, `/tmp/`, ...) in the docs,
//!   except on a line that says `example path`;
//! - the version: CHANGELOG.md has a section for Cargo.toml's version, which is also the chart's
//!   version and appVersion (the release workflow checks the same against the tag).
//!
//! Each check reports every wrong claim with its file and line, not the first one only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use karpenter_capi::cli::Cli;
use serde_json::Value;

#[path = "common/chart.rs"]
mod chart;
use chart::{CHART, strings, stripped_docs};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

// ---------------------------------------------------------------------------------------------
// The documents
// ---------------------------------------------------------------------------------------------

struct Doc {
    /// Relative to the repository, e.g. `docs/deploy.md`.
    name: String,
    text: String,
}

fn read(rel: &str) -> String {
    let p = Path::new(ROOT).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// README.md, CHANGELOG.md and every docs/*.md, in that order.
fn docs() -> Vec<Doc> {
    let mut names = vec!["README.md".to_string(), "CHANGELOG.md".to_string()];
    let mut in_docs: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("listing docs/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    in_docs.sort();
    names.extend(in_docs);
    names
        .into_iter()
        .map(|name| Doc {
            text: read(&name),
            name,
        })
        .collect()
}

/// A piece of a document a claim is read from: a paragraph of prose, or one line of a code block
/// (with its `\` continuation lines), with the line it starts on.
struct Unit {
    line: usize,
    text: String,
    code: bool,
}

fn units(doc: &Doc) -> Vec<Unit> {
    let mut out = Vec::new();
    let mut in_code = false;
    let mut para: Option<Unit> = None;
    let mut continued: Option<Unit> = None;
    for (i, line) in doc.text.lines().enumerate() {
        let n = i + 1;
        if line.trim_start().starts_with("```") {
            out.extend(para.take());
            out.extend(continued.take());
            in_code = !in_code;
            continue;
        }
        if in_code {
            let unit = continued.get_or_insert(Unit {
                line: n,
                text: String::new(),
                code: true,
            });
            match line.trim_end().strip_suffix('\\') {
                Some(head) => {
                    unit.text.push_str(head);
                    unit.text.push(' ');
                }
                None => {
                    unit.text.push_str(line);
                    out.extend(continued.take());
                }
            }
        } else if line.trim().is_empty() {
            out.extend(para.take());
        } else if line.starts_with('|') {
            // A table row is a claim of its own.
            out.extend(para.take());
            out.push(Unit {
                line: n,
                text: line.to_string(),
                code: false,
            });
        } else {
            let unit = para.get_or_insert(Unit {
                line: n,
                text: String::new(),
                code: false,
            });
            unit.text.push_str(line);
            unit.text.push('\n');
        }
    }
    out.extend(para);
    out.extend(continued);
    out
}

/// The text of every inline code span of a paragraph.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn report(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} wrong claim(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// (a) the CRDs `karpenter-capi crds` prints
// ---------------------------------------------------------------------------------------------

const NUMBERS: &[&str] = &[
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve",
];

fn number(word: &str) -> Option<usize> {
    let w = word.to_ascii_lowercase();
    NUMBERS
        .iter()
        .position(|n| *n == w)
        .or_else(|| w.parse().ok())
}

/// Whether `word` occurs in `text` as a whole word (`NodePool` is not in `NodePools`).
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric()) && !after.is_some_and(|c| c.is_alphanumeric())
    })
}

/// The kinds in `karpenter-capi crds`'s output, as `crds` prints it (`api::crds::render_yaml`).
fn printed_crd_kinds() -> Vec<String> {
    let yaml = karpenter_capi::api::crds::render_yaml().expect("crds render");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).expect("crds print YAML");
    docs.iter()
        .filter(|d| !d.is_null())
        .map(|d| {
            assert_eq!(d["kind"], "CustomResourceDefinition");
            d["spec"]["names"]["kind"]
                .as_str()
                .expect("a CRD names its kind")
                .to_string()
        })
        .collect()
}

/// Problems with the CRD claims of one piece of text.
fn crd_claims(text: &str, kinds: &[String], at: &str) -> Vec<String> {
    let mut problems = Vec::new();
    // "four CRDs", "(5 CRDs": a number word right before; not a list's "1. **CRDs".
    let words: Vec<&str> = text
        .split_whitespace()
        .map(|w| w.trim_start_matches(|c: char| !c.is_alphanumeric()))
        .collect();
    for pair in words.windows(2) {
        if pair[1].trim_end_matches(|c: char| !c.is_alphanumeric()) == "CRDs"
            && let Some(n) = number(pair[0])
            && n != kinds.len()
        {
            problems.push(format!(
                "{at}: says {} CRDs; `karpenter-capi crds` prints {} ({})",
                pair[0],
                kinds.len(),
                kinds.join(", ")
            ));
        }
    }
    let named: Vec<&String> = kinds.iter().filter(|k| has_word(text, k)).collect();
    if named.len() >= 3 && named.len() < kinds.len() {
        let missing: Vec<&String> = kinds.iter().filter(|k| !named.contains(k)).collect();
        problems.push(format!(
            "{at}: lists the CRDs without {}",
            missing
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    problems
}

#[test]
fn the_crds_the_docs_count_and_list_are_the_ones_crds_prints() {
    let kinds = printed_crd_kinds();
    assert_eq!(
        kinds.len(),
        karpenter_capi::api::crds::all().len(),
        "crds prints every CRD of api::crds::all"
    );
    let mut problems = Vec::new();
    for doc in docs() {
        for unit in units(&doc) {
            // Sentence by sentence: one that names where the CRDs are is about them.
            let sentences = unit.text.split(". ").flat_map(|s| s.split(".\n"));
            for t in sentences {
                if t.contains("karpenter-capi crds")
                    || t.contains("deploy/crds")
                    || t.contains("chart's `crds/`")
                {
                    let at = format!("{}:{}", doc.name, unit.line);
                    problems.extend(crd_claims(t, &kinds, &at));
                }
            }
        }
    }
    // The subcommand's own help says what it prints.
    let cmd = Cli::command();
    let about = cmd
        .find_subcommand("crds")
        .and_then(|c| c.get_about())
        .map(|a| a.to_string())
        .unwrap_or_default();
    for k in &kinds {
        if !has_word(&about, k) {
            problems.push(format!("`crds --help` ({about:?}) does not name {k}"));
        }
    }
    report("CRDs", &problems);
}

// ---------------------------------------------------------------------------------------------
// (b) test counts
// ---------------------------------------------------------------------------------------------

/// Rust source without its comments and, unless `keep_strings`, with every string literal
/// emptied (`""`), so that neither a comment nor a string (this file's own lists of attributes)
/// counts as a test.
fn strip_comments(src: &str, keep_strings: bool) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let mut last = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                out.push_str(&src[last..i]);
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                last = i;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                out.push_str(&src[last..i]);
                i = src[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
                last = i;
            }
            b'"' => {
                // A raw string r"..." or r#"..."#: find its end by its hashes.
                let mut hashes = 0;
                let mut j = i;
                while j > 0 && b[j - 1] == b'#' {
                    hashes += 1;
                    j -= 1;
                }
                let raw = j > 0
                    && b[j - 1] == b'r'
                    && !(j > 1 && (b[j - 2].is_ascii_alphanumeric() || b[j - 2] == b'_'));
                let start = if raw { j - 1 } else { i };
                if raw {
                    let close = format!("\"{}", "#".repeat(hashes));
                    i = src[i + 1..]
                        .find(&close)
                        .map_or(b.len(), |e| i + 1 + e + close.len());
                } else {
                    i += 1;
                    while i < b.len() && b[i] != b'"' {
                        i += if b[i] == b'\\' { 2 } else { 1 };
                    }
                    i += 1;
                }
                i = i.min(b.len());
                if !keep_strings {
                    out.push_str(&src[last..start]);
                    out.push_str("\"\"");
                    last = i;
                }
            }
            b'\'' => {
                // A character literal ('"', '\''); a lifetime has no closing quote nearby.
                if b.get(i + 1) == Some(&b'\\') {
                    i += src[i + 2..].find('\'').map_or(1, |e| e + 3);
                } else if b.get(i + 2) == Some(&b'\'') {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    out.push_str(&src[last.min(src.len())..]);
    out
}

/// The index of the bracket closing the one at `open`.
fn closing(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Splits at the commas outside brackets; empty parts dropped.
fn top_level_items(body: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in body.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&body[start..]);
    items
        .into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// The bodies of every invocation `name![...]` / `name!(...)` that is not inside a macro's own
/// definition (a body with a `$` in it).
fn invocations<'a>(src: &'a str, name: &str) -> Vec<&'a str> {
    let pat = format!("{name}!");
    let mut out = Vec::new();
    for (i, _) in src.match_indices(&pat) {
        if src[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let after = i + pat.len();
        let Some(open) = src[after..]
            .find(|c: char| !c.is_whitespace())
            .map(|o| after + o)
        else {
            continue;
        };
        if !matches!(src.as_bytes()[open], b'[' | b'(') {
            continue;
        }
        if let Some(close) = closing(src, open) {
            let body = &src[open + 1..close];
            if !body.contains('$') {
                out.push(body);
            }
        }
    }
    out
}

/// The files of the module tree rooted at `root`: `mod x;` declarations followed, with their
/// `#[path = "..."]`.
fn module_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(file) = todo.pop() {
        if files.contains(&file) {
            continue;
        }
        let src = strip_comments(
            &std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("reading {}: {e}", file.display())),
            true,
        );
        let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
        for (i, _) in src.match_indices("mod ") {
            let before = src[..i].trim_end();
            if !(before.is_empty()
                || before.ends_with(';')
                || before.ends_with('}')
                || before.ends_with(']')
                || before.ends_with("pub")
                || before.ends_with("pub(crate)"))
            {
                continue;
            }
            let rest = &src[i + 4..];
            let name_len = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..name_len];
            if name.is_empty() || !rest[name_len..].trim_start().starts_with(';') {
                continue; // an inline module: its tests are in this file
            }
            // The attributes just before the declaration.
            let attrs_start = before.rfind([';', '}']).map_or(0, |p| p + 1);
            let attrs = &src[attrs_start..i];
            let path = attrs.find("#[path").and_then(|p| {
                let q = attrs[p..].find('"')? + p + 1;
                let e = attrs[q..].find('"')? + q;
                Some(dir.join(&attrs[q..e]))
            });
            let candidates = match path {
                Some(p) => vec![p],
                None => vec![
                    dir.join(format!("{name}.rs")),
                    dir.join(name).join("mod.rs"),
                ],
            };
            let found = candidates.iter().find(|p| p.is_file()).unwrap_or_else(|| {
                panic!(
                    "{}: mod {name} is in none of {candidates:?}; teach tests/docs_claims.rs \
                     where it is",
                    file.display()
                )
            });
            todo.push(found.clone());
        }
        files.push(file);
    }
    files
}

/// Test attributes libtest counts: `#[test]`, `#[tokio::test]`, `#[actix::test]`,
/// `#[actix_rt::test]` (with or without arguments).
const TEST_ATTRIBUTES: &[&str] = &[
    "#[test]",
    "#[tokio::test]",
    "#[tokio::test(",
    "#[actix::test]",
    "#[actix::test(",
    "#[actix_rt::test]",
    "#[actix_rt::test(",
];

/// Macros that register libtest-mimic tests (tests/assets, tests/control_plane/flows.rs), with how
/// many tests each listed entry is: `trials![a, b needs [X]]` one each, `on_both_backends![a, b]`
/// two each (`simulated::` and `real::`).
const REGISTRATION_MACROS: &[(&str, usize)] = &[("trials", 1), ("on_both_backends", 2)];

/// How many tests the test binary `name` registers (what `cargo test --test NAME -- --list`
/// lists), counted from its sources: the test attributes, and the entries of the registration
/// macros. A macro of its own that registers tests in another way fails this, so that a count is
/// never silently wrong.
fn registered_tests(name: &str) -> usize {
    let tests = Path::new(ROOT).join("tests");
    let root = [
        tests.join(format!("{name}.rs")),
        tests.join(name).join("main.rs"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap_or_else(|| panic!("no test binary {name} (tests/{name}.rs or tests/{name}/main.rs)"));
    let mut count = 0;
    for file in module_files(&root) {
        let src = strip_comments(&std::fs::read_to_string(&file).unwrap_or_default(), false);
        count += TEST_ATTRIBUTES
            .iter()
            .map(|a| src.matches(a).count())
            .sum::<usize>();
        for (mac, per_entry) in REGISTRATION_MACROS {
            for body in invocations(&src, mac) {
                // `on_both_backends![needs [X]; a, b]`: the entries follow the `;`.
                let entries = body.split_once(';').map_or(body, |(_, e)| e);
                count += per_entry * top_level_items(entries).len();
            }
        }
        for (i, _) in src.match_indices("macro_rules!") {
            let rest = &src[i + "macro_rules!".len()..];
            let mac = rest
                .trim_start()
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or_default();
            let registers = rest
                .find('{')
                .and_then(|o| closing(rest, o).map(|c| &rest[o..c]))
                .is_some_and(|body| {
                    body.contains("trials!") || TEST_ATTRIBUTES.iter().any(|a| body.contains(a))
                });
            assert!(
                !registers || REGISTRATION_MACROS.iter().any(|(m, _)| *m == mac),
                "{}: macro {mac} registers tests; teach tests/docs_claims.rs how many per entry",
                file.display()
            );
        }
    }
    count
}

/// Every test binary: tests/NAME.rs and tests/NAME/main.rs.
fn test_binaries() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("tests"))
        .expect("listing tests/")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let p = e.path();
            let name = p.file_stem()?.to_string_lossy().into_owned();
            let binary = if p.is_dir() {
                p.join("main.rs").is_file()
            } else {
                p.extension().is_some_and(|x| x == "rs")
            };
            binary.then_some(name)
        })
        .collect();
    names.sort();
    names
}

/// `N tests` in a line, with the N.
fn stated_count(line: &str) -> Option<(usize, &str)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    words.windows(2).find_map(|w| {
        let tests = w[1].trim_end_matches(|c: char| !c.is_alphanumeric());
        if tests != "tests" {
            return None;
        }
        let n = w[0].trim_start_matches(|c: char| !c.is_alphanumeric());
        Some((n.replace(',', "").parse().ok()?, w[0]))
    })
}

#[test]
fn the_test_counts_the_docs_state_are_the_registered_tests() {
    let binaries = test_binaries();
    let counts: BTreeMap<&str, usize> = binaries
        .iter()
        .map(|b| (b.as_str(), registered_tests(b)))
        .collect();
    eprintln!("tests registered per binary (from the sources): {counts:?}");
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in docs() {
        for (i, line) in doc.text.lines().enumerate() {
            let Some(at) = line.find("cargo test --test ") else {
                continue;
            };
            let Some((stated, _)) = stated_count(line) else {
                continue;
            };
            let mut args = line[at + "cargo test --test ".len()..].split_whitespace();
            let name = args.next().unwrap_or_default().trim_matches('`');
            let place = format!("{}:{}", doc.name, i + 1);
            let Some(real) = counts.get(name) else {
                problems.push(format!("{place}: no test binary {name}"));
                continue;
            };
            if let Some(filter) = args.next().filter(|a| !a.starts_with('#') && *a != "--") {
                problems.push(format!(
                    "{place}: states {stated} tests for a filtered run ({filter}), which this \
                     test cannot count; state the binary's count, or none"
                ));
                continue;
            }
            checked += 1;
            if stated != *real {
                problems.push(format!(
                    "{place}: says `cargo test --test {name}` runs {stated} tests; it registers {real}"
                ));
            }
        }
    }
    eprintln!("{checked} stated test count(s) checked");
    // The README's list of what `cargo test` runs names every test binary.
    let readme = read("README.md");
    match readme
        .lines()
        .position(|l| l.contains("every test binary ("))
    {
        None => problems.push("README.md: no list of \"every test binary (...)\"".into()),
        Some(i) => {
            let text: String = readme.lines().skip(i).take(3).collect::<Vec<_>>().join(" ");
            let list = text
                .split_once("every test binary (")
                .and_then(|(_, rest)| rest.split_once(')'))
                .map_or("", |(list, _)| list);
            let named: Vec<String> = code_spans(&format!(" {list}"))
                .into_iter()
                .map(str::to_string)
                .collect();
            if named != binaries {
                problems.push(format!(
                    "README.md:{}: lists the test binaries {named:?}; they are {binaries:?}",
                    i + 1
                ));
            }
        }
    }
    report("test counts", &problems);
}

// ---------------------------------------------------------------------------------------------
// (c) flags
// ---------------------------------------------------------------------------------------------

/// Flags of other programs the docs show, by program. A flag the docs write that is neither the
/// CLI's nor listed here fails: a typo, a flag that was removed, or another tool's flag to add.
const OTHER_TOOLS: &[(&str, &[&str])] = &[
    (
        "cargo",
        &[
            "--all",
            "--all-targets",
            "--bench",
            "--bin",
            "--features",
            "--lib",
            "--locked",
            "--no-default-features",
            "--no-run",
            "--profile",
            "--release",
            "--target",
            "--test",
        ],
    ),
    (
        "libtest and criterion (after `--`)",
        &[
            "--ignored",
            "--include-ignored",
            "--list",
            "--measurement-time",
            "--nocapture",
            "--quick",
            "--warm-up-time",
        ],
    ),
    (
        "kubectl",
        &[
            "--as",
            "--certificate-authority",
            "--cluster",
            "--context",
            "--dry-run",
            "--duration",
            "--embed-certs",
            "--field-selector",
            "--for",
            "--force-conflicts",
            "--from-file",
            "--kubeconfig",
            "--minify",
            "--overwrite",
            "--raw",
            "--replicas",
            "--server",
            "--server-side",
            "--show-labels",
            "--timeout",
            "--token",
            "--type",
            "--user",
            "--validate",
            "--wait",
        ],
    ),
    (
        "helm",
        &[
            "--app-version",
            "--create-namespace",
            "--install",
            "--reset-then-reuse-values",
            "--reuse-values",
            "--set",
            "--set-json",
            "--show-only",
            "--skip-crds",
            "--strict",
            "--version",
        ],
    ),
    (
        "etcd, kube-apiserver, kube-controller-manager",
        &[
            "--audit-log-path",
            "--audit-policy-file",
            "--authorization-mode",
            "--leader-elect",
            "--service-account-max-token-expiration",
            "--unsafe-no-fsync",
            "--use-service-account-credentials",
        ],
    ),
    (
        "Cluster API's manager",
        &[
            "--diagnostics-address",
            "--health-addr",
            "--insecure-diagnostics",
            "--machinedeployment-concurrency",
            "--machineset-concurrency",
            "--webhook-cert-dir",
            "--webhook-port",
        ],
    ),
    ("Dockerfile (COPY)", &["--from"]),
    ("chroot", &["--userspec"]),
    (
        "heaptrack_print",
        &["--flamegraph-cost-type", "--print-flamegraph"],
    ),
];

/// Each (sub)command by its path (`""`, `run`, `explain pod`) with its long flags.
fn clap_flags() -> BTreeMap<String, BTreeSet<String>> {
    fn walk(cmd: &clap::Command, path: &str, out: &mut BTreeMap<String, BTreeSet<String>>) {
        let mut flags: BTreeSet<String> = ["--help".to_string()].into();
        if cmd.get_version().is_some() {
            flags.insert("--version".into());
        }
        for arg in cmd.get_arguments() {
            flags.extend(arg.get_long().map(|l| format!("--{l}")));
            flags.extend(
                arg.get_all_aliases()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|l| format!("--{l}")),
            );
        }
        out.insert(path.to_string(), flags);
        for sub in cmd.get_subcommands() {
            let p = if path.is_empty() {
                sub.get_name().to_string()
            } else {
                format!("{path} {}", sub.get_name())
            };
            walk(sub, &p, out);
        }
    }
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = BTreeMap::new();
    walk(&cmd, "", &mut out);
    out
}

/// The options scripts/build-image and scripts/image-rootfs take (their `case` arms).
fn build_image_flags() -> BTreeSet<String> {
    ["scripts/build-image", "scripts/image-rootfs"]
        .into_iter()
        .flat_map(|script| read(script).lines().map(str::to_string).collect::<Vec<_>>())
        .filter_map(|l| {
            let l = l.trim_start();
            let flag = l.strip_prefix("--")?.split(')').next()?;
            (l.contains(')') && flag.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                .then(|| format!("--{flag}"))
        })
        .collect()
}

/// Every `--flag` token of a text, with its byte offset.
fn flag_tokens(text: &str) -> Vec<(usize, String)> {
    let b = text.as_bytes();
    text.match_indices("--")
        .filter(|(i, _)| {
            let before_ok = *i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'-');
            let first = b.get(i + 2);
            before_ok && first.is_some_and(|c| c.is_ascii_lowercase())
        })
        .map(|(i, _)| {
            let rest = &text[i + 2..];
            let len = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
                .unwrap_or(rest.len());
            (i, format!("--{}", rest[..len].trim_end_matches('-')))
        })
        .collect()
}

/// Where `text` runs the binary (`karpenter-capi SUB ...`, `cargo run ... -- SUB ...`): the
/// subcommand path and the flags given to it, up to the end of that command.
fn invocations_of_the_cli(
    text: &str,
    commands: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<(String, Vec<String>)> {
    let mut starts: Vec<usize> = Vec::new();
    for (i, _) in text.match_indices("karpenter-capi ") {
        let before = text[..i].chars().next_back();
        if before.is_none_or(|c| c.is_whitespace() || matches!(c, '/' | '(' | '`' | '$')) {
            starts.push(i + "karpenter-capi ".len());
        }
    }
    for (i, _) in text.match_indices("cargo run") {
        if let Some(dd) = text[i..].find(" -- ") {
            let between = &text[i..i + dd];
            if !between.contains(['|', ';', '&', '`']) {
                starts.push(i + dd + " -- ".len());
            }
        }
    }
    let mut out = Vec::new();
    for start in starts {
        let mut words = text[start..].split_whitespace().peekable();
        let mut path = String::new();
        while let Some(w) = words.peek() {
            let next = if path.is_empty() {
                w.to_string()
            } else {
                format!("{path} {w}")
            };
            if commands.contains_key(&next) {
                path = next;
                words.next();
            } else {
                break;
            }
        }
        if path.is_empty() {
            continue; // `karpenter-capi` as a name (a release, a namespace), not the binary run
        }
        let mut flags = Vec::new();
        for w in words {
            if w.starts_with(['|', ';', '#', '>', ')', '`']) || w.starts_with("&&") || w == "&" {
                break;
            }
            let end = w.ends_with(['`', ';', ')']);
            if w.starts_with("--") && w.len() > 2 {
                let flag = w.split(['=', '`', ';', ')', ',']).next().unwrap_or(w);
                flags.push(flag.to_string());
            }
            if end {
                break;
            }
        }
        out.push((path, flags));
    }
    out
}

#[test]
fn every_flag_the_docs_mention_exists() {
    let commands = clap_flags();
    let ours: BTreeSet<&String> = commands.values().flatten().collect();
    let others: BTreeMap<&str, &str> = OTHER_TOOLS
        .iter()
        .flat_map(|(tool, flags)| flags.iter().map(move |f| (*f, *tool)))
        .collect();
    let build_image = build_image_flags();
    assert!(
        build_image.contains("--sim-binary"),
        "scripts/build-image's options were not found: {build_image:?}"
    );
    let mut problems = Vec::new();
    for doc in docs() {
        // Any flag, anywhere: ours, or a tool's the docs use.
        for (i, line) in doc.text.lines().enumerate() {
            for (_, flag) in flag_tokens(line) {
                if !ours.contains(&flag)
                    && !others.contains_key(flag.as_str())
                    && !build_image.contains(&flag)
                {
                    problems.push(format!(
                        "{}:{}: {flag} is no flag of karpenter-capi (nor of a tool in \
                         OTHER_TOOLS)",
                        doc.name,
                        i + 1
                    ));
                }
            }
        }
        // Where the binary is run, its flags are the subcommand's.
        for unit in units(&doc) {
            let texts: Vec<&str> = if unit.code {
                vec![unit.text.as_str()]
            } else {
                code_spans(&unit.text)
            };
            for text in texts {
                for (path, flags) in invocations_of_the_cli(text, &commands) {
                    for flag in flags {
                        if !commands[&path].contains(&flag) {
                            problems.push(format!(
                                "{}:{}: `karpenter-capi {path}` has no {flag}",
                                doc.name, unit.line
                            ));
                        }
                    }
                }
            }
        }
    }
    // The README's configuration table: `run` flags and their environment twins.
    // Each `run` flag with its environment twin: clap's `env`, or else a variable its help
    // names as the default (`--kubeconfig`: KUBECONFIG, read by the kube client).
    let run: BTreeMap<String, (Option<String>, String)> = {
        let mut cmd = Cli::command();
        cmd.build();
        cmd.find_subcommand("run")
            .expect("a run subcommand")
            .get_arguments()
            .filter_map(|a| {
                Some((
                    format!("--{}", a.get_long()?),
                    (
                        a.get_env().map(|e| e.to_string_lossy().into_owned()),
                        a.get_help().map(|h| h.to_string()).unwrap_or_default(),
                    ),
                ))
            })
            .collect()
    };
    let mut rows = 0;
    for (i, line) in read("README.md").lines().enumerate() {
        if !line.starts_with("| `--") {
            continue;
        }
        rows += 1;
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let flags: Vec<&str> = code_spans(cells[1]).into_iter().collect();
        let envs: Vec<&str> = code_spans(cells.get(2).copied().unwrap_or_default());
        for (j, flag) in flags.iter().enumerate() {
            match run.get(*flag) {
                None => problems.push(format!(
                    "README.md:{}: the configuration table lists {flag}, which `run` does not take",
                    i + 1
                )),
                Some((env, help)) => {
                    if let Some(stated) = envs.get(j)
                        && env.as_deref() != Some(*stated)
                        && !(env.is_none() && has_word(help, stated))
                    {
                        problems.push(format!(
                            "README.md:{}: {flag}'s environment twin is {env:?}, not {stated}",
                            i + 1
                        ));
                    }
                }
            }
        }
    }
    assert!(rows > 20, "the README's configuration table was not found");
    report("flags", &problems);
}

// ---------------------------------------------------------------------------------------------
// (d) RBAC: docs/deploy.md's tables against the chart
// ---------------------------------------------------------------------------------------------

/// One permission: API group (`""` for core), resource (or `*suffix`), verb, and whether it is
/// limited to named objects (`resourceNames`).
type Grant = (String, String, String, bool);

/// A Helm template read as tests/deploy reads the chart (`chart::stripped_docs`); the Lease's
/// name is kept as a placeholder, so that its rule keeps its `resourceNames`.
fn stripped_template(file: &str) -> Value {
    let text = read(&format!("{CHART}/templates/{file}"))
        .replace("{{ .Values.leaderElection.name | quote }}", "\"the-lease\"");
    let docs = stripped_docs(&text, &format!("templates/{file} (stripped)"));
    match docs.len() {
        1 => docs.into_iter().next().unwrap_or_default(),
        _ => Value::Array(docs),
    }
}

fn grants_of_rules(rules: &Value) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in rules.as_array().expect("a list of rules") {
        let named = rule.get("resourceNames").is_some();
        for g in strings(&rule["apiGroups"]) {
            for r in strings(&rule["resources"]) {
                for v in strings(&rule["verbs"]) {
                    out.insert((g.clone(), r.clone(), v, named));
                }
            }
        }
    }
    out
}

/// What the chart grants, by docs/deploy.md's table heading.
fn chart_grants() -> BTreeMap<&'static str, BTreeSet<Grant>> {
    // Every template with rules is one of these (a new one must be added here and to the docs).
    let known = [
        "_rules-workload.tpl",
        "_rules-karpenter.tpl",
        "_rules-cluster-api.tpl",
        "role-leader-election.yaml",
        "fleet-rbac.yaml",
    ];
    let includes = [
        "clusterrole.yaml",
        "workload-cluster-rbac.yaml",
        "clusterrole-cluster-api.yaml",
    ];
    for entry in std::fs::read_dir(Path::new(ROOT).join(CHART).join("templates"))
        .expect("listing the chart's templates")
        .filter_map(|e| e.ok())
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        // A PrometheusRule's `rules:` are alerts, not RBAC.
        let rbac = !text.contains("kind: PrometheusRule");
        let has_rules = rbac
            && (text.lines().any(|l| l.trim_start().starts_with("rules:"))
                || text.contains("apiGroups:"));
        if has_rules && !known.contains(&name.as_str()) {
            let helper = text.contains("include \"karpenter-capi.workloadRules\"")
                || text.contains("include \"karpenter-capi.clusterAPIRules\"");
            assert!(
                helper && includes.contains(&name.as_str()),
                "templates/{name} grants rules tests/docs_claims.rs does not read"
            );
        }
    }
    let mut cluster_api = grants_of_rules(&stripped_template("_rules-cluster-api.tpl"));
    // The infrastructure rules come from values, one `get` rule per entry, and with
    // generate.enabled one more for its `*machinetemplates` kinds (create, delete, list).
    let values: Value =
        serde_saphyr::from_str(&read(&format!("{CHART}/values.yaml"))).expect("values.yaml");
    for t in values["rbac"]["clusterAPI"]["infrastructureTemplates"]
        .as_array()
        .expect("values rbac.clusterAPI.infrastructureTemplates")
    {
        for r in strings(&t["resources"]) {
            let group = t["group"].as_str().unwrap_or_default().to_string();
            if r.ends_with("machinetemplates") {
                for v in ["create", "delete", "list"] {
                    cluster_api.insert((group.clone(), r.clone(), v.into(), false));
                }
            }
            cluster_api.insert((group, r, "get".into(), false));
        }
    }
    let lease = stripped_template("role-leader-election.yaml");
    let role = lease
        .as_array()
        .into_iter()
        .flatten()
        .chain(std::iter::once(&lease))
        .find(|d| d["kind"] == "Role")
        .expect("role-leader-election.yaml has a Role");
    // The role's kind is a template expression (stripped): the document with rules.
    let fleet = stripped_template("fleet-rbac.yaml")
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d.get("rules").is_some())
        .map(|d| grants_of_rules(&d["rules"]))
        .expect("fleet-rbac.yaml has a role with rules");
    // Karpenter's kinds: in the workload rules by default (the workload table lists them), in
    // their own management-cluster ClusterRole with karpenterObjects=management.
    let karpenter = grants_of_rules(&stripped_template("_rules-karpenter.tpl"));
    let mut workload = grants_of_rules(&stripped_template("_rules-workload.tpl"));
    workload.extend(karpenter.iter().cloned());
    BTreeMap::from([
        ("Workload cluster", workload),
        ("Karpenter's objects in the management layout", karpenter),
        ("Leader election", grants_of_rules(&role["rules"])),
        ("Cluster API objects", cluster_api),
        ("Fleet topology", fleet),
    ])
}

/// docs/deploy.md's RBAC tables, by the `###` heading above each, with the line of each grant.
fn documented_grants(text: &str) -> BTreeMap<String, BTreeMap<Grant, usize>> {
    let mut out: BTreeMap<String, BTreeMap<Grant, usize>> = BTreeMap::new();
    let mut section = false;
    let mut heading = String::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("## ") {
            section = line == "## RBAC";
            continue;
        }
        if !section {
            continue;
        }
        if let Some(h) = line.strip_prefix("### ") {
            heading = h.trim().to_string();
            continue;
        }
        if !line.starts_with("| ") || line.starts_with("| API group") {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 5 {
            continue;
        }
        let group = match cells[1] {
            "core" => String::new(),
            g => g.trim_matches('`').to_string(),
        };
        let named = cells[4].contains("`resourceNames`");
        let grants = out.entry(heading.clone()).or_default();
        for r in cells[2].split(',').map(|r| r.trim().trim_matches('`')) {
            for v in cells[3].split(',').map(str::trim) {
                grants.insert((group.clone(), r.to_string(), v.to_string(), named), i + 1);
            }
        }
    }
    out
}

#[test]
fn deploy_md_lists_exactly_the_rbac_the_chart_grants() {
    let doc = read("docs/deploy.md");
    let documented = documented_grants(&doc);
    let mut problems = Vec::new();
    for (heading, granted) in chart_grants() {
        let Some(listed) = documented.get(heading) else {
            problems.push(format!(
                "docs/deploy.md: no table under \"### {heading}\" in \"## RBAC\""
            ));
            continue;
        };
        // A documented `*suffix` stands for the chart's resources of that group ending in it.
        let patterns: Vec<&Grant> = listed.keys().filter(|g| g.1.starts_with('*')).collect();
        let as_documented = |g: &Grant| -> Grant {
            patterns
                .iter()
                .find(|p| p.0 == g.0 && p.2 == g.2 && p.3 == g.3 && g.1.ends_with(&p.1[1..]))
                .map_or_else(|| g.clone(), |p| (*p).clone())
        };
        let granted: BTreeSet<Grant> = granted.iter().map(as_documented).collect();
        let show = |g: &Grant| {
            let group = if g.0.is_empty() { "core" } else { &g.0 };
            let named = if g.3 { " (resourceNames)" } else { "" };
            format!("{group} {} {}{named}", g.1, g.2)
        };
        for g in &granted {
            if !listed.contains_key(g) {
                problems.push(format!(
                    "docs/deploy.md, \"{heading}\": the chart grants {}, the table does not say so",
                    show(g)
                ));
            }
        }
        for (g, line) in listed {
            if !granted.contains(g) {
                problems.push(format!(
                    "docs/deploy.md:{line}: lists {}, which the chart does not grant",
                    show(g)
                ));
            }
        }
    }
    report("RBAC", &problems);
}

// ---------------------------------------------------------------------------------------------
// (e) no paths of a developer's machine
// ---------------------------------------------------------------------------------------------

/// Absolute paths that exist only on some machine. A line that shows one on purpose says
/// `example path` (in a shell comment, or an HTML comment in prose).
const MACHINE_PATHS: &[&str] = &[
    "/work/",
    "/home/",
    "/root/",
    "/tmp/",
    "/Users/",
    "/var/folders/",
    "/private/var/",
];

#[test]
fn no_doc_names_a_path_of_a_developers_machine() {
    let mut problems = Vec::new();
    for doc in docs() {
        for (i, line) in doc.text.lines().enumerate() {
            if line.contains("example path") {
                continue;
            }
            for p in MACHINE_PATHS {
                let found = line.match_indices(p).any(|(at, _)| {
                    line[..at].chars().next_back().is_none_or(|c| {
                        c.is_whitespace() || matches!(c, '=' | '`' | '(' | '"' | '\'' | ':' | '[')
                    })
                });
                if found {
                    problems.push(format!(
                        "{}:{}: an absolute path of a machine ({p}...): {}",
                        doc.name,
                        i + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    report("machine paths", &problems);
}

// ---------------------------------------------------------------------------------------------
// (f) the version
// ---------------------------------------------------------------------------------------------

#[test]
fn the_changelog_and_the_chart_carry_the_crate_version() {
    let version = env!("CARGO_PKG_VERSION");
    let mut problems = Vec::new();
    let changelog = read("CHANGELOG.md");
    if !changelog
        .lines()
        .any(|l| l.starts_with(&format!("## [{version}]")))
    {
        problems.push(format!("CHANGELOG.md has no section \"## [{version}]\""));
    }
    let chart: Value =
        serde_saphyr::from_str(&read(&format!("{CHART}/Chart.yaml"))).expect("Chart.yaml");
    for key in ["version", "appVersion"] {
        if chart[key].as_str() != Some(version) {
            problems.push(format!(
                "{CHART}/Chart.yaml: {key} is {}, Cargo.toml's version {version}",
                chart[key]
            ));
        }
    }
    report("version", &problems);
}
