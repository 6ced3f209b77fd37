//! The pod subresources a controller posts to: `binding` (the scheduler's) and `eviction`
//! (the drain path, blocked by PodDisruptionBudgets with 429 as kube-apiserver does).

use serde_json::{Value, json};

use super::clock::now_rfc3339;
use super::errors::ApiError;
use super::pdb_expected::{WorkloadDefs, expectation};
use super::registry::ResourceDef;
use super::selectors::LabelSelector;
use super::store::{DeleteOpts, Inner, Part, is_deleting};

/// The Status a successful binding or eviction answers with (HTTP 201).
pub fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

/// POST pods/{name}/binding: sets spec.nodeName and PodScheduled=True; 409 if already bound.
pub fn bind(
    inner: &mut Inner,
    pods: &ResourceDef,
    ns: &str,
    name: &str,
    body: &Value,
) -> Result<Value, ApiError> {
    let target = body
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "Binding \"{name}\" is invalid: target.name: Required value"
            ))
        })?;
    let pod = inner
        .get(pods, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found("", "pods", name))?;
    if let Some(node) = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        return Err(ApiError::conflict_with(
            "",
            "pods",
            name,
            &format!("pod {name} is already assigned to node \"{node}\""),
        ));
    }
    if is_deleting(&pod) {
        return Err(ApiError::conflict_with(
            "",
            "pods",
            name,
            "pod is being deleted, cannot be assigned to a host",
        ));
    }
    let mut bound = pod.clone();
    if let Some(spec) = bound.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("nodeName".into(), json!(target));
    } else if let Some(o) = bound.as_object_mut() {
        o.insert("spec".into(), json!({"nodeName": target}));
    }
    let updated = inner.update(pods, ns, name, bound, Part::Main)?;
    let mut with_condition = updated.clone();
    set_condition(
        &mut with_condition,
        json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}),
    );
    inner.update(pods, ns, name, with_condition, Part::Status)?;
    Ok(success())
}

fn set_condition(pod: &mut Value, cond: Value) {
    let Some(obj) = pod.as_object_mut() else {
        return;
    };
    let status = obj.entry("status").or_insert_with(|| json!({}));
    let Some(status) = status.as_object_mut() else {
        return;
    };
    let conds = status.entry("conditions").or_insert_with(|| json!([]));
    let Some(list) = conds.as_array_mut() else {
        return;
    };
    list.retain(|c| c.get("type") != cond.get("type"));
    list.push(cond);
}

/// POST pods/{name}/eviction: deletes the pod unless a PodDisruptionBudget forbids it (429).
pub fn evict(
    inner: &mut Inner,
    pods: &ResourceDef,
    pdbs: Option<&ResourceDef>,
    workloads: &WorkloadDefs,
    ns: &str,
    name: &str,
    body: &Value,
) -> Result<Value, ApiError> {
    let pod = inner
        .get(pods, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found("", "pods", name))?;
    if !ignores_budgets(&pod)
        && let Some(pdbs) = pdbs
    {
        check_budgets(inner, pods, pdbs, workloads, ns, &pod)?;
    }
    let opts = DeleteOpts {
        uid: body
            .pointer("/deleteOptions/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from),
        resource_version: body
            .pointer("/deleteOptions/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from),
        orphan: false,
        grace_period: body
            .pointer("/deleteOptions/gracePeriodSeconds")
            .and_then(Value::as_i64),
    };
    inner.delete(pods, ns, name, &opts)?;
    Ok(success())
}

/// Whether removing `pod` now would take one of its budgets below what it requires (or hits a
/// pod that more than one budget selects, which the Eviction API refuses too).
pub fn would_violate_budget(
    inner: &Inner,
    pods: &ResourceDef,
    pdbs: &ResourceDef,
    workloads: &WorkloadDefs,
    ns: &str,
    pod: &Value,
) -> bool {
    !ignores_budgets(pod) && check_budgets(inner, pods, pdbs, workloads, ns, pod).is_err()
}

/// Pods that do not count towards a budget can always go: finished, pending, or already deleting.
fn ignores_budgets(pod: &Value) -> bool {
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending");
    matches!(phase, "Succeeded" | "Failed" | "Pending") || is_deleting(pod)
}

pub(crate) fn healthy(pod: &Value) -> bool {
    pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty())
        && !is_deleting(pod)
}

/// Whether the pod's budget allows one more disruption, counted as the disruption controller
/// counts it (module `pdb_expected`): kube-apiserver refuses an eviction when the budget's
/// status allows none.
fn check_budgets(
    inner: &Inner,
    pods: &ResourceDef,
    pdbs: &ResourceDef,
    workloads: &WorkloadDefs,
    ns: &str,
    pod: &Value,
) -> Result<(), ApiError> {
    let matching: Vec<&Value> = inner
        .iter(pdbs, Some(ns))
        .map(|(_, pdb)| pdb)
        .filter(|pdb| {
            LabelSelector::from_object(pdb.pointer("/spec/selector"))
                .is_ok_and(|s| !s.is_empty() && s.matches_object(pod))
        })
        .collect();
    let pdb = match matching.as_slice() {
        [] => return Ok(()),
        [one] => *one,
        _ => {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    };
    let pdb_name = pdb
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let selector = LabelSelector::from_object(pdb.pointer("/spec/selector")).unwrap_or_default();
    let selected: Vec<&Value> = inner
        .iter(pods, Some(ns))
        .map(|(_, p)| p)
        .filter(|p| selector.matches_object(p))
        .collect();
    let healthy = selected.iter().filter(|p| healthy(p)).count() as i64;
    let reader = workloads.reader(inner, ns);
    let budget = expectation(pdb, &selected, &reader).map_err(|field| {
        ApiError::invalid(format!(
            "PodDisruptionBudget \"{pdb_name}\" is invalid: {field}"
        ))
    })?;
    if budget.allowed(healthy) >= 1 {
        return Ok(());
    }
    let desired = budget.desired;
    Err(ApiError::too_many_requests(
        "Cannot evict pod as it would violate the pod's disruption budget.",
        json!([{
            "reason": "DisruptionBudget",
            "message": format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently")
        }]),
    ))
}
