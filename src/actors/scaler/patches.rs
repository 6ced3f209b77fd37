//! The JSON patches a Scaler sends, each guarded so that a concurrent writer makes it conflict
//! rather than be overwritten.

use std::collections::{BTreeSet, HashSet};

use serde_json::{Value, json};

use super::DELETE_MACHINE_VALUE;
use super::plan::ReplicaWrite;
use crate::actors::patch::{JsonPatch, escape};
use crate::api::wellknown::{
    DELETE_MACHINE_ANNOTATION, EXCLUDE_NODE_DRAINING_ANNOTATION, HANDED_BACK_ANNOTATION,
    MANAGED_REPLICAS_ANNOTATION, MEMBER_LABEL, NODECLAIM_ANNOTATION,
};
use crate::capi::model::{Machine, MachineDeployment};

/// Binds `machine` to `claim`: the claim's name in its annotations and our member label.
/// Guarded on the maps it reads and writes (the binding lives in the annotations), not the whole
/// resourceVersion: Cluster API writes Machine status all the time, and those writes must not
/// make a bind conflict. A map the Machine does not have yet is tested for null: the API
/// server's json-patch passes that only while the member is absent (and never serves an empty
/// map), so a concurrent bind still conflicts.
pub(super) fn bind(machine: &Machine, claim: &str) -> JsonPatch {
    let mut p = JsonPatch::new();
    p.test("/metadata/annotations", json_map(&machine.annotations));
    if machine.labels.is_empty() {
        p.test("/metadata/labels", Value::Null);
    }
    p.set_entry(
        !machine.annotations.is_empty(),
        "/metadata/annotations",
        NODECLAIM_ANNOTATION,
        claim,
    );
    p.set_entry(
        !machine.labels.is_empty(),
        "/metadata/labels",
        MEMBER_LABEL,
        "",
    );
    p
}

/// Marks `machine` for deletion (the decrement follows in a replica write), and tells Cluster
/// API not to drain it again when we `drained` it already. Guarded by its resourceVersion.
pub(super) fn release(machine: &Machine, drained: bool) -> JsonPatch {
    let mut p = JsonPatch::guarded(Some(machine.resource_version.as_str()));
    p.set_entry(
        !machine.annotations.is_empty(),
        "/metadata/annotations",
        DELETE_MACHINE_ANNOTATION,
        DELETE_MACHINE_VALUE,
    );
    if drained {
        p.set_entry(
            true,
            "/metadata/annotations",
            EXCLUDE_NODE_DRAINING_ANNOTATION,
            DELETE_MACHINE_VALUE,
        );
    }
    p
}

/// The replica write `w` on `md`: a compare-and-swap on `spec.replicas` and on the managed
/// replicas annotation, so a write from a stale view conflicts instead of landing.
pub(super) fn replicas(md: &MachineDeployment, w: &ReplicaWrite) -> JsonPatch {
    let mut p = JsonPatch::new();
    match md.spec_replicas {
        Some(r) => p.test("/spec/replicas", json!(r)),
        None => &mut p,
    };
    p.set("/spec/replicas", json!(w.to));
    if let Some(v) = md.annotations.get(MANAGED_REPLICAS_ANNOTATION) {
        p.test(
            &format!(
                "/metadata/annotations/{}",
                escape(MANAGED_REPLICAS_ANNOTATION)
            ),
            json!(v),
        );
    }
    p.set_entry(
        !md.annotations.is_empty(),
        "/metadata/annotations",
        MANAGED_REPLICAS_ANNOTATION,
        &w.managed_to.to_string(),
    );
    if !w.handed_back.is_empty() || !w.reclaimed.is_empty() {
        // The map exists now: the entry above made it if it was missing.
        p.set_entry(
            true,
            "/metadata/annotations",
            HANDED_BACK_ANNOTATION,
            &handed_back_value(md, &w.handed_back, &w.reclaimed),
        );
    }
    p
}

/// The provider IDs a pool's handed-back annotation lists.
pub(crate) fn handed_back(md: &MachineDeployment) -> HashSet<String> {
    md.handed_back()
}

/// The handed-back annotation after handing `more` back and taking `taken` again: still-listed
/// instances only, so it shrinks as the cloud removes them.
pub(super) fn handed_back_value(
    md: &MachineDeployment,
    more: &[String],
    taken: &[String],
) -> String {
    let listed: HashSet<&String> = md.provider_id_list.iter().collect();
    let mut all: BTreeSet<String> = handed_back(md)
        .into_iter()
        .filter(|p| listed.contains(p) && !taken.contains(p))
        .collect();
    all.extend(more.iter().cloned());
    all.into_iter().collect::<Vec<_>>().join(",")
}

/// A string map as a JSON patch `test` value: an empty one is an absent member (null).
fn json_map(m: &std::collections::BTreeMap<String, String>) -> Value {
    if m.is_empty() { Value::Null } else { json!(m) }
}
