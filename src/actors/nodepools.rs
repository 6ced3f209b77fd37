//! Watches NodePools (feeding the NodePool index the provisioner reads) and keeps each NodePool's
//! status true: `resources` and `nodes` from its claims, and `Ready` from `ValidationSucceeded`
//! and `NodeClassReady`, each with a reason an operator can act on.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Shared;
use super::decode::{Lenient, Malformed};
use crate::api::conditions::{self, ConditionStatus};
use crate::api::nodepool::{NodePool, NodePoolStatus};
use crate::api::resources::Resources;
use crate::api::validation::validate_nodepool;
use crate::api::wellknown::{NODECLASS_GROUP, NODECLASS_KIND, NODEPOOL_LABEL};
use crate::metrics::UsageLabels;

/// Claims or the catalog changed: recompute statuses (coalesced).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Refresh;

pub struct NodePools {
    shared: Arc<Shared>,
    buffer: Vec<NodePool>,
    /// NodePools the types cannot decode, by name: left out of the index (nothing provisions
    /// from them) and given `ValidationSucceeded=False` naming the field.
    malformed: BTreeMap<String, Malformed>,
    bad_buffer: Vec<Malformed>,
    /// The last decode problem reported by Event per NodePool, so each is told once.
    told: BTreeMap<String, String>,
    scheduled: bool,
}

impl NodePools {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            buffer: Vec::new(),
            malformed: BTreeMap::new(),
            bad_buffer: Vec::new(),
            told: BTreeMap::new(),
            scheduled: false,
        }
    }

    fn schedule(&mut self, ctx: &mut Context<Self>) {
        if self.scheduled {
            return;
        }
        self.scheduled = true;
        ctx.run_later(Duration::from_millis(500), |act, ctx| {
            act.scheduled = false;
            act.refresh(ctx);
        });
    }

    fn refresh(&mut self, ctx: &mut Context<Self>) {
        if !self.shared.router.is_active() {
            return;
        }
        let pools: Vec<Arc<NodePool>> = self
            .shared
            .state
            .nodepools
            .read()
            .values()
            .cloned()
            .collect();
        let usage = usage_by_pool(&self.shared);
        self.refresh_malformed(ctx);
        for np in pools {
            let (resources, nodes) = usage.get(&np.name_any()).cloned().unwrap_or_default();
            let status = desired_status(&self.shared, &np, &resources, nodes);
            self.publish_metrics(&np, &resources);
            if np.status.as_ref() == Some(&status) {
                continue;
            }
            let api: Api<NodePool> = Api::all(self.shared.workload.clone());
            let name = np.name_any();
            let body = json!({ "status": status });
            let was_ready = np
                .status
                .as_ref()
                .map(|_| conditions::is_true(np.conditions(), conditions::READY));
            let ready = status
                .conditions
                .as_deref()
                .map(|c| conditions::is_true(c, conditions::READY));
            if ready == Some(false) && was_ready != Some(false) {
                let msg = status
                    .conditions
                    .as_deref()
                    .and_then(|c| conditions::get(c, conditions::READY))
                    .map(|c| c.message.clone())
                    .unwrap_or_default();
                self.shared.events.warning(
                    np.object_ref(&()),
                    "NotReady",
                    format!("NodePool {name} is not ready: {msg}"),
                );
            }
            ctx.spawn(
                async move {
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
                        .await
                }
                .into_actor(self)
                .map(|r, _, _| {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "updating NodePool status failed");
                    }
                }),
            );
        }
    }

    /// A NodePool that does not decode gets `ValidationSucceeded=False` (and so `Ready=False`)
    /// with the field and the decoder's reason, and one Event per distinct problem.
    fn refresh_malformed(&mut self, ctx: &mut Context<Self>) {
        let now = Timestamp::now();
        let bad: Vec<Malformed> = self.malformed.values().cloned().collect();
        for m in bad {
            let Some(name) = m.metadata.name.clone() else {
                continue;
            };
            let message = m.message();
            let current: Vec<conditions::Condition> = m
                .conditions
                .clone()
                .and_then(|c| serde_json::from_value(c).ok())
                .unwrap_or_default();
            let mut conds = current.clone();
            let generation = m.metadata.generation;
            conditions::set(
                &mut conds,
                conditions::VALIDATION_SUCCEEDED,
                ConditionStatus::False,
                "ValidationFailed",
                &message,
                generation,
                now,
            );
            conditions::set_nodepool_ready(&mut conds, generation, now);
            if self.told.get(&name) != Some(&message) {
                self.shared.events.warning(
                    m.object_ref::<NodePool>(),
                    "ValidationFailed",
                    format!("NodePool {name} cannot be read: {message}"),
                );
                self.told.insert(name.clone(), message);
            }
            if conds == current && m.conditions.is_some() {
                continue;
            }
            let api: Api<NodePool> = Api::all(self.shared.workload.clone());
            let body = json!({ "status": { "conditions": conds } });
            ctx.spawn(
                async move {
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
                        .await
                }
                .into_actor(self)
                .map(|r, _, _| {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "updating a malformed NodePool's status failed");
                    }
                }),
            );
        }
    }

    fn publish_metrics(&self, np: &NodePool, resources: &Resources) {
        let m = &self.shared.metrics;
        for (k, q) in resources.iter() {
            m.nodepools_usage
                .get_or_create(&UsageLabels {
                    nodepool: np.name_any(),
                    resource_type: k.to_string(),
                })
                .set(q.as_f64());
        }
        for (k, q) in np.spec.limits.iter().flatten() {
            if let Ok(q) = crate::api::resources::Quantity::from_k8s(q) {
                m.nodepools_limit
                    .get_or_create(&UsageLabels {
                        nodepool: np.name_any(),
                        resource_type: k.clone(),
                    })
                    .set(q.as_f64());
            }
        }
    }
}

