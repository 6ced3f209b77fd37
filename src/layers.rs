//! The crate's import graph, checked: no circle between sibling modules at any depth, the
//! top-level modules in layers that only import downwards, and one module file style. The
//! stand-ins' crate (crates/standins) is held to the circle and file-style rules too.
//!
//! Reads every file under `src/` as text: `use` trees and inline `crate::`/`super::`/`self::`
//! paths (comments, strings and `#[cfg(test)]` modules left out), each resolved to the deepest
//! module it names. An import of `a::b::x` by `a::c::y` is an arrow `b -> c` between the siblings
//! under `a`; imports between a module and its own ancestors or descendants are not arrows (a
//! parent re-exporting its children is how Rust modules work).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level modules from the bottom up: a module imports only from layers below its own.
/// A new top-level module has to be placed here.
const LAYERS: &[&[&str]] = &[
    // Karpenter's API types and pure rules.
    &["api"],
    // Pure bin-packing.
    &["scheduling"],
    // The Cluster API model, the command line, metrics and small leaf services.
    &[
        "capi",
        "cli",
        "metrics",
        "ratelimit",
        "write_gate",
        "shadow",
        "leader",
        "kubeconfig_watch",
        "thread_cache",
        "logging",
    ],
    // Indexes fed by watches; the HTTP endpoints; the clients' retries on `Retry-After`.
    &["state", "http", "retry_after"],
    // Pure disruption decisions over the indexes.
    &["disruption"],
    // Read-side projections of the indexes, shared by the actors and the tools.
    &["view"],
    // Behaviour.
    &["actors"],
    // Wiring the controller together.
    &["app"],
    // Read-only tools. The stand-ins (`sim`, `controlplane`) are no longer layers here: they
    // are their own crate (crates/standins), which cannot import this one, so the compiler
    // enforces what their layers did; this crate re-exports them.
    &["explain"],
    // What drives them: `init`, and `simulate` (the simulated cluster with a controller).
    &["init", "simulate"],
    // Builders for tests and benches, over everything.
    &["testing"],
];

/// Arrows between siblings that close a circle and are being taken apart elsewhere; each entry
/// goes when its arrow does (the test fails on an entry whose arrow is gone, so the list only
/// shrinks).
const ALLOWED: &[(&str, &str)] = &[];

type Module = Vec<String>;

fn name(m: &[String]) -> String {
    if m.is_empty() {
        "crate".to_string()
    } else {
        m.join("::")
    }
}

/// Every module of the crate by path, with its source text (code only).
fn modules(src: &Path) -> BTreeMap<Module, String> {
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut out = BTreeMap::new();
    for file in files {
        let Ok(rel) = file.strip_prefix(src) else {
            continue;
        };
        let mut parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        match parts.last().map(String::as_str) {
            Some("main") if parts.len() == 1 => continue,
            Some("lib") if parts.len() == 1 => parts.clear(),
            Some("mod") => {
                parts.pop();
            }
            _ => {}
        }
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => panic!("reading {}: {e}", file.display()),
        };
        out.insert(parts, code_only(&text));
    }
    // Modules declared only for tests (`#[cfg(test)] mod x;`) are left out with their children.
    let test_only: Vec<Module> = out
        .iter()
        .flat_map(|(m, text)| {
            test_children(text).into_iter().map(move |c| {
                let mut child = m.clone();
                child.push(c);
                child
            })
        })
        .collect();
    out.retain(|m, _| !test_only.iter().any(|t| m.starts_with(t)));
    for text in out.values_mut() {
        *text = without_test_blocks(text);
    }
    out
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => panic!("reading {}: {e}", dir.display()),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `text` with comments, string and character literals blanked out, so that only code is left
/// to look for paths in.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        if ch(&c, i) == '/' && ch(&c, i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch(&c, i) == '/' && ch(&c, i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if ch(&c, i) == '/' && ch(&c, i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if ch(&c, i) == '*' && ch(&c, i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if ch(&c, i) == 'r'
            && (ch(&c, i + 1) == '"'
                || (ch(&c, i + 1) == '#' && (ch(&c, i + 2) == '"' || ch(&c, i + 2) == '#')))
            && !c
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"..." or r#"..."#.
            let mut hashes = 0;
            i += 1;
            while ch(&c, i) == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            while i < c.len() {
                if ch(&c, i) == '"' && (1..=hashes).all(|k| ch(&c, i + k) == '#') {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            out.push_str("\"\"");
        } else if ch(&c, i) == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if ch(&c, i) == '\'' && (ch(&c, i + 1) == '\\' || ch(&c, i + 2) == '\'') {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime.
            i += 1;
            while i < c.len() && c[i] != '\'' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The character at `i`, or NUL past the end.
fn ch(c: &[char], i: usize) -> char {
    c.get(i).copied().unwrap_or('\0')
}

/// The names of the child modules `text` declares for tests only (`#[cfg(test)] mod x;`).
fn test_children(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        rest = &rest[at + "#[cfg(test)]".len()..];
        let item = rest.trim_start();
        let item = item.strip_prefix("pub ").unwrap_or(item);
        if let Some(decl) = item.strip_prefix("mod ") {
            let name: String = decl
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if decl[name.len()..].trim_start().starts_with(';') {
                out.push(name);
            }
        }
    }
    out
}

/// `text` without its inline `#[cfg(test)] mod x { ... }` blocks.
fn without_test_blocks(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        let after = &rest[at + "#[cfg(test)]".len()..];
        let item = after.trim_start();
        let is_block = item.starts_with("mod ")
            && item
                .find(['{', ';'])
                .is_some_and(|k| item.as_bytes().get(k) == Some(&b'{'));
        if !is_block {
            out.push_str(&rest[..at + "#[cfg(test)]".len()]);
            rest = after;
            continue;
        }
        out.push_str(&rest[..at]);
        let open = at + (rest.len() - at - item.len()) + item.find('{').unwrap_or(0);
        let mut depth = 0usize;
        let mut end = rest.len();
        for (k, ch) in rest[open..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The full paths a `use` tree names (`a::{b, c::{d, e}}` gives `a::b`, `a::c::d`, `a::c::e`).
fn use_paths(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{').filter(|_| tree.ends_with('}')) {
        let head = tree[..open].trim().trim_end_matches("::");
        let prefix = match (prefix.is_empty(), head.is_empty()) {
            (_, true) => prefix.to_string(),
            (true, false) => head.to_string(),
            (false, false) => format!("{prefix}::{head}"),
        };
        let inner = &tree[open + 1..tree.len() - 1];
        let mut depth = 0;
        let mut start = 0;
        for (k, ch) in inner.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    use_paths(&inner[start..k], &prefix, out);
                    start = k + 1;
                }
                _ => {}
            }
        }
        use_paths(&inner[start..], &prefix, out);
        return;
    }
    if tree.is_empty() {
        return;
    }
    let path = tree.split(" as ").next().unwrap_or(tree).trim();
    out.push(if prefix.is_empty() {
        path.to_string()
    } else {
        format!("{prefix}::{path}")
    });
}

