//! Which Machine a MachineSet removes first when it scales down, as Cluster API's MachineSet
//! controller sorts them (both v1.10 and v1.14): Machines already deleting, then those marked
//! `cluster.x-k8s.io/delete-machine`, then unhealthy ones (no Node yet), then the healthy ones
//! by the set's deletion order, and equal priorities by name. `Random`, the default, is no
//! shuffle: it leaves every healthy Machine at one priority, so the name decides. A rollout
//! removes its old Machines in this order, which is how the controller foresees them.

use std::cmp::Reverse;

use jiff::Timestamp;

use crate::api::wellknown::DELETE_MACHINE_ANNOTATION;
use crate::capi::model::{DeletionOrder, Machine};

/// A Machine's turn in its MachineSet's scale-down under `order`: sorting by it ascending gives
/// the order Cluster API removes them in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Turn {
    priority: u8,
    age: Option<AgeKey>,
    name: String,
}

/// Oldest first, or newest first, among healthy Machines.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum AgeKey {
    Oldest(Option<Timestamp>),
    Newest(Reverse<Option<Timestamp>>),
}

pub(crate) fn turn(order: DeletionOrder, m: &Machine) -> Turn {
    let priority = if m.is_deleting() {
        0
    } else if m.annotations.contains_key(DELETE_MACHINE_ANNOTATION) {
        1
    } else if m.node_ref.is_none() {
        2
    } else {
        3
    };
    let age = match (priority, order) {
        (3, DeletionOrder::Oldest) => Some(AgeKey::Oldest(m.creation_timestamp)),
        (3, DeletionOrder::Newest) => Some(AgeKey::Newest(Reverse(m.creation_timestamp))),
        _ => None,
    };
    Turn {
        priority,
        age,
        name: m.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::version::CapiVersion;

    fn machine(name: &str, created: &str, node: bool, marked: bool) -> Machine {
        let mut v = serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": "1",
                         "creationTimestamp": created,
                         "labels": {"cluster.x-k8s.io/cluster-name": "c"}},
            "spec": {"clusterName": "c", "bootstrap": {}, "infrastructureRef": {"apiGroup": "x", "kind": "K", "name": name}},
        });
        if node {
            v["status"] = serde_json::json!({"nodeRef": {"name": name}});
        }
        if marked {
            v["metadata"]["annotations"] = serde_json::json!({DELETE_MACHINE_ANNOTATION: ""});
        }
        Machine::from_value(&v, CapiVersion::V1Beta2).expect("a Machine")
    }

    fn sorted(order: DeletionOrder) -> Vec<String> {
        let mut ms = [
            machine("d-old", "2026-01-01T00:00:00Z", true, false),
            machine("a-new", "2026-01-03T00:00:00Z", true, false),
            machine("c-booting", "2026-01-04T00:00:00Z", false, false),
            machine("z-marked", "2026-01-05T00:00:00Z", true, true),
        ];
        ms.sort_by_key(|m| turn(order, m));
        ms.iter().map(|m| m.name.clone()).collect()
    }

    #[test]
    fn marked_then_unhealthy_then_the_sets_order_with_names_breaking_ties() {
        assert_eq!(
            sorted(DeletionOrder::Random),
            ["z-marked", "c-booting", "a-new", "d-old"]
        );
        assert_eq!(
            sorted(DeletionOrder::Oldest),
            ["z-marked", "c-booting", "d-old", "a-new"]
        );
        assert_eq!(
            sorted(DeletionOrder::Newest),
            ["z-marked", "c-booting", "a-new", "d-old"]
        );
    }
}
