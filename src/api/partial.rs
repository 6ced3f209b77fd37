//! Reading part of a value while it is parsed: a [`Keep`] rule names the fields of an object
//! that are skipped (or the only ones read), and a deserializer wrapped by it ([`Seed`]) hands
//! the type's own `Deserialize` impl every other field, so what is kept decodes (and fails)
//! exactly as it would whole, and what is skipped is never built. A real API server's objects
//! carry `metadata.managedFields` (often the larger part of an object), which the controller
//! never reads: the watches skip it with [`OBJECT`]; the pod and Node watches also skip what
//! their indexes drop (`state::watched`).

use std::borrow::Cow;
use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess, SeqAccess,
    Visitor,
};

/// What of a value is read.
#[derive(Clone, Copy)]
pub(crate) enum Keep {
    /// All of it.
    All,
    /// An object, some of its fields.
    Object(&'static Fields),
    /// A list, each element by this rule.
    Each(&'static Keep),
}

/// Which fields of an object are read.
pub(crate) struct Fields {
    /// Only these are read (`None`: every field but `skip`).
    pub(crate) only: Option<&'static [&'static str]>,
    /// These are skipped unread.
    pub(crate) skip: &'static [&'static str],
    /// These are read by their own rule.
    pub(crate) nested: &'static [(&'static str, Keep)],
}

impl Fields {
    fn reads(&self, key: &str) -> bool {
        !self.skip.contains(&key) && self.only.is_none_or(|only| only.contains(&key))
    }

    /// Every field name the rule names, to check them against the type's.
    #[cfg(test)]
    pub(crate) fn names(&self) -> impl Iterator<Item = &'static str> {
        let only = self.only.into_iter().flatten().copied();
        let nested = self.nested.iter().map(|(k, _)| *k);
        only.chain(self.skip.iter().copied()).chain(nested)
    }

    fn rule(&self, key: &str) -> Keep {
        self.nested
            .iter()
            .find(|(k, _)| *k == key)
            .map_or(Keep::All, |(_, keep)| *keep)
    }
}

/// An object's metadata: everything but `managedFields`.
pub(crate) const METADATA: Keep = Keep::Object(&Fields {
    only: None,
    skip: &["managedFields"],
    nested: &[],
});

/// A Kubernetes object as the controller reads it: everything but its metadata's
/// `managedFields`.
pub(crate) const OBJECT: Keep = Keep::Object(&Fields {
    only: None,
    skip: &[],
    nested: &[("metadata", METADATA)],
});

/// `seed`'s value read under `keep`.
pub(crate) struct Seed<S> {
    pub(crate) seed: S,
    pub(crate) keep: Keep,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<S> {
    type Value = S::Value;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(Slim {
            de,
            keep: self.keep,
        })
    }
}

/// A deserializer that reads its value under `keep`.
struct Slim<D> {
    de: D,
    keep: Keep,
}

/// The methods a [`Slim`] passes through unchanged.
macro_rules! pass {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.de.$method(visitor)
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Slim<D> {
    type Error = D::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        match self.keep {
            Keep::Object(only) => {
                self.de
                    .deserialize_struct(name, fields, Objects { visitor, only })
            }
            _ => self.de.deserialize_struct(name, fields, visitor),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        match self.keep {
            Keep::Each(each) => self.de.deserialize_seq(Lists { visitor, each }),
            _ => self.de.deserialize_seq(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let keep = self.keep;
        self.de.deserialize_option(Options { visitor, keep })
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de.deserialize_newtype_struct(name, visitor)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de.deserialize_unit_struct(name, visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de.deserialize_tuple(len, visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de.deserialize_tuple_struct(name, len, visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de.deserialize_enum(name, variants, visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.de.is_human_readable()
    }

    pass! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32
        deserialize_i64 deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32
        deserialize_u64 deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf
        deserialize_unit deserialize_map deserialize_identifier deserialize_ignored_any
    }
}

/// An optional value: present, it is read under `keep`.
struct Options<V> {
    visitor: V,
    keep: Keep,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Options<V> {
    type Value = V::Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }
    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_some(Slim {
            de,
            keep: self.keep,
        })
    }
}

/// A list: each element read under `each`.
struct Lists<V> {
    visitor: V,
    each: &'static Keep,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Lists<V> {
    type Value = V::Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_seq(Elements {
            seq,
            each: *self.each,
        })
    }
}

struct Elements<A> {
    seq: A,
    each: Keep,
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Elements<A> {
    type Error = A::Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        let keep = self.each;
        self.seq.next_element_seed(Seed { seed, keep })
    }
    fn size_hint(&self) -> Option<usize> {
        self.seq.size_hint()
    }
}

/// An object: the fields `only` reads, each under its own rule; the rest skipped unread.
struct Objects<V> {
    visitor: V,
    only: &'static Fields,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Objects<V> {
    type Value = V::Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(Entries {
            map,
            only: self.only,
            next: Keep::All,
        })
    }
}

struct Entries<A> {
    map: A,
    only: &'static Fields,
    /// The rule of the value after the key last handed out.
    next: Keep,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Entries<A> {
    type Error = A::Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        while let Some(Key(key)) = self.map.next_key::<Key<'de>>()? {
            if !self.only.reads(&key) {
                self.map.next_value::<IgnoredAny>()?;
                continue;
            }
            self.next = self.only.rule(&key);
            let key: de::value::CowStrDeserializer<'de, A::Error> = key.into_deserializer();
            return seed.deserialize(key).map(Some);
        }
        Ok(None)
    }
    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        let keep = self.next;
        self.map.next_value_seed(Seed { seed, keep })
    }
}

/// A map key, borrowed from the input when it can be.
struct Key<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        de.deserialize_identifier(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Owned(v)))
    }
}
