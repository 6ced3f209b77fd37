//! One internal model of Machines, MachineSets and MachineDeployments, read from either
//! `cluster.x-k8s.io/v1beta1` or `v1beta2` JSON. The rest of the controller never sees which
//! version the management cluster speaks, except through the `version` field kept for writes.
//!
//! Where the versions differ:
//! - `infrastructureRef`: v1beta1 `apiVersion` (split into group and version) vs v1beta2
//!   `apiGroup` (version left to discovery);
//! - failure reason/message: v1beta1 `status.failure*` vs v1beta2
//!   `status.deprecated.v1beta1.failure*`, or (v1beta2's own signal) `InfrastructureReady=False`
//!   with reason `Deleted`;
//! - deletion order: v1beta1 `spec.strategy.rollingUpdate.deletePolicy` vs v1beta2
//!   `spec.deletion.order`.
//!
//! Everything else (`status.nodeRef.name`, `spec.providerID`, `spec.replicas`, `status.phase`,
//! metadata) sits at the same path in both.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use jiff::Timestamp;
use kube::api::DynamicObject;
use serde_json::Value;

use crate::api::wellknown::{
    DEPLOYMENT_NAME_LABEL, MACHINE_DEPLOYMENT_KIND, MACHINE_POOL_KIND, MACHINE_SET_KIND,
    POOL_NAME_LABEL,
};
pub use crate::capi::json::ModelError;
use crate::capi::json::Reader;
use crate::capi::kind::ScalableKind;
use crate::capi::provider_id::ProviderId;
pub use crate::capi::selector::{LabelSelector, SelectorOperator, SelectorRequirement};
use crate::capi::version::CapiVersion;

/// `status.phase` of a Machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MachinePhase {
    Pending,
    Provisioning,
    Provisioned,
    Running,
    Deleting,
    Deleted,
    Failed,
    Unknown,
}

impl MachinePhase {
    /// An absent phase means the Machine controller has not reconciled it yet: Pending. A phase
    /// this code does not know is Unknown rather than an error, so a newer Cluster API cannot
    /// break reading.
    fn parse(phase: Option<&str>) -> MachinePhase {
        match phase {
            None => MachinePhase::Pending,
            Some("Pending") => MachinePhase::Pending,
            Some("Provisioning") => MachinePhase::Provisioning,
            Some("Provisioned") => MachinePhase::Provisioned,
            Some("Running") => MachinePhase::Running,
            Some("Deleting") => MachinePhase::Deleting,
            Some("Deleted") => MachinePhase::Deleted,
            Some("Failed") => MachinePhase::Failed,
            Some(_) => MachinePhase::Unknown,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MachinePhase::Pending => "Pending",
            MachinePhase::Provisioning => "Provisioning",
            MachinePhase::Provisioned => "Provisioned",
            MachinePhase::Running => "Running",
            MachinePhase::Deleting => "Deleting",
            MachinePhase::Deleted => "Deleted",
            MachinePhase::Failed => "Failed",
            MachinePhase::Unknown => "Unknown",
        }
    }
}

impl fmt::Display for MachinePhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reference to an infrastructure object (machine or machine template).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InfrastructureRef {
    pub api_group: String,
    pub kind: String,
    pub name: String,
    /// Known only from v1beta1 references; v1beta2 leaves it to discovery.
    pub version: Option<String>,
}

/// How a MachineSet picks Machines to delete when scaled down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeletionOrder {
    Random,
    Newest,
    Oldest,
}

impl DeletionOrder {
    fn parse(s: &str) -> Option<DeletionOrder> {
        match s {
            "Random" => Some(DeletionOrder::Random),
            "Newest" => Some(DeletionOrder::Newest),
            "Oldest" => Some(DeletionOrder::Oldest),
            _ => None,
        }
    }
}

/// Metadata every Cluster API object carries.
pub(super) struct Meta {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) uid: String,
    pub(super) resource_version: String,
    pub(super) generation: Option<i64>,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) annotations: BTreeMap<String, String>,
    pub(super) creation_timestamp: Option<Timestamp>,
    pub(super) deletion_timestamp: Option<Timestamp>,
}

