//! Generated node groups (docs/generate.md): which shapes a NodeClass's `spec.generate`
//! offers, which MachineDeployment each (shape, zone) is served by, and the two objects created
//! for it (the infrastructure template copy with the patches, and the MachineDeployment copy).
//! Pure: the Catalog offers the groups, the Generator actor creates and removes them.
//!
//! A group's name is derived from its NodeClass, shape, zone, patches and the source's whole
//! `spec.template`: found again after a restart, the same for two claims racing for one shape,
//! and new when the source changes, so the old group is no longer the shape's and its claims
//! drift while it drains to zero and goes.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;

use crate::api::nodeclass::{Generate, TemplatePatch};
use crate::api::nodepool::fnv1a64;
use crate::api::resources::Quantity;
use crate::api::wellknown::{
    CA_PRICE_ANNOTATION, CPU_ANNOTATION, DEPLOYMENT_NAME_LABEL, GPU_COUNT_ANNOTATION,
    INSTANCE_TYPE_LABEL, LABELS_ANNOTATION, MAX_SIZE_ANNOTATION, MEMBER_LABEL, MEMORY_ANNOTATION,
    MIN_SIZE_ANNOTATION, PRICE_ANNOTATION, ZONE_LABEL,
};
use crate::capi::model::MachineDeployment;

/// On a generated MachineDeployment and its template: the NodeClass that generated it. Only
/// objects carrying it are ever deleted by the controller.
pub const GENERATED_LABEL: &str = "karpenter.cluster.x-k8s.io/generated-by";
/// On a generated MachineDeployment: its shape's name.
pub const SHAPE_ANNOTATION: &str = "karpenter.cluster.x-k8s.io/shape";
/// On a generated MachineDeployment: the digest of its source's Machines it was made (or last
/// rolled out) from.
pub(crate) const SOURCE_DIGEST_ANNOTATION: &str = "karpenter.cluster.x-k8s.io/source-digest";
/// How long a generated group may stay at zero replicas unless the NodeClass says.
pub(crate) const DEFAULT_IDLE_AFTER: Duration = Duration::from_secs(600);
const MIB: i128 = 1 << 20;

/// A field of `spec.generate` that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("spec.generate.{field}: {message}")]
pub struct FieldError {
    pub(crate) field: String,
    pub(crate) message: String,
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        message: message.into(),
    }
}

/// One machine shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shape {
    pub cpu: i64,
    pub memory_mib: i64,
    pub(crate) gpus: i64,
}

impl Shape {
    /// `4c-16gi`, `2c-1536mi`, `8c-32gi-1gpu`: a valid label value, the instance type's name.
    pub fn name(&self) -> String {
        let memory = if self.memory_mib % 1024 == 0 {
            format!("{}gi", self.memory_mib / 1024)
        } else {
            format!("{}mi", self.memory_mib)
        };
        let gpus = if self.gpus > 0 {
            format!("-{}gpu", self.gpus)
        } else {
            String::new()
        };
        format!("{}c-{memory}{gpus}", self.cpu)
    }

    fn memory_gib(&self) -> String {
        let gib = self.memory_mib as f64 / 1024.0;
        if gib.fract() == 0.0 {
            format!("{gib:.0}")
        } else {
            format!("{gib}")
        }
    }
}

/// `spec.generate` checked: everything the catalog and the Generator need, each field parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Valid {
    /// `namespace/name` of the source MachineDeployment.
    pub source: String,
    /// Each allowed shape with its price per hour.
    pub shapes: Vec<(Shape, f64)>,
    pub(crate) zones: Vec<String>,
    pub(crate) patches: Vec<TemplatePatch>,
    pub max_groups: usize,
    pub idle_after: Duration,
    /// `onSourceChange: Rollout`: groups keep their names and roll out.
    pub(crate) rollout: bool,
}

