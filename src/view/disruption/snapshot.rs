//! The solver's view of the cluster a disruption decision simulates on.

use std::collections::HashSet;

use crate::api::nodeclaim::NodeClaim;
use crate::disruption::Candidate;
use crate::scheduling::Snapshot;
use crate::view::Inputs;

/// The solver's view of the cluster, as the provisioner sees it, with every pod of the nodes a
/// decision may simulate removing: candidates with pods that are due for repair, drifted, or
/// consolidatable under a policy that moves pods (empty ones go without a solve).
pub(crate) fn snapshot(
    view: Inputs<'_>,
    candidates: &[Candidate],
    leaving: &[Candidate],
    under_consolidate_after: &HashSet<String>,
) -> Snapshot {
    let none: [(&u64, &NodeClaim); 0] = [];
    let moving: HashSet<String> = candidates
        .iter()
        .filter(|c| !c.is_empty())
        .filter(|c| c.eligible_reasons().next().is_some())
        .chain(leaving)
        .map(|c| c.node.clone())
        .collect();
    let mut snapshot = crate::view::snapshot::build(
        view,
        none,
        view.settings.preference,
        crate::view::snapshot::BoundPods::Needed { moving: &moving },
    );
    // CapacityQuotas cap provisioning only, as upstream's: a replacement is made in place of
    // what it replaces, and the candidates still count in the quotas' usage here, so a quota
    // at its limit would otherwise refuse every replacing consolidation.
    snapshot.quotas.clear();
    // A moved pod's volumes bound where it may go, as they bound a pending pod.
    let on_moving = snapshot.bound_pods.iter().filter(|p| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some_and(|n| moving.contains(n))
    });
    snapshot.volume_topology = crate::scheduling::volumes::topology_of(
        on_moving.map(|p| &**p),
        &view.state.storage.read().catalog,
    );
    // The nodes of the commands under way are going: their pods are planned as pending.
    let leaving: Vec<&Candidate> = leaving.iter().collect();
    let mut snapshot = if leaving.is_empty() {
        snapshot
    } else {
        crate::disruption::consolidation::without(&snapshot, &leaving)
    };
    // Their pods are not the next decision's moved pods: nodes inside consolidateAfter may
    // take them, as upstream lets pods of deleting nodes go there. They are displaced, as the
    // pods of deleting nodes are: the next decision must leave them room.
    let leaving_pods = std::mem::take(&mut snapshot.moved);
    snapshot.displaced.extend(leaving_pods);
    snapshot.under_consolidate_after = under_consolidate_after.clone();
    snapshot
}
