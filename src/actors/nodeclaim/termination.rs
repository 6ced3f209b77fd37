//! Termination of a deleted claim (Karpenter core v1's termination flow):
//!
//! 1. With a `terminationGracePeriod`, stamp `karpenter.sh/nodeclaim-termination-timestamp`
//!    (deletion + grace): the moment every pod must be gone.
//! 2. Drain the Node through the Terminator (taint, evictions in Karpenter's order, PDBs and
//!    do-not-disrupt honoured until the deadline, then VolumeAttachments) while the Machine still
//!    runs, so pods leave gracefully. `Drained` and `VolumesDetached` follow on the claim.
//! 3. Release the Machine (delete-machine annotation, then the compare-and-swap decrement), with
//!    Cluster API's own drain switched off for it: ours is done. `InstanceTerminating`.
//! 4. Once the Machine is gone: delete the Node if it is still there, drop our finalizer from it
//!    and from the claim.
//!
//! A Node that is not Ready while its Machine is already gone skips step 2, as Karpenter does
//! when the cloud provider no longer knows the instance: nothing runs there to drain.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Next, Step, condition_time, has_finalizer, is_true, object_ref, since};
use crate::actors::messages::{CancelRequest, ReleaseMachine};
use crate::actors::patch::JsonPatch;
use crate::actors::terminator::{Drain, DrainState, Forget};
use crate::actors::{Error, Shared, api_err};
use crate::api::conditions::{self, ConditionStatus};
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::*;
use crate::metrics::{ClaimTerminatedLabels, NodePoolLabels, NodeTerminatedLabels};
use crate::state::claims::{provider_id, recorded_deployment, recorded_instance, recorded_machine};
use crate::state::machines::key as machine_key;
use crate::view::node::node_ready;

/// How long a terminating claim waits before it asks again on its own (progress normally arrives
/// as a kick from the Terminator, the Machine watch or the Node watch).
const RESYNC: Duration = Duration::from_secs(30);

/// The reason (condition and Event) a claim's instance is handed back rather than removed.
const INSTANCE_NOT_REMOVABLE: &str = "InstanceNotRemovable";

/// Upstream's eviction reason when the claim carries no `DisruptionReason`.
const FORCEFUL: &str = "Forceful Termination";

impl Step {
    pub(super) async fn terminate(&mut self) -> Result<Next, Error> {
        let c = self.claim.clone();
        if !has_finalizer(&c) {
            return Ok(Next::Done);
        }
        let deadline = match self.termination_deadline(&c).await? {
            Deadline::Stamped(updated) => return Ok(Next::Continue(updated)),
            Deadline::At(d) => d,
        };
        if let Some(pid) = recorded_instance(&c) {
            return self.terminate_instance(&c, pid, deadline).await;
        }
        let bound = self.bound_machine();
        let synced = self.shared.state.machines.read().synced();
        let instance_gone = synced && matches!(bound, Ok(None));
        let machine = bound.ok().flatten();
        let node = self
            .claim_node()
            .or_else(|| self.machine_node(machine.as_deref()));
        // Only a Machine still running can have pods on a Node the index does not show: once it
        // is deleting or gone, Cluster API removes its Node, and no read is needed.
        let running = machine
            .as_deref()
            .filter(|m| m.deletion_timestamp.is_none());
        if node.is_none()
            && let Some(m) = running
            && self.node_not_indexed_yet(&c, m).await?
        {
            // The Node watch lags behind the API server: draining now would see no Node and
            // let the Machine go with its pods still running. The watch's kick brings us back.
            return Ok(Next::Wait(Some(RESYNC)));
        }
        // Drain while the Machine still runs, so pods leave on their own terms. A NotReady Node
        // whose Machine is gone has no kubelet left to stop any pod: evictions there would only
        // wait on budgets for nothing, so it is let go at once.
        let dead = node
            .as_ref()
            .is_some_and(|n| instance_gone && !node_ready(n));
        if dead {
            tracing::info!(nodeclaim = %self.name(), "node NotReady and its Machine gone; not draining");
        }
        if let Some(n) = &node
            && !dead
            && let Some(next) = self.drain(&c, n, deadline).await?
        {
            return Ok(next);
        }
        if let Some(machine) = machine {
            if machine.deletion_timestamp.is_none()
                && !crate::state::machines::released_elsewhere(&machine)
                && let Some(md) = crate::state::machines::deployment_key(&machine)
            {
                self.scaler(&md).do_send(ReleaseMachine {
                    machine: machine_key(&machine.namespace, &machine.name),
                    drained: node.is_some(),
                });
            }
            if !is_true(&c, conditions::INSTANCE_TERMINATING) {
                let updated = self
                    .set_conditions(&[(
                        conditions::INSTANCE_TERMINATING,
                        ConditionStatus::True,
                        "InstanceTerminating",
                        "",
                    )])
                    .await?;
                if let Some(u) = updated {
                    self.claim = u;
                }
            }
            return Ok(Next::Wait(Some(RESYNC)));
        }
        // The Machine is gone; a Node that outlived it goes now.
        if let Some(n) = &node {
            self.delete_node(n).await?;
        }
        self.finish(&c, node.as_deref()).await
    }

