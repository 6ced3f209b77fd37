//! core/v1 and events.k8s.io/v1 Events are one resource in kube-apiserver, served in two shapes.
//! Here they share one storage, kept in the events.k8s.io/v1 shape (what the controller writes);
//! core/v1 requests are converted on the way in and out, as upstream's
//! `pkg/apis/events/v1/conversion.go` does, so `kubectl describe` lists the controller's events.

use serde_json::{Value, json};

use super::registry::ResourceDef;

/// Renders a stored object for `def` at `version`: sets `apiVersion` and `kind` (all versions
/// share one storage) and gives core/v1 Events their shape.
pub fn stamp(obj: &mut Value, def: &ResourceDef, version: &str) {
    if is_core_event(def) {
        to_core(obj);
    }
    if let Some(o) = obj.as_object_mut() {
        o.insert("apiVersion".into(), json!(def.api_version(version)));
        o.insert("kind".into(), json!(def.kind));
    }
}

/// (core/v1 field, events.k8s.io/v1 field): the top-level fields whose names differ.
const RENAMES: [(&str, &str); 7] = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

/// Whether `def` is core/v1 Events, served from the events.k8s.io/v1 storage.
pub fn is_core_event(def: &ResourceDef) -> bool {
    def.builtin && def.group.is_empty() && def.plural == "events"
}

/// A stored (events.k8s.io/v1) Event in the core/v1 shape.
pub fn to_core(obj: &mut Value) {
    rename(obj, true);
}

/// A core/v1 Event in the stored (events.k8s.io/v1) shape.
pub fn to_stored(obj: &mut Value) {
    rename(obj, false);
}

fn rename(obj: &mut Value, to_core: bool) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    for (core, v1) in RENAMES {
        let (from, to) = if to_core { (v1, core) } else { (core, v1) };
        if let Some(v) = map.remove(from) {
            map.insert(to.to_string(), v);
        }
    }
}

/// Where a core/v1 field selector's field lives in the stored shape (`involvedObject.name` is
/// `regarding.name`, `source` is the reporting component).
pub fn stored_field(field: &str) -> String {
    if field == "source" {
        return "deprecatedSource.component".to_string();
    }
    let (head, rest) = field.split_once('.').unwrap_or((field, ""));
    let head = RENAMES
        .iter()
        .find(|(core, _)| *core == head)
        .map_or(head, |(_, v1)| v1);
    if rest.is_empty() {
        head.to_string()
    } else {
        format!("{head}.{rest}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_and_selector_fields() {
        let stored = json!({"regarding": {"name": "a"}, "note": "n", "reason": "R",
                            "reportingController": "c", "deprecatedCount": 2});
        let mut core = stored.clone();
        to_core(&mut core);
        assert_eq!(
            core,
            json!({"involvedObject": {"name": "a"}, "message": "n", "reason": "R",
                   "reportingComponent": "c", "count": 2})
        );
        to_stored(&mut core);
        assert_eq!(core, stored);
        assert_eq!(stored_field("involvedObject.uid"), "regarding.uid");
        assert_eq!(stored_field("reportingComponent"), "reportingController");
        assert_eq!(stored_field("source"), "deprecatedSource.component");
        assert_eq!(stored_field("type"), "type");
    }
}
