//! The solve itself: pods in Karpenter's order onto existing nodes (initialized first), then
//! claims of this round (fewest pods first), then new claims by NodePool weight, relaxing
//! preferences when a pod fits nowhere; pods with pod terms that fit nowhere go round again while
//! the round before placed something.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use k8s_openapi::api::core::v1::Pod;

use super::amounts::{Amounts, Dims};
use super::claim_index::ClaimIndex;
use super::error::PodError;
use super::pod::{PodInfo, TermKind, pod_key};
use super::quota::QuotaCap;
use super::topology::{Domains, Narrowing, Place, Rejection, Source, Topology};
use super::volumes::{NodeVolumes, PodVolumes, VolumeTopology, VolumeUsage};
use super::{MinValuesPolicy, NewClaim, PoolInput, PreferencePolicy, Results, Snapshot};
use crate::api::requirements::Requirements;

mod existing;
mod new_claim;
mod pool_miss;
mod preferences;
mod template;

use existing::{Node, daemons_to_come, node_domain, node_source, node_taints};
use new_claim::{Claim, finish_claim};
use preferences::{Attempt, attempt_requirements, relax};
pub use template::nodepool_requirements;
pub(super) use template::{
    Pool, STATIC_POOL, build_pool, exceeded_limit, offering_usable, restricted_label,
    type_compatible, unknown_label,
};
use template::{pool_domains, weight_of};

/// Decides where every pending pod goes. Pure and deterministic: the same snapshot gives the
/// same result.
pub fn solve(snapshot: &Snapshot) -> Results {
    solve_with_volumes(snapshot, &NodeVolumes::default())
}

/// [`solve`], with existing nodes' CSI volume limits: a pod goes to an existing node only if
/// its volumes still fit there (upstream's `VolumeUsage`).
pub fn solve_with_volumes<'a>(snapshot: &'a Snapshot, volumes: &'a NodeVolumes) -> Results {
    let mut failures = Vec::new();
    let mut pending = Vec::new();
    let defaults = match &snapshot.default_spread {
        Some(d) => d.for_pods(&snapshot.pods),
        None => vec![None; snapshot.pods.len()],
    };
    for (pod, defaults) in snapshot.pods.iter().zip(&defaults) {
        match PodInfo::read_with_defaults(pod, defaults.as_deref()) {
            Ok(info) => pending.push(info),
            Err(details) => failures.push((pod_key(pod), PodError::InvalidPod { details })),
        }
    }
    let daemons: Vec<PodInfo> = snapshot
        .daemonsets
        .iter()
        .filter_map(|d| PodInfo::read(d).ok())
        .collect();
    let bound: Vec<PodInfo> = snapshot
        .bound_pods
        .iter()
        .filter_map(|p| PodInfo::read(p).ok())
        .collect();

    // Karpenter's order: biggest cpu, then memory, first; by key for determinism. A buffer's
    // placeholder goes after the real pods of its size, so they take the room first.
    pending.sort_by(|a, b| {
        b.cpu()
            .cmp(&a.cpu())
            .then_with(|| b.memory().cmp(&a.memory()))
            .then_with(|| a.placeholder.cmp(&b.placeholder))
            .then_with(|| a.key.cmp(&b.key))
    });
    let dims = learn_dims(snapshot, &pending, &daemons);
    let mut solver = Solver::new(snapshot, &dims, &daemons);
    // No limited node or instance type: nothing to check per placement.
    if !volumes.by_node.is_empty() || !volumes.by_pod.is_empty() {
        solver.volumes = Some((volumes.by_node.clone(), &volumes.by_pod));
    }
    if !snapshot.volume_topology.is_empty() {
        solver.volume_topology = Some(&snapshot.volume_topology);
    }
    solver.intern_terms(&pending, &bound);
    solver.place_bound(&snapshot.bound_pods, &bound);

    let policy = snapshot.preference_policy;
    let mut placed = Vec::new();
    let mut queue: Vec<&PodInfo> = pending.iter().collect();
    if !snapshot.nominated.is_empty() {
        queue = solver.place_nominated(queue, &snapshot.nominated, policy, &mut placed);
    }
    // As upstream's queue: a pod that fails goes round again while the pass before placed
    // something, because a pod's affinity (or spread) may be to a pod placed later in this same
    // batch. Only pods with pod terms can be helped by other placements, so only they return.
    loop {
        let mut progress = false;
        let mut again = Vec::new();
        for info in queue {
            match solver.place(info, policy) {
                Ok(node) => {
                    progress = true;
                    if let Some(node) = node {
                        placed.push((info.key.clone(), node));
                    }
                }
                Err(e) if !info.terms.is_empty() => again.push((info, e)),
                Err(e) => failures.push((info.key.clone(), e)),
            }
        }
        if !progress || again.is_empty() {
            failures.extend(again.into_iter().map(|(info, e)| (info.key.clone(), e)));
            break;
        }
        queue = again.into_iter().map(|(info, _)| info).collect();
    }
    Results {
        new_claims: solver.finish(&pending),
        placed_on_existing: placed,
        failures,
    }
}