/// Per NodePool: the summed capacity of its live claims and how many there are.
pub fn usage_by_pool(shared: &Shared) -> BTreeMap<String, (Resources, i64)> {
    let mut out: BTreeMap<String, (Resources, i64)> = BTreeMap::new();
    for c in shared.state.claims.read().all() {
        if c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(pool) = c.labels().get(NODEPOOL_LABEL) else {
            continue;
        };
        let entry = out.entry(pool.clone()).or_default();
        entry.1 += 1;
        let capacity = c
            .status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .or_else(|| c.spec.resources.as_ref().and_then(|r| r.requests.as_ref()));
        if let Some(Ok(r)) = capacity.map(Resources::from_k8s) {
            entry.0.add_assign(&r);
        }
    }
    out
}

fn desired_status(
    shared: &Shared,
    np: &NodePool,
    resources: &Resources,
    nodes: i64,
) -> NodePoolStatus {
    let mut status = np.status.clone().unwrap_or_default();
    let mut conds = status.conditions.take().unwrap_or_default();
    let now = Timestamp::now();
    let generation = np.metadata.generation;
    match validate_nodepool(np) {
        Ok(()) => conditions::set(
            &mut conds,
            conditions::VALIDATION_SUCCEEDED,
            ConditionStatus::True,
            "ValidationSucceeded",
            "",
            generation,
            now,
        ),
        Err(e) => conditions::set(
            &mut conds,
            conditions::VALIDATION_SUCCEEDED,
            ConditionStatus::False,
            "ValidationFailed",
            &e.to_string(),
            generation,
            now,
        ),
    };
    let r = &np.spec.template.spec.node_class_ref;
    let (st, reason, msg) = if r.group != NODECLASS_GROUP || r.kind != NODECLASS_KIND {
        (
            ConditionStatus::False,
            "NodeClassNotSupported",
            format!(
                "spec.template.spec.nodeClassRef: {}/{} is not a {NODECLASS_GROUP} {NODECLASS_KIND}",
                r.group, r.kind
            ),
        )
    } else {
        match shared.catalog.nodeclass_ready(&r.name) {
            Some(Ok(())) => (ConditionStatus::True, "NodeClassReady", String::new()),
            Some(Err(m)) => (
                ConditionStatus::False,
                "NodeClassNotReady",
                format!("ClusterAPINodeClass {}: {m}", r.name),
            ),
            None => (
                ConditionStatus::False,
                "NodeClassNotFound",
                format!("ClusterAPINodeClass {} not found", r.name),
            ),
        }
    };
    conditions::set(
        &mut conds,
        conditions::NODE_CLASS_READY,
        st,
        reason,
        &msg,
        generation,
        now,
    );
    conditions::set_nodepool_ready(&mut conds, generation, now);
    // Keep transition times stable: only conditions that changed got `now`.
    status.conditions = Some(conds);
    status.resources = Some(resources.to_k8s());
    status.nodes = Some(nodes);
    status
}

