//! Decisions on small, hand-built clusters: one table row per rule.

use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::api::nodepool::NodePool;
use crate::api::requirements::{Requirement, Requirements};
use crate::api::resources::Resources;
use crate::api::wellknown::{CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, ZONE_LABEL};
use crate::scheduling::{ExistingNode, InstanceType, PoolInput};
use crate::testing;

fn res(cpu: &str, mem: &str) -> Resources {
    [("cpu", cpu), ("memory", mem), ("pods", "110")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.parse().expect("quantity")))
        .collect()
}

/// An instance type of `cpu` CPUs (2 GiB each) in one zone, one offering per capacity type.
pub(super) fn it(name: &str, cpu: i64, price: f64, cts: &[&str]) -> InstanceType {
    testing::instance_type(name, cpu, cpu * 2)
        .zones(&["z"])
        .capacity_types(cts)
        .price(price)
        .build()
}

fn nodepool() -> NodePool {
    testing::nodepool("default")
}

fn pod(name: &str, node: &str, cpu: &str) -> Pod {
    testing::pod(name)
        .namespace("ns")
        .node(node)
        .requests(cpu, "1Gi")
        .build()
}

/// A node of type `ty` (from `types`) with these pods.
pub(super) struct Node<'a> {
    pub(super) name: &'a str,
    pub(super) ty: &'a str,
    pub(super) ct: &'a str,
    pub(super) pods: &'a [(&'a str, &'a str)],
}

