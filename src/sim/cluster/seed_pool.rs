//! Seeding MachinePools: the MachinePool and the infrastructure pool (`DevMachinePool`) it
//! points at, with or without MachinePool Machines, written as a user would.

use super::*;
use crate::api::wellknown::POOL_NAME_LABEL;
use crate::sim::capi::{INFRA_POOL_KIND, POOL_MACHINES_ANNOTATION, infra_pool_resource};

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
            Api::namespaced_with(self.client.clone(), &seed.namespace, &ar);
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
            let status = json!({"status": {
                "capacity": capacity,
                "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
            }});
            crate::sim::standin::merge_status(&infra_api, &infra_name, &status)
                .await
                .map_err(kube_err(what))?;
        }
        let v = self.cfg.capi_version;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &seed.namespace, &v.machine_pool());
        api.create(&PostParams::default(), &machine_pool(v, seed))
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
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            ns,
            &self.cfg.capi_version.machine_pool(),
        );
        crate::sim::standin::merge_patch(&api, name, &json!({"spec": {"replicas": replicas}}))
            .await
            .map_err(kube_err(format!("scale MachinePool {ns}/{name}")))
    }

    /// The MachinePool Machines of pool `ns/mp`.
    pub async fn machines_of_pool(&self, ns: &str, mp: &str) -> Result<Vec<DynamicObject>, Error> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), ns, &self.cfg.capi_version.machine());
        Ok(api
            .list(&ListParams::default().labels(&format!("{POOL_NAME_LABEL}={mp}")))
            .await
            .map_err(kube_err(format!("list Machines of MachinePool {ns}/{mp}")))?
            .items)
    }
}

/// A MachinePool body in `v`'s shape (after the upstream CRDs): the template names the
/// infrastructure pool, not a machine template.
pub fn machine_pool(v: CapiVersion, seed: &MachineDeploymentSeed) -> DynamicObject {
    let name = &seed.name;
    let infra_name = seed
        .infrastructure_template
        .clone()
        .unwrap_or_else(|| name.clone());
    let mut template_labels = seed.template_labels.clone();
    template_labels.insert(CLUSTER_NAME_LABEL.into(), CLUSTER_NAME.into());
    let (bootstrap_ref, infra_ref) = match v {
        CapiVersion::V1Beta1 => (
            json!({"apiVersion": format!("{BOOTSTRAP_GROUP}/v1beta1"), "kind": "KubeadmConfig", "name": name}),
            json!({"apiVersion": format!("{INFRA_GROUP}/{INFRA_VERSION}"), "kind": INFRA_POOL_KIND, "name": infra_name}),
        ),
        CapiVersion::V1Beta2 => (
            json!({"apiGroup": BOOTSTRAP_GROUP, "kind": "KubeadmConfig", "name": name}),
            json!({"apiGroup": INFRA_GROUP, "kind": INFRA_POOL_KIND, "name": infra_name}),
        ),
    };
    dynamic(json!({
        "apiVersion": v.api_version(),
        "kind": "MachinePool",
        "metadata": {
            "name": name,
            "namespace": seed.namespace,
            "labels": seed.labels,
            "annotations": seed.annotations,
        },
        "spec": {
            "clusterName": CLUSTER_NAME,
            "replicas": seed.replicas,
            "template": {
                "metadata": {"labels": template_labels},
                "spec": {
                    "bootstrap": {"configRef": bootstrap_ref},
                    "clusterName": CLUSTER_NAME,
                    "infrastructureRef": infra_ref,
                    "version": seed.kubernetes_version.clone().unwrap_or_else(|| "v1.33.0".into()),
                },
            },
        },
    }))
}
