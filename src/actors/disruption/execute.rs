//! The writes of disruption: stamping conditions, tainting and marking candidates, creating
//! replacements, deleting candidates (the Terminator then drains them), and rolling a command
//! back. Every write is guarded by the resourceVersion it was computed from, so a racing writer
//! makes it fail cleanly; a command's own writes then read the object again and retry
//! (`persist`), the others leave it to the next pass, which starts again from the indexes.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::actors::claim_factory::{self, Purpose};
use crate::actors::patch::{JsonPatch, send};
use crate::actors::persist::persist_counted;
use crate::actors::{Error, Shared, api_err};
use crate::api::conditions::{self, Condition, ConditionStatus};
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodepool::NodePool;
use crate::api::wellknown::{
    DISRUPTED_TAINT_KEY, NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION,
    NODEPOOL_HASH_VERSION_ANNOTATION, NODEPOOL_LABEL,
};
use crate::disruption::{Candidate, Command};
use crate::metrics::{DecisionLabels, DisruptedLabels, PoolDecisionLabels};
use crate::view::disruption::Stamp;

pub(crate) use super::notes::{Publish, on_claim_and_node};

const CLAIM: (&str, &str) = ("NodeClaim", "nodeclaims");

fn claims(shared: &Shared) -> Api<NodeClaim> {
    shared.api()
}

/// Rewrite a claim's conditions with `edit`, guarded by the version they were read from.
async fn edit_conditions(
    shared: &Shared,
    claim: &NodeClaim,
    edit: impl FnOnce(&mut Vec<Condition>),
) -> Result<(), Error> {
    let name = claim.name_any();
    let mut conds = claim.conditions().to_vec();
    edit(&mut conds);
    if conds.as_slice() == claim.conditions() {
        return Ok(());
    }
    let mut p = JsonPatch::guarded(claim.resource_version().as_deref());
    if claim.status.is_none() {
        p.set("/status", json!({"conditions": conds}));
    } else {
        p.set("/status/conditions", json!(conds));
    }
    let updated: NodeClaim = send(shared, CLAIM, &name, p, true).await?;
    shared
        .state
        .claims
        .write()
        .apply_response(Arc::new(updated));
    Ok(())
}

/// Record the claim's last pod event. A merge patch of the one field: it creates `status` when
/// there is none and races with no other writer's fields (only the leader writes this one).
pub(crate) async fn record_pod_event(
    shared: &Shared,
    claim: &NodeClaim,
    at: Timestamp,
) -> Result<(), Error> {
    let name = claim.name_any();
    let body = json!({"status": {"lastPodEventTime": at.to_string()}});
    let updated: NodeClaim = claims(shared)
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(api_err(&shared.metrics, "patch", CLAIM.1, &name))?;
    shared
        .state
        .claims
        .write()
        .apply_response(Arc::new(updated));
    Ok(())
}

/// `Drifted` and `Consolidatable` as the pass computed them.
pub(crate) async fn stamp(shared: &Shared, s: &Stamp) -> Result<(), Error> {
    let generation = s.claim.metadata.generation;
    let now = Timestamp::now();
    edit_conditions(shared, &s.claim, |conds| {
        match s.drift {
            Some(d) => {
                conditions::set(
                    conds,
                    conditions::DRIFTED,
                    ConditionStatus::True,
                    d.reason(),
                    d.message(),
                    generation,
                    now,
                );
            }
            None => {
                conditions::remove(conds, conditions::DRIFTED);
            }
        }
        if s.consolidatable {
            conditions::set(
                conds,
                conditions::CONSOLIDATABLE,
                ConditionStatus::True,
                conditions::CONSOLIDATABLE,
                "",
                generation,
                now,
            );
        } else {
            conditions::remove(conds, conditions::CONSOLIDATABLE);
        }
    })
    .await
}

/// Stamp today's NodePool hash on a claim written with another hash version (no drift).
pub(crate) async fn restamp(
    shared: &Shared,
    claim: &NodeClaim,
    np: &NodePool,
) -> Result<(), Error> {
    let name = claim.name_any();
    let mut p = JsonPatch::guarded(claim.resource_version().as_deref());
    p.set_entry(
        true,
        "/metadata/annotations",
        NODEPOOL_HASH_ANNOTATION,
        &crate::api::drift_hash::nodepool_hash(np),
    );
    p.set_entry(
        true,
        "/metadata/annotations",
        NODEPOOL_HASH_VERSION_ANNOTATION,
        NODEPOOL_HASH_VERSION,
    );
    let updated: NodeClaim = send(shared, CLAIM, &name, p, false).await?;
    shared
        .state
        .claims
        .write()
        .apply_response(Arc::new(updated));
    Ok(())
}