/// Check `spec.generate`, naming the first field that cannot be used.
pub fn validate(g: &Generate) -> Result<Valid, FieldError> {
    if g.source.name.is_empty() || g.source.namespace.is_empty() {
        return Err(refuse(
            "source",
            "namespace and name of a MachineDeployment are required",
        ));
    }
    let shapes = shape_grid(g)?;
    let priced = shapes
        .into_iter()
        .map(|s| Ok((price_of(g, &s)?, s)))
        .collect::<Result<Vec<_>, FieldError>>()?
        .into_iter()
        .map(|(p, s)| (s, p))
        .collect();
    for (i, p) in g.patches.iter().enumerate() {
        check_patch(i, p)?;
    }
    for (i, z) in g.zones.iter().enumerate() {
        if z.is_empty() {
            return Err(refuse(format!("zones[{i}]"), "must not be empty"));
        }
    }
    if g.max_machine_deployments < 1 {
        return Err(refuse("maxMachineDeployments", "must be at least 1"));
    }
    let idle_after = g.idle_after.map_or(DEFAULT_IDLE_AFTER, |d| d.0);
    if idle_after.is_zero() {
        return Err(refuse("idleAfter", "must be greater than zero"));
    }
    let rollout = match g.on_source_change.as_deref() {
        None | Some("Drift") => false,
        Some("Rollout") => true,
        Some(other) => {
            return Err(refuse(
                "onSourceChange",
                format!("{other:?} is not Drift or Rollout"),
            ));
        }
    };
    Ok(Valid {
        rollout,
        source: format!("{}/{}", g.source.namespace, g.source.name),
        shapes: priced,
        zones: g.zones.clone(),
        patches: g.patches.clone(),
        max_groups: g.max_machine_deployments as usize,
        idle_after,
    })
}

/// Every combination of CPU, memory and GPU counts within the memory-per-CPU bounds.
fn shape_grid(g: &Generate) -> Result<Vec<Shape>, FieldError> {
    let s = &g.shapes;
    if s.cpu.is_empty() || s.memory.is_empty() {
        return Err(refuse(
            "shapes",
            "cpu and memory each need one value at least",
        ));
    }
    for (i, c) in s.cpu.iter().enumerate() {
        if *c < 1 {
            return Err(refuse(format!("shapes.cpu[{i}]"), "must be at least 1"));
        }
    }
    let memory = s
        .memory
        .iter()
        .enumerate()
        .map(|(i, m)| mebibytes(&format!("shapes.memory[{i}]"), m))
        .collect::<Result<Vec<_>, _>>()?;
    let per_cpu = |field: &str, v: &Option<String>| {
        v.as_ref()
            .map(|q| mebibytes(&format!("shapes.{field}"), q))
            .transpose()
    };
    let min = per_cpu("minMemoryPerCPU", &s.min_memory_per_cpu)?;
    let max = per_cpu("maxMemoryPerCPU", &s.max_memory_per_cpu)?;
    let gpus: Vec<i64> = if s.gpus.is_empty() {
        vec![0]
    } else {
        s.gpus.clone()
    };
    if let Some(i) = gpus.iter().position(|g| *g < 0) {
        return Err(refuse(format!("shapes.gpus[{i}]"), "must not be negative"));
    }
    let mut out = Vec::new();
    for &cpu in &s.cpu {
        for &memory_mib in &memory {
            let ratio_ok = min.is_none_or(|m| memory_mib >= m * cpu)
                && max.is_none_or(|m| memory_mib <= m * cpu);
            if !ratio_ok {
                continue;
            }
            for &g in &gpus {
                out.push(Shape {
                    cpu,
                    memory_mib,
                    gpus: g,
                });
            }
        }
    }
    out.sort();
    out.dedup();
    if out.is_empty() {
        return Err(refuse(
            "shapes",
            "no combination of cpu and memory is within minMemoryPerCPU and maxMemoryPerCPU",
        ));
    }
    Ok(out)
}

/// A positive quantity of whole MiB.
fn mebibytes(field: &str, q: &str) -> Result<i64, FieldError> {
    let parsed = Quantity::from_str(q)
        .map_err(|e| refuse(field, format!("{q:?} is not a quantity: {e}")))?;
    let bytes = parsed.as_nanos() / 1_000_000_000;
    if bytes <= 0 || bytes % MIB != 0 {
        return Err(refuse(
            field,
            format!("{q:?} must be a positive whole number of MiB"),
        ));
    }
    i64::try_from(bytes / MIB).map_err(|_| refuse(field, format!("{q:?} is too large")))
}

