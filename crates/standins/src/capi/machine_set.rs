//! The MachineSet controller: creates Machines up to its replicas, removes the surplus in
//! Cluster API's scale-down order, and propagates in-place changes to its Machines.

use super::Inner;
use super::MACHINE_FINALIZER;
use super::WRITES_IN_FLIGHT;
use super::controller_uid;
use super::dynamic;
use super::has_node_ref;
use super::ignore_not_found;
use super::is_available;
use super::machine_deployment::up_to_date;
use super::object;
use super::owner_ref;
use super::preflight;
use super::selector_string;
use super::set_replicas;
use super::string_map;
use crate::capi_version::CapiVersion;
use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{StreamExt, stream};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::rollout::{self, DISABLE_MACHINE_CREATE_ANNOTATION};
use crate::standin::{at, str_at};
use crate::wellknown::{
    CLUSTER_NAME_LABEL, DELETE_MACHINE_ANNOTATION, DEPLOYMENT_NAME_LABEL, SET_NAME_LABEL,
};

impl Inner {
    pub(super) async fn reconcile_set(&self, ns: &str, name: &str) -> Result<(), kube::Error> {
        let v = self.cfg.version;
        let sets_api = self.api(&v.machine_set(), ns);
        let machines_api = self.api(&v.machine(), ns);
        let by_label = ListParams::default().labels(&format!("{SET_NAME_LABEL}={name}"));
        let Some(ms) = sets_api.get_opt(name).await? else {
            for m in machines_api.list(&by_label).await?.items {
                ignore_not_found(
                    machines_api
                        .delete(&m.name_any(), &DeleteParams::default())
                        .await,
                )?;
            }
            return Ok(());
        };
        if ms.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        // Cluster API's pause (the Cluster's `spec.paused` or the set's own annotation): the
        // `Paused` condition says so and the set neither creates nor deletes a Machine until it
        // lifts.
        let Some(ms) = self.unless_paused(ns, &sets_api, ms, "MachineSet").await? else {
            return Ok(());
        };
        let ms_uid = ms.uid().unwrap_or_default();
        let machines: Vec<Arc<DynamicObject>> =
            Self::cached(&self.machines, ns, SET_NAME_LABEL, name)
                .into_iter()
                .filter(|m| controller_uid(m).as_deref() == Some(ms_uid.as_str()))
                .collect();
        // As Cluster API: Machines being deleted still count, so a deleted Machine is replaced
        // only once it is gone (and the set never has more than spec.replicas Machines).
        let replicas = set_replicas(&ms);
        let diff = machines.len() as i64 - replicas;
        let create_disabled = ms
            .annotations()
            .get(DISABLE_MACHINE_CREATE_ANNOTATION)
            .is_some_and(|v| v == "true");
        // Cluster API runs its preflight checks only when it would create Machines.
        let held = (diff < 0).then(|| preflight::failure(&ms)).flatten();
        if diff < 0 && create_disabled {
            tracing::debug!(
                ms = name,
                "machine creation disabled on this (old) MachineSet"
            );
        } else if let Some(why) = &held {
            tracing::debug!(ms = name, %why, "scale up on hold: a preflight check fails");
        } else if diff < 0 {
            let bodies = (0..diff.unsigned_abs())
                .map(|_| self.set_machine(&ms))
                .collect();
            self.create_machines(ns, &machines_api, bodies).await?;
        } else if diff > 0 {
            let order = DeletionOrder::of(&ms);
            self.delete_surplus(ns, &machines_api, &machines, diff as usize, name, order)
                .await?;
        }
        self.propagate_to_machines(&ms, &machines, &machines_api)
            .await?;

        // Status reports what was observed; our own creates and deletes trigger the next pass,
        // which reports the new count.
        let observed = machines.len() as i64;
        let ready = machines.iter().filter(|m| is_available(m)).count() as i64;
        let mut status = json!({
            "replicas": observed,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "selector": selector_string(&ms),
            "observedGeneration": ms.metadata.generation.unwrap_or(0),
        });
        match v {
            CapiVersion::V1Beta1 => status["fullyLabeledReplicas"] = json!(observed),
            CapiVersion::V1Beta2 => {
                let up_to_date = machines
                    .iter()
                    .filter(|m| up_to_date(&m.data, v) == Some(true))
                    .count();
                status["upToDateReplicas"] = json!(up_to_date)
            }
        }
        if preflight::switched(&ms) {
            for (k, v) in preflight::status_conditions(v, &ms, observed, replicas, held.as_deref())
            {
                status[k] = v;
            }
        }
        self.write_status_if_changed(&sets_api, &ms, status).await
    }

