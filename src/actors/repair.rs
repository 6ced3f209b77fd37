//! Node repair in its legacy mode (`--feature-gates NodeRepair=true --legacy-node-repair`,
//! Karpenter v1.14's behaviour; without the flag repair is a disruption method): a claim whose
//! Node has stayed unhealthy past its policy's toleration (`Ready` False or Unknown by default)
//! is deleted at once, its termination deadline set to now (upstream's forceful repair; a
//! policy's `terminationGracePeriod` gives the drain that long), and replaced as any deleted
//! claim is (its pods pend again; a static pool launches another). The rules are in
//! `view::repair`. Leader only; woken by Node and Machine changes and at the next toleration's
//! end, never polling.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use super::Shared;
use super::disruption::{announce_blocked, count_repaired};
use super::pass::{Coalesced, Pass};
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::TERMINATION_TIMESTAMP_ANNOTATION;
use crate::metrics::DisruptedLabels;
use crate::view::repair::{self, Repair, RepairPolicies};

/// Nodes, Machines or claims changed: look again (coalesced).
#[derive(Message, Default)]
#[rtype(result = "()")]
pub(crate) struct Look;

const COALESCE: Duration = Duration::from_millis(200);

pub(crate) struct NodeRepair {
    shared: Arc<Shared>,
    policies: RepairPolicies,
    pass: Coalesced,
    /// The wake-up for the next toleration's end, when one is set.
    wake: Option<(jiff::Timestamp, SpawnHandle)>,
    /// Claims being repaired (delete sent) whose deletion the index does not show yet.
    repairing: HashSet<String>,
    /// NodePools whose blocked-repair gauge is set, so it is cleared when none is left.
    blocked_pools: HashSet<String>,
}

impl NodeRepair {
    pub(crate) fn new(shared: Arc<Shared>, policies: RepairPolicies) -> Self {
        Self {
            shared,
            policies,
            pass: Coalesced::new(COALESCE),
            wake: None,
            repairing: HashSet::new(),
            blocked_pools: HashSet::new(),
        }
    }

    /// Wake when the next toleration ends (nothing else would: the Node does not change then).
    fn wake_at(&mut self, at: Option<jiff::Timestamp>, ctx: &mut Context<Self>) {
        if self.wake.as_ref().map(|(t, _)| *t) == at {
            return;
        }
        if let Some((_, h)) = self.wake.take() {
            ctx.cancel_future(h);
        }
        let Some(at) = at else { return };
        let wait = at
            .duration_since(jiff::Timestamp::now())
            .try_into()
            .unwrap_or(Duration::ZERO);
        let h = ctx.run_later(wait, |act, ctx| {
            act.wake = None;
            act.look(ctx);
        });
        self.wake = Some((at, h));
    }

    fn look(&mut self, ctx: &mut Context<Self>) {
        if !self.shared.router.is_active() {
            return;
        }
        {
            let claims = self.shared.state.claims.read();
            self.repairing.retain(|n| {
                claims
                    .get(n)
                    .is_some_and(|c| c.metadata.deletion_timestamp.is_none())
            });
        }
        let decision = repair::decide(self.shared.view(), &self.policies, jiff::Timestamp::now());
        self.wake_at(decision.next, ctx);
        announce_blocked(
            &self.shared,
            &decision.blocked,
            &decision.held_pools,
            &mut self.blocked_pools,
        );
        for r in decision.repair {
            if self.repairing.insert(r.claim.name_any()) {
                self.repair(r, ctx);
            }
        }
    }

    /// Stamp the termination deadline (now, unless the policy gives the drain longer), then delete the claim (upstream's order: the drain
    /// that follows waits for nothing).
    fn repair(&mut self, r: Repair, ctx: &mut Context<Self>) {
        let name = r.claim.name_any();
        tracing::info!(nodeclaim = %name, node = %r.node, reason = %r.why, "{}", self.shared.settings.say("deleting unhealthy node", "would delete unhealthy node"));
        let api: Api<NodeClaim> = self.shared.api();
        let stamp =
            repair::termination_stamp(&r.claim, jiff::Timestamp::now(), r.termination_grace_period);
        let target = name.clone();
        let gate = self.shared.deletion_gate.clone();
        ctx.spawn(
            async move {
                let _gate = gate.hold("deleting an unhealthy node's NodeClaim").await;
                if let Some(now) = stamp {
                    let patch =
                        json!({"metadata": {"annotations": {TERMINATION_TIMESTAMP_ANNOTATION: now}}});
                    api.patch(&target, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                }
                api.delete(&target, &DeleteParams::default()).await?;
                Ok::<Repair, kube::Error>(r)
            }
            .into_actor(self)
            .map(move |res, act, ctx| match res {
                Ok(r) => {
                    act.pass.backoff.reset();
                    act.count(&r);
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    tracing::warn!(nodeclaim = %name, error = %e, "repairing an unhealthy node failed");
                    act.repairing.remove(&name);
                    let d = act.pass.backoff.next_delay();
                    ctx.run_later(d, |act, ctx| act.look(ctx));
                }
            }),
        );
    }

    /// Upstream's metrics, and the Event saying why the claim goes.
    fn count(&self, r: &Repair) {
        let m = &self.shared.metrics;
        let labels = DisruptedLabels::of("unhealthy", r.nodepool.clone(), &r.claim, None);
        m.nodeclaims_disrupted.get_or_create(&labels).inc();
        m.pods_disruption_initiated.get_or_create(&labels).inc_by(
            super::disruption::reschedulable_pods(&self.shared, &r.claim),
        );
        count_repaired(&self.shared, &r.claim, &r.condition, &r.why);
    }
}

impl Pass for NodeRepair {
    fn coalesced(&mut self) -> &mut Coalesced {
        &mut self.pass
    }

    fn pass(&mut self, ctx: &mut Context<Self>) {
        self.look(ctx);
    }
}

/// Start the NodeRepair actor (on the leader) and register it: only in legacy mode, since in
/// v1.15's mode repair is a method of the Disruption actor.
pub(crate) fn start(shared: &Arc<Shared>) {
    if let Some(policies) = shared.settings.legacy_repair() {
        let repair = NodeRepair::new(shared.clone(), policies.clone());
        shared.router.actors().start(repair);
    }
}

super::registry::stoppable!(NodeRepair);

impl Actor for NodeRepair {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.schedule(ctx);
    }
}

impl Handler<Look> for NodeRepair {
    type Result = ();
    fn handle(&mut self, _: Look, ctx: &mut Self::Context) {
        self.schedule(ctx);
    }
}
