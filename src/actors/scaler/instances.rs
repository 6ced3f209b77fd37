//! A Scaler of a MachinePool without MachinePool Machines (offered for scale-up only): its
//! instances are the provider IDs in `spec.providerIDList`, and no Machine exists to carry a
//! binding, so the claim carries it (`karpenter.cluster.x-k8s.io/instance`), written by this
//! Scaler alone, guarded by the claim's resourceVersion, before the claim is told.
//!
//! The planner sees each listed instance as a Machine: bound when a claim (or a bind in flight)
//! holds it, ours when it is among the newest unbound beyond the baseline (instances without a
//! Node yet are the newest, then by their Node's age). Instances this controller handed back
//! (see below) are the pool's baseline, never bound again.
//!
//! No specific instance can be removed: lowering replicas lets the cloud choose which one goes.
//! A deleted claim's instance is therefore handed back instead: one compare-and-swap write lowers
//! the managed count and records the provider ID in `karpenter.cluster.x-k8s.io/handed-back-
//! instances`, leaving `spec.replicas` alone. The two land together, so a restart on either
//! side of it counts the instance exactly once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use kube::ResourceExt;
use kube::api::{Api, PatchParams};

use super::Scaler;
use super::patches::handed_back;
use super::plan::{MachineView, Plan};
use crate::actors::patch::JsonPatch;
use crate::actors::{Error, api_err};
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::INSTANCE_ANNOTATION;
use crate::capi::model::MachineDeployment;
use crate::state::claims::recorded_instance;

impl Scaler {
    /// The pool's instances as the planner's Machines, oldest first, and how many listed
    /// instances were handed back (baseline the views leave out).
    pub(super) fn instance_views(&mut self, md: &MachineDeployment) -> (Vec<MachineView>, i32) {
        let back = handed_back(md);
        let claims = self.shared.state.claims.read();
        let empty = HashMap::new();
        let held = claims.instances_of(&self.md).unwrap_or(&empty);
        // A bind stays in flight until the index shows it (or the claim is gone).
        self.binding.retain(|pid, claim| {
            held.get(pid) != Some(claim)
                && claims
                    .get(claim)
                    .is_some_and(|c| recorded_instance(&c).is_none())
        });
        self.handing_back.retain(|pid| !back.contains(pid));
        let nodes = self.shared.state.nodes.read();
        let mut seen = HashSet::new();
        let set_aside = md
            .provider_id_list
            .iter()
            .filter(|p| back.contains(*p))
            .collect::<HashSet<_>>()
            .len() as i32;
        let mut views: Vec<(Option<jiff::Timestamp>, usize, MachineView)> = md
            .provider_id_list
            .iter()
            .enumerate()
            .filter(|(_, pid)| !back.contains(*pid) && seen.insert(pid.as_str()))
            .map(|(i, pid)| {
                let created = nodes
                    .by_provider_id(pid)
                    .and_then(|n| n.metadata.creation_timestamp.as_ref().map(|t| t.0));
                let bound_to = held.get(pid).or_else(|| self.binding.get(pid)).cloned();
                let view = MachineView {
                    key: pid.clone(),
                    marked: bound_to.is_some() && self.handing_back.contains(pid),
                    bound_to,
                    replaced: false,
                };
                (created, i, view)
            })
            .collect();
        // Instances with a Node, oldest Node first; those without one yet are the newest.
        views.sort_by_key(|(created, i, _)| (created.is_none(), *created, *i));
        (views.into_iter().map(|(_, _, v)| v).collect(), set_aside)
    }

    /// The plan, as a pool that cannot remove an instance carries it out: nothing released (no
    /// spare can be removed by name), and a decrement becomes a hand-back that keeps the replica.
    pub(super) fn instance_plan(plan: &mut Plan) {
        plan.release.clear();
        let direct = std::mem::take(&mut plan.delete_directly);
        if let Some(w) = plan.write.as_mut()
            && (!w.decrements.is_empty() || !direct.is_empty())
        {
            w.to = w.from;
            w.handed_back = std::mem::take(&mut w.decrements);
            w.handed_back.extend(direct);
        }
    }

    /// Bind a pool instance to a claim: its provider ID on the claim, guarded by the claim's
    /// resourceVersion; the bind stays in flight (the instance reserved) until the index shows
    /// it or a read proves it did not land, so no instance is ever given to two claims.
    pub(super) fn bind_instance(&mut self, claim: String, pid: String, ctx: &mut Context<Self>) {
        if self.binding.contains_key(&pid) {
            return;
        }
        let Some(c) = self.shared.state.claims.read().get(&claim) else {
            return;
        };
        if recorded_instance(&c).is_some() || c.metadata.deletion_timestamp.is_some() {
            return;
        }
        self.binding.insert(pid.clone(), claim.clone());
        let asked_at = self
            .asked
            .iter()
            .find(|(n, _)| n == &claim)
            .map(|(_, t)| *t);
        self.asked.retain(|(n, _)| n != &claim);
        let shared = self.shared.clone();
        let mut p = JsonPatch::guarded(c.resource_version().as_deref());
        p.set_entry(
            !c.annotations().is_empty(),
            "/metadata/annotations",
            INSTANCE_ANNOTATION,
            &pid,
        );
        let name = claim.clone();
        let fut = async move {
            let patch = p.into_patch().map_err(|source| Error::Patch {
                kind: "NodeClaim",
                name: name.clone(),
                source,
            })?;
            Api::<NodeClaim>::all(shared.workload.clone())
                .patch(&name, &PatchParams::default(), &patch)
                .await
                .map_err(api_err(&shared.metrics, "patch", "nodeclaims", &name))
        };
        let shared = self.shared.clone();
        let deadline = self.deadline();
        let what = format!("binding instance {pid} to NodeClaim {claim}");
        let fut = async move { super::writes::bounded(&shared, deadline, what, fut).await };
        ctx.spawn(fut.into_actor(self).map(move |r, act, ctx| {
            match r {
                Ok(updated) => {
                    act.backoff.reset();
                    act.claim_read(updated);
                    act.bound(&claim, pid, asked_at);
                }
                Err(e) if e.is_conflict() || e.is_not_found() => {
                    act.binding.remove(&pid);
                    act.asked
                        .push_front((claim.clone(), asked_at.unwrap_or_else(Instant::now)));
                    act.confirm_instance(claim, pid, asked_at, ctx);
                    return;
                }
                Err(e) => {
                    tracing::warn!(nodeclaim = %claim, instance = %pid, error = %e, "binding failed or unknown; reading the NodeClaim back");
                    act.confirm_instance(claim, pid, asked_at, ctx);
                    return;
                }
            }
            act.replan(ctx);
        }));
    }

