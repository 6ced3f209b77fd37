//! Scale-from-zero annotations on a MachineDeployment or MachineSet (Cluster Autoscaler's
//! convention): capacity, labels, taints, size bounds and price of the nodes it would make.
//!
//! Parsing collects every problem instead of stopping at the first, so one status condition can
//! tell an operator everything that is wrong with an object, and it never panics: these values
//! are typed by hand into YAML.
//!
//! What Cluster Autoscaler accepts is accepted here too (issue 37): users carry these
//! annotations over from it, and a MachineDeployment it scales must not be refused here. Where it
//! passes over part of a value (one entry of a list, a GPU type without a count, an empty value)
//! so does this parser, and records what it passed over in [`ScaleFromZero::skipped`] for the
//! NodeClass status, where the autoscaler only logs it. Only what it refuses, failing the node
//! group, is an [`AnnotationError`]. The citations `CA <file>:<line>` name
//! kubernetes/autoscaler's cluster-autoscaler/cloudprovider/clusterapi/ directory at commit
//! 35e8a280425c76a4040f57ae0fa232a952c02024 (tag cluster-autoscaler-1.36.1; the lines are the
//! same at master 55c37cd5eb550756c5ccc5a89e9068d77797e575).
//!
//! Deliberate differences from the autoscaler: surrounding whitespace is trimmed (it refuses
//! `" 4"` and drops `" a=b:NoSchedule"`, which is never what the author meant); labels and taint
//! entries a Node could not carry (invalid key or value, or a label this controller sets itself)
//! are skipped where it keeps them; negative capacities and counts stay errors where it builds a
//! node with negative capacity (one that fits no pod, so the group is as unusable either way).
//!
//! GPUs: `gpu-type` may be a resource name (it contains a `/`, e.g. `nvidia.com/gpu` or
//! `amd.com/gpu`), which then names the extended resource the count is published under; any
//! other value (e.g. `nvidia-tesla-t4`) is taken as the accelerator model and the count is
//! published as `nvidia.com/gpu`, the resource the NVIDIA device plugin registers. (The
//! autoscaler publishes the count under the gpu-type string whatever it is.)

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Taint as K8sTaint;

use crate::api::resources::{Quantity, QuantityError, Resources};
use crate::api::wellknown::{
    CA_PRICE_ANNOTATION, CPU_ANNOTATION, EPHEMERAL_DISK_ANNOTATION, GPU_COUNT_ANNOTATION,
    GPU_TYPE_ANNOTATION, LABELS_ANNOTATION, MAX_PODS_ANNOTATION, MAX_SIZE_ANNOTATION,
    MEMORY_ANNOTATION, MIN_SIZE_ANNOTATION, PRICE_ANNOTATION, RESOURCE_CPU,
    RESOURCE_EPHEMERAL_STORAGE, RESOURCE_MEMORY, RESOURCE_PODS, TAINTS_ANNOTATION,
};
use crate::capi::model::TemplateTaint;

/// The DRA driver that publishes the node's `gpu-count` GPUs as devices (Cluster Autoscaler's
/// alternative to `gpu-type`; read in `capi::autoscaler`).
pub(crate) const DRA_DRIVER_ANNOTATION: &str =
    "capacity.cluster-autoscaler.kubernetes.io/dra-driver";

/// Where a scalable resource's own taints are: the `key` of a [`Skipped`] entry from them.
pub(crate) const TEMPLATE_TAINTS_FIELD: &str = "spec.template.spec.taints";

/// What the annotations say about the nodes an object would make. Absent annotations are
/// `None` or empty; defaults (110 pods, price 0) are the caller's business.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScaleFromZero {
    /// Never zero: a zero cpu, memory or ephemeral-disk is `None` (the template's value is used).
    pub cpu: Option<Quantity>,
    pub memory: Option<Quantity>,
    pub ephemeral_disk: Option<Quantity>,
    pub max_pods: Option<i64>,
    pub gpu: Option<Gpu>,
    pub labels: BTreeMap<String, String>,
    /// The taints annotation's; after [`with_template_taints`](Self::with_template_taints),
    /// merged with the scalable resource's own.
    pub taints: Vec<Taint>,
    pub min_size: Option<i32>,
    pub max_size: Option<i32>,
    pub price: Option<f64>,
    /// What was passed over rather than refused, in the order met, for the NodeClass status.
    pub skipped: Vec<Skipped>,
}

