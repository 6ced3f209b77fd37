//! Registration (Karpenter core's lifecycle/registration): the Node with the claim's provider ID
//! gets the claim's labels, annotations, taints and startup taints, loses the unregistered
//! taint, and is owned and guarded by the claim; then `Registered=True` and `nodeName`.
//!
//! A Node that registration leaves already initialized (Ready, no startup or ephemeral taints,
//! extended resources present) is initialized in the same requests: the Node patch also carries `karpenter.sh/initialized`, and
//! one status write sets `Registered` and `Initialized` (in that order, with one transition
//! time), so the claim costs two writes here instead of four. A kubelet usually creates its
//! Node a moment before it reports Ready, so registration waits for Ready up to `READY_WAIT`
//! after the Node appeared (the Node takes no pods before Ready anyway); past that it registers
//! without initializing, as before, so a Node that needs its DaemonSets (a CNI) to turn Ready
//! is delayed by at most that much.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Next, Step, is_true, left_until};
use crate::actors::Error;
use crate::actors::patch::JsonPatch;
use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::*;
use crate::metrics::{Metrics, NodeTerminatedLabels};
use crate::state::claims::recorded_deployment;
use crate::state::compact::CompactNode;
use crate::view::binding::Binding;
use crate::view::node::{node_initialized, same_taint};

/// How long registration waits for a new Node to turn Ready so that it can initialize it in the
/// same writes (measured from the Node's creationTimestamp, whole seconds: 1-2 s in effect).
pub(crate) const READY_WAIT: Duration = Duration::from_secs(2);

impl Step {
    /// Registration (Karpenter core v1's NodeClaim lifecycle): sync the claim onto the Node, take the
    /// unregistered taint off, own the Node; then `Registered=True`.
    pub(super) async fn register(&mut self, compact: &CompactNode) -> Result<Next, Error> {
        let c = self.claim.clone();
        let node = &compact.node();
        let node_name = node.name_any();
        let initialize = !is_true(&c, conditions::INITIALIZED)
            && node_initialized(&registered_node(node, &c), &c).is_ok();
        if !initialize
            && !node_registered(compact, &c, self.binding())
            && !compact.ready()
            && let Some(created) = node.metadata.creation_timestamp.as_ref()
            && let Some(left) = left_until(created.0, READY_WAIT)
        {
            tracing::debug!(nodeclaim = %self.name(), node = %node_name, ?left, "waiting briefly for the Node to turn Ready");
            return Ok(Next::Wait(Some(left)));
        }
        let label_missing =
            node.labels().get(INITIALIZED_LABEL).map(String::as_str) != Some("true");
        if !node_registered(compact, &c, self.binding()) {
            let patch = registration_patch(node, &c, initialize, self.binding());
            self.patch_node(&node_name, patch).await?;
        } else if initialize && label_missing {
            self.patch_node(&node_name, initialized_label_patch(node))
                .await?;
        }
        let types: &[&str] = if initialize {
            &[conditions::REGISTERED, conditions::INITIALIZED]
        } else {
            &[conditions::REGISTERED]
        };
        // Why it is not initialized yet rides on the same write (upstream shows the reason on
        // `Initialized=Unknown`), rather than a second status write right after this one.
        let not_initialized = (!initialize)
            .then(|| node_initialized(&registered_node(node, &c), &c).err())
            .flatten();
        let generation = c.metadata.generation;
        let updated = self
            .conditions_true(types, |status| {
                status.node_name = Some(node_name.clone());
                if let Some(why) = &not_initialized {
                    conditions::set(
                        status.conditions.get_or_insert_with(Vec::new),
                        conditions::INITIALIZED,
                        conditions::ConditionStatus::Unknown,
                        why.reason,
                        &why.message,
                        generation,
                        jiff::Timestamp::now(),
                    );
                }
            })
            .await?;
        let md = recorded_deployment(&c).unwrap_or_default().to_string();
        let m = &self.shared.metrics;
        m.nodeclaims_registered
            .get_or_create(&Metrics::pool(&self.nodepool(), &md))
            .inc();
        // Upstream's zone: the claim's, as launch labelled it (the Node's may come later).
        m.nodes_created
            .get_or_create(&NodeTerminatedLabels {
                nodepool: self.nodepool(),
                zone: c.labels().get(ZONE_LABEL).cloned().unwrap_or_default(),
            })
            .inc();
        tracing::info!(nodeclaim = %self.name(), node = %node_name, "registered");
        self.record_registration(Ok(()));
        if initialize {
            self.initialized_metrics(&md, &node_name);
        }
        Ok(Next::Continue(updated))
    }
}

/// Labels Karpenter puts on the Node at registration: the claim's labels (but its binding to a
/// Cluster in the management cluster) plus `registered` (and `initialized` when registration
/// initializes it too).
fn registration_labels(
    c: &NodeClaim,
    initialized: bool,
    binding: Option<&Binding>,
) -> BTreeMap<String, String> {
    let mut labels = c.labels().clone();
    if let Some(b) = binding {
        b.unlabel(&mut labels);
    }
    labels.insert(REGISTERED_LABEL.to_string(), "true".to_string());
    if initialized {
        labels.insert(INITIALIZED_LABEL.to_string(), "true".to_string());
    }
    labels
}

