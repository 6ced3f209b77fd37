//! The room a node group (MachineDeployment or MachinePool) has left for new claims under its
//! `cluster-api-autoscaler-node-group-max-size`, as one rule the catalog, the solver, the launch
//! and disruption all read.
//!
//! `spec.replicas` alone is not the count: the Scaler raises it a moment after a claim chose
//! the group (its writes coalesce), so a claim just created holds a slot the replicas do not
//! show yet. A plan made in that moment that counted the slot as free would choose the group
//! again, and the Scaler would turn its claim away at max size (and the claim, with nowhere
//! else to go, would be deleted). So the claims of ours that hold or wait for a replica of the
//! group are counted against the replicas this controller owns (the `managed-replicas`
//! annotation, written in the same patch as `spec.replicas`): what they hold beyond it is not in
//! `spec.replicas` yet, and is added to it. Once the Scaler's write lands, `managed-replicas`
//! rises with `spec.replicas` and the same claims count nothing more: never counted twice. A
//! claim deleted before the write stops counting with it.

use std::collections::{BTreeMap, HashMap};

use crate::api::wellknown::MANAGED_REPLICAS_ANNOTATION;
use crate::capi::model::MachineDeployment;
use crate::scheduling::Offering;

/// Each group's [`Owned`] counts, by key (`offerings::Catalog::owned`).
pub(crate) type OwnedByGroup = BTreeMap<String, Owned>;
/// How many claims hold or wait for a replica of each group, by key (`state::Claims::holding`).
pub(crate) type Holding = HashMap<String, i32>;

/// What a group's room is counted from besides its offering's `replicas` and `max_size`, read
/// from the same MachineDeployment (or MachinePool) object, so the counts agree with each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owned {
    /// The replicas this controller owns (`managed-replicas`).
    pub(crate) managed: i32,
    /// Instances of a pool handed back to it (see `handed_back`): a claim takes one again
    /// without raising the replicas, so each is room under max-size too.
    pub(crate) handed_back: i32,
}

impl Owned {
    pub(crate) fn of(md: &MachineDeployment) -> Self {
        Self {
            managed: managed_replicas(md),
            handed_back: i32::try_from(md.handed_back().len()).unwrap_or(i32::MAX),
        }
    }
}

/// The replicas this controller owns, from the MachineDeployment's annotation.
pub fn managed_replicas(md: &MachineDeployment) -> i32 {
    md.annotations
        .get(MANAGED_REPLICAS_ANNOTATION)
        .and_then(|v| v.trim().parse::<i32>().ok())
        .unwrap_or(0)
        .max(0)
}

/// Replicas that `holding` claims (ours, holding or waiting for a replica of the group) need
/// beyond the `managed` ones the group's replicas already count.
pub(crate) fn unreflected(holding: i32, managed: i32) -> i32 {
    (holding - managed).max(0)
}

/// Whether one more claim fits: `replicas` plus what claims hold beyond them below max-size, or
/// a handed-back instance left to take.
pub(crate) fn has_room(
    replicas: i32,
    max_size: Option<i32>,
    handed_back: i32,
    unreflected: i32,
) -> bool {
    max_size.is_none_or(|max| unreflected < (max - replicas).max(0) + handed_back)
}

/// Counts the claims holding a replica of `o`'s group into it: `replicas` grows by what they
/// hold beyond the replicas, and the offering is unavailable once no claim more fits. A group
/// without max-size never runs out, nor one whose `owned` counts are unknown.
pub(crate) fn count_claims(o: &mut Offering, owned: Option<&Owned>, holding: i32) {
    let (Some(owned), Some(_)) = (owned, o.max_size) else {
        return;
    };
    o.available &= fits_one_more(o, Some(owned), holding);
    o.replicas = o
        .replicas
        .saturating_add(unreflected(holding, owned.managed));
}

/// [`count_claims`] for `o`, its group's counts looked up by its key.
pub(crate) fn count_claims_of(o: &mut Offering, owned: &OwnedByGroup, holding: &Holding) {
    let held = holding.get(&o.machine_deployment).copied().unwrap_or(0);
    count_claims(o, owned.get(&o.machine_deployment), held);
}

