//! Pod deletion cost management (`--feature-gates PodDeletionCostManagement=true`; alpha and off
//! by default, as upstream): once a period (upstream's minute) the managed nodes are ranked in
//! the order disruption would remove them and the pods on them get their
//! `controller.kubernetes.io/pod-deletion-cost`, so a scale-in empties those nodes first. The
//! rules are in `view::deletion_cost`; this actor reads the indexes, sends the writes and
//! remembers what it wrote, which is how a value someone else changed is told apart. Leader
//! only. A timer, not a watch: upstream re-ranks on its schedule, and a pass that finds every
//! pod as ranked writes nothing.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Shared;
use super::patch::{JsonPatch, escape};
use crate::api::wellknown::{MANAGED_DELETION_COST_ANNOTATION, POD_DELETION_COST_ANNOTATION};
use crate::metrics::ResultLabels;
use crate::state::pods::key;
use crate::view::deletion_cost::{self, Action, Write};
use crate::view::disruption as view;

/// Writes in flight at once (a first ranking may touch hundreds of pods).
const CONCURRENT_WRITES: usize = 8;
const ANNOTATIONS: &str = "/metadata/annotations";
/// Upstream's Event reason when a managed value was changed by someone else.
pub(crate) const CONFLICT_REASON: &str = "PodDeletionCostThirdPartyConflict";

pub(crate) struct DeletionCost {
    shared: Arc<Shared>,
    period: Duration,
    /// Per pod key, the deletion cost this controller last wrote there.
    written: HashMap<String, String>,
    /// A pass's writes are still being sent: the next pass waits for them.
    writing: bool,
}

impl DeletionCost {
    pub(crate) fn new(shared: Arc<Shared>, period: Duration) -> Self {
        Self {
            shared,
            period,
            written: HashMap::new(),
            writing: false,
        }
    }

    /// Rank, plan and send the writes the pods need.
    fn pass(&mut self, ctx: &mut Context<Self>) {
        if !self.shared.router.is_active() || self.writing {
            return;
        }
        let writes = self.plan();
        if writes.is_empty() {
            return;
        }
        self.writing = true;
        let shared = self.shared.clone();
        ctx.spawn(
            async move {
                stream::iter(writes)
                    .map(|w| {
                        let shared = shared.clone();
                        async move {
                            let sent = send(&shared, &w).await;
                            (w, sent)
                        }
                    })
                    .buffer_unordered(CONCURRENT_WRITES)
                    .collect::<Vec<_>>()
                    .await
            }
            .into_actor(self)
            .map(|results, act, _| {
                act.writing = false;
                for (w, sent) in results {
                    act.sent(w, sent);
                }
            }),
        );
    }

    /// The writes the pods need now, from the disruption view read once off the indexes.
    fn plan(&mut self) -> Vec<Write> {
        let inputs = self.shared.view();
        let pdbs = self.shared.state.pdbs.read().all().clone();
        let none = HashSet::new();
        let view = view::gather(
            inputs,
            &view::Memory {
                pdbs: &pdbs,
                pod_events: &HashMap::new(),
                // Only the recorded lastPodEventTime is known here (as for `explain`).
                started: jiff::Timestamp::UNIX_EPOCH,
                executing: &none,
                nominated: &none,
                now: jiff::Timestamp::now(),
                keep_held: false,
            },
        );
        let ranking = deletion_cost::rank(inputs, &view);
        self.shared
            .metrics
            .pod_deletion_cost_nodes_ranked
            .inc_by(ranking.len() as u64);
        let pods = self.shared.state.pods.read();
        self.written.retain(|k, _| pods.contains(k));
        deletion_cost::plan(&ranking, &pods, &self.written)
    }

