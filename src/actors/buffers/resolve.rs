//! A CapacityBuffer resolved: how many chunks, of which pod, and the status that says so. Pure:
//! the actor reads the referenced objects and hands them in.
//!
//! The chunk count follows the API's own text, which is also Cluster Autoscaler's core (since
//! 2026-07) and Karpenter's `computeReplicas` (v1.14.1), so one buffer means the same headroom
//! whichever autoscaler reads it: `replicas` and `percentage` (of the `scalableRef`'s replicas,
//! rounded up to at least 1; left out while the workload has no replicas) together take the
//! larger; `limits` bound the result, or alone give as many chunks as fit in them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::api::capacity_buffer::{
    BUFFER_NAME_ANNOTATION, BUFFER_NAMESPACE_ANNOTATION, CapacityBuffer, FAKE_POD_ANNOTATION,
    LocalObjectRef,
};
use crate::api::resources::{Quantity, Resources};

/// `ReadyForProvisioning` reasons (upstream Karpenter's).
pub(crate) const RESOLVED: &str = "Resolved";
pub(crate) const POD_TEMPLATE_NOT_FOUND: &str = "PodTemplateNotFound";
pub(crate) const SCALABLE_REF_NOT_FOUND: &str = "ScalableRefNotFound";
pub(crate) const RESOLUTION_FAILED: &str = "ResolutionFailed";

/// The object a buffer's chunk comes from, as read.
#[derive(Clone, Debug)]
pub struct Source {
    pub template: PodTemplateSpec,
    /// The workload's `spec.replicas` (a `scalableRef`; unset counts as 1, as the API defaults
    /// it).
    pub scalable_replicas: Option<i32>,
    /// The PodTemplate's name and generation (a `podTemplateRef`).
    pub pod_template: Option<(String, i64)>,
}

/// Why a buffer cannot be provisioned: a `ReadyForProvisioning` reason and a message naming the
/// field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReady {
    pub(crate) reason: &'static str,
    pub message: String,
}

impl NotReady {
    pub(crate) fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// A resolved buffer: its chunk count and the pod of one chunk.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub replicas: i32,
    pub(crate) template: PodTemplateSpec,
    pub(crate) pod_template: Option<LocalObjectRef>,
    pub pod_template_generation: Option<i64>,
}

/// The buffer's chunk count from its spec and what it references.
pub fn resolve(cb: &CapacityBuffer, source: Source) -> Result<Resolved, NotReady> {
    let spec = &cb.spec;
    let mut sizes = Vec::new();
    if let Some(r) = spec.replicas {
        sizes.push(r.max(0));
    }
    // A percentage of a workload scaled to zero asks for nothing, but it is still a size: the
    // buffer resolves to what `replicas` says, or to none.
    let mut sized = !sizes.is_empty();
    if let (Some(p), Some(_)) = (spec.percentage, &spec.scalable_ref) {
        sized = true;
        let of = source.scalable_replicas.unwrap_or(1);
        if of > 0 {
            sizes.push(percentage_of(of, p));
        }
    }
    let wanted = sized.then(|| sizes.into_iter().max().unwrap_or(0));
    let by_limits = match &spec.limits {
        Some(limits) => Some(chunks_within(limits, &source.template)?),
        None => None,
    };
    let replicas = match (wanted, by_limits) {
        (Some(w), Some(Some(l))) => w.min(l),
        (Some(w), _) => w,
        (None, Some(Some(l))) => l,
        (None, Some(None)) => {
            return Err(NotReady::new(
                RESOLUTION_FAILED,
                "spec.limits: the pod template requests none of the limited resources, so no \
                 number of chunks follows from them",
            ));
        }
        (None, None) => {
            return Err(NotReady::new(
                RESOLUTION_FAILED,
                "spec: none of replicas, percentage or limits is set, so the buffer has no size",
            ));
        }
    };
    let (pod_template, pod_template_generation) = match source.pod_template {
        Some((name, generation)) => (Some(LocalObjectRef { name }), Some(generation)),
        None => (None, None),
    };
    Ok(Resolved {
        replicas,
        template: source.template,
        pod_template,
        pod_template_generation,
    })
}

