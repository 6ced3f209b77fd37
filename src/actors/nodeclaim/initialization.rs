//! Initialization (Karpenter core's lifecycle/initialization): the registered Node is Ready, has
//! no startup or ephemeral taints and offers every requested extended resource; then it is
//! labelled `karpenter.sh/initialized=true` and the claim gets `Initialized=True`.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::registration::initialized_label_patch;
use super::{Next, Step, since};
use crate::actors::Error;
use crate::api::conditions::{self, ConditionStatus};
use crate::api::wellknown::*;
use crate::metrics::Metrics;
use crate::view::node::node_initialized;
// The trimmed-Node test of the state layer still reads it here.
#[cfg(test)]
pub(crate) use crate::view::node::node_ready;

impl Step {
    /// Initialization: Ready, no startup or ephemeral taints, requested extended resources
    /// present; then label the Node and set `Initialized=True`.
    pub(super) async fn initialize(&mut self, md: &str, node: &Node) -> Result<Next, Error> {
        let c = self.claim.clone();
        if let Err(why) = node_initialized(node, &c) {
            tracing::debug!(nodeclaim = %self.name(), node = %node.name_any(), reason = why.reason, "not initialized yet");
            // Say why on the claim, as upstream does, so `kubectl get nodeclaim` shows it.
            let wanted = [(
                conditions::INITIALIZED,
                ConditionStatus::Unknown,
                why.reason,
                why.message.as_str(),
            )];
            if let Some(updated) = self.set_conditions(&wanted).await? {
                self.claim = updated;
            }
            return Ok(Next::Wait(None));
        }
        let node_name = node.name_any();
        if node.labels().get(INITIALIZED_LABEL).map(String::as_str) != Some("true") {
            self.patch_node(&node_name, initialized_label_patch(node))
                .await?;
        }
        let updated = self
            .conditions_true(&[conditions::INITIALIZED], |_| {})
            .await?;
        self.initialized_metrics(md, &node_name);
        Ok(Next::Continue(updated))
    }

    pub(super) fn initialized_metrics(&self, md: &str, node_name: &str) {
        let m = &self.shared.metrics;
        m.nodeclaims_initialized
            .get_or_create(&Metrics::pool(&self.nodepool(), md))
            .inc();
        Metrics::observe(&m.claim_initialized_seconds, md, since(self.created()));
        tracing::info!(nodeclaim = %self.name(), node = %node_name, "initialized");
    }
}
