//! `metadata.managedFields` as kube-apiserver writes them on every create, update and patch
//! (server-side field tracking), so objects read from the simulated cluster weigh what they weigh
//! on a real one: a controller that keeps whole objects pays for them here too.
//!
//! What follows upstream (`k8s.io/apimachinery/pkg/util/managedfields/internal/fieldmanager.go`):
//! the manager is the `fieldManager` query parameter, else the User-Agent up to its first `/`;
//! a write's entry is keyed by manager, operation (`Update`: the simulated server has no
//! server-side apply) and subresource, and gains every field the write added or changed, which
//! other managers' entries lose; managedFields sent in a request replace the stored ones when
//! they hold entries, `[]` or `[{}]` resets them, anything else (absent, unreadable) keeps the
//! stored ones, and a subresource write always keeps the stored ones. Not modelled: the cap of
//! ten Update managers, and list items keyed the way each type's schema says (here a list of
//! objects with a `name` or `type` is keyed by it, `k:{"name":"x"}`, and any other list is one
//! field).

use std::cell::RefCell;

use serde_json::{Map, Value, json};

/// Who is writing, for the entry a write adds to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manager {
    pub name: String,
    pub subresource: String,
}

impl Manager {
    /// Whether `entry` is this manager's Update entry (entries are keyed by manager, operation
    /// and subresource).
    fn owns(&self, entry: &Value) -> bool {
        entry["manager"] == self.name.as_str()
            && entry["operation"] == "Update"
            && entry
                .get("subresource")
                .and_then(Value::as_str)
                .unwrap_or_default()
                == self.subresource
    }
}

thread_local! {
    /// The manager of the request being served on this thread. The HTTP layer's write is
    /// synchronous from taking the store's lock to the commit, so this names exactly the writes
    /// the request causes, without threading a parameter through every store operation.
    static CURRENT: RefCell<Option<Manager>> = const { RefCell::new(None) };
}

/// Writes made while the returned guard lives are `manager`'s.
pub fn writing_as(manager: Manager) -> Guard {
    let previous = CURRENT.with(|c| c.replace(Some(manager)));
    Guard { previous }
}

/// Restores the manager in effect before [`writing_as`].
pub struct Guard {
    previous: Option<Manager>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

/// The manager name kube-apiserver records: the `fieldManager` parameter, else the User-Agent's
/// first `/`-separated segment.
pub fn manager_name(field_manager: Option<&str>, user_agent: &str) -> String {
    match field_manager.filter(|m| !m.is_empty()) {
        Some(m) => m.to_string(),
        None => user_agent.split('/').next().unwrap_or_default().to_string(),
    }
}

/// Sets `new`'s managedFields for a write over `old` (None: a create) by the current manager;
/// writes with no manager in effect (the simulator's own bookkeeping: garbage collection, fault
/// injection) keep `old`'s.
pub fn track(old: Option<&Value>, new: &mut Value) {
    let Some(manager) = CURRENT.with(|c| c.borrow().clone()) else {
        let keep = old
            .and_then(|o| o.pointer("/metadata/managedFields"))
            .cloned();
        set_entries(
            new,
            keep.and_then(|k| k.as_array().cloned()).unwrap_or_default(),
        );
        return;
    };
    let mut entries = base_entries(old, new, &manager);
    let changed = changed_fields(old, new);
    if !changed.is_empty() {
        for e in entries.iter_mut() {
            if !manager.owns(e)
                && let Some(Value::Object(fields)) = e.get_mut("fieldsV1")
            {
                subtract(fields, &changed);
            }
        }
        entries.retain(|e| e["fieldsV1"].as_object().is_some_and(|f| !f.is_empty()));
        let api_version = new["apiVersion"].as_str().unwrap_or_default().to_string();
        let mine = entries.iter_mut().find(|e| manager.owns(e));
        let now = super::clock::now_rfc3339();
        match mine {
            Some(e) => {
                if let Some(Value::Object(fields)) = e.get_mut("fieldsV1") {
                    union(fields, changed);
                }
                e["time"] = json!(now);
                e["apiVersion"] = json!(api_version);
            }
            None => {
                let mut e = json!({
                    "manager": manager.name,
                    "operation": "Update",
                    "apiVersion": api_version,
                    "time": now,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": Value::Object(changed),
                });
                if !manager.subresource.is_empty() {
                    e["subresource"] = json!(manager.subresource);
                }
                entries.push(e);
            }
        }
    }
    set_entries(new, entries);
}

/// The entries a write starts from, as upstream's `decodeManagedFields` chooses them.
fn base_entries(old: Option<&Value>, new: &Value, manager: &Manager) -> Vec<Value> {
    let live = || {
        old.and_then(|o| o.pointer("/metadata/managedFields"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    if !manager.subresource.is_empty() {
        return live();
    }
    match new.pointer("/metadata/managedFields") {
        Some(Value::Array(sent)) if is_reset(sent) => Vec::new(),
        Some(Value::Array(sent)) if sent.iter().all(is_entry) => sent.clone(),
        _ => live(),
    }
}

/// `[]` or `[{}]`: the request asks to clear managedFields.
fn is_reset(sent: &[Value]) -> bool {
    match sent {
        [] => true,
        [only] => only.as_object().is_some_and(Map::is_empty),
        _ => false,
    }
}

/// An entry upstream can decode: a manager, an operation it knows and a field set.
fn is_entry(e: &Value) -> bool {
    e["manager"].is_string()
        && matches!(e["operation"].as_str(), Some("Update" | "Apply"))
        && e["fieldsV1"].is_object()
}

fn set_entries(obj: &mut Value, entries: Vec<Value>) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if entries.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(entries));
    }
}

/// Metadata the server owns, never tracked (upstream's `StripMetaManager`).
const SERVER_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "managedFields",
];

