//! What one disruption pass sees, read from the indexes (no API calls): the candidates with
//! their prices, pods, drift and consolidatability; the claims protected from disruption and
//! why; the budgets left per pool and reason; expired claims; condition and hash stamps that
//! are out of date; and disrupted taints nobody owns any more (a controller that died mid-way).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;

use super::Inputs;
use super::catalog::CatalogView;
use super::protection::{PdbIndex, node_protected, pods_protected};
use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::{DisruptionReason, NodePool};
use crate::api::wellknown::NODEPOOL_LABEL;
use crate::capi::model::MachineDeployment;
use crate::disruption::{self, Allowed, Blocker, Candidate, Drift, drift};
use crate::state::claims::{recorded_deployment, recorded_instance};
use crate::state::compact::CompactNode;
use crate::state::pods::PodSummary;
use crate::state::{MachineDeployments, Machines, Nodes, Pods};

mod budget;
mod candidate;
mod claim;
use candidate::{candidate, reschedule_cost, share_pool_totals};
mod repair;
mod rollout;
mod snapshot;
use budget::BudgetCount;
#[cfg(test)]
pub(crate) use budget::BudgetStanding;
pub(crate) use budget::budget_standing;
pub(in crate::view) use claim::under_way;
use claim::{
    consolidatable, consolidate_after_hold, expired, pod_event_behind, pool_up_to_date,
    stamp_needed,
};
use rollout::{Hold, Rollout, at_min_size, deployment_hold};
pub(crate) use snapshot::snapshot;

/// A claim whose `Drifted` or `Consolidatable` condition should change.
#[derive(Clone, Debug)]
pub(crate) struct Stamp {
    pub(crate) claim: Arc<NodeClaim>,
    pub(crate) drift: Option<Drift>,
    pub(crate) consolidatable: bool,
}

#[derive(Default)]
pub(crate) struct View {
    pub(crate) candidates: Vec<Candidate>,
    /// Claims that would be candidates but for this (do-not-disrupt, a PodDisruptionBudget).
    pub(crate) blocked: Vec<(Arc<NodeClaim>, disruption::Hold)>,
    /// With `Memory::keep_held`: the candidates the blocked claims would make.
    pub(crate) held_candidates: Vec<Candidate>,
    /// Claims due for repair that are held back: (claim, node, why), for `NodeRepairBlocked`.
    pub(crate) repair_blocked: Vec<(Arc<NodeClaim>, String, String)>,
    /// NodePools node repair's unhealthy-fraction guard holds, with why.
    pub(crate) repair_held_pools: BTreeMap<String, String>,
    pub(crate) allowed: Allowed,
    /// Per pool and reason: the budget's allowance before nodes under way are subtracted, and
    /// those nodes (upstream's allowed_disruptions and nodes_consuming_budgets gauges).
    pub(crate) budget_use: Vec<(String, DisruptionReason, usize, usize)>,
    pub(crate) expired: Vec<Arc<NodeClaim>>,
    pub(crate) stamps: Vec<Stamp>,
    /// Claims carrying a NodePool hash of another hash version.
    pub(crate) restamp: Vec<(Arc<NodeClaim>, Arc<NodePool>)>,
    /// Claims whose Node carries `karpenter.sh/disrupted` from a command that is no longer
    /// running (this controller, or the one before it, stopped mid-way): roll back.
    pub(crate) stale: Vec<(Arc<Node>, Arc<NodeClaim>)>,
    /// Claims on a Machine a RollingUpdate has outdated, for which the rollout already made a
    /// fresh Machine nobody holds: each gets a replacement claim that takes it, so the pods
    /// Cluster API drains off the old Machine find a registered node waiting.
    pub(crate) rollout: Vec<Arc<NodeClaim>>,
    /// Claims whose `status.lastPodEventTime` is behind the pod events seen on their node.
    pub(crate) pod_event_times: Vec<(Arc<NodeClaim>, Timestamp)>,
    /// Pools with candidates for a reason whose budget allows no disruption now.
    pub(crate) budget_blocked: Vec<(Arc<NodePool>, DisruptionReason)>,
    /// Claims this pass does not weigh at all, and why (for `explain`; the pass ignores them),
    /// with the blocker of those not already going.
    pub(crate) skipped: Vec<(String, &'static str, Option<Blocker>)>,
    /// Nodes whose pool's `consolidateAfter` has not passed since their last pod event: a
    /// consolidation moves no pod onto them.
    pub(crate) under_consolidate_after: HashSet<String>,
    /// Claims whose group the catalog cannot read (malformed, template not read or failing):
    /// drift is not decided for them until it can, and each says why.
    pub(crate) unknown_group: Vec<(Arc<NodeClaim>, String)>,
}

/// What the pass knows that the indexes do not.
pub(crate) struct Memory<'a> {
    pub(crate) pdbs: &'a BTreeMap<String, Arc<PodDisruptionBudget>>,
    /// Last pod event per node, since this actor started.
    pub(crate) pod_events: &'a HashMap<String, Timestamp>,
    /// When this actor started: the earliest a pod event may be assumed (it never consolidates
    /// early after a restart; at worst it waits `consolidateAfter` once more).
    pub(crate) started: Timestamp,
    /// Claims of the command being carried out (their taints are ours).
    pub(crate) executing: &'a HashSet<String>,
    /// Claims pods are heading for (upstream's nomination): a command's replacements while the
    /// moved pods arrive, and the places the provisioner just planned pending pods onto. Not
    /// candidates: still empty a moment before their pods arrive, they would go as empty.
    pub(crate) nominated: &'a HashSet<String>,
    pub(crate) now: Timestamp,
    /// Keep the candidate a blocked claim would make too (`View::held_candidates`): `explain
    /// node --remove` simulates removing a node whatever holds it; the pass does not need them.
    pub(crate) keep_held: bool,
}

