//! Seeding MachinePools: the MachinePool and the infrastructure pool (`DevMachinePool`) it
//! points at, with or without MachinePool Machines, written as a user would.

use std::collections::BTreeMap;

use kube::Api;
use kube::api::PostParams;
use kube::core::DynamicObject;
use serde_json::json;

use crate::capi::dynamic;
use crate::capi::{INFRA_POOL_KIND, POOL_MACHINES_ANNOTATION, infra_pool_resource};
use crate::capi_version::ScalableKind;
use crate::wellknown::CLUSTER_NAME_LABEL;
use crate::wellknown::POOL_NAME_LABEL;

use super::seed::{labelled_as_the_webhook_would, machine_pool, with_bootstrap_data_secret};
use super::{Backend, CLUSTER_NAME, Error, MachineDeploymentSeed, SimCluster, kube_err};

impl SimCluster {
    /// A MachinePool of the configured version from `seed` (the fields a MachineDeployment seed
    /// has: labels, template labels, annotations, replicas, version) and its infrastructure pool,
    /// named after it (or `seed.infrastructure_template`) and carrying `capacity` in its status
    /// when given. `pool_machines` false makes a pool without MachinePool Machines.
    pub async fn create_machine_pool_from(
        &self,
        seed: &MachineDeploymentSeed,
        pool_machines: bool,
        capacity: Option<BTreeMap<String, String>>,
    ) -> Result<DynamicObject, Error> {
        let infra_name = seed
            .infrastructure_template
            .clone()
            .unwrap_or_else(|| seed.name.clone());
        let ar = infra_pool_resource();
        let infra_api: Api<DynamicObject> =
            Api::namespaced_with(self.management.clone(), &seed.namespace, &ar);
        let mut annotations = BTreeMap::new();
        if !pool_machines {
            annotations.insert(POOL_MACHINES_ANNOTATION.to_string(), "false".to_string());
        }
        let body = dynamic(json!({
            "apiVersion": ar.api_version,
            "kind": INFRA_POOL_KIND,
            "metadata": {
                "name": infra_name, "namespace": seed.namespace,
                "labels": {CLUSTER_NAME_LABEL: CLUSTER_NAME},
                "annotations": annotations,
            },
            "spec": {"template": {"backend": {"inMemory": {}}}},
        }));
        let what = format!("create {INFRA_POOL_KIND} {}/{infra_name}", seed.namespace);
        infra_api
            .create(&PostParams::default(), &body)
            .await
            .map_err(kube_err(what.clone()))?;
        if let Some(capacity) = capacity {
            let status = super::seed::capacity_status(&capacity);
            crate::standin::merge_status(&infra_api, &infra_name, &status)
                .await
                .map_err(kube_err(what))?;
        }
        let v = self.cfg.capi_version;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.management.clone(), &seed.namespace, &v.machine_pool());
        let mut mp = machine_pool(v, seed);
        if self.cfg.cluster_api.is_real() {
            // Cluster API's real manager: its Cluster must exist, and the pool bootstraps from
            // a data secret (no bootstrap provider runs), as seeded MachineDeployments do; its
            // own webhook labels the object. The infrastructure provider (`sim::real::pool`)
            // serves the DevMachinePool.
            self.ensure_cluster(&seed.namespace).await?;
            mp = with_bootstrap_data_secret(mp);
        } else if self.cfg.backend == Backend::Real {
            mp = labelled_as_the_webhook_would(mp);
        }
        api.create(&PostParams::default(), &mp)
            .await
            .map_err(kube_err(format!(
                "create MachinePool {}/{}",
                seed.namespace, seed.name
            )))
    }

    /// Sets a MachinePool's spec.replicas (as a user or the controller would).
    pub async fn scale_machine_pool(
        &self,
        ns: &str,
        name: &str,
        replicas: i64,
    ) -> Result<(), Error> {
        self.scale_group(ScalableKind::MachinePool, ns, name, replicas)
            .await
    }

    /// The MachinePool Machines of pool `ns/mp`.
    pub async fn machines_of_pool(&self, ns: &str, mp: &str) -> Result<Vec<DynamicObject>, Error> {
        self.machines_labelled(ns, POOL_NAME_LABEL, mp).await
    }
}