    /// The instance of a pool without MachinePool Machines: drained like any other, then handed
    /// back to the pool (its replica kept: no specific instance can be removed, and lowering
    /// replicas would let the cloud choose which one goes). Its Node stays cordoned, let go by
    /// this claim, and the claim and an Event say why. An instance the pool no longer lists
    /// is gone, and its Node with it.
    async fn terminate_instance(
        &mut self,
        c: &NodeClaim,
        pid: &str,
        deadline: Option<Timestamp>,
    ) -> Result<Next, Error> {
        let node = self.claim_node();
        let md = recorded_deployment(c).unwrap_or_default().to_string();
        if super::instance_gone(&self.shared, &md, pid) {
            if let Some(n) = &node {
                self.delete_node(n).await?;
            }
            return self.finish(c, node.as_deref()).await;
        }
        if let Some(n) = &node
            && let Some(next) = self.drain(c, n, deadline).await?
        {
            return Ok(next);
        }
        let handed_back = self
            .shared
            .state
            .deployments
            .read()
            .get(&md)
            .is_some_and(|p| crate::actors::scaler::handed_back(&p).contains(pid));
        if !handed_back {
            self.scaler(&md).do_send(ReleaseMachine {
                machine: pid.to_string(),
                drained: node.is_some(),
            });
            let message = format!(
                "{} has no MachinePool Machines: no specific instance can be removed, and lowering its replicas would let the cloud choose which instance goes; instance {pid} is drained, cordoned and handed back to the pool (its replica kept) for an operator to remove",
                crate::capi::scalable::ScalableRef::parse(&md)
                    .map(|r| r.to_string())
                    .unwrap_or_else(|| md.clone())
            );
            let updated = self
                .set_conditions(&[(
                    conditions::INSTANCE_TERMINATING,
                    ConditionStatus::False,
                    INSTANCE_NOT_REMOVABLE,
                    &message,
                )])
                .await?;
            if let Some(u) = updated {
                self.shared
                    .events
                    .warning(object_ref(c), INSTANCE_NOT_REMOVABLE, message);
                self.claim = u;
            }
            return Ok(Next::Wait(Some(RESYNC)));
        }
        if let Some(n) = &node {
            self.let_node_go(n).await?;
        }
        self.finish(c, node.as_deref()).await
    }

