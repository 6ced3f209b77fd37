//! The writes the controller makes to Cluster API objects, as patch bodies. The paths are the
//! same in v1beta1 and v1beta2; the version parameter keeps the seam visible should a future
//! version move them.

use serde_json::{Value, json};

use crate::capi::version::CapiVersion;

/// JSON Pointer to a MachineDeployment's or MachineSet's desired replica count.
pub fn replicas_path(_version: CapiVersion) -> &'static str {
    "/spec/replicas"
}

/// A JSON Patch (RFC 6902) that sets `spec.replicas` to `new` only if it still equals
/// `expected`: the compare-and-swap every replica write goes through. With `expected` `None`
/// (the field is absent, so there is nothing to test) pair it with
/// [`resource_version_test`] to keep the write conditional.
pub fn replicas_patch(version: CapiVersion, expected: Option<i32>, new: i32) -> Value {
    let path = replicas_path(version);
    match expected {
        Some(expected) => json!([
            {"op": "test", "path": path, "value": expected},
            {"op": "replace", "path": path, "value": new},
        ]),
        None => json!([{"op": "add", "path": path, "value": new}]),
    }
}

/// A JSON Patch operation that fails the patch unless the object is at `resource_version`.
pub(crate) fn resource_version_test(resource_version: &str) -> Value {
    json!({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})
}

/// Prepends [`resource_version_test`] to a JSON Patch array.
pub fn with_resource_version(patch: Value, resource_version: &str) -> Value {
    let mut ops = vec![resource_version_test(resource_version)];
    if let Value::Array(rest) = patch {
        ops.extend(rest);
    }
    Value::Array(ops)
}

/// Escapes a map key for use in a JSON Pointer (`/` -> `~1`, `~` -> `~0`).
pub(crate) fn json_pointer_escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// JSON Pointer to one annotation.
pub fn annotation_path(key: &str) -> String {
    format!("/metadata/annotations/{}", json_pointer_escape(key))
}

/// JSON Pointer to one label.
pub fn label_path(key: &str) -> String {
    format!("/metadata/labels/{}", json_pointer_escape(key))
}

/// A merge patch (RFC 7386) that sets (`Some`) or removes (`None`) one annotation; it works
/// whether or not the object has annotations yet, which a JSON Patch `add` does not.
pub fn annotation_merge_patch(key: &str, value: Option<&str>) -> Value {
    json!({"metadata": {"annotations": {key: value}}})
}

/// A merge patch that sets or removes one label.
pub fn label_merge_patch(key: &str, value: Option<&str>) -> Value {
    json!({"metadata": {"labels": {key: value}}})
}

/// A merge patch for the scale subresource or the object itself setting `spec.replicas`.
pub fn replicas_merge_patch(_version: CapiVersion, replicas: i32) -> Value {
    json!({"spec": {"replicas": replicas}})
}
