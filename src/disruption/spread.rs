//! Where the scheduler, not the plan, puts the pods a consolidation moves.
//!
//! The plan packs the moved pods biggest first into whatever room is left (the provisioner's
//! solver, first fit). kube-scheduler places them one by one, in the order they come back, on
//! the node its default scoring likes best: `LeastAllocated`, the most room left. The fresh
//! replacement takes pods first, then the emptiest nodes. Small pods arriving first take the
//! room a big one was planned into, the big one finds none, and the provisioner launches a node
//! for it: the move saved nothing and cost a node and a pause. In the 1,000-pod consolidation
//! scenario such moves turned four large nodes into four small ones with one pod each.
//!
//! So a plan stands only when every moved pod still finds room when the pods are placed that
//! way, coming back smallest first and biggest first (the order a drain recreates them in is
//! not known). The model weighs what decides room: requests, node selectors and affinity,
//! taints. It leaves out pod (anti-)affinity, topology spread, host ports and volumes, which the
//! plan has already checked.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::Taint;

use crate::api::requirements::Requirements;
use crate::api::resources::Resources;
use crate::scheduling::pod::PodInfo;
use crate::scheduling::selector::untolerated;
use crate::scheduling::{NewClaim, Snapshot};

/// Somewhere a moved pod may land.
#[derive(Clone)]
struct Room<'a> {
    name: &'a str,
    accepts: Accepts<'a>,
    taints: &'a [Taint],
    allocatable: Resources,
    used: Resources,
}

/// What a pod's node selector and affinity are checked against.
#[derive(Clone, Copy)]
enum Accepts<'a> {
    Labels(&'a BTreeMap<String, String>),
    /// A replacement not launched yet: its requirements.
    Requirements(&'a Requirements),
}

impl Room<'_> {
    fn takes(&self, pod: &PodInfo) -> bool {
        pod.requests.fits(&self.allocatable.sub(&self.used))
            && untolerated(&pod.tolerations, self.taints, false).is_none()
            && pod.node_terms.iter().any(|t| match self.accepts {
                Accepts::Labels(labels) => t.matches_labels(labels),
                Accepts::Requirements(reqs) => t.compatible(reqs).is_ok(),
            })
    }

    /// kube-scheduler's `LeastAllocated` score with the pod on it: the share of CPU and of
    /// memory left, averaged.
    fn score(&self, pod: &PodInfo) -> f64 {
        let shares: Vec<f64> = ["cpu", "memory"]
            .iter()
            .filter_map(|r| {
                let total = self.allocatable.get(r).as_f64();
                let used = self.used.get(r).as_f64() + pod.requests.get(r).as_f64();
                (total > 0.0).then(|| (total - used) / total)
            })
            .collect();
        if shares.is_empty() {
            0.0
        } else {
            shares.iter().sum::<f64>() / shares.len() as f64
        }
    }
}

