//! The provisioner's watch of Pods: the pod index kept current, and a batch opened or extended
//! for each pod that becomes provisionable.

use std::time::Instant;

use actix::prelude::*;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
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
            Watched::Pod(Ok(ev)) => self.pod_event(ev, ctx),
            Watched::Pod(Err(e)) => {
                tracing::warn!(error = %e, watch = "Pods", "watch failed; it will re-list");
            }
        }
    }
}

impl Provisioner {
    fn pod_event(&mut self, ev: watcher::Event<Pod>, ctx: &mut Context<Self>) {
        match ev {
            // A re-list is buffered whole so the index never shows half of it.
            watcher::Event::Init => self.pod_buffer = pods::Pods::default(),
            watcher::Event::InitApply(p) => {
                self.pod_buffer.apply(p);
            }
            watcher::Event::InitDone => self.pods_relisted(ctx),
            watcher::Event::Apply(p) => self.pod_applied(p, ctx),
            watcher::Event::Delete(p) => self.pod_deleted(&p),
        }
    }

    /// A re-list done: it replaces the index, and what happened while the watch was down is
    /// caught up, since no event will say it.
    fn pods_relisted(&mut self, ctx: &mut Context<Self>) {
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
        self.forget_vanished_pods();
        self.shared.synced.notify_waiters();
        self.extend_batch(None, ctx);
    }

    /// Pods deleted while the watch was down never get a Delete event: what is kept about them
    /// goes once the re-listed index no longer holds them.
    fn forget_vanished_pods(&mut self) {
        let index = self.shared.state.pods.read();
        self.told.retain(|k, _| index.contains(k));
        self.waiting.retain(|k, _| index.contains(k));
        self.nominations.retain(|k, _| index.contains(k));
        self.shared
            .state
            .nominated
            .write()
            .retain(|k, _| index.contains(k));
    }

    /// A pod added or changed: its node hears of it, and it joins a batch when it became
    /// provisionable or stops being waited for when it no longer is.
    fn pod_applied(&mut self, p: Pod, ctx: &mut Context<Self>) {
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

    /// A pod deleted: its node hears of it, and nothing is kept about it.
    fn pod_deleted(&mut self, p: &Pod) {
        let key = pods::key(p);
        self.shared.state.pods.write().remove(&key);
        if let Some(node) = pods::node_name(p) {
            // Gone without being seen terminating or terminal first: an event now.
            let counted = pods::is_terminal(p) || p.metadata.deletion_timestamp.is_some();
            let at = (!counted && !pods::is_daemonset_pod(p)).then(Timestamp::now);
            self.shared.router.drain_node_changed(node);
            self.shared.router.pod_changed(node, at);
        }
        self.told.remove(&key);
        self.waiting.remove(&key);
        self.nominations.forget(&key);
        self.shared.state.nominated.write().remove(&key);
    }
}
