//! Watches NodeClaims, keeps the claim index, and gives every claim of ours its own
//! NodeClaimActor (started when this replica leads, stopped when the claim is gone).

use std::sync::Arc;

use actix::prelude::*;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::Shared;
use super::nodeclaim::{ClaimChanged, NodeClaimActor, Stop};
use super::scaler::{CancelRequest, Poke};
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::{NODECLASS_GROUP, NODECLASS_KIND};
use crate::state::claims::recorded_deployment;

/// Start acting on claims (this replica became the leader and the caches are warm).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Activate;

/// True when the claim's NodeClass is ours (other providers' claims are left alone).
pub fn is_ours(c: &NodeClaim) -> bool {
    let r = &c.spec.node_class_ref;
    r.group == NODECLASS_GROUP && r.kind == NODECLASS_KIND
}

pub struct Supervisor {
    shared: Arc<Shared>,
    buffer: Vec<NodeClaim>,
    active: bool,
}

impl Supervisor {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            buffer: Vec::new(),
            active: false,
        }
    }

    /// Hand a claim to its actor (starting one); `listed` when it comes from a (re-)list.
    fn deliver(&self, c: Arc<NodeClaim>, listed: bool) {
        if !self.active || !is_ours(&c) {
            return;
        }
        let name = c.name_any();
        if let Some(a) = self.shared.router.claim(&name) {
            a.do_send(ClaimChanged { claim: c, listed });
            return;
        }
        if c.metadata.deletion_timestamp.is_some()
            && !c
                .finalizers()
                .iter()
                .any(|f| f == crate::api::wellknown::TERMINATION_FINALIZER)
        {
            return;
        }
        let addr = NodeClaimActor::new(self.shared.clone(), c).start();
        self.shared.router.add_claim(name, addr);
    }

    fn poke_scaler_of(&self, c: &NodeClaim) {
        if let Some(s) = recorded_deployment(c).and_then(|md| self.shared.router.scaler(md)) {
            s.do_send(Poke);
        }
    }

    /// The claim left the API (normally after its actor removed the finalizer; possibly forced
    /// by someone else). Its Scaler forgets any request it still holds for it.
    fn gone(&self, c: &NodeClaim) {
        if let Some(a) = self.shared.router.remove_claim(&c.name_any()) {
            a.do_send(Stop);
        }
        if let Some(s) = recorded_deployment(c).and_then(|md| self.shared.router.scaler(md)) {
            s.do_send(CancelRequest {
                claim: c.name_any(),
            });
        }
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let api: Api<NodeClaim> = Api::all(self.shared.workload.clone());
        ctx.add_stream(watcher(api, watcher::Config::default()).default_backoff());
    }
}

impl StreamHandler<Result<watcher::Event<NodeClaim>, watcher::Error>> for Supervisor {
    fn handle(
        &mut self,
        ev: Result<watcher::Event<NodeClaim>, watcher::Error>,
        _: &mut Self::Context,
    ) {
        match ev {
            Ok(watcher::Event::Init) => self.buffer.clear(),
            Ok(watcher::Event::InitApply(c)) => self.buffer.push(c),
            Ok(watcher::Event::InitDone) => {
                let fresh = std::mem::take(&mut self.buffer);
                let gone = self.shared.state.claims.write().replace_all(fresh);
                for c in gone {
                    self.gone(&c);
                }
                let all: Vec<_> = self.shared.state.claims.read().all().cloned().collect();
                for c in all {
                    self.deliver(c, true);
                }
                for (_, s) in self.shared.router.scalers() {
                    s.do_send(Poke);
                }
                self.shared.synced.notify_waiters();
            }
            Ok(watcher::Event::Apply(c)) => {
                let c = Arc::new(c);
                let old = self.shared.state.claims.write().apply((*c).clone());
                if let Some(old) = old
                    && recorded_deployment(&old) != recorded_deployment(&c)
                {
                    self.poke_scaler_of(&old);
                }
                self.poke_scaler_of(&c);
                self.deliver(c, false);
                self.shared.router.nodepools_changed();
            }
            Ok(watcher::Event::Delete(c)) => {
                self.shared.state.claims.write().remove(&c.name_any());
                self.gone(&c);
                self.shared.router.nodepools_changed();
                // Pods that waited for this claim may need another.
                self.shared.router.provisioner_poke();
            }
            Err(e) => tracing::warn!(error = %e, "NodeClaim watch failed; it will re-list"),
        }
    }
}

impl Handler<Activate> for Supervisor {
    type Result = ();
    fn handle(&mut self, _: Activate, _: &mut Self::Context) {
        if self.active {
            return;
        }
        self.active = true;
        let all: Vec<_> = self.shared.state.claims.read().all().cloned().collect();
        for c in all {
            self.deliver(c, true);
        }
    }
}
