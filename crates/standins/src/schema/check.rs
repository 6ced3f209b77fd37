//! Validation of a value against a compiled node, with kube-apiserver's field errors.

use serde_json::Value;

use super::Cause;
use super::compile::{Node, Type};
use super::fields::{join, shown};

impl Node {
    /// Checks `v` (found at `path`) and everything under it; `old` is the stored value at the
    /// same place on an update, and an unchanged value is not checked again (ratcheting).
    pub fn check(&self, v: &Value, old: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
        if old == Some(v) {
            return;
        }
        if v.is_null() {
            if !self.nullable && (self.ty.is_some() || self.int_or_string) {
                causes.push(type_invalid(path, v, self.type_name()));
            }
            return;
        }
        if !self.type_matches(v) {
            causes.push(type_invalid(path, v, self.type_name()));
            return;
        }
        if !self.enumeration.is_empty() && !self.enumeration.contains(v) {
            let supported: Vec<String> = self.enumeration.iter().map(Value::to_string).collect();
            causes.push(Cause {
                reason: "FieldValueNotSupported",
                field: path.to_string(),
                message: format!(
                    "Unsupported value: {}: supported values: {}",
                    v,
                    supported.join(", ")
                ),
            });
        }
        match v {
            Value::String(s) => self.string(s, v, path, causes),
            Value::Number(n) => self.number(n.as_f64().unwrap_or(0.0), v, path, causes),
            Value::Array(items) => self.array(items, old, path, causes),
            Value::Object(m) => self.object(m, old, path, causes),
            _ => {}
        }
    }

    /// Evaluates the CEL rules of this node and of every node under it, on a value that passed
    /// [`Node::check`]; unchanged values are skipped as there.
    pub fn check_rules(&self, v: &Value, old: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
        if old == Some(v) || v.is_null() || !self.has_rules {
            return;
        }
        for rule in &self.rules {
            rule.check(v, old, path, causes);
        }
        match v {
            Value::Array(items) => {
                let Some(item) = &self.items else { return };
                let old_items = old.and_then(Value::as_array);
                for (i, x) in items.iter().enumerate() {
                    let old_item = old_items.and_then(|o| self.correlate(x, o));
                    item.check_rules(x, old_item, &format!("{path}[{i}]"), causes);
                }
            }
            Value::Object(m) => {
                for (k, x) in m {
                    let child = match (self.properties.get(k), &self.additional) {
                        (Some(c), _) => c,
                        (None, Some(a)) => a,
                        (None, None) => continue,
                    };
                    child.check_rules(x, old.and_then(|o| o.get(k)), &join(path, k), causes);
                }
            }
            _ => {}
        }
    }

