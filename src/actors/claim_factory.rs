//! The one NodeClaim factory: every claim this controller creates (the provisioner's for pending
//! pods, a static pool's to hold its replicas, a disruption command's replacement, a rollout's)
//! is built and sent here.
//!
//! Built: from a solver's decision and its NodePool (`scheduling::nodeclaim_for`, the
//! `--default-termination-grace-period`), launched at creation where the purpose allows
//! (`nodeclaim::prelaunch`), and named here as `generateName` would (`<pool>-` and five
//! characters), so a create whose answer was lost is found by reading that name back.
//!
//! Sent: its MachineDeployment's room is taken at once (`Claims::expect_created`), then one
//! retry strategy for every site (`persist`): the server's transient failures (5xx, 429, no
//! answer) are retried with the write backoff, reading the name back before each retry so a
//! create that landed is never made twice; a 409 reads the name back too (our claim: created;
//! another's: the name is taken, given up); a 403, a 422 (an invalid object) or any other
//! answer retrying cannot change ends it at once. Each failed attempt counts in
//! `api_errors_total`; a disruption's retries also in `disruption_write_retries`. A created
//! claim counts in `nodeclaims_created_total` by its purpose's reason and goes into the index
//! in the same turn; a failed one gives its room back. What a failure means next (solve the
//! pods again, retry the pass, roll the command back) is the caller's.

use crate::view::catalog::ResolveError;
use std::collections::BTreeMap;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;

use kube::ResourceExt;
use kube::api::{Api, PostParams};

use super::persist::{name_suffix, persist, persist_counted};
use super::{Error, Shared, api_err};
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::NodePool;
use crate::api::wellknown::{
    INITIALIZED_LABEL, MACHINE_DEPLOYMENT_ANNOTATION, NODEPOOL_HASH_ANNOTATION,
    NODEPOOL_HASH_VERSION_ANNOTATION, NODEPOOL_LABEL, REGISTERED_LABEL, REPLACES_ANNOTATION,
    TERMINATION_FINALIZER,
};
use crate::metrics::CreatedLabels;
use crate::scheduling::NewClaim;

/// Why a claim is created: what differs between the sites, and nothing else.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Purpose {
    /// The provisioner's, for pending pods.
    Provisioning,
    /// A static NodePool's, to hold `spec.replicas`.
    Static,
    /// A disruption command's replacement; `reason` is its method's, lower case (`drifted`).
    Replacement { reason: String },
    /// A Cluster API rollout's: the outdated claim's successor ([`rollout`]).
    Rollout,
}

impl Purpose {
    /// The `reason` label of `nodeclaims_created_total` (upstream's: a static pool's claims
    /// are provisioning's too).
    fn reason(&self) -> &str {
        match self {
            Purpose::Provisioning | Purpose::Static => "provisioning",
            Purpose::Replacement { reason } => reason,
            Purpose::Rollout => "rollout",
        }
    }

    /// Launched at creation (offering, finalizer, labels in the object created). A replacement
    /// is launched by its claim actor as before; a rollout's is built launched.
    fn prelaunches(&self) -> bool {
        matches!(self, Purpose::Provisioning | Purpose::Static)
    }

    /// Part of a disruption command, whose retries are counted with its other writes.
    fn is_disruption(&self) -> bool {
        matches!(self, Purpose::Replacement { .. } | Purpose::Rollout)
    }

    fn created(&self) -> (&'static str, &'static str) {
        match self {
            Purpose::Static => (
                "created nodeclaim to hold the static pool's replicas",
                "would create NodeClaim to hold the static pool's replicas",
            ),
            _ => ("created nodeclaim", "would create NodeClaim"),
        }
    }
}

/// The claim for `new` of pool `np`, ready to [`create`]: named, with the default termination
/// grace period, launched at creation when `purpose` allows and an offering can be chosen;
/// with why none could be, when it was tried (the provisioner creates no claim that has no room
/// left, `provisioner::nowhere`).
pub(crate) fn build(
    shared: &Shared,
    new: &NewClaim,
    np: &NodePool,
    purpose: &Purpose,
) -> (NodeClaim, Option<ResolveError>) {
    let mut claim = crate::scheduling::with_default_termination_grace_period(
        crate::scheduling::nodeclaim_for(new, np),
        shared.settings.default_termination_grace_period,
    );
    let mut refused = None;
    if purpose.prelaunches() {
        match super::nodeclaim::prelaunch(
            &shared.catalog,
            &mut claim,
            shared.settings.min_values_policy,
        ) {
            Ok(o) => {
                tracing::debug!(nodepool = %new.nodepool, machine_deployment = %o.machine_deployment, instance_type = %o.instance_type, price = o.price, "offering chosen at creation");
            }
            Err(e) => refused = Some(e),
        }
    }
    (named(claim), refused)
}