    /// In-place propagation from the MachineSet to its Machines, as Cluster API's MachineSet
    /// controller does: template labels and annotations (added or changed; the stand-in never
    /// removes a Machine label), and the deletion timeouts, minReadySeconds and readinessGates.
    async fn propagate_to_machines(
        &self,
        ms: &DynamicObject,
        machines: &[Arc<DynamicObject>],
        api: &Api<DynamicObject>,
    ) -> Result<(), kube::Error> {
        let template = at(&ms.data, &["spec", "template"]);
        let labels = string_map(template.and_then(|t| at(t, &["metadata", "labels"])));
        let annotations = string_map(template.and_then(|t| at(t, &["metadata", "annotations"])));
        let tspec = template.and_then(|t| t.get("spec"));
        for m in machines
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
        {
            let mut patch = json!({});
            let stale_labels: BTreeMap<&String, &String> = labels
                .iter()
                .filter(|(k, v)| m.labels().get(*k) != Some(*v))
                .collect();
            if !stale_labels.is_empty() {
                patch["metadata"]["labels"] = json!(stale_labels);
            }
            let stale_annotations: BTreeMap<&String, &String> = annotations
                .iter()
                .filter(|(k, v)| m.annotations().get(*k) != Some(*v))
                .collect();
            if !stale_annotations.is_empty() {
                patch["metadata"]["annotations"] = json!(stale_annotations);
            }
            for key in rollout::IN_PLACE_SPEC_FIELDS {
                if *key == "taints" {
                    continue;
                }
                let want = tspec.and_then(|s| s.get(*key)).unwrap_or(&Value::Null);
                let have = m
                    .data
                    .pointer(&format!("/spec/{key}"))
                    .unwrap_or(&Value::Null);
                if want != have {
                    patch["spec"][*key] = want.clone();
                }
            }
            if patch.as_object().is_some_and(|p| !p.is_empty()) {
                tracing::debug!(machine = %m.name_any(), "propagating in-place fields to Machine");
                ignore_not_found(
                    api.patch(
                        &m.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .map(|_| ()),
                )?;
            }
        }
        Ok(())
    }

    /// Creates `bodies` side by side and waits until the cache shows them, as Cluster API's
    /// MachineSet controller waits for its creates, so the next reconcile cannot count them
    /// missing and create them again.
    pub(super) async fn create_machines(
        &self,
        ns: &str,
        api: &Api<DynamicObject>,
        bodies: Vec<DynamicObject>,
    ) -> Result<(), kube::Error> {
        // Side by side: a real API server answers each create in milliseconds, so one at a
        // time through the simulated one would make Cluster API the slow part of a burst.
        let creates: Vec<_> = bodies
            .iter()
            .map(|body| async move {
                // A name clash with a random suffix fails this pass; the retry draws another.
                api.create(&PostParams::default(), body).await?;
                tracing::debug!(machine = %body.name_any(), "created Machine");
                Ok::<_, kube::Error>(body.name_any())
            })
            .collect();
        let results: Vec<Result<String, kube::Error>> = stream::iter(creates)
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect()
            .await;
        let (created, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
        let created: Vec<String> = created.into_iter().filter_map(Result::ok).collect();
        // Even when some failed, so the retry counts the ones that were made.
        let v = self.cfg.version;
        self.await_cached(&self.machines, &v.machine(), ns, &created)
            .await;
        match failed.into_iter().next() {
            Some(Err(err)) => Err(err),
            _ => Ok(()),
        }
    }

    /// Deletes `surplus` of `machines` in Cluster API's scale-down order ([`deletion_rank`]) and
    /// waits until the cache shows them deleting.
    pub(super) async fn delete_surplus(
        &self,
        ns: &str,
        api: &Api<DynamicObject>,
        machines: &[Arc<DynamicObject>],
        surplus: usize,
        owner: &str,
        order: DeletionOrder,
    ) -> Result<(), kube::Error> {
        let mut ranked: Vec<&DynamicObject> = machines.iter().map(|m| &**m).collect();
        ranked.sort_by_key(|m| deletion_rank(order, m));
        let mut deleted = Vec::new();
        for victim in ranked.iter().take(surplus) {
            if victim.metadata.deletion_timestamp.is_some() {
                continue;
            }
            tracing::info!(owner, machine = %victim.name_any(), "scaling down: deleting Machine");
            ignore_not_found(
                api.delete(&victim.name_any(), &DeleteParams::default())
                    .await,
            )?;
            deleted.push(victim.name_any());
        }
        let v = self.cfg.version;
        self.await_deleting_in_cache(&self.machines, &v.machine(), ns, &deleted)
            .await;
        Ok(())
    }

    /// A Machine of `ms` from its template, as Cluster API's MachineSet controller creates it.
    fn set_machine(&self, ms: &DynamicObject) -> DynamicObject {
        let v = self.cfg.version;
        let ms_name = ms.name_any();
        let name = format!("{ms_name}-{}", self.rng.suffix());
        let template = at(&ms.data, &["spec", "template"])
            .cloned()
            .unwrap_or(json!({}));
        let mut labels = string_map(at(&template, &["metadata", "labels"]));
        let cluster = str_at(&ms.data, &["spec", "clusterName"]).unwrap_or_default();
        labels.insert(SET_NAME_LABEL.into(), ms_name.clone());
        labels.insert(CLUSTER_NAME_LABEL.into(), cluster.to_string());
        if let Some(md) = ms.labels().get(DEPLOYMENT_NAME_LABEL) {
            labels.insert(DEPLOYMENT_NAME_LABEL.into(), md.clone());
        }
        let annotations = string_map(at(&template, &["metadata", "annotations"]));
        let mut spec = object(template.get("spec"));
        spec.insert("clusterName".into(), json!(cluster));
        // The infrastructure provider clones the template into a Machine-specific object.
        if let Some(infra) = spec
            .get_mut("infrastructureRef")
            .and_then(Value::as_object_mut)
        {
            if let Some(kind) = infra.get("kind").and_then(Value::as_str) {
                let kind = kind.strip_suffix("Template").unwrap_or(kind).to_string();
                infra.insert("kind".into(), json!(kind));
            }
            infra.insert("name".into(), json!(name));
        }
        dynamic(json!({
            "apiVersion": v.api_version(),
            "kind": "Machine",
            "metadata": {
                "name": name,
                "namespace": ms.namespace(),
                "labels": labels,
                "annotations": annotations,
                "finalizers": [MACHINE_FINALIZER],
                "ownerReferences": [owner_ref(v, "MachineSet", ms)],
            },
            "spec": spec,
        }))
    }
}

/// The order a MachineSet removes its healthy Machines in (`spec.deletion.order` in v1beta2,
/// `spec.deletePolicy` in v1beta1; Random when unset, as Cluster API defaults it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DeletionOrder {
    Random,
    Newest,
    Oldest,
}

impl DeletionOrder {
    pub(super) fn of(ms: &DynamicObject) -> Self {
        let order = str_at(&ms.data, &["spec", "deletion", "order"])
            .or_else(|| str_at(&ms.data, &["spec", "deletePolicy"]));
        match order {
            Some("Newest") => Self::Newest,
            Some("Oldest") => Self::Oldest,
            _ => Self::Random,
        }
    }
}

/// Scale-down order inside one MachineSet, as Cluster API's MachineSet controller sorts: Machines
/// already being deleted (they count until gone), then those marked with the delete-machine
/// annotation, then unhealthy ones (no Node yet, a failure, `NodeHealthy` or
/// `HealthCheckSucceeded` False), then the healthy ones by the set's order; equal ranks by
/// name. Random is no shuffle: equal priorities fall to the name, so with Cluster API's random
/// name suffixes an unmarked Machine's turn has nothing to do with its age.
pub(super) fn deletion_rank(order: DeletionOrder, m: &DynamicObject) -> (u8, i64, String) {
    let rank = if m.metadata.deletion_timestamp.is_some() {
        0
    } else if m.annotations().contains_key(DELETE_MACHINE_ANNOTATION) {
        1
    } else if !healthy(m) {
        2
    } else {
        3
    };
    let created = m
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    let age = match (rank, order) {
        (3, DeletionOrder::Oldest) => created,
        (3, DeletionOrder::Newest) => -created,
        _ => 0,
    };
    (rank, age, m.name_any())
}

/// Cluster API's `isMachineHealthy`, on the conditions its own version reads (`status.conditions`).
fn healthy(m: &DynamicObject) -> bool {
    let failed = ["failureReason", "failureMessage"]
        .iter()
        .any(|f| at(&m.data, &["status", f]).is_some_and(|v| !v.is_null()));
    let condition_false = |kind: &str| {
        at(&m.data, &["status", "conditions"])
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| {
                c.get("type").and_then(Value::as_str) == Some(kind)
                    && c.get("status").and_then(Value::as_str) == Some("False")
            })
    };
    has_node_ref(m)
        && !failed
        && !condition_false("NodeHealthy")
        && !condition_false("HealthCheckSucceeded")
}