    /// Remember what a write left on the pod, and say what happened.
    fn sent(&mut self, w: Write, sent: Result<(), super::Error>) {
        let pod = key(&w.pod);
        let result = if sent.is_ok() { "success" } else { "error" };
        self.shared
            .metrics
            .pod_deletion_cost_pods_updated
            .get_or_create(&ResultLabels {
                result: result.to_string(),
            })
            .inc();
        if let Err(e) = sent {
            // The pod changed under the write (or is gone): the next pass plans from what it is.
            tracing::debug!(pod = %pod, error = %e, "writing a pod deletion cost failed");
            return;
        }
        match w.action {
            Action::Set(cost) => {
                self.written.insert(pod, cost.to_string());
            }
            Action::Clear => {
                self.written.remove(&pod);
            }
            Action::Release => {
                self.written.remove(&pod);
                self.conflict(&w.pod);
            }
        }
    }

    fn conflict(&self, pod: &Pod) {
        let now = pod.annotations().get(POD_DELETION_COST_ANNOTATION);
        tracing::warn!(pod = %key(pod), value = ?now, "pod deletion cost changed by another writer; no longer managed");
        self.shared.events.warning(
            pod.object_ref(&()),
            CONFLICT_REASON,
            format!(
                "{POD_DELETION_COST_ANNOTATION} was changed by another writer (now {}); Karpenter stops managing it and removed {MANAGED_DELETION_COST_ANNOTATION}",
                now.map_or("unset", String::as_str)
            ),
        );
    }
}

/// Send one write, guarded on the annotations it was planned from, so a concurrent change by
/// the pod's owner is never overwritten (the write fails and the next pass sees the change).
async fn send(shared: &Shared, w: &Write) -> Result<(), super::Error> {
    let name = w.pod.name_any();
    let patch = guarded(&w.pod, &w.action)
        .into_patch()
        .map_err(|source| super::Error::Patch {
            kind: "Pod",
            name: name.clone(),
            source,
        })?;
    let api: Api<Pod> = Api::namespaced(
        shared.workload.clone(),
        &w.pod.namespace().unwrap_or_default(),
    );
    api.patch(&name, &PatchParams::default(), &patch)
        .await
        .map(|_| ())
        .map_err(super::api_err(&shared.metrics, "patch", "pods", &name))
}

/// The JSON patch of `action` on `pod`: the annotations it changes tested first at the values
/// read (an absent one through the resourceVersion, as a patch cannot test for absence).
pub(crate) fn guarded(pod: &Pod, action: &Action) -> JsonPatch {
    let annotations = pod.annotations();
    let current = annotations.get(POD_DELETION_COST_ANNOTATION);
    let marked = annotations.contains_key(MANAGED_DELETION_COST_ANNOTATION);
    let mut p = if current.is_none() || !marked {
        JsonPatch::guarded(pod.resource_version().as_deref())
    } else {
        JsonPatch::new()
    };
    let cost_path = format!("{ANNOTATIONS}/{}", escape(POD_DELETION_COST_ANNOTATION));
    let mark_path = format!("{ANNOTATIONS}/{}", escape(MANAGED_DELETION_COST_ANNOTATION));
    if let Some(v) = current {
        p.test(&cost_path, json!(v));
    }
    if marked {
        p.test(&mark_path, json!("true"));
    }
    match action {
        Action::Set(cost) => {
            let exists = !annotations.is_empty();
            p.set_entry(
                exists,
                ANNOTATIONS,
                POD_DELETION_COST_ANNOTATION,
                &cost.to_string(),
            );
            p.set_entry(
                exists,
                ANNOTATIONS,
                MANAGED_DELETION_COST_ANNOTATION,
                "true",
            );
        }
        Action::Clear => {
            if current.is_some() {
                p.remove(&cost_path);
            }
            p.remove(&mark_path);
        }
        Action::Release => {
            p.remove(&mark_path);
        }
    }
    p
}

/// Start the pod deletion cost actor (on the leader, behind its feature gate) and register it.
pub(crate) fn start(shared: &Arc<Shared>) {
    if let Some(period) = shared.settings.pod_deletion_cost {
        shared
            .router
            .actors()
            .start(DeletionCost::new(shared.clone(), period));
    }
}

super::registry::stoppable!(DeletionCost);

impl Actor for DeletionCost {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.period, |act, ctx| act.pass(ctx));
    }
}

#[cfg(test)]
mod tests;
