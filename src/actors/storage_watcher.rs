//! The watches on PersistentVolumeClaims, PersistentVolumes, StorageClasses and CSINodes
//! (workload cluster), kept in `state.storage` as the little volume topology and volume limits
//! read. A change pokes the
//! provisioner: a pod whose claim was missing may now be provisionable.

use std::sync::Arc;

use actix::prelude::*;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::Shared;
use crate::scheduling::volumes::csinode_limits;
use crate::state::storage::{Kind, Storage};
use kube::ResourceExt;

type Event<K> = Result<watcher::Event<K>, watcher::Error>;

/// Boxed: a PersistentVolume event is several times the size of the others.
enum Watched {
    Claim(Box<Event<PersistentVolumeClaim>>),
    Volume(Box<Event<PersistentVolume>>),
    Class(Box<Event<StorageClass>>),
    CsiNode(Box<Event<CSINode>>),
}

pub struct StorageWatcher {
    shared: Arc<Shared>,
    claims: Vec<PersistentVolumeClaim>,
    volumes: Vec<PersistentVolume>,
    classes: Vec<StorageClass>,
    csinodes: Vec<CSINode>,
}

impl StorageWatcher {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            claims: Vec::new(),
            volumes: Vec::new(),
            classes: Vec::new(),
            csinodes: Vec::new(),
        }
    }
}

impl Actor for StorageWatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        use futures::StreamExt;
        let client = self.shared.workload.clone();
        let cfg = watcher::Config::default;
        let claims = watcher(Api::<PersistentVolumeClaim>::all(client.clone()), cfg())
            .default_backoff()
            .map(|e| Watched::Claim(Box::new(e)));
        let volumes = watcher(Api::<PersistentVolume>::all(client.clone()), cfg())
            .default_backoff()
            .map(|e| Watched::Volume(Box::new(e)));
        let classes = watcher(Api::<StorageClass>::all(client.clone()), cfg())
            .default_backoff()
            .map(|e| Watched::Class(Box::new(e)));
        let csinodes = watcher(Api::<CSINode>::all(client), cfg())
            .default_backoff()
            .map(|e| Watched::CsiNode(Box::new(e)));
        ctx.add_stream(futures::stream::select(
            futures::stream::select(claims, csinodes),
            futures::stream::select(volumes, classes),
        ));
    }
}

/// Applies one watch event of one kind: buffers a re-list and swaps it in whole when done.
fn apply<K: Clone>(
    ev: Event<K>,
    buffer: &mut Vec<K>,
    kind: Kind,
    shared: &Shared,
    put: fn(&mut Storage, &K),
    relist: fn(&mut Storage),
    remove: fn(&mut Storage, &K),
) {
    let mut storage = shared.state.storage.write();
    match ev {
        Ok(watcher::Event::Init) => buffer.clear(),
        Ok(watcher::Event::InitApply(o)) => buffer.push(o),
        Ok(watcher::Event::InitDone) => {
            relist(&mut storage);
            for o in std::mem::take(buffer) {
                put(&mut storage, &o);
            }
            storage.mark_listed(kind);
        }
        Ok(watcher::Event::Apply(o)) => put(&mut storage, &o),
        Ok(watcher::Event::Delete(o)) => remove(&mut storage, &o),
        Err(e) => tracing::warn!(error = %e, ?kind, "storage watch failed; it will re-list"),
    }
}

impl StreamHandler<Watched> for StorageWatcher {
    fn handle(&mut self, ev: Watched, _: &mut Self::Context) {
        let shared = &self.shared;
        match ev {
            Watched::Claim(ev) => apply(
                *ev,
                &mut self.claims,
                Kind::Claims,
                shared,
                |s, o| s.catalog.apply_claim(o),
                |s| s.catalog.claims.clear(),
                |s, o| s.catalog.remove_claim(o),
            ),
            Watched::Volume(ev) => apply(
                *ev,
                &mut self.volumes,
                Kind::Volumes,
                shared,
                |s, o| s.catalog.apply_volume(o),
                |s| s.catalog.volumes.clear(),
                |s, o| s.catalog.remove_volume(o),
            ),
            Watched::Class(ev) => apply(
                *ev,
                &mut self.classes,
                Kind::Classes,
                shared,
                |s, o| s.catalog.apply_class(o),
                |s| s.catalog.classes.clear(),
                |s, o| s.catalog.remove_class(o),
            ),
            Watched::CsiNode(ev) => apply(
                *ev,
                &mut self.csinodes,
                Kind::CsiNodes,
                shared,
                |s, o| {
                    s.csi_limits.insert(o.name_any(), csinode_limits(o));
                },
                |s| s.csi_limits.clear(),
                |s, o| {
                    s.csi_limits.remove(&o.name_any());
                },
            ),
        }
        shared.router.provisioner_poke();
    }
}
