//! Custom resources checked against their CRD's structural OpenAPI v3 schema, as
//! apiextensions-apiserver does on every create, update, patch and status write: unknown fields
//! pruned, defaults applied, then every constraint of the schema (types, enums, required fields,
//! patterns, lengths, item and property counts, bounds) and its CEL rules. Each schema is compiled
//! once, when the resource is registered; a CRD whose schema or rules cannot be compiled fails the
//! registration, so a rule nobody can evaluate is noticed rather than skipped.
//!
//! Updates ratchet as kube-apiserver's `CRDValidationRatcheting` does: a value unchanged from the
//! stored object is not checked again, so an object written under an older, looser CRD can still
//! have its status written.

mod cel;
mod check;
mod compile;
mod fields;

use serde_json::Value;

pub use compile::Node;

/// One field error, as kube-apiserver lists it among a Status's `details.causes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`, ...
    pub reason: &'static str,
    /// The field's path, e.g. `spec.template.spec.requirements[0].values[0]`.
    pub field: String,
    /// What is wrong, without the field (`Invalid value: "x": ...`).
    pub message: String,
}

/// Field errors after which kube-apiserver does not evaluate CEL rules.
const BLOCKING: [&str; 5] = [
    "FieldValueTypeInvalid",
    "FieldValueNotSupported",
    "FieldValueRequired",
    "FieldValueTooLong",
    "FieldValueTooMany",
];

/// The compiled schema of one served version of a custom resource.
#[derive(Debug)]
pub struct Schema {
    root: Node,
}

impl Schema {
    /// Compiles a CRD version's `openAPIV3Schema`; the error names what could not be compiled.
    pub fn compile(open_api: &Value) -> Result<Self, String> {
        Ok(Self {
            root: Node::compile(open_api, "")?,
        })
    }

    /// Prunes and defaults `obj` in place, then validates it (against `old` on an update).
    pub fn admit(&self, obj: &mut Value, old: Option<&Value>) -> Result<(), Vec<Cause>> {
        self.root.prune_and_default(obj, true);
        let mut causes = Vec::new();
        self.root.check(obj, old, "", &mut causes);
        // As kube-apiserver does, rules are not evaluated over a value of the wrong shape or
        // size (their cost could not be bounded); it says so.
        if causes.iter().any(|c| BLOCKING.contains(&c.reason)) {
            if self.root.has_rules {
                causes.push(Cause {
                    reason: "FieldValueInvalid",
                    field: "<nil>".to_string(),
                    message: "Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation".to_string(),
                });
            }
        } else {
            self.root.check_rules(obj, old, "", &mut causes);
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(causes)
        }
    }
}

#[cfg(test)]
mod tests;
