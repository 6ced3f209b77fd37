//! Every candidate a pass does not take gets the first thing that stopped it: one test per
//! blocker the decision and the actor's holds produce (the view's are
//! `view::disruption::tests::blockers`).

use super::*;
use crate::disruption::blocker::{self, Blocker};

/// The blocker the decision gives `claim`, if any.
fn blocker_of(d: &Decision, claim: &str) -> Option<Blocker> {
    d.blocked
        .iter()
        .find(|b| b.claim == claim)
        .map(|b| b.hold.blocker)
}

fn one_node(types: &[InstanceType], ty: &str, ct: &str) -> (Snapshot, Vec<Candidate>) {
    cluster(
        types,
        &[Node {
            name: "big",
            ty,
            ct,
            pods: &[("p", "1")],
        }],
    )
}

#[test]
fn every_blocker_has_one_snake_case_label() {
    let labels: std::collections::BTreeSet<&str> = Blocker::ALL.iter().map(|b| b.label()).collect();
    assert_eq!(labels.len(), Blocker::ALL.len(), "labels are distinct");
    for l in labels {
        assert!(
            l.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{l} is snake case"
        );
    }
}

/// `budget`: a pool whose budget is 0, or used up by this pass's own command.
#[test]
fn a_used_up_budget_blocks_with_budget() {
    let empty = |name| Node {
        name,
        ty: "small",
        ct: "on-demand",
        pods: &[],
    };
    let (s, c) = cluster(&types(), &[empty("a"), empty("b"), empty("c")]);
    let d = decide_explained(&s, &c, &allow(2));
    assert_eq!(
        d.command.as_ref().map(|c| c.claim_names()),
        Some(vec!["claim-a".to_string(), "claim-b".to_string()])
    );
    assert_eq!(blocker_of(&d, "claim-a"), None, "taken");
    assert_eq!(blocker_of(&d, "claim-c"), Some(Blocker::Budget));
    let d = decide_explained(&s, &c, &allow(0));
    assert!(d.blocked.iter().all(|b| b.hold.blocker == Blocker::Budget));
    assert_eq!(d.blocked.len(), 3);
}

/// What consolidation's simulation says when it gives up names the blocker: `not_cheaper`,
/// `spot_to_spot`, `min_values`, `balanced`, `no_feasible_schedule`.
#[test]
fn consolidation_gives_up_naming_its_blocker() {
    // Already on the cheapest type that fits.
    let (s, c) = one_node(&types(), "small", "on-demand");
    let d = decide_explained(&s, &c, &allow(1));
    assert_eq!(blocker_of(&d, "claim-big"), Some(Blocker::NotCheaper));
    // Spot replaced only by spot.
    let spot = vec![
        it("small", 2, 1.0, &["spot", "on-demand"]),
        it("large", 8, 4.0, &["spot", "on-demand"]),
    ];
    let (s, c) = one_node(&spot, "large", "spot");
    let d = decide_explained(&s, &c, &allow(1));
    assert_eq!(blocker_of(&d, "claim-big"), Some(Blocker::SpotToSpot));
    // minValues the cheaper types alone cannot meet.
    let four = vec![
        it("small", 2, 1.0, &["on-demand"]),
        it("medium", 4, 2.0, &["on-demand"]),
        it("large", 8, 4.0, &["on-demand"]),
        it("xlarge", 16, 8.0, &["on-demand"]),
    ];
    let (mut s, c) = one_node(&four, "large", "on-demand");
    let mut req = crate::api::nodeclaim::NodeSelectorRequirementWithMinValues::new(
        INSTANCE_TYPE_LABEL,
        crate::api::nodeclaim::Operator::Exists,
        &[],
    );
    req.min_values = Some(3);
    s.nodepools[0].nodepool.spec.template.spec.requirements = vec![req];
    let d = decide_explained(&s, &c, &allow(1));
    assert_eq!(blocker_of(&d, "claim-big"), Some(Blocker::MinValues));
    // A Balanced pool: the move saves too little of the pool's cost.
    let (s, mut c) = busy_and_idle();
    for x in &mut c {
        x.policy = ConsolidationPolicy::Balanced;
        (x.pool_cost, x.pool_disruption) = (100.0, 4.0);
    }
    let d = decide_explained(&s, &c, &allow(1));
    assert_eq!(blocker_of(&d, "claim-idle"), Some(Blocker::Balanced));
    // Its pod's volume is where no node or type is.
    let (mut s, c) = busy_and_idle();
    let mut zone = Requirements::new();
    zone.add(Requirement::is_in(ZONE_LABEL, &["elsewhere"]));
    s.volume_topology.insert("ns/p2".into(), vec![zone]);
    let d = decide_explained(&s, &c, &allow(1));
    assert_eq!(
        blocker_of(&d, "claim-idle"),
        Some(Blocker::NoFeasibleSchedule)
    );
}

