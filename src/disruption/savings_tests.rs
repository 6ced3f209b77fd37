//! What a replacement is priced at when a `Balanced` pool weighs a move's savings (Karpenter
//! v1.15's #3217: only offerings the replacement may launch count).

use super::tests::{allow, big_on_demand};
use super::*;
use crate::api::nodeclaim::{NodeSelectorRequirementWithMinValues, Operator};
use crate::api::wellknown::CAPACITY_TYPE_LABEL;
use crate::testing;

/// A `large` on-demand node at 4/h with one pod, and a `small` type that fits the pod: 3.6/h
/// on-demand, 1.8/h as spot.
fn one_node_and_a_cheaper_type() -> (Snapshot, Vec<Candidate>) {
    let types = vec![
        testing::instance_type("large", 8, 16)
            .zones(&["z"])
            .capacity_types(&["on-demand"])
            .price(4.0)
            .build(),
        testing::instance_type("small", 2, 4)
            .zones(&["z"])
            .capacity_types(&["spot", "on-demand"])
            .price(3.6)
            .build(),
    ];
    big_on_demand(&types)
}

/// The pool weighs the move `Balanced`: its cost is the node's (4/h) and the node is half of its
/// disruption. Saving 0.4/h (10 % of the cost) is not worth it (score 0.2 < 0.5); saving 2.2/h
/// (55 %) would be.
fn balanced(candidates: &[Candidate]) -> Vec<Candidate> {
    candidates
        .iter()
        .cloned()
        .map(|mut c| {
            c.policy = ConsolidationPolicy::Balanced;
            c.pool_cost = 4.0;
            c.pool_disruption = 2.0 * c.reschedule_cost;
            c
        })
        .collect()
}

/// An on-demand-only pool's replacement can launch only on-demand: its spot offering's price
/// must not make the move look worth it (upstream's `EstimatedSavings` used the cheapest
/// offering of any capacity type until #3217).
#[test]
fn balanced_savings_count_only_offerings_the_replacement_may_launch() {
    let (mut s, c) = one_node_and_a_cheaper_type();
    s.nodepools[0].nodepool.spec.template.spec.requirements =
        vec![NodeSelectorRequirementWithMinValues::new(
            CAPACITY_TYPE_LABEL,
            Operator::In,
            &["on-demand"],
        )];
    assert_eq!(decide(&s, &balanced(&c), &allow(1)), None);
    // Under another policy the same move goes ahead: it is cheaper, only not by enough.
    let cmd = decide(&s, &c, &allow(1)).expect("a cheaper replacement");
    assert_eq!(cmd.decision(), "replace");
}

/// The negative control, upstream's `NoCapacityTypeRestriction`: a pool that allows spot has its
/// replacement pinned to spot and priced as spot, and the larger saving is worth it.
#[test]
fn balanced_savings_count_spot_where_the_pool_allows_it() {
    let (s, c) = one_node_and_a_cheaper_type();
    let cmd = decide(&s, &balanced(&c), &allow(1)).expect("a worthwhile move");
    let ct = cmd.replacements[0]
        .requirements
        .get(CAPACITY_TYPE_LABEL)
        .expect("a capacity type requirement");
    assert!(ct.has("spot") && !ct.has("on-demand"), "{ct:?}");
}