/// `percentage` of `replicas`, rounded up, and at least 1 when both are positive.
pub fn percentage_of(replicas: i32, percentage: i32) -> i32 {
    if replicas <= 0 || percentage <= 0 {
        return 0;
    }
    let n = (i64::from(replicas) * i64::from(percentage) + 99) / 100;
    i32::try_from(n).unwrap_or(i32::MAX).max(1)
}

/// How many chunks fit in `limits`: for each limited resource the pod requests, the floor of
/// limit over request; the smallest. None when the pod requests none of them. A template whose
/// requests do not parse is refused naming the field.
fn chunks_within(
    limits: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    template: &PodTemplateSpec,
) -> Result<Option<i32>, NotReady> {
    let requests = requests_of(template)?;
    let mut fewest: Option<i64> = None;
    for (name, limit) in limits {
        let limit = Quantity::from_k8s(limit)
            .map_err(|e| NotReady::new(RESOLUTION_FAILED, format!("spec.limits.{name}: {e}")))?;
        let request = requests.get(name);
        if request.is_zero() || request.is_negative() {
            continue;
        }
        let n = (limit.as_nanos().max(0) / request.as_nanos()) as i64;
        fewest = Some(fewest.map_or(n, |f| f.min(n)));
    }
    Ok(fewest.map(|n| i32::try_from(n).unwrap_or(i32::MAX)))
}

/// One chunk's requests, as kube-scheduler sums them.
pub(crate) fn requests_of(template: &PodTemplateSpec) -> Result<Resources, NotReady> {
    let Some(spec) = &template.spec else {
        return Ok(Resources::new());
    };
    crate::scheduling::pod::pod_requests(spec)
        .map_err(|e| NotReady::new(RESOLUTION_FAILED, format!("pod template: {e}")))
}

