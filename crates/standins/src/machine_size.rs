//! The size of the VMs an infrastructure machine template makes, as the simulator's
//! infrastructure spells it: annotations on the template's own metadata (the DevMachineTemplate
//! CRD's spec has no such fields), playing what a vSphere template's `numCPUs`/`memoryMiB` are.
//! The kubelet stand-in registers a Machine's Node with this capacity (it wins over the
//! template's `status.capacity` and the MachineDeployment's scale-from-zero annotations, which
//! are only beliefs about the VM), and both infrastructure providers (the Cluster API stand-in's
//! and `real::provider`, beside Cluster API's real manager) publish it as the template's
//! `status.capacity`, as Cluster API's scale-from-zero contract asks a provider to.
//!
//! Stand-in code only: it shares nothing with the controller it grades.

use std::collections::BTreeMap;

use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::quantity::parse_milli;
use super::standin::{Shutdown, WorkQueue, at, log_retry, merge_status};

/// CPUs of the template's VMs (a quantity, e.g. "4").
pub const CPU_ANNOTATION: &str = "sim.karpenter.cluster.x-k8s.io/cpu";
/// Memory of the template's VMs (a quantity, e.g. "16Gi").
pub const MEMORY_ANNOTATION: &str = "sim.karpenter.cluster.x-k8s.io/memory";
/// `nvidia.com/gpu` devices of the template's VMs (a count; optional).
pub const GPU_ANNOTATION: &str = "sim.karpenter.cluster.x-k8s.io/gpu";

/// The extended resource the GPU count is.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The size annotations: (annotation, resource, whether it must be a whole count).
const SIZES: [(&str, &str, bool); 3] = [
    (CPU_ANNOTATION, "cpu", false),
    (MEMORY_ANNOTATION, "memory", false),
    (GPU_ANNOTATION, GPU_RESOURCE, true),
];

/// The capacity the size annotations in `annotations` give (resource -> quantity, as written).
/// A malformed value (not a quantity, not positive, a fractional GPU count) is left out with a
/// warning, never a panic: its resource then comes from wherever it came without it.
pub fn capacity(annotations: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (annotation, resource, whole) in SIZES {
        let Some(raw) = annotations.get(annotation) else {
            continue;
        };
        let value = raw.trim();
        let valid = parse_milli(value).is_some_and(|m| {
            let sized = if resource == GPU_RESOURCE {
                m >= 0
            } else {
                m > 0
            };
            sized && (!whole || m % 1000 == 0)
        });
        if valid {
            out.insert(resource.to_string(), value.to_string());
        } else {
            tracing::warn!(
                annotation,
                value = %raw,
                "simulated infrastructure: ignoring a malformed machine size"
            );
        }
    }
    out
}

/// The size annotations of a template as JSON (a whole object, or its `metadata`-less `data`
/// with no annotations).
pub fn capacity_of(template: &Value) -> BTreeMap<String, String> {
    let annotations: BTreeMap<String, String> = at(template, &["metadata", "annotations"])
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    capacity(&annotations)
}

/// The `status.capacity` patch that makes `template`'s published capacity say its size (merged
/// with what is there), or None when it says so already or the template has no size.
pub fn status_patch(template: &DynamicObject) -> Option<Value> {
    let size = capacity(template.annotations());
    let published = at(&template.data, &["status", "capacity"]);
    let missing: BTreeMap<&String, &String> = size
        .iter()
        .filter(|(k, v)| {
            published
                .and_then(|c| c.get(k.as_str()))
                .is_none_or(|p| !same_quantity(p, v))
        })
        .collect();
    (!missing.is_empty()).then(|| json!({"status": {"capacity": missing}}))
}

/// Whether a published capacity value (a string or a number) is `want`.
fn same_quantity(published: &Value, want: &str) -> bool {
    let text = match published {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return false,
    };
    text == want || (parse_milli(&text).is_some() && parse_milli(&text) == parse_milli(want))
}

