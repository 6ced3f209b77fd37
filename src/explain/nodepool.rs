//! `explain nodepool NAME`: the offerings its ClusterAPINodeClass resolves to (the catalog's
//! own build), which of them the NodePool can use, every MachineDeployment or offering left
//! out and why, and its usage against its limits.

use std::collections::BTreeMap;
use std::fmt;

use kube::ResourceExt;
use serde::Serialize;

use super::cluster::{Cluster, Resolved};
use super::{Error, OfferingView};
use crate::api::requirements::Requirements;
use crate::api::resources::Quantity;
use crate::capi::model::LabelSelector;
use crate::capi::offerings::not_selected;
use crate::scheduling::instance_type::{offering_allowed, taints_declared};
use crate::scheduling::nodepool_requirements;
use crate::view::catalog::declared_taints;
use crate::view::usage::usage_by_pool;

#[derive(Debug, Serialize)]
pub(crate) struct NodePoolReport {
    pub(crate) nodepool: String,
    pub(crate) nodeclass: String,
    /// Whether the NodeClass resolves to at least one offering.
    pub(crate) nodeclass_ready: bool,
    /// Why not, when it does not.
    pub(crate) nodeclass_problem: Option<String>,
    /// Offerings the NodePool can launch from (unavailable ones included, marked).
    pub(crate) offerings: Vec<OfferingView>,
    /// Instance types with at least one available usable offering.
    pub(crate) instance_types: Vec<String>,
    pub(crate) left_out: Vec<LeftOut>,
    /// Per limited resource (and `nodes`): (used, limit).
    pub(crate) usage: BTreeMap<String, Usage>,
    /// Instances deleted claims handed back to pools without MachinePool Machines, still
    /// running (paid for) until the next claim on the pool takes one or the pool shrinks.
    pub(crate) handed_back: Vec<HandedBack>,
    /// Things the read could not see or check.
    pub(crate) notes: Vec<String>,
}

/// A MachineDeployment or an offering the NodePool cannot use.
#[derive(Debug, Serialize)]
pub(crate) struct LeftOut {
    pub(crate) machine_deployment: String,
    pub(crate) reason: String,
}