/// The Node as the registration patch leaves it, as far as initialization reads it (taints).
fn registered_node(node: &Node, c: &NodeClaim) -> Node {
    let mut after = node.clone();
    after.spec.get_or_insert_with(Default::default).taints = Some(registration_taints(node, c));
    after
}

/// Only the `initialized` label (a Node registered earlier, its claim not yet marked).
pub(super) fn initialized_label_patch(node: &Node) -> JsonPatch {
    let mut p = JsonPatch::new();
    p.set_entry(
        !node.labels().is_empty(),
        "/metadata/labels",
        INITIALIZED_LABEL,
        "true",
    );
    p
}

/// The Node's taints after registration: without the unregistered taint, with the claim's
/// taints and startup taints (each once). A handed-back instance taken again gets no startup
/// taints: whatever lifts them (a CNI agent, a device plugin) ran on it once and will not again.
fn registration_taints(node: &Node, c: &NodeClaim) -> Vec<Taint> {
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != UNREGISTERED_TAINT_KEY)
        .collect();
    let startup = c
        .spec
        .startup_taints
        .iter()
        .flatten()
        .filter(|_| !taken_back(node));
    let wanted = c.spec.taints.iter().flatten().chain(startup);
    for t in wanted {
        if !taints.iter().any(|have| same_taint(have, t)) {
            taints.push(t.clone());
        }
    }
    taints
}

/// True when the Node already carries everything registration writes (read in place: every
/// reconcile of a settled claim asks). `binding`: the claim is in the management cluster, so
/// the Node has no owner reference to it.
pub(super) fn node_registered(
    node: &CompactNode,
    c: &NodeClaim,
    binding: Option<&Binding>,
) -> bool {
    node.labels().get(REGISTERED_LABEL) == Some("true")
        && !node
            .taints()
            .iter()
            .any(|t| t.key == UNREGISTERED_TAINT_KEY)
        && node.has_finalizer(TERMINATION_FINALIZER)
        && (binding.is_some() || (c.metadata.uid.as_deref()).is_some_and(|uid| node.owned_by(uid)))
}

/// The registration patch of `node`. Its owner reference to the claim only when both live in
/// the workload cluster: with the claim in the management cluster (`binding`), the workload
/// cluster's garbage collector would find no owner and delete the Node; there the claim's
/// termination finalizer on the Node and the claim actor's own Node deletion stand in for it.
pub(super) fn registration_patch(
    node: &Node,
    c: &NodeClaim,
    initialized: bool,
    binding: Option<&Binding>,
) -> JsonPatch {
    let mut p = JsonPatch::guarded(node.resource_version().as_deref());
    let has_labels = !node.labels().is_empty();
    for (k, v) in registration_labels(c, initialized, binding) {
        if node.labels().get(&k) != Some(&v) {
            p.set_entry(has_labels, "/metadata/labels", &k, &v);
        }
    }
    if taken_back(node) {
        // A handed-back instance's Node, cordoned when its last claim let it go: this claim
        // takes it as its own, so the cordon and the mark go.
        p.set("/spec/unschedulable", json!(false));
        p.remove(&format!(
            "/metadata/annotations/{}",
            crate::actors::patch::escape(HANDED_BACK_NODE_ANNOTATION)
        ));
    }
    let has_annotations = !node.annotations().is_empty();
    for (k, v) in c.annotations() {
        if k == "kubectl.kubernetes.io/last-applied-configuration"
            || node.annotations().get(k) == Some(v)
        {
            continue;
        }
        p.set_entry(has_annotations, "/metadata/annotations", k, v);
    }
    p.set("/spec/taints", json!(registration_taints(node, c)));
    let mut finalizers = node.finalizers().to_vec();
    if !finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
        finalizers.push(TERMINATION_FINALIZER.to_string());
    }
    p.set("/metadata/finalizers", json!(finalizers));
    if binding.is_none() {
        p.set("/metadata/ownerReferences", json!(owners_with(node, c)));
    }
    p
}

/// The Node's owner references with one to its claim.
fn owners_with(
    node: &Node,
    c: &NodeClaim,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    let mut owners = node.owner_references().to_vec();
    if let Some(uid) = &c.metadata.uid
        && !owners.iter().any(|o| &o.uid == uid)
    {
        owners.push(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: NodeClaim::api_version(&()).to_string(),
                kind: NodeClaim::kind(&()).to_string(),
                name: c.name_any(),
                uid: uid.clone(),
                block_owner_deletion: Some(true),
                controller: None,
            },
        );
    }
    owners
}

/// The Node of a handed-back instance a claim took again (see the Scaler's `instances`).
fn taken_back(node: &Node) -> bool {
    node.annotations().contains_key(HANDED_BACK_NODE_ANNOTATION)
}
