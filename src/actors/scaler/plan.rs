//! The Scaler's decisions as a pure function of one snapshot: which waiting claims get which
//! Machines, whether to raise or lower `spec.replicas`, which surplus Machines to release.
//!
//! Accounting is by counts, rebuilt from durable state every time, so a restarted controller
//! reaches the same answer as the one that crashed:
//! - `managed` (an annotation written with every replica write) is how many replicas we own;
//!   the rest (`spec.replicas - managed`) are the baseline we never touch;
//! - what we should own is every Machine bound to a claim, every Machine we marked for release
//!   but have not yet decremented, and one pending replica per waiting claim.

#[cfg(test)]
use std::collections::BTreeSet;

/// One live Machine of the MachineDeployment, as the planner needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineView {
    pub key: String,
    /// The claim named by the Machine's binding annotation (or a bind in flight).
    pub bound_to: Option<String>,
    /// Carries `cluster.x-k8s.io/delete-machine`: released by us, waiting for the decrement.
    pub marked: bool,
    /// Outdated by a rollout, its claim already replaced by one on a fresh Machine: Cluster API
    /// deletes it, so it is not a replica we need (the fresh Machine is its surge).
    pub replaced: bool,
}

#[derive(Clone, Debug)]
pub struct Snapshot<'a> {
    pub spec_replicas: i32,
    pub managed: i32,
    pub min_size: i32,
    pub max_size: Option<i32>,
    /// Baseline replicas not among `machines` (a pool's handed-back instances): the baseline
    /// left to find among them is that much smaller.
    pub set_aside: i32,
    /// Live Machines (not deleting, not already decremented), oldest first.
    pub machines: &'a [MachineView],
    /// Claims waiting for a Machine, oldest first.
    pub waiting: &'a [String],
    /// Cluster API is rolling the MachineDeployment out (RollingUpdate with outdated Machines
    /// left): it replaces our claims' Machines with fresh ones. Spare Machines are kept for the
    /// claims that replace the rolled-out ones to adopt, not released (which would only make
    /// Cluster API create them again).
    pub rolling_out: bool,
    /// Claims of ours that have chosen no MachineDeployment yet. Adopting another
    /// provisioner's replicas counts a free Machine for each of its claims caught between the
    /// replica raise and the bind; until such a claim chooses, that many spare Machines are
    /// kept for it rather than released (and created again when it chooses this one).
    pub unplaced: i32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// (claim, machine key): bind these now.
    pub(crate) bind: Vec<(String, String)>,
    /// Raise or lower replicas (at most one write at a time).
    pub(crate) write: Option<ReplicaWrite>,
    /// Waiting claims that cannot fit under max-size: they should choose another offering.
    pub(crate) reject: Vec<String>,
    /// Unbound Machines of ours that no claim wants: annotate them for deletion.
    pub(crate) release: Vec<String>,
    /// Marked Machines that cannot be decremented because of min-size: delete them directly
    /// (their MachineSet replaces them as baseline capacity).
    pub(crate) delete_directly: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReplicaWrite {
    pub(crate) from: i32,
    pub(crate) to: i32,
    pub(crate) managed_from: i32,
    pub(crate) managed_to: i32,
    /// Marked Machines this write removes (empty for a scale-up).
    pub(crate) decrements: Vec<String>,
    /// Instances of a pool without MachinePool Machines handed back to the pool by this write
    /// (their replicas kept, no longer ours).
    pub(crate) handed_back: Vec<String>,
    /// Handed-back instances of such a pool that claims took again: ours once more (counted in
    /// `managed_to`), struck from the handed-back list by this write.
    pub(crate) reclaimed: Vec<String>,
}

impl ReplicaWrite {
    pub(crate) fn delta(&self) -> i32 {
        self.to - self.from
    }
}

