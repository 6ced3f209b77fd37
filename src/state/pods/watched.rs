//! The Pod as the watch decodes it (`state::watched`): its `metadata.managedFields`, and
//! whatever of its spec and status `state::trim` drops ([`slim`]), skipped while the JSON is
//! parsed. On a real API server every pod carries managedFields: a quarter of the controller's
//! CPU on a real control plane went to decoding pods, most of it that tree.

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};

use crate::state::watched::{Parts, Slimmed, Watched};

/// A watched Pod: the same resource as `Pod` for `Api` and the watcher.
pub(crate) type WatchedPod = Watched<Pod>;

impl Slimmed for Pod {
    type Spec = PodSpec;
    type Status = PodStatus;
    const SPEC: slim::Keep = slim::SPEC;
    const STATUS: slim::Keep = slim::STATUS;
    fn parts(&mut self) -> Parts<'_, PodSpec, PodStatus> {
        Parts {
            metadata: &mut self.metadata,
            spec: &mut self.spec,
            status: &mut self.status,
        }
    }
}

mod slim;

#[cfg(test)]
mod tests;
