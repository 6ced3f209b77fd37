//! PodDisruptionBudgets by `namespace/name`, watched on every replica: the provisioner plans
//! only for the pods of a deleting node that can be evicted at all, and disruption reads which
//! pods a budget protects.

use std::sync::Arc;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;

use super::feed::Index;
use super::reschedulable::Pdbs;

#[derive(Default)]
pub(crate) struct PodDisruptionBudgets {
    by_key: Pdbs,
    listed: bool,
}

impl PodDisruptionBudgets {
    /// Every budget, by `namespace/name`.
    pub(crate) fn all(&self) -> &Pdbs {
        &self.by_key
    }

    /// The first list has completed.
    pub(crate) fn synced(&self) -> bool {
        self.listed
    }
}

fn key(p: &PodDisruptionBudget) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

impl Index<PodDisruptionBudget> for PodDisruptionBudgets {
    type Kept = Arc<PodDisruptionBudget>;
    type Listing = Vec<Self::Kept>;
    type Changed = ();

    fn keep(obj: PodDisruptionBudget) -> Self::Kept {
        Arc::new(obj)
    }

    fn apply(&mut self, p: Self::Kept) {
        self.by_key.insert(key(&p), p);
    }

    fn delete(&mut self, p: Self::Kept) {
        self.by_key.remove(&key(&p));
    }

    fn reset(&mut self, all: Vec<Self::Kept>) {
        self.by_key = all.into_iter().map(|p| (key(&p), p)).collect();
        self.listed = true;
    }

    fn synced(&self) -> bool {
        PodDisruptionBudgets::synced(self)
    }
}
