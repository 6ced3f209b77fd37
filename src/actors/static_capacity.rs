//! Holds each static NodePool (`spec.replicas`) at its count: launches claims from its template
//! when it has fewer, deletes the least costly to disrupt when it has more (upstream's static
//! provisioning and deprovisioning). Leader only; woken by NodePool, claim and Node changes,
//! never by a timer except to retry a failed write.
//!
//! Restart-safe: the count is read from the indexes, which hold every claim a create that
//! landed made (the actor starts once the caches are warm), and each create is named here and
//! read back when its answer is lost, so a restart mid-scale neither makes a claim twice nor
//! forgets one. Creates and deletes still in flight are counted until the index shows them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use kube::api::{Api, DeleteParams};
use kube::{Resource, ResourceExt};

use super::Shared;
use super::claim_factory::{self, Purpose};
use super::pass::{Coalesced, Pass};
use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::NodePool;
use crate::view::static_capacity::{self, Plan};

/// NodePools, claims or Nodes changed: look at the static pools again (coalesced).
#[derive(Message, Default)]
#[rtype(result = "()")]
pub(crate) struct Hold;

/// A burst of claim changes (a pool scaled by hundreds) is looked at once.
const COALESCE: Duration = Duration::from_millis(100);

pub(crate) struct StaticCapacity {
    shared: Arc<Shared>,
    pass: Coalesced,
    /// Per pool: names of claims being created, not yet in the index.
    creating: HashMap<String, HashSet<String>>,
    /// Claims being deleted whose deletion the index does not show yet.
    deleting: HashSet<String>,
    /// The last limit warning told per pool, so each is told once.
    told: BTreeMap<String, String>,
}

impl StaticCapacity {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            pass: Coalesced::new(COALESCE),
            creating: HashMap::new(),
            deleting: HashSet::new(),
            told: BTreeMap::new(),
        }
    }

    /// Forget in-flight writes the index now shows.
    fn settle(&mut self) {
        let claims = self.shared.state.claims.read();
        for names in self.creating.values_mut() {
            names.retain(|n| !claims.contains(n));
        }
        self.deleting.retain(|n| {
            claims
                .get(n)
                .is_some_and(|c| c.metadata.deletion_timestamp.is_none())
        });
    }

    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        if !self.shared.router.is_active() {
            return;
        }
        self.settle();
        let counts = static_capacity::counts(
            self.shared.view(),
            &HashSet::new(),
            &self.deleting,
            jiff::Timestamp::now(),
        );
        self.told.retain(|pool, _| counts.contains_key(pool));
        for (name, (np, count)) in counts {
            // Upstream waits for the pool to be Ready (its NodeClass too).
            if !conditions::is_true(np.conditions(), conditions::READY) {
                continue;
            }
            let creating = self.creating.get(&name).map_or(0, HashSet::len);
            let plan = static_capacity::plan(&np, &count, creating);
            self.report(&np, &count, &plan);
            match plan {
                Plan::Hold | Plan::Broken(_) => {}
                Plan::Create { count: n, .. } => {
                    for _ in 0..n {
                        self.create(&np, ctx);
                    }
                }
                Plan::Remove(claims) => {
                    for claim in claims {
                        self.delete(&name, claim, ctx);
                    }
                }
            }
        }
    }

    /// Replicas above `limits.nodes`, or a limit that cannot be read: a Warning on the NodePool
    /// (once per message) besides upstream's log line.
    fn report(&mut self, np: &NodePool, count: &static_capacity::Count, plan: &Plan) {
        let name = np.name_any();
        let message = match plan {
            Plan::Create {
                capped: Some(limit),
                ..
            } => {
                tracing::info!(nodepool = %name, limit, "nodepool node limit reached");
                format!(
                    "spec.replicas {} is above limits.nodes {limit}: the pool holds {limit} nodes at most ({} now)",
                    np.spec.replicas.unwrap_or(0),
                    count.total()
                )
            }
            Plan::Broken(why) => format!("static NodePool launches nothing: {why}"),
            _ => {
                self.told.remove(&name);
                return;
            }
        };
        if self.told.get(&name) == Some(&message) {
            return;
        }
        self.shared
            .events
            .warning(np.object_ref(&()), "NodePoolLimitReached", message.clone());
        self.told.insert(name, message);
    }

    fn create(&mut self, np: &NodePool, ctx: &mut Context<Self>) {
        let Some(new) = crate::scheduling::static_claim(np) else {
            return;
        };
        let pool = np.name_any();
        // A claim no offering can launch is created all the same here (its actor says why
        // and deletes it); only the provisioner's plans hold such a claim back.
        let (claim, _) = claim_factory::build(&self.shared, &new, np, &Purpose::Static);
        let name = claim.name_any();
        self.creating
            .entry(pool.clone())
            .or_default()
            .insert(name.clone());
        let created = claim_factory::create(self.shared.clone(), claim, Purpose::Static);
        ctx.spawn(created.into_actor(self).map(move |r, act, ctx| {
            match r {
                Ok(_) => act.pass.backoff.reset(),
                Err(e) => {
                    tracing::warn!(nodeclaim = %name, nodepool = %pool, error = %e, "creating a static pool's nodeclaim failed");
                    act.retry_later(ctx);
                }
            }
            if let Some(names) = act.creating.get_mut(&pool) {
                names.remove(&name);
            }
        }));
    }

    fn delete(&mut self, pool: &str, claim: String, ctx: &mut Context<Self>) {
        if !self.deleting.insert(claim.clone()) {
            return;
        }
        tracing::info!(nodeclaim = %claim, nodepool = %pool, "{}", self.shared.settings.say("deleting nodeclaim: the static pool holds more than spec.replicas", "would delete NodeClaim: the static pool holds more than spec.replicas"));
        let api: Api<NodeClaim> = self.shared.api();
        let gate = self.shared.deletion_gate.clone();
        ctx.spawn(
            async move {
                let _gate = gate.hold("deleting a static pool's NodeClaim").await;
                api.delete(&claim, &DeleteParams::default())
                    .await
                    .map(|_| claim)
            }
            .into_actor(self)
            .map(|r, act, ctx| match r {
                Ok(_) => act.pass.backoff.reset(),
                Err(kube::Error::Api(s)) if s.code == 404 => act.pass.backoff.reset(),
                Err(e) => {
                    tracing::warn!(error = %e, "deleting a static pool's nodeclaim failed");
                    // Counted as running again; the retry decides afresh.
                    act.deleting.clear();
                    act.retry_later(ctx);
                }
            }),
        );
    }
}

impl Pass for StaticCapacity {
    fn coalesced(&mut self) -> &mut Coalesced {
        &mut self.pass
    }

    fn pass(&mut self, ctx: &mut Context<Self>) {
        self.reconcile(ctx);
    }
}

/// Start the StaticCapacity actor (on the leader, behind its feature gate) and register it.
pub(crate) fn start(shared: &Arc<Shared>) {
    if shared.settings.static_capacity {
        shared
            .router
            .actors()
            .start(StaticCapacity::new(shared.clone()));
    }
}

super::registry::stoppable!(StaticCapacity);

impl Actor for StaticCapacity {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.schedule(ctx);
    }
}

impl Handler<Hold> for StaticCapacity {
    type Result = ();
    fn handle(&mut self, _: Hold, ctx: &mut Self::Context) {
        self.schedule(ctx);
    }
}
