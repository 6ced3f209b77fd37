//! NodePools as templates for new claims: their compatible instance types, limits and
//! minValues, and opening a new claim for a pod.

use std::collections::BTreeSet;
use std::rc::Rc;

use k8s_openapi::api::core::v1::Taint;

use super::existing::LABELS_TO_COME;

use super::{Solver, Usability};
use crate::api::nodeclaim::Operator;
use crate::api::nodepool::NodePool;
use crate::api::requirements::{Requirement, Requirements};
use crate::api::resources::{Quantity, Resources};
use crate::api::wellknown::{
    DEFAULT_MAX_PODS, HOSTNAME_LABEL, INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, RESOURCE_PODS,
    WELL_KNOWN_LABELS,
};
use crate::scheduling::amounts::{Amounts, Dims};
use crate::scheduling::error::PodError;
use crate::scheduling::instance_type::{InstanceType, Offering, absent_label};
use crate::scheduling::pod::PodInfo;
use crate::scheduling::selector::untolerated;
use crate::scheduling::{MinValuesPolicy, Snapshot};

/// One instance type of one pool, with the pool's DaemonSet overhead already taken off.
pub(in crate::scheduling) struct TypeInfo<'a> {
    pub(in crate::scheduling) it: &'a InstanceType,
    pub(in crate::scheduling) capacity: Amounts,
    /// Allocatable minus DaemonSet overhead: what pods may use.
    pub(in crate::scheduling) avail: Amounts,
    pub(in crate::scheduling) daemon: Resources,
    /// Host ports the DaemonSet pods on such a node take.
    pub(in crate::scheduling) daemon_ports: Vec<(i32, String)>,
}

/// A NodePool prepared for the solve.
pub(in crate::scheduling) struct Pool<'a> {
    pub(in crate::scheduling) name: &'a str,
    pub(in crate::scheduling) reqs: Requirements,
    pub(in crate::scheduling) taints: &'a [Taint],
    /// Compatible with the pool's requirements and with an available offering, cheapest first.
    pub(in crate::scheduling) types: Vec<TypeInfo<'a>>,
    /// Why the pool can launch nothing at all (bad requirements), if so.
    pub(in crate::scheduling) broken: Option<String>,
    /// Label keys a node of this pool will carry: its requirements, its types' requirements
    /// and its offerings' labels.
    pub(in crate::scheduling) known_keys: BTreeSet<String>,
    /// Dimensions with a limit; `remaining` is meaningful only for those.
    pub(in crate::scheduling) limited: Vec<usize>,
    pub(in crate::scheduling) remaining: Amounts,
    pub(in crate::scheduling) nodes_remaining: Option<i64>,
}

impl<'a> Solver<'a> {
    pub(super) fn usability(&self, pi: usize, reqs: &Requirements) -> Usability<'a> {
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

/// Why a static NodePool opens no claim for a pending pod.
pub(in crate::scheduling) const STATIC_POOL: &str = "static (spec.replicas set): it keeps its replica count and provisions nothing for pending pods";

/// Why no new node can meet `reqs`, if it requires `kubernetes.io/hostname` (upstream's one
/// restricted label) by naming hosts: a new node's hostname is not known before it registers,
/// so only an existing node can match. Requirements that only exclude hosts (NotIn, Exists)
/// any new node meets. Upstream gets the same outcome by giving each new claim a placeholder
/// hostname the pod's requirement cannot intersect.
pub(in crate::scheduling) fn restricted_label(reqs: &Requirements) -> Option<PodError> {
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
pub(in crate::scheduling) fn unknown_label<'r>(
    pool: &Pool,
    reqs: &'r Requirements,
) -> Option<&'r str> {
    reqs.iter()
        .find(|r| {
            !r.allows_absent()
                && !pool.known_keys.contains(r.key())
                && !WELL_KNOWN_LABELS.contains(&r.key())
        })
        .map(|r| r.key())
}

pub(super) fn weight_of(snapshot: &Snapshot, name: &str) -> i32 {
    snapshot
        .nodepools
        .iter()
        .find(|p| p.nodepool.metadata.name.as_deref() == Some(name))
        .map(|p| p.nodepool.weight())
        .unwrap_or(0)
}

pub(in crate::scheduling) fn build_pool<'a>(
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
pub(super) fn pool_domains(pool: &Pool, key: &str) -> BTreeSet<String> {
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

/// An instance type a claim with `reqs` may use: its requirements are compatible and it has an
/// available offering the requirements allow. Written without allocating, as it runs for every
/// type whenever a claim's requirements narrow.
fn type_usable(it: &InstanceType, reqs: &Requirements) -> bool {
    type_compatible(it, reqs) && it.offerings.iter().any(|o| offering_usable(o, reqs))
}

/// The type's own requirements allow `reqs` (for every shared key some value, or absence,
/// satisfies both).
pub(in crate::scheduling) fn type_compatible(it: &InstanceType, reqs: &Requirements) -> bool {
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

pub(in crate::scheduling) fn offering_usable(o: &Offering, reqs: &Requirements) -> bool {
    o.available
        && reqs
            .iter()
            .all(|r| o.labels.get(r.key()).is_none_or(|v| r.has(v)))
}

pub(super) fn cheapest<'i>(it: &'i InstanceType, reqs: &Requirements) -> Option<&'i Offering> {
    it.offerings
        .iter()
        .filter(|o| offering_usable(o, reqs))
        .min_by(|a, b| a.price.total_cmp(&b.price))
}

pub(in crate::scheduling) fn exceeded_limit(
    pool: &Pool,
    capacity: &Amounts,
    own: &Amounts,
) -> Option<usize> {
    pool.limited
        .iter()
        .copied()
        .find(|&d| capacity.get(d) > pool.remaining.get(d).saturating_add(own.get(d)))
}

/// `reqs`' minValues against the distinct values `types` offer: `Ok(None)` when met; when not,
/// the unmet one under the Strict policy, the requirements with it lowered under BestEffort.
pub(super) fn meet_min_values(
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
