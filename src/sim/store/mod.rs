//! The object store: one lock over ordered maps, one global resourceVersion counter, a bounded
//! history of change events for watch resumption, and a broadcast channel feeding live watches.
//! All API semantics that touch stored state (create, update, delete with finalizers, garbage
//! collection) live here, so the HTTP layer only translates.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::clock::now_rfc3339;
use super::errors::ApiError;
use super::registry::{Registry, ResourceDef};
use super::selectors::{FieldSelector, LabelSelector};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

/// One change, as kept in history and broadcast to watches.
#[derive(Debug)]
pub struct StoredEvent {
    pub rv: u64,
    pub key: String,
    pub namespace: String,
    pub kind: EventKind,
    pub object: Arc<Value>,
    /// The object before a modification, so a selector-filtered watch can turn a change that
    /// leaves its selector into DELETED and one that enters it into ADDED.
    pub prev: Option<Arc<Value>>,
    /// When the change was committed (a lagging watch delivers it relative to this).
    pub committed: tokio::time::Instant,
    /// The event's watch lines already serialised, by (API version, event type): every watcher
    /// of the same version shares one serialisation instead of making its own.
    lines: Mutex<Vec<(String, &'static str, bytes::Bytes)>>,
}

impl StoredEvent {
    /// The watch line for `version` and `kind`, serialised by `render` on first use and shared
    /// by every later watcher asking for the same.
    pub fn line(
        &self,
        version: &str,
        kind: &'static str,
        render: impl FnOnce() -> bytes::Bytes,
    ) -> bytes::Bytes {
        if let Some((_, _, l)) = self
            .lines
            .lock()
            .iter()
            .find(|(v, k, _)| v == version && *k == kind)
        {
            return l.clone();
        }
        // Rendered outside the lock; two watchers racing here render twice, harmlessly.
        let l = render();
        self.lines
            .lock()
            .push((version.to_string(), kind, l.clone()));
        l
    }
}

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
}

/// DeleteOptions that matter here.
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub orphan: bool,
    /// `gracePeriodSeconds`: for pods, how long the kubelet may take (None: the pod's own
    /// `terminationGracePeriodSeconds`, default 30).
    pub grace_period: Option<i64>,
}

type ObjKey = (String, String);

/// Where a watch starts.
pub enum WatchStart {
    /// Initial ADDED events for current objects, then live events.
    Snapshot(Vec<Arc<Value>>),
    /// Events from history after the requested resourceVersion, then live events.
    History(Vec<Arc<StoredEvent>>),
}

/// The state behind the lock; `pub(crate)` so multi-object operations (eviction) stay atomic.
pub(crate) struct Inner {
    registry: Arc<Registry>,
    /// Stored objects behind `Arc`s shared with the history and watch events, so a write
    /// copies no object to publish it.
    objects: BTreeMap<String, BTreeMap<ObjKey, Arc<Value>>>,
    /// uid -> (storage key, namespace, name) of every live object.
    uids: HashMap<String, (String, String, String)>,
    /// owner uid -> (storage key, namespace, name) of objects whose ownerReferences name it.
    dependents: HashMap<String, BTreeSet<(String, String, String)>>,
    rv: u64,
    history: VecDeque<Arc<StoredEvent>>,
    history_size: usize,
    /// The newest resourceVersion no longer in history: watching from below it is 410 Expired.
    compacted: u64,
    rng: StdRng,
    events: broadcast::Sender<Arc<StoredEvent>>,
    /// The resourceVersion after every commit, for waiters that only need to know that
    /// something changed (`simulate` waiting for settlement).
    changes: tokio::sync::watch::Sender<u64>,
}

/// The simulated cluster's storage. Reads through it bypass HTTP (for tests and reports).
pub struct Store {
    inner: Mutex<Inner>,
    registry: Arc<Registry>,
    events: broadcast::Sender<Arc<StoredEvent>>,
}

