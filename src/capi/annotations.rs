//! Scale-from-zero annotations on a MachineDeployment or MachineSet (Cluster Autoscaler's
//! convention): capacity, labels, taints, size bounds and price of the nodes it would make.
//!
//! Parsing collects every problem instead of stopping at the first, so one status condition can
//! tell an operator everything that is wrong with an object, and it never panics: these values
//! are typed by hand into YAML.
//!
//! GPUs: `gpu-type` may be a resource name (it contains a `/`, e.g. `nvidia.com/gpu` or
//! `amd.com/gpu`), which then names the extended resource the count is published under; any
//! other value (e.g. `nvidia-tesla-t4`) is taken as the accelerator model and the count is
//! published as `nvidia.com/gpu`, the resource the NVIDIA device plugin registers.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Taint as K8sTaint;

use crate::api::resources::{Quantity, QuantityError, Resources};
use crate::api::wellknown::{
    CPU_ANNOTATION, EPHEMERAL_DISK_ANNOTATION, GPU_COUNT_ANNOTATION, GPU_TYPE_ANNOTATION,
    LABELS_ANNOTATION, MAX_PODS_ANNOTATION, MAX_SIZE_ANNOTATION, MEMORY_ANNOTATION,
    MIN_SIZE_ANNOTATION, NVIDIA_GPU_RESOURCE, PRICE_ANNOTATION, RESOURCE_CPU,
    RESOURCE_EPHEMERAL_STORAGE, RESOURCE_MEMORY, RESOURCE_PODS, TAINTS_ANNOTATION,
};

/// The DRA driver that publishes the node's `gpu-count` GPUs as devices (Cluster Autoscaler's
/// alternative to `gpu-type`; read in `capi::autoscaler`).
pub const DRA_DRIVER_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/dra-driver";

/// What the annotations say about the nodes an object would make. Absent annotations are
/// `None` or empty; defaults (110 pods, price 0) are the caller's business.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScaleFromZero {
    pub cpu: Option<Quantity>,
    pub memory: Option<Quantity>,
    pub ephemeral_disk: Option<Quantity>,
    pub max_pods: Option<i64>,
    pub gpu: Option<Gpu>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub min_size: Option<i32>,
    pub max_size: Option<i32>,
    pub price: Option<f64>,
}

/// GPUs per node: `count` of extended resource `resource`, of model `gpu_type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub gpu_type: String,
    pub resource: String,
    pub count: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }

    pub fn parse(s: &str) -> Option<TaintEffect> {
        match s {
            "NoSchedule" => Some(TaintEffect::NoSchedule),
            "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
            "NoExecute" => Some(TaintEffect::NoExecute),
            _ => None,
        }
    }
}

/// A node taint as the taints annotation describes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Taint {
    pub key: String,
    pub value: Option<String>,
    pub effect: TaintEffect,
}

impl Taint {
    pub fn to_k8s(&self) -> K8sTaint {
        K8sTaint {
            key: self.key.clone(),
            value: self.value.clone(),
            effect: self.effect.as_str().to_string(),
            time_added: None,
        }
    }
}

impl fmt::Display for Taint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={}:{}", self.key, v, self.effect.as_str()),
            None => write!(f, "{}:{}", self.key, self.effect.as_str()),
        }
    }
}

