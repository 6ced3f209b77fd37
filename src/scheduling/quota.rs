//! CapacityQuotas as the solver applies them: one more cap beside a NodePool's `spec.limits`,
//! shared by every pool whose claims the quota's node selector may cover. What a quota's nodes
//! use comes in with the snapshot (every Node the selector matches, and every claim not yet a
//! Node that may match); each claim the solve opens under it is charged against what is left,
//! so the claims of one solve, and of solves whose creates have not answered yet (they are in
//! the snapshot as in-flight claims), cannot together pass a limit.

use crate::api::capacity_quota::NODES;
use crate::api::requirements::Requirements;
use crate::api::resources::{Quantity, Resources};
use crate::api::wellknown::WELL_KNOWN_LABELS;

use super::amounts::{Amounts, Dims};
use super::selector::{MaybeLabel, Selector};

/// An enforced CapacityQuota: its node selector, limits, and what its nodes use now.
#[derive(Clone, Debug)]
pub struct QuotaInput {
    pub(crate) name: String,
    pub(crate) selector: Selector,
    pub(crate) limits: Resources,
    /// Summed capacity of the covered Nodes and claims, with `nodes` their count.
    pub(crate) usage: Resources,
}

/// Adds one node of `capacity` to a quota's usage.
pub(crate) fn count_node(usage: &mut Resources, capacity: &Resources) {
    usage.add_assign(capacity);
    let nodes = usage.get(NODES).saturating_add(Quantity::from_units(1));
    usage.set(NODES, nodes);
}

/// What a node launched under `reqs` may carry for `key`: the values its requirements leave
/// (a claim's requirements are every label it is sure to get), any value for a key its pool's
/// instance types or offerings may add, else nothing.
pub(crate) fn claim_label<'r>(
    reqs: &'r Requirements,
    known: &dyn Fn(&str) -> bool,
    key: &str,
) -> MaybeLabel<'r> {
    match reqs.get(key) {
        Some(r) => match r.finite_values() {
            Some(vs) if vs.is_empty() && r.allows_absent() => MaybeLabel::Absent,
            Some(vs) if !r.allows_absent() => {
                MaybeLabel::OneOf(vs.iter().map(String::as_str).collect())
            }
            _ => MaybeLabel::Any,
        },
        None if known(key) || WELL_KNOWN_LABELS.contains(&key) => MaybeLabel::Any,
        None => MaybeLabel::Absent,
    }
}

/// A quota during one solve.
pub(in crate::scheduling) struct QuotaCap {
    pub(in crate::scheduling) name: String,
    pub(in crate::scheduling) selector: Selector,
    /// Dimensions with a limit; `remaining` is meaningful only for those.
    pub(in crate::scheduling) limited: Vec<usize>,
    pub(in crate::scheduling) remaining: Amounts,
    pub(in crate::scheduling) nodes_remaining: Option<i64>,
}

impl QuotaCap {
    pub(in crate::scheduling) fn new(q: &QuotaInput, dims: &Dims) -> QuotaCap {
        let mut limited = Vec::new();
        let mut remaining = Amounts::zero(dims.len());
        let mut nodes_remaining = None;
        for (key, limit) in q.limits.iter() {
            let left = limit.saturating_sub(q.usage.get(key));
            if key == NODES {
                nodes_remaining = Some(left.as_units());
            } else if let Some(d) = dims.position(key) {
                limited.push(d);
                if let Some(slot) = remaining.0.get_mut(d) {
                    *slot = left.as_nanos();
                }
            }
        }
        QuotaCap {
            name: q.name.clone(),
            selector: q.selector.clone(),
            limited,
            remaining,
            nodes_remaining,
        }
    }

    /// Whether a claim under `reqs` (of a pool whose nodes may carry the `known` keys) may be
    /// one of the quota's nodes.
    pub(in crate::scheduling) fn may_cover(
        &self,
        reqs: &Requirements,
        known: &dyn Fn(&str) -> bool,
    ) -> bool {
        self.selector
            .could_match(|key| claim_label(reqs, known, key))
    }

    /// The first limited dimension a node of `capacity` would take over the limit, counting
    /// `own` (the claim's charge so far) as already free.
    pub(in crate::scheduling) fn exceeded(
        &self,
        capacity: &Amounts,
        own: &Amounts,
    ) -> Option<usize> {
        self.limited
            .iter()
            .copied()
            .find(|&d| capacity.get(d) > self.remaining.get(d).saturating_add(own.get(d)))
    }

