//! The catalog as every reader sees it: each NodeClass's instance types and offerings as the
//! Catalog actor last published them, the offerings recently marked unavailable, and the
//! launch's ranking of offerings for a claim. Claims, the provisioner, disruption and `explain`
//! read it alike.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Taint;
use parking_lot::RwLock;

use crate::api::nodeoverlay::NodeOverlay;
use crate::api::nodepool::NodePool;
use crate::api::requirements::{MinValuesError, Requirements};
use crate::api::resources::Resources;
use crate::capi::offerings;
use crate::capi::overlay::{self, Verdict};
use crate::capi::room;
use crate::scheduling::InstanceType;
use crate::state::Claims;

mod resolve;
use resolve::readiness;
pub(crate) use resolve::{LeftOut, resolve_nodeclass};

/// The offering a claim launches from, with what its node will look like.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub(crate) machine_deployment: String,
    pub(crate) instance_type: String,
    pub(crate) zone: Option<String>,
    pub(crate) capacity_type: String,
    pub price: f64,
    pub(crate) capacity: Resources,
    pub(crate) allocatable: Resources,
    pub(crate) labels: std::collections::BTreeMap<String, String>,
}

impl Choice {
    /// The labels Karpenter writes on a claim at launch: the well-known ones of the offering.
    pub(crate) fn node_labels(&self) -> Vec<(String, String)> {
        use crate::api::wellknown::*;
        [
            INSTANCE_TYPE_LABEL,
            ZONE_LABEL,
            CAPACITY_TYPE_LABEL,
            ARCH_LABEL,
            OS_LABEL,
        ]
        .iter()
        .filter_map(|k| self.labels.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("ClusterAPINodeClass {0} not found")]
    NodeClassNotFound(String),
    #[error("ClusterAPINodeClass {name} is not ready: {message}")]
    NodeClassNotReady { name: String, message: String },
    #[error("invalid NodeClaim: {0}")]
    Invalid(String),
    #[error("no available offering of ClusterAPINodeClass {nodeclass} is compatible: {details}")]
    NoCompatibleOffering { nodeclass: String, details: String },
    #[error(
        "no offering of ClusterAPINodeClass {nodeclass} is compatible yet, and {pending} of its MachineDeployments or MachinePools are not offered until their infrastructure templates or pools are read"
    )]
    PoolsPending { nodeclass: String, pending: usize },
    #[error(
        "validating minValues against the instance types of ClusterAPINodeClass {nodeclass} that can launch it: {source}"
    )]
    MinValues {
        nodeclass: String,
        #[source]
        source: MinValuesError,
    },
}

impl ResolveError {
    /// Event reason.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            ResolveError::NodeClassNotFound(_) => "NodeClassNotFound",
            ResolveError::NodeClassNotReady { .. } => "NodeClassNotReady",
            ResolveError::Invalid(_) => "InvalidNodeClaim",
            ResolveError::NoCompatibleOffering { .. } => "InsufficientCapacity",
            ResolveError::PoolsPending { .. } => "MachinePoolsPending",
            // Upstream's launch reason for a cloud provider error it has no name for.
            ResolveError::MinValues { .. } => "LaunchFailed",
        }
    }
}

#[derive(Clone)]
struct Entry {
    catalog: Arc<offerings::Catalog>,
    create_timeout: Option<Duration>,
    ready: Result<(), String>,
}

#[derive(Default)]
struct Inner {
    by_nodeclass: HashMap<String, Entry>,
    /// The catalog a NodePool sees where NodeOverlays make it differ from its NodeClass's
    /// (`capi::overlay::Applied::pools`), with that NodeClass's name.
    by_pool: PoolCatalogs,
    unavailable: HashMap<String, Instant>,
    /// MachinePool key -> hash of its infrastructure pool's instance fields, as last read.
    instance_hashes: HashMap<String, String>,
    /// NodeClass -> why its `spec.generate` patches cannot be used.
    generation_refused: HashMap<String, String>,
}

impl Inner {
    /// The catalog `pool` sees of `nodeclass`: its own where overlays gave it one, else the
    /// NodeClass's (also for readers without a pool).
    fn catalog(&self, nodeclass: &str, pool: Option<&str>) -> Option<&Arc<offerings::Catalog>> {
        match pool.and_then(|p| self.by_pool.get(p)) {
            Some((nc, c)) if nc == nodeclass => Some(c),
            _ => self.by_nodeclass.get(nodeclass).map(|e| &e.catalog),
        }
    }
}

