//! Keeps each NodePool's status true: `resources` and `nodes` from its claims, `Ready` from
//! `ValidationSucceeded` and `NodeClassReady`, each with a reason an operator can act on, and
//! the rollout status (`view::rollout`) on each NodePool and ClusterAPINodeClass. The
//! NodePool index it reads (`state::named`, the one the provisioner reads too) is fed by its
//! own watch (`state::feed`), which asks for a refresh on every change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Shared;
use super::pass::{Coalesced, Pass};
use super::patch::write_conditions;
use crate::api::conditions::{self, ConditionStatus};
use crate::api::decode::Malformed;
use crate::api::nodeclass::ClusterAPINodeClass;
use crate::api::nodepool::{NodePool, NodePoolStatus};
use crate::api::resources::Resources;
use crate::api::validation::validate_nodepool;
use crate::api::wellknown::{NODECLASS_GROUP, NODECLASS_KIND};
use crate::capi::autoscaler;
use crate::disruption::pause;
use crate::metrics::UsageLabels;
use crate::view::pool_counts::Tally;
use crate::view::rollout::Rollout;
use pacing::{Paced, verdicts};

mod pacing;

/// Claims or the catalog changed: recompute statuses (coalesced).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Refresh;

/// Claims change in bursts (a scale-up writes hundreds); one status write per pool covers a
/// burst. This is a coalescing delay, not a retry: failed writes retry with `Backoff`.
const COALESCE: Duration = Duration::from_millis(500);

pub(crate) struct NodePools {
    shared: Arc<Shared>,
    /// The last decode problem reported by Event per NodePool, so each is told once.
    told: BTreeMap<String, String>,
    pass: Coalesced,
    /// Metric series published per NodePool (usage and limit resource types), so the ones that
    /// go away (a resource back to zero, a deleted pool) are removed, not exported for ever.
    usage_series: HashMap<String, BTreeSet<String>>,
    limit_series: HashMap<String, BTreeSet<String>>,
    /// Each claim's part in the counts, kept between refreshes.
    tally: Tally,
    /// When each status (by kind and name) was last written, and whether a refresh is due
    /// for the counts held back meanwhile (`COUNTS_EVERY`).
    written: Paced,
    counts_held: bool,
}