pub(super) fn learn_dims(snapshot: &Snapshot, pending: &[PodInfo], daemons: &[PodInfo]) -> Dims {
    let mut dims = Dims::default();
    for p in pending.iter().chain(daemons) {
        dims.learn(&p.requests);
    }
    for n in &snapshot.nodes {
        dims.learn(&n.allocatable);
        dims.learn(&n.requested);
    }
    for pool in &snapshot.nodepools {
        for it in &pool.instance_types {
            dims.learn(&it.capacity);
            dims.learn(&it.overhead);
        }
        for key in pool.nodepool.spec.limits.iter().flatten().map(|(k, _)| k) {
            if key != "nodes" {
                dims.intern(key);
            }
        }
    }
    for q in &snapshot.quotas {
        for (key, _) in q.limits.iter() {
            if key != crate::api::capacity_quota::NODES {
                dims.intern(key);
            }
        }
    }
    dims
}

/// What one pending pod carries into every attempt.
struct Prepared {
    amounts: Amounts,
    /// (group, required, weight) for each topology term, in the pod's order.
    terms: Vec<(usize, bool, i32)>,
    /// Groups whose selector the pod matches.
    matched: Vec<usize>,
}

struct Solver<'a> {
    dims: &'a Dims,
    /// Dynamic NodePools only, by weight.
    pools: Vec<Pool<'a>>,
    /// CapacityQuotas, charged by the claims opened under them.
    quotas: Vec<QuotaCap>,
    /// Names of the static NodePools, left out of provisioning (named in a pod's failure).
    static_pools: Vec<&'a str>,
    nodes: Vec<Node<'a>>,
    claims: Vec<Claim>,
    /// Which claims a pod could still join (see [`ClaimIndex`]).
    index: ClaimIndex,
    topology: Topology<'a>,
    prepared: HashMap<String, Prepared>,
    /// Pods of `finish`'s `pending` slice placed on each claim are recorded by index; this maps
    /// a pending pod's key to that index.
    order: HashMap<String, usize>,
    /// Which types of a pool a set of requirements leaves usable, cached because claims share
    /// a handful of distinct requirement sets and the check touches every offering.
    usable: RefCell<HashMap<(usize, String), Usability<'a>>>,
    /// Existing nodes' volume usage (updated as pods land) and each pending pod's volumes.
    volumes: Option<VolumeState<'a>>,
    /// Each pending pod's volume topology alternatives (upstream's volume requirements).
    volume_topology: Option<&'a VolumeTopology>,
    min_values_policy: MinValuesPolicy,
    /// While set, the one node a pod may go to (its nominated node; see `place_nominated`).
    only: Option<usize>,
    /// Pods a disruption simulation moves, and the nodes they may not go to.
    moved: &'a HashSet<String>,
    under_consolidate_after: &'a HashSet<String>,
}

type VolumeState<'a> = (
    HashMap<String, VolumeUsage>,
    &'a HashMap<String, PodVolumes>,
);

/// Per type of a pool: `None` when unusable under some requirements, else the price of its
/// cheapest usable offering and the capacity types of its usable offerings.
type Usability<'a> = Rc<Vec<Option<(f64, Vec<&'a str>)>>>;

