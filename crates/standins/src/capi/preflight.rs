//! Cluster API's MachineSet preflight checks, as far as the stand-in plays them: the control
//! plane's `ControlPlaneIsStable` check, failing while the simulator's switch
//! `CONTROL_PLANE_UPGRADING_ANNOTATION` is "true" on the MachineSet (carried from its
//! MachineDeployment, as every annotation). Real Cluster API (v1.14,
//! `core/reconcilers/machineset/machineset_preflight.go`) then creates no Machine for a
//! scale-up, retries, and reports the failing check in the set's conditions in both API
//! versions' shapes; the stand-in does the same with the same words, and honours Cluster API's
//! skip annotation. A set never switched gets no conditions (the stand-in writes none
//! otherwise), so runs that do not use the switch write what they wrote before.

use jiff::Timestamp;
use kube::ResourceExt;
use kube::core::DynamicObject;
use serde_json::{Value, json};

use super::CapiVersion;
use crate::standin::str_at;

/// Simulator switch on a MachineDeployment (carried to its MachineSets): while "true", its
/// Cluster's control plane counts as upgrading, so Cluster API's `ControlPlaneIsStable`
/// preflight check holds every scale-up of the set. "false" lifts it (an annotation removed
/// from the MachineDeployment stays on its sets, as with `FAIL_LAUNCHES_ANNOTATION`).
pub const CONTROL_PLANE_UPGRADING_ANNOTATION: &str =
    "sim.karpenter.cluster.x-k8s.io/control-plane-upgrading";

const CONTROL_PLANE_IS_STABLE: &str = "ControlPlaneIsStable";

/// Cluster API's reason on `MachinesCreated` while a preflight check fails.
const PREFLIGHT_CHECK_FAILED: &str = "PreflightCheckFailed";

/// Cluster API's annotation listing the preflight checks a MachineSet skips (`All` or names,
/// comma-separated).
pub const SKIP_PREFLIGHT_CHECKS_ANNOTATION: &str =
    "machineset.cluster.x-k8s.io/skip-preflight-checks";

/// The kind of the simulated clusters' minimal control plane: the real-Cluster-API backend's
/// provider serves it (`sim::real::provider`), and the check's message names it as Cluster API
/// names the control plane it reads.
pub const CONTROL_PLANE_KIND: &str = "SimControlPlane";

/// Whether the switch was ever set on `ms` (either value): only then are conditions written.
pub fn switched(ms: &DynamicObject) -> bool {
    ms.annotations()
        .contains_key(CONTROL_PLANE_UPGRADING_ANNOTATION)
}

/// The failing check's message when a scale-up of `ms` would run its preflight checks now, as
/// Cluster API words it; None when the check passes or is skipped.
pub fn failure(ms: &DynamicObject) -> Option<String> {
    let annotations = ms.annotations();
    if annotations
        .get(CONTROL_PLANE_UPGRADING_ANNOTATION)
        .is_none_or(|v| v != "true")
    {
        return None;
    }
    let skipped = annotations
        .get(SKIP_PREFLIGHT_CHECKS_ANNOTATION)
        .is_some_and(|list| {
            list.split(',')
                .map(str::trim)
                .any(|c| c == "All" || c == CONTROL_PLANE_IS_STABLE)
        });
    if skipped {
        return None;
    }
    let ns = ms.namespace().unwrap_or_default();
    let cluster = str_at(&ms.data, &["spec", "clusterName"]).unwrap_or_default();
    // The control plane's `namespace/name`: the real-Cluster-API backend's provider names its
    // control plane after the Cluster.
    Some(format!(
        "{CONTROL_PLANE_KIND} {ns}/{cluster} is upgrading (\"{CONTROL_PLANE_IS_STABLE}\" preflight check failed)"
    ))
}

