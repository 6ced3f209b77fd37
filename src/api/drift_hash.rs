//! The NodePool drift hash exactly as upstream Karpenter computes it, so NodeClaims move between
//! upstream Karpenter (or the Go Cluster API provider) and this controller, in both directions,
//! without the whole fleet counting as drifted.
//!
//! Upstream hashes `spec.template` as its Go value with `hashstructure` (v2, format 2, options
//! `SlicesAsSets`, `IgnoreZeroValue`, `ZeroNil`), skipping the fields tagged `hash:"ignore"`
//! (`requirements`, `resources`, a duration's raw text). That walk is reproduced here over the
//! same shapes:
//! - a string hashes its bytes, an integer its 8 little-endian bytes, with 64-bit FNV-1;
//! - a struct starts from the hash of its Go type name and folds in each field that is not the
//!   zero value: `h = finish(h ^ ordered(hash(field name), hash(value)))`;
//! - a map is `finish` of the XOR of `ordered(hash(key), hash(value))` over its entries, so an
//!   empty map (present, not nil) still counts, and differs from an absent one;
//! - a slice is the XOR of its elements' hashes (a set: order does not matter, and a repeated
//!   element cancels out, as upstream's does);
//! - `ordered(a, b)` is the hash of `a` then `b` as little-endian bytes, `finish(a)` the hash of
//!   `a` alone.
//!
//! The Go types' names, field names and field order are part of the hash, so they are spelled
//! out below as upstream declares them. Test vectors in this module's tests were produced by
//! upstream's own type definitions and hashing library.

use k8s_openapi::api::core::v1::Taint;

use super::duration::NillableDuration;
use super::nodepool::NodePool;

/// FNV-1 (not 1a), 64 bit: Go's `hash/fnv.New64`, the hasher `hashstructure` defaults to.
fn fnv1(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, b| h.wrapping_mul(PRIME) ^ u64::from(*b))
}

fn string(s: &str) -> u64 {
    fnv1(s.as_bytes())
}

fn int(v: i64) -> u64 {
    fnv1(&v.to_le_bytes())
}

fn ordered(a: u64, b: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_le_bytes());
    bytes[8..].copy_from_slice(&b.to_le_bytes());
    fnv1(&bytes)
}

fn finish(a: u64) -> u64 {
    fnv1(&a.to_le_bytes())
}

/// A Go struct being hashed: its type name, then each non-zero field in declaration order.
struct Struct(u64);

impl Struct {
    fn new(type_name: &str) -> Self {
        Struct(string(type_name))
    }

    /// A field whose value is not Go's zero value (callers skip zero fields, as upstream's
    /// `IgnoreZeroValue` does; a skipped field leaves no trace, not even the finishing step).
    fn field(mut self, name: &str, value: u64) -> Self {
        self.0 = finish(self.0 ^ ordered(string(name), value));
        self
    }

    /// A string field, skipped when empty.
    fn string(self, name: &str, value: &str) -> Self {
        if value.is_empty() {
            self
        } else {
            self.field(name, string(value))
        }
    }

    fn done(self) -> u64 {
        self.0
    }
}

/// A `map[string]string`: `None` is Go's nil map (a zero value, skipped by the caller).
fn map<'a>(entries: impl Iterator<Item = (&'a String, &'a String)>) -> u64 {
    finish(
        entries
            .map(|(k, v)| ordered(string(k), string(v)))
            .fold(0, |h, e| h ^ e),
    )
}

/// A slice hashed as a set.
fn set(items: impl Iterator<Item = u64>) -> u64 {
    items.fold(0, |h, e| h ^ e)
}

