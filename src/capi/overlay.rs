//! NodeOverlays applied to the catalog, as upstream's overlay store applies them to instance
//! types: overlays in weight order (higher first; at equal weight the name later in the
//! alphabet first), each validated, then checked for a conflict with an overlay of the same
//! weight that already changes the same offering's price or the same extended resource, and
//! only then recorded. The first price recorded for an offering is the one that applies, so
//! only the highest-weight price overlay counts; capacity merges, a resource set by a higher
//! weight standing.
//!
//! An offering here is one MachineDeployment; an overlay selects it when every requirement
//! holds on the labels its nodes will carry (instance type, zone, capacity type, arch, os and
//! the MachineDeployment's node labels). A key the nodes do not carry matches only `NotIn` and
//! `DoesNotExist`, as upstream's compatibility check treats an undefined label.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::api::nodeclaim::NodeSelectorRequirementWithMinValues;
use crate::api::nodeoverlay::{NodeOverlay, PriceChange, price_change};
use crate::api::requirements::Requirements;
use crate::api::resources::{Quantity, Resources};
use crate::api::validate_nodeoverlay;
use crate::capi::offerings::Catalog;
pub use crate::capi::offerings::PriceOverlaid;
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

/// Offering slots are keyed by (catalog index, MachineDeployment); an instance type's by
/// (catalog index, type name): two NodeClasses may select the same MachineDeployment.
#[derive(Default)]
struct Store {
    prices: HashMap<(usize, String), PriceSlot>,
    capacity: HashMap<(usize, String), CapacitySlot>,
}

/// Applies `overlays` to `catalogs` in place (prices and capacity), recording on each catalog
/// which offerings an overlay priced, and returns each overlay's verdict by name.
pub fn apply(
    overlays: &[&NodeOverlay],
    catalogs: &mut [&mut Catalog],
) -> BTreeMap<String, Verdict> {
    let mut sorted: Vec<&NodeOverlay> = overlays.to_vec();
    sorted.sort_by(|a, b| {
        b.weight()
            .cmp(&a.weight())
            .then_with(|| b.metadata.name.cmp(&a.metadata.name))
    });
    let mut verdicts = BTreeMap::new();
    let mut store = Store::default();
    for o in sorted {
        let name = o.metadata.name.clone().unwrap_or_default();
        let verdict = match parse(o) {
            Err(message) => Verdict::Invalid(message),
            Ok(p) => {
                let with = conflicts(&store, &p, catalogs);
                if with.is_empty() {
                    record(&mut store, &p, catalogs);
                    Verdict::Applied
                } else {
                    Verdict::Conflict { with }
                }
            }
        };
        verdicts.insert(name, verdict);
    }
    for (i, catalog) in catalogs.iter_mut().enumerate() {
        write(&store, i, catalog);
    }
    verdicts
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

/// True when the overlay's requirements hold on the labels the offering's nodes will carry.
fn selects(reqs: &Requirements, o: &Offering) -> bool {
    reqs.iter().all(|r| match o.labels.get(r.key()) {
        Some(v) => r.has(v),
        None => r.allows_absent(),
    })
}

/// Each (catalog, type index, matched offering indexes) the overlay selects.
fn selected<'c>(
    p: &Parsed<'_>,
    catalogs: &'c [&mut Catalog],
) -> Vec<(usize, &'c str, Vec<&'c Offering>)> {
    let mut out = Vec::new();
    for (i, c) in catalogs.iter().enumerate() {
        for t in &c.instance_types {
            let matched: Vec<&Offering> = t
                .offerings
                .iter()
                .filter(|o| selects(&p.requirements, o))
                .collect();
            if !matched.is_empty() {
                out.push((i, t.name.as_str(), matched));
            }
        }
    }
    out
}

/// The overlays of equal weight, recorded before, that already change what `p` would.
fn conflicts(store: &Store, p: &Parsed<'_>, catalogs: &[&mut Catalog]) -> BTreeSet<String> {
    let mut with = BTreeSet::new();
    for (i, type_name, offerings) in selected(p, catalogs) {
        if p.price.is_some() {
            for o in offerings {
                if let Some(s) = store.prices.get(&(i, o.machine_deployment.clone()))
                    && s.lowest_weight == p.weight
                {
                    with.insert(s.lowest_name.clone());
                }
            }
        }
        if !p.capacity.is_empty()
            && let Some(s) = store.capacity.get(&(i, type_name.to_string()))
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

fn record(store: &mut Store, p: &Parsed<'_>, catalogs: &[&mut Catalog]) {
    for (i, type_name, offerings) in selected(p, catalogs) {
        if let Some(change) = p.price {
            for o in offerings {
                store
                    .prices
                    .entry((i, o.machine_deployment.clone()))
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
                .entry((i, type_name.to_string()))
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

/// Writes the recorded changes into catalog `i`.
fn write(store: &Store, i: usize, catalog: &mut Catalog) {
    catalog.price_overlays.clear();
    for t in &mut catalog.instance_types {
        if let Some(s) = store.capacity.get(&(i, t.name.clone())) {
            for (k, q) in s.update.iter() {
                t.capacity.set(k, *q);
            }
        }
        for o in &mut t.offerings {
            if let Some(s) = store.prices.get(&(i, o.machine_deployment.clone())) {
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
