//! Relaxing a pod's preferences one step at a time when it fits nowhere.

use std::borrow::Cow;

use super::Prepared;
use crate::api::requirements::{Requirement, Requirements};
use crate::scheduling::pod::{PodInfo, TermKind};
use crate::scheduling::topology::Narrowing;

/// How far a pod's preferences have been relaxed.
#[derive(Clone, Debug)]
pub(super) struct Attempt {
    pub(super) node_term: usize,
    /// Index of the heaviest preferred node-affinity term still required.
    pub(super) preferred_node: usize,
    /// Per topology term: dropped by relaxation.
    pub(super) dropped: Vec<bool>,
    pub(super) tolerate_prefer_no_schedule: bool,
}

pub(super) fn attempt_requirements<'p>(
    pod: &'p PodInfo,
    attempt: &Attempt,
) -> Cow<'p, Requirements> {
    let base = pod
        .node_terms
        .get(attempt.node_term)
        .or_else(|| pod.node_terms.first());
    let preferred = pod
        .preferred_node
        .get(attempt.preferred_node)
        .map(|(_, r)| r);
    match (base, preferred) {
        (Some(b), None) => Cow::Borrowed(b),
        (Some(b), Some(p)) => Cow::Owned(b.intersect(p)),
        (None, Some(p)) => Cow::Borrowed(p),
        (None, None) => Cow::Owned(Requirements::new()),
    }
}

/// Drops one preference, in Karpenter's order: the next required node-affinity term, preferred
/// pod affinity, preferred anti-affinity (lightest first), preferred node affinity (heaviest
/// first), ScheduleAnyway spreads, then PreferNoSchedule taints. False when nothing is left.
pub(super) fn relax(pod: &PodInfo, prep: &Prepared, attempt: &mut Attempt) -> bool {
    if attempt.node_term + 1 < pod.node_terms.len() {
        attempt.node_term += 1;
        return true;
    }
    for kind in [TermKind::Affinity, TermKind::AntiAffinity] {
        let lightest = prep
            .terms
            .iter()
            .zip(&pod.terms)
            .enumerate()
            .filter(|(i, ((_, required, _), t))| {
                !required
                    && t.group.kind == kind
                    && !attempt.dropped.get(*i).copied().unwrap_or(true)
            })
            .min_by_key(|(_, ((_, _, w), _))| *w)
            .map(|(i, _)| i);
        if let Some(i) = lightest
            && let Some(d) = attempt.dropped.get_mut(i)
        {
            *d = true;
            return true;
        }
    }
    if attempt.preferred_node < pod.preferred_node.len() {
        attempt.preferred_node += 1;
        return true;
    }
    let soft_spread = pod.terms.iter().enumerate().find(|(i, t)| {
        !t.required
            && matches!(t.group.kind, TermKind::Spread { .. })
            && !attempt.dropped.get(*i).copied().unwrap_or(true)
    });
    if let Some((i, _)) = soft_spread
        && let Some(d) = attempt.dropped.get_mut(i)
    {
        *d = true;
        return true;
    }
    if !attempt.tolerate_prefer_no_schedule {
        attempt.tolerate_prefer_no_schedule = true;
        return true;
    }
    false
}

pub(super) fn with_narrowing(mut reqs: Requirements, narrowed: &[Narrowing]) -> Requirements {
    for (k, vs) in narrowed {
        reqs.add(Requirement::is_in(k, vs.as_slice()));
    }
    reqs
}
