//! The scenario's node groups as `--scalable` asks: MachineDeployments, MachinePools with
//! MachinePool Machines, or a mix (even-numbered MachineDeployments, odd-numbered MachinePools).

use std::time::Duration;

use kube::Api;
use kube::core::DynamicObject;

use crate::cli::ScalableArg;
use crate::sim::capi::infra_pool_resource;
use crate::sim::cluster::{Error, MachineDeploymentSeed, SimCluster};

/// Whether node group `i` is a MachinePool.
pub fn is_pool(scalable: ScalableArg, i: usize) -> bool {
    match scalable {
        ScalableArg::Machinedeployments => false,
        ScalableArg::Machinepools => true,
        ScalableArg::Mixed => i % 2 == 1,
    }
}

/// `n` node groups of the kind `--scalable` asks for, as progress lines name them:
/// "3 MachinePools", not "3 MachineDeployments", when they are MachinePools.
pub fn named(scalable: ScalableArg, n: usize) -> String {
    let (one, many) = match scalable {
        ScalableArg::Machinedeployments => ("MachineDeployment", "MachineDeployments"),
        ScalableArg::Machinepools => ("MachinePool", "MachinePools"),
        ScalableArg::Mixed => (
            "node group (a MachineDeployment or a MachinePool)",
            "node groups (MachineDeployments and MachinePools)",
        ),
    };
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Creates node group `i` from `seed` (a MachineDeployment seed named `md-<i>`): the
/// MachineDeployment itself, or a MachinePool `mp-<i>` with the same annotations and labels.
pub async fn create(
    c: &SimCluster,
    scalable: ScalableArg,
    i: usize,
    seed: MachineDeploymentSeed,
) -> Result<(), Error> {
    if is_pool(scalable, i) {
        let seed = MachineDeploymentSeed {
            name: format!("mp-{i}"),
            ..seed
        };
        c.create_machine_pool_from(&seed, true, None).await?;
        pool_machines_reported(c, &seed).await;
    } else {
        c.create_machine_deployment_from(&seed).await?;
    }
    Ok(())
}

/// Waits (at most 10 s) until the infrastructure pool reports its machine kind, as a pool an
/// operator points the controller at has long done: claims created earlier would find it not
/// yet offered.
async fn pool_machines_reported(c: &SimCluster, seed: &MachineDeploymentSeed) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(c.client(), &seed.namespace, &infra_pool_resource());
    for _ in 0..200 {
        let reported = api
            .get_opt(&seed.name)
            .await
            .ok()
            .flatten()
            .is_some_and(|p| {
                p.data
                    .pointer("/status/infrastructureMachineKind")
                    .is_some_and(|k| k.is_string())
            });
        if reported {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
