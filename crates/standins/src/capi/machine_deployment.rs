//! The MachineDeployment controller: one MachineSet per template revision, scaled and rolled
//! out as `rollout` plans, in-place propagation of the fields Cluster API propagates, and the
//! MachineDeployment's status.

use super::Inner;
use super::TEMPLATE_HASH_LABEL;
use super::WRITES_IN_FLIGHT;
use super::conditions::condition;
use super::conditions::now_rfc3339;
use super::conditions::set_condition;
use super::controller_uid;
use super::dynamic;
use super::ignore_not_found;
use super::is_available;
use super::object;
use super::owner_ref;
use super::selector_string;
use super::set_annotation;
use super::set_replicas;
use super::string_map;
use crate::capi_version::CapiVersion;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::rollout::{
    self, DISABLE_MACHINE_CREATE_ANNOTATION, SetCounts, StrategyType, UP_TO_DATE_CONDITION,
};
use crate::standin::{at, is_conflict, is_not_found, str_at};
use crate::wellknown::{CLUSTER_NAME_LABEL, DEPLOYMENT_NAME_LABEL, MIN_SIZE_ANNOTATION};

impl Inner {
    pub(super) async fn reconcile_deployment(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<(), kube::Error> {
        let v = self.cfg.version;
        let mds = self.api(&v.machine_deployment(), ns);
        let sets_api = self.api(&v.machine_set(), ns);
        let by_label = ListParams::default().labels(&format!("{DEPLOYMENT_NAME_LABEL}={name}"));
        let Some(md) = mds.get_opt(name).await? else {
            // Garbage-collect what the deleted MachineDeployment owned.
            for ms in sets_api.list(&by_label).await?.items {
                ignore_not_found(
                    sets_api
                        .delete(&ms.name_any(), &DeleteParams::default())
                        .await,
                )?;
            }
            return Ok(());
        };
        // Cluster API's pause (the Cluster's `spec.paused` or the MachineDeployment's
        // `cluster.x-k8s.io/paused` annotation): the `Paused` condition says so and nothing else
        // happens (no MachineSet scaled, no status written) until it lifts.
        let Some(md) = self
            .unless_paused(ns, &mds, md, "MachineDeployment")
            .await?
        else {
            return Ok(());
        };
        let md_uid = md.uid().unwrap_or_default();
        let mut sets: Vec<DynamicObject> =
            Self::cached(&self.sets, ns, DEPLOYMENT_NAME_LABEL, name)
                .into_iter()
                .map(|ms| DynamicObject::clone(&ms))
                .filter(|ms| controller_uid(ms).as_deref() == Some(md_uid.as_str()))
                .filter(|ms| ms.metadata.deletion_timestamp.is_none())
                .collect();
        sets.sort_by_key(|ms| {
            (
                ms.metadata.creation_timestamp.clone().map(|t| t.0),
                ms.name_any(),
            )
        });
        let machines = Self::cached(&self.machines, ns, DEPLOYMENT_NAME_LABEL, name);

        let replicas = desired_md_replicas(&md);
        let empty = json!({});
        let md_spec = md.data.get("spec").unwrap_or(&empty);
        let md_template = md_spec.get("template");
        let strategy = match rollout::strategy(md_spec, v) {
            Ok(s) => s,
            Err(err) => {
                // Cluster API refuses to reconcile such a MachineDeployment (its webhook would
                // have refused it first); nothing moves until the spec is fixed.
                tracing::warn!(md = name, error = %err, "cluster api stand-in: invalid rollout strategy");
                return Ok(());
            }
        };
        let paused = md_spec.get("paused").and_then(Value::as_bool) == Some(true);
        let new_idx = sets.iter().position(|ms| {
            rollout::same_rollout_fields(at(&ms.data, &["spec", "template"]), md_template)
        });

        let Some(new_idx) = new_idx else {
            // Cluster API creates no MachineSet for a paused MachineDeployment.
            if !paused {
                let olds: Vec<SetCounts> =
                    sets.iter().map(|ms| set_counts(ms, &machines)).collect();
                let initial = rollout::initial_new_set_replicas(replicas, &strategy, &olds);
                let ms = self.new_machine_set(&md, initial);
                let ms = sets_api.create(&PostParams::default(), &ms).await?;
                tracing::info!(md = name, ms = %ms.name_any(), replicas = initial, old_sets = sets.len(), "created MachineSet");
                self.await_cached(&self.sets, &v.machine_set(), ns, &[ms.name_any()])
                    .await;
                // The create's watch event brings us back with the new set in the list.
            }
            return self
                .write_md_status(&mds, &md, &sets, None, &machines)
                .await;
        };

        // In-place propagation: the up-to-date set follows every in-place field; old sets only
        // learn whether they may still create Machines.
        let on_delete = strategy.kind == StrategyType::OnDelete;
        for (i, ms) in sets.iter_mut().enumerate() {
            let desired = if i == new_idx {
                self.in_place_update(&md, ms)
            } else {
                let mut d = ms.clone();
                set_annotation(
                    &mut d,
                    DISABLE_MACHINE_CREATE_ANNOTATION,
                    on_delete.to_string(),
                );
                d
            };
            if desired.metadata.annotations != ms.metadata.annotations
                || desired.metadata.labels != ms.metadata.labels
                || desired.data.get("spec") != ms.data.get("spec")
            {
                *ms = sets_api
                    .replace(&ms.name_any(), &PostParams::default(), &desired)
                    .await?;
            }
        }

        if !paused {
            let new_counts = set_counts(&sets[new_idx], &machines);
            let old_counts: Vec<SetCounts> = sets
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != new_idx)
                .map(|(_, ms)| set_counts(ms, &machines))
                .collect();
            let intents = match strategy.kind {
                StrategyType::RollingUpdate => {
                    rollout::plan_rolling_update(replicas, &strategy, &new_counts, &old_counts)
                }
                StrategyType::OnDelete => {
                    rollout::plan_on_delete(replicas, &strategy, &new_counts, &old_counts)
                }
            };
            for ms in sets.iter_mut() {
                if let Some(n) = intents.get(&ms.name_any()) {
                    tracing::info!(md = name, ms = %ms.name_any(), replicas = n, "scaling MachineSet");
                    match self.scale_set(&sets_api, ms, *n).await {
                        Ok(scaled) => *ms = scaled,
                        Err(err) if is_conflict(&err) => {
                            // Planned from a cached MachineSet the server has moved past: wait
                            // for the cache to catch up and plan again, as a conflict requeues
                            // in controller-runtime, rather than act on the stale view.
                            tracing::debug!(md = name, ms = %ms.name_any(), "MachineSet changed since cached: planning again");
                            let stale = ms.resource_version().unwrap_or_default();
                            self.await_cache_past(
                                &self.sets,
                                &v.machine_set(),
                                ns,
                                &ms.name_any(),
                                &stale,
                            )
                            .await;
                            self.queue.push(super::Work::Deployment {
                                ns: ns.to_string(),
                                name: name.to_string(),
                            });
                            return Ok(());
                        }
                        Err(err) => return Err(err),
                    }
                }
            }
        }

        self.sync_up_to_date(ns, &sets[new_idx], &sets, &machines)
            .await?;
        self.write_md_status(&mds, &md, &sets, Some(new_idx), &machines)
            .await?;
        self.cleanup_old_sets(&sets_api, &md, &sets, new_idx, &machines)
            .await
    }

