//! The controller's settings, as plain values every layer reads (the actors, the read layer and
//! the tools alike), so a projection never needs an actor to learn them.

use std::time::Duration;

use crate::api::repair_policy::RepairPolicies;

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
    /// `--karpenter-objects management`: Karpenter's objects are in the management cluster,
    /// bound to this Cluster (None: in the workload cluster).
    pub karpenter_objects: Option<super::binding::Binding>,
    /// Provisioning batch windows.
    pub batching: Batching,
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
    /// CapacityBuffers are kept as placeholder pods (`--feature-gates CapacityBuffer=true`; off
    /// by default, as upstream).
    pub capacity_buffers: bool,
    /// CapacityQuotas cap provisioning and get their status written
    /// (`--feature-gates CapacityQuota=true`; off by default).
    pub capacity_quotas: bool,
    /// Node repair (`--feature-gates NodeRepair=true`): which Node conditions, held how long,
    /// call for a replacement (`--repair-policies`; by default `Ready` False or Unknown for
    /// 30 minutes). None: off (upstream's default).
    pub node_repair: Option<RepairPolicies>,
    /// Node repair as Karpenter v1.14 did it (`--legacy-node-repair`): the claim deleted at
    /// once, outside the budgets, with no replacement first. Otherwise repair is a disruption
    /// method (v1.15). Only one of the two runs.
    pub legacy_node_repair: bool,
    /// Static NodePools are held at `spec.replicas` (`--feature-gates StaticCapacity=false`
    /// turns it off).
    pub static_capacity: bool,
    /// NodeOverlays are applied (`--feature-gates NodeOverlay=false` ignores them, as upstream
    /// does with its gate off: no price or capacity changes, no overlay status written).
    pub node_overlay: bool,
    /// Pod deletion cost management (`--feature-gates PodDeletionCostManagement=true`): how
    /// often the nodes are ranked and the pods' deletion costs written. None: off (upstream's
    /// default).
    pub pod_deletion_cost: Option<Duration>,
    /// Shadow mode (`run --dry-run`): no write reaches the server, so the decision log lines
    /// say what would have been done ([`Settings::say`]).
    pub dry_run: bool,
}

impl Settings {
    /// The policies of node repair run as a budgeted disruption (v1.15), when it is on.
    pub(crate) fn voluntary_repair(&self) -> Option<&RepairPolicies> {
        self.node_repair
            .as_ref()
            .filter(|_| !self.legacy_node_repair)
    }

    /// The policies of node repair run as v1.14 did (`--legacy-node-repair`), when it is on.
    pub(crate) fn legacy_repair(&self) -> Option<&RepairPolicies> {
        self.node_repair
            .as_ref()
            .filter(|_| self.legacy_node_repair)
    }

    /// A decision's log message: `done` when the controller writes, `would` in a dry run,
    /// where the same decision is made and the write never sent.
    pub(crate) fn say(&self, done: &'static str, would: &'static str) -> &'static str {
        if self.dry_run { would } else { done }
    }
}

/// Upstream's pod deletion cost period: one ranking a minute at most.
pub(crate) const DELETION_COST_PERIOD: Duration = Duration::from_secs(60);

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
    /// No voluntary disruption decision at all (`--disruption-paused`): drift, emptiness and
    /// consolidation wait (and node repair, unless in its legacy mode); expiry and commands
    /// already under way go on.
    pub paused: bool,
    /// A NodePool whose drift replacements fail to launch is left out of drift for this long
    /// after its first failure, doubling with each failed window up to `drift_backoff_cap`
    /// (upstream's RFC: 1 minute to 10 minutes; tests shorten them).
    pub drift_backoff: Duration,
    pub drift_backoff_cap: Duration,
    /// `--feature-gates TerminateFirstDrift=true`: a static NodePool with no room under its
    /// `limits.nodes` for a replacement has its drifted nodes taken first, one at a time, and
    /// refilled by its own count (upstream's terminate-first drift, alpha).
    pub terminate_first_drift: bool,
    /// `--feature-gates TerminateFirstRepair=true`: the same for a node due for repair in such
    /// a pool (upstream's terminate-first repair, alpha).
    pub terminate_first_repair: bool,
}

impl Default for DisruptionSettings {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(10),
            debounce: Duration::from_secs(1),
            validation: Duration::from_secs(15),
            replacement_timeout: Duration::from_secs(20 * 60),
            paused: false,
            drift_backoff: Duration::from_secs(60),
            drift_backoff_cap: Duration::from_secs(600),
            terminate_first_drift: false,
            terminate_first_repair: false,
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
            karpenter_objects: None,
            batching: Batching::default(),
            preference: crate::scheduling::PreferencePolicy::Respect,
            min_values_policy: crate::scheduling::MinValuesPolicy::Strict,
            default_termination_grace_period: None,
            default_constraints: None,
            capacity_buffers: false,
            capacity_quotas: false,
            deadlines: Deadlines::default(),
            min_drain_time: Duration::from_secs(5),
            disruption: DisruptionSettings::default(),
            node_repair: None,
            legacy_node_repair: false,
            static_capacity: true,
            node_overlay: true,
            pod_deletion_cost: None,
            dry_run: false,
        }
    }
}

/// Batching windows (Karpenter's `BATCH_IDLE_DURATION` and `BATCH_MAX_DURATION`).
#[derive(Clone, Copy, Debug)]
pub struct Batching {
    pub idle: Duration,
    pub max: Duration,
}

impl Default for Batching {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(1),
            max: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only one of node repair's two modes runs: the Disruption actor's (v1.15) or the legacy
    /// actor (v1.14), and neither while the gate is off.
    #[test]
    fn only_one_repair_mode_runs() {
        let modes = |on: bool, legacy_node_repair| {
            let s = Settings {
                node_repair: on.then(|| RepairPolicies::ready(Duration::from_secs(60))),
                legacy_node_repair,
                ..Settings::default()
            };
            (s.voluntary_repair().is_some(), s.legacy_repair().is_some())
        };
        assert_eq!(modes(true, false), (true, false));
        assert_eq!(modes(true, true), (false, true));
        assert_eq!(modes(false, true), (false, false));
        assert_eq!(modes(false, false), (false, false));
    }
}