fn disrupted_taint() -> Taint {
    Taint {
        key: DISRUPTED_TAINT_KEY.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    }
}

/// Add or remove `karpenter.sh/disrupted:NoSchedule`, guarded by the Node's version.
async fn set_taint(shared: &Shared, node: &Node, on: bool) -> Result<(), Error> {
    let name = node.name_any();
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let had = taints.iter().any(|t| t.key == DISRUPTED_TAINT_KEY);
    if had == on {
        return Ok(());
    }
    taints.retain(|t| t.key != DISRUPTED_TAINT_KEY);
    if on {
        taints.push(disrupted_taint());
    }
    let mut p = JsonPatch::guarded(node.resource_version().as_deref());
    if node.spec.is_none() {
        p.set("/spec", json!({"taints": taints}));
    } else {
        p.set("/spec/taints", json!(taints));
    }
    let updated: Node = send(shared, ("Node", "nodes"), &name, p, false).await?;
    shared.state.nodes.write().apply_response(updated);
    Ok(())
}

/// The candidate's Node: from the index, or from the API once a write's outcome is unknown
/// (`fresh`). A Node being deleted is no longer a candidate's.
async fn candidate_node(shared: &Shared, c: &Candidate, fresh: bool) -> Result<Arc<Node>, Error> {
    let node = if fresh {
        let api: Api<Node> = Api::all(shared.workload.clone());
        let node = api.get_opt(&c.node).await.map_err(api_err(
            &shared.metrics,
            "get",
            "nodes",
            &c.node,
        ))?;
        node.map(Arc::new)
    } else {
        shared.state.nodes.read().get(&c.node)
    };
    node.filter(|n| n.metadata.deletion_timestamp.is_none())
        .ok_or_else(|| Error::Gone {
            what: format!("Node {}", c.node),
        })
}

/// The candidate's claim, likewise; one being deleted is no longer a candidate.
async fn candidate_claim(
    shared: &Shared,
    c: &Candidate,
    fresh: bool,
) -> Result<Arc<NodeClaim>, Error> {
    let claim = if fresh {
        read_claim(shared, &c.claim).await?.map(Arc::new)
    } else {
        shared.state.claims.read().get(&c.claim)
    };
    claim
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .ok_or_else(|| Error::Gone {
            what: format!("NodeClaim {}", c.claim),
        })
}

async fn read_claim(shared: &Shared, name: &str) -> Result<Option<NodeClaim>, Error> {
    claims(shared)
        .get_opt(name)
        .await
        .map_err(api_err(&shared.metrics, "get", CLAIM.1, name))
}

/// Taint every candidate's Node, then record why on the claim (`DisruptionReason`): the taint
/// first, so a controller that dies in between leaves a taint the next one rolls back. Each
/// write goes through the server's transient failures (`persist`). The candidates are marked
/// side by side: one whose writes keep failing must not hold the others back.
pub(crate) async fn mark(shared: &Shared, cmd: &Command) -> Result<(), Error> {
    let reason = cmd.method.reason().as_str();
    let message = format!("{reason} ({})", cmd.decision());
    let marks = cmd
        .candidates
        .iter()
        .map(|c| mark_one(shared, c, reason, &message));
    all_done(futures::future::join_all(marks).await)
}

/// The first error of writes that ran side by side, or success.
fn all_done(results: Vec<Result<(), Error>>) -> Result<(), Error> {
    results.into_iter().collect()
}

async fn mark_one(
    shared: &Shared,
    c: &Candidate,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    let m = &shared.metrics;
    persist_counted(
        m,
        "taint",
        &format!("tainting Node {}", c.node),
        |fresh| async move {
            let node = candidate_node(shared, c, fresh).await?;
            set_taint(shared, &node, true).await
        },
    )
    .await?;
    persist_counted(
        m,
        "mark",
        &format!("marking NodeClaim {}", c.claim),
        |fresh| async move {
            let claim = candidate_claim(shared, c, fresh).await?;
            let generation = claim.metadata.generation;
            edit_conditions(shared, &claim, |conds| {
                conditions::set(
                    conds,
                    conditions::DISRUPTION_REASON,
                    ConditionStatus::True,
                    reason,
                    message,
                    generation,
                    Timestamp::now(),
                );
            })
            .await
        },
    )
    .await
}

/// Undo `mark` on a claim and its Node (a failed replacement, or a command that no longer runs).
pub(crate) async fn unmark(shared: &Shared, claim: &NodeClaim, node: &Node) -> Result<(), Error> {
    set_taint(shared, node, false).await?;
    edit_conditions(shared, claim, |conds| {
        conditions::remove(conds, conditions::DISRUPTION_REASON);
    })
    .await
}

