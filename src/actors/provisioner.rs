//! The provisioner: pending pods become right-sized NodeClaims (Karpenter core v1's provisioning controller).
//!
//! It hears of each pod change from the Pod feed (`watch.rs`), batches provisionable pods (a
//! batch ends after `BATCH_IDLE_DURATION` without a new pod, or `BATCH_MAX_DURATION` after it
//! opened), takes a snapshot of the indexes, runs the pure solver on the blocking pool (a big
//! solve never stalls the actors), then creates the claims it decided and tells each pod it
//! could not place why.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kube::{Resource, ResourceExt};

use super::Shared;
use super::backoff::Backoff;
use super::batch::Batch;
use super::claim_factory::{self, Purpose};
use super::nomination::{self, Nominations};
use crate::api::nodeclaim::NodeClaim;
use crate::scheduling::{self, PreferencePolicy, Results, Snapshot};
use crate::view::catalog::ResolveError;

/// Something the provisioner packs against changed; pending pods (if any) get a new batch.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Pending;

pub use crate::view::settings::Batching;

mod watch;
mod why;

pub(crate) use watch::PodsChanged;

pub struct Provisioner {
    shared: Arc<Shared>,
    preference: PreferencePolicy,
    batch: Batch,
    timer: Option<SpawnHandle>,
    /// Claims whose create has not answered yet, by a local id: the next solve counts them as
    /// in-flight capacity, so it never creates a duplicate for the same pods.
    creating: HashMap<u64, Creating>,
    next_create: u64,
    /// Delay before re-solving after a create failed; reset by a create that succeeds.
    create_backoff: Backoff,
    solving: bool,
    again: bool,
    /// Last failure message per pod, so an Event is published once per distinct reason.
    told: HashMap<String, String>,
    /// Pods seen provisionable, until they are bound (for the startup-duration metric).
    waiting: HashMap<String, Instant>,
    /// Where each pod was last planned (the next solve puts it back there first) and the
    /// `Nominated` Event about it.
    nominations: Nominations,
}

