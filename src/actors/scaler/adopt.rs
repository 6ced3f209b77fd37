//! Adopting what another provisioner left: Machines the Go Cluster API provider claimed (its
//! member label on the Machine, `cluster.x-k8s.io/machine` on the claim, no binding of ours) and
//! the replicas it raised, so a switch-over writes no replica, deletes nothing and drains nothing.
//!
//! The replicas we own are recorded once, absolutely, before any adopted Machine is bound: a
//! restart between the two finds the count already there and the bindings still to do, and
//! counts nothing twice.

use std::collections::{BTreeMap, HashSet};

use kube::ResourceExt;

use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::{MANAGED_REPLICAS_ANNOTATION, MEMBER_LABEL};
use crate::capi::model::{Machine, MachineDeployment};
use crate::state::claims::{Claims, is_ours, provider_id, recorded_deployment, recorded_machine};
use crate::state::machines::{bound_claim, claimed_elsewhere, key, released_elsewhere};

/// The live Machines among `machines` that a claim names with `cluster.x-k8s.io/machine` while
/// no binding of ours does: machine key to claim name.
pub(crate) fn adopted(machines: &[&Machine], claims: &Claims) -> BTreeMap<String, String> {
    // Claimed elsewhere first: the one label lookup that rules out almost every Machine.
    let wanted: HashSet<String> = machines
        .iter()
        .filter(|m| claimed_elsewhere(m))
        .filter(|m| m.deletion_timestamp.is_none() && !released_elsewhere(m))
        .map(|m| key(&m.namespace, &m.name))
        .collect();
    if wanted.is_empty() {
        return BTreeMap::new();
    }
    claims
        .all()
        .filter_map(|c| {
            let mk = recorded_machine(c)?;
            wanted.contains(mk).then(|| (mk.to_string(), c.name_any()))
        })
        .collect()
}

/// Claims still to be placed by anyone: neither a MachineDeployment nor a Machine recorded, not
/// launched, not deleting (the Go provider's claims between its replica raise and its bind).
pub(super) fn unplaced(c: &NodeClaim) -> bool {
    c.metadata.deletion_timestamp.is_none()
        && recorded_deployment(c).is_none()
        && recorded_machine(c).is_none()
        && provider_id(c).is_none()
}

/// The replicas of `md` to own when adopting it, or `None` when there is nothing to adopt (we
/// wrote its managed count already, or no Machine of it was claimed by another provisioner):
/// every Machine bound to a claim, ours or adopted, and the free Machines a claim still being
/// placed was raised for (at most one per such claim).
pub(crate) fn managed_at_adoption(
    md: &MachineDeployment,
    md_key: &str,
    machines: &[&Machine],
    claims: &Claims,
) -> Option<i32> {
    if md.annotations.contains_key(MANAGED_REPLICAS_ANNOTATION) {
        return None;
    }
    let live: Vec<&Machine> = machines
        .iter()
        .copied()
        .filter(|m| m.deletion_timestamp.is_none() && !released_elsewhere(m))
        .collect();
    if !live.iter().any(|m| claimed_elsewhere(m)) {
        return None;
    }
    let bound = live
        .iter()
        .filter(|m| m.labels.contains_key(MEMBER_LABEL) || bound_claim(m).is_some())
        .count();
    let free = live.len() - bound;
    let to_place = claims
        .all()
        .filter(|c| is_ours(c))
        .filter(|c| unplaced(c))
        .count()
        + claims.waiting_on(md_key).len();
    let managed = bound + free.min(to_place);
    let spec = md.spec_replicas.unwrap_or(0).max(0) as usize;
    Some(managed.min(spec) as i32)
}