    /// Leave the Node of a handed-back instance to the pool: cordoned (nothing new lands on an
    /// instance that should go), without our finalizer, owner reference or anything this
    /// claim put there (its labels and taints, the unregistered and disruption taints, the
    /// registered and initialized labels), so nothing of ours counts or deletes it any more and
    /// the next claim on the pool can take it as it would a new instance. The annotation says
    /// who let it go (and that registration may lift the cordon).
    async fn let_node_go(&mut self, node: &Node) -> Result<(), Error> {
        let c = self.claim.clone();
        let uid = c.metadata.uid.clone();
        let mut p = JsonPatch::guarded(node.resource_version().as_deref());
        let finalizers: Vec<&String> = node
            .finalizers()
            .iter()
            .filter(|f| *f != TERMINATION_FINALIZER)
            .collect();
        p.set("/metadata/finalizers", json!(finalizers));
        let owners: Vec<_> = node
            .owner_references()
            .iter()
            .filter(|o| Some(&o.uid) != uid.as_ref())
            .collect();
        p.set("/metadata/ownerReferences", json!(owners));
        p.set("/metadata/labels", json!(released_labels(node, &c)));
        let mut annotations = node.annotations().clone();
        annotations.insert(HANDED_BACK_NODE_ANNOTATION.to_string(), c.name_any());
        p.set("/metadata/annotations", json!(annotations));
        p.set("/spec/taints", json!(released_taints(node, &c)));
        p.set("/spec/unschedulable", json!(true));
        let name = node.name_any();
        match self.patch_node(&name, p).await {
            Err(e) if e.is_not_found() => Ok(()),
            r => r,
        }
    }

    /// Nothing of the claim's instance is left to wait for: let the claim go.
    async fn finish(&mut self, c: &NodeClaim, node: Option<&Node>) -> Result<Next, Error> {
        if let Some(md) = recorded_deployment(c) {
            // Make sure no bind for us is in flight before we let go (else it would orphan a
            // Machine): if one is, wait for it to land and release that Machine instead.
            match self
                .scaler(md)
                .send(CancelRequest { claim: self.name() })
                .await
            {
                Ok(false) => {}
                Ok(true) | Err(_) => return Ok(Next::Wait(Some(Duration::from_millis(200)))),
            }
            if matches!(self.bound_machine(), Ok(Some(_))) {
                return Ok(Next::Wait(Some(Duration::ZERO)));
            }
        }
        let mut p = JsonPatch::guarded(c.resource_version().as_deref());
        let finalizers: Vec<&String> = c
            .finalizers()
            .iter()
            .filter(|f| *f != TERMINATION_FINALIZER)
            .collect();
        p.set("/metadata/finalizers", json!(finalizers));
        self.patch_claim(p, false).await?;
        if let Some(n) = node
            && let Some(t) = self.shared.router.terminator()
        {
            t.do_send(Forget(n.name_any()));
        }
        observe_terminated(&self.shared, c);
        self.terminated = true;
        tracing::info!(nodeclaim = %self.name(), "{}", self.shared.settings.say("terminated", "would have terminated (finalizer not removed)"));
        Ok(Next::Done)
    }

