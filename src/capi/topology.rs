//! ClusterClass topologies: whose replicas a node group's are.
//!
//! Cluster API's topology controller makes a managed Cluster's MachineDeployments and
//! MachinePools from `spec.topology.workers`, labels each with the topology entry it came from,
//! and applies the entry's `replicas` to the group on every reconcile, whoever wrote the group's
//! replicas since. An entry that leaves `replicas` unset leaves them to whoever scales the group
//! (Cluster API's own advice for autoscalers). So a group whose entry sets `replicas` cannot be
//! scaled by anyone else: every replica write would be undone, a raise as a surplus Machine
//! deleted, a decrement as a new unclaimed Machine. Such a group is held here: not offered, no
//! replica write, none of its nodes disrupted, never taken for gone either (no drift), and the
//! NodeClass that selects it says which field to unset.

use std::collections::BTreeSet;

use kube::api::DynamicObject;
use serde_json::Value;

use super::kind::ScalableKind;
use super::model::MachineDeployment;

/// Put on every object the topology controller manages.
pub const OWNED_LABEL: &str = "topology.cluster.x-k8s.io/owned";
/// The `spec.topology.workers.machineDeployments[].name` a MachineDeployment was made from.
pub const DEPLOYMENT_NAME_LABEL: &str = "topology.cluster.x-k8s.io/deployment-name";
/// The `spec.topology.workers.machinePools[].name` a MachinePool was made from.
pub(crate) const POOL_NAME_LABEL: &str = "topology.cluster.x-k8s.io/pool-name";

/// One topology entry of a Cluster: its kind of node group and its name.
pub(crate) type Entry = (ScalableKind, String);

/// The entries of `cluster`'s topology that set `replicas` (same path in v1beta1 and v1beta2).
/// A Cluster without a topology has none.
pub(crate) fn entries_with_replicas(cluster: &DynamicObject) -> BTreeSet<Entry> {
    let workers = cluster.data.pointer("/spec/topology/workers");
    let of = |kind: ScalableKind| {
        workers
            .and_then(|w| w.get(kind.topology_workers()))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|e| e.get("replicas").is_some_and(|r| !r.is_null()))
            .filter_map(|e| e.get("name").and_then(Value::as_str))
            .map(move |name| (kind, name.to_string()))
    };
    ScalableKind::ALL.into_iter().flat_map(of).collect()
}

/// The topology entry `md` was made from, when the topology controller manages it.
pub(crate) fn entry_of(md: &MachineDeployment) -> Option<Entry> {
    if !md.labels.contains_key(OWNED_LABEL) {
        return None;
    }
    let label = match md.kind {
        ScalableKind::MachineDeployment => DEPLOYMENT_NAME_LABEL,
        ScalableKind::MachinePool => POOL_NAME_LABEL,
    };
    md.labels.get(label).map(|name| (md.kind, name.clone()))
}

/// Why `md`'s replicas are not ours to write, given the entries of its Cluster that set
/// replicas; None when they are.
pub(crate) fn replicas_held(md: &MachineDeployment, set: &BTreeSet<Entry>) -> Option<String> {
    let entry = entry_of(md)?;
    if !set.contains(&entry) {
        return None;
    }
    let list = match entry.0 {
        ScalableKind::MachineDeployment => "machineDeployments",
        ScalableKind::MachinePool => "machinePools",
    };
    Some(format!(
        "its replicas belong to Cluster {}/{}'s topology (spec.topology.workers.{list}[name={}].replicas is set, and Cluster API's topology controller undoes any other replica write); unset that field to let the controller scale it",
        md.namespace, md.cluster_name, entry.1
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster(workers: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"topology": {"classRef": {"name": "cc"}, "version": "v1.33.0",
                                  "workers": workers}},
        }))
        .expect("a Cluster")
    }

    fn group(kind: ScalableKind, labels: &[(&str, &str)]) -> MachineDeployment {
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let v = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
            "metadata": {"name": "c-md-0-abcde", "namespace": "ns", "uid": "u",
                         "resourceVersion": "1", "labels": labels},
            "spec": {"clusterName": "c",
                     "selector": {"matchLabels": {"cluster.x-k8s.io/cluster-name": "c"}},
                     "template": {"spec": {"clusterName": "c", "bootstrap": {},
                                  "infrastructureRef": {"apiGroup": "infra", "kind": "K", "name": "t"}}}}
        });
        let mut md =
            MachineDeployment::from_value(&v, crate::capi::CapiVersion::V1Beta2).expect("an MD");
        // The pool reading needs a MachinePool's fields; the rule reads only the kind.
        md.kind = kind;
        md
    }

    #[test]
    fn only_entries_that_set_replicas_are_read() {
        let c = cluster(json!({
            "machineDeployments": [
                {"class": "default", "name": "md-0"},
                {"class": "default", "name": "md-1", "replicas": 3},
                {"class": "default", "name": "md-2", "replicas": null},
            ],
            "machinePools": [{"class": "default", "name": "mp-0", "replicas": 0}],
        }));
        assert_eq!(
            entries_with_replicas(&c),
            BTreeSet::from([
                (ScalableKind::MachineDeployment, "md-1".to_string()),
                (ScalableKind::MachinePool, "mp-0".to_string()),
            ])
        );
    }

    #[test]
    fn a_cluster_without_a_topology_holds_nothing() {
        let c: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": "c", "namespace": "ns"}, "spec": {},
        }))
        .expect("a Cluster");
        assert!(entries_with_replicas(&c).is_empty());
    }

    #[test]
    fn a_group_is_held_only_by_its_own_entry_when_the_topology_owns_it() {
        let set = BTreeSet::from([(ScalableKind::MachineDeployment, "md-1".to_string())]);
        let owned = |name| {
            group(
                ScalableKind::MachineDeployment,
                &[(OWNED_LABEL, ""), (DEPLOYMENT_NAME_LABEL, name)],
            )
        };
        let why = replicas_held(&owned("md-1"), &set).expect("held");
        assert!(
            why.contains("spec.topology.workers.machineDeployments[name=md-1].replicas"),
            "{why}"
        );
        assert!(why.contains("Cluster ns/c"), "{why}");
        assert_eq!(replicas_held(&owned("md-0"), &set), None);
        // The name label alone (say, copied by hand) is not the topology's ownership.
        let unowned = group(
            ScalableKind::MachineDeployment,
            &[(DEPLOYMENT_NAME_LABEL, "md-1")],
        );
        assert_eq!(replicas_held(&unowned, &set), None);
    }

    #[test]
    fn a_pool_is_matched_by_its_pool_name_label() {
        let set = BTreeSet::from([(ScalableKind::MachinePool, "md-1".to_string())]);
        let pool = group(
            ScalableKind::MachinePool,
            &[(OWNED_LABEL, ""), (POOL_NAME_LABEL, "md-1")],
        );
        assert!(replicas_held(&pool, &set).is_some());
        let deployment_of_same_name = group(
            ScalableKind::MachineDeployment,
            &[(OWNED_LABEL, ""), (DEPLOYMENT_NAME_LABEL, "md-1")],
        );
        assert_eq!(replicas_held(&deployment_of_same_name, &set), None);
    }
}