pub fn plan(s: &Snapshot<'_>) -> Plan {
    let mut plan = Plan::default();
    let baseline = (s.spec_replicas - s.managed - s.set_aside).max(0);
    let bound = s.machines.iter().filter(|m| m.bound_to.is_some()).count() as i32;
    let marked: Vec<&MachineView> = s
        .machines
        .iter()
        .filter(|m| m.marked && m.bound_to.is_none())
        .collect();
    let unbound: Vec<&MachineView> = s
        .machines
        .iter()
        .filter(|m| m.bound_to.is_none() && !m.marked)
        .collect();

    // Ours among the unbound are the newest ones beyond the baseline count.
    let live = s.machines.len() as i32;
    let ours_unbound =
        (live - baseline - bound - marked.len() as i32).clamp(0, unbound.len() as i32) as usize;
    let eligible = &unbound[unbound.len() - ours_unbound..];

    // FIFO: the oldest waiting claim gets the oldest eligible Machine.
    let pairs = s.waiting.len().min(eligible.len());
    for (claim, m) in s.waiting.iter().zip(eligible.iter()).take(pairs) {
        plan.bind.push((claim.clone(), m.key.clone()));
    }
    let still_waiting = &s.waiting[pairs..];
    let spare = &eligible[pairs..];

    let replaced = s
        .machines
        .iter()
        .filter(|m| m.replaced && m.bound_to.is_some())
        .count() as i32;
    let desired = bound - replaced + marked.len() as i32 + s.waiting.len() as i32;
    if desired > s.managed {
        let mut need = desired - s.managed;
        if let Some(max) = s.max_size {
            let room = (max - s.spec_replicas).max(0);
            if need > room {
                // Reject the newest waiters that have neither a Machine nor room.
                let over = (need - room) as usize;
                let rejectable = still_waiting.len().min(over);
                plan.reject = still_waiting[still_waiting.len() - rejectable..].to_vec();
                need = room;
            }
        }
        if need > 0 {
            plan.write = Some(ReplicaWrite {
                from: s.spec_replicas,
                to: s.spec_replicas + need,
                managed_from: s.managed,
                managed_to: s.managed + need,
                decrements: Vec::new(),
                handed_back: Vec::new(),
                reclaimed: Vec::new(),
            });
        }
        return plan;
    }

    let to_decrement: Vec<String> = s
        .machines
        .iter()
        .filter(|m| m.marked)
        .map(|m| m.key.clone())
        .collect();
    if !to_decrement.is_empty() {
        let k = to_decrement.len() as i32;
        let to = (s.spec_replicas - k).max(s.min_size).min(s.spec_replicas);
        let through_replicas = (s.spec_replicas - to) as usize;
        let (dec, direct) = to_decrement.split_at(through_replicas.min(to_decrement.len()));
        plan.delete_directly = direct.to_vec();
        plan.write = Some(ReplicaWrite {
            from: s.spec_replicas,
            to,
            managed_from: s.managed,
            managed_to: (s.managed - k).max(0),
            decrements: dec.to_vec(),
            handed_back: Vec::new(),
            reclaimed: Vec::new(),
        });
        return plan;
    }

    if desired < s.managed && !s.rolling_out {
        // Surplus pending replicas (a claim gave up before its Machine came): release the
        // newest spare Machines of ours; a replica whose Machine has not appeared yet is released
        // when it does (never lower replicas blindly).
        let surplus = (s.managed - desired - s.unplaced).max(0) as usize;
        plan.release = spare
            .iter()
            .rev()
            .take(surplus)
            .map(|m| m.key.clone())
            .collect();
    }
    plan
}

