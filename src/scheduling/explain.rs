//! Why a pod can or cannot go to each NodePool and instance type: the first constraint that
//! rules each one out, checked with the solver's own predicates in the solver's order (pool
//! taints, pool requirements, node limit, then per type: requirements, offerings, resources,
//! limits), and finally the solver itself for what only a whole solve knows (topology spread
//! and pod affinity). `karpenter-capi explain pod` prints it; nothing here decides anything the
//! solver does not.

use serde::Serialize;

use k8s_openapi::api::core::v1::Pod;

use super::amounts::Amounts;
use super::error::PodError;
use super::instance_type::{InstanceType, Offering, absent_label};
use super::pod::{PodInfo, TermKind};
use super::selector::untolerated;
use super::solver::{
    Pool, STATIC_POOL, build_pool, exceeded_limit, fits, learn_dims, offering_usable,
    restricted_label, type_compatible, unknown_label,
};
use super::{ExistingNode, PoolInput, Snapshot, solve};
use crate::api::requirements::Requirements;
use crate::api::resources::Quantity;

/// The kinds of constraint that can rule a NodePool or an instance type out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Constraint {
    /// The NodePool itself cannot launch (a bad requirement or limit in its spec).
    Nodepool,
    /// A NodePool taint the pod does not tolerate.
    Taints,
    /// Node selector / required node affinity against the NodePool's or the type's labels.
    Requirements,
    /// No available offering (max size reached, recently failed, or labels the pod excludes).
    Offerings,
    /// The pod's requests (plus DaemonSet overhead) exceed what the type can hold.
    Resources,
    /// The NodePool's `spec.limits` leave no room for a node of this type.
    Limits,
    /// Topology spread constraints.
    Topology,
    /// Pod affinity or anti-affinity.
    Affinity,
}

impl std::fmt::Display for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Constraint::Nodepool => "nodepool",
            Constraint::Taints => "taints",
            Constraint::Requirements => "requirements",
            Constraint::Offerings => "offerings",
            Constraint::Resources => "resources",
            Constraint::Limits => "limits",
            Constraint::Topology => "topology",
            Constraint::Affinity => "affinity",
        })
    }
}

/// One constraint that rules something out, with the detail a person needs to change it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct RuledOut {
    pub(crate) constraint: Constraint,
    pub(crate) message: String,
}

impl RuledOut {
    fn new(constraint: Constraint, message: impl Into<String>) -> Self {
        Self {
            constraint,
            message: message.into(),
        }
    }
}

/// One instance type of a pool for the pod.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct TypeVerdict {
    pub(crate) instance_type: String,
    /// `None`: the pod could go to a new node of this type.
    pub(crate) ruled_out: Option<RuledOut>,
}

/// One NodePool for the pod: ruled out as a whole, or per instance type.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolVerdict {
    pub(crate) nodepool: String,
    pub(crate) ruled_out: Option<RuledOut>,
    pub(crate) instance_types: Vec<TypeVerdict>,
}

impl PoolVerdict {
    /// Instance types nothing rules out.
    pub(crate) fn eligible(&self) -> impl Iterator<Item = &str> {
        self.instance_types
            .iter()
            .filter(|t| t.ruled_out.is_none())
            .map(|t| t.instance_type.as_str())
    }
}

/// For each NodePool of `snapshot` (in the solver's order of weight, then name), why `pod` can
/// or cannot get a new node from it. Errors when the pod's spec cannot be read (the same error
/// the solver reports as `InvalidPod`).
pub(crate) fn rule_out(pod: &Pod, snapshot: &Snapshot) -> Result<Vec<PoolVerdict>, String> {
    let defaults = snapshot
        .default_spread
        .as_ref()
        .and_then(|d| d.for_pod(pod));
    let info = PodInfo::read_with_defaults(pod, defaults.as_deref())?;
    let daemons: Vec<PodInfo> = snapshot
        .daemonsets
        .iter()
        .filter_map(|d| PodInfo::read(d).ok())
        .collect();
    let dims = learn_dims(snapshot, std::slice::from_ref(&info), &daemons);
    let amounts = dims.amounts(&info.requests);
    let mut pools: Vec<&PoolInput> = snapshot.nodepools.iter().collect();
    pools.sort_by(|a, b| {
        b.nodepool
            .weight()
            .cmp(&a.nodepool.weight())
            .then_with(|| a.nodepool.metadata.name.cmp(&b.nodepool.metadata.name))
    });
    let mut out = Vec::new();
    for input in pools {
        let pool = build_pool(
            &input.nodepool,
            &input.instance_types,
            &input.usage,
            &dims,
            &daemons,
        );
        let mut verdict = PoolVerdict {
            nodepool: pool.name.to_string(),
            ruled_out: None,
            instance_types: Vec::new(),
        };
        if input.nodepool.is_static() {
            verdict.ruled_out = Some(RuledOut::new(Constraint::Nodepool, STATIC_POOL));
            out.push(verdict);
            continue;
        }
        match pool_level(&pool, &info) {
            Err(r) => verdict.ruled_out = Some(r),
            Ok(terms) => {
                verdict.instance_types = input
                    .instance_types
                    .iter()
                    .map(|it| TypeVerdict {
                        instance_type: it.name.clone(),
                        ruled_out: type_level(&pool, it, &terms, &amounts, &dims).err(),
                    })
                    .collect();
                if verdict.eligible().next().is_some() {
                    whole_solve(pod, &info, snapshot, input, &mut verdict);
                }
            }
        }
        out.push(verdict);
    }
    Ok(out)
}

