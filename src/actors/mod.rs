//! The behaviour, as actors (DESIGN.md section 3). Watches feed `state/` and route changes to the
//! actor that waits; actors own in-flight state and side effects; decisions are pure functions
//! (`scaler::plan`, `catalog::offerings`).
//!
//! ```text
//! Supervisor   --Start/ClaimChanged--> NodeClaimActor (one per claim)
//! NodeClaimActor --Resolve--> Catalog, --RequestMachine/CancelRequest/ReleaseMachine--> Scaler(md)
//! Scaler       --MachineBound/RequestRejected--> NodeClaimActor
//! CapiWatcher  --Poke--> Scaler(md), --Kick--> NodeClaimActor (Machine changed or gone)
//! NodeWatcher  --Kick--> NodeClaimActor (Node changed)
//! ```

pub mod backoff;
pub mod batch;
pub mod capi_watcher;
pub mod catalog;
pub mod controller;
pub mod decode;
pub mod disruption;
pub mod events;
pub mod messages;
pub mod node_watcher;
pub mod nodeclaim;
pub mod nodepools;
pub mod nomination;
pub mod patch;
pub mod provisioner;
pub mod router;
pub mod scaler;
pub mod snapshot;
pub mod storage_watcher;
pub mod supervisor;
pub mod terminator;
pub mod tracked;
pub mod workload_watcher;

use std::sync::Arc;
use std::time::Duration;

use crate::capi::version::CapiVersion;
use crate::metrics::Metrics;
use crate::state::State;

pub use controller::{Controller, ControllerHandle};

/// Controller settings that actors read.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Claim created -> Machine has a provider ID (a NodeClass may override it).
    pub create_timeout: Duration,
    /// Provider ID set -> Node registered.
    pub registration_timeout: Duration,
    /// A claim that cannot launch (NodeClass missing, not ready or invalid) is deleted this long
    /// after its creation (Karpenter's launch timeout).
    pub launch_timeout: Duration,
    /// How long an offering that failed stays unavailable.
    pub unavailable_offering_ttl: Duration,
    /// Only Cluster API objects in this namespace (None: all).
    pub capi_namespace: Option<String>,
    /// Only MachineDeployments of this cluster (label cluster.x-k8s.io/cluster-name).
    pub cluster_name: Option<String>,
    /// Provisioning batch windows.
    pub batching: provisioner::Batching,
    /// Preferred affinities: tried as required first, or ignored.
    pub preference: crate::scheduling::PreferencePolicy,
    /// minValues the instance types cannot meet: no claim, or lowered ones.
    pub min_values_policy: crate::scheduling::MinValuesPolicy,
    /// terminationGracePeriod of claims whose NodePool sets none.
    pub default_termination_grace_period: Option<Duration>,
    /// Default topology spread constraints for pods without their own (`--scheduler-config`);
    /// the workload watch runs only when some are set.
    pub default_constraints: Option<crate::scheduling::default_spread::DefaultConstraints>,
    /// Deadlines of the actors' own work (tests shorten them).
    pub deadlines: Deadlines,
    /// A drained node counts as drained only this long after its drain began, so pods bound
    /// just before the taint landed are seen too (upstream's 5 s; simulations shorten it).
    pub min_drain_time: Duration,
    /// Disruption's timing (consolidation, drift, expiration).
    pub disruption: DisruptionSettings,
}

/// How often and how carefully disruption acts (Karpenter core's constants; tests shorten them).
#[derive(Clone, Copy, Debug)]
pub struct DisruptionSettings {
    /// A pass at least this often, even when nothing changed (upstream polls every 10 s).
    pub poll: Duration,
    /// Changes are gathered this long before a pass (debounce).
    pub debounce: Duration,
    /// A decision is carried out only if it still holds this long after it was made
    /// (upstream's validation period, 15 s).
    pub validation: Duration,
    /// Replacements that are not Initialized within this roll the command back.
    pub replacement_timeout: Duration,
}

impl Default for DisruptionSettings {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(10),
            debounce: Duration::from_secs(1),
            validation: Duration::from_secs(15),
            replacement_timeout: Duration::from_secs(20 * 60),
        }
    }
}

/// How long an actor waits for its own work before it gives up on it and retries with backoff:
/// a request that never answers must never freeze a claim or a MachineDeployment.
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    /// One NodeClaimActor reconcile (a few reads and at most MAX_STEPS writes).
    pub claim_step: Duration,
    /// One Scaler write (a replica compare-and-swap, a bind or a release mark).
    pub scaler_write: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            claim_step: Duration::from_secs(60),
            scaler_write: Duration::from_secs(30),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            create_timeout: Duration::from_secs(300),
            registration_timeout: Duration::from_secs(900),
            launch_timeout: Duration::from_secs(300),
            unavailable_offering_ttl: Duration::from_secs(180),
            capi_namespace: None,
            cluster_name: None,
            batching: provisioner::Batching::default(),
            preference: crate::scheduling::PreferencePolicy::Respect,
            min_values_policy: crate::scheduling::MinValuesPolicy::Strict,
            default_termination_grace_period: None,
            default_constraints: None,
            deadlines: Deadlines::default(),
            min_drain_time: Duration::from_secs(5),
            disruption: DisruptionSettings::default(),
        }
    }
}

/// What every actor shares: the two clients, the indexes, metrics, settings and the router.
/// Clients must be created on the System thread that runs the actors (a kube Client is bound to
/// the runtime it was built on).
pub struct Shared {
    pub workload: kube::Client,
    pub management: kube::Client,
    pub capi_version: CapiVersion,
    pub state: State,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub router: router::Router,
    pub events: events::Events,
    pub catalog: catalog::CatalogView,
    /// Signalled whenever a watch finishes a (re-)list, so start-up can wait for warm caches
    /// without polling.
    pub synced: Arc<tokio::sync::Notify>,
}

/// Errors of the actors' API calls, with the object they were about.
#[derive(Debug, thiserror::Error)]
pub enum Error {
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
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Api { source: kube::Error::Api(s), .. } if s.code == 409 || s.code == 422)
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Api { source: kube::Error::Api(s), .. } if s.code == 404)
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

/// Stop any of the long-lived actors.
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct StopActor;

macro_rules! stoppable {
    ($($t:ty),*) => {$(
        impl actix::Handler<StopActor> for $t {
            type Result = ();
            fn handle(&mut self, _: StopActor, ctx: &mut Self::Context) {
                use actix::ActorContext;
                ctx.stop();
            }
        }
    )*};
}
stoppable!(
    supervisor::Supervisor,
    capi_watcher::CapiWatcher,
    node_watcher::NodeWatcher,
    catalog::Catalog,
    nodepools::NodePools,
    provisioner::Provisioner,
    storage_watcher::StorageWatcher,
    workload_watcher::WorkloadWatcher,
    terminator::Terminator,
    disruption::Disruption
);