impl Actor for NodePools {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Per-object decoding: one NodePool the types cannot read must not stop the watch.
        let api: Api<Lenient<NodePool>> = Api::all(self.shared.workload.clone());
        ctx.add_stream(watcher(api, watcher::Config::default()).default_backoff());
    }
}

impl StreamHandler<Result<watcher::Event<Lenient<NodePool>>, watcher::Error>> for NodePools {
    fn handle(
        &mut self,
        ev: Result<watcher::Event<Lenient<NodePool>>, watcher::Error>,
        ctx: &mut Self::Context,
    ) {
        match ev {
            Ok(watcher::Event::Init) => {
                self.buffer.clear();
                self.bad_buffer.clear();
            }
            Ok(watcher::Event::InitApply(Lenient::Ok(np))) => self.buffer.push(np),
            Ok(watcher::Event::InitApply(Lenient::Bad(m))) => self.bad_buffer.push(*m),
            Ok(watcher::Event::InitDone) => {
                self.malformed = std::mem::take(&mut self.bad_buffer)
                    .into_iter()
                    .map(|m| (m.metadata.name.clone().unwrap_or_default(), m))
                    .collect();
                self.told.retain(|n, _| self.malformed.contains_key(n));
                let fresh = std::mem::take(&mut self.buffer);
                let mut pools = self.shared.state.nodepools.write();
                pools.clear();
                for np in fresh {
                    pools.insert(np.name_any(), Arc::new(np));
                }
                drop(pools);
                self.shared
                    .state
                    .nodepools_synced
                    .store(true, std::sync::atomic::Ordering::Release);
                self.shared.synced.notify_waiters();
            }
            Ok(watcher::Event::Apply(Lenient::Ok(np))) => {
                self.malformed.remove(&np.name_any());
                self.told.remove(&np.name_any());
                self.shared
                    .state
                    .nodepools
                    .write()
                    .insert(np.name_any(), Arc::new(np));
            }
            Ok(watcher::Event::Apply(Lenient::Bad(m))) => {
                let name = m.metadata.name.clone().unwrap_or_default();
                tracing::warn!(nodepool = %name, problem = %m, "NodePool cannot be decoded; it is not used until fixed");
                // The last good version must not keep provisioning: the user changed it.
                self.shared.state.nodepools.write().remove(&name);
                self.malformed.insert(name, *m);
            }
            Ok(watcher::Event::Delete(np)) => {
                let name = np.name_any();
                self.malformed.remove(&name);
                self.told.remove(&name);
                self.shared.state.nodepools.write().remove(&name);
            }
            Err(e) => {
                tracing::warn!(error = %e, "NodePool watch failed; it will re-list");
                return;
            }
        }
        self.shared.router.provisioner_poke();
        self.schedule(ctx);
    }
}

impl Handler<Refresh> for NodePools {
    type Result = ();
    fn handle(&mut self, _: Refresh, ctx: &mut Self::Context) {
        self.schedule(ctx);
    }
}
