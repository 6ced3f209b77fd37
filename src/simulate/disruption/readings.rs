//! What the disruption scenarios read off the simulated cluster's store to judge the
//! controller: live claims and nodes, cost, pods unbound or pending, disruption still under way,
//! and the lower bound on nodes no packing beats. Read from the server, never from the controller.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::api::resources::Resources;
use crate::api::wellknown::DISRUPTED_TAINT_KEY;
use crate::simulate::BackgroundSim;
use crate::simulate::launch::{self};

pub(super) fn deleting(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

pub(super) fn name_of(v: &Value) -> String {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

pub(super) fn bound(p: &Value) -> bool {
    p.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty())
}

pub(super) fn has_condition(v: &Value, ty: &str) -> bool {
    v.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == ty && c["status"] == "True"))
}

/// The scenario's NodePool says `NodesUpToDate=True` for its current generation: the rollout
/// of its last change has ended, as `kubectl wait --for=condition=NodesUpToDate` reads it (a
/// True left from before the change does not count).
pub(super) fn pool_up_to_date(sim: &BackgroundSim) -> bool {
    let Some(pool) = (sim.cluster().karpenter_store()).get("nodepools", "", launch::NODEPOOL)
    else {
        return false;
    };
    let generation = pool.pointer("/metadata/generation");
    pool.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c["type"] == "NodesUpToDate"
                    && c["status"] == "True"
                    && c.get("observedGeneration") == generation
            })
        })
}

/// Live (not deleting) claims.
pub(super) fn live_claims(sim: &BackgroundSim) -> BTreeSet<String> {
    sim.cluster()
        .karpenter_store()
        .list("nodeclaims", None)
        .iter()
        .filter(|c| !deleting(c))
        .map(name_of)
        .collect()
}

/// The sum of the prices of the MachineDeployments of the live Machines.
pub fn cost_per_hour(sim: &BackgroundSim) -> f64 {
    crate::simulate::timeline::cost_per_hour(sim.cluster().capi_store())
}

pub(super) fn live_nodes(sim: &BackgroundSim) -> usize {
    sim.cluster()
        .store()
        .list("nodes", None)
        .iter()
        .filter(|n| !deleting(n))
        .count()
}

/// Total requests of the pods that should run (not being deleted, not finished) over the
/// largest offering (`cpu`, `memory`, `pods`): the fewest nodes that could hold them, ignoring
/// how they pack.
pub fn lower_bound(pods: &[Value], largest: (&str, &str, u64)) -> usize {
    let mut total = Resources::new();
    let mut count = 0u64;
    for p in pods.iter().filter(|p| !deleting(p)) {
        if matches!(
            p.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        ) {
            continue;
        }
        count += 1;
        if let Ok(pod) = serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(p.clone())
            && let Some(r) = pod
                .spec
                .as_ref()
                .and_then(|s| crate::scheduling::pod::pod_requests(s).ok())
        {
            total.add_assign(&r);
        }
    }
    let quantity = |s: &str| {
        crate::api::resources::Quantity::from_k8s(
            &k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.to_string()),
        )
        .map(|q| q.as_f64())
        .unwrap_or(0.0)
    };
    let (cpu, memory, max_pods) = (quantity(largest.0), quantity(largest.1), largest.2);
    let ratio = |used: f64, cap: f64| if cap > 0.0 { used / cap } else { 0.0 };
    let need = ratio(total.get("cpu").as_f64(), cpu)
        .max(ratio(total.get("memory").as_f64(), memory))
        .max(ratio(count as f64, max_pods as f64));
    // A hair of tolerance so 10.0000001 from float sums is 10.
    (need - 1e-9).ceil().max(0.0) as usize
}

/// The longest any pod spent pending (created, not yet bound) after `since_ms`, from the
/// server's write log; pods still unbound count until now, pods deleted unbound until then.
pub fn max_pending_ms(sim: &BackgroundSim, since_ms: u64) -> u64 {
    let stats = sim.cluster().stats();
    let now = stats.now_ms();
    let mut open: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut longest = 0;
    for w in stats.writes() {
        if w.resource != "pods" {
            continue;
        }
        let key = (w.namespace.clone(), w.name.clone());
        match (w.verb.as_str(), w.subresource.as_str()) {
            ("create", "") => {
                open.insert(key, w.at_ms);
            }
            ("create", "binding") | ("delete", "") => {
                if let Some(at) = open.remove(&key)
                    && w.at_ms >= since_ms
                {
                    longest = longest.max(w.at_ms - at.max(since_ms));
                }
            }
            _ => {}
        }
    }
    for at in open.values() {
        longest = longest.max(now.saturating_sub((*at).max(since_ms)));
    }
    longest
}

/// Anything of a disruption in flight: a claim being deleted or marked, a Node tainted as
/// disrupted.
pub(super) fn disruption_in_flight(sim: &BackgroundSim) -> Option<String> {
    let store = sim.cluster().store();
    for c in sim.cluster().karpenter_store().list("nodeclaims", None) {
        if deleting(&c) {
            return Some(format!("NodeClaim {} terminating", name_of(&c)));
        }
        if has_condition(&c, "DisruptionReason") {
            return Some(format!("NodeClaim {} marked for disruption", name_of(&c)));
        }
    }
    for n in store.list("nodes", None) {
        let tainted = n
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .is_some_and(|ts| ts.iter().any(|t| t["key"] == DISRUPTED_TAINT_KEY));
        if tainted {
            return Some(format!("Node {} tainted disrupted", name_of(&n)));
        }
    }
    None
}

pub(super) fn unbound_pods(sim: &BackgroundSim) -> usize {
    sim.cluster()
        .store()
        .list("pods", None)
        .iter()
        .filter(|p| !deleting(p) && !bound(p))
        .count()
}

/// Pods the scheduler bound onto a node in the `window_ms` before the controller's first
/// disruption taint on it in the phase (from `since_ms`): the time between a decision and its
/// taint, when the candidate still takes pods whose room the decision did not plan.
pub(super) fn binds_before_taint(sim: &BackgroundSim, since_ms: u64, window_ms: u64) -> u64 {
    let stats = sim.cluster().stats();
    let mut tainted: BTreeMap<String, u64> = BTreeMap::new();
    for w in stats.writes().iter().filter(|w| {
        w.at_ms >= since_ms
            && w.agent == crate::app::USER_AGENT
            && w.resource == "nodes"
            && w.verb == "patch"
    }) {
        tainted.entry(w.name.clone()).or_insert(w.at_ms);
    }
    sim.cluster()
        .bindings()
        .iter()
        .filter(|b| {
            tainted.get(&b.node).is_some_and(|&taint| {
                let at = stats.ms_at(b.bound_at);
                at < taint && at + window_ms >= taint
            })
        })
        .count() as u64
}
