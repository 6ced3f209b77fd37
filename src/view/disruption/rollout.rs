//! What Cluster API's rollouts, pauses and topologies do to disruption: a paused or rolling-out
//! MachineDeployment, or one whose replicas its Cluster's topology sets, holds its nodes; one
//! at its min size gives none up by choice; and claims on Machines a RollingUpdate outdated
//! are replaced as the rollout makes room.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use kube::ResourceExt;

use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::{REPLACES_ANNOTATION, SET_NAME_LABEL};
use crate::capi::autoscaler;
use crate::capi::deletion;
use crate::capi::model::{DeletionOrder, Machine, MachineDeployment};
use crate::state::claims::{recorded_deployment, recorded_machine};
use crate::state::machines::{MachineDeployments, Machines};

/// What Cluster API's own state of a MachineDeployment does to its nodes' disruption.
#[derive(Clone, Debug)]
pub(super) enum Hold {
    /// Paused, or its replicas held by its Cluster's topology: no replica is written, so none
    /// of its Machines could be given back.
    Paused(String),
    /// A rollout is under way: as the autoscaler, none of its nodes is scaled down meanwhile
    /// (drift still replaces them).
    RollingOut(String),
}

pub(super) fn deployment_hold(
    md: &MachineDeployment,
    cluster_paused: bool,
    replicas_held: Option<String>,
    machines: &[&Machine],
) -> Option<Hold> {
    if let Some(why) = replicas_held {
        return Some(Hold::Paused(format!("its {}: {why}", md.scalable())));
    }
    if cluster_paused {
        return Some(Hold::Paused(format!(
            "its MachineDeployment {}'s Cluster {} is paused (spec.paused or the \"{}\" annotation): Cluster API would not remove its Machine",
            md.key(),
            md.cluster_name,
            autoscaler::PAUSED_ANNOTATION
        )));
    }
    if autoscaler::paused(md) {
        return Some(Hold::Paused(format!(
            "its MachineDeployment {} is paused (\"{}\" annotation or spec.paused): Cluster API would not remove its Machine",
            md.key(),
            autoscaler::PAUSED_ANNOTATION
        )));
    }
    autoscaler::mid_rollout(md, machines).then(|| {
        Hold::RollingOut(format!(
            "its MachineDeployment {} is mid-rollout (Machines not up to date remain): no scale-down until it completes",
            md.key()
        ))
    })
}

/// Cluster Autoscaler's rule: a group at its min-size annotation gives up no node by choice.
/// Removing one would lower no replica (Cluster API keeps the group at min size): the Machine
/// would be deleted and made again, a drain and a boot for nothing.
pub(super) fn at_min_size(group: &MachineDeployment) -> Option<String> {
    let min: i32 = group
        .annotations
        .get(crate::api::wellknown::MIN_SIZE_ANNOTATION)?
        .trim()
        .trim_start_matches('+')
        .parse()
        .ok()?;
    let replicas = group.spec_replicas?;
    (min > 0 && replicas <= min).then(|| {
        format!(
            "its {} is at its min size ({replicas} replicas, min {min}): Cluster API would only make its Machine again",
            group.scalable()
        )
    })
}

/// A RollingUpdate in progress, as the claims see it: which claims sit on outdated Machines and
/// which claims were created to replace them.
pub(super) struct Rollout {
    /// Replacement claim -> the claim it replaces, while that one is still on an outdated
    /// Machine (both stay out of consolidation until Cluster API deletes the old Machine).
    replacing: HashMap<String, String>,
}

impl Rollout {
    pub(super) fn new(
        claims: &[Arc<NodeClaim>],
        machines: &Machines,
        mds: &MachineDeployments,
    ) -> Self {
        let outdated: HashSet<String> = claims
            .iter()
            .filter(|c| outdated_under_rolling_update(c, machines, mds))
            .map(|c| c.name_any())
            .collect();
        let replacing = claims
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter_map(|c| {
                let old = c.annotations().get(REPLACES_ANNOTATION)?;
                outdated.contains(old).then(|| (c.name_any(), old.clone()))
            })
            .collect();
        Self { replacing }
    }

    /// Why the claim is not a consolidation candidate now, if the rollout holds it.
    pub(super) fn protects(&self, claim: &str) -> Option<String> {
        if let Some(old) = self.replacing.get(claim) {
            return Some(format!(
                "it replaces NodeClaim {old}, whose Machine a Cluster API rollout is replacing"
            ));
        }
        self.replacing
            .values()
            .any(|o| o == claim)
            .then(|| "a Cluster API rollout is replacing its Machine".to_string())
    }

