//! Loading what was read into the simulated cluster: each object as the source has it (names,
//! UIDs, owners, bindings, status), kinds in the order the snapshot lists them, so the
//! stand-ins and the controller meet a cluster that is already there rather than one being
//! built.

use super::Error;
use super::read::{Kind, Snapshot};
use crate::capi::version::CapiVersion;
use crate::sim::cluster::{Preload, ServedVersions, SimClusterConfig};
use crate::sim::{ResourceDef, Store};

/// The simulated cluster for `snap`: its Cluster API version, and the template kinds it does
/// not serve yet.
pub fn cluster_config(snap: &Snapshot) -> SimClusterConfig {
    let v = snap.capi_version;
    SimClusterConfig {
        capi_version: v.into(),
        served: match v {
            CapiVersion::V1Beta1 => ServedVersions::V1beta1,
            CapiVersion::V1Beta2 => ServedVersions::V1beta2,
        },
        node_ready_delay: std::time::Duration::from_millis(100),
        node_delete_delay: std::time::Duration::from_millis(50),
        extra_resources: snap
            .kinds
            .iter()
            .filter(|k| k.group.starts_with("infrastructure.") || k.group.starts_with("bootstrap."))
            .map(def_of)
            .collect(),
        ..SimClusterConfig::default()
    }
}

fn def_of(k: &Kind) -> ResourceDef {
    ResourceDef::custom(&k.group, &[&k.version], &k.kind, &k.plural, k.namespaced).with_status()
}

/// Every object of `snap`, to be put into the simulated server's store before its stand-ins
/// start ([`crate::sim::cluster::Preload`]), so they find the cluster already there.
pub fn preload(snap: &Snapshot) -> Preload {
    let kinds = snap.kinds.clone();
    Box::new(move |store: &Store| {
        for k in kinds {
            let def = store
                .registry()
                .lookup(&k.group, &k.version, &k.plural)
                .cloned()
                .ok_or_else(|| Error::Load {
                    kind: k.kind.clone(),
                    why: format!(
                        "the simulated cluster does not serve {}/{}",
                        k.group, k.version
                    ),
                })
                .map_err(|e| e.to_string())?;
            store
                .restore(&def, k.objects)
                .map_err(|e| Error::Load {
                    kind: k.kind.clone(),
                    why: e.message.clone(),
                })
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    })
}