impl Store {
    pub(crate) fn new(
        registry: Arc<Registry>,
        history_size: usize,
        watch_buffer: usize,
        seed: u64,
    ) -> Self {
        let (events, _) = broadcast::channel(watch_buffer.max(16));
        let inner = Inner {
            registry: registry.clone(),
            objects: BTreeMap::new(),
            uids: HashMap::new(),
            dependents: HashMap::new(),
            rv: 0,
            history: VecDeque::new(),
            history_size: history_size.max(1),
            compacted: 0,
            rng: StdRng::seed_from_u64(seed),
            events: events.clone(),
            changes: tokio::sync::watch::Sender::new(0),
        };
        let store = Self {
            inner: Mutex::new(inner),
            registry,
            events,
        };
        if let Some(ns) = store.registry.by_name("namespaces").cloned() {
            let mut inner = store.lock();
            for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                // Cannot fail: the namespace store is empty and the names are valid.
                let _ = inner.create(&ns, "", json!({"metadata": {"name": name}}));
            }
        }
        store
    }

    /// Create each of `objs` in `ns` with the status it carries, as if its controllers had
    /// already written it, one event each and under one lock: for standing up a large settled
    /// cluster fast (`simulate --scenario none --nodes`), where a pod's Pending-then-Running pair
    /// would set the stand-ins to work.
    pub fn create_with_status(
        &self,
        def: &ResourceDef,
        ns: &str,
        objs: impl IntoIterator<Item = Value>,
    ) -> Result<(), ApiError> {
        // Recorded under a manager of its own, so these objects carry managedFields as
        // everything written through the API does.
        let _manager = super::managed_fields::writing_as(super::managed_fields::Manager {
            name: "simulate-standup".into(),
            subresource: String::new(),
        });
        let mut inner = self.inner.lock();
        for obj in objs {
            inner.create_part(def, ns, obj, false)?;
        }
        Ok(())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// One object by resource (`plural` or `plural.group`), namespace ("" when cluster-scoped) and name.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let def = self.registry.by_name(resource)?;
        let inner = self.lock();
        inner.get(def, namespace, name).cloned()
    }

    /// Every object of a resource, in one namespace or (None) all.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        let Some(def) = self.registry.by_name(resource) else {
            return Vec::new();
        };
        let inner = self.lock();
        inner.iter(def, namespace).map(|(_, v)| v.clone()).collect()
    }

    /// Look at every object of a resource without copying it: for samplers that only count, so
    /// they cost the server next to nothing.
    pub fn visit(&self, resource: &str, mut f: impl FnMut(&Value)) {
        let Some(def) = self.registry.by_name(resource) else {
            return;
        };
        let inner = self.lock();
        inner.iter(def, None).for_each(|(_, v)| f(v));
    }

    /// Whether `f` holds for every object of `resource`, stopping at the first that fails.
    pub fn all(&self, resource: &str, mut f: impl FnMut(&Value) -> bool) -> bool {
        let Some(def) = self.registry.by_name(resource) else {
            return true;
        };
        let inner = self.lock();
        inner.iter(def, None).all(|(_, v)| f(v))
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<StoredEvent>> {
        self.events.subscribe()
    }

    /// A receiver that wakes after every write (its value: the resourceVersion then), for
    /// waiting on the cluster by events instead of polling it.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.lock().changes.subscribe()
    }
}

impl Inner {
    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub fn get(&self, def: &ResourceDef, ns: &str, name: &str) -> Option<&Value> {
        self.get_shared(def, ns, name).map(Arc::as_ref)
    }

    fn get_shared(&self, def: &ResourceDef, ns: &str, name: &str) -> Option<&Arc<Value>> {
        self.objects
            .get(&def.storage_key())?
            .get(&(ns.to_string(), name.to_string()))
    }

    /// Stores `obj` (as committed) under its key.
    fn put(&mut self, key: &str, ns: &str, name: &str, obj: Arc<Value>) {
        self.objects
            .entry(key.to_string())
            .or_default()
            .insert((ns.to_string(), name.to_string()), obj);
    }

    pub fn iter<'a>(
        &'a self,
        def: &ResourceDef,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjKey, &'a Value)> + 'a {
        self.iter_shared(def, ns).map(|(k, v)| (k, v.as_ref()))
    }

    fn iter_shared<'a>(
        &'a self,
        def: &ResourceDef,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjKey, &'a Arc<Value>)> + 'a {
        self.objects
            .get(&def.storage_key())
            .into_iter()
            .flat_map(|m| m.iter())
            .filter(move |((n, _), _)| ns.is_none_or(|want| want == n))
    }

    /// A page of a filtered list: items, and the key to continue after when more remain.
    pub fn list_page(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        after: Option<&ObjKey>,
        limit: Option<usize>,
    ) -> (Vec<Value>, Option<ObjKey>) {
        let mut items = Vec::new();
        let mut matching = self
            .iter(def, ns)
            .filter(|(k, _)| after.is_none_or(|a| *k > a))
            .filter(|(_, v)| labels.matches_object(v) && fields.matches(v));
        for (k, v) in matching.by_ref() {
            items.push(v.clone());
            if limit.is_some_and(|l| items.len() >= l) {
                return (items, Some(k.clone()));
            }
        }
        (items, None)
    }

    /// Whether continuing from `rv` is still possible (continue tokens expire with history).
    pub fn is_expired(&self, rv: u64) -> bool {
        rv < self.compacted
    }

