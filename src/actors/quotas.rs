//! The CapacityQuota actor (leader only, with `--feature-gates CapacityQuota=true`): watches the
//! quotas into `state.quotas`, where every solve reads them, and writes each quota's status as
//! upstream's controller does: `used` (what the nodes it selects use, for each resource its
//! limits name), `observedGeneration` and the `Reconciled` condition. A quota that cannot be
//! enforced (a limit that is not a whole non-negative quantity, a bad selector) is left out of
//! provisioning and says why in `Reconciled` (False, `ReconciliationFailed`, naming the field)
//! and in one Warning Event.
//!
//! Usage changes with every Node and claim, so the status is recomputed from the indexes on a
//! short period (no API read) and written only when it changes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Shared;
use crate::api::capacity_quota::{
    CapacityQuota, CapacityQuotaStatus, CapacityQuotaUsage, RECONCILED, RECONCILIATION_FAILED,
    RECONCILIATION_SUCCEEDED,
};
use crate::api::conditions::{self, ConditionStatus};
use crate::api::decode::Lenient;
use crate::metrics::QuotaLabels;
use crate::scheduling::quota::QuotaInput;
use crate::view::quotas::count;

/// How often the status is recomputed from the indexes.
const STATUS_PERIOD: Duration = Duration::from_secs(2);

struct Watched(Result<watcher::Event<Lenient<CapacityQuota>>, watcher::Error>);

impl Message for Watched {
    type Result = ();
}

pub(crate) struct Quotas {
    shared: Arc<Shared>,
    /// The status last written per quota, so an unchanged one is not written again before the
    /// watch shows it.
    written: HashMap<String, CapacityQuotaStatus>,
    /// The last problem told in an Event, per quota (one Event per new problem).
    reported: HashMap<String, String>,
    /// The quotas a (re-)list has shown so far; at its end the others are gone.
    listed: Option<HashSet<String>>,
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
            listed: None,
            series: HashMap::new(),
        }
    }

    fn changed(&self) {
        self.shared.router.provisioner_poke();
    }

    fn forget(&mut self, name: &str) {
        if self.shared.state.quotas.write().remove(name).is_some() {
            self.changed();
        }
        self.written.remove(name);
        self.publish(name, None);
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

    fn event(&mut self, ev: Result<watcher::Event<Lenient<CapacityQuota>>, watcher::Error>) {
        match ev {
            Ok(watcher::Event::Apply(Lenient::Ok(q)))
            | Ok(watcher::Event::InitApply(Lenient::Ok(q))) => {
                let name = q.name_any();
                if let Some(listed) = self.listed.as_mut() {
                    listed.insert(name.clone());
                }
                let spec_changed = self
                    .shared
                    .state
                    .quotas
                    .read()
                    .get(&name)
                    .is_none_or(|old| old.spec != q.spec);
                self.shared.state.quotas.write().insert(name, Arc::new(q));
                if spec_changed {
                    self.changed();
                }
            }
            Ok(watcher::Event::Apply(Lenient::Bad(m)))
            | Ok(watcher::Event::InitApply(Lenient::Bad(m))) => {
                // The API server's schema keeps most of these out; one that slips through
                // caps nothing and is named once.
                let bad = Lenient::<CapacityQuota>::Bad(m.clone());
                let name = bad.meta().name.clone().unwrap_or_default();
                if let Some(listed) = self.listed.as_mut() {
                    listed.insert(name.clone());
                }
                self.forget(&name);
                let message = m.message();
                if self.reported.get(&name) != Some(&message) {
                    self.shared.events.warning(
                        m.object_ref::<CapacityQuota>(),
                        RECONCILIATION_FAILED,
                        format!("CapacityQuota {name}: {message}"),
                    );
                    self.reported.insert(name, message);
                }
            }
            Ok(watcher::Event::Delete(q)) => {
                let name = q.meta().name.clone().unwrap_or_default();
                self.reported.remove(&name);
                self.forget(&name);
            }
            Ok(watcher::Event::Init) => self.listed = Some(HashSet::new()),
            Ok(watcher::Event::InitDone) => {
                // Quotas deleted while the watch was down.
                let listed = self.listed.take().unwrap_or_default();
                let gone: Vec<String> = (self.shared.state.quotas.read().keys())
                    .filter(|k| !listed.contains(*k))
                    .cloned()
                    .collect();
                for name in gone {
                    self.forget(&name);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, watch = "CapacityQuotas", "watch failed; it will re-list");
            }
        }
    }
}

impl Actor for Quotas {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        use futures::StreamExt;
        let api: Api<Lenient<CapacityQuota>> = Api::all(self.shared.workload.clone());
        ctx.add_stream(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .map(Watched),
        );
        ctx.run_interval(STATUS_PERIOD, |act, ctx| act.refresh(ctx));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        // A replica that no longer leads enforces nothing it can no longer see change.
        self.shared.state.quotas.write().clear();
    }
}

impl StreamHandler<Watched> for Quotas {
    fn handle(&mut self, ev: Watched, ctx: &mut Self::Context) {
        self.event(ev.0);
        self.refresh(ctx);
    }
}
