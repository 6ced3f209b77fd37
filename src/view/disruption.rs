//! What one disruption pass sees, read from the indexes (no API calls): the candidates with
//! their prices, pods, drift and consolidatability; the claims protected from disruption and
//! why; the budgets left per pool and reason; expired claims; condition and hash stamps that
//! are out of date; and disrupted taints nobody owns any more (a controller that died mid-way).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;

use super::Inputs;
use super::catalog::CatalogView;
use super::protection::{PdbIndex, node_protected, pods_protected};
use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::{ConsolidationPolicy, DisruptionReason, NodePool};
use crate::api::wellknown::{
    CAPACITY_TYPE_LABEL, CAPACITY_TYPE_ON_DEMAND, DISRUPTED_TAINT_KEY, INFRA_POOL_HASH_ANNOTATION,
    INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, POOL_TEMPLATE_HASH_ANNOTATION,
};
use crate::disruption::{
    self, Allowed, Candidate, Drift, budgets, consolidation::reschedulable, drift,
};
use crate::scheduling::Snapshot;
use crate::state::claims::{recorded_deployment, recorded_instance};
use crate::state::compact::CompactNode;
use crate::state::pods;

mod rollout;
use rollout::{Hold, Rollout, deployment_hold};

/// A claim whose `Drifted` or `Consolidatable` condition should change.
#[derive(Clone, Debug)]
pub struct Stamp {
    pub claim: Arc<NodeClaim>,
    pub drift: Option<Drift>,
    pub consolidatable: bool,
}

#[derive(Default)]
pub struct View {
    pub candidates: Vec<Candidate>,
    /// Claims that would be candidates but for this (do-not-disrupt, a PodDisruptionBudget).
    pub blocked: Vec<(Arc<NodeClaim>, String)>,
    pub allowed: Allowed,
    /// Per pool and reason: the budget's allowance before nodes under way are subtracted, and
    /// those nodes (upstream's allowed_disruptions and nodes_consuming_budgets gauges).
    pub budget_use: Vec<(String, DisruptionReason, usize, usize)>,
    pub expired: Vec<Arc<NodeClaim>>,
    pub stamps: Vec<Stamp>,
    /// Claims carrying a NodePool hash of another hash version.
    pub restamp: Vec<(Arc<NodeClaim>, Arc<NodePool>)>,
    /// Claims whose Node carries `karpenter.sh/disrupted` from a command that is no longer
    /// running (this controller, or the one before it, stopped mid-way): roll back.
    pub stale: Vec<(Arc<Node>, Arc<NodeClaim>)>,
    /// Claims on a Machine a RollingUpdate has outdated, for which the rollout already made a
    /// fresh Machine nobody holds: each gets a replacement claim that takes it, so the pods
    /// Cluster API drains off the old Machine find a registered node waiting.
    pub rollout: Vec<Arc<NodeClaim>>,
    /// Claims whose `status.lastPodEventTime` is behind the pod events seen on their node.
    pub pod_event_times: Vec<(Arc<NodeClaim>, Timestamp)>,
    /// Pools with candidates for a reason whose budget allows no disruption now.
    pub budget_blocked: Vec<(Arc<NodePool>, DisruptionReason)>,
    /// Claims this pass does not weigh at all, and why (for `explain`; the pass ignores them).
    pub skipped: Vec<(String, &'static str)>,
    /// Nodes whose pool's `consolidateAfter` has not passed since their last pod event: a
    /// consolidation moves no pod onto them.
    pub under_consolidate_after: HashSet<String>,
    /// Claims whose group the catalog cannot read (malformed, template not read or failing):
    /// drift is not decided for them until it can, and each says why.
    pub unknown_group: Vec<(Arc<NodeClaim>, String)>,
}

/// What the pass knows that the indexes do not.
pub struct Memory<'a> {
    pub pdbs: &'a BTreeMap<String, Arc<PodDisruptionBudget>>,
    /// Last pod event per node, since this actor started.
    pub pod_events: &'a HashMap<String, Timestamp>,
    /// When this actor started: the earliest a pod event may be assumed (it never consolidates
    /// early after a restart; at worst it waits `consolidateAfter` once more).
    pub started: Timestamp,
    /// Claims of the command being carried out (their taints are ours).
    pub executing: &'a HashSet<String>,
    /// Claims pods are heading for (upstream's nomination): a command's replacements while the
    /// moved pods arrive, and the places the provisioner just planned pending pods onto. Not
    /// candidates: still empty a moment before their pods arrive, they would go as empty.
    pub nominated: &'a HashSet<String>,
    pub now: Timestamp,
}