pub(crate) fn gather(inputs: Inputs<'_>, mem: &Memory<'_>) -> View {
    // Before the indexes below are locked for the pass (counting reads them too).
    let (static_room, terminate_first) = static_room(inputs, mem);
    let mut due = repair::due(inputs, mem.now);
    let st = inputs.state;
    let claims: Vec<Arc<NodeClaim>> = st.claims.read().all().cloned().collect();
    let pools = st.nodepools.read().all().clone();
    let nodes = st.nodes.read();
    let pods = st.pods.read();
    let machines = st.machines.read();
    let deployments = st.deployments.read();
    let mut pass = Pass {
        inputs,
        mem,
        pools: &pools,
        specs: pools
            .iter()
            .map(|(name, np)| (name.as_str(), drift::PoolSpec::of(np)))
            .collect(),
        nodes: &nodes,
        pods: &pods,
        machines: &machines,
        deployments: &deployments,
        selected: selected_by_nodeclass(inputs.catalog, &pools),
        pdbs: PdbIndex::new(mem.pdbs),
        rollout: Rollout::new(&claims, &machines, &deployments),
        holds: HashMap::new(),
        counts: HashMap::new(),
        totals: HashMap::new(),
        due: std::mem::take(&mut due.by_claim),
    };
    let mut view = View {
        repair_blocked: due.blocked,
        repair_held_pools: due.held_pools,
        ..View::default()
    };
    view.allowed.static_room = static_room;
    view.allowed.terminate_first = terminate_first;
    view.allowed.terminate_first_gates = terminate_first_gates(inputs).collect();
    view.rollout = pass.rollout.replace_now(&claims, &machines, &deployments);
    for c in &claims {
        pass.weigh(c, &mut view);
    }
    share_pool_totals(&mut view.candidates, &pass.totals);
    (view.allowed.budgets, view.budget_use) = budget::allow(&pools, &pass.counts, mem.now);
    view.budget_blocked = budget::blocked(&view.candidates, &view.allowed, &pools);
    view
}

