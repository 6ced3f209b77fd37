//! Server-side table output (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), which
//! `kubectl get` asks for: the columns a real cluster prints. Custom resources get their CRD's
//! `additionalPrinterColumns` (the project's own CRDs from [`crate::project_crds`]; Cluster API's
//! after its CRDs), Pods, Nodes, Events and Leases the columns of kube-apiserver's printers,
//! every other kind Name and Age.

use serde_json::{Value, json};

use super::registry::ResourceDef;

/// What a table row carries besides its cells (`includeObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Include {
    None,
    Metadata,
    Object,
}

/// Whether a request asked for a Table, and with which objects: `None` for plain JSON.
pub fn requested(accept: Option<&str>, include_object: Option<&str>) -> Option<Include> {
    let wants = accept.is_some_and(|a| {
        a.split(',').any(|part| {
            let params: Vec<&str> = part.split(';').map(str::trim).collect();
            params.contains(&"as=Table") && params.contains(&"g=meta.k8s.io")
        })
    });
    wants.then_some(match include_object {
        Some("None") => Include::None,
        Some("Object") => Include::Object,
        _ => Include::Metadata,
    })
}

/// How a column's cell is computed.
enum Cell {
    /// A JSONPath as in `additionalPrinterColumns` (with `date` columns shown as an age).
    Path {
        path: String,
        date: bool,
    },
    Name,
    PodReady,
    PodStatus,
    Restarts,
    NodeStatus,
    NodeRoles,
    NodeAddress(&'static str),
    EventObject,
}

struct Column {
    name: String,
    kind: &'static str,
    priority: i64,
    cell: Cell,
}

/// A column of a built-in printer: every cell a string (ages included, as kube's printers do).
fn col(name: &str, priority: i64, cell: Cell) -> Column {
    Column {
        name: name.to_string(),
        kind: "string",
        priority,
        cell,
    }
}

fn path(p: &str) -> Cell {
    Cell::Path {
        path: p.to_string(),
        date: false,
    }
}

fn age() -> Cell {
    Cell::Path {
        path: ".metadata.creationTimestamp".to_string(),
        date: true,
    }
}

/// The columns of `def` at `version`, Name first.
fn columns(def: &ResourceDef, version: &str) -> Vec<Column> {
    let mut cols = vec![col("Name", 0, Cell::Name)];
    let builtin = |g: &str, plural: &str| def.builtin && def.group == g && def.plural == plural;
    if builtin("", "pods") {
        cols.extend([
            col("Ready", 0, Cell::PodReady),
            col("Status", 0, Cell::PodStatus),
            col("Restarts", 0, Cell::Restarts),
            col("Age", 0, age()),
            col("IP", 1, path(".status.podIP")),
            col("Node", 1, path(".spec.nodeName")),
            col("Nominated Node", 1, path(".status.nominatedNodeName")),
        ]);
    } else if builtin("", "nodes") {
        cols.extend([
            col("Status", 0, Cell::NodeStatus),
            col("Roles", 0, Cell::NodeRoles),
            col("Age", 0, age()),
            col("Version", 0, path(".status.nodeInfo.kubeletVersion")),
            col("Internal-IP", 1, Cell::NodeAddress("InternalIP")),
            col("External-IP", 1, Cell::NodeAddress("ExternalIP")),
            col("OS-Image", 1, path(".status.nodeInfo.osImage")),
            col("Kernel-Version", 1, path(".status.nodeInfo.kernelVersion")),
            col(
                "Container-Runtime",
                1,
                path(".status.nodeInfo.containerRuntimeVersion"),
            ),
        ]);
    } else if def.plural == "events" && def.builtin {
        // kubectl's events table: no Name column by default.
        let note = if def.group.is_empty() {
            ".message"
        } else {
            ".note"
        };
        cols = vec![
            col("Last Seen", 0, age()),
            col("Type", 0, path(".type")),
            col("Reason", 0, path(".reason")),
            col("Object", 0, Cell::EventObject),
            col("Message", 0, path(note)),
            col("Name", 1, Cell::Name),
        ];
    } else if builtin("coordination.k8s.io", "leases") {
        cols.extend([
            col("Holder", 0, path(".spec.holderIdentity")),
            col("Age", 0, age()),
        ]);
    } else if !def.builtin {
        cols.extend(custom_columns(def, version));
    } else {
        cols.push(col("Age", 0, age()));
    }
    cols
}

/// A custom resource's printer columns: the project's CRDs, Cluster API's main kinds, else Age
/// (what apiextensions-apiserver prints for a CRD without any).
fn custom_columns(def: &ResourceDef, version: &str) -> Vec<Column> {
    // Unparsable CRD files fail every registry before a table is asked for.
    let own = crate::project_crds::all()
        .unwrap_or_default()
        .into_iter()
        .find(|crd| crd.spec.group == def.group && crd.spec.names.plural == def.plural);
    if let Some(crd) = own {
        let printer = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == version)
            .and_then(|v| v.additional_printer_columns.clone())
            .unwrap_or_default();
        if !printer.is_empty() {
            return printer
                .into_iter()
                .map(|c| Column {
                    name: c.name,
                    kind: if c.type_ == "integer" {
                        "integer"
                    } else {
                        "string"
                    },
                    priority: i64::from(c.priority.unwrap_or(0)),
                    cell: Cell::Path {
                        path: c.json_path,
                        date: c.type_ == "date",
                    },
                })
                .collect();
        }
    }
    let cluster = || col("Cluster", 0, path(".spec.clusterName"));
    match (def.group.as_str(), def.plural.as_str()) {
        ("cluster.x-k8s.io", "machinedeployments" | "machinesets") => vec![
            cluster(),
            col("Desired", 0, path(".spec.replicas")),
            col("Current", 0, path(".status.replicas")),
            col("Ready", 0, path(".status.readyReplicas")),
            col("Available", 0, path(".status.availableReplicas")),
            col("Age", 0, age()),
            col("Version", 0, path(".spec.template.spec.version")),
        ],
        ("cluster.x-k8s.io", "machines") => vec![
            cluster(),
            col("Node Name", 0, path(".status.nodeRef.name")),
            col("Provider ID", 0, path(".spec.providerID")),
            col("Phase", 0, path(".status.phase")),
            col("Age", 0, age()),
            col("Version", 0, path(".spec.version")),
        ],
        _ => vec![col("Age", 0, age())],
    }
}