/// A Cluster API (v1beta2-style) condition's status: v1beta2 objects keep them in
/// `status.conditions`, v1beta1 objects of Cluster API >= 1.9 in `status.v1beta2.conditions`.
fn condition_status(
    r: &Reader<'_>,
    version: CapiVersion,
    type_: &str,
) -> Result<Option<bool>, ModelError> {
    let path = match version {
        CapiVersion::V1Beta1 => "status.v1beta2.conditions",
        CapiVersion::V1Beta2 => "status.conditions",
    };
    Ok(r.array(path)?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
        .and_then(|c| match c.get("status").and_then(Value::as_str) {
            Some("True") => Some(true),
            Some("False") => Some(false),
            _ => None,
        }))
}

/// Cluster API's manual remediation request, acted on by a MachineHealthCheck.
pub(crate) const REMEDIATE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/remediate-machine";

/// Whether a MachineHealthCheck watches over the Machine: the conditions only an MHC sets, in
/// any of the condition lists either API version carries, or the remediation request.
fn health_checked(
    r: &Reader<'_>,
    annotations: &BTreeMap<String, String>,
) -> Result<bool, ModelError> {
    if annotations.contains_key(REMEDIATE_MACHINE_ANNOTATION) {
        return Ok(true);
    }
    for path in [
        "status.conditions",
        "status.v1beta2.conditions",
        "status.deprecated.v1beta1.conditions",
    ] {
        let found = r.array(path)?.iter().any(|c| {
            matches!(
                c.get("type").and_then(Value::as_str),
                Some("HealthCheckSucceeded" | "OwnerRemediated")
            )
        });
        if found {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The failure reason we report for a v1beta2 Machine whose infrastructure went away.
pub(crate) const INFRASTRUCTURE_DELETED: &str = "InfrastructureDeleted";

/// Cluster API v1beta2 reports a terminal infrastructure failure as `InfrastructureReady=False`
/// with reason `Deleted` (the infrastructure machine was deleted after it existed: the provider
/// lost the instance) rather than in the deprecated failure fields. Returns the condition's
/// message (or a default) when that is the case.
fn infrastructure_deleted(
    r: &Reader<'_>,
    version: CapiVersion,
) -> Result<Option<String>, ModelError> {
    if version != CapiVersion::V1Beta2 || r.get("metadata.deletionTimestamp").is_some() {
        return Ok(None);
    }
    for c in r.array("status.conditions")? {
        let field = |k: &str| c.get(k).and_then(Value::as_str);
        if field("type") == Some("InfrastructureReady")
            && field("status") == Some("False")
            && field("reason") == Some("Deleted")
        {
            let message = field("message").filter(|m| !m.is_empty());
            return Ok(Some(
                message
                    .unwrap_or("infrastructure machine was deleted")
                    .to_string(),
            ));
        }
    }
    Ok(None)
}

pub(super) fn read_meta(r: &Reader<'_>) -> Result<Meta, ModelError> {
    Ok(Meta {
        name: r.req_str("metadata.name")?,
        namespace: r.req_str("metadata.namespace")?,
        uid: r.req_str("metadata.uid")?,
        resource_version: r.req_str("metadata.resourceVersion")?,
        generation: r.opt_i64("metadata.generation")?,
        labels: r.string_map("metadata.labels")?,
        annotations: r.string_map("metadata.annotations")?,
        creation_timestamp: r.opt_time("metadata.creationTimestamp")?,
        deletion_timestamp: r.opt_time("metadata.deletionTimestamp")?,
    })
}

/// The name of the controller owner of `kind`, if any.
fn controller_owner(r: &Reader<'_>, kind: &str) -> Result<Option<String>, ModelError> {
    let path = "metadata.ownerReferences";
    for (i, owner) in r.array(path)?.iter().enumerate() {
        let field = |name: &str| format!("{path}[{i}].{name}");
        if !owner.is_object() {
            return Err(r.wrong(&format!("{path}[{i}]"), "an object"));
        }
        let controller = match owner.get("controller") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(r.wrong(&field("controller"), "a boolean")),
        };
        let owner_kind = r.member_str(owner, &field("kind"))?;
        if controller && owner_kind.as_deref() == Some(kind) {
            return r
                .member_str(owner, &field("name"))?
                .map(Some)
                .ok_or_else(|| r.missing(&field("name")));
        }
    }
    Ok(None)
}

pub(super) fn read_infrastructure_ref(
    r: &Reader<'_>,
    path: &str,
    version: CapiVersion,
) -> Result<InfrastructureRef, ModelError> {
    if r.get(path).is_none() {
        return Err(r.missing(path));
    }
    let kind = r.req_str(&format!("{path}.kind"))?;
    let name = r.req_str(&format!("{path}.name"))?;
    let (api_group, ref_version) = match version {
        CapiVersion::V1Beta1 => {
            let field = format!("{path}.apiVersion");
            let api_version = r.req_str(&field)?;
            match api_version.rsplit_once('/') {
                Some((group, v)) if !group.is_empty() && !v.is_empty() => {
                    (group.to_string(), Some(v.to_string()))
                }
                Some(_) => {
                    return Err(r.invalid(&field, format!("malformed apiVersion {api_version:?}")));
                }
                // The core group has no group part ("v1").
                None => (String::new(), Some(api_version)),
            }
        }
        CapiVersion::V1Beta2 => (r.req_str(&format!("{path}.apiGroup"))?, None),
    };
    Ok(InfrastructureRef {
        api_group,
        kind,
        name,
        version: ref_version,
    })
}

/// A Cluster API Machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub resource_version: String,
    pub generation: Option<i64>,
    /// Shared: the Machines of one MachineSet carry the same labels, and the index keeps one
    /// copy of them (`state::machines`).
    pub(crate) labels: Arc<BTreeMap<String, String>>,
    pub annotations: BTreeMap<String, String>,
    pub creation_timestamp: Option<Timestamp>,
    pub deletion_timestamp: Option<Timestamp>,
    /// The controller owner of kind MachineSet.
    pub machine_set_name: Option<String>,
    /// From the `cluster.x-k8s.io/deployment-name` label.
    pub deployment_name: Option<String>,
    /// A MachinePool Machine's pool: its controller owner of kind MachinePool, else the
    /// `cluster.x-k8s.io/pool-name` label.
    pub(crate) pool_name: Option<String>,
    pub cluster_name: String,
    /// `spec.providerID`; an empty string is `None`.
    pub provider_id: Option<String>,
    /// `status.nodeRef.name`.
    pub node_ref: Option<String>,
    pub phase: MachinePhase,
    pub failure_reason: Option<String>,
    pub failure_message: Option<String>,
    /// The `UpToDate` condition Cluster API's MachineDeployment controller sets (False: the
    /// Machine's MachineSet is outdated, a rollout would replace it); None when not reported.
    pub(crate) up_to_date: Option<bool>,
    /// A MachineHealthCheck watches over it: its `HealthCheckSucceeded` or `OwnerRemediated`
    /// condition is reported (Cluster API sets them only on Machines an MHC targets), or the
    /// `cluster.x-k8s.io/remediate-machine` annotation asks an MHC to remediate it.
    pub(crate) health_checked: bool,
    pub infrastructure_ref: InfrastructureRef,
    pub version: CapiVersion,
}

impl Machine {
    pub fn from_value(value: &Value, version: CapiVersion) -> Result<Machine, ModelError> {
        let r = Reader::new("Machine", value);
        let meta = read_meta(&r)?;
        let failure_root = match version {
            CapiVersion::V1Beta1 => "status",
            CapiVersion::V1Beta2 => "status.deprecated.v1beta1",
        };
        let phase = r.opt_str("status.phase")?;
        let lost = infrastructure_deleted(&r, version)?;
        let failure_reason = r
            .opt_str(&format!("{failure_root}.failureReason"))?
            .or_else(|| lost.as_ref().map(|_| INFRASTRUCTURE_DELETED.to_string()));
        let failure_message = r
            .opt_str(&format!("{failure_root}.failureMessage"))?
            .or(lost);
        Ok(Machine {
            machine_set_name: controller_owner(&r, MACHINE_SET_KIND)?,
            deployment_name: meta.labels.get(DEPLOYMENT_NAME_LABEL).cloned(),
            pool_name: controller_owner(&r, MACHINE_POOL_KIND)?
                .or_else(|| meta.labels.get(POOL_NAME_LABEL).cloned()),
            cluster_name: r.req_str("spec.clusterName")?,
            provider_id: r.opt_str("spec.providerID")?,
            node_ref: r.opt_str("status.nodeRef.name")?,
            phase: MachinePhase::parse(phase.as_deref()),
            failure_reason,
            failure_message,
            up_to_date: condition_status(&r, version, "UpToDate")?,
            health_checked: health_checked(&r, &meta.annotations)?,
            infrastructure_ref: read_infrastructure_ref(&r, "spec.infrastructureRef", version)?,
            version,
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            resource_version: meta.resource_version,
            generation: meta.generation,
            labels: Arc::new(meta.labels),
            annotations: meta.annotations,
            creation_timestamp: meta.creation_timestamp,
            deletion_timestamp: meta.deletion_timestamp,
        })
    }

    pub fn from_dynamic(
        object: &DynamicObject,
        version: CapiVersion,
    ) -> Result<Machine, ModelError> {
        Self::from_value(&dynamic_to_value("Machine", object)?, version)
    }

    /// `namespace/name`, the form the NodeClaim's machine annotation uses.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Deletion requested (deletionTimestamp set) or the Machine says it is going away.
    pub fn is_deleting(&self) -> bool {
        self.deletion_timestamp.is_some()
            || matches!(self.phase, MachinePhase::Deleting | MachinePhase::Deleted)
    }

    pub fn is_failed(&self) -> bool {
        self.phase == MachinePhase::Failed || self.failure_reason.is_some()
    }

    pub fn provider(&self) -> Option<ProviderId> {
        self.provider_id.as_deref().and_then(ProviderId::new)
    }
}

/// One entry of a scalable resource's `spec.template.spec.taints` (Cluster API >= 1.12, both
/// API versions): the taints Cluster API puts on the nodes of its Machines. Kept as written:
/// turning it into a node taint (and merging it with the taints annotation) is
/// `ScaleFromZero::with_template_taints`'s business.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateTaint {
    pub(crate) key: String,
    /// Absent and empty are the same (Go's `omitempty`).
    pub(crate) value: Option<String>,
    pub(crate) effect: String,
    /// `Always` or `OnInitialization`. Either way the taint is on the node when it joins, which
    /// is all a scale-from-zero node shape describes, so nothing reads it to build one.
    pub(crate) propagation: Option<String>,
}