impl NodePools {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            told: BTreeMap::new(),
            pass: Coalesced::new(COALESCE),
            usage_series: HashMap::new(),
            limit_series: HashMap::new(),
            tally: Tally::default(),
            written: Paced::default(),
            counts_held: false,
        }
    }

    /// Pools that are gone keep no metric series and no write times.
    fn forget_missing(&mut self, present: &BTreeSet<String>) {
        self.written.retain(|key| {
            key.strip_prefix("NodePool/")
                .is_none_or(|pool| present.contains(pool))
        });
        self.shared
            .state
            .registration_health
            .write()
            .retain(|pool| present.contains(pool));
        let m = &self.shared.metrics;
        for (series, family) in [
            (&mut self.usage_series, &m.nodepools_usage),
            (&mut self.limit_series, &m.nodepools_limit),
        ] {
            series.retain(|pool, types| {
                if present.contains(pool) {
                    return true;
                }
                for t in types.iter() {
                    family.remove(&UsageLabels {
                        nodepool: pool.clone(),
                        resource_type: t.clone(),
                    });
                }
                false
            });
        }
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
        let counts = self.tally.count_state(&self.shared.state);
        let present: BTreeSet<String> = pools.iter().map(|np| np.name_any()).collect();
        self.forget_missing(&present);
        self.refresh_malformed(ctx);
        for np in pools {
            let name = np.name_any();
            let (resources, nodes) = counts.usage.get(name.as_str()).cloned().unwrap_or_default();
            let rollout = counts.pools.get(name.as_str()).copied().unwrap_or_default();
            let status = desired_status(&self.shared, &np, &resources, nodes, &rollout);
            self.publish_metrics(&np, &resources);
            if np.status.as_ref() == Some(&status) {
                continue;
            }
            let before = np.status.as_ref().and_then(|s| s.conditions.as_deref());
            let moved = np.status.as_ref().and_then(|s| s.observed_generation)
                != status.observed_generation;
            let key = format!("NodePool/{name}");
            if !self.due(key, moved, before, &status.conditions, ctx) {
                continue;
            }
            let api: Api<NodePool> = self.shared.api();
            let body = status_patch(np.status.as_ref(), &status);
            let was_ready = np
                .status
                .as_ref()
                .map(|_| conditions::is_true(np.conditions(), conditions::READY));
            tell_pause_transition(&self.shared, &np, &status);
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
            self.write_status(ctx, api, name, body, true);
        }
        self.refresh_nodeclasses(ctx, &counts.classes);
    }

    /// Whether the status `key` should be written now: at once when a condition's status or
    /// reason changes, a new generation is observed (tools wait for `observedGeneration`) or it
    /// was not written lately; else once `COUNTS_EVERY` has passed since its last write, with
    /// a refresh set for then.
    fn due(
        &mut self,
        key: String,
        generation_moved: bool,
        before: Option<&[conditions::Condition]>,
        after: &Option<Vec<conditions::Condition>>,
        ctx: &mut Context<Self>,
    ) -> bool {
        let urgent = generation_moved || verdicts(before) != verdicts(after.as_deref());
        match self.written.write(key, urgent, Instant::now()) {
            Ok(()) => true,
            Err(wait) => {
                self.hold_counts(wait, ctx);
                false
            }
        }
    }

    /// Refresh again in `after`, once however many statuses were held back.
    fn hold_counts(&mut self, after: Duration, ctx: &mut Context<Self>) {
        if self.counts_held {
            return;
        }
        self.counts_held = true;
        ctx.run_later(after, |act, ctx| {
            act.counts_held = false;
            act.schedule(ctx);
        });
    }

    /// Merge-patches `name`'s status with `body`; a failure retries the whole refresh later,
    /// and a success resets the back-off when `resets` (the NodePools' own writes).
    fn write_status<K>(
        &mut self,
        ctx: &mut Context<Self>,
        api: Api<K>,
        name: String,
        body: serde_json::Value,
        resets: bool,
    ) where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + 'static,
    {
        ctx.spawn(
            async move {
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
                    .await
            }
            .into_actor(self)
            .map(move |r, act, ctx| match r {
                Ok(_) if resets => act.pass.backoff.reset(),
                Ok(_) => {}
                // A deleted object needs no status.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                // Another writer got there first: computed again from the index.
                Err(kube::Error::Api(s)) if s.code == 409 => act.retry_later(ctx),
                Err(e) => {
                    tracing::warn!(error = %e, kind = %K::kind(&()), "updating status failed; retrying");
                    act.retry_later(ctx);
                }
            }),
        );
    }

    /// Each ClusterAPINodeClass's rollout status, over the claims that use it. The Catalog
    /// writes its `Ready` condition; this writes the counts and `NodesUpToDate` only, read back
    /// from the index's copy so neither drops the other's condition for long (the next pass of
    /// either restores it).
    fn refresh_nodeclasses(
        &mut self,
        ctx: &mut Context<Self>,
        rollouts: &BTreeMap<Arc<str>, Rollout>,
    ) {
        let classes: Vec<Arc<ClusterAPINodeClass>> = self
            .shared
            .state
            .nodeclasses
            .read()
            .values()
            .cloned()
            .collect();
        let present: BTreeSet<String> = classes.iter().map(|nc| nc.name_any()).collect();
        self.written.retain(|key| {
            key.strip_prefix("NodeClass/")
                .is_none_or(|class| present.contains(class))
        });
        for nc in classes {
            let name = nc.name_any();
            let rollout = rollouts.get(name.as_str()).copied().unwrap_or_default();
            let current = nc.status.clone().unwrap_or_default();
            let mut desired = current.clone();
            let mut conds = desired.conditions.take().unwrap_or_default();
            set_nodes_up_to_date(
                &mut conds,
                &rollout,
                nc.metadata.generation,
                Timestamp::now(),
            );
            desired.conditions = Some(conds);
            desired.observed_generation = nc.metadata.generation;
            desired.nodes = Some(rollout.nodes);
            desired.up_to_date_nodes = Some(rollout.up_to_date);
            desired.ready_nodes = Some(rollout.ready);
            desired.up_to_date_and_ready_nodes = Some(rollout.up_to_date_and_ready);
            if desired == current {
                continue;
            }
            let before = current.conditions.as_deref();
            let moved = current.observed_generation != desired.observed_generation;
            let key = format!("NodeClass/{name}");
            if !self.due(key, moved, before, &desired.conditions, ctx) {
                continue;
            }
            // The Catalog writes this conditions list too (`Ready`): the write is guarded by
            // the resourceVersion it was computed from, and a conflict retries the refresh
            // once the index has the Catalog's write.
            let api: Api<ClusterAPINodeClass> = self.shared.api();
            let body = json!({
                "metadata": {"resourceVersion": nc.metadata.resource_version},
                "status": desired,
            });
            self.write_status(ctx, api, name, body, false);
        }
    }

    /// A NodePool that does not decode gets `ValidationSucceeded=False` (and so `Ready=False`)
    /// with the field and the decoder's reason, and one Event per distinct problem.
    fn refresh_malformed(&mut self, ctx: &mut Context<Self>) {
        let now = Timestamp::now();
        // NodePools the types cannot decode: left out of the index's pools (nothing provisions
        // from them) and given `ValidationSucceeded=False` naming the field.
        let bad: Vec<Malformed> = {
            let index = self.shared.state.nodepools.read();
            let malformed = index.malformed();
            self.told.retain(|n, _| malformed.contains_key(n));
            malformed.values().cloned().collect()
        };
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
            ctx.spawn(
                write_conditions::<NodePool>(
                    self.shared.client_for::<NodePool>(),
                    name,
                    json!(conds),
                )
                .into_actor(self),
            );
        }
    }

    fn publish_metrics(&mut self, np: &NodePool, resources: &Resources) {
        let m = &self.shared.metrics;
        let pool = np.name_any();
        let labels = |t: &str| UsageLabels {
            nodepool: pool.clone(),
            resource_type: t.to_string(),
        };
        let mut usage = BTreeSet::new();
        for (k, q) in resources.iter() {
            m.nodepools_usage.get_or_create(&labels(k)).set(q.as_f64());
            usage.insert(k.to_string());
        }
        let mut limits = BTreeSet::new();
        for (k, q) in np.spec.limits.iter().flatten() {
            if let Ok(q) = crate::api::resources::Quantity::from_k8s(q) {
                m.nodepools_limit.get_or_create(&labels(k)).set(q.as_f64());
                limits.insert(k.clone());
            }
        }
        // A resource that went to zero (or a limit removed) must not keep its last value.
        for (series, family, now) in [
            (&mut self.usage_series, &m.nodepools_usage, usage),
            (&mut self.limit_series, &m.nodepools_limit, limits),
        ] {
            let before = series.insert(pool.clone(), now.clone()).unwrap_or_default();
            for t in before.difference(&now) {
                family.remove(&labels(t));
            }
        }
    }
}

