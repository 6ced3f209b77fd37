//! Loading what was read into the simulated cluster: each object as the source has it (names,
//! UIDs, owners, bindings, status), kinds in the order the snapshot lists them, so the
//! stand-ins and the controller meet a cluster that is already there rather than one being
//! built.

use super::Error;
use super::read::{Kind, Snapshot};
use crate::capi::version::CapiVersion;
use crate::sim::ResourceDef;
use crate::sim::cluster::{ServedVersions, SimClusterConfig};
use crate::simulate::BackgroundSim;

/// The simulated cluster for `snap`: its Cluster API version, and the template kinds it does
/// not serve yet.
pub fn cluster_config(snap: &Snapshot) -> SimClusterConfig {
    let v = snap.capi_version;
    SimClusterConfig {
        capi_version: v,
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

/// Puts every object of `snap` into the simulated server's store; returns how many.
pub async fn load(sim: &BackgroundSim, snap: &Snapshot) -> Result<usize, Error> {
    let kinds = snap.kinds.clone();
    sim.run(move |c| async move {
        let store = c.try_server()?.store();
        let mut n = 0;
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
                })?;
            n += store.restore(&def, k.objects).map_err(|e| Error::Load {
                kind: k.kind.clone(),
                why: e.message.clone(),
            })?;
        }
        Ok(n)
    })
    .await?
}
