//! The two scalable kinds (MachineDeployments and MachinePools) and the reference that names one:
//! kind, namespace and name. A MachinePool is read into the same model as a MachineDeployment
//! (`MachineDeployment` with `kind` MachinePool), so the catalog, the Scalers and binding handle
//! both through one type; a pool's Machines (MachinePool Machines) name their pool as a
//! MachineDeployment's name theirs.
//!
//! Keys: a MachineDeployment keeps the `namespace/name` key it always had (so claims written
//! before MachinePools existed still resolve); a MachinePool's is `MachinePool/namespace/name`.
//! Neither a namespace nor a name can hold a `/`, so the two never collide.

use std::fmt;

use kube::api::DynamicObject;
use serde_json::Value;

use crate::api::wellknown::{CLUSTER_NAME_LABEL, MACHINE_POOL_KIND, POOL_NAME_LABEL};
use crate::capi::json::{ModelError, Reader};
pub(crate) use crate::capi::kind::ScalableKind;
use crate::capi::model::{
    LabelSelector, Machine, MachineDeployment, ROLLOUT_FIELDS, dynamic_to_value,
    read_infrastructure_ref, read_meta, read_template_taints,
};
use crate::capi::version::CapiVersion;

impl ScalableKind {
    /// Reads an object of this kind into the scalable model.
    pub(crate) fn parser(
        self,
    ) -> fn(&DynamicObject, CapiVersion) -> Result<MachineDeployment, ModelError> {
        match self {
            ScalableKind::MachineDeployment => MachineDeployment::from_dynamic,
            ScalableKind::MachinePool => MachineDeployment::from_pool_dynamic,
        }
    }
}

