//! The handed-back instances of a pool without MachinePool Machines as one plan sees them, and
//! the plan as such a pool carries it out (see `instances` for the whole story): a decrement
//! becomes a hand-back, and waiting claims take free handed-back instances back before any
//! replica is raised. Pure functions of the snapshot, like `plan`.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::plan::{MachineView, Plan, ReplicaWrite};
use crate::api::wellknown::HANDED_BACK_NODE_ANNOTATION;
use crate::state::compact::CompactNode;

/// The pool's handed-back instances as one plan sees them (see the module's comment).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct TakeBack {
    /// Held by a live claim whose bind the index shows: ours again once the write striking
    /// them from the handed-back list lands.
    pub(super) held: Vec<String>,
    /// Take-back binds the index does not show yet: no replica write until it does.
    pub(super) in_flight: i32,
    /// Free to take: held by no claim, its Node let go, Ready and not leaving (listed order).
    pub(super) free: Vec<String>,
}

impl TakeBack {
    /// How many handed-back instances count as ours in this plan.
    pub(super) fn ours(&self) -> i32 {
        self.held.len() as i32 + self.in_flight
    }
}

/// The planner's view of the pool's instances: views, handed-back baseline left out of them,
/// and the handed-back instances claims hold or may take.
#[derive(Default)]
pub(super) struct InstanceSide {
    pub(super) views: Vec<MachineView>,
    /// Handed-back instances not taken back: baseline the views leave out (see
    /// `plan::Snapshot::set_aside`).
    pub(super) set_aside: i32,
    pub(super) take_back: TakeBack,
    /// Nodes of handed-back instances no claim let go (see `settle_handed_back_nodes`).
    pub(super) unsettled: Vec<Arc<Node>>,
}

/// The plan, as a pool that cannot remove an instance carries it out: nothing released (no
/// spare can be removed by name), a decrement becomes a hand-back that keeps the replica,
/// and waiting claims take free handed-back instances before any replica is raised.
/// `managed` is the count recorded on the pool (the snapshot counted `take_back` on top).
pub(super) fn instance_plan(
    plan: &mut Plan,
    take_back: &TakeBack,
    spec_replicas: i32,
    managed: i32,
    waiting: &[String],
) {
    plan.release.clear();
    let direct = std::mem::take(&mut plan.delete_directly);
    if let Some(w) = plan.write.as_mut()
        && (!w.decrements.is_empty() || !direct.is_empty())
    {
        w.to = w.from;
        w.handed_back = std::mem::take(&mut w.decrements);
        w.handed_back.extend(direct);
    }
    take_free_instances(plan, &take_back.free, waiting);
    if take_back.in_flight > 0 {
        // Counted as ours in the snapshot but not yet provably held: a write now could
        // record a count a restart would not find again.
        plan.write = None;
    } else if !take_back.held.is_empty() {
        let w = plan.write.get_or_insert_with(|| ReplicaWrite {
            from: spec_replicas,
            to: spec_replicas,
            managed_from: managed + take_back.ours(),
            managed_to: managed + take_back.ours(),
            decrements: Vec::new(),
            handed_back: Vec::new(),
            reclaimed: Vec::new(),
        });
        w.managed_from = managed;
        w.reclaimed = take_back.held.clone();
    }
}

/// Waiting claims that no Machine was planned for take free handed-back instances, oldest
/// claim first; each one a raise planned for it no longer needs (or a claim turned away at
/// max-size no longer is: taking an instance back raises nothing).
fn take_free_instances(plan: &mut Plan, free: &[String], waiting: &[String]) {
    let planned: HashSet<String> = plan.bind.iter().map(|(c, _)| c.clone()).collect();
    let unplaced = waiting.iter().filter(|c| !planned.contains(*c));
    for (claim, pid) in unplaced.zip(free) {
        if let Some(i) = plan.reject.iter().position(|c| c == claim) {
            plan.reject.remove(i);
        } else if let Some(w) = plan.write.as_mut().filter(|w| w.delta() > 0) {
            w.to -= 1;
            w.managed_to -= 1;
        }
        plan.bind.push((claim.clone(), pid.clone()));
    }
    if plan.write.as_ref().is_some_and(|w| {
        w.to == w.from && w.managed_to == w.managed_from && w.handed_back.is_empty()
    }) {
        plan.write = None;
    }
}

/// A handed-back instance may be taken when its Node was let go by its old claim (so it
/// carries nothing of that claim's), is Ready and is not leaving: an instance that never joined
/// may never join, and a claim bound to it would wait out its registration TTL.
pub(super) fn free_to_take(node: Option<&Arc<CompactNode>>) -> bool {
    node.is_some_and(|n| n.ready() && !n.deleting() && let_go(n))
}