/// Per static NodePool, the drift replacements it may launch now; and, with
/// `TerminateFirstDrift` or `TerminateFirstRepair`, the pools whose drifted or unhealthy nodes
/// go before their replacement.
fn static_room(
    inputs: Inputs<'_>,
    mem: &Memory<'_>,
) -> (HashMap<String, usize>, HashSet<(String, DisruptionReason)>) {
    use super::static_capacity::{counts, drift_room, terminate_first};
    let reasons: Vec<DisruptionReason> = terminate_first_gates(inputs).collect();
    let mut room = HashMap::new();
    let mut first = HashSet::new();
    for (name, (np, count)) in counts(inputs, mem.executing, &HashSet::new(), mem.now) {
        if !reasons.is_empty() && terminate_first(&np, &count) {
            first.extend(reasons.iter().map(|r| (name.clone(), *r)));
        }
        room.insert(name, drift_room(&np, &count));
    }
    (room, first)
}

/// The reasons whose terminate-first gate is on (`TerminateFirstDrift`, `TerminateFirstRepair`).
fn terminate_first_gates(inputs: Inputs<'_>) -> impl Iterator<Item = DisruptionReason> {
    let gates = &inputs.settings.disruption;
    [
        (gates.terminate_first_drift, DisruptionReason::Drifted),
        (gates.terminate_first_repair, DisruptionReason::Unhealthy),
    ]
    .into_iter()
    .filter_map(|(on, reason)| on.then_some(reason))
}

/// One pass over the claims: the indexes it reads, locked, and what it learns on the way.
struct Pass<'a> {
    inputs: Inputs<'a>,
    mem: &'a Memory<'a>,
    pools: &'a HashMap<String, Arc<NodePool>>,
    /// Each pool's side of drift, worked out once a pass rather than once a claim.
    specs: HashMap<&'a str, drift::PoolSpec<'a>>,
    nodes: &'a Nodes,
    pods: &'a Pods,
    machines: &'a Machines,
    deployments: &'a MachineDeployments,
    /// The groups each NodeClass selects.
    selected: HashMap<String, HashSet<String>>,
    pdbs: PdbIndex,
    rollout: Rollout,
    /// What each MachineDeployment's own state holds back, read once a pass.
    holds: HashMap<String, Option<Hold>>,
    /// Per pool: its claims in its budget.
    counts: HashMap<String, BudgetCount>,
    /// Per pool: hourly cost and reschedule disruption cost of all its weighed claims.
    totals: HashMap<String, (f64, f64)>,
    /// Claims unhealthy past their toleration (node repair as a disruption method).
    due: HashMap<String, crate::view::repair::Repair>,
}

/// A claim the pass weighs: in an existing NodePool, initialized on a Node that stays, no
/// command under way for it, its MachineDeployment recorded.
struct Weighable<'a> {
    claim: &'a Arc<NodeClaim>,
    name: String,
    pool: String,
    np: &'a Arc<NodePool>,
    node: &'a CompactNode,
    md: &'a str,
}

/// What disrupting a weighable claim would gain and cost.
struct Worth<'p> {
    drift: Option<Drift>,
    /// What its pool pays for it (NodeOverlays may price the offering for that pool alone).
    price: f64,
    /// The pods a disruption would move.
    moving: Vec<&'p PodSummary>,
    reschedule_cost: f64,
    /// `consolidateAfter` has passed, before anything else holds consolidation back.
    consolidatable: bool,
}

