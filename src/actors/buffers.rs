//! The CapacityBuffer actor (leader only, with `--feature-gates CapacityBuffer=true`): resolves
//! each buffer's chunk (its PodTemplate, or the pod template of the Deployment, StatefulSet or
//! ReplicaSet its `scalableRef` names) and size into placeholder pods the provisioner packs
//! with the pending pods, and writes the buffer's status: `replicas`, `podTemplateRef`,
//! `ReadyForProvisioning`, and `Provisioning` from where the last solve put the placeholders.
//!
//! Event-driven: a buffer is resolved again when it changes and when an object it references
//! changes. The buffers come from `state.capacity_buffers` and the referenced kinds' changes
//! from `state::referents`, both fed in `watches::start`, whose callbacks send
//! [`BuffersChanged`] and [`ReferentChanged`] (only changes to referenced objects cost a read).

pub mod resolve;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use actix::prelude::*;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{PodTemplate, PodTemplateSpec};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Shared;
use crate::api::capacity_buffer::{
    ACTIVE_CAPACITY, CapacityBuffer, CapacityBufferStatus, PROVISIONING, READY_FOR_PROVISIONING,
};
use crate::api::conditions::{self, ConditionStatus};
use crate::state::buffers::Placed;
use crate::state::referents::Referent;
use resolve::{NotReady, Source};

/// `Provisioning` reasons (upstream Karpenter's).
pub(crate) const FITS_EXISTING_CAPACITY: &str = "FitsExistingCapacity";
pub(crate) const REQUIRES_NEW_CAPACITY: &str = "RequiresNewCapacity";
pub(crate) const NOT_READY_FOR_PROVISIONING: &str = "NotReadyForProvisioning";
pub(crate) const BUFFER_EMPTY: &str = "BufferEmpty";

/// Where the last solve put each buffer's placeholder pods (buffer key -> placements).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Provisioned(pub HashMap<String, Placed>);

/// The CapacityBuffer feed took a change (`Router::buffers_changed`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct BuffersChanged;

/// An object a buffer may reference changed (`Router::buffer_referent_changed`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReferentChanged(pub Referent);

/// A buffer's resolution, with the status it leads to.
struct Resolution {
    key: String,
    generation: Option<i64>,
    outcome: Result<resolve::Resolved, NotReady>,
}

impl Message for Resolution {
    type Result = ();
}

pub(crate) struct Buffers {
    shared: Arc<Shared>,
    /// The buffers as this actor last took them from the index, by `namespace/name`.
    buffers: HashMap<String, Arc<CapacityBuffer>>,
    /// Status as this actor last wrote or read it, per buffer.
    statuses: HashMap<String, CapacityBufferStatus>,
    /// The last problem reported in an Event, per buffer (one Event per new problem).
    reported: HashMap<String, String>,
}

