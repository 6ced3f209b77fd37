//! How many pods a PodDisruptionBudget expects and how many of them must stay healthy, as
//! kube-controller-manager's disruption controller counts them, which is what kube-apiserver's
//! Eviction API then enforces through the budget's status:
//! - an integer `minAvailable`: the selected pods are expected, that many must stay healthy;
//! - `maxUnavailable`, or a percentage `minAvailable`: the expected pods are the sum of the
//!   scale (`spec.replicas`) of the selected pods' controllers, a ReplicaSet of a Deployment
//!   counting as its Deployment. A pod with no controller counts for nothing (the real controller
//!   says so in an `UnmanagedPods` Event), so bare pods alone allow no disruption at all; a
//!   controller that cannot be found fails safe, allowing none either.

use std::collections::BTreeSet;

use serde_json::Value;

use super::registry::{Registry, ResourceDef};
use super::store::Inner;

/// The workload kinds whose scale is read, with their group and plural.
const WORKLOADS: [(&str, &str, &str); 4] = [
    ("Deployment", "apps", "deployments"),
    ("ReplicaSet", "apps", "replicasets"),
    ("StatefulSet", "apps", "statefulsets"),
    ("ReplicationController", "", "replicationcontrollers"),
];

/// What a budget asks of its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expectation {
    pub expected: i64,
    pub desired: i64,
}

impl Expectation {
    /// Disruptions allowed with `healthy` pods: none while no pod is expected.
    pub fn allowed(&self, healthy: i64) -> i64 {
        if self.expected <= 0 {
            return 0;
        }
        (healthy - self.desired).max(0)
    }
}

/// A workload object by kind and name, in the budget's namespace.
pub(crate) type Workloads<'a> = dyn Fn(&str, &str) -> Option<Value> + 'a;

/// `pdb`'s expectation over the pods it `selected`; an error names an unreadable field.
pub(crate) fn expectation(
    pdb: &Value,
    selected: &[&Value],
    workloads: &Workloads<'_>,
) -> Result<Expectation, String> {
    let count = selected.len() as i64;
    if let Some(min) = pdb.pointer("/spec/minAvailable") {
        if min.is_i64() {
            let desired = scaled(min, count).map_err(|e| format!("spec.minAvailable: {e}"))?;
            return Ok(Expectation {
                expected: count,
                desired,
            });
        }
        let expected = controllers_scale(selected, workloads);
        let desired = scaled(min, expected).map_err(|e| format!("spec.minAvailable: {e}"))?;
        return Ok(Expectation { expected, desired });
    }
    if let Some(max) = pdb.pointer("/spec/maxUnavailable") {
        let expected = controllers_scale(selected, workloads);
        let max = scaled(max, expected).map_err(|e| format!("spec.maxUnavailable: {e}"))?;
        return Ok(Expectation {
            expected,
            desired: (expected - max).max(0),
        });
    }
    Ok(Expectation {
        expected: count,
        desired: 1,
    })
}

/// The sum of the scale of the pods' controllers, each counted once; 0 when one cannot be found.
fn controllers_scale(pods: &[&Value], workloads: &Workloads<'_>) -> i64 {
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for pod in pods {
        let Some((kind, name)) = controller_of(pod) else {
            continue;
        };
        let Some((key, scale)) = scale_of(workloads, &kind, &name) else {
            return 0;
        };
        if seen.insert(key) {
            total += scale;
        }
    }
    total
}

/// The controller owner reference of `obj`: (kind, name).
fn controller_of(obj: &Value) -> Option<(String, String)> {
    obj.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|o| o["controller"] == true)
        .and_then(|o| Some((o["kind"].as_str()?.into(), o["name"].as_str()?.into())))
}

/// The workload that scales `kind` `name` (a ReplicaSet's Deployment), as (kind, name), and its
/// replicas.
fn scale_of(workloads: &Workloads<'_>, kind: &str, name: &str) -> Option<((String, String), i64)> {
    if !WORKLOADS.iter().any(|(k, _, _)| *k == kind) {
        return None;
    }
    let obj = workloads(kind, name)?;
    if kind == "ReplicaSet"
        && let Some((owner_kind, owner)) = controller_of(&obj)
        && owner_kind == "Deployment"
    {
        return scale_of(workloads, &owner_kind, &owner);
    }
    let replicas = obj.pointer("/spec/replicas").and_then(Value::as_i64);
    Some(((kind.into(), name.into()), replicas.unwrap_or(1)))
}

