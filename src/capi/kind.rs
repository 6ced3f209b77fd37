//! The two scalable kinds, MachineDeployment and MachinePool (`capi::scalable` reads and names
//! them).

use std::fmt;

use kube::discovery::ApiResource;

use crate::api::wellknown::MACHINE_POOL_KIND;
use crate::capi::version::{CapiVersion, machine_deployment_resource, machine_pool_resource};

/// Which kind of scalable resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum ScalableKind {
    #[default]
    MachineDeployment,
    MachinePool,
}

impl ScalableKind {
    /// Every kind, in the order they are listed and watched.
    pub(crate) const ALL: [ScalableKind; 2] =
        [ScalableKind::MachineDeployment, ScalableKind::MachinePool];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ScalableKind::MachineDeployment => "MachineDeployment",
            ScalableKind::MachinePool => MACHINE_POOL_KIND,
        }
    }

    /// The kind's objects, as watches and messages name them ("MachineDeployments").
    pub(crate) fn watch_name(self) -> &'static str {
        match self {
            ScalableKind::MachineDeployment => "MachineDeployments",
            ScalableKind::MachinePool => "MachinePools",
        }
    }

    /// Whether a management cluster may not serve the kind (MachinePools are behind a Cluster
    /// API feature gate): then it is watched only once discovery says it is served, and a
    /// listing that finds it missing finds none.
    pub(crate) fn optional(self) -> bool {
        match self {
            ScalableKind::MachineDeployment => false,
            ScalableKind::MachinePool => true,
        }
    }

    /// The resource's plural, as API paths and metrics name it.
    pub(crate) fn plural(self) -> &'static str {
        match self {
            ScalableKind::MachineDeployment => "machinedeployments",
            ScalableKind::MachinePool => "machinepools",
        }
    }

    /// The list under a Cluster's `spec.topology.workers` holding this kind's entries.
    pub(crate) fn topology_workers(self) -> &'static str {
        match self {
            ScalableKind::MachineDeployment => "machineDeployments",
            ScalableKind::MachinePool => "machinePools",
        }
    }

    /// The resource to read and write objects of this kind at `version`.
    pub fn resource(self, version: CapiVersion) -> ApiResource {
        match self {
            ScalableKind::MachineDeployment => machine_deployment_resource(version),
            ScalableKind::MachinePool => machine_pool_resource(version),
        }
    }
}

impl fmt::Display for ScalableKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
