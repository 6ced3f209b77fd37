//! `explain nodeclaim` and the disruption pass agree on which method may take a node: one table
//! of the cases their copies of the rule once disagreed on (issue 39), each run through the
//! pass (`pass::settle_and_decide`, as the actor and `explain node` call it) and through
//! `explain nodeclaim`'s report of a candidate, with every budget closed and then open.

use std::collections::HashSet;

use super::tests::{Node, allow, cluster, types};
use super::*;
use crate::explain::nodeclaim::of_candidate;

/// One node's standing, and what the pass does with it.
struct Case {
    name: &'static str,
    pods: bool,
    policy: ConsolidationPolicy,
    /// `consolidateAfter` has passed since its last pod event.
    consolidatable: bool,
    static_pool: bool,
    /// The reason the pass takes it for when its budget allows, or None.
    goes_for: Option<DisruptionReason>,
    /// What stops it whatever the budgets, when `goes_for` is None.
    blocker: Option<Blocker>,
}

const fn case(
    name: &'static str,
    pods: bool,
    policy: ConsolidationPolicy,
    consolidatable: bool,
) -> Case {
    Case {
        name,
        pods,
        policy,
        consolidatable,
        static_pool: false,
        goes_for: None,
        blocker: None,
    }
}

fn cases() -> Vec<Case> {
    use ConsolidationPolicy::{WhenEmpty, WhenEmptyOrUnderutilized as Both};
    use DisruptionReason::{Empty, Underutilized};
    let goes = |c: Case, r| Case {
        goes_for: Some(r),
        ..c
    };
    let stops = |c: Case, b| Case {
        blocker: Some(b),
        ..c
    };
    vec![
        stops(
            case("empty, consolidateAfter not passed", false, Both, false),
            Blocker::NotConsolidatable,
        ),
        // Emptiness's under any policy; explain used to list Underutilized for it too.
        goes(
            case("empty, WhenEmptyOrUnderutilized", false, Both, true),
            Empty,
        ),
        goes(case("empty, WhenEmpty", false, WhenEmpty, true), Empty),
        stops(
            case("with pods, WhenEmpty", true, WhenEmpty, true),
            Blocker::ConsolidationDisabled,
        ),
        stops(
            case("with pods, WhenEmpty, not passed", true, WhenEmpty, false),
            Blocker::NotConsolidatable,
        ),
        goes(
            case("with pods, WhenEmptyOrUnderutilized", true, Both, true),
            Underutilized,
        ),
        stops(
            Case {
                static_pool: true,
                ..case("empty, static pool", false, Both, true)
            },
            Blocker::StaticPool,
        ),
    ]
}

/// The case's node, alone on the cluster, as a candidate.
fn candidate_of(case: &Case) -> (Snapshot, Vec<Candidate>) {
    let pods: &[(&str, &str)] = if case.pods { &[("p", "1")] } else { &[] };
    let (s, mut c) = cluster(
        &types(),
        &[Node {
            name: "big",
            ty: "large",
            ct: "on-demand",
            pods,
        }],
    );
    c[0].policy = case.policy;
    c[0].static_pool = case.static_pool;
    if !case.consolidatable {
        let hold = Hold::new(
            Blocker::NotConsolidatable,
            "consolidateAfter has not passed",
        );
        blocker::hold_consolidation(&mut c[0], hold);
    }
    (s, c)
}

/// The pass over the case's node with every budget at `budget`: its command, or its blocker.
fn pass_over(case: &Case, budget: usize) -> (Option<Command>, Option<Hold>) {
    let (s, c) = candidate_of(case);
    let (d, _) = pass::settle_and_decide(&s, c, &allow(budget), &HashSet::new(), true);
    let hold = d.blocked.into_iter().find(|b| b.claim == "claim-big");
    (d.command, hold.map(|b| b.hold))
}

#[test]
fn explain_and_the_pass_agree_on_which_method_may_take_a_node() {
    for case in cases() {
        let (_, c) = candidate_of(&case);
        let name = case.name;
        // Budgets closed: the pass names the budget of the reason explain lists, and nothing
        // else; a node no method may take is stopped by the same hold in both.
        let (command, hold) = pass_over(&case, 0);
        let explained = of_candidate(&c[0], &allow(0));
        assert_eq!(command, None, "{name}");
        let hold = hold.unwrap_or_else(|| panic!("{name}: the pass names a blocker"));
        match case.goes_for {
            Some(r) => {
                assert_eq!(hold.blocker, Blocker::Budget, "{name}");
                assert!(hold.why.contains(r.as_str()), "{name}: {}", hold.why);
                assert_eq!(explained.budget_blocked, vec![format!("{r:?}")], "{name}");
                assert_eq!(explained.reason, None, "{name}");
            }
            None => {
                assert_eq!(Some(hold.blocker), case.blocker, "{name}");
                assert!(explained.budget_blocked.is_empty(), "{name}");
                let reason = explained.reason.unwrap_or_default();
                assert!(reason.contains(&hold.why), "{name}: {reason}");
            }
        }
        // Budgets open: the pass takes it for that reason, or the same hold stops it.
        let (command, hold) = pass_over(&case, 10);
        let explained = of_candidate(&c[0], &allow(10));
        assert!(explained.budget_blocked.is_empty(), "{name}");
        let taken_for = command.map(|cmd| cmd.method.reason());
        assert_eq!(taken_for, case.goes_for, "{name}: {hold:?}");
        assert_eq!(hold.map(|h| h.blocker), case.blocker, "{name}");
    }
}

/// The actor's holds go through the same rule: a consolidation pause or pods on their way hold
/// only the nodes consolidation would move pods off; a drift back-off is a node's blocker only
/// when no other method may take it.
#[test]
fn the_actors_holds_follow_the_same_rule() {
    let of = |name| {
        cases()
            .into_iter()
            .find(|c| c.name == name)
            .map(|c| candidate_of(&c).1.remove(0))
    };
    let mut c: Vec<Candidate> = [
        "empty, WhenEmptyOrUnderutilized",
        "with pods, WhenEmpty",
        "with pods, WhenEmptyOrUnderutilized",
    ]
    .into_iter()
    .filter_map(of)
    .collect();
    assert_eq!(
        hold_underutilized(&mut c, &Hold::new(Blocker::Backoff, "paused")),
        1
    );
    let reasons: Vec<_> = c.iter().map(|c| c.consolidation_reason().ok()).collect();
    assert_eq!(reasons, [Some(DisruptionReason::Empty), None, None]);
    assert_eq!(
        c[1].consolidation_reason().map_err(|h| h.blocker),
        Err(Blocker::ConsolidationDisabled),
        "a WhenEmpty pool's node with pods is not consolidation's to pause"
    );
    for x in &mut c {
        x.drift = Some(Drift::NodePoolDrifted);
        blocker::hold_drift(x, Hold::new(Blocker::Backoff, "drift backs off"));
        assert_eq!(x.drift, None);
    }
    let blockers: Vec<_> = c
        .iter()
        .map(|x| blocker::first_blocker(x, &allow(10), None, None).map(|h| h.blocker))
        .collect();
    let not_reached = Some(Blocker::NotReached);
    let backoff = Some(Blocker::Backoff);
    assert_eq!(blockers, [not_reached, backoff, backoff]);
}
