//! `explain nodeclaim NAME`: its phase, its MachineDeployment, Machine and Node, the step of
//! the launch it waits on (the NodeClaim actor's order of steps) and since when, the deadline
//! that applies, and whether the disruption view makes it a candidate, and why not.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;
use serde::Serialize;

use super::cluster::Cluster;
use super::{Error, ts};
use crate::actors::nodeclaim::registration_clock_start;
use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::{NODEPOOL_LABEL, TERMINATION_FINALIZER};
use crate::disruption::{Allowed, Candidate};
use crate::state::claims::{provider_id, recorded_deployment, recorded_machine};
use crate::view::disruption::{self as view, Memory};

#[derive(Debug, Serialize)]
pub(crate) struct NodeClaimReport {
    pub(crate) nodeclaim: String,
    pub(crate) nodepool: Option<String>,
    pub(crate) nodeclass: String,
    /// `Deleting`, `Initialized`, `Registered`, `Launched` or `Launching`.
    pub(crate) phase: String,
    pub(crate) created: Option<String>,
    pub(crate) machine_deployment: Option<String>,
    pub(crate) machine: Option<String>,
    pub(crate) provider_id: Option<String>,
    pub(crate) node: Option<String>,
    /// What it waits for; `None` once initialized.
    pub(crate) waiting_for: Option<String>,
    /// Since when it has waited for that (RFC 3339).
    pub(crate) since: Option<String>,
    pub(crate) deadline: Option<Deadline>,
    pub(crate) disruption: Disruption,
}