/// The shape's price per hour: its table entry, or the sum of the rates.
fn price_of(g: &Generate, shape: &Shape) -> Result<f64, FieldError> {
    let p = &g.price;
    let name = shape.name();
    for (i, e) in p.table.iter().enumerate() {
        if e.shape == name {
            return decimal(&format!("price.table[{i}].price"), &e.price);
        }
    }
    let rate = |field: &str, v: &Option<String>| {
        v.as_ref()
            .map(|s| decimal(&format!("price.{field}"), s))
            .transpose()
    };
    let cpu = rate("perCPUHour", &p.per_cpu_hour)?;
    let gib = rate("perGiBHour", &p.per_gib_hour)?;
    let gpu = rate("perGPUHour", &p.per_gpu_hour)?;
    if cpu.is_none() && gib.is_none() && p.table.is_empty() {
        return Err(refuse(
            "price",
            "set perCPUHour and perGiBHour, or a table naming every shape",
        ));
    }
    if cpu.is_none() && gib.is_none() {
        return Err(refuse(
            "price.table",
            format!("no entry for shape {name}, and no rates to price it"),
        ));
    }
    let memory_gib = shape.memory_mib as f64 / 1024.0;
    Ok(cpu.unwrap_or(0.0) * shape.cpu as f64
        + gib.unwrap_or(0.0) * memory_gib
        + gpu.unwrap_or(0.0) * shape.gpus as f64)
}

fn decimal(field: &str, s: &str) -> Result<f64, FieldError> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(refuse(
            field,
            format!("{s:?} is not a non-negative decimal number"),
        )),
    }
}

const PLACEHOLDERS: [&str; 6] = ["cpu", "memoryMiB", "memoryGiB", "gpus", "zone", "shape"];

