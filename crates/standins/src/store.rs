//! The object store: one lock over ordered maps, one global resourceVersion counter, a bounded
//! history of change events for watch resumption, and a broadcast channel feeding live watches.
//! All API semantics that touch stored state (create, update, delete with finalizers, garbage
//! collection) live here, so the HTTP layer only translates.

use admission::omit_empty_meta;
use gc::finalizers;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

mod admission;
mod gc;

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

    /// Loading objects read from another cluster (`simulate --from-cluster`): each is stored as
    /// that cluster has it (name, UID, creation time, owners, finalizers, status), with no
    /// admission or defaulting (its own server did both), a resourceVersion of this store and
    /// one ADDED event. A namespace that does not exist yet is created first. Returns how many
    /// were stored; an object whose name is taken is an error.
    pub fn restore(
        &self,
        def: &ResourceDef,
        objs: impl IntoIterator<Item = Value>,
    ) -> Result<usize, ApiError> {
        let mut inner = self.inner.lock();
        let key = def.storage_key();
        let namespaces = self.registry.by_name("namespaces").cloned();
        let mut n = 0;
        for mut obj in objs {
            let meta = |o: &Value, f: &str| {
                o.pointer(&format!("/metadata/{f}"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let (name, uid) = (meta(&obj, "name"), meta(&obj, "uid"));
            let ns = if def.namespaced {
                meta(&obj, "namespace")
            } else {
                String::new()
            };
            if name.is_empty() || uid.is_empty() {
                return Err(ApiError::invalid(format!(
                    "{} {ns}/{name}: a loaded object needs a name and a uid",
                    def.kind
                )));
            }
            if let Some(nsdef) = namespaces.as_ref().filter(|_| !ns.is_empty())
                && inner.get(nsdef, "", &ns).is_none()
            {
                inner.create(nsdef, "", json!({"metadata": {"name": ns}}))?;
            }
            if inner.get(def, &ns, &name).is_some() {
                return Err(ApiError::already_exists(&def.group, &def.plural, &name));
            }
            if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
                m.remove("managedFields");
            }
            let stored = inner.commit(&key, &ns, EventKind::Added, obj, None);
            inner.put(&key, &ns, &name, stored);
            inner.uids.insert(uid, (key.clone(), ns, name));
            n += 1;
        }
        Ok(n)
    }

    /// Mirroring another API server (the real backend): puts `obj` as that server sent it, with
    /// no admission, defaulting or garbage collection, which the other server has done.
    pub fn mirror_put(&self, def: &ResourceDef, ns: &str, obj: Value) {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut inner = self.inner.lock();
        let key = def.storage_key();
        let prev = inner.get_shared(def, ns, &name).cloned();
        let kind = match prev {
            Some(_) => EventKind::Modified,
            None => EventKind::Added,
        };
        let stored = inner.commit(&key, ns, kind, obj, prev);
        inner.put(&key, ns, &name, stored);
    }

    /// Mirroring: the other server deleted `ns/name`.
    pub fn mirror_remove(&self, def: &ResourceDef, ns: &str, name: &str) {
        let mut inner = self.inner.lock();
        let key = def.storage_key();
        let prev = inner
            .objects
            .get_mut(&key)
            .and_then(|m| m.remove(&(ns.to_string(), name.to_string())));
        if let Some(prev) = prev {
            let last = Value::clone(&prev);
            inner.commit(&key, ns, EventKind::Deleted, last, Some(prev));
        }
    }

    /// Mirroring: the names of every object of `def` in the mirror (for a relist to drop those
    /// the other server no longer has).
    pub fn mirror_keys(&self, def: &ResourceDef) -> Vec<(String, String)> {
        let inner = self.inner.lock();
        inner.iter(def, None).map(|(k, _)| k.clone()).collect()
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
    pub fn visit(&self, resource: &str, f: impl FnMut(&Value)) {
        self.visit_in(resource, None, f);
    }

    /// [`Store::visit`] in one namespace or (None) all: a fleet's management server holds every
    /// Cluster's objects, and one Cluster's sampler walks its own namespace only.
    pub fn visit_in(&self, resource: &str, namespace: Option<&str>, mut f: impl FnMut(&Value)) {
        let Some(def) = self.registry.by_name(resource) else {
            return;
        };
        let inner = self.lock();
        inner.iter(def, namespace).for_each(|(_, v)| f(v));
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
        // Keys sort by namespace first, so one namespace is a range: a fleet's management
        // server holds every Cluster's objects, and each Cluster asks for its namespace's.
        let from = match ns {
            Some(n) => Bound::Included((n.to_string(), String::new())),
            None => Bound::Unbounded,
        };
        self.objects
            .get(&def.storage_key())
            .map(|m| m.range((from, Bound::Unbounded)))
            .into_iter()
            .flatten()
            .take_while(move |((n, _), _)| ns.is_none_or(|want| want == n))
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
        super::validate::admit_custom(&self.registry, def, &mut merged, Some(&old))?;
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
}

fn is_pod(def: &ResourceDef) -> bool {
    def.builtin && def.group.is_empty() && def.plural == "pods"
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

#[cfg(test)]
mod tests {
    use super::admission::spec_changed;
    use super::*;
    use crate::registry::CapiVersions;

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

    #[test]
    fn one_namespace_is_its_objects_only_beside_a_longer_namesake() {
        // "fleet-1" sorts right before "fleet-10": a namespace's range must stop at its end.
        let (s, reg) = store();
        let (ns, cm) = (
            reg.by_name("namespaces").unwrap(),
            reg.by_name("configmaps").unwrap(),
        );
        for n in ["fleet-0", "fleet-1", "fleet-10", "fleet-2"] {
            let mut inner = s.lock();
            inner
                .create(ns, "", json!({"metadata": {"name": n}}))
                .unwrap();
            for name in ["a", "b"] {
                inner
                    .create(cm, n, json!({"metadata": {"name": name}}))
                    .unwrap();
            }
        }
        let mut seen = Vec::new();
        s.visit_in("configmaps", Some("fleet-1"), |v| {
            let meta = &v["metadata"];
            seen.push(format!(
                "{}/{}",
                meta["namespace"].as_str().unwrap(),
                meta["name"].as_str().unwrap()
            ));
        });
        assert_eq!(seen, ["fleet-1/a", "fleet-1/b"]);
        assert_eq!(s.list("configmaps", Some("fleet-10")).len(), 2);
        assert!(s.list("configmaps", Some("fleet-")).is_empty());
        assert_eq!(s.list("configmaps", None).len(), 8);
    }
}
