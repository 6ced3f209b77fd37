//! NodePools by name, fed by a watch that decodes each one on its own: the ones that decode
//! are what the provisioner and disruption read; the ones that do not are kept apart (nothing
//! provisions from them) so the NodePools actor can say why on the object.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kube::ResourceExt;

use super::feed::Index;
use crate::api::decode::{Lenient, Malformed};
use crate::api::nodepool::NodePool;

#[derive(Default)]
pub struct NodePoolIndex {
    pools: HashMap<String, Arc<NodePool>>,
    malformed: BTreeMap<String, Malformed>,
    listed: bool,
}

impl NodePoolIndex {
    pub fn get(&self, name: &str) -> Option<&Arc<NodePool>> {
        self.pools.get(name)
    }

    /// Every NodePool that decodes, by name.
    pub fn all(&self) -> &HashMap<String, Arc<NodePool>> {
        &self.pools
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<NodePool>> {
        self.pools.values()
    }

    /// The NodePools the types cannot decode, by name.
    pub fn malformed(&self) -> &BTreeMap<String, Malformed> {
        &self.malformed
    }

    /// The first list has completed.
    pub fn synced(&self) -> bool {
        self.listed
    }
}

impl Index<Lenient<NodePool>> for NodePoolIndex {
    type Kept = Lenient<NodePool>;
    type Changed = ();

    fn keep(obj: Lenient<NodePool>) -> Self::Kept {
        obj
    }

    fn apply(&mut self, np: Self::Kept) {
        match np {
            Lenient::Ok(np) => {
                self.malformed.remove(&np.name_any());
                self.pools.insert(np.name_any(), Arc::new(np));
            }
            Lenient::Bad(m) => {
                let name = m.metadata.name.clone().unwrap_or_default();
                tracing::warn!(nodepool = %name, problem = %m, "NodePool cannot be decoded; it is not used until fixed");
                // The last good version must not keep provisioning: the user changed it.
                self.pools.remove(&name);
                self.malformed.insert(name, *m);
            }
        }
    }

    fn delete(&mut self, np: Self::Kept) {
        let name = np.name_any();
        self.malformed.remove(&name);
        self.pools.remove(&name);
    }

    fn reset(&mut self, all: Vec<Self::Kept>) {
        self.pools.clear();
        self.malformed.clear();
        for np in all {
            match np {
                Lenient::Ok(np) => {
                    self.pools.insert(np.name_any(), Arc::new(np));
                }
                Lenient::Bad(m) => {
                    self.malformed
                        .insert(m.metadata.name.clone().unwrap_or_default(), *m);
                }
            }
        }
        self.listed = true;
    }

    fn synced(&self) -> bool {
        NodePoolIndex::synced(self)
    }
}
