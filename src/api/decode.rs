//! Per-object decoding for watches. A watch of `NodePool` fails as a whole (and re-lists over
//! and over) when one object does not decode, e.g. an `expireAfter` that overflows: serde gives
//! up on the list and the watcher retries it for ever, so no NodePool is seen and the bad one
//! never learns why. Watching `Lenient<NodePool>` instead decodes each object on its own: a good
//! one arrives as `Lenient::Ok`, a bad one as `Lenient::Bad` with its metadata and the path of
//! the field that failed (via `serde_path_to_error`), so the actor can report it on the object
//! and keep serving the rest.
//!
//! A good object, the common case, is decoded in one pass from its text (`metadata.managedFields`
//! skipped as it is parsed, never built); only a bad one is parsed again whole, into a `Value`,
//! to say what failed. Decoding every object twice (a `Value`, then the type from it) was 0.30 ms
//! of controller CPU per NodeClaim in a burst against kube-apiserver (docs/benchmarks.md). The
//! text is there to keep because kube's watcher reads each event line and each list body with
//! `serde_json::from_str`, and an event's `object` after its `type`, as API servers write it
//! (serde would buffer an `object` that came first, and the event would fail).

use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, DeserializeSeed};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::api::partial;

/// An object the types could not decode: what identifies it, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Malformed {
    pub metadata: ObjectMeta,
    /// The field that failed, e.g. `spec.template.spec.expireAfter` (empty for the root).
    pub path: String,
    /// The decoder's reason, e.g. `invalid duration "99999999999999999999h": too large`.
    pub error: String,
    /// The object's `status.conditions` as stored, so a status written for the bad object keeps
    /// the transition times of conditions that did not change.
    pub conditions: Option<Value>,
}

impl Malformed {
    /// `"<path>: <error>"`, the form condition messages and Events use.
    pub fn message(&self) -> String {
        if self.path.is_empty() || self.path == "." {
            self.error.clone()
        } else {
            format!("{}: {}", self.path, self.error)
        }
    }
}

impl Malformed {
    /// A reference for Events about this object, as `K`'s kind.
    pub fn object_ref<K: Resource<DynamicType = ()>>(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            name: self.metadata.name.clone(),
            namespace: self.metadata.namespace.clone(),
            uid: self.metadata.uid.clone(),
            resource_version: self.metadata.resource_version.clone(),
            field_path: None,
        }
    }
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

/// One watched object: decoded, or kept as [`Malformed`].
#[derive(Clone, Debug)]
pub enum Lenient<K> {
    Ok(K),
    Bad(Box<Malformed>),
}

impl<K> Lenient<K> {
    pub fn ok(self) -> Option<K> {
        match self {
            Lenient::Ok(k) => Some(k),
            Lenient::Bad(_) => None,
        }
    }
}

/// Decodes `value` as `K`, or explains which field failed.
pub fn decode<K: DeserializeOwned>(value: &Value) -> Result<K, Box<Malformed>> {
    serde_path_to_error::deserialize::<_, K>(value).map_err(|e| {
        let path = e.path().to_string();
        let error = e.into_inner().to_string();
        // The API server guarantees metadata's shape; if even that fails, keep what we can so
        // the report still names the object.
        let metadata = value
            .get("metadata")
            .and_then(|m| ObjectMeta::deserialize(m).ok())
            .unwrap_or_else(|| ObjectMeta {
                name: value
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(String::from),
                namespace: value
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .map(String::from),
                ..ObjectMeta::default()
            });
        Box::new(Malformed {
            metadata,
            path,
            error,
            conditions: value.pointer("/status/conditions").cloned(),
        })
    })
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Only a body that is not JSON at all fails here; any JSON object becomes Ok or Bad.
        // The object is kept as its text, not parsed into a `Value`: the common, good object is
        // then parsed once, straight into `K`.
        let raw = Box::<RawValue>::deserialize(d)?;
        Ok(lenient(raw.get()))
    }
}

/// `json` decoded as `K` in one pass, `metadata.managedFields` skipped as it is parsed: it is
/// never read here and is often the larger part of an object (at 5,000 NodeClaims it was 72 of
/// the controller's 165 MiB heap peak when it was built and then dropped).
fn lenient<K: DeserializeOwned>(json: &str) -> Lenient<K> {
    let one_pass = partial::Seed {
        seed: PhantomData::<K>,
        keep: partial::OBJECT,
    }
    .deserialize(&mut serde_json::Deserializer::from_str(json));
    match one_pass {
        Ok(k) => Lenient::Ok(k),
        Err(_) => explained(json),
    }
}