/// What is wrong with one annotation value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Problem {
    #[error("{0}")]
    Quantity(#[from] QuantityError),
    #[error("must not be empty")]
    Empty,
    #[error("must not be negative")]
    Negative,
    #[error("expected a non-negative integer")]
    NotAnInteger,
    #[error("expected a non-negative decimal number")]
    NotAPrice,
    #[error("entry {entry:?}: {why}")]
    BadLabel { entry: String, why: String },
    #[error("label {key:?} given twice")]
    DuplicateLabel { key: String },
    #[error("entry {entry:?}: {why}")]
    BadTaint { entry: String, why: String },
    #[error("needs {other} as well")]
    MissingCompanion { other: &'static str },
    #[error("{0}")]
    BadGpuType(String),
    #[error("min-size {min} is above max-size {max}")]
    MinAboveMax { min: i32, max: i32 },
    #[error("entry {entry:?}: {why}")]
    BadEntry { entry: String, why: String },
}

/// One bad annotation: its key, its value and why it was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("annotation {key}: value {value:?}: {problem}")]
pub struct AnnotationError {
    pub key: String,
    pub value: String,
    pub problem: Problem,
}

/// Every bad annotation on one object.
#[derive(Debug, Clone, PartialEq)]
pub struct AnnotationErrors(pub Vec<AnnotationError>);

impl AnnotationErrors {
    pub fn iter(&self) -> impl Iterator<Item = &AnnotationError> {
        self.0.iter()
    }

    /// The errors about `key`.
    pub fn for_key<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a AnnotationError> {
        self.0.iter().filter(move |e| e.key == key)
    }
}

impl fmt::Display for AnnotationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for AnnotationErrors {}

/// Reads the scale-from-zero annotations, reporting every malformed one.
pub fn parse(annotations: &BTreeMap<String, String>) -> Result<ScaleFromZero, AnnotationErrors> {
    let mut p = Parser {
        annotations,
        errors: Vec::new(),
    };
    let gpu_type = p.raw(GPU_TYPE_ANNOTATION);
    let gpu_count = p.field(GPU_COUNT_ANNOTATION, parse_count);
    let mut out = ScaleFromZero {
        cpu: p.field(CPU_ANNOTATION, parse_quantity),
        memory: p.field(MEMORY_ANNOTATION, parse_quantity),
        ephemeral_disk: p.field(EPHEMERAL_DISK_ANNOTATION, parse_quantity),
        max_pods: p.field(MAX_PODS_ANNOTATION, parse_count),
        gpu: None,
        labels: p.field(LABELS_ANNOTATION, parse_labels).unwrap_or_default(),
        taints: p.field(TAINTS_ANNOTATION, parse_taints).unwrap_or_default(),
        min_size: p.field(MIN_SIZE_ANNOTATION, parse_size),
        max_size: p.field(MAX_SIZE_ANNOTATION, parse_size),
        price: p.field(PRICE_ANNOTATION, parse_price),
    };
    out.gpu = p.gpu(gpu_type, gpu_count);
    if let (Some(min), Some(max)) = (out.min_size, out.max_size)
        && min > max
    {
        p.error(MIN_SIZE_ANNOTATION, Problem::MinAboveMax { min, max });
    }
    if p.errors.is_empty() {
        Ok(out)
    } else {
        Err(AnnotationErrors(p.errors))
    }
}

struct Parser<'a> {
    annotations: &'a BTreeMap<String, String>,
    errors: Vec<AnnotationError>,
}

impl<'a> Parser<'a> {
    fn raw(&self, key: &str) -> Option<&'a str> {
        self.annotations.get(key).map(String::as_str)
    }

    fn error(&mut self, key: &str, problem: Problem) {
        let value = self.raw(key).unwrap_or_default().to_string();
        self.errors.push(AnnotationError {
            key: key.to_string(),
            value,
            problem,
        });
    }

    /// The parsed annotation, or `None` when absent or bad (the error is recorded).
    fn field<T>(&mut self, key: &str, parse: fn(&str) -> Result<T, Problem>) -> Option<T> {
        let raw = self.raw(key)?;
        match parse(raw.trim()) {
            Ok(v) => Some(v),
            Err(problem) => {
                self.error(key, problem);
                None
            }
        }
    }

    fn gpu(&mut self, gpu_type: Option<&str>, count: Option<i64>) -> Option<Gpu> {
        let gpu_type = gpu_type.map(str::trim);
        match (gpu_type, count, self.raw(GPU_COUNT_ANNOTATION)) {
            (Some(""), _, _) => {
                self.error(GPU_TYPE_ANNOTATION, Problem::Empty);
                None
            }
            (Some(gpu_type), _, _) if gpu_type_problem(gpu_type).is_some() => {
                let why = gpu_type_problem(gpu_type).unwrap_or_default();
                self.error(GPU_TYPE_ANNOTATION, Problem::BadGpuType(why));
                None
            }
            (Some(gpu_type), Some(count), _) => Some(Gpu {
                gpu_type: gpu_type.to_string(),
                resource: gpu_resource(gpu_type),
                count,
            }),
            (Some(_), None, None) => {
                self.error(
                    GPU_TYPE_ANNOTATION,
                    Problem::MissingCompanion {
                        other: GPU_COUNT_ANNOTATION,
                    },
                );
                None
            }
            // With a DRA driver the count is of its devices (`capi::autoscaler` reads it).
            (None, _, Some(_)) if self.annotations.contains_key(DRA_DRIVER_ANNOTATION) => None,
            (None, _, Some(_)) => {
                self.error(
                    GPU_COUNT_ANNOTATION,
                    Problem::MissingCompanion {
                        other: GPU_TYPE_ANNOTATION,
                    },
                );
                None
            }
            // A count that failed to parse was already reported.
            _ => None,
        }
    }
}

