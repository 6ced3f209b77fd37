//! Reading typed fields out of untyped Cluster API JSON, with errors that name the object and
//! the field. A JSON `null` counts as absent, as it does for the API server.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::Value;

/// A required part missing or wrongly typed on a Cluster API object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("{object}: {field} is required")]
    Missing { object: String, field: String },
    #[error("{object}: {field}: expected {expected}")]
    WrongType {
        object: String,
        field: String,
        expected: &'static str,
    },
    #[error("{object}: {field}: {reason}")]
    Invalid {
        object: String,
        field: String,
        reason: String,
    },
    #[error("{object}: cannot be read as JSON: {reason}")]
    Serialize { object: String, reason: String },
}

/// One object being read; `object` is `Kind namespace/name` for messages.
pub(crate) struct Reader<'a> {
    root: &'a Value,
    pub(crate) object: String,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(kind: &str, root: &'a Value) -> Reader<'a> {
        let text = |path: &[&str]| {
            lookup(root, path)
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string()
        };
        let object = format!(
            "{kind} {}/{}",
            text(&["metadata", "namespace"]),
            text(&["metadata", "name"])
        );
        Reader { root, object }
    }

    pub(crate) fn get(&self, path: &str) -> Option<&'a Value> {
        let parts: Vec<&str> = path.split('.').collect();
        lookup(self.root, &parts)
    }

    pub(crate) fn missing(&self, field: &str) -> ModelError {
        ModelError::Missing {
            object: self.object.clone(),
            field: field.to_string(),
        }
    }

    pub(crate) fn wrong(&self, field: &str, expected: &'static str) -> ModelError {
        ModelError::WrongType {
            object: self.object.clone(),
            field: field.to_string(),
            expected,
        }
    }

    pub(crate) fn invalid(&self, field: &str, reason: impl Into<String>) -> ModelError {
        ModelError::Invalid {
            object: self.object.clone(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    /// A string field; the empty string counts as absent, as Go's `omitempty` writes it.
    pub(crate) fn opt_str(&self, path: &str) -> Result<Option<String>, ModelError> {
        str_at(self, self.get(path), path)
    }

    /// A non-empty string field.
    pub(crate) fn req_str(&self, path: &str) -> Result<String, ModelError> {
        self.opt_str(path)?.ok_or_else(|| self.missing(path))
    }

    pub(crate) fn opt_i64(&self, path: &str) -> Result<Option<i64>, ModelError> {
        match self.get(path) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.wrong(path, "an integer")),
        }
    }

    pub(crate) fn opt_i32(&self, path: &str) -> Result<Option<i32>, ModelError> {
        match self.opt_i64(path)? {
            None => Ok(None),
            Some(n) => i32::try_from(n)
                .map(Some)
                .map_err(|_| self.wrong(path, "a 32-bit integer")),
        }
    }

    pub(crate) fn opt_bool(&self, path: &str) -> Result<Option<bool>, ModelError> {
        match self.get(path) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong(path, "a boolean")),
        }
    }

    /// A `map[string]string` (labels, annotations, matchLabels); absent is empty.
    pub(crate) fn string_map(&self, path: &str) -> Result<BTreeMap<String, String>, ModelError> {
        let Some(value) = self.get(path) else {
            return Ok(BTreeMap::new());
        };
        let map = value
            .as_object()
            .ok_or_else(|| self.wrong(path, "a map of strings"))?;
        map.iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(self.wrong(&format!("{path}.{k}"), "a string")),
            })
            .collect()
    }

    /// An RFC 3339 timestamp.
    pub(crate) fn opt_time(&self, path: &str) -> Result<Option<Timestamp>, ModelError> {
        match self.opt_str(path)? {
            None => Ok(None),
            Some(s) => s
                .parse::<Timestamp>()
                .map(Some)
                .map_err(|e| self.invalid(path, format!("timestamp {s:?}: {e}"))),
        }
    }

    /// An array of objects; absent is empty.
    pub(crate) fn array(&self, path: &str) -> Result<&'a [Value], ModelError> {
        match self.get(path) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items.as_slice()),
            Some(_) => Err(self.wrong(path, "a list")),
        }
    }

    /// A string member of an array element, for `field[i].member` paths.
    pub(crate) fn member_str(
        &self,
        item: &'a Value,
        field: &str,
    ) -> Result<Option<String>, ModelError> {
        str_at(
            self,
            item.get(member_name(field)).filter(|v| !v.is_null()),
            field,
        )
    }
}

fn member_name(field: &str) -> &str {
    field.rsplit('.').next().unwrap_or(field)
}

fn str_at(
    reader: &Reader<'_>,
    value: Option<&Value>,
    field: &str,
) -> Result<Option<String>, ModelError> {
    match value {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(reader.wrong(field, "a string")),
    }
}

fn lookup<'a>(root: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut current = root;
    for part in path {
        current = current.get(part)?;
    }
    (!current.is_null()).then_some(current)
}
