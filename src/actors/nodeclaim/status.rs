//! The claim's writes: its conditions and status (guarded by the resourceVersion they were
//! computed from), patches of the claim and its Node, and the claim's deletion.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PatchParams};
use serde_json::Value;

use super::Step;
use crate::actors::patch::JsonPatch;
use crate::actors::{Error, api_err};
use crate::api::conditions::{self, ConditionStatus};
use crate::api::nodeclaim::NodeClaim;

impl Step {
    /// Edit the status, set conditions `types` True in order (and the root `Ready`), write it
    /// guarded.
    pub(super) async fn conditions_true(
        &self,
        types: &[&str],
        edit: impl FnOnce(&mut crate::api::nodeclaim::NodeClaimStatus),
    ) -> Result<Arc<NodeClaim>, Error> {
        let c = &self.claim;
        let now = Timestamp::now();
        let mut status = c.status.clone().unwrap_or_default();
        edit(&mut status);
        let mut conds = status.conditions.take().unwrap_or_default();
        for type_ in types {
            conditions::set(
                &mut conds,
                type_,
                ConditionStatus::True,
                type_,
                "",
                c.metadata.generation,
                now,
            );
        }
        conditions::set_nodeclaim_ready(&mut conds, c.metadata.generation, now);
        status.conditions = Some(conds);
        self.patch_status(serde_json::to_value(&status).unwrap_or(Value::Null))
            .await
    }

    /// Set these conditions (status, reason, message); one guarded status write when any of them
    /// changes, None when none did.
    pub(super) async fn set_conditions(
        &self,
        wanted: &[(&str, ConditionStatus, &str, &str)],
    ) -> Result<Option<Arc<NodeClaim>>, Error> {
        let c = &self.claim;
        let now = Timestamp::now();
        let mut status = c.status.clone().unwrap_or_default();
        let mut conds = status.conditions.take().unwrap_or_default();
        let mut changed = false;
        for (type_, st, reason, message) in wanted {
            changed |= conditions::set(
                &mut conds,
                type_,
                *st,
                reason,
                message,
                c.metadata.generation,
                now,
            );
        }
        if !changed {
            return Ok(None);
        }
        status.conditions = Some(conds);
        self.patch_status(serde_json::to_value(&status).unwrap_or(Value::Null))
            .await
            .map(Some)
    }

    pub(super) async fn patch_node(&self, name: &str, p: JsonPatch) -> Result<(), Error> {
        let api: Api<Node> = Api::all(self.shared.workload.clone());
        let patch = p.into_patch().map_err(|source| Error::Patch {
            kind: "Node",
            name: name.to_string(),
            source,
        })?;
        let updated = api
            .patch(name, &PatchParams::default(), &patch)
            .await
            .map_err(api_err(&self.shared.metrics, "patch", "nodes", name))?;
        self.shared.state.nodes.write().apply_response(updated);
        Ok(())
    }

    /// Deletes the claim, ordered against a disruption command's budget check (`gate`).
    pub(super) async fn delete_claim(&self) -> Result<(), Error> {
        let name = self.name();
        let _gate = self.shared.deletion_gate.hold("deleting a NodeClaim").await;
        match self.api().delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(api_err(&self.shared.metrics, "delete", "nodeclaims", &name)(e)),
        }
    }

    pub(super) async fn patch_claim(
        &self,
        p: JsonPatch,
        status: bool,
    ) -> Result<Arc<NodeClaim>, Error> {
        let name = self.name();
        let patch = p.into_patch().map_err(|source| Error::Patch {
            kind: "NodeClaim",
            name: name.clone(),
            source,
        })?;
        let api = self.api();
        let r = if status {
            api.patch_status(&name, &PatchParams::default(), &patch)
                .await
        } else {
            api.patch(&name, &PatchParams::default(), &patch).await
        };
        r.map(Arc::new)
            .map_err(api_err(&self.shared.metrics, "patch", "nodeclaims", &name))
    }

    /// Replace the status, guarded by the resourceVersion we computed it from.
    pub(super) async fn patch_status(&self, status: Value) -> Result<Arc<NodeClaim>, Error> {
        let mut p = JsonPatch::guarded(self.claim.resource_version().as_deref());
        p.set("/status", status);
        self.patch_claim(p, true).await
    }
}
