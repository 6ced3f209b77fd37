//! A pod's spec and status read the way the index keeps them: what `state::trim` drops is
//! skipped while the JSON is parsed, never built. A real API server's pod carries a projected
//! token volume and its mounts, the kubelet's container statuses, and whatever the workload
//! brings (environment, probes, commands, images): decoding those into k8s-openapi values only
//! for the index to drop them was most of the decode's cost on a real control plane.
//!
//! These are the pod's rules; [`crate::api::partial`] reads a value under them.

use crate::api::partial::Fields;
pub(super) use crate::api::partial::Keep;

/// A container as the solver reads it (`state::trim`'s `container`).
pub(super) const CONTAINER: Keep = Keep::Object(&Fields {
    only: Some(&["name", "resources", "restartPolicy", "ports"]),
    skip: &[],
    nested: &[],
});

/// A volume that can tie a pod to storage (`state::trim`'s `volumes`); the others decode to a
/// name alone and are dropped by the trim.
pub(super) const VOLUME: Keep = Keep::Object(&Fields {
    only: Some(&["name", "persistentVolumeClaim", "ephemeral"]),
    skip: &[],
    nested: &[],
});

/// A pod's spec: what the trim empties is skipped.
pub(super) const SPEC: Keep = Keep::Object(&Fields {
    only: None,
    skip: &[
        "ephemeralContainers",
        "readinessGates",
        "dnsConfig",
        "hostAliases",
        "imagePullSecrets",
        "securityContext",
    ],
    nested: &[
        ("containers", Keep::Each(&CONTAINER)),
        ("initContainers", Keep::Each(&CONTAINER)),
        ("volumes", Keep::Each(&VOLUME)),
    ],
});

/// A pod's status: what the trim empties is skipped.
pub(super) const STATUS: Keep = Keep::Object(&Fields {
    only: None,
    skip: &[
        "containerStatuses",
        "initContainerStatuses",
        "ephemeralContainerStatuses",
        "resourceClaimStatuses",
        "hostIP",
        "hostIPs",
        "podIP",
        "podIPs",
        "message",
        "qosClass",
    ],
    nested: &[],
});
