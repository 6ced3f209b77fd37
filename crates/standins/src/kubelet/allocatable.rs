//! What a kubelet reports as allocatable from its capacity: memory pre-allocated as huge pages
//! is not allocatable memory (the kubelet's node allocatable takes `hugepages-*` out of it).
//! The stand-in reserves nothing else.

use std::collections::BTreeMap;

use super::super::quantity::parse_milli;

/// `capacity` with memory less every `hugepages-*` quantity, never below zero; a memory that is
/// not a quantity is left as it is.
pub(super) fn allocatable(capacity: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = capacity.clone();
    let huge: i128 = capacity
        .iter()
        .filter(|(k, _)| k.starts_with("hugepages-"))
        .filter_map(|(_, v)| parse_milli(v))
        .sum();
    if huge > 0
        && let Some(memory) = capacity.get("memory").and_then(|m| parse_milli(m))
    {
        let bytes = (memory - huge).max(0) / 1000;
        out.insert("memory".into(), bytes.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn huge_pages_are_not_allocatable_memory() {
        let cap = map(&[("memory", "20Gi"), ("hugepages-2Mi", "5Gi"), ("cpu", "4")]);
        let a = allocatable(&cap);
        assert_eq!(a["memory"], (15_i64 << 30).to_string());
        assert_eq!(a["hugepages-2Mi"], "5Gi");
        assert_eq!(a["cpu"], "4");
        let all = map(&[("memory", "4Gi"), ("hugepages-1Gi", "8Gi")]);
        assert_eq!(allocatable(&all)["memory"], "0");
        let none = map(&[("memory", "4Gi")]);
        assert_eq!(allocatable(&none), none, "nothing to take out");
    }
}