#[cfg(test)]
mod tests {
    use super::super::tests::machine;
    use super::*;

    #[test]
    fn scale_down_takes_annotated_then_unhealthy_then_the_sets_order() {
        let machines = || {
            let mut unhealthy = machine("b-unhealthy", "2026-01-02T00:00:00Z", false, true);
            unhealthy.data["status"]["conditions"] =
                json!([{"type": "NodeHealthy", "status": "False"}]);
            [
                machine("d-old-running", "2026-01-01T00:00:00Z", false, true),
                machine("a-new-running", "2026-01-03T00:00:00Z", false, true),
                machine("c-provisioning", "2026-01-04T00:00:00Z", false, false),
                unhealthy,
                machine("z-marked", "2026-01-05T00:00:00Z", true, true),
            ]
        };
        let order = |o: DeletionOrder| {
            let mut ms = machines();
            ms.sort_by_key(|m| deletion_rank(o, m));
            ms.iter().map(|m| m.name_any()).collect::<Vec<_>>()
        };
        let first = ["z-marked", "b-unhealthy", "c-provisioning"];
        let then =
            |rest: [&'static str; 2]| -> Vec<&'static str> { [&first[..], &rest[..]].concat() };
        // Random sorts equal priorities by name: no preference for age.
        assert_eq!(
            order(DeletionOrder::Random),
            then(["a-new-running", "d-old-running"])
        );
        assert_eq!(
            order(DeletionOrder::Oldest),
            then(["d-old-running", "a-new-running"])
        );
        assert_eq!(
            order(DeletionOrder::Newest),
            then(["a-new-running", "d-old-running"])
        );
        let set = |spec: Value| dynamic(json!({"metadata": {"name": "s"}, "spec": spec}));
        assert_eq!(DeletionOrder::of(&set(json!({}))), DeletionOrder::Random);
        assert_eq!(
            DeletionOrder::of(&set(json!({"deletion": {"order": "Oldest"}}))),
            DeletionOrder::Oldest
        );
        assert_eq!(
            DeletionOrder::of(&set(json!({"deletePolicy": "Newest"}))),
            DeletionOrder::Newest
        );
    }
}
