//! The durable-state invariants, checked against the simulated server's store once nothing is in
//! flight: one Machine per claim and one claim per Machine, no leaked Machine, replicas equal to
//! the live Machines of every managed MachineDeployment and MachinePool. A pool without
//! MachinePool Machines is checked the same way over its instances (`spec.providerIDList`), each
//! bound by the claim that names it (`karpenter.cluster.x-k8s.io/instance`), one claim per
//! instance.
//!
//! The objects are read as the store holds them (raw JSON: annotations, labels, spec.replicas),
//! never through the controller's Cluster API model or its indexes, so a bug in how the controller
//! reads them cannot hide a violation.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

use crate::api::wellknown::{
    DEPLOYMENT_NAME_LABEL, INSTANCE_ANNOTATION, MACHINE_ANNOTATION, MACHINE_DEPLOYMENT_ANNOTATION,
    MANAGED_REPLICAS_ANNOTATION, MEMBER_LABEL, NODECLAIM_ANNOTATION, POOL_NAME_LABEL,
};
use crate::capi::version::CapiVersion;
use crate::sim::Store;

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

fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
}

/// `namespace/name`, as the claims' Machine annotation names a Machine.
fn key_of(obj: &Value) -> Option<String> {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str)?;
    let namespace = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    Some(format!("{namespace}/{name}"))
}

/// The store's resources of the two scalable kinds, and the kind word messages use.
pub(crate) const SCALABLE_RESOURCES: [(&str, &str); 2] = [
    ("machinedeployments", "MachineDeployment"),
    ("machinepools", "MachinePool"),
];

/// The resource and name of the MachineDeployment or MachinePool a Machine belongs to, by
/// Cluster API's labels.
pub(crate) fn scalable_of(m: &Value) -> Option<(&'static str, &str)> {
    label(m, DEPLOYMENT_NAME_LABEL)
        .map(|md| ("machinedeployments", md))
        .or_else(|| label(m, POOL_NAME_LABEL).map(|mp| ("machinepools", mp)))
}

/// A Machine as the invariants read it.
struct RawMachine {
    key: String,
    name: String,
    /// The NodeClaim its durable annotation names (empty counts as none).
    claim: Option<String>,
    /// Resource and `namespace/name` of its MachineDeployment or MachinePool, from Cluster
    /// API's labels.
    deployment: Option<(&'static str, String)>,
    deleting: bool,
}

impl RawMachine {
    fn of(v: &Value) -> Option<Self> {
        let key = key_of(v)?;
        let (namespace, name) = key.split_once('/')?;
        Some(Self {
            name: name.to_string(),
            claim: annotation(v, NODECLAIM_ANNOTATION)
                .filter(|c| !c.is_empty())
                .map(str::to_string),
            deployment: scalable_of(v).map(|(r, md)| (r, format!("{namespace}/{md}"))),
            deleting: is_deleting(v),
            key,
        })
    }
}

/// The instances of every MachinePool without MachinePool Machines (no Machine names it), as
/// Machines bound to the claim that names their provider ID; two claims naming one instance
/// are counted as double-bound.
fn pool_instances(
    scalables: &[(&str, &str, Value)],
    machines: &[RawMachine],
    claims: &BTreeMap<String, Value>,
    inv: &mut Invariants,
) -> Vec<RawMachine> {
    let with_machines: BTreeSet<&str> = machines
        .iter()
        .filter_map(|m| m.deployment.as_ref())
        .filter(|(r, _)| *r == "machinepools")
        .map(|(_, k)| k.as_str())
        .collect();
    let mut out = Vec::new();
    for (_, _, mp) in scalables.iter().filter(|(r, _, _)| *r == "machinepools") {
        let Some(key) = key_of(mp) else { continue };
        if with_machines.contains(key.as_str()) {
            continue;
        }
        let recorded = format!("MachinePool/{key}");
        let mut holders: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, c) in claims {
            if annotation(c, MACHINE_DEPLOYMENT_ANNOTATION) == Some(recorded.as_str())
                && let Some(pid) = annotation(c, INSTANCE_ANNOTATION)
            {
                holders.entry(pid).or_default().push(name);
            }
        }
        for (pid, cs) in holders.iter().filter(|(_, cs)| cs.len() > 1) {
            inv.double_bound += 1;
            inv.problems.push(format!(
                "instance {pid} is named by NodeClaims {}",
                cs.join(", ")
            ));
        }
        let listed: BTreeSet<&str> = mp
            .pointer("/spec/providerIDList")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        out.extend(listed.into_iter().map(|pid| {
            RawMachine {
                key: pid.to_string(),
                name: pid.to_string(),
                claim: holders
                    .get(pid)
                    .and_then(|cs| cs.first())
                    .map(|c| c.to_string()),
                deployment: Some(("machinepools", key.clone())),
                deleting: false,
            }
        }));
    }
    out
}

fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// `_version`: the fields read here are the same in every Cluster API version the simulated
/// cluster serves.
pub fn check(store: &Store, version: CapiVersion) -> Invariants {
    check_apart(store, store, version)
}