/// An annotation entry (or a whole value, or an entry of `spec.template.spec.taints`) left out
/// the way Cluster Autoscaler leaves it out, instead of refusing the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The annotation, or [`TEMPLATE_TAINTS_FIELD`].
    pub key: String,
    /// The entry as written (for a single-valued annotation, the value).
    pub entry: String,
    /// Why, and what is used instead.
    pub reason: String,
}

/// `annotation <key>: "<entry>" ignored: <reason>`, one line for a status message.
impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.key == TEMPLATE_TAINTS_FIELD {
            "field"
        } else {
            "annotation"
        };
        // A long entry (a 10,000-character label value) is cut, so the reason still fits in an
        // Event's 1024 bytes.
        const SHOWN: usize = 120;
        let mut entry = self.entry.as_str();
        let mut cut = "";
        if entry.len() > SHOWN {
            let mut end = SHOWN;
            while !entry.is_char_boundary(end) {
                end -= 1;
            }
            entry = &entry[..end];
            cut = "...";
        }
        write!(
            f,
            "{what} {}: {:?}{cut} ignored: {}",
            self.key, entry, self.reason
        )
    }
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
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<TaintEffect> {
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
///
/// `Empty`, `BadLabel`, `DuplicateLabel`, `BadTaint`, `MissingCompanion`, `BadGpuType` and
/// `BadEntry` are no longer produced: since issue 37 what they described is passed over and
/// recorded as [`Skipped`], as Cluster Autoscaler passes it over. They stay until the tests
/// outside `src/capi` that still name them are updated.
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

/// Why an empty capacity or count value is passed over.
const EMPTY_IS_UNSET: &str = "empty: treated as unset, as Cluster Autoscaler treats it";

/// Reads the scale-from-zero annotations, reporting every malformed one; entries Cluster
/// Autoscaler passes over are passed over and listed in [`ScaleFromZero::skipped`].
pub fn parse(annotations: &BTreeMap<String, String>) -> Result<ScaleFromZero, AnnotationErrors> {
    let mut p = Parser {
        annotations,
        errors: Vec::new(),
        skipped: Vec::new(),
    };
    let cpu = p.capacity(CPU_ANNOTATION);
    let memory = p.capacity(MEMORY_ANNOTATION);
    let ephemeral_disk = p.capacity(EPHEMERAL_DISK_ANNOTATION);
    let max_pods = p.count(MAX_PODS_ANNOTATION);
    let gpu_count = p.count(GPU_COUNT_ANNOTATION);
    let gpu = p.gpu(gpu_count);
    let labels = p.list(LABELS_ANNOTATION, parse_labels).unwrap_or_default();
    let taints = p.list(TAINTS_ANNOTATION, parse_taints).unwrap_or_default();
    let min_size = p.size(MIN_SIZE_ANNOTATION);
    let max_size = p.size(MAX_SIZE_ANNOTATION);
    let price = p.price();
    // CA clusterapi_utils.go:210 (kubernetes/autoscaler@35e8a280425c) refuses it too.
    if let (Some(min), Some(max)) = (min_size, max_size)
        && min > max
    {
        p.error(MIN_SIZE_ANNOTATION, Problem::MinAboveMax { min, max });
    }
    if !p.errors.is_empty() {
        return Err(AnnotationErrors(p.errors));
    }
    Ok(ScaleFromZero {
        cpu,
        memory,
        ephemeral_disk,
        max_pods,
        gpu,
        labels,
        taints,
        min_size,
        max_size,
        price,
        skipped: p.skipped,
    })
}

/// An entry a list parser passed over, and why.
type Dropped = (String, String);

struct Parser<'a> {
    annotations: &'a BTreeMap<String, String>,
    errors: Vec<AnnotationError>,
    skipped: Vec<Skipped>,
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

    fn skip(&mut self, key: &str, entry: impl Into<String>, reason: impl Into<String>) {
        self.skipped.push(Skipped {
            key: key.to_string(),
            entry: entry.into(),
            reason: reason.into(),
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

    /// The hourly price: `cluster.x-k8s.io/machine-current-price`, else Cluster Autoscaler's
    /// `capacity.cluster-autoscaler.kubernetes.io/price`. When both are set and differ the first
    /// wins (it is the one Cluster API users already set) and the other is reported as skipped.
    fn price(&mut self) -> Option<f64> {
        let current = self.field(PRICE_ANNOTATION, parse_price);
        let ca = self.field(CA_PRICE_ANNOTATION, parse_price);
        match (current, ca) {
            (Some(c), Some(other)) if c != other => {
                let raw = self
                    .raw(CA_PRICE_ANNOTATION)
                    .unwrap_or_default()
                    .to_string();
                self.skip(
                    CA_PRICE_ANNOTATION,
                    raw,
                    format!("{PRICE_ANNOTATION} is set too and wins"),
                );
                Some(c)
            }
            (c, ca) => c.or(ca),
        }
    }

    /// cpu, memory, ephemeral-disk: a Kubernetes quantity.
    fn capacity(&mut self, key: &str) -> Option<Quantity> {
        let raw = self.raw(key)?;
        let value = raw.trim();
        // CA clusterapi_utils.go:252 (kubernetes/autoscaler@35e8a280425c): an empty value is
        // read as no annotation at all.
        if value.is_empty() {
            self.skip(key, raw, EMPTY_IS_UNSET);
            return None;
        }
        match parse_quantity(value) {
            // CA clusterapi_unstructured.go:311, 319 and 327 (kubernetes/autoscaler@35e8a280425c):
            // a zero cpu, memory or ephemeral-disk is left out of the annotation capacity, so the
            // infrastructure template's status.capacity (or nothing) stands.
            Ok(q) if q.is_zero() => {
                self.skip(
                    key,
                    raw,
                    "zero: the infrastructure template's status.capacity is used instead, as \
                     Cluster Autoscaler does",
                );
                None
            }
            Ok(q) => Some(q),
            Err(problem) => {
                self.error(key, problem);
                None
            }
        }
    }

    /// maxPods and gpu-count: a base-10 integer.
    fn count(&mut self, key: &str) -> Option<i64> {
        let raw = self.raw(key)?;
        let value = raw.trim();
        // CA clusterapi_utils.go:259 (kubernetes/autoscaler@35e8a280425c): empty is unset.
        if value.is_empty() {
            self.skip(key, raw, EMPTY_IS_UNSET);
            return None;
        }
        // CA clusterapi_utils.go:260 (kubernetes/autoscaler@35e8a280425c) reads it with Go's
        // strconv.ParseInt, which takes a leading `+` ("+58"). A negative count is accepted there
        // too and makes a node nothing fits; here it is refused, which leaves the group as
        // unusable and says why.
        match parse_go_int(value).and_then(non_negative) {
            Ok(n) => Some(n),
            Err(problem) => {
                self.error(key, problem);
                None
            }
        }
    }

    /// min-size and max-size.
    fn size(&mut self, key: &str) -> Option<i32> {
        let raw = self.raw(key)?;
        // CA clusterapi_utils.go:153, 184 (kubernetes/autoscaler@35e8a280425c): Go's strconv.Atoi,
        // so a leading `+` is fine and an empty value is refused; :197 and :206 refuse a
        // negative one.
        let n = match parse_go_int(raw.trim()).and_then(non_negative) {
            Ok(n) => n,
            Err(problem) => {
                self.error(key, problem);
                return None;
            }
        };
        // Atoi takes any 64-bit value; replicas are 32-bit, so a larger bound cannot bind.
        match i32::try_from(n) {
            Ok(n) => Some(n),
            Err(_) => {
                self.skip(
                    key,
                    raw,
                    format!(
                        "above {}: {} is used (replica counts are 32-bit)",
                        i32::MAX,
                        i32::MAX
                    ),
                );
                Some(i32::MAX)
            }
        }
    }

    /// A comma-separated list whose bad entries are passed over (recorded) rather than refused.
    fn list<T>(&mut self, key: &str, parse: fn(&str) -> (T, Vec<Dropped>)) -> Option<T> {
        let raw = self.raw(key)?;
        let (out, dropped) = parse(raw);
        for (entry, reason) in dropped {
            self.skip(key, entry, reason);
        }
        Some(out)
    }

    /// The GPU the annotations describe. CA clusterapi_unstructured.go:336
    /// (kubernetes/autoscaler@35e8a280425c) publishes one only when both gpu-type and a non-zero
    /// gpu-count are there, and ignores either alone, so that is no error here either.
    fn gpu(&mut self, count: Option<i64>) -> Option<Gpu> {
        let count_raw = self.raw(GPU_COUNT_ANNOTATION);
        // A count written but unreadable has its error already; nothing more to say about it.
        let count_failed = count.is_none() && count_raw.is_some_and(|c| !c.trim().is_empty());
        let Some(raw_type) = self.raw(GPU_TYPE_ANNOTATION) else {
            // With a DRA driver the count is of its devices (`capi::autoscaler` reads it).
            if let (Some(n), Some(raw)) = (count, count_raw)
                && n > 0
                && !self.annotations.contains_key(DRA_DRIVER_ANNOTATION)
            {
                self.skip(
                    GPU_COUNT_ANNOTATION,
                    raw,
                    format!(
                        "no {GPU_TYPE_ANNOTATION} or {DRA_DRIVER_ANNOTATION} says what the GPUs \
                         are: none is published, as Cluster Autoscaler does"
                    ),
                );
            }
            return None;
        };
        let gpu_type = raw_type.trim();
        if gpu_type.is_empty() {
            self.skip(
                GPU_TYPE_ANNOTATION,
                raw_type,
                "empty: no GPU is published, as Cluster Autoscaler does",
            );
            return None;
        }
        // The autoscaler takes any string as the resource name; one that is not a valid
        // resource name (or model) is one no pod can request, so publishing nothing is the same.
        if let Some(why) = gpu_type_problem(gpu_type) {
            self.skip(
                GPU_TYPE_ANNOTATION,
                raw_type,
                format!("{why}: no GPU is published (no pod could request it)"),
            );
            return None;
        }
        match count {
            Some(count) => Some(Gpu {
                gpu_type: gpu_type.to_string(),
                resource: gpu_resource(gpu_type),
                count,
            }),
            None if count_failed => None,
            None => {
                self.skip(
                    GPU_TYPE_ANNOTATION,
                    raw_type,
                    format!(
                        "no {GPU_COUNT_ANNOTATION}: no GPU is published, as Cluster Autoscaler does"
                    ),
                );
                None
            }
        }
    }
}

impl ScaleFromZero {
    /// Merges the scalable resource's own taints (`spec.template.spec.taints`, Cluster API's
    /// taint propagation) into [`taints`](Self::taints), as CA clusterapi_unstructured.go:229-283
    /// (kubernetes/autoscaler@35e8a280425c, cluster-autoscaler-1.36.1) builds a node's taints:
    /// the resource's taints first, in their order, whatever their propagation; then each taint
    /// of the annotation replaces the one with its key and effect, or is appended. A resource
    /// taint with no key, or an effect none of the three, is passed over and recorded (the API
    /// server's schema allows neither; the autoscaler would keep it, to no effect on scheduling).
    pub(crate) fn with_template_taints(mut self, template: &[TemplateTaint]) -> ScaleFromZero {
        let mut merged = Vec::new();
        for t in template {
            let effect = TaintEffect::parse(&t.effect);
            match effect {
                Some(effect) if !t.key.is_empty() => merged.push(Taint {
                    key: t.key.clone(),
                    value: t.value.clone().filter(|v| !v.is_empty()),
                    effect,
                }),
                _ => {
                    let value = t
                        .value
                        .as_deref()
                        .map_or(String::new(), |v| format!("={v}"));
                    let reason = if t.key.is_empty() {
                        "no key".to_string()
                    } else {
                        format!(
                            "effect {:?} is not NoSchedule, PreferNoSchedule or NoExecute",
                            t.effect
                        )
                    };
                    self.skipped.push(Skipped {
                        key: TEMPLATE_TAINTS_FIELD.to_string(),
                        entry: format!("{}{value}:{}", t.key, t.effect),
                        reason,
                    });
                }
            }
        }
        for taint in std::mem::take(&mut self.taints) {
            upsert_taint(&mut merged, taint);
        }
        self.taints = merged;
        self
    }

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
mod tests;
mod values;

pub(crate) use values::validate_label_key;
use values::*;
