//! The Pod as the watch decodes it: a `Pod` whose `metadata.managedFields`, and whatever of its
//! spec and status `state::trim` drops ([`slim`]), are skipped while the JSON is parsed, never
//! built. On a real API server every pod carries managedFields, whose
//! `fieldsV1` decodes into a `serde_json::Value` tree only for the index to drop it
//! (`state::trim`): a quarter of the controller's CPU on a real control plane went to decoding
//! pods, most of it that tree. Everything else decodes as `Pod` does, so the index keeps what it
//! kept before: a watched pod, trimmed, is the whole pod trimmed.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use crate::api::partial;

/// A watched Pod (see the module doc): the same resource as `Pod` for `Api` and the watcher.
#[derive(Clone, Debug, Default)]
pub(crate) struct WatchedPod(pub(crate) Pod);

impl WatchedPod {
    pub(crate) fn into_pod(self) -> Pod {
        self.0
    }
}

/// A map key, as its place in a list of known names (`None`: a key skipped unread), read
/// without allocating.
struct KeyIn(&'static [&'static str]);

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
        Ok(self.0.iter().position(|n| *n == v))
    }
}

/// A map read field by field into `Self`: the fields named in `NAMES` by [`Fields::field`],
/// any other skipped unread (`IgnoredAny`).
trait Fields: Default {
    const NAMES: &'static [&'static str];
    const WHAT: &'static str;
    /// Reads the value of the field `NAMES[i]` from `map`.
    fn field<'de, A: MapAccess<'de>>(&mut self, i: usize, map: &mut A) -> Result<(), A::Error>;
}

/// Deserializes a [`Fields`] type from a map.
struct FieldsVisitor<T>(PhantomData<T>);

impl<'de, T: Fields> Visitor<'de> for FieldsVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::WHAT)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut value = T::default();
        while let Some(key) = map.next_key_seed(KeyIn(T::NAMES))? {
            match key {
                Some(i) => value.field(i, &mut map)?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(value)
    }
}

impl<'de> Deserialize<'de> for WatchedPod {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(FieldsVisitor(PhantomData))
    }
}

/// The Pod's fields read; `apiVersion`, `kind` and unknown ones are skipped.
impl Fields for WatchedPod {
    const NAMES: &'static [&'static str] = &["metadata", "spec", "status"];
    const WHAT: &'static str = "a Pod";
    fn field<'de, A: MapAccess<'de>>(&mut self, i: usize, map: &mut A) -> Result<(), A::Error> {
        let pod = &mut self.0;
        match i {
            0 => {
                pod.metadata = map
                    .next_value_seed(partial::Seed {
                        seed: PhantomData::<Option<ObjectMeta>>,
                        keep: partial::METADATA,
                    })
                    .map_err(|e| named(pod, "metadata", e))?
                    .unwrap_or_default();
            }
            1 => {
                pod.spec = map
                    .next_value_seed(partial::Seed {
                        seed: PhantomData,
                        keep: slim::SPEC,
                    })
                    .map_err(|e| named(pod, "spec", e))?
            }
            _ => {
                pod.status = map
                    .next_value_seed(partial::Seed {
                        seed: PhantomData,
                        keep: slim::STATUS,
                    })
                    .map_err(|e| named(pod, "status", e))?
            }
        }
        Ok(())
    }
}

/// A decoding error that names the pod (its metadata comes first from an API server) and the
/// part that failed, so the watch's log says which object to look at.
fn named<E: de::Error>(pod: &Pod, part: &str, e: E) -> E {
    let who = match (&pod.metadata.namespace, &pod.metadata.name) {
        (Some(ns), Some(name)) => Cow::Owned(format!("pod {ns}/{name}")),
        (None, Some(name)) => Cow::Owned(format!("pod {name}")),
        _ => Cow::Borrowed("a pod whose metadata was not read yet"),
    };
    E::custom(format_args!("{who}: {part}: {e}"))
}

/// The same resource as `Pod` (URL, group, version, kind), so `Api<WatchedPod>` lists and
/// watches exactly what `Api<Pod>` does.
impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = <Pod as kube::Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

mod slim;

#[cfg(test)]
mod tests;
