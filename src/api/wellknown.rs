//! Every well-known label, annotation, taint key and finalizer in one place, so that a typo
//! cannot split one concept into two strings.

// ---- Karpenter (karpenter.sh) ----
pub const KARPENTER_GROUP: &str = "karpenter.sh";
pub const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";
pub const CAPACITY_TYPE_LABEL: &str = "karpenter.sh/capacity-type";
pub const REGISTERED_LABEL: &str = "karpenter.sh/registered";
pub const INITIALIZED_LABEL: &str = "karpenter.sh/initialized";
pub const NODECLASS_LABEL_PREFIX: &str = "karpenter.cluster.x-k8s.io/";
pub const DO_NOT_DISRUPT_ANNOTATION: &str = "karpenter.sh/do-not-disrupt";
/// On a Pod: its owner's steer of consolidation's eviction cost (v1.15), read before the
/// deletion cost.
pub const DISRUPTION_COST_ANNOTATION: &str = "karpenter.sh/disruption-cost";
/// On a Pod: "true" while its deletion cost is the controller's ranking (pod deletion cost
/// management), not its owner's.
pub const MANAGED_DELETION_COST_ANNOTATION: &str = "karpenter.sh/managed-deletion-cost";
/// On a Pod: Kubernetes' ReplicaSet scale-in order (lower goes first).
pub const POD_DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";
/// On a Node or NodeClaim: `"true"` (no other value) keeps node repair from replacing it
/// (Karpenter v1.15, alpha). `do-not-disrupt` does not: repair is not held by it.
pub const DO_NOT_REPAIR_ANNOTATION: &str = "karpenter.sh/do-not-repair";
/// On a deleted claim with a terminationGracePeriod: when every pod of its node must be gone
/// (RFC 3339), as upstream Karpenter writes it.
pub const TERMINATION_TIMESTAMP_ANNOTATION: &str = "karpenter.sh/nodeclaim-termination-timestamp";
/// On every NodeClaim the provisioner creates: "true" when a minValues of its NodePool was
/// lowered under the BestEffort policy, else "false" (upstream's key and values).
pub const MIN_VALUES_RELAXED_ANNOTATION: &str = "karpenter.sh/nodeclaim-min-values-relaxed";
pub const NODEPOOL_HASH_ANNOTATION: &str = "karpenter.sh/nodepool-hash";
pub const NODEPOOL_HASH_VERSION_ANNOTATION: &str = "karpenter.sh/nodepool-hash-version";
/// Version of our hashing scheme; bump when the hashed fields change so drift is not flagged
/// on every node after an upgrade.
pub const NODEPOOL_HASH_VERSION: &str = "v3";
pub const TERMINATION_FINALIZER: &str = "karpenter.sh/termination";
pub const UNREGISTERED_TAINT_KEY: &str = "karpenter.sh/unregistered";
pub const DISRUPTED_TAINT_KEY: &str = "karpenter.sh/disrupted";

pub const CAPACITY_TYPE_ON_DEMAND: &str = "on-demand";
pub const CAPACITY_TYPE_SPOT: &str = "spot";
pub const CAPACITY_TYPE_RESERVED: &str = "reserved";

// ---- Kubernetes well-known labels ----
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
pub const INSTANCE_TYPE_LABEL_BETA: &str = "beta.kubernetes.io/instance-type";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const ZONE_LABEL_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const REGION_LABEL_BETA: &str = "failure-domain.beta.kubernetes.io/region";
pub const ARCH_LABEL: &str = "kubernetes.io/arch";
pub const OS_LABEL: &str = "kubernetes.io/os";
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
pub const WINDOWS_BUILD_LABEL: &str = "node.kubernetes.io/windows-build";

// ---- Kubernetes taints that mean "not ready yet" (ephemeral, ignored for initialization) ----
pub const NOT_READY_TAINT_KEY: &str = "node.kubernetes.io/not-ready";
pub const UNREACHABLE_TAINT_KEY: &str = "node.kubernetes.io/unreachable";
pub const UNINITIALIZED_TAINT_KEY: &str = "node.cloudprovider.kubernetes.io/uninitialized";
pub const EPHEMERAL_TAINT_KEYS: [&str; 4] = [
    NOT_READY_TAINT_KEY,
    UNREACHABLE_TAINT_KEY,
    UNINITIALIZED_TAINT_KEY,
    UNREGISTERED_TAINT_KEY,
];

// ---- ClusterAPINodeClass ----
pub const NODECLASS_GROUP: &str = "karpenter.cluster.x-k8s.io";
pub const NODECLASS_KIND: &str = "ClusterAPINodeClass";