/// [`check`] with Cluster API's objects in `capi`, a management cluster apart from the workload
/// cluster `store` holding the claims.
pub fn check_apart(store: &Store, capi: &Store, _version: CapiVersion) -> Invariants {
    check_in(store, capi, None)
}

/// [`check_apart`] over the Cluster API objects of namespace `scope` alone (every namespace
/// when None): a management cluster shared by a fleet holds each cluster's in a namespace of
/// its own.
pub fn check_in(store: &Store, capi: &Store, scope: Option<&str>) -> Invariants {
    let mut inv = Invariants::default();
    let mut machines = read_machines(capi, scope, &mut inv);
    let scalables: Vec<(&str, &str, Value)> = SCALABLE_RESOURCES
        .iter()
        .flat_map(|(r, kind)| capi.list(r, scope).into_iter().map(move |v| (*r, *kind, v)))
        .collect();
    let claims = read_claims(store);
    // A MachinePool without Machines has its instances stand in for them.
    let instances = pool_instances(&scalables, &machines, &claims, &mut inv);
    machines.extend(instances);
    // Invariant 1: one-to-one, and both halves agree.
    check_claims_named_once(&machines, &mut inv);
    check_machines_named_once(&machines, &claims, &mut inv);
    // Invariant 2: no leak, replicas equal live Machines.
    for (resource, kind, md) in scalables
        .iter()
        .filter(|(_, _, md)| label(md, MEMBER_LABEL).is_some())
    {
        check_replicas(resource, kind, md, &machines, &claims, &mut inv);
    }
    inv
}

/// Every Machine, an unreadable one as a problem.
fn read_machines(store: &Store, scope: Option<&str>, inv: &mut Invariants) -> Vec<RawMachine> {
    store
        .list("machines", scope)
        .iter()
        .filter_map(|v| {
            let m = RawMachine::of(v);
            if m.is_none() {
                inv.problems.push(format!("unreadable Machine: {v}"));
            }
            m
        })
        .collect()
}

/// Every NodeClaim by name.
fn read_claims(store: &Store) -> BTreeMap<String, Value> {
    store
        .list("nodeclaims", None)
        .into_iter()
        .filter_map(|c| {
            c.pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_string)
                .map(|n| (n, c))
        })
        .collect()
}

/// No NodeClaim is named by two Machines.
fn check_claims_named_once(machines: &[RawMachine], inv: &mut Invariants) {
    let mut by_claim: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for m in machines {
        if let Some(c) = &m.claim {
            by_claim.entry(c).or_default().push(m.key.clone());
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
}

/// No Machine is named by two NodeClaims, and the Machine a NodeClaim names names it back.
fn check_machines_named_once(
    machines: &[RawMachine],
    claims: &BTreeMap<String, Value>,
    inv: &mut Invariants,
) {
    let mut named: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, c) in claims {
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
        let Some(m) = machines.iter().find(|m| m.key == *machine) else {
            continue;
        };
        if let Some(c) = cs.first()
            && m.claim.as_deref() != Some(*c)
        {
            inv.problems.push(format!(
                "NodeClaim {c} names Machine {machine}, which names {:?}",
                m.claim
            ));
        }
    }
}

/// One member MachineDeployment or MachinePool: no more live Machines bound to no live claim
/// than the replicas the controller does not own (a leak otherwise), and its replicas equal to
/// its live Machines.
fn check_replicas(
    resource: &str,
    kind: &str,
    md: &Value,
    machines: &[RawMachine],
    claims: &BTreeMap<String, Value>,
    inv: &mut Invariants,
) {
    let Some(key) = key_of(md) else {
        return;
    };
    let live: Vec<&RawMachine> = machines
        .iter()
        .filter(|m| {
            m.deployment
                .as_ref()
                .is_some_and(|(r, k)| *r == resource && *k == key)
                && !m.deleting
        })
        .collect();
    let bound: BTreeSet<&str> = live
        .iter()
        .filter(|m| {
            m.claim
                .as_deref()
                .is_some_and(|c| claims.get(c).is_some_and(|cv| !is_deleting(cv)))
        })
        .map(|m| m.name.as_str())
        .collect();
    inv.bound += bound.len();
    // The replicas the controller says it owns; an absent or unreadable annotation is none.
    let managed = annotation(md, MANAGED_REPLICAS_ANNOTATION)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .unwrap_or(0)
        .max(0);
    let replicas = md
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let baseline = (replicas - managed).max(0) as usize;
    let unbound = live.len() - bound.len();
    if unbound > baseline {
        inv.leaked += unbound - baseline;
        inv.problems.push(format!(
            "{kind} {key}: {} live Machines bound to no live NodeClaim beyond a baseline of {baseline}",
            unbound - baseline
        ));
    }
    if replicas as usize != live.len() {
        inv.problems.push(format!(
            "{kind} {key}: spec.replicas {replicas} but {} live Machines",
            live.len()
        ));
    }
}
