//! NodeOverlays applied to the catalog, as upstream's overlay store applies them to the
//! instance types each NodePool sees: overlays in weight order (higher first; at equal weight
//! the name later in the alphabet first), each validated, then checked for a conflict with an
//! overlay of the same weight that already changes the same offering's price or the same
//! extended resource for some NodePool, and only then recorded for every NodePool (never in
//! part). The first price recorded for an offering is the one that applies, so only the
//! highest-weight price overlay counts; capacity merges, a resource set by a higher weight
//! standing.
//!
//! An offering here is one MachineDeployment; an overlay selects it for a NodePool when every
//! requirement holds on the labels the pool's nodes from it will carry: the offering's
//! (instance type, zone, capacity type, arch, os and the MachineDeployment's node labels), the
//! pool's template labels and `karpenter.sh/nodepool`. A key the nodes do not carry matches only
//! `NotIn` and `DoesNotExist`, as upstream's compatibility check treats an undefined label (and
//! a key the pool and the offering set to different values, as upstream's empty intersection).
//!
//! Pools share their NodeClass's catalog: only where an overlay's requirements name
//! `karpenter.sh/nodepool` or a key of a pool's template labels does a pool get a catalog of its
//! own, one per distinct set of those labels, so the common case costs no copy at all.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::api::nodeclaim::NodeSelectorRequirementWithMinValues;
use crate::api::nodeoverlay::{NodeOverlay, PriceChange, price_change};
use crate::api::nodepool::NodePool;
use crate::api::requirements::Requirements;
use crate::api::resources::{Quantity, Resources};
use crate::api::validate_nodeoverlay;
use crate::api::wellknown::{NODECLASS_GROUP, NODECLASS_KIND, NODEPOOL_LABEL};
use crate::capi::offerings::Catalog;
pub(crate) use crate::capi::offerings::PriceOverlaid;
use crate::scheduling::Offering;

/// What became of one overlay.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Valid and recorded (whether or not it selects anything).
    Applied,
    /// Runtime validation refused it: the message names the fields.
    Invalid(String),
    /// An overlay of the same weight, evaluated first, already changes what this one would.
    Conflict { with: BTreeSet<String> },
}

impl Verdict {
    /// The condition reason and message upstream writes for this verdict (none when applied).
    pub fn failure(&self) -> Option<(&'static str, String)> {
        use crate::api::nodeoverlay::{REASON_CONFLICT, REASON_RUNTIME_VALIDATION};
        match self {
            Verdict::Applied => None,
            Verdict::Invalid(m) => Some((REASON_RUNTIME_VALIDATION, m.clone())),
            Verdict::Conflict { with } => Some((
                REASON_CONFLICT,
                format!(
                    "conflict with another overlay: {} (same weight, evaluated first)",
                    with.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            )),
        }
    }
}

/// A NodePool as overlays see it: its name, its template's labels, and which of the catalogs
/// passed to [`apply`] is its NodeClass's.
#[derive(Clone, Debug)]
pub struct Pool<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub catalog: usize,
}

/// The NodePools that take their instance types from one of `nodeclasses` (by name, in the
/// order of the catalogs), as [`apply`] wants them. Upstream lists every NodePool; one whose
/// NodeClass is not ours or not there has no instance types to overlay.
pub(crate) fn pools_of<'a>(
    nodepools: impl IntoIterator<Item = &'a NodePool>,
    nodeclasses: &[&str],
) -> Vec<Pool<'a>> {
    static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
    nodepools
        .into_iter()
        .filter_map(|np| {
            let r = &np.spec.template.spec.node_class_ref;
            if r.group != NODECLASS_GROUP || r.kind != NODECLASS_KIND {
                return None;
            }
            let catalog = nodeclasses.iter().position(|n| *n == r.name)?;
            Some(Pool {
                name: np.metadata.name.as_deref()?,
                labels: np
                    .spec
                    .template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.labels.as_ref())
                    .unwrap_or(&NO_LABELS),
                catalog,
            })
        })
        .collect()
}

/// What applying the overlays decided, besides the NodeClass catalogs changed in place.
#[derive(Debug, Default)]
pub struct Applied {
    /// Each overlay's verdict, by name.
    pub verdicts: BTreeMap<String, Verdict>,
    /// The catalog a NodePool sees, for the pools that see their NodeClass's differently (an
    /// overlay names `karpenter.sh/nodepool` or one of their template labels); pools with the
    /// same such labels share one. Every other pool sees its NodeClass's catalog as changed.
    pub pools: BTreeMap<String, Arc<Catalog>>,
}