/// The workload kinds' definitions a store serves, to read them in place.
pub(crate) struct WorkloadDefs(Vec<(&'static str, ResourceDef)>);

impl WorkloadDefs {
    pub fn of(registry: &Registry) -> Self {
        WorkloadDefs(
            WORKLOADS
                .iter()
                .filter_map(|(kind, group, plural)| {
                    registry
                        .lookup(group, "v1", plural)
                        .map(|d| (*kind, d.clone()))
                })
                .collect(),
        )
    }

    /// The namespace's workloads in `inner`.
    pub fn reader<'a>(
        &'a self,
        inner: &'a Inner,
        ns: &'a str,
    ) -> impl Fn(&str, &str) -> Option<Value> + 'a {
        move |kind, name| {
            let (_, def) = self.0.iter().find(|(k, _)| *k == kind)?;
            inner.get(def, ns, name).cloned()
        }
    }
}

/// An integer, or a percentage of `total` rounded up as the disruption controller rounds it.
fn scaled(v: &Value, total: i64) -> Result<i64, String> {
    if let Some(n) = v.as_i64() {
        return Ok(n);
    }
    let s = v
        .as_str()
        .ok_or_else(|| format!("{v} is neither an integer nor a percentage"))?;
    let pct: i64 = s
        .strip_suffix('%')
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("{s:?} is neither an integer nor a percentage"))?;
    Ok((pct * total + 99) / 100)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(owner: Option<(&str, &str)>) -> Value {
        let refs: Vec<Value> = owner
            .map(|(kind, name)| json!({"kind": kind, "name": name, "controller": true}))
            .into_iter()
            .collect();
        json!({"metadata": {"ownerReferences": refs}})
    }

    fn web(kind: &str, name: &str) -> Option<Value> {
        match (kind, name) {
            ("Deployment", "web") => Some(json!({"spec": {"replicas": 4}})),
            ("ReplicaSet", "web-1") => Some(json!({"metadata": {"ownerReferences": [
                {"kind": "Deployment", "name": "web", "controller": true}]},
                "spec": {"replicas": 2}})),
            _ => None,
        }
    }

    fn of(spec: Value, pods: &[Value]) -> Expectation {
        let selected: Vec<&Value> = pods.iter().collect();
        expectation(&json!({ "spec": spec }), &selected, &web).unwrap()
    }

    #[test]
    fn bare_pods_under_max_unavailable_are_not_expected() {
        let bare = [pod(None), pod(None), pod(None)];
        let e = of(json!({"maxUnavailable": 1}), &bare);
        assert_eq!(
            e,
            Expectation {
                expected: 0,
                desired: 0
            }
        );
        assert_eq!(e.allowed(3), 0);
        // A percentage minAvailable counts from the controllers too.
        assert_eq!(of(json!({"minAvailable": "50%"}), &bare).allowed(3), 0);
        // An integer minAvailable counts the pods themselves.
        let e = of(json!({"minAvailable": 2}), &bare);
        assert_eq!(
            e,
            Expectation {
                expected: 3,
                desired: 2
            }
        );
        assert_eq!(e.allowed(3), 1);
    }

    #[test]
    fn controlled_pods_are_expected_from_their_controllers_scale() {
        // Three pods of a ReplicaSet of a Deployment of 4: the Deployment's scale, once.
        let pods = [
            pod(Some(("ReplicaSet", "web-1"))),
            pod(Some(("ReplicaSet", "web-1"))),
            pod(Some(("Deployment", "web"))),
        ];
        let e = of(json!({"maxUnavailable": "50%"}), &pods);
        assert_eq!(
            e,
            Expectation {
                expected: 4,
                desired: 2
            }
        );
        assert_eq!(e.allowed(3), 1);
        // A controller that cannot be found allows nothing.
        let lost = [pod(Some(("ReplicaSet", "gone")))];
        assert_eq!(of(json!({"maxUnavailable": 1}), &lost).allowed(1), 0);
    }

    #[test]
    fn budgets_round_up() {
        let none = |_: &str, _: &str| None;
        let three = [pod(None), pod(None), pod(None)];
        let selected: Vec<&Value> = three.iter().collect();
        let desired = |spec: Value| expectation(&json!({ "spec": spec }), &selected, &none);
        assert_eq!(desired(json!({"minAvailable": 2})).unwrap().desired, 2);
        assert_eq!(scaled(&json!("50%"), 3), Ok(2));
        assert_eq!(scaled(&json!("34%"), 3), Ok(2));
        assert!(desired(json!({"minAvailable": "x"})).is_err());
    }
}