// ---- Cluster API ----
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// With `--karpenter-objects management`, the namespace of the Cluster a Karpenter object is
/// bound to (beside `cluster-name`: two Clusters of one name in two namespaces stay apart).
pub const CLUSTER_NAMESPACE_LABEL: &str = "karpenter.cluster.x-k8s.io/cluster-namespace";
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
pub const SET_NAME_LABEL: &str = "cluster.x-k8s.io/set-name";
/// On every MachinePool Machine: the MachinePool it belongs to.
pub const POOL_NAME_LABEL: &str = "cluster.x-k8s.io/pool-name";
/// Cluster API skips its own drain of a Machine's Node when the Machine carries this (any value).
pub const EXCLUDE_NODE_DRAINING_ANNOTATION: &str = "machine.cluster.x-k8s.io/exclude-node-draining";
pub const DELETE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/delete-machine";
/// Membership label on MachineDeployments (and the Machines we bind) used by the Go provider.
pub const MEMBER_LABEL: &str = "node.cluster.x-k8s.io/karpenter-member";
/// Annotation on a NodeClaim naming its Machine as `<namespace>/<name>`.
pub const MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/machine";
/// Annotation on a Machine naming the NodeClaim bound to it (the other half of invariant 1).
pub const NODECLAIM_ANNOTATION: &str = "karpenter.cluster.x-k8s.io/nodeclaim";
/// Annotation on a NodeClaim of a MachinePool without MachinePool Machines: the provider ID of
/// the pool instance bound to it (the durable binding; no Machine exists to carry it).
pub const INSTANCE_ANNOTATION: &str = "karpenter.cluster.x-k8s.io/instance";
/// Annotation on a NodeClaim bound to a MachinePool Machine: the hash of the pool's template
/// (`spec.template.spec`) when its Machine was bound. A pool's Machines carry no `UpToDate` of
/// their own (Cluster API sets it true on every one), so a template changed since is the
/// claim's drift.
pub const POOL_TEMPLATE_HASH_ANNOTATION: &str = "karpenter.cluster.x-k8s.io/pool-template-hash";
/// Annotation on a NodeClaim bound to a MachinePool Machine: the hash of the infrastructure
/// pool's instance fields (e.g. an AWSMachinePool's launch template) when its Machine was bound;
/// an edit of them in place since is the claim's drift, as a pool template change is.
pub const INFRA_POOL_HASH_ANNOTATION: &str = "karpenter.cluster.x-k8s.io/infrastructure-pool-hash";
/// Annotation on a MachinePool without MachinePool Machines: the provider IDs (comma-separated)
/// of instances whose claims were deleted and that were handed back to the pool as baseline
/// capacity (no specific instance can be removed). Written with the managed-replicas count.
pub const HANDED_BACK_ANNOTATION: &str = "karpenter.cluster.x-k8s.io/handed-back-instances";
/// Annotation on the Node of a handed-back instance (value: the claim that let it go): cordoned
/// and cleared of that claim's labels and taints, free for the next claim on its pool, whose
/// registration lifts the cordon and takes the annotation off.
pub const HANDED_BACK_NODE_ANNOTATION: &str = "karpenter.cluster.x-k8s.io/handed-back-by";
/// Annotation on a NodeClaim naming the MachineDeployment it waits on, written before the
/// replica write so a restarted controller can account for the pending replica (invariant 4).
pub const MACHINE_DEPLOYMENT_ANNOTATION: &str = "karpenter.cluster.x-k8s.io/machine-deployment";
/// Annotation on a NodeClaim created ahead of a Cluster API RollingUpdate, naming the claim whose
/// outdated Machine it replaces (it takes the rollout's fresh Machine before the old one goes).
pub const REPLACES_ANNOTATION: &str = "karpenter.cluster.x-k8s.io/replaces";
pub const MIN_SIZE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
/// Annotation on a NodePool that pauses its voluntary disruption while its value is "true"
/// (upstream's RFC for a disruption pause names none yet, so this controller's own domain).
pub const DISRUPTION_PAUSED_ANNOTATION: &str = "karpenter.cluster.x-k8s.io/disruption-paused";
pub const MAX_SIZE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";
pub const PRICE_ANNOTATION: &str = "cluster.x-k8s.io/machine-current-price";
/// The price under Cluster Autoscaler's capacity prefix (the name the Go provider's pending change
/// reads). `PRICE_ANNOTATION` wins when both are set and differ.
pub const CA_PRICE_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/price";

// ---- Scale-from-zero annotations (Cluster Autoscaler's convention) ----
pub const CAPACITY_ANNOTATION_PREFIX: &str = "capacity.cluster-autoscaler.kubernetes.io/";
pub const CPU_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/cpu";
pub const MEMORY_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/memory";
pub const EPHEMERAL_DISK_ANNOTATION: &str =
    "capacity.cluster-autoscaler.kubernetes.io/ephemeral-disk";
