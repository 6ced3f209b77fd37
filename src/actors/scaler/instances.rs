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
//!
//! A handed-back instance is capacity already paid for, so the next claim that waits on the pool
//! takes it back before any replica is raised (every instance of a pool is the same offering):
//! the claim's instance annotation first (the durable truth, as for any bind), then one write
//! that strikes the instance from the handed-back list and counts it as ours again. A handed-back
//! instance held by a live claim is "taken back" until that write lands; the planner counts it as
//! ours meanwhile, and no replica write goes out while a take-back bind is still unseen, so a
//! restart anywhere in between counts it once. Only an instance whose Node was let go (see
//! termination) and is Ready is taken: one that never joined is left to the pool's own scale-down.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, PatchParams};

use super::Scaler;
use super::patches::handed_back;
use super::plan::MachineView;
use super::take_back::{InstanceSide, TakeBack, free_to_take, let_go};
use crate::actors::patch::JsonPatch;
use crate::actors::{Error, api_err};
use crate::api::nodeclaim::NodeClaim;
use crate::api::wellknown::{
    HANDED_BACK_NODE_ANNOTATION, INSTANCE_ANNOTATION, UNREGISTERED_TAINT_KEY,
};
use crate::capi::model::MachineDeployment;
use crate::metrics::Metrics;
use crate::state::claims::recorded_instance;

impl Scaler {
    /// The pool's instances as the planner's Machines, oldest first; how many listed instances
    /// were handed back (baseline the views leave out); and which of those are taken back.
    pub(super) fn instance_views(&mut self, md: &MachineDeployment) -> InstanceSide {
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
        let live_holder = |pid: &str| {
            held.get(pid).filter(|c| {
                claims
                    .get(c)
                    .is_some_and(|c| c.metadata.deletion_timestamp.is_none())
            })
        };
        let nodes = self.shared.state.nodes.read();
        let mut seen = HashSet::new();
        let mut side = InstanceSide {
            views: Vec::new(),
            set_aside: 0,
            take_back: TakeBack::default(),
            unsettled: Vec::new(),
        };
        let mut views: Vec<(Option<jiff::Timestamp>, usize, MachineView)> = Vec::new();
        for (i, pid) in md.provider_id_list.iter().enumerate() {
            if !seen.insert(pid.as_str()) {
                continue;
            }
            let holder = if back.contains(pid) {
                let taken = match (live_holder(pid), self.binding.get(pid)) {
                    (Some(c), _) => {
                        side.take_back.held.push(pid.clone());
                        Some(c.clone())
                    }
                    (None, Some(c)) => {
                        side.take_back.in_flight += 1;
                        Some(c.clone())
                    }
                    (None, None) => None,
                };
                if taken.is_none() {
                    side.set_aside += 1;
                    let node = nodes.compact_by_provider_id(pid);
                    if held.contains_key(pid) {
                        // Its deleted claim is still letting it go.
                    } else if free_to_take(node) {
                        side.take_back.free.push(pid.clone());
                    } else if node.is_some_and(|n| !n.deleting() && !let_go(n)) {
                        side.unsettled.extend(nodes.by_provider_id(pid));
                    }
                    continue;
                }
                taken
            } else {
                held.get(pid).or_else(|| self.binding.get(pid)).cloned()
            };
            let created = nodes
                .by_provider_id(pid)
                .and_then(|n| n.metadata.creation_timestamp.as_ref().map(|t| t.0));
            let view = MachineView {
                key: pid.clone(),
                marked: holder.is_some() && self.handing_back.contains(pid),
                bound_to: holder,
                replaced: false,
            };
            views.push((created, i, view));
        }
        // Instances with a Node, oldest Node first; those without one yet are the newest.
        views.sort_by_key(|(created, i, _)| (created.is_none(), *created, *i));
        side.views = views.into_iter().map(|(_, _, v)| v).collect();
        side
    }