/// The timeout that ends the current wait.
#[derive(Debug, Serialize)]
pub(crate) struct Deadline {
    /// `create`, `registration` or `launch`.
    pub(crate) kind: String,
    /// The timeout, Go-style (`5m`).
    pub(crate) timeout: String,
    /// Where the timeout comes from (`--create-timeout`, `ClusterAPINodeClass x spec.createTimeout`).
    pub(crate) source: String,
    /// When it passes (RFC 3339).
    pub(crate) at: String,
    pub(crate) passed: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct Disruption {
    pub(crate) candidate: bool,
    /// Why not, when it is not.
    pub(crate) reason: Option<String>,
    pub(crate) drift: Option<String>,
    pub(crate) consolidatable: Option<bool>,
    /// Disruption reasons it is eligible for whose NodePool budget allows none now.
    pub(crate) budget_blocked: Vec<String>,
}

pub(crate) fn explain(cluster: &Cluster, name: &str) -> Result<NodeClaimReport, Error> {
    let st = &cluster.state;
    let claim = st.claims.read().get(name).ok_or(Error::NotFound {
        kind: "NodeClaim",
        name: name.to_string(),
    })?;
    let machine = st.machines.read().bound_to(name).ok().flatten();
    let pid = machine
        .as_ref()
        .and_then(|m| m.provider_id.clone())
        .or_else(|| provider_id(&claim).map(str::to_string));
    let node = pid
        .as_deref()
        .and_then(|p| {
            st.nodes
                .read()
                .compact_by_provider_id(p)
                .map(|n| n.name().to_string())
        })
        .or_else(|| claim.status.as_ref().and_then(|s| s.node_name.clone()));
    let created = claim.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let (waiting_for, since, deadline) = wait(
        cluster,
        &claim,
        machine.is_some(),
        pid.is_some(),
        node.is_some(),
    );
    Ok(NodeClaimReport {
        nodeclaim: name.to_string(),
        nodepool: claim.labels().get(NODEPOOL_LABEL).cloned(),
        nodeclass: claim.spec.node_class_ref.name.clone(),
        phase: phase(&claim),
        created: created.map(ts),
        machine_deployment: recorded_deployment(&claim).map(str::to_string),
        machine: machine
            .as_ref()
            .map(|m| format!("{}/{}", m.namespace, m.name))
            .or_else(|| recorded_machine(&claim).map(str::to_string)),
        provider_id: pid,
        node,
        waiting_for,
        since: since.map(ts),
        deadline,
        disruption: disruption(cluster, &claim),
    })
}

fn phase(c: &NodeClaim) -> String {
    let conds = c.conditions();
    if c.metadata.deletion_timestamp.is_some() {
        "Deleting"
    } else if conditions::is_true(conds, conditions::INITIALIZED) {
        "Initialized"
    } else if conditions::is_true(conds, conditions::REGISTERED) {
        "Registered"
    } else if conditions::is_true(conds, conditions::LAUNCHED) {
        "Launched"
    } else {
        "Launching"
    }
    .to_string()
}

/// The step the NodeClaim actor waits on, in its order of steps (`NodeClaimActor::next`), with
/// the deadline it applies.
fn wait(
    cluster: &Cluster,
    c: &NodeClaim,
    has_machine: bool,
    has_provider_id: bool,
    has_node: bool,
) -> (Option<String>, Option<Timestamp>, Option<Deadline>) {
    let settings = &cluster.settings;
    let created = c
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(Timestamp::now);
    let conds = c.conditions();
    if let Some(t) = &c.metadata.deletion_timestamp {
        return (
            Some("termination: drain the node, then release its Machine".into()),
            Some(t.0),
            None,
        );
    }
    let nodeclass = &c.spec.node_class_ref.name;
    let (create_timeout, create_source) = match cluster.catalog.create_timeout(nodeclass) {
        Some(t) => (
            t,
            format!("ClusterAPINodeClass {nodeclass} spec.createTimeout"),
        ),
        None => (settings.create_timeout, "--create-timeout".to_string()),
    };
    let create = |what: &str| {
        (
            Some(what.to_string()),
            Some(created),
            Some(deadline("create", create_timeout, &create_source, created)),
        )
    };
    let launched = recorded_deployment(c).is_some()
        && c.finalizers().iter().any(|f| f == TERMINATION_FINALIZER);
    if !launched {
        return (
            Some(
                "a launch decision: an offering of its NodeClass that fits its requirements".into(),
            ),
            Some(created),
            Some(deadline(
                "launch",
                settings.launch_timeout,
                "the launch timeout",
                created,
            )),
        );
    }
    if !has_machine {
        return create("a Machine from its MachineDeployment (a replica added for it)");
    }
    if !has_provider_id {
        return create(
            "the Machine's provider ID (the infrastructure provider creating the instance)",
        );
    }
    if !has_node {
        let start = registration_clock_start(c);
        return (
            Some("its Node to register (a Node with the Machine's provider ID)".into()),
            Some(start),
            Some(deadline(
                "registration",
                settings.registration_timeout,
                "--registration-timeout",
                start,
            )),
        );
    }
    if !conditions::is_true(conds, conditions::INITIALIZED) {
        let since = conditions::get(conds, conditions::REGISTERED)
            .map(|r| r.last_transition_time.0)
            .unwrap_or(created);
        return (
            Some(
                "initialization: the Node Ready, its startup taints gone, its resources registered"
                    .into(),
            ),
            Some(since),
            None,
        );
    }
    (None, None, None)
}

fn deadline(kind: &str, timeout: Duration, source: &str, start: Timestamp) -> Deadline {
    let at = start
        .checked_add(jiff::SignedDuration::try_from(timeout).unwrap_or(jiff::SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX);
    Deadline {
        kind: kind.to_string(),
        timeout: crate::api::duration::format(timeout),
        source: source.to_string(),
        at: ts(at),
        passed: at <= Timestamp::now(),
    }
}

/// What the pass makes of a candidate: the reasons it is eligible for whose budget allows none
/// now, and, when no method may take it, the hold the pass's blocker names
/// (`Candidate::eligible_for`, `Candidate::consolidation_reason`: the pass's own rule).
pub(crate) fn of_candidate(cand: &Candidate, allowed: &Allowed) -> Disruption {
    let mut out = Disruption {
        candidate: true,
        reason: None,
        drift: cand
            .drift
            .map(|d| format!("{}: {}", d.reason(), d.message())),
        consolidatable: Some(cand.consolidatable),
        budget_blocked: cand
            .eligible_reasons()
            .filter(|r| allowed.get(&cand.nodepool, *r) == 0)
            .map(|r| format!("{r:?}"))
            .collect(),
    };
    if cand.drift.is_none() && cand.repair.is_none() {
        out.reason = cand
            .consolidation_reason()
            .err()
            .map(|hold| format!("a candidate, but no method may take it now: {}", hold.why));
    }
    out
}

/// What the disruption view (`view::disruption::gather`) makes of the claim.
fn disruption(cluster: &Cluster, c: &NodeClaim) -> Disruption {
    let name = c.name_any();
    let pod_events = HashMap::new();
    let executing = HashSet::new();
    let pdbs = cluster.state.pdbs.read().all().clone();
    let mem = Memory {
        pdbs: &pdbs,
        pod_events: &pod_events,
        // Only the recorded lastPodEventTime is known to a one-off read.
        started: Timestamp::UNIX_EPOCH,
        executing: &executing,
        nominated: &executing,
        now: Timestamp::now(),
        keep_held: false,
    };
    let v = view::gather(cluster.view(), &mem);
    let mut out = Disruption {
        candidate: false,
        reason: None,
        drift: None,
        consolidatable: None,
        budget_blocked: Vec::new(),
    };
    if let Some(cand) = v.candidates.iter().find(|k| k.claim == name) {
        return of_candidate(cand, &v.allowed);
    }
    if let Some((_, hold)) = v.blocked.iter().find(|(k, _)| k.name_any() == name) {
        out.reason = Some(hold.why.clone());
        return out;
    }
    if v.expired.iter().any(|k| k.name_any() == name) {
        out.reason = Some("expired (expireAfter passed): it is being replaced, not weighed".into());
        return out;
    }
    out.reason = Some(
        v.skipped
            .iter()
            .find(|(k, _, _)| *k == name)
            .map(|(_, why, _)| why.to_string())
            .unwrap_or_else(|| "the disruption view does not list it".into()),
    );
    out
}

impl fmt::Display for NodeClaimReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let or = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        writeln!(f, "NodeClaim {} ({})", self.nodeclaim, self.phase)?;
        writeln!(
            f,
            "  NodePool {}, ClusterAPINodeClass {}, created {}",
            or(&self.nodepool),
            self.nodeclass,
            or(&self.created)
        )?;
        writeln!(f, "  MachineDeployment {}", or(&self.machine_deployment))?;
        writeln!(f, "  Machine {}", or(&self.machine))?;
        writeln!(f, "  provider ID {}", or(&self.provider_id))?;
        writeln!(f, "  Node {}", or(&self.node))?;
        match &self.waiting_for {
            Some(w) => writeln!(f, "  waiting for {w}, since {}", or(&self.since))?,
            None => writeln!(
                f,
                "  waiting for nothing: launched, registered and initialized"
            )?,
        }
        if let Some(d) = &self.deadline {
            writeln!(
                f,
                "  {} timeout {} (from {}): {} {}",
                d.kind,
                d.timeout,
                d.source,
                if d.passed { "passed at" } else { "passes at" },
                d.at
            )?;
        }
        let d = &self.disruption;
        if d.candidate {
            writeln!(f, "  disruption: a candidate")?;
            if let Some(drift) = &d.drift {
                writeln!(f, "    drifted: {drift}")?;
            }
            if let Some(c) = d.consolidatable {
                writeln!(f, "    consolidatable: {c}")?;
            }
            if !d.budget_blocked.is_empty() {
                writeln!(
                    f,
                    "    its NodePool's budget allows no disruption now for: {}",
                    d.budget_blocked.join(", ")
                )?;
            }
        } else {
            writeln!(f, "  disruption: not a candidate")?;
        }
        if let Some(r) = &d.reason {
            writeln!(f, "    because {r}")?;
        }
        Ok(())
    }
}
