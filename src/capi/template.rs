//! Node shape from an infrastructure machine template: `status.capacity` (a ResourceList) and
//! `status.nodeInfo {architecture, operatingSystem}`, as the Cluster API autoscaling-from-zero
//! contract defines them, merged with the scale-from-zero annotations which take precedence.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kube::api::{Api, DynamicObject};
use serde_json::Value;

use crate::api::resources::Quantity;
use crate::api::resources::{QuantityError, Resources, quantity_from_json};
use crate::api::wellknown::{
    ARCH_LABEL, DEFAULT_ARCH, DEFAULT_MAX_PODS, DEFAULT_OS, OS_LABEL, RESOURCE_PODS,
};
use crate::capi::annotations::{ScaleFromZero, Taint};
use crate::capi::model::MachineDeployment;
use crate::capi::version;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TemplateError {
    #[error("{object}: {field}: expected {expected}")]
    WrongType {
        object: String,
        field: String,
        expected: &'static str,
    },
    #[error("{object}: {field}: {source}")]
    Quantity {
        object: String,
        field: String,
        #[source]
        source: QuantityError,
    },
    #[error("serializing object: {0}")]
    Serialize(String),
}

/// What a template's status says about the nodes it makes. Everything is optional: most
/// providers do not publish it yet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TemplateCapacity {
    pub capacity: Resources,
    pub architecture: Option<String>,
    pub operating_system: Option<String>,
    /// An infrastructure machine pool's `status.infrastructureMachineKind`: set when the
    /// provider surfaces each instance as a Machine (MachinePool Machines).
    pub(crate) machine_kind: Option<String>,
    /// The object reports itself provisioned (`status.ready`, or v1beta2's
    /// `status.initialization.provisioned`): an infrastructure pool that is and reports no
    /// machine kind has no MachinePool Machines (before that, it may simply not have said yet).
    pub(crate) provisioned: bool,
    /// An infrastructure machine pool's instance fields, hashed
    /// (`capi::scalable::infrastructure_pool_hash`): an edit in place that replaces its
    /// instances changes it.
    pub(crate) instance_hash: Option<String>,
}

/// The node a MachineDeployment would make, as the scheduler sees it before it exists.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeShape {
    pub capacity: Resources,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub arch: String,
    pub os: String,
}

impl TemplateCapacity {
    /// Reads `status.capacity` and `status.nodeInfo` of a template object in JSON form.
    pub fn from_value(template: &Value) -> Result<TemplateCapacity, TemplateError> {
        let object = describe(template);
        let wrong = |field: &str, expected| TemplateError::WrongType {
            object: object.clone(),
            field: field.to_string(),
            expected,
        };
        let status = template.get("status").filter(|s| !s.is_null());
        let capacity = match status.and_then(|s| s.get("capacity")) {
            None | Some(Value::Null) => Resources::new(),
            Some(Value::Object(map)) => {
                let mut out = Resources::new();
                for (key, raw) in map {
                    let q = quantity_from_json(raw).map_err(|source| TemplateError::Quantity {
                        object: object.clone(),
                        field: format!("status.capacity.{key}"),
                        source,
                    })?;
                    out.set(key.clone(), q);
                }
                out
            }
            Some(_) => return Err(wrong("status.capacity", "an object")),
        };
        let node_info = match status.and_then(|s| s.get("nodeInfo")) {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v),
            Some(_) => return Err(wrong("status.nodeInfo", "an object")),
        };
        let text = |field: &str| -> Result<Option<String>, TemplateError> {
            match node_info.and_then(|n| n.get(field)) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.is_empty() => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(wrong(&format!("status.nodeInfo.{field}"), "a string")),
            }
        };
        let machine_kind = match status.and_then(|s| s.get("infrastructureMachineKind")) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(wrong("status.infrastructureMachineKind", "a string")),
        };
        Ok(TemplateCapacity {
            capacity,
            architecture: text("architecture")?,
            operating_system: text("operatingSystem")?,
            machine_kind,
            provisioned: status.is_some_and(|s| {
                s.get("ready") == Some(&Value::Bool(true))
                    || s.pointer("/initialization/provisioned") == Some(&Value::Bool(true))
            }),
            instance_hash: crate::capi::scalable::infrastructure_pool_hash(template),
        })
    }

    pub fn from_dynamic(
        template: &kube::api::DynamicObject,
    ) -> Result<TemplateCapacity, TemplateError> {
        let value =
            serde_json::to_value(template).map_err(|e| TemplateError::Serialize(e.to_string()))?;
        Self::from_value(&value)
    }
}