/// Every path in `code` that starts at `crate`, `super` or `self`.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut k = 0;
    while k < code.len() {
        let boundary = k == 0 || !(is_ident(bytes[k - 1]) || bytes[k - 1] == b':');
        let rest = &code[k..];
        if boundary && rest.starts_with("use") && rest[3..].starts_with(char::is_whitespace) {
            let end = rest.find(';').unwrap_or(rest.len());
            use_paths(&rest[3..end], "", &mut out);
            k += end.max(1);
            continue;
        }
        if boundary
            && ["crate::", "super::", "self::"]
                .iter()
                .any(|p| rest.starts_with(p))
        {
            let len = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            out.push(rest[..len].trim_end_matches(':').to_string());
            k += len.max(1);
            continue;
        }
        k += rest.chars().next().map_or(1, char::len_utf8);
    }
    out
}

/// The deepest module `path`, written in module `from`, names; `None` for paths outside the
/// crate.
fn resolve(from: &[String], path: &str, modules: &BTreeMap<Module, String>) -> Option<Module> {
    let mut segs = path.split("::").map(str::trim).filter(|s| !s.is_empty());
    let mut cur: Module = match segs.next()? {
        "crate" => Vec::new(),
        "self" => from.to_vec(),
        "super" => from.get(..from.len().checked_sub(1)?)?.to_vec(),
        _ => return None,
    };
    let mut segs = segs.peekable();
    while segs.peek() == Some(&"super") {
        segs.next();
        cur.pop();
    }
    for s in segs {
        cur.push(s.to_string());
        if !modules.contains_key(&cur) {
            cur.pop();
            break;
        }
    }
    Some(cur)
}

/// Arrows between siblings, by their parent: `(parent, from, to)` with `from` and `to` the
/// full paths of the two siblings.
fn sibling_arrows(modules: &BTreeMap<Module, String>) -> BTreeSet<(Module, Module, Module)> {
    let mut out = BTreeSet::new();
    for (m, code) in modules {
        for p in paths(code) {
            let Some(to) = resolve(m, &p, modules) else {
                continue;
            };
            if m.starts_with(&to) || to.starts_with(m) {
                continue;
            }
            let common = m.iter().zip(&to).take_while(|(a, b)| a == b).count();
            out.insert((
                m[..common].to_vec(),
                m[..=common].to_vec(),
                to[..=common].to_vec(),
            ));
        }
    }
    out
}

/// Circles among the arrows (Tarjan's strongly connected components of two or more).
fn circles(arrows: &BTreeSet<(Module, Module)>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        arrows: &'a BTreeSet<(Module, Module)>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for (_, w) in self.arrows.iter().filter(|(a, _)| a == v) {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.entry(v).or_default();
                    *lv = (*lv).min(lw);
                } else if self.stack.contains(&w) {
                    let iw = self.index[w];
                    let lv = self.low.entry(v).or_default();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    comp.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.found.push(comp);
                }
            }
        }
    }
    let mut walk = Walk {
        arrows,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for (a, _) in arrows {
        if !walk.index.contains_key(a) {
            walk.visit(a);
        }
    }
    walk.found
}

