//! DaemonSets by `namespace/name`: each one's pod lands on every new node that accepts it, so
//! the solver counts its requests as overhead (provisioning and consolidation alike).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::ResourceExt;

use super::feed::Index;

#[derive(Default)]
pub(crate) struct DaemonSets {
    by_key: BTreeMap<String, Arc<DaemonSet>>,
    listed: bool,
}

fn key(d: &DaemonSet) -> String {
    format!("{}/{}", d.namespace().unwrap_or_default(), d.name_any())
}

impl DaemonSets {
    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<DaemonSet>> {
        self.by_key.values()
    }

    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    pub(crate) fn apply(&mut self, d: DaemonSet) {
        self.by_key.insert(key(&d), Arc::new(d));
    }

    pub(crate) fn remove(&mut self, d: &DaemonSet) {
        self.by_key.remove(&key(d));
    }

    /// A fresh list replaces everything (DaemonSets deleted while the watch was down go too).
    pub(crate) fn replace_all(&mut self, list: Vec<DaemonSet>) {
        self.by_key = list.into_iter().map(|d| (key(&d), Arc::new(d))).collect();
        self.listed = true;
    }

    pub(crate) fn synced(&self) -> bool {
        self.listed
    }
}

impl Index<DaemonSet> for DaemonSets {
    type Kept = DaemonSet;
    type Listing = Vec<Self::Kept>;
    type Changed = ();

    fn keep(d: DaemonSet) -> DaemonSet {
        d
    }

    fn apply(&mut self, d: DaemonSet) {
        DaemonSets::apply(self, d);
    }

    fn delete(&mut self, d: DaemonSet) {
        self.remove(&d);
    }

    fn reset(&mut self, all: Vec<DaemonSet>) {
        self.replace_all(all);
    }

    fn synced(&self) -> bool {
        DaemonSets::synced(self)
    }
}
