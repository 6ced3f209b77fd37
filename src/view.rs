//! The read layer: projections of the indexes (`state`) and the published catalog that the
//! actors and the tools (`explain`, `init`) share. Each takes a plain [`Inputs`] (the indexes,
//! the catalog view and the settings) and never an actor's context, so a one-off reading of the
//! cluster answers with the same code the controller runs.
//!
//! - [`snapshot`]: the solver's view of the cluster (provisioner, disruption, `explain pod`).
//! - [`catalog`]: each NodeClass's offerings and the launch's ranking of them.
//! - [`usage`]: what each NodePool counts against its limits.
//! - [`quotas`]: the CapacityQuotas to enforce and what their nodes use.
//! - [`disruption`] and [`protection`]: the disruption candidates and what protects a node.
//! - [`deletion_cost`]: the nodes a ReplicaSet scale-in should empty first, and the pod
//!   deletion costs that say so.
//! - [`node`]: how a Node stands against its claim (ready, registered, initialized).
//! - [`rollout`]: how far each NodePool's and NodeClass's nodes are rolled out (`NodesUpToDate`).
//! - [`repair`]: which unhealthy Nodes node repair replaces, and which it holds back.
//! - [`static_capacity`]: what each static NodePool holds and needs.
//! - [`settings`]: the controller's settings as plain values.

pub mod binding;
pub mod catalog;
pub(crate) mod deletion_cost;
pub(crate) mod disruption;
pub(crate) mod node;
pub(crate) mod pool_counts;
pub(crate) mod protection;
pub(crate) mod quotas;
pub mod repair;
pub(crate) mod rollout;
pub(crate) mod settings;
pub(crate) mod snapshot;
pub mod static_capacity;
pub(crate) mod usage;

use crate::state::State;

pub use catalog::CatalogView;
pub use settings::Settings;

/// What a projection reads: the indexes, the catalog as last published, and the settings.
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    pub state: &'a State,
    pub catalog: &'a CatalogView,
    pub settings: &'a Settings,
}
