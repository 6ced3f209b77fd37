//! What a Scaler keeps track of between plans: the planner's inputs gathered from the indexes,
//! Machines bound to claims that are gone, decrements Cluster API did not carry out, and the
//! MachineDeployment's size bounds.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::adopt;
use super::plan::MachineView;
use super::take_back::InstanceSide;
use super::{DELETE_MACHINE_VALUE, Scaler};
use crate::actors::messages::{Rejection, RequestRejected};
use crate::api::wellknown::DELETE_MACHINE_ANNOTATION;
use crate::api::wellknown::{MAX_SIZE_ANNOTATION, MIN_SIZE_ANNOTATION, REPLACES_ANNOTATION};
use crate::capi::annotations;
use crate::capi::model::{Machine, MachineDeployment};
use crate::state::claims::{Claims, is_ours, recorded_deployment, recorded_instance};
use crate::state::machines::{Machines, bound_claim, deployment_key, released_elsewhere};

/// True when the Machine carries our release mark (or any mark while bound to one of our claims).
pub(crate) fn marked_by_us(m: &Machine) -> bool {
    match m.annotations.get(DELETE_MACHINE_ANNOTATION) {
        Some(v) => v == DELETE_MACHINE_VALUE || bound_claim(m).is_some(),
        None => false,
    }
}

// Read where the catalog counts a group's room too (`capi::room`).
pub(crate) use crate::capi::room::managed_replicas;

/// How a Machine left the planner's count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Removal {
    /// Its replica was removed by the write that produced this MachineDeployment generation.
    Decremented { generation: Option<i64> },
    /// Deleted directly (below min-size): the API server, not a MachineSet, removes it.
    Deleted,
}

/// min-size and max-size from their own annotations only (a malformed capacity annotation must
/// not switch the bounds off); a malformed size annotation keeps `last` (the last good bounds).
pub(crate) fn size_bounds(
    annotations: &std::collections::BTreeMap<String, String>,
    last: Option<(i32, Option<i32>)>,
) -> (i32, Option<i32>) {
    let sizes: std::collections::BTreeMap<String, String> = annotations
        .iter()
        .filter(|(k, _)| *k == MIN_SIZE_ANNOTATION || *k == MAX_SIZE_ANNOTATION)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    match annotations::parse(&sizes) {
        Ok(s) => (s.min_size.unwrap_or(0), s.max_size),
        // Never seen good bounds: refuse to grow beyond what exists rather than run unbounded.
        Err(_) => last.unwrap_or((0, Some(0))),
    }
}

/// What `plan` needs, gathered from the indexes.
pub(super) struct Inputs {
    pub(super) md: Arc<MachineDeployment>,
    /// Decremented Machines Cluster API will not remove (see `spent_decrements`).
    pub(super) spent: Vec<Arc<Machine>>,
    pub(super) machines: Vec<MachineView>,
    pub(super) waiting: Vec<String>,
    pub(super) min_size: i32,
    pub(super) max_size: Option<i32>,
    pub(super) rolling_out: bool,
    /// Machines another provisioner bound (machine key to claim), to bind as ours.
    pub(super) adopted: std::collections::BTreeMap<String, String>,
    /// The managed count to record before adopting them (`None`: recorded already).
    pub(super) adopt_managed: Option<i32>,
    /// A pool without MachinePool Machines: its handed-back instances (its views are in
    /// `machines`; empty for any other kind).
    pub(super) instances: InstanceSide,
}

/// What [`Scaler::machine_views`] reads off the Machines: the decrements Cluster API spent
/// elsewhere, the planner's views, whether a rollout is under way, the Machines to adopt and
/// the managed count to record first.
type MachineSide = (
    Vec<Arc<Machine>>,
    Vec<MachineView>,
    bool,
    std::collections::BTreeMap<String, String>,
    Option<i32>,
);

impl Scaler {
    /// Machines bound to a claim that is gone (deleted while a bind was landing, or removed by
    /// someone else): garbage to release, once the claim index had time to see the claim.
    pub(super) fn orphans(&mut self, machines: &[MachineView]) -> Vec<String> {
        const GRACE: Duration = Duration::from_secs(30);
        let claims = self.shared.state.claims.read();
        // Only claims whose Machine is still here can need the grace period. A set, not a
        // search of the Machines per claim: in a burst both are the MachineDeployment's size,
        // and the search was a quarter of each re-plan.
        if !self.bound_at.is_empty() {
            let bound: HashSet<&str> = machines
                .iter()
                .filter_map(|m| m.bound_to.as_deref())
                .collect();
            self.bound_at
                .retain(|c, t| t.elapsed() < GRACE * 2 && bound.contains(c.as_str()));
        }
        if !claims.synced() {
            return Vec::new();
        }
        machines
            .iter()
            .filter(|m| !m.marked)
            .filter_map(|m| {
                let c = m.bound_to.as_deref()?;
                let fresh = self.bound_at.get(c).is_some_and(|t| t.elapsed() < GRACE);
                let in_flight = self.binding.contains_key(&m.key);
                (!claims.contains(c) && !fresh && !in_flight).then(|| m.key.clone())
            })
            .collect()
    }

