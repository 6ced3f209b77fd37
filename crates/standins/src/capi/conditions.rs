//! Cluster API's v1beta2-style conditions on the stand-in's objects: where they live in each
//! API version, and reading and setting one.

use kube::core::DynamicObject;
use serde_json::{Value, json};

use crate::capi_version::CapiVersion;

/// Where an object's v1beta2-style conditions live: `status.conditions` in v1beta2,
/// `status.v1beta2.conditions` on v1beta1 objects (Cluster API 1.9 and later).
pub(super) fn conditions_path(v: CapiVersion) -> &'static str {
    match v {
        CapiVersion::V1Beta1 => "/status/v1beta2/conditions",
        CapiVersion::V1Beta2 => "/status/conditions",
    }
}

/// The v1beta2-style condition `kind` of an object, when it has one.
pub(super) fn condition<'a>(obj: &'a Value, v: CapiVersion, kind: &str) -> Option<&'a Value> {
    obj.pointer(conditions_path(v))?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
}

/// Puts `condition` among `obj`'s v1beta2-style conditions, replacing one of its type.
pub(super) fn set_condition(obj: &mut DynamicObject, v: CapiVersion, condition: Value) {
    let kind = condition.get("type").cloned();
    let data = &mut obj.data;
    if !data.get("status").is_some_and(Value::is_object) {
        data["status"] = json!({});
    }
    let mut parent = &mut data["status"];
    if v == CapiVersion::V1Beta1 {
        if !parent.get("v1beta2").is_some_and(Value::is_object) {
            parent["v1beta2"] = json!({});
        }
        parent = &mut parent["v1beta2"];
    }
    if !parent.get("conditions").is_some_and(Value::is_array) {
        parent["conditions"] = json!([]);
    }
    if let Some(list) = parent["conditions"].as_array_mut() {
        match list.iter_mut().find(|c| c.get("type") == kind.as_ref()) {
            Some(slot) => *slot = condition,
            None => list.push(condition),
        }
    }
}

/// Now, to the second, as conditions carry it.
pub(super) fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