/// The merge patch that makes the status `desired`. A merge patch never removes a key it does
/// not mention, so every `status.resources` key that went away is written as null.
fn status_patch(current: Option<&NodePoolStatus>, desired: &NodePoolStatus) -> serde_json::Value {
    let mut body = json!({ "status": desired });
    let old_keys = current
        .and_then(|s| s.resources.as_ref())
        .into_iter()
        .flat_map(|r| r.keys());
    let new = desired.resources.as_ref();
    if let Some(resources) = body
        .pointer_mut("/status/resources")
        .and_then(serde_json::Value::as_object_mut)
    {
        for k in old_keys {
            if !new.is_some_and(|n| n.contains_key(k)) {
                resources.insert(k.clone(), serde_json::Value::Null);
            }
        }
    }
    body
}

fn desired_status(
    shared: &Shared,
    np: &NodePool,
    resources: &Resources,
    nodes: i64,
    rollout: &Rollout,
) -> NodePoolStatus {
    let mut status = np.status.clone().unwrap_or_default();
    let mut conds = status.conditions.take().unwrap_or_default();
    let now = Timestamp::now();
    let generation = np.metadata.generation;
    set_validation(np, &mut conds, generation, now);
    set_nodeclass_ready(shared, np, &mut conds, generation, now);
    set_registration_healthy(shared, np, &mut conds, generation, now);
    set_disruption_paused(shared, np, &mut conds, generation, now);
    set_nodes_up_to_date(&mut conds, rollout, generation, now);
    conditions::set_nodepool_ready(&mut conds, generation, now);
    // Keep transition times stable: only conditions that changed got `now`.
    status.conditions = Some(conds);
    status.resources = Some(resources.to_k8s());
    status.nodes = Some(nodes);
    status.observed_generation = generation;
    status.up_to_date_nodes = Some(rollout.up_to_date);
    status.ready_nodes = Some(rollout.ready);
    status.up_to_date_and_ready_nodes = Some(rollout.up_to_date_and_ready);
    status
}

