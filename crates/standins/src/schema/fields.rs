//! Field paths and values as kube-apiserver writes them in its field errors.

use serde_json::Value;

/// `parent.child`, or `child` at the root.
pub fn join(path: &str, child: &str) -> String {
    if path.is_empty() {
        child.to_string()
    } else {
        format!("{path}.{child}")
    }
}

/// A value as kube-apiserver quotes it in a field error: scalars as they are, a map or a list
/// by its type.
pub fn shown(v: &Value) -> String {
    match v {
        Value::Object(_) => "\"object\"".to_string(),
        Value::Array(_) => "\"array\"".to_string(),
        Value::Null => "\"null\"".to_string(),
        other => other.to_string(),
    }
}