/// A NodeClass with `spec.generate`: its name, its generated groups, whether it can be used.
pub(crate) type GeneratedOf = (
    String,
    Vec<crate::api::nodeclass::GeneratedGroup>,
    Option<Result<(), String>>,
);

/// Read side of the catalog, shared by every actor.
#[derive(Clone, Default)]
pub struct CatalogView {
    inner: Arc<RwLock<Inner>>,
    /// The claim index, whose claims holding a replica of a group count against its room
    /// (`capi::room`). None where no claims are made (tools, benchmarks): replicas alone.
    claims: Option<Arc<RwLock<Claims>>>,
}

impl CatalogView {
    /// A view whose offerings count the claims of `claims` holding a replica of their group.
    pub(crate) fn counting(claims: Arc<RwLock<Claims>>) -> Self {
        Self {
            claims: Some(claims),
            ..Self::default()
        }
    }

    /// Claims holding a replica, by group (read before the catalog's own lock, never inside it).
    fn holding(&self) -> room::Holding {
        self.claims
            .as_ref()
            .map(|c| c.read().holding())
            .unwrap_or_default()
    }

    pub(crate) fn mark_unavailable(&self, md: &str, ttl: Duration) {
        self.inner
            .write()
            .unavailable
            .insert(md.to_string(), Instant::now() + ttl);
    }

    pub(crate) fn is_unavailable(&self, md: &str) -> bool {
        self.inner
            .read()
            .unavailable
            .get(md)
            .is_some_and(|until| *until > Instant::now())
    }

    pub(crate) fn create_timeout(&self, nodeclass: &str) -> Option<Duration> {
        self.inner
            .read()
            .by_nodeclass
            .get(nodeclass)
            .and_then(|e| e.create_timeout)
    }

    /// The NodeClass's instance types, as a NodePool without labels an overlay names sees them.
    pub fn instance_types(&self, nodeclass: &str) -> Vec<InstanceType> {
        self.pool_instance_types(nodeclass, None)
    }

    /// The instance types `pool` takes from `nodeclass`, NodeOverlays applied as that pool sees
    /// them (its name and template labels), offerings recently marked unavailable so, and the
    /// claims not in a group's replicas yet counted in (`capi::room`).
    pub fn pool_instance_types(&self, nodeclass: &str, pool: Option<&str>) -> Vec<InstanceType> {
        let holding = self.holding();
        let inner = self.inner.read();
        let Some(catalog) = inner.catalog(nodeclass, pool) else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut types = catalog.instance_types.clone();
        for o in types.iter_mut().flat_map(|t| t.offerings.iter_mut()) {
            if inner
                .unavailable
                .get(&o.machine_deployment)
                .is_some_and(|until| *until > now)
            {
                o.available = false;
            }
            room::count_claims_of(o, &catalog.owned, &holding);
        }
        types
    }

    pub(crate) fn nodeclass_ready(&self, nodeclass: &str) -> Option<Result<(), String>> {
        self.inner
            .read()
            .by_nodeclass
            .get(nodeclass)
            .map(|e| e.ready.clone())
    }

    /// Every group the NodeClass selects, offered or not (None: no catalog published for it).
    /// A claim drifts for its group only when the group is not in here.
    pub(crate) fn selected(&self, nodeclass: &str) -> Option<HashSet<String>> {
        self.inner
            .read()
            .by_nodeclass
            .get(nodeclass)
            .map(|e| e.catalog.selected.iter().cloned().collect())
    }

    /// Why a selected group is left out with what it offers unknown (any NodeClass), if it is.
    pub fn unknown(&self, md: &str) -> Option<String> {
        self.inner
            .read()
            .by_nodeclass
            .values()
            .find_map(|e| e.catalog.unknown.get(md).cloned())
    }

