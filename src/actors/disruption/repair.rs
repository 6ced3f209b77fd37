//! The writes node repair adds to a disruption command (Karpenter v1.15): the claim's
//! termination deadline stamped right before its delete, so the drain of a node that is down
//! waits for nothing, and the repair counted and told once the delete landed.

use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::actors::persist::persist_counted;
use crate::actors::{Error, Shared, api_err};
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::TERMINATION_TIMESTAMP_ANNOTATION;
use crate::disruption::{Candidate, Command, Method};
use crate::view::repair::termination_stamp;

/// Before a repair's delete: the termination deadline at now (an earlier one is kept). A claim
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
    let Some(stamp) = claim.and_then(|cl| termination_stamp(cl, jiff::Timestamp::now())) else {
        return Ok(());
    };
    let api: Api<NodeClaim> = Api::all(shared.workload.clone());
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
pub(super) fn count_repaired(shared: &Shared, cmd: &Command, c: &Candidate, claim: &NodeClaim) {
    if let (Method::Repair, Some(verdict)) = (cmd.method, c.repair.as_ref()) {
        crate::actors::repair::count_repaired(shared, claim, &verdict.condition, &verdict.why);
    }
}