/// The fields `new` adds or changes over `old`, as a FieldsV1 set.
fn changed_fields(old: Option<&Value>, new: &Value) -> Map<String, Value> {
    let Some(new) = new.as_object() else {
        return Map::new();
    };
    let old = old.and_then(Value::as_object);
    let mut out = Map::new();
    for (k, v) in new {
        if k == "apiVersion" || k == "kind" {
            continue;
        }
        let before = old.and_then(|o| o.get(k));
        let set = if k == "metadata" {
            let mut meta = v.clone();
            if let Some(m) = meta.as_object_mut() {
                SERVER_META.iter().for_each(|f| {
                    m.remove(*f);
                });
            }
            let mut old_meta = before.cloned();
            if let Some(Some(m)) = old_meta.as_mut().map(Value::as_object_mut) {
                SERVER_META.iter().for_each(|f| {
                    m.remove(*f);
                });
            }
            diff(old_meta.as_ref(), &meta)
        } else {
            diff(before, v)
        };
        // Top-level fields are struct fields, which FieldsV1 marks by their children only.
        if let Some(Value::Object(mut set)) = set {
            set.remove(".");
            if !set.is_empty() {
                out.insert(format!("f:{k}"), Value::Object(set));
            }
        } else if let Some(leaf) = set {
            out.insert(format!("f:{k}"), leaf);
        }
    }
    out
}

/// The FieldsV1 node for one value written over `before`; None when unchanged.
fn diff(before: Option<&Value>, after: &Value) -> Option<Value> {
    if before == Some(after) {
        return None;
    }
    match after {
        Value::Object(fields) => {
            let old = before.and_then(Value::as_object);
            let mut node = Map::new();
            if old.is_none() {
                node.insert(".".into(), json!({}));
            }
            for (k, v) in fields {
                if let Some(child) = diff(old.and_then(|o| o.get(k)), v) {
                    node.insert(format!("f:{k}"), child);
                }
            }
            (!node.is_empty()).then_some(Value::Object(node))
        }
        Value::Array(items) if items.iter().all(|i| item_key(i).is_some()) && !items.is_empty() => {
            let old_items = before.and_then(Value::as_array);
            let mut node = Map::new();
            for item in items {
                let Some(key) = item_key(item) else { continue };
                let was =
                    old_items.and_then(|o| o.iter().find(|i| item_key(i) == Some(key.clone())));
                if let Some(child) = diff(was, item) {
                    node.insert(key, child);
                }
            }
            Some(Value::Object(node))
        }
        _ => Some(json!({})),
    }
}

/// An associative list item's key: `k:{"name":"x"}` or `k:{"type":"x"}`.
fn item_key(item: &Value) -> Option<String> {
    let o = item.as_object()?;
    ["name", "type"].iter().find_map(|k| {
        let v = o.get(*k)?.as_str()?;
        Some(format!("k:{{\"{k}\":{}}}", json!(v)))
    })
}

