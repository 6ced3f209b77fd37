//! The drain's last step: waiting for the node's VolumeAttachments to go, except those of volumes
//! that pods which are not drained still use (read through their PersistentVolumeClaims).

use std::collections::HashSet;
use std::time::Instant;

use actix::prelude::*;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::Api;
use kube::{Resource, ResourceExt};

use super::{DrainState, Terminator, drain};

impl Terminator {
    /// After the pods: wait for the node's VolumeAttachments to go, except those of volumes that
    /// pods which are not drained still use, and not past the deadline.
    pub(super) fn volumes(
        &mut self,
        node_name: &str,
        pods: &[Pod],
        deadline: Option<jiff::Timestamp>,
        now: jiff::Timestamp,
        ctx: &mut Context<Self>,
    ) -> DrainState {
        let attachments = self
            .shared
            .state
            .volume_attachments
            .read()
            .on_node(node_name);
        let Some(entry) = self.nodes.get_mut(node_name) else {
            return DrainState::Done {
                volumes_detached: true,
            };
        };
        let with_volume: Vec<String> = attachments
            .iter()
            .filter_map(|a| a.persistent_volume.clone())
            .collect();
        let pending: Vec<String> = if with_volume.is_empty() {
            Vec::new()
        } else {
            let Some(ignored) = &entry.ignored_volumes else {
                if !entry.lookup_in_flight {
                    entry.lookup_in_flight = true;
                    self.look_up_ignored_volumes(node_name, pods, ctx);
                }
                return DrainState::AwaitingVolumes {
                    attachments: with_volume.len(),
                };
            };
            with_volume
                .into_iter()
                .filter(|pv| !ignored.contains(pv))
                .collect()
        };
        let past_deadline = deadline.is_some_and(|d| now >= d);
        let state = if pending.is_empty() {
            DrainState::Done {
                volumes_detached: true,
            }
        } else if past_deadline {
            DrainState::Done {
                volumes_detached: false,
            }
        } else {
            if !entry.awaiting_reported {
                entry.awaiting_reported = true;
                if let Some(node) = self.shared.state.nodes.read().get(node_name) {
                    self.shared.events.normal(
                        node.object_ref(&()),
                        "AwaitingVolumeDetachment",
                        format!(
                            "Awaiting deletion of {} VolumeAttachment(s) bound to node {node_name}",
                            pending.len()
                        ),
                    );
                }
            }
            // Attachment changes arrive by watch; the deadline needs a timer.
            if let Some(d) = deadline {
                let at = Instant::now() + now.duration_until(d).unsigned_abs();
                self.wake(node_name, at, ctx);
            }
            return DrainState::AwaitingVolumes {
                attachments: pending.len(),
            };
        };
        if let DrainState::Done { volumes_detached } = state
            && let Some(e) = self.nodes.get_mut(node_name)
            && e.done.is_none()
        {
            e.done = Some(volumes_detached);
            self.shared.router.kick_claim(&e.claim);
        }
        state
    }

    /// The PersistentVolumes behind the claims of pods that are not drained (through each
    /// PersistentVolumeClaim's `spec.volumeName`).
    fn look_up_ignored_volumes(&mut self, node_name: &str, pods: &[Pod], ctx: &mut Context<Self>) {
        let now = jiff::Timestamp::now();
        let claims: Vec<(String, String)> = pods
            .iter()
            .filter(|p| !drain::must_leave(p, now))
            .flat_map(|p| {
                let ns = p.namespace().unwrap_or_default();
                p.spec
                    .iter()
                    .flat_map(|s| s.volumes.iter().flatten())
                    .filter_map(|v| v.persistent_volume_claim.as_ref())
                    .map(move |c| (ns.clone(), c.claim_name.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let client = self.shared.workload.clone();
        let node = node_name.to_string();
        let fut = async move {
            let mut volumes = HashSet::new();
            for (ns, name) in claims {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
                match api.get_opt(&name).await {
                    Ok(Some(pvc)) => volumes.extend(pvc.spec.and_then(|s| s.volume_name)),
                    Ok(None) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(volumes)
        };
        ctx.spawn(fut.into_actor(self).map(move |result, act, ctx| {
            let Some(e) = act.nodes.get_mut(&node) else {
                return;
            };
            e.lookup_in_flight = false;
            match result {
                Ok(v) => {
                    e.ignored_volumes = Some(v);
                    act.retry.reset();
                }
                Err(err) => {
                    tracing::warn!(node = %node, error = %err, "reading PersistentVolumeClaims failed; retrying");
                    let at = Instant::now() + act.retry.next_delay();
                    act.wake(&node, at, ctx);
                    return;
                }
            }
            act.step(&node, ctx);
        }));
    }
}
