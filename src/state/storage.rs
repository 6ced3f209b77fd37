//! PersistentVolumeClaims, PersistentVolumes, StorageClasses and CSINodes, reduced to what volume
//! topology reads (`scheduling::volumes`): the provisioner adds each pending pod's volume zones
//! to its requirements before a solve, and existing nodes' CSI attach limits bound where they go.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::ResourceExt;

use super::feed::Index;
use crate::scheduling::volumes::{CsiLimits, VolumeCatalog, csinode_limits};

/// The catalog and whether each of its three watches has listed once.
#[derive(Default)]
pub(crate) struct Storage {
    pub(crate) catalog: VolumeCatalog,
    /// CSINodes' attach limits by node.
    pub(crate) csi_limits: CsiLimits,
    /// Claims, volumes, classes, CSINodes.
    listed: [bool; 4],
}

/// Which watch a re-list came from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Claims = 0,
    Volumes = 1,
    Classes = 2,
    CsiNodes = 3,
}

impl Storage {
    pub(crate) fn synced(&self) -> bool {
        self.listed.iter().all(|l| *l)
    }

    pub(crate) fn mark_listed(&mut self, kind: Kind) {
        self.listed[kind as usize] = true;
    }
}

/// Each kind is kept whole until its list completes, as the catalog reads it.
macro_rules! storage_index {
    ($k:ty, $kind:expr, |$s:ident, $o:ident| apply $apply:block delete $delete:block clear $clear:block) => {
        impl Index<$k> for Storage {
            type Kept = $k;
            type Listing = Vec<Self::Kept>;
            type Changed = ();
            fn keep(obj: $k) -> $k {
                obj
            }
            fn apply(&mut self, $o: $k) {
                let $s = self;
                $apply
            }
            fn delete(&mut self, $o: $k) {
                let $s = self;
                $delete
            }
            fn reset(&mut self, all: Vec<$k>) {
                {
                    let $s = &mut *self;
                    $clear
                }
                for o in all {
                    <Self as Index<$k>>::apply(self, o);
                }
                self.mark_listed($kind);
            }
            fn synced(&self) -> bool {
                self.listed[$kind as usize]
            }
        }
    };
}

storage_index!(PersistentVolumeClaim, Kind::Claims, |s, o|
    apply { s.catalog.apply_claim(&o) }
    delete { s.catalog.remove_claim(&o) }
    clear { s.catalog.claims.clear() });
storage_index!(PersistentVolume, Kind::Volumes, |s, o|
    apply { s.catalog.apply_volume(&o) }
    delete { s.catalog.remove_volume(&o) }
    clear { s.catalog.volumes.clear() });
storage_index!(StorageClass, Kind::Classes, |s, o|
    apply { s.catalog.apply_class(&o) }
    delete { s.catalog.remove_class(&o) }
    clear { s.catalog.classes.clear() });
storage_index!(CSINode, Kind::CsiNodes, |s, o|
    apply { s.csi_limits.insert(o.name_any(), csinode_limits(&o)); }
    delete { s.csi_limits.remove(&o.name_any()); }
    clear { s.csi_limits.clear() });
