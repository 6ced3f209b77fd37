//! The behaviour, as actors (docs/architecture.md). Watches feed `state/` and route changes to the
//! actor that waits; actors own in-flight state and side effects; decisions are pure functions
//! (`scaler::plan`, `capi::offerings::build`).
//!
//! ```text
//! Claim feed   --ClaimsChanged--> Supervisor --Start/ClaimChanged--> NodeClaimActor (one per claim)
//! NodeClaimActor --RequestMachine/CancelRequest/ReleaseMachine--> Scaler(md) (its offering from
//!                the Catalog's published CatalogView, read directly)
//! Scaler       --MachineBound/RequestRejected--> NodeClaimActor
//! Machine feed --Poke--> Scaler(md), --Kick--> NodeClaimActor (Machine changed or gone)
//! Node feed    --Kick--> NodeClaimActor (Node changed)
//! Pod feed     --PodsChanged--> Provisioner
//! (every feed starts in `watches`, one line per kind)
//! ```

pub(crate) mod backoff;
pub mod batch;
pub(crate) mod bindings;
pub mod buffers;
pub mod catalog;
pub(crate) mod claim_factory;
pub mod controller;
pub(crate) mod deletion_cost;
pub(crate) mod disruption;
pub(crate) mod events;
pub mod gate;
pub(crate) mod generator;
pub(crate) mod messages;
pub(crate) mod nodeclaim;
pub(crate) mod nodepools;
pub(crate) mod nomination;
pub(crate) mod pass;
pub mod patch;
pub(crate) mod persist;
pub mod provisioner;
pub(crate) mod quotas;
pub(crate) mod registry;
pub(crate) mod repair;
pub(crate) mod router;
pub mod scaler;
pub(crate) mod static_capacity;
pub(crate) mod supervisor;
pub(crate) mod terminator;
pub mod tracked;
mod watches;

use std::sync::Arc;
use std::time::Duration;

use crate::capi::version::CapiVersion;
use crate::metrics::Metrics;
use crate::state::State;

pub use crate::view::settings::{Deadlines, DisruptionSettings, Settings};

/// What every actor shares: the clients, the indexes, metrics, settings and the router.
/// Clients must be created on the System thread that runs the actors (a kube Client is bound to
/// the runtime it was built on).
pub struct Shared {
    pub(crate) workload: kube::Client,
    pub(crate) management: kube::Client,
    /// Karpenter's objects' cluster (`--karpenter-objects`): the workload cluster's client, or
    /// the management cluster's; only [`Shared::client_for`] picks it.
    karpenter: kube::Client,
    pub(crate) capi_version: CapiVersion,
    pub state: State,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) settings: Settings,
    pub router: router::Router,
    pub(crate) events: events::Events,
    pub catalog: crate::view::CatalogView,
    /// Signalled whenever a watch finishes a (re-)list, so start-up can wait for warm caches
    /// without polling.
    pub(crate) synced: Arc<tokio::sync::Notify>,
    /// Orders the controller's own claim deletions against a disruption command's budget
    /// check and mark (see `gate`).
    pub(crate) deletion_gate: gate::DeletionGate,
}

impl Shared {
    /// The client of the cluster that holds objects of kind `K`: Karpenter's kinds where
    /// `--karpenter-objects` says (`view::binding`), every other kind the workload cluster's.
    /// Cluster API's kinds are read as dynamic objects, through `management` directly.
    pub(crate) fn client_for<K: kube::Resource<DynamicType = ()>>(&self) -> kube::Client {
        if crate::view::binding::is_karpenter_group(&K::group(&())) {
            self.karpenter.clone()
        } else {
            self.workload.clone()
        }
    }

    /// Every `K` of the cluster that holds them (cluster-scoped kinds).
    pub(crate) fn api<K>(&self) -> kube::Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>,
    {
        kube::Api::all(self.client_for::<K>())
    }

    /// The label selector a list or watch of `K` needs: this Cluster's binding for Karpenter's
    /// kinds in the management cluster, none otherwise.
    pub(crate) fn selector_for<K: kube::Resource<DynamicType = ()>>(&self) -> Option<String> {
        let binding = self.settings.karpenter_objects.as_ref()?;
        crate::view::binding::is_karpenter_group(&K::group(&())).then(|| binding.selector())
    }

    /// The plain view the read layer's projections take.
    pub(crate) fn view(&self) -> crate::view::Inputs<'_> {
        crate::view::Inputs {
            state: &self.state,
            catalog: &self.catalog,
            settings: &self.settings,
        }
    }
}

/// Errors of the actors' API calls, with the object they were about.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("{verb} {kind} {name}: {source}")]
    Api {
        verb: &'static str,
        kind: &'static str,
        name: String,
        source: kube::Error,
    },
    #[error("building a patch for {kind} {name}: {source}")]
    Patch {
        kind: &'static str,
        name: String,
        source: serde_json::Error,
    },
    #[error("{what}: no answer within {after:?}")]
    Timeout { what: String, after: Duration },
    #[error("{what} is gone")]
    Gone { what: String },
    #[error("reading {kind} {name}: {source}")]
    Model {
        kind: &'static str,
        name: String,
        source: crate::capi::model::ModelError,
    },
}

impl Error {
    /// A lost compare-and-swap: the object changed under us (409), or a JSON patch `test` failed
    /// (422 on kube-apiserver). Either way: re-read and re-plan, never overwrite.
    pub(crate) fn is_conflict(&self) -> bool {
        matches!(self, Error::Api { source: kube::Error::Api(s), .. } if s.code == 409 || s.code == 422)
    }

    /// A lost compare-and-swap on a Node: our copy of it is behind the server's.
    pub(crate) fn is_node_conflict(&self) -> bool {
        self.is_conflict() && matches!(self, Error::Api { kind: "nodes", .. })
    }

    pub(crate) fn is_not_found(&self) -> bool {
        matches!(self, Error::Api { source: kube::Error::Api(s), .. } if s.code == 404)
    }

    /// The wait the server asked for when it refused the call (`Retry-After`).
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Api { source, .. } => crate::retry_after::retry_after(source),
            _ => None,
        }
    }
}

/// Run `fut`, counting an API error by verb and resource on failure.
pub(crate) fn api_err<'a>(
    metrics: &'a Metrics,
    verb: &'static str,
    kind: &'static str,
    name: &str,
) -> impl FnOnce(kube::Error) -> Error + 'a {
    let name = name.to_string();
    move |source| {
        let code = match &source {
            kube::Error::Api(s) => s.code,
            _ => 0,
        };
        if code != 409 && code != 404 {
            metrics.api_error(verb, kind);
        }
        Error::Api {
            verb,
            kind,
            name,
            source,
        }
    }
}