impl<'a> Pass<'a> {
    /// Counts the claim in its pool's budget, then files it: skipped, expired, blocked or a
    /// candidate, with the records it is behind on.
    fn weigh(&mut self, c: &'a Arc<NodeClaim>, view: &mut View) {
        let name = c.name_any();
        let pool = c.labels().get(NODEPOOL_LABEL).cloned().unwrap_or_default();
        let node = self.node_of(c);
        self.count_in_budget(c, &name, &pool, node);
        let Some(w) = self.admit(c, name, pool, node, view) else {
            return;
        };
        if let Some(why) = self.inputs.catalog.unknown(w.md) {
            view.unknown_group.push((c.clone(), why));
        }
        let group = self.deployments.get(w.md);
        // Summaries, not pods: this runs for every node on every pass.
        let on_node = self.pods.summaries_on(w.node.name());
        let worth = self.worth(&w, group.as_deref(), &on_node);
        let totals = self.totals.entry(w.pool.clone()).or_default();
        totals.0 += worth.price;
        totals.1 += worth.reschedule_cost;
        note_conditions(&w, &worth, view);
        let repair = self.repair(&w, view);
        let now = self.mem.now;
        match (
            self.restraint(&w, group.as_deref(), &worth, &on_node),
            repair,
        ) {
            (Err(hold), None) => {
                if self.mem.keep_held {
                    let held = candidate(w, worth, Some(hold.clone()), now);
                    view.held_candidates.push(held);
                }
                view.blocked.push((c.clone(), hold));
            }
            // What holds a healthy node back does not hold its repair: a candidate for that
            // alone.
            (Err(hold), Some(r)) => view.candidates.push(Candidate {
                drift: None,
                drifted_since: None,
                repair: Some(r),
                ..candidate(w, worth, Some(hold), now)
            }),
            (Ok(consolidation_hold), r) => view.candidates.push(Candidate {
                repair: r,
                ..candidate(w, worth, consolidation_hold, now)
            }),
        }
    }

    /// The claim's repair verdict when it is due for repair and nothing holds its repair back
    /// (what does is filed for `NodeRepairBlocked`).
    fn repair(&mut self, w: &Weighable<'a>, view: &mut View) -> Option<disruption::RepairVerdict> {
        let due = repair::verdict(self.due.get(&w.name)?);
        let paused = match self.hold(w.md) {
            Some(Hold::Paused(why)) => Some(why),
            _ => None,
        };
        let operator = self.inputs.settings.disruption.paused;
        match repair::held(w.claim, w.node, w.np, operator, paused) {
            Some(why) => {
                let node = w.node.name().to_string();
                view.repair_blocked.push((w.claim.clone(), node, why));
                None
            }
            None => Some(due),
        }
    }