/// A bad object, parsed again whole to say what failed. Rare, so it may cost a second pass; the
/// typed decode of a `Value` gives the field's path and a reason without the parser's line and
/// column (meaningless to whoever reads the condition), and the metadata and conditions as stored.
fn explained<K: DeserializeOwned>(json: &str) -> Lenient<K> {
    let mut value: Value = match serde_json::from_str(json) {
        Ok(value) => value,
        // Cannot happen for text the watch's parser accepted as one value; kept as a report
        // rather than a panic all the same.
        Err(e) => {
            return Lenient::Bad(Box::new(Malformed {
                metadata: ObjectMeta::default(),
                path: String::new(),
                error: e.to_string(),
                conditions: None,
            }));
        }
    };
    // Dropped so that a bad object's kept metadata never holds it either.
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    match decode::<K>(&value) {
        // Only a type that reads text and a `Value` differently could fail one and not the
        // other; what decodes is kept.
        Ok(k) => Lenient::Ok(k),
        Err(m) => Lenient::Bad(m),
    }
}

/// A wrapper's `kube::Resource` names (kind, group, version, plural): the wrapped `$k`'s, so
/// `Api` reads the same URL for both (`Lenient` here, `state::watched::Watched`).
macro_rules! resource_names_of {
    ($k:ident) => {
        fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
            <$k as kube::Resource>::kind(dt)
        }
        fn group(dt: &()) -> std::borrow::Cow<'_, str> {
            <$k as kube::Resource>::group(dt)
        }
        fn version(dt: &()) -> std::borrow::Cow<'_, str> {
            <$k as kube::Resource>::version(dt)
        }
        fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
            <$k as kube::Resource>::plural(dt)
        }
    };
}
pub(crate) use resource_names_of;