    /// The selected groups of these NodeClasses whose template's first read has not answered
    /// yet: while there are any, the provisioner places nothing for them.
    pub(crate) fn unread<'n>(&self, nodeclasses: impl IntoIterator<Item = &'n str>) -> Vec<String> {
        let inner = self.inner.read();
        nodeclasses
            .into_iter()
            .filter_map(|nc| inner.by_nodeclass.get(nc))
            .flat_map(|e| e.catalog.unread.iter().cloned())
            .collect()
    }

    /// True for a MachinePool offered for scale-up only (`capi::offerings::scale_up_only`): no
    /// instance of it can be removed by name.
    pub(crate) fn scale_up_only(&self, md: &str) -> bool {
        self.inner
            .read()
            .by_nodeclass
            .values()
            .any(|e| e.catalog.scale_up_only.iter().any(|k| k == md))
    }

    /// The group a NodeClass offers for a shape of `spec.generate` that does not exist yet
    /// (created when a claim chooses it), by MachineDeployment key.
    pub(crate) fn to_generate(&self, md: &str) -> Option<crate::capi::generate::GroupPlan> {
        self.inner
            .read()
            .by_nodeclass
            .values()
            .find_map(|e| e.catalog.to_generate.get(md).cloned())
    }

    /// Record (or clear) why a NodeClass's `spec.generate` patches cannot be used.
    pub(crate) fn refuse_generation(&self, nodeclass: &str, why: Option<String>) {
        let mut inner = self.inner.write();
        match why {
            Some(w) => inner.generation_refused.insert(nodeclass.to_string(), w),
            None => inner.generation_refused.remove(nodeclass),
        };
    }

    pub(crate) fn generation_refused(&self) -> HashMap<String, String> {
        self.inner.read().generation_refused.clone()
    }

    /// Every NodeClass's `spec.generate` plans not created yet, and the generated groups that
    /// exist, as the last rebuild saw them (the Generator's status and sweep read it).
    pub(crate) fn generated(&self) -> Vec<GeneratedOf> {
        self.inner
            .read()
            .by_nodeclass
            .iter()
            .filter(|(_, e)| e.catalog.generation.is_some())
            .map(|(n, e)| {
                (
                    n.clone(),
                    e.catalog.generated.clone(),
                    e.catalog.generation.clone(),
                )
            })
            .collect()
    }

    /// The offering backed by a MachineDeployment (any NodeClass), for a claim's status.
    pub fn offering(&self, md: &str) -> Option<Choice> {
        self.pool_offering(md, None)
    }

    /// The offering backed by a MachineDeployment as `pool` sees it (its price and capacity
    /// after the NodeOverlays that select it for that pool).
    pub(crate) fn pool_offering(&self, md: &str, pool: Option<&str>) -> Option<Choice> {
        let inner = self.inner.read();
        let find = |c: &offerings::Catalog| {
            c.instance_types.iter().find_map(|t| {
                t.offerings
                    .iter()
                    .find(|o| o.machine_deployment == md)
                    .map(|o| choice(t, o))
            })
        };
        pool.and_then(|p| inner.by_pool.get(p))
            .and_then(|(_, c)| find(c))
            .or_else(|| inner.by_nodeclass.values().find_map(|e| find(&e.catalog)))
    }

    /// The NodeOverlay that set a MachineDeployment's price for `pool` (None: as a pool without
    /// labels an overlay names sees it), with the price before it.
    pub(crate) fn price_overlay(
        &self,
        md: &str,
        pool: Option<&str>,
    ) -> Option<crate::capi::overlay::PriceOverlaid> {
        let inner = self.inner.read();
        match pool.and_then(|p| inner.by_pool.get(p)) {
            Some((_, c)) if c.deployments.iter().any(|d| d == md) => {
                c.price_overlays.get(md).cloned()
            }
            _ => inner
                .by_nodeclass
                .values()
                .find_map(|e| e.catalog.price_overlays.get(md).cloned()),
        }
    }

    /// The cheapest available offering compatible with the claim of `pool` (its prices after the
    /// NodeOverlays as that pool sees them); ties go to the least-loaded MachineDeployment.
    pub fn resolve(
        &self,
        nodeclass: &str,
        pool: Option<&str>,
        reqs: &Requirements,
        requests: &Resources,
        excluded: &HashSet<String>,
        declared_taints: &[Taint],
    ) -> Result<Choice, ResolveError> {
        let holding = self.holding();
        let inner = self.inner.read();
        let Some(entry) = inner.by_nodeclass.get(nodeclass) else {
            return Err(ResolveError::NodeClassNotFound(nodeclass.to_string()));
        };
        if let Err(message) = &entry.ready
            && entry.catalog.instance_types.is_empty()
        {
            return Err(ResolveError::NodeClassNotReady {
                name: nodeclass.to_string(),
                message: message.clone(),
            });
        }
        let now = Instant::now();
        let catalog = inner.catalog(nodeclass, pool).unwrap_or(&entry.catalog);
        let is_unavailable = |o: &crate::scheduling::Offering| {
            !o.available
                || !room::fits_one_more_of(o, &catalog.owned, &holding)
                || excluded.contains(&o.machine_deployment)
                || inner
                    .unavailable
                    .get(&o.machine_deployment)
                    .is_some_and(|u| *u > now)
        };
        let ranked = rank(
            &catalog.instance_types,
            reqs,
            requests,
            declared_taints,
            &is_unavailable,
        );
        let count = |fit: Fit| ranked.iter().filter(|r| r.fit == fit).count();
        match ranked.iter().find(|r| r.fit == Fit::Eligible) {
            Some(r) => {
                min_values_met(&ranked, reqs).map_err(|source| ResolveError::MinValues {
                    nodeclass: nodeclass.to_string(),
                    source,
                })?;
                Ok(choice(r.instance_type, r.offering))
            }
            // A pool that may serve the claim is not read yet (right after a start): wait for
            // it rather than find the claim unlaunchable.
            None if !catalog.pending.is_empty() => Err(ResolveError::PoolsPending {
                nodeclass: nodeclass.to_string(),
                pending: catalog.pending.len(),
            }),
            None => Err(ResolveError::NoCompatibleOffering {
                nodeclass: nodeclass.to_string(),
                details: format!(
                    "{} offerings incompatible with the requirements or carrying taints the NodePool does not declare, {} too small for the requests, {} unavailable (max-size reached, MachineDeployment paused, or recently failed)",
                    count(Fit::Incompatible),
                    count(Fit::TooSmall),
                    count(Fit::Unavailable)
                ),
            }),
        }
    }

    /// Publish a NodeClass's catalog with its readiness (the Catalog actor, after a rebuild).
    pub(crate) fn publish(
        &self,
        nodeclass: String,
        catalog: offerings::Catalog,
        create_timeout: Option<Duration>,
        ready: Result<(), String>,
    ) {
        let entry = Entry {
            catalog: Arc::new(catalog),
            create_timeout,
            ready,
        };
        self.inner.write().by_nodeclass.insert(nodeclass, entry);
    }

    /// Publish the catalogs NodePools see where NodeOverlays make them differ from their
    /// NodeClass's (pool name -> (NodeClass, catalog)); every other pool's entry goes.
    pub fn publish_pools(&self, pools: PoolCatalogs) {
        self.inner.write().by_pool = pools;
    }

    /// Publish the MachinePools' infrastructure pool hashes (`TemplateCapacity::instance_hash`).
    pub(crate) fn publish_instance_hashes(&self, hashes: HashMap<String, String>) {
        self.inner.write().instance_hashes = hashes;
    }

    /// The hash of MachinePool `md`'s infrastructure pool instance fields, as last read.
    pub(crate) fn instance_hash(&self, md: &str) -> Option<String> {
        self.inner.read().instance_hashes.get(md).cloned()
    }

    /// Publish a NodeClass's catalog directly (benchmarks and tools that have no Catalog actor).
    pub fn insert(
        &self,
        nodeclass: &str,
        catalog: offerings::Catalog,
        create_timeout: Option<Duration>,
    ) {
        let ready = readiness(&catalog);
        self.publish(nodeclass.to_string(), catalog, create_timeout, ready);
    }

    /// Drop unavailability marks that expired (keyed by MachineDeployment; they would pile up).
    pub(crate) fn forget_unavailable(&self) {
        let now = Instant::now();
        self.inner
            .write()
            .unavailable
            .retain(|_, until| *until > now);
    }

    /// Keep only these NodeClasses (the others are gone).
    pub(crate) fn retain(&self, names: &HashSet<String>) {
        let mut inner = self.inner.write();
        inner.by_nodeclass.retain(|k, _| names.contains(k));
        inner.by_pool.retain(|_, (nc, _)| names.contains(nc));
    }
}