/// The status fields carrying the set's `ScalingUp` (v1beta2) and `MachinesCreated` (v1beta1)
/// conditions in `version`'s shape, after a reconcile that saw `current` Machines of `desired`
/// and, if the scale-up was held, why. Each condition keeps its transition time while its
/// status stays.
pub fn status_conditions(
    version: CapiVersion,
    ms: &DynamicObject,
    current: i64,
    desired: i64,
    held: Option<&str>,
) -> Vec<(&'static str, Value)> {
    let status = ms.data.get("status");
    let (v1beta2_path, v1beta1_path): (&[&str], &[&str]) = match version {
        CapiVersion::V1Beta2 => (&["conditions"], &["deprecated", "v1beta1", "conditions"]),
        CapiVersion::V1Beta1 => (&["v1beta2", "conditions"], &["conditions"]),
    };
    let existing = |path: &[&str], type_: &str| -> Option<Value> {
        let mut at = status?;
        for p in path {
            at = at.get(*p)?;
        }
        at.as_array()?
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
            .cloned()
    };
    let with_time = |mut c: Value, before: Option<Value>| {
        let kept = before
            .filter(|b| b.get("status") == c.get("status"))
            .and_then(|b| b.get("lastTransitionTime").cloned());
        let now =
            Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH);
        c["lastTransitionTime"] = kept.unwrap_or_else(|| json!(now.to_string()));
        c
    };

    let scaling_up = if current < desired {
        let mut message = format!("Scaling up from {current} to {desired} replicas");
        if let Some(why) = held {
            message.push_str(&format!(" is blocked because:\n* {why}"));
        }
        json!({"type": "ScalingUp", "status": "True", "reason": "ScalingUp", "message": message})
    } else {
        // A v1beta2 condition's message is required, empty or not.
        json!({"type": "ScalingUp", "status": "False", "reason": "NotScalingUp", "message": ""})
    };
    let scaling_up = with_time(scaling_up, existing(v1beta2_path, "ScalingUp"));

    // As Cluster API: False while a check fails; True once the set is not short of Machines;
    // otherwise left as it was (so it still says PreflightCheckFailed while the Machines the
    // passed check let through are being made).
    let before = existing(v1beta1_path, "MachinesCreated");
    let machines_created = match held {
        Some(why) => Some(json!({"type": "MachinesCreated", "status": "False",
            "severity": "Error", "reason": PREFLIGHT_CHECK_FAILED, "message": why})),
        None if current >= desired => Some(json!({"type": "MachinesCreated", "status": "True"})),
        None => before.clone(),
    };
    let machines_created = machines_created.map(|c| with_time(c, before));

    // The lists are written whole: the conditions other writers put there (Paused) stay.
    let others = |path: &[&str], type_: &str| -> Vec<Value> {
        let mut at = status;
        for p in path {
            at = at.and_then(|a| a.get(*p));
        }
        at.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|c| c.get("type").and_then(Value::as_str) != Some(type_))
            .cloned()
            .collect()
    };
    let mut v1beta1_list = others(v1beta1_path, "MachinesCreated");
    v1beta1_list.extend(machines_created);
    let mut v1beta2_list = others(v1beta2_path, "ScalingUp");
    v1beta2_list.push(scaling_up);
    let (v1beta1_list, v1beta2_list) = (json!(v1beta1_list), json!(v1beta2_list));
    match version {
        CapiVersion::V1Beta2 => vec![
            ("conditions", v1beta2_list),
            (
                "deprecated",
                json!({"v1beta1": {"conditions": v1beta1_list}}),
            ),
        ],
        CapiVersion::V1Beta1 => vec![
            ("conditions", v1beta1_list),
            ("v1beta2", json!({"conditions": v1beta2_list})),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(annotations: Value, status: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
            "metadata": {"name": "md-0-a", "namespace": "ns", "annotations": annotations},
            "spec": {"clusterName": "sim"},
            "status": status,
        }))
        .expect("a MachineSet")
    }

    /// The held scale-up's words, the conditions that carry them in both shapes, and the
    /// skip annotation. That the controller reads these conditions as real Cluster API's is
    /// the controller crate's test (`capi::preflight`), which sees both.
    #[test]
    fn a_held_scale_up_says_why_in_both_shapes() {
        for version in [CapiVersion::V1Beta2, CapiVersion::V1Beta1] {
            let held = set(
                json!({CONTROL_PLANE_UPGRADING_ANNOTATION: "true"}),
                json!({}),
            );
            let why = failure(&held).expect("the check fails");
            assert_eq!(
                why,
                "SimControlPlane ns/sim is upgrading (\"ControlPlaneIsStable\" preflight check failed)"
            );
            let status = json!(
                status_conditions(version, &held, 0, 1, Some(&why))
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect::<serde_json::Map<String, Value>>()
            );
            let (scaling_up, created) = match version {
                CapiVersion::V1Beta2 => ("/conditions/0", "/deprecated/v1beta1/conditions/0"),
                CapiVersion::V1Beta1 => ("/v1beta2/conditions/0", "/conditions/0"),
            };
            let message = status.pointer(&format!("{scaling_up}/message"));
            assert!(
                message
                    .and_then(Value::as_str)
                    .is_some_and(|m| m.ends_with(&why)),
                "{version:?}: {status:#}"
            );
            assert_eq!(
                status.pointer(&format!("{created}/reason")),
                Some(&json!(PREFLIGHT_CHECK_FAILED))
            );
            let lifted = set(
                json!({CONTROL_PLANE_UPGRADING_ANNOTATION: "false"}),
                json!({}),
            );
            assert_eq!(failure(&lifted), None);
        }
        let skipped = set(
            json!({CONTROL_PLANE_UPGRADING_ANNOTATION: "true",
                   SKIP_PREFLIGHT_CHECKS_ANNOTATION: "KubeadmVersionSkew, ControlPlaneIsStable"}),
            json!({}),
        );
        assert_eq!(failure(&skipped), None);
    }
}