/// The wrapper is the same resource as `K` (same URL, group, version, kind), so `Api<Lenient<K>>`
/// lists and watches exactly what `Api<K>` does.
impl<K> Resource for Lenient<K>
where
    K: Resource<DynamicType = ()>,
{
    type DynamicType = ();
    type Scope = K::Scope;
    resource_names_of!(K);
    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Ok(k) => k.meta(),
            Lenient::Bad(m) => &m.metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Ok(k) => k.meta_mut(),
            Lenient::Bad(m) => &mut m.metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::nodepool::NodePool;
    use serde_json::json;

    fn pool(expire: &str) -> Value {
        json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "p", "resourceVersion": "7"},
            "spec": {"template": {"spec": {
                "nodeClassRef": {"group": "g", "kind": "k", "name": "n"},
                "requirements": [],
                "expireAfter": expire,
            }}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                "message": "", "lastTransitionTime": "2024-01-01T00:00:00Z"}]},
        })
    }

    #[test]
    fn a_bad_field_is_kept_with_its_path_and_the_metadata() {
        let bad = decode::<NodePool>(&pool("99999999999999999999999h")).unwrap_err();
        assert_eq!(bad.path, "spec.template.spec.expireAfter");
        assert!(bad.error.contains("too large"), "{}", bad.error);
        assert_eq!(bad.metadata.name.as_deref(), Some("p"));
        assert_eq!(bad.metadata.resource_version.as_deref(), Some("7"));
        assert!(bad.conditions.is_some());
        assert!(
            bad.message()
                .starts_with("spec.template.spec.expireAfter: ")
        );
        assert!(decode::<NodePool>(&pool("720h")).is_ok());
    }

    #[test]
    fn a_list_with_one_bad_item_decodes_the_others() {
        let list = json!([
            pool("720h"),
            pool("99999999999999999999999h"),
            pool("Never")
        ]);
        // What the watch did before: one bad item fails the whole list.
        assert!(serde_json::from_value::<Vec<NodePool>>(list.clone()).is_err());
        let items: Vec<Lenient<NodePool>> = serde_json::from_value(list).unwrap();
        let ok = items.iter().filter(|i| matches!(i, Lenient::Ok(_))).count();
        assert_eq!(ok, 2);
        assert_eq!(Lenient::<NodePool>::plural(&()), "nodepools");
        assert_eq!(Lenient::<NodePool>::group(&()), "karpenter.sh");
    }

    #[test]
    fn sequence_indices_appear_in_the_path() {
        let mut v = pool("720h");
        v["spec"]["template"]["spec"]["requirements"] = json!([{"key": "a", "operator": "In", "values": ["x"]}, {"key": "b", "operator": "Sometimes"}]);
        let bad = decode::<NodePool>(&v).unwrap_err();
        assert!(
            bad.path.contains("requirements[1].operator"),
            "{}",
            bad.path
        );
    }

    /// `v` with managedFields from two managers, as kube-apiserver serves it.
    fn with_managed_fields(mut v: Value) -> Value {
        v["metadata"]["managedFields"] = json!([
            {"manager": "kubectl", "operation": "Apply", "apiVersion": "karpenter.sh/v1",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:template": {".": {}}}}},
            {"manager": "karpenter-capi", "operation": "Update", "subresource": "status",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}}
        ]);
        v
    }

    #[test]
    fn a_good_object_with_managed_fields_decodes_as_the_same_object_without() {
        let without = pool("720h");
        let text = serde_json::to_string(&with_managed_fields(without.clone())).unwrap();
        let Lenient::Ok(decoded) = serde_json::from_str::<Lenient<NodePool>>(&text).unwrap() else {
            panic!("a good object decodes")
        };
        assert_eq!(
            decoded,
            serde_json::from_value::<NodePool>(without).unwrap()
        );
        assert_eq!(decoded.metadata.managed_fields, None);
        // From a `Value` too (serde_json hands `RawValue` its text), as tests build objects.
        let from_value = serde_json::from_str::<Value>(&text).unwrap();
        let Lenient::Ok(p) = serde_json::from_value::<Lenient<NodePool>>(from_value).unwrap()
        else {
            panic!("a good object decodes from a Value")
        };
        assert_eq!(p, decoded);
    }

    #[test]
    fn a_bad_object_read_from_text_keeps_its_metadata_path_reason_and_conditions() {
        let mut v = with_managed_fields(pool("720h"));
        v["metadata"]["labels"] = json!({"team": "a"});
        v["spec"]["template"]["spec"]["requirements"] =
            json!([{"key": "a", "operator": "In", "values": "x"}]);
        let text = serde_json::to_string(&v).unwrap();
        let Lenient::Bad(bad) = serde_json::from_str::<Lenient<NodePool>>(&text).unwrap() else {
            panic!("a wrong type deep in spec is reported")
        };
        assert_eq!(bad.path, "spec.template.spec.requirements[0].values");
        // The reason as the typed decode gives it, without the parser's line and column.
        assert_eq!(
            bad.error,
            r#"invalid type: string "x", expected a sequence"#
        );
        assert_eq!(bad.metadata.name.as_deref(), Some("p"));
        assert_eq!(bad.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(
            bad.metadata.labels.as_ref().and_then(|l| l.get("team")),
            Some(&"a".to_string())
        );
        assert_eq!(bad.metadata.managed_fields, None);
        assert_eq!(bad.conditions.as_ref(), v.pointer("/status/conditions"));

        let text = serde_json::to_string(&pool("99999999999999999999h")).unwrap();
        let Lenient::Bad(bad) = serde_json::from_str::<Lenient<NodePool>>(&text).unwrap() else {
            panic!("an overflowing expireAfter is reported")
        };
        assert_eq!(bad.path, "spec.template.spec.expireAfter");
        assert!(bad.error.contains("too large"), "{}", bad.error);
        assert!(!bad.error.contains("line"), "{}", bad.error);
    }

    /// The shapes kube's watcher reads (each event line, and a list's body, with
    /// `serde_json::from_str`): every object decoded on its own, a bad one among good ones.
    #[test]
    fn watch_events_and_lists_read_from_text_decode_each_object_on_its_own() {
        use kube::core::{ObjectList, WatchEvent};
        let bad = with_managed_fields(pool("99999999999999999999h"));
        let good = with_managed_fields(pool("720h"));
        // Written as API servers write it, `type` before `object` (`json!` would sort the keys).
        let line = |kind: &str, obj: &Value| format!(r#"{{"type":"{kind}","object":{obj}}}"#);

        let added = serde_json::from_str::<WatchEvent<Lenient<NodePool>>>(&line("ADDED", &good));
        assert!(matches!(added, Ok(WatchEvent::Added(Lenient::Ok(_)))));
        let modified =
            serde_json::from_str::<WatchEvent<Lenient<NodePool>>>(&line("MODIFIED", &bad));
        let Ok(WatchEvent::Modified(Lenient::Bad(m))) = modified else {
            panic!("the bad object arrives as Bad: {modified:?}")
        };
        assert_eq!(m.path, "spec.template.spec.expireAfter");

        let list = json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePoolList",
            "metadata": {"resourceVersion": "9"}, "items": [good, bad, pool("Never")]});
        let items = serde_json::from_str::<ObjectList<Lenient<NodePool>>>(&list.to_string())
            .unwrap()
            .items;
        let ok: Vec<_> = items.iter().map(|i| matches!(i, Lenient::Ok(_))).collect();
        assert_eq!(ok, [true, false, true]);
    }
}