/// Create the replacement claims (`claim_factory`); their names.
pub(crate) async fn launch_replacements(
    shared: &Shared,
    cmd: &Command,
) -> Result<Vec<String>, Error> {
    let mut names = Vec::new();
    for new in &cmd.replacements {
        let Some(np) = shared.state.nodepools.read().get(&new.nodepool).cloned() else {
            return Err(Error::Gone {
                what: format!("NodePool {}", new.nodepool),
            });
        };
        let purpose = Purpose::Replacement {
            reason: cmd.method.reason().as_str().to_lowercase(),
        };
        let (claim, _) = claim_factory::build(shared, new, &np, &purpose);
        let created = claim_factory::create(shared, claim, purpose).await?;
        names.push(created.name_any());
    }
    Ok(names)
}

/// A claim for the fresh Machine of a RollingUpdate, replacing `old` (whose Machine the rollout
/// outdated; `claim_factory::rollout` builds it).
pub(crate) async fn replace_for_rollout(shared: &Shared, old: &NodeClaim) -> Result<String, Error> {
    let old_name = old.name_any();
    let claim = claim_factory::rollout(old);
    let created = claim_factory::create(shared, claim, Purpose::Rollout).await?;
    let name = created.name_any();
    tracing::info!(nodeclaim = %name, replaces = %old_name, "{}", shared.settings.say("a Cluster API rollout made a fresh Machine: replacing the outdated one's claim", "a Cluster API rollout made a fresh Machine: would replace the outdated one's claim"));
    shared.events.normal(
        old.object_ref(&()),
        "RolloutReplacement",
        format!("NodeClaim {name} takes the rollout's fresh Machine; this claim ends when Cluster API deletes its outdated Machine"),
    );
    Ok(name)
}

/// Delete the candidates: their finalizer runs the Terminator's drain, then releases the
/// Machines. Counted as upstream counts disruption. A delete whose answer was lost is read
/// back: a claim already deleting (or gone) is done. The candidates are deleted side by side,
/// so one whose delete keeps failing does not hold back the others' drains.
pub(crate) async fn delete_candidates(shared: &Shared, cmd: &Command) -> Result<(), Error> {
    let deletes = cmd
        .candidates
        .iter()
        .map(|c| delete_candidate(shared, cmd, c));
    all_done(futures::future::join_all(deletes).await)
}

async fn delete_candidate(shared: &Shared, cmd: &Command, c: &Candidate) -> Result<(), Error> {
    let reason = cmd.method.reason().as_str();
    let claim = shared.state.claims.read().get(&c.claim);
    super::repair::stamp_deadline(shared, cmd, c, claim.as_deref()).await?;
    let deleted = persist_counted(
        &shared.metrics,
        "delete",
        &format!("deleting NodeClaim {}", c.claim),
        |fresh| async move {
            if fresh {
                let found = read_claim(shared, &c.claim).await?;
                if found.is_none_or(|f| f.metadata.deletion_timestamp.is_some()) {
                    return Ok(true);
                }
            }
            match claims(shared)
                .delete(&c.claim, &DeleteParams::default())
                .await
            {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
                Err(e) => Err(api_err(&shared.metrics, "delete", CLAIM.1, &c.claim)(e)),
            }
        },
    )
    .await?;
    if !deleted {
        return Ok(());
    }
    let labels = disrupted_labels(cmd, c, claim.as_deref());
    shared
        .metrics
        .nodeclaims_disrupted
        .get_or_create(&labels)
        .inc();
    // Upstream counts the pods the candidate was chosen with (its reschedulable pods), not
    // what is left on the node when the delete lands.
    shared
        .metrics
        .pods_disruption_initiated
        .get_or_create(&labels)
        .inc_by(c.pods.len() as u64);
    if let Some(claim) = claim {
        super::repair::count_command(shared, cmd, c, &claim);
        on_claim_and_node(
            shared,
            &claim,
            crate::actors::events::Events::normal,
            "DisruptionTerminating",
            |object| {
                format!(
                    "Disrupting {object}: {reason}/{} ({} method)",
                    cmd.decision(),
                    method_name(cmd)
                )
            },
        );
    }
    Ok(())
}

/// `on_claim_and_node` for each of a command's candidates the index still holds.
pub(crate) fn on_candidates(
    shared: &Shared,
    cmd: &Command,
    publish: Publish,
    reason: &str,
    note: impl Fn(&str) -> String,
) {
    for c in &cmd.candidates {
        let claim = shared.state.claims.read().get(&c.claim);
        if let Some(claim) = claim {
            on_claim_and_node(shared, &claim, publish, reason, &note);
        }
    }
}