    /// Claims of ours not yet on any MachineDeployment (see `plan::Snapshot::unplaced`): a scan
    /// of every claim, so counted only when a plan would release a spare Machine.
    pub(super) fn unplaced(&self) -> i32 {
        let claims = self.shared.state.claims.read();
        claims
            .all()
            .filter(|c| is_ours(c) && adopt::unplaced(c))
            .count() as i32
    }

    /// Gather the planner's inputs; `None` when the MachineDeployment is gone.
    pub(super) fn inputs(&mut self) -> Option<Inputs> {
        let md = self.shared.state.deployments.read().get(&self.md)?;
        if md.deletion_timestamp.is_some() {
            return None;
        }
        let (min_size, max_size) = size_bounds(&md.annotations, self.bounds);
        self.bounds = Some((min_size, max_size));

        let (machine_side, instances) = if self.instances_only() {
            let mut side = self.instance_views(&md);
            let views = std::mem::take(&mut side.views);
            ((Vec::new(), views, false, Default::default(), None), side)
        } else {
            (self.machine_views(&md), InstanceSide::default())
        };
        let (spent, views, rolling_out, adopted, adopt_managed) = machine_side;

        let claims = self.shared.state.claims.read();
        if claims.synced() {
            // A turned-down claim that is gone will never ask again.
            self.rejected.retain(|c| claims.contains(c));
        }
        self.asked.retain(|(c, at)| match claims.get(c) {
            // Not in the index yet (its write is newer than our watch): keep asking for a
            // while; a claim the index never shows is gone, and must not hold a replica.
            None => at.elapsed() < Duration::from_secs(30),
            // The index may not have seen the write that recorded this MachineDeployment.
            Some(cl) => {
                cl.metadata.deletion_timestamp.is_none()
                    && recorded_deployment(&cl).is_none_or(|md| md == self.md)
            }
        });
        let waiting = self.waiting(&claims, &views);
        Some(Inputs {
            md,
            spent,
            machines: views,
            waiting,
            min_size,
            max_size,
            rolling_out,
            instances,
            adopted,
            adopt_managed,
        })
    }

    /// Claims waiting for a Machine of this MachineDeployment, oldest first (ties by name):
    /// those the claim index says recorded it and those that asked, less those turned down,
    /// bound (in `views`, in the Machine index) or holding a pool instance. Borrowed until the
    /// end: only the claims that wait are copied.
    fn waiting(&self, claims: &Claims, views: &[MachineView]) -> Vec<String> {
        let bound_now: HashSet<&str> = views.iter().filter_map(|v| v.bound_to.as_deref()).collect();
        let machines = self.shared.state.machines.read();
        let mut waiting: Vec<(Option<Time>, &str)> = claims
            .waiting_on(&self.md)
            .iter()
            .chain(self.asked.iter().map(|(c, _)| c))
            .map(String::as_str)
            .filter(|c| !self.rejected.contains(*c) && !bound_now.contains(c))
            .filter(|c| matches!(machines.bound_to(c), Ok(None)))
            .filter_map(|c| match claims.get(c) {
                Some(cl) if recorded_instance(&cl).is_some() => None,
                cl => Some((cl.and_then(|cl| cl.metadata.creation_timestamp.clone()), c)),
            })
            .collect();
        // A claim that asked is usually in the index's set too: once sorted, its copies are
        // side by side.
        waiting.sort_unstable();
        waiting.dedup_by(|a, b| a.1 == b.1);
        waiting.into_iter().map(|(_, c)| c.to_string()).collect()
    }

