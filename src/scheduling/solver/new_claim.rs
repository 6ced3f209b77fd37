//! New claims: opening one from a NodePool for a pod that fits nowhere else, whether a later
//! pod may join a claim opened earlier in the same solve, and what each claim becomes.

use std::borrow::Cow;
use std::collections::BTreeSet;

use super::pool_miss::{PoolMiss, pool_admits, summarise};
use super::preferences::with_narrowing;
use super::template::{
    Pool, STATIC_POOL, TypeInfo, exceeded_limit, meet_min_values, unknown_label,
};
use super::{Ctx, Solver, fits, ports_conflict};
use crate::api::requirements::{Requirement, Requirements};
use crate::api::resources::Resources;
use crate::api::wellknown::{CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, INSTANCE_TYPE_LABEL};
use crate::scheduling::amounts::Amounts;
use crate::scheduling::claim_index::{Cursor, HostTerms, room};
use crate::scheduling::error::PodError;
use crate::scheduling::pod::PodInfo;
use crate::scheduling::quota::{QuotaCap, first_exceeded};
use crate::scheduling::selector::untolerated;
use crate::scheduling::topology::{Domains, Narrowing, Place, Rejection, Source};
use crate::scheduling::volumes::PodVolumes;
use crate::scheduling::{MAX_INSTANCE_TYPES, MinValuesPolicy, NewClaim};

/// A claim opened in this solve.
pub(super) struct Claim {
    pub(super) pool: usize,
    pub(super) hostname: String,
    pub(super) reqs: Requirements,
    /// Sum of the pods' requests.
    pub(super) used: Amounts,
    /// Indices into the pool's types, cheapest first.
    pub(super) types: Vec<usize>,
    /// Element-wise maximum of the types' `avail`: a quick upper bound on what still fits.
    pub(super) max_avail: Amounts,
    pub(super) pods: Vec<usize>,
    pub(super) host_ports: Vec<(i32, String)>,
    /// Capacity counted against the pool's limits and its quotas' (its cheapest type's).
    pub(super) charge: Amounts,
    /// The CapacityQuotas (indices into the solver's) that may cover it, chosen when it opens:
    /// its requirements only narrow after, so the set only shrinks (`release_uncovered`).
    pub(super) quotas: Vec<usize>,
    /// A minValues of its pool was lowered to open it (BestEffort).
    pub(super) min_values_relaxed: bool,
    /// Its pods' volumes by the CSI driver that attaches them: its types' attach limits must
    /// hold them.
    pub(super) volumes: PodVolumes,
}

/// A claim a pod may join: its usage, instance types, requirements (when they change) and
/// volumes (when the pod brings some) after.
type Joined = (
    Amounts,
    Vec<usize>,
    Option<Requirements>,
    Option<PodVolumes>,
);

impl<'a> Solver<'a> {
    pub(super) fn try_claims(&mut self, ctx: &Ctx) -> bool {
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
            let Some(joined) = ctx.alternatives().find_map(|ctx| self.join(claim, &ctx)) else {
                continue;
            };
            self.commit_to_claim(ci, ctx, joined);
            return true;
        }
        false
    }

    /// What claim `ci` becomes if `ctx`'s pod joins it: its usage, the types left and its
    /// requirements when they change; `None` when the pod cannot join.
    #[inline]
    pub(super) fn join(&self, claim: &Claim, ctx: &Ctx) -> Option<Joined> {
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
        let volumes = self.pod_volumes(&ctx.pod.key).map(|v| {
            let mut all = claim.volumes.clone();
            for (driver, claims) in v {
                all.entry(driver.clone())
                    .or_default()
                    .extend(claims.iter().cloned());
            }
            all
        });
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
                && first_exceeded(
                    &self.quotas,
                    &claim.quotas,
                    &t.capacity,
                    &claim.charge,
                    self.dims,
                )
                .is_none()
                && usable
                    .as_ref()
                    .is_none_or(|u| u.get(ti).is_some_and(Option::is_some))
                && volumes.as_ref().is_none_or(|v| attach_limits_hold(t, v))
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
        Some((used, types, reqs, volumes))
    }

    /// The pod's volumes by CSI driver, when it has any and some node or type is limited.
    fn pod_volumes(&self, pod: &str) -> Option<&PodVolumes> {
        self.volumes.as_ref().and_then(|(_, pods)| pods.get(pod))
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

    fn commit_to_claim(&mut self, ci: usize, ctx: &Ctx, joined: Joined) {
        let (used, types, reqs, volumes) = joined;
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
            release_uncovered(pool, &mut self.quotas, claim);
        }
        if let Some(v) = volumes {
            claim.volumes = v;
        }
        claim.host_ports.extend(ctx.pod.host_ports.iter().cloned());
        if let Some(&i) = self.order.get(&ctx.pod.key) {
            claim.pods.push(i);
        }
        recharge(pool, &mut self.quotas, claim);
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
}