    /// The claim's termination deadline: stamped once from its `terminationGracePeriod`, then
    /// read back from the annotation (so a restarted controller keeps the same deadline). An
    /// annotation is honoured without a grace period too, as upstream's: node repair stamps now.
    async fn termination_deadline(&mut self, c: &NodeClaim) -> Result<Deadline, Error> {
        if let Some(v) = c.annotations().get(TERMINATION_TIMESTAMP_ANNOTATION) {
            return match v.parse::<Timestamp>() {
                Ok(t) => Ok(Deadline::At(Some(t))),
                Err(e) => {
                    // Not ours to fix silently: say so, and fall back to no deadline (the
                    // drain then honours every budget, as without a grace period).
                    self.shared.events.warning(
                        object_ref(c),
                        "InvalidTerminationTimestamp",
                        format!(
                            "NodeClaim {}: annotation {TERMINATION_TIMESTAMP_ANNOTATION}={v:?} is not an RFC 3339 time ({e}); draining without a deadline",
                            self.name()
                        ),
                    );
                    Ok(Deadline::At(None))
                }
            };
        }
        let Some(grace) = c.spec.termination_grace_period.as_ref().map(|g| g.0) else {
            return Ok(Deadline::At(None));
        };
        let deleted = c
            .metadata
            .deletion_timestamp
            .as_ref()
            .map(|t| t.0)
            .unwrap_or_else(Timestamp::now);
        let at = jiff::SignedDuration::try_from(grace)
            .ok()
            .and_then(|g| deleted.checked_add(g).ok())
            .unwrap_or(Timestamp::MAX);
        let stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let mut p = JsonPatch::guarded(c.resource_version().as_deref());
        p.set_entry(
            !c.annotations().is_empty(),
            "/metadata/annotations",
            TERMINATION_TIMESTAMP_ANNOTATION,
            &stamp,
        );
        let updated = self.patch_claim(p, false).await?;
        self.shared.events.warning(
            object_ref(c),
            "TerminationGracePeriodExpiring",
            format!("All pods will be deleted by {stamp}"),
        );
        Ok(Deadline::Stamped(updated))
    }

    /// Ask the Terminator where the Node's drain stands and mirror it in the claim's
    /// conditions. `Some(next)` while the Machine must wait.
    async fn drain(
        &mut self,
        c: &NodeClaim,
        node: &Node,
        deadline: Option<Timestamp>,
    ) -> Result<Option<Next>, Error> {
        let Some(terminator) = self.shared.router.terminator() else {
            // Not leading (the writers are stopping): another replica finishes this.
            return Ok(Some(Next::Wait(Some(RESYNC))));
        };
        let reason = conditions::get(c.conditions(), conditions::DISRUPTION_REASON)
            .filter(|d| d.is_true())
            .map(|d| d.reason.clone())
            .unwrap_or_else(|| FORCEFUL.to_string());
        let state = match terminator
            .send(Drain {
                claim: self.name(),
                node: node.name_any(),
                nodepool: self.nodepool(),
                deadline,
                reason,
            })
            .await
        {
            Ok(s) => s,
            Err(_) => return Ok(Some(Next::Wait(Some(RESYNC)))),
        };
        let wanted = drain_conditions(&state);
        if let Some(updated) = self.set_conditions(&wanted).await? {
            self.claim = updated;
        }
        Ok(match state {
            DrainState::Done { .. } => None,
            _ => Some(Next::Wait(Some(RESYNC))),
        })
    }

