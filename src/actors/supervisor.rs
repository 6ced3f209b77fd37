//! Hears of each change of the claim index (`state::claims`, fed by the NodeClaim watch) and
//! gives every claim of ours its own NodeClaimActor (started when this replica leads, stopped
//! when the claim is gone).

use std::sync::Arc;

use actix::prelude::*;
use kube::ResourceExt;

use super::Shared;
use super::messages::{CancelRequest, ClaimChanged, Gone, Poke};
use super::nodeclaim::NodeClaimActor;
use super::scaler::claim_matters;
use crate::api::decode::Malformed;
use crate::api::nodeclaim::NodeClaim;
use crate::state::claims::{ClaimChange, is_ours, recorded_deployment};

/// Start acting on claims (this replica became the leader and the caches are warm).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Activate;

/// The claim index took a change (sent by the NodeClaim feed right after it applied it).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct ClaimsChanged(pub(crate) ClaimChange);

pub(crate) struct Supervisor {
    shared: Arc<Shared>,
    /// Claims whose latest version the types cannot decode, with the problem last reported by
    /// Event (each distinct problem is told once, by the leader).
    malformed: std::collections::BTreeMap<String, (Malformed, bool)>,
    active: bool,
}

impl Supervisor {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            malformed: std::collections::BTreeMap::new(),
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

super::registry::stoppable!(Supervisor);

impl Actor for Supervisor {
    type Context = Context<Self>;
}

impl Handler<ClaimsChanged> for Supervisor {
    type Result = ();
    fn handle(&mut self, ClaimsChanged(change): ClaimsChanged, _: &mut Self::Context) {
        match change {
            ClaimChange::Applied { old, new } => self.applied(old, new),
            ClaimChange::Malformed(m) => self.malformed(*m),
            ClaimChange::Deleted { name, last } => self.deleted(&name, last),
            ClaimChange::Relisted { gone, malformed } => self.relisted(gone, malformed),
        }
    }
}

impl Supervisor {
    fn applied(&mut self, old: Option<Arc<NodeClaim>>, c: Arc<NodeClaim>) {
        self.malformed.remove(&c.name_any());
        let replan = claim_matters(old.as_deref(), &c);
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
        if replan {
            self.poke_scaler_of(&c);
        }
        self.deliver(c, false);
        self.shared.router.nodepools_changed();
        self.shared.router.disruption_changed();
    }

    fn deleted(&mut self, name: &str, last: Option<Arc<NodeClaim>>) {
        self.malformed.remove(name);
        if let Some(c) = last {
            self.gone(&c);
        }
        self.shared.router.nodepools_changed();
        self.shared.router.disruption_changed();
        // Pods that waited for this claim may need another.
        self.shared.router.provisioner_poke();
    }

    /// A re-list was swapped in: every claim's actor reconciles from it, and every Scaler.
    fn relisted(&mut self, gone: Vec<Arc<NodeClaim>>, bad: Vec<Malformed>) {
        let names: std::collections::BTreeSet<String> =
            bad.iter().filter_map(|m| m.metadata.name.clone()).collect();
        self.malformed.retain(|n, _| names.contains(n));
        for m in bad {
            self.malformed(m);
        }
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
