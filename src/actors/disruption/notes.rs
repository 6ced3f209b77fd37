//! Disruption's Events on a claim and its Node, shared by the command's writes, the pass and
//! node repair.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Resource, ResourceExt};

use crate::actors::Shared;
use crate::api::nodeclaim::NodeClaim;

/// `Events::normal` or `Events::warning`.
pub(crate) type Publish = fn(&crate::actors::events::Events, ObjectReference, &str, String);

/// Publish a disruption Event on a claim and on its Node when it has one (`status.nodeName`, as
/// the index holds it), as upstream does, so `kubectl describe node` shows it too. `note` gets
/// the object it is for ("NodeClaim x" or "Node y"). The writer keys its repeat suppression on
/// the object, so the two Events never fold into one.
pub(crate) fn on_claim_and_node(
    shared: &Shared,
    claim: &NodeClaim,
    publish: Publish,
    reason: &str,
    note: impl Fn(&str) -> String,
) {
    let node = claim
        .status
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .and_then(|n| shared.state.nodes.read().get(n));
    if let Some(node) = node {
        publish(
            &shared.events,
            node.object_ref(&()),
            reason,
            note(&format!("Node {}", node.name_any())),
        );
    }
    publish(
        &shared.events,
        claim.object_ref(&()),
        reason,
        note(&format!("NodeClaim {}", claim.name_any())),
    );
}