/// The pool-wide checks of the solver's `open_claim`, in its order. Returns the pod's required
/// node-selector terms (ORed) the pool admits, each already intersected with the pool's
/// requirements.
fn pool_level(pool: &Pool, pod: &PodInfo) -> Result<Vec<Requirements>, RuledOut> {
    if let Some(why) = &pool.broken {
        return Err(RuledOut::new(Constraint::Nodepool, why.clone()));
    }
    // PreferNoSchedule taints are only a preference; the solver relaxes them last.
    if let Some(t) = untolerated(&pod.tolerations, pool.taints, false) {
        return Err(RuledOut::new(
            Constraint::Taints,
            format!(
                "taint {}={}:{} is not tolerated",
                t.key,
                t.value.as_deref().unwrap_or(""),
                t.effect
            ),
        ));
    }
    let mut admitted = Vec::new();
    let mut first_miss = None;
    for term in &pod.node_terms {
        let miss = match pool.reqs.compatible(term) {
            Err(e) => Some(format!("incompatible requirements, {e}")),
            Ok(()) => unknown_label(pool, term)
                .map(|key| {
                    format!("label {key:?} is not provided by the NodePool or its instance types")
                })
                .or_else(|| restricted_label(term).map(|e| e.to_string())),
        };
        match miss {
            Some(m) => {
                first_miss.get_or_insert(m);
            }
            None => admitted.push(pool.reqs.intersect(term)),
        }
    }
    if admitted.is_empty() {
        return Err(RuledOut::new(
            Constraint::Requirements,
            first_miss.unwrap_or_else(|| "no node-selector term is admitted".into()),
        ));
    }
    if pool.nodes_remaining.is_some_and(|n| n < 1) {
        return Err(RuledOut::new(
            Constraint::Limits,
            "the NodePool has reached its limit on \"nodes\"",
        ));
    }
    Ok(admitted)
}

/// The per-type checks of the solver's `build_pool` and `open_claim`, in their order.
fn type_level(
    pool: &Pool,
    it: &InstanceType,
    terms: &[Requirements],
    amounts: &Amounts,
    dims: &super::amounts::Dims,
) -> Result<(), RuledOut> {
    if !type_compatible(it, &pool.reqs) {
        return Err(RuledOut::new(
            Constraint::Requirements,
            "the instance type's labels conflict with the NodePool's requirements",
        ));
    }
    if let Some(r) = offerings_miss(it, &pool.reqs, "the NodePool's requirements") {
        return Err(r);
    }
    let Some(t) = pool.types.iter().find(|t| std::ptr::eq(t.it, it)) else {
        return Err(RuledOut::new(
            Constraint::Offerings,
            "no available offering the NodePool allows",
        ));
    };
    // A term the type's labels allow, with an offering it allows.
    let mut miss = None;
    let mut admitted = false;
    for reqs in terms {
        if !type_compatible(it, reqs) {
            miss.get_or_insert(RuledOut::new(
                Constraint::Requirements,
                format!(
                    "the pod's node selector or required node affinity excludes it ({})",
                    describe_type(it)
                ),
            ));
        } else if let Some(key) = absent_label(reqs, &pool.reqs, |k| it.carries(k)) {
            miss.get_or_insert(RuledOut::new(
                Constraint::Requirements,
                format!(
                    "the pod requires label {key:?}, which neither the instance type's \
                     MachineDeployments nor the NodePool give its nodes"
                ),
            ));
        } else if let Some(r) = offerings_miss(it, reqs, "the pod's requirements") {
            miss.get_or_insert(r);
        } else {
            admitted = true;
            break;
        }
    }
    if !admitted {
        return Err(miss.unwrap_or_else(|| {
            RuledOut::new(Constraint::Requirements, "no node-selector term admits it")
        }));
    }
    if !fits(amounts, &t.avail) {
        let short: Vec<String> = (0..dims.len())
            .filter(|&d| amounts.get(d) > t.avail.get(d))
            .map(|d| {
                format!(
                    "{} needs {} but {} is free for pods",
                    dims.name(d),
                    Quantity::from_nanos(amounts.get(d)),
                    Quantity::from_nanos(t.avail.get(d).max(0))
                )
            })
            .collect();
        return Err(RuledOut::new(
            Constraint::Resources,
            format!("too small after DaemonSet overhead: {}", short.join(", ")),
        ));
    }
    let zero = Amounts::zero(dims.len());
    if let Some(d) = exceeded_limit(pool, &t.capacity, &zero) {
        return Err(RuledOut::new(
            Constraint::Limits,
            format!(
                "a node of this type ({} {}) exceeds what the NodePool's limit on {:?} leaves ({})",
                Quantity::from_nanos(t.capacity.get(d)),
                dims.name(d),
                dims.name(d),
                Quantity::from_nanos(pool.remaining.get(d).max(0))
            ),
        ));
    }
    Ok(())
}