/// A pool's handed-back instances, at the pool's price each.
#[derive(Debug, Serialize)]
pub(crate) struct HandedBack {
    pub(crate) machine_deployment: String,
    pub(crate) instances: Vec<String>,
    pub(crate) price_each: f64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Usage {
    pub(crate) used: String,
    pub(crate) limit: Option<String>,
}

pub(crate) fn explain(cluster: &Cluster, name: &str) -> Result<NodePoolReport, Error> {
    let np = cluster
        .state
        .nodepools
        .read()
        .get(name)
        .cloned()
        .ok_or(Error::NotFound {
            kind: "NodePool",
            name: name.to_string(),
        })?;
    let nodeclass = np.spec.template.spec.node_class_ref.name.clone();
    let mut notes: Vec<String> = cluster
        .malformed
        .iter()
        .map(|(kind, n, why)| format!("{kind} {n} cannot be read: {why}"))
        .collect();
    let resolved = cluster.nodeclasses.get(&nodeclass);
    let nodeclass_ready = nodeclass_readiness(cluster, &nodeclass, resolved);
    let mut left_out = excluded(cluster);
    let mut usable = Usable::default();
    if let Some(r) = resolved {
        left_out.extend(not_selected_by(cluster, &nodeclass, r));
        left_out.extend(catalog_problems(r));
        let reqs = pool_requirements(&np, &mut notes);
        usable = usable_offerings(cluster, &np, &reqs);
        left_out.append(&mut usable.left_out);
        notes.extend(unreadable_templates(cluster, r));
    }
    left_out.sort_by(|a, b| a.machine_deployment.cmp(&b.machine_deployment));
    notes.push(
        "offerings the controller marked unavailable after a failed launch are known only to \
         the running controller and are shown here as available"
            .into(),
    );
    let handed_back = handed_back(cluster, &usable.offerings);
    Ok(NodePoolReport {
        handed_back,
        nodepool: np.name_any(),
        nodeclass,
        nodeclass_ready: nodeclass_ready.is_ok(),
        nodeclass_problem: nodeclass_ready.err(),
        offerings: usable.offerings,
        instance_types: usable.instance_types,
        left_out,
        usage: usage(cluster, &np),
        notes,
    })
}

/// Whether the NodeClass resolves to offerings, and why not.
fn nodeclass_readiness(
    cluster: &Cluster,
    nodeclass: &str,
    resolved: Option<&Resolved>,
) -> Result<(), String> {
    match resolved {
        None => Err(format!("ClusterAPINodeClass {nodeclass} not found")),
        // The catalog's own message blames the member label and the selector; when the cluster
        // filter left nothing to select from, that filter is the cause.
        Some(r)
            if r.ready.is_err()
                && cluster.deployments.is_empty()
                && !cluster.excluded.is_empty() =>
        {
            Err(format!(
                "no MachineDeployment to select from: --cluster-name leaves out all {} of them \
                 (see left out)",
                cluster.excluded.len()
            ))
        }
        Some(r) => r.ready.clone(),
    }
}

/// The node groups the cluster filter (`--cluster-name`) left out.
fn excluded(cluster: &Cluster) -> Vec<LeftOut> {
    cluster
        .excluded
        .iter()
        .map(|(md, why)| LeftOut {
            machine_deployment: md.clone(),
            reason: why.clone(),
        })
        .collect()
}

/// The node groups the NodeClass's selector does not select.
fn not_selected_by(cluster: &Cluster, nodeclass: &str, r: &Resolved) -> Vec<LeftOut> {
    let selector = r
        .nodeclass
        .spec
        .scalable_resource_selector
        .as_ref()
        .map(LabelSelector::try_from)
        .and_then(Result::ok);
    cluster
        .deployments
        .iter()
        .filter_map(|md| {
            not_selected(md, selector.as_ref()).map(|why| LeftOut {
                machine_deployment: md.key(),
                reason: format!("not selected by ClusterAPINodeClass {nodeclass}: {why}"),
            })
        })
        .collect()
}

/// The selected node groups the catalog's own build left out, with its words.
fn catalog_problems(r: &Resolved) -> Vec<LeftOut> {
    r.catalog
        .problems
        .iter()
        .map(|p| {
            let (md, why) = p
                .strip_prefix("MachineDeployment ")
                .and_then(|rest| rest.split_once(": "))
                .unwrap_or(("?", p.as_str()));
            LeftOut {
                machine_deployment: md.to_string(),
                reason: why.to_string(),
            }
        })
        .collect()
}

/// The NodePool's view of the catalog's offerings.
#[derive(Default)]
struct Usable {
    /// Those it can launch from (unavailable ones included, marked).
    offerings: Vec<OfferingView>,
    /// Instance types with at least one available usable offering.
    instance_types: Vec<String>,
    /// Offerings it cannot use, and why.
    left_out: Vec<LeftOut>,
}

/// Each offering as this NodePool sees it (NodeOverlays may select it by name or template
/// labels): usable, or left out for undeclared taints, unmet requirements or unavailability.
fn usable_offerings(
    cluster: &Cluster,
    np: &crate::api::nodepool::NodePool,
    reqs: &Requirements,
) -> Usable {
    let spec = &np.spec.template.spec;
    let name = np.name_any();
    let declared = declared_taints(&spec.taints, &spec.startup_taints);
    let mut usable = Usable::default();
    let seen = cluster
        .catalog
        .pool_instance_types(&spec.node_class_ref.name, Some(&name));
    for t in &seen {
        for o in &t.offerings {
            let refused = if !taints_declared(o, &declared) {
                Some(format!(
                    "its nodes carry taints the NodePool does not declare in taints or startupTaints: {}",
                    o.taints
                        .iter()
                        .map(|t| format!(
                            "{}={}:{}",
                            t.key,
                            t.value.as_deref().unwrap_or(""),
                            t.effect
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            } else if !offering_allowed(o, reqs) {
                Some(format!(
                    "its labels do not meet the NodePool's requirements ({})",
                    describe(reqs)
                ))
            } else {
                None
            };
            if let Some(reason) = refused {
                usable.left_out.push(LeftOut {
                    machine_deployment: o.machine_deployment.clone(),
                    reason,
                });
                continue;
            }
            let view = OfferingView::new(&t.name, o).overlaid(&cluster.catalog, Some(&name));
            if let Some(why) = &view.unavailable_reason {
                usable.left_out.push(LeftOut {
                    machine_deployment: o.machine_deployment.clone(),
                    reason: format!("unavailable: {why}"),
                });
            } else if !usable.instance_types.contains(&t.name) {
                usable.instance_types.push(t.name.clone());
            }
            usable.offerings.push(view);
        }
    }
    usable
}

/// Notes for the MachineDeployments left out for want of capacity whose infrastructure
/// template cannot be read (only there does the unread template matter).
fn unreadable_templates(cluster: &Cluster, r: &Resolved) -> Vec<String> {
    let mut unreadable: Vec<(&String, &String)> = cluster.template_errors.iter().collect();
    unreadable.sort();
    unreadable
        .into_iter()
        .filter(|(md, _)| {
            r.catalog
                .problems
                .iter()
                .any(|p| p.contains(md.as_str()) && p.contains("capacity"))
        })
        .map(|(md, e)| {
            format!(
                "MachineDeployment {md}: its infrastructure template cannot be read ({e}), so only annotations could give its capacity"
            )
        })
        .collect()
}

/// The handed-back instances still listed by the pools this NodePool launches on.
fn handed_back(cluster: &Cluster, offerings: &[OfferingView]) -> Vec<HandedBack> {
    let mut out: Vec<HandedBack> = Vec::new();
    for o in offerings {
        if out
            .iter()
            .any(|h| h.machine_deployment == o.machine_deployment)
        {
            continue;
        }
        let Some(md) = cluster
            .deployments
            .iter()
            .find(|md| md.key() == o.machine_deployment)
        else {
            continue;
        };
        let back = md.handed_back();
        let instances: Vec<String> = md
            .provider_id_list
            .iter()
            .filter(|p| back.contains(*p))
            .cloned()
            .collect();
        if !instances.is_empty() {
            out.push(HandedBack {
                machine_deployment: o.machine_deployment.clone(),
                instances,
                price_each: o.price,
            });
        }
    }
    out
}

/// The pool's requirements as the solver reads them.
fn pool_requirements(np: &crate::api::nodepool::NodePool, notes: &mut Vec<String>) -> Requirements {
    nodepool_requirements(np).unwrap_or_else(|(reqs, why)| {
        notes.push(format!("the NodePool can launch nothing: {why}"));
        reqs
    })
}

fn describe(reqs: &Requirements) -> String {
    reqs.iter()
        .map(|r| format!("{} {r}", r.key()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn usage(cluster: &Cluster, np: &crate::api::nodepool::NodePool) -> BTreeMap<String, Usage> {
    let by_pool = usage_by_pool(&cluster.state);
    let (resources, nodes) = by_pool.get(&np.name_any()).cloned().unwrap_or_default();
    let mut out = BTreeMap::new();
    let limits = np.spec.limits.clone().unwrap_or_default();
    for key in ["cpu", "memory"]
        .into_iter()
        .map(str::to_string)
        .chain(limits.keys().cloned())
    {
        let used = if key == "nodes" {
            Quantity::from_units(nodes).to_string()
        } else {
            resources.get(&key).to_string()
        };
        out.insert(
            key.clone(),
            Usage {
                used,
                limit: limits.get(&key).map(|q| q.0.clone()),
            },
        );
    }
    out.entry("nodes".into()).or_insert(Usage {
        used: nodes.to_string(),
        limit: None,
    });
    out
}

impl fmt::Display for NodePoolReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "NodePool {} (ClusterAPINodeClass {})",
            self.nodepool, self.nodeclass
        )?;
        match &self.nodeclass_problem {
            None => writeln!(f, "  NodeClass ready")?,
            Some(e) => writeln!(f, "  NodeClass not ready: {e}")?,
        }
        writeln!(
            f,
            "  instance types it can launch now: {}",
            if self.instance_types.is_empty() {
                "none".to_string()
            } else {
                self.instance_types.join(", ")
            }
        )?;
        writeln!(f, "  offerings:")?;
        if self.offerings.is_empty() {
            writeln!(f, "    none")?;
        }
        for o in &self.offerings {
            writeln!(f, "    {}", o.line())?;
        }
        if !self.left_out.is_empty() {
            writeln!(f, "  left out:")?;
            for l in &self.left_out {
                writeln!(
                    f,
                    "    MachineDeployment {}: {}",
                    l.machine_deployment, l.reason
                )?;
            }
        }
        if !self.handed_back.is_empty() {
            writeln!(
                f,
                "  handed-back instances (running and paid for; the next claim on the pool takes one back):"
            )?;
            for h in &self.handed_back {
                writeln!(
                    f,
                    "    {}: {} at {} each ({})",
                    h.machine_deployment,
                    h.instances.len(),
                    h.price_each,
                    h.instances.join(", ")
                )?;
            }
        }
        writeln!(f, "  usage:")?;
        for (k, u) in &self.usage {
            match &u.limit {
                Some(l) => writeln!(f, "    {k}: {} of limit {l}", u.used)?,
                None => writeln!(f, "    {k}: {} (no limit)", u.used)?,
            }
        }
        for n in &self.notes {
            writeln!(f, "  note: {n}")?;
        }
        Ok(())
    }
}
