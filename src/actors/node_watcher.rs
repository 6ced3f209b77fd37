//! The watch on Nodes (workload cluster). Each Node change updates the node index and is routed,
//! by provider ID, to the claim that waits for it (registration, initialization, termination).

use std::sync::Arc;

use actix::prelude::*;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::Shared;
use super::messages::Kick;
use crate::state::compact::CompactNode;
use crate::state::feed::Staleness;
use crate::state::machines::bound_claim;
use crate::state::nodes::provider_id;

pub struct NodeWatcher {
    shared: Arc<Shared>,
    buffer: Vec<CompactNode>,
    stale: Staleness,
}

impl NodeWatcher {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            buffer: Vec::new(),
            stale: Staleness::new("Nodes"),
        }
    }

    fn route(&self, pid: Option<&str>) {
        let Some(pid) = pid else { return };
        let claim = self
            .shared
            .state
            .claims
            .read()
            .by_provider_id(pid)
            .map(|c| c.name_any())
            .or_else(|| {
                self.shared
                    .state
                    .machines
                    .read()
                    .by_provider_id(pid)
                    .and_then(|m| bound_claim(&m).map(str::to_string))
            });
        if let Some(a) = claim.and_then(|c| self.shared.router.claim(&c)) {
            a.do_send(Kick);
        }
    }
}

impl Actor for NodeWatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let api: Api<Node> = Api::all(self.shared.workload.clone());
        // Besides `Ready`, the conditions node repair's policies watch.
        let kept: Vec<String> = (self.shared.settings.node_repair.iter())
            .flat_map(|p| p.condition_types())
            .collect();
        ctx.add_stream(
            watcher(api, watcher::Config::default())
                .modify(move |n| crate::state::trim::node_keeping(n, &kept))
                .default_backoff(),
        );
    }
}

impl StreamHandler<Result<watcher::Event<Node>, watcher::Error>> for NodeWatcher {
    fn handle(&mut self, ev: Result<watcher::Event<Node>, watcher::Error>, _: &mut Self::Context) {
        self.stale.saw(&ev, &self.shared.metrics);
        match ev {
            Ok(watcher::Event::Init) => self.buffer.clear(),
            // Compacted as they arrive, so the initial list is never held whole.
            Ok(watcher::Event::InitApply(n)) => self.buffer.push(CompactNode::new(n)),
            Ok(watcher::Event::InitDone) => {
                let fresh = std::mem::take(&mut self.buffer);
                let gone = self.shared.state.nodes.write().replace_all(fresh);
                for n in gone {
                    self.route(n.provider_id());
                }
                let all: Vec<Box<str>> = (self.shared.state.nodes.read().all())
                    .filter_map(|n| n.provider_id().map(Box::from))
                    .collect();
                for pid in all {
                    self.route(Some(&pid));
                }
                self.shared.synced.notify_waiters();
            }
            Ok(watcher::Event::Apply(n)) => {
                let pid = provider_id(&n).map(Box::<str>::from);
                self.shared.state.nodes.write().apply(n);
                self.route(pid.as_deref());
                self.shared.router.disruption_changed();
            }
            Ok(watcher::Event::Delete(n)) => {
                self.shared.state.nodes.write().remove(&n.name_any());
                self.route(provider_id(&n));
                self.shared.router.disruption_changed();
            }
            Err(e) => tracing::warn!(error = %e, watch = "Nodes", "watch failed; it will re-list"),
        }
    }
}
