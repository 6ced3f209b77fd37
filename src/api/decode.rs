//! Per-object decoding for watches. A watch of `NodePool` fails as a whole (and re-lists over
//! and over) when one object does not decode, e.g. an `expireAfter` that overflows: serde gives
//! up on the list and the watcher retries it for ever, so no NodePool is seen and the bad one
//! never learns why. Watching `Lenient<NodePool>` instead decodes each object on its own: a good
//! one arrives as `Lenient::Ok`, a bad one as `Lenient::Bad` with its metadata and the path of
//! the field that failed (via `serde_path_to_error`), so the actor can report it on the object
//! and keep serving the rest.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

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
        let mut value = Value::deserialize(d)?;
        // managedFields is never read here and is often the larger part of an object: dropped
        // before the typed decode, so a re-list's thousands of claims never hold it (at 5,000
        // NodeClaims it was 72 of the controller's 165 MiB heap peak).
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
        Ok(match decode::<K>(&value) {
            Ok(k) => Lenient::Ok(k),
            Err(m) => Lenient::Bad(m),
        })
    }
}

/// The wrapper is the same resource as `K` (same URL, group, version, kind), so `Api<Lenient<K>>`
/// lists and watches exactly what `Api<K>` does.
impl<K> Resource for Lenient<K>
where
    K: Resource<DynamicType = ()>,
{
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
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
    fn managed_fields_are_dropped_before_the_typed_decode() {
        let mut v = pool("720h");
        v["metadata"]["managedFields"] = json!([{"manager": "kubectl", "operation": "Apply",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:template": {}}}}]);
        let decoded: Lenient<NodePool> = serde_json::from_value(v).unwrap();
        let Lenient::Ok(p) = decoded else {
            panic!("decodes")
        };
        assert_eq!(p.metadata.managed_fields, None);
        assert_eq!(p.metadata.name.as_deref(), Some("p"));
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
}
