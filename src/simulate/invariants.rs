//! DESIGN.md section 4, checked against the simulated server's store once nothing is in flight:
//! one Machine per claim and one claim per Machine, no leaked Machine, replicas equal to the live
//! Machines of every managed MachineDeployment.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

use crate::api::wellknown::{MACHINE_ANNOTATION, MEMBER_LABEL};
use crate::capi::model::{Machine, MachineDeployment};
use crate::capi::version::CapiVersion;
use crate::sim::Store;
use crate::state::machines::{bound_claim, deployment_key};

#[derive(Clone, Debug, Default, Serialize)]
pub struct Invariants {
    /// Claims named by two Machines plus Machines named by two claims.
    pub double_bound: usize,
    /// Live Machines of managed MachineDeployments bound to no live claim (beyond the baseline
    /// the controller never owned).
    pub leaked: usize,
    /// Live Machines bound to a live claim.
    pub bound: usize,
    /// Every violation, in words.
    pub problems: Vec<String>,
}

impl Invariants {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

pub fn check(store: &Store, version: CapiVersion) -> Invariants {
    let mut inv = Invariants::default();
    let machines: Vec<Machine> = store
        .list("machines", None)
        .iter()
        .filter_map(|v| match Machine::from_value(v, version) {
            Ok(m) => Some(m),
            Err(e) => {
                inv.problems.push(format!("unreadable Machine: {e}"));
                None
            }
        })
        .collect();
    let mds: Vec<MachineDeployment> = store
        .list("machinedeployments", None)
        .iter()
        .filter_map(|v| MachineDeployment::from_value(v, version).ok())
        .collect();
    let claims: BTreeMap<String, Value> = store
        .list("nodeclaims", None)
        .into_iter()
        .filter_map(|c| {
            c.pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_string)
                .map(|n| (n, c))
        })
        .collect();

    // Invariant 1: one-to-one, and both halves agree.
    let mut by_claim: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for m in &machines {
        if let Some(c) = bound_claim(m) {
            by_claim.entry(c).or_default().push(m.key());
        }
    }
    for (claim, ms) in &by_claim {
        if ms.len() > 1 {
            inv.double_bound += 1;
            inv.problems.push(format!(
                "NodeClaim {claim} is named by Machines {}",
                ms.join(", ")
            ));
        }
    }
    let mut named: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, c) in &claims {
        if let Some(m) = annotation(c, MACHINE_ANNOTATION) {
            named.entry(m).or_default().push(name);
        }
    }
    for (machine, cs) in &named {
        if cs.len() > 1 {
            inv.double_bound += 1;
            inv.problems.push(format!(
                "Machine {machine} is named by NodeClaims {}",
                cs.join(", ")
            ));
        }
        let Some(m) = machines.iter().find(|m| m.key() == *machine) else {
            continue;
        };
        if let Some(c) = cs.first()
            && bound_claim(m) != Some(*c)
        {
            inv.problems.push(format!(
                "NodeClaim {c} names Machine {machine}, which names {:?}",
                bound_claim(m)
            ));
        }
    }

    // Invariant 2: no leak, replicas equal live Machines.
    for md in mds.iter().filter(|md| md.labels.contains_key(MEMBER_LABEL)) {
        let key = md.key();
        let live: Vec<&Machine> = machines
            .iter()
            .filter(|m| {
                deployment_key(m).as_deref() == Some(key.as_str()) && m.deletion_timestamp.is_none()
            })
            .collect();
        let bound: BTreeSet<&str> = live
            .iter()
            .filter(|m| {
                bound_claim(m).is_some_and(|c| claims.get(c).is_some_and(|cv| !is_deleting(cv)))
            })
            .map(|m| m.name.as_str())
            .collect();
        inv.bound += bound.len();
        let managed = crate::actors::scaler::managed_replicas(md);
        let replicas = md.spec_replicas.unwrap_or(0);
        let baseline = (replicas - managed).max(0) as usize;
        let unbound = live.len() - bound.len();
        if unbound > baseline {
            inv.leaked += unbound - baseline;
            inv.problems.push(format!(
                "MachineDeployment {key}: {} live Machines bound to no live NodeClaim beyond a baseline of {baseline}",
                unbound - baseline
            ));
        }
        if replicas as usize != live.len() {
            inv.problems.push(format!(
                "MachineDeployment {key}: spec.replicas {replicas} but {} live Machines",
                live.len()
            ));
        }
    }
    inv
}