impl Buffers {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            buffers: HashMap::new(),
            statuses: HashMap::new(),
            reported: HashMap::new(),
        }
    }

    /// Read what the buffer references and resolve it (off the actor).
    fn reconcile(&mut self, key: &str, ctx: &mut Context<Self>) {
        let Some(cb) = self.buffers.get(key).cloned() else {
            return;
        };
        if cb.strategy() != ACTIVE_CAPACITY {
            // Another strategy is another autoscaler's: neither packed nor written.
            self.publish_pods(key, Vec::new());
            return;
        }
        let client = self.shared.workload.clone();
        let key = key.to_string();
        let generation = cb.metadata.generation;
        ctx.spawn(
            async move {
                let outcome = match read_source(client, &cb).await {
                    Ok(source) => resolve::resolve(&cb, source),
                    Err(e) => Err(e),
                };
                Resolution {
                    key,
                    generation,
                    outcome,
                }
            }
            .into_actor(self)
            .map(|r, act, ctx| act.resolved(r, ctx)),
        );
    }

    fn resolved(&mut self, r: Resolution, ctx: &mut Context<Self>) {
        let Some(cb) = self.buffers.get(&r.key).cloned() else {
            return;
        };
        if cb.metadata.generation != r.generation {
            // Overtaken by a newer spec, whose own resolution is on its way.
            return;
        }
        let mut status = self.statuses.get(&r.key).cloned().unwrap_or_default();
        let mut conds = status.conditions.take().unwrap_or_default();
        let now = Timestamp::now();
        let generation = cb.metadata.generation;
        status.provisioning_strategy = Some(cb.strategy().to_string());
        match r.outcome {
            Ok(resolved) => {
                self.reported.remove(&r.key);
                status.replicas = Some(resolved.replicas);
                status.pod_template_ref = resolved.pod_template.clone();
                status.pod_template_generation = resolved.pod_template_generation;
                conditions::set(
                    &mut conds,
                    READY_FOR_PROVISIONING,
                    ConditionStatus::True,
                    resolve::RESOLVED,
                    "Pod template resolved successfully",
                    generation,
                    now,
                );
                if resolved.replicas == 0 {
                    conditions::set(
                        &mut conds,
                        PROVISIONING,
                        ConditionStatus::False,
                        BUFFER_EMPTY,
                        "Buffer has zero desired replicas",
                        generation,
                        now,
                    );
                }
                let pods = resolve::placeholder_pods(&cb, &resolved);
                self.publish_pods(&r.key, pods);
            }
            Err(problem) => {
                status.replicas = None;
                status.pod_template_ref = None;
                status.pod_template_generation = None;
                conditions::set(
                    &mut conds,
                    READY_FOR_PROVISIONING,
                    ConditionStatus::False,
                    problem.reason,
                    &problem.message,
                    generation,
                    now,
                );
                conditions::set(
                    &mut conds,
                    PROVISIONING,
                    ConditionStatus::False,
                    NOT_READY_FOR_PROVISIONING,
                    "Buffer is not ReadyForProvisioning",
                    generation,
                    now,
                );
                if self.reported.get(&r.key) != Some(&problem.message) {
                    tracing::warn!(capacitybuffer = %r.key, reason = problem.reason, problem = %problem.message, "capacity buffer not ready for provisioning");
                    self.shared.events.warning(
                        cb.object_ref(&()),
                        problem.reason,
                        format!("CapacityBuffer {}: {}", r.key, problem.message),
                    );
                    self.reported.insert(r.key.clone(), problem.message);
                }
                self.publish_pods(&r.key, Vec::new());
            }
        }
        status.conditions = Some(conds);
        self.write_status(&r.key, &cb, status, ctx);
    }

    /// Hand the placeholder pods to the provisioner; a change makes it solve, and disruption
    /// look again (the nodes that held the old ones may be empty now).
    fn publish_pods(&self, key: &str, pods: Vec<k8s_openapi::api::core::v1::Pod>) {
        if self.shared.state.buffers.write().set(key, pods) {
            self.shared.router.provisioner_poke();
            self.shared.router.disruption_changed();
        }
    }

    /// The solve's placements become each ready buffer's `Provisioning` condition: True when
    /// every placeholder fits capacity that exists (Nodes and claims already made), False when
    /// some need new claims or fit nowhere.
    fn provisioned(&mut self, placed: HashMap<String, Placed>, ctx: &mut Context<Self>) {
        let now = Timestamp::now();
        for (key, p) in placed {
            let Some(cb) = self.buffers.get(&key).cloned() else {
                continue;
            };
            let mut status = self.statuses.get(&key).cloned().unwrap_or_default();
            if !conditions::is_true(
                status.conditions.as_deref().unwrap_or_default(),
                READY_FOR_PROVISIONING,
            ) {
                continue;
            }
            let desired = status.replicas.unwrap_or_default();
            let (state, reason, message) = if p.new_claims > 0 || p.failed > 0 {
                (
                    ConditionStatus::False,
                    REQUIRES_NEW_CAPACITY,
                    format!(
                        "{}/{desired} virtual pods required new capacity, {} failed",
                        p.new_claims, p.failed
                    ),
                )
            } else {
                (
                    ConditionStatus::True,
                    FITS_EXISTING_CAPACITY,
                    format!("All {desired} virtual pods fit on existing capacity"),
                )
            };
            let mut conds = status.conditions.take().unwrap_or_default();
            let changed = conditions::set(
                &mut conds,
                PROVISIONING,
                state,
                reason,
                &message,
                cb.metadata.generation,
                now,
            );
            status.conditions = Some(conds);
            if changed {
                self.write_status(&key, &cb, status, ctx);
            }
        }
    }

    /// Write the whole status when it differs from what the buffer carries.
    fn write_status(
        &mut self,
        key: &str,
        cb: &CapacityBuffer,
        status: CapacityBufferStatus,
        ctx: &mut Context<Self>,
    ) {
        if self.statuses.get(key) == Some(&status) {
            return;
        }
        self.statuses.insert(key.to_string(), status.clone());
        if !self.shared.router.is_active() {
            return;
        }
        let api: Api<CapacityBuffer> = Api::namespaced(
            self.shared.workload.clone(),
            &cb.namespace().unwrap_or_default(),
        );
        let name = cb.name_any();
        // Every field named, unset ones as null: a merge patch leaves out what it does not
        // name, and a buffer that stops resolving must lose its old replicas and template.
        let body = json!({ "status": {
            "podTemplateRef": status.pod_template_ref,
            "replicas": status.replicas,
            "podTemplateGeneration": status.pod_template_generation,
            "conditions": status.conditions,
            "provisioningStrategy": status.provisioning_strategy,
        }});
        let key = key.to_string();
        ctx.spawn(
            async move {
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
                    .await
                    .map_err(|e| {
                        tracing::warn!(capacitybuffer = %name, error = %e, "writing capacity buffer status failed; written again at the buffer's next resolution");
                    })
            }
            .into_actor(self)
            .map(move |written, act, _| {
                // Not what the buffer carries: the next resolution must write it again.
                if written.is_err() {
                    act.statuses.remove(&key);
                }
            }),
        );
    }

    /// The buffers that reference `referent`.
    fn referencing(&self, (kind, namespace, name): &Referent) -> Vec<String> {
        self.buffers
            .iter()
            .filter(|(_, cb)| cb.namespace().as_deref() == Some(namespace.as_str()))
            .filter(
                |(_, cb)| match (&cb.spec.pod_template_ref, &cb.spec.scalable_ref) {
                    (Some(t), _) => *kind == "PodTemplate" && t.name == *name,
                    (None, Some(s)) => s.kind == *kind && s.name == *name,
                    (None, None) => false,
                },
            )
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn forget(&mut self, key: &str) {
        self.buffers.remove(key);
        self.statuses.remove(key);
        self.reported.remove(key);
        self.publish_pods(key, Vec::new());
    }
}