/// The catalogs NodePools see where NodeOverlays make them differ from their NodeClass's: pool
/// name -> (NodeClass, catalog), as [`CatalogView::publish_pools`] takes them.
pub(crate) type PoolCatalogs = HashMap<String, (String, Arc<offerings::Catalog>)>;

/// Applies the NodeOverlays to the NodeClass catalogs about to be published (by NodeClass name)
/// as `nodepools` see them: each catalog changed in place as a pool without labels an overlay
/// names sees it, the catalogs of the pools that see theirs differently, and each overlay's
/// verdict. The Catalog actor runs it on every rebuild; `explain` on its one-off read.
pub fn apply_overlays(
    overlays: &[&NodeOverlay],
    catalogs: Vec<(&str, &mut offerings::Catalog)>,
    nodepools: &[Arc<NodePool>],
) -> (BTreeMap<String, Verdict>, PoolCatalogs) {
    let names: Vec<&str> = catalogs.iter().map(|(n, _)| *n).collect();
    let pools = overlay::pools_of(nodepools.iter().map(|p| p.as_ref()), &names);
    let mut each: Vec<&mut offerings::Catalog> = catalogs.into_iter().map(|(_, c)| c).collect();
    let applied = overlay::apply(overlays, &mut each, &pools);
    let by_pool = pools
        .iter()
        .filter_map(|p| {
            let own = applied.pools.get(p.name)?.clone();
            Some((p.name.to_string(), (names[p.catalog].to_string(), own)))
        })
        .collect();
    (applied.verdicts, by_pool)
}

