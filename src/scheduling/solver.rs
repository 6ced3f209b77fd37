//! The solve itself: pods in Karpenter's order onto existing nodes (initialized first), then
//! claims of this round (fewest pods first), then new claims by NodePool weight, relaxing
//! preferences when a pod fits nowhere; pods with pod terms that fit nowhere go round again while
//! the round before placed something.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::rc::Rc;

use k8s_openapi::api::core::v1::{Pod, Taint};

use super::amounts::{Amounts, Dims};
use super::claim_index::{ClaimIndex, Cursor, HostTerms, room};
use super::error::PodError;
use super::instance_type::{InstanceType, Offering, absent_label};
use super::pod::{PodInfo, TermKind};
use super::selector::untolerated;
use super::topology::{Domains, Narrowing, Place, Rejection, Source, Topology};
use super::volumes::{NodeVolumes, PodVolumes, VolumeTopology, VolumeUsage};
use super::{
    ExistingNode, MAX_INSTANCE_TYPES, MinValuesPolicy, NewClaim, PoolInput, PreferencePolicy,
    Results, Snapshot,
};
use crate::api::nodeclaim::Operator;
use crate::api::nodepool::NodePool;
use crate::api::requirements::{Requirement, Requirements};
use crate::api::resources::{Quantity, Resources};
use crate::api::wellknown::{
    CAPACITY_TYPE_LABEL, DEFAULT_MAX_PODS, EPHEMERAL_TAINT_KEYS, HOSTNAME_LABEL, INITIALIZED_LABEL,
    INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, REGISTERED_LABEL, RESOURCE_PODS, WELL_KNOWN_LABELS,
};

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

    // Karpenter's order: biggest cpu, then memory, first; by key for determinism.
    pending.sort_by(|a, b| {
        b.cpu()
            .cmp(&a.cpu())
            .then_with(|| b.memory().cmp(&a.memory()))
            .then_with(|| a.key.cmp(&b.key))
    });
    let dims = learn_dims(snapshot, &pending, &daemons);
    let mut solver = Solver::new(snapshot, &dims, &daemons);
    // No limited node: nothing to check per placement.
    if !volumes.by_node.is_empty() {
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

/// The taints a pod must tolerate on an existing node. Ephemeral ones (not-ready,
/// unregistered...) count only once the node is initialized: before, they are the node
/// coming up; after, they mean it went bad and pods should not be promised to it.
fn node_taints(node: &ExistingNode) -> Vec<Taint> {
    if node.initialized() {
        return node.taints.clone();
    }
    node.taints
        .iter()
        .filter(|t| !EPHEMERAL_TAINT_KEYS.contains(&t.key.as_str()))
        .cloned()
        .collect()
}

pub(super) fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
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
    dims
}

/// One instance type of one pool, with the pool's DaemonSet overhead already taken off.
pub(super) struct TypeInfo<'a> {
    pub(super) it: &'a InstanceType,
    pub(super) capacity: Amounts,
    /// Allocatable minus DaemonSet overhead: what pods may use.
    pub(super) avail: Amounts,
    pub(super) daemon: Resources,
    /// Host ports the DaemonSet pods on such a node take.
    pub(super) daemon_ports: Vec<(i32, String)>,
}

/// A NodePool prepared for the solve.
pub(super) struct Pool<'a> {
    pub(super) name: &'a str,
    pub(super) reqs: Requirements,
    pub(super) taints: &'a [Taint],
    /// Compatible with the pool's requirements and with an available offering, cheapest first.
    pub(super) types: Vec<TypeInfo<'a>>,
    /// Why the pool can launch nothing at all (bad requirements), if so.
    pub(super) broken: Option<String>,
    /// Label keys a node of this pool will carry: its requirements, its types' requirements
    /// and its offerings' labels.
    pub(super) known_keys: BTreeSet<String>,
    /// Dimensions with a limit; `remaining` is meaningful only for those.
    pub(super) limited: Vec<usize>,
    pub(super) remaining: Amounts,
    pub(super) nodes_remaining: Option<i64>,
}

/// A claim opened in this solve.
struct Claim {
    pool: usize,
    hostname: String,
    reqs: Requirements,
    /// Sum of the pods' requests.
    used: Amounts,
    /// Indices into the pool's types, cheapest first.
    types: Vec<usize>,
    /// Element-wise maximum of the types' `avail`: a quick upper bound on what still fits.
    max_avail: Amounts,
    pods: Vec<usize>,
    host_ports: Vec<(i32, String)>,
    /// Capacity counted against the pool's limits (its cheapest type's).
    charge: Amounts,
    /// A minValues of its pool was lowered to open it (BestEffort).
    min_values_relaxed: bool,
}

/// An existing or in-flight node.
struct Node<'a> {
    input: &'a ExistingNode,
    free: Amounts,
    taints: Vec<Taint>,
    host_ports: Vec<(i32, String)>,
}

/// What one pending pod carries into every attempt.
struct Prepared {
    amounts: Amounts,
    /// (group, required, weight) for each topology term, in the pod's order.
    terms: Vec<(usize, bool, i32)>,
    /// Groups whose selector the pod matches.
    matched: Vec<usize>,
}

/// How far a pod's preferences have been relaxed.
#[derive(Clone, Debug)]
struct Attempt {
    node_term: usize,
    /// Index of the heaviest preferred node-affinity term still required.
    preferred_node: usize,
    /// Per topology term: dropped by relaxation.
    dropped: Vec<bool>,
    tolerate_prefer_no_schedule: bool,
}

/// Why one NodePool could not open a claim for a pod.
enum PoolMiss {
    Incompatible(String),
    Limit(String),
    NoFit(String),
}