    fn type_name(&self) -> &'static str {
        match self.ty {
            Some(t) => t.name(),
            None if self.int_or_string => "integer or string",
            None => "any",
        }
    }

    fn type_matches(&self, v: &Value) -> bool {
        if self.int_or_string {
            return v.is_string() || v.is_i64() || v.is_u64();
        }
        match self.ty {
            None => true,
            Some(Type::Object) => v.is_object(),
            Some(Type::Array) => v.is_array(),
            Some(Type::String) => v.is_string(),
            Some(Type::Integer) => v.is_i64() || v.is_u64(),
            Some(Type::Number) => v.is_number(),
            Some(Type::Boolean) => v.is_boolean(),
        }
    }

    fn string(&self, s: &str, v: &Value, path: &str, causes: &mut Vec<Cause>) {
        // Lengths count characters (Go's utf8.RuneCountInString), as kube-openapi does.
        let len = || s.chars().count() as u64;
        if let Some(max) = self.max_length
            && len() > max
        {
            return causes.push(Cause {
                reason: "FieldValueTooLong",
                field: path.to_string(),
                message: format!("Too long: may not be more than {max} bytes"),
            });
        }
        if let Some(min) = self.min_length
            && len() < min
        {
            return causes.push(invalid(
                path,
                v,
                format!("{path} in body should be at least {min} chars long"),
            ));
        }
        if let Some((text, re)) = &self.pattern
            && !re.is_match(s)
        {
            return causes.push(invalid(
                path,
                v,
                format!("{path} in body should match '{text}'"),
            ));
        }
        if self.format.as_deref() == Some("date-time") && s.parse::<jiff::Timestamp>().is_err() {
            causes.push(type_invalid(path, v, "date-time"));
        }
    }

    fn number(&self, n: f64, v: &Value, path: &str, causes: &mut Vec<Cause>) {
        if let Some(min) = self.minimum {
            let (bad, words) = if self.exclusive_minimum {
                (n <= min, "greater than")
            } else {
                (n < min, "greater than or equal to")
            };
            if bad {
                causes.push(invalid(
                    path,
                    v,
                    format!("{path} in body should be {words} {}", number(min)),
                ));
            }
        }
        if let Some(max) = self.maximum {
            let (bad, words) = if self.exclusive_maximum {
                (n >= max, "less than")
            } else {
                (n > max, "less than or equal to")
            };
            if bad {
                causes.push(invalid(
                    path,
                    v,
                    format!("{path} in body should be {words} {}", number(max)),
                ));
            }
        }
    }

    fn array(&self, items: &[Value], old: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
        let n = items.len() as u64;
        if let Some(max) = self.max_items
            && n > max
        {
            causes.push(Cause {
                reason: "FieldValueTooMany",
                field: path.to_string(),
                message: format!("Too many: {n}: must have at most {max} items"),
            });
        }
        if let Some(min) = self.min_items
            && n < min
        {
            causes.push(invalid(
                path,
                &Value::from(n),
                format!("{path} in body should have at least {min} items"),
            ));
        }
        let Some(item) = &self.items else { return };
        let old_items = old.and_then(Value::as_array);
        for (i, v) in items.iter().enumerate() {
            let old_item = old_items.and_then(|o| self.correlate(v, o));
            item.check(v, old_item, &format!("{path}[{i}]"), causes);
        }
    }

    /// The old item an update's item stands for: only lists of type `map` correlate, by their
    /// keys (kube-apiserver does not match the items of other lists to the old ones).
    fn correlate<'a>(&self, v: &Value, old: &'a [Value]) -> Option<&'a Value> {
        if self.list_map_keys.is_empty() {
            return None;
        }
        old.iter()
            .find(|o| self.list_map_keys.iter().all(|k| o.get(k) == v.get(k)))
    }

    fn object(
        &self,
        m: &serde_json::Map<String, Value>,
        old: Option<&Value>,
        path: &str,
        causes: &mut Vec<Cause>,
    ) {
        let n = m.len() as u64;
        if let Some(max) = self.max_properties
            && n > max
        {
            causes.push(Cause {
                reason: "FieldValueTooMany",
                field: path.to_string(),
                message: format!("Too many: {n}: must have at most {max} items"),
            });
        }
        if let Some(min) = self.min_properties
            && n < min
        {
            causes.push(invalid(
                path,
                &Value::from(n),
                format!("{path} in body should have at least {min} properties"),
            ));
        }
        for r in &self.required {
            if !m.contains_key(r) {
                causes.push(Cause {
                    reason: "FieldValueRequired",
                    field: join(path, r),
                    message: "Required value".to_string(),
                });
            }
        }
        for (k, v) in m {
            let child = match (self.properties.get(k), &self.additional) {
                (Some(c), _) => c,
                (None, Some(a)) => a,
                (None, None) => continue,
            };
            let old_child = old.and_then(|o| o.get(k));
            child.check(v, old_child, &join(path, k), causes);
        }
    }
}

/// `field.Invalid`: the value, then why.
pub fn invalid(path: &str, v: &Value, why: String) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: path.to_string(),
        message: format!("Invalid value: {}: {why}", shown(v)),
    }
}

fn type_invalid(path: &str, v: &Value, want: &str) -> Cause {
    // kube-apiserver names the type it got, not the value.
    let got = match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let got = format!("{got:?}");
    Cause {
        reason: "FieldValueTypeInvalid",
        field: path.to_string(),
        message: format!("Invalid value: {got}: {path} in body must be of type {want}: {got}"),
    }
}

fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        x.to_string()
    }
}
