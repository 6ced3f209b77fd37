//! The [`Candidate`] a weighable claim makes: its price, pods and costs as the disruption
//! methods read them, and its pool's totals, which the `Balanced` policy weighs a move against.

use std::collections::HashMap;

use jiff::Timestamp;
use kube::ResourceExt;

use super::{Weighable, Worth, consolidate_after_hold};
use crate::api::conditions;
use crate::api::wellknown::{CAPACITY_TYPE_LABEL, CAPACITY_TYPE_ON_DEMAND, INSTANCE_TYPE_LABEL};
use crate::disruption::{self, Candidate};
use crate::state::pods::PodSummary;

/// The candidate a claim nothing holds back makes; consolidatable only if nothing holds its
/// consolidation (`hold`) and `consolidateAfter` has passed.
pub(super) fn candidate(
    w: Weighable<'_>,
    worth: Worth<'_>,
    hold: Option<disruption::Hold>,
    now: Timestamp,
) -> Candidate {
    let c = w.claim;
    let hold = hold.or_else(|| consolidate_after_hold(w.np, worth.consolidatable));
    Candidate {
        claim: w.name,
        node: w.node.name().to_string(),
        nodepool: w.pool,
        price: worth.price,
        instance_type: c
            .labels()
            .get(INSTANCE_TYPE_LABEL)
            .cloned()
            .unwrap_or_default(),
        machine_deployment: w.md.to_string(),
        reschedule_cost: worth.reschedule_cost,
        drifted_since: conditions::get(c.conditions(), conditions::DRIFTED)
            .filter(|d| d.is_true())
            .map(|d| d.last_transition_time.0.as_second()),
        pool_cost: 0.0,
        pool_disruption: 0.0,
        capacity_type: c
            .labels()
            .get(CAPACITY_TYPE_LABEL)
            .cloned()
            .unwrap_or_else(|| CAPACITY_TYPE_ON_DEMAND.to_string()),
        pods: worth
            .moving
            .iter()
            .map(|p| p.shared_key().clone())
            .collect(),
        disruption_cost: disruption::claim_disruption_cost(c, &worth.moving, now),
        drift: worth.drift,
        consolidatable: hold.is_none(),
        policy: w.np.disruption().consolidation_policy(),
        static_pool: w.np.is_static(),
        repair: None,
        hold,
    }
}

/// Each candidate's pool totals, which the `Balanced` policy weighs a move against.
pub(super) fn share_pool_totals(
    candidates: &mut [Candidate],
    totals: &HashMap<String, (f64, f64)>,
) {
    for c in candidates {
        if let Some((cost, disruption)) = totals.get(&c.nodepool) {
            c.pool_cost = *cost;
            c.pool_disruption = *disruption;
        }
    }
}

/// Upstream's reschedule disruption cost: 1 for the node itself, plus each moving pod's
/// eviction cost where it is positive.
pub(super) fn reschedule_cost(moving: &[&PodSummary]) -> f64 {
    1.0 + moving
        .iter()
        .map(|p| p.eviction_cost().max(0.0))
        .sum::<f64>()
}