    /// Outdated claims to replace now: per MachineDeployment, as many as the rollout has fresh
    /// Machines that neither a claim holds nor a replacement already waits for, oldest first.
    pub(super) fn replace_now(
        &self,
        claims: &[Arc<NodeClaim>],
        machines: &Machines,
        mds: &MachineDeployments,
    ) -> Vec<Arc<NodeClaim>> {
        let replaced: HashSet<&String> = self.replacing.values().collect();
        let mut waiting: HashMap<&str, usize> = HashMap::new();
        for new in self.replacing.keys() {
            let Some(c) = claims
                .iter()
                .find(|c| c.metadata.name.as_ref() == Some(new))
            else {
                continue;
            };
            if let (Some(md), None) = (recorded_deployment(c), recorded_machine(c)) {
                *waiting.entry(md).or_default() += 1;
            }
        }
        let mut by_md: BTreeMap<&str, Vec<&Arc<NodeClaim>>> = BTreeMap::new();
        for c in claims {
            if outdated_under_rolling_update(c, machines, mds)
                && !replaced.contains(&c.name_any())
                && let Some(md) = recorded_deployment(c)
            {
                by_md.entry(md).or_default().push(c);
            }
        }
        let mut out = Vec::new();
        for (md, mut olds) in by_md {
            let of_md = machines.of_deployment(md);
            if !marks_complete(&of_md) {
                continue;
            }
            let fresh = of_md
                .iter()
                .filter(|m| m.up_to_date == Some(true) && !m.is_deleting())
                .filter(|m| crate::state::machines::bound_claim(m).is_none())
                .count();
            let free = fresh.saturating_sub(waiting.get(md).copied().unwrap_or(0));
            // Cluster API's rollout deletes old Machines in its MachineSet's deletion order
            // (`capi::deletion`; Random, the default, by name): the first fresh Machines go to
            // the claims whose Machines it deletes first.
            let order = mds
                .get(md)
                .and_then(|d| d.deletion_order)
                .unwrap_or(DeletionOrder::Random);
            olds.sort_by_cached_key(|c| {
                machines
                    .bound_to(&c.name_any())
                    .ok()
                    .flatten()
                    .map(|m| deletion::turn(order, &m))
            });
            out.extend(olds.into_iter().take(free).cloned());
        }
        out
    }
}

/// Whether Cluster API has marked every outdated Machine of a MachineDeployment: the Machines
/// still up to date all belong to one MachineSet (the new one). Cluster API marks each Machine
/// in its own reconcile while the new MachineSet already creates fresh ones, so until then the
/// claims seen outdated are only some of those its rollout deletes, and pairing the first fresh
/// Machine with one of them could foresee the wrong one (the rollout deletes in its own order).
fn marks_complete(machines: &[&Machine]) -> bool {
    let sets: HashSet<Option<&String>> = machines
        .iter()
        .filter(|m| m.up_to_date == Some(true) && !m.is_deleting())
        .map(|m| m.labels.get(SET_NAME_LABEL))
        .collect();
    sets.len() <= 1
}

/// The claim is alive on a Machine that a RollingUpdate MachineDeployment has outdated.
fn outdated_under_rolling_update(
    c: &NodeClaim,
    machines: &Machines,
    mds: &MachineDeployments,
) -> bool {
    let Some(md) = recorded_deployment(c) else {
        return false;
    };
    c.metadata.deletion_timestamp.is_none()
        && mds.get(md).is_some_and(|d| !d.on_delete)
        && machines
            .bound_to(&c.name_any())
            .ok()
            .flatten()
            .is_some_and(|m| m.up_to_date == Some(false) && !m.is_deleting())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md() -> MachineDeployment {
        let v = serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
            "metadata": {"name": "md", "namespace": "ns", "uid": "u", "resourceVersion": "1"},
            "spec": {"clusterName": "c",
                     "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": "md"}},
                     "template": {"spec": {"clusterName": "c", "bootstrap": {},
                                  "infrastructureRef": {"apiGroup": "infra", "kind": "K", "name": "t"}}}}
        });
        MachineDeployment::from_value(&v, crate::capi::CapiVersion::V1Beta2).expect("an MD")
    }

    /// Replicas a topology holds stop every disruption of the group's nodes (drift included:
    /// a `Paused` hold is never a drift candidate's exception), naming the group and why.
    #[test]
    fn replicas_held_by_a_topology_hold_the_nodes_as_a_pause_does() {
        let why = "its replicas belong to Cluster ns/c's topology".to_string();
        match deployment_hold(&md(), false, Some(why), &[]) {
            Some(Hold::Paused(m)) => {
                assert!(m.contains("MachineDeployment ns/md"), "{m}");
                assert!(m.contains("Cluster ns/c's topology"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        assert!(deployment_hold(&md(), false, None, &[]).is_none());
    }
}
