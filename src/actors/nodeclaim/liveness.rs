//! Liveness (Karpenter core's lifecycle/liveness) and the ways a launch can fail: the create
//! timeout (no Machine or no provider ID in time), the registration timeout, a Machine that
//! Cluster API marks failed, and a Machine deleted by someone else. Each deletes the claim (its
//! termination releases whatever it holds) so the provisioner solves its pods again.

use std::time::Duration;

use jiff::Timestamp;

use kube::Resource;
use kube::api::{Api, DynamicObject};

use super::{Next, Step, left_until, object_ref};
use crate::actors::{Error, api_err};
use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::capi::model::Machine;
use crate::capi::version;
use crate::metrics::{DisruptedLabels, Metrics};
use crate::state::claims::provider_id;
use crate::state::machines::bound_claim;

/// How soon a claim looks again after finding the Machine index behind the API server.
const INDEX_BEHIND_RECHECK: Duration = Duration::from_secs(1);

impl Step {
    pub(super) fn create_timeout_setting(&self) -> Duration {
        self.shared
            .catalog
            .create_timeout(&self.claim.spec.node_class_ref.name)
            .unwrap_or(self.shared.settings.create_timeout)
    }

    /// Time left before the create timeout, or None when it has passed.
    pub(super) fn create_deadline_left(&self) -> Option<Duration> {
        left_until(self.created(), self.create_timeout_setting())
    }

    /// Karpenter's liveness rule: `Registered` must turn True within the registration timeout
    /// of its last transition. Upstream writes it Unknown when it first writes the claim's
    /// status; we write it Unknown together with `Launched=True` (the create timeout bounds
    /// the launch, so slow providers are not cut short). A claim written by another Karpenter
    /// keeps the transition time it has.
    pub(super) fn registration_deadline_left(&self) -> Option<Duration> {
        left_until(
            registration_clock_start(&self.claim),
            self.shared.settings.registration_timeout,
        )
    }

    pub(super) async fn create_timeout(
        &mut self,
        md: &str,
        machine: Option<&Machine>,
    ) -> Result<Next, Error> {
        let c = self.claim.clone();
        let timeout = self.create_timeout_setting();
        self.shared
            .metrics
            .create_timeouts
            .get_or_create(&Metrics::pool(&self.nodepool(), md))
            .inc();
        self.shared
            .catalog
            .mark_unavailable(md, self.shared.settings.unavailable_offering_ttl);
        let what = match machine {
            Some(m) => format!("Machine {}/{} got no provider ID", m.namespace, m.name),
            // Cluster API held it back: the timeout says which check, not only that it waited.
            None => match self.preflight_hold(md) {
                Some(h) => format!(
                    "no Machine was created ({})",
                    super::preflight::held_message(md, &h)
                ),
                None => "no Machine was created".to_string(),
            },
        };
        self.shared.events.warning(
            object_ref(&c),
            "CreateTimeout",
            format!(
                "{what} within {} from MachineDeployment {md}; deleting the NodeClaim and marking the offering unavailable for {}",
                crate::api::duration::format(timeout),
                crate::api::duration::format(self.shared.settings.unavailable_offering_ttl)
            ),
        );
        tracing::warn!(nodeclaim = %self.name(), machine_deployment = %md, "create timeout");
        self.tell_nominated_pods(&format!(
            "{what} within {} from MachineDeployment {md}",
            crate::api::duration::format(timeout)
        ));
        let (reason, message) = conditions::get(c.conditions(), conditions::LAUNCHED)
            .filter(|l| !l.is_true() && !l.reason.is_empty())
            .map(|l| (l.reason.clone(), l.message.clone()))
            .unwrap_or_else(|| ("LaunchTimeout".to_string(), what.clone()));
        self.record_registration(Err((reason, message)));
        self.delete_claim().await?;
        self.count_timeout("launch_timeout");
        Ok(Next::Wait(None))
    }

