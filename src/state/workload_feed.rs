//! How Services, ReplicaSets, StatefulSets and ReplicationControllers (workload cluster) feed
//! the workload index, watched only when `--scheduler-config` sets default topology spread
//! constraints. Each object is cut down to its selector as it arrives: a ReplicaSet's pod
//! template is never kept, not even while a re-list is buffered.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{ReplicationController, Service};
use kube::ResourceExt;

use super::feed::Index;
use super::workloads::{Kind, WorkloadIndex};
use crate::scheduling::default_spread::{
    OwnerSelector, REPLICA_SET, REPLICATION_CONTROLLER, STATEFUL_SET, WorkloadKey, Workloads,
};

/// One watched object, as much of it as a deduction reads.
#[derive(Clone, Debug)]
pub enum Entry {
    Service {
        namespace: String,
        name: String,
        selector: Option<BTreeMap<String, String>>,
    },
    /// None: it adds nothing (a ReplicationController with an empty selector).
    Owner(WorkloadKey, Option<OwnerSelector>),
}

impl Entry {
    fn put(&self, w: &mut Workloads) {
        match self {
            Entry::Service {
                namespace,
                name,
                selector,
            } => w.put_service(namespace, name, selector.as_ref()),
            Entry::Owner(key, Some(selector)) => w.put_owner(key.clone(), selector.clone()),
            Entry::Owner(key, None) => w.remove_owner(key),
        }
    }

    fn remove(&self, w: &mut Workloads) {
        match self {
            Entry::Service {
                namespace, name, ..
            } => w.remove_service(namespace, name),
            Entry::Owner(key, _) => w.remove_owner(key),
        }
    }
}

fn owner_key(kind: &'static str, o: &impl ResourceExt) -> WorkloadKey {
    WorkloadKey {
        kind,
        namespace: o.namespace().unwrap_or_default(),
        name: o.name_any(),
    }
}

fn service(s: &Service) -> Entry {
    Entry::Service {
        namespace: s.namespace().unwrap_or_default(),
        name: s.name_any(),
        selector: s.spec.as_ref().and_then(|spec| spec.selector.clone()),
    }
}

fn replica_set(rs: &ReplicaSet) -> Entry {
    let selector = rs.spec.as_ref().map(|s| &s.selector);
    Entry::Owner(
        owner_key(REPLICA_SET.1, rs),
        Some(OwnerSelector::from_label_selector(selector)),
    )
}

fn stateful_set(ss: &StatefulSet) -> Entry {
    let selector = ss.spec.as_ref().map(|s| &s.selector);
    Entry::Owner(
        owner_key(STATEFUL_SET.1, ss),
        Some(OwnerSelector::from_label_selector(selector)),
    )
}

fn replication_controller(rc: &ReplicationController) -> Entry {
    let selector = rc
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .filter(|s| !s.is_empty());
    Entry::Owner(
        owner_key(REPLICATION_CONTROLLER.1, rc),
        selector.map(OwnerSelector::Labels),
    )
}

/// One implementation per kind; `cut` keeps what a deduction reads, `clear` empties that kind
/// before a re-list is swapped in.
macro_rules! workload_index {
    ($k:ty, $kind:expr, $cut:ident, |$w:ident| $clear:expr) => {
        impl Index<$k> for WorkloadIndex {
            type Kept = Entry;
            type Listing = Vec<Self::Kept>;
            type Changed = ();
            fn keep(obj: $k) -> Entry {
                $cut(&obj)
            }
            fn apply(&mut self, e: Entry) {
                e.put(self.edit());
            }
            fn delete(&mut self, e: Entry) {
                e.remove(self.edit());
            }
            fn reset(&mut self, all: Vec<Entry>) {
                let $w = self.edit();
                $clear;
                for e in all {
                    e.put($w);
                }
                self.mark_listed($kind);
            }
            fn synced(&self) -> bool {
                self.listed($kind)
            }
        }
    };
}

workload_index!(Service, Kind::Services, service, |w| w.clear_services());
workload_index!(ReplicaSet, Kind::ReplicaSets, replica_set, |w| w
    .clear_owners(REPLICA_SET.1));
workload_index!(StatefulSet, Kind::StatefulSets, stateful_set, |w| w
    .clear_owners(STATEFUL_SET.1));
workload_index!(
    ReplicationController,
    Kind::ReplicationControllers,
    replication_controller,
    |w| w.clear_owners(REPLICATION_CONTROLLER.1)
);
