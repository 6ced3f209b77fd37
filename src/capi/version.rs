//! Which `cluster.x-k8s.io` version to speak, found by discovery, and the `ApiResource`s for
//! the Cluster API kinds at that version.

use std::fmt;
use std::str::FromStr;

use kube::discovery::ApiResource;

use crate::api::wellknown::CAPI_GROUP;

/// The Cluster API versions this controller reads and writes. Both map to one internal model.
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

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown Cluster API version {0:?}: expected v1beta1 or v1beta2")]
    UnknownVersion(String),
    #[error("API group {CAPI_GROUP} is not served by the management cluster")]
    GroupNotServed,
    #[error(
        "API group {CAPI_GROUP} serves versions [{}], none of which is supported (v1beta2, v1beta1)",
        found.join(", ")
    )]
    NoSupportedVersion { found: Vec<String> },
    #[error("API group {group} is not served by the management cluster")]
    InfrastructureGroupNotServed { group: String },
    #[error("discovering API groups: {0}")]
    Discovery(#[source] kube::Error),
}

impl CapiVersion {
    /// Newest first: the order discovery prefers.
    pub fn machine(self) -> ApiResource {
        machine_resource(self)
    }

    pub fn machine_set(self) -> ApiResource {
        machine_set_resource(self)
    }

    pub fn machine_deployment(self) -> ApiResource {
        machine_deployment_resource(self)
    }

    pub fn machine_pool(self) -> ApiResource {
        machine_pool_resource(self)
    }

    pub fn cluster(self) -> ApiResource {
        capi_resource(self, "Cluster", "clusters")
    }

    pub const ALL: [CapiVersion; 2] = [CapiVersion::V1Beta2, CapiVersion::V1Beta1];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CapiVersion::V1Beta1 => "v1beta1",
            CapiVersion::V1Beta2 => "v1beta2",
        }
    }

    /// `cluster.x-k8s.io/<version>`.
    pub fn api_version(self) -> String {
        format!("{CAPI_GROUP}/{}", self.as_str())
    }
}

impl fmt::Display for CapiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CapiVersion {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "v1beta1" => Ok(CapiVersion::V1Beta1),
            "v1beta2" => Ok(CapiVersion::V1Beta2),
            other => Err(Error::UnknownVersion(other.to_string())),
        }
    }
}

/// The version to use: `forced` as given (the operator knows best, and it lets the controller run
/// where discovery is restricted), otherwise the newest supported version the management cluster
/// serves for `cluster.x-k8s.io`.
pub async fn discover(
    client: &kube::Client,
    forced: Option<CapiVersion>,
) -> Result<CapiVersion, Error> {
    if let Some(version) = forced {
        return Ok(version);
    }
    let served = served_versions(client, CAPI_GROUP)
        .await?
        .ok_or(Error::GroupNotServed)?;
    choose_version(&served)
}

/// The preference rule of [`discover`] on a list of served versions.
pub(crate) fn choose_version(served: &[String]) -> Result<CapiVersion, Error> {
    CapiVersion::ALL
        .into_iter()
        .find(|v| served.iter().any(|s| s == v.as_str()))
        .ok_or_else(|| Error::NoSupportedVersion {
            found: served.to_vec(),
        })
}

/// The preferred version of an infrastructure provider's group. v1beta2 infrastructure
/// references name only the group, so the version to read a template at comes from discovery.
pub async fn infrastructure_version(client: &kube::Client, group: &str) -> Result<String, Error> {
    let groups = client.list_api_groups().await.map_err(Error::Discovery)?;
    let found = groups.groups.into_iter().find(|g| g.name == group);
    let Some(found) = found else {
        return Err(Error::InfrastructureGroupNotServed {
            group: group.to_string(),
        });
    };
    found
        .preferred_version
        .map(|v| v.version)
        .or_else(|| found.versions.first().map(|v| v.version.clone()))
        .ok_or_else(|| Error::InfrastructureGroupNotServed {
            group: group.to_string(),
        })
}

