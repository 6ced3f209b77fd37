//! An object as its watch decodes it: a k8s-openapi object (metadata, spec, status) whose
//! `metadata.managedFields`, and whatever of its spec and status its index drops
//! (`state::trim`), are skipped while the JSON is parsed, never built. On a real API server
//! every object carries managedFields, whose `fieldsV1` decodes into a `serde_json::Value` tree
//! only for the index to drop it, and a pod or a kubelet's Node carries much besides that the
//! index drops too (container statuses; the image list, node info, addresses): decoding those was
//! most of the controller's CPU on a real control plane. Every kept field is handed to
//! k8s-openapi's own `Deserialize`, so it decodes (and fails) as it does in the whole object:
//! a watched object, trimmed, is the whole object trimmed (each kind's tests check it).

use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{self, DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, MapAccess};
use serde::de::{Deserialize, Visitor};

use crate::api::partial::{self, Keep};

/// A kind whose watch skips what its index drops: where its three parts are, and the rules its
/// spec and status are read by.
pub(crate) trait Slimmed: kube::Resource<DynamicType = ()> + Default {
    type Spec: DeserializeOwned;
    type Status: DeserializeOwned;
    /// What of the spec is read.
    const SPEC: Keep;
    /// What of the status is read.
    const STATUS: Keep;
    fn parts(&mut self) -> Parts<'_, Self::Spec, Self::Status>;
}

/// An object's metadata, spec and status, to fill in.
pub(crate) struct Parts<'a, Spec, Status> {
    pub(crate) metadata: &'a mut ObjectMeta,
    pub(crate) spec: &'a mut Option<Spec>,
    pub(crate) status: &'a mut Option<Status>,
}

/// A watched `K` (see the module doc): the same resource as `K` for `Api` and the watcher.
#[derive(Clone, Debug, Default)]
pub(crate) struct Watched<K>(pub(crate) K);

impl<K> Watched<K> {
    pub(crate) fn into_inner(self) -> K {
        self.0
    }
}

/// The object's fields read; `apiVersion`, `kind` and unknown ones are skipped.
const NAMES: &[&str] = &["metadata", "spec", "status"];

/// A map key, as its place in [`NAMES`] (`None`: a key skipped unread), read without
/// allocating.
struct KeyIn;

impl<'de> DeserializeSeed<'de> for KeyIn {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl Visitor<'_> for KeyIn {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(NAMES.iter().position(|n| *n == v))
    }
}

impl<'de, K: Slimmed> Deserialize<'de> for Watched<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ObjectVisitor(PhantomData))
    }
}

struct ObjectVisitor<K>(PhantomData<K>);

impl<'de, K: Slimmed> Visitor<'de> for ObjectVisitor<K> {
    type Value = Watched<K>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {}", K::kind(&()))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Watched<K>, A::Error> {
        let mut object = K::default();
        while let Some(key) = map.next_key_seed(KeyIn)? {
            match key {
                Some(i) => field(&mut object, i, &mut map)?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Watched(object))
    }
}

/// Reads the value of the field `NAMES[i]` from `map` into `object`, under its rule.
fn field<'de, K: Slimmed, A: MapAccess<'de>>(
    object: &mut K,
    i: usize,
    map: &mut A,
) -> Result<(), A::Error> {
    let Parts {
        metadata,
        spec,
        status,
    } = object.parts();
    match i {
        0 => {
            *metadata = map
                .next_value_seed(partial::Seed {
                    seed: PhantomData::<Option<ObjectMeta>>,
                    keep: partial::METADATA,
                })
                .map_err(|e| named::<K, _>(metadata, "metadata", e))?
                .unwrap_or_default();
        }
        1 => {
            *spec = map
                .next_value_seed(partial::Seed {
                    seed: PhantomData,
                    keep: K::SPEC,
                })
                .map_err(|e| named::<K, _>(metadata, "spec", e))?
        }
        _ => {
            *status = map
                .next_value_seed(partial::Seed {
                    seed: PhantomData,
                    keep: K::STATUS,
                })
                .map_err(|e| named::<K, _>(metadata, "status", e))?
        }
    }
    Ok(())
}

/// A decoding error that names the object (its metadata comes first from an API server) and the
/// part that failed, so the watch's log says which object to look at.
fn named<K: Slimmed, E: de::Error>(meta: &ObjectMeta, part: &str, e: E) -> E {
    let kind = K::kind(&());
    let namespace = meta.namespace.as_deref().filter(|ns| !ns.is_empty());
    let who = match (namespace, &meta.name) {
        (Some(ns), Some(name)) => format!("{kind} {ns}/{name}"),
        (None, Some(name)) => format!("{kind} {name}"),
        _ => format!("a {kind} whose metadata was not read yet"),
    };
    E::custom(format_args!("{who}: {part}: {e}"))
}

/// The same resource as `K` (URL, group, version, kind), so `Api<Watched<K>>` lists and
/// watches exactly what `Api<K>` does.
impl<K: Slimmed> kube::Resource for Watched<K> {
    type DynamicType = ();
    type Scope = K::Scope;
    crate::api::decode::resource_names_of!(K);
    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

/// The field names `T`'s `Deserialize` reads, as it hands them to `deserialize_struct`: a
/// misspelt name in a rule would silently read (or skip) nothing, so each kind's tests check
/// its rules' names against these.
#[cfg(test)]
pub(crate) fn fields_of<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Capture<'a>(&'a mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for Capture<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("captured"))
        }
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Capture(&mut fields));
    fields
}

/// Each name `rule` gives is a field of `T`.
#[cfg(test)]
pub(crate) fn assert_names_fields_of<T: DeserializeOwned>(rule: &Keep) {
    let Keep::Object(rule) = rule else {
        panic!("an object's rule")
    };
    let fields = fields_of::<T>();
    assert!(!fields.is_empty());
    for name in rule.names() {
        assert!(fields.contains(&name), "{name} is not one of {fields:?}");
    }
}