/// Adds `b`'s fields to `a`.
fn union(a: &mut Map<String, Value>, b: Map<String, Value>) {
    for (k, v) in b {
        match (a.get_mut(&k), v) {
            (Some(Value::Object(mine)), Value::Object(theirs)) => union(mine, theirs),
            (_, v) => {
                a.entry(k).or_insert(v);
            }
        }
    }
}

/// Removes from `a` the fields `b` now owns (leaves of `b`), dropping emptied branches.
fn subtract(a: &mut Map<String, Value>, b: &Map<String, Value>) {
    for (k, theirs) in b {
        let Some(Value::Object(mine)) = a.get_mut(k) else {
            continue;
        };
        match theirs.as_object() {
            Some(t) if !t.is_empty() => {
                let had = !mine.is_empty();
                subtract(mine, t);
                if had && mine.is_empty() {
                    a.remove(k);
                }
            }
            _ => {
                if mine.is_empty() {
                    a.remove(k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn as_manager(name: &str) -> Guard {
        writing_as(Manager {
            name: name.into(),
            subresource: String::new(),
        })
    }

    #[test]
    fn a_create_owns_every_field_it_wrote() {
        let _g = as_manager("kubectl-client-side-apply");
        let mut obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "labels": {"app": "x"}}, "data": {"k": "v"}});
        track(None, &mut obj);
        let entries = obj["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0]["manager"], "kubectl-client-side-apply");
        assert_eq!(entries[0]["operation"], "Update");
        assert_eq!(entries[0]["fieldsType"], "FieldsV1");
        assert_eq!(
            entries[0]["fieldsV1"],
            json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                   "f:data": {"f:k": {}}})
        );
    }

    #[test]
    fn another_manager_takes_over_what_it_changes() {
        let mut obj =
            json!({"apiVersion": "v1", "metadata": {"name": "a"}, "data": {"k": "v", "j": "w"}});
        {
            let _g = as_manager("first");
            track(None, &mut obj);
        }
        let old = obj.clone();
        obj["data"]["k"] = json!("changed");
        {
            let _g = as_manager("second");
            track(Some(&old), &mut obj);
        }
        let entries = obj["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 2);
        assert!(entries[0]["fieldsV1"]["f:data"].get("f:k").is_none());
        assert!(entries[0]["fieldsV1"]["f:data"].get("f:j").is_some());
        assert_eq!(entries[1]["fieldsV1"], json!({"f:data": {"f:k": {}}}));
    }

    #[test]
    fn sent_managed_fields_reset_replace_or_are_ignored() {
        let _g = as_manager("m");
        let mut live = json!({"apiVersion": "v1", "metadata": {"name": "a"}, "data": {"k": "v"}});
        track(None, &mut live);
        // Absent: the live entries stay (no change, nothing added).
        let mut absent = live.clone();
        absent["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        track(Some(&live), &mut absent);
        assert_eq!(absent, live);
        // Garbage: ignored as well.
        let mut garbage = live.clone();
        garbage["metadata"]["managedFields"] = json!([{"bogus": 1}]);
        track(Some(&live), &mut garbage);
        assert_eq!(garbage, live);
        // [{}]: cleared.
        let mut reset = live.clone();
        reset["metadata"]["managedFields"] = json!([{}]);
        track(Some(&live), &mut reset);
        assert!(reset["metadata"].get("managedFields").is_none());
    }

    #[test]
    fn lists_of_named_items_are_keyed() {
        let _g = as_manager("kubelet");
        let mut obj = json!({"apiVersion": "v1", "metadata": {"name": "p"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        track(None, &mut obj);
        let f = &obj["metadata"]["managedFields"][0]["fieldsV1"];
        assert_eq!(
            f["f:status"]["f:conditions"]["k:{\"type\":\"Ready\"}"],
            json!({".": {}, "f:type": {}, "f:status": {}})
        );
    }

    #[test]
    fn manager_from_the_user_agent_or_the_parameter() {
        assert_eq!(
            manager_name(None, "kubectl/v1.35.0 (linux/amd64)"),
            "kubectl"
        );
        assert_eq!(manager_name(Some("mine"), "kubectl/v1.35.0"), "mine");
        assert_eq!(
            manager_name(Some(""), "karpenter-capi/0.1"),
            "karpenter-capi"
        );
    }
}
