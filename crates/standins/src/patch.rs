//! The three patch formats kube-apiserver accepts from controllers: JSON merge patch (RFC 7386),
//! JSON patch (RFC 6902) and strategic merge patch (built-in kinds only).

use serde_json::{Map, Value};

/// Why a patch could not be applied: `Malformed` is a 400, `Failed` a 422 (as kube-apiserver answers
/// a JSON patch whose operation cannot be applied, a failed `test` included).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PatchError {
    #[error("{0}")]
    Malformed(String),
    #[error("{0}")]
    Failed(String),
}

/// RFC 7386: objects merge recursively, `null` deletes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// RFC 6902, applied all-or-nothing.
/// Applies `ops` to `doc` (the caller's own copy: a failed patch leaves nothing behind).
pub fn json_patch(mut doc: Value, ops: &Value) -> Result<Value, PatchError> {
    let ops = ops
        .as_array()
        .ok_or_else(|| PatchError::Malformed("json patch must be an array of operations".into()))?;
    for (i, op) in ops.iter().enumerate() {
        let field = |name: &str| {
            op.get(name).and_then(Value::as_str).ok_or_else(|| {
                PatchError::Malformed(format!("json patch operation {i}: missing {name:?}"))
            })
        };
        let path = pointer(field("path")?)?;
        let value = || {
            op.get("value").cloned().ok_or_else(|| {
                PatchError::Malformed(format!("json patch operation {i}: missing \"value\""))
            })
        };
        match field("op")? {
            "add" => add(&mut doc, &path, value()?)?,
            "remove" => {
                remove(&mut doc, &path)?;
            }
            "replace" => {
                remove(&mut doc, &path)?;
                add(&mut doc, &path, value()?)?;
            }
            "move" => {
                let from = pointer(field("from")?)?;
                let v = remove(&mut doc, &from)?;
                add(&mut doc, &path, v)?;
            }
            "copy" => {
                let from = pointer(field("from")?)?;
                let v = get(&doc, &from).cloned().ok_or_else(|| missing(&from))?;
                add(&mut doc, &path, v)?;
            }
            "test" => {
                let expected = value()?;
                // As the API server's json-patch (evanphx, v4): the parent must exist; a
                // missing member, or one that is null, passes only a test for null (how a
                // writer guards "this map is not there yet").
                let shown = format!("/{}", path.join("/"));
                let actual = get(&doc, &path);
                if let Some((_, parents)) = path.split_last()
                    && actual.is_none()
                    && !get(&doc, parents).is_some_and(Value::is_object)
                {
                    return Err(PatchError::Failed(format!(
                        "test operation does not apply: is missing path: {shown}"
                    )));
                }
                let actual = actual.filter(|v| !v.is_null());
                let passes = match actual {
                    None => expected.is_null(),
                    Some(v) => *v == expected,
                };
                if !passes {
                    return Err(PatchError::Failed(format!(
                        "testing value {shown} failed: test failed"
                    )));
                }
            }
            other => {
                return Err(PatchError::Malformed(format!(
                    "json patch operation {i}: unknown op {other:?}"
                )));
            }
        }
    }
    Ok(doc)
}

fn pointer(p: &str) -> Result<Vec<String>, PatchError> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let rest = p
        .strip_prefix('/')
        .ok_or_else(|| PatchError::Malformed(format!("invalid JSON pointer {p:?}")))?;
    Ok(rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn missing(path: &[String]) -> PatchError {
    PatchError::Failed(format!(
        "doc is missing path: \"/{}\": missing value",
        path.join("/")
    ))
}

fn get<'a>(doc: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(doc, |cur, seg| match cur {
        Value::Object(m) => m.get(seg),
        Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn parent_mut<'a>(
    doc: &'a mut Value,
    path: &[String],
) -> Result<(&'a mut Value, String), PatchError> {
    let (last, parents) = path
        .split_last()
        .ok_or_else(|| PatchError::Failed("cannot operate on the document root".into()))?;
    let mut cur = doc;
    for seg in parents {
        cur = match cur {
            Value::Object(m) => m.get_mut(seg),
            Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| missing(path))?;
    }
    Ok((cur, last.clone()))
}

fn add(doc: &mut Value, path: &[String], value: Value) -> Result<(), PatchError> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = parent_mut(doc, path)?;
    match parent {
        Value::Object(m) => {
            m.insert(last, value);
            Ok(())
        }
        Value::Array(a) => {
            let idx = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>().map_err(|_| missing(path))?
            };
            if idx > a.len() {
                return Err(PatchError::Failed(format!(
                    "add operation: index {idx} out of bounds at /{}",
                    path.join("/")
                )));
            }
            a.insert(idx, value);
            Ok(())
        }
        _ => Err(missing(path)),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, PatchError> {
    let (parent, last) = parent_mut(doc, path)?;
    match parent {
        Value::Object(m) => m.remove(&last).ok_or_else(|| missing(path)),
        Value::Array(a) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(missing(path)),
        },
        _ => Err(missing(path)),
    }
}

/// How strategic merge treats a list, by its path in the object (the built-in kinds' patch tags).
enum ListStrategy {
    /// Merge items by this key.
    ByKey(&'static str),
    /// A set of primitives (finalizers): union.
    Primitives,
}

fn list_strategy(path: &str) -> Option<ListStrategy> {
    Some(match path {
        "metadata.finalizers" => ListStrategy::Primitives,
        "metadata.ownerReferences" => ListStrategy::ByKey("uid"),
        "status.conditions" | "status.addresses" => ListStrategy::ByKey("type"),
        "spec.containers"
        | "spec.initContainers"
        | "spec.volumes"
        | "spec.template.spec.containers"
        | "spec.template.spec.initContainers"
        | "spec.template.spec.volumes" => ListStrategy::ByKey("name"),
        _ => return None,
    })
}

/// Strategic merge patch for built-in kinds. Lists without a merge strategy (for example
/// `spec.taints` and `spec.tolerations`, which carry no patch tags in Kubernetes) are replaced.
pub fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    smp_object(target, patch, "")
}

