//! What a create or an update admits and how it shapes the object: generated names and uids,
//! the DefaultStorageClass admission plugin, status and metadata rules, and the merge of an
//! update over what is stored.

use super::EventKind;
use super::Inner;
use super::Part;
use super::is_pod;
use super::set_meta;
use std::sync::Arc;

use rand::Rng;
use serde_json::{Map, Value, json};

use crate::clock::now_rfc3339;
use crate::errors::ApiError;
use crate::registry::ResourceDef;

impl Inner {
    fn random_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| char::from(ALPHABET[self.rng.random_range(0..ALPHABET.len())]))
            .collect()
    }

    fn new_uid(&mut self) -> String {
        let b: [u8; 16] = self.rng.random();
        let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
        format!(
            "{}-{}-4{}-a{}-{}",
            &h[0..8],
            &h[8..12],
            &h[13..16],
            &h[17..20],
            &h[20..32]
        )
    }

    pub fn create(&mut self, def: &ResourceDef, ns: &str, obj: Value) -> Result<Value, ApiError> {
        self.create_part(def, ns, obj, true)
    }

    pub(super) fn create_part(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        mut obj: Value,
        reset_status: bool,
    ) -> Result<Value, ApiError> {
        let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
            return Err(ApiError::invalid(format!(
                "{} in version \"{}\" cannot be handled: metadata is required",
                def.kind,
                def.preferred_version()
            )));
        };
        if meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let generate = meta
            .get("generateName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() && generate.is_empty() {
            return Err(ApiError::invalid(format!(
                "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                def.kind
            )));
        }
        if def.namespaced && self.get_ns(ns).is_none() {
            return Err(ApiError::not_found("", "namespaces", ns));
        }
        let key = def.storage_key();
        if name.is_empty() {
            name = loop {
                let candidate = format!("{generate}{}", self.random_suffix());
                if self.get(def, ns, &candidate).is_none() {
                    break candidate;
                }
            };
        } else if self.get(def, ns, &name).is_some() {
            return Err(ApiError::already_exists(&def.group, &def.plural, &name));
        }
        let uid = self.new_uid();
        let meta = obj
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| ApiError::internal("metadata vanished"))?;
        meta.insert("name".into(), json!(name));
        if def.namespaced {
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        meta.insert("uid".into(), json!(uid));
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
        meta.remove("deletionTimestamp");
        meta.remove("deletionGracePeriodSeconds");
        if def.tracks_generation() {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
        if reset_status {
            prepare_status_on_create(def, &mut obj);
        }
        self.default_storage_class(def, &mut obj);
        crate::capi_defaults::apply(def, &mut obj);
        crate::validate::admit_custom(&self.registry, def, &mut obj, None)?;
        omit_empty_meta(&mut obj);
        crate::managed_fields::track(None, &mut obj);
        crate::validate::check(def, &obj)?;
        if is_pod(def) {
            crate::validate_pod::check_create(&obj)?;
        }
        let stored = self.commit(&key, ns, EventKind::Added, obj, None);
        self.put(&key, ns, &name, stored.clone());
        self.uids.insert(uid, (key, ns.to_string(), name));
        Ok(Value::clone(&stored))
    }

    /// The DefaultStorageClass admission plugin: a new PersistentVolumeClaim that names no
    /// StorageClass at all (absent, not `""`; nor the beta annotation) gets the default one,
    /// the newest of those marked `storageclass.kubernetes.io/is-default-class: "true"` (then
    /// the first by name), as the apiserver's `GetDefaultClass` picks it.
    fn default_storage_class(&self, def: &ResourceDef, obj: &mut Value) {
        const BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
        if !(def.builtin && def.group.is_empty() && def.plural == "persistentvolumeclaims") {
            return;
        }
        let named = !obj["spec"]["storageClassName"].is_null()
            || !obj["metadata"]["annotations"][BETA_CLASS].is_null();
        let Some(classes) = self.registry.by_name("storageclasses").filter(|_| !named) else {
            return;
        };
        let marked = |sc: &Value, key: &str| sc["metadata"]["annotations"][key] == "true";
        let default = self
            .iter(classes, None)
            .map(|(_, sc)| sc)
            .filter(|sc| {
                marked(sc, crate::wellknown::ANN_DEFAULT_CLASS)
                    || marked(sc, "storageclass.beta.kubernetes.io/is-default-class")
            })
            .map(|sc| {
                let created = sc["metadata"]["creationTimestamp"].as_str().unwrap_or("");
                let name = sc["metadata"]["name"].as_str().unwrap_or("");
                (std::cmp::Reverse(created.to_string()), name.to_string())
            })
            .min();
        if let (Some((_, name)), Some(spec)) =
            (default, obj.get_mut("spec").and_then(Value::as_object_mut))
        {
            spec.insert("storageClassName".into(), json!(name));
        }
    }

    fn get_ns(&self, ns: &str) -> Option<&Value> {
        self.objects
            .get("/namespaces")?
            .get(&(String::new(), ns.to_string()))
            .map(Arc::as_ref)
    }

    /// PUT semantics: `new` replaces the object (main part or status), with a resourceVersion
    /// precondition when `new` carries one.
    pub fn update(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        new: Value,
        part: Part,
    ) -> Result<Value, ApiError> {
        let old = self
            .get_shared(def, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
        let want_rv = new
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !want_rv.is_empty()
            && Some(want_rv)
                != old
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
        {
            return Err(ApiError::conflict(&def.group, &def.plural, name));
        }
        if let Some(body_name) = new.pointer("/metadata/name").and_then(Value::as_str)
            && body_name != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let merged = merge_for_update(def, &old, new, part);
        self.write(def, ns, name, old, merged)
    }
}

/// The API server stores metadata through Go's `ObjectMeta`, whose maps and lists are
/// `omitempty` (custom resources too: their metadata is coerced through it), so an empty
/// `labels: {}` or `finalizers: []` is never served back. Writers rely on that, e.g. a JSON
/// patch that tests `/metadata/annotations` for null before creating the map.
pub(super) fn omit_empty_meta(obj: &mut Value) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.retain(|_, v| match v {
            Value::Null => false,
            Value::Object(m) => !m.is_empty(),
            Value::Array(a) => !a.is_empty(),
            _ => true,
        });
    }
}

