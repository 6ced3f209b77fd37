use serde_json::{Value, json};

use super::*;

fn schema(s: Value) -> Schema {
    Schema::compile(&s).expect("compiles")
}

fn fields(r: Result<(), Vec<Cause>>) -> Vec<String> {
    r.err()
        .unwrap_or_default()
        .into_iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect()
}

#[test]
fn every_project_crd_compiles() {
    let r = crate::registry::Registry::new(Default::default(), vec![]);
    assert!(r.is_ok(), "{:?}", r.err());
}

#[test]
fn structural_constraints_are_checked_with_kube_apiserver_messages() {
    let s = schema(json!({
        "type": "object",
        "required": ["spec"],
        "properties": {"spec": {"type": "object", "properties": {
            "weight": {"type": "integer", "minimum": 1, "maximum": 100},
            "op": {"type": "string", "enum": ["In", "NotIn"]},
            "after": {"type": "string", "pattern": "^[0-9]+s$", "default": "0s"},
            "keys": {"type": "array", "maxItems": 1, "items": {"type": "string", "maxLength": 3}},
        }}},
    }));
    let mut ok = json!({"spec": {"weight": 5, "unknown": 1}});
    assert_eq!(fields(s.admit(&mut ok, None)), Vec::<String>::new());
    assert_eq!(
        ok,
        json!({"spec": {"weight": 5, "after": "0s"}}),
        "pruned and defaulted"
    );
    let mut bad =
        json!({"spec": {"weight": 101, "op": "Foo", "after": "x", "keys": ["abcd", "a"]}});
    assert_eq!(
        fields(s.admit(&mut bad, None)),
        vec![
            r#"spec.after: Invalid value: "x": spec.after in body should match '^[0-9]+s$'"#,
            "spec.keys: Too many: 2: must have at most 1 items",
            "spec.keys[0]: Too long: may not be more than 3 bytes",
            r#"spec.op: Unsupported value: "Foo": supported values: "In", "NotIn""#,
            "spec.weight: Invalid value: 101: spec.weight in body should be less than or equal to 100",
        ]
    );
    let mut text = json!({"spec": {"weight": "1"}});
    assert_eq!(
        fields(s.admit(&mut text, None)),
        vec![
            r#"spec.weight: Invalid value: "string": spec.weight in body must be of type integer: "string""#
        ]
    );
    assert_eq!(
        fields(s.admit(&mut json!({}), None)),
        vec!["spec: Required value"]
    );
}

#[test]
fn an_unchanged_invalid_value_ratchets_on_update() {
    let s = schema(json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"n": {"type": "integer", "maximum": 1}}},
        "status": {"type": "object", "properties": {"m": {"type": "integer", "maximum": 1}}},
    }}));
    let old = json!({"spec": {"n": 5}});
    let mut new = json!({"spec": {"n": 5}, "status": {"m": 1}});
    assert!(s.admit(&mut new, Some(&old)).is_ok());
    let mut changed = json!({"spec": {"n": 6}});
    assert!(s.admit(&mut changed, Some(&old)).is_err());
}

#[test]
fn cel_rules_and_transition_rules() {
    let s = schema(json!({"type": "object", "properties": {"spec": {
        "type": "object",
        "x-kubernetes-validations": [{"rule": "self.ref == oldSelf.ref", "message": "ref is immutable"}],
        "properties": {
            "ref": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"},
                "x-kubernetes-validations": [{"rule": "self.all(x, !x.find('^([^/]+)').endsWith('karpenter.sh'))",
                    "message": "restricted"}]},
            "reqs": {"type": "array", "items": {"type": "object", "properties": {
                "values": {"type": "array", "items": {"type": "string"}},
                "minValues": {"type": "integer"}}},
                "x-kubernetes-validations": [
                    {"rule": "self.all(x, has(x.minValues) ? x.values.size() >= x.minValues : true)"},
                    {"rule": "self.all(x, x.values.size() == 0 || int(x.values[0]) >= 0)", "message": "integer"}]},
        },
    }}}));
    let mut ok = json!({"spec": {"ref": "a", "labels": {"a.io/x": "1"}, "reqs": [{"values": ["1"], "minValues": 1}]}});
    assert_eq!(fields(s.admit(&mut ok, None)), Vec::<String>::new());
    let mut bad = json!({"spec": {"labels": {"x.karpenter.sh/y": "1"}, "reqs": [{"values": ["a"], "minValues": 2}]}});
    let got = fields(s.admit(&mut bad, None));
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0], "spec.labels: Invalid value: restricted");
    assert!(
        got[1].contains("failed rule: self.all(x, has(x.minValues)"),
        "{got:?}"
    );
    assert!(
        got[2].starts_with(r#"spec.reqs: Invalid value: "array": "#),
        "{got:?}"
    );
    // A value of the wrong type stops the rules, as kube-apiserver says.
    let mut wrong = json!({"spec": {"labels": {"x.karpenter.sh/y": "1"}, "reqs": "x"}});
    let got = fields(s.admit(&mut wrong, None));
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got[1].starts_with("<nil>: Invalid value: null: some validation rules were not checked")
    );
    let old = json!({"spec": {"ref": "a"}});
    let mut moved = json!({"spec": {"ref": "b"}});
    assert_eq!(
        fields(s.admit(&mut moved, Some(&old))),
        vec!["spec: Invalid value: ref is immutable"]
    );
}

#[test]
fn a_rule_calling_an_unknown_function_does_not_compile() {
    let e = Schema::compile(&json!({"type": "string",
        "x-kubernetes-validations": [{"rule": "isQuantity(self)"}]}))
    .unwrap_err();
    assert!(e.contains("isQuantity"), "{e}");
}
