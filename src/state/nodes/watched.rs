//! The Node as the watch decodes it (`state::watched`): its `metadata.managedFields`, and what
//! `trim::node_body` drops from its status, skipped while the JSON is parsed. A kubelet's Node
//! on a real API server carries managedFields from several managers, the image list (often
//! dozens of entries with long digests), node info, addresses and volumes: decoding a whole
//! `Node` cost four times what the simulated backend's did, per claim, only for the index to
//! drop all that. The conditions each decode without their heartbeat and message (also
//! dropped); which conditions stay is the watch's choice (`trim::node_keeping`), made after.
//! The spec is kept whole, as the trim keeps it.

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};

use crate::api::partial::{Fields, Keep};
use crate::state::watched::{Parts, Slimmed, Watched};

/// A watched Node: the same resource as `Node` for `Api` and the watcher.
pub(crate) type WatchedNode = Watched<Node>;

/// A condition without what `trim::node_body` drops from it.
const CONDITION: Keep = Keep::Object(&Fields {
    only: None,
    skip: &["lastHeartbeatTime", "message"],
    nested: &[],
});

/// A Node's status: what `trim::node_body` empties is skipped (its tests check the two agree).
const STATUS: Keep = Keep::Object(&Fields {
    only: None,
    skip: &[
        "capacity",
        "images",
        "nodeInfo",
        "addresses",
        "daemonEndpoints",
        "volumesInUse",
        "volumesAttached",
        "config",
        "features",
        "runtimeHandlers",
    ],
    nested: &[("conditions", Keep::Each(&CONDITION))],
});

impl Slimmed for Node {
    type Spec = NodeSpec;
    type Status = NodeStatus;
    const SPEC: Keep = Keep::All;
    const STATUS: Keep = STATUS;
    fn parts(&mut self) -> Parts<'_, NodeSpec, NodeStatus> {
        Parts {
            metadata: &mut self.metadata,
            spec: &mut self.spec,
            status: &mut self.status,
        }
    }
}

#[cfg(test)]
mod tests;