/// `spec.template.spec.taints`, read as Cluster Autoscaler 1.36 reads it (kubernetes/autoscaler
/// cluster-autoscaler/cloudprovider/clusterapi/clusterapi_unstructured.go:232-252 at
/// 35e8a280425c, tag cluster-autoscaler-1.36.1): a list that is not a list counts as none, an
/// item that is not an object is passed over and a field that is not a string is empty. Never an
/// error: the API server's schema keeps all of that from happening, and a taint list that could
/// not be read must not take the whole MachineDeployment out of the model.
pub(super) fn read_template_taints(r: &Reader<'_>) -> Vec<TemplateTaint> {
    let Some(Value::Array(items)) = r.get("spec.template.spec.taints") else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let item = item.as_object()?;
            let text = |field: &str| {
                item.get(field)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
            };
            Some(TemplateTaint {
                key: text("key").unwrap_or_default(),
                value: text("value"),
                effect: text("effect").unwrap_or_default(),
                propagation: text("propagation"),
            })
        })
        .collect()
}

/// A Cluster API MachineDeployment.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineDeployment {
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) uid: String,
    pub(crate) resource_version: String,
    pub generation: Option<i64>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub(crate) creation_timestamp: Option<Timestamp>,
    pub(crate) deletion_timestamp: Option<Timestamp>,
    /// `spec.replicas`; absent means the API server has not defaulted it (Cluster API defaults
    /// to 1, or to the min-size annotation when autoscaling).
    pub spec_replicas: Option<i32>,
    pub status_replicas: Option<i32>,
    pub ready_replicas: Option<i32>,
    pub available_replicas: Option<i32>,
    pub observed_generation: Option<i64>,
    pub selector: LabelSelector,
    /// `status.selector`, the scale subresource's selector string.
    pub status_selector: Option<String>,
    pub template_labels: BTreeMap<String, String>,
    pub template_annotations: BTreeMap<String, String>,
    /// `spec.template.spec.taints` (see [`read_template_taints`]).
    pub(crate) template_taints: Vec<TemplateTaint>,
    pub infrastructure_ref: InfrastructureRef,
    pub cluster_name: String,
    pub deletion_order: Option<DeletionOrder>,
    /// `OnDelete`: Cluster API replaces an outdated Machine only once someone deletes it
    /// (v1beta1 `spec.strategy.type`, v1beta2 `spec.rollout.strategy.type`; default
    /// RollingUpdate, where Cluster API replaces them itself).
    pub(crate) on_delete: bool,
    pub paused: bool,
    pub version: CapiVersion,
    /// MachineDeployment, or MachinePool for a pool read by `MachineDeployment::from_pool_value`.
    pub(crate) kind: ScalableKind,
    /// A MachinePool's `spec.providerIDList` (empty for a MachineDeployment).
    pub(crate) provider_id_list: Vec<String>,
    /// A MachinePool's template hash (`capi::scalable::pool_template_hash`); None for a
    /// MachineDeployment, whose Machines report `UpToDate` themselves.
    pub(crate) template_hash: Option<String>,
    /// A digest of the whole `spec.template` as read: a generated group's name carries it, so
    /// a change of the source makes new groups (`capi::generate`).
    pub(crate) spec_template_digest: String,
}

