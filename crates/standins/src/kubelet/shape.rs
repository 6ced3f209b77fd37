//! The shape of a Machine's Node: capacity, labels, taints and platform from its
//! infrastructure template and its MachineDeployment's (or MachinePool's) scale-from-zero
//! annotations.

use std::collections::BTreeMap;

use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::Inner;
use crate::capi::string_map;
use crate::machine_size;
use crate::quantity::parse_milli;
use crate::standin::{at, str_at};
use crate::wellknown::{
    ARCH_LABEL, CPU_ANNOTATION, DEFAULT_MAX_PODS, DEPLOYMENT_NAME_LABEL, EPHEMERAL_DISK_ANNOTATION,
    GPU_COUNT_ANNOTATION, LABELS_ANNOTATION, MAX_PODS_ANNOTATION, MEMORY_ANNOTATION, OS_LABEL,
    POOL_NAME_LABEL, TAINTS_ANNOTATION,
};

impl Inner {
    /// Capacity, labels, taints and platform for the Machine's MachineDeployment or MachinePool.
    pub(super) async fn shape_of(&self, machine: &DynamicObject) -> NodeShape {
        let ns = machine.namespace().unwrap_or_default();
        let v = self.cfg.version;
        let owner = match (
            machine.labels().get(DEPLOYMENT_NAME_LABEL),
            machine.labels().get(POOL_NAME_LABEL),
        ) {
            (Some(md), _) => Some((v.machine_deployment(), md)),
            (None, Some(mp)) => Some((v.machine_pool(), mp)),
            (None, None) => None,
        };
        let md = match owner {
            Some((ar, name)) => {
                Api::<DynamicObject>::namespaced_with(self.client.clone(), &ns, &ar)
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten()
            }
            None => None,
        };
        let template = match &md {
            Some(md) => self.infrastructure_template(md, &ns).await,
            None => None,
        };
        let empty = BTreeMap::new();
        NodeShape::from_sources(
            md.as_ref().map(|m| m.annotations()).unwrap_or(&empty),
            template.as_ref(),
        )
    }

    /// The MachineDeployment's infrastructure template (a MachinePool's infrastructure pool), for
    /// the machine size its annotations give (`sim::machine_size`), and `status.capacity` and
    /// `status.nodeInfo` where the MachineDeployment's annotations leave gaps.
    async fn infrastructure_template(&self, md: &DynamicObject, ns: &str) -> Option<Value> {
        let r = at(&md.data, &["spec", "template", "spec", "infrastructureRef"])?;
        let kind = r.get("kind")?.as_str()?;
        let name = r.get("name")?.as_str()?;
        let plural = format!("{}s", kind.to_lowercase());
        // v1beta1 refs name the version; v1beta2 refs name only the group, so try the
        // versions infrastructure providers serve today, newest first.
        let candidates: Vec<(String, String)> = match (r.get("apiVersion"), r.get("apiGroup")) {
            (Some(av), _) => {
                let av = av.as_str()?;
                let (g, v) = av.split_once('/').unwrap_or(("", av));
                vec![(g.to_string(), v.to_string())]
            }
            (None, Some(g)) => ["v1beta2", "v1beta1", "v1alpha1"]
                .iter()
                .map(|v| (g.as_str().unwrap_or_default().to_string(), v.to_string()))
                .collect(),
            (None, None) => return None,
        };
        for (group, version) in candidates {
            let ar = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(&group, &version, kind),
                &plural,
            );
            let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &ar);
            if let Ok(Some(t)) = api.get_opt(name).await {
                // The whole object: its own annotations may give the VM's size.
                return serde_json::to_value(&t).ok();
            }
        }
        None
    }
}

/// What a Node of one MachineDeployment looks like.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeShape {
    pub capacity: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Value>,
    pub arch: String,
    pub os: String,
}

impl NodeShape {
    /// The VM's size from the template's own annotations (`sim::machine_size`: what the machine
    /// really is) wins for cpu, memory and `nvidia.com/gpu`; then the MachineDeployment's
    /// scale-from-zero annotations (only the autoscaler's belief about the machine) win over
    /// the template's `status.capacity`/`status.nodeInfo`. Malformed values are skipped with a
    /// warning, falling back to the next source (bad input never panics). `template` is the
    /// whole template object (metadata included).
    pub fn from_sources(annotations: &BTreeMap<String, String>, template: Option<&Value>) -> Self {
        let mut capacity = string_map(template.and_then(|t| at(t, &["status", "capacity"])));
        let mut set = |resource: &str, annotation: &str| {
            if let Some(q) = annotations.get(annotation) {
                if parse_milli(q).is_some() {
                    capacity.insert(resource.to_string(), q.trim().to_string());
                } else {
                    tracing::warn!(annotation, value = %q, "kubelet stand-in: ignoring malformed quantity");
                }
            }
        };
        set("cpu", CPU_ANNOTATION);
        set("memory", MEMORY_ANNOTATION);
        set("ephemeral-storage", EPHEMERAL_DISK_ANNOTATION);
        set("pods", MAX_PODS_ANNOTATION);
        set("nvidia.com/gpu", GPU_COUNT_ANNOTATION);
        if let Some(t) = template {
            capacity.extend(machine_size::capacity_of(t));
        }
        capacity
            .entry("pods".into())
            .or_insert_with(|| DEFAULT_MAX_PODS.to_string());

        let labels = annotations
            .get(LABELS_ANNOTATION)
            .map(|s| parse_labels(s))
            .unwrap_or_default();
        let taints = annotations
            .get(TAINTS_ANNOTATION)
            .map(|s| parse_taints(s))
            .unwrap_or_default();
        let info = |field: &str, default: &str| {
            template
                .and_then(|t| str_at(t, &["status", "nodeInfo", field]))
                .unwrap_or(default)
                .to_string()
        };
        let arch = labels
            .get(ARCH_LABEL)
            .cloned()
            .unwrap_or_else(|| info("architecture", "amd64"));
        let os = labels
            .get(OS_LABEL)
            .cloned()
            .unwrap_or_else(|| info("operatingSystem", "linux"));
        Self {
            capacity,
            labels,
            taints,
            arch,
            os,
        }
    }
}

