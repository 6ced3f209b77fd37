//! Read-mostly indexes fed by watches, shared by the actors (the linkerd policy-controller
//! shape: watches write, everyone reads, nobody calls the API to answer a question the index
//! already knows). They mirror the API and make no decisions.

pub(crate) mod buffers;
pub(crate) mod claims;
pub(crate) mod compact;
pub(crate) mod daemonsets;
pub mod feed;
pub(crate) mod machines;
pub(crate) mod named;
pub(crate) mod nodes;
pub(crate) mod pdbs;
pub(crate) mod pods;
pub(crate) mod preflight;
pub(crate) mod referents;
pub(crate) mod registration_health;
pub mod reschedulable;
pub(crate) mod shared;
pub(crate) mod storage;
pub(crate) mod trim;
pub(crate) mod versions;
pub(crate) mod volumes;
pub(crate) mod watch;
pub(crate) mod watched;
pub(crate) mod workload_feed;
pub(crate) mod workloads;

use std::sync::Arc;

use parking_lot::RwLock;

pub(crate) use claims::Claims;
pub(crate) use daemonsets::DaemonSets;
pub(crate) use machines::{MachineDeployments, Machines};
pub(crate) use named::{BufferIndex, NodeClassIndex, NodeOverlayIndex, NodePoolIndex, QuotaIndex};
pub(crate) use nodes::Nodes;
pub(crate) use pdbs::PodDisruptionBudgets;
pub(crate) use pods::Pods;
pub(crate) use storage::Storage;
pub(crate) use volumes::VolumeAttachments;
pub(crate) use workloads::WorkloadIndex;

/// All indexes, cheap to clone.
#[derive(Clone, Default)]
pub struct State {
    pub(crate) machines: Arc<RwLock<Machines>>,
    pub deployments: Arc<RwLock<MachineDeployments>>,
    /// MachineSet preflight checks holding a MachineDeployment's scale-up.
    pub(crate) preflight: Arc<RwLock<preflight::PreflightHolds>>,
    pub claims: Arc<RwLock<Claims>>,
    pub nodes: Arc<RwLock<Nodes>>,
    pub(crate) pods: Arc<RwLock<Pods>>,
    pub(crate) daemonsets: Arc<RwLock<DaemonSets>>,
    pub(crate) volume_attachments: Arc<RwLock<VolumeAttachments>>,
    /// PersistentVolumeClaims, PersistentVolumes and StorageClasses: volume topology.
    pub(crate) storage: Arc<RwLock<Storage>>,
    /// Services and ReplicationControllers, ReplicaSets, StatefulSets by their selectors:
    /// default topology spread (only with `--scheduler-config`).
    pub workloads: Arc<RwLock<WorkloadIndex>>,
    /// NodePools: the ones that decode, and the ones that do not (kept apart).
    pub nodepools: Arc<RwLock<NodePoolIndex>>,
    /// ClusterAPINodeClasses, and the ones that do not decode: the catalog is built from them.
    pub(crate) nodeclasses: Arc<RwLock<NodeClassIndex>>,
    /// NodeOverlays (an empty list when their CRD is not installed).
    pub(crate) overlays: Arc<RwLock<NodeOverlayIndex>>,
    /// PodDisruptionBudgets: the provisioner plans only for the pods of a deleting node that
    /// can be evicted at all; disruption reads which pods they protect.
    pub(crate) pdbs: Arc<RwLock<PodDisruptionBudgets>>,
    /// Recent launch outcomes per NodePool, for its `NodeRegistrationHealthy` condition.
    pub(crate) registration_health: Arc<RwLock<registration_health::RegistrationHealth>>,
    /// Pending pods the provisioner planned onto a claim (or a Node without one), by pod key:
    /// the place and until when the plan holds. Disruption leaves those places alone while a
    /// pod planned there is still pending, as upstream's nominated nodes.
    pub(crate) nominated:
        Arc<RwLock<std::collections::HashMap<String, (String, std::time::Instant)>>>,
    /// CapacityBuffers' placeholder pods, and the nodes the last solve put them on.
    pub(crate) buffers: Arc<RwLock<buffers::BufferPods>>,
    /// CapacityQuotas by name, and the ones that do not decode (`--feature-gates
    /// CapacityQuota=true`; empty without).
    pub(crate) quotas: Arc<RwLock<QuotaIndex>>,
    /// CapacityBuffers by `namespace/name`, and the ones that do not decode (`--feature-gates
    /// CapacityBuffer=true`; empty without): the Buffers actor resolves them.
    pub(crate) capacity_buffers: Arc<RwLock<BufferIndex>>,
}