/// A claim for the fresh Machine of a RollingUpdate, replacing `old` (whose Machine the rollout
/// outdated): the same spec, pool, owner and offering, created already launched onto `old`'s
/// MachineDeployment (offering recorded, finalizer set, as the launch step would write them),
/// so the Scaler hands it a spare fresh Machine without a replica write.
pub(crate) fn rollout(old: &NodeClaim) -> NodeClaim {
    let pool = old
        .labels()
        .get(NODEPOOL_LABEL)
        .cloned()
        .unwrap_or_default();
    let mut labels = old.labels().clone();
    labels.retain(|k, _| k != REGISTERED_LABEL && k != INITIALIZED_LABEL);
    let mut annotations: BTreeMap<String, String> = old
        .annotations()
        .iter()
        .filter(|(k, _)| {
            [
                NODEPOOL_HASH_ANNOTATION,
                NODEPOOL_HASH_VERSION_ANNOTATION,
                MACHINE_DEPLOYMENT_ANNOTATION,
            ]
            .contains(&k.as_str())
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.insert(REPLACES_ANNOTATION.to_string(), old.name_any());
    let mut claim = NodeClaim::new("", old.spec.clone());
    claim.metadata = kube::api::ObjectMeta {
        generate_name: Some(format!("{pool}-")),
        labels: Some(labels),
        annotations: Some(annotations),
        finalizers: Some(vec![TERMINATION_FINALIZER.to_string()]),
        owner_references: old.metadata.owner_references.clone(),
        ..Default::default()
    };
    named(claim)
}

/// `claim` named as `generateName` would name it.
fn named(mut claim: NodeClaim) -> NodeClaim {
    if let Some(prefix) = claim.metadata.generate_name.take() {
        claim.metadata.name = Some(format!("{prefix}{}", name_suffix()));
    }
    claim
}

/// Create `claim` (from [`build`] or [`rollout`]): its room is taken now, before the returned
/// future first runs; the future carries the create through the server's failures (the module's
/// strategy) and answers the claim created, already counted and in the index. `shared` is a
/// `&Shared` in an async caller, an `Arc<Shared>` for an actor's `'static` spawn.
pub(crate) fn create<S: Deref<Target = Shared>>(
    shared: S,
    mut claim: NodeClaim,
    purpose: Purpose,
) -> impl Future<Output = Result<NodeClaim, Error>> {
    // In the management cluster, every claim is bound to the Cluster it is for.
    if let Some(binding) = &shared.settings.karpenter_objects {
        binding.label(claim.metadata.labels.get_or_insert_default());
    }
    shared.state.claims.write().expect_created(&claim);
    async move {
        let r = send(&shared, &claim, &purpose).await;
        let pool = claim.labels().get(NODEPOOL_LABEL).cloned();
        let pool = pool.as_deref().unwrap_or_default();
        match &r {
            Ok(created) => {
                shared
                    .metrics
                    .nodeclaims_created
                    .get_or_create(&CreatedLabels::of(purpose.reason(), pool, created))
                    .inc();
                let (done, dry) = purpose.created();
                tracing::info!(nodeclaim = %created.name_any(), nodepool = %pool, reason = purpose.reason(), "{}", shared.settings.say(done, dry));
                let index = Arc::new(created.clone());
                shared.state.claims.write().apply_response(index);
            }
            Err(_) => shared.state.claims.write().unexpect(&claim.name_any()),
        }
        r
    }
}

/// The create, retried as the module says.
async fn send(shared: &Shared, claim: &NodeClaim, purpose: &Purpose) -> Result<NodeClaim, Error> {
    let name = claim.name_any();
    let api: Api<NodeClaim> = shared.api();
    let what = format!("creating NodeClaim {name}");
    let attempt = |fresh: bool| {
        let (api, name) = (&api, &name);
        async move {
            if fresh
                && let Some(found) = api.get_opt(name).await.map_err(api_err(
                    &shared.metrics,
                    "get",
                    "nodeclaims",
                    name,
                ))?
            {
                return if same_claim(&found, claim) {
                    Ok(found)
                } else {
                    Err(Error::Gone {
                        what: format!("the name {name}, taken by another NodeClaim,"),
                    })
                };
            }
            api.create(&PostParams::default(), claim)
                .await
                .map_err(api_err(&shared.metrics, "create", "nodeclaims", name))
        }
    };
    if purpose.is_disruption() {
        persist_counted(&shared.metrics, "create", &what, attempt).await
    } else {
        persist(&what, attempt).await
    }
}

/// The claim found under a created claim's name is the one sent: every label and annotation it
/// was created with.
fn same_claim(found: &NodeClaim, sent: &NodeClaim) -> bool {
    let has = |have: &BTreeMap<String, String>, want: &BTreeMap<String, String>| {
        want.iter().all(|(k, v)| have.get(k) == Some(v))
    };
    has(found.labels(), sent.labels()) && has(found.annotations(), sent.annotations())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(labels: &[(&str, &str)]) -> NodeClaim {
        let mut c = NodeClaim::new("c", Default::default());
        c.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        c
    }

    #[test]
    fn a_claim_is_named_from_its_pool() {
        let mut c = claim(&[]);
        c.metadata.name = None;
        c.metadata.generate_name = Some("pool-".into());
        let c = named(c);
        let name = c.metadata.name.unwrap();
        assert!(name.starts_with("pool-") && name.len() == "pool-".len() + 5);
        assert_eq!(c.metadata.generate_name, None);
    }

    #[test]
    fn only_our_claim_counts_as_created_under_its_name() {
        let sent = claim(&[(NODEPOOL_LABEL, "a")]);
        assert!(same_claim(
            &claim(&[(NODEPOOL_LABEL, "a"), ("x", "y")]),
            &sent
        ));
        assert!(!same_claim(&claim(&[(NODEPOOL_LABEL, "b")]), &sent));
    }

    #[test]
    fn each_purpose_says_its_reason_and_whether_it_launches_at_creation() {
        let drift = Purpose::Replacement {
            reason: "drifted".into(),
        };
        assert_eq!(Purpose::Static.reason(), "provisioning");
        assert_eq!(drift.reason(), "drifted");
        assert_eq!(Purpose::Rollout.reason(), "rollout");
        assert!(Purpose::Provisioning.prelaunches() && !drift.prelaunches());
        assert!(drift.is_disruption() && !Purpose::Static.is_disruption());
    }
}