struct Solver<'a> {
    dims: &'a Dims,
    /// Dynamic NodePools only, by weight.
    pools: Vec<Pool<'a>>,
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

    fn try_place(
        &mut self,
        pod: &PodInfo,
        prep: &Prepared,
        attempt: &Attempt,
    ) -> Result<Option<String>, PodError> {
        let reqs = attempt_requirements(pod, attempt);
        let active: Vec<usize> = prep
            .terms
            .iter()
            .zip(&attempt.dropped)
            .filter(|(_, dropped)| !**dropped)
            .map(|((g, _, _), _)| *g)
            .collect();
        // Only required anti-affinity repels other pods; a preference binds its owner alone.
        let owned: Vec<usize> = prep
            .terms
            .iter()
            .filter(|(g, required, _)| {
                *required && self.topology.kind(*g) == Some(TermKind::AntiAffinity)
            })
            .map(|(g, _, _)| *g)
            .collect();
        // Upstream's strict requirements: the required term being tried, without preferences.
        // A spread's global minimum is counted over the domains they allow, so a preference
        // being tried never hides a domain the spread must keep level.
        let no_terms = Requirements::new();
        let strict = pod
            .node_terms
            .get(attempt.node_term)
            .or_else(|| pod.node_terms.first())
            .unwrap_or(&no_terms);
        // Upstream's volume requirements: each alternative narrows where the pod goes (tried in
        // order at every node, claim and pool), while `strict` stays the pod's own.
        let with_volumes: Vec<Requirements> = self
            .volume_topology
            .and_then(|t| t.get(&pod.key))
            .map(|alts| alts.iter().map(|a| reqs.intersect(a)).collect())
            .unwrap_or_default();
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
        // A requirement naming hosts (the pod's, or a volume's) rules out every new node.
        let open: Vec<&Requirements>;
        let ctx = match choices {
            [only] => match restricted_label(only) {
                Some(e) => return Err(e),
                None => ctx,
            },
            _ => {
                let mut restricted = None;
                open = choices
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
                if let Some(e) = restricted.filter(|_| open.is_empty()) {
                    return Err(e);
                }
                Ctx {
                    choices: &open,
                    ..ctx
                }
            }
        };
        if self.try_claims(&ctx) {
            return Ok(None);
        }
        self.try_new_claim(&ctx).map(|()| None)
    }

    fn try_nodes(&mut self, ctx: &Ctx) -> Option<String> {
        let range = match self.only {
            Some(ni) => ni..ni + 1,
            None => 0..self.nodes.len(),
        };
        for ni in range {
            let node = &self.nodes[ni];
            if self.under_consolidate_after.contains(&node.input.name)
                && self.moved.contains(&ctx.pod.key)
            {
                continue;
            }
            if !fits(&ctx.prep.amounts, &node.free)
                || untolerated(&ctx.pod.tolerations, &node.taints, ctx.prefer_blocks).is_some()
                || ports_conflict(&node.host_ports, &ctx.pod.host_ports)
                || !self.volumes_fit(&node.input.name, &ctx.pod.key)
            {
                continue;
            }
            let place = Place::Node {
                labels: &node.input.labels,
                hostname: &node.input.name,
            };
            let admitted = ctx.alternatives().any(|ctx| {
                ctx.reqs.matches_labels(&node.input.labels) && self.admit(&ctx, &place).is_ok()
            });
            if !admitted {
                continue;
            }
            let input = self.nodes[ni].input;
            self.add_volumes(&input.name, &ctx.pod.key);
            let node = &mut self.nodes[ni];
            node.free.sub_assign(&ctx.prep.amounts);
            node.host_ports.extend(ctx.pod.host_ports.iter().cloned());
            let input = node.input;
            self.topology.record(
                &ctx.prep.matched,
                ctx.owned,
                |k, _| Domains::from_one(node_domain(input, k)),
                node_source(input),
            );
            return Some(input.name.clone());
        }
        None
    }

    fn volumes_fit(&self, node: &str, pod: &str) -> bool {
        let Some((usage, pods)) = &self.volumes else {
            return true;
        };
        match (usage.get(node), pods.get(pod)) {
            (Some(u), Some(v)) => u.fits(v),
            _ => true,
        }
    }

    fn add_volumes(&mut self, node: &str, pod: &str) {
        if let Some((usage, pods)) = &mut self.volumes
            && let (Some(u), Some(v)) = (usage.get_mut(node), pods.get(pod))
        {
            u.add(v);
        }
    }

    fn try_claims(&mut self, ctx: &Ctx) -> bool {
        let carried: Vec<usize> = ctx
            .active
            .iter()
            .copied()
            .filter(|&g| self.topology.host_keyed(g))
            .collect();
        let matched: Vec<usize> = ctx
            .prep
            .matched
            .iter()
            .copied()
            .filter(|&g| self.topology.host_keyed(g))
            .collect();
        let host_terms = HostTerms {
            carried: &carried,
            matched: &matched,
        };
        let mut at = Cursor::default();
        while let Some(ci) = self.index.next(&mut at, &ctx.prep.amounts, &host_terms) {
            let Some(claim) = self.claims.get(ci) else {
                break;
            };
            if !claim.used.fits_with(&ctx.prep.amounts, &claim.max_avail)
                || ports_conflict(&claim.host_ports, &ctx.pod.host_ports)
            {
                continue;
            }
            if untolerated(
                &ctx.pod.tolerations,
                self.pools[claim.pool].taints,
                ctx.prefer_blocks,
            )
            .is_some()
            {
                continue;
            }
            let Some((used, types, reqs)) =
                ctx.alternatives().find_map(|ctx| self.join(claim, &ctx))
            else {
                continue;
            };
            self.commit_to_claim(ci, ctx, used, types, reqs);
            return true;
        }
        false
    }

    /// What claim `ci` becomes if `ctx`'s pod joins it: its usage, the types left and its
    /// requirements when they change; `None` when the pod cannot join.
    #[inline]
    fn join(&self, claim: &Claim, ctx: &Ctx) -> Option<Joined> {
        let pool = &self.pools[claim.pool];
        if (!ctx.reqs.is_empty() && claim.reqs.compatible(ctx.reqs).is_err())
            || unknown_label(pool, ctx.reqs).is_some()
        {
            return None;
        }
        let Ok(narrowed) = self.admit_claim(ctx, claim) else {
            return None;
        };
        let reqs = if ctx.reqs.is_empty() && narrowed.is_empty() {
            None
        } else {
            Some(with_narrowing(claim.reqs.intersect(ctx.reqs), &narrowed))
        };
        let changed = reqs.as_ref().filter(|r| **r != claim.reqs);
        let mut used = claim.used.clone();
        used.add_assign(&ctx.prep.amounts);
        let check_reqs = changed.unwrap_or(&claim.reqs);
        let usable = changed.map(|r| self.usability(claim.pool, r));
        let mut types = Vec::with_capacity(claim.types.len());
        for &ti in &claim.types {
            let Some(t) = pool.types.get(ti) else {
                continue;
            };
            if fits(&used, &t.avail)
                && !ports_conflict(&t.daemon_ports, &ctx.pod.host_ports)
                && within_limits(pool, &t.capacity, &claim.charge)
                && usable
                    .as_ref()
                    .is_none_or(|u| u.get(ti).is_some_and(Option::is_some))
            {
                types.push(ti);
            }
        }
        // Joining never relaxes minValues (upstream's in-flight claims check them strictly):
        // a claim keeps the types it was opened with, relaxed or not.
        if types.is_empty()
            || meet_min_values(pool, &types, check_reqs, MinValuesPolicy::Strict).is_err()
        {
            return None;
        }
        Some((used, types, reqs))
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

    fn admit_claim(&self, ctx: &Ctx, claim: &Claim) -> Result<Vec<Narrowing>, Rejection> {
        if ctx.active.is_empty() && ctx.prep.matched.is_empty() {
            return Ok(Vec::new());
        }
        let place = Place::Claim {
            hostname: &claim.hostname,
            requirements: &claim.reqs,
        };
        self.admit(ctx, &place)
    }

    fn commit_to_claim(
        &mut self,
        ci: usize,
        ctx: &Ctx,
        used: Amounts,
        types: Vec<usize>,
        reqs: Option<Requirements>,
    ) {
        let Some(claim) = self.claims.get_mut(ci) else {
            return;
        };
        let Some(pool) = self.pools.get_mut(claim.pool) else {
            return;
        };
        if types.len() != claim.types.len() {
            claim.max_avail = max_avail(&pool.types, &types, self.dims.len());
        }
        claim.types = types;
        claim.used = used;
        if let Some(r) = reqs {
            claim.reqs = r;
        }
        claim.host_ports.extend(ctx.pod.host_ports.iter().cloned());
        if let Some(&i) = self.order.get(&ctx.pod.key) {
            claim.pods.push(i);
        }
        recharge(pool, claim);
        self.index
            .update(ci, room(&claim.max_avail, &claim.used), claim.pods.len());
        self.record_on_claim(ci, ctx);
    }

    /// After a pod joined claim `ci`: the topology groups it counts in record the claim's
    /// domains, and the hostname-keyed ones say what they now refuse there.
    fn record_on_claim(&mut self, ci: usize, ctx: &Ctx) {
        let Some(claim) = self.claims.get(ci) else {
            return;
        };
        self.topology.record(
            &ctx.prep.matched,
            ctx.owned,
            |k, all| claim_domains(claim, &self.pools, k, all),
            claim_source(claim, &self.pools),
        );
        for &g in ctx.prep.matched.iter().chain(ctx.owned) {
            if self.topology.host_keyed(g) {
                let (refuses, repels) = self.topology.host_blocks(g, &claim.hostname);
                self.index.mark(ci, g, refuses, repels);
            }
        }
    }

    fn try_new_claim(&mut self, ctx: &Ctx) -> Result<(), PodError> {
        let mut misses: Vec<(&str, PoolMiss)> = Vec::new();
        for pi in 0..self.pools.len() {
            let mut opened = None;
            for alt in ctx.alternatives() {
                opened = Some(self.open_claim(pi, &alt));
                if matches!(opened, Some(Ok(_))) {
                    break;
                }
            }
            let Some(opened) = opened else {
                continue;
            };
            match opened {
                Ok(claim) => {
                    let ci = self.claims.len();
                    self.index
                        .push(room(&claim.max_avail, &claim.used), claim.pods.len());
                    self.claims.push(claim);
                    if let (Some(claim), Some(pool)) =
                        (self.claims.get_mut(ci), self.pools.get_mut(pi))
                    {
                        claim.charge = Amounts::zero(self.dims.len());
                        recharge(pool, claim);
                        if let Some(n) = pool.nodes_remaining.as_mut() {
                            *n -= 1;
                        }
                    }
                    self.record_on_claim(ci, ctx);
                    return Ok(());
                }
                Err(miss) => misses.push((self.pools[pi].name, miss)),
            }
        }
        for name in &self.static_pools {
            misses.push((name, PoolMiss::Incompatible(STATIC_POOL.into())));
        }
        Err(summarise(misses))
    }

    fn open_claim(&self, pi: usize, ctx: &Ctx) -> Result<Claim, PoolMiss> {
        let pool = &self.pools[pi];
        if let Some(why) = &pool.broken {
            return Err(PoolMiss::Incompatible(why.clone()));
        }
        if let Some(t) = untolerated(&ctx.pod.tolerations, pool.taints, ctx.prefer_blocks) {
            return Err(PoolMiss::Incompatible(format!(
                "taint {}={}:{} is not tolerated",
                t.key,
                t.value.as_deref().unwrap_or(""),
                t.effect
            )));
        }
        if let Err(e) = pool.reqs.compatible(ctx.reqs) {
            return Err(PoolMiss::Incompatible(format!(
                "incompatible requirements, {e}"
            )));
        }
        if let Some(key) = unknown_label(pool, ctx.reqs) {
            return Err(PoolMiss::Incompatible(format!(
                "label {key:?} is not provided by the NodePool or its instance types"
            )));
        }
        if pool.nodes_remaining.is_some_and(|n| n < 1) {
            return Err(PoolMiss::Limit("nodes".into()));
        }
        let hostname = format!("{}-claim-{}", pool.name, self.claims.len());
        let base = if ctx.reqs.is_empty() {
            Cow::Borrowed(&pool.reqs)
        } else {
            Cow::Owned(pool.reqs.intersect(ctx.reqs))
        };
        let narrowed = if ctx.active.is_empty() && ctx.prep.matched.is_empty() {
            Vec::new()
        } else {
            let place = Place::Claim {
                hostname: &hostname,
                requirements: &base,
            };
            self.admit(ctx, &place)
                .map_err(|r| PoolMiss::Incompatible(self.topology.explain(r)))?
        };
        let reqs = with_narrowing(base.into_owned(), &narrowed);
        let usable = (reqs != pool.reqs).then(|| self.usability(pi, &reqs));
        let zero = Amounts::zero(self.dims.len());
        let mut types = Vec::new();
        let (mut matching, mut fitting) = (0usize, 0usize);
        let mut limit_hit: Option<usize> = None;
        for (ti, t) in pool.types.iter().enumerate() {
            if usable
                .as_ref()
                .is_some_and(|u| !u.get(ti).is_some_and(Option::is_some))
            {
                continue;
            }
            matching += 1;
            // Upstream's daemon overhead groups: a DaemonSet pod's host port is taken on every
            // node of the types it runs on.
            if !fits(&ctx.prep.amounts, &t.avail)
                || ports_conflict(&t.daemon_ports, &ctx.pod.host_ports)
            {
                continue;
            }
            fitting += 1;
            if let Some(d) = exceeded_limit(pool, &t.capacity, &zero) {
                limit_hit.get_or_insert(d);
                continue;
            }
            types.push(ti);
        }
        if types.is_empty() {
            if let Some(d) = limit_hit {
                return Err(PoolMiss::Limit(self.dims.name(d).to_string()));
            }
            return Err(PoolMiss::NoFit(
                self.no_fit_details(pool, ctx, matching, fitting),
            ));
        }
        let relaxed = meet_min_values(pool, &types, &reqs, self.min_values_policy)
            .map_err(PoolMiss::NoFit)?;
        let min_values_relaxed = relaxed.is_some();
        let reqs = relaxed.unwrap_or(reqs);
        let mut used = zero.clone();
        used.add_assign(&ctx.prep.amounts);
        Ok(Claim {
            pool: pi,
            max_avail: max_avail(&pool.types, &types, self.dims.len()),
            hostname,
            reqs,
            used,
            types,
            pods: self.order.get(&ctx.pod.key).copied().into_iter().collect(),
            host_ports: ctx.pod.host_ports.clone(),
            charge: zero,
            min_values_relaxed,
        })
    }

    fn no_fit_details(&self, pool: &Pool, ctx: &Ctx, matching: usize, fitting: usize) -> String {
        if pool.types.is_empty() {
            return "the NodePool has no instance type with an available offering".into();
        }
        if matching == 0 {
            return format!(
                "none of {} instance types matches the requirements {}",
                pool.types.len(),
                describe(ctx.reqs)
            );
        }
        debug_assert_eq!(fitting, 0);
        if !ctx.pod.host_ports.is_empty()
            && pool
                .types
                .iter()
                .all(|t| ports_conflict(&t.daemon_ports, &ctx.pod.host_ports))
        {
            return "its host ports are taken by DaemonSet pods on every instance type".into();
        }
        let requests: Vec<String> = ctx
            .pod
            .requests
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let short: Vec<&str> = (0..self.dims.len())
            .filter(|&d| {
                let want = ctx.prep.amounts.get(d);
                want > 0 && pool.types.iter().all(|t| t.avail.get(d) < want)
            })
            .map(|d| self.dims.name(d))
            .collect();
        if short.is_empty() {
            format!(
                "requests {} (plus DaemonSet overhead) fit no single instance type",
                requests.join(", ")
            )
        } else {
            format!(
                "requests {} (plus DaemonSet overhead) exceed every instance type on {}",
                requests.join(", "),
                short.join(", ")
            )
        }
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

    fn usability(&self, pi: usize, reqs: &Requirements) -> Usability<'a> {
        // Requirements are kept in key order, so their debug form identifies them.
        let key = (pi, format!("{reqs:?}"));
        if let Some(u) = self.usable.borrow().get(&key) {
            return Rc::clone(u);
        }
        let Some(pool) = self.pools.get(pi) else {
            return Rc::default();
        };
        let (types, pool_reqs) = (pool.types.as_slice(), &pool.reqs);
        let u: Usability<'a> = Rc::new(
            types
                .iter()
                .map(|t| {
                    if !type_compatible(t.it, reqs) {
                        return None;
                    }
                    let mut price: Option<f64> = None;
                    let mut capacity_types: Vec<&'a str> = Vec::new();
                    let carried = |o: &Offering, k: &str| {
                        o.labels.contains_key(k) || t.it.requirements.has(k)
                    };
                    for o in t.it.offerings.iter().filter(|o| {
                        offering_usable(o, reqs)
                            && absent_label(reqs, pool_reqs, |k| carried(o, k)).is_none()
                    }) {
                        price = Some(price.map_or(o.price, |p| p.min(o.price)));
                        if !capacity_types.contains(&o.capacity_type.as_str()) {
                            capacity_types.push(o.capacity_type.as_str());
                        }
                    }
                    price.map(|p| (p, capacity_types))
                })
                .collect(),
        );
        self.usable.borrow_mut().insert(key, Rc::clone(&u));
        u
    }
}

