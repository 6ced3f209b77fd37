//! Launch (Karpenter core's lifecycle/launch): choose an offering, record it on the claim with
//! the finalizer before any replica is requested (invariant 4; the provisioner does it in the
//! claim it creates when it can, [`prelaunch`], saving a write), record the bound Machine, and
//! write `Launched=True` with the provider ID and capacity once the Machine has one. A claim
//! that cannot launch says why and, past Karpenter's launch timeout, is deleted.

use std::collections::HashSet;
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::{Next, Step, left_until, object_ref, since};
use crate::actors::Error;
use crate::actors::patch::JsonPatch;
use crate::api::conditions::{self, ConditionStatus};
use crate::api::nodeclaim::NodeClaim;
use crate::api::requirements::Requirements;
use crate::api::resources::Resources;
use crate::api::wellknown::*;
use crate::capi::model::Machine;
use crate::metrics::Metrics;
use crate::scheduling::MinValuesPolicy;
use crate::state::claims::recorded_machine;
use crate::state::machines::key as machine_key;
use crate::view::catalog::{CatalogView, Choice, ResolveError};

/// How often a claim whose NodeClass is missing or not ready tries again.
const LAUNCH_RETRY: Duration = Duration::from_secs(10);

/// The offering a claim launches on: the cheapest available one its requirements, requests and
/// taints allow, but those in `excluded`. Its minValues must be met by the types that can launch
/// it, unless `policy` is BestEffort (upstream's cloud providers skip that check then).
pub(crate) fn resolve(
    catalog: &CatalogView,
    claim: &NodeClaim,
    excluded: &HashSet<String>,
    policy: MinValuesPolicy,
) -> Result<Choice, ResolveError> {
    // Values the schema accepts but that make no sense (a negative request) are refused
    // with the field named, as upstream's CEL rules would have refused the object.
    crate::api::validation::validate_nodeclaim(claim)
        .map_err(|e| ResolveError::Invalid(e.to_string()))?;
    let spec = &claim.spec;
    let mut reqs = Requirements::from_node_selector_requirements(&spec.requirements)
        .map_err(|e| ResolveError::Invalid(format!("spec.requirements: {e}")))?;
    if policy == MinValuesPolicy::BestEffort {
        reqs.relax_min_values(|_| 0);
    }
    let requests = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .map(Resources::from_k8s)
        .transpose()
        .map_err(|e| ResolveError::Invalid(format!("spec.resources.requests: {e}")))?
        .unwrap_or_default();
    let declared = crate::view::catalog::declared_taints(&spec.taints, &spec.startup_taints);
    catalog.resolve(
        &spec.node_class_ref.name,
        claim.labels().get(NODEPOOL_LABEL).map(String::as_str),
        &reqs,
        &requests,
        excluded,
        &declared,
    )
}

/// A new claim, launched at its creation: the offering chosen, recorded with the finalizer and
/// the offering's labels in the object created, so its first write is its creation (invariant 4
/// holds: the MachineDeployment is on the claim before any replica is asked for). When no
/// offering can be chosen, the claim is left as it was and why is returned: the provisioner
/// does not create a claim no offering has room for (`NoCompatibleOffering`), and creates any
/// other as it is, for its actor to decide (and say why).
pub(crate) fn prelaunch(
    catalog: &CatalogView,
    claim: &mut NodeClaim,
    policy: MinValuesPolicy,
) -> Result<Choice, ResolveError> {
    let choice = resolve(catalog, claim, &HashSet::new(), policy)?;
    let finalizers = claim.metadata.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
        finalizers.push(TERMINATION_FINALIZER.to_string());
    }
    claim
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            MACHINE_DEPLOYMENT_ANNOTATION.to_string(),
            choice.machine_deployment.clone(),
        );
    let labels = launch_labels(claim, &choice);
    claim
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .extend(labels);
    Ok(choice)
}