fn crate_modules() -> BTreeMap<Module, String> {
    modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

#[test]
fn no_circle_between_sibling_modules() {
    assert_no_circle(&crate_modules(), ALLOWED);
}

/// The stand-ins' crate (crates/standins) by the same rule: its own circles, since the crate
/// boundary only keeps it from importing this one.
#[test]
fn no_circle_between_sibling_modules_of_the_stand_ins() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/standins/src");
    assert_no_circle(&modules(&src), &[]);
}

fn assert_no_circle(modules: &BTreeMap<Module, String>, allowed: &[(&str, &str)]) {
    let arrows = sibling_arrows(modules);
    let allowed: BTreeSet<(String, String)> = allowed
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let present: BTreeSet<(String, String)> =
        arrows.iter().map(|(_, a, b)| (name(a), name(b))).collect();
    let stale: Vec<_> = allowed.difference(&present).collect();
    assert!(
        stale.is_empty(),
        "allowed arrows that no longer exist (remove them from ALLOWED): {stale:?}"
    );
    let checked: BTreeSet<(Module, Module)> = arrows
        .into_iter()
        .filter(|(_, a, b)| !allowed.contains(&(name(a), name(b))))
        .map(|(_, a, b)| (a, b))
        .collect();
    let found: Vec<Vec<String>> = circles(&checked)
        .into_iter()
        .map(|c| c.iter().map(|m| name(m)).collect())
        .collect();
    assert!(
        found.is_empty(),
        "import circles between sibling modules: {found:?}"
    );
}

/// One module style: a module with children is `foo.rs` beside `foo/`, never `foo/mod.rs`, so
/// a file's path names its module and a newcomer meets one convention.
#[test]
fn modules_with_children_are_named_files_not_mod_rs() {
    let mut files = Vec::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    walk(&root.join("src"), &mut files);
    walk(&root.join("crates/standins/src"), &mut files);
    let mod_rs: Vec<_> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n == "mod.rs"))
        .collect();
    assert!(
        mod_rs.is_empty(),
        "rename each to its directory's name plus .rs: {mod_rs:?}"
    );
}

#[test]
fn top_level_modules_import_only_downwards() {
    let modules = crate_modules();
    let layer = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
    let mut wrong = Vec::new();
    for m in modules.keys().filter(|m| m.len() == 1) {
        if layer(&m[0]).is_none() {
            wrong.push(format!("{} is in no layer: place it in LAYERS", m[0]));
        }
    }
    for (parent, from, to) in sibling_arrows(&modules) {
        if !parent.is_empty() {
            continue;
        }
        let (f, t) = (&from[0], &to[0]);
        if let (Some(lf), Some(lt)) = (layer(f), layer(t))
            && lt >= lf
        {
            wrong.push(format!("{f} imports {t}, which is not in a layer below it"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn reads_use_trees_and_inline_paths() {
    let code = code_only(
        "use super::{a::{B, c}, d as e};\n// use crate::not_this;\nlet s = \"crate::nor_this\";\nlet x = crate::f::g(y);\n",
    );
    assert_eq!(
        paths(&code),
        ["super::a::B", "super::a::c", "super::d", "crate::f::g"]
    );
}

/// The words of a watch stream (`kube::runtime::watcher`, a `StreamHandler` over its events)
/// that `code` uses as whole words (`capi_watcher` is not `watcher`).
fn watch_words(code: &str) -> Vec<&'static str> {
    const WATCH_WORDS: &[&str] = &["watcher", "StreamHandler", "WatchStreamExt", "add_stream"];
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    (WATCH_WORDS.iter().copied())
        .filter(|word| {
            code.match_indices(word).any(|(at, _)| {
                let before = code[..at].chars().next_back();
                let after = code[at + word.len()..].chars().next();
                !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
            })
        })
        .collect()
}

/// No actor holds a watch stream: every watch starts through `state::watch` and feeds its index
/// through `state::feed` (one re-list semantics and one set of metrics for all), and the actors
/// hear of changes from the feeds' callbacks. Test code is left out.
#[test]
fn no_actor_holds_a_watch_stream() {
    let found: Vec<String> = crate_modules()
        .iter()
        .filter(|(m, _)| m.first().is_some_and(|top| top == "actors"))
        .flat_map(|(m, code)| {
            watch_words(code)
                .into_iter()
                .map(move |w| format!("{} uses {w}", name(m)))
        })
        .collect();
    assert!(
        found.is_empty(),
        "feed the index through state::watch and state::feed instead: {found:?}"
    );
}

#[test]
fn finds_the_words_of_a_watch_stream() {
    let code = code_only(
        "use kube::runtime::{WatchStreamExt, watcher};\n// StreamHandler in a comment\nuse super::capi_watcher::X;\n",
    );
    assert_eq!(watch_words(&code), ["watcher", "WatchStreamExt"]);
    assert!(watch_words(&code_only("use super::capi_watcher::X;")).is_empty());
}