    /// The claim's Machine failed before its Node registered: avoid the offering for a while,
    /// say why, and delete the claim (its termination releases the Machine).
    pub(super) async fn machine_failed(
        &mut self,
        md: &str,
        machine: &Machine,
    ) -> Result<Next, Error> {
        let c = self.claim.clone();
        self.shared
            .catalog
            .mark_unavailable(md, self.shared.settings.unavailable_offering_ttl);
        self.shared
            .metrics
            .cloudprovider_errors
            .get_or_create(&crate::metrics::ErrorLabels {
                method: "Create".into(),
                error: "MachineFailed".into(),
            })
            .inc();
        let why = match (&machine.failure_reason, &machine.failure_message) {
            (Some(r), Some(m)) => format!("{r}: {m}"),
            (Some(r), None) => r.clone(),
            (None, Some(m)) => m.clone(),
            (None, None) => format!("phase {:?}", machine.phase),
        };
        self.shared.events.warning(
            object_ref(&c),
            "MachineFailed",
            format!(
                "Machine {}/{} of MachineDeployment {md} failed ({why}); deleting the NodeClaim and marking the offering unavailable for {}",
                machine.namespace,
                machine.name,
                crate::api::duration::format(self.shared.settings.unavailable_offering_ttl)
            ),
        );
        tracing::warn!(nodeclaim = %self.name(), machine = %machine.name, reason = %why, "machine failed");
        self.tell_nominated_pods(&format!(
            "Machine {}/{} of MachineDeployment {md} failed ({why})",
            machine.namespace, machine.name
        ));
        self.delete_claim().await?;
        Ok(Next::Wait(None))
    }

    /// Upstream's `InsufficientCapacityError` on each pod a solve planned onto this claim
    /// (kubernetes-sigs/karpenter#3143): the launch failed, so the pods that wait for it are
    /// told why where their owners look, not only in the claim's Events and the logs. The
    /// provisioner solves them again once the claim is gone.
    pub(super) fn tell_nominated_pods(&self, why: &str) {
        let name = self.name();
        let pods: Vec<String> = (self.shared.state.nominated.read().iter())
            .filter(|(_, (place, _))| *place == name)
            .map(|(pod, _)| pod.clone())
            .collect();
        let index = self.shared.state.pods.read();
        for pod in pods.iter().filter_map(|key| index.get(key)) {
            self.shared.events.warning(
                pod.object_ref(&()),
                "InsufficientCapacityError",
                format!("NodeClaim {name}, nominated for this pod, failed to launch: {why}"),
            );
        }
    }

    pub(super) async fn registration_timeout(&mut self, md: &str) -> Result<Next, Error> {
        let c = self.claim.clone();
        self.shared
            .metrics
            .registration_timeouts
            .get_or_create(&Metrics::pool(&self.nodepool(), md))
            .inc();
        self.shared
            .catalog
            .mark_unavailable(md, self.shared.settings.unavailable_offering_ttl);
        self.shared.events.warning(
            object_ref(&c),
            "RegistrationTimeout",
            format!(
                "No Node with provider ID {} registered within {}; deleting the NodeClaim",
                provider_id(&c).unwrap_or("?"),
                crate::api::duration::format(self.shared.settings.registration_timeout)
            ),
        );
        self.record_registration(Err((
            "RegistrationFailed".to_string(),
            "a launched node did not register in time".to_string(),
        )));
        self.delete_claim().await?;
        self.count_timeout("registration_timeout");
        Ok(Next::Wait(None))
    }

    /// A launch of this claim's NodePool registered (`Ok`) or timed out: the pool's
    /// `NodeRegistrationHealthy` follows.
    pub(super) fn record_registration(&self, outcome: Result<(), (String, String)>) {
        let pool = self.nodepool();
        if pool.is_empty() {
            return;
        }
        self.shared
            .state
            .registration_health
            .write()
            .record(&pool, outcome);
        self.shared.router.nodepools_changed();
    }

    /// A claim deleted by a liveness timeout counts as disrupted, as upstream counts it
    /// (`launch_timeout` or `registration_timeout`).
    pub(super) fn count_timeout(&self, reason: &str) {
        // No pods count here: a claim that never launched or registered has none, and upstream
        // adds none for these reasons either.
        self.shared
            .metrics
            .nodeclaims_disrupted
            .get_or_create(&DisruptedLabels::of(
                reason,
                self.nodepool(),
                &self.claim,
                None,
            ))
            .inc();
    }