impl Applied {
    /// The catalog `pool` sees, given its NodeClass's (`nodeclass`, as changed in place).
    pub fn seen_by<'c>(&'c self, pool: &str, nodeclass: &'c Catalog) -> &'c Catalog {
        self.pools.get(pool).map_or(nodeclass, |c| c.as_ref())
    }
}

/// A validated overlay, ready to match.
struct Parsed<'a> {
    name: &'a str,
    weight: i32,
    requirements: Requirements,
    price: Option<PriceChange>,
    capacity: Resources,
}

/// The price recorded for one offering.
struct PriceSlot {
    change: PriceChange,
    owner: String,
    /// The weight and name of the last overlay recorded here (what an overlay of equal weight
    /// conflicts with).
    lowest_weight: i32,
    lowest_name: String,
}

/// The capacity recorded for one instance type.
struct CapacitySlot {
    update: Resources,
    lowest_weight: i32,
    lowest_resources: BTreeSet<String>,
    lowest_name: String,
}

/// Upstream's store for one NodePool: prices by MachineDeployment, capacity by instance type.
#[derive(Default)]
struct Store {
    prices: HashMap<String, PriceSlot>,
    capacity: HashMap<String, CapacitySlot>,
}

/// The NodePools that see one catalog alike: those of one NodeClass whose labels the overlays
/// name are the same (`labels`, with `karpenter.sh/nodepool` among them when an overlay names
/// it). The first group of each catalog has no such labels: the NodeClass's own view, which
/// pools without such labels, and readers without a pool, see.
struct Group {
    catalog: usize,
    labels: BTreeMap<String, String>,
    /// Some NodePool sees the catalog this way: upstream evaluates conflicts only there.
    evaluated: bool,
    store: Store,
}

/// Applies `overlays` to `catalogs` as the NodePools in `pools` see them: prices and capacity
/// changed in place for each NodeClass's own view, a catalog of its own for each pool that sees
/// it differently, and each overlay's verdict by name.
pub fn apply(
    overlays: &[&NodeOverlay],
    catalogs: &mut [&mut Catalog],
    pools: &[Pool<'_>],
) -> Applied {
    let mut sorted: Vec<&NodeOverlay> = overlays.to_vec();
    sorted.sort_by(|a, b| {
        b.weight()
            .cmp(&a.weight())
            .then_with(|| b.metadata.name.cmp(&a.metadata.name))
    });
    let parsed: Vec<(String, Result<Parsed<'_>, String>)> = sorted
        .into_iter()
        .map(|o| (o.metadata.name.clone().unwrap_or_default(), parse(o)))
        .collect();
    let named: BTreeSet<&str> = parsed
        .iter()
        .filter_map(|(_, p)| p.as_ref().ok())
        .flat_map(|p| p.requirements.keys())
        .collect();
    let (mut groups, of_pool) = group(pools, catalogs.len(), &named);
    let mut verdicts = BTreeMap::new();
    for (name, p) in parsed {
        let verdict = match p {
            Err(message) => Verdict::Invalid(message),
            Ok(p) => {
                let with: BTreeSet<String> = groups
                    .iter()
                    .filter(|g| g.evaluated)
                    .flat_map(|g| conflicts(g, &p, catalogs[g.catalog]))
                    .collect();
                if with.is_empty() {
                    for g in &mut groups {
                        let catalog: &Catalog = catalogs[g.catalog];
                        record(g, &p, catalog);
                    }
                    Verdict::Applied
                } else {
                    Verdict::Conflict { with }
                }
            }
        };
        verdicts.insert(name, verdict);
    }
    // The pools' own catalogs are copied from the NodeClass's before its own view is written.
    let own: Vec<Option<Arc<Catalog>>> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            (i >= catalogs.len()).then(|| {
                let mut c = catalogs[g.catalog].clone();
                write(&g.store, &mut c);
                Arc::new(c)
            })
        })
        .collect();
    for (g, catalog) in groups.iter().zip(catalogs.iter_mut()) {
        write(&g.store, catalog);
    }
    let pools = of_pool
        .into_iter()
        .filter_map(|(pool, g)| Some((pool.to_string(), own[g].clone()?)))
        .collect();
    Applied { verdicts, pools }
}