/// A pool's (or claim's) taints and startup taints together.
pub(crate) fn declared_taints(
    taints: &Option<Vec<Taint>>,
    startup: &Option<Vec<Taint>>,
) -> Vec<Taint> {
    taints
        .iter()
        .chain(startup.iter())
        .flatten()
        .cloned()
        .collect()
}

/// How one offering stands for a launch, in the order the launch checks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fit {
    /// The launch may use it.
    Eligible,
    /// Its instance type's allocatable cannot hold the claim's requests.
    TooSmall,
    /// Its labels do not meet the claim's requirements, or its nodes carry taints the claim
    /// does not declare.
    Incompatible,
    /// Max size reached, paused, recently failed, or already turned the claim down.
    Unavailable,
}

/// One offering judged for a launch.
pub(crate) struct Ranked<'a> {
    pub(crate) instance_type: &'a InstanceType,
    pub(crate) offering: &'a crate::scheduling::Offering,
    pub(crate) fit: Fit,
    /// Replicas over max size (or replicas, without one): ties on price go to the least loaded.
    pub(crate) load: f64,
}

/// Every offering of `types` judged for a claim with `reqs`, `requests` and declared taints,
/// eligible ones first in the launch's order of preference (price, then load, then
/// MachineDeployment name): the first is what a launch takes. Pure: `resolve` and `explain` use
/// it alike.
pub(crate) fn rank<'a>(
    types: &'a [InstanceType],
    reqs: &Requirements,
    requests: &Resources,
    declared_taints: &[Taint],
    unavailable: &dyn Fn(&crate::scheduling::Offering) -> bool,
) -> Vec<Ranked<'a>> {
    let mut out: Vec<Ranked<'a>> = Vec::new();
    for t in types {
        let fits = requests.fits(&t.allocatable());
        for o in &t.offerings {
            let fit = if !fits {
                Fit::TooSmall
            } else if Requirements::from_labels(&o.labels)
                .compatible(reqs)
                .is_err()
                || !crate::scheduling::instance_type::taints_declared(o, declared_taints)
            {
                Fit::Incompatible
            } else if unavailable(o) {
                Fit::Unavailable
            } else {
                Fit::Eligible
            };
            let load = match o.max_size {
                Some(max) if max > 0 => f64::from(o.replicas) / f64::from(max),
                _ => f64::from(o.replicas),
            };
            out.push(Ranked {
                instance_type: t,
                offering: o,
                fit,
                load,
            });
        }
    }
    out.sort_by(|a, b| {
        (a.fit != Fit::Eligible)
            .cmp(&(b.fit != Fit::Eligible))
            .then_with(|| a.offering.price.total_cmp(&b.offering.price))
            .then_with(|| a.load.total_cmp(&b.load))
            .then_with(|| {
                a.offering
                    .machine_deployment
                    .cmp(&b.offering.machine_deployment)
            })
    });
    out
}

/// The claim's minValues against the instance types a launch may use (those with an eligible
/// offering), as upstream's cloud provider checks them before it creates an instance: a key
/// counts the distinct values those types offer within the requirements.
pub(crate) fn min_values_met(
    ranked: &[Ranked<'_>],
    reqs: &Requirements,
) -> Result<(), MinValuesError> {
    if !reqs.iter().any(|r| r.min_values().is_some()) {
        return Ok(());
    }
    let mut types: Vec<&InstanceType> = Vec::new();
    for r in ranked.iter().filter(|r| r.fit == Fit::Eligible) {
        if !types.iter().any(|t| t.name == r.instance_type.name) {
            types.push(r.instance_type);
        }
    }
    reqs.check_min_values(|key| {
        crate::scheduling::instance_type::distinct_values(&types, reqs, key)
    })
}

fn choice(t: &InstanceType, o: &crate::scheduling::Offering) -> Choice {
    Choice {
        machine_deployment: o.machine_deployment.clone(),
        instance_type: t.name.clone(),
        zone: o.zone.clone(),
        capacity_type: o.capacity_type.clone(),
        price: o.price,
        capacity: t.capacity.clone(),
        allocatable: t.allocatable(),
        labels: o.labels.clone(),
    }
}

#[cfg(test)]
mod tests;