/// `Kind namespace/name` for messages, with `?` for what is missing.
fn describe(object: &Value) -> String {
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("?").to_string();
    let meta = object.get("metadata");
    format!(
        "{} {}/{}",
        text(object.get("kind")),
        text(meta.and_then(|m| m.get("namespace"))),
        text(meta.and_then(|m| m.get("name")))
    )
}

/// The node shape: template capacity overridden key by key by the annotations; labels from the
/// labels annotation; taints from the taints annotation. Architecture and OS come from the
/// labels annotation, else the template's nodeInfo, else amd64/linux, and are written back as
/// the `kubernetes.io/arch` and `kubernetes.io/os` labels so requirements can select them. Pods
/// default to 110 when neither source states them, as Cluster Autoscaler assumes.
pub fn merge(template: Option<&TemplateCapacity>, annotations: &ScaleFromZero) -> NodeShape {
    let mut capacity = template.map(|t| t.capacity.clone()).unwrap_or_default();
    for (key, value) in annotations.capacity().iter() {
        capacity.set(key, *value);
    }
    if !capacity.0.contains_key(RESOURCE_PODS) {
        capacity.set(RESOURCE_PODS, Quantity::from_units(DEFAULT_MAX_PODS));
    }
    let mut labels = annotations.labels.clone();
    let pick = |label: &str, from_template: Option<&String>, default: &str| {
        labels
            .get(label)
            .or(from_template)
            .cloned()
            .unwrap_or_else(|| default.to_string())
    };
    let arch = pick(
        ARCH_LABEL,
        template.and_then(|t| t.architecture.as_ref()),
        DEFAULT_ARCH,
    );
    let os = pick(
        OS_LABEL,
        template.and_then(|t| t.operating_system.as_ref()),
        DEFAULT_OS,
    );
    labels.insert(ARCH_LABEL.to_string(), arch.clone());
    labels.insert(OS_LABEL.to_string(), os.clone());
    NodeShape {
        capacity,
        labels,
        taints: annotations.taints.clone(),
        arch,
        os,
    }
}

/// Why a template could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReadError {
    /// The server says the template does not exist: Cluster API cannot clone it, so the
    /// MachineDeployment's MachineSet cannot create Machines.
    #[error("{kind} {namespace}/{name} not found")]
    NotFound {
        kind: String,
        namespace: String,
        name: String,
    },
    /// Anything else (discovery, permissions, a malformed status): may pass.
    #[error("{0}")]
    Other(String),
}

/// The resource an infrastructure template kind is read and written through: its version
/// discovered unless the reference pins one.
pub(crate) async fn template_resource(
    client: &kube::Client,
    group: &str,
    pinned: Option<String>,
    kind: &str,
) -> Result<kube::core::ApiResource, version::Error> {
    let ver = match pinned {
        Some(v) => v,
        None => version::infrastructure_version(client, group).await?,
    };
    Ok(version::infrastructure_template_resource(group, &ver, kind))
}

/// Read a MachineDeployment's infrastructure template's capacity (`group`, `kind`, `name` in
/// namespace `ns`); the version is discovered unless the reference pins one.
pub async fn read_template(
    client: &kube::Client,
    group: &str,
    pinned: Option<String>,
    kind: &str,
    ns: &str,
    name: &str,
) -> Result<TemplateCapacity, ReadError> {
    let ar = template_resource(client, group, pinned, kind)
        .await
        .map_err(|e| ReadError::Other(e.to_string()))?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let obj = api.get(name).await.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 404 => ReadError::NotFound {
            kind: kind.to_string(),
            namespace: ns.to_string(),
            name: name.to_string(),
        },
        // The server's own message rather than the whole Status.
        kube::Error::Api(s) => ReadError::Other(format!("{} ({})", s.message, s.code)),
        e => ReadError::Other(e.to_string()),
    })?;
    TemplateCapacity::from_dynamic(&obj).map_err(|e| ReadError::Other(e.to_string()))
}

/// The template capacity of every MachineDeployment that has a readable one (one-off reads for
/// tools; the Catalog actor caches and re-reads on its own schedule).
pub(crate) async fn read_templates(
    client: &kube::Client,
    mds: &[Arc<MachineDeployment>],
) -> (
    HashMap<String, TemplateCapacity>,
    HashMap<String, ReadError>,
) {
    let mut ok = HashMap::new();
    let mut failed = HashMap::new();
    for md in mds {
        let r = &md.infrastructure_ref;
        match read_template(
            client,
            &r.api_group,
            r.version.clone(),
            &r.kind,
            &md.namespace,
            &r.name,
        )
        .await
        {
            Ok(t) => {
                ok.insert(md.key(), t);
            }
            Err(e) => {
                failed.insert(md.key(), e);
            }
        }
    }
    (ok, failed)
}
