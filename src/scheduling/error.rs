//! Why a pod could not be placed. The Display of each variant is the message of the Event the
//! provisioner puts on the pod, so it says what to change.

/// The reason a pending pod got no node in a solve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// The pod's own spec cannot be read (a bad operator in a selector, a bad quantity).
    #[error("cannot schedule pod: {details}")]
    InvalidPod { details: String },
    /// The pod requires a label Karpenter reserves, one no new node can be created with
    /// (`kubernetes.io/hostname`: a new node's name is not known before it registers), and no
    /// existing node took it.
    #[error("label {key:?} is restricted: {details}")]
    RestrictedLabel { key: String, details: String },
    /// No NodePool's requirements, taints or topology admit the pod.
    #[error("no NodePool matches the pod: {details}")]
    NoNodePoolMatches { details: String },
    /// A NodePool would admit the pod but its `spec.limits` leave no room.
    #[error("NodePool {nodepool:?} has reached its limit on {resource:?}")]
    LimitReached { nodepool: String, resource: String },
    /// A NodePool would admit the pod but a CapacityQuota covering its new node has no room:
    /// the quota's limit, less what the nodes it selects use, is less than one more node.
    #[error("CapacityQuota {quota:?} has reached its limit on {resource:?}")]
    QuotaReached { quota: String, resource: String },
    /// A NodePool admits the pod but none of its instance types can hold it.
    #[error("no instance type of NodePool {nodepool:?} fits the pod: {details}")]
    NoInstanceTypeFits { nodepool: String, details: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_nodepool_and_resource() {
        let cases = [
            (
                PodError::LimitReached {
                    nodepool: "default".into(),
                    resource: "cpu".into(),
                },
                "NodePool \"default\" has reached its limit on \"cpu\"",
            ),
            (
                PodError::QuotaReached {
                    quota: "team-a".into(),
                    resource: "nodes".into(),
                },
                "CapacityQuota \"team-a\" has reached its limit on \"nodes\"",
            ),
            (
                PodError::NoInstanceTypeFits {
                    nodepool: "gpu".into(),
                    details: "needs memory 64Gi".into(),
                },
                "no instance type of NodePool \"gpu\" fits the pod: needs memory 64Gi",
            ),
            (
                PodError::NoNodePoolMatches {
                    details: "x".into(),
                },
                "no NodePool matches the pod: x",
            ),
        ];
        for (err, want) in cases {
            assert_eq!(err.to_string(), want);
        }
    }
}
