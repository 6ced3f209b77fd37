//! The Cluster API model: one internal Machine / MachineSet / MachineDeployment (or MachinePool,
//! the second scalable kind) model read from
//! v1beta1 or v1beta2, scale-from-zero annotations, infrastructure template capacity, provider
//! IDs, version discovery and the patches the controller writes.

pub mod annotations;
pub mod autoscaler;
pub(crate) mod deletion;
pub mod generate;
mod json;
pub mod kind;
pub mod model;
pub mod offerings;
pub mod overlay;
pub mod patch;
pub(crate) mod preflight;
pub mod provider_id;
pub(crate) mod room;
pub(crate) mod scalable;
mod selector;
pub mod template;
pub mod topology;
pub mod version;

pub use annotations::{AnnotationError, AnnotationErrors, ScaleFromZero, Taint, TaintEffect};
pub use model::{
    DeletionOrder, InfrastructureRef, LabelSelector, Machine, MachineDeployment, MachinePhase,
    MachineSet, ModelError,
};
pub(crate) use scalable::ScalableKind;
pub use version::CapiVersion;
