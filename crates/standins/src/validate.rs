//! Field validation the real kube-apiserver applies to built-in types before it stores them, so
//! that a client that works against the simulated cluster also works against a real one. Only
//! the rules the controller can run into are modelled; each cites the upstream rule it mirrors.

use serde_json::Value;

use super::errors::ApiError;
use super::registry::{Registry, ResourceDef};

/// Upstream `pkg/apis/core/validation/events.go`: `NoteLengthLimit` (bytes, Go `len`).
pub const EVENT_NOTE_LIMIT: usize = 1024;
/// Upstream `ReasonLengthLimit` and `ActionLengthLimit`.
pub const EVENT_REASON_LIMIT: usize = 128;
pub const EVENT_ACTION_LIMIT: usize = 128;

/// A custom resource about to be stored, against its CRD's schema and rules: pruned and
/// defaulted in place, then validated (against `old`, the stored object, on an update).
pub fn admit_custom(
    registry: &Registry,
    def: &ResourceDef,
    obj: &mut Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .and_then(|v| v.rsplit('/').next())
        .unwrap_or_else(|| def.preferred_version());
    let Some(schema) = registry
        .schema(def, version)
        .or_else(|| registry.schema(def, def.preferred_version()))
    else {
        return Ok(());
    };
    let mut causes: Vec<_> = schema
        .admit(obj, old)
        .err()
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.reason, c.field, c.message))
        .collect();
    if def.scale {
        causes.extend(scale_spec(obj));
    }
    if causes.is_empty() {
        return Ok(());
    }
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    tracing::debug!(kind = %def.kind, name, ?causes, "simulated server: invalid custom resource refused");
    Err(ApiError::invalid_fields(
        &def.group, &def.kind, name, &causes,
    ))
}

/// apiextensions-apiserver's check of a scale subresource's `specReplicasPath` (`.spec.replicas`
/// for every scalable custom resource served here), after the schema's: the value must read as
/// an int64 and not be negative, worded as Go's unstructured accessor words it.
fn scale_spec(obj: &Value) -> Option<(&'static str, String, String)> {
    const PATH: &str = ".spec.replicas";
    let v = obj.pointer("/spec/replicas").filter(|v| !v.is_null())?;
    let message = match v.as_i64() {
        Some(n) if n < 0 => format!("Invalid value: {n}: should be a non-negative integer"),
        Some(_) => return None,
        None => {
            let (shown, go_type) = match v {
                Value::String(s) => (s.clone(), "string"),
                Value::Bool(b) => (b.to_string(), "bool"),
                Value::Number(n) => (n.to_string(), "float64"),
                Value::Array(_) => (v.to_string(), "[]interface {}"),
                _ => (v.to_string(), "map[string]interface {}"),
            };
            format!(
                "Invalid value: 0: {PATH} accessor error: {shown} is of the type {go_type}, expected int64"
            )
        }
    };
    Some(("FieldValueInvalid", PATH.to_string(), message))
}

/// Checks `obj` (the object about to be stored, after merge or patch) for `def`.
pub fn check(def: &ResourceDef, obj: &Value) -> Result<(), ApiError> {
    if def.group == "events.k8s.io" && def.plural == "events" {
        return events_v1(obj);
    }
    Ok(())
}

/// events.k8s.io/v1 Events: the limits of `ValidateEventCreate`/`ValidateEventUpdate` for the
/// fields a reporter fills in.
fn events_v1(obj: &Value) -> Result<(), ApiError> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut problems = Vec::new();
    for (field, limit) in [
        ("note", EVENT_NOTE_LIMIT),
        ("reason", EVENT_REASON_LIMIT),
        ("action", EVENT_ACTION_LIMIT),
    ] {
        if obj
            .get(field)
            .and_then(Value::as_str)
            .is_some_and(|s| s.len() > limit)
        {
            problems.push(format!(
                "{field}: Too long: may not be more than {limit} bytes"
            ));
        }
    }
    for field in [
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ] {
        if obj
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            problems.push(format!("{field}: Required value"));
        }
    }
    if obj.get("eventTime").is_none_or(Value::is_null) {
        problems.push("eventTime: Required value".to_string());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "Event.events.k8s.io {name:?} is invalid: [{}]",
            problems.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(note: &str) -> Value {
        json!({
            "metadata": {"name": "x.1"},
            "eventTime": "2024-01-01T00:00:00.000000Z",
            "reportingController": "c", "reportingInstance": "i",
            "action": "A", "reason": "R", "note": note,
        })
    }

    #[test]
    fn event_note_limit_is_1024_bytes() {
        assert!(events_v1(&event(&"x".repeat(1024))).is_ok());
        let err = events_v1(&event(&"x".repeat(1025))).unwrap_err();
        assert!(err.to_string().contains("note: Too long"), "{err}");
        // Bytes, not characters: 513 two-byte characters are 1026 bytes.
        assert!(events_v1(&event(&"é".repeat(513))).is_err());
    }

    #[test]
    fn reporter_fields_are_required() {
        let mut e = event("n");
        e["reportingInstance"] = json!("");
        assert!(events_v1(&e).is_err());
    }
}
