//! Helpers the unit tests share.

/// Merges `b` into `a`, objects key by key, anything else replaced (a JSON merge patch without
/// deletions).
pub fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}
