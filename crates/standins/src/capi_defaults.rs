//! Cluster API's defaulting webhooks, as far as the controller can see them: every Machine,
//! MachineSet, MachineDeployment and MachinePool carries the `cluster.x-k8s.io/cluster-name`
//! label of its `spec.clusterName`, set on create and on every update. Anything that filters by
//! Cluster (`--cluster-name`) relies on that label, so the simulated cluster must add it too.

use serde_json::{Value, json};

use super::registry::ResourceDef;
use crate::wellknown::CLUSTER_NAME_LABEL;

const KINDS: [&str; 4] = [
    "machines",
    "machinesets",
    "machinedeployments",
    "machinepools",
];

/// Applies the webhooks' label default to `obj` if it is one of their kinds.
pub fn apply(def: &ResourceDef, obj: &mut Value) {
    if def.group != "cluster.x-k8s.io" || !KINDS.contains(&def.plural.as_str()) {
        return;
    }
    label_with_cluster(obj);
}

/// The webhooks' label default on an object of one of their kinds: its `spec.clusterName` as
/// its `cluster.x-k8s.io/cluster-name` label. Where no webhook runs (a real control plane
/// without Cluster API), whoever creates the object applies it, as the webhook would.
pub fn label_with_cluster(obj: &mut Value) {
    let Some(cluster) = obj["spec"]["clusterName"]
        .as_str()
        .filter(|c| !c.is_empty())
        .map(str::to_string)
    else {
        return;
    };
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let labels = meta.entry("labels").or_insert_with(|| json!({}));
    if let Some(labels) = labels.as_object_mut() {
        labels.insert(CLUSTER_NAME_LABEL.into(), json!(cluster));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(group: &str, plural: &str) -> ResourceDef {
        ResourceDef::custom(group, &["v1beta2"], "Kind", plural, true)
    }

    #[test]
    fn labels_cluster_api_kinds_with_their_cluster() {
        let mut md = json!({"metadata": {"name": "md"}, "spec": {"clusterName": "prod"}});
        apply(&def("cluster.x-k8s.io", "machinedeployments"), &mut md);
        assert_eq!(md["metadata"]["labels"][CLUSTER_NAME_LABEL], "prod");
        // A user's wrong value is overwritten, as the webhook does.
        md["metadata"]["labels"][CLUSTER_NAME_LABEL] = json!("other");
        apply(&def("cluster.x-k8s.io", "machinedeployments"), &mut md);
        assert_eq!(md["metadata"]["labels"][CLUSTER_NAME_LABEL], "prod");
    }

    #[test]
    fn leaves_other_kinds_and_objects_without_a_cluster_alone() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"clusterName": "prod"}});
        apply(&def("", "pods"), &mut pod);
        assert!(pod["metadata"].get("labels").is_none());
        let mut md = json!({"metadata": {"name": "md"}, "spec": {}});
        apply(&def("cluster.x-k8s.io", "machinedeployments"), &mut md);
        assert!(md["metadata"].get("labels").is_none());
    }
}
