//! Cluster API's pause, as every one of its controllers applies it first: a Cluster's
//! `spec.paused` or an object's own `cluster.x-k8s.io/paused` annotation holds the object, and
//! its `Paused` condition says so.

use kube::api::PostParams;
use kube::core::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::conditions::{condition, now_rfc3339, set_condition};
use super::{Inner, Work, str_at};
use crate::standin::{is_conflict, is_not_found};

impl Inner {
    /// Cluster API's `Paused` condition on `obj` (a MachineDeployment or MachineSet of `kind`)
    /// made current, as every Cluster API controller does first (`EnsurePausedCondition`):
    /// True while its Cluster has `spec.paused` or it carries the `cluster.x-k8s.io/paused`
    /// annotation, else False. Written only when it changes, from a fresh read with its
    /// resourceVersion and again on a conflict, as Cluster API's patch helper writes
    /// conditions. [`Pause::stop`] says whether the reconcile ends here.
    pub(super) async fn ensure_paused_condition(
        &self,
        api: &Api<DynamicObject>,
        obj: &DynamicObject,
        kind: &str,
        cluster_paused: bool,
    ) -> Result<Pause, kube::Error> {
        let v = self.cfg.version;
        let annotated = obj.annotations().contains_key(PAUSED_ANNOTATION);
        let paused = cluster_paused || annotated;
        let want = paused_condition(kind, cluster_paused, annotated, obj.metadata.generation);
        let have = condition(&obj.data, v, PAUSED_CONDITION);
        let same_except_generation = have.is_some_and(|h| {
            ["status", "reason", "message"]
                .iter()
                .all(|k| h.get(*k).unwrap_or(&Value::Null) == &want[*k])
        });
        let same = same_except_generation
            && have.and_then(|h| h.get("observedGeneration")) == Some(&want["observedGeneration"]);
        if same {
            return Ok(Pause {
                stop: paused,
                fresh: None,
            });
        }
        let name = obj.name_any();
        for attempt in 0..5 {
            let Some(mut fresh) = api.get_opt(&name).await? else {
                return Ok(Pause {
                    stop: true,
                    fresh: None,
                });
            };
            let mut c = want.clone();
            let before = condition(&fresh.data, v, PAUSED_CONDITION);
            // The transition time moves only when the status does.
            let kept = before
                .filter(|b| b.get("status") == c.get("status"))
                .and_then(|b| b.get("lastTransitionTime").cloned());
            c["lastTransitionTime"] = kept.unwrap_or_else(|| json!(now_rfc3339()));
            set_condition(&mut fresh, v, c);
            match api
                .replace_status(&name, &PostParams::default(), &fresh)
                .await
            {
                Ok(written) => {
                    // As Cluster API: a change of the pause ends this reconcile (the write's
                    // event brings the next one); only a newer generation on a False
                    // condition lets it go on.
                    return Ok(Pause {
                        stop: paused || !same_except_generation,
                        fresh: Some(written),
                    });
                }
                Err(err) if is_not_found(&err) => {
                    return Ok(Pause {
                        stop: true,
                        fresh: None,
                    });
                }
                Err(err) if is_conflict(&err) && attempt < 4 => continue,
                Err(err) => return Err(err),
            }
        }
        Ok(Pause {
            stop: true,
            fresh: None,
        })
    }

    /// Cluster API's pause, where each of its reconcilers starts: `obj`'s `Paused` condition
    /// made current ([`Inner::ensure_paused_condition`]). `None` when the reconcile ends here,
    /// else the object to go on with (as the condition write left it, when it wrote).
    pub(super) async fn unless_paused(
        &self,
        ns: &str,
        api: &Api<DynamicObject>,
        obj: DynamicObject,
        kind: &str,
    ) -> Result<Option<DynamicObject>, kube::Error> {
        let cluster_paused = self.cluster_paused(ns, &obj).await?;
        let pause = self
            .ensure_paused_condition(api, &obj, kind, cluster_paused)
            .await?;
        Ok((!pause.stop).then(|| pause.fresh.unwrap_or(obj)))
    }

    /// Records whether Cluster `key` is paused, as its watch saw it.
    pub(super) fn note_cluster_pause(&self, key: &(String, String), paused: bool) {
        let mut held = self.paused_clusters.lock();
        let changed = if paused {
            held.insert(key.clone())
        } else {
            held.remove(key)
        };
        drop(held);
        if changed {
            self.pause_changed.notify_waiters();
        }
    }