pub(super) fn cluster(types: &[InstanceType], nodes: &[Node<'_>]) -> (Snapshot, Vec<Candidate>) {
    let mut snapshot = Snapshot {
        nodepools: vec![PoolInput {
            nodepool: nodepool(),
            instance_types: types.to_vec(),
            usage: Resources::new(),
        }],
        ..Default::default()
    };
    let mut candidates = Vec::new();
    for n in nodes {
        let t = types.iter().find(|t| t.name == n.ty).expect("type");
        let price = t
            .offerings
            .iter()
            .find(|o| o.capacity_type == n.ct)
            .expect("offering")
            .price;
        let mut requested = Resources::new();
        let mut keys = Vec::new();
        for (p, cpu) in n.pods {
            let pod = pod(p, n.name, cpu);
            requested = requested
                .add(
                    &crate::scheduling::pod::pod_requests(pod.spec.as_ref().expect("spec"))
                        .expect("requests"),
                )
                .add(&res("0", "0").with("cpu", "0".parse().expect("q")));
            keys.push(format!("ns/{p}"));
            snapshot.bound_pods.push(std::sync::Arc::new(pod));
        }
        let requested = requested.with(
            "pods",
            crate::api::resources::Quantity::from_units(n.pods.len() as i64),
        );
        snapshot.nodes.push(ExistingNode {
            name: n.name.into(),
            labels: [
                (INSTANCE_TYPE_LABEL, n.ty),
                (ZONE_LABEL, "z"),
                (CAPACITY_TYPE_LABEL, n.ct),
                (NODEPOOL_LABEL, "default"),
                ("kubernetes.io/hostname", n.name),
                (crate::api::wellknown::INITIALIZED_LABEL, "true"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            taints: vec![],
            allocatable: t.allocatable(),
            requested,
            daemon_requested: Default::default(),
            in_flight: false,
            nodepool: Some("default".into()),
        });
        candidates.push(testing::candidate(n.name, n.ty, n.ct, price, keys));
    }
    (snapshot, candidates)
}

/// One on-demand node `big` of type `large` (from `types`) with one pod of 1 CPU.
pub(super) fn big_on_demand(types: &[InstanceType]) -> (Snapshot, Vec<Candidate>) {
    cluster(
        types,
        &[Node {
            name: "big",
            ty: "large",
            ct: "on-demand",
            pods: &[("p", "1")],
        }],
    )
}

pub(super) fn allow(n: usize) -> Allowed {
    testing::allowed(n)
}

pub(super) fn types() -> Vec<InstanceType> {
    vec![
        it("small", 2, 1.0, &["on-demand"]),
        it("large", 8, 4.0, &["on-demand"]),
    ]
}

/// [`types`] with every offering unavailable but small's, which is at its max size with one
/// replica: the node on it is the only room there is.
pub(super) fn full_at_max_size() -> Vec<InstanceType> {
    let mut full = types();
    for t in &mut full {
        for o in &mut t.offerings {
            o.available = false;
        }
    }
    let small = &mut full[0].offerings[0];
    (small.replicas, small.max_size) = (1, Some(1));
    full
}

/// One drifted small node `busy` running one pod of 1 CPU, on `types`.
fn drifted_busy(types: &[InstanceType]) -> (Snapshot, Vec<Candidate>) {
    let (s, mut c) = cluster(
        types,
        &[Node {
            name: "busy",
            ty: "small",
            ct: "on-demand",
            pods: &[("p", "1")],
        }],
    );
    c[0].consolidatable = false;
    c[0].drift = Some(Drift::NodePoolDrifted);
    (s, c)
}

#[test]
fn empty_nodes_go_together_within_the_budget() {
    let (s, c) = cluster(
        &types(),
        &[
            Node {
                name: "a",
                ty: "small",
                ct: "on-demand",
                pods: &[],
            },
            Node {
                name: "b",
                ty: "small",
                ct: "on-demand",
                pods: &[],
            },
            Node {
                name: "c",
                ty: "small",
                ct: "on-demand",
                pods: &[],
            },
            Node {
                name: "d",
                ty: "small",
                ct: "on-demand",
                pods: &[("p", "1")],
            },
        ],
    );
    let cmd = decide(&s, &c, &allow(2)).expect("a command");
    assert_eq!(cmd.method, Method::Emptiness);
    assert_eq!(cmd.claim_names(), vec!["claim-a", "claim-b"]);
    assert!(cmd.replacements.is_empty());
    // A node whose consolidateAfter has not passed is not empty yet, as far as disruption goes.
    let waiting: Vec<Candidate> = c
        .iter()
        .cloned()
        .map(|mut x| {
            x.consolidatable = false;
            x
        })
        .collect();
    assert_eq!(decide(&s, &waiting, &allow(2)), None);
    // A zero budget stops everything.
    assert_eq!(decide(&s, &c, &allow(0)), None);
}

/// A large node half used (`p1`, 4 CPUs) and a small one whose pod (`p2`, 1 CPU) fits beside.
fn busy_and_idle() -> (Snapshot, Vec<Candidate>) {
    cluster(
        &types(),
        &[
            Node {
                name: "busy",
                ty: "large",
                ct: "on-demand",
                pods: &[("p1", "4")],
            },
            Node {
                name: "idle",
                ty: "small",
                ct: "on-demand",
                pods: &[("p2", "1")],
            },
        ],
    )
}

#[test]
fn an_underutilized_node_whose_pods_fit_elsewhere_is_deleted() {
    let (s, c) = busy_and_idle();
    let cmd = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(cmd.method, Method::SingleNodeConsolidation);
    assert_eq!(cmd.claim_names(), vec!["claim-idle"]);
    assert_eq!(cmd.decision(), "delete");
}

#[test]
fn a_pod_moves_only_where_its_volume_can_follow() {
    let (mut s, c) = busy_and_idle();
    let zone = |z: &str| {
        let mut r = Requirements::new();
        r.add(Requirement::is_in(ZONE_LABEL, &[z]));
        vec![r]
    };
    // Its volume is in the nodes' zone: the move stands.
    s.volume_topology.insert("ns/p2".into(), zone("z"));
    assert_eq!(
        decide(&s, &c, &allow(1)).map(|c| c.decision()),
        Some("delete")
    );
    // Its volume is in a zone no node or instance type offers: the pod could not run anywhere
    // else, so its node stays.
    s.volume_topology.insert("ns/p2".into(), zone("elsewhere"));
    assert_eq!(decide(&s, &c, &allow(1)), None);
}

#[test]
fn a_node_is_replaced_only_by_something_strictly_cheaper() {
    // One large node running one small pod: a small node is cheaper.
    let (s, c) = big_on_demand(&types());
    let cmd = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(cmd.method, Method::SingleNodeConsolidation);
    assert_eq!(cmd.decision(), "replace");
    assert_eq!(
        cmd.replacements[0].instance_types,
        vec!["small".to_string()]
    );
    // Already on the cheapest type that fits: nothing to do.
    let (s, c) = cluster(
        &types(),
        &[Node {
            name: "small",
            ty: "small",
            ct: "on-demand",
            pods: &[("p", "1")],
        }],
    );
    assert_eq!(decide(&s, &c, &allow(1)), None);
}

/// Audit row 11: three large nodes with one 1-CPU pod each. One large node could hold all
/// three pods and costs less than three, but a replacement of a type being removed must be
/// cheaper than that candidate (upstream's filterOutSameInstanceType): keeping one large and
/// deleting the other two disrupts less, so that is the command.
#[test]
fn several_nodes_fold_into_the_ones_that_stay() {
    let (s, c) = cluster(
        &types(),
        &[
            Node {
                name: "a",
                ty: "large",
                ct: "on-demand",
                pods: &[("p1", "1")],
            },
            Node {
                name: "b",
                ty: "large",
                ct: "on-demand",
                pods: &[("p2", "1")],
            },
            Node {
                name: "c",
                ty: "large",
                ct: "on-demand",
                pods: &[("p3", "1")],
            },
        ],
    );
    let cmd = decide(&s, &c, &allow(3)).expect("a command");
    assert_eq!(cmd.method, Method::MultiNodeConsolidation);
    assert_eq!(cmd.candidates.len(), 2);
    assert_eq!(cmd.decision(), "delete");
    // The budget caps the search: with one allowed, single-node consolidation acts instead.
    let cmd = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(cmd.method, Method::SingleNodeConsolidation);
    assert_eq!(cmd.candidates.len(), 1);
}

#[test]
fn a_spot_node_is_not_replaced_by_spot() {
    let types = vec![
        it("small", 2, 1.0, &["spot", "on-demand"]),
        it("large", 8, 4.0, &["spot", "on-demand"]),
    ];
    let (s, c) = cluster(
        &types,
        &[Node {
            name: "big",
            ty: "large",
            ct: "spot",
            pods: &[("p", "1")],
        }],
    );
    assert_eq!(decide(&s, &c, &allow(1)), None);
    // An on-demand node may be replaced by a cheaper spot or on-demand one.
    let (s, c) = big_on_demand(&types);
    assert_eq!(
        decide(&s, &c, &allow(1)).map(|c| c.decision()),
        Some("replace")
    );
}

#[test]
fn when_empty_pools_only_delete_empty_nodes() {
    let (s, mut c) = big_on_demand(&types());
    c[0].policy = ConsolidationPolicy::WhenEmpty;
    assert_eq!(decide(&s, &c, &allow(1)), None);
}

/// Upstream's static drift: a static pool's drifted node, empty or not, is replaced by one claim
/// of the pool's template (no pods planned onto it), within the Drifted budget and the room its
/// `limits.nodes` leaves; nothing else takes a static pool's nodes.
#[test]
fn a_static_pools_drifted_node_is_replaced_one_for_one() {
    let (s, mut c) = cluster(
        &types(),
        &[
            Node {
                name: "busy",
                ty: "small",
                ct: "on-demand",
                pods: &[("p", "1")],
            },
            Node {
                name: "idle",
                ty: "small",
                ct: "on-demand",
                pods: &[],
            },
        ],
    );
    for x in &mut c {
        x.static_pool = true;
        x.consolidatable = false;
    }
    c[0].drift = Some(Drift::NodePoolDrifted);
    let mut a = allow(1);
    assert_eq!(decide(&s, &c, &a), None, "no room reserved: nothing");
    a.static_room.insert("default".into(), 1);
    let cmd = decide(&s, &c, &a).expect("a command");
    assert_eq!(cmd.method, Method::Drift);
    assert_eq!(cmd.claim_names(), ["claim-busy"]);
    let [r] = cmd.replacements.as_slice() else {
        panic!("one replacement: {cmd:?}")
    };
    assert!(r.pods.is_empty() && r.instance_types.is_empty(), "{r:?}");
    assert_eq!(revalidate(&s, &c, &a, &cmd).ok(), Some(cmd.clone()));
    a.budgets
        .insert(("default".into(), DisruptionReason::Drifted), 0);
    assert_eq!(decide(&s, &c, &a), None, "the Drifted budget holds it");
    // Never emptiness or consolidation, even when marked consolidatable.
    c[0].drift = None;
    c[1].consolidatable = true;
    assert_eq!(decide(&s, &c, &allow(1)), None);
}

/// Terminate-first drift (`TerminateFirstDrift`): a static pool with no room under its
/// `limits.nodes` has the drifted node deleted alone (its count refills it); without the gate
/// nothing happens, and the Drifted budget still holds it.
#[test]
fn a_static_pool_at_its_limit_takes_a_drifted_node_first_with_the_gate() {
    let (s, mut c) = drifted_busy(&types());
    c[0].static_pool = true;
    let mut a = allow(1);
    a.static_room.insert("default".into(), 0);
    assert_eq!(
        decide(&s, &c, &a),
        None,
        "without the gate: held at the limit"
    );
    a.terminate_first
        .insert(("default".into(), DisruptionReason::Drifted));
    let cmd = decide(&s, &c, &a).expect("a command");
    assert_eq!(cmd.method, Method::Drift);
    assert_eq!(cmd.claim_names(), ["claim-busy"]);
    assert!(cmd.replacements.is_empty(), "deleted first: {cmd:?}");
    assert_eq!(cmd.decision(), "delete");
    assert_eq!(revalidate(&s, &c, &a, &cmd).ok(), Some(cmd.clone()));
    a.budgets
        .insert(("default".into(), DisruptionReason::Drifted), 0);
    assert_eq!(decide(&s, &c, &a), None, "the Drifted budget holds it");
}

/// A dynamic pool's drifted node on a MachineDeployment at its max size (every other offering
/// unavailable): replace-first waits; with `TerminateFirstDrift` the node goes alone, since its
/// replacement fits in the slot it frees. A node on another MachineDeployment frees nothing the
/// replacement could use, so it stays even with the gate.
#[test]
fn a_dynamic_pool_at_its_max_size_takes_a_drifted_node_first_with_the_gate() {
    let (s, mut c) = drifted_busy(&full_at_max_size());
    let mut a = allow(1);
    assert_eq!(decide(&s, &c, &a), None, "without the gate: no room, wait");
    a.terminate_first_gates.insert(DisruptionReason::Drifted);
    let cmd = decide(&s, &c, &a).expect("a command");
    assert_eq!((cmd.method, cmd.decision()), (Method::Drift, "delete"));
    assert_eq!(cmd.claim_names(), ["claim-busy"]);
    assert_eq!(revalidate(&s, &c, &a, &cmd).ok(), Some(cmd.clone()));
    // Room beside it after the pause: the announced delete no longer holds.
    let mut roomy = s.clone();
    roomy.nodepools[0].instance_types[1].offerings[0].available = true;
    assert!(revalidate(&roomy, &c, &a, &cmd).is_err());
    let mut closed = a.clone();
    closed
        .budgets
        .insert(("default".into(), DisruptionReason::Drifted), 0);
    assert_eq!(decide(&s, &c, &closed), None, "the Drifted budget holds it");
    // One node of the pool down at a time: not while a claim of the pool still launches, nor
    // while a pending pod would take the slot first.
    let mut refilling = s.clone();
    let mut launching = refilling.nodes[0].clone();
    (launching.name, launching.in_flight) = ("launching".into(), true);
    refilling.nodes.push(launching);
    assert_eq!(decide(&refilling, &c, &a), None, "a refill is under way");
    let mut waiting = s.clone();
    let mut pending = pod("early", "", "2");
    if let Some(spec) = pending.spec.as_mut() {
        spec.node_name = None;
    }
    waiting.pods.push(pending);
    assert_eq!(decide(&waiting, &c, &a), None, "a pending pod came first");
    // Not replaced first either, when its MachineDeployment has a slot the pending pod needs:
    // the pod came first, and the node waits with that blocker.
    let mut slot = waiting.clone();
    let small = &mut slot.nodepools[0].instance_types[0].offerings[0];
    (small.replicas, small.max_size, small.available) = (1, Some(2), true);
    let d = decide_explained(&slot, &c, &a);
    assert_eq!(d.command, None, "the free slot is the pending pod's");
    let held = d
        .blocked
        .iter()
        .find(|b| b.claim == "claim-busy")
        .expect("held");
    assert_eq!(held.hold.blocker, Blocker::PodsOnTheirWay, "{held:?}");
    let mut off = a.clone();
    off.terminate_first_gates.clear();
    assert!(
        decide(&slot, &c, &off).is_some_and(|cmd| cmd.decision() == "replace"),
        "without the gate drift replaces first, as before"
    );
    c[0].machine_deployment = "ns/elsewhere".into();
    assert_eq!(
        decide(&s, &c, &a),
        None,
        "its own slot is not the one needed"
    );
}

/// The same at the NodePool's `limits`: a replacement beside the node would pass them, one in
/// its place does not.
#[test]
fn a_dynamic_pool_at_its_limits_takes_a_drifted_node_first_with_the_gate() {
    let (mut s, c) = drifted_busy(&types());
    let pool = &mut s.nodepools[0];
    pool.nodepool.spec.limits = Some(
        [(
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("2".into()),
        )]
        .into_iter()
        .collect(),
    );
    pool.usage = res("2", "4Gi").with("nodes", crate::api::resources::Quantity::from_units(1));
    let mut a = allow(1);
    assert_eq!(
        decide(&s, &c, &a),
        None,
        "without the gate: at the limit, wait"
    );
    a.terminate_first_gates.insert(DisruptionReason::Drifted);
    let cmd = decide(&s, &c, &a).expect("a command");
    assert_eq!((cmd.method, cmd.decision()), (Method::Drift, "delete"));
}

#[test]
fn a_drifted_node_is_replaced_even_without_savings() {
    let (s, mut c) = cluster(
        &types(),
        &[Node {
            name: "old",
            ty: "small",
            ct: "on-demand",
            pods: &[("p", "1")],
        }],
    );
    c[0].drift = Some(Drift::NodePoolDrifted);
    c[0].consolidatable = false;
    let cmd = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(cmd.method, Method::Drift);
    assert_eq!(cmd.decision(), "replace");
    // The drift budget can be closed while others are open.
    let mut a = allow(1);
    a.budgets
        .insert(("default".into(), DisruptionReason::Drifted), 0);
    assert_eq!(decide(&s, &c, &a), None);
}

#[test]
fn a_drift_replacement_holds_all_the_drifted_nodes_pods() {
    // "room" could take one of the drifted node's two pods: the plain plan would size the
    // replacement for the other one alone; like for like, it holds both (the scheduler may put
    // either anywhere).
    let (s, mut c) = cluster(
        &types(),
        &[
            Node {
                name: "old",
                ty: "small",
                ct: "on-demand",
                pods: &[("p1", "900m"), ("p2", "900m")],
            },
            Node {
                name: "room",
                ty: "small",
                ct: "on-demand",
                pods: &[("q", "900m")],
            },
        ],
    );
    c[0].drift = Some(Drift::NodePoolDrifted);
    c[1].consolidatable = false;
    c[0].consolidatable = false;
    let cmd = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(cmd.method, Method::Drift);
    assert_eq!(cmd.candidates.len(), 1);
    let held: usize = cmd.replacements.iter().map(|r| r.pods.len()).sum();
    assert_eq!(held, 2, "{:?}", cmd.replacements);
}

#[test]
fn disruption_cost_follows_upstream() {
    assert_eq!(eviction_cost(None, None), 1.0);
    assert!(eviction_cost(Some("1000000000"), None) > 1.0);
    assert!(eviction_cost(None, Some(-2_000_000_000)) >= -10.0);
    assert_eq!(eviction_cost(Some("not a number"), None), 1.0);
    let day = std::time::Duration::from_secs(86_400);
    assert_eq!(lifetime_remaining(day, None), 1.0);
    assert_eq!(lifetime_remaining(day, Some(day * 4)), 0.75);
    assert_eq!(lifetime_remaining(day * 5, Some(day * 4)), 0.0);
}

#[test]
fn a_pending_command_is_carried_out_only_while_it_still_holds() {
    let (s, c) = cluster(
        &types(),
        &[
            Node {
                name: "a",
                ty: "small",
                ct: "on-demand",
                pods: &[],
            },
            Node {
                name: "b",
                ty: "small",
                ct: "on-demand",
                pods: &[],
            },
        ],
    );
    let pending = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(pending.claim_names(), vec!["claim-a"]);
    // Another node became empty meanwhile: the pending command still holds as it was.
    assert_eq!(
        revalidate(&s, &c, &allow(1), &pending).ok(),
        Some(pending.clone())
    );
    // A pod landed on the candidate: it is no longer empty.
    let (s2, c2) = cluster(
        &types(),
        &[
            Node {
                name: "a",
                ty: "small",
                ct: "on-demand",
                pods: &[("p", "1")],
            },
            Node {
                name: "b",
                ty: "small",
                ct: "on-demand",
                pods: &[],
            },
        ],
    );
    assert_eq!(revalidate(&s2, &c2, &allow(1), &pending).ok(), None);
    // The candidate is protected now (no longer a candidate), or the budget closed; the
    // explained form says which.
    assert_eq!(revalidate(&s, &c[1..], &allow(1), &pending).ok(), None);
    assert_eq!(revalidate(&s, &c, &allow(0), &pending).ok(), None);
    let why = |s: &Snapshot, c: &[Candidate], n| {
        revalidate(s, c, &allow(n), &pending)
            .err()
            .unwrap_or_default()
    };
    assert!(why(&s, &c[1..], 1).contains("is no longer a candidate"));
    assert!(why(&s, &c, 0).contains("budget"));
    assert!(
        why(&s2, &c2, 1).contains("claim-a has pods"),
        "{}",
        why(&s2, &c2, 1)
    );
}

/// Upstream's emptiness validator filters: the candidates a pod landed on meanwhile stay, the
/// rest of the command goes on (a consolidation, by contrast, holds whole or not at all).
#[test]
fn an_emptiness_command_goes_on_without_the_nodes_that_got_pods() {
    let node = |name, pods| Node {
        name,
        ty: "small",
        ct: "on-demand",
        pods,
    };
    let (s, c) = cluster(&types(), &[node("a", &[]), node("b", &[]), node("c", &[])]);
    let pending = decide(&s, &c, &allow(3)).expect("a command");
    assert_eq!(pending.method, Method::Emptiness);
    assert_eq!(pending.claim_names().len(), 3);
    // A moved pod landed on b before the validation.
    let (s2, c2) = cluster(
        &types(),
        &[node("a", &[]), node("b", &[("p", "1")]), node("c", &[])],
    );
    let kept = revalidate(&s2, &c2, &allow(3), &pending).expect("the rest still holds");
    assert_eq!(kept.method, Method::Emptiness);
    assert_eq!(kept.claim_names(), vec!["claim-a", "claim-c"]);
    // The budget shrank to one meanwhile: one goes.
    let one = revalidate(&s, &c, &allow(1), &pending).expect("within the budget");
    assert_eq!(one.claim_names(), vec!["claim-a"]);
    // Every candidate got a pod: nothing is left to carry out.
    let (s3, c3) = cluster(
        &types(),
        &[
            node("a", &[("p", "1")]),
            node("b", &[("q", "1")]),
            node("c", &[("r", "1")]),
        ],
    );
    let why = revalidate(&s3, &c3, &allow(3), &pending).expect_err("none left");
    assert!(why.contains("no candidate is still empty"), "{why}");
}

/// What consolidation of nodes with pods waits for: pods of draining nodes and pending pods
/// with room now, not the pods of a command whose replacement is still launching.
#[test]
fn pods_on_their_way_are_the_draining_ones_and_those_about_to_bind() {
    let (mut s, _) = cluster(
        &types(),
        &[Node {
            name: "a",
            ty: "large",
            ct: "on-demand",
            pods: &[("a1", "1")],
        }],
    );
    let none = std::collections::HashSet::new();
    assert_eq!(consolidation::pods_on_their_way(&s, &none), 0);
    s.displaced
        .extend(["ns/d1".to_string(), "ns/d2".to_string()]);
    s.about_to_bind.insert("ns/p".to_string());
    assert_eq!(consolidation::pods_on_their_way(&s, &none), 3);
    let not_yet = std::collections::HashSet::from(["ns/d2".to_string()]);
    assert_eq!(consolidation::pods_on_their_way(&s, &not_yet), 2);
}

/// While pods are on their way, nodes with pods wait; empty nodes go on; once waited long
/// enough (`may_wait` false) nothing is held.
#[test]
fn consolidation_of_nodes_with_pods_waits_for_pods_on_their_way() {
    let node = |name, pods| Node {
        name,
        ty: "small",
        ct: "on-demand",
        pods,
    };
    let (mut s, c) = cluster(&types(), &[node("busy", &[("p", "1")]), node("empty", &[])]);
    let none = std::collections::HashSet::new();
    let mut quiet = c.clone();
    assert_eq!(
        consolidation::wait_for_pods_on_their_way(&s, &mut quiet, &none, true),
        (0, 0)
    );
    assert!(quiet.iter().all(|c| c.consolidatable));
    s.displaced.insert("ns/elsewhere".to_string());
    let mut held = c.clone();
    assert_eq!(
        consolidation::wait_for_pods_on_their_way(&s, &mut held, &none, true),
        (1, 1)
    );
    let waiting: Vec<&str> = held
        .iter()
        .filter(|c| !c.consolidatable)
        .map(|c| c.node.as_str())
        .collect();
    assert_eq!(waiting, vec!["busy"]);
    // The empty node still goes; the busy one is not decided on this pass.
    let cmd = decide(&s, &held, &allow(2)).expect("emptiness");
    assert_eq!(cmd.method, Method::Emptiness);
    assert_eq!(cmd.claim_names(), vec!["claim-empty"]);
    let mut late = c.clone();
    assert_eq!(
        consolidation::wait_for_pods_on_their_way(&s, &mut late, &none, false),
        (1, 0)
    );
    assert!(late.iter().all(|c| c.consolidatable));
}

/// Upstream refuses a plan that moves pods onto capacity that is not there yet: an in-flight
/// claim (or a Node not initialized) with room does not make a busy node deletable.
#[test]
fn consolidation_does_not_rely_on_capacity_still_launching() {
    let (mut s, c) = cluster(
        &types(),
        &[Node {
            name: "busy",
            ty: "small",
            ct: "on-demand",
            pods: &[("p", "1")],
        }],
    );
    let only_busy = c.clone();
    // An 8-CPU claim still launching, with all its room free.
    let large = types().remove(1);
    s.nodes.push(ExistingNode {
        name: "launching".into(),
        labels: [
            (INSTANCE_TYPE_LABEL, "large"),
            (ZONE_LABEL, "z"),
            (CAPACITY_TYPE_LABEL, "on-demand"),
            (NODEPOOL_LABEL, "default"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        taints: vec![],
        allocatable: large.allocatable(),
        requested: Resources::new(),
        daemon_requested: Default::default(),
        in_flight: true,
        nodepool: Some("default".into()),
    });
    assert_eq!(decide(&s, &only_busy, &allow(1)), None);
    // The same room on an initialized node is fair game.
    let last = s.nodes.len() - 1;
    s.nodes[last].in_flight = false;
    s.nodes[last].labels.insert(
        crate::api::wellknown::INITIALIZED_LABEL.into(),
        "true".into(),
    );
    let cmd = decide(&s, &only_busy, &allow(1)).expect("a command");
    assert_eq!(cmd.decision(), "delete");
}

/// Audit row 6: an empty node goes under the Empty budget only; consolidation does not take it
/// under the Underutilized one.
#[test]
fn empty_nodes_use_the_empty_budget_only() {
    let empty = |name: &'static str| Node {
        name,
        ty: "small",
        ct: "on-demand",
        pods: &[],
    };
    let (s, c) = cluster(&types(), &[empty("e1"), empty("e2")]);
    let mut allowed = allow(5);
    allowed
        .budgets
        .insert(("default".into(), DisruptionReason::Empty), 0);
    assert_eq!(decide(&s, &c, &allowed), None);
}

/// Audit row 12: v1.14 orders candidates by savings per unit of disruption. Of two nodes whose
/// pods fit elsewhere, the expensive one goes first, not the one with the fewest pods.
#[test]
fn the_most_savings_per_disruption_goes_first() {
    let (s, c) = cluster(
        &types(),
        &[
            Node {
                name: "room",
                ty: "large",
                ct: "on-demand",
                pods: &[("r", "1")],
            },
            Node {
                name: "cheap",
                ty: "small",
                ct: "on-demand",
                pods: &[("p1", "1")],
            },
            Node {
                name: "big",
                ty: "large",
                ct: "on-demand",
                pods: &[("p2", "1"), ("p3", "1")],
            },
        ],
    );
    // `room` only takes pods.
    let c: Vec<Candidate> = c.into_iter().filter(|c| c.claim != "claim-room").collect();
    let cmd = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(cmd.claim_names(), vec!["claim-big"]);
}

/// Audit row 14: under `Balanced`, a move that saves 1 % of the pool's cost while causing half
/// of its disruption is not worth it (score 0.02 < 1/k = 0.5); a move that saves as much as it
/// disrupts is.
#[test]
fn balanced_pools_weigh_savings_against_disruption() {
    let (s, c) = busy_and_idle();
    let balanced = |pool_cost: f64, pool_disruption: f64| -> Vec<Candidate> {
        c.iter()
            .cloned()
            .map(|mut x| {
                x.policy = ConsolidationPolicy::Balanced;
                x.pool_cost = pool_cost;
                x.pool_disruption = pool_disruption;
                x
            })
            .collect()
    };
    // `idle` costs 1 and disrupts 2 (itself and one pod).
    assert_eq!(decide(&s, &balanced(100.0, 4.0), &allow(1)), None);
    let cmd = decide(&s, &balanced(5.0, 10.0), &allow(1)).expect("a worthwhile move");
    assert_eq!(cmd.claim_names(), vec!["claim-idle"]);
}

/// Audit row 15: an on-demand node's replacement that may be spot or on-demand is judged at its
/// worst launch price and pinned to spot, so a launch that falls back to on-demand cannot cost
/// more than the node it replaces.
#[test]
fn an_on_demand_replacement_is_priced_at_its_worst_launch_and_pinned_to_spot() {
    let types = vec![
        // On-demand 5, spot 2.5: cheaper than the candidate only as spot.
        it("small", 2, 5.0, &["spot", "on-demand"]),
        it("large", 8, 4.0, &["on-demand"]),
    ];
    let (s, c) = big_on_demand(&types);
    let cmd = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(cmd.decision(), "replace");
    let ct = cmd.replacements[0]
        .requirements
        .get(CAPACITY_TYPE_LABEL)
        .expect("a capacity type requirement");
    assert!(ct.has("spot") && !ct.has("on-demand"), "{ct:?}");
}

/// Audit row 13: the single-node search does not always look at the same first candidates. With
/// more unmovable candidates than a pass simulates ahead of the one that can go, a later pass
/// (the window moved on) finds it.
#[test]
fn the_single_node_search_window_moves_on() {
    let mut nodes: Vec<Node<'_>> = (0..MAX_SINGLE_NODE_SIMULATIONS + 10)
        .map(|i| Node {
            name: Box::leak(format!("full-{i:03}").into_boxed_str()),
            ty: "small",
            ct: "on-demand",
            // 1.5 of 2 CPUs: fits on no other small node, and nothing is cheaper than a small.
            pods: Box::leak(
                vec![(Box::leak(format!("f{i}").into_boxed_str()) as &str, "1500m")]
                    .into_boxed_slice(),
            ),
        })
        .collect();
    // A large node of many tiny pods (a low savings ratio: it sorts last), which can go.
    let tiny: Vec<(&str, &str)> = (0..9)
        .map(|i| (Box::leak(format!("t{i}").into_boxed_str()) as &str, "100m"))
        .collect();
    nodes.push(Node {
        name: "movable",
        ty: "large",
        ct: "on-demand",
        pods: &tiny,
    });
    let (mut s, c) = cluster(&types(), &nodes);
    // Its room is not for the others' pods.
    if let Some(n) = s.nodes.iter_mut().find(|n| n.name == "movable") {
        n.taints = vec![k8s_openapi::api::core::v1::Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }];
    }
    let mut allowed = allow(1);
    assert_eq!(
        decide(&s, &c, &allowed),
        None,
        "the first window holds only unmovable nodes"
    );
    allowed.rotation = MAX_SINGLE_NODE_SIMULATIONS;
    let cmd = decide(&s, &c, &allowed).expect("the next window reaches it");
    assert_eq!(cmd.claim_names(), vec!["claim-movable"]);
}

/// Audit row 21: validation carries out the announced plan or none. A pending delete whose
/// pods now need a replacement is dropped, not turned into a replace.
#[test]
fn validation_rejects_a_changed_plan() {
    let (s, c) = cluster(
        &types(),
        &[
            Node {
                name: "room",
                ty: "large",
                ct: "on-demand",
                pods: &[("r", "1")],
            },
            Node {
                name: "big",
                ty: "large",
                ct: "on-demand",
                pods: &[("p", "1")],
            },
        ],
    );
    let c: Vec<Candidate> = c.into_iter().filter(|c| c.claim == "claim-big").collect();
    let pending = decide(&s, &c, &allow(1)).expect("a command");
    assert_eq!(pending.decision(), "delete");
    assert_eq!(
        revalidate(&s, &c, &allow(1), &pending).ok(),
        Some(pending.clone())
    );
    // `room` filled up meanwhile: `big` could still go, but only for a new small node.
    let mut full = s.clone();
    if let Some(n) = full.nodes.iter_mut().find(|n| n.name == "room") {
        n.requested = n.allocatable.clone();
    }
    assert_eq!(
        decide(&full, &c, &allow(1)).map(|c| c.decision()),
        Some("replace")
    );
    assert_eq!(revalidate(&full, &c, &allow(1), &pending).ok(), None);
}

/// Audit row 18: a node still inside its pool's `consolidateAfter` (it just received pods) takes
/// none of the pods a consolidation would move, so it can go idle in turn.
#[test]
fn moved_pods_do_not_land_on_nodes_inside_consolidate_after() {
    let (mut s, c) = busy_and_idle();
    assert_eq!(
        decide(&s, &c, &allow(1)).map(|c| c.decision()),
        Some("delete")
    );
    s.under_consolidate_after.insert("busy".to_string());
    assert_eq!(decide(&s, &c, &allow(1)), None);
}

/// The scheduler, not the plan, places moved pods: least allocated first, in the order they
/// come back. Two nodes have 1.5 and 1 CPU free; the plan puts the candidate's 1.5-CPU pod in
/// the 1.5 and its two small pods in the 1. Smallest first, the scheduler puts the small pods
/// in the emptiest room and the big one finds none: the provisioner would launch a node for it.
#[test]
fn moved_pods_must_find_room_where_the_scheduler_spreads_them() {
    let nodes = |candidate: &'static [(&'static str, &'static str)]| {
        cluster(
            &types(),
            &[
                Node {
                    name: "c",
                    ty: "large",
                    ct: "on-demand",
                    pods: candidate,
                },
                Node {
                    name: "x",
                    ty: "large",
                    ct: "on-demand",
                    pods: &[("x1", "6500m")],
                },
                Node {
                    name: "y",
                    ty: "large",
                    ct: "on-demand",
                    pods: &[("y1", "7")],
                },
            ],
        )
    };
    let (s, c) = nodes(&[("big", "1500m"), ("s1", "500m"), ("s2", "500m")]);
    let only_c = &c[..1];
    let plan = consolidation::without(&s, &[&c[0]]);
    let moved = c[0].pods.iter().map(|p| &**p).collect();
    assert!(
        spread::stranded(&plan, &moved, None).is_some(),
        "the spread strands the big pod"
    );
    // Its pods (2.5 CPU) need a large node of their own, no cheaper: the node stays.
    assert_eq!(decide(&s, only_c, &allow(1)), None);

    // A pod already pending is ahead of the moved ones in the scheduler's queue: alone, the
    // big pod goes to the 1.5 CPU left; after a pending 1-CPU pod took the emptiest room it
    // would not, so the move needs a small node of its own.
    let (mut s, c) = nodes(&[("big", "1500m")]);
    assert_eq!(
        decide(&s, &c[..1], &allow(1)).map(|c| c.decision()),
        Some("delete")
    );
    s.pods.push(
        testing::pod("waiting")
            .namespace("ns")
            .requests("1", "1Gi")
            .build(),
    );
    assert_eq!(
        decide(&s, &c[..1], &allow(1)).map(|c| c.decision()),
        Some("replace")
    );

    // With 2 CPU of pods a small node of their own holds them all, wherever they come back in
    // the meantime: that is the move, not a delete into room the small pods would take.
    let (s, c) = nodes(&[("big", "1500m"), ("s1", "250m"), ("s2", "250m")]);
    let cmd = decide(&s, &c[..1], &allow(1)).expect("a command");
    assert_eq!(cmd.decision(), "replace");
    assert_eq!(
        cmd.replacements[0].instance_types,
        vec!["small".to_string()]
    );
}

/// Two small nodes with one 1.5-CPU pod each fold into one medium node, cheaper than both; a
/// full large node with five such pods ranks before them by savings per disruption, so no
/// prefix of that order pairs the small ones. The search tries the cheapest nodes first too.
#[test]
fn small_nodes_fold_into_a_larger_one_whatever_ranks_before_them() {
    let types = vec![
        it("small", 2, 1.0, &["on-demand"]),
        it("medium", 4, 1.9, &["on-demand"]),
        it("large", 8, 3.7, &["on-demand"]),
    ];
    let (s, c) = cluster(
        &types,
        &[
            Node {
                name: "full",
                ty: "large",
                ct: "on-demand",
                pods: &[
                    ("f1", "1500m"),
                    ("f2", "1500m"),
                    ("f3", "1500m"),
                    ("f4", "1500m"),
                    ("f5", "1500m"),
                ],
            },
            Node {
                name: "s1",
                ty: "small",
                ct: "on-demand",
                pods: &[("a", "1500m")],
            },
            Node {
                name: "s2",
                ty: "small",
                ct: "on-demand",
                pods: &[("b", "1500m")],
            },
        ],
    );
    let cmd = decide(&s, &c, &allow(3)).expect("a command");
    assert_eq!(cmd.method, Method::MultiNodeConsolidation);
    assert_eq!(cmd.claim_names(), vec!["claim-s1", "claim-s2"]);
    assert_eq!(cmd.decision(), "replace");
    assert_eq!(
        cmd.replacements[0].instance_types,
        vec!["medium".to_string()]
    );
}

/// Pods of a node already leaving (a command under way, or a deleting node) were counted on
/// finding room when their node was given up. A candidate whose removal leaves them none must
/// stay, though a pod nothing marks would not hold it back: the provisioner launches for such
/// a pod anyway, but for the leaving node's pods the launch is the consolidation's doing. Here the
/// only room for a leaving node's 1.5-CPU pod is the candidate's node, and the candidate's own
/// pod fits in the 1 CPU left elsewhere.
#[test]
fn a_candidate_keeps_the_room_pods_of_a_leaving_node_need() {
    let (mut s, c) = z_and_x_with_a_pending_pod("1500m");
    let only_z = &c[..1];
    // Merely pending (nothing marks it as counted on): the provisioner's business, the
    // candidate goes.
    assert_eq!(
        decide(&s, only_z, &allow(1)).map(|c| c.decision()),
        Some("delete")
    );
    // Displaced by a node that is leaving: the candidate holds its room and stays (a small
    // replacement for that pod would cost what the candidate does).
    s.displaced.insert("ns/pending".to_string());
    assert_eq!(decide(&s, only_z, &allow(1)), None);
}

/// A leaving node's pod and a moved pod each fit the one 1.5-CPU gap, but not both: a
/// 1.5-CPU pod of a node already leaving goes to `r1` (1.5 CPU free) and the candidate's 1-CPU
/// pod to `r2` (1 CPU free) in a packing, but their drains run side by side and the scheduler
/// puts the small pod, when it comes back first, in the emptiest room, `r1`: the leaving node's
/// pod then finds none, and the provisioner launches for it. The candidate stays (a node of
/// its own for its pod costs what it does).
#[test]
fn a_moved_pod_and_a_leaving_nodes_pod_do_not_count_on_the_same_gap() {
    let (mut s, c) = cluster(
        &types(),
        &[
            Node {
                name: "z",
                ty: "small",
                ct: "on-demand",
                pods: &[("z1", "1")],
            },
            Node {
                name: "r1",
                ty: "large",
                ct: "on-demand",
                pods: &[("r1a", "6500m")],
            },
            Node {
                name: "r2",
                ty: "large",
                ct: "on-demand",
                pods: &[("r2a", "7")],
            },
        ],
    );
    // Alone, the candidate's pod has room: the emptiest, r1.
    assert_eq!(
        decide(&s, &c[..1], &allow(1)).map(|c| c.decision()),
        Some("delete")
    );
    s.pods.push(
        testing::pod("leaving")
            .namespace("ns")
            .requests("1500m", "1Gi")
            .build(),
    );
    s.displaced.insert("ns/leaving".to_string());
    let plan = consolidation::without(&s, &[&c[0]]);
    let moved = c[0].pods.iter().map(|p| &**p).collect();
    let why = spread::stranded(&plan, &moved, None);
    assert!(
        why.as_deref()
            .is_some_and(|w| w.contains("ns/leaving of a node already leaving")),
        "{why:?}"
    );
    assert_eq!(decide(&s, &c[..1], &allow(1)), None);

    // Where the leaving node's pod has no room on the nodes there are (its room is a
    // replacement still launching), the candidate's pod takes none from it.
    let mut launching = s.nodes[1].clone();
    launching.name = "launching".into();
    launching.in_flight = true;
    launching.requested = Resources::new();
    s.nodes.push(launching);
    if let Some(n) = s.nodes.iter_mut().find(|n| n.name == "r1") {
        n.requested = n.allocatable.sub(&res("1", "1Gi"));
    }
    assert_eq!(
        decide(&s, &c[..1], &allow(1)).map(|c| c.decision()),
        Some("delete")
    );
}

/// Two nodes (z: 1.5 CPU free, x: 1 CPU free) and a pending pod; the candidate is z, whose own
/// pod fits in x's room.
fn z_and_x_with_a_pending_pod(cpu: &str) -> (Snapshot, Vec<Candidate>) {
    let (mut s, c) = cluster(
        &types(),
        &[
            Node {
                name: "z",
                ty: "small",
                ct: "on-demand",
                pods: &[("z1", "500m")],
            },
            Node {
                name: "x",
                ty: "large",
                ct: "on-demand",
                pods: &[("x1", "7")],
            },
        ],
    );
    s.pods.push(
        testing::pod("pending")
            .namespace("ns")
            .requests(cpu, "1Gi")
            .build(),
    );
    (s, c)
}

/// A pod pending now that fits the cluster as it is (a pod a drain just evicted, say) is about
/// to be bound: the scheduler binds it before the candidates' pods come back. Here its only room
/// is the candidate's node, so the candidate stays (a small replacement for it would cost what
/// the candidate does), where taking it for the provisioner's business let the candidate go and
/// left the candidate's pod, once evicted, without room.
#[test]
fn a_candidate_keeps_the_room_a_pending_pod_is_about_to_take() {
    let (mut s, c) = z_and_x_with_a_pending_pod("1500m");
    consolidation::keep_room_of_pods_about_to_bind(&mut s);
    assert_eq!(
        s.about_to_bind,
        std::collections::HashSet::from(["ns/pending".to_string()]),
        "the pending pod fits z now"
    );
    assert_eq!(decide(&s, &c[..1], &allow(1)), None);
}

/// A pending pod that no existing node has room for now needs a launch whatever consolidation
/// does: it does not hold a candidate back.
#[test]
fn a_pending_pod_without_room_now_does_not_hold_a_candidate() {
    let (mut s, c) = z_and_x_with_a_pending_pod("3");
    consolidation::keep_room_of_pods_about_to_bind(&mut s);
    assert!(s.about_to_bind.is_empty(), "{:?}", s.about_to_bind);
    assert_eq!(
        decide(&s, &c[..1], &allow(1)).map(|c| c.decision()),
        Some("delete")
    );
}

/// Upstream's RemoveInstanceTypeOptionsByPriceAndMinValues: the types cheaper than the
/// candidate must meet the NodePool's minValues on their own, or no replacement is made.
#[test]
fn a_replacement_meets_min_values_with_the_cheaper_types_alone() {
    let types = vec![
        it("small", 2, 1.0, &["on-demand"]),
        it("medium", 4, 2.0, &["on-demand"]),
        it("large", 8, 4.0, &["on-demand"]),
        it("xlarge", 16, 8.0, &["on-demand"]),
    ];
    // Four types hold the pod; two of them are cheaper than the large node it is on.
    for (min, replaced) in [(2, true), (3, false)] {
        let (mut s, c) = big_on_demand(&types);
        let mut req = crate::api::nodeclaim::NodeSelectorRequirementWithMinValues::new(
            INSTANCE_TYPE_LABEL,
            crate::api::nodeclaim::Operator::Exists,
            &[],
        );
        req.min_values = Some(min);
        s.nodepools[0].nodepool.spec.template.spec.requirements = vec![req];
        let cmd = decide(&s, &c, &allow(1));
        assert_eq!(cmd.is_some(), replaced, "minValues {min}: {cmd:?}");
    }
}

/// The metrics' start-up series name every method with the decisions it can take.
#[test]
fn the_metrics_declare_every_method_with_its_decisions() {
    let methods = [
        Method::Repair,
        Method::Emptiness,
        Method::Drift,
        Method::MultiNodeConsolidation,
        Method::SingleNodeConsolidation,
    ];
    let expected: Vec<(String, &str, &[&str])> = methods
        .iter()
        .map(|m| {
            let decisions: &[&str] = match m {
                Method::Emptiness => &["delete"],
                Method::Repair
                | Method::Drift
                | Method::MultiNodeConsolidation
                | Method::SingleNodeConsolidation => &["delete", "replace"],
            };
            (
                m.reason().as_str().to_lowercase(),
                m.consolidation_type(),
                decisions,
            )
        })
        .collect();
    let declared: Vec<(String, &str, &[&str])> = crate::metrics::DISRUPTION_METHOD_SERIES
        .iter()
        .map(|(r, t, d)| (r.to_string(), *t, *d))
        .collect();
    assert_eq!(declared, expected);
}

mod blockers;
