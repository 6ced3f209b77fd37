//! Karpenter core's node health suite (`pkg/controllers/node/health/`): the policies this
//! provider claims, the 20 % guard, the toleration and the next look, and the termination
//! deadline a repair writes, against node repair's rules (`view::repair`) on indexes built by
//! hand and an explicit clock, as upstream steps its fake clock. The whole flows (repair, the
//! guard, budgets and do-not-disrupt ignored, the MachineHealthCheck) are in
//! `tests/disruption/repair.rs` and `tests/control_plane/flows.rs`.

use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::wellknown::{NODEPOOL_LABEL, TERMINATION_TIMESTAMP_ANNOTATION};
use karpenter_capi::state::State;
use karpenter_capi::view::repair::{RepairPolicies, decide, termination_stamp, threshold};
use karpenter_capi::view::{CatalogView, Inputs, Settings};

/// Upstream's providers' toleration.
const TOLERATION: Duration = Duration::from_secs(30 * 60);

/// Now, to the second (a condition's transition time carries no more).
fn t0() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).expect("now")
}

fn minutes(m: i64) -> SignedDuration {
    SignedDuration::from_mins(m)
}

/// One node of the hand-made cluster: its NodePool (None: a claim of no pool) and its `Ready`
/// condition since when.
struct Member<'a> {
    pool: Option<&'a str>,
    ready: &'a str,
    since: Timestamp,
}

fn healthy(pool: Option<&str>, since: Timestamp) -> Member<'_> {
    Member {
        pool,
        ready: "True",
        since,
    }
}

fn claim(i: usize, m: &Member<'_>) -> NodeClaim {
    let labels = m.pool.map_or(json!({}), |p| json!({NODEPOOL_LABEL: p}));
    serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": format!("nc-{i}"), "labels": labels},
        "spec": {"requirements": [], "nodeClassRef": {
            "group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}},
        "status": {"nodeName": format!("node-{i}"), "providerID": format!("sim://node-{i}")},
    }))
    .expect("a NodeClaim")
}

fn node(i: usize, m: &Member<'_>) -> Node {
    let labels = m.pool.map_or(json!({}), |p| json!({NODEPOOL_LABEL: p}));
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": format!("node-{i}"), "labels": labels},
        "spec": {"providerID": format!("sim://node-{i}")},
        "status": {"conditions": [{"type": "Ready", "status": m.ready,
            "lastTransitionTime": m.since.to_string()}]},
    }))
    .expect("a Node")
}