    /// Waits while `machine` is paused (its Cluster's `spec.paused`, as the Cluster watch last
    /// saw it, or its own `cluster.x-k8s.io/paused` annotation, as the Machine cache holds it),
    /// as Cluster API's Machine controller and every infrastructure provider stop there: no
    /// provider ID, no drain, no finalizer removed until the pause lifts. Woken by either watch,
    /// never the server. False when the stand-in shuts down.
    pub(super) async fn hold_while_paused(&self, ns: &str, machine: &DynamicObject) -> bool {
        let cluster = str_at(&machine.data, &["spec", "clusterName"]).map(str::to_string);
        let key = cluster.map(|c| (ns.to_string(), c));
        let cached =
            ObjectRef::new_with(&machine.name_any(), self.cfg.version.machine()).within(ns);
        let mut stop = self.shutdown.clone();
        let mut told = false;
        loop {
            // Registered before looking, so a change applied meanwhile still wakes us.
            let machine_changed = self.cache_changed.notified();
            let pause_changed = self.pause_changed.notified();
            let annotated = self
                .machines
                .get(&cached)
                .map_or_else(
                    || machine.annotations().clone(),
                    |m| m.annotations().clone(),
                )
                .contains_key(PAUSED_ANNOTATION);
            let paused = annotated
                || key
                    .as_ref()
                    .is_some_and(|k| self.paused_clusters.lock().contains(k));
            if !paused {
                return true;
            }
            if !told {
                tracing::debug!(machine = %machine.name_any(), "cluster api stand-in: Machine paused; holding");
                told = true;
            }
            tokio::select! {
                _ = machine_changed => {}
                _ = pause_changed => {}
                _ = stop.wait() => return false,
            }
        }
    }

    /// Whether the API server serves Clusters (asked once).
    pub(super) async fn serves_clusters(&self) -> bool {
        *self
            .clusters_served
            .get_or_init(|| async {
                self.client
                    .list_api_group_resources(&self.cfg.version.api_version())
                    .await
                    .is_ok_and(|l| l.resources.iter().any(|r| r.name == "clusters"))
            })
            .await
    }

    /// Queues the MachineDeployments, MachineSets and MachinePools of Cluster `ns/cluster`,
    /// listed from the server (a MachineDeployment paused before it made a set has none in the
    /// cache).
    pub(super) async fn queue_cluster_objects(
        &self,
        ns: &str,
        cluster: &str,
    ) -> Result<(), kube::Error> {
        let v = self.cfg.version;
        let of_cluster =
            |o: &DynamicObject| str_at(&o.data, &["spec", "clusterName"]) == Some(cluster);
        for md in self
            .api(&v.machine_deployment(), ns)
            .list(&Default::default())
            .await?
            .items
        {
            if of_cluster(&md) {
                self.queue.push(Work::Deployment {
                    ns: ns.to_string(),
                    name: md.name_any(),
                });
            }
        }
        for ms in self
            .api(&v.machine_set(), ns)
            .list(&Default::default())
            .await?
            .items
        {
            if of_cluster(&ms) {
                self.queue.push(Work::Set {
                    ns: ns.to_string(),
                    name: ms.name_any(),
                });
            }
        }
        // MachinePools only where their CRD is served.
        let pools = self
            .api(&v.machine_pool(), ns)
            .list(&Default::default())
            .await;
        for mp in pools.map(|l| l.items).unwrap_or_default() {
            if of_cluster(&mp) {
                self.queue.push(Work::Pool {
                    ns: ns.to_string(),
                    name: mp.name_any(),
                });
            }
        }
        Ok(())
    }

    /// Whether `obj`'s Cluster (its `spec.clusterName`) has `spec.paused`; a missing Cluster,
    /// or a control plane that serves no Clusters, pauses nothing. Only `spec.paused` counts:
    /// Cluster API's controllers read the Cluster's field and the object's own annotation,
    /// never an annotation on the Cluster (that one pauses the Cluster's own controller).
    pub(super) async fn cluster_paused(
        &self,
        ns: &str,
        obj: &DynamicObject,
    ) -> Result<bool, kube::Error> {
        let Some(name) = obj
            .data
            .pointer("/spec/clusterName")
            .and_then(Value::as_str)
        else {
            return Ok(false);
        };
        if !self.serves_clusters().await {
            return Ok(false);
        }
        let clusters = self.api(&self.cfg.version.cluster(), ns);
        Ok(clusters
            .get_opt(name)
            .await?
            .is_some_and(|c| c.data.pointer("/spec/paused").and_then(Value::as_bool) == Some(true)))
    }
}

/// What [`Inner::ensure_paused_condition`] found.
pub(super) struct Pause {
    /// The reconcile ends here: the object is paused, gone, or its pause just changed.
    pub(super) stop: bool,
    /// The object as the condition write left it, when it wrote.
    pub(super) fresh: Option<DynamicObject>,
}

/// Cluster API's pause annotation, on the Cluster's objects themselves.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

/// Cluster API's v1beta2 `Paused` condition type (also its True reason).
pub const PAUSED_CONDITION: &str = "Paused";

/// The `Paused` condition Cluster API sets on an object of `kind`, worded as it words it.
pub(super) fn paused_condition(
    kind: &str,
    cluster_paused: bool,
    annotated: bool,
    generation: Option<i64>,
) -> Value {
    let mut why = Vec::new();
    if cluster_paused {
        why.push("Cluster spec.paused is set to true".to_string());
    }
    if annotated {
        why.push(format!("{kind} has the {PAUSED_ANNOTATION} annotation"));
    }
    let paused = !why.is_empty();
    json!({
        "type": PAUSED_CONDITION,
        "status": if paused { "True" } else { "False" },
        "reason": if paused { PAUSED_CONDITION } else { "NotPaused" },
        "message": why.join(", "),
        "observedGeneration": generation.unwrap_or(0),
    })
}
