//! A NodeClaim's resource lists (`spec.resources.requests`, `status.capacity`,
//! `status.allocatable`), kept as a sorted list of pairs. Every claim holds three of them with a
//! handful of entries each; a `BTreeMap` node takes room for eleven, so at 5,000 claims the
//! maps' empty slots alone were several MiB.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A resource name -> quantity map (corev1.ResourceList), sorted by name like the `BTreeMap` it
/// stands in for (same JSON, same schema, same iteration order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResourceList(Vec<(String, Quantity)>);

impl ResourceList {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, key: &str) -> Option<&Quantity> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Sets `key`, returning what it held.
    pub fn insert(&mut self, key: String, value: Quantity) -> Option<Quantity> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<Quantity> {
        self.find(key).ok().map(|i| self.0.remove(i).1)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Entries in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Quantity)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(k, _)| k)
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }
}

impl FromIterator<(String, Quantity)> for ResourceList {
    fn from_iter<I: IntoIterator<Item = (String, Quantity)>>(iter: I) -> Self {
        // Through a map: later duplicates win and the result is sorted, as a BTreeMap's is.
        BTreeMap::from_iter(iter).into()
    }
}

impl From<BTreeMap<String, Quantity>> for ResourceList {
    fn from(map: BTreeMap<String, Quantity>) -> Self {
        let mut pairs: Vec<_> = map.into_iter().collect();
        pairs.shrink_to_fit();
        Self(pairs)
    }
}

impl<const N: usize> From<[(String, Quantity); N]> for ResourceList {
    fn from(pairs: [(String, Quantity); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl From<&ResourceList> for BTreeMap<String, Quantity> {
    fn from(list: &ResourceList) -> Self {
        list.0.iter().cloned().collect()
    }
}

impl<'a> IntoIterator for &'a ResourceList {
    type Item = (&'a String, &'a Quantity);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, Quantity)>,
        fn(&'a (String, Quantity)) -> (&'a String, &'a Quantity),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl IntoIterator for ResourceList {
    type Item = (String, Quantity);
    type IntoIter = std::vec::IntoIter<(String, Quantity)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl Serialize for ResourceList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for ResourceList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        BTreeMap::<String, Quantity>::deserialize(d).map(Self::from)
    }
}

impl schemars::JsonSchema for ResourceList {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        <BTreeMap<String, Quantity> as schemars::JsonSchema>::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <BTreeMap<String, Quantity> as schemars::JsonSchema>::json_schema(generator)
    }

    fn inline_schema() -> bool {
        <BTreeMap<String, Quantity> as schemars::JsonSchema>::inline_schema()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_and_writes_the_json_a_map_does() {
        let v = json!({"pods": "110", "cpu": "4", "memory": "16Gi"});
        let list: ResourceList = serde_json::from_value(v.clone()).unwrap();
        let map: BTreeMap<String, Quantity> = serde_json::from_value(v).unwrap();
        assert_eq!(
            serde_json::to_string(&list).unwrap(),
            serde_json::to_string(&map).unwrap()
        );
        assert_eq!(
            list.keys().collect::<Vec<_>>(),
            map.keys().collect::<Vec<_>>()
        );
        assert_eq!(list.get("cpu"), Some(&Quantity("4".into())));
        assert_eq!(list.get("gpu"), None);
        assert_eq!(BTreeMap::from(&list), map);
    }

    #[test]
    fn insert_keeps_names_sorted_and_unique() {
        let mut list = ResourceList::new();
        assert_eq!(list.insert("memory".into(), Quantity("1Gi".into())), None);
        assert_eq!(list.insert("cpu".into(), Quantity("1".into())), None);
        assert_eq!(
            list.insert("cpu".into(), Quantity("2".into())),
            Some(Quantity("1".into()))
        );
        assert_eq!(list.keys().collect::<Vec<_>>(), ["cpu", "memory"]);
        assert_eq!(list.remove("cpu"), Some(Quantity("2".into())));
        assert_eq!(list.len(), 1);
    }

    #[test]
    fn the_schema_is_a_maps() {
        let a = schemars::schema_for!(ResourceList);
        let b = schemars::schema_for!(BTreeMap<String, Quantity>);
        assert_eq!(
            a.as_value()["additionalProperties"],
            b.as_value()["additionalProperties"]
        );
        assert_eq!(a.as_value()["type"], b.as_value()["type"]);
    }
}