/// Why no offering of `it` is usable under `reqs`, if none is: unavailable offerings win over
/// label mismatches only when some offering's labels would have been allowed.
fn offerings_miss(it: &InstanceType, reqs: &Requirements, whose: &str) -> Option<RuledOut> {
    if it.offerings.iter().any(|o| offering_usable(o, reqs)) {
        return None;
    }
    let allowed: Vec<&Offering> = it
        .offerings
        .iter()
        .filter(|o| {
            let mut open = (*o).clone();
            open.available = true;
            offering_usable(&open, reqs)
        })
        .collect();
    if allowed.is_empty() {
        return Some(RuledOut::new(
            Constraint::Requirements,
            format!(
                "every offering's labels (zone, capacity type...) are excluded by {whose}: {}",
                it.offerings
                    .iter()
                    .map(|o| o.machine_deployment.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    Some(RuledOut::new(
        Constraint::Offerings,
        format!(
            "no available offering: {}",
            allowed
                .iter()
                .map(|o| format!("{} {}", o.machine_deployment, unavailable_reason(o)))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    ))
}

/// Why an offering is unavailable: its max size, else Cluster API's pause on its
/// MachineDeployment or a recent launch failure or timeout (the offering does not say which).
pub(crate) fn unavailable_reason(o: &Offering) -> String {
    match o.max_size {
        // The replicas as the catalog view counts them: claims whose replica is not written
        // yet included (`capi::room`).
        Some(max) if o.replicas >= max => format!(
            "is at its max size ({} of {max} replicas, claims not written yet counted)",
            o.replicas
        ),
        _ => "is marked unavailable: its MachineDeployment is paused (cluster.x-k8s.io/paused), or a launch on it recently failed or timed out".into(),
    }
}

fn describe_type(it: &InstanceType) -> String {
    let parts: Vec<String> = it
        .requirements
        .iter()
        .map(|r| format!("{} {r}", r.key()))
        .collect();
    parts.join(", ")
}

/// What only a whole solve knows (topology spread, pod affinity, minValues): the pod alone
/// against this pool, with the rest of the cluster as it is but every existing node full (so
/// the bound pods still count for topology while the pod must open a new claim). Types the
/// solve does not keep are ruled out by what it reports.
fn whole_solve(
    pod: &Pod,
    info: &PodInfo,
    snapshot: &Snapshot,
    input: &PoolInput,
    verdict: &mut PoolVerdict,
) {
    let nodes = snapshot
        .nodes
        .iter()
        .map(|n| ExistingNode {
            requested: n.allocatable.clone(),
            ..n.clone()
        })
        .collect();
    let alone = Snapshot {
        pods: vec![pod.clone()],
        nodepools: vec![input.clone()],
        nodes,
        ..snapshot.clone()
    };
    let results = solve(&alone);
    let reason = if let Some((_, e)) = results.failures.first() {
        let message = e.to_string();
        // Every per-type check passed, so what failed is what only the solve sees: the
        // message names it when it can; else the pod's own topology terms are the cause (a
        // domain was chosen that no type offers).
        let spreads = info
            .terms
            .iter()
            .any(|t| matches!(t.group.kind, TermKind::Spread { .. }));
        let constraint = if message.contains("topology spread") {
            Constraint::Topology
        } else if message.contains("affinity") {
            Constraint::Affinity
        } else if matches!(
            e,
            PodError::LimitReached { .. } | PodError::QuotaReached { .. }
        ) {
            Constraint::Limits
        } else if spreads {
            Constraint::Topology
        } else if !info.terms.is_empty() {
            Constraint::Affinity
        } else {
            Constraint::Requirements
        };
        RuledOut::new(constraint, message)
    } else if let Some(claim) = results.new_claims.first() {
        let kept = &claim.instance_types;
        for t in &mut verdict.instance_types {
            if t.ruled_out.is_none() && !kept.contains(&t.instance_type) {
                t.ruled_out = Some(RuledOut::new(
                    Constraint::Topology,
                    "the domain the topology constraints choose has no offering of this type",
                ));
            }
        }
        return;
    } else {
        return;
    };
    for t in &mut verdict.instance_types {
        if t.ruled_out.is_none() {
            t.ruled_out = Some(reason.clone());
        }
    }
}