/// Claims named by more than one Machine in a snapshot (never expected; reported, not fixed).
#[cfg(test)]
pub(crate) fn claims_bound_twice(machines: &[MachineView]) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut twice = BTreeSet::new();
    for c in machines.iter().filter_map(|m| m.bound_to.as_ref()) {
        if !seen.insert(c.clone()) {
            twice.insert(c.clone());
        }
    }
    twice
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(key: &str, bound: Option<&str>, marked: bool) -> MachineView {
        MachineView {
            key: key.into(),
            bound_to: bound.map(Into::into),
            marked,
            replaced: false,
        }
    }

    fn waiting(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn snap<'a>(
        spec: i32,
        managed: i32,
        machines: &'a [MachineView],
        waiting: &'a [String],
    ) -> Snapshot<'a> {
        Snapshot {
            spec_replicas: spec,
            managed,
            min_size: 0,
            max_size: None,
            set_aside: 0,
            machines,
            waiting,
            rolling_out: false,
            unplaced: 0,
        }
    }

    #[test]
    fn one_write_covers_every_waiting_claim() {
        let w = waiting(&["a", "b", "c"]);
        let p = plan(&snap(0, 0, &[], &w));
        assert_eq!(
            p.write.as_ref().map(|w| (w.from, w.to, w.managed_to)),
            Some((0, 3, 3))
        );
        assert!(p.bind.is_empty());
    }

    #[test]
    fn machines_bind_fifo_and_baseline_is_never_taken() {
        // Two baseline Machines (old), then two of ours.
        let ms = [
            m("base-1", None, false),
            m("base-2", None, false),
            m("new-1", None, false),
            m("new-2", None, false),
        ];
        let w = waiting(&["a", "b", "c"]);
        let p = plan(&snap(5, 3, &ms, &w));
        assert_eq!(
            p.bind,
            vec![("a".into(), "new-1".into()), ("b".into(), "new-2".into())]
        );
        assert_eq!(p.write, None, "the third replica is already written");
    }

    #[test]
    fn restart_before_the_replica_write_adds_the_missing_replicas() {
        // Claims recorded the MD but the controller died before writing replicas.
        let w = waiting(&["a", "b"]);
        let p = plan(&snap(1, 0, &[m("base", None, false)], &w));
        assert_eq!(p.write.map(|w| (w.from, w.to)), Some((1, 3)));
        assert!(p.bind.is_empty());
    }

    #[test]
    fn max_size_rejects_the_newest_waiters() {
        let w = waiting(&["a", "b", "c"]);
        let mut s = snap(1, 1, &[], &w);
        s.max_size = Some(2);
        let p = plan(&s);
        // managed 1 already covers "a"; room for one more ("b"); "c" is rejected.
        assert_eq!(p.write.map(|w| w.to), Some(2));
        assert_eq!(p.reject, vec!["c".to_string()]);
    }

    #[test]
    fn marked_machines_are_decremented_in_one_write() {
        let ms = [
            m("x", Some("a"), true),
            m("y", Some("b"), true),
            m("z", Some("c"), false),
        ];
        let p = plan(&snap(3, 3, &ms, &[]));
        let w = p.write.unwrap();
        assert_eq!((w.from, w.to, w.managed_to), (3, 1, 1));
        assert_eq!(w.decrements, vec!["x".to_string(), "y".to_string()]);
    }

    #[test]
    fn min_size_turns_decrements_into_direct_deletes() {
        let ms = [m("x", Some("a"), true), m("y", Some("b"), true)];
        let mut s = snap(2, 2, &ms, &[]);
        s.min_size = 1;
        let p = plan(&s);
        let w = p.write.unwrap();
        assert_eq!((w.from, w.to, w.managed_to), (2, 1, 0));
        assert_eq!(w.decrements, vec!["x".to_string()]);
        assert_eq!(p.delete_directly, vec!["y".to_string()]);
    }

    #[test]
    fn surplus_replica_releases_a_spare_machine_of_ours_only() {
        // A claim gave up; its Machine arrived unbound. Baseline Machine stays.
        let ms = [m("base", None, false), m("ours", None, false)];
        let p = plan(&snap(2, 1, &ms, &[]));
        assert_eq!(p.release, vec!["ours".to_string()]);
        assert_eq!(p.write, None);
    }

    #[test]
    fn a_spare_is_kept_while_a_claim_has_not_chosen_its_machine_deployment() {
        // Adopted: three Machines bound, one free that the Go provider raised for a claim
        // that has not chosen yet. It stays until that claim chooses; then it binds there.
        let ms = [
            m("a-m", Some("a"), false),
            m("b-m", Some("b"), false),
            m("c-m", Some("c"), false),
            m("free", None, false),
        ];
        let choosing = Snapshot {
            unplaced: 1,
            ..snap(4, 4, &ms, &[])
        };
        assert_eq!(plan(&choosing), Plan::default());
        let w = waiting(&["f"]);
        assert_eq!(
            plan(&snap(4, 4, &ms, &w)).bind,
            vec![("f".to_string(), "free".to_string())]
        );
        // It chose another MachineDeployment: the spare goes back.
        assert_eq!(
            plan(&snap(4, 4, &ms, &[])).release,
            vec!["free".to_string()]
        );
    }

    #[test]
    fn a_rollout_keeps_fresh_machines_for_the_claims_that_replace_rolled_out_ones() {
        // Cluster API deleted a bound Machine and created a fresh one: the claim that replaces
        // the rolled-out one adopts it rather than it being released and created again.
        let ms = [m("kept", Some("c1"), false), m("fresh", None, false)];
        let rolling = Snapshot {
            rolling_out: true,
            ..snap(2, 2, &ms, &[])
        };
        assert_eq!(plan(&rolling).release, Vec::<String>::new());
        assert_eq!(plan(&rolling).write, None);
        let w = waiting(&["c2"]);
        let adopting = Snapshot {
            rolling_out: true,
            ..snap(2, 2, &ms, &w)
        };
        assert_eq!(
            plan(&adopting).bind,
            vec![("c2".to_string(), "fresh".to_string())]
        );
        // Once the rollout is over, a spare nobody adopted goes back.
        assert_eq!(
            plan(&snap(2, 2, &ms, &[])).release,
            vec!["fresh".to_string()]
        );
    }

    #[test]
    fn a_replacement_takes_the_surge_machine_without_a_replica_write() {
        // Two claims on outdated Machines; the rollout surged a fresh one. The claim created to
        // replace o1 takes it: o1's Machine is Cluster API's to delete, not a replica we need.
        let old = MachineView {
            replaced: true,
            ..m("o1", Some("c1"), false)
        };
        let ms = [
            old.clone(),
            m("o2", Some("c2"), false),
            m("fresh", None, false),
        ];
        let w = waiting(&["r1"]);
        let p = plan(&Snapshot {
            rolling_out: true,
            ..snap(2, 2, &ms, &w)
        });
        assert_eq!(p.bind, vec![("r1".to_string(), "fresh".to_string())]);
        assert_eq!(p.write, None);
        // Bound: still no write while o1 waits for Cluster API.
        let ms = [
            old,
            m("o2", Some("c2"), false),
            m("fresh", Some("r1"), false),
        ];
        let p = plan(&Snapshot {
            rolling_out: true,
            ..snap(2, 2, &ms, &[])
        });
        assert_eq!(p, Plan::default());
    }

    #[test]
    fn surplus_without_a_machine_waits_instead_of_lowering_blindly() {
        let p = plan(&snap(1, 1, &[], &[]));
        assert_eq!(p, Plan::default());
    }

    #[test]
    fn quiet_state_plans_nothing() {
        let ms = [m("a-m", Some("a"), false), m("b-m", Some("b"), false)];
        assert_eq!(plan(&snap(2, 2, &ms, &[])), Plan::default());
    }

    #[test]
    fn double_binding_is_detected() {
        let ms = [m("x", Some("a"), false), m("y", Some("a"), false)];
        assert_eq!(
            claims_bound_twice(&ms).into_iter().collect::<Vec<_>>(),
            vec!["a".to_string()]
        );
    }
}