pub fn gather(inputs: Inputs<'_>, mem: &Memory<'_>) -> View {
    let st = inputs.state;
    // Before the indexes below are locked for the pass (counting reads them too).
    let static_room: HashMap<String, usize> =
        super::static_capacity::counts(inputs, mem.executing, &HashSet::new(), mem.now)
            .into_iter()
            .map(|(name, (np, count))| (name, super::static_capacity::drift_room(&np, &count)))
            .collect();
    let claims: Vec<Arc<NodeClaim>> = st.claims.read().all().cloned().collect();
    let pools = st.nodepools.read().all().clone();
    let nodes = st.nodes.read();
    let pod_index = st.pods.read();
    let machines = st.machines.read();
    let deployments = st.deployments.read();
    let selected = selected_by_nodeclass(inputs.catalog, &pools);
    let pdbs = PdbIndex::new(mem.pdbs);

    let mut view = View::default();
    view.allowed.static_room = static_room;
    let rollout = Rollout::new(&claims, &machines, &deployments);
    view.rollout = rollout.replace_now(&claims, &machines, &deployments);
    let mut total: HashMap<String, usize> = HashMap::new();
    // Per pool: hourly cost and reschedule disruption cost of all its initialized nodes.
    let mut pool_totals: HashMap<String, (f64, f64)> = HashMap::new();
    let mut disrupting: HashMap<String, usize> = HashMap::new();
    let mut holds: HashMap<String, Option<Hold>> = HashMap::new();
    for c in &claims {
        let name = c.name_any();
        let pool_name = c.labels().get(NODEPOOL_LABEL).cloned().unwrap_or_default();
        let node = c
            .status
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| nodes.compact(n))
            .map(|n| &**n);
        let initialized = conditions::is_true(c.conditions(), conditions::INITIALIZED);
        // Cluster API deleting the claim's Machine (a rollout, a MachineHealthCheck, a user)
        // is a disruption from that moment: the claim's own deletion follows a watch event
        // later, and a decision made in between must already count it.
        let machine_going = machines
            .bound_to(&name)
            .ok()
            .flatten()
            .is_some_and(|m| m.deletion_timestamp.is_some());
        let standing = budget_standing(
            c,
            node,
            mem.executing.contains(&name) || machine_going,
            mem.now,
        );
        if standing.counted {
            *total.entry(pool_name.clone()).or_default() += 1;
            if standing.disrupting {
                *disrupting.entry(pool_name.clone()).or_default() += 1;
            }
        }
        let going =
            c.metadata.deletion_timestamp.is_some() || node.as_ref().is_some_and(|n| n.deleting());
        let under_way = under_way(c, node);
        let expiring = !going && expired(c, mem.now);
        if c.metadata.deletion_timestamp.is_some() {
            view.skipped.push((name, "it is being deleted"));
            continue;
        }
        // No instance of such a pool can be removed by name: deleting its claim would leave a
        // cordoned instance behind (handed back to the pool), so nothing disrupts it by choice.
        if recorded_instance(c).is_some() {
            view.skipped
                .push((name, "its MachinePool cannot remove a specific instance"));
            continue;
        }
        if expiring {
            view.expired.push(c.clone());
            continue;
        }
        let Some(np) = pools.get(&pool_name) else {
            view.skipped.push((name, "its NodePool does not exist"));
            continue;
        };
        if drift::needs_restamp(c, np) {
            view.restamp.push((c.clone(), np.clone()));
        }
        if let Some(at) = node
            .as_ref()
            .and_then(|n| pod_event_behind(c, mem.pod_events.get(n.name())))
        {
            view.pod_event_times.push((c.clone(), at));
        }
        let (Some(node), true) = (node, initialized) else {
            view.skipped
                .push((name, "it is not initialized with a Node yet"));
            continue;
        };
        if node.deleting() {
            view.skipped.push((name, "its Node is being deleted"));
            continue;
        }
        let ours = mem.executing.contains(&name);
        if under_way || ours {
            if !ours {
                view.stale.push((Arc::new(node.node()), c.clone()));
            }
            view.skipped.push((
                name,
                "a disruption command is already under way for it (karpenter.sh/disrupted taint or DisruptionReason condition)",
            ));
            continue;
        }
        // A claim another provisioner launched names no MachineDeployment of ours until its
        // adoption lands: read as one on no selected MachineDeployment it would drift, so it
        // waits for that write.
        let Some(md) = recorded_deployment(c) else {
            view.skipped.push((
                name,
                "its MachineDeployment is not recorded yet (its adoption is under way)",
            ));
            continue;
        };
        let machine = machines.bound_to(&name).ok().flatten();
        let nodeclass = &c.spec.node_class_ref.name;
        // Only under OnDelete is an outdated Machine ours to replace; under RollingUpdate
        // Cluster API replaces it itself (and the Scaler lets the new claims adopt the fresh
        // Machines).
        let group = deployments.get(md);
        let on_delete = group.as_ref().is_some_and(|d| d.on_delete);
        if let Some(why) = inputs.catalog.unknown(md) {
            view.unknown_group.push((c.clone(), why));
        }
        let provider = drift::Provider {
            selected: selected.get(nodeclass).map(|mds| mds.contains(md)),
            machine_up_to_date: match group.as_ref().and_then(|d| d.template_hash.as_deref()) {
                // A pool's Machines are all `UpToDate`; its template and its infrastructure
                // pool's instance fields are compared instead.
                Some(now) => pool_up_to_date(c, now, inputs.catalog.instance_hash(md).as_deref()),
                None => machine
                    .as_ref()
                    .and_then(|m| m.up_to_date)
                    .filter(|_| on_delete),
            },
        };
        let drift = drift::drifted(c, np, provider);
        let on_node = pod_index.on_node(node.name());
        // What its pool pays: NodeOverlays may price the offering for that pool alone.
        let price = inputs
            .catalog
            .pool_offering(md, Some(&pool_name))
            .as_ref()
            .map(|o| o.price)
            .unwrap_or(0.0);
        let moving: Vec<&Arc<Pod>> = on_node.iter().filter(|p| reschedulable(p)).collect();
        let reschedule_cost = reschedule_cost(&moving);
        {
            let totals = pool_totals.entry(pool_name.clone()).or_default();
            totals.0 += price;
            totals.1 += reschedule_cost;
        }
        let consolidatable = consolidatable(c, np, node.name(), mem);
        if !consolidatable && np.disruption().consolidate_after().duration().is_some() {
            view.under_consolidate_after.insert(node.name().to_string());
        }
        if stamp_needed(c, drift, consolidatable) {
            view.stamps.push(Stamp {
                claim: c.clone(),
                drift,
                consolidatable,
            });
        }
        if mem.nominated.contains(&name) {
            view.blocked.push((
                c.clone(),
                "pods are planned onto it (nominated: the replacement of a disruption, or a node the provisioner chose for pending pods)".to_string(),
            ));
            continue;
        }
        if let Some(why) = rollout.protects(&name) {
            view.blocked.push((c.clone(), why));
            continue;
        }
        let hold = holds
            .entry(md.to_string())
            .or_insert_with(|| {
                deployments.get(md).and_then(|d| {
                    let cluster_paused = deployments.cluster_paused(&d);
                    deployment_hold(&d, cluster_paused, &machines.of_deployment(md))
                })
            })
            .clone();
        let rolling_out = match hold {
            Some(Hold::Paused(why)) => {
                view.blocked.push((c.clone(), why));
                continue;
            }
            Some(Hold::RollingOut(why)) if drift.is_none() => {
                view.blocked.push((c.clone(), why));
                continue;
            }
            Some(Hold::RollingOut(_)) => true,
            None => false,
        };
        if let Some(why) = node_protected(c, node) {
            view.blocked.push((c.clone(), why));
            continue;
        }
        // Drift launches its replacement first, so only consolidation is held at min size.
        if let Some(why) = group
            .as_deref()
            .filter(|_| drift.is_none())
            .and_then(at_min_size)
        {
            view.blocked.push((c.clone(), why));
            continue;
        }
        // Upstream's eventual disruption class: a drifted claim with a terminationGracePeriod is
        // replaced even when its pods block eviction (the drain honours them until the grace
        // period ends); for everything else they protect it.
        let pod_blocked = pods_protected(&on_node, &pdbs, mem.now);
        let eventual = drift.is_some() && c.spec.termination_grace_period.is_some();
        // A drifted claim on a MachineDeployment mid-rollout stays a drift candidate only.
        let mut consolidatable = consolidatable && !rolling_out;
        // A node the last solve put a CapacityBuffer's placeholders on holds the buffer's room:
        // not empty, and not consolidated (upstream's emptiness check); drift still replaces it.
        if moving.is_empty() && st.buffers.read().hosts(node.name()) {
            consolidatable = false;
        }
        if let Some(why) = pod_blocked {
            if !eventual {
                view.blocked.push((c.clone(), why));
                continue;
            }
            consolidatable = false;
        }
        // A static pool's nodes are held: only drift replaces them, one for one.
        if np.is_static() && drift.is_none() {
            view.blocked.push((
                c.clone(),
                "its NodePool is static (spec.replicas): its nodes are held, not consolidated"
                    .to_string(),
            ));
            continue;
        }
        let consolidatable = consolidatable && !np.is_static();
        view.candidates.push(Candidate {
            claim: name,
            node: node.name().to_string(),
            nodepool: pool_name,
            price,
            instance_type: c
                .labels()
                .get(INSTANCE_TYPE_LABEL)
                .cloned()
                .unwrap_or_default(),
            reschedule_cost,
            drifted_since: conditions::get(c.conditions(), conditions::DRIFTED)
                .filter(|d| d.is_true())
                .map(|d| d.last_transition_time.0.as_second()),
            pool_cost: 0.0,
            pool_disruption: 0.0,
            capacity_type: c
                .labels()
                .get(CAPACITY_TYPE_LABEL)
                .cloned()
                .unwrap_or_else(|| CAPACITY_TYPE_ON_DEMAND.to_string()),
            pods: moving.iter().map(|p| pods::key(p)).collect(),
            disruption_cost: disruption::claim_disruption_cost(c, &moving, mem.now),
            drift,
            consolidatable,
            policy: np.disruption().consolidation_policy(),
            static_pool: np.is_static(),
        });
    }
    for c in &mut view.candidates {
        if let Some((cost, disruption)) = pool_totals.get(&c.nodepool) {
            c.pool_cost = *cost;
            c.pool_disruption = *disruption;
        }
    }
    let now_unix = mem.now.as_second();
    for (name, np) in &pools {
        for reason in [
            DisruptionReason::Empty,
            DisruptionReason::Drifted,
            DisruptionReason::Underutilized,
        ] {
            let n = total.get(name).copied().unwrap_or(0);
            let busy = disrupting.get(name).copied().unwrap_or(0);
            let left = budgets::allowed(np, reason, n, busy, now_unix);
            view.allowed.budgets.insert((name.clone(), reason), left);
            let whole = budgets::allowed(np, reason, n, 0, now_unix);
            view.budget_use.push((name.clone(), reason, whole, busy));
        }
    }
    let mut blocked: HashSet<(String, DisruptionReason)> = HashSet::new();
    for c in &view.candidates {
        let eligible = [
            (
                DisruptionReason::Empty,
                c.consolidatable && c.pods.is_empty(),
            ),
            (DisruptionReason::Drifted, c.drift.is_some()),
            (
                DisruptionReason::Underutilized,
                c.consolidatable && c.policy != ConsolidationPolicy::WhenEmpty,
            ),
        ];
        for (reason, yes) in eligible {
            if yes && view.allowed.get(&c.nodepool, reason) == 0 {
                blocked.insert((c.nodepool.clone(), reason));
            }
        }
    }
    let mut blocked: Vec<(String, DisruptionReason)> = blocked.into_iter().collect();
    blocked.sort();
    view.budget_blocked = blocked
        .into_iter()
        .filter_map(|(pool, reason)| pools.get(&pool).map(|np| (np.clone(), reason)))
        .collect();
    view
}