/// The first pod that would find no room when the scheduler places the moved pods, smallest
/// first or biggest first, on `snapshot`'s initialized nodes and `replacement`; with why.
/// `snapshot` is the cluster without the candidates (their pods pending). Pods already pending
/// are ahead in the scheduler's queue: they are placed first (one that finds no room is the
/// provisioner's, not this move's). Pods of nodes already leaving (`displaced`) are not pending
/// yet: their drains run beside this move's, so they come back mixed with the moved pods and
/// are placed together with them, each needing room of its own, as upstream simulates the pods
/// of deleting nodes and of the candidates in one solve. Checked apart, a leaving node's pod and
/// a moved pod could each count on the same gap, and the one that came back second found none.
/// A leaving node's pod that finds no room even without the moved pods (its room is a
/// replacement still launching) is not this move's doing.
pub(crate) fn stranded(
    snapshot: &Snapshot,
    moved: &HashSet<&str>,
    replacement: Option<&NewClaim>,
) -> Option<String> {
    let mut ours = Vec::new();
    let mut displaced = Vec::new();
    let mut waiting = Vec::new();
    for p in snapshot.pods.iter().filter_map(|p| PodInfo::read(p).ok()) {
        if moved.contains(p.key.as_str()) {
            ours.push(p);
        } else if snapshot.displaced.contains(&p.key) {
            displaced.push(p);
        } else {
            waiting.push(p);
        }
    }
    if ours.is_empty() {
        return None;
    }
    let mut coming_back: Vec<&PodInfo> = ours.iter().chain(&displaced).collect();
    let mut waiting: Vec<&PodInfo> = waiting.iter().collect();
    let mut displaced: Vec<&PodInfo> = displaced.iter().collect();
    for pods in [&mut coming_back, &mut waiting, &mut displaced] {
        pods.sort_by(|a, b| by_size(a, b));
    }
    let mut rooms: Vec<Room> = snapshot
        .nodes
        .iter()
        .filter(|n| n.initialized())
        .map(|n| Room {
            name: &n.name,
            accepts: Accepts::Labels(&n.labels),
            taints: &n.taints,
            allocatable: n.allocatable.clone(),
            used: n.requested.clone(),
        })
        .collect();
    if let Some(new) = replacement {
        match replacement_room(snapshot, new, &coming_back) {
            Some(room) => rooms.push(room),
            None => {
                return Some(format!(
                    "the replacement's room is unknown ({})",
                    new.nodepool
                ));
            }
        }
    }
    rooms.sort_by(|a, b| a.name.cmp(b.name));
    [false, true].iter().find_map(|&biggest_first| {
        let mut rooms = rooms.clone();
        for pod in in_order(&waiting, biggest_first) {
            place(&mut rooms, pod);
        }
        let mut alone = rooms.clone();
        let housed_alone: HashSet<&str> = in_order(&displaced, biggest_first)
            .into_iter()
            .filter(|pod| place(&mut alone, pod))
            .map(|pod| pod.key.as_str())
            .collect();
        let which = in_order(&coming_back, biggest_first).into_iter().find(|pod| {
            !place(&mut rooms, pod)
                && (moved.contains(pod.key.as_str()) || housed_alone.contains(pod.key.as_str()))
        })?;
        let whose = if moved.contains(which.key.as_str()) {
            ""
        } else {
            " of a node already leaving"
        };
        Some(format!(
            "pod {}{whose} would find no room where the scheduler spreads the moved pods (least allocated first)",
            which.key
        ))
    })
}

fn by_size(a: &PodInfo, b: &PodInfo) -> std::cmp::Ordering {
    a.cpu()
        .cmp(&b.cpu())
        .then_with(|| a.memory().cmp(&b.memory()))
        .then_with(|| a.key.cmp(&b.key))
}

/// `pods` (sorted smallest first) in the order they come back.
fn in_order<'p>(pods: &[&'p PodInfo], biggest_first: bool) -> Vec<&'p PodInfo> {
    if biggest_first {
        pods.iter().rev().copied().collect()
    } else {
        pods.to_vec()
    }
}

/// Places `pod` on the room with the best score that takes it; false when none does.
fn place(rooms: &mut [Room], pod: &PodInfo) -> bool {
    let best = rooms
        .iter()
        .enumerate()
        .filter(|(_, r)| r.takes(pod))
        .map(|(i, r)| (i, r.score(pod)))
        .fold(None::<(usize, f64)>, |best, (i, s)| match best {
            Some((_, b)) if b >= s => best,
            _ => Some((i, s)),
        });
    match best {
        Some((i, _)) => {
            rooms[i].used.add_assign(&pod.requests);
            true
        }
        None => false,
    }
}

/// The replacement as a node: the smallest type it may launch, less what its claim holds
/// besides `pods` (the moved pods and the leaving nodes', placed again: DaemonSets, pods
/// pending anyway).
fn replacement_room<'a>(
    snapshot: &'a Snapshot,
    new: &'a NewClaim,
    pods: &[&PodInfo],
) -> Option<Room<'a>> {
    let pool = snapshot
        .nodepools
        .iter()
        .find(|p| p.nodepool.metadata.name.as_deref() == Some(new.nodepool.as_str()))?;
    let allocatable = pool
        .instance_types
        .iter()
        .filter(|t| new.instance_types.contains(&t.name))
        .map(|t| t.allocatable())
        .min_by(|a, b| {
            a.get("cpu")
                .cmp(&b.get("cpu"))
                .then_with(|| a.get("memory").cmp(&b.get("memory")))
        })?;
    let by_key: HashMap<&str, &PodInfo> = pods.iter().map(|p| (p.key.as_str(), *p)).collect();
    let mut moved_here = Resources::new();
    for p in new.pods.iter().filter_map(|k| by_key.get(k.as_str())) {
        moved_here.add_assign(&p.requests);
    }
    Some(Room {
        name: "",
        accepts: Accepts::Requirements(&new.requirements),
        taints: pool
            .nodepool
            .spec
            .template
            .spec
            .taints
            .as_deref()
            .unwrap_or_default(),
        allocatable,
        used: new.requests.sub(&moved_here),
    })
}