    /// Read the claim back after a bind that conflicted or whose answer was lost. While the
    /// instance is in `binding` it stays reserved for this claim.
    fn confirm_instance(
        &mut self,
        claim: String,
        pid: String,
        asked_at: Option<Instant>,
        ctx: &mut Context<Self>,
    ) {
        let shared = self.shared.clone();
        let name = claim.clone();
        let read = async move {
            Api::<NodeClaim>::all(shared.workload.clone())
                .get_opt(&name)
                .await
                .map_err(api_err(&shared.metrics, "get", "nodeclaims", &name))
        };
        ctx.spawn(read.into_actor(self).map(move |r, act, ctx| match r {
            Ok(Some(c)) => {
                let landed = recorded_instance(&c) == Some(pid.as_str());
                act.claim_read(c);
                if landed {
                    act.backoff.reset();
                    act.asked.retain(|(n, _)| n != &claim);
                    act.bound(&claim, pid, asked_at);
                } else if act.binding.get(&pid) == Some(&claim) {
                    act.binding.remove(&pid);
                    act.asked
                        .push_front((claim, asked_at.unwrap_or_else(Instant::now)));
                }
                act.replan(ctx);
            }
            Ok(None) => {
                act.binding.remove(&pid);
                act.shared.state.claims.write().remove(&claim);
                act.replan(ctx);
            }
            Err(e) => {
                let d = act.backoff.next_delay_after(e.retry_after());
                tracing::warn!(nodeclaim = %claim, error = %e, retry_in = ?d, "reading the NodeClaim back failed");
                ctx.run_later(d, move |act, ctx| {
                    act.confirm_instance(claim, pid, asked_at, ctx)
                });
            }
        }));
    }

    /// A hand-back landed: its claims may finish now.
    pub(super) fn handed_back_written(&mut self, pids: &[String]) {
        let holders: Vec<String> = {
            let claims = self.shared.state.claims.read();
            let Some(held) = claims.instances_of(&self.md) else {
                return;
            };
            pids.iter().filter_map(|p| held.get(p).cloned()).collect()
        };
        for claim in holders {
            self.shared.router.kick_claim(&claim);
        }
    }

    fn claim_read(&mut self, c: NodeClaim) {
        self.shared
            .state
            .claims
            .write()
            .apply_response(crate::state::claims::trimmed(Arc::new(c)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::scaler::patches::handed_back_value;
    use crate::actors::scaler::plan::{ReplicaWrite, plan};
    use crate::api::wellknown::HANDED_BACK_ANNOTATION;

    #[test]
    fn a_decrement_becomes_a_hand_back_that_keeps_the_replica() {
        let mut p = Plan {
            write: Some(ReplicaWrite {
                from: 3,
                to: 2,
                managed_from: 3,
                managed_to: 1,
                decrements: vec!["p1".into()],
                handed_back: Vec::new(),
            }),
            delete_directly: vec!["p2".into()],
            release: vec!["p3".into()],
            ..Plan::default()
        };
        Scaler::instance_plan(&mut p);
        let w = p.write.expect("a write");
        assert_eq!((w.from, w.to, w.managed_to), (3, 3, 1));
        assert_eq!(w.handed_back, vec!["p1".to_string(), "p2".to_string()]);
        assert!(w.decrements.is_empty() && p.release.is_empty() && p.delete_directly.is_empty());
    }

    #[test]
    fn a_scale_up_stays_a_scale_up() {
        let w = vec!["a".to_string()];
        let mut p = plan(&crate::actors::scaler::plan::Snapshot {
            spec_replicas: 1,
            managed: 0,
            min_size: 0,
            max_size: None,
            set_aside: 0,
            machines: &[],
            waiting: &w,
            rolling_out: false,
            unplaced: 0,
        });
        Scaler::instance_plan(&mut p);
        let w = p.write.expect("a write");
        assert_eq!((w.from, w.to, w.managed_to), (1, 2, 1));
        assert!(w.handed_back.is_empty());
    }

    #[test]
    fn the_hand_back_list_keeps_only_listed_instances() {
        let v = serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
            "metadata": {"name": "mp", "namespace": "ns", "uid": "u", "resourceVersion": "1",
                         "annotations": {HANDED_BACK_ANNOTATION: "gone,a"}},
            "spec": {"clusterName": "c", "replicas": 2, "providerIDList": ["a", "b"],
                     "template": {"spec": {"infrastructureRef": {
                         "apiGroup": "infrastructure.cluster.x-k8s.io",
                         "kind": "DevMachinePool", "name": "mp"}}}},
        });
        let md = MachineDeployment::from_pool_value(&v, crate::capi::version::CapiVersion::V1Beta2)
            .expect("a pool");
        assert_eq!(handed_back_value(&md, &["b".into()]), "a,b");
    }
}