/// A replacement of a running command that is not Initialized yet: launching, and the command
/// waits for its readiness (upstream's two Events, on the replacement claim only).
pub(crate) fn replacement_waiting(shared: &Shared, replacement: &NodeClaim, cmd: &Command) {
    let name = replacement.name_any();
    let candidates = cmd.claim_names().join(", ");
    shared.events.normal(
        replacement.object_ref(&()),
        "DisruptionLaunching",
        format!(
            "Launching NodeClaim {name} to replace {candidates} ({}, {} method)",
            cmd.method.reason().as_str(),
            method_name(cmd)
        ),
    );
    shared.events.normal(
        replacement.object_ref(&()),
        "DisruptionWaitingReadiness",
        format!("Disruption of {candidates} waits until NodeClaim {name} is Initialized"),
    );
}

/// Upstream's labels for a command's decision counters.
pub(crate) fn decision_labels(cmd: &Command) -> DecisionLabels {
    DecisionLabels {
        decision: cmd.decision().into(),
        reason: cmd.method.reason().as_str().to_lowercase(),
        consolidation_type: cmd.method.consolidation_type().into(),
    }
}

/// Count a command as decided once it is under way (candidates marked, replacements created),
/// as upstream does: a command rolled back later still counts.
pub(crate) fn count_started(shared: &Shared, cmd: &Command) {
    let labels = decision_labels(cmd);
    let m = &shared.metrics;
    m.disruption_decisions.get_or_create(&labels).inc();
    let mut pools: Vec<&str> = cmd.candidates.iter().map(|c| c.nodepool.as_str()).collect();
    pools.sort_unstable();
    pools.dedup();
    for pool in pools {
        m.disruption_decisions_by_nodepool
            .get_or_create(&PoolDecisionLabels {
                nodepool: pool.to_string(),
                decision: labels.decision.clone(),
                reason: labels.reason.clone(),
                consolidation_type: labels.consolidation_type.clone(),
            })
            .inc();
    }
}

/// The labels of a candidate a command deleted: the pool's consolidation policy only when the
/// method has a consolidation type (emptiness and consolidation; upstream's queue leaves it empty
/// for drift), the termination mode from the claim (`graceful` when the index no longer holds
/// it: no grace period known).
fn disrupted_labels(cmd: &Command, c: &Candidate, claim: Option<&NodeClaim>) -> DisruptedLabels {
    let consolidating = !cmd.method.consolidation_type().is_empty();
    DisruptedLabels {
        reason: cmd.method.reason().as_str().to_lowercase(),
        nodepool: c.nodepool.clone(),
        capacity_type: c.capacity_type.clone(),
        consolidation_policy: if consolidating {
            crate::metrics::consolidation_policy(c.policy).to_string()
        } else {
            String::new()
        },
        termination_mode: claim
            .map_or("graceful", crate::metrics::termination_mode)
            .to_string(),
    }
}

pub(crate) fn method_name(cmd: &Command) -> &'static str {
    match cmd.method {
        crate::disruption::Method::Repair => "repair",
        crate::disruption::Method::Emptiness => "emptiness",
        crate::disruption::Method::Drift => "drift",
        crate::disruption::Method::MultiNodeConsolidation => "multi-node consolidation",
        crate::disruption::Method::SingleNodeConsolidation => "single-node consolidation",
    }
}

/// The reschedulable pods on the claim's Node as the indexes hold them now, before its drain
/// starts (upstream lists them at the same moment); 0 without a Node.
pub(crate) fn reschedulable_pods(shared: &Shared, claim: &NodeClaim) -> u64 {
    claim
        .status
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .map_or(0, |node| {
            shared.state.pods.read().reschedulable_on_node(node) as u64
        })
}

/// Expiration is forceful: the claim goes whatever the budgets say (its drain still honours
/// PodDisruptionBudgets and do-not-disrupt until its terminationGracePeriod).
pub(crate) async fn expire(shared: &Shared, claim: &NodeClaim) -> Result<(), Error> {
    let name = claim.name_any();
    match claims(shared).delete(&name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(api_err(&shared.metrics, "delete", "nodeclaims", &name)(e)),
    }
    let nodepool = claim
        .labels()
        .get(NODEPOOL_LABEL)
        .cloned()
        .unwrap_or_default();
    let labels = DisruptedLabels::of("expired", nodepool, claim, None);
    shared
        .metrics
        .nodeclaims_disrupted
        .get_or_create(&labels)
        .inc();
    shared
        .metrics
        .pods_disruption_initiated
        .get_or_create(&labels)
        .inc_by(reschedulable_pods(shared, claim));
    let after = claim
        .spec
        .expire_after
        .and_then(|d| d.duration())
        .map(crate::api::duration::format)
        .unwrap_or_default();
    shared.events.normal(
        claim.object_ref(&()),
        "Expired",
        format!("NodeClaim {name} expired (expireAfter {after}); deleting it"),
    );
    Ok(())
}