impl<'a> Solver<'a> {
    fn new(snapshot: &'a Snapshot, dims: &'a Dims, daemons: &[PodInfo]) -> Solver<'a> {
        // Static pools are upstream's too: out of provisioning entirely, domains included.
        let (statics, dynamics): (Vec<&PoolInput>, Vec<&PoolInput>) = snapshot
            .nodepools
            .iter()
            .partition(|p| p.nodepool.is_static());
        let mut pools: Vec<Pool<'a>> = dynamics
            .into_iter()
            .map(|p| build_pool(&p.nodepool, &p.instance_types, &p.usage, dims, daemons))
            .collect();
        // Weight descending, then name, as Karpenter orders NodePools.
        pools.sort_by(|a, b| {
            let wa = weight_of(snapshot, a.name);
            let wb = weight_of(snapshot, b.name);
            wb.cmp(&wa).then_with(|| a.name.cmp(b.name))
        });
        let mut nodes: Vec<Node> = snapshot
            .nodes
            .iter()
            .map(|n| {
                let taints = node_taints(n);
                let mut free = dims.amounts(&n.allocatable);
                free.sub_assign(&dims.amounts(&n.requested));
                free.sub_assign(&dims.amounts(&daemons_to_come(n, &taints, daemons)));
                Node {
                    input: n,
                    free,
                    taints,
                    host_ports: Vec::new(),
                }
            })
            .collect();
        // Upstream's order: initialized nodes first, so a pod lands where it can run now
        // rather than on a node still coming up; then by name.
        nodes.sort_by(|a, b| {
            (!a.input.initialized(), &a.input.name).cmp(&(!b.input.initialized(), &b.input.name))
        });
        Solver {
            dims,
            pools,
            quotas: snapshot
                .quotas
                .iter()
                .map(|q| QuotaCap::new(q, dims))
                .collect(),
            static_pools: statics
                .iter()
                .map(|p| p.nodepool.metadata.name.as_deref().unwrap_or_default())
                .collect(),
            nodes,
            claims: Vec::new(),
            index: ClaimIndex::default(),
            topology: Topology::with_namespaces(snapshot.namespaces.clone()),
            prepared: HashMap::new(),
            order: HashMap::new(),
            usable: RefCell::new(HashMap::new()),
            volumes: None,
            volume_topology: None,
            min_values_policy: snapshot.min_values_policy,
            only: None,
            moved: &snapshot.moved,
            under_consolidate_after: &snapshot.under_consolidate_after,
        }
    }

    /// Interns every topology term, learns the domains of the keys in use, and prepares each
    /// pending pod.
    fn intern_terms(&mut self, pending: &[PodInfo], bound: &[PodInfo]) {
        for p in pending.iter().chain(bound) {
            for t in &p.terms {
                self.topology.intern(&t.group, p);
            }
        }
        for key in self.topology.keys() {
            // Pools first: a spread's node filter passes them cheaply.
            for pool in &self.pools {
                for v in pool_domains(pool, &key) {
                    let source = Source::Pool {
                        taints: pool.taints,
                    };
                    self.topology.add_domain(&key, &v, source);
                }
            }
            for n in &self.nodes {
                if let Some(v) = n.input.labels.get(&key) {
                    let source = Source::Node {
                        labels: &n.input.labels,
                        taints: &n.input.taints,
                    };
                    self.topology.add_domain(&key, v, source);
                }
            }
        }
        for (i, p) in pending.iter().enumerate() {
            let terms = p
                .terms
                .iter()
                .map(|t| (self.topology.intern(&t.group, p), t.required, t.weight))
                .collect();
            let matched = if self.topology.is_empty() {
                Vec::new()
            } else {
                self.topology.matching(&p.namespace, &p.labels)
            };
            self.prepared.insert(
                p.key.clone(),
                Prepared {
                    amounts: self.dims.amounts(&p.requests),
                    terms,
                    matched,
                },
            );
            self.order.insert(p.key.clone(), i);
        }
    }

    /// Each node's index by its name.
    fn node_indexes(&self) -> HashMap<&'a str, usize> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.input.name.as_str(), i))
            .collect()
    }

    /// Counts the bound pods in their nodes' domains and takes their host ports.
    fn place_bound(&mut self, pods: &[std::sync::Arc<Pod>], infos: &[PodInfo]) {
        let by_name = self.node_indexes();
        let infos: HashMap<&str, &PodInfo> = infos.iter().map(|p| (p.key.as_str(), p)).collect();
        for pod in pods {
            let key = pod_key(pod);
            let (Some(info), Some(ni)) = (
                infos.get(key.as_str()),
                pod.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .and_then(|n| by_name.get(n)),
            ) else {
                continue;
            };
            let Some(node) = self.nodes.get_mut(*ni) else {
                continue;
            };
            node.host_ports.extend(info.host_ports.iter().cloned());
            if self.topology.is_empty() {
                continue;
            }
            let matched = self.topology.matching(&info.namespace, &info.labels);
            let owned: Vec<usize> = info
                .terms
                .iter()
                .filter(|t| t.required && t.group.kind == TermKind::AntiAffinity)
                .map(|t| self.topology.intern(&t.group, info))
                .collect();
            let input = node.input;
            self.topology.record(
                &matched,
                &owned,
                |k, _| Domains::from_one(node_domain(input, k)),
                node_source(input),
            );
        }
    }

    /// Puts each pod of `queue` an earlier solve planned onto one of the nodes (an in-flight
    /// claim, most often) back there, in the solve's order and before any other pod, and
    /// returns the pods left for the ordinary placement. First-fit over the same pods in
    /// another order does not refill the same claims, so without this a pod planned onto a
    /// claim could find its room taken by another and get a claim of its own. Upstream needs no
    /// such pass: it solves nothing while a claim has not launched.
    fn place_nominated<'p>(
        &mut self,
        queue: Vec<&'p PodInfo>,
        nominated: &HashMap<String, String>,
        policy: PreferencePolicy,
        placed: &mut Vec<(String, String)>,
    ) -> Vec<&'p PodInfo> {
        let by_name = self.node_indexes();
        let targets: Vec<Option<usize>> = queue
            .iter()
            .map(|p| {
                nominated
                    .get(&p.key)
                    .and_then(|n| by_name.get(n.as_str()).copied())
            })
            .collect();
        let mut rest = Vec::with_capacity(queue.len());
        for (info, target) in queue.into_iter().zip(targets) {
            let Some(ni) = target else {
                rest.push(info);
                continue;
            };
            self.only = Some(ni);
            let outcome = self.place(info, policy);
            self.only = None;
            match outcome {
                Ok(Some(node)) => placed.push((info.key.clone(), node)),
                _ => rest.push(info),
            }
        }
        rest
    }

    /// Places one pod, relaxing its preferences until it fits or nothing is left to relax.
    /// `Ok(Some(node))` when it went to an existing node, `Ok(None)` when to a claim.
    fn place(
        &mut self,
        pod: &PodInfo,
        policy: PreferencePolicy,
    ) -> Result<Option<String>, PodError> {
        let Some(prep) = self.prepared.remove(&pod.key) else {
            return Err(PodError::InvalidPod {
                details: "pod was not prepared".into(),
            });
        };
        // Ignore starts where full relaxation would end: no preference is ever required.
        let ignore = policy == PreferencePolicy::Ignore;
        let mut attempt = Attempt {
            node_term: 0,
            preferred_node: if ignore { pod.preferred_node.len() } else { 0 },
            dropped: prep
                .terms
                .iter()
                .map(|(_, required, _)| ignore && !required)
                .collect(),
            tolerate_prefer_no_schedule: ignore,
        };
        let result = loop {
            let outcome = self.try_place(pod, &prep, &attempt);
            match outcome {
                Ok(r) => break Ok(r),
                Err(e) => {
                    if !relax(pod, &prep, &mut attempt) {
                        break Err(e);
                    }
                }
            }
        };
        self.prepared.insert(pod.key.clone(), prep);
        result
    }

    /// One attempt at placing `pod`: on an existing node, else (unless pinned to one node) on a
    /// claim of this pass or a new one.
    fn try_place(
        &mut self,
        pod: &PodInfo,
        prep: &Prepared,
        attempt: &Attempt,
    ) -> Result<Option<String>, PodError> {
        let reqs = attempt_requirements(pod, attempt);
        let active = active_terms(prep, attempt);
        let owned = self.repelling_terms(prep);
        let no_terms = Requirements::new();
        let strict = strict_requirements(pod, attempt, &no_terms);
        let with_volumes = self.volume_alternatives(pod, &reqs);
        // The common case, no volume alternative, allocates nothing.
        let alone = [&*reqs];
        let many: Vec<&Requirements>;
        let choices: &[&Requirements] = if with_volumes.is_empty() {
            &alone
        } else {
            many = with_volumes.iter().collect();
            &many
        };
        let ctx = Ctx {
            pod,
            prep,
            reqs: &reqs,
            choices,
            strict,
            active: &active,
            owned: &owned,
            prefer_blocks: !attempt.tolerate_prefer_no_schedule,
        };
        if let Some(node) = self.try_nodes(&ctx) {
            return Ok(Some(node));
        }
        if self.only.is_some() {
            // Not where it was planned; the ordinary placement decides (and says why).
            return Err(PodError::NoNodePoolMatches {
                details: String::new(),
            });
        }
        self.try_new_places(ctx)
    }

    /// Only required anti-affinity repels other pods; a preference binds its owner alone.
    fn repelling_terms(&self, prep: &Prepared) -> Vec<usize> {
        prep.terms
            .iter()
            .filter(|(g, required, _)| {
                *required && self.topology.kind(*g) == Some(TermKind::AntiAffinity)
            })
            .map(|(g, _, _)| *g)
            .collect()
    }

    /// Upstream's volume requirements: each alternative narrows where the pod goes (tried in
    /// order at every node, claim and pool), while the strict requirements stay the pod's own.
    fn volume_alternatives(&self, pod: &PodInfo, reqs: &Requirements) -> Vec<Requirements> {
        self.volume_topology
            .and_then(|t| t.get(&pod.key))
            .map(|alts| alts.iter().map(|a| reqs.intersect(a)).collect())
            .unwrap_or_default()
    }

    /// `ctx`'s pod on a claim of this pass or a new one, over the choices a new node can meet.
    fn try_new_places(&mut self, ctx: Ctx) -> Result<Option<String>, PodError> {
        let open = open_choices(ctx.choices)?;
        let ctx = match &open {
            Some(open) => Ctx {
                choices: open,
                ..ctx
            },
            None => ctx,
        };
        if self.try_claims(&ctx) {
            return Ok(None);
        }
        self.try_new_claim(&ctx).map(|()| None)
    }

    /// The topology's verdict on `ctx`'s pod at `place` (see [`Topology::admit`]).
    fn admit(&self, ctx: &Ctx, place: &Place) -> Result<Vec<Narrowing>, Rejection> {
        self.topology.admit(
            ctx.active,
            &ctx.prep.matched,
            ctx.reqs,
            ctx.strict,
            ctx.pod,
            place,
        )
    }

    /// The claims decided, with their instance types ordered by price and their final
    /// requirements.
    fn finish(&self, pending: &[PodInfo]) -> Vec<NewClaim> {
        self.claims
            .iter()
            .filter_map(|c| {
                let pool = self.pools.get(c.pool)?;
                let usable = self.usability(c.pool, &c.reqs);
                Some(finish_claim(pool, c, &usable, pending))
            })
            .collect()
    }
}

