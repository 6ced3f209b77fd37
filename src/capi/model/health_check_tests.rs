use super::*;
use serde_json::json;

fn machine(version: CapiVersion, annotations: Value, status: Value) -> Machine {
    let v = json!({
        "metadata": {"name": "m", "namespace": "ns", "uid": "u", "resourceVersion": "1",
            "annotations": annotations},
        "spec": {"clusterName": "c", "bootstrap": {},
            "infrastructureRef": {"apiGroup": "infra", "apiVersion": "infra/v1", "kind": "K", "name": "t"}},
        "status": status,
    });
    Machine::from_value(&v, version).expect("machine")
}

#[test]
fn a_machine_health_check_is_seen_in_either_api_version() {
    let cond = |t: &str| json!([{"type": t, "status": "False"}]);
    let none = json!({});
    for (version, status) in [
        (
            CapiVersion::V1Beta2,
            json!({"conditions": cond("HealthCheckSucceeded")}),
        ),
        (
            CapiVersion::V1Beta2,
            json!({"deprecated": {"v1beta1": {"conditions": cond("OwnerRemediated")}}}),
        ),
        (
            CapiVersion::V1Beta1,
            json!({"conditions": cond("HealthCheckSucceeded")}),
        ),
        (
            CapiVersion::V1Beta1,
            json!({"v1beta2": {"conditions": cond("OwnerRemediated")}}),
        ),
    ] {
        assert!(
            machine(version, none.clone(), status.clone()).health_checked,
            "{status}"
        );
    }
    for version in [CapiVersion::V1Beta1, CapiVersion::V1Beta2] {
        let plain = machine(version, none.clone(), json!({"conditions": cond("Ready")}));
        assert!(!plain.health_checked);
        let asked = machine(
            version,
            json!({REMEDIATE_MACHINE_ANNOTATION: ""}),
            json!({}),
        );
        assert!(asked.health_checked);
    }
}