/// A claim a pod may join: its usage, instance types and requirements (when they change) after.
type Joined = (Amounts, Vec<usize>, Option<Requirements>);

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

fn finish_claim(
    pool: &Pool,
    c: &Claim,
    usable: &[Option<(f64, Vec<&str>)>],
    pending: &[PodInfo],
) -> NewClaim {
    let mut priced: Vec<(f64, &TypeInfo, &[&str])> = c
        .types
        .iter()
        .filter_map(|&ti| {
            let (price, cts) = usable.get(ti)?.as_ref()?;
            Some((*price, pool.types.get(ti)?, cts.as_slice()))
        })
        .collect();
    priced.sort_by(|a, b| {
        a.0.total_cmp(&b.0)
            .then_with(|| a.1.it.name.cmp(&b.1.it.name))
    });
    priced.truncate(MAX_INSTANCE_TYPES);
    let names: Vec<String> = priced.iter().map(|(_, t, _)| t.it.name.clone()).collect();
    let capacity_types: BTreeSet<&str> = priced
        .iter()
        .flat_map(|(_, _, cts)| cts.iter().copied())
        .collect();
    let mut reqs = c.reqs.clone();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    reqs.add(Requirement::is_in(INSTANCE_TYPE_LABEL, &name_refs));
    let ct: Vec<&str> = capacity_types.into_iter().collect();
    if !ct.is_empty() {
        reqs.add(Requirement::is_in(CAPACITY_TYPE_LABEL, &ct));
    }
    let mut requests = Resources::new();
    let mut pods = Vec::with_capacity(c.pods.len());
    for &pi in &c.pods {
        if let Some(p) = pending.get(pi) {
            requests.add_assign(&p.requests);
            pods.push(p.key.clone());
        }
    }
    if let Some((_, t, _)) = priced.first() {
        requests.add_assign(&t.daemon);
    }
    NewClaim {
        nodepool: pool.name.to_string(),
        requirements: reqs,
        requests,
        pods,
        instance_types: names,
        min_values_relaxed: c.min_values_relaxed,
    }
}

