//! Why a solve launches: for each new claim, where its pods come from (pending, or a deleting
//! node's) and what room the existing nodes had for them at that moment. Logged with each
//! launch, so a launch nobody expected (after a consolidation) can be read afterwards.

use std::collections::BTreeMap;

use crate::api::resources::Resources;
use crate::scheduling::pod::pod_requests;
use crate::scheduling::{Results, Snapshot};
use crate::state::pods;

/// One line per new claim of `results`, in their order.
pub(super) fn launches(snapshot: &Snapshot, results: &Results, index: &pods::Pods) -> Vec<String> {
    if results.new_claims.is_empty() {
        return Vec::new();
    }
    let by_key: BTreeMap<String, &k8s_openapi::api::core::v1::Pod> =
        snapshot.pods.iter().map(|p| (pods::key(p), p)).collect();
    // Room on the nodes a pod without tolerations may use (no NoSchedule/NoExecute taint).
    let open: Vec<(&str, Resources, bool)> = snapshot
        .nodes
        .iter()
        .filter(|n| {
            n.taints
                .iter()
                .all(|t| t.effect != "NoSchedule" && t.effect != "NoExecute")
        })
        .map(|n| {
            (
                n.name.as_str(),
                n.allocatable.sub(&n.requested),
                n.in_flight,
            )
        })
        .collect();
    let tainted = snapshot.nodes.len() - open.len();
    // CPU free on the initialized open nodes together: far more than a launch's pods need
    // means the room is there but cut into pieces too small for them.
    let free_cpu_millis: i64 = open
        .iter()
        .filter(|(_, _, in_flight)| !in_flight)
        .map(|(_, free, _)| free.get("cpu").as_millis())
        .sum();
    results
        .new_claims
        .iter()
        .map(|claim| {
            let mut from: BTreeMap<String, usize> = BTreeMap::new();
            let mut fit_somewhere = 0;
            let mut nominated = 0;
            let mut smallest: Option<Resources> = None;
            for key in &claim.pods {
                let Some(p) = by_key.get(key) else { continue };
                let origin = index
                    .get(key)
                    .and_then(|p| pods::node_name(&p).map(String::from))
                    .unwrap_or_else(|| "pending".into());
                *from.entry(origin).or_default() += 1;
                if snapshot.nominated.contains_key(key) {
                    nominated += 1;
                }
                let Some(r) = p.spec.as_ref().and_then(|s| pod_requests(s).ok()) else {
                    continue;
                };
                if open.iter().any(|(_, free, _)| r.fits(free)) {
                    fit_somewhere += 1;
                }
                if smallest
                    .as_ref()
                    .is_none_or(|s| r.get("cpu") < s.get("cpu"))
                {
                    smallest = Some(r);
                }
            }
            let smallest = smallest.unwrap_or_default();
            let room: Vec<String> = open
                .iter()
                .filter(|(_, free, _)| smallest.fits(free))
                .map(|(name, free, in_flight)| {
                    format!(
                        "{name}{}={}m/{}Mi",
                        if *in_flight { "(in flight)" } else { "" },
                        free.get("cpu").as_millis(),
                        free.get("memory").as_units() >> 20
                    )
                })
                .collect();
            format!(
                "pods={} from={from:?} nominated={nominated} fit_one_by_one={fit_somewhere} \
                 smallest={}m/{}Mi nodes_open={} nodes_tainted={tainted} \
                 free_cpu_on_open_nodes={free_cpu_millis}m room_for_smallest={room:?}",
                claim.pods.len(),
                smallest.get("cpu").as_millis(),
                smallest.get("memory").as_units() >> 20,
                open.len(),
            )
        })
        .collect()
}