    /// The Machine index shows no Machine bound to this claim, though the claim recorded one.
    /// The index is a cache fed by a watch, and one that lags can go back to a version from
    /// before the bind; deleting the claim cannot be undone, so the Machine is read from the API
    /// server first, as upstream's liveness asks the cloud provider rather than its own cache.
    pub(super) async fn recorded_machine_unseen(&mut self, mk: String) -> Result<Next, Error> {
        let live = self.read_machine(&mk).await?;
        let name = self.name();
        match live {
            Some(m) if m.deletion_timestamp.is_none() && bound_claim(&m) == Some(name.as_str()) => {
                tracing::info!(nodeclaim = %name, machine = %mk, "the Machine index is behind the API server (it lost the binding); waiting for the watch");
                self.shared.metrics.machine_index_behind.inc();
                self.shared.state.machines.write().apply_response(m);
                Ok(Next::Wait(Some(INDEX_BEHIND_RECHECK)))
            }
            _ => self.machine_gone(mk).await,
        }
    }

    /// GET the Machine with key `mk` (`namespace/name`); `None` when it does not exist.
    async fn read_machine(&self, mk: &str) -> Result<Option<Machine>, Error> {
        let (namespace, name) = mk.split_once('/').unwrap_or(("", mk));
        let v = self.shared.capi_version;
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.shared.management.clone(),
            namespace,
            &version::machine_resource(v),
        );
        let Some(obj) = api.get_opt(name).await.map_err(api_err(
            &self.shared.metrics,
            "get",
            "machines",
            name,
        ))?
        else {
            return Ok(None);
        };
        Machine::from_dynamic(&obj, v)
            .map(Some)
            .map_err(|source| Error::Model {
                kind: "Machine",
                name: name.to_string(),
                source,
            })
    }

    /// Garbage collection: the claim's Machine is gone, so is the claim.
    pub(super) async fn machine_gone(&mut self, machine: String) -> Result<Next, Error> {
        let c = self.claim.clone();
        self.shared.events.warning(
            object_ref(&c),
            "MachineDeleted",
            format!(
                "Machine {machine} no longer exists; deleting NodeClaim {}",
                self.name()
            ),
        );
        self.delete_claim().await?;
        Ok(Next::Wait(None))
    }
}

/// When the registration clock started: the `Registered` condition's last transition while it
/// is not True, else the launch, else the claim's creation.
pub(crate) fn registration_clock_start(c: &NodeClaim) -> Timestamp {
    let conds = c.conditions();
    conditions::get(conds, conditions::REGISTERED)
        .filter(|r| !r.is_true())
        .or_else(|| conditions::get(conds, conditions::LAUNCHED).filter(|l| l.is_true()))
        .map(|cond| cond.last_transition_time.0)
        .or_else(|| c.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or_else(Timestamp::now)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(conditions: serde_json::Value) -> NodeClaim {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"requirements": [],
                     "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}},
            "status": {"conditions": conditions},
        }))
        .expect("a valid NodeClaim")
    }

    fn at(t: &str) -> Timestamp {
        t.parse().expect("a timestamp")
    }

    #[test]
    fn registration_is_timed_from_the_registered_condition_as_upstream() {
        // Written by upstream Karpenter: Registered Unknown since the status was first written,
        // launched later; the clock runs from Registered's transition, not from the launch.
        let upstream = claim(json!([
            {"type": "Registered", "status": "Unknown", "reason": "NodeNotFound",
             "lastTransitionTime": "2026-01-01T00:00:05Z"},
            {"type": "Launched", "status": "True", "reason": "Launched",
             "lastTransitionTime": "2026-01-01T00:04:00Z"},
        ]));
        assert_eq!(
            registration_clock_start(&upstream),
            at("2026-01-01T00:00:05Z")
        );
        // Launched without a Registered condition (an older claim of ours): from the launch.
        let launched = claim(json!([
            {"type": "Launched", "status": "True", "reason": "Launched",
             "lastTransitionTime": "2026-01-01T00:10:00Z"},
        ]));
        assert_eq!(
            registration_clock_start(&launched),
            at("2026-01-01T00:10:00Z")
        );
        // Nothing written yet: from creation, never from "now" (which would never expire).
        assert_eq!(
            registration_clock_start(&claim(json!([]))),
            at("2026-01-01T00:00:00Z")
        );
    }
}