pub(super) fn finish_claim(
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

/// Whether a node of type `t` may attach `volumes`: each driver's distinct claims within the
/// type's limit for it (upstream's volume limits, known here before the node exists from the
/// csi-driver annotation).
fn attach_limits_hold(t: &TypeInfo, volumes: &PodVolumes) -> bool {
    t.it.csi_limits
        .iter()
        .all(|(driver, limit)| volumes.get(driver).is_none_or(|c| c.len() <= *limit))
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

/// After a claim's requirements narrowed (a pod joined with a node selector, or the topology
/// chose its zone): the quotas that can no longer cover it get back its charge and its node.
/// Narrowing only takes quotas away, so none is added.
fn release_uncovered(pool: &Pool, quotas: &mut [QuotaCap], claim: &mut Claim) {
    let known = |k: &str| pool.known_keys.contains(k);
    claim.quotas.retain(|&qi| {
        let Some(q) = quotas.get_mut(qi) else {
            return false;
        };
        if q.may_cover(&claim.reqs, &known) {
            return true;
        }
        q.remaining.add_assign(&claim.charge);
        if let Some(n) = q.nodes_remaining.as_mut() {
            *n += 1;
        }
        false
    });
}

/// Moves a claim's charge against its pool's limits and its quotas to its current cheapest
/// type.
fn recharge(pool: &mut Pool, quotas: &mut [QuotaCap], claim: &mut Claim) {
    if pool.limited.is_empty() && claim.quotas.is_empty() {
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
    for &qi in &claim.quotas {
        if let Some(q) = quotas.get_mut(qi) {
            q.remaining.add_assign(&claim.charge);
            q.remaining.sub_assign(&cap);
        }
    }
    claim.charge = cap;
}

/// A claim of this solve as a spread's node filter sees it: its requirements and its pool's
/// taints.
fn claim_source<'c>(claim: &'c Claim, pools: &'c [Pool]) -> Source<'c> {
    Source::Claim {
        requirements: &claim.reqs,
        taints: pools.get(claim.pool).map(|p| p.taints).unwrap_or_default(),
    }
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

impl<'a> Solver<'a> {
    pub(super) fn try_new_claim(&mut self, ctx: &Ctx) -> Result<(), PodError> {
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
                        recharge(pool, &mut self.quotas, claim);
                        if let Some(n) = pool.nodes_remaining.as_mut() {
                            *n -= 1;
                        }
                        for &qi in &claim.quotas {
                            if let Some(n) = self
                                .quotas
                                .get_mut(qi)
                                .and_then(|q| q.nodes_remaining.as_mut())
                            {
                                *n -= 1;
                            }
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

    /// A new claim from pool `pi` for the pod, or why the pool cannot open one.
    fn open_claim(&self, pi: usize, ctx: &Ctx) -> Result<Claim, PoolMiss> {
        let pool = &self.pools[pi];
        pool_admits(pool, ctx)?;
        let hostname = format!("{}-claim-{}", pool.name, self.claims.len());
        let reqs = self.claim_requirements(pool, ctx, &hostname)?;
        let quotas = self.claim_quotas(pool, &reqs)?;
        let pod_volumes = self.pod_volumes(&ctx.pod.key);
        let types = self.claim_types(pi, ctx, &reqs, &quotas, pod_volumes)?;
        let relaxed = meet_min_values(pool, &types, &reqs, self.min_values_policy)
            .map_err(PoolMiss::NoFit)?;
        let min_values_relaxed = relaxed.is_some();
        let reqs = relaxed.unwrap_or(reqs);
        let zero = Amounts::zero(self.dims.len());
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
            quotas,
            min_values_relaxed,
            volumes: pod_volumes.cloned().unwrap_or_default(),
        })
    }

    /// The new claim's requirements: the pool's narrowed by the pod's, then by where its
    /// topology spread and affinity let this new hostname go (skipped when it has neither, as
    /// admitting is the costly part of opening a claim).
    fn claim_requirements(
        &self,
        pool: &Pool,
        ctx: &Ctx,
        hostname: &str,
    ) -> Result<Requirements, PoolMiss> {
        let base = if ctx.reqs.is_empty() {
            Cow::Borrowed(&pool.reqs)
        } else {
            Cow::Owned(pool.reqs.intersect(ctx.reqs))
        };
        let narrowed = if ctx.active.is_empty() && ctx.prep.matched.is_empty() {
            Vec::new()
        } else {
            let place = Place::Claim {
                hostname,
                requirements: &base,
            };
            self.admit(ctx, &place)
                .map_err(|r| PoolMiss::Incompatible(self.topology.explain(r)))?
        };
        Ok(with_narrowing(base.into_owned(), &narrowed))
    }

    /// The CapacityQuotas that may cover the new claim; one with no node left refuses it
    /// whatever its instance type.
    fn claim_quotas(&self, pool: &Pool, reqs: &Requirements) -> Result<Vec<usize>, PoolMiss> {
        let known = |k: &str| pool.known_keys.contains(k);
        let quotas: Vec<usize> = (self.quotas.iter().enumerate())
            .filter(|(_, q)| q.may_cover(reqs, &known))
            .map(|(i, _)| i)
            .collect();
        if let Some(q) =
            (quotas.iter().filter_map(|&q| self.quotas.get(q))).find(|q| !q.node_left())
        {
            return Err(PoolMiss::Quota(q.name.clone(), "nodes".into()));
        }
        Ok(quotas)
    }

    /// The pool's instance types the new claim may take. When there is none, a limit or quota
    /// that ruled out a fitting type is the reason given: raising it would let the pod in,
    /// which a bare "does not fit" would hide.
    fn claim_types(
        &self,
        pi: usize,
        ctx: &Ctx,
        reqs: &Requirements,
        quotas: &[usize],
        pod_volumes: Option<&PodVolumes>,
    ) -> Result<Vec<usize>, PoolMiss> {
        let pool = &self.pools[pi];
        // Every type of the pool meets the pool's own requirements: only narrower ones can rule
        // some out.
        let usable = (*reqs != pool.reqs).then(|| self.usability(pi, reqs));
        let zero = Amounts::zero(self.dims.len());
        let mut types = Vec::new();
        let (mut matching, mut fitting) = (0usize, 0usize);
        let mut limit_hit: Option<usize> = None;
        let mut quota_hit: Option<(&str, String)> = None;
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
                || pod_volumes.is_some_and(|v| !attach_limits_hold(t, v))
            {
                continue;
            }
            fitting += 1;
            if let Some(d) = exceeded_limit(pool, &t.capacity, &zero) {
                limit_hit.get_or_insert(d);
                continue;
            }
            if let Some(hit) = first_exceeded(&self.quotas, quotas, &t.capacity, &zero, self.dims) {
                quota_hit.get_or_insert(hit);
                continue;
            }
            types.push(ti);
        }
        if !types.is_empty() {
            return Ok(types);
        }
        if let Some(d) = limit_hit {
            return Err(PoolMiss::Limit(self.dims.name(d).to_string()));
        }
        if let Some((name, resource)) = quota_hit {
            return Err(PoolMiss::Quota(name.to_string(), resource));
        }
        Err(PoolMiss::NoFit(
            self.no_fit_details(pool, ctx, matching, fitting),
        ))
    }
}