/// `ValidationSucceeded`: the NodePool's own validation, as the webhook-less CRD leaves it to us.
fn set_validation(
    np: &NodePool,
    conds: &mut Vec<conditions::Condition>,
    generation: Option<i64>,
    now: Timestamp,
) {
    match validate_nodepool(np) {
        Ok(()) => conditions::set(
            conds,
            conditions::VALIDATION_SUCCEEDED,
            ConditionStatus::True,
            "ValidationSucceeded",
            "",
            generation,
            now,
        ),
        Err(e) => conditions::set(
            conds,
            conditions::VALIDATION_SUCCEEDED,
            ConditionStatus::False,
            "ValidationFailed",
            &e.to_string(),
            generation,
            now,
        ),
    };
}

/// `NodeClassReady`: the referenced ClusterAPINodeClass is ours, known and ready in the catalog.
fn set_nodeclass_ready(
    shared: &Shared,
    np: &NodePool,
    conds: &mut Vec<conditions::Condition>,
    generation: Option<i64>,
    now: Timestamp,
) {
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
        conds,
        conditions::NODE_CLASS_READY,
        st,
        reason,
        &msg,
        generation,
        now,
    );
}

/// `NodeRegistrationHealthy` from recent launch outcomes, when the record has a verdict.
fn set_registration_healthy(
    shared: &Shared,
    np: &NodePool,
    conds: &mut Vec<conditions::Condition>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let current = conditions::get(conds, conditions::NODE_REGISTRATION_HEALTHY)
        .map(|c| (c.status.as_bool(), c.observed_generation));
    let desired =
        shared
            .state
            .registration_health
            .write()
            .desired(&np.name_any(), generation, current);
    if let Some(verdict) = desired {
        let (st, reason, msg) = match verdict {
            None => (
                ConditionStatus::Unknown,
                "AwaitingReconciliation".to_string(),
                "no launch registered or timed out since the NodePool last changed".to_string(),
            ),
            Some(v) if v.healthy => (ConditionStatus::True, String::new(), String::new()),
            Some(v) => (ConditionStatus::False, v.reason, v.message),
        };
        conditions::set(
            conds,
            conditions::NODE_REGISTRATION_HEALTHY,
            st,
            &reason,
            &msg,
            generation,
            now,
        );
    }
}

/// `NodesUpToDate` from the rollout counts (`view::rollout`).
fn set_nodes_up_to_date(
    conds: &mut Vec<conditions::Condition>,
    rollout: &Rollout,
    generation: Option<i64>,
    now: Timestamp,
) {
    let v = rollout.verdict();
    conditions::set(
        conds,
        conditions::NODES_UP_TO_DATE,
        v.status,
        v.reason,
        &v.message,
        generation,
        now,
    );
}

/// `DisruptionPaused`: True while an operator's pause (the setting, the pool's annotation) or
/// Cluster API's pause on all its node groups holds the pool's voluntary disruption; False once
/// a pause ended; absent on a pool never paused.
fn set_disruption_paused(
    shared: &Shared,
    np: &NodePool,
    conds: &mut Vec<conditions::Condition>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let pause = pause::paused(shared.settings.disruption.paused, np)
        .or_else(|| cluster_api_pause(shared, np));
    let had = conditions::get(conds, conditions::DISRUPTION_PAUSED).is_some();
    if let Some((st, reason, msg)) = pause::condition(pause.as_ref(), had) {
        conditions::set(
            conds,
            conditions::DISRUPTION_PAUSED,
            st,
            reason,
            &msg,
            generation,
            now,
        );
    }
}