pub const MAX_PODS_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/maxPods";
pub const GPU_TYPE_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/gpu-type";
pub const GPU_COUNT_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/gpu-count";
pub const LABELS_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/labels";
pub const TAINTS_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/taints";
/// Cluster Autoscaler's default when maxPods is not annotated.
pub const DEFAULT_MAX_PODS: i64 = 110;

/// Label domains Cluster API propagates from a Machine to its Node.
pub const CAPI_PROPAGATED_DOMAINS: [&str; 3] = [
    "node-role.kubernetes.io",
    "node-restriction.kubernetes.io",
    "node.cluster.x-k8s.io",
];

/// True when `key`'s prefix is `domain` or a subdomain of it.
pub fn key_in_domain(key: &str, domain: &str) -> bool {
    let prefix = key.split_once('/').map(|(p, _)| p).unwrap_or(key);
    prefix == domain || prefix.ends_with(&format!(".{domain}"))
}

/// True when Cluster API propagates this Machine label to the Node.
pub fn capi_propagates(key: &str) -> bool {
    CAPI_PROPAGATED_DOMAINS
        .iter()
        .any(|d| key_in_domain(key, d))
}

// ---- Resource names (added for src/capi) ----
pub const RESOURCE_CPU: &str = "cpu";
pub const RESOURCE_MEMORY: &str = "memory";
pub const RESOURCE_EPHEMERAL_STORAGE: &str = "ephemeral-storage";
pub const RESOURCE_PODS: &str = "pods";
/// The extended resource the NVIDIA device plugin registers; where a scale-from-zero GPU count
/// goes when the gpu-type annotation names a model rather than a resource.
pub const NVIDIA_GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Architecture and OS assumed when neither the template nor the annotations say.
pub const DEFAULT_ARCH: &str = "amd64";
pub const DEFAULT_OS: &str = "linux";
/// Controller owner-reference kinds in the Cluster API ownership chain.
pub const MACHINE_SET_KIND: &str = "MachineSet";
pub const MACHINE_DEPLOYMENT_KIND: &str = "MachineDeployment";
pub const MACHINE_POOL_KIND: &str = "MachinePool";

/// Annotation on a MachineDeployment: how many of its replicas this controller added and has not
/// yet removed. Written in the same compare-and-swap patch as `spec.replicas`, so that a restarted
/// controller knows which replicas are its own (invariants 2 and 4).
pub const MANAGED_REPLICAS_ANNOTATION: &str = "karpenter.cluster.x-k8s.io/managed-replicas";

/// Deprecated keys and the well-known keys they stand for: a pod's requirement on one is read as
/// a requirement on the other (upstream's `NormalizedLabels`), so old manifests keep working.
pub const NORMALIZED_LABELS: [(&str, &str); 5] = [
    (ZONE_LABEL_BETA, ZONE_LABEL),
    ("beta.kubernetes.io/arch", ARCH_LABEL),
    ("beta.kubernetes.io/os", OS_LABEL),
    (INSTANCE_TYPE_LABEL_BETA, INSTANCE_TYPE_LABEL),
    (REGION_LABEL_BETA, REGION_LABEL),
];

/// `key`, or the well-known key it is a deprecated alias of.
pub fn normalized_label(key: &str) -> &str {
    NORMALIZED_LABELS
        .iter()
        .find(|(old, _)| *old == key)
        .map_or(key, |(_, new)| new)
}

/// Labels every node gets from its provider, so a pod may require them (and a NodePool may
/// constrain them) even when no NodePool or instance type spells out their values.
pub const WELL_KNOWN_LABELS: [&str; 10] = [
    ZONE_LABEL,
    ZONE_LABEL_BETA,
    REGION_LABEL,
    INSTANCE_TYPE_LABEL,
    INSTANCE_TYPE_LABEL_BETA,
    ARCH_LABEL,
    OS_LABEL,
    WINDOWS_BUILD_LABEL,
    CAPACITY_TYPE_LABEL,
    HOSTNAME_LABEL,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deprecated_keys_normalize_to_well_known_ones() {
        assert_eq!(
            normalized_label(INSTANCE_TYPE_LABEL_BETA),
            INSTANCE_TYPE_LABEL
        );
        assert_eq!(normalized_label("beta.kubernetes.io/arch"), ARCH_LABEL);
        assert_eq!(normalized_label(REGION_LABEL_BETA), REGION_LABEL);
        assert_eq!(normalized_label(ZONE_LABEL), ZONE_LABEL);
        assert_eq!(normalized_label("example.com/team"), "example.com/team");
    }

    #[test]
    fn domains_include_subdomains() {
        assert!(capi_propagates("node-role.kubernetes.io/worker"));
        assert!(capi_propagates("node.cluster.x-k8s.io"));
        assert!(capi_propagates("foo.node.cluster.x-k8s.io/bar"));
        assert!(!capi_propagates("xnode.cluster.x-k8s.io/bar"));
        assert!(!capi_propagates("kubernetes.io/arch"));
    }
}