/// The fields of a Machine's template whose change makes Cluster API roll a MachineDeployment's
/// Machines out (the rest, such as drain timeouts, are propagated in place).
pub(crate) const ROLLOUT_FIELDS: [&str; 4] =
    ["version", "bootstrap", "infrastructureRef", "failureDomain"];

/// A digest of what a MachineDeployment's Machines are made of: `spec.template.metadata` and
/// the rollout fields of `spec.template.spec`, with each reference's API version or group left
/// out, so that reading the same object at v1beta1 or v1beta2 (a Cluster API upgrade) gives the
/// same digest. A generated group's name carries its source's (`capi::generate`): a new
/// template, bootstrap, version or node labels make new groups, and nothing else does.
pub(crate) fn spec_template_digest(value: &Value) -> String {
    let spec = value.pointer("/spec/template/spec");
    let mut essence = serde_json::Map::new();
    for f in ROLLOUT_FIELDS {
        if let Some(v) = spec.and_then(|s| s.get(f)) {
            essence.insert(f.to_string(), without_ref_versions(v));
        }
    }
    if let Some(m) = value.pointer("/spec/template/metadata") {
        essence.insert("metadata".into(), m.clone());
    }
    // serde_json's maps are sorted, so equal essences print equally.
    let text = Value::Object(essence).to_string();
    format!("{:016x}", crate::api::nodepool::fnv1a64(text.as_bytes()))
}

