//! The controller's access on the real backend: the repository's Helm chart rendered with its
//! default values (the joined topology: every permission in ClusterRoles), its RBAC applied with
//! kubectl, and a token for its ServiceAccount. The controller under test gets that token and
//! nothing else, so a permission the chart lacks is refused as it would be in a cluster.

use std::path::PathBuf;

use super::Error;
use crate::controlplane::ControlPlane;
use crate::controlplane::rbac::{self, ServiceAccountAccess};

/// The variable naming the directory that holds kubectl and helm, and its default beside the
/// checkout (where `.ci/install-tools` puts them).
pub const TOOLS_VARIABLE: &str = "KARPENTER_CAPI_TOOLS";

/// The release and its namespace, as the chart's docs install it.
const RELEASE: &str = "karpenter-capi";
const NAMESPACE: &str = "karpenter-capi";

/// helm, kubectl and the chart, found before anything starts.
pub struct Chart {
    helm: PathBuf,
    kubectl: PathBuf,
    chart: PathBuf,
}

impl Chart {
    /// The tools from [`TOOLS_VARIABLE`] (default `target/tools/bin` of the checkout) and the
    /// checkout's chart; an error names what is missing and where it was looked for.
    pub fn locate() -> Result<Self, Error> {
        let repo = crate::repo_root();
        let tools = std::env::var_os(TOOLS_VARIABLE)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| repo.join("target/tools/bin"));
        let chart = Chart {
            helm: tools.join("helm"),
            kubectl: tools.join("kubectl"),
            chart: repo.join("deploy/helm/karpenter-capi"),
        };
        for tool in [&chart.helm, &chart.kubectl] {
            if !tool.is_file() {
                return Err(Error::Tool(tool.clone()));
            }
        }
        if !chart.chart.join("Chart.yaml").is_file() {
            return Err(Error::Chart(chart.chart.clone()));
        }
        Ok(chart)
    }

    /// Applies the chart's RBAC to `plane` and hands back its ServiceAccount's access.
    pub async fn install(&self, plane: &ControlPlane) -> Result<ServiceAccountAccess, Error> {
        let install = rbac::Install {
            helm: &self.helm,
            kubectl: &self.kubectl,
            chart: &self.chart,
            release: RELEASE,
            namespace: NAMESPACE,
            helm_args: &[],
        };
        Ok(rbac::install(plane, &install).await?)
    }
}