    /// The handed-back instances still running (the baseline the views leave out), and what
    /// they cost at the pool's price, for operators to see capacity paid for and unused.
    pub(super) fn report_handed_back(&self, running: i32) {
        let md = Metrics::md(&self.md);
        let m = &self.shared.metrics;
        m.handed_back_instances
            .get_or_create(&md)
            .set(i64::from(running));
        let price = self
            .shared
            .catalog
            .offering(&self.md)
            .map_or(0.0, |o| o.price);
        m.handed_back_price
            .get_or_create(&md)
            .set(f64::from(running) * price);
    }

    /// Nodes of handed-back instances that joined after their claim was gone (deleted before
    /// registration): the kubelet registered them with `karpenter.sh/unregistered:NoExecute`,
    /// and nothing else would ever lift it. Left to the pool as termination leaves the others:
    /// cordoned, the taint lifted, marked free to take. A failed patch is retried at the next
    /// plan (the Node still lacks the mark).
    pub(super) fn settle_handed_back_nodes(
        &mut self,
        nodes: Vec<Arc<Node>>,
        ctx: &mut Context<Self>,
    ) {
        for node in nodes {
            let name = node.name_any();
            if !self.settling.insert(name.clone()) {
                continue;
            }
            let mut p = JsonPatch::guarded(node.resource_version().as_deref());
            let taints: Vec<_> = (node.spec.as_ref().and_then(|s| s.taints.as_ref()))
                .into_iter()
                .flatten()
                .filter(|t| t.key != UNREGISTERED_TAINT_KEY)
                .collect();
            p.set("/spec/taints", serde_json::json!(taints));
            p.set("/spec/unschedulable", serde_json::json!(true));
            p.set_entry(
                !node.annotations().is_empty(),
                "/metadata/annotations",
                HANDED_BACK_NODE_ANNOTATION,
                "",
            );
            let shared = self.shared.clone();
            let n = name.clone();
            let fut = async move {
                let patch = p.into_patch().map_err(|source| Error::Patch {
                    kind: "Node",
                    name: n.clone(),
                    source,
                })?;
                Api::<Node>::all(shared.workload.clone())
                    .patch(&n, &PatchParams::default(), &patch)
                    .await
                    .map_err(api_err(&shared.metrics, "patch", "nodes", &n))
            };
            ctx.spawn(fut.into_actor(self).map(move |r, act, _| {
                act.settling.remove(&name);
                match r {
                    Ok(_) => tracing::info!(node = %name, pool = %act.md, "the Node of a handed-back instance joined after its claim was gone: cordoned and its unregistered taint lifted"),
                    Err(e) => tracing::debug!(node = %name, error = %e, "settling a handed-back instance's Node failed; retried at the next plan"),
                }
            }));
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
            shared
                .api::<NodeClaim>()
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
            shared
                .api::<NodeClaim>()
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
    use crate::api::wellknown::HANDED_BACK_ANNOTATION;

    /// A pool without MachinePool Machines listing instances `a` and `b`, with `back` handed back.
    fn pool_listing_a_and_b(back: &str) -> MachineDeployment {
        let v = serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
            "metadata": {"name": "mp", "namespace": "ns", "uid": "u", "resourceVersion": "1",
                         "annotations": {HANDED_BACK_ANNOTATION: back}},
            "spec": {"clusterName": "c", "replicas": 2, "providerIDList": ["a", "b"],
                     "template": {"spec": {"infrastructureRef": {
                         "apiGroup": "infrastructure.cluster.x-k8s.io",
                         "kind": "DevMachinePool", "name": "mp"}}}},
        });
        MachineDeployment::from_pool_value(&v, crate::capi::version::CapiVersion::V1Beta2)
            .expect("a pool")
    }

    #[test]
    fn a_taken_back_instance_leaves_the_hand_back_list() {
        let md = pool_listing_a_and_b("a,b");
        assert_eq!(handed_back_value(&md, &[], &["a".into()]), "b");
    }

    #[test]
    fn the_hand_back_list_keeps_only_listed_instances() {
        let md = pool_listing_a_and_b("gone,a");
        assert_eq!(handed_back_value(&md, &["b".into()], &[]), "a,b");
    }
}
