//! Where the upstream CRDs live: a directory beside the checkout (`../shared/upstream`), or the
//! one `KARPENTER_CAPI_UPSTREAM` names. The repository carries none of them; the real backend
//! installs them and the simulated server checks Cluster API's kinds against their schemas.

use std::path::PathBuf;

/// The variable naming the directory of upstream CRDs and examples.
pub const UPSTREAM_VARIABLE: &str = "KARPENTER_CAPI_UPSTREAM";

/// Cluster API's core kinds the simulated cluster serves, as upstream's CRD files name them.
pub const CAPI_CRDS: [&str; 4] = [
    "cluster.x-k8s.io_machinedeployments.yaml",
    "cluster.x-k8s.io_machinesets.yaml",
    "cluster.x-k8s.io_machines.yaml",
    "cluster.x-k8s.io_machinepools.yaml",
];

/// The upstream CRD directory: `$KARPENTER_CAPI_UPSTREAM/crds`, by default
/// `../shared/upstream/crds` beside the checkout.
pub fn crds_dir() -> PathBuf {
    std::env::var_os(UPSTREAM_VARIABLE)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("../shared/upstream"))
        .join("crds")
}