/// What a create keeps of `status`: custom resources with a status subresource drop it, pods
/// start Pending, namespaces Active; other built-ins (nodes) keep what the creator sent.
fn prepare_status_on_create(def: &ResourceDef, obj: &mut Value) {
    let Some(o) = obj.as_object_mut() else { return };
    match (def.builtin, def.plural.as_str()) {
        (true, "pods") if def.group.is_empty() => {
            o.insert("status".into(), json!({"phase": "Pending"}));
        }
        (true, "namespaces") if def.group.is_empty() => {
            o.insert("status".into(), json!({"phase": "Active"}));
        }
        (false, _) if def.status => {
            o.remove("status");
        }
        _ => {}
    }
}

/// The object a PUT produces: the main resource never changes status (when a status subresource
/// exists), the status subresource changes only status; server-owned metadata is kept; the
/// generation moves when anything outside metadata and status changed.
pub fn merge_for_update(def: &ResourceDef, old: &Value, mut new: Value, part: Part) -> Value {
    let mut merged = match part {
        Part::Status => {
            let mut m = old.clone();
            if let Some(o) = m.as_object_mut() {
                match new.as_object_mut().and_then(|n| n.remove("status")) {
                    Some(s) => o.insert("status".into(), s),
                    None => o.remove("status"),
                };
            }
            m
        }
        Part::Main => {
            let mut m = new;
            if def.status
                && let Some(o) = m.as_object_mut()
            {
                match old.get("status") {
                    Some(s) => o.insert("status".into(), s.clone()),
                    None => o.remove("status"),
                };
            }
            m
        }
    };
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match old.pointer(&format!("/metadata/{field}")) {
            Some(v) => set_meta(&mut merged, field, v.clone()),
            None => {
                if let Some(meta) = merged.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove(field);
                }
            }
        }
    }
    if def.tracks_generation() && spec_changed(old, &merged) {
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        set_meta(&mut merged, "generation", json!(g + 1));
    }
    merged
}

pub(super) fn spec_changed(old: &Value, new: &Value) -> bool {
    // Compared in place: cloning the objects (metadata and managedFields included) to strip
    // them cost the server more than the rest of the write.
    const NOT_SPEC: [&str; 4] = ["metadata", "status", "apiVersion", "kind"];
    // A non-object has no spec fields: it compares as an empty map.
    let empty = Map::new();
    let old = old.as_object().unwrap_or(&empty);
    let new = new.as_object().unwrap_or(&empty);
    let spec =
        |m: &Map<String, Value>| m.keys().filter(|k| !NOT_SPEC.contains(&k.as_str())).count();
    spec(old) != spec(new)
        || old
            .iter()
            .filter(|(k, _)| !NOT_SPEC.contains(&k.as_str()))
            .any(|(k, v)| new.get(k) != Some(v))
}