/// The labels a launched claim carries that `claim` lacks or has otherwise: each single-valued
/// requirement of its spec and every label of the offering it launches on (upstream's
/// PopulateNodeClaimDetails). A claim another provisioner created (the Go provider writes only
/// its creation labels) thus ends with the labels one of ours has, and never drifts for labels
/// this controller did not write.
pub(crate) fn launch_labels(claim: &NodeClaim, offering: &Choice) -> Vec<(String, String)> {
    let mut wanted: std::collections::BTreeMap<String, String> = Default::default();
    if let Ok(reqs) = Requirements::from_node_selector_requirements(&claim.spec.requirements) {
        for r in reqs.iter() {
            if r.key() == HOSTNAME_LABEL || r.allows_absent() {
                continue;
            }
            if let Some(values) = r.finite_values()
                && values.len() == 1
                && let Some(v) = values.iter().next()
            {
                wanted.insert(r.key().to_string(), v.clone());
            }
        }
    }
    wanted.extend(offering.labels.clone());
    wanted.extend(offering.node_labels());
    wanted
        .into_iter()
        .filter(|(k, v)| claim.labels().get(k) != Some(v))
        .collect()
}

impl Step {
    /// First step: choose the offering and record it on the claim, with the finalizer and the
    /// offering's labels, before any replica is requested (invariant 4).
    pub(super) async fn launch_decision(&mut self) -> Result<Next, Error> {
        let c = self.claim.clone();
        let offering = match self.resolve() {
            Ok(o) => o,
            Err(e @ ResolveError::NoCompatibleOffering { .. }) => {
                return self.insufficient_capacity(e).await;
            }
            Err(e @ ResolveError::Invalid(_)) => {
                return self.launch_blocked(e, ConditionStatus::False, None).await;
            }
            // The NodeClass may appear or become ready: retry, as Karpenter does for launch errors.
            Err(e) => {
                return self
                    .launch_blocked(e, ConditionStatus::Unknown, Some(LAUNCH_RETRY))
                    .await;
            }
        };
        let mut p = JsonPatch::guarded(c.resource_version().as_deref());
        let mut finalizers = c.finalizers().to_vec();
        if !finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
            finalizers.push(TERMINATION_FINALIZER.to_string());
        }
        p.set("/metadata/finalizers", json!(finalizers));
        let has_annotations = !c.annotations().is_empty();
        p.set_entry(
            has_annotations,
            "/metadata/annotations",
            MACHINE_DEPLOYMENT_ANNOTATION,
            &offering.machine_deployment,
        );
        let has_labels = !c.labels().is_empty();
        for (k, v) in launch_labels(&c, &offering) {
            p.set_entry(has_labels, "/metadata/labels", &k, &v);
        }
        // The MachineDeployment's room is taken from now, not from when the index sees the
        // write: another claim resolving meanwhile must not count the slot as free.
        let claims = &self.shared.state.claims;
        claims
            .write()
            .expect(&self.name(), &offering.machine_deployment);
        let updated = match self.patch_claim(p, false).await {
            Ok(u) => u,
            Err(e) => {
                claims.write().unexpect(&self.name());
                return Err(e);
            }
        };
        tracing::info!(nodeclaim = %self.name(), machine_deployment = %offering.machine_deployment, instance_type = %offering.instance_type, price = offering.price, "offering chosen");
        Ok(Next::Continue(updated))
    }

    pub(super) fn resolve(&self) -> Result<Choice, ResolveError> {
        resolve(
            &self.shared.catalog,
            &self.claim,
            &self.excluded,
            self.shared.settings.min_values_policy,
        )
    }

    /// A launch that cannot start yet (or ever): say why in `Launched` and an Event, once.
    pub(super) async fn launch_blocked(
        &mut self,
        e: ResolveError,
        status: ConditionStatus,
        retry: Option<Duration>,
    ) -> Result<Next, Error> {
        let c = self.claim.clone();
        let message = e.to_string();
        // Karpenter's launch timeout: a claim that cannot launch is not kept for ever; deleting
        // it lets the provisioner solve its pods again (perhaps on another NodePool).
        let Some(left) = left_until(self.created(), self.shared.settings.launch_timeout) else {
            tracing::warn!(nodeclaim = %self.name(), error = %e, "not launched within the launch timeout; deleting it");
            self.shared.events.warning(
                object_ref(&c),
                "LaunchTimeout",
                format!(
                    "NodeClaim {} could not launch within {}: {message}; deleting it",
                    self.name(),
                    crate::api::duration::format(self.shared.settings.launch_timeout)
                ),
            );
            self.record_registration(Err((e.reason().to_string(), message)));
            self.delete_claim().await?;
            self.count_timeout("launch_timeout");
            return Ok(Next::Wait(None));
        };
        let retry = Some(retry.map_or(left, |r| r.min(left)));
        let mut st = c.status.clone().unwrap_or_default();
        let mut conds = st.conditions.take().unwrap_or_default();
        let now = Timestamp::now();
        let changed = conditions::set(
            &mut conds,
            conditions::LAUNCHED,
            status,
            e.reason(),
            &message,
            c.metadata.generation,
            now,
        );
        if !changed {
            return Ok(Next::Wait(retry));
        }
        tracing::warn!(nodeclaim = %self.name(), error = %e, "cannot launch yet");
        self.shared.events.warning(
            object_ref(&c),
            e.reason(),
            format!("Cannot launch NodeClaim {}: {message}", self.name()),
        );
        conditions::set_nodeclaim_ready(&mut conds, c.metadata.generation, now);
        st.conditions = Some(conds);
        let updated = self
            .patch_status(serde_json::to_value(&st).unwrap_or(Value::Null))
            .await?;
        self.claim = updated.clone();
        Ok(Next::Wait(retry))
    }

    /// Karpenter's rule: a launch that cannot be satisfied deletes the claim, so the provisioner
    /// retries the pods elsewhere; the Event says why.
    pub(super) async fn insufficient_capacity(&mut self, e: ResolveError) -> Result<Next, Error> {
        let c = self.claim.clone();
        tracing::warn!(nodeclaim = %self.name(), error = %e, "no offering can launch this claim; deleting it");
        self.tell_nominated_pods(&e.to_string());
        self.shared.events.warning(
            object_ref(&c),
            e.reason(),
            format!("Cannot launch NodeClaim {}: {e}; deleting it", self.name()),
        );
        self.shared
            .metrics
            .cloudprovider_errors
            .get_or_create(&crate::metrics::ErrorLabels {
                method: "Create".into(),
                error: e.reason().into(),
            })
            .inc();
        self.delete_claim().await?;
        Ok(Next::Wait(None))
    }

    pub(super) async fn record_machine(&mut self, md: &str, mk: &str) -> Result<Next, Error> {
        let c = self.claim.clone();
        let mut p = JsonPatch::guarded(c.resource_version().as_deref());
        p.set_entry(
            !c.annotations().is_empty(),
            "/metadata/annotations",
            MACHINE_ANNOTATION,
            mk,
        );
        // A pool's Machines never report an outdated template: the claim keeps the template
        // it was bound under, and a pool template changed since is its drift.
        let pool_template = self
            .shared
            .state
            .deployments
            .read()
            .get(md)
            .and_then(|d| d.template_hash.clone());
        if let Some(hash) = pool_template {
            p.set_entry(
                !c.annotations().is_empty(),
                "/metadata/annotations",
                POOL_TEMPLATE_HASH_ANNOTATION,
                &hash,
            );
            // And what its infrastructure pool makes instances of, edited in place or not.
            if let Some(infra) = self.shared.catalog.instance_hash(md) {
                p.set_entry(
                    !c.annotations().is_empty(),
                    "/metadata/annotations",
                    INFRA_POOL_HASH_ANNOTATION,
                    &infra,
                );
            }
        }
        let updated = self.patch_claim(p, false).await?;
        // Karpenter's cloud-provider Create: the claim was accepted (created) until a Machine
        // is bound to it, observed once, when the binding is first recorded on the claim.
        if recorded_machine(&c).is_none() {
            self.shared
                .metrics
                .cloudprovider("Create", since(self.created()));
        }
        Ok(Next::Continue(updated))
    }

    /// The Machine has a provider ID: record it with capacity and `Launched=True`.
    pub(super) async fn launched(
        &mut self,
        md: &str,
        machine: Option<&Machine>,
        pid: &str,
    ) -> Result<Next, Error> {
        let pool = self.claim.labels().get(NODEPOOL_LABEL).cloned();
        let offering = self.shared.catalog.pool_offering(md, pool.as_deref());
        // An adopted claim (bound by another provisioner's Machine) skipped the launch decision:
        // its labels are written here, before it is Launched, so drift never sees it without
        // them. A claim of ours has them all already and costs no write.
        if let Some(o) = &offering {
            let missing = launch_labels(&self.claim, o);
            if !missing.is_empty() {
                let mut p = JsonPatch::guarded(self.claim.resource_version().as_deref());
                let has_labels = !self.claim.labels().is_empty();
                for (k, v) in &missing {
                    p.set_entry(has_labels, "/metadata/labels", k, v);
                }
                self.claim = self.patch_claim(p, false).await?;
            }
        }
        let generation = self.claim.metadata.generation;
        let updated = self
            .conditions_true(&[conditions::LAUNCHED], |status| {
                status.provider_id = Some(pid.to_string());
                // Start the registration clock now, as upstream's liveness reads it.
                let conds = status.conditions.get_or_insert_with(Vec::new);
                if conditions::get(conds, conditions::REGISTERED).is_none() {
                    conditions::set(
                        conds,
                        conditions::REGISTERED,
                        ConditionStatus::Unknown,
                        "NodeNotFound",
                        "Node not registered with cluster",
                        generation,
                        Timestamp::now(),
                    );
                }
                if let Some(o) = &offering {
                    status.capacity = Some(o.capacity.to_k8s());
                    status.allocatable = Some(o.allocatable.to_k8s());
                }
            })
            .await?;
        let m = &self.shared.metrics;
        m.nodeclaims_launched
            .get_or_create(&Metrics::pool(&self.nodepool(), md))
            .inc();
        Metrics::observe(&m.claim_launch_seconds, md, since(self.created()));
        let mk = machine.map(|m| machine_key(&m.namespace, &m.name));
        if let Some(seen) = mk
            .as_ref()
            .and_then(|mk| self.shared.state.machines.read().provider_id_seen(mk))
        {
            Metrics::observe(&m.provider_id_to_claim_seconds, md, seen.elapsed());
        }
        tracing::info!(nodeclaim = %self.name(), machine = mk.as_deref(), provider_id = %pid, machine_deployment = %md, "launched");
        Ok(Next::Continue(updated))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parity row 31: the Go provider's claim shape (its creation labels only) gets what one of
    /// ours carries; labels it already has with the same value are not written again.
    #[test]
    fn launch_labels_are_the_requirements_and_the_offerings() {
        let claim: NodeClaim = serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "default-x", "labels": {
                NODEPOOL_LABEL: "default", "team": "a"}},
            "spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io",
                                      "kind": "ClusterAPINodeClass", "name": "default"},
                     "requirements": [
                         {"key": "node.cluster.x-k8s.io/pool", "operator": "In", "values": ["md-0"]},
                         {"key": ZONE_LABEL, "operator": "In", "values": ["a", "b"]},
                         {"key": "team", "operator": "In", "values": ["a"]},
                         {"key": "gpu", "operator": "DoesNotExist"}]}
        }))
        .expect("a NodeClaim");
        let offering = Choice {
            machine_deployment: "default/md-0".into(),
            instance_type: "sim-0".into(),
            zone: Some("a".into()),
            capacity_type: CAPACITY_TYPE_ON_DEMAND.into(),
            price: 0.2,
            capacity: Resources::new(),
            allocatable: Resources::new(),
            labels: [
                (INSTANCE_TYPE_LABEL, "sim-0"),
                (ZONE_LABEL, "a"),
                (CAPACITY_TYPE_LABEL, CAPACITY_TYPE_ON_DEMAND),
                ("node.cluster.x-k8s.io/pool", "md-0"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        };
        let got: std::collections::BTreeMap<String, String> =
            launch_labels(&claim, &offering).into_iter().collect();
        let want: std::collections::BTreeMap<String, String> = [
            (INSTANCE_TYPE_LABEL, "sim-0"),
            (ZONE_LABEL, "a"),
            (CAPACITY_TYPE_LABEL, CAPACITY_TYPE_ON_DEMAND),
            ("node.cluster.x-k8s.io/pool", "md-0"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        assert_eq!(got, want);
    }
}
