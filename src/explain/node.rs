//! `explain node NAME [--remove]`: the node's NodeClaim and NodePool, and what the disruption
//! pass makes of it now: disrupted by which method, or the first thing that stops it (a
//! [`Blocker`]). The pass is repeated with the controller's own functions on the cluster read
//! once: the disruption view (`view::disruption::gather`), the snapshot it simulates on, then
//! `disruption::pass::settle_and_decide`, as the Disruption actor calls them. `--remove` asks
//! what if the node went now: where its pods would land (an existing node or a new claim), what
//! it would save per hour, and what would stop it, from consolidation's own simulation
//! (`disruption::removal`). Nothing is written.

use std::collections::HashSet;
use std::fmt;

use jiff::Timestamp;
use kube::ResourceExt;
use serde::Serialize;

use super::Error;
use super::cluster::Cluster;
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::{ConsolidationPolicy, DisruptionReason};
use crate::api::wellknown::NODEPOOL_LABEL;
use crate::disruption::{self, Blocker, Candidate, Decision, Hold, Outcome, consolidation};
use crate::view::disruption::{self as view, Memory, View};

#[derive(Debug, Serialize)]
pub(crate) struct NodeReport {
    pub(crate) node: String,
    pub(crate) nodeclaim: Option<String>,
    pub(crate) nodepool: Option<String>,
    pub(crate) instance_type: Option<String>,
    /// Its hourly price, as its pool pays it.
    pub(crate) price: Option<f64>,
    /// The pass would disrupt it now: the method and decision (`Drift (replace)`).
    pub(crate) disrupted_by: Option<String>,
    /// The first thing that stops its disruption now (a `karpenter_voluntary_disruption_blocked_nodes` label).
    pub(crate) blocker: Option<String>,
    pub(crate) why: Option<String>,
    /// `--remove`: what if it went now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) remove: Option<Removal>,
}

/// What removing the node now would take, as single-node consolidation simulates it.
#[derive(Debug, Serialize)]
pub(crate) struct Removal {
    /// `delete` (its pods fit elsewhere), `replace` (one cheaper claim) or `no`.
    pub(crate) verdict: String,
    /// Why not, when the verdict is `no`.
    pub(crate) blocker: Option<String>,
    pub(crate) why: Option<String>,
    pub(crate) destinations: Vec<Destination>,
    pub(crate) replacement: Option<Replacement>,
    /// Its price less the replacement's (0 when the verdict is `no`).
    pub(crate) savings_per_hour: f64,
    /// What would stop it even so: its budget, a PodDisruptionBudget, do-not-disrupt, and
    /// anything else that holds it now.
    pub(crate) stopped_by: Vec<Stop>,
}

