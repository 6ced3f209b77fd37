//! A schema node compiled from its OpenAPI v3 form, and the pruning and defaulting that
//! precede validation.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Value};

use super::cel::Rule;
use super::fields::join;

/// The JSON type a node requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    Object,
    Array,
    String,
    Integer,
    Number,
    Boolean,
}

impl Type {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "object" => Self::Object,
            "array" => Self::Array,
            "string" => Self::String,
            "integer" => Self::Integer,
            "number" => Self::Number,
            "boolean" => Self::Boolean,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Object => "object",
            Self::Array => "array",
            Self::String => "string",
            Self::Integer => "integer",
            Self::Number => "number",
            Self::Boolean => "boolean",
        }
    }
}

/// One compiled schema node.
#[derive(Debug, Default)]
pub struct Node {
    pub ty: Option<Type>,
    pub nullable: bool,
    pub int_or_string: bool,
    pub preserve_unknown: bool,
    pub embedded: bool,
    pub enumeration: Vec<Value>,
    pub required: Vec<String>,
    pub pattern: Option<(String, Regex)>,
    pub format: Option<String>,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    pub min_properties: Option<u64>,
    pub max_properties: Option<u64>,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
    pub exclusive_minimum: bool,
    pub exclusive_maximum: bool,
    pub default: Option<Value>,
    pub properties: BTreeMap<String, Node>,
    pub additional: Option<Box<Node>>,
    pub items: Option<Box<Node>>,
    /// `x-kubernetes-list-type: map` keys, by which an update's items are matched to the old.
    pub list_map_keys: Vec<String>,
    pub rules: Vec<Rule>,
    /// Whether this node or any under it has rules (the rules pass skips the rest).
    pub has_rules: bool,
}

impl Node {
    /// Compiles `s`, found at `path` (for the error of a pattern or rule that does not compile).
    pub fn compile(s: &Value, path: &str) -> Result<Self, String> {
        let uint = |k: &str| s.get(k).and_then(Value::as_u64);
        let flag = |k: &str| s.get(k).and_then(Value::as_bool).unwrap_or(false);
        let mut node = Node {
            ty: s.get("type").and_then(Value::as_str).and_then(Type::parse),
            nullable: flag("nullable"),
            int_or_string: flag("x-kubernetes-int-or-string"),
            preserve_unknown: flag("x-kubernetes-preserve-unknown-fields"),
            embedded: flag("x-kubernetes-embedded-resource"),
            enumeration: s
                .get("enum")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            required: s
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|r| r.as_str().map(String::from))
                .collect(),
            pattern: None,
            format: s.get("format").and_then(Value::as_str).map(String::from),
            min_length: uint("minLength"),
            max_length: uint("maxLength"),
            min_items: uint("minItems"),
            max_items: uint("maxItems"),
            min_properties: uint("minProperties"),
            max_properties: uint("maxProperties"),
            minimum: s.get("minimum").and_then(Value::as_f64),
            maximum: s.get("maximum").and_then(Value::as_f64),
            exclusive_minimum: flag("exclusiveMinimum"),
            exclusive_maximum: flag("exclusiveMaximum"),
            default: s.get("default").cloned(),
            list_map_keys: s
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|r| r.as_str().map(String::from))
                .collect(),
            ..Node::default()
        };
        if let Some(p) = s.get("pattern").and_then(Value::as_str) {
            let re = Regex::new(p)
                .map_err(|e| format!("{}: pattern {p:?} does not compile: {e}", at(path)))?;
            node.pattern = Some((p.to_string(), re));
        }
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                node.properties
                    .insert(k.clone(), Node::compile(v, &join(path, k))?);
            }
        }
        match s.get("additionalProperties") {
            Some(Value::Bool(true)) => node.preserve_unknown = true,
            Some(a @ Value::Object(_)) => {
                node.additional = Some(Box::new(Node::compile(a, &format!("{path}[*]"))?));
            }
            _ => {}
        }
        if let Some(items) = s.get("items").filter(|i| i.is_object()) {
            node.items = Some(Box::new(Node::compile(items, &format!("{path}[*]"))?));
        }
        if let Some(rules) = s.get("x-kubernetes-validations").and_then(Value::as_array) {
            for r in rules {
                node.rules.push(
                    Rule::compile(r)
                        .map_err(|e| format!("{}: x-kubernetes-validations: {e}", at(path)))?,
                );
            }
        }
        node.has_rules = !node.rules.is_empty()
            || node.properties.values().any(|p| p.has_rules)
            || node.additional.as_ref().is_some_and(|a| a.has_rules)
            || node.items.as_ref().is_some_and(|i| i.has_rules);
        Ok(node)
    }

    /// Drops fields the schema does not know (unless it preserves them), drops `null`s a
    /// non-nullable field cannot hold, and fills in absent fields that have a default, as the
    /// API server does before it validates. `root` keeps `apiVersion`, `kind` and `metadata`.
    pub fn prune_and_default(&self, v: &mut Value, root: bool) {
        match v {
            Value::Object(m) => self.prune_object(m, root),
            Value::Array(items) => {
                if let Some(item) = &self.items {
                    for i in items {
                        item.prune_and_default(i, false);
                    }
                }
            }
            _ => {}
        }
    }

    fn prune_object(&self, m: &mut Map<String, Value>, root: bool) {
        let keeps_meta = root || self.embedded;
        if let Some(additional) = &self.additional {
            for v in m.values_mut() {
                additional.prune_and_default(v, false);
            }
            return;
        }
        if !self.preserve_unknown {
            m.retain(|k, _| {
                self.properties.contains_key(k)
                    || (keeps_meta && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
            });
        }
        for (k, child) in &self.properties {
            // An object's own metadata is ObjectMeta whatever the schema says of it (upstream
            // CRDs declare it a bare `type: object`): kube-apiserver never prunes inside it.
            if keeps_meta && k == "metadata" {
                continue;
            }
            match m.get(k) {
                Some(Value::Null) if !child.nullable => match &child.default {
                    Some(d) => {
                        m.insert(k.clone(), d.clone());
                    }
                    None => {
                        m.remove(k);
                    }
                },
                None => {
                    if let Some(d) = &child.default {
                        m.insert(k.clone(), d.clone());
                    }
                }
                _ => {}
            }
            if let Some(v) = m.get_mut(k) {
                child.prune_and_default(v, false);
            }
        }
    }
}

fn at(path: &str) -> &str {
    if path.is_empty() { "<root>" } else { path }
}