/// Why a static NodePool opens no claim for a pending pod.
pub(super) const STATIC_POOL: &str = "static (spec.replicas set): it keeps its replica count and provisions nothing for pending pods";

/// Why no new node can meet `reqs`, if it requires `kubernetes.io/hostname` (upstream's one
/// restricted label) by naming hosts: a new node's hostname is not known before it registers,
/// so only an existing node can match. Requirements that only exclude hosts (NotIn, Exists)
/// any new node meets. Upstream gets the same outcome by giving each new claim a placeholder
/// hostname the pod's requirement cannot intersect.
pub(super) fn restricted_label(reqs: &Requirements) -> Option<PodError> {
    let r = reqs.get(HOSTNAME_LABEL)?;
    if matches!(r.operator(), Operator::NotIn | Operator::Exists) {
        return None;
    }
    Some(PodError::RestrictedLabel {
        key: HOSTNAME_LABEL.into(),
        details: format!(
            "no new node can meet {HOSTNAME_LABEL} {r} from the pod's node selector, node \
             affinity or volumes (a node's hostname is not known before it registers), and no \
             existing node with that hostname can take the pod"
        ),
    })
}

/// A label the pod requires that no node of the pool will carry (Karpenter's rule for labels
/// neither defined by the pool nor well known). Checked when opening a claim and when joining
/// one, so a pod cannot slip its requirement onto a claim another pod opened.
pub(super) fn unknown_label<'r>(pool: &Pool, reqs: &'r Requirements) -> Option<&'r str> {
    reqs.iter()
        .find(|r| {
            !r.allows_absent()
                && !pool.known_keys.contains(r.key())
                && !WELL_KNOWN_LABELS.contains(&r.key())
        })
        .map(|r| r.key())
}