/// Cluster API's pause as the pool sees it: every node group its NodeClass selects is paused
/// (its Cluster, or itself). A pool with some groups paused is not: its other nodes still go,
/// and the paused ones say why on their own (`DisruptionBlocked`).
fn cluster_api_pause(shared: &Shared, np: &NodePool) -> Option<pause::Pause> {
    let nodeclass = &np.spec.template.spec.node_class_ref.name;
    let selected = shared.catalog.selected(nodeclass)?;
    let deployments = shared.state.deployments.read();
    let mut why = BTreeSet::new();
    for key in &selected {
        let md = deployments.get(key)?;
        if deployments.cluster_paused(&md) {
            why.insert(format!("Cluster {}/{}", md.namespace, md.cluster_name));
        } else if autoscaler::paused(&md) {
            why.insert(md.scalable().to_string());
        } else {
            return None;
        }
    }
    (!why.is_empty())
        .then(|| pause::Pause::ClusterApi(why.into_iter().collect::<Vec<_>>().join(", ")))
}

/// One Event on the NodePool, and a log line, when its pause starts or ends.
fn tell_pause_transition(shared: &Shared, np: &NodePool, status: &NodePoolStatus) {
    let was = conditions::get(np.conditions(), conditions::DISRUPTION_PAUSED)
        .and_then(|c| c.status.as_bool());
    let Some(now) = status
        .conditions
        .as_deref()
        .and_then(|c| conditions::get(c, conditions::DISRUPTION_PAUSED))
    else {
        return;
    };
    let name = np.name_any();
    match pause::transition(was, now.is_true()) {
        Some(pause::Transition::Started) => {
            tracing::info!(nodepool = %name, reason = %now.reason, "voluntary disruption paused: {}", now.message);
            shared.events.normal(
                np.object_ref(&()),
                "DisruptionPaused",
                format!(
                    "Voluntary disruption of NodePool {name} is paused: {}",
                    now.message
                ),
            );
        }
        Some(pause::Transition::Ended) => {
            tracing::info!(nodepool = %name, "voluntary disruption resumed");
            shared.events.normal(
                np.object_ref(&()),
                "DisruptionResumed",
                format!("Voluntary disruption of NodePool {name} goes on again"),
            );
        }
        None => {}
    }
}

impl Pass for NodePools {
    fn coalesced(&mut self) -> &mut Coalesced {
        &mut self.pass
    }

    fn pass(&mut self, ctx: &mut Context<Self>) {
        self.refresh(ctx);
    }
}

super::registry::stoppable!(NodePools);

impl Actor for NodePools {
    type Context = Context<Self>;
}

impl Handler<super::tracked::Tracked> for NodePools {
    type Result = MessageResult<super::tracked::Tracked>;
    fn handle(&mut self, _: super::tracked::Tracked, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            [
                ("usage_series", self.usage_series.len()),
                ("limit_series", self.limit_series.len()),
            ]
            .into_iter()
            .collect(),
        )
    }
}

impl Handler<Refresh> for NodePools {
    type Result = ();
    fn handle(&mut self, _: Refresh, ctx: &mut Self::Context) {
        self.schedule(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::resources::Quantity;

    fn status(pairs: &[(&str, i64)]) -> NodePoolStatus {
        let mut r = Resources::new();
        for (k, v) in pairs {
            r = r.with(*k, Quantity::from_units(*v));
        }
        NodePoolStatus {
            resources: Some(r.to_k8s()),
            nodes: Some(pairs.len() as i64),
            ..NodePoolStatus::default()
        }
    }

    #[test]
    fn resources_that_went_away_are_written_as_null() {
        let old = status(&[("cpu", 4), ("nvidia.com/gpu", 1)]);
        let new = status(&[("cpu", 2)]);
        let body = status_patch(Some(&old), &new);
        assert_eq!(body["status"]["resources"]["cpu"], "2");
        assert!(body["status"]["resources"]["nvidia.com/gpu"].is_null());
        assert!(
            body["status"]["resources"]
                .as_object()
                .expect("resources")
                .contains_key("nvidia.com/gpu"),
            "the key must be present, as null: {body}"
        );
        let empty = status(&[]);
        let body = status_patch(Some(&new), &empty);
        assert!(body["status"]["resources"]["cpu"].is_null(), "{body}");
        let first = status_patch(None, &new);
        assert_eq!(
            first["status"]["resources"],
            serde_json::json!({"cpu": "2"})
        );
    }
}