/// The chunk's pod template and the workload's replicas, read from the API.
async fn read_source(client: kube::Client, cb: &CapacityBuffer) -> Result<Source, NotReady> {
    let namespace = cb.namespace().unwrap_or_default();
    if let Some(r) = &cb.spec.pod_template_ref {
        let api: Api<PodTemplate> = Api::namespaced(client, &namespace);
        return match api.get_opt(&r.name).await {
            Ok(Some(t)) => Ok(Source {
                template: t.template.unwrap_or_default(),
                scalable_replicas: None,
                pod_template: Some((r.name.clone(), t.metadata.generation.unwrap_or_default())),
            }),
            Ok(None) => Err(NotReady::new(
                resolve::POD_TEMPLATE_NOT_FOUND,
                format!(
                    "spec.podTemplateRef: PodTemplate {namespace}/{} not found",
                    r.name
                ),
            )),
            Err(e) => Err(NotReady::new(
                resolve::RESOLUTION_FAILED,
                format!("spec.podTemplateRef: reading PodTemplate {}: {e}", r.name),
            )),
        };
    }
    let Some(r) = &cb.spec.scalable_ref else {
        return Err(NotReady::new(
            resolve::RESOLUTION_FAILED,
            "spec: neither podTemplateRef nor scalableRef is set",
        ));
    };
    let group = if r.api_group.is_empty() {
        "apps"
    } else {
        r.api_group.as_str()
    };
    let read = match (group, r.kind.as_str()) {
        ("apps", "Deployment") => {
            read_workload::<Deployment>(client, &namespace, &r.name, |d| {
                d.spec.map(|s| (s.template, s.replicas))
            })
            .await
        }
        ("apps", "StatefulSet") => {
            read_workload::<StatefulSet>(client, &namespace, &r.name, |d| {
                d.spec.map(|s| (s.template, s.replicas))
            })
            .await
        }
        ("apps", "ReplicaSet") => {
            read_workload::<ReplicaSet>(client, &namespace, &r.name, |d| {
                d.spec.and_then(|s| Some((s.template?, s.replicas)))
            })
            .await
        }
        _ => {
            return Err(NotReady::new(
                resolve::RESOLUTION_FAILED,
                format!(
                    "spec.scalableRef: {}/{} is not supported (apps Deployment, StatefulSet or \
                     ReplicaSet)",
                    r.api_group, r.kind
                ),
            ));
        }
    };
    match read {
        Ok(Some((template, replicas))) => Ok(Source {
            template,
            scalable_replicas: Some(replicas.unwrap_or(1)),
            pod_template: None,
        }),
        Ok(None) => Err(NotReady::new(
            resolve::SCALABLE_REF_NOT_FOUND,
            format!(
                "spec.scalableRef: {} {namespace}/{} not found",
                r.kind, r.name
            ),
        )),
        Err(e) => Err(NotReady::new(
            resolve::RESOLUTION_FAILED,
            format!("spec.scalableRef: reading {} {}: {e}", r.kind, r.name),
        )),
    }
}