    /// Sets `ms`'s `spec.replicas` to `replicas`, on condition that the server still holds the
    /// version of `ms` the decision was made from (its cached resourceVersion): a reconcile
    /// working from a stale cache gets a 409 Conflict instead of undoing a newer write.
    pub(super) async fn scale_set(
        &self,
        api: &Api<DynamicObject>,
        ms: &DynamicObject,
        replicas: i64,
    ) -> Result<DynamicObject, kube::Error> {
        let mut patch = json!({"spec": {"replicas": replicas}});
        if let Some(rv) = ms.resource_version() {
            patch["metadata"] = json!({"resourceVersion": rv});
        }
        api.patch(
            &ms.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    }

    /// The up-to-date MachineSet with the MachineDeployment's in-place fields: labels, template
    /// metadata, annotations, deletion order, and the template fields that need no new Machines.
    fn in_place_update(&self, md: &DynamicObject, ms: &DynamicObject) -> DynamicObject {
        let v = self.cfg.version;
        let mut d = ms.clone();
        let hash = ms
            .labels()
            .get(TEMPLATE_HASH_LABEL)
            .cloned()
            .unwrap_or_default();
        let labels = self.set_labels(md, &hash);
        d.metadata.labels = Some(labels.clone());
        let mut annotations = md_annotations_for_set(md);
        for (k, val) in ms.annotations() {
            // Keep what others (e.g. the autoscaler or the controller) put on the set.
            annotations.entry(k.clone()).or_insert_with(|| val.clone());
        }
        annotations.insert(DISABLE_MACHINE_CREATE_ANNOTATION.into(), "false".into());
        d.metadata.annotations = Some(annotations);
        let md_spec = md.data.get("spec").cloned().unwrap_or(json!({}));
        let md_template = md_spec.get("template").cloned().unwrap_or(json!({}));
        let spec = d.data["spec"].as_object_mut();
        let Some(spec) = spec else { return d };
        let template = spec.entry("template").or_insert_with(|| json!({}));
        template["metadata"] = json!({
            "labels": labels,
            "annotations": object(md_template.pointer("/metadata/annotations")),
        });
        let tspec = template
            .as_object_mut()
            .map(|t| t.entry("spec").or_insert_with(|| json!({})));
        if let Some(Value::Object(tspec)) = tspec {
            for key in rollout::IN_PLACE_SPEC_FIELDS {
                match md_template.pointer(&format!("/spec/{key}")) {
                    Some(val) => tspec.insert((*key).to_string(), val.clone()),
                    None => tspec.remove(*key),
                };
            }
        }
        match v {
            CapiVersion::V1Beta1 => {
                copy_or_remove(spec, "minReadySeconds", md_spec.get("minReadySeconds"));
                copy_or_remove(
                    spec,
                    "deletePolicy",
                    md_spec.pointer("/strategy/rollingUpdate/deletePolicy"),
                );
            }
            CapiVersion::V1Beta2 => {
                let order = md_spec.pointer("/deletion/order").cloned();
                match order {
                    Some(o) => {
                        spec.insert("deletion".into(), json!({"order": o}));
                    }
                    None => {
                        spec.remove("deletion");
                    }
                }
            }
        }
        d
    }

    /// Labels of a MachineSet (and of its template): the MachineDeployment template's labels,
    /// its template hash and the deployment and cluster names.
    fn set_labels(&self, md: &DynamicObject, hash: &str) -> BTreeMap<String, String> {
        let cluster = str_at(&md.data, &["spec", "clusterName"]).unwrap_or_default();
        let mut labels = string_map(at(&md.data, &["spec", "template", "metadata", "labels"]));
        labels.insert(TEMPLATE_HASH_LABEL.into(), hash.to_string());
        labels.insert(DEPLOYMENT_NAME_LABEL.into(), md.name_any());
        labels.insert(CLUSTER_NAME_LABEL.into(), cluster.to_string());
        labels
    }

    /// The Machine `UpToDate` condition: True on Machines of the up-to-date MachineSet, False on
    /// the others. Written only when it changes, with the resourceVersion as precondition.
    /// Cluster API's Machine controller sets it in each Machine's own reconcile, while the new
    /// MachineSet already creates fresh Machines: each write here waits a random part of the
    /// provider jitter first, so the marks land one by one among those creates, not at once.
    async fn sync_up_to_date(
        &self,
        ns: &str,
        new_set: &DynamicObject,
        sets: &[DynamicObject],
        machines: &[Arc<DynamicObject>],
    ) -> Result<(), kube::Error> {
        let api = self.api(&self.cfg.version.machine(), ns);
        let new_uid = new_set.uid().unwrap_or_default();
        let owned: HashSet<String> = sets.iter().filter_map(|s| s.uid()).collect();
        let writes: Vec<_> = machines
            .iter()
            .filter_map(|m| {
                let owner = controller_uid(m)?;
                if m.metadata.deletion_timestamp.is_some() || !owned.contains(&owner) {
                    return None;
                }
                let want = owner == new_uid;
                (up_to_date(&m.data, self.cfg.version) != Some(want)).then(|| {
                    let after = self.rng.delay(Duration::ZERO, self.cfg.jitter);
                    let (api, name) = (&api, m.name_any());
                    async move {
                        if !self.shutdown.sleep(after).await {
                            return Ok(());
                        }
                        self.write_up_to_date(api, name, want).await
                    }
                })
            })
            .collect();
        stream::iter(writes)
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    /// One Machine's `UpToDate` condition, read-modify-write, retried on a conflict.
    async fn write_up_to_date(
        &self,
        api: &Api<DynamicObject>,
        name: String,
        want: bool,
    ) -> Result<(), kube::Error> {
        for attempt in 0..3 {
            let Some(mut fresh) = api.get_opt(&name).await? else {
                break;
            };
            if fresh.metadata.deletion_timestamp.is_some() {
                break;
            }
            set_up_to_date(&mut fresh, self.cfg.version, want);
            match api
                .replace_status(&name, &PostParams::default(), &fresh)
                .await
            {
                Ok(_) => break,
                Err(err) if is_not_found(&err) => break,
                Err(err) if is_conflict(&err) && attempt < 2 => continue,
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// MachineDeployment status from its MachineSets' Machines (Cluster API sums the sets'
    /// status, which counts the same Machines).
    async fn write_md_status(
        &self,
        mds: &Api<DynamicObject>,
        md: &DynamicObject,
        sets: &[DynamicObject],
        new_idx: Option<usize>,
        machines: &[Arc<DynamicObject>],
    ) -> Result<(), kube::Error> {
        let v = self.cfg.version;
        let replicas = desired_md_replicas(md);
        let counts: Vec<SetCounts> = sets.iter().map(|ms| set_counts(ms, machines)).collect();
        let actual: i64 = counts.iter().map(|c| c.actual).sum();
        let available: i64 = counts.iter().map(|c| c.available).sum();
        let total_spec: i64 = counts.iter().map(|c| c.spec).sum();
        let updated = new_idx.map_or(0, |i| counts[i].actual);
        let phase = if total_spec < available {
            "ScalingDown"
        } else if replicas > available {
            "ScalingUp"
        } else {
            "Running"
        };
        let mut status = json!({
            "replicas": actual,
            "readyReplicas": available,
            "availableReplicas": available,
            "selector": selector_string(md),
            "phase": phase,
            "observedGeneration": md.metadata.generation.unwrap_or(0),
        });
        match v {
            CapiVersion::V1Beta1 => {
                status["updatedReplicas"] = json!(updated);
                status["unavailableReplicas"] = json!((total_spec - available).max(0));
            }
            CapiVersion::V1Beta2 => status["upToDateReplicas"] = json!(updated),
        }
        self.write_status_if_changed(mds, md, status).await
    }

    /// Once a rollout is complete, old MachineSets without replicas or Machines go: all of them
    /// in v1beta2, all but the newest `spec.revisionHistoryLimit` (default 1) in v1beta1.
    async fn cleanup_old_sets(
        &self,
        sets_api: &Api<DynamicObject>,
        md: &DynamicObject,
        sets: &[DynamicObject],
        new_idx: usize,
        machines: &[Arc<DynamicObject>],
    ) -> Result<(), kube::Error> {
        let replicas = desired_md_replicas(md);
        let new = set_counts(&sets[new_idx], machines);
        let total_actual: i64 = sets.iter().map(|ms| set_counts(ms, machines).actual).sum();
        if new.actual != replicas || new.available != replicas || total_actual != replicas {
            return Ok(());
        }
        let olds: Vec<&DynamicObject> = sets
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != new_idx)
            .map(|(_, ms)| ms)
            .collect();
        let keep = match self.cfg.version {
            CapiVersion::V1Beta1 => at(&md.data, &["spec", "revisionHistoryLimit"])
                .and_then(Value::as_i64)
                .unwrap_or(1)
                .max(0) as usize,
            CapiVersion::V1Beta2 => 0,
        };
        let excess = olds.len().saturating_sub(keep);
        for ms in olds.into_iter().take(excess) {
            let c = set_counts(ms, machines);
            if c.spec == 0 && c.actual == 0 {
                tracing::info!(ms = %ms.name_any(), "deleting old MachineSet after rollout");
                ignore_not_found(
                    sets_api
                        .delete(&ms.name_any(), &DeleteParams::default())
                        .await,
                )?;
            }
        }
        Ok(())
    }

    fn new_machine_set(&self, md: &DynamicObject, replicas: i64) -> DynamicObject {
        let v = self.cfg.version;
        let md_name = md.name_any();
        let suffix = self.rng.suffix();
        let name = format!("{md_name}-{suffix}");
        let cluster = str_at(&md.data, &["spec", "clusterName"]).unwrap_or_default();
        let source = at(&md.data, &["spec", "template"]);
        // As Cluster API: the hash of the rollout fields, then the name's random suffix, so
        // two sets of one template still differ.
        let hash = format!("{}-{suffix}", rollout::template_hash(source));
        let template_labels = self.set_labels(md, &hash);
        // Rebuilt field by field: a malformed template (not an object) must not panic us.
        let mut metadata = object(source.and_then(|t| t.get("metadata")));
        metadata.insert("labels".into(), json!(template_labels));
        let template = json!({
            "metadata": metadata,
            "spec": object(source.and_then(|t| t.get("spec"))),
        });

        let mut match_labels = string_map(at(&md.data, &["spec", "selector", "matchLabels"]));
        match_labels.insert(TEMPLATE_HASH_LABEL.into(), hash);
        // The MachineSet inherits the MD's annotations (scale-from-zero ones included), as
        // Cluster API does, so readers may look at either object.
        let mut annotations = md_annotations_for_set(md);
        annotations.insert(DISABLE_MACHINE_CREATE_ANNOTATION.into(), "false".into());
        let body = json!({
            "apiVersion": v.api_version(),
            "kind": "MachineSet",
            "metadata": {
                "name": name,
                "namespace": md.namespace(),
                "labels": template_labels,
                "annotations": annotations,
                "ownerReferences": [owner_ref(v, "MachineDeployment", md)],
            },
            "spec": {
                "clusterName": cluster,
                "replicas": replicas,
                "selector": {"matchLabels": match_labels},
                "template": template,
            },
        });
        let mut ms = dynamic(body);
        // The in-place fields (deletion order, minReadySeconds...) as an update would set them.
        ms = self.in_place_update(md, &ms);
        ms
    }
}

/// A MachineSet's replicas and Machines as the rollout planner counts them.
fn set_counts(ms: &DynamicObject, machines: &[Arc<DynamicObject>]) -> SetCounts {
    let uid = ms.uid().unwrap_or_default();
    let mine = machines
        .iter()
        .filter(|m| controller_uid(m).as_deref() == Some(uid.as_str()));
    let (mut actual, mut available) = (0, 0);
    for m in mine {
        actual += 1;
        if is_available(m) {
            available += 1;
        }
    }
    SetCounts {
        name: ms.name_any(),
        spec: set_replicas(ms),
        actual,
        reported: at(&ms.data, &["status", "replicas"])
            .and_then(Value::as_i64)
            .unwrap_or(0),
        available,
    }
}

/// The MachineDeployment's annotations a MachineSet carries.
fn md_annotations_for_set(md: &DynamicObject) -> BTreeMap<String, String> {
    md.annotations()
        .iter()
        .filter(|(k, _)| !k.starts_with("kubectl.kubernetes.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn copy_or_remove(target: &mut serde_json::Map<String, Value>, key: &str, from: Option<&Value>) {
    match from {
        Some(v) if !v.is_null() => {
            target.insert(key.to_string(), v.clone());
        }
        _ => {
            target.remove(key);
        }
    }
}

/// The Machine's UpToDate condition status, when it has one.
pub fn up_to_date(machine: &Value, v: CapiVersion) -> Option<bool> {
    condition(machine, v, UP_TO_DATE_CONDITION)
        .and_then(|c| c.get("status").and_then(Value::as_str))
        .map(|s| s == "True")
}

fn set_up_to_date(machine: &mut DynamicObject, v: CapiVersion, up_to_date: bool) {
    let generation = machine.metadata.generation.unwrap_or(0);
    let condition = json!({
        "type": UP_TO_DATE_CONDITION,
        "status": if up_to_date { "True" } else { "False" },
        "reason": if up_to_date { "UpToDate" } else { "NotUpToDate" },
        "message": if up_to_date { "" } else { "* MachineDeployment's template changed: the Machine's MachineSet is outdated" },
        "lastTransitionTime": now_rfc3339(),
        "observedGeneration": generation,
    });
    set_condition(machine, v, condition);
}

/// spec.replicas as Cluster API defaults it: absent means the autoscaler min-size, else 1.
pub(super) fn desired_md_replicas(md: &DynamicObject) -> i64 {
    if let Some(r) = at(&md.data, &["spec", "replicas"]).and_then(Value::as_i64) {
        return r.max(0);
    }
    md.annotations()
        .get(MIN_SIZE_ANNOTATION)
        .and_then(|s| s.trim().parse::<i64>().ok())
        .map(|n| n.max(0))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests;