/// `v` without `apiVersion`/`apiGroup` in any object that names a kind (a reference).
fn without_ref_versions(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| {
                    !(o.contains_key("kind") && (*k == "apiVersion" || *k == "apiGroup"))
                })
                .map(|(k, v)| (k.clone(), without_ref_versions(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

impl MachineDeployment {
    /// The provider IDs a pool's handed-back annotation lists (instances a deleted claim gave
    /// back to a pool without MachinePool Machines; see the Scaler's `instances`).
    pub(crate) fn handed_back(&self) -> std::collections::HashSet<String> {
        self.annotations
            .get(crate::api::wellknown::HANDED_BACK_ANNOTATION)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn from_value(
        value: &Value,
        version: CapiVersion,
    ) -> Result<MachineDeployment, ModelError> {
        let r = Reader::new("MachineDeployment", value);
        let meta = read_meta(&r)?;
        let order_path = match version {
            CapiVersion::V1Beta1 => "spec.strategy.rollingUpdate.deletePolicy",
            CapiVersion::V1Beta2 => "spec.deletion.order",
        };
        let deletion_order = match r.opt_str(order_path)? {
            None => None,
            Some(s) => Some(DeletionOrder::parse(&s).ok_or_else(|| {
                r.invalid(order_path, format!("{s:?} is not Random, Newest or Oldest"))
            })?),
        };
        if r.get("spec.selector").is_none() {
            return Err(r.missing("spec.selector"));
        }
        let strategy_path = match version {
            CapiVersion::V1Beta1 => "spec.strategy.type",
            CapiVersion::V1Beta2 => "spec.rollout.strategy.type",
        };
        let on_delete = r.opt_str(strategy_path)?.as_deref() == Some("OnDelete");
        Ok(MachineDeployment {
            spec_replicas: r.opt_i32("spec.replicas")?,
            status_replicas: r.opt_i32("status.replicas")?,
            ready_replicas: r.opt_i32("status.readyReplicas")?,
            available_replicas: r.opt_i32("status.availableReplicas")?,
            observed_generation: r.opt_i64("status.observedGeneration")?,
            selector: LabelSelector::read(&r, "spec.selector")?,
            status_selector: r.opt_str("status.selector")?,
            template_labels: r.string_map("spec.template.metadata.labels")?,
            template_annotations: r.string_map("spec.template.metadata.annotations")?,
            template_taints: read_template_taints(&r),
            infrastructure_ref: read_infrastructure_ref(
                &r,
                "spec.template.spec.infrastructureRef",
                version,
            )?,
            cluster_name: r.req_str("spec.clusterName")?,
            deletion_order,
            on_delete,
            paused: r.opt_bool("spec.paused")?.unwrap_or(false),
            version,
            kind: ScalableKind::MachineDeployment,
            provider_id_list: Vec::new(),
            template_hash: None,
            spec_template_digest: spec_template_digest(value),
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            resource_version: meta.resource_version,
            generation: meta.generation,
            labels: meta.labels,
            annotations: meta.annotations,
            creation_timestamp: meta.creation_timestamp,
            deletion_timestamp: meta.deletion_timestamp,
        })
    }

    pub fn from_dynamic(
        object: &DynamicObject,
        version: CapiVersion,
    ) -> Result<MachineDeployment, ModelError> {
        Self::from_value(&dynamic_to_value("MachineDeployment", object)?, version)
    }

    /// `namespace/name` for a MachineDeployment, `MachinePool/namespace/name` for a pool.
    pub fn key(&self) -> String {
        self.scalable().key()
    }

    pub fn is_deleting(&self) -> bool {
        self.deletion_timestamp.is_some()
    }
}

/// A Cluster API MachineSet: only what is needed to walk Machine -> MachineDeployment, to
/// read scale-from-zero annotations placed on it, and whether a preflight check holds its
/// scale-up.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineSet {
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) uid: String,
    pub(crate) resource_version: String,
    /// The controller owner of kind MachineDeployment, else the deployment-name label.
    pub deployment_name: Option<String>,
    pub cluster_name: String,
    pub replicas: Option<i32>,
    pub status_replicas: Option<i32>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) deletion_timestamp: Option<Timestamp>,
    pub version: CapiVersion,
    /// The failing preflight checks' messages while they hold a scale-up
    /// (`preflight::failing_checks`).
    pub(crate) preflight: Option<String>,
}

impl MachineSet {
    pub fn from_value(value: &Value, version: CapiVersion) -> Result<MachineSet, ModelError> {
        let r = Reader::new("MachineSet", value);
        let meta = read_meta(&r)?;
        let deployment_name = match controller_owner(&r, MACHINE_DEPLOYMENT_KIND)? {
            Some(name) => Some(name),
            None => meta.labels.get(DEPLOYMENT_NAME_LABEL).cloned(),
        };
        Ok(MachineSet {
            deployment_name,
            cluster_name: r.req_str("spec.clusterName")?,
            replicas: r.opt_i32("spec.replicas")?,
            status_replicas: r.opt_i32("status.replicas")?,
            version,
            preflight: super::preflight::failing_checks(value),
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            resource_version: meta.resource_version,
            labels: meta.labels,
            annotations: meta.annotations,
            deletion_timestamp: meta.deletion_timestamp,
        })
    }

    pub fn from_dynamic(
        object: &DynamicObject,
        version: CapiVersion,
    ) -> Result<MachineSet, ModelError> {
        Self::from_value(&dynamic_to_value("MachineSet", object)?, version)
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

pub(super) fn dynamic_to_value(kind: &str, object: &DynamicObject) -> Result<Value, ModelError> {
    serde_json::to_value(object).map_err(|e| ModelError::Serialize {
        object: format!(
            "{kind} {}/{}",
            object.metadata.namespace.as_deref().unwrap_or("?"),
            object.metadata.name.as_deref().unwrap_or("?")
        ),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod health_check_tests;