type Template = (PodTemplateSpec, Option<i32>);

async fn read_workload<K>(
    client: kube::Client,
    namespace: &str,
    name: &str,
    template: fn(K) -> Option<Template>,
) -> Result<Option<Template>, kube::Error>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client, namespace);
    Ok(api.get_opt(name).await?.and_then(template))
}

/// The index is fed on every replica from the start-up (`watches::start`), so it may
/// be full already when this replica comes to lead: catch up at once.
/// Start the CapacityBuffer actor (on the leader, behind its feature gate) and register it.
pub(crate) fn start(shared: &Arc<Shared>) {
    if shared.settings.capacity_buffers {
        shared.router.actors().start(Buffers::new(shared.clone()));
    }
}

super::registry::stoppable!(Buffers);

impl Actor for Buffers {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.catch_up(ctx);
    }
}

impl Buffers {
    /// Catch up with the index after a change: a buffer gone or that no longer decodes is
    /// forgotten (its placeholder pods go); one that does not decode provisions nothing and is
    /// named once per problem (the API server's schema keeps most of these out); a new version
    /// of a buffer brings its status, and a new spec resolves it again.
    fn catch_up(&mut self, ctx: &mut Context<Self>) {
        let (now, bad) = {
            let index = self.shared.state.capacity_buffers.read();
            let bad: Vec<_> = (index.malformed().iter())
                .map(|(key, m)| (key.clone(), m.message(), m.object_ref::<CapacityBuffer>()))
                .collect();
            (index.all().clone(), bad)
        };
        let gone: Vec<String> = (self.buffers.keys())
            .filter(|key| !now.contains_key(*key))
            .cloned()
            .collect();
        for key in gone {
            self.forget(&key);
        }
        let malformed: HashSet<&String> = bad.iter().map(|(key, _, _)| key).collect();
        (self.reported).retain(|key, _| now.contains_key(key) || malformed.contains(key));
        for (key, message, object) in bad {
            if self.reported.get(&key) != Some(&message) {
                self.shared.events.warning(
                    object,
                    resolve::RESOLUTION_FAILED,
                    format!("CapacityBuffer {key}: {message}"),
                );
            }
            self.reported.insert(key, message);
        }
        for (key, cb) in now {
            let old = self.buffers.get(&key);
            if old.is_some_and(|old| old.metadata.resource_version == cb.metadata.resource_version)
            {
                continue;
            }
            let spec_changed = old.is_none_or(|old| {
                old.spec != cb.spec || old.metadata.generation != cb.metadata.generation
            });
            self.statuses
                .insert(key.clone(), cb.status.clone().unwrap_or_default());
            self.buffers.insert(key.clone(), cb);
            if spec_changed {
                self.reconcile(&key, ctx);
            }
        }
    }
}

impl Handler<BuffersChanged> for Buffers {
    type Result = ();
    fn handle(&mut self, _: BuffersChanged, ctx: &mut Self::Context) {
        self.catch_up(ctx);
    }
}

impl Handler<ReferentChanged> for Buffers {
    type Result = ();
    fn handle(&mut self, ReferentChanged(referent): ReferentChanged, ctx: &mut Self::Context) {
        for key in self.referencing(&referent) {
            self.reconcile(&key, ctx);
        }
    }
}

impl Handler<Provisioned> for Buffers {
    type Result = ();
    fn handle(&mut self, msg: Provisioned, ctx: &mut Self::Context) {
        self.provisioned(msg.0, ctx);
    }
}