/// The solver's view of the cluster, as the provisioner sees it, with every pod of the nodes a
/// decision may simulate removing: candidates with pods that are drifted, or consolidatable
/// under a policy that moves pods (empty ones go without a solve).
pub fn snapshot(
    view: Inputs<'_>,
    candidates: &[Candidate],
    leaving: &[Candidate],
    under_consolidate_after: &HashSet<String>,
) -> Snapshot {
    let none: [(&u64, &NodeClaim); 0] = [];
    let moving: HashSet<String> = candidates
        .iter()
        .filter(|c| !c.pods.is_empty())
        .filter(|c| {
            c.drift.is_some() || (c.consolidatable && c.policy != ConsolidationPolicy::WhenEmpty)
        })
        .chain(leaving)
        .map(|c| c.node.clone())
        .collect();
    let mut snapshot = super::snapshot::build(
        view,
        none,
        view.settings.preference,
        super::snapshot::BoundPods::Needed { moving: &moving },
    );
    // A moved pod's volumes bound where it may go, as they bound a pending pod.
    let on_moving = snapshot.bound_pods.iter().filter(|p| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some_and(|n| moving.contains(n))
    });
    snapshot.volume_topology = crate::scheduling::volumes::topology_of(
        on_moving.map(|p| &**p),
        &view.state.storage.read().catalog,
    );
    // The nodes of the commands under way are going: their pods are planned as pending.
    let leaving: Vec<&Candidate> = leaving.iter().collect();
    let mut snapshot = if leaving.is_empty() {
        snapshot
    } else {
        crate::disruption::consolidation::without(&snapshot, &leaving)
    };
    // Their pods are not the next decision's moved pods: nodes inside consolidateAfter may
    // take them, as upstream lets pods of deleting nodes go there. They are displaced, as the
    // pods of deleting nodes are: the next decision must leave them room.
    let leaving_pods = std::mem::take(&mut snapshot.moved);
    snapshot.displaced.extend(leaving_pods);
    snapshot.under_consolidate_after = under_consolidate_after.clone();
    snapshot
}

