//! The Cluster API versions the stand-ins serve and speak, and the resources of Cluster API's
//! kinds at each: the stand-in's own statement of upstream's API, not the controller's. A
//! module of its own (re-exported as `capi::CapiVersion`), as every stand-in speaks it.

use std::fmt;

use kube::discovery::ApiResource;

/// Cluster API's API group.
const CAPI_GROUP: &str = "cluster.x-k8s.io";

/// A version of `cluster.x-k8s.io` the stand-ins serve.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum CapiVersion {
    V1Beta1,
    #[default]
    V1Beta2,
}

impl CapiVersion {
    /// Newest first.
    pub const ALL: [CapiVersion; 2] = [CapiVersion::V1Beta2, CapiVersion::V1Beta1];

    pub fn machine(self) -> ApiResource {
        self.resource("Machine", "machines")
    }

    pub fn machine_set(self) -> ApiResource {
        self.resource("MachineSet", "machinesets")
    }

    pub fn machine_deployment(self) -> ApiResource {
        self.resource("MachineDeployment", "machinedeployments")
    }

    pub fn machine_pool(self) -> ApiResource {
        self.resource("MachinePool", "machinepools")
    }

    pub fn cluster(self) -> ApiResource {
        self.resource("Cluster", "clusters")
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CapiVersion::V1Beta1 => "v1beta1",
            CapiVersion::V1Beta2 => "v1beta2",
        }
    }

    /// `cluster.x-k8s.io/<version>`.
    pub fn api_version(self) -> String {
        format!("{CAPI_GROUP}/{}", self.as_str())
    }

    fn resource(self, kind: &str, plural: &str) -> ApiResource {
        ApiResource {
            group: CAPI_GROUP.to_string(),
            version: self.as_str().to_string(),
            api_version: self.api_version(),
            kind: kind.to_string(),
            plural: plural.to_string(),
        }
    }
}

impl fmt::Display for CapiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kinds of Cluster API node group the stand-ins scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScalableKind {
    MachineDeployment,
    MachinePool,
}

impl ScalableKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ScalableKind::MachineDeployment => "MachineDeployment",
            ScalableKind::MachinePool => "MachinePool",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_kinds_at_each_version() {
        assert_eq!(
            CapiVersion::V1Beta1.api_version(),
            "cluster.x-k8s.io/v1beta1"
        );
        let md = CapiVersion::V1Beta2.machine_deployment();
        assert_eq!(md.api_version, "cluster.x-k8s.io/v1beta2");
        assert_eq!(
            (md.kind.as_str(), md.plural.as_str()),
            ("MachineDeployment", "machinedeployments")
        );
        assert_eq!(CapiVersion::V1Beta2.to_string(), "v1beta2");
    }
}
