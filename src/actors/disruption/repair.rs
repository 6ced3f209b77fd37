//! The writes node repair adds to a disruption command (Karpenter v1.15): the claim's
//! termination deadline stamped right before its delete, so the drain of a node that is down
//! waits for nothing, and the repair counted and told once the delete landed; and the Events
//! and gauge of repairs held back, which the legacy actor (`actors::repair`) shares.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::notes::on_claim_and_node;
use crate::actors::events::Events;
use crate::actors::persist::persist_counted;
use crate::actors::{Error, Shared, api_err};
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::{NODEPOOL_LABEL, TERMINATION_TIMESTAMP_ANNOTATION};
use crate::disruption::{Candidate, Command, Method};
use crate::metrics::{NodePoolLabels, UnhealthyLabels};
use crate::view::repair::{capacity_type, termination_stamp};

/// Before a repair's delete: the termination deadline its policy allows, now for a forceful
/// repair (an earlier one is kept). A claim
/// the stamp cannot reach is not deleted (the error stops the command's delete).
pub(super) async fn stamp_deadline(
    shared: &Shared,
    cmd: &Command,
    c: &Candidate,
    claim: Option<&NodeClaim>,
) -> Result<(), Error> {
    if cmd.method != Method::Repair {
        return Ok(());
    }
    let grace = c
        .repair
        .as_ref()
        .map(|r| r.termination_grace_period)
        .unwrap_or_default();
    let Some(stamp) = claim.and_then(|cl| termination_stamp(cl, jiff::Timestamp::now(), grace))
    else {
        return Ok(());
    };
    let api: Api<NodeClaim> = shared.api();
    let patch = json!({"metadata": {"annotations": {TERMINATION_TIMESTAMP_ANNOTATION: stamp}}});
    let what = format!("stamping NodeClaim {}'s termination deadline", c.claim);
    persist_counted(&shared.metrics, "stamp", &what, |_| {
        let (api, patch) = (&api, &patch);
        async move {
            api.patch(&c.claim, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map(|_| ())
                .map_err(api_err(&shared.metrics, "patch", "nodeclaims", &c.claim))
        }
    })
    .await
}

/// After a repair's delete landed: upstream's unhealthy counter and the `NodeRepair` Event.
pub(super) fn count_command(shared: &Shared, cmd: &Command, c: &Candidate, claim: &NodeClaim) {
    if let (Method::Repair, Some(verdict)) = (cmd.method, c.repair.as_ref()) {
        count_repaired(shared, claim, &verdict.condition, &verdict.why);
    }
}

/// `NodeRepairBlocked` on each held-back claim and its Node, and on each NodePool the
/// unhealthy-fraction guard holds (`held_pools`, as upstream tells it), and the per-pool gauge
/// of them; `pools` remembers the pools the gauge is set for, so it is cleared when none is
/// left.
pub(crate) fn announce_blocked(
    shared: &Shared,
    blocked: &[(Arc<NodeClaim>, String, String)],
    held_pools: &BTreeMap<String, String>,
    pools: &mut HashSet<String>,
) {
    for (pool, why) in held_pools {
        let np = shared.state.nodepools.read().get(pool).cloned();
        if let Some(np) = np {
            shared
                .events
                .warning(np.object_ref(&()), "NodeRepairBlocked", why.clone());
        }
    }
    let mut now: HashMap<String, i64> = HashMap::new();
    for (claim, node, why) in blocked {
        tracing::info!(nodeclaim = %claim.name_any(), node = %node, reason = %why, "node repair blocked");
        let pool = claim
            .labels()
            .get(NODEPOOL_LABEL)
            .cloned()
            .unwrap_or_default();
        *now.entry(pool).or_default() += 1;
        on_claim_and_node(shared, claim, Events::warning, "NodeRepairBlocked", |_| {
            why.clone()
        });
    }
    let gauge = &shared.metrics.nodes_repair_blocked;
    for pool in pools.drain() {
        if !now.contains_key(&pool) {
            gauge.remove(&NodePoolLabels { nodepool: pool });
        }
    }
    for (pool, n) in now {
        gauge
            .get_or_create(&NodePoolLabels {
                nodepool: pool.clone(),
            })
            .set(n);
        pools.insert(pool);
    }
}

/// Upstream's `karpenter_nodeclaims_unhealthy_disrupted_total`, counted once the repaired claim
/// is deleted, and the `NodeRepair` Event saying why it went.
pub(crate) fn count_repaired(shared: &Shared, claim: &NodeClaim, condition: &str, why: &str) {
    let nodepool = claim
        .labels()
        .get(NODEPOOL_LABEL)
        .cloned()
        .unwrap_or_default();
    shared
        .metrics
        .nodeclaims_unhealthy_disrupted
        .get_or_create(&UnhealthyLabels {
            condition: condition.to_string(),
            nodepool,
            capacity_type: capacity_type(claim),
            image_id: claim
                .status
                .as_ref()
                .and_then(|s| s.image_id.clone())
                .unwrap_or_default(),
        })
        .inc();
    on_claim_and_node(shared, claim, Events::warning, "NodeRepair", |object| {
        format!("Replacing {object}: {why}")
    });
}
