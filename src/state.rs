//! Read-mostly indexes fed by watches, shared by the actors (the linkerd policy-controller
//! shape: watches write, everyone reads, nobody calls the API to answer a question the index
//! already knows). They mirror the API and make no decisions.

pub mod buffers;
pub mod claims;
pub mod compact;
pub mod daemonsets;
pub mod feed;
pub mod machines;
pub mod named;
pub mod nodes;
pub mod pdbs;
pub mod pods;
pub mod preflight;
pub mod referents;
pub mod registration_health;
pub mod reschedulable;
pub mod shared;
pub mod storage;
pub mod trim;
pub mod versions;
pub mod volumes;
pub(crate) mod workload_feed;
pub mod workloads;

use std::sync::Arc;

use parking_lot::RwLock;

pub use claims::Claims;
pub use daemonsets::DaemonSets;
pub use machines::{MachineDeployments, Machines};
pub use named::{BufferIndex, NodeClassIndex, NodeOverlayIndex, NodePoolIndex, QuotaIndex};
pub use nodes::Nodes;
pub use pdbs::PodDisruptionBudgets;
pub use pods::Pods;
pub use storage::Storage;
pub use volumes::VolumeAttachments;
pub use workloads::WorkloadIndex;

/// All indexes, cheap to clone.
#[derive(Clone, Default)]
pub struct State {
    pub machines: Arc<RwLock<Machines>>,
    pub deployments: Arc<RwLock<MachineDeployments>>,
    /// MachineSet preflight checks holding a MachineDeployment's scale-up.
    pub preflight: Arc<RwLock<preflight::PreflightHolds>>,
    pub claims: Arc<RwLock<Claims>>,
    pub nodes: Arc<RwLock<Nodes>>,
    pub pods: Arc<RwLock<Pods>>,
    pub daemonsets: Arc<RwLock<DaemonSets>>,
    pub volume_attachments: Arc<RwLock<VolumeAttachments>>,
    /// PersistentVolumeClaims, PersistentVolumes and StorageClasses: volume topology.
    pub storage: Arc<RwLock<Storage>>,
    /// Services and ReplicationControllers, ReplicaSets, StatefulSets by their selectors:
    /// default topology spread (only with `--scheduler-config`).
    pub workloads: Arc<RwLock<WorkloadIndex>>,
    /// NodePools: the ones that decode, and the ones that do not (kept apart).
    pub nodepools: Arc<RwLock<NodePoolIndex>>,
    /// ClusterAPINodeClasses, and the ones that do not decode: the catalog is built from them.
    pub nodeclasses: Arc<RwLock<NodeClassIndex>>,
    /// NodeOverlays (an empty list when their CRD is not installed).
    pub overlays: Arc<RwLock<NodeOverlayIndex>>,
    /// PodDisruptionBudgets: the provisioner plans only for the pods of a deleting node that
    /// can be evicted at all; disruption reads which pods they protect.
    pub pdbs: Arc<RwLock<PodDisruptionBudgets>>,
    /// Recent launch outcomes per NodePool, for its `NodeRegistrationHealthy` condition.
    pub registration_health: Arc<RwLock<registration_health::RegistrationHealth>>,
    /// Pending pods the provisioner planned onto a claim (or a Node without one), by pod key:
    /// the place and until when the plan holds. Disruption leaves those places alone while a
    /// pod planned there is still pending, as upstream's nominated nodes.
    pub nominated: Arc<RwLock<std::collections::HashMap<String, (String, std::time::Instant)>>>,
    /// CapacityBuffers' placeholder pods, and the nodes the last solve put them on.
    pub buffers: Arc<RwLock<buffers::BufferPods>>,
    /// CapacityQuotas by name, and the ones that do not decode (`--feature-gates
    /// CapacityQuota=true`; empty without).
    pub quotas: Arc<RwLock<QuotaIndex>>,
    /// CapacityBuffers by `namespace/name`, and the ones that do not decode (`--feature-gates
    /// CapacityBuffer=true`; empty without): the Buffers actor resolves them.
    pub capacity_buffers: Arc<RwLock<BufferIndex>>,
}