/// The Node was left to the pool (by its claim's termination, or by the Scaler for a Node that
/// joined after its claim was gone).
pub(super) fn let_go(node: &CompactNode) -> bool {
    node.annotations()
        .get(HANDED_BACK_NODE_ANNOTATION)
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::scaler::plan::plan;

    #[test]
    fn a_decrement_becomes_a_hand_back_that_keeps_the_replica() {
        let mut p = Plan {
            write: Some(ReplicaWrite {
                from: 3,
                to: 2,
                managed_from: 3,
                managed_to: 1,
                decrements: vec!["p1".into()],
                handed_back: Vec::new(),
                reclaimed: Vec::new(),
            }),
            delete_directly: vec!["p2".into()],
            release: vec!["p3".into()],
            ..Plan::default()
        };
        instance_plan(&mut p, &TakeBack::default(), 3, 3, &[]);
        let w = p.write.expect("a write");
        assert_eq!((w.from, w.to, w.managed_to), (3, 3, 1));
        assert_eq!(w.handed_back, vec!["p1".to_string(), "p2".to_string()]);
        assert!(w.decrements.is_empty() && p.release.is_empty() && p.delete_directly.is_empty());
    }

    #[test]
    fn a_scale_up_stays_a_scale_up() {
        let w = vec!["a".to_string()];
        let mut p = plan(&crate::actors::scaler::plan::Snapshot {
            spec_replicas: 1,
            managed: 0,
            min_size: 0,
            max_size: None,
            set_aside: 0,
            machines: &[],
            waiting: &w,
            rolling_out: false,
            unplaced: 0,
        });
        instance_plan(&mut p, &TakeBack::default(), 1, 0, &w);
        let w = p.write.expect("a write");
        assert_eq!((w.from, w.to, w.managed_to), (1, 2, 1));
        assert!(w.handed_back.is_empty());
    }

    /// A pool of 3: one instance bound, one baseline, one handed back (`p9`, its Node let go).
    fn pool_plan(waiting: &[String], max_size: Option<i32>) -> Plan {
        let machines = [
            MachineView {
                key: "p1".into(),
                bound_to: Some("old".into()),
                marked: false,
                replaced: false,
            },
            MachineView {
                key: "p2".into(),
                bound_to: None,
                marked: false,
                replaced: false,
            },
        ];
        plan(&crate::actors::scaler::plan::Snapshot {
            spec_replicas: 3,
            managed: 1,
            min_size: 0,
            max_size,
            set_aside: 1,
            machines: &machines,
            waiting,
            rolling_out: false,
            unplaced: 0,
        })
    }

    fn free(pids: &[&str]) -> TakeBack {
        TakeBack {
            free: pids.iter().map(|p| p.to_string()).collect(),
            ..TakeBack::default()
        }
    }

    #[test]
    fn a_waiting_claim_takes_a_handed_back_instance_instead_of_a_raise() {
        let waiting = vec!["a".to_string(), "b".to_string()];
        let mut p = pool_plan(&waiting, None);
        assert_eq!(p.write.as_ref().map(|w| w.to), Some(5), "{p:?}");
        instance_plan(&mut p, &free(&["p9"]), 3, 1, &waiting);
        assert_eq!(p.bind, vec![("a".to_string(), "p9".to_string())]);
        let w = p.write.expect("the raise for b");
        assert_eq!((w.from, w.to, w.managed_to), (3, 4, 2));

        let one = vec!["a".to_string()];
        let mut p = pool_plan(&one, None);
        instance_plan(&mut p, &free(&["p9"]), 3, 1, &one);
        assert_eq!(p.bind, vec![("a".to_string(), "p9".to_string())]);
        assert_eq!(p.write, None, "no raise at all");
    }

    #[test]
    fn a_claim_turned_away_at_max_size_takes_a_handed_back_instance() {
        let waiting = vec!["a".to_string()];
        let mut p = pool_plan(&waiting, Some(3));
        assert_eq!(p.reject, waiting);
        instance_plan(&mut p, &free(&["p9"]), 3, 1, &waiting);
        assert!(p.reject.is_empty(), "{p:?}");
        assert_eq!(p.bind, vec![("a".to_string(), "p9".to_string())]);
        assert_eq!(p.write, None);
    }

    #[test]
    fn a_taken_back_instance_is_counted_ours_by_one_write_once_its_bind_shows() {
        let held = TakeBack {
            held: vec!["p9".into()],
            ..TakeBack::default()
        };
        // The snapshot counted it as ours (managed 1 + 1) and bound: nothing else to do.
        let machines = [MachineView {
            key: "p9".into(),
            bound_to: Some("a".into()),
            marked: false,
            replaced: false,
        }];
        let mut p = plan(&crate::actors::scaler::plan::Snapshot {
            spec_replicas: 3,
            managed: 2,
            min_size: 0,
            max_size: None,
            set_aside: 0,
            machines: &machines,
            waiting: &[],
            rolling_out: false,
            unplaced: 0,
        });
        instance_plan(&mut p, &held, 3, 1, &[]);
        let w = p.write.expect("the take-back write");
        assert_eq!((w.from, w.to, w.managed_to), (3, 3, 2));
        assert_eq!(w.reclaimed, vec!["p9".to_string()]);

        let unseen = TakeBack {
            in_flight: 1,
            ..held
        };
        let waiting = vec!["b".to_string()];
        let mut p = pool_plan(&waiting, None);
        instance_plan(&mut p, &unseen, 3, 1, &waiting);
        assert_eq!(p.write, None, "no write while a take-back bind is unseen");
    }
}
