//! Cluster API's MachineSet preflight checks, as a MachineSet reports them: while a check fails
//! (the control plane is provisioning or upgrading, a version skew), the MachineSet creates no
//! Machine for a replica raise and says why in its conditions. A claim waiting for that Machine
//! shows the reason instead of only timing out.
//!
//! Two shapes carry it, and either API version may hold both (Cluster API v1.10-v1.14):
//! - the v1beta2 `ScalingUp` condition (in `status.conditions` of a v1beta2 object,
//!   `status.v1beta2.conditions` of a v1beta1 one): True, its message "Scaling up from 0 to 1
//!   replicas is blocked because:" followed by one `* <message>` line per failing check (and
//!   one per missing template, which is not a preflight check);
//! - the v1beta1 `MachinesCreated` condition (in `status.conditions` of a v1beta1 object,
//!   `status.deprecated.v1beta1.conditions` of a v1beta2 one): False, reason
//!   `PreflightCheckFailed`, the failing checks' messages joined by "; ".
//!
//! Each check's message ends with `("<check>" preflight check failed)`, e.g.
//! `SimControlPlane default/sim is upgrading ("ControlPlaneIsStable" preflight check failed)`.

use serde_json::Value;

/// The v1beta1 condition's reason for a failing preflight check (also the reason the claim's
/// `Launched` condition carries while one holds its Machine).
pub(crate) const PREFLIGHT_CHECK_FAILED: &str = "PreflightCheckFailed";

/// The words every failing check's message (and a failure to run the checks) contains.
const PREFLIGHT_MARK: &str = "preflight check";

/// The v1beta2 condition of a MachineSet that is scaling up.
const SCALING_UP: &str = "ScalingUp";

/// The v1beta1 condition of a MachineSet's Machine creation.
const MACHINES_CREATED: &str = "MachinesCreated";

/// A MachineSet whose scale-up a preflight check holds: which, and Cluster API's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PreflightHold {
    /// `namespace/name` of the MachineSet.
    pub(crate) machine_set: String,
    /// The failing checks' messages, joined by "; ".
    pub(crate) message: String,
}

/// What holds the MachineSet `object`'s scale-up, if a preflight check does. The v1beta2
/// `ScalingUp` condition decides where there is one: Cluster API recomputes it on every
/// reconcile, while it leaves `MachinesCreated` False until the set has all its Machines (so
/// it still says `PreflightCheckFailed` while the Machines the passed check let through are
/// being made). The v1beta1 condition decides only where no `ScalingUp` is reported.
pub(crate) fn failing_checks(object: &Value) -> Option<String> {
    let lists = [
        "/status/conditions",
        "/status/v1beta2/conditions",
        "/status/deprecated/v1beta1/conditions",
    ];
    let conditions = || {
        lists
            .iter()
            .filter_map(|p| object.pointer(p).and_then(Value::as_array))
            .flatten()
    };
    match conditions().find(|c| field(c, "type") == Some(SCALING_UP)) {
        Some(scaling_up) => scaling_up_blocked(scaling_up),
        None => conditions().find_map(machines_not_created),
    }
}

fn field<'a>(condition: &'a Value, key: &str) -> Option<&'a str> {
    condition.get(key).and_then(Value::as_str)
}