/// One scalable resource: kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ScalableRef {
    pub(crate) kind: ScalableKind,
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl ScalableRef {
    pub(crate) fn new(kind: ScalableKind, namespace: &str, name: &str) -> Self {
        Self {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The key the indexes, the Scalers and the claim's annotation use (see the module doc).
    pub(crate) fn key(&self) -> String {
        match self.kind {
            ScalableKind::MachineDeployment => format!("{}/{}", self.namespace, self.name),
            ScalableKind::MachinePool => {
                format!("{MACHINE_POOL_KIND}/{}/{}", self.namespace, self.name)
            }
        }
    }

    /// The reference a [`key`](Self::key) names; None when it is not one.
    pub(crate) fn parse(key: &str) -> Option<ScalableRef> {
        let parts: Vec<&str> = key.split('/').collect();
        let (kind, ns, name) = match parts.as_slice() {
            [ns, name] => (ScalableKind::MachineDeployment, *ns, *name),
            [kind, ns, name] if *kind == MACHINE_POOL_KIND => {
                (ScalableKind::MachinePool, *ns, *name)
            }
            _ => return None,
        };
        (!ns.is_empty() && !name.is_empty()).then(|| ScalableRef::new(kind, ns, name))
    }
}

/// `MachinePool ns/name`, as messages and Events name it.
impl fmt::Display for ScalableRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

impl Machine {
    /// The MachineDeployment or MachinePool this Machine belongs to, if any.
    pub(crate) fn scalable(&self) -> Option<ScalableRef> {
        match (&self.deployment_name, &self.pool_name) {
            (Some(md), _) => Some(ScalableRef::new(
                ScalableKind::MachineDeployment,
                &self.namespace,
                md,
            )),
            (None, Some(mp)) => Some(ScalableRef::new(
                ScalableKind::MachinePool,
                &self.namespace,
                mp,
            )),
            (None, None) => None,
        }
    }
}

impl MachineDeployment {
    pub(crate) fn scalable(&self) -> ScalableRef {
        ScalableRef::new(self.kind, &self.namespace, &self.name)
    }

    pub(crate) fn is_pool(&self) -> bool {
        self.kind == ScalableKind::MachinePool
    }

    /// A MachinePool in the scalable model: replicas and status as a MachineDeployment's, the
    /// template's metadata and infrastructure reference (the infrastructure pool, where a
    /// provider may publish capacity as a template does), `spec.providerIDList`, and the
    /// selector of its MachinePool Machines (pool and cluster name). A pool has no rollout
    /// strategy or deletion order of its own.
    pub(crate) fn from_pool_value(value: &Value, version: CapiVersion) -> Result<Self, ModelError> {
        let r = Reader::new(MACHINE_POOL_KIND, value);
        let meta = read_meta(&r)?;
        let cluster_name = r.req_str("spec.clusterName")?;
        let provider_id_list = r
            .array("spec.providerIDList")?
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| r.wrong(&format!("spec.providerIDList[{i}]"), "a string"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let selector = LabelSelector {
            match_labels: [
                (POOL_NAME_LABEL.to_string(), meta.name.clone()),
                (CLUSTER_NAME_LABEL.to_string(), cluster_name.clone()),
            ]
            .into(),
            match_expressions: Vec::new(),
        };
        Ok(MachineDeployment {
            spec_replicas: r.opt_i32("spec.replicas")?,
            status_replicas: r.opt_i32("status.replicas")?,
            ready_replicas: r.opt_i32("status.readyReplicas")?,
            available_replicas: r.opt_i32("status.availableReplicas")?,
            observed_generation: r.opt_i64("status.observedGeneration")?,
            selector,
            status_selector: None,
            template_labels: r.string_map("spec.template.metadata.labels")?,
            template_annotations: r.string_map("spec.template.metadata.annotations")?,
            // A MachinePool's template carries them at the same path as a MachineDeployment's,
            // and the autoscaler reads them the same way for both kinds.
            template_taints: read_template_taints(&r),
            infrastructure_ref: read_infrastructure_ref(
                &r,
                "spec.template.spec.infrastructureRef",
                version,
            )?,
            cluster_name,
            deletion_order: None,
            on_delete: false,
            paused: false,
            version,
            kind: ScalableKind::MachinePool,
            provider_id_list,
            template_hash: Some(pool_template_hash(value)),
            spec_template_digest: crate::capi::model::spec_template_digest(value),
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

    pub(crate) fn from_pool_dynamic(
        object: &DynamicObject,
        version: CapiVersion,
    ) -> Result<Self, ModelError> {
        Self::from_pool_value(&dynamic_to_value(MACHINE_POOL_KIND, object)?, version)
    }
}

/// The hash of a MachinePool's template as a rollout sees it (`ROLLOUT_FIELDS` of
/// `spec.template.spec`): FNV-1a over their JSON with keys sorted, so it is the same whatever
/// order the API server wrote the fields in and across releases of this controller.
pub(crate) fn pool_template_hash(pool: &Value) -> String {
    fields_hash(pool.pointer("/spec/template/spec"), &ROLLOUT_FIELDS)
}

/// The fields of an infrastructure machine pool's `spec` that say what its instances are made
/// of, so that a provider replaces its instances when they change: `template` (Cluster API's
/// Docker and in-memory pools, whose instances follow its image; Azure's pools), and AWS's
/// `awsLaunchTemplate` and `mixedInstancesPolicy` (a new launch template version, rolled out by
/// an instance refresh). The rest (sizes, tags, the provider IDs the provider writes) replace no
/// instance.
const INSTANCE_FIELDS: [&str; 3] = ["template", "awsLaunchTemplate", "mixedInstancesPolicy"];

/// The hash of an infrastructure machine pool's instance fields (`INSTANCE_FIELDS` of `spec`),
/// as [`pool_template_hash`] hashes; None when it has none of them (nothing to compare).
pub(crate) fn infrastructure_pool_hash(infra_pool: &Value) -> Option<String> {
    let spec = infra_pool.get("spec")?;
    INSTANCE_FIELDS
        .iter()
        .any(|f| spec.get(*f).is_some_and(|v| !v.is_null()))
        .then(|| fields_hash(Some(spec), &INSTANCE_FIELDS))
}

/// FNV-1a over the canonical JSON of `fields` of `object` (those present).
fn fields_hash(object: Option<&Value>, fields: &[&str]) -> String {
    let fields: serde_json::Map<String, Value> = fields
        .iter()
        .filter_map(|f| Some((f.to_string(), object?.get(*f)?.clone())))
        .collect();
    let mut text = String::new();
    canonical(&Value::Object(fields), &mut text);
    format!("{:016x}", crate::api::nodepool::fnv1a64(text.as_bytes()))
}

fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for k in keys {
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(&m[k], out);
                out.push(',');
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for x in a {
                canonical(x, out);
                out.push(',');
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests;
