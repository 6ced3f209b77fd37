//! The provisioner's watch of Pods: the pod index kept current, and a batch opened or extended
//! for each pod that becomes provisionable.

use std::time::Instant;

use actix::prelude::*;
use jiff::Timestamp;
use kube::runtime::watcher;

use super::{Provisioner, Watched};
use crate::state::pods;

impl StreamHandler<Watched> for Provisioner {
    fn handle(&mut self, ev: Watched, ctx: &mut Self::Context) {
        let m = &self.shared.metrics;
        match &ev {
            Watched::Pod(ev) => self.pods_stale.saw(ev, m),
        }
        match ev {
            Watched::Pod(Ok(ev)) => match ev {
                watcher::Event::Init => self.pod_buffer = pods::Pods::default(),
                watcher::Event::InitApply(p) => {
                    self.pod_buffer.apply(p);
                }
                watcher::Event::InitDone => {
                    let fresh = std::mem::take(&mut self.pod_buffer);
                    // Pod events missed while the watch was down (scheduled, terminating).
                    let now = Timestamp::now();
                    let events: Vec<(String, Timestamp)> = {
                        let index = self.shared.state.pods.read();
                        fresh.each_on_a_node(|p| {
                            let old = index.get(&pods::key(p));
                            let at = pods::pod_event_time(old.as_deref(), p, now)?;
                            Some((pods::node_name(p)?.to_string(), at))
                        })
                    };
                    for (node, at) in events {
                        self.shared.router.pod_changed(&node, Some(at));
                    }
                    // Pods we provisioned for that were bound while the watch was down.
                    let bound = fresh.each_on_a_node(|p| {
                        let key = pods::key(p);
                        let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
                        self.waiting.contains_key(&key).then_some((key, created))
                    });
                    for (key, created) in bound {
                        self.started(&key, created);
                    }
                    self.shared.state.pods.write().replace_with(fresh);
                    // Pods deleted while the watch was down never get a Delete event.
                    let index = self.shared.state.pods.read();
                    self.told.retain(|k, _| index.contains(k));
                    self.waiting.retain(|k, _| index.contains(k));
                    self.nominations.retain(|k, _| index.contains(k));
                    self.shared
                        .state
                        .nominated
                        .write()
                        .retain(|k, _| index.contains(k));
                    drop(index);
                    self.shared.synced.notify_waiters();
                    self.extend_batch(None, ctx);
                }
                watcher::Event::Apply(p) => {
                    let key = pods::key(&p);
                    self.observe_startup(&key, &p);
                    if let Some(node) = pods::node_name(&p) {
                        let old = self.shared.state.pods.read().get(&key);
                        let at = pods::pod_event_time(old.as_deref(), &p, Timestamp::now());
                        self.shared.router.drain_node_changed(node);
                        self.shared.router.pod_changed(node, at);
                    }
                    let newly_bound = pods::node_name(&p).is_some()
                        && self
                            .shared
                            .state
                            .pods
                            .read()
                            .get(&key)
                            .is_none_or(|old| pods::node_name(&old).is_none());
                    let provisionable = self.shared.state.pods.write().apply(p);
                    // A pod bound where a buffer's placeholders were packed takes their room:
                    // the buffer is packed again.
                    if newly_bound && !self.shared.state.buffers.read().is_empty() {
                        self.poke_batch(ctx);
                    }
                    if provisionable {
                        self.extend_batch(Some(&key), ctx);
                        self.waiting.entry(key).or_insert_with(Instant::now);
                    } else {
                        self.told.remove(&key);
                        self.nominations.forget(&key);
                        self.shared.state.nominated.write().remove(&key);
                    }
                }
                watcher::Event::Delete(p) => {
                    let key = pods::key(&p);
                    self.shared.state.pods.write().remove(&key);
                    if let Some(node) = pods::node_name(&p) {
                        // Gone without being seen terminating or terminal first: an event now.
                        let counted =
                            pods::is_terminal(&p) || p.metadata.deletion_timestamp.is_some();
                        let at = (!counted && !pods::is_daemonset_pod(&p)).then(Timestamp::now);
                        self.shared.router.drain_node_changed(node);
                        self.shared.router.pod_changed(node, at);
                    }
                    self.told.remove(&key);
                    self.waiting.remove(&key);
                    self.nominations.forget(&key);
                    self.shared.state.nominated.write().remove(&key);
                }
            },
            Watched::Pod(Err(e)) => {
                tracing::warn!(error = %e, watch = "Pods", "watch failed; it will re-list");
            }
        }
    }
}
