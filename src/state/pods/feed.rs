//! The Pod watch's side of the index: what each change tells the provisioner, read off the
//! index as the change is applied (the pod's previous version is gone after), from
//! what the index keeps beside each pod: neither a change nor a re-list decodes a kept pod.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::{EventFacts, Pods, is_daemonset_pod, is_terminal, key, node_name};
use crate::state::feed::{Index, Listing};

/// A pod change, as the provisioner and the nodes' actors hear of it.
#[derive(Debug)]
pub(crate) enum PodChange {
    /// A pod was added or changed.
    Applied {
        key: String,
        /// The node it names, and the time of the event that node hears of (scheduled,
        /// terminating), if any.
        node: Option<(String, Option<Timestamp>)>,
        created: Option<Timestamp>,
        /// It names a node its previous version did not.
        newly_bound: bool,
        provisionable: bool,
    },
    /// A pod is gone.
    Deleted {
        key: String,
        node: Option<(String, Option<Timestamp>)>,
    },
    /// A re-list was swapped in: the events its pods' nodes missed while the watch was down.
    Relisted { events: Vec<(String, Timestamp)> },
}

/// A re-list is indexed (and so packed) as it arrives: a buffer of pods would hold the whole
/// cluster's pods unpacked until the list ends.
impl Listing<Pod> for Pods {
    fn push(&mut self, p: Pod) {
        self.apply(p);
    }
}

impl Index<Pod> for Pods {
    type Kept = Pod;
    type Listing = Pods;
    type Changed = PodChange;

    fn keep(p: Pod) -> Pod {
        p
    }

    fn apply(&mut self, p: Pod) -> PodChange {
        let key = key(&p);
        // The previous version as the index summed it up: a change decodes nothing kept.
        let old = self.events_of(&key).copied();
        let node = node_name(&p).map(|n| {
            let at = EventFacts::of(&p).event_time(old.as_ref(), Timestamp::now());
            (n.to_string(), at)
        });
        let newly_bound = node.is_some() && old.is_none_or(|old| !old.bound);
        let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let provisionable = Pods::apply(self, p);
        PodChange::Applied {
            key,
            node,
            created,
            newly_bound,
            provisionable,
        }
    }

    fn delete(&mut self, p: Pod) -> PodChange {
        let key = key(&p);
        self.remove(&key);
        // Gone without being seen terminating or terminal first: an event now.
        let counted = is_terminal(&p) || p.metadata.deletion_timestamp.is_some();
        let at = (!counted && !is_daemonset_pod(&p)).then(Timestamp::now);
        let node = node_name(&p).map(|n| (n.to_string(), at));
        PodChange::Deleted { key, node }
    }

    fn reset(&mut self, fresh: Pods) -> PodChange {
        // Pod events missed while the watch was down (scheduled, terminating).
        let now = Timestamp::now();
        let events = fresh.each_on_a_node(|key, node, facts| {
            let at = facts.event_time(self.events_of(key), now)?;
            Some((node.to_string(), at))
        });
        self.replace_with(fresh);
        PodChange::Relisted { events }
    }

    fn synced(&self) -> bool {
        Pods::synced(self)
    }
}