fn expired(c: &NodeClaim, now: Timestamp) -> bool {
    let Some(after) = c.spec.expire_after.and_then(|d| d.duration()) else {
        return false;
    };
    let Some(created) = c.metadata.creation_timestamp.as_ref() else {
        return false;
    };
    since(created.0, now) >= after
}

fn since(t: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(t)).unwrap_or_default()
}

/// Pod events move `status.lastPodEventTime` in steps of at least this (Karpenter v1.0's dedupe):
/// a node filling up writes its claim a few times, not once per pod. The countdown itself uses
/// the exact time held in memory.
pub const POD_EVENT_WRITE_STEP: Duration = Duration::from_secs(10);

/// The time to record as the claim's last pod event, if the record is that far behind.
fn pod_event_behind(c: &NodeClaim, seen: Option<&Timestamp>) -> Option<Timestamp> {
    let seen = *seen?;
    let recorded = c
        .status
        .as_ref()
        .and_then(|s| s.last_pod_event_time.as_ref())
        .map(|t| t.0);
    match recorded {
        Some(r) if seen <= r || since(r, seen) < POD_EVENT_WRITE_STEP => None,
        _ => Some(seen),
    }
}

/// `consolidateAfter` has passed since the node's last pod event (or its initialization), and
/// the pool consolidates at all.
fn consolidatable(c: &NodeClaim, np: &NodePool, node: &str, mem: &Memory<'_>) -> bool {
    let Some(after) = np.disruption().consolidate_after().duration() else {
        return false;
    };
    let initialized = conditions::get(c.conditions(), conditions::INITIALIZED)
        .map(|i| i.last_transition_time.0)
        .unwrap_or(mem.now);
    let recorded = c
        .status
        .as_ref()
        .and_then(|s| s.last_pod_event_time.as_ref())
        .map(|t| t.0);
    let last = [
        Some(initialized),
        recorded,
        mem.pod_events.get(node).copied(),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(mem.started);
    // Before this actor started we saw no pod events: assume one at start (never early).
    let last = if after.is_zero() {
        last
    } else {
        last.max(mem.started)
    };
    since(last, mem.now) >= after
}

fn stamp_needed(c: &NodeClaim, drift: Option<Drift>, consolidatable: bool) -> bool {
    let conds = c.conditions();
    let drifted_now = conditions::get(conds, conditions::DRIFTED)
        .filter(|d| d.is_true())
        .map(|d| d.reason.as_str());
    let consolidatable_now = conditions::is_true(conds, conditions::CONSOLIDATABLE);
    drifted_now != drift.map(Drift::reason) || consolidatable_now != consolidatable
}

/// Cluster Autoscaler's rule: a group at its min-size annotation gives up no node by choice.
/// Removing one would lower no replica (Cluster API keeps the group at min size): the Machine
/// would be deleted and made again, a drain and a boot for nothing.
fn at_min_size(group: &crate::capi::model::MachineDeployment) -> Option<String> {
    let min: i32 = group
        .annotations
        .get(crate::api::wellknown::MIN_SIZE_ANNOTATION)?
        .trim()
        .trim_start_matches('+')
        .parse()
        .ok()?;
    let replicas = group.spec_replicas?;
    (min > 0 && replicas <= min).then(|| {
        format!(
            "its {} is at its min size ({replicas} replicas, min {min}): Cluster API would only make its Machine again",
            group.scalable()
        )
    })
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

/// Upstream's reschedule disruption cost: 1 for the node itself, plus each moving pod's
/// eviction cost where it is positive.
fn reschedule_cost(moving: &[&Arc<Pod>]) -> f64 {
    1.0 + moving
        .iter()
        .map(|p| disruption::pod_eviction_cost(p).max(0.0))
        .sum::<f64>()
}

/// Where a claim stands in its pool's disruption budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetStanding {
    /// It is one of the pool's nodes the budget's percentage is of.
    pub counted: bool,
    /// It uses up a disruption of the budget now.
    pub disrupting: bool,
}

/// Upstream's budget accounting: only initialized claims count, less those whose instance is
/// already terminating; of them, the ones whose Node is not Ready, the ones going away (claim or
/// Node deleting, or expired) and those of the commands under way (or, as the caller says,
/// whose Machine Cluster API is deleting) are disrupting. A claim whose
/// Node is already gone still counts while it is deleted (upstream keeps its state node for the
/// claim alone). A launch that never initialized uses no budget when it is deleted, and during an
/// outage (Nodes NotReady) nothing more is disrupted voluntarily.
pub fn budget_standing(
    c: &NodeClaim,
    node: Option<&CompactNode>,
    executing: bool,
    now: Timestamp,
) -> BudgetStanding {
    let counted = conditions::is_true(c.conditions(), conditions::INITIALIZED)
        && !conditions::is_true(c.conditions(), conditions::INSTANCE_TERMINATING);
    let going = c.metadata.deletion_timestamp.is_some()
        || node.is_some_and(CompactNode::deleting)
        || expired(c, now);
    BudgetStanding {
        counted,
        // A claim of a command under way counts from the command's start, before its marks
        // reach the index: the next pass may come first.
        disrupting: counted && (going || executing || node.is_some_and(|n| !n.ready())),
    }
}

/// A disruption command has marked the claim (condition) or tainted its Node.
fn under_way(c: &NodeClaim, node: Option<&CompactNode>) -> bool {
    node.is_some_and(|n| n.taints().iter().any(|t| t.key == DISRUPTED_TAINT_KEY))
        || conditions::get(c.conditions(), conditions::DISRUPTION_REASON).is_some()
}

#[cfg(test)]
mod tests;

/// Whether claim `c` on a MachinePool Machine is bound under the pool's current template
/// (`template_now`) and infrastructure pool (`infra_now`); None when it recorded neither.
fn pool_up_to_date(c: &NodeClaim, template_now: &str, infra_now: Option<&str>) -> Option<bool> {
    let annotations = c.annotations();
    let template = annotations
        .get(POOL_TEMPLATE_HASH_ANNOTATION)
        .map(|bound_under| bound_under == template_now);
    let infra = match (annotations.get(INFRA_POOL_HASH_ANNOTATION), infra_now) {
        (Some(bound_under), Some(now)) => Some(bound_under == now),
        _ => None,
    };
    match (template, infra) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), _) | (None, Some(true)) => Some(true),
        (None, None) => None,
    }
}
