//! The project's own CRDs (NodePool, NodeClaim, ClusterAPINodeClass, NodeOverlay,
//! CapacityBuffer, CapacityQuota), which the simulated API server serves and the real control
//! plane installs: read from the generated files a user installs (deploy/crds), not from the
//! controller's types, so the stand-ins serve exactly what is shipped. The controller's crate
//! tests that those files are current.

use std::sync::OnceLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// Each file and its text, in the order the controller's crate lists the kinds.
const FILES: [(&str, &str); 6] = [
    (
        "karpenter.sh_nodepools.yaml",
        include_str!("../../../deploy/crds/karpenter.sh_nodepools.yaml"),
    ),
    (
        "karpenter.sh_nodeclaims.yaml",
        include_str!("../../../deploy/crds/karpenter.sh_nodeclaims.yaml"),
    ),
    (
        "karpenter.cluster.x-k8s.io_clusterapinodeclasses.yaml",
        include_str!("../../../deploy/crds/karpenter.cluster.x-k8s.io_clusterapinodeclasses.yaml"),
    ),
    (
        "karpenter.sh_nodeoverlays.yaml",
        include_str!("../../../deploy/crds/karpenter.sh_nodeoverlays.yaml"),
    ),
    (
        "autoscaling.x-k8s.io_capacitybuffers.yaml",
        include_str!("../../../deploy/crds/autoscaling.x-k8s.io_capacitybuffers.yaml"),
    ),
    (
        "autoscaling.x-k8s.io_capacityquotas.yaml",
        include_str!("../../../deploy/crds/autoscaling.x-k8s.io_capacityquotas.yaml"),
    ),
];

/// The project's CRDs, parsed once per process; the error names the file that does not parse.
pub fn all() -> Result<Vec<CustomResourceDefinition>, String> {
    static CRDS: OnceLock<Result<Vec<CustomResourceDefinition>, String>> = OnceLock::new();
    CRDS.get_or_init(|| {
        FILES
            .iter()
            .map(|(file, text)| {
                serde_saphyr::from_str(text).map_err(|e| format!("deploy/crds/{file}: {e}"))
            })
            .collect()
    })
    .clone()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_file_is_a_crd() {
        let crds = super::all().expect("deploy/crds parses");
        let names: Vec<_> = crds.iter().map(|c| c.spec.names.kind.as_str()).collect();
        assert_eq!(
            names,
            [
                "NodePool",
                "NodeClaim",
                "ClusterAPINodeClass",
                "NodeOverlay",
                "CapacityBuffer",
                "CapacityQuota"
            ]
        );
    }
}
