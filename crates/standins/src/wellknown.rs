//! The upstream names the stand-ins read and write: Kubernetes', Cluster API's, Cluster
//! Autoscaler's and Karpenter's labels, annotations, taints and validation patterns. They are
//! stated here rather than imported from the controller's crate, because they are upstream's
//! names: a stand-in that borrowed the controller's spelling would agree with a misspelling
//! instead of catching it.

// ---- Kubernetes ----
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const ARCH_LABEL: &str = "kubernetes.io/arch";
pub const OS_LABEL: &str = "kubernetes.io/os";
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
pub const NOT_READY_TAINT_KEY: &str = "node.kubernetes.io/not-ready";
/// The annotation marking a StorageClass as the default.
pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
/// apimachinery's pattern for `resource.Quantity` strings, as CRDs carry it.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";
/// apimachinery's pattern for a label value.
pub const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";

// ---- Karpenter ----
pub const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";
pub const DO_NOT_DISRUPT_ANNOTATION: &str = "karpenter.sh/do-not-disrupt";
pub const TERMINATION_TIMESTAMP_ANNOTATION: &str = "karpenter.sh/nodeclaim-termination-timestamp";
pub const UNREGISTERED_TAINT_KEY: &str = "karpenter.sh/unregistered";

// ---- Cluster API ----
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Beside `cluster-name`, the namespace of the Cluster a Karpenter object in the management
/// cluster is bound to.
pub const CLUSTER_NAMESPACE_LABEL: &str = "karpenter.cluster.x-k8s.io/cluster-namespace";
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
pub const SET_NAME_LABEL: &str = "cluster.x-k8s.io/set-name";
/// On every MachinePool Machine: the MachinePool it belongs to.
pub const POOL_NAME_LABEL: &str = "cluster.x-k8s.io/pool-name";
/// Cluster API skips its own drain of a Machine's Node when the Machine carries this.
pub const EXCLUDE_NODE_DRAINING_ANNOTATION: &str = "machine.cluster.x-k8s.io/exclude-node-draining";
pub const DELETE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/delete-machine";
pub const MACHINE_POOL_KIND: &str = "MachinePool";
/// The label domains Cluster API propagates from a Machine to its Node.
const CAPI_PROPAGATED_DOMAINS: [&str; 3] = [
    "node-role.kubernetes.io",
    "node-restriction.kubernetes.io",
    "node.cluster.x-k8s.io",
];

/// True when Cluster API propagates this Machine label to the Node: its prefix is one of those
/// domains or a subdomain of one.
pub fn capi_propagates(key: &str) -> bool {
    let prefix = key.split_once('/').map_or(key, |(p, _)| p);
    CAPI_PROPAGATED_DOMAINS
        .iter()
        .any(|d| prefix == *d || prefix.ends_with(&format!(".{d}")))
}

// ---- Cluster Autoscaler (Cluster API provider's scale-from-zero annotations) ----
pub const MIN_SIZE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
pub const CPU_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/cpu";
pub const MEMORY_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/memory";
pub const EPHEMERAL_DISK_ANNOTATION: &str =
    "capacity.cluster-autoscaler.kubernetes.io/ephemeral-disk";
pub const MAX_PODS_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/maxPods";
pub const GPU_COUNT_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/gpu-count";
pub const LABELS_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/labels";
pub const TAINTS_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/taints";
/// Cluster Autoscaler's default when maxPods is not annotated.
pub const DEFAULT_MAX_PODS: i64 = 110;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_api_propagates_its_domains_and_their_subdomains_only() {
        assert!(capi_propagates("node-role.kubernetes.io/worker"));
        assert!(capi_propagates("gpu.node.cluster.x-k8s.io/model"));
        assert!(capi_propagates("node.cluster.x-k8s.io"));
        assert!(!capi_propagates("kubernetes.io/arch"));
        assert!(!capi_propagates("xnode.cluster.x-k8s.io/a"));
    }
}