fn weight_of(snapshot: &Snapshot, name: &str) -> i32 {
    snapshot
        .nodepools
        .iter()
        .find(|p| p.nodepool.metadata.name.as_deref() == Some(name))
        .map(|p| p.nodepool.weight())
        .unwrap_or(0)
}

pub(super) fn build_pool<'a>(
    np: &'a NodePool,
    instance_types: &'a [InstanceType],
    usage: &Resources,
    dims: &Dims,
    daemons: &[PodInfo],
) -> Pool<'a> {
    let name = np.metadata.name.as_deref().unwrap_or_default();
    let template = &np.spec.template;
    let (reqs, mut broken) = match nodepool_requirements(np) {
        Ok(r) => (r, None),
        Err((r, why)) => (r, Some(why)),
    };
    let taints: &[Taint] = template.spec.taints.as_deref().unwrap_or_default();
    // Every node of the pool gets those labels before long: DaemonSets waiting for them run
    // there too (upstream's simulation-only requirements, never on the claim).
    let mut daemon_reqs = reqs.clone();
    for key in LABELS_TO_COME {
        daemon_reqs.add(Requirement::is_in(key, &["true"]));
    }

    let mut types: Vec<(f64, TypeInfo)> = instance_types
        .iter()
        .filter(|it| type_usable(it, &reqs))
        .filter_map(|it| {
            let price = cheapest(it, &reqs)?.price;
            let (daemon, daemon_ports) = daemon_overhead(it, &daemon_reqs, taints, daemons);
            // A type that does not say how many pods it holds gets the kubelet's default
            // rather than room for none.
            let mut capacity = it.capacity.clone();
            if !capacity.0.contains_key(RESOURCE_PODS) {
                capacity.set(RESOURCE_PODS, Quantity::from_units(DEFAULT_MAX_PODS));
            }
            let mut avail = dims.amounts(&capacity.sub(&it.overhead));
            avail.sub_assign(&dims.amounts(&daemon));
            Some((
                price,
                TypeInfo {
                    it,
                    capacity: dims.amounts(&capacity),
                    avail,
                    daemon,
                    daemon_ports,
                },
            ))
        })
        .collect();
    types.sort_by(|a, b| {
        a.0.total_cmp(&b.0)
            .then_with(|| a.1.it.name.cmp(&b.1.it.name))
    });

    let mut known_keys: BTreeSet<String> = reqs.keys().map(str::to_string).collect();
    for (_, t) in &types {
        known_keys.extend(t.it.requirements.keys().map(str::to_string));
        for o in &t.it.offerings {
            known_keys.extend(o.labels.keys().cloned());
        }
    }
    let mut limited = Vec::new();
    let mut remaining = Amounts::zero(dims.len());
    let mut nodes_remaining = None;
    for (key, q) in np.spec.limits.iter().flatten() {
        let Ok(limit) = Quantity::from_k8s(q) else {
            broken = Some(format!("spec.limits.{key}: {:?} is not a quantity", q.0));
            continue;
        };
        let left = limit.saturating_sub(usage.get(key));
        if key == "nodes" {
            nodes_remaining = Some(left.as_units());
        } else if let Some(d) = dims.position(key) {
            limited.push(d);
            if let Some(slot) = remaining.0.get_mut(d) {
                *slot = left.as_nanos();
            }
        }
    }
    Pool {
        name,
        reqs,
        taints,
        types: types.into_iter().map(|(_, t)| t).collect(),
        broken,
        known_keys,
        limited,
        remaining,
        nodes_remaining,
    }
}