/// A gpu-type with a `/` names an extended resource, so it must be a valid resource name (a
/// qualified name); without one it is the GPU model, published as a label value.
fn gpu_type_problem(gpu_type: &str) -> Option<String> {
    if gpu_type.contains('/') {
        validate_label_key(gpu_type)
            .err()
            .map(|e| format!("not a valid extended resource name: {e}"))
    } else {
        validate_label_value(gpu_type)
            .err()
            .map(|e| format!("not a valid GPU model (a label value): {e}"))
    }
}

/// Labels a MachineDeployment may not set on its nodes: the node's own name, and Karpenter's
/// domain (the controller sets those itself), except `karpenter.sh/capacity-type`, which is how a
/// MachineDeployment declares its capacity type.
fn restricted_label(key: &str) -> Option<String> {
    let domain = key.split_once('/').map_or("", |(d, _)| d);
    if key == crate::api::wellknown::HOSTNAME_LABEL {
        return Some(format!("label {key:?} is restricted: it is set per node"));
    }
    if (domain == "karpenter.sh" || domain.ends_with(".karpenter.sh"))
        && key != crate::api::wellknown::CAPACITY_TYPE_LABEL
    {
        return Some(format!(
            "label {key:?} is restricted: the karpenter.sh domain is set by the controller"
        ));
    }
    None
}

/// See the module documentation for the rule.
fn gpu_resource(gpu_type: &str) -> String {
    if gpu_type.contains('/') {
        gpu_type.to_string()
    } else {
        NVIDIA_GPU_RESOURCE.to_string()
    }
}

fn parse_quantity(raw: &str) -> Result<Quantity, Problem> {
    let q: Quantity = raw.parse()?;
    if q.is_negative() {
        return Err(Problem::Negative);
    }
    Ok(q)
}

fn parse_count(raw: &str) -> Result<i64, Problem> {
    if raw.starts_with('-') && raw.len() > 1 && raw[1..].bytes().all(|b| b.is_ascii_digit()) {
        return Err(Problem::Negative);
    }
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Problem::NotAnInteger);
    }
    raw.parse::<i64>().map_err(|_| Problem::NotAnInteger)
}

fn parse_size(raw: &str) -> Result<i32, Problem> {
    let n = parse_count(raw)?;
    i32::try_from(n).map_err(|_| Problem::NotAnInteger)
}

fn parse_price(raw: &str) -> Result<f64, Problem> {
    // Only plain decimals: Rust would also accept "inf", "NaN" and "1e400".
    let plain = !raw.is_empty()
        && raw
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-' || b == b'+');
    let price: f64 = if plain {
        raw.parse().map_err(|_| Problem::NotAPrice)?
    } else {
        return Err(Problem::NotAPrice);
    };
    if !price.is_finite() {
        return Err(Problem::NotAPrice);
    }
    if price < 0.0 {
        return Err(Problem::Negative);
    }
    Ok(price)
}

/// `k=v,k2=v2`; blank entries (a trailing comma) are ignored.
fn parse_labels(raw: &str) -> Result<BTreeMap<String, String>, Problem> {
    let mut labels = BTreeMap::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: String| Problem::BadLabel {
            entry: entry.to_string(),
            why,
        };
        let (key, value) = entry
            .split_once('=')
            .ok_or_else(|| bad("expected key=value".into()))?;
        let (key, value) = (key.trim(), value.trim());
        validate_label_key(key).map_err(bad)?;
        validate_label_value(value).map_err(bad)?;
        if let Some(why) = restricted_label(key) {
            return Err(bad(why));
        }
        if labels.insert(key.to_string(), value.to_string()).is_some() {
            return Err(Problem::DuplicateLabel {
                key: key.to_string(),
            });
        }
    }
    Ok(labels)
}

/// `key=value:Effect` or `key:Effect`, comma separated; blank entries are ignored.
fn parse_taints(raw: &str) -> Result<Vec<Taint>, Problem> {
    let mut taints = Vec::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: String| Problem::BadTaint {
            entry: entry.to_string(),
            why,
        };
        let (key_value, effect) = entry
            .rsplit_once(':')
            .ok_or_else(|| bad("expected key=value:Effect or key:Effect".into()))?;
        let effect = TaintEffect::parse(effect.trim()).ok_or_else(|| {
            bad(format!(
                "effect {:?} is not NoSchedule, PreferNoSchedule or NoExecute",
                effect.trim()
            ))
        })?;
        let (key, value) = match key_value.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (key_value.trim(), None),
        };
        validate_label_key(key).map_err(bad)?;
        if let Some(v) = value {
            validate_label_value(v).map_err(bad)?;
        }
        taints.push(Taint {
            key: key.to_string(),
            value: value.filter(|v| !v.is_empty()).map(str::to_string),
            effect,
        });
    }
    Ok(taints)
}

