//! Existing and in-flight nodes: what room they have and whether a pod may go there.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Taint;

use super::{Ctx, Solver, fits, ports_conflict};
use crate::api::resources::Resources;
use crate::api::wellknown::{
    EPHEMERAL_TAINT_KEYS, HOSTNAME_LABEL, INITIALIZED_LABEL, REGISTERED_LABEL,
};
use crate::scheduling::ExistingNode;
use crate::scheduling::amounts::Amounts;
use crate::scheduling::pod::PodInfo;
use crate::scheduling::selector::untolerated;
use crate::scheduling::topology::{Domains, Place, Source};

/// An existing or in-flight node.
pub(super) struct Node<'a> {
    pub(super) input: &'a ExistingNode,
    pub(super) free: Amounts,
    pub(super) taints: Vec<Taint>,
    pub(super) host_ports: Vec<(i32, String)>,
}

/// The taints a pod must tolerate on an existing node. Ephemeral ones (not-ready,
/// unregistered...) count only once the node is initialized: before, they are the node
/// coming up; after, they mean it went bad and pods should not be promised to it.
pub(super) fn node_taints(node: &ExistingNode) -> Vec<Taint> {
    if node.initialized() {
        return node.taints.clone();
    }
    node.taints
        .iter()
        .filter(|t| !EPHEMERAL_TAINT_KEYS.contains(&t.key.as_str()))
        .cloned()
        .collect()
}

impl<'a> Solver<'a> {
    pub(super) fn try_nodes(&mut self, ctx: &Ctx) -> Option<String> {
        let range = match self.only {
            Some(ni) => ni..ni + 1,
            None => 0..self.nodes.len(),
        };
        for ni in range {
            let node = &self.nodes[ni];
            if self.under_consolidate_after.contains(&node.input.name)
                && self.moved.contains(&ctx.pod.key)
            {
                continue;
            }
            if !fits(&ctx.prep.amounts, &node.free)
                || untolerated(&ctx.pod.tolerations, &node.taints, ctx.prefer_blocks).is_some()
                || ports_conflict(&node.host_ports, &ctx.pod.host_ports)
                || !self.volumes_fit(&node.input.name, &ctx.pod.key)
            {
                continue;
            }
            let place = Place::Node {
                labels: &node.input.labels,
                hostname: &node.input.name,
            };
            let admitted = ctx.alternatives().any(|ctx| {
                ctx.reqs.matches_labels(&node.input.labels) && self.admit(&ctx, &place).is_ok()
            });
            if !admitted {
                continue;
            }
            let input = self.nodes[ni].input;
            self.add_volumes(&input.name, &ctx.pod.key);
            let node = &mut self.nodes[ni];
            node.free.sub_assign(&ctx.prep.amounts);
            node.host_ports.extend(ctx.pod.host_ports.iter().cloned());
            let input = node.input;
            self.topology.record(
                &ctx.prep.matched,
                ctx.owned,
                |k, _| Domains::from_one(node_domain(input, k)),
                node_source(input),
            );
            return Some(input.name.clone());
        }
        None
    }

    fn volumes_fit(&self, node: &str, pod: &str) -> bool {
        let Some((usage, pods)) = &self.volumes else {
            return true;
        };
        match (usage.get(node), pods.get(pod)) {
            (Some(u), Some(v)) => u.fits(v),
            _ => true,
        }
    }

    fn add_volumes(&mut self, node: &str, pod: &str) {
        if let Some((usage, pods)) = &mut self.volumes
            && let (Some(u), Some(v)) = (usage.get_mut(node), pods.get(pod))
        {
            u.add(v);
        }
    }
}

/// The labels (`true`) every Karpenter node gets once registered and initialized, which a
/// DaemonSet may wait for.
pub(super) const LABELS_TO_COME: [&str; 2] = [REGISTERED_LABEL, INITIALIZED_LABEL];

/// What the DaemonSets that run on node `n` still have to place there (upstream's remaining
/// daemon resources): their requests less those of their pods already on it, never below zero
/// (a DaemonSet may have placed a pod nobody expected, after a label appeared).
pub(super) fn daemons_to_come(
    n: &ExistingNode,
    taints: &[Taint],
    daemons: &[PodInfo],
) -> Resources {
    if daemons.is_empty() {
        return Resources::new();
    }
    // A node still coming up gets those labels before long: DaemonSets waiting for them are to
    // come too (as a new claim's overhead counts them).
    let labels = if n.initialized() {
        Cow::Borrowed(&n.labels)
    } else {
        let mut l = n.labels.clone();
        for key in LABELS_TO_COME {
            l.entry(key.to_string())
                .or_insert_with(|| "true".to_string());
        }
        Cow::Owned(l)
    };
    let mut total = Resources::new();
    for d in daemons {
        if untolerated(&d.tolerations, taints, false).is_none()
            && d.node_terms.iter().any(|t| t.matches_labels(&labels))
        {
            total.add_assign(&d.requests);
        }
    }
    let mut left = total.sub(&n.daemon_requested);
    left.0.retain(|_, q| !q.is_negative() && !q.is_zero());
    left
}

/// An existing node as a spread's node filter sees it.
pub(super) fn node_source(node: &ExistingNode) -> Source<'_> {
    Source::Node {
        labels: &node.labels,
        taints: &node.taints,
    }
}

pub(super) fn node_domain<'n>(node: &'n ExistingNode, key: &str) -> Option<&'n str> {
    if key == HOSTNAME_LABEL {
        return Some(
            node.labels
                .get(key)
                .map(String::as_str)
                .unwrap_or(node.name.as_str()),
        );
    }
    node.labels.get(key).map(String::as_str)
}