    fn node_of(&self, c: &NodeClaim) -> Option<&'a CompactNode> {
        let nodes = self.nodes;
        c.status
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| nodes.compact(n))
            .map(|n| &**n)
    }

    /// Every claim counts in its pool's budget, the ones this pass does not weigh too.
    fn count_in_budget(
        &mut self,
        c: &NodeClaim,
        name: &str,
        pool: &str,
        node: Option<&CompactNode>,
    ) {
        // Cluster API deleting the claim's Machine (a rollout, a MachineHealthCheck, a user)
        // is a disruption from that moment: the claim's own deletion follows a watch event
        // later, and a decision made in between must already count it.
        let machine_going = self
            .machines
            .bound_to(name)
            .ok()
            .flatten()
            .is_some_and(|m| m.deletion_timestamp.is_some());
        let executing = self.mem.executing.contains(name) || machine_going;
        let standing = budget_standing(c, node, executing, self.mem.now);
        self.counts
            .entry(pool.to_string())
            .or_default()
            .add(standing);
    }

    /// The claim, if the pass weighs it; else it is filed as skipped or expired, and why.
    fn admit(
        &self,
        c: &'a Arc<NodeClaim>,
        name: String,
        pool: String,
        node: Option<&'a CompactNode>,
        view: &mut View,
    ) -> Option<Weighable<'a>> {
        let np = self.pool_to_weigh(c, &name, &pool, node, view)?;
        self.note_records_behind(c, np, node, view);
        let (node, md) = self.settled(c, &name, node, view)?;
        Some(Weighable {
            claim: c,
            name,
            pool,
            np,
            node,
            md,
        })
    }

    /// The claim's NodePool, unless the claim is going already, cannot be removed by name or
    /// has expired (those are filed here).
    fn pool_to_weigh(
        &self,
        c: &Arc<NodeClaim>,
        name: &str,
        pool: &str,
        node: Option<&CompactNode>,
        view: &mut View,
    ) -> Option<&'a Arc<NodePool>> {
        if c.metadata.deletion_timestamp.is_some() {
            return skip(view, name, "it is being deleted", None);
        }
        // No instance of such a pool can be removed by name: deleting its claim would leave a
        // cordoned instance behind (handed back to the pool), so nothing disrupts it by choice.
        if recorded_instance(c).is_some() {
            return skip(
                view,
                name,
                "its MachinePool cannot remove a specific instance",
                Some(Blocker::NotRemovable),
            );
        }
        if !node.is_some_and(CompactNode::deleting) && expired(c, self.mem.now) {
            view.expired.push(c.clone());
            return None;
        }
        match self.pools.get(pool) {
            Some(np) => Some(np),
            None => skip(
                view,
                name,
                "its NodePool does not exist",
                Some(Blocker::Unmanaged),
            ),
        }
    }

    /// The claim's records that are behind: its NodePool hash, and its last pod event.
    fn note_records_behind(
        &self,
        c: &Arc<NodeClaim>,
        np: &Arc<NodePool>,
        node: Option<&CompactNode>,
        view: &mut View,
    ) {
        if self.with_spec(np, |spec| drift::needs_restamp(c, spec)) {
            view.restamp.push((c.clone(), np.clone()));
        }
        if let Some(at) = node.and_then(|n| pod_event_behind(c, self.mem.pod_events.get(n.name())))
        {
            view.pod_event_times.push((c.clone(), at));
        }
    }

    /// The claim's Node and MachineDeployment, once it is initialized on a Node that stays, no
    /// command is under way for it and its MachineDeployment is recorded; else it is filed as
    /// skipped (and, marked by a command no longer running, as stale).
    fn settled(
        &self,
        c: &'a Arc<NodeClaim>,
        name: &str,
        node: Option<&'a CompactNode>,
        view: &mut View,
    ) -> Option<(&'a CompactNode, &'a str)> {
        let initialized = conditions::is_true(c.conditions(), conditions::INITIALIZED);
        let (Some(node), true) = (node, initialized) else {
            let why = "it is not initialized with a Node yet";
            return skip(view, name, why, Some(Blocker::NotInitialized));
        };
        if node.deleting() {
            return skip(view, name, "its Node is being deleted", None);
        }
        let ours = self.mem.executing.contains(name);
        if under_way(c, Some(node)) || ours {
            if !ours {
                view.stale.push((Arc::new(node.node()), c.clone()));
            }
            return skip(
                view,
                name,
                "a disruption command is already under way for it (karpenter.sh/disrupted taint or DisruptionReason condition)",
                None,
            );
        }
        // A claim another provisioner launched names no MachineDeployment of ours until its
        // adoption lands: read as one on no selected MachineDeployment it would drift, so it
        // waits for that write.
        let Some(md) = recorded_deployment(c) else {
            return skip(
                view,
                name,
                "its MachineDeployment is not recorded yet (its adoption is under way)",
                Some(Blocker::Unmanaged),
            );
        };
        Some((node, md))
    }

    fn worth<'p>(
        &self,
        w: &Weighable<'a>,
        group: Option<&MachineDeployment>,
        on_node: &[&'p PodSummary],
    ) -> Worth<'p> {
        let moving: Vec<&PodSummary> = on_node
            .iter()
            .copied()
            .filter(|p| p.is_reschedulable())
            .collect();
        Worth {
            drift: self.drift(w, group),
            price: self
                .inputs
                .catalog
                .pool_offering(w.md, Some(&w.pool))
                .as_ref()
                .map(|o| o.price)
                .unwrap_or(0.0),
            reschedule_cost: reschedule_cost(&moving),
            moving,
            consolidatable: consolidatable(
                w.claim,
                w.np,
                self.mem.pod_events.get(w.node.name()).copied(),
                self.mem.started,
                self.mem.now,
            ),
        }
    }

    /// Whether the claim drifted from its NodePool or from what its group makes now.
    fn drift(&self, w: &Weighable<'a>, group: Option<&MachineDeployment>) -> Option<Drift> {
        // Only under OnDelete is an outdated Machine ours to replace; under RollingUpdate
        // Cluster API replaces it itself (and the Scaler lets the new claims adopt the fresh
        // Machines).
        let on_delete = group.is_some_and(|d| d.on_delete);
        let nodeclass = &w.claim.spec.node_class_ref.name;
        let provider = drift::Provider {
            selected: self.selected.get(nodeclass).map(|mds| mds.contains(w.md)),
            machine_up_to_date: match group.and_then(|d| d.template_hash.as_deref()) {
                // A pool's Machines are all `UpToDate`; its template and its infrastructure
                // pool's instance fields are compared instead.
                Some(now) => {
                    let infra_now = self.inputs.catalog.instance_hash(w.md);
                    pool_up_to_date(w.claim, now, infra_now.as_deref())
                }
                None => self
                    .machines
                    .bound_to(&w.name)
                    .ok()
                    .flatten()
                    .and_then(|m| m.up_to_date)
                    .filter(|_| on_delete),
            },
        };
        self.with_spec(w.np, |spec| drift::drifted(w.claim, spec, provider))
    }

    /// `f` of the pool's drift side: the pass's own, or (for a pool it has not seen) made now.
    fn with_spec<T>(&self, np: &NodePool, f: impl FnOnce(&drift::PoolSpec) -> T) -> T {
        match np.metadata.name.as_deref().and_then(|n| self.specs.get(n)) {
            Some(spec) => f(spec),
            None => f(&drift::PoolSpec::of(np)),
        }
    }

    /// What holds every disruption of the claim now (`Err`); when nothing does, what holds its
    /// consolidation (`Ok(Some)`: drift still may), in the order the rules are checked.
    fn restraint(
        &mut self,
        w: &Weighable<'a>,
        group: Option<&MachineDeployment>,
        worth: &Worth<'_>,
        on_node: &[&PodSummary],
    ) -> Result<Option<disruption::Hold>, disruption::Hold> {
        use disruption::Hold;
        // An operator's pause holds every voluntary disruption of the pool, as Cluster API's
        // pause (`deployment_holds`) holds its groups' nodes: filed as blocked, with the reason.
        refuse(
            disruption::pause::paused(self.inputs.settings.disruption.paused, w.np)
                .map(|p| Hold::new(Blocker::Paused, p.message())),
        )?;
        if self.mem.nominated.contains(&w.name) {
            return Err(Hold::new(
                Blocker::Nominated,
                "pods are planned onto it (nominated: the replacement of a disruption, or a node the provisioner chose for pending pods)",
            ));
        }
        refuse(
            self.rollout
                .protects(&w.name)
                .map(held(Blocker::RollingOut)),
        )?;
        let rolling_out = self.deployment_holds(w.md, worth.drift)?;
        refuse(node_protected(w.claim, w.node))?;
        // Drift launches its replacement first, so only consolidation is held at min size.
        refuse(
            group
                .filter(|_| worth.drift.is_none())
                .and_then(at_min_size)
                .map(held(Blocker::MinSize)),
        )?;
        // A node the last solve put a CapacityBuffer's placeholders on holds the buffer's room:
        // not empty, and not consolidated (upstream's emptiness check); drift still replaces it.
        let holds_buffer = (worth.moving.is_empty()
            && self.inputs.state.buffers.read().hosts(w.node.name()))
        .then(|| {
            Hold::new(
                Blocker::BufferPods,
                "it holds a CapacityBuffer's placeholder pods",
            )
        });
        let pods_hold = self.pods_hold(w.claim, worth.drift, on_node)?;
        // A static pool's nodes are held: only drift replaces them, one for one.
        let static_pool = w.np.is_static().then(|| {
            Hold::new(
                Blocker::StaticPool,
                "its NodePool is static (spec.replicas): its nodes are held, not consolidated",
            )
        });
        if let (Some(hold), None) = (&static_pool, worth.drift) {
            return Err(hold.clone());
        }
        Ok(rolling_out.or(holds_buffer).or(pods_hold).or(static_pool))
    }

    /// Whether the claim's MachineDeployment holds it: paused, or mid-rollout, where a drifted
    /// claim stays a drift candidate only (then `Ok(Some)`, consolidation held).
    fn deployment_holds(
        &mut self,
        md: &str,
        drift: Option<Drift>,
    ) -> Result<Option<disruption::Hold>, disruption::Hold> {
        match self.hold(md) {
            Some(Hold::Paused(why)) => Err(held(Blocker::Paused)(why)),
            Some(Hold::RollingOut(why)) if drift.is_none() => Err(held(Blocker::RollingOut)(why)),
            Some(Hold::RollingOut(why)) => Ok(Some(held(Blocker::RollingOut)(why))),
            None => Ok(None),
        }
    }

    /// What the MachineDeployment's own state holds back, read once a pass.
    fn hold(&mut self, md: &str) -> Option<Hold> {
        let (deployments, machines) = (self.deployments, self.machines);
        self.holds
            .entry(md.to_string())
            .or_insert_with(|| {
                deployments.get(md).and_then(|d| {
                    let cluster_paused = deployments.cluster_paused(&d);
                    let replicas_held = deployments.replicas_held(&d);
                    deployment_hold(
                        &d,
                        cluster_paused,
                        replicas_held,
                        &machines.of_deployment(md),
                    )
                })
            })
            .clone()
    }

    /// Whether the claim's pods hold it. Upstream's eventual disruption class: a drifted claim
    /// with a terminationGracePeriod is replaced even when its pods block eviction (the drain
    /// honours them until the grace period ends), only not consolidated (then `Ok(Some)`); for
    /// everything else they protect it.
    fn pods_hold(
        &self,
        c: &NodeClaim,
        drift: Option<Drift>,
        on_node: &[&PodSummary],
    ) -> Result<Option<disruption::Hold>, disruption::Hold> {
        let Some(hold) = pods_protected(on_node, &self.pdbs, self.mem.now) else {
            return Ok(None);
        };
        let eventual = drift.is_some() && c.spec.termination_grace_period.is_some();
        if eventual { Ok(Some(hold)) } else { Err(hold) }
    }
}