    /// Starts a watch: the events it must replay, taken under the same lock as the subscription
    /// so nothing is missed or duplicated between them.
    pub fn watch_from(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        from: Option<u64>,
        subscribe: impl FnOnce() -> broadcast::Receiver<Arc<StoredEvent>>,
    ) -> Result<(WatchStart, broadcast::Receiver<Arc<StoredEvent>>, u64), ApiError> {
        let key = def.storage_key();
        let start = match from {
            None => {
                WatchStart::Snapshot(self.iter_shared(def, ns).map(|(_, v)| v.clone()).collect())
            }
            Some(rv) if rv < self.compacted => {
                return Err(ApiError::expired(format!(
                    "too old resource version: {rv} ({})",
                    self.compacted + 1
                )));
            }
            Some(rv) => WatchStart::History(
                self.history
                    .iter()
                    .filter(|e| e.rv > rv && e.key == key && ns.is_none_or(|n| n == e.namespace))
                    .cloned()
                    .collect(),
            ),
        };
        Ok((start, subscribe(), self.rv))
    }

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

    /// Records a change: next resourceVersion, history (trimmed), broadcast.
    fn commit(
        &mut self,
        key: &str,
        ns: &str,
        kind: EventKind,
        object: Value,
        prev: Option<Arc<Value>>,
    ) -> Arc<Value> {
        self.rv += 1;
        let mut object = object;
        set_meta(&mut object, "resourceVersion", json!(self.rv.to_string()));
        self.index_owners(key, ns, kind, &object, prev.as_deref());
        let object = Arc::new(object);
        let event = Arc::new(StoredEvent {
            rv: self.rv,
            key: key.to_string(),
            namespace: ns.to_string(),
            kind,
            object: object.clone(),
            prev,
            committed: tokio::time::Instant::now(),
            lines: Mutex::new(Vec::new()),
        });
        self.history.push_back(event.clone());
        while self.history.len() > self.history_size {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.events.send(event);
        let _ = self.changes.send_replace(self.rv);
        object
    }

    pub fn create(&mut self, def: &ResourceDef, ns: &str, obj: Value) -> Result<Value, ApiError> {
        self.create_part(def, ns, obj, true)
    }

    fn create_part(
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
        super::capi_defaults::apply(def, &mut obj);
        omit_empty_meta(&mut obj);
        super::managed_fields::track(None, &mut obj);
        super::validate::check(def, &obj)?;
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
                marked(sc, crate::scheduling::volumes::ANN_DEFAULT_CLASS)
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

    /// Stores `merged` over `old` (a no-op when nothing changed), removing the object when it is
    /// being deleted and its last finalizer went.
    fn write(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        old: Arc<Value>,
        mut merged: Value,
    ) -> Result<Value, ApiError> {
        let key = def.storage_key();
        set_meta(
            &mut merged,
            "resourceVersion",
            old.pointer("/metadata/resourceVersion")
                .cloned()
                .unwrap_or(json!("")),
        );
        super::capi_defaults::apply(def, &mut merged);
        omit_empty_meta(&mut merged);
        super::managed_fields::track(Some(&old), &mut merged);
        if merged == *old {
            return Ok(Value::clone(&old));
        }
        if is_deleting(&merged) && finalizers(&merged).is_empty() {
            return Ok(self.remove(&key, ns, name, merged));
        }
        super::validate::check(def, &merged)?;
        let stored = self.commit(&key, ns, EventKind::Modified, merged, Some(old));
        self.put(&key, ns, name, stored.clone());
        Ok(Value::clone(&stored))
    }

    /// A write by a phantom concurrent writer: bumps the object's resourceVersion (fault injection).
    pub fn touch(&mut self, def: &ResourceDef, ns: &str, name: &str) {
        let Some(old) = self.get_shared(def, ns, name).cloned() else {
            return;
        };
        let key = def.storage_key();
        let stored = self.commit(&key, ns, EventKind::Modified, Value::clone(&old), Some(old));
        self.put(&key, ns, name, stored);
    }

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
    fn remove(&mut self, key: &str, ns: &str, name: &str, last: Value) -> Value {
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

    fn index_owners(
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

fn is_pod(def: &ResourceDef) -> bool {
    def.builtin && def.group.is_empty() && def.plural == "pods"
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

pub fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

pub fn set_meta(obj: &mut Value, field: &str, value: Value) {
    if !obj.get("metadata").is_some_and(Value::is_object)
        && let Some(o) = obj.as_object_mut()
    {
        o.insert("metadata".into(), Value::Object(Map::new()));
    }
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert(field.into(), value);
    }
}

/// The API server stores metadata through Go's `ObjectMeta`, whose maps and lists are
/// `omitempty` (custom resources too: their metadata is coerced through it), so an empty
/// `labels: {}` or `finalizers: []` is never served back. Writers rely on that, e.g. a JSON
/// patch that tests `/metadata/annotations` for null before creating the map.
fn omit_empty_meta(obj: &mut Value) {
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

fn spec_changed(old: &Value, new: &Value) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::registry::CapiVersions;

    fn store() -> (Store, Arc<Registry>) {
        let reg = Arc::new(Registry::new(CapiVersions::Both, vec![]).unwrap());
        (Store::new(reg.clone(), 100, 100, 1), reg)
    }

    #[test]
    fn only_fields_outside_metadata_and_status_change_the_spec() {
        let base = json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a"},
                          "spec": {"replicas": 1}, "status": {"ready": 1}});
        let mut v = base.clone();
        v["metadata"]["labels"] = json!({"x": "y"});
        v["status"]["ready"] = json!(2);
        assert!(!spec_changed(&base, &v));
        v["spec"]["replicas"] = json!(2);
        assert!(spec_changed(&base, &v));
        let mut added = base.clone();
        added["template"] = json!({});
        assert!(spec_changed(&base, &added), "a new top-level field");
        assert!(spec_changed(&added, &base), "a removed one");
        assert!(!spec_changed(&json!(null), &json!({"metadata": {}})));
    }

    #[test]
    fn owner_gone_collects_dependents_unless_another_owner_lives() {
        let (s, reg) = store();
        let cm = reg.by_name("configmaps").unwrap().clone();
        let mut inner = s.lock();
        let a = inner
            .create(&cm, "default", json!({"metadata": {"name": "a"}}))
            .unwrap();
        let b = inner
            .create(&cm, "default", json!({"metadata": {"name": "b"}}))
            .unwrap();
        let uid = |v: &Value| v["metadata"]["uid"].as_str().unwrap().to_string();
        let r = |u: String| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": u});
        inner
            .create(
                &cm,
                "default",
                json!({"metadata": {"name": "only-a", "ownerReferences": [r(uid(&a))]}}),
            )
            .unwrap();
        inner
            .create(
                &cm,
                "default",
                json!({"metadata": {"name": "both", "ownerReferences": [r(uid(&a)), r(uid(&b))]}}),
            )
            .unwrap();
        inner
            .delete(&cm, "default", "a", &DeleteOpts::default())
            .unwrap();
        assert!(inner.get(&cm, "default", "only-a").is_none());
        let both = inner.get(&cm, "default", "both").unwrap();
        assert_eq!(
            both["metadata"]["ownerReferences"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn a_claim_naming_no_class_gets_the_newest_default() {
        let (s, reg) = store();
        let sc = reg.by_name("storageclasses").unwrap().clone();
        let pvc = reg.by_name("persistentvolumeclaims").unwrap().clone();
        let mut inner = s.lock();
        inner
            .create(
                &pvc,
                "default",
                json!({"metadata": {"name": "before"}, "spec": {}}),
            )
            .unwrap();
        let class = |name: &str, default: &str| {
            json!({"metadata": {"name": name,
                    "annotations": {"storageclass.kubernetes.io/is-default-class": default}},
                   "provisioner": "p"})
        };
        // "zzz-new" sorts after "old" by name, so only its newer creationTimestamp (RFC 3339 to
        // the second) makes it the default.
        inner.create(&sc, "", class("old", "true")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        inner.create(&sc, "", class("zzz-new", "true")).unwrap();
        inner.create(&sc, "", class("other", "false")).unwrap();
        let class_of = |inner: &mut Inner, name: &str, spec: Value| {
            inner
                .create(
                    &pvc,
                    "default",
                    json!({"metadata": {"name": name}, "spec": spec}),
                )
                .unwrap()["spec"]["storageClassName"]
                .clone()
        };
        assert_eq!(class_of(&mut inner, "none", json!({})), json!("zzz-new"));
        assert_eq!(
            class_of(&mut inner, "empty", json!({"storageClassName": ""})),
            json!("")
        );
        assert_eq!(
            class_of(&mut inner, "named", json!({"storageClassName": "old"})),
            json!("old")
        );
        // Created before any default existed: left alone.
        let before = inner.get(&pvc, "default", "before").unwrap();
        assert!(before["spec"]["storageClassName"].is_null());
    }

    #[test]
    fn namespaced_create_needs_the_namespace() {
        let (s, reg) = store();
        let cm = reg.by_name("configmaps").unwrap().clone();
        let err = s
            .lock()
            .create(&cm, "nope", json!({"metadata": {"name": "a"}}))
            .unwrap_err();
        assert_eq!(err.code, 404);
        assert_eq!(err.message, "namespaces \"nope\" not found");
    }
}
