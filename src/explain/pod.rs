//! `explain pod NAMESPACE/NAME`: where a bound pod went and why its node has that type, or why
//! a pending pod has no node: what the provisioner's next solve would do with it, and for every
//! NodePool and instance type the first constraint that rules it out.

use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::Serialize;

use super::cluster::Cluster;
use super::{Error, OfferingView};
use crate::api::nodeclaim::NodeClaim;
use crate::api::requirements::Requirements;
use crate::api::resources::Resources;
use crate::api::wellknown::{INSTANCE_TYPE_LABEL, NODEPOOL_LABEL};
use crate::scheduling;
use crate::scheduling::explain::{PoolVerdict, rule_out};
use crate::state::claims::recorded_deployment;
use crate::state::pods;
use crate::view::catalog::{Fit, declared_taints, rank};

#[derive(Debug, Serialize)]
pub(crate) struct PodReport {
    pub(crate) pod: String,
    /// `Running`, `Pending`...
    pub(crate) phase: String,
    /// Set when the pod is bound.
    pub(crate) placed: Option<Placement>,
    /// Set when it is not.
    pub(crate) pending: Option<Pending>,
}

/// A bound pod's node, claim and offering.
#[derive(Debug, Serialize)]
pub(crate) struct Placement {
    pub(crate) node: String,
    pub(crate) nodeclaim: Option<String>,
    pub(crate) nodepool: Option<String>,
    pub(crate) instance_type: Option<String>,
    pub(crate) machine_deployment: Option<String>,
    /// Why that offering: the rule the launch used.
    pub(crate) reason: String,
    /// Every offering of its NodeClass as the launch judges it, eligible ones first in the
    /// launch's order of preference; `chosen` marks the one it launched from.
    pub(crate) offerings: Vec<Considered>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Considered {
    #[serde(flatten)]
    pub(crate) offering: OfferingView,
    /// How the launch's rule judges it now (`eligible`, `too-small`, `incompatible`,
    /// `unavailable`).
    pub(crate) fit: Fit,
    pub(crate) chosen: bool,
}

/// A pod with no node.
#[derive(Debug, Serialize)]
pub(crate) struct Pending {
    /// Karpenter only packs pods the kube-scheduler marked Unschedulable.
    pub(crate) provisionable: bool,
    pub(crate) note: Option<String>,
    /// What the next solve (all pending pods, as the provisioner batches them) does with it.
    pub(crate) outcome: Outcome,
    pub(crate) nodepools: Vec<PoolVerdict>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub(crate) enum Outcome {
    /// It fits on an existing node or an in-flight claim.
    ExistingNode {
        node: String,
        in_flight: bool,
    },
    /// A new claim from this pool, with these types (cheapest first).
    NewClaim {
        nodepool: String,
        instance_types: Vec<String>,
    },
    Failed {
        message: String,
    },
}

pub(crate) fn explain(cluster: &Cluster, target: &str) -> Result<PodReport, Error> {
    let (ns, name) = target
        .split_once('/')
        .ok_or_else(|| Error::BadArgument(format!("{target:?} is not NAMESPACE/NAME")))?;
    let key = format!("{ns}/{name}");
    let pod = cluster.state.pods.read().get(&key).ok_or(Error::NotFound {
        kind: "Pod",
        name: key.clone(),
    })?;
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Unknown".into());
    let mut report = PodReport {
        pod: key,
        phase,
        placed: None,
        pending: None,
    };
    match pods::node_name(&pod) {
        Some(node) => report.placed = Some(placement(cluster, node)),
        None => report.pending = Some(pending(cluster, &pod)?),
    }
    Ok(report)
}

fn placement(cluster: &Cluster, node: &str) -> Placement {
    let st = &cluster.state;
    let claim = st
        .claims
        .read()
        .all()
        .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .cloned();
    let Some(claim) = claim else {
        return Placement {
            node: node.to_string(),
            nodeclaim: None,
            nodepool: None,
            instance_type: None,
            machine_deployment: None,
            reason: "no NodeClaim owns this node: Karpenter did not launch it".into(),
            offerings: Vec::new(),
        };
    };
    let md = recorded_deployment(&claim).map(str::to_string);
    Placement {
        node: node.to_string(),
        nodeclaim: Some(claim.name_any()),
        nodepool: claim.labels().get(NODEPOOL_LABEL).cloned(),
        instance_type: claim.labels().get(INSTANCE_TYPE_LABEL).cloned(),
        offerings: considered(cluster, &claim, md.as_deref()),
        machine_deployment: md,
        reason: "a launch takes the cheapest eligible offering: one whose instance type holds \
                 the claim's requests, whose labels meet its requirements, whose taints it \
                 declares and which is available (ties: the least loaded MachineDeployment)"
            .into(),
    }
}

/// Every offering of the claim's NodeClass as the launch judged it (`catalog::rank`, the rule
/// `CatalogView::resolve` applies), eligible ones first in its order of preference.
fn considered(cluster: &Cluster, claim: &NodeClaim, chosen: Option<&str>) -> Vec<Considered> {
    let spec = &claim.spec;
    let reqs =
        Requirements::from_node_selector_requirements(&spec.requirements).unwrap_or_default();
    let requests = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| Resources::from_k8s(r).ok())
        .unwrap_or_default();
    let declared = declared_taints(&spec.taints, &spec.startup_taints);
    let pool = claim.labels().get(NODEPOOL_LABEL).map(String::as_str);
    let types = cluster
        .catalog
        .pool_instance_types(&spec.node_class_ref.name, pool);
    let unavailable = |o: &crate::scheduling::Offering| !o.available;
    rank(&types, &reqs, &requests, &declared, &unavailable)
        .into_iter()
        .map(|r| Considered {
            offering: OfferingView::new(&r.instance_type.name, r.offering)
                .overlaid(&cluster.catalog, pool),
            fit: r.fit,
            chosen: Some(r.offering.machine_deployment.as_str()) == chosen,
        })
        .collect()
}

fn pending(cluster: &Cluster, pod: &Pod) -> Result<Pending, Error> {
    let provisionable = pods::is_provisionable(pod);
    let mut snapshot = crate::view::snapshot::build(
        cluster.view(),
        std::iter::empty::<(&u64, &NodeClaim)>(),
        cluster.settings.preference,
        crate::view::snapshot::BoundPods::All,
    );
    let key = pods::key(pod);
    if !snapshot.pods.iter().any(|p| pods::key(p) == key) {
        snapshot.pods.push(pod.clone());
    }
    // A pod whose spec cannot be read is an answer too: the solve reports it as InvalidPod.
    let nodepools = rule_out(pod, &snapshot).unwrap_or_default();
    let results = scheduling::solve(&snapshot);
    let in_flight = |node: &str| snapshot.nodes.iter().any(|n| n.name == node && n.in_flight);
    let outcome =
        if let Some((_, node)) = results.placed_on_existing.iter().find(|(p, _)| *p == key) {
            Outcome::ExistingNode {
                node: node.clone(),
                in_flight: in_flight(node),
            }
        } else if let Some(c) = results.new_claims.iter().find(|c| c.pods.contains(&key)) {
            Outcome::NewClaim {
                nodepool: c.nodepool.clone(),
                instance_types: c.instance_types.clone(),
            }
        } else if let Some((_, e)) = results.failures.iter().find(|(p, _)| *p == key) {
            Outcome::Failed {
                message: e.to_string(),
            }
        } else {
            Outcome::Failed {
                message: "the solve did not consider the pod".into(),
            }
        };
    let note = (!provisionable).then(|| {
        "the kube-scheduler has not marked it Unschedulable (PodScheduled=False, reason \
         Unschedulable), or it is nominated, terminating, a DaemonSet or mirror pod: Karpenter \
         does not provision for it yet; below is what it would do"
            .to_string()
    });
    Ok(Pending {
        provisionable,
        note,
        outcome,
        nodepools,
    })
}

impl fmt::Display for PodReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Pod {} ({})", self.pod, self.phase)?;
        if let Some(p) = &self.placed {
            writeln!(f, "  bound to node {}", p.node)?;
            if let Some(c) = &p.nodeclaim {
                writeln!(
                    f,
                    "  NodeClaim {c} of NodePool {}, instance type {}, from MachineDeployment {}",
                    p.nodepool.as_deref().unwrap_or("?"),
                    p.instance_type.as_deref().unwrap_or("?"),
                    p.machine_deployment.as_deref().unwrap_or("?")
                )?;
            }
            writeln!(f, "  why: {}", p.reason)?;
            if !p.offerings.is_empty() {
                writeln!(
                    f,
                    "  offerings considered (* chosen; eligible first, cheapest first):"
                )?;
                for o in &p.offerings {
                    let mark = if o.chosen { "*" } else { " " };
                    writeln!(f, "   {mark} {:?}: {}", o.fit, o.offering.line())?;
                }
            }
        }
        if let Some(p) = &self.pending {
            if let Some(n) = &p.note {
                writeln!(f, "  note: {n}")?;
            }
            match &p.outcome {
                Outcome::ExistingNode { node, in_flight } if *in_flight => writeln!(
                    f,
                    "  next solve: fits on NodeClaim {node}, still launching: wait for its node"
                )?,
                Outcome::ExistingNode { node, .. } => writeln!(
                    f,
                    "  next solve: fits on existing node {node}: the kube-scheduler should bind it"
                )?,
                Outcome::NewClaim {
                    nodepool,
                    instance_types,
                } => writeln!(
                    f,
                    "  next solve: a new NodeClaim from NodePool {nodepool}, instance types {}",
                    instance_types.join(", ")
                )?,
                Outcome::Failed { message } => writeln!(f, "  next solve: fails: {message}")?,
            }
            if p.nodepools.is_empty() {
                writeln!(f, "  no NodePool can launch (none, or none valid)")?;
            }
            for v in &p.nodepools {
                match &v.ruled_out {
                    Some(r) => writeln!(
                        f,
                        "  NodePool {}: ruled out by {}: {}",
                        v.nodepool, r.constraint, r.message
                    )?,
                    None => {
                        writeln!(f, "  NodePool {}:", v.nodepool)?;
                        if v.instance_types.is_empty() {
                            writeln!(f, "    no instance types (check its ClusterAPINodeClass)")?;
                        }
                        for t in &v.instance_types {
                            match &t.ruled_out {
                                Some(r) => writeln!(
                                    f,
                                    "    {}: ruled out by {}: {}",
                                    t.instance_type, r.constraint, r.message
                                )?,
                                None => writeln!(f, "    {}: fits", t.instance_type)?,
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