    /// Whether the quota has room for one more node.
    pub(in crate::scheduling) fn node_left(&self) -> bool {
        self.nodes_remaining.is_none_or(|n| n >= 1)
    }
}

/// The first of `which` quotas a node of `capacity` would take over a limit, and on what
/// (`nodes` when it has no node left; else the dimension's name).
pub(in crate::scheduling) fn first_exceeded<'q>(
    quotas: &'q [QuotaCap],
    which: &[usize],
    capacity: &Amounts,
    own: &Amounts,
    dims: &Dims,
) -> Option<(&'q str, String)> {
    which.iter().filter_map(|&q| quotas.get(q)).find_map(|q| {
        q.exceeded(capacity, own)
            .map(|d| (q.name.as_str(), dims.name(d).to_string()))
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;
    use crate::api::requirements::Requirement;

    fn res(pairs: &[(&str, i64)]) -> Resources {
        let mut r = Resources::new();
        for (k, v) in pairs {
            r.set(*k, Quantity::from_units(*v));
        }
        r
    }

    fn input(labels: &[(&str, &str)], limits: &[(&str, i64)], usage: &[(&str, i64)]) -> QuotaInput {
        let sel = LabelSelector {
            match_labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        };
        QuotaInput {
            name: "q".into(),
            selector: Selector::parse(Some(&sel), "spec.selector").unwrap(),
            limits: res(limits),
            usage: res(usage),
        }
    }

    fn dims() -> Dims {
        let mut d = Dims::default();
        d.intern("cpu");
        d.intern("memory");
        d
    }

    #[test]
    fn remaining_is_limit_less_usage_and_a_node_fits_exactly_up_to_it() {
        let d = dims();
        let q = QuotaCap::new(
            &input(
                &[],
                &[("cpu", 8), ("nodes", 3)],
                &[("cpu", 4), ("nodes", 2)],
            ),
            &d,
        );
        assert_eq!(q.nodes_remaining, Some(1));
        assert!(q.node_left());
        let zero = Amounts::zero(d.len());
        // 4 CPUs left: a 4-CPU node fits exactly, a 5-CPU one does not.
        assert_eq!(q.exceeded(&d.amounts(&res(&[("cpu", 4)])), &zero), None);
        assert_eq!(q.exceeded(&d.amounts(&res(&[("cpu", 5)])), &zero), Some(0));
        // A claim's own charge is free to move to a bigger type.
        assert_eq!(
            q.exceeded(
                &d.amounts(&res(&[("cpu", 6)])),
                &d.amounts(&res(&[("cpu", 2)]))
            ),
            None
        );
        // Memory is not limited by this quota.
        assert_eq!(
            q.exceeded(&d.amounts(&res(&[("memory", 1 << 40)])), &zero),
            None
        );
    }

    #[test]
    fn usage_over_the_limit_leaves_nothing() {
        let d = dims();
        let q = QuotaCap::new(&input(&[], &[("nodes", 2)], &[("nodes", 5)]), &d);
        assert!(!q.node_left());
    }

    #[test]
    fn counting_a_node_adds_its_capacity_and_one_node() {
        let mut u = Resources::new();
        count_node(&mut u, &res(&[("cpu", 4)]));
        count_node(&mut u, &res(&[("cpu", 2)]));
        assert_eq!(u.get("cpu"), Quantity::from_units(6));
        assert_eq!(u.get("nodes"), Quantity::from_units(2));
    }

    #[test]
    fn a_claim_is_covered_when_its_labels_may_match() {
        let d = dims();
        let q = QuotaCap::new(&input(&[("team", "a")], &[("nodes", 1)], &[]), &d);
        let mut reqs = Requirements::new();
        reqs.add(Requirement::is_in("team", &["a"]));
        assert!(q.may_cover(&reqs, &|_| false));
        let mut other = Requirements::new();
        other.add(Requirement::is_in("team", &["b"]));
        assert!(!q.may_cover(&other, &|_| false));
        // A pool whose nodes never carry the key is not covered; one whose instance types may
        // add it is.
        assert!(!q.may_cover(&Requirements::new(), &|_| false));
        assert!(q.may_cover(&Requirements::new(), &|k| k == "team"));
        // Still one of two teams: may be a's.
        let mut either = Requirements::new();
        either.add(Requirement::is_in("team", &["a", "b"]));
        assert!(q.may_cover(&either, &|_| false));
    }
}
