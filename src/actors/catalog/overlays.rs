//! The Catalog's NodeOverlays (from `state::overlays`): their application to the catalogs
//! about to be published (as each NodePool sees them), and their status conditions.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;
use jiff::Timestamp;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Catalog, NodePoolsChanged, PoolsSeen};
use crate::actors::patch::write_conditions;
use crate::api::conditions::{self, ConditionStatus};
use crate::api::decode::Malformed;
use crate::api::nodeoverlay::{NodeOverlay, VALIDATION_SUCCEEDED};
use crate::api::nodepool::NodePool;
use crate::capi::offerings;
use crate::capi::overlay::Verdict;
use crate::view::catalog::{PoolCatalogs, apply_overlays};

impl Catalog {
    /// Applies the NodeOverlays to the catalogs about to be published (of the NodeClasses
    /// `names`), as each NodePool sees them, and writes each overlay's `ValidationSucceeded` and
    /// `Ready` conditions, with upstream's reasons (a valid one's once the NodePool list has
    /// synced: before, a conflict in some pool cannot be told). Returns the pools' own catalogs.
    pub(super) fn apply_overlays(
        &mut self,
        names: &[&str],
        resolved: &mut [(offerings::Catalog, Result<(), String>)],
        ctx: &mut Context<Self>,
    ) -> PoolCatalogs {
        // With the NodeOverlay gate off, overlays are ignored as upstream ignores them: nothing
        // re-priced, no status written.
        let overlays: Vec<Arc<NodeOverlay>> = if self.shared.settings.node_overlay {
            self.shared
                .state
                .overlays
                .read()
                .values()
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        let refs: Vec<&NodeOverlay> = overlays.iter().map(|o| o.as_ref()).collect();
        let (nodepools, seen) = self.pools_now();
        let pools_synced = seen.0;
        self.pools_seen = Some(seen);
        let catalogs: Vec<(&str, &mut offerings::Catalog)> = names
            .iter()
            .copied()
            .zip(resolved.iter_mut().map(|(c, _)| c))
            .collect();
        let (verdicts, by_pool) = apply_overlays(&refs, catalogs, &nodepools);
        for o in overlays.iter().filter(|_| pools_synced) {
            let verdict = verdicts
                .get(&o.name_any())
                .cloned()
                .unwrap_or(Verdict::Applied);
            self.write_overlay_status(
                &o.name_any(),
                o.conditions(),
                o.metadata.generation,
                &verdict,
                ctx,
            );
        }
        let bad: Vec<Malformed> = match self.shared.settings.node_overlay {
            true => {
                let index = self.shared.state.overlays.read();
                index.malformed().values().cloned().collect()
            }
            false => Vec::new(),
        };
        for m in bad {
            let current: Vec<conditions::Condition> = m
                .conditions
                .clone()
                .and_then(|c| serde_json::from_value(c).ok())
                .unwrap_or_default();
            let verdict = Verdict::Invalid(format!("cannot be read: {}", m.message()));
            let name = m.metadata.name.clone().unwrap_or_default();
            self.write_overlay_status(&name, &current, m.metadata.generation, &verdict, ctx);
        }
        by_pool
    }

    /// The NodePools now, and what overlays see of them.
    fn pools_now(&self) -> (Vec<Arc<NodePool>>, PoolsSeen) {
        let index = self.shared.state.nodepools.read();
        let pools: Vec<Arc<NodePool>> = index.values().cloned().collect();
        let seen = pools_seen(index.synced(), &pools);
        (pools, seen)
    }

    /// One overlay's conditions from its verdict; written (and a Warning Event sent) only when
    /// they change.
    fn write_overlay_status(
        &self,
        name: &str,
        current: &[conditions::Condition],
        generation: Option<i64>,
        verdict: &Verdict,
        ctx: &mut Context<Self>,
    ) {
        let now = Timestamp::now();
        let mut conds = current.to_vec();
        let (status, reason, message) = match verdict.failure() {
            None => (
                ConditionStatus::True,
                VALIDATION_SUCCEEDED.to_string(),
                String::new(),
            ),
            Some((reason, message)) => (ConditionStatus::False, reason.to_string(), message),
        };
        let mut changed = conditions::set(
            &mut conds,
            VALIDATION_SUCCEEDED,
            status,
            &reason,
            &message,
            generation,
            now,
        );
        changed |= conditions::set_root_ready(&mut conds, &[VALIDATION_SUCCEEDED], generation, now);
        if !changed {
            return;
        }
        if status == ConditionStatus::False {
            tracing::warn!(nodeoverlay = %name, reason = %reason, message = %message, "NodeOverlay not applied");
            let reference = k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some(NodeOverlay::api_version(&()).into_owned()),
                kind: Some(NodeOverlay::kind(&()).into_owned()),
                name: Some(name.to_string()),
                ..Default::default()
            };
            self.shared.events.warning(reference, &reason, message);
        }
        ctx.spawn(
            write_conditions::<NodeOverlay>(
                self.shared.client_for::<NodeOverlay>(),
                name.to_string(),
                json!(conds),
            )
            .into_actor(self),
        );
    }
}

impl Handler<NodePoolsChanged> for Catalog {
    type Result = ();
    fn handle(&mut self, _: NodePoolsChanged, ctx: &mut Self::Context) {
        if !self.synced() || self.shared.state.overlays.read().is_empty() {
            return;
        }
        let (_, now) = self.pools_now();
        if self.pools_seen.as_ref() != Some(&now) {
            // The prices a pool sees may change: consolidation looks again, as for an overlay.
            self.overlays_changed = true;
            self.schedule_rebuild(ctx);
        }
    }
}

/// What overlays see of `pools`, in a stable order.
fn pools_seen(synced: bool, pools: &[Arc<NodePool>]) -> PoolsSeen {
    let mut seen: Vec<(String, String, BTreeMap<String, String>)> = pools
        .iter()
        .map(|np| {
            let t = &np.spec.template;
            (
                np.name_any(),
                t.spec.node_class_ref.name.clone(),
                t.metadata
                    .as_ref()
                    .and_then(|m| m.labels.clone())
                    .unwrap_or_default(),
            )
        })
        .collect();
    seen.sort();
    (synced, seen)
}