/// Where a pod of a new claim had been planned (see `planned_elsewhere`).
enum Elsewhere<'p> {
    InFlight { pod: &'p str, claim: String },
    Registered { pod: &'p str, claim: String },
}

/// A claim whose create has not answered yet, with the pods it was made for.
struct Creating {
    claim: NodeClaim,
    pods: Vec<String>,
}

impl Provisioner {
    pub(crate) fn new(
        shared: Arc<Shared>,
        batching: Batching,
        preference: PreferencePolicy,
    ) -> Self {
        Self {
            shared,
            preference,
            batch: Batch::new(batching),
            timer: None,
            creating: HashMap::new(),
            next_create: 0,
            create_backoff: Backoff::api(),
            solving: false,
            again: false,
            told: HashMap::new(),
            waiting: HashMap::new(),
            nominations: Nominations::new(nomination::window(batching.max)),
        }
    }

    /// Provisionable pod `key` arrived (None: a re-list, any may have): open a batch or push
    /// its idle deadline out, never past the max deadline, once per pod and batch.
    fn extend_batch(&mut self, key: Option<&str>, ctx: &mut Context<Self>) {
        if !self.wants_batch() {
            return;
        }
        let now = Instant::now();
        let fire_at = match key {
            Some(key) => self.batch.pod(key, now),
            None => Some(self.batch.relisted(now)),
        };
        if let Some(fire_at) = fire_at {
            self.arm(fire_at, now, ctx);
        }
    }

    /// Something other than a pod changed that may let a pending pod fit: open a batch if none
    /// is open, but never extend one (see `batch`).
    fn poke_batch(&mut self, ctx: &mut Context<Self>) {
        if !self.wants_batch() {
            return;
        }
        let now = Instant::now();
        if let Some(fire_at) = self.batch.other(now) {
            self.arm(fire_at, now, ctx);
        }
    }

    /// A solve has work: pending pods, or pods of a deleting node to plan for.
    fn wants_batch(&self) -> bool {
        self.shared.router.is_active()
            && (self.shared.state.pods.read().provisionable_count() > 0
                || !self.shared.state.buffers.read().is_empty()
                || crate::view::snapshot::has_reschedulable_pods(&self.shared.state))
    }

    fn arm(&mut self, fire_at: Instant, now: Instant, ctx: &mut Context<Self>) {
        if let Some(h) = self.timer.take() {
            ctx.cancel_future(h);
        }
        self.timer = Some(
            ctx.run_later(fire_at.saturating_duration_since(now), |act, ctx| {
                act.timer = None;
                act.batch.fired();
                act.solve(ctx);
            }),
        );
    }

    fn solve(&mut self, ctx: &mut Context<Self>) {
        if self.solving {
            self.again = true;
            return;
        }
        self.forget_gone_places();
        let mut snapshot = self.snapshot();
        let m = &self.shared.metrics;
        m.scheduler_queue_depth.set(snapshot.pods.len() as i64);
        if snapshot.pods.is_empty() {
            return;
        }
        // A group whose template has no answer yet (a start, a failover) may be the one the
        // pods should go to: placing them now could pick a dearer group. The catalog's rebuild
        // after the read pokes the batch again.
        let unread = self.shared.catalog.unread(
            snapshot
                .nodepools
                .iter()
                .map(|p| p.nodepool.spec.template.spec.node_class_ref.name.as_str()),
        );
        if !unread.is_empty() {
            tracing::debug!(groups = ?unread, "waiting for the first read of these groups' templates before placing pods");
            return;
        }
        // Volume zones bound where each pod may go; pods whose claims cannot be used drop out;
        // existing nodes' CSI attach limits bound the pods they take.
        let (volumes, volume_failures) = {
            let storage = self.shared.state.storage.read();
            scheduling::volumes::prepare(&mut snapshot, &storage.catalog, &storage.csi_limits)
        };
        self.solving = true;
        let started = Instant::now();
        // Claims are made from the NodePools the solve saw (their hash included), never from a
        // later read that a NodePool change may have overtaken (upstream's "should not use a
        // different NodePool hash").
        let pools: HashMap<String, crate::api::nodepool::NodePool> = snapshot
            .nodepools
            .iter()
            .map(|p| (p.nodepool.name_any(), p.nodepool.clone()))
            .collect();
        let index = self.shared.state.pods.clone();
        let fut = async move {
            tokio::task::spawn_blocking(move || {
                let mut results = scheduling::solve_with_volumes(&snapshot, &volumes);
                results.failures.extend(volume_failures);
                for line in why::launches(&snapshot, &results, &index.read()) {
                    tracing::debug!(why = %line, "launching for pods existing nodes did not take");
                }
                results
            })
            .await
        };
        ctx.spawn(fut.into_actor(self).map(move |r, act, ctx| {
            act.shared
                .metrics
                .scheduling_duration
                .observe(started.elapsed().as_secs_f64());
            match r {
                Ok(results) => act.apply(results, &pools, ctx),
                Err(e) => tracing::error!(error = %e, "scheduling solve failed"),
            }
            act.solving = false;
            if std::mem::take(&mut act.again) {
                act.poke_batch(ctx);
            }
        }));
    }

    /// Create the decided claims; tell unplaceable pods why.
    fn apply(
        &mut self,
        results: Results,
        pools: &HashMap<String, crate::api::nodepool::NodePool>,
        ctx: &mut Context<Self>,
    ) {
        let results = self.take_placeholders(results);
        let m = &self.shared.metrics;
        m.unschedulable_pods.set(results.failures.len() as i64);
        let ignored = results
            .failures
            .iter()
            .filter(|(_, e)| matches!(e, scheduling::PodError::InvalidPod { .. }))
            .count();
        m.ignored_pods.set(ignored as i64);
        tracing::info!(
            new_claims = results.new_claims.len(),
            on_existing = results.placed_on_existing.len(),
            unschedulable = results.failures.len(),
            "scheduling solve done"
        );
        for (pod_key, err) in &results.failures {
            let message = format!("Failed to schedule pod: {err}");
            if self.told.get(pod_key) == Some(&message) {
                continue;
            }
            if let Some(p) = self.shared.state.pods.read().get(pod_key) {
                self.shared
                    .events
                    .warning(p.object_ref(&()), "FailedScheduling", message.clone());
            }
            self.told.insert(pod_key.clone(), message);
        }
        for (pod_key, node) in &results.placed_on_existing {
            let target = self.existing_target(node);
            self.nominate(pod_key, target);
        }
        let in_creates: HashMap<String, u64> = self
            .creating
            .iter()
            .flat_map(|(id, c)| c.pods.iter().map(|p| (p.clone(), *id)))
            .collect();
        let mut nowhere = 0;
        for new in results.new_claims {
            let Some(pool) = pools.get(&new.nodepool) else {
                continue;
            };
            let (claim, refused) =
                claim_factory::build(&self.shared, &new, pool, &Purpose::Provisioning);
            // Room the solve saw is gone (another claim of this plan, or one made since, took
            // its group's last slot): the claim could only be created and deleted. Anything else
            // (a NodeClass not ready yet, pools not read yet) may pass: the claim is created and
            // its actor waits, saying why.
            if let Some(e @ ResolveError::NoCompatibleOffering { .. }) = refused {
                nowhere += new.pods.len();
                self.nowhere(&new.nodepool, &new.pods, &e);
                continue;
            }
            match self.planned_elsewhere(&new.pods, &in_creates) {
                Some(Elsewhere::InFlight { pod, claim }) => {
                    // Capacity made twice for the same pods: what the solver's nominated pass
                    // prevents.
                    self.shared.metrics.extra_nodeclaims.inc();
                    tracing::warn!(nodepool = %new.nodepool, pod = %pod, planned_on = %claim, "{}", self.shared.settings.say("a new claim is made for a pod an earlier solve planned onto a claim still in flight", "would make a new claim for a pod an earlier solve planned onto a claim still in flight"));
                }
                Some(Elsewhere::Registered { pod, claim }) => {
                    // The scheduler bound other pods to the Node planned for this one (it does
                    // not follow our plans; upstream's neither).
                    self.shared.metrics.replanned_nodeclaims.inc();
                    tracing::info!(nodepool = %new.nodepool, pod = %pod, planned_on = %claim, "{}", self.shared.settings.say("a new claim is made for a pod whose planned Node took other pods", "would make a new claim for a pod whose planned Node took other pods"));
                }
                None => {}
            }
            self.create(claim, new.nodepool.clone(), new.pods, ctx);
        }
        if nowhere > 0 {
            self.shared
                .metrics
                .unschedulable_pods
                .set((results.failures.len() + nowhere) as i64);
        }
    }

    /// A planned claim no offering has room for any more is not created (upstream's
    /// provisioner creates no claim it knows cannot launch): its pods are told why, as pods the
    /// solve could not place are, and placed again by the next solve, which room coming back
    /// starts (a claim deleted, a MachineDeployment's replicas, annotations or max-size
    /// changed, all of which poke the provisioner).
    fn nowhere(&mut self, nodepool: &str, pods: &[String], e: &ResolveError) {
        self.shared.metrics.nodeclaims_not_created.inc();
        tracing::info!(nodepool = %nodepool, pods = pods.len(), error = %e, "not creating a planned nodeclaim: no offering has room for it any more");
        let message = format!(
            "Failed to schedule pod: the NodeClaim of NodePool {nodepool} planned for it was not created: {e}; the pod is placed again when capacity changes"
        );
        let index = self.shared.state.pods.read();
        let buffers = self.shared.state.buffers.read();
        for key in pods {
            // A CapacityBuffer's placeholder is no pod to tell (its claim is simply not made).
            if self.told.get(key) == Some(&message) || buffers.owner(key).is_some() {
                continue;
            }
            if let Some(p) = index.get(key) {
                self.shared
                    .events
                    .warning(p.object_ref(&()), "FailedScheduling", message.clone());
            }
            self.told.insert(key.clone(), message.clone());
        }
    }

    /// CapacityBuffers' placeholders leave the results here: where they went becomes their
    /// buffers' `Provisioning` condition (and the nodes holding buffer room are remembered), a
    /// claim opened for them is created as any other, and nothing is reported or nominated for
    /// them (they are no pods of the cluster; a nomination would keep their claim from
    /// disruption for good).
    fn take_placeholders(&mut self, mut results: Results) -> Results {
        let buffers = self.shared.state.buffers.read();
        if buffers.is_empty() {
            drop(buffers);
            self.shared.state.buffers.write().set_hosts(HashMap::new());
            return results;
        }
        let mut placed: HashMap<String, crate::state::buffers::Placed> = buffers
            .buffers()
            .map(|b| (b.to_string(), Default::default()))
            .collect();
        let mut hosts: HashMap<String, HashSet<String>> = HashMap::new();
        let mut count = |pod: &str, how: fn(&mut crate::state::buffers::Placed)| {
            let buffer = buffers.owner(pod)?;
            how(placed.get_mut(buffer)?);
            Some(buffer.to_string())
        };
        results.placed_on_existing.retain(|(pod, node)| {
            let Some(buffer) = count(pod, |p| p.existing += 1) else {
                return true;
            };
            hosts.entry(buffer).or_default().insert(node.clone());
            false
        });
        results
            .failures
            .retain(|(pod, _)| count(pod, |p| p.failed += 1).is_none());
        for claim in &results.new_claims {
            for pod in &claim.pods {
                count(pod, |p| p.new_claims += 1);
            }
        }
        drop(buffers);
        self.shared.state.buffers.write().set_hosts(hosts);
        self.shared.router.buffers_provisioned(placed);
        results
    }

    /// Create one claim (`claim_factory`: named, read back when its answer is lost, never made
    /// twice). Until the API answers it counts as in-flight capacity (`creating`); a failure is
    /// reported on its pods, and the pods are solved again after a backoff.
    fn create(
        &mut self,
        claim: NodeClaim,
        nodepool: String,
        pods: Vec<String>,
        ctx: &mut Context<Self>,
    ) {
        let id = self.next_create;
        self.next_create += 1;
        self.creating.insert(
            id,
            Creating {
                claim: claim.clone(),
                pods: pods.clone(),
            },
        );
        // Its MachineDeployment's room is taken from now, not from when the create answers.
        let created = claim_factory::create(self.shared.clone(), claim, Purpose::Provisioning);
        ctx.spawn(created.into_actor(self).map(move |r, act, ctx| {
            // It leaves `creating` in the turn the factory put it into the index, so no solve
            // ever misses it.
            act.creating.remove(&id);
            match r {
                Ok(created) => {
                    act.create_backoff.reset();
                    tracing::debug!(nodeclaim = %created.name_any(), pods = ?pods, "the pods the new claim is for");
                    let target = nomination::target(Some(&created.name_any()), None);
                    for pod in &pods {
                        act.nominate(pod, target.clone());
                    }
                }
                Err(e) => act.create_failed(&nodepool, &pods, &e, ctx),
            }
        }));
    }

    /// How a solve's existing node reads in a `Nominated` Event: an in-flight claim by its
    /// name, a Node with the claim it came from. None for a claim whose create has not
    /// answered yet (it has no name; its pods are told once it is created).
    fn existing_target(&self, node: &str) -> Option<nomination::Target> {
        let claims = self.shared.state.claims.read();
        if claims.contains(node) {
            return nomination::target(Some(node), None);
        }
        let n = self.shared.state.nodes.read().compact(node)?.clone();
        let claim = (n.provider_id())
            .and_then(|id| claims.by_provider_id(id))
            .map(|c| c.name_any());
        nomination::target(claim.as_deref(), Some(node))
    }

    /// Publish `Nominated` on a pod placed on `target` (once per target, rate-limited).
    fn nominate(&mut self, pod_key: &str, target: Option<nomination::Target>) {
        let Some(target) = target else { return };
        if self.shared.state.buffers.read().owner(pod_key).is_some() {
            return;
        }
        let now = Instant::now();
        // Disruption leaves the place alone while the plan holds (upstream's nominated node).
        self.shared.state.nominated.write().insert(
            pod_key.to_string(),
            (target.place().to_string(), now + self.nominations.window()),
        );
        let Some(note) = self.nominations.nominate(pod_key, &target, now) else {
            return;
        };
        if let Some(p) = self.shared.state.pods.read().get(pod_key) {
            self.shared
                .events
                .normal(p.object_ref(&()), "Nominated", note);
        }
    }

    /// A create failed: count it, tell each pod it was for (an Event), and solve again after a
    /// backoff (the pods are still pending; the next solve sees the state as it is then).
    fn create_failed(
        &mut self,
        nodepool: &str,
        pods: &[String],
        e: &super::Error,
        ctx: &mut Context<Self>,
    ) {
        let retry_in = self.create_backoff.next_delay_after(e.retry_after());
        tracing::warn!(nodepool = %nodepool, error = %e, retry_in = ?retry_in, "creating nodeclaim failed; solving its pods again");
        let message = format!(
            "Failed to create a NodeClaim of NodePool {nodepool} for this pod: {e}; retrying in {}",
            crate::api::duration::format(retry_in)
        );
        {
            let index = self.shared.state.pods.read();
            for key in pods {
                if let Some(p) = index.get(key) {
                    self.shared.events.warning(
                        p.object_ref(&()),
                        "FailedCreatingNodeClaim",
                        message.clone(),
                    );
                }
            }
        }
        ctx.run_later(retry_in, |act, ctx| act.poke_batch(ctx));
    }

    /// `key`, one of the pods we provisioned for, is bound: observe its startup once, from its
    /// creation (or, without one, from when we first saw it pending).
    pub(super) fn started(&mut self, key: &str, created: Option<jiff::Timestamp>) {
        let Some(first_seen) = self.waiting.remove(key) else {
            return;
        };
        let took = created
            .and_then(|c| Duration::try_from(jiff::Timestamp::now().duration_since(c)).ok())
            .unwrap_or_else(|| first_seen.elapsed());
        self.shared
            .metrics
            .pods_startup_duration
            .observe(took.as_secs_f64());
    }

    /// Everything the solver looks at, copied out of the indexes; creates not answered yet
    /// count as in-flight capacity, and each pod whose plan still holds goes back where it was
    /// planned (its claim by the claim's name, or its Node's once registered).
    fn snapshot(&self) -> Snapshot {
        let mut snapshot = crate::view::snapshot::build(
            self.shared.view(),
            self.creating.iter().map(|(id, c)| (id, &c.claim)),
            self.preference,
            crate::view::snapshot::BoundPods::Needed {
                moving: &HashSet::new(),
            },
        );
        let claims = self.shared.state.claims.read();
        let mut nominated: HashMap<String, String> = self
            .nominations
            .planned(Instant::now())
            .map(|(pod, place)| {
                let node = claims
                    .get(place)
                    .and_then(|c| c.status.as_ref()?.node_name.clone())
                    .unwrap_or_else(|| place.to_string());
                (pod.to_string(), node)
            })
            .collect();
        for (id, c) in &self.creating {
            for pod in &c.pods {
                nominated.insert(pod.clone(), format!("creating-{id}"));
            }
        }
        snapshot.nominated = nominated;
        snapshot
    }

    /// Plans onto a claim or Node that is gone are forgotten (the pod is placed afresh).
    fn forget_gone_places(&mut self) {
        let claims = self.shared.state.claims.read();
        let nodes = self.shared.state.nodes.read();
        self.nominations
            .retain(|_, place| claims.contains(place) || nodes.contains(place));
    }

    /// Whether a pod of a new claim was planned by an earlier solve onto another claim still
    /// there (not being deleted): still in flight (its create unanswered, or no Node yet), the
    /// new claim is capacity made twice for it (`karpenter_capi_extra_nodeclaims_total`);
    /// registered, the scheduler gave its room to other pods
    /// (`karpenter_capi_replanned_nodeclaims_total`).
    fn planned_elsewhere<'p>(
        &self,
        pods: &'p [String],
        in_creates: &HashMap<String, u64>,
    ) -> Option<Elsewhere<'p>> {
        let claims = self.shared.state.claims.read();
        let mut registered = None;
        for pod in pods {
            if let Some(id) = in_creates.get(pod) {
                let claim = format!("creating-{id}");
                return Some(Elsewhere::InFlight { pod, claim });
            }
            let Some(place) = self.nominations.place_of(pod) else {
                continue;
            };
            let Some(c) = claims
                .get(place)
                .filter(|c| c.metadata.deletion_timestamp.is_none())
            else {
                continue;
            };
            let claim = place.to_string();
            if c.status
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_none()
            {
                return Some(Elsewhere::InFlight { pod, claim });
            }
            registered.get_or_insert(Elsewhere::Registered { pod, claim });
        }
        registered
    }
}

super::registry::stoppable!(Provisioner);

impl Actor for Provisioner {
    type Context = Context<Self>;
}

impl Handler<super::tracked::Tracked> for Provisioner {
    type Result = MessageResult<super::tracked::Tracked>;
    fn handle(&mut self, _: super::tracked::Tracked, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            [
                ("told", self.told.len()),
                ("waiting", self.waiting.len()),
                ("nominations", self.nominations.len()),
                ("creating", self.creating.len()),
                ("daemonsets", self.shared.state.daemonsets.read().len()),
            ]
            .into_iter()
            .collect(),
        )
    }
}

impl Handler<Pending> for Provisioner {
    type Result = ();
    fn handle(&mut self, _: Pending, ctx: &mut Self::Context) {
        self.poke_batch(ctx);
    }
}
