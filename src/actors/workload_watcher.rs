//! The watches on Services, ReplicaSets, StatefulSets and ReplicationControllers (workload
//! cluster), started only when `--scheduler-config` sets default topology spread constraints.
//! Each object is cut down to its selector as it arrives (`state.workloads`): a ReplicaSet's
//! pod template is never kept, not even while a re-list is buffered. A change pokes the
//! provisioner: a pod's deduced selector may have changed.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{ReplicationController, Service};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::Shared;
use crate::scheduling::default_spread::{
    OwnerSelector, REPLICA_SET, REPLICATION_CONTROLLER, STATEFUL_SET, WorkloadKey, Workloads,
};
use crate::state::workloads::Kind;

/// One watched object, as much of it as a deduction reads.
#[derive(Clone, Debug)]
enum Entry {
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

type Event = Result<watcher::Event<Entry>, watcher::Error>;

/// The event with its object cut down to an [`Entry`].
fn trimmed<K>(ev: Result<watcher::Event<K>, watcher::Error>, cut: fn(&K) -> Entry) -> Event {
    ev.map(|e| match e {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(cut(&o)),
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::Apply(o) => watcher::Event::Apply(cut(&o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(cut(&o)),
    })
}

pub struct WorkloadWatcher {
    shared: Arc<Shared>,
    /// A re-list in progress, by kind.
    buffers: [Vec<Entry>; 4],
}

impl WorkloadWatcher {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            buffers: Default::default(),
        }
    }
}

impl Actor for WorkloadWatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        use futures::StreamExt;
        let client = self.shared.workload.clone();
        let cfg = watcher::Config::default;
        let services = watcher(Api::<Service>::all(client.clone()), cfg())
            .default_backoff()
            .map(|e| (Kind::Services, trimmed(e, service)));
        let replica_sets = watcher(Api::<ReplicaSet>::all(client.clone()), cfg())
            .default_backoff()
            .map(|e| (Kind::ReplicaSets, trimmed(e, replica_set)));
        let stateful_sets = watcher(Api::<StatefulSet>::all(client.clone()), cfg())
            .default_backoff()
            .map(|e| (Kind::StatefulSets, trimmed(e, stateful_set)));
        let controllers = watcher(Api::<ReplicationController>::all(client), cfg())
            .default_backoff()
            .map(|e| {
                (
                    Kind::ReplicationControllers,
                    trimmed(e, replication_controller),
                )
            });
        ctx.add_stream(futures::stream::select(
            futures::stream::select(services, replica_sets),
            futures::stream::select(stateful_sets, controllers),
        ));
    }
}

impl StreamHandler<(Kind, Event)> for WorkloadWatcher {
    fn handle(&mut self, (kind, ev): (Kind, Event), _: &mut Self::Context) {
        let buffer = &mut self.buffers[kind as usize];
        let mut index = self.shared.state.workloads.write();
        match ev {
            Ok(watcher::Event::Init) => buffer.clear(),
            Ok(watcher::Event::InitApply(e)) => buffer.push(e),
            Ok(watcher::Event::InitDone) => {
                let w = index.edit();
                match kind {
                    Kind::Services => w.clear_services(),
                    Kind::ReplicaSets => w.clear_owners(REPLICA_SET.1),
                    Kind::StatefulSets => w.clear_owners(STATEFUL_SET.1),
                    Kind::ReplicationControllers => w.clear_owners(REPLICATION_CONTROLLER.1),
                }
                for e in std::mem::take(buffer) {
                    e.put(w);
                }
                index.mark_listed(kind);
                self.shared.synced.notify_waiters();
            }
            Ok(watcher::Event::Apply(e)) => e.put(index.edit()),
            Ok(watcher::Event::Delete(e)) => e.remove(index.edit()),
            Err(e) => tracing::warn!(error = %e, ?kind, "workload watch failed; it will re-list"),
        }
        drop(index);
        self.shared.router.provisioner_poke();
    }
}
