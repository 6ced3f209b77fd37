//! Writing a decided claim as the NodeClaim object Karpenter would create.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;

use super::NewClaim;
use crate::api::drift_hash::nodepool_hash;
use crate::api::duration::GoDuration;
use crate::api::nodeclaim::{NodeClaim, NodeClaimSpec, ResourceRequirements};
use crate::api::nodepool::NodePool;
use crate::api::wellknown::{
    HOSTNAME_LABEL, MIN_VALUES_RELAXED_ANNOTATION, NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION,
    NODEPOOL_HASH_VERSION_ANNOTATION, NODEPOOL_LABEL,
};

/// The NodeClaim for `new`: `generateName: <nodepool>-`, owned by the NodePool (blocking its
/// deletion, not as controller, as upstream does), labelled with the template labels, the pool
/// and every single-valued requirement, annotated with the template annotations, the drift
/// hash and whether minValues were relaxed, and carrying the template's taints, lifetimes and
/// node class.
pub fn nodeclaim_for(new: &NewClaim, nodepool: &NodePool) -> NodeClaim {
    let pool_name = nodepool.metadata.name.clone().unwrap_or_default();
    let template = &nodepool.spec.template;
    let meta = template.metadata.as_ref();

    let mut labels: BTreeMap<String, String> =
        meta.and_then(|m| m.labels.clone()).unwrap_or_default();
    for r in new.requirements.iter() {
        if r.key() == HOSTNAME_LABEL || r.allows_absent() {
            continue;
        }
        if let Some(values) = r.finite_values()
            && values.len() == 1
            && let Some(v) = values.iter().next()
        {
            labels.insert(r.key().to_string(), v.clone());
        }
    }
    labels.insert(NODEPOOL_LABEL.to_string(), pool_name.clone());

    let mut annotations: BTreeMap<String, String> =
        meta.and_then(|m| m.annotations.clone()).unwrap_or_default();
    annotations.insert(
        NODEPOOL_HASH_ANNOTATION.to_string(),
        nodepool_hash(nodepool),
    );
    annotations.insert(
        NODEPOOL_HASH_VERSION_ANNOTATION.to_string(),
        NODEPOOL_HASH_VERSION.to_string(),
    );
    annotations.insert(
        MIN_VALUES_RELAXED_ANNOTATION.to_string(),
        new.min_values_relaxed.to_string(),
    );

    NodeClaim {
        metadata: ObjectMeta {
            generate_name: Some(format!("{pool_name}-")),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "karpenter.sh/v1".into(),
                kind: "NodePool".into(),
                name: pool_name,
                uid: nodepool.metadata.uid.clone().unwrap_or_default(),
                block_owner_deletion: Some(true),
                controller: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: NodeClaimSpec {
            taints: template.spec.taints.clone(),
            startup_taints: template.spec.startup_taints.clone(),
            requirements: new.requirements.to_node_selector_requirements(),
            resources: Some(ResourceRequirements {
                requests: Some(new.requests.to_k8s()),
            }),
            node_class_ref: template.spec.node_class_ref.clone(),
            termination_grace_period: template.spec.termination_grace_period,
            expire_after: Some(nodepool.expire_after()),
        },
        status: None,
    }
}

/// What a static NodePool (`spec.replicas`) launches to hold its count: its template and
/// nothing else, no pods and no requests, as upstream's static claims leave the instance type
/// to the cloud provider (here: the cheapest offering the requirements allow). None when the
/// template's requirements cannot be read (the pool launches nothing).
pub fn static_claim(nodepool: &NodePool) -> Option<NewClaim> {
    let requirements = super::nodepool_requirements(nodepool).ok()?;
    Some(NewClaim {
        nodepool: nodepool.metadata.name.clone().unwrap_or_default(),
        requirements,
        requests: crate::api::resources::Resources::new(),
        pods: Vec::new(),
        instance_types: Vec::new(),
        min_values_relaxed: false,
    })
}

/// `claim` with the controller's `--default-termination-grace-period` when its NodePool sets
/// none (upstream's `DefaultTerminationGracePeriod`); a NodePool's own value always wins.
pub fn with_default_termination_grace_period(
    mut claim: NodeClaim,
    default: Option<Duration>,
) -> NodeClaim {
    if claim.spec.termination_grace_period.is_none() {
        claim.spec.termination_grace_period = default.map(GoDuration);
    }
    claim
}
