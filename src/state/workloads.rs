//! Services, ReplicaSets, StatefulSets and ReplicationControllers reduced to their selectors:
//! what default topology spread constraints deduce a pod's selector from
//! (`scheduling::default_spread`). Kept only while `--scheduler-config` sets default
//! constraints. Behind an `Arc` so a snapshot shares it; a change copies it only while a solve
//! still holds the old one.

use std::sync::Arc;

use crate::scheduling::default_spread::Workloads;

/// Which watch a re-list came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Services = 0,
    ReplicaSets = 1,
    StatefulSets = 2,
    ReplicationControllers = 3,
}

#[derive(Default)]
pub struct WorkloadIndex {
    selectors: Arc<Workloads>,
    listed: [bool; 4],
}

impl WorkloadIndex {
    /// The selectors as they are now, shared.
    pub fn selectors(&self) -> Arc<Workloads> {
        self.selectors.clone()
    }

    pub(crate) fn edit(&mut self) -> &mut Workloads {
        Arc::make_mut(&mut self.selectors)
    }

    pub(crate) fn synced(&self) -> bool {
        self.listed.iter().all(|l| *l)
    }

    /// Whether this kind has been listed once.
    pub(crate) fn listed(&self, kind: Kind) -> bool {
        self.listed[kind as usize]
    }

    pub(crate) fn mark_listed(&mut self, kind: Kind) {
        self.listed[kind as usize] = true;
    }
}
