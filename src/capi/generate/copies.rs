//! The two objects created for a group: the source's infrastructure template copied with the
//! patches, and the source MachineDeployment copied at zero replicas, each under the group's
//! names and with the NodeClass's mark.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::FieldError;
use super::{GENERATED_LABEL, GroupPlan, inherited_label, refuse};
use crate::api::nodeclass::TemplatePatch;
use crate::api::wellknown::{CLUSTER_NAME_LABEL, DEPLOYMENT_NAME_LABEL};
use crate::capi::model::MachineDeployment;

impl GroupPlan {
    /// The infrastructure template to create: a copy of the source's (`template`, as read)
    /// under this group's name, marked, with the patches applied. A patch that does not apply
    /// is refused naming it.
    pub fn template_object(&self, template: &Value) -> Result<Value, FieldError> {
        let mut t = template.clone();
        let meta = copied_metadata(
            template,
            &self.template_name,
            &self.nodeclass,
            inherited_label,
        );
        if let Some(o) = t.as_object_mut() {
            o.remove("status");
            o.insert("metadata".into(), meta);
        }
        for (i, p) in self.patches.iter().enumerate() {
            let op = self.operation(i, p)?;
            let patch: json_patch::Patch = serde_json::from_value(json!([op]))
                .map_err(|e| refuse(format!("patches[{i}]"), e.to_string()))?;
            json_patch::patch(&mut t, &patch).map_err(|e| {
                refuse(
                    format!("patches[{i}]"),
                    format!("does not apply to the source's template: {e}"),
                )
            })?;
        }
        Ok(t)
    }

    /// One patch as a JSON-patch operation with its placeholders filled.
    fn operation(&self, i: usize, p: &TemplatePatch) -> Result<Value, FieldError> {
        let mut op = json!({"op": p.op, "path": p.path});
        if let Some(v) = &p.value {
            let mut value = self.filled(v);
            if p.value_type.as_deref() == Some("Integer") {
                let s = value.as_str().map(str::to_string).unwrap_or_default();
                let n: i64 = s.trim().parse().map_err(|_| {
                    refuse(
                        format!("patches[{i}].value"),
                        format!("{s:?} is not an integer (valueType Integer)"),
                    )
                })?;
                value = json!(n);
            }
            op["value"] = value;
        }
        Ok(op)
    }

    /// The MachineDeployment to create: a copy of the source (`source`, as read) at zero
    /// replicas under this group's name, selecting only its own Machines, pointing at its own
    /// template, in its zone.
    pub fn group_object(&self, source_raw: &Value, source: &MachineDeployment) -> Value {
        let mut md = source_raw.clone();
        let mut meta = json!({
            "name": self.name,
            "namespace": self.namespace,
            "labels": self.labels(source),
            "annotations": self.annotations(source),
        });
        if source_raw.pointer("/metadata/namespace").is_none() {
            meta.as_object_mut().map(|m| m.remove("namespace"));
        }
        let Some(o) = md.as_object_mut() else {
            return md;
        };
        o.remove("status");
        o.insert("metadata".into(), meta);
        let spec = o.entry("spec").or_insert_with(|| json!({}));
        spec["replicas"] = json!(0);
        spec["selector"] = json!({"matchLabels": {
            CLUSTER_NAME_LABEL: source.cluster_name,
            DEPLOYMENT_NAME_LABEL: self.name,
        }});
        if let Some(spec) = spec.as_object_mut() {
            spec.remove("paused");
        }
        let template = &mut spec["template"];
        template["metadata"]["labels"][CLUSTER_NAME_LABEL] = json!(source.cluster_name);
        template["metadata"]["labels"][DEPLOYMENT_NAME_LABEL] = json!(self.name);
        template["spec"]["infrastructureRef"]["name"] = json!(self.template_name);
        if let Some(z) = &self.zone {
            template["spec"]["failureDomain"] = json!(z);
        }
        md
    }
}

/// Metadata for a copy named `name`: the original's labels that carry over, its annotations,
/// and the mark.
fn copied_metadata(
    original: &Value,
    name: &str,
    nodeclass: &str,
    keep_label: fn(&str) -> bool,
) -> Value {
    let mut labels: BTreeMap<String, Value> = original
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|l| {
            l.iter()
                .filter(|(k, _)| keep_label(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    labels.insert(GENERATED_LABEL.into(), json!(nodeclass));
    // The annotations carry over too, and the map is always there: a patch may add one.
    let annotations: BTreeMap<String, Value> = original
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .map(|a| {
            a.iter()
                .filter(|(k, _)| *k != "kubectl.kubernetes.io/last-applied-configuration")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let mut meta = json!({"name": name, "labels": labels, "annotations": annotations});
    if let Some(ns) = original.pointer("/metadata/namespace") {
        meta["namespace"] = ns.clone();
    }
    meta
}