/// A metav1 Table of `objects` (already rendered for `def` at `version`), with its column
/// definitions (watch events carry them too: kubectl prints the header once, while they stay the
/// same). `list_meta` is the list's metadata (resourceVersion, continue).
pub fn render(
    def: &ResourceDef,
    version: &str,
    objects: &[Value],
    include: Include,
    list_meta: Value,
) -> Value {
    let cols = columns(def, version);
    let now = jiff::Timestamp::now();
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let cells: Vec<Value> = cols.iter().map(|c| cell(&c.cell, obj, now)).collect();
            let mut row = json!({"cells": cells});
            match include {
                Include::None => {}
                Include::Object => row["object"] = obj.clone(),
                Include::Metadata => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj.get("metadata").cloned().unwrap_or(Value::Null),
                    });
                }
            }
            row
        })
        .collect();
    let definitions: Vec<Value> = cols
        .iter()
        .map(|c| {
            let format = if matches!(c.cell, Cell::Name) {
                "name"
            } else {
                ""
            };
            json!({"name": c.name, "type": c.kind, "format": format,
                   "description": "", "priority": c.priority})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

fn cell(c: &Cell, obj: &Value, now: jiff::Timestamp) -> Value {
    let s = |v: &str| Value::String(v.to_string());
    match c {
        Cell::Name => obj
            .pointer("/metadata/name")
            .cloned()
            .unwrap_or_else(|| s("")),
        Cell::Path { path, date: true } => {
            let when = json_path(obj, path)
                .and_then(|v| v.as_str().map(String::from))
                .and_then(|t| t.parse::<jiff::Timestamp>().ok());
            s(&when.map_or("<unknown>".to_string(), |t| human_duration(now, t)))
        }
        Cell::Path { path, date: false } => match json_path(obj, path) {
            Some(Value::String(v)) => s(&v),
            // kubectl prints a missing value as <none>.
            Some(Value::Null) | None => s("<none>"),
            Some(v) => v,
        },
        Cell::PodReady => {
            let total = obj
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            // The kubelet stand-in publishes the pod's Ready condition, not container statuses.
            let ready = match obj
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
            {
                Some(cs) => cs
                    .iter()
                    .filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true))
                    .count(),
                None if condition(obj, "Ready") == Some("True") => total,
                None => 0,
            };
            s(&format!("{ready}/{total}"))
        }
        Cell::PodStatus => {
            let phase = obj
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("Unknown");
            let deleting = obj.pointer("/metadata/deletionTimestamp").is_some();
            s(if deleting { "Terminating" } else { phase })
        }
        Cell::Restarts => json!(0),
        Cell::NodeStatus => {
            let ready = condition(obj, "Ready").unwrap_or("Unknown");
            let mut status = match ready {
                "True" => "Ready".to_string(),
                _ => "NotReady".to_string(),
            };
            if obj.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
                status.push_str(",SchedulingDisabled");
            }
            s(&status)
        }
        Cell::NodeRoles => {
            let roles: Vec<&str> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|l| {
                    l.keys()
                        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                        .collect()
                })
                .unwrap_or_default();
            s(&if roles.is_empty() {
                "<none>".to_string()
            } else {
                roles.join(",")
            })
        }
        Cell::NodeAddress(kind) => {
            let addr = obj
                .pointer("/status/addresses")
                .and_then(Value::as_array)
                .and_then(|a| {
                    a.iter()
                        .find(|x| x.get("type").and_then(Value::as_str) == Some(kind))
                })
                .and_then(|x| x.get("address"))
                .and_then(Value::as_str)
                .unwrap_or("<none>");
            s(addr)
        }
        Cell::EventObject => {
            let target = obj.get("involvedObject").or_else(|| obj.get("regarding"));
            let field = |f: &str| {
                target
                    .and_then(|t| t.get(f))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            s(&format!(
                "{}/{}",
                field("kind").to_lowercase(),
                field("name")
            ))
        }
    }
}

fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a str> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))?
        .get("status")?
        .as_str()
}

/// The subset of JSONPath that printer columns use: `.a.b` (with `\.` inside a key), `[n]`,
/// and `[?(@.key=="value")]` (the first match).
fn json_path(obj: &Value, path: &str) -> Option<Value> {
    let mut cur = obj.clone();
    for seg in split_path(path.trim_start_matches('{').trim_end_matches('}')) {
        let (key, filters) = match seg.find('[') {
            Some(i) => (&seg[..i], &seg[i..]),
            None => (seg.as_str(), ""),
        };
        if !key.is_empty() {
            cur = cur.get(key)?.clone();
        }
        for filter in filters.split_inclusive(']').filter(|f| !f.is_empty()) {
            let inner = filter.trim_start_matches('[').trim_end_matches(']');
            cur = match inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                Some(cond) => {
                    let (field, want) = cond.split_once("==")?;
                    let want = want.trim().trim_matches('"').trim_matches('\'');
                    cur.as_array()?
                        .iter()
                        .find(|x| x.get(field.trim()).and_then(Value::as_str) == Some(want))?
                        .clone()
                }
                None => cur.get(inner.parse::<usize>().ok()?)?.clone(),
            };
        }
    }
    Some(cur)
}

/// Splits `.a.b\.c[0].d` into `a`, `b.c[0]`, `d`.
fn split_path(path: &str) -> Vec<String> {
    let mut segs = Vec::new();
    let mut cur = String::new();
    let mut chars = path.chars().peekable();
    let mut depth = 0;
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'.') => {
                cur.push('.');
                chars.next();
            }
            '[' => {
                depth += 1;
                cur.push(c);
            }
            ']' => {
                depth -= 1;
                cur.push(c);
            }
            '.' if depth == 0 => {
                if !cur.is_empty() {
                    segs.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        segs.push(cur);
    }
    segs
}

/// kube's `duration.HumanDuration` of `now - then`.
fn human_duration(now: jiff::Timestamp, then: jiff::Timestamp) -> String {
    let secs = now.as_second() - then.as_second();
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{days}d")
        } else {
            format!("{days}d{h}h")
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        let d = days % 365;
        return if d == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{d}d")
        };
    }
    format!("{years}y")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_handles_escapes_indices_and_filters() {
        let obj = json!({
            "metadata": {"labels": {"node.kubernetes.io/instance-type": "m4"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "list": [1, 2]}
        });
        assert_eq!(
            json_path(&obj, r".metadata.labels.node\.kubernetes\.io/instance-type"),
            Some(json!("m4"))
        );
        assert_eq!(
            json_path(&obj, r#".status.conditions[?(@.type=="Ready")].status"#),
            Some(json!("True"))
        );
        assert_eq!(json_path(&obj, ".status.list[1]"), Some(json!(2)));
        assert_eq!(json_path(&obj, ".status.missing"), None);
    }

    #[test]
    fn human_durations_match_kube() {
        let t = |s: i64| jiff::Timestamp::from_second(s).unwrap();
        let now = t(1_000_000);
        for (ago, want) in [
            (5, "5s"),
            (119, "119s"),
            (150, "2m30s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (10 * 3600, "10h"),
            (3 * 86400 + 3600, "3d1h"),
            (30 * 86400, "30d"),
        ] {
            assert_eq!(human_duration(now, t(1_000_000 - ago)), want, "{ago}");
        }
    }

    #[test]
    fn table_is_asked_for_by_kubectls_accept_header() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(requested(Some(kubectl), None), Some(Include::Metadata));
        assert_eq!(requested(Some("application/json"), None), None);
        assert_eq!(requested(None, Some("Object")), None);
    }
}
