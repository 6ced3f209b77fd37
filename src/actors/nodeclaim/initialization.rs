//! Initialization (Karpenter core's lifecycle/initialization): the registered Node is Ready, has
//! no startup or ephemeral taints and offers every requested extended resource; then it is
//! labelled `karpenter.sh/initialized=true` and the claim gets `Initialized=True`.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::registration::{initialized_label_patch, same_taint};
use super::{Next, Step, since};
use crate::actors::Error;
use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::*;
use crate::metrics::Metrics;

impl Step {
    /// Initialization: Ready, no startup or ephemeral taints, requested extended resources
    /// present; then label the Node and set `Initialized=True`.
    pub(super) async fn initialize(&mut self, md: &str, node: &Node) -> Result<Next, Error> {
        let c = self.claim.clone();
        if let Err(why) = node_initialized(node, &c) {
            tracing::debug!(nodeclaim = %self.name(), node = %node.name_any(), why, "not initialized yet");
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

/// The Node's `Ready` condition is True.
pub(crate) fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// Why a registered Node is not initialized yet, or Ok.
pub(super) fn node_initialized(node: &Node, c: &NodeClaim) -> Result<(), &'static str> {
    if !node_ready(node) {
        return Err("node not Ready");
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    if taints
        .iter()
        .any(|t| EPHEMERAL_TAINT_KEYS.contains(&t.key.as_str()))
    {
        return Err("ephemeral taint present");
    }
    if c.spec
        .startup_taints
        .iter()
        .flatten()
        .any(|st| taints.iter().any(|t| same_taint(t, st)))
    {
        return Err("startup taint present");
    }
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let requests = c.spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    for name in requests.into_iter().flat_map(|r| r.keys()) {
        if matches!(
            name.as_str(),
            "cpu" | "memory" | "pods" | "ephemeral-storage"
        ) {
            continue;
        }
        let have = allocatable
            .and_then(|a| a.get(name))
            .and_then(|q| crate::api::resources::Quantity::from_k8s(q).ok())
            .map(|q| !q.is_zero())
            .unwrap_or(false);
        if !have {
            return Err("requested extended resource not yet allocatable");
        }
    }
    Ok(())
}