fn check_patch(i: usize, p: &TemplatePatch) -> Result<(), FieldError> {
    let field = format!("patches[{i}]");
    if !matches!(p.op.as_str(), "add" | "replace" | "remove") {
        return Err(refuse(
            format!("{field}.op"),
            format!("{:?} is not add, replace or remove", p.op),
        ));
    }
    if !p.path.starts_with('/') {
        return Err(refuse(
            format!("{field}.path"),
            format!("{:?} is not a JSON pointer (it starts with /)", p.path),
        ));
    }
    if p.op != "remove" && p.value.is_none() {
        return Err(refuse(
            format!("{field}.value"),
            format!("{} needs a value", p.op),
        ));
    }
    if !matches!(p.value_type.as_deref(), None | Some("String" | "Integer")) {
        return Err(refuse(
            format!("{field}.valueType"),
            format!("{:?} is not String or Integer", p.value_type),
        ));
    }
    if let Some(v) = &p.value {
        for name in placeholders_in(v) {
            if !PLACEHOLDERS.contains(&name.as_str()) {
                return Err(refuse(
                    format!("{field}.value"),
                    format!(
                        "unknown placeholder {{{{{name}}}}} (known: {})",
                        PLACEHOLDERS.join(", ")
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The `{{name}}` placeholders in every string of `v`.
fn placeholders_in(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut visit = vec![v];
    while let Some(v) = visit.pop() {
        match v {
            Value::String(s) => {
                let mut rest = s.as_str();
                while let Some(start) = rest.find("{{") {
                    let after = &rest[start + 2..];
                    let Some(end) = after.find("}}") else { break };
                    out.push(after[..end].trim().to_string());
                    rest = &after[end + 2..];
                }
            }
            Value::Array(a) => visit.extend(a),
            Value::Object(o) => visit.extend(o.values()),
            _ => {}
        }
    }
    out
}

/// One group to serve (shape, zone) for a NodeClass: offered whether or not it exists yet.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupPlan {
    pub(crate) nodeclass: String,
    pub(crate) namespace: String,
    pub name: String,
    /// `namespace/name` of the source MachineDeployment.
    pub(crate) source: String,
    pub shape: Shape,
    pub(crate) zone: Option<String>,
    pub(crate) price: f64,
    pub(crate) patches: Vec<TemplatePatch>,
    /// The digest of the source's Machines (`MachineDeployment::spec_template_digest`).
    pub(crate) source_digest: String,
    /// The name of the group's template copy: the group's own with `Drift` (the name changes
    /// with the source anyway), the group's and the source digest's with `Rollout` (a new copy
    /// per source, the group's name staying).
    pub(crate) template_name: String,
}

/// The groups that serve a NodeClass's shapes today, given its source.
pub fn plans(nodeclass: &str, v: &Valid, source: &MachineDeployment) -> Vec<GroupPlan> {
    let zones: Vec<Option<String>> = if v.zones.is_empty() {
        vec![None]
    } else {
        v.zones.iter().cloned().map(Some).collect()
    };
    let mut out = Vec::new();
    for (shape, price) in &v.shapes {
        for zone in &zones {
            let digest = (!v.rollout).then_some(source.spec_template_digest.as_str());
            let name = group_name(
                nodeclass,
                source,
                digest,
                shape,
                zone.as_deref(),
                &v.patches,
            );
            let template_name = if v.rollout {
                let short: String = source.spec_template_digest.chars().take(8).collect();
                format!("{name}-{short}")
            } else {
                name.clone()
            };
            out.push(GroupPlan {
                source_digest: source.spec_template_digest.clone(),
                template_name,
                nodeclass: nodeclass.to_string(),
                namespace: source.namespace.clone(),
                name,
                source: source.key(),
                shape: shape.clone(),
                zone: zone.clone(),
                price: *price,
                patches: v.patches.clone(),
            });
        }
    }
    out
}

/// `<source>-<shape>[-<zone>]-<digest>` (the digest of the source's Machines in it with
/// `Drift`, so a source change renames the group), at most 63 characters (a label value: Cluster API
/// labels each Machine with its MachineDeployment's name).
fn group_name(
    nodeclass: &str,
    source: &MachineDeployment,
    source_digest: Option<&str>,
    shape: &Shape,
    zone: Option<&str>,
    patches: &[TemplatePatch],
) -> String {
    let fingerprint = format!(
        "{nodeclass}\n{}\n{}\n{}\n{}",
        source_digest.unwrap_or_default(),
        shape.name(),
        zone.unwrap_or_default(),
        serde_json::to_string(patches).unwrap_or_default()
    );
    let digest = format!("{:08x}", fnv1a64(fingerprint.as_bytes()) as u32);
    let zone_part = zone.map(|z| format!("-{}", slug(z))).unwrap_or_default();
    let rest = format!("-{}{zone_part}-{digest}", shape.name());
    let room = 63usize.saturating_sub(rest.len()).max(1);
    let mut prefix: String = source.name.chars().take(room).collect();
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    format!("{prefix}{rest}")
}

fn slug(s: &str) -> String {
    let mut out: String = s
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(20)
        .collect();
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// Annotations of the source a generated group does not inherit: its size, price and bounds
/// are the shape's, and what Cluster API or a client wrote about the source is not about it.
fn inherited_annotation(key: &str) -> bool {
    ![
        CPU_ANNOTATION,
        MEMORY_ANNOTATION,
        GPU_COUNT_ANNOTATION,
        PRICE_ANNOTATION,
        CA_PRICE_ANNOTATION,
        MIN_SIZE_ANNOTATION,
        MAX_SIZE_ANNOTATION,
        LABELS_ANNOTATION,
        "kubectl.kubernetes.io/last-applied-configuration",
    ]
    .contains(&key)
        && !key.starts_with("machinedeployment.clusters.x-k8s.io/")
        && !key.starts_with("topology.cluster.x-k8s.io/")
        && !key.starts_with("karpenter.cluster.x-k8s.io/")
        && !key.starts_with("karpenter.sh/")
}

/// Labels of the source a generated group does not inherit (a ClusterClass's topology
/// controller owns the source, not the copy).
fn inherited_label(key: &str) -> bool {
    !key.starts_with("topology.cluster.x-k8s.io/") && key != GENERATED_LABEL
}

impl GroupPlan {
    pub(crate) fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn fill(&self, s: &str) -> String {
        let mut out = s.to_string();
        for (name, value) in [
            ("cpu", self.shape.cpu.to_string()),
            ("memoryMiB", self.shape.memory_mib.to_string()),
            ("memoryGiB", self.shape.memory_gib()),
            ("gpus", self.shape.gpus.to_string()),
            ("zone", self.zone.clone().unwrap_or_default()),
            ("shape", self.shape.name()),
        ] {
            out = out.replace(&format!("{{{{{name}}}}}"), &value);
        }
        out
    }

    fn filled(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.fill(s)),
            Value::Array(a) => Value::Array(a.iter().map(|v| self.filled(v)).collect()),
            Value::Object(o) => {
                Value::Object(o.iter().map(|(k, v)| (k.clone(), self.filled(v))).collect())
            }
            other => other.clone(),
        }
    }

    /// The generated MachineDeployment's annotations: the source's that still apply, and the
    /// shape's size, price and node labels (so scale-from-zero reads it like any other group).
    pub(crate) fn annotations(&self, source: &MachineDeployment) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = source
            .annotations
            .iter()
            .filter(|(k, _)| inherited_annotation(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.insert(CPU_ANNOTATION.into(), self.shape.cpu.to_string());
        out.insert(
            MEMORY_ANNOTATION.into(),
            format!("{}Mi", self.shape.memory_mib),
        );
        if self.shape.gpus > 0 {
            out.insert(GPU_COUNT_ANNOTATION.into(), self.shape.gpus.to_string());
        }
        out.insert(PRICE_ANNOTATION.into(), format!("{}", self.price));
        out.insert(LABELS_ANNOTATION.into(), self.node_labels(source));
        out.insert(SHAPE_ANNOTATION.into(), self.shape.name());
        out.insert(SOURCE_DIGEST_ANNOTATION.into(), self.source_digest.clone());
        out
    }

    /// The source's node labels annotation with the shape's instance type and the zone.
    fn node_labels(&self, source: &MachineDeployment) -> String {
        let mut entries: Vec<String> = source
            .annotations
            .get(LABELS_ANNOTATION)
            .map(|s| {
                s.split(',')
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .filter(|e| {
                        let k = e.split('=').next().unwrap_or_default();
                        k != INSTANCE_TYPE_LABEL && (self.zone.is_none() || k != ZONE_LABEL)
                    })
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        entries.push(format!("{INSTANCE_TYPE_LABEL}={}", self.shape.name()));
        if let Some(z) = &self.zone {
            entries.push(format!("{ZONE_LABEL}={z}"));
        }
        entries.join(",")
    }

    /// The group's labels: the source's, membership, and the mark of its NodeClass.
    pub(crate) fn labels(&self, source: &MachineDeployment) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = source
            .labels
            .iter()
            .filter(|(k, _)| inherited_label(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.insert(MEMBER_LABEL.into(), String::new());
        out.insert(GENERATED_LABEL.into(), self.nodeclass.clone());
        out
    }

    /// The group as the catalog sees it before it exists: the source at zero replicas with
    /// this group's name, labels and annotations.
    pub(crate) fn model(&self, source: &MachineDeployment) -> MachineDeployment {
        let mut md = source.clone();
        md.name = self.name.clone();
        md.uid = String::new();
        md.resource_version = String::new();
        md.generation = None;
        md.labels = self.labels(source);
        md.annotations = self.annotations(source);
        md.creation_timestamp = None;
        md.deletion_timestamp = None;
        md.spec_replicas = Some(0);
        md.status_replicas = None;
        md.ready_replicas = None;
        md.available_replicas = None;
        md.observed_generation = None;
        md.status_selector = None;
        md.template_labels
            .insert(DEPLOYMENT_NAME_LABEL.into(), self.name.clone());
        md.infrastructure_ref.name = self.template_name.clone();
        md.paused = false;
        md
    }
}

/// The NodeClass that generated a MachineDeployment or template, from its mark.
pub(crate) fn generated_by(labels: &BTreeMap<String, String>) -> Option<&str> {
    labels.get(GENERATED_LABEL).map(String::as_str)
}

mod copies;

#[cfg(test)]
mod tests;