fn cluster(members: &[Member<'_>]) -> State {
    let st = State::default();
    for (i, m) in members.iter().enumerate() {
        st.claims.write().apply(Arc::new(claim(i, m)));
        st.nodes.write().apply(node(i, m));
    }
    st
}

/// Repair's decision at `now`: the claims it replaces and the ones it holds back.
fn look(st: &State, now: Timestamp) -> (Vec<String>, Vec<String>, Option<Timestamp>) {
    let (catalog, settings) = (CatalogView::default(), Settings::default());
    let d = decide(
        Inputs {
            state: st,
            catalog: &catalog,
            settings: &settings,
        },
        &RepairPolicies::ready(TOLERATION),
        now,
    );
    let mut repair: Vec<String> = d
        .repair
        .iter()
        .filter_map(|r| r.claim.metadata.name.clone())
        .collect();
    let mut blocked: Vec<String> = d
        .blocked
        .iter()
        .filter_map(|(c, _, _)| c.metadata.name.clone())
        .collect();
    repair.sort();
    blocked.sort();
    (repair, blocked, d.next)
}

#[test]
fn by_default_only_ready_false_or_unknown_calls_for_a_repair() {
    let defaults = RepairPolicies::parse("").expect("the defaults");
    let policies: Vec<(&str, &str, Duration)> = defaults
        .policies()
        .iter()
        .map(|p| (p.condition.as_str(), p.status.as_str(), p.toleration))
        .collect();
    assert_eq!(
        policies,
        [
            ("Ready", "False", TOLERATION),
            ("Ready", "Unknown", TOLERATION)
        ]
    );
}

#[test]
fn a_fifth_of_a_small_pool_rounds_up_to_one_node() {
    // Upstream's case: one unhealthy node of three may be repaired (33 % > 20 %, rounded up).
    assert_eq!(threshold(3), 1);
    assert_eq!(threshold(4), 1);
    // Two of ten may; three of ten may not.
    assert_eq!(threshold(10), 2);
    let t0 = t0();
    let sick = Member {
        pool: Some("default"),
        ready: "False",
        since: t0,
    };
    let st = cluster(&[
        sick,
        healthy(Some("default"), t0),
        healthy(Some("default"), t0),
    ]);
    let (repair, blocked, _) = look(&st, t0 + minutes(60));
    assert_eq!((repair, blocked), (vec!["nc-0".to_string()], vec![]));
}

#[test]
fn a_node_unhealthy_for_less_than_its_toleration_is_kept() {
    let t0 = t0();
    let st = cluster(&[Member {
        pool: Some("default"),
        ready: "False",
        since: t0,
    }]);
    let (repair, blocked, next) = look(&st, t0 + minutes(20));
    assert!(repair.is_empty() && blocked.is_empty());
    assert_eq!(next, Some(t0 + minutes(30)), "looks again when it ends");
    assert_eq!(look(&st, t0 + minutes(60)).0, ["nc-0"]);
}

#[test]
fn the_next_look_is_at_the_earliest_toleration_end() {
    // Upstream's two conditions of one Node become two Nodes here (one condition, `Ready`, one
    // toleration): at 27 minutes the first ends in 3, the second in 13.
    let t0 = t0();
    let st = cluster(&[
        Member {
            pool: Some("default"),
            ready: "Unknown",
            since: t0 + minutes(10),
        },
        Member {
            pool: Some("default"),
            ready: "False",
            since: t0,
        },
        healthy(Some("default"), t0),
        healthy(Some("default"), t0),
        healthy(Some("default"), t0),
        healthy(Some("default"), t0),
        healthy(Some("default"), t0),
        healthy(Some("default"), t0),
        healthy(Some("default"), t0),
        healthy(Some("default"), t0),
    ]);
    let now = t0 + minutes(27);
    let (_, _, next) = look(&st, now);
    assert_eq!(next.map(|n| n.duration_since(now)), Some(minutes(3)));
}

#[test]
fn over_a_fifth_of_a_pool_unhealthy_holds_every_repair_back() {
    // Upstream: three of ten Nodes of a NodePool unhealthy.
    let t0 = t0();
    let mut members: Vec<Member<'_>> = (0..3)
        .map(|_| Member {
            pool: Some("default"),
            ready: "False",
            since: t0,
        })
        .collect();
    members.extend((0..7).map(|_| healthy(Some("default"), t0)));
    let (repair, blocked, _) = look(&cluster(&members), t0 + minutes(60));
    assert!(repair.is_empty());
    assert_eq!(blocked, ["nc-0", "nc-1", "nc-2"]);
}

#[test]
fn over_a_fifth_of_the_cluster_unhealthy_holds_back_claims_of_no_pool() {
    // Upstream's standalone claims (no NodePool label) are weighed against every Node.
    let t0 = t0();
    let mut members: Vec<Member<'_>> = (0..3)
        .map(|_| Member {
            pool: None,
            ready: "False",
            since: t0,
        })
        .collect();
    members.extend((0..7).map(|_| healthy(None, t0)));
    let (repair, blocked, _) = look(&cluster(&members), t0 + minutes(60));
    assert!(repair.is_empty());
    assert_eq!(blocked, ["nc-0", "nc-1", "nc-2"]);
}

fn stamped(due: Option<Timestamp>) -> NodeClaim {
    let mut c = claim(
        0,
        &Member {
            pool: Some("default"),
            ready: "False",
            since: Timestamp::now(),
        },
    );
    if let Some(due) = due {
        c.metadata.annotations = Some(
            [(
                TERMINATION_TIMESTAMP_ANNOTATION.to_string(),
                due.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            )]
            .into(),
        );
    }
    c
}

#[test]
fn a_repair_stamps_the_termination_deadline_at_now() {
    let now = Timestamp::now();
    assert_eq!(
        termination_stamp(&stamped(None), now, Duration::ZERO),
        Some(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
    );
}

#[test]
fn a_later_deadline_from_the_pools_grace_period_is_brought_forward() {
    let now = Timestamp::now();
    assert_eq!(
        termination_stamp(&stamped(Some(now + minutes(120))), now, Duration::ZERO),
        Some(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
    );
}

#[test]
fn a_deadline_already_passed_is_kept() {
    let now = Timestamp::now();
    assert_eq!(
        termination_stamp(&stamped(Some(now - minutes(3))), now, Duration::ZERO),
        None
    );
}

/// Ahead of upstream's suite (reason-aware policies, #3336): a policy's
/// `terminationGracePeriod` gives the drain that long, a sooner deadline is kept and a later
/// one brought forward to it.
#[test]
fn a_policys_grace_period_sets_the_deadline_that_far_ahead() {
    let now = Timestamp::now();
    let grace = Duration::from_secs(10 * 60);
    let at = |t: Timestamp| Some(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    assert_eq!(
        termination_stamp(&stamped(None), now, grace),
        at(now + minutes(10))
    );
    assert_eq!(
        termination_stamp(&stamped(Some(now + minutes(120))), now, grace),
        at(now + minutes(10))
    );
    assert_eq!(
        termination_stamp(&stamped(Some(now + minutes(5))), now, grace),
        None
    );
}