    /// Whether the claim's Node exists on the API server though the Node index does not show
    /// it yet. Its name comes from the claim (registered) or its running Machine's `nodeRef`;
    /// without either, no Node of it ever registered. One read, on the rare path where the
    /// index has no Node for a claim whose Machine still runs.
    async fn node_not_indexed_yet(
        &self,
        c: &NodeClaim,
        machine: &crate::capi::model::Machine,
    ) -> Result<bool, Error> {
        // Usually one name twice (the claim's and the Machine's): read it once.
        let names: std::collections::BTreeSet<String> = c
            .status
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .into_iter()
            .chain(machine.node_ref.clone())
            .collect();
        let api: Api<Node> = Api::all(self.shared.workload.clone());
        for name in names {
            let found = api.get_opt(&name).await.map_err(api_err(
                &self.shared.metrics,
                "get",
                "nodes",
                &name,
            ))?;
            // The claim's instance, or (when the claim never learned it) its Machine's.
            let expected = provider_id(c).or(machine.provider_id.as_deref());
            let same_instance = |n: &Node| {
                let id = n.spec.as_ref().and_then(|s| s.provider_id.as_deref());
                expected.is_none() || id == expected
            };
            if found.as_ref().is_some_and(same_instance) {
                tracing::debug!(nodeclaim = %self.name(), node = %name, "node not in the index yet; waiting for the watch");
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The Node of a claim that never learned it (a create timeout while its Machine was
    /// being provisioned): the one its Machine names. Without it, a Node that registered after
    /// the claim gave up would never be drained, and its Machine never released.
    fn machine_node(&self, machine: Option<&crate::capi::model::Machine>) -> Option<Arc<Node>> {
        let m = machine?;
        let nodes = self.shared.state.nodes.read();
        m.provider_id
            .as_deref()
            .and_then(|pid| nodes.by_provider_id(pid))
            .or_else(|| m.node_ref.as_deref().and_then(|n| nodes.get(n)))
    }

    pub(super) fn claim_node(&self) -> Option<Arc<Node>> {
        let nodes = self.shared.state.nodes.read();
        provider_id(&self.claim)
            .and_then(|pid| nodes.by_provider_id(pid))
            .or_else(|| {
                self.claim
                    .status
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .and_then(|n| nodes.get(n))
            })
    }

    /// Delete the Node (if nothing else is) and release our finalizer on it: its Machine is
    /// gone, so nothing runs there any more.
    async fn delete_node(&mut self, node: &Node) -> Result<(), Error> {
        let api: Api<Node> = Api::all(self.shared.workload.clone());
        let name = node.name_any();
        if node.metadata.deletion_timestamp.is_none() {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
                Err(e) => return Err(api_err(&self.shared.metrics, "delete", "nodes", &name)(e)),
            }
        }
        self.release_node_finalizer(node).await
    }

    /// Drop `karpenter.sh/termination` from the Node: the Node is gone for good (counted here,
    /// where it really goes, whoever deleted it).
    async fn release_node_finalizer(&mut self, node: &Node) -> Result<(), Error> {
        let api: Api<Node> = Api::all(self.shared.workload.clone());
        let name = node.name_any();
        if !node.finalizers().iter().any(|f| f == TERMINATION_FINALIZER) {
            return Ok(());
        }
        let mut p = JsonPatch::guarded(node.resource_version().as_deref());
        let rest: Vec<&String> = node
            .finalizers()
            .iter()
            .filter(|f| *f != TERMINATION_FINALIZER)
            .collect();
        p.set("/metadata/finalizers", json!(rest));
        let patch = p.into_patch().map_err(|source| Error::Patch {
            kind: "Node",
            name: name.clone(),
            source,
        })?;
        match api.patch(&name, &PatchParams::default(), &patch).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(api_err(&self.shared.metrics, "patch", "nodes", &name)(e)),
        }
        let pool = NodePoolLabels {
            nodepool: self.nodepool(),
        };
        self.shared
            .metrics
            .nodes_terminated
            .get_or_create(&NodeTerminatedLabels {
                nodepool: pool.nodepool.clone(),
                zone: node.labels().get(ZONE_LABEL).cloned().unwrap_or_default(),
            })
            .inc();
        if let Some(deleted) = node.metadata.deletion_timestamp.as_ref() {
            self.shared
                .metrics
                .nodes_termination_duration
                .get_or_create(&pool)
                .observe(since(deleted.0).as_secs_f64());
        }
        if let Some(created) = node.meta().creation_timestamp.as_ref() {
            self.shared
                .metrics
                .nodes_lifetime_duration
                .get_or_create(&pool)
                .observe(since(created.0).as_secs_f64());
        }
        Ok(())
    }
}

/// Count a finished termination: claims terminated, termination and instance-termination
/// durations, and Karpenter's cloud-provider Delete (release requested, i.e. the claim's
/// deletion, until its Machine is gone, for claims that had one).
pub(super) fn observe_terminated(shared: &Shared, c: &NodeClaim) {
    let nodepool = c.labels().get(NODEPOOL_LABEL).cloned().unwrap_or_default();
    let pool = NodePoolLabels {
        nodepool: nodepool.clone(),
    };
    if let Some(deleted) = c.metadata.deletion_timestamp.as_ref() {
        if recorded_machine(c).is_some() {
            shared.metrics.cloudprovider("Delete", since(deleted.0));
        }
        shared
            .metrics
            .nodeclaims_termination_duration
            .get_or_create(&pool)
            .observe(since(deleted.0).as_secs_f64());
    }
    if let Some(t) = condition_time(c, conditions::INSTANCE_TERMINATING) {
        shared
            .metrics
            .nodeclaims_instance_termination_duration
            .get_or_create(&pool)
            .observe(since(t).as_secs_f64());
    }
    let label = |k: &str| c.labels().get(k).cloned().unwrap_or_default();
    shared
        .metrics
        .nodeclaims_terminated
        .get_or_create(&ClaimTerminatedLabels {
            nodepool,
            capacity_type: label(CAPACITY_TYPE_LABEL),
            zone: label(ZONE_LABEL),
        })
        .inc();
}

enum Deadline {
    /// The annotation was just written: continue with the updated claim.
    Stamped(Arc<NodeClaim>),
    At(Option<Timestamp>),
}

/// The claim's Drained / VolumesDetached conditions for a drain state (upstream's reasons).
fn drain_conditions(
    state: &DrainState,
) -> Vec<(&'static str, ConditionStatus, &'static str, &'static str)> {
    use ConditionStatus::{False, True, Unknown};
    match state {
        DrainState::Draining { .. } => vec![(conditions::DRAINED, Unknown, "Draining", "Draining")],
        DrainState::AwaitingVolumes { .. } => vec![
            (conditions::DRAINED, True, "Drained", ""),
            (
                conditions::VOLUMES_DETACHED,
                Unknown,
                "AwaitingVolumeDetachment",
                "AwaitingVolumeDetachment",
            ),
        ],
        DrainState::Done {
            volumes_detached: true,
        } => vec![
            (conditions::DRAINED, True, "Drained", ""),
            (conditions::VOLUMES_DETACHED, True, "VolumesDetached", ""),
        ],
        DrainState::Done {
            volumes_detached: false,
        } => vec![
            (conditions::DRAINED, True, "Drained", ""),
            (
                conditions::VOLUMES_DETACHED,
                False,
                "TerminationGracePeriodElapsed",
                "TerminationGracePeriodElapsed",
            ),
        ],
    }
}

/// A handed-back instance's Node labels once its claim lets it go: the claim's own labels and
/// Karpenter's lifecycle labels go; those that describe the instance itself (the Kubernetes
/// well-known labels under `kubernetes.io`, and the capacity type) stay true of it and stay.
fn released_labels(node: &Node, c: &NodeClaim) -> std::collections::BTreeMap<String, String> {
    let describes_instance = |k: &str| {
        k == CAPACITY_TYPE_LABEL
            || k.split_once('/').is_some_and(|(domain, _)| {
                domain == "kubernetes.io" || domain.ends_with(".kubernetes.io")
            })
    };
    let mut labels = node.labels().clone();
    labels.retain(|k, _| {
        let ours = k == NODEPOOL_LABEL || k == REGISTERED_LABEL || k == INITIALIZED_LABEL;
        !ours && (describes_instance(k) || !c.labels().contains_key(k))
    });
    labels
}

/// A handed-back instance's Node taints once its claim lets it go: without the claim's taints
/// and startup taints, and without the unregistered and disruption taints (an instance left
/// with `karpenter.sh/unregistered:NoExecute` could never run a pod again).
fn released_taints(node: &Node, c: &NodeClaim) -> Vec<k8s_openapi::api::core::v1::Taint> {
    let claims = c
        .spec
        .taints
        .iter()
        .flatten()
        .chain(c.spec.startup_taints.iter().flatten())
        .collect::<Vec<_>>();
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| {
            ts.iter()
                .filter(|t| t.key != DISRUPTED_TAINT_KEY && t.key != UNREGISTERED_TAINT_KEY)
                .filter(|t| !claims.iter().any(|ct| crate::view::node::same_taint(t, ct)))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}