/// The buffer's placeholder pods: `replicas` copies of the chunk's pod, pending and
/// unschedulable as a real pod waiting for room would be, named and marked as upstream names
/// them. Never written to the cluster. Volumes that need a claim are dropped: a placeholder's
/// claim would never exist.
pub fn placeholder_pods(cb: &CapacityBuffer, resolved: &Resolved) -> Vec<Pod> {
    let namespace = cb.namespace().unwrap_or_default();
    let name = cb.name_any();
    let uid = cb.uid().unwrap_or_default();
    let mut spec = resolved.template.spec.clone().unwrap_or_default();
    spec.node_name = None;
    spec.priority = Some(i32::MIN);
    let dropped: Vec<String> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some())
        .map(|v| v.name.clone())
        .collect();
    if !dropped.is_empty() {
        if let Some(vs) = spec.volumes.as_mut() {
            vs.retain(|v| !dropped.contains(&v.name));
        }
        let containers = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten());
        for c in containers {
            if let Some(mounts) = c.volume_mounts.as_mut() {
                mounts.retain(|m| !dropped.contains(&m.name));
            }
        }
    }
    let labels = resolved
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone());
    let annotations: BTreeMap<String, String> = [
        (FAKE_POD_ANNOTATION, "true"),
        (BUFFER_NAME_ANNOTATION, name.as_str()),
        (BUFFER_NAMESPACE_ANNOTATION, namespace.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    (1..=resolved.replicas.max(0))
        .map(|i| Pod {
            metadata: ObjectMeta {
                name: Some(format!("capacity-buffer-{name}-{i}")),
                namespace: Some(namespace.clone()),
                uid: Some(format!("{uid}-{i}")),
                labels: labels.clone(),
                annotations: Some(annotations.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(spec.clone()),
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "PodScheduled".into(),
                    status: "False".into(),
                    reason: Some("Unschedulable".into()),
                    ..PodCondition::default()
                }]),
                phase: Some("Pending".into()),
                ..PodStatus::default()
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::capacity_buffer::{CapacityBufferSpec, ScalableRef};
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

    fn template(cpu: &str) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: None,
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(
                            [("cpu".to_string(), K8sQuantity(cpu.into()))]
                                .into_iter()
                                .collect(),
                        ),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
        }
    }

    fn buffer(spec: CapacityBufferSpec) -> CapacityBuffer {
        let mut cb = CapacityBuffer::new("b", spec);
        cb.metadata.namespace = Some("default".into());
        cb
    }

    fn scalable(replicas: i32) -> Source {
        Source {
            template: template("1"),
            scalable_replicas: Some(replicas),
            pod_template: None,
        }
    }

    fn deployment() -> Option<ScalableRef> {
        Some(ScalableRef {
            api_group: "apps".into(),
            kind: "Deployment".into(),
            name: "web".into(),
        })
    }

    fn limits(cpu: &str) -> Option<BTreeMap<String, K8sQuantity>> {
        Some([("cpu".to_string(), K8sQuantity(cpu.into()))].into())
    }

    fn replicas_of(spec: CapacityBufferSpec, source: Source) -> Result<i32, NotReady> {
        resolve(&buffer(spec), source).map(|r| r.replicas)
    }

    #[test]
    fn percentage_rounds_up_to_at_least_one() {
        assert_eq!(percentage_of(10, 20), 2);
        assert_eq!(percentage_of(10, 25), 3);
        assert_eq!(percentage_of(1, 10), 1);
        assert_eq!(percentage_of(0, 10), 0);
        assert_eq!(percentage_of(10, 0), 0);
        assert_eq!(percentage_of(10, 150), 15);
    }

    #[test]
    fn replicas_and_percentage_take_the_larger_and_limits_bound_them() {
        let both = CapacityBufferSpec {
            scalable_ref: deployment(),
            replicas: Some(5),
            percentage: Some(20),
            ..CapacityBufferSpec::default()
        };
        // max(5, 20 % of 10 = 2): the API's text and upstream's computeReplicas.
        assert_eq!(replicas_of(both.clone(), scalable(10)), Ok(5));
        assert_eq!(replicas_of(both.clone(), scalable(40)), Ok(8));
        // A workload at zero replicas: the percentage is left out, replicas stand alone.
        assert_eq!(replicas_of(both.clone(), scalable(0)), Ok(5));
        let percentage_only = CapacityBufferSpec {
            replicas: None,
            ..both.clone()
        };
        assert_eq!(replicas_of(percentage_only, scalable(0)), Ok(0));
        let capped = CapacityBufferSpec {
            percentage: Some(80),
            replicas: Some(10),
            limits: limits("4"),
            ..both
        };
        assert_eq!(replicas_of(capped, scalable(10)), Ok(4));
        let limits_only = CapacityBufferSpec {
            scalable_ref: deployment(),
            limits: limits("5500m"),
            ..CapacityBufferSpec::default()
        };
        assert_eq!(replicas_of(limits_only, scalable(3)), Ok(5));
    }

    #[test]
    fn a_buffer_without_a_size_or_with_limits_the_pod_does_not_request_is_not_ready() {
        let none = CapacityBufferSpec {
            scalable_ref: deployment(),
            ..CapacityBufferSpec::default()
        };
        let e = replicas_of(none, scalable(3)).unwrap_err();
        assert_eq!(e.reason, RESOLUTION_FAILED);
        let memory = CapacityBufferSpec {
            scalable_ref: deployment(),
            limits: Some([("memory".to_string(), K8sQuantity("1Gi".into()))].into()),
            ..CapacityBufferSpec::default()
        };
        let e = replicas_of(memory, scalable(3)).unwrap_err();
        assert!(e.message.starts_with("spec.limits"), "{}", e.message);
    }

    #[test]
    fn placeholders_are_pending_marked_and_never_claim_volumes() {
        let cb = buffer(CapacityBufferSpec {
            replicas: Some(2),
            ..CapacityBufferSpec::default()
        });
        let mut t = template("1");
        if let Some(spec) = t.spec.as_mut() {
            spec.volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
                name: "data".into(),
                persistent_volume_claim: Some(Default::default()),
                ..Default::default()
            }]);
            spec.containers[0].volume_mounts =
                Some(vec![k8s_openapi::api::core::v1::VolumeMount {
                    name: "data".into(),
                    mount_path: "/d".into(),
                    ..Default::default()
                }]);
        }
        let resolved = resolve(
            &cb,
            Source {
                template: t,
                scalable_replicas: None,
                pod_template: Some(("t".into(), 1)),
            },
        )
        .unwrap();
        let pods = placeholder_pods(&cb, &resolved);
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[1].name_any(), "capacity-buffer-b-2");
        let spec = pods[0].spec.as_ref().unwrap();
        assert!(spec.volumes.as_ref().unwrap().is_empty());
        assert!(
            spec.containers[0]
                .volume_mounts
                .as_ref()
                .unwrap()
                .is_empty()
        );
        assert!(crate::state::pods::is_provisionable(&pods[0]));
    }
}
