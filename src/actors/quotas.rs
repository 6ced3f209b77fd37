//! The CapacityQuota actor (leader only, with `--feature-gates CapacityQuota=true`): reads the
//! quotas from `state.quotas` (fed in `watches::start`), where every solve reads them
//! too, and writes each quota's status as
//! upstream's controller does: `used` (what the nodes it selects use, for each resource its
//! limits name), `observedGeneration` and the `Reconciled` condition. A quota that cannot be
//! enforced (a limit that is not a whole non-negative quantity, a bad selector) is left out of
//! provisioning and says why in `Reconciled` (False, `ReconciliationFailed`, naming the field)
//! and in one Warning Event.
//!
//! Usage changes with every Node and claim, so the status is recomputed from the indexes on a
//! short period (no API read) and written only when it changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Shared;
use crate::api::capacity_quota::{
    CapacityQuota, CapacityQuotaStatus, CapacityQuotaUsage, RECONCILED, RECONCILIATION_FAILED,
    RECONCILIATION_SUCCEEDED,
};
use crate::api::conditions::{self, ConditionStatus};
use crate::metrics::QuotaLabels;
use crate::scheduling::quota::QuotaInput;
use crate::view::quotas::count;

/// How often the status is recomputed from the indexes.
const STATUS_PERIOD: Duration = Duration::from_secs(2);

/// The quota feed took a change (`Router::quotas_changed`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct QuotasChanged;

pub(crate) struct Quotas {
    shared: Arc<Shared>,
    /// The status last written per quota, so an unchanged one is not written again before the
    /// watch shows it.
    written: HashMap<String, CapacityQuotaStatus>,
    /// The last problem told in an Event, per quota (one Event per new problem).
    reported: HashMap<String, String>,
    /// The resources whose gauges are published, per quota, so a resource a quota no longer
    /// limits, and a quota gone or no longer enforced, lose their series.
    series: HashMap<String, BTreeSet<String>>,
}