fn smp_object(target: &mut Value, patch: &Value, path: &str) -> Result<(), PatchError> {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = p.clone();
            replaced.remove("$patch");
            *target = Value::Object(replaced);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some(other) => {
            return Err(PatchError::Malformed(format!(
                "{path}: unknown $patch directive {other:?}"
            )));
        }
        None => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return Ok(());
    };
    for (k, v) in p {
        if k.starts_with("$setElementOrder/") || k == "$retainKeys" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(gone)) = (t.get_mut(field), v.as_array()) {
                list.retain(|x| !gone.contains(x));
            }
            continue;
        }
        let child_path = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        if v.is_null() {
            t.remove(k);
            continue;
        }
        let slot = t.entry(k.clone()).or_insert(Value::Null);
        match (v, list_strategy(&child_path)) {
            (Value::Array(items), Some(strategy)) => smp_list(slot, items, strategy, &child_path)?,
            (Value::Object(_), _) => {
                smp_object(slot, v, &child_path)?;
                if slot.is_null() {
                    t.remove(k);
                }
            }
            _ => *slot = v.clone(),
        }
    }
    Ok(())
}

fn smp_list(
    target: &mut Value,
    items: &[Value],
    strategy: ListStrategy,
    path: &str,
) -> Result<(), PatchError> {
    if items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *target = Value::Array(
            items
                .iter()
                .filter(|i| i.get("$patch").is_none())
                .cloned()
                .collect(),
        );
        return Ok(());
    }
    if !target.is_array() {
        *target = Value::Array(Vec::new());
    }
    let Value::Array(list) = target else {
        return Ok(());
    };
    match strategy {
        ListStrategy::Primitives => {
            for item in items {
                if !list.contains(item) {
                    list.push(item.clone());
                }
            }
        }
        ListStrategy::ByKey(key) => {
            for item in items {
                let id = item.get(key).ok_or_else(|| {
                    PatchError::Malformed(format!("{path}: map item has no merge key {key:?}"))
                })?;
                let pos = list.iter().position(|x| x.get(key) == Some(id));
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        list.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => {
                        if let Some(existing) = list.get_mut(i) {
                            smp_object(existing, item, path)?;
                        }
                    }
                    (None, false) => list.push(item.clone()),
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let mut t = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        merge_patch(&mut t, &json!({"a": {"b": null, "d": 3}, "l": [3]}));
        assert_eq!(t, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
    }

    #[test]
    fn json_patch_ops() {
        let t = json!({"a": {"b": 1}, "l": [1, 2]});
        let out = json_patch(
            t.clone(),
            &json!([
                {"op": "test", "path": "/a/b", "value": 1},
                {"op": "add", "path": "/l/-", "value": 3},
                {"op": "replace", "path": "/a/b", "value": 2},
                {"op": "copy", "from": "/a", "path": "/c"},
                {"op": "move", "from": "/c/b", "path": "/d"},
                {"op": "remove", "path": "/l/0"}
            ]),
        )
        .unwrap();
        assert_eq!(out, json!({"a": {"b": 2}, "c": {}, "d": 2, "l": [2, 3]}));
        // A missing member passes a test for null only, and only inside an existing object.
        assert!(
            json_patch(
                t.clone(),
                &json!([{"op": "test", "path": "/a/zz", "value": null}])
            )
            .is_ok()
        );
        for bad in [
            json!([{"op": "test", "path": "/a/zz", "value": 1}]),
            json!([{"op": "test", "path": "/a/b", "value": null}]),
            json!([{"op": "test", "path": "/zz/y", "value": null}]),
            json!([{"op": "test", "path": "/l/7", "value": null}]),
        ] {
            assert!(
                matches!(json_patch(t.clone(), &bad), Err(PatchError::Failed(_))),
                "{bad}"
            );
        }
        let failed = json_patch(
            t.clone(),
            &json!([{"op": "test", "path": "/a/b", "value": 9}]),
        );
        assert!(matches!(failed, Err(PatchError::Failed(_))));
        let bad = json_patch(t.clone(), &json!([{"op": "nope", "path": "/a"}]));
        assert!(matches!(bad, Err(PatchError::Malformed(_))));
        assert!(matches!(
            json_patch(t.clone(), &json!([{"op": "remove", "path": "/zz"}])),
            Err(PatchError::Failed(_))
        ));
    }

    #[test]
    fn strategic_merge_by_key_and_replace() {
        let mut node = json!({
            "metadata": {"finalizers": ["a"]},
            "spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Disk", "status": "False"}]}
        });
        strategic_merge(
            &mut node,
            &json!({
                "metadata": {"finalizers": ["b"]},
                "spec": {"taints": [{"key": "y", "effect": "NoExecute"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Disk", "$patch": "delete"}]}
            }),
        )
        .unwrap();
        assert_eq!(node["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            node["spec"]["taints"],
            json!([{"key": "y", "effect": "NoExecute"}])
        );
        assert_eq!(
            node["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}])
        );
        strategic_merge(&mut node, &json!({"$deleteFromPrimitiveList/metadata": [], "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}})).unwrap();
        assert_eq!(node["metadata"]["finalizers"], json!(["b"]));
    }
}