    /// The MachineDeployment's (or pool's) Machines as the planner sees them, the decrements
    /// Cluster API spent elsewhere, whether a rollout is under way, and the Machines another
    /// provisioner bound that are to be adopted.
    fn machine_views(&mut self, md: &MachineDeployment) -> MachineSide {
        let machines = self.shared.state.machines.read();
        let keyed: Vec<(&str, &Machine)> = machines.keyed_of_deployment(&self.md).collect();
        let all: Vec<&Machine> = keyed.iter().map(|(_, m)| *m).collect();
        // Decremented Machines stay until they are deleting, gone or no longer this one's: a
        // lookup each (they are few), not a set of every Machine's key.
        let md_key = self.md.as_str();
        self.decremented.retain(|k, _| {
            machines.get(k).is_some_and(|m| {
                m.deletion_timestamp.is_none() && deployment_key(&m).as_deref() == Some(md_key)
            })
        });
        let spent = self.spent_decrements(md, &machines);
        self.binding.retain(|mk, _| {
            machines
                .get(mk)
                .map(|m| bound_claim(&m).is_none())
                .unwrap_or(false)
        });

        // Cluster API replaces outdated Machines itself under RollingUpdate (not OnDelete, where
        // disruption replaces them as drift).
        let rolling_out = !md.on_delete && all.iter().any(|m| m.up_to_date == Some(false));
        let replaced = if rolling_out {
            replaced_claims(&self.shared.state.claims.read(), &self.md)
        } else {
            HashSet::new()
        };
        let (adopted, adopt_managed) = {
            let claims = self.shared.state.claims.read();
            (
                adopt::adopted(&all, &claims),
                adopt::managed_at_adoption(md, &self.md, &all, &claims),
            )
        };
        let views: Vec<MachineView> = keyed
            .iter()
            .filter(|(k, m)| {
                m.deletion_timestamp.is_none()
                    && !released_elsewhere(m)
                    && !self.decremented.contains_key(*k)
            })
            .map(|&(k, m)| MachineView {
                bound_to: bound_claim(m)
                    .map(str::to_string)
                    .or_else(|| self.binding.get(k).cloned())
                    .or_else(|| adopted.get(k).cloned()),
                marked: marked_by_us(m),
                replaced: m.up_to_date == Some(false)
                    && bound_claim(m).is_some_and(|c| replaced.contains(c)),
                key: k.to_string(),
            })
            .collect();

        (spent, views, rolling_out, adopted, adopt_managed)
    }

    pub(super) fn reject_all(&mut self, why: Rejection) {
        let claims: Vec<String> = self.asked.iter().map(|(c, _)| c.clone()).collect();
        for c in claims {
            self.reject(&c, why);
        }
    }

    pub(super) fn reject(&mut self, claim: &str, why: Rejection) {
        self.asked.retain(|(c, _)| c != claim);
        self.rejected.insert(claim.to_string());
        if let Some(addr) = self.shared.router.claim(claim) {
            addr.do_send(RequestRejected {
                machine_deployment: self.md.clone(),
                why,
            });
        }
    }

    /// Decremented Machines that Cluster API will not remove: the MachineDeployment's status
    /// is at its current generation (no older than our write) and counts as many Machines as
    /// replicas, yet they are still here and not deleting. Their MachineSet spent the decrement
    /// elsewhere: it had fewer Machines than replicas (Cluster API removes Machines only beyond
    /// the replicas, so a decrement while it is still creating cancels a creation instead), its
    /// cache had not seen our mark yet, another Machine was being deleted at that moment (a
    /// MachineHealthCheck, a user), or a rollout chose elsewhere.
    pub(super) fn spent_decrements(
        &self,
        md: &MachineDeployment,
        machines: &Machines,
    ) -> Vec<Arc<Machine>> {
        let Some(observed) = md.observed_generation else {
            return Vec::new();
        };
        let settled = !self.writing
            && md.status_replicas.is_some()
            && md.status_replicas == md.spec_replicas
            && md.generation.is_none_or(|g| observed >= g);
        if !settled {
            return Vec::new();
        }
        self.decremented
            .iter()
            .filter(|(k, r)| {
                !self.verifying.contains(*k)
                    && matches!(r, Removal::Decremented { generation: Some(g) } if observed >= *g)
            })
            .filter_map(|(k, _)| machines.get(k))
            .filter(|m| m.deletion_timestamp.is_none())
            .collect()
    }
}

/// Claims of `md` that a rollout replacement (a claim created for a fresh Machine, naming them)
/// stands in for: their outdated Machines no longer count as replicas we need.
fn replaced_claims(claims: &crate::state::claims::Claims, md: &str) -> HashSet<String> {
    claims
        .all()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| recorded_deployment(c) == Some(md))
        .filter_map(|c| c.annotations().get(REPLACES_ANNOTATION).cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::wellknown::CPU_ANNOTATION;
    use std::collections::BTreeMap;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_malformed_capacity_annotation_keeps_the_size_bounds() {
        let a = annotations(&[
            (MIN_SIZE_ANNOTATION, "1"),
            (MAX_SIZE_ANNOTATION, "3"),
            (CPU_ANNOTATION, "four"),
        ]);
        assert_eq!(size_bounds(&a, None), (1, Some(3)));
    }

    #[test]
    fn a_malformed_size_annotation_keeps_the_last_good_bounds() {
        let a = annotations(&[(MIN_SIZE_ANNOTATION, "1"), (MAX_SIZE_ANNOTATION, "lots")]);
        assert_eq!(size_bounds(&a, Some((1, Some(3)))), (1, Some(3)));
        // Never parsed: do not grow at all rather than without bound.
        assert_eq!(size_bounds(&a, None), (0, Some(0)));
        assert_eq!(size_bounds(&BTreeMap::new(), Some((1, Some(3)))), (0, None));
    }
}