/// A Kubernetes qualified name: optional DNS-subdomain prefix (<= 253) and `/`, then a name of
/// 1..=63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        validate_dns_subdomain(prefix).map_err(|why| format!("key {key:?}: prefix {why}"))?;
    }
    if name.is_empty() {
        return Err(format!("key {key:?}: name part must not be empty"));
    }
    validate_name_part(name).map_err(|why| format!("key {key:?}: {why}"))
}

/// Empty, or 1..=63 characters of the name-part alphabet.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    validate_name_part(value).map_err(|why| format!("value {value:?}: {why}"))
}

fn validate_name_part(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err("longer than 63 characters".into());
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if !s.starts_with(alnum) || !s.ends_with(alnum) {
        return Err("must start and end with a letter or digit".into());
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(alnum(c) || c == '-' || c == '_' || c == '.'))
    {
        return Err(format!("character {c:?} is not allowed"));
    }
    Ok(())
}

fn validate_dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 253 {
        return Err("must be 1 to 253 characters".into());
    }
    for label in s.split('.') {
        let lower_alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        let ok = !label.is_empty()
            && label.len() <= 63
            && label.starts_with(lower_alnum)
            && label.ends_with(lower_alnum)
            && label.chars().all(|c| lower_alnum(c) || c == '-');
        if !ok {
            return Err(format!("{s:?} is not a lowercase DNS subdomain"));
        }
    }
    Ok(())
}

impl ScaleFromZero {
    /// The resources these annotations state: cpu, memory, ephemeral-storage, pods and the GPU
    /// resource (when the count is positive). Keys without an annotation are absent, so the
    /// result can override a template key by key.
    pub fn capacity(&self) -> Resources {
        let mut out = Resources::new();
        if let Some(cpu) = self.cpu {
            out.set(RESOURCE_CPU, cpu);
        }
        if let Some(memory) = self.memory {
            out.set(RESOURCE_MEMORY, memory);
        }
        if let Some(disk) = self.ephemeral_disk {
            out.set(RESOURCE_EPHEMERAL_STORAGE, disk);
        }
        // The autoscaler reads maxPods 0 as unset (then 110).
        if let Some(pods) = self.max_pods.filter(|p| *p > 0) {
            out.set(RESOURCE_PODS, Quantity::from_units(pods));
        }
        if let Some(gpu) = self.gpu.as_ref().filter(|g| g.count > 0) {
            out.set(gpu.resource.clone(), Quantity::from_units(gpu.count));
        }
        out
    }
}

#[cfg(test)]
mod restricted_tests {
    use super::*;

    fn parse_one(key: &str, value: &str) -> Result<ScaleFromZero, AnnotationErrors> {
        let mut a = BTreeMap::new();
        a.insert(key.to_string(), value.to_string());
        if key == GPU_TYPE_ANNOTATION {
            a.insert(GPU_COUNT_ANNOTATION.to_string(), "1".to_string());
        }
        parse(&a)
    }

    #[test]
    fn restricted_labels_and_bad_gpu_types_are_rejected_naming_the_annotation() {
        for (key, value) in [
            (LABELS_ANNOTATION, "kubernetes.io/hostname=node-1"),
            (LABELS_ANNOTATION, "karpenter.sh/nodepool=default"),
            (LABELS_ANNOTATION, "team=a b"),
            (GPU_TYPE_ANNOTATION, "nvidia.com/gpu x"),
            (GPU_TYPE_ANNOTATION, "a/b/c"),
            (GPU_TYPE_ANNOTATION, "NVIDIA Tesla T4"),
        ] {
            let err = parse_one(key, value).expect_err(value);
            assert!(err.to_string().contains(key), "{key}={value}: {err}");
        }
        for (key, value) in [
            (LABELS_ANNOTATION, "node.kubernetes.io/role=gpu"),
            (LABELS_ANNOTATION, "karpenter.sh/capacity-type=spot"),
            (GPU_TYPE_ANNOTATION, "nvidia-tesla-t4"),
            (GPU_TYPE_ANNOTATION, "amd.com/gpu"),
        ] {
            assert!(parse_one(key, value).is_ok(), "{key}={value}");
        }
    }
}