impl Quotas {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            written: HashMap::new(),
            reported: HashMap::new(),
            series: HashMap::new(),
        }
    }

    /// Sets the usage and limit gauges of an enforced quota to `input`'s, or (None) removes
    /// them: a quota that caps nothing must not show limits on a dashboard.
    fn publish(&mut self, name: &str, input: Option<&QuotaInput>) {
        let m = &self.shared.metrics;
        let labels = |resource: &str| QuotaLabels {
            capacity_quota: name.to_string(),
            resource_type: resource.to_string(),
        };
        let now: BTreeSet<String> = input
            .map(|i| i.limits.iter().map(|(k, _)| k.to_string()).collect())
            .unwrap_or_default();
        if let Some(input) = input {
            for (resource, limit) in input.limits.iter() {
                let l = labels(resource);
                m.capacity_quota_limit.get_or_create(&l).set(limit.as_f64());
                (m.capacity_quota_usage.get_or_create(&l)).set(input.usage.get(resource).as_f64());
            }
        }
        let before = match now.is_empty() {
            true => self.series.remove(name),
            false => self.series.insert(name.to_string(), now.clone()),
        };
        for resource in before.unwrap_or_default().difference(&now) {
            m.capacity_quota_limit.remove(&labels(resource));
            m.capacity_quota_usage.remove(&labels(resource));
        }
    }

    /// Recompute every quota's status and write those that changed.
    fn refresh(&mut self, ctx: &mut Context<Self>) {
        let now = Timestamp::now();
        for c in count(self.shared.view(), &[]) {
            self.publish(&c.quota.name_any(), c.input.as_ref().ok());
            let q = c.quota;
            let name = q.name_any();
            let old = q.status.clone().unwrap_or_default();
            let mut status = old.clone();
            let mut conds = status.conditions.take().unwrap_or_default();
            let generation = q.metadata.generation;
            match &c.input {
                Ok(input) => {
                    self.reported.remove(&name);
                    let used: BTreeMap<String, _> = q
                        .spec
                        .limits
                        .resources
                        .keys()
                        .map(|k| (k.clone(), input.usage.get(k).to_k8s()))
                        .collect();
                    status.used = Some(CapacityQuotaUsage { resources: used });
                    conditions::set(
                        &mut conds,
                        RECONCILED,
                        ConditionStatus::True,
                        RECONCILIATION_SUCCEEDED,
                        "usage counted over the nodes the selector matches",
                        generation,
                        now,
                    );
                }
                Err(m) => {
                    let message = format!("not enforced: {m}");
                    if self.reported.get(&name) != Some(&message) {
                        self.shared.events.warning(
                            q.object_ref(&()),
                            RECONCILIATION_FAILED,
                            format!("CapacityQuota {name}: {message}"),
                        );
                        self.reported.insert(name.clone(), message.clone());
                    }
                    status.used = None;
                    conditions::set(
                        &mut conds,
                        RECONCILED,
                        ConditionStatus::False,
                        RECONCILIATION_FAILED,
                        &message,
                        generation,
                        now,
                    );
                }
            }
            status.conditions = Some(conds);
            status.observed_generation = generation;
            if status == old || self.written.get(&name) == Some(&status) {
                continue;
            }
            self.write(&q, status, ctx);
        }
    }

    /// Merge-patch the status, guarded by the resourceVersion it was computed from: another
    /// writer's newer status (Cluster Autoscaler writes the same fields) is not overwritten
    /// by one computed from an older copy; the next refresh computes again.
    fn write(&mut self, q: &CapacityQuota, status: CapacityQuotaStatus, ctx: &mut Context<Self>) {
        if !self.shared.router.is_active() {
            return;
        }
        let name = q.name_any();
        self.written.insert(name.clone(), status.clone());
        let api: Api<CapacityQuota> = Api::all(self.shared.workload.clone());
        let body = json!({
            "metadata": {"resourceVersion": q.metadata.resource_version},
            "status": {
                "used": status.used,
                "conditions": status.conditions,
                "observedGeneration": status.observed_generation,
            },
        });
        ctx.spawn(
            async move {
                match api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
                    .await
                {
                    Ok(_) => None,
                    Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Some(name),
                    Err(e) => {
                        tracing::warn!(capacityquota = %name, error = %e, "writing capacity quota status failed");
                        Some(name)
                    }
                }
            }
            .into_actor(self)
            .map(|failed, act, _| {
                // Not written: the next refresh writes it again.
                if let Some(name) = failed {
                    act.written.remove(&name);
                }
            }),
        );
    }

    /// Catch up with the index after a change: a quota gone or that no longer decodes loses
    /// its gauges and the status written for it; one that does not decode caps nothing (the
    /// index keeps it apart) and is named once per problem (the API server's schema keeps
    /// most of these out).
    fn catch_up(&mut self) {
        let (gone, bad) = {
            let index = self.shared.state.quotas.read();
            let gone: BTreeSet<String> = (self.written.keys().chain(self.series.keys()))
                .filter(|name| index.get(name).is_none())
                .cloned()
                .collect();
            self.reported.retain(|name, _| {
                index.get(name).is_some() || index.malformed().contains_key(name)
            });
            let bad: Vec<_> = (index.malformed().iter())
                .map(|(name, m)| (name.clone(), m.message(), m.object_ref::<CapacityQuota>()))
                .collect();
            (gone, bad)
        };
        for name in gone {
            self.written.remove(&name);
            self.publish(&name, None);
        }
        for (name, message, object) in bad {
            if self.reported.get(&name) != Some(&message) {
                self.shared.events.warning(
                    object,
                    RECONCILIATION_FAILED,
                    format!("CapacityQuota {name}: {message}"),
                );
                self.reported.insert(name, message);
            }
        }
    }
}

/// Start the CapacityQuota actor (on the leader, behind its feature gate) and register it.
pub(crate) fn start(shared: &Arc<Shared>) {
    if shared.settings.capacity_quotas {
        shared.router.actors().start(Quotas::new(shared.clone()));
    }
}

super::registry::stoppable!(Quotas);

impl Actor for Quotas {
    type Context = Context<Self>;

    /// The feed runs on every replica from the start-up (`watches::start`), so the
    /// index is already full when this replica comes to lead: catch up at once. Nothing is
    /// cleared when the actor stops: it stops only with the whole controller (`Actors::stop`),
    /// whose feeds and provisioner stop with it, so no replica that no longer leads enforces
    /// quotas it can no longer see change.
    fn started(&mut self, ctx: &mut Self::Context) {
        self.catch_up();
        self.refresh(ctx);
        ctx.run_interval(STATUS_PERIOD, |act, ctx| act.refresh(ctx));
    }
}

impl Handler<QuotasChanged> for Quotas {
    type Result = ();
    fn handle(&mut self, _: QuotasChanged, ctx: &mut Self::Context) {
        self.catch_up();
        self.refresh(ctx);
    }
}