/// What every node of a NodePool satisfies: its template requirements, its template labels
/// (so pods selecting on them match) and its own `karpenter.sh/nodepool` label. When the
/// template requirements cannot be read: the labels alone, and why (the pool launches nothing).
pub fn nodepool_requirements(np: &NodePool) -> Result<Requirements, (Requirements, String)> {
    let name = np.metadata.name.as_deref().unwrap_or_default();
    let template = &np.spec.template;
    let (mut reqs, broken) =
        match Requirements::from_node_selector_requirements(&template.spec.requirements) {
            Ok(r) => (r, None),
            Err(e) => (
                Requirements::new(),
                Some(format!("spec.template.spec.requirements: {e}")),
            ),
        };
    for (k, v) in template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref())
        .into_iter()
        .flatten()
    {
        reqs.add(Requirement::is_in(k, &[v.as_str()]));
    }
    reqs.add(Requirement::is_in(NODEPOOL_LABEL, &[name]));
    match broken {
        None => Ok(reqs),
        Some(why) => Err((reqs, why)),
    }
}

/// The labels (`true`) every Karpenter node gets once registered and initialized, which a
/// DaemonSet may wait for.
const LABELS_TO_COME: [&str; 2] = [REGISTERED_LABEL, INITIALIZED_LABEL];

/// What the DaemonSets that run on node `n` still have to place there (upstream's remaining
/// daemon resources): their requests less those of their pods already on it, never below zero
/// (a DaemonSet may have placed a pod nobody expected, after a label appeared).
fn daemons_to_come(n: &ExistingNode, taints: &[Taint], daemons: &[PodInfo]) -> Resources {
    if daemons.is_empty() {
        return Resources::new();
    }
    // A node still coming up gets those labels before long: DaemonSets waiting for them are to
    // come too (as a new claim's overhead counts them).
    let labels = if n.initialized() {
        Cow::Borrowed(&n.labels)
    } else {
        let mut l = n.labels.clone();
        for key in LABELS_TO_COME {
            l.entry(key.to_string())
                .or_insert_with(|| "true".to_string());
        }
        Cow::Owned(l)
    };
    let mut total = Resources::new();
    for d in daemons {
        if untolerated(&d.tolerations, taints, false).is_none()
            && d.node_terms.iter().any(|t| t.matches_labels(&labels))
        {
            total.add_assign(&d.requests);
        }
    }
    let mut left = total.sub(&n.daemon_requested);
    left.0.retain(|_, q| !q.is_negative() && !q.is_zero());
    left
}

/// The requests and host ports of the DaemonSet pods that would run on a node of this type
/// from this pool (a DaemonSet selecting a label such a node lacks runs elsewhere).
fn daemon_overhead(
    it: &InstanceType,
    pool_reqs: &Requirements,
    taints: &[Taint],
    daemons: &[PodInfo],
) -> (Resources, Vec<(i32, String)>) {
    let mut total = Resources::new();
    let mut ports = Vec::new();
    for d in daemons {
        if untolerated(&d.tolerations, taints, false).is_some() {
            continue;
        }
        let lands = d.node_terms.iter().any(|term| {
            pool_reqs.compatible(term).is_ok()
                && it.requirements.compatible(term).is_ok()
                && absent_label(term, pool_reqs, |k| it.carries(k)).is_none()
        });
        if lands {
            total.add_assign(&d.requests);
            ports.extend(d.host_ports.iter().cloned());
        }
    }
    (total, ports)
}

/// The values of `key` a pool's instance types can offer, and those its requirements (or
/// template labels) name outright, as upstream registers them.
fn pool_domains(pool: &Pool, key: &str) -> BTreeSet<String> {
    let allowed = pool.reqs.get(key);
    let mut out: BTreeSet<String> = allowed
        .filter(|r| !r.allows_absent())
        .and_then(|r| r.finite_values())
        .cloned()
        .unwrap_or_default();
    for t in &pool.types {
        for o in t.it.offerings.iter().filter(|o| o.available) {
            if let Some(v) = o.labels.get(key) {
                out.insert(v.clone());
            }
        }
        if let Some(vs) = t.it.requirements.values(key) {
            out.extend(vs.iter().cloned());
        }
    }
    out.retain(|v| allowed.is_none_or(|r| r.has(v)));
    out
}