/// Nanoseconds as a Go `time.Duration` holds them.
fn nanos(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// `metav1.Duration{Duration time.Duration}`.
fn duration(d: std::time::Duration) -> u64 {
    let mut s = Struct::new("Duration");
    if !d.is_zero() {
        s = s.field("Duration", int(nanos(d)));
    }
    s.done()
}

/// `metav1.Time{time.Time}`: the embedded `time.Time` hashes its `MarshalBinary` form. Upstream
/// decodes API times into the controller's local zone; this assumes that zone is UTC (offset
/// 0, not Go's UTC marker), as in a container without a `TZ`.
fn time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> u64 {
    // Seconds from January 1 of year 1 (Go's internal epoch) to the Unix epoch.
    const UNIX_TO_INTERNAL: i64 = 62_135_596_800;
    let ts = t.0;
    let mut b = Vec::with_capacity(15);
    b.push(1u8); // format version 1: whole-minute zone offset
    b.extend_from_slice(&(ts.as_second() + UNIX_TO_INTERNAL).to_be_bytes());
    b.extend_from_slice(&ts.subsec_nanosecond().to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    Struct::new("Time").field("Time", fnv1(&b)).done()
}

/// `core/v1.Taint{Key, Value, Effect, TimeAdded}`.
fn taint(t: &Taint) -> u64 {
    let mut s = Struct::new("Taint")
        .string("Key", &t.key)
        .string("Value", t.value.as_deref().unwrap_or(""))
        .string("Effect", &t.effect);
    if let Some(added) = &t.time_added {
        s = s.field("TimeAdded", time(added));
    }
    s.done()
}

/// Upstream's `NodePool.Hash()`: the decimal form of the hash of `spec.template`.
pub fn nodepool_hash(np: &NodePool) -> String {
    let template = &np.spec.template;
    let spec = &template.spec;

    let mut root = Struct::new("NodeClaimTemplate");
    // ObjectMeta{Labels, Annotations}, embedded: zero when both maps are nil.
    if let Some(meta) = template
        .metadata
        .as_ref()
        .filter(|m| m.labels.is_some() || m.annotations.is_some())
    {
        let mut m = Struct::new("ObjectMeta");
        if let Some(labels) = &meta.labels {
            m = m.field("Labels", map(labels.iter()));
        }
        if let Some(annotations) = &meta.annotations {
            m = m.field("Annotations", map(annotations.iter()));
        }
        root = root.field("ObjectMeta", m.done());
    }

    // NodeClaimTemplateSpec{Taints, StartupTaints, Requirements (ignored), NodeClassRef,
    // TerminationGracePeriod, ExpireAfter}. NodeClassRef is a pointer the API always sets, so
    // the spec is never the zero value.
    let mut s = Struct::new("NodeClaimTemplateSpec");
    if let Some(taints) = &spec.taints {
        s = s.field("Taints", set(taints.iter().map(taint)));
    }
    if let Some(taints) = &spec.startup_taints {
        s = s.field("StartupTaints", set(taints.iter().map(taint)));
    }
    let class = &spec.node_class_ref;
    s = s.field(
        "NodeClassRef",
        Struct::new("NodeClassReference")
            .string("Kind", &class.kind)
            .string("Name", &class.name)
            .string("Group", &class.group)
            .done(),
    );
    if let Some(tgp) = &spec.termination_grace_period {
        s = s.field("TerminationGracePeriod", duration(tgp.0));
    }
    // NillableDuration{*time.Duration, Raw (ignored)}: "Never" decodes to the zero value.
    if let Some(NillableDuration::After(d)) = &spec.expire_after {
        s = s.field(
            "ExpireAfter",
            Struct::new("NillableDuration")
                .field("Duration", int(nanos(*d)))
                .done(),
        );
    }
    root = root.field("Spec", s.done());
    root.done().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(spec.template as JSON, upstream's hash)`, produced by Karpenter v1.14.1's own type
    /// definitions hashed with its hashing library (hashstructure v2.0.2) by a Go program outside
    /// this repository.
    const VECTORS: &[(&str, &str)] = &[
        (
            r#"{"spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}], "expireAfter": "720h"}}"#,
            "18334128632711491354",
        ),
        (
            r#"{"spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [], "expireAfter": "Never"}}"#,
            "14327136011462032137",
        ),
        (
            r#"{"spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}], "expireAfter": "720h"}}"#,
            "18334128632711491354",
        ),
        (
            r#"{"metadata": {"labels": {"team": "a", "tier": "web"}}, "spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [], "expireAfter": "720h"}}"#,
            "5626587763754066895",
        ),
        (
            r#"{"metadata": {"labels": {"tier": "web", "team": "a"}, "annotations": {"example.com/owner": "platform"}}, "spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [], "expireAfter": "720h"}}"#,
            "4821722437410104655",
        ),
        (
            r#"{"spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [], "expireAfter": "720h", "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}, {"key": "spot", "effect": "PreferNoSchedule"}]}}"#,
            "12517333849965289726",
        ),
        (
            r#"{"spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [], "expireAfter": "720h", "taints": [{"key": "spot", "effect": "PreferNoSchedule"}, {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}"#,
            "12517333849965289726",
        ),
        (
            r#"{"spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [], "expireAfter": "720h", "startupTaints": [{"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoExecute"}]}}"#,
            "9765560801353167893",
        ),
        (
            r#"{"spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [], "expireAfter": "24h", "terminationGracePeriod": "48h"}}"#,
            "5084606934947813323",
        ),
        (
            r#"{"spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "other"}, "requirements": [], "expireAfter": "1h30m", "terminationGracePeriod": "90s"}}"#,
            "4372808360305451936",
        ),
        (
            r#"{"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}, "requirements": [], "expireAfter": "720h"}}"#,
            "6821555240594823858",
        ),
        (
            r#"{"metadata": {"labels": {"a": ""}}, "spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [], "expireAfter": "720h", "taints": [{"key": "dedicated", "effect": "NoSchedule"}], "startupTaints": [{"key": "dedicated", "effect": "NoSchedule"}]}}"#,
            "15886946751529659628",
        ),
        (
            r#"{"metadata": {"labels": {}, "annotations": {}}, "spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [], "taints": [], "expireAfter": "720h"}}"#,
            "780860545780486384",
        ),
        (
            r#"{"spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [], "expireAfter": "720h", "taints": [{"key": "k", "value": "v", "effect": "NoExecute", "timeAdded": "2024-01-02T03:04:05Z"}]}}"#,
            "15164419112488972775",
        ),
    ];

    /// Templates using what Karpenter v1.15 added (Gte and Lte requirements, a zero grace
    /// period), hashed by upstream's own code at kubernetes-sigs/karpenter 2266468 (main on
    /// 2026-08-20, the v1.15 line: `NodePoolHashVersion` still "v3", `Hash()` and the template's
    /// types unchanged since v1.14.1, hashstructure still v2.0.2) and at v1.14.1, which gave the
    /// same values; both also gave every value of [`VECTORS`] again.
    const V1_15_VECTORS: &[(&str, &str)] = &[
        (
            r#"{"spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [{"key": "example.com/generation", "operator": "Gte", "values": ["3"]}, {"key": "example.com/memory-gib", "operator": "Lte", "values": ["256"]}], "expireAfter": "720h"}}"#,
            "18334128632711491354",
        ),
        (
            r#"{"metadata": {"labels": {"team": "a"}}, "spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"], "minValues": 1}], "expireAfter": "720h", "terminationGracePeriod": "0s", "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}"#,
            "6453564428879478967",
        ),
    ];

    /// Karpenter v1.15 did not change the NodePool hash: same version, same values, so claims
    /// stamped by v1.14 or v1.15 (upstream's or the Go provider's) and by this controller are
    /// read alike. `consolidateAfter`, which v1.15's CRD now defaults, is outside
    /// `spec.template`: a pool stored without it (v1.14.1 required it) hashes as one with it.
    #[test]
    fn karpenter_v1_15_hashes_as_v1_14_did() {
        assert_eq!(crate::api::wellknown::NODEPOOL_HASH_VERSION, "v3");
        for (i, (template, want)) in V1_15_VECTORS.iter().enumerate() {
            assert_eq!(
                nodepool_hash(&pool(template)),
                *want,
                "vector {i}: {template}"
            );
        }
        let with = |disruption: serde_json::Value| -> NodePool {
            let mut np = pool(VECTORS[0].0);
            np.spec.disruption = serde_json::from_value(disruption).expect("disruption");
            np
        };
        let hash = nodepool_hash(&pool(VECTORS[0].0));
        for disruption in [
            serde_json::json!(null),
            serde_json::json!({"consolidationPolicy": "WhenEmpty"}),
            serde_json::json!({"consolidateAfter": "0s", "budgets": [{"nodes": "10%"}]}),
            serde_json::json!({"consolidateAfter": "10m"}),
        ] {
            assert_eq!(
                nodepool_hash(&with(disruption.clone())),
                hash,
                "{disruption}"
            );
        }
    }

    fn pool(template: &str) -> NodePool {
        let template: serde_json::Value = serde_json::from_str(template).expect("vector JSON");
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "vector"},
            "spec": {"template": template},
        }))
        .expect("vector NodePool")
    }

    #[test]
    fn matches_upstreams_own_hashes() {
        for (i, (template, want)) in VECTORS.iter().enumerate() {
            assert_eq!(
                nodepool_hash(&pool(template)),
                *want,
                "vector {i}: {template}"
            );
        }
    }

    #[test]
    fn fnv1_is_gos_fnv64() {
        // Go: fnv.New64() over "a" and over nothing.
        assert_eq!(fnv1(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1(b"a"), 0xaf63_bd4c_8601_b7be);
    }
}