/// Whether the management cluster serves objects of `kind` at `version` (Cluster API's
/// MachinePool feature may be off, or its CRD not installed), as the autoscaler asks before
/// watching MachinePools.
pub(crate) async fn serves_scalable(
    client: &kube::Client,
    version: CapiVersion,
    kind: crate::capi::ScalableKind,
) -> Result<bool, Error> {
    serves(client, version, kind.plural()).await
}

/// Whether the management cluster serves Clusters at `version` (Cluster API always does; a
/// cluster with only the scalable kinds' CRDs does not).
pub(crate) async fn serves_clusters(
    client: &kube::Client,
    version: CapiVersion,
) -> Result<bool, Error> {
    serves(client, version, "clusters").await
}

async fn serves(client: &kube::Client, version: CapiVersion, plural: &str) -> Result<bool, Error> {
    match client
        .list_api_group_resources(&version.api_version())
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == plural)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(Error::Discovery(e)),
    }
}

/// Versions served for `group`, `None` when the group is absent.
async fn served_versions(client: &kube::Client, group: &str) -> Result<Option<Vec<String>>, Error> {
    let groups = client.list_api_groups().await.map_err(Error::Discovery)?;
    Ok(groups
        .groups
        .into_iter()
        .find(|g| g.name == group)
        .map(|g| g.versions.into_iter().map(|v| v.version).collect()))
}

fn capi_resource(version: CapiVersion, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: CAPI_GROUP.to_string(),
        version: version.as_str().to_string(),
        api_version: version.api_version(),
        kind: kind.to_string(),
        plural: plural.to_string(),
    }
}

pub fn machine_resource(version: CapiVersion) -> ApiResource {
    capi_resource(version, "Machine", "machines")
}

pub(crate) fn machine_set_resource(version: CapiVersion) -> ApiResource {
    capi_resource(version, "MachineSet", "machinesets")
}

pub fn machine_deployment_resource(version: CapiVersion) -> ApiResource {
    capi_resource(version, "MachineDeployment", "machinedeployments")
}

pub(crate) fn machine_pool_resource(version: CapiVersion) -> ApiResource {
    capi_resource(version, "MachinePool", "machinepools")
}

/// An infrastructure machine template kind (e.g. `DockerMachineTemplate`); the plural is the
/// lowercased kind plus "s", which is how every Cluster API provider names template resources.
pub(crate) fn infrastructure_template_resource(
    group: &str,
    version: &str,
    kind: &str,
) -> ApiResource {
    let api_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version,
        kind: kind.to_string(),
        plural: format!("{}s", kind.to_lowercase()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for v in CapiVersion::ALL {
            assert_eq!(v.to_string().parse::<CapiVersion>().unwrap(), v);
        }
        assert!(matches!(
            "v1alpha4".parse::<CapiVersion>(),
            Err(Error::UnknownVersion(s)) if s == "v1alpha4"
        ));
        assert_eq!(
            CapiVersion::V1Beta2.api_version(),
            "cluster.x-k8s.io/v1beta2"
        );
    }

    #[test]
    fn prefers_v1beta2() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            choose_version(&s(&["v1beta1", "v1beta2"])).unwrap(),
            CapiVersion::V1Beta2
        );
        assert_eq!(
            choose_version(&s(&["v1alpha4", "v1beta1"])).unwrap(),
            CapiVersion::V1Beta1
        );
        let err = choose_version(&s(&["v1alpha3", "v1alpha4"])).unwrap_err();
        assert!(err.to_string().contains("v1alpha3, v1alpha4"), "{err}");
    }

    #[test]
    fn resources() {
        let md = machine_deployment_resource(CapiVersion::V1Beta1);
        assert_eq!(md.api_version, "cluster.x-k8s.io/v1beta1");
        assert_eq!(md.plural, "machinedeployments");
        assert_eq!(machine_resource(CapiVersion::V1Beta2).kind, "Machine");
        assert_eq!(
            machine_set_resource(CapiVersion::V1Beta2).plural,
            "machinesets"
        );
        let t = infrastructure_template_resource(
            "infrastructure.cluster.x-k8s.io",
            "v1beta2",
            "DevMachineTemplate",
        );
        assert_eq!(t.plural, "devmachinetemplates");
        assert_eq!(t.api_version, "infrastructure.cluster.x-k8s.io/v1beta2");
    }
}