/// `k=v,k2=v2` (entries without `=` are skipped).
pub fn parse_labels(s: &str) -> BTreeMap<String, String> {
    s.split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

/// `k=v:Effect,k2:Effect` as Node taints (entries with an unknown effect are skipped).
pub fn parse_taints(s: &str) -> Vec<Value> {
    s.split(',')
        .filter_map(|t| {
            let (kv, effect) = t.trim().rsplit_once(':')?;
            if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                return None;
            }
            let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
            if key.is_empty() {
                return None;
            }
            let mut taint = json!({"key": key, "effect": effect});
            if !value.is_empty() {
                taint["value"] = json!(value);
            }
            Some(taint)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_templates_machine_size_wins_over_the_scale_from_zero_beliefs() {
        let annotations = BTreeMap::from([
            (CPU_ANNOTATION.to_string(), "2".to_string()),
            (MEMORY_ANNOTATION.to_string(), "4Gi".to_string()),
            (GPU_COUNT_ANNOTATION.to_string(), "0".to_string()),
        ]);
        let status =
            json!({"capacity": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "20Gi"}});
        let sized = json!({
            "metadata": {"annotations": {
                machine_size::CPU_ANNOTATION: "8",
                machine_size::MEMORY_ANNOTATION: "32Gi",
                machine_size::GPU_ANNOTATION: "1",
            }},
            "status": status,
        });
        let shape = NodeShape::from_sources(&annotations, Some(&sized));
        assert_eq!(shape.capacity["cpu"], "8");
        assert_eq!(shape.capacity["memory"], "32Gi");
        assert_eq!(shape.capacity["nvidia.com/gpu"], "1");
        // What the size leaves out still comes from the other sources.
        assert_eq!(shape.capacity["ephemeral-storage"], "20Gi");
        assert_eq!(shape.capacity["pods"], "110");

        // A malformed size is ignored: the MachineDeployment's belief, then the status, stand.
        let malformed = json!({
            "metadata": {"annotations": {
                machine_size::CPU_ANNOTATION: "eight",
                machine_size::MEMORY_ANNOTATION: "-1Gi",
            }},
            "status": status,
        });
        let shape = NodeShape::from_sources(&annotations, Some(&malformed));
        assert_eq!(shape.capacity["cpu"], "2");
        assert_eq!(shape.capacity["memory"], "4Gi");
        let shape = NodeShape::from_sources(&BTreeMap::new(), Some(&malformed));
        assert_eq!(shape.capacity["cpu"], "1");
        assert_eq!(shape.capacity["memory"], "2Gi");

        // Without a size, exactly as before: annotations over status.
        let unsized_ = json!({"metadata": {"annotations": {}}, "status": status});
        let shape = NodeShape::from_sources(&annotations, Some(&unsized_));
        assert_eq!(shape.capacity["cpu"], "2");
        assert_eq!(shape.capacity["memory"], "4Gi");
        assert_eq!(shape.capacity["nvidia.com/gpu"], "0");
    }

    #[test]
    fn shape_prefers_annotations_over_template() {
        let annotations = BTreeMap::from([
            (CPU_ANNOTATION.to_string(), "4".to_string()),
            (MEMORY_ANNOTATION.to_string(), "not-a-quantity".to_string()),
            (
                LABELS_ANNOTATION.to_string(),
                "kubernetes.io/arch=arm64,topology.kubernetes.io/zone=z1".to_string(),
            ),
            (
                TAINTS_ANNOTATION.to_string(),
                "gpu=true:NoSchedule,bad:Nope,dedicated:NoExecute".to_string(),
            ),
        ]);
        let template = json!({"status": {"capacity": {"cpu": "2", "memory": "8Gi"}, "nodeInfo": {"operatingSystem": "linux"}}});
        let shape = NodeShape::from_sources(&annotations, Some(&template));
        assert_eq!(shape.capacity["cpu"], "4");
        assert_eq!(shape.capacity["memory"], "8Gi");
        assert_eq!(shape.capacity["pods"], "110");
        assert_eq!(shape.arch, "arm64");
        assert_eq!(shape.os, "linux");
        assert_eq!(shape.labels["topology.kubernetes.io/zone"], "z1");
        assert_eq!(
            shape.taints,
            vec![
                json!({"key": "gpu", "value": "true", "effect": "NoSchedule"}),
                json!({"key": "dedicated", "effect": "NoExecute"}),
            ]
        );
    }
}