/// [`fits_one_more`] for `o`, its group's counts looked up by its key.
pub(crate) fn fits_one_more_of(o: &Offering, owned: &OwnedByGroup, holding: &Holding) -> bool {
    let held = holding.get(&o.machine_deployment).copied().unwrap_or(0);
    fits_one_more(o, owned.get(&o.machine_deployment), held)
}

/// Whether one more claim fits `o`'s group with `holding` claims counted in ([`count_claims`]
/// without changing the offering).
pub(crate) fn fits_one_more(o: &Offering, owned: Option<&Owned>, holding: i32) -> bool {
    let (Some(owned), Some(_)) = (owned, o.max_size) else {
        return true;
    };
    let more = unreflected(holding, owned.managed);
    has_room(o.replicas, o.max_size, owned.handed_back, more)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offering(replicas: i32, max_size: Option<i32>) -> Offering {
        Offering {
            machine_deployment: "default/md-0".into(),
            zone: None,
            capacity_type: "on-demand".into(),
            price: 1.0,
            available: has_room(replicas, max_size, 0, 0),
            labels: Default::default(),
            taints: Vec::new(),
            replicas,
            max_size,
        }
    }

    fn owned(managed: i32) -> Owned {
        Owned {
            managed,
            handed_back: 0,
        }
    }

    /// `replicas` of `max_size` with `managed` of them ours and `holding` claims on the group:
    /// whether it offers one more, and the replicas counted.
    fn counted(replicas: i32, max_size: i32, managed: i32, holding: i32) -> (bool, i32) {
        let mut o = offering(replicas, Some(max_size));
        count_claims(&mut o, Some(&owned(managed)), holding);
        (o.available, o.replicas)
    }

    /// Issue 40: one Machine short of max-size, with a claim just created for it whose replica
    /// the Scaler has not written yet, the group has no room; before the claim it had one.
    #[test]
    fn a_claim_not_in_the_replicas_yet_takes_the_last_slot() {
        assert!(offering(2, Some(3)).available, "one short of max-size");
        assert_eq!(counted(2, 3, 2, 3), (false, 3), "the claim holds the slot");
        assert_eq!(counted(2, 3, 2, 2), (true, 2), "no claim beyond replicas");
    }

    /// Once the Scaler's write lands, `managed-replicas` counts the claim: it is not counted
    /// twice, and a group with room left keeps it. Replicas somebody else set (the baseline)
    /// are in `replicas`, not in `managed`.
    #[test]
    fn a_claim_the_replicas_count_is_not_counted_again() {
        assert_eq!(counted(3, 4, 3, 3), (true, 3), "written: counted once");
        assert_eq!(counted(3, 3, 3, 3), (false, 3), "written, at max-size");
        assert_eq!(counted(3, 5, 1, 2), (true, 4), "baseline 2, one unwritten");
    }

    /// A pool's handed-back instances are room a claim takes without a replica raise; claims
    /// waiting to take them use it up.
    #[test]
    fn handed_back_instances_are_room_until_claims_take_them() {
        assert!(has_room(3, Some(3), 1, 0));
        assert!(!has_room(3, Some(3), 1, 1));
        // The catalog offers a pool at max-size with a handed-back instance.
        let mut o = offering(3, Some(3));
        o.available = has_room(3, Some(3), 2, 0);
        let pool = Owned {
            managed: 1,
            handed_back: 2,
        };
        count_claims(&mut o, Some(&pool), 2);
        assert!(o.available, "one of two handed-back instances still free");
    }

    /// No max-size, or counts not known (a catalog built without them): nothing changes.
    #[test]
    fn a_group_without_max_size_or_counts_is_left_alone() {
        let mut o = offering(10, None);
        count_claims(&mut o, Some(&owned(0)), 5);
        assert!(o.available);
        assert_eq!(o.replicas, 10);
        let mut o = offering(2, Some(3));
        count_claims(&mut o, None, 5);
        assert!(o.available);
    }
}