/// Per-attempt view of a pod.
#[derive(Clone, Copy)]
struct Ctx<'c> {
    pod: &'c PodInfo,
    prep: &'c Prepared,
    /// The attempt's requirements (the required term with the preference being tried), with one
    /// volume alternative when the pod has some.
    reqs: &'c Requirements,
    /// `reqs` with each of the pod's volume alternatives, in order (`reqs` alone without any).
    choices: &'c [&'c Requirements],
    /// The required term alone.
    strict: &'c Requirements,
    active: &'c [usize],
    owned: &'c [usize],
    prefer_blocks: bool,
}

impl<'c> Ctx<'c> {
    /// The attempt once per volume alternative (upstream tries them in order at each place).
    fn alternatives(&self) -> impl Iterator<Item = Ctx<'c>> + '_ {
        self.choices.iter().map(|reqs| Ctx { reqs, ..*self })
    }
}

/// The groups of the terms `attempt` keeps.
fn active_terms(prep: &Prepared, attempt: &Attempt) -> Vec<usize> {
    prep.terms
        .iter()
        .zip(&attempt.dropped)
        .filter(|(_, dropped)| !**dropped)
        .map(|((g, _, _), _)| *g)
        .collect()
}

/// Upstream's strict requirements: the required term being tried, without preferences. A
/// spread's global minimum is counted over the domains they allow, so a preference being tried
/// never hides a domain the spread must keep level.
fn strict_requirements<'r>(
    pod: &'r PodInfo,
    attempt: &Attempt,
    no_terms: &'r Requirements,
) -> &'r Requirements {
    pod.node_terms
        .get(attempt.node_term)
        .or_else(|| pod.node_terms.first())
        .unwrap_or(no_terms)
}

/// A requirement naming hosts (the pod's, or a volume's) rules out every new node: the choices
/// left, None when they are `choices` unchanged (its one choice names none), the first such
/// error when none is left.
fn open_choices<'r>(
    choices: &[&'r Requirements],
) -> Result<Option<Vec<&'r Requirements>>, PodError> {
    if let [only] = choices {
        return restricted_label(only).map_or(Ok(None), Err);
    }
    let mut restricted = None;
    let open: Vec<&Requirements> = choices
        .iter()
        .copied()
        .filter(|r| match restricted_label(r) {
            Some(e) => {
                restricted.get_or_insert(e);
                false
            }
            None => true,
        })
        .collect();
    match restricted.filter(|_| open.is_empty()) {
        Some(e) => Err(e),
        None => Ok(Some(open)),
    }
}

pub(super) fn fits(want: &Amounts, avail: &Amounts) -> bool {
    want.0.iter().zip(&avail.0).all(|(w, a)| w <= a)
}

fn ports_conflict(taken: &[(i32, String)], wanted: &[(i32, String)]) -> bool {
    wanted.iter().any(|w| taken.contains(w))
}