/// The infrastructure template kind the providers publish sizes on.
pub fn dev_machine_template_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "infrastructure.cluster.x-k8s.io",
            "v1beta2",
            "DevMachineTemplate",
        ),
        "devmachinetemplates",
    )
}

/// The provider's template controller: every DevMachineTemplate with size annotations, whenever
/// it is created or changed, gets them in `status.capacity` (written only when different).
pub fn spawn_publisher(
    client: Client,
    scope: Option<String>,
    shutdown: Shutdown,
) -> Vec<JoinHandle<()>> {
    let queue = std::sync::Arc::new(WorkQueue::<(String, String)>::default());
    let ar = dev_machine_template_resource();
    let on = queue.clone();
    let watch = super::standin::spawn_watch(
        "devmachinetemplates (machine sizes)",
        super::standin::watched(&client, scope.as_deref(), &ar),
        shutdown.clone(),
        move |event| {
            if let Event::Apply(t) | Event::InitApply(t) = event
                && t.metadata.deletion_timestamp.is_none()
                && status_patch(&t).is_some()
            {
                on.push((t.namespace().unwrap_or_default(), t.name_any()));
            }
        },
    );
    let worker = tokio::spawn(async move {
        while let Some(key) = queue.pop(&shutdown).await {
            let (ns, name) = &key;
            let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar);
            // Read fresh: the event may be older than a write of ours.
            let result = match api.get_opt(name).await {
                Ok(Some(t)) => match status_patch(&t) {
                    Some(patch) => merge_status(&api, name, &patch).await,
                    None => Ok(()),
                },
                Ok(None) => Ok(()),
                Err(err) => Err(err),
            };
            queue.done(&key);
            if let Err(err) = result {
                log_retry(
                    "infrastructure provider: template capacity",
                    &format!("DevMachineTemplate {ns}/{name}"),
                    &err,
                );
                if shutdown.sleep(std::time::Duration::from_millis(100)).await {
                    queue.push(key);
                }
            } else {
                tracing::debug!(template = %name, "machine size published");
            }
        }
    });
    vec![watch, worker]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(annotations: Value, status: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
            "kind": "DevMachineTemplate",
            "metadata": {"name": "t", "namespace": "default", "annotations": annotations},
            "spec": {},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn sizes_are_read_and_malformed_ones_left_out() {
        let a = BTreeMap::from([
            (CPU_ANNOTATION.to_string(), " 8 ".to_string()),
            (MEMORY_ANNOTATION.to_string(), "lots".to_string()),
            (GPU_ANNOTATION.to_string(), "2".to_string()),
        ]);
        let c = capacity(&a);
        assert_eq!(c.get("cpu").map(String::as_str), Some("8"));
        assert_eq!(c.get("memory"), None);
        assert_eq!(c.get(GPU_RESOURCE).map(String::as_str), Some("2"));
        let bad = BTreeMap::from([
            (CPU_ANNOTATION.to_string(), "-4".to_string()),
            (MEMORY_ANNOTATION.to_string(), "0".to_string()),
            (GPU_ANNOTATION.to_string(), "1.5".to_string()),
        ]);
        assert!(capacity(&bad).is_empty());
    }

    #[test]
    fn the_status_patch_merges_and_is_written_only_when_different() {
        let sized = json!({CPU_ANNOTATION: "8", MEMORY_ANNOTATION: "32Gi"});
        let t = template(
            sized.clone(),
            json!({"capacity": {"cpu": "2", "pods": "110"}}),
        );
        assert_eq!(
            status_patch(&t),
            Some(json!({"status": {"capacity": {"cpu": "8", "memory": "32Gi"}}}))
        );
        let done = template(
            sized.clone(),
            json!({"capacity": {"cpu": 8, "memory": "32Gi", "pods": "110"}}),
        );
        assert_eq!(status_patch(&done), None);
        // The same quantity spelt otherwise is the same.
        let spelt = template(
            sized,
            json!({"capacity": {"cpu": "8000m", "memory": "32768Mi"}}),
        );
        assert_eq!(status_patch(&spelt), None);
        assert_eq!(status_patch(&template(json!({}), json!({}))), None);
    }
}