fn attempt_requirements<'p>(pod: &'p PodInfo, attempt: &Attempt) -> Cow<'p, Requirements> {
    let base = pod
        .node_terms
        .get(attempt.node_term)
        .or_else(|| pod.node_terms.first());
    let preferred = pod
        .preferred_node
        .get(attempt.preferred_node)
        .map(|(_, r)| r);
    match (base, preferred) {
        (Some(b), None) => Cow::Borrowed(b),
        (Some(b), Some(p)) => Cow::Owned(b.intersect(p)),
        (None, Some(p)) => Cow::Borrowed(p),
        (None, None) => Cow::Owned(Requirements::new()),
    }
}

/// Drops one preference, in Karpenter's order: the next required node-affinity term, preferred
/// pod affinity, preferred anti-affinity (lightest first), preferred node affinity (heaviest
/// first), ScheduleAnyway spreads, then PreferNoSchedule taints. False when nothing is left.
fn relax(pod: &PodInfo, prep: &Prepared, attempt: &mut Attempt) -> bool {
    if attempt.node_term + 1 < pod.node_terms.len() {
        attempt.node_term += 1;
        return true;
    }
    for kind in [TermKind::Affinity, TermKind::AntiAffinity] {
        let lightest = prep
            .terms
            .iter()
            .zip(&pod.terms)
            .enumerate()
            .filter(|(i, ((_, required, _), t))| {
                !required
                    && t.group.kind == kind
                    && !attempt.dropped.get(*i).copied().unwrap_or(true)
            })
            .min_by_key(|(_, ((_, _, w), _))| *w)
            .map(|(i, _)| i);
        if let Some(i) = lightest
            && let Some(d) = attempt.dropped.get_mut(i)
        {
            *d = true;
            return true;
        }
    }
    if attempt.preferred_node < pod.preferred_node.len() {
        attempt.preferred_node += 1;
        return true;
    }
    let soft_spread = pod.terms.iter().enumerate().find(|(i, t)| {
        !t.required
            && matches!(t.group.kind, TermKind::Spread { .. })
            && !attempt.dropped.get(*i).copied().unwrap_or(true)
    });
    if let Some((i, _)) = soft_spread
        && let Some(d) = attempt.dropped.get_mut(i)
    {
        *d = true;
        return true;
    }
    if !attempt.tolerate_prefer_no_schedule {
        attempt.tolerate_prefer_no_schedule = true;
        return true;
    }
    false
}

fn with_narrowing(mut reqs: Requirements, narrowed: &[Narrowing]) -> Requirements {
    for (k, vs) in narrowed {
        reqs.add(Requirement::is_in(k, vs.as_slice()));
    }
    reqs
}

pub(super) fn fits(want: &Amounts, avail: &Amounts) -> bool {
    want.0.iter().zip(&avail.0).all(|(w, a)| w <= a)
}

fn ports_conflict(taken: &[(i32, String)], wanted: &[(i32, String)]) -> bool {
    wanted.iter().any(|w| taken.contains(w))
}

/// An instance type a claim with `reqs` may use: its requirements are compatible and it has an
/// available offering the requirements allow. Written without allocating, as it runs for every
/// type whenever a claim's requirements narrow.
fn type_usable(it: &InstanceType, reqs: &Requirements) -> bool {
    type_compatible(it, reqs) && it.offerings.iter().any(|o| offering_usable(o, reqs))
}

/// The type's own requirements allow `reqs` (for every shared key some value, or absence,
/// satisfies both).
pub(super) fn type_compatible(it: &InstanceType, reqs: &Requirements) -> bool {
    reqs.iter().all(|r| match it.requirements.get(r.key()) {
        None => true,
        Some(mine) => match mine.finite_values() {
            Some(vs) => vs.iter().any(|v| r.has(v)) || (mine.allows_absent() && r.allows_absent()),
            None => {
                let both = mine.intersect(r);
                !both.is_empty() || both.allows_absent()
            }
        },
    })
}

pub(super) fn offering_usable(o: &Offering, reqs: &Requirements) -> bool {
    o.available
        && reqs
            .iter()
            .all(|r| o.labels.get(r.key()).is_none_or(|v| r.has(v)))
}

fn cheapest<'i>(it: &'i InstanceType, reqs: &Requirements) -> Option<&'i Offering> {
    it.offerings
        .iter()
        .filter(|o| offering_usable(o, reqs))
        .min_by(|a, b| a.price.total_cmp(&b.price))
}

fn max_avail(types: &[TypeInfo], chosen: &[usize], len: usize) -> Amounts {
    let mut out = Amounts(vec![i128::MIN; len]);
    for t in chosen.iter().filter_map(|&i| types.get(i)) {
        out.max_assign(&t.avail);
    }
    out
}

/// True when a type's capacity fits the pool's limits, counting `own` (the claim's current
/// charge) as already free.
fn within_limits(pool: &Pool, capacity: &Amounts, own: &Amounts) -> bool {
    exceeded_limit(pool, capacity, own).is_none()
}

pub(super) fn exceeded_limit(pool: &Pool, capacity: &Amounts, own: &Amounts) -> Option<usize> {
    pool.limited
        .iter()
        .copied()
        .find(|&d| capacity.get(d) > pool.remaining.get(d).saturating_add(own.get(d)))
}

