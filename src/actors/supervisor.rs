//! Watches NodeClaims, keeps the claim index, and gives every claim of ours its own
//! NodeClaimActor (started when this replica leads, stopped when the claim is gone).

use std::sync::Arc;

use actix::prelude::*;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::Shared;
use super::messages::{CancelRequest, ClaimChanged, Gone, Poke};
use super::nodeclaim::NodeClaimActor;
use crate::api::decode::{Lenient, Malformed};
use crate::api::nodeclaim::NodeClaim;
use crate::state::claims::is_ours;
use crate::state::claims::recorded_deployment;
use crate::state::feed::Staleness;

/// Start acting on claims (this replica became the leader and the caches are warm).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Activate;

pub(crate) struct Supervisor {
    shared: Arc<Shared>,
    buffer: Vec<NodeClaim>,
    bad_buffer: Vec<Malformed>,
    /// Claims whose latest version the types cannot decode, with the problem last reported by
    /// Event (each distinct problem is told once, by the leader).
    malformed: std::collections::BTreeMap<String, (Malformed, bool)>,
    active: bool,
    stale: Staleness,
}

impl Supervisor {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            buffer: Vec::new(),
            bad_buffer: Vec::new(),
            malformed: std::collections::BTreeMap::new(),
            active: false,
            stale: Staleness::new("NodeClaims"),
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

    /// A claim's new version does not decode. Its last good version stays in the index (its
    /// actor keeps its Machine; dropping it would look like the claim was deleted and release
    /// capacity a workload may be using) and the problem is reported on the claim.
    fn malformed(&mut self, m: Malformed) {
        let name = m.metadata.name.clone().unwrap_or_default();
        let unchanged = self
            .malformed
            .get(&name)
            .is_some_and(|(old, _)| old.message() == m.message());
        if !unchanged {
            tracing::warn!(nodeclaim = %name, problem = %m, "NodeClaim cannot be decoded; acting on its last readable version");
            self.malformed.insert(name, (m, false));
        }
        self.report_malformed();
    }

    fn report_malformed(&mut self) {
        if !self.active {
            return;
        }
        for (name, (m, told)) in self.malformed.iter_mut() {
            if *told {
                continue;
            }
            self.shared.events.warning(
                m.object_ref::<NodeClaim>(),
                "ValidationFailed",
                format!("NodeClaim {name} cannot be read: {}", m.message()),
            );
            *told = true;
        }
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
            a.do_send(Gone(Arc::new(c.clone())));
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
        // Per-object decoding: one claim the types cannot read must not stop the watch.
        let api: Api<Lenient<NodeClaim>> = Api::all(self.shared.workload.clone());
        ctx.add_stream(watcher(api, watcher::Config::default()).default_backoff());
    }
}

impl StreamHandler<Result<watcher::Event<Lenient<NodeClaim>>, watcher::Error>> for Supervisor {
    fn handle(
        &mut self,
        ev: Result<watcher::Event<Lenient<NodeClaim>>, watcher::Error>,
        _: &mut Self::Context,
    ) {
        self.stale.saw(&ev, &self.shared.metrics);
        match ev {
            Ok(watcher::Event::Init) => {
                self.buffer.clear();
                self.bad_buffer.clear();
            }
            Ok(watcher::Event::InitApply(Lenient::Ok(c))) => self.buffer.push(c),
            Ok(watcher::Event::InitApply(Lenient::Bad(m))) => self.bad_buffer.push(*m),
            Ok(watcher::Event::InitDone) => {
                let mut fresh = std::mem::take(&mut self.buffer);
                let bad = std::mem::take(&mut self.bad_buffer);
                // A claim that exists but no longer decodes is not gone: keep its last good
                // version so its actor and its Machine stay.
                {
                    let index = self.shared.state.claims.read();
                    fresh.extend(bad.iter().filter_map(|m| {
                        m.metadata
                            .name
                            .as_deref()
                            .and_then(|n| index.get(n))
                            .map(|c| (*c).clone())
                    }));
                }
                let names: std::collections::BTreeSet<String> =
                    bad.iter().filter_map(|m| m.metadata.name.clone()).collect();
                self.malformed.retain(|n, _| names.contains(n));
                for m in bad {
                    self.malformed(m);
                }
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
            Ok(watcher::Event::Apply(Lenient::Bad(m))) => self.malformed(*m),
            Ok(watcher::Event::Apply(Lenient::Ok(c))) => {
                self.malformed.remove(&c.name_any());
                let c = Arc::new(c);
                let old = self.shared.state.claims.write().apply(c.clone());
                if let Some(old) = &old
                    && recorded_deployment(old) != recorded_deployment(&c)
                {
                    self.poke_scaler_of(old);
                }
                // Deletion began: the provisioner plans for the pods its node will give up.
                if c.metadata.deletion_timestamp.is_some()
                    && old.is_none_or(|o| o.metadata.deletion_timestamp.is_none())
                {
                    self.shared.router.provisioner_poke();
                }
                self.poke_scaler_of(&c);
                self.deliver(c, false);
                self.shared.router.nodepools_changed();
                self.shared.router.disruption_changed();
            }
            Ok(watcher::Event::Delete(c)) => {
                let name = c.name_any();
                self.malformed.remove(&name);
                let last = self.shared.state.claims.write().remove(&name);
                // The deleted object itself may not decode; its last good version says which
                // Scaler held a request for it.
                match (c, last) {
                    (Lenient::Ok(c), _) => self.gone(&c),
                    (Lenient::Bad(_), Some(last)) => self.gone(&last),
                    (Lenient::Bad(_), None) => {}
                }
                self.shared.router.nodepools_changed();
                self.shared.router.disruption_changed();
                // Pods that waited for this claim may need another.
                self.shared.router.provisioner_poke();
            }
            Err(e) => {
                tracing::warn!(error = %e, watch = "NodeClaims", "watch failed; it will re-list")
            }
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
        self.report_malformed();
    }
}