/// A candidate the pass did not look at once it had its command: `not_reached`.
#[test]
fn a_candidate_behind_the_command_is_not_reached() {
    let (s, mut c) = cluster(
        &types(),
        &[
            Node {
                name: "empty",
                ty: "small",
                ct: "on-demand",
                pods: &[],
            },
            Node {
                name: "drifted",
                ty: "small",
                ct: "on-demand",
                pods: &[("p", "1")],
            },
        ],
    );
    c[1].drift = Some(Drift::NodePoolDrifted);
    let d = decide_explained(&s, &c, &allow(2));
    assert_eq!(
        d.command.as_ref().map(|c| c.method),
        Some(Method::Emptiness)
    );
    assert_eq!(blocker_of(&d, "claim-drifted"), Some(Blocker::NotReached));
}

/// What keeps consolidation off a candidate: `consolidateAfter` not passed
/// (`not_consolidatable`), a `WhenEmpty` pool's node with pods (`consolidation_disabled`), pods
/// on their way (`pods_on_their_way`), a static pool (`static_pool`), and a static pool's
/// drift with no room for its replacement (`static_pool`).
#[test]
fn consolidation_holds_name_their_blocker() {
    let (s, mut c) = busy_and_idle();
    c[0].consolidatable = false;
    c[1].policy = ConsolidationPolicy::WhenEmpty;
    let d = decide_explained(&s, &c, &allow(1));
    assert_eq!(
        blocker_of(&d, "claim-busy"),
        Some(Blocker::NotConsolidatable)
    );
    assert_eq!(
        blocker_of(&d, "claim-idle"),
        Some(Blocker::ConsolidationDisabled)
    );
    // Pods on their way to a node: consolidation of nodes with pods waits.
    let (mut s, c) = busy_and_idle();
    s.about_to_bind.insert("ns/pending".into());
    let (d, moving) = pass::settle_and_decide(&s, c, &allow(1), &Default::default(), true);
    assert_eq!(moving, 1);
    assert_eq!(d.command, None);
    assert_eq!(blocker_of(&d, "claim-idle"), Some(Blocker::PodsOnTheirWay));
    // A static pool's drifted node without room under limits.nodes, and its other node.
    let (s, mut c) = busy_and_idle();
    for x in &mut c {
        x.static_pool = true;
    }
    c[0].drift = Some(Drift::NodePoolDrifted);
    let d = decide_explained(&s, &c, &allow(1));
    assert_eq!(blocker_of(&d, "claim-busy"), Some(Blocker::StaticPool));
    assert_eq!(blocker_of(&d, "claim-idle"), Some(Blocker::StaticPool));
}

/// The actor's holds: a rolled-back command's candidates and a consolidation pause back off
/// (`backoff`); a command dropped at validation blocks its candidates the new decision did not
/// take (`validation_churn`).
#[test]
fn back_offs_and_a_dropped_validation_name_their_blocker() {
    let (s, mut c) = busy_and_idle();
    let held = blocker::hold_back(&mut c, |x| {
        (x.claim == "claim-busy").then(|| Hold::new(Blocker::Backoff, "rolled back"))
    });
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].hold.blocker, Blocker::Backoff);
    assert_eq!(c.len(), 1, "the backed-off candidate is not decided on");
    blocker::hold_consolidation(&mut c[0], Hold::new(Blocker::Backoff, "paused"));
    let d = decide_explained(&s, &c, &allow(1));
    assert_eq!(blocker_of(&d, "claim-idle"), Some(Blocker::Backoff));
    // The pending command named `claim-idle`; the new decision took nothing.
    let (s, c) = busy_and_idle();
    let pending = decide(&s, &c, &allow(1)).expect("a command");
    let mut d = decide_explained(&s, &[], &allow(1));
    pass::churned(&pending, "a pod moved", &mut d);
    assert_eq!(blocker_of(&d, "claim-idle"), Some(Blocker::ValidationChurn));
}