/// The groups of NodePools that see a catalog alike (one per catalog first, for its own view),
/// and each pool's group.
fn group<'p>(
    pools: &[Pool<'p>],
    catalogs: usize,
    named: &BTreeSet<&str>,
) -> (Vec<Group>, Vec<(&'p str, usize)>) {
    let mut groups: Vec<Group> = (0..catalogs)
        .map(|catalog| Group {
            catalog,
            labels: BTreeMap::new(),
            evaluated: false,
            store: Store::default(),
        })
        .collect();
    let mut index: HashMap<(usize, BTreeMap<String, String>), usize> = HashMap::new();
    let mut of_pool = Vec::new();
    for p in pools.iter().filter(|p| p.catalog < catalogs) {
        let mut labels: BTreeMap<String, String> = p
            .labels
            .iter()
            .filter(|(k, _)| named.contains(k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if named.contains(NODEPOOL_LABEL) {
            labels.insert(NODEPOOL_LABEL.to_string(), p.name.to_string());
        }
        let g = if labels.is_empty() {
            p.catalog
        } else {
            *index.entry((p.catalog, labels.clone())).or_insert_with(|| {
                groups.push(Group {
                    catalog: p.catalog,
                    labels,
                    evaluated: false,
                    store: Store::default(),
                });
                groups.len() - 1
            })
        };
        groups[g].evaluated = true;
        of_pool.push((p.name, g));
    }
    (groups, of_pool)
}

fn parse(o: &NodeOverlay) -> Result<Parsed<'_>, String> {
    validate_nodeoverlay(o).map_err(|e| e.to_string())?;
    let reqs: Vec<NodeSelectorRequirementWithMinValues> = o
        .spec
        .requirements
        .iter()
        .map(|r| NodeSelectorRequirementWithMinValues {
            key: r.key.clone(),
            operator: r.operator,
            values: r.values.clone(),
            min_values: None,
        })
        .collect();
    let requirements = Requirements::from_node_selector_requirements(&reqs)
        .map_err(|e| format!("spec.requirements: {e}"))?;
    let price = price_change(&o.spec).map_err(|e| e.to_string())?;
    let mut capacity = Resources::new();
    for (k, q) in o.spec.capacity.iter().flatten() {
        let q = Quantity::from_k8s(q).map_err(|e| format!("spec.capacity[{k:?}]: {e}"))?;
        capacity.set(k.clone(), q);
    }
    Ok(Parsed {
        name: o.metadata.name.as_deref().unwrap_or_default(),
        weight: o.weight(),
        requirements,
        price,
        capacity,
    })
}

/// True when the overlay's requirements hold on the labels a node of the group's pools from
/// this offering will carry: the pools' labels the overlays name, and the offering's.
fn selects(reqs: &Requirements, pool: &BTreeMap<String, String>, o: &Offering) -> bool {
    reqs.iter().all(|r| {
        let value = match (pool.get(r.key()), o.labels.get(r.key())) {
            (Some(a), Some(b)) if a != b => None,
            (Some(a), _) => Some(a),
            (None, b) => b,
        };
        match value {
            Some(v) => r.has(v),
            None => r.allows_absent(),
        }
    })
}

/// Each (type name, matched offerings) the overlay selects in the group's view of `catalog`.
fn selected<'c>(
    p: &Parsed<'_>,
    g: &Group,
    catalog: &'c Catalog,
) -> Vec<(&'c str, Vec<&'c Offering>)> {
    let mut out = Vec::new();
    for t in &catalog.instance_types {
        let matched: Vec<&Offering> = t
            .offerings
            .iter()
            .filter(|o| selects(&p.requirements, &g.labels, o))
            .collect();
        if !matched.is_empty() {
            out.push((t.name.as_str(), matched));
        }
    }
    out
}

/// The overlays of equal weight, recorded before in this group, that already change what `p`
/// would.
fn conflicts(g: &Group, p: &Parsed<'_>, catalog: &Catalog) -> BTreeSet<String> {
    let mut with = BTreeSet::new();
    for (type_name, offerings) in selected(p, g, catalog) {
        if p.price.is_some() {
            for o in offerings {
                if let Some(s) = g.store.prices.get(&o.machine_deployment)
                    && s.lowest_weight == p.weight
                {
                    with.insert(s.lowest_name.clone());
                }
            }
        }
        if !p.capacity.is_empty()
            && let Some(s) = g.store.capacity.get(type_name)
            && s.lowest_weight == p.weight
            && p.capacity
                .iter()
                .any(|(k, _)| s.lowest_resources.contains(k))
        {
            with.insert(s.lowest_name.clone());
        }
    }
    with
}

fn record(g: &mut Group, p: &Parsed<'_>, catalog: &Catalog) {
    let selected = selected(p, g, catalog);
    let store = &mut g.store;
    for (type_name, offerings) in selected {
        if let Some(change) = p.price {
            for o in offerings {
                store
                    .prices
                    .entry(o.machine_deployment.clone())
                    .and_modify(|s| {
                        s.lowest_weight = p.weight;
                        s.lowest_name = p.name.to_string();
                    })
                    .or_insert_with(|| PriceSlot {
                        change,
                        owner: p.name.to_string(),
                        lowest_weight: p.weight,
                        lowest_name: p.name.to_string(),
                    });
            }
        }
        if !p.capacity.is_empty() {
            let keys: BTreeSet<String> = p.capacity.iter().map(|(k, _)| k.to_string()).collect();
            let slot = store
                .capacity
                .entry(type_name.to_string())
                .or_insert_with(|| CapacitySlot {
                    update: Resources::new(),
                    lowest_weight: p.weight,
                    lowest_resources: BTreeSet::new(),
                    lowest_name: String::new(),
                });
            for (k, q) in p.capacity.iter() {
                if !slot.update.0.contains_key(k) {
                    slot.update.set(k, *q);
                }
            }
            slot.lowest_weight = p.weight;
            slot.lowest_resources = keys;
            slot.lowest_name = p.name.to_string();
        }
    }
}

/// Writes the recorded changes into a catalog.
fn write(store: &Store, catalog: &mut Catalog) {
    catalog.price_overlays.clear();
    for t in &mut catalog.instance_types {
        if let Some(s) = store.capacity.get(&t.name) {
            for (k, q) in s.update.iter() {
                t.capacity.set(k, *q);
            }
        }
        for o in &mut t.offerings {
            if let Some(s) = store.prices.get(&o.machine_deployment) {
                catalog.price_overlays.insert(
                    o.machine_deployment.clone(),
                    PriceOverlaid {
                        overlay: s.owner.clone(),
                        base_price: o.price,
                        change: s.change,
                    },
                );
                o.price = s.change.apply(o.price);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::wellknown::INSTANCE_TYPE_LABEL;

    const GPU: &str = "nvidia.com/gpu";

    /// A type whose MachineDeployment already states one GPU, and one without any.
    fn catalog() -> Catalog {
        let mut gpu = crate::testing::instance_type("gpu", 4, 16).build();
        gpu.capacity.set(GPU, Quantity::from_units(1));
        Catalog {
            instance_types: vec![gpu, crate::testing::instance_type("plain", 4, 16).build()],
            ..Default::default()
        }
    }

    /// Karpenter v1.15's #3151 made an override replace, key by key, what it names (its
    /// offering capacity and overhead overrides had added to the base); a NodeOverlay's capacity
    /// always did, and does here: a GPU count stated again is the new count, not one more.
    #[test]
    fn overlay_capacity_replaces_what_the_type_states_key_by_key() {
        let mut c = catalog();
        let o = crate::testing::node_overlay(
            "gpus",
            serde_json::json!({
                "requirements": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": ["gpu", "plain"]}],
                "capacity": {GPU: "4"},
            }),
        );
        let labels = BTreeMap::new();
        let pools = [Pool {
            name: "default",
            labels: &labels,
            catalog: 0,
        }];
        let applied = apply(&[&o], &mut [&mut c], &pools);
        assert_eq!(applied.verdicts.get("gpus"), Some(&Verdict::Applied));
        for t in &c.instance_types {
            assert_eq!(t.capacity.get(GPU), Quantity::from_units(4), "{}", t.name);
            assert_eq!(
                t.allocatable().get(GPU),
                Quantity::from_units(4),
                "{}",
                t.name
            );
            // What the overlay does not name stays as the type states it.
            assert_eq!(t.capacity.get("cpu"), Quantity::from_units(4), "{}", t.name);
        }
    }
}