/// Moves a claim's charge against its pool's limits to its current cheapest type.
fn recharge(pool: &mut Pool, claim: &mut Claim) {
    if pool.limited.is_empty() {
        return;
    }
    let Some(cap) = claim
        .types
        .first()
        .and_then(|&i| pool.types.get(i))
        .map(|t| t.capacity.clone())
    else {
        return;
    };
    pool.remaining.add_assign(&claim.charge);
    pool.remaining.sub_assign(&cap);
    claim.charge = cap;
}

/// `reqs`' minValues against the distinct values `types` offer: `Ok(None)` when met; when not,
/// the unmet one under the Strict policy, the requirements with it lowered under BestEffort.
fn meet_min_values(
    pool: &Pool,
    types: &[usize],
    reqs: &Requirements,
    policy: MinValuesPolicy,
) -> Result<Option<Requirements>, String> {
    if !reqs.iter().any(|r| r.min_values().is_some()) {
        return Ok(None);
    }
    let available = |key: &str| distinct_values(pool, types, reqs, key);
    let Err(unmet) = reqs.check_min_values(available) else {
        return Ok(None);
    };
    match policy {
        MinValuesPolicy::Strict => Err(unmet.to_string()),
        MinValuesPolicy::BestEffort => {
            let mut relaxed = reqs.clone();
            relaxed.relax_min_values(available);
            Ok(Some(relaxed))
        }
    }
}

/// How many distinct values of `key` the chosen types offer within `reqs` (what a minValues on
/// `key` counts).
fn distinct_values(pool: &Pool, types: &[usize], reqs: &Requirements, key: &str) -> usize {
    let allowed = reqs.get(key);
    let mut values: BTreeSet<&str> = BTreeSet::new();
    for t in types.iter().filter_map(|&i| pool.types.get(i)) {
        if key == INSTANCE_TYPE_LABEL {
            values.insert(&t.it.name);
        } else if let Some(vs) = t.it.requirements.values(key) {
            values.extend(
                vs.iter()
                    .filter(|v| allowed.is_none_or(|r| r.has(v)))
                    .map(String::as_str),
            );
        }
    }
    values.len()
}

/// An existing node as a spread's node filter sees it.
fn node_source(node: &ExistingNode) -> Source<'_> {
    Source::Node {
        labels: &node.labels,
        taints: &node.taints,
    }
}

/// A claim of this solve as a spread's node filter sees it: its requirements and its pool's
/// taints.
fn claim_source<'c>(claim: &'c Claim, pools: &'c [Pool]) -> Source<'c> {
    Source::Claim {
        requirements: &claim.reqs,
        taints: pools.get(claim.pool).map(|p| p.taints).unwrap_or_default(),
    }
}

fn node_domain<'n>(node: &'n ExistingNode, key: &str) -> Option<&'n str> {
    if key == HOSTNAME_LABEL {
        return Some(
            node.labels
                .get(key)
                .map(String::as_str)
                .unwrap_or(node.name.as_str()),
        );
    }
    node.labels.get(key).map(String::as_str)
}

/// Where a pod on `claim` may be for `key`: its hostname, the one value it is narrowed to, or
/// the values it may still launch with (those its requirements name, else those its instance
/// types' available offerings carry, as upstream's claim requirements include its types').
/// `all`: whether an open claim's values are wanted (they cost a walk over its types).
fn claim_domains<'c>(claim: &'c Claim, pools: &'c [Pool], key: &str, all: bool) -> Domains<'c> {
    if key == HOSTNAME_LABEL {
        return Domains::One(&claim.hostname);
    }
    if let Some(vs) = claim.reqs.values(key) {
        return match vs.len() {
            1 => Domains::from_one(vs.iter().next().map(String::as_str)),
            _ if !all => Domains::Open(Vec::new()),
            _ => Domains::Open(vs.iter().map(String::as_str).collect()),
        };
    }
    if !all {
        return Domains::Open(Vec::new());
    }
    let allowed = claim.reqs.get(key);
    let mut out: BTreeSet<&str> = BTreeSet::new();
    let types = pools
        .get(claim.pool)
        .map(|p| p.types.as_slice())
        .unwrap_or_default();
    for t in claim.types.iter().filter_map(|&ti| types.get(ti)) {
        for o in t.it.offerings.iter().filter(|o| o.available) {
            if let Some(v) = o.labels.get(key) {
                out.insert(v);
            }
        }
        out.extend(
            t.it.requirements
                .values(key)
                .into_iter()
                .flatten()
                .map(String::as_str),
        );
    }
    out.retain(|v| allowed.is_none_or(|r| r.has(v)));
    match out.len() {
        1 => Domains::from_one(out.into_iter().next()),
        _ => Domains::Open(out.into_iter().collect()),
    }
}

fn describe(reqs: &Requirements) -> String {
    let parts: Vec<String> = reqs.iter().map(|r| format!("{} {r}", r.key())).collect();
    format!("[{}]", parts.join(", "))
}

/// One error for the pod from every pool's miss: a limit or a fit problem of the first pool
/// that otherwise matched, else the list of why no pool matched.
fn summarise(misses: Vec<(&str, PoolMiss)>) -> PodError {
    if misses.is_empty() {
        return PodError::NoNodePoolMatches {
            details: "there are no NodePools".into(),
        };
    }
    let mut reasons = Vec::new();
    for (pool, miss) in misses {
        match miss {
            PoolMiss::Limit(resource) => {
                return PodError::LimitReached {
                    nodepool: pool.to_string(),
                    resource,
                };
            }
            PoolMiss::NoFit(details) => {
                return PodError::NoInstanceTypeFits {
                    nodepool: pool.to_string(),
                    details,
                };
            }
            PoolMiss::Incompatible(why) => reasons.push(format!("NodePool {pool:?}: {why}")),
        }
    }
    PodError::NoNodePoolMatches {
        details: reasons.join("; "),
    }
}