/// Files the claim as one the pass does not weigh, and why (a blocker unless it is going).
fn skip<T>(view: &mut View, name: &str, why: &'static str, blocker: Option<Blocker>) -> Option<T> {
    view.skipped.push((name.to_string(), why, blocker));
    None
}

/// `Err` with the hold, when there is one.
fn refuse(hold: Option<disruption::Hold>) -> Result<(), disruption::Hold> {
    hold.map_or(Ok(()), Err)
}

/// `why`, held by `blocker`.
fn held(blocker: Blocker) -> impl Fn(String) -> disruption::Hold {
    move |why| disruption::Hold::new(blocker, why)
}

/// What the claim's consolidatability means beyond this pass: its Node, inside its pool's
/// `consolidateAfter`, takes no moved pod; and its Drifted and Consolidatable conditions are
/// stamped when they are out of date.
fn note_conditions(w: &Weighable<'_>, worth: &Worth<'_>, view: &mut View) {
    if !worth.consolidatable && w.np.disruption().consolidate_after().duration().is_some() {
        view.under_consolidate_after
            .insert(w.node.name().to_string());
    }
    if stamp_needed(w.claim, worth.drift, worth.consolidatable) {
        view.stamps.push(Stamp {
            claim: w.claim.clone(),
            drift: worth.drift,
            consolidatable: worth.consolidatable,
        });
    }
}

/// The groups each NodeClass selects (offered or not), for NodeClasses the catalog is sure of.
fn selected_by_nodeclass(
    catalog: &CatalogView,
    pools: &HashMap<String, Arc<NodePool>>,
) -> HashMap<String, HashSet<String>> {
    let mut out = HashMap::new();
    for np in pools.values() {
        let nc = &np.spec.template.spec.node_class_ref.name;
        if out.contains_key(nc) || catalog.nodeclass_ready(nc) != Some(Ok(())) {
            continue;
        }
        if let Some(selected) = catalog.selected(nc) {
            out.insert(nc.clone(), selected);
        }
    }
    out
}

#[cfg(test)]
mod tests;