/// Where one of its pods would go.
#[derive(Debug, Serialize)]
pub(crate) struct Destination {
    pub(crate) pod: String,
    /// An existing node.
    pub(crate) node: Option<String>,
    /// A new claim of this NodePool.
    pub(crate) new_claim: Option<String>,
    /// Why it would find no place.
    pub(crate) unschedulable: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Replacement {
    pub(crate) nodepool: String,
    /// The instance types it could launch (only the cheaper ones), cheapest first.
    pub(crate) instance_types: Vec<String>,
    pub(crate) price: f64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Stop {
    pub(crate) blocker: String,
    pub(crate) why: String,
}

impl Stop {
    fn of(hold: &Hold) -> Self {
        Self {
            blocker: hold.blocker.label().to_string(),
            why: hold.why.clone(),
        }
    }
}

pub(crate) fn explain(cluster: &Cluster, name: &str, remove: bool) -> Result<NodeReport, Error> {
    if cluster.state.nodes.read().compact(name).is_none() {
        return Err(Error::NotFound {
            kind: "Node",
            name: name.to_string(),
        });
    }
    let claim = claim_on(cluster, name);
    let mut report = NodeReport {
        node: name.to_string(),
        nodeclaim: claim.as_ref().map(|c| c.name_any()),
        nodepool: claim
            .as_ref()
            .and_then(|c| c.labels().get(NODEPOOL_LABEL).cloned()),
        instance_type: None,
        price: None,
        disrupted_by: None,
        blocker: None,
        why: None,
        remove: None,
    };
    let Some(claim) = claim.map(|c| c.name_any()) else {
        report.why = Some("no NodeClaim has this Node: the controller does not manage it".into());
        return Ok(report);
    };
    let v = gather(cluster, remove);
    let decision = decide(cluster, &v);
    let known = v.candidates.iter().chain(&v.held_candidates);
    if let Some(c) = known.clone().find(|c| c.claim == claim) {
        report.instance_type = Some(c.instance_type.clone());
        report.price = Some(c.price);
    }
    standing(&mut report, &claim, &v, &decision);
    if remove {
        report.remove = known
            .clone()
            .find(|c| c.claim == claim)
            .map(|c| removal(cluster, &v, c));
    }
    Ok(report)
}

/// The NodeClaim whose Node this is.
fn claim_on(cluster: &Cluster, node: &str) -> Option<std::sync::Arc<NodeClaim>> {
    let claims = cluster.state.claims.read();
    claims
        .all()
        .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .cloned()
}

/// The disruption view as the pass gathers it, from a one-off read: no pod events beyond the
/// recorded ones, no command under way, no nomination.
fn gather(cluster: &Cluster, keep_held: bool) -> View {
    let none = HashSet::new();
    let pod_events = Default::default();
    let pdbs = cluster.state.pdbs.read().all().clone();
    let mem = Memory {
        pdbs: &pdbs,
        pod_events: &pod_events,
        started: Timestamp::UNIX_EPOCH,
        executing: &none,
        nominated: &none,
        now: Timestamp::now(),
        keep_held,
    };
    view::gather(cluster.view(), &mem)
}

/// The pass's decision on the view, made as the actor's (`decide::solve`) makes it.
fn decide(cluster: &Cluster, v: &View) -> Decision {
    let mut snapshot = view::snapshot(
        cluster.view(),
        &v.candidates,
        &[],
        &v.under_consolidate_after,
    );
    consolidation::keep_room_of_pods_about_to_bind(&mut snapshot);
    let none = HashSet::new();
    disruption::pass::settle_and_decide(&snapshot, v.candidates.clone(), &v.allowed, &none, true).0
}

/// What the pass makes of the claim: taken by the decision, or its first blocker (from the
/// decision, the view's holds or its skips).
fn standing(report: &mut NodeReport, claim: &str, v: &View, d: &Decision) {
    let set = |r: &mut NodeReport, blocker: Option<Blocker>, why: &str| {
        r.blocker = blocker.map(|b| b.label().to_string());
        r.why = Some(why.to_string());
    };
    if let Some(cmd) = d.command.as_ref()
        && cmd.candidates.iter().any(|c| c.claim == claim)
    {
        report.disrupted_by = Some(format!("{:?} ({})", cmd.method, cmd.decision()));
        return;
    }
    if let Some(b) = d.blocked.iter().find(|b| b.claim == claim) {
        return set(report, Some(b.hold.blocker), &b.hold.why);
    }
    if let Some((_, hold)) = v.blocked.iter().find(|(c, _)| c.name_any() == claim) {
        return set(report, Some(hold.blocker), &hold.why);
    }
    if v.expired.iter().any(|c| c.name_any() == claim) {
        return set(
            report,
            None,
            "expired (expireAfter passed): it is being replaced",
        );
    }
    match v.skipped.iter().find(|(c, _, _)| c == claim) {
        Some((_, why, blocker)) => set(report, *blocker, why),
        None => set(report, None, "the disruption view does not list it"),
    }
}

/// The what-if: the node's pods simulated away on a snapshot where the node may go, judged as
/// single-node consolidation judges a candidate.
fn removal(cluster: &Cluster, v: &View, c: &Candidate) -> Removal {
    // The snapshot carries the pods of the nodes a decision may remove: this one, whatever
    // holds it now.
    let movable = Candidate {
        consolidatable: true,
        policy: ConsolidationPolicy::WhenEmptyOrUnderutilized,
        ..c.clone()
    };
    let mut snapshot = view::snapshot(cluster.view(), &[movable], &[], &v.under_consolidate_after);
    consolidation::keep_room_of_pods_about_to_bind(&mut snapshot);
    let outcome = disruption::removal(&snapshot, c);
    let mut out = Removal {
        verdict: String::new(),
        blocker: None,
        why: None,
        destinations: destinations(&snapshot, c),
        replacement: None,
        savings_per_hour: 0.0,
        stopped_by: stops(v, c),
    };
    match outcome {
        Outcome::Delete => {
            out.verdict = "delete".into();
            out.savings_per_hour = c.price;
        }
        Outcome::Replace(new, price) => {
            out.verdict = "replace".into();
            out.savings_per_hour = c.price - price;
            out.replacement = Some(Replacement {
                nodepool: new.nodepool,
                instance_types: new.instance_types,
                price,
            });
        }
        Outcome::No(hold) => {
            out.verdict = "no".into();
            out.blocker = Some(hold.blocker.label().to_string());
            out.why = Some(hold.why);
        }
    }
    out
}

/// Where the solver puts each of the node's pods once the node is gone.
fn destinations(snapshot: &crate::scheduling::Snapshot, c: &Candidate) -> Vec<Destination> {
    let moved: HashSet<&str> = c.pods.iter().map(|p| &**p).collect();
    let without = consolidation::without(snapshot, &[c]);
    let (results, _) = consolidation::simulate(&without, &moved);
    c.pods
        .iter()
        .map(|pod| Destination {
            pod: pod.to_string(),
            node: results
                .placed_on_existing
                .iter()
                .find(|(p, _)| **p == **pod)
                .map(|(_, n)| n.clone()),
            new_claim: results
                .new_claims
                .iter()
                .find(|n| n.pods.iter().any(|p| **p == **pod))
                .map(|n| n.nodepool.clone()),
            unschedulable: results
                .failures
                .iter()
                .find(|(p, _)| **p == **pod)
                .map(|(_, why)| why.to_string()),
        })
        .collect()
}

/// What would stop the removal even if the simulation allows it: what holds the node now, and
/// its pool's budget for the reason it would go for.
fn stops(v: &View, c: &Candidate) -> Vec<Stop> {
    let mut out: Vec<Stop> = v
        .blocked
        .iter()
        .filter(|(k, _)| k.name_any() == c.claim)
        .map(|(_, hold)| Stop::of(hold))
        .collect();
    if let Some(hold) = c.hold.as_ref().filter(|_| out.is_empty()) {
        out.push(Stop::of(hold));
    }
    let reason = if c.drift.is_some() {
        DisruptionReason::Drifted
    } else if c.is_empty() {
        DisruptionReason::Empty
    } else {
        DisruptionReason::Underutilized
    };
    if v.allowed.get(&c.nodepool, reason) == 0 {
        out.push(Stop {
            blocker: Blocker::Budget.label().to_string(),
            why: format!(
                "NodePool {}'s budget allows no {} disruption now",
                c.nodepool,
                reason.as_str()
            ),
        });
    }
    out
}

impl fmt::Display for NodeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let or = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        writeln!(f, "Node {}", self.node)?;
        writeln!(
            f,
            "  NodeClaim {}, NodePool {}, instance type {}{}",
            or(&self.nodeclaim),
            or(&self.nodepool),
            or(&self.instance_type),
            self.price
                .map(|p| format!(", ${p:.4}/h"))
                .unwrap_or_default()
        )?;
        match (&self.disrupted_by, &self.blocker) {
            (Some(by), _) => writeln!(f, "  disruption: the next pass would take it: {by}")?,
            (None, Some(b)) => writeln!(f, "  disruption: blocked ({b}): {}", or(&self.why))?,
            (None, None) => writeln!(f, "  disruption: not weighed: {}", or(&self.why))?,
        }
        if let Some(r) = &self.remove {
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Removal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.verdict.as_str() {
            "no" => writeln!(
                f,
                "  if it went now: not possible ({}): {}",
                self.blocker.as_deref().unwrap_or("-"),
                self.why.as_deref().unwrap_or("-")
            )?,
            v => writeln!(
                f,
                "  if it went now: {v}, saving ${:.4}/h",
                self.savings_per_hour
            )?,
        }
        if let Some(r) = &self.replacement {
            writeln!(
                f,
                "    replacement: a new claim of NodePool {} (${:.4}/h; types {})",
                r.nodepool,
                r.price,
                r.instance_types.join(", ")
            )?;
        }
        for d in &self.destinations {
            let to = match (&d.node, &d.new_claim, &d.unschedulable) {
                (Some(n), _, _) => format!("node {n}"),
                (None, Some(p), _) => format!("a new claim of NodePool {p}"),
                (None, None, Some(why)) => format!("nowhere: {why}"),
                (None, None, None) => "nowhere".to_string(),
            };
            writeln!(f, "    pod {} -> {to}", d.pod)?;
        }
        for s in &self.stopped_by {
            writeln!(f, "    stopped by {}: {}", s.blocker, s.why)?;
        }
        if self.stopped_by.is_empty() {
            writeln!(f, "    nothing else would stop it")?;
        }
        Ok(())
    }
}
