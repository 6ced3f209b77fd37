//! What the provisioner does with each change of the pod index (`state::pods`, fed by its
//! watch): the pod's node hears of it, and a batch opens or grows for each pod that becomes
//! provisionable.

use std::time::Instant;

use actix::prelude::*;

use super::Provisioner;
use crate::state::pods::{self, PodChange};

/// The pod index took a change (sent by the Pod feed right after it applied it).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct PodsChanged(pub(crate) PodChange);

impl Handler<PodsChanged> for Provisioner {
    type Result = ();
    fn handle(&mut self, PodsChanged(change): PodsChanged, ctx: &mut Self::Context) {
        match change {
            PodChange::Applied {
                key,
                node,
                created,
                newly_bound,
                provisionable,
            } => self.pod_applied(key, node, created, newly_bound, provisionable, ctx),
            PodChange::Deleted { key, node } => self.pod_deleted(&key, node),
            PodChange::Relisted { events } => self.pods_relisted(events, ctx),
        }
    }
}

impl Provisioner {
    /// A re-list done (the index holds it): what happened while the watch was down is caught
    /// up, since no event will say it.
    fn pods_relisted(&mut self, events: Vec<(String, jiff::Timestamp)>, ctx: &mut Context<Self>) {
        for (node, at) in events {
            self.shared.router.pod_changed(&node, Some(at));
        }
        // Pods we provisioned for that were bound while the watch was down.
        let bound: Vec<_> = {
            let index = self.shared.state.pods.read();
            self.waiting
                .keys()
                .filter_map(|key| {
                    let p = index.get(key)?;
                    pods::node_name(&p)?;
                    let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
                    Some((key.clone(), created))
                })
                .collect()
        };
        for (key, created) in bound {
            self.started(&key, created);
        }
        self.forget_vanished_pods();
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
    fn pod_applied(
        &mut self,
        key: String,
        node: Option<(String, Option<jiff::Timestamp>)>,
        created: Option<jiff::Timestamp>,
        newly_bound: bool,
        provisionable: bool,
        ctx: &mut Context<Self>,
    ) {
        if let Some((node, at)) = node {
            self.started(&key, created);
            self.shared.router.drain_node_changed(&node);
            self.shared.router.pod_changed(&node, at);
        }
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
    fn pod_deleted(&mut self, key: &str, node: Option<(String, Option<jiff::Timestamp>)>) {
        if let Some((node, at)) = node {
            self.shared.router.drain_node_changed(&node);
            self.shared.router.pod_changed(&node, at);
        }
        self.told.remove(key);
        self.waiting.remove(key);
        self.nominations.forget(key);
        self.shared.state.nominated.write().remove(key);
    }
}
