use serde_json::Value;

use super::*;

fn pod(annotations: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7",
                     "annotations": annotations},
    }))
    .unwrap()
}

fn ops(p: JsonPatch) -> Vec<Value> {
    match p.into_patch().unwrap() {
        kube::api::Patch::Json(patch) => match serde_json::to_value(patch).unwrap() {
            Value::Array(ops) => ops,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

const COST: &str = "/metadata/annotations/controller.kubernetes.io~1pod-deletion-cost";
const MARK: &str = "/metadata/annotations/karpenter.sh~1managed-deletion-cost";

#[test]
fn a_first_write_is_guarded_by_the_resource_version_and_creates_the_map() {
    let got = ops(guarded(&pod(json!({})), &Action::Set(-50)));
    assert_eq!(
        got,
        [
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"}),
            json!({"op": "add", "path": "/metadata/annotations",
             "value": {"controller.kubernetes.io/pod-deletion-cost": "-50"}}),
            json!({"op": "add", "path": MARK, "value": "true"}),
        ]
    );
}

#[test]
fn a_managed_value_is_rewritten_only_as_it_was_read() {
    let managed = pod(json!({
        "controller.kubernetes.io/pod-deletion-cost": "-50",
        "karpenter.sh/managed-deletion-cost": "true",
    }));
    let tests = [
        json!({"op": "test", "path": COST, "value": "-50"}),
        json!({"op": "test", "path": MARK, "value": "true"}),
    ];
    let set = ops(guarded(&managed, &Action::Set(-49)));
    assert_eq!(set[..2], tests);
    assert_eq!(set[2], json!({"op": "add", "path": COST, "value": "-49"}));
    let clear = ops(guarded(&managed, &Action::Clear));
    assert_eq!(
        clear[2..],
        [
            json!({"op": "remove", "path": COST}),
            json!({"op": "remove", "path": MARK})
        ]
    );
    // Released: the marker goes, the other writer's value stays.
    let release = ops(guarded(&managed, &Action::Release));
    assert_eq!(release[2..], [json!({"op": "remove", "path": MARK})]);
}