/// The preflight lines of a v1beta2 `ScalingUp` condition that says the scale-up is blocked.
fn scaling_up_blocked(condition: &Value) -> Option<String> {
    if field(condition, "status") != Some("True") {
        return None;
    }
    let lines: Vec<&str> = field(condition, "message")?
        .lines()
        .filter_map(|l| l.trim().strip_prefix("* "))
        .filter(|l| l.contains(PREFLIGHT_MARK))
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// The message of a v1beta1 `MachinesCreated` condition False for a failing preflight check.
fn machines_not_created(condition: &Value) -> Option<String> {
    if field(condition, "type") != Some(MACHINES_CREATED)
        || field(condition, "status") != Some("False")
        || field(condition, "reason") != Some(PREFLIGHT_CHECK_FAILED)
    {
        return None;
    }
    Some(field(condition, "message").unwrap_or_default().to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Cluster API v1.14's words for the control plane upgrading (`runPreflightChecks`).
    const UPGRADING: &str = "SimControlPlane default/sim is upgrading (\"ControlPlaneIsStable\" preflight check failed)";
    const SKEW: &str = "MachineSet version (1.36.0) and ControlPlane version (1.35.0) do not conform to the kubernetes version skew policy as MachineSet version is higher than ControlPlane version (\"KubernetesVersionSkew\" preflight check failed)";

    fn scaling_up(message: &str) -> Value {
        json!({"type": "ScalingUp", "status": "True", "reason": "ScalingUp", "message": message})
    }

    fn machines_created(status: &str, reason: &str, message: &str) -> Value {
        json!({"type": "MachinesCreated", "status": status, "reason": reason,
               "severity": "Error", "message": message})
    }

    /// A v1beta2 MachineSet of Cluster API v1.14: both lists, the v1beta2 one read.
    #[test]
    fn the_v1beta2_shape_names_each_failing_check() {
        let blocked = format!(
            "Scaling up from 0 to 2 replicas is blocked because:\n* {UPGRADING}\n* {SKEW}\n* DevMachineTemplate does not exist"
        );
        let ms = json!({"status": {
            "conditions": [scaling_up(&blocked)],
            "deprecated": {"v1beta1": {"conditions": [
                machines_created("False", "PreflightCheckFailed", "ignored: the v1beta2 list wins")]}},
        }});
        assert_eq!(
            failing_checks(&ms).as_deref(),
            Some(format!("{UPGRADING}; {SKEW}").as_str())
        );
    }

    /// A v1beta1 MachineSet (Cluster API v1.10, or a v1beta1 read of v1.14): both lists agree;
    /// without a v1beta2 list (Cluster API before v1.9) the v1beta1 condition alone.
    #[test]
    fn the_v1beta1_shape_names_the_failing_checks() {
        let both = json!({"status": {
            "conditions": [machines_created("False", "PreflightCheckFailed", UPGRADING)],
            "v1beta2": {"conditions": [scaling_up(&format!(
                "Scaling up from 1 to 2 replicas is blocked because:\n* {UPGRADING}"))]},
        }});
        assert_eq!(failing_checks(&both).as_deref(), Some(UPGRADING));
        let v1beta1_only = json!({"status": {"conditions": [
            machines_created("False", "PreflightCheckFailed", &format!("{UPGRADING}; {SKEW}"))]}});
        assert_eq!(
            failing_checks(&v1beta1_only).as_deref(),
            Some(format!("{UPGRADING}; {SKEW}").as_str())
        );
    }

    /// Scaling up unblocked, blocked only by a missing template, created, or failing for
    /// another reason: no preflight hold.
    #[test]
    fn other_states_hold_nothing() {
        for status in [
            json!({}),
            json!({"conditions": [scaling_up("Scaling up from 0 to 1 replicas")]}),
            json!({"conditions": [scaling_up(
                "Scaling up from 0 to 1 replicas is blocked because:\n* DevMachineTemplate does not exist")]}),
            json!({"conditions": [{"type": "ScalingUp", "status": "False",
                                   "reason": "NotScalingUp", "message": ""}]}),
            json!({"conditions": [machines_created("True", "", "")]}),
            json!({"conditions": [machines_created("False", "MachineCreationFailed", "quota")]}),
            json!({"conditions": "not a list"}),
            // The check passed and the Machines are being made: the v1beta1 condition lags.
            json!({"conditions": [scaling_up("Scaling up from 0 to 1 replicas")],
                   "deprecated": {"v1beta1": {"conditions": [
                       machines_created("False", "PreflightCheckFailed", UPGRADING)]}}}),
        ] {
            assert_eq!(
                failing_checks(&json!({ "status": status })),
                None,
                "{status}"
            );
        }
    }
}

/// The Cluster API stand-in's preflight conditions (crates/standins) read back as real Cluster
/// API's are, in both shapes: held, then (switched off) not. Here, where both crates are seen.
#[cfg(all(test, feature = "simulator"))]
mod against_the_stand_in {
    use kube::core::DynamicObject;
    use serde_json::{Value, json};

    use super::failing_checks;
    use crate::sim::capi::CapiVersion;
    use crate::sim::capi::preflight::{
        CONTROL_PLANE_UPGRADING_ANNOTATION, failure, status_conditions,
    };

    fn set(annotations: Value, status: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
            "metadata": {"name": "md-0-a", "namespace": "ns", "annotations": annotations},
            "spec": {"clusterName": "sim"},
            "status": status,
        }))
        .expect("a MachineSet")
    }

    fn status(version: CapiVersion, ms: &DynamicObject, held: Option<&str>) -> Value {
        let fields: serde_json::Map<String, Value> = status_conditions(version, ms, 0, 1, held)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        json!({ "status": fields })
    }

    #[test]
    fn the_stand_ins_conditions_read_as_cluster_apis() {
        for version in CapiVersion::ALL {
            let held = set(
                json!({CONTROL_PLANE_UPGRADING_ANNOTATION: "true"}),
                json!({}),
            );
            let why = failure(&held).expect("the check fails");
            let object = status(version, &held, Some(&why));
            assert_eq!(
                failing_checks(&object).as_deref(),
                Some(why.as_str()),
                "{version:?}: {object:#}"
            );
            // Lifted while the Machine is on its way: no hold, though MachinesCreated lags.
            let lifted = set(
                json!({CONTROL_PLANE_UPGRADING_ANNOTATION: "false"}),
                object["status"].clone(),
            );
            assert_eq!(failure(&lifted), None);
            assert_eq!(
                failing_checks(&status(version, &lifted, None)),
                None,
                "{version:?}"
            );
        }
    }
}
