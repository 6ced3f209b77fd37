//! Deletion and garbage collection: finalizers, graceful pod termination, namespace contents,
//! and dependents collected or orphaned through their owner references.

use super::DeleteOpts;
use super::EventKind;
use super::Inner;
use super::is_deleting;
use super::is_pod;
use super::set_meta;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::clock::now_rfc3339;
use crate::errors::ApiError;
use crate::registry::{Registry, ResourceDef};

impl Inner {
    pub fn delete(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Value, ApiError> {
        let old = self
            .get_shared(def, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
        let meta_str = |f: &str| {
            old.pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        if let Some(uid) = &opts.uid
            && *uid != meta_str("uid")
        {
            return Err(ApiError::conflict_with(
                &def.group,
                &def.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str("uid")
                ),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && *rv != meta_str("resourceVersion")
        {
            return Err(ApiError::conflict_with(
                &def.group,
                &def.plural,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str("resourceVersion")
                ),
            ));
        }
        if opts.orphan {
            self.orphan_dependents(&meta_str("uid"));
        }
        if is_pod(def) {
            // As kube-apiserver does for pods: a pod bound to a node and not finished is only
            // marked (deletionTimestamp = now + grace); its kubelet removes it once the
            // containers have stopped. A later delete may shorten the grace, never extend it.
            let grace = pod_grace_period(&old, opts.grace_period);
            if grace > 0 {
                return Ok(self.mark_pod_terminating(def, ns, name, old, grace));
            }
            if finalizers(&old).is_empty() {
                let key = def.storage_key();
                return Ok(self.remove(&key, ns, name, Value::clone(&old)));
            }
        }
        if is_deleting(&old) {
            return Ok(Value::clone(&old));
        }
        let key = def.storage_key();
        if finalizers(&old).is_empty() {
            return Ok(self.remove(&key, ns, name, Value::clone(&old)));
        }
        let mut marked = Value::clone(&old);
        set_meta(&mut marked, "deletionTimestamp", json!(now_rfc3339()));
        set_meta(&mut marked, "deletionGracePeriodSeconds", json!(0));
        if def.tracks_generation() {
            let g = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            set_meta(&mut marked, "generation", json!(g + 1));
        }
        let stored = self.commit(&key, ns, EventKind::Modified, marked, Some(old));
        self.put(&key, ns, name, stored.clone());
        Ok(Value::clone(&stored))
    }

    /// A graceful pod deletion: deletionTimestamp `grace` seconds from now, or kept when an
    /// earlier one is already set.
    fn mark_pod_terminating(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        old: Arc<Value>,
        grace: i64,
    ) -> Value {
        let now = jiff::Timestamp::now();
        let until = now
            .checked_add(jiff::SignedDuration::from_secs(grace))
            .unwrap_or(now);
        let current = old
            .pointer("/metadata/deletionTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok());
        if current.is_some_and(|c| c <= until) {
            return Value::clone(&old);
        }
        let mut marked = Value::clone(&old);
        set_meta(
            &mut marked,
            "deletionTimestamp",
            json!(until.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
        );
        set_meta(&mut marked, "deletionGracePeriodSeconds", json!(grace));
        let key = def.storage_key();
        let stored = self.commit(&key, ns, EventKind::Modified, marked, Some(old));
        self.put(&key, ns, name, stored.clone());
        Value::clone(&stored)
    }

    /// Removes an object for good (DELETED event), then garbage-collects what it owned.
    pub(super) fn remove(&mut self, key: &str, ns: &str, name: &str, last: Value) -> Value {
        let prev = self
            .objects
            .get_mut(key)
            .and_then(|m| m.remove(&(ns.to_string(), name.to_string())));
        let uid = last
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        self.uids.remove(&uid);
        let gone = self.commit(key, ns, EventKind::Deleted, last, prev);
        if key == "/namespaces" {
            self.delete_namespace_contents(name);
        }
        self.collect_dependents(&uid);
        Value::clone(&gone)
    }

    fn delete_namespace_contents(&mut self, ns: &str) {
        let registry = self.registry.clone();
        for def in registry.all().iter().filter(|d| d.namespaced) {
            let names: Vec<String> = self
                .iter(def, Some(ns))
                .map(|((_, n), _)| n.clone())
                .collect();
            for name in names {
                let _ = self.delete(def, ns, &name, &DeleteOpts::default());
            }
        }
    }

    /// Background propagation: dependents whose every owner is gone are deleted; dependents that
    /// still have a live owner lose only the reference to the removed one.
    fn collect_dependents(&mut self, owner_uid: &str) {
        if owner_uid.is_empty() {
            return;
        }
        let registry = self.registry.clone();
        for (def, ns, name) in self.dependents_of(owner_uid, &registry) {
            let Some(obj) = self.get(def, &ns, &name).cloned() else {
                continue;
            };
            let others_alive = owner_refs(&obj).iter().any(|r| {
                let uid = r.get("uid").and_then(Value::as_str).unwrap_or_default();
                uid != owner_uid && self.uids.contains_key(uid)
            });
            if others_alive {
                let _ = self.strip_owner(def, &ns, &name, owner_uid);
            } else {
                let _ = self.delete(def, &ns, &name, &DeleteOpts::default());
            }
        }
    }

    fn orphan_dependents(&mut self, owner_uid: &str) {
        let registry = self.registry.clone();
        for (def, ns, name) in self.dependents_of(owner_uid, &registry) {
            let _ = self.strip_owner(def, &ns, &name, owner_uid);
        }
    }

    pub(super) fn index_owners(
        &mut self,
        key: &str,
        ns: &str,
        kind: EventKind,
        object: &Value,
        prev: Option<&Value>,
    ) {
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let entry = (key.to_string(), ns.to_string(), name.to_string());
        for uid in prev.map(owner_uids).unwrap_or_default() {
            if let Some(set) = self.dependents.get_mut(&uid) {
                set.remove(&entry);
                if set.is_empty() {
                    self.dependents.remove(&uid);
                }
            }
        }
        if kind != EventKind::Deleted {
            for uid in owner_uids(object) {
                self.dependents
                    .entry(uid)
                    .or_default()
                    .insert(entry.clone());
            }
        }
    }

    fn dependents_of<'r>(
        &self,
        owner_uid: &str,
        registry: &'r Registry,
    ) -> Vec<(&'r ResourceDef, String, String)> {
        let Some(set) = self.dependents.get(owner_uid) else {
            return Vec::new();
        };
        set.iter()
            .filter_map(|(key, ns, name)| {
                let def = registry.all().iter().find(|d| d.storage_key() == *key)?;
                Some((def, ns.clone(), name.clone()))
            })
            .collect()
    }

    fn strip_owner(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        owner_uid: &str,
    ) -> Result<Value, ApiError> {
        let old = self
            .get_shared(def, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
        let mut new = Value::clone(&old);
        if let Some(refs) = new
            .pointer_mut("/metadata/ownerReferences")
            .and_then(Value::as_array_mut)
        {
            refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(owner_uid));
        }
        self.write(def, ns, name, old, new)
    }
}

fn owner_uids(obj: &Value) -> Vec<String> {
    owner_refs(obj)
        .iter()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
        .map(String::from)
        .collect()
}

fn owner_refs(obj: &Value) -> Vec<Value> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|f| {
            f.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// The grace a pod deletion gets, as kube-apiserver computes it: 0 for a pod no kubelet runs
/// (unbound) or that has finished; else the request's `gracePeriodSeconds`, else the pod's
/// `terminationGracePeriodSeconds`, else 30.
pub fn pod_grace_period(pod: &Value, requested: Option<i64>) -> i64 {
    let bound = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    );
    if !bound || finished {
        return 0;
    }
    requested
        .or_else(|| {
            pod.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .map(|g| if g < 0 { 1 } else { g })
        .unwrap_or(30)
}
