//! PersistentVolumeClaims, PersistentVolumes, StorageClasses and CSINodes, reduced to what volume
//! topology reads (`scheduling::volumes`): the provisioner adds each pending pod's volume zones
//! to its requirements before a solve, and existing nodes' CSI attach limits bound where they go.

use crate::scheduling::volumes::{CsiLimits, VolumeCatalog};

/// The catalog and whether each of its three watches has listed once.
#[derive(Default)]
pub struct Storage {
    pub catalog: VolumeCatalog,
    /// CSINodes' attach limits by node.
    pub csi_limits: CsiLimits,
    /// Claims, volumes, classes, CSINodes.
    listed: [bool; 4],
}

/// Which watch a re-list came from.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Claims = 0,
    Volumes = 1,
    Classes = 2,
    CsiNodes = 3,
}

impl Storage {
    pub fn synced(&self) -> bool {
        self.listed.iter().all(|l| *l)
    }

    pub fn mark_listed(&mut self, kind: Kind) {
        self.listed[kind as usize] = true;
    }
}
