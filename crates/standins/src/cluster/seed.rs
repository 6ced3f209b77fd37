//! Seeding the simulated cluster: MachineDeployments with their infrastructure templates, pods
//! and Deployments, written through the cluster's client as a user would.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

use crate::capi::INFRA_POOL_KIND;
use crate::capi::{CapiVersion, dynamic};
use crate::capi_version::ScalableKind;
use crate::wellknown::{CLUSTER_NAME_LABEL, DEPLOYMENT_NAME_LABEL};

use super::{
    BOOTSTRAP_GROUP, Backend, CLUSTER_NAME, Error, INFRA_GROUP, INFRA_TEMPLATE_KIND, INFRA_VERSION,
    MachineDeploymentSeed, Served, SimCluster, kube_err,
};

impl SimCluster {
    /// A MachineDeployment of the configured version with `labels` on the MD, the given
    /// annotations and replicas, and a matching DevMachineTemplate named after it.
    pub async fn create_machine_deployment(
        &self,
        name: &str,
        ns: &str,
        annotations: BTreeMap<String, String>,
        labels: BTreeMap<String, String>,
        replicas: i64,
    ) -> Result<DynamicObject, Error> {
        self.create_machine_deployment_from(&MachineDeploymentSeed {
            name: name.into(),
            namespace: ns.into(),
            replicas,
            labels,
            annotations,
            ..Default::default()
        })
        .await
    }

    pub async fn create_machine_deployment_from(
        &self,
        seed: &MachineDeploymentSeed,
    ) -> Result<DynamicObject, Error> {
        let v = self.cfg.capi_version;
        // A user creates the template a MachineDeployment refers to first; a seed that names
        // its own template leaves that to the caller (or means it to be missing).
        if seed.infrastructure_template.is_none() {
            self.create_template_object(&seed.namespace, &seed.name)
                .await?;
        }
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.management.clone(),
            &seed.namespace,
            &v.machine_deployment(),
        );
        let mut md = machine_deployment(v, seed);
        if self.cfg.cluster_api.is_real() {
            // Cluster API's real manager: its Cluster must exist, and it bootstraps from a
            // data secret (no bootstrap provider runs); its own webhook labels the object.
            self.ensure_cluster(&seed.namespace).await?;
            md = with_bootstrap_data_secret(md);
        } else if self.cfg.backend == Backend::Real {
            md = labelled_as_the_webhook_would(md);
        }
        api.create(&PostParams::default(), &md)
            .await
            .map_err(kube_err(format!(
                "create MachineDeployment {}/{}",
                seed.namespace, seed.name
            )))
    }

    /// The workload cluster's objects for Cluster API's real manager in `ns` (a Cluster, its
    /// providers' objects, its kubeconfig Secret); nothing when the stand-in plays Cluster API.
    pub async fn ensure_cluster(&self, ns: &str) -> Result<(), Error> {
        match &self.served {
            Served::Real { backend, .. } => Ok(backend
                .ensure_cluster(&self.management, ns, CLUSTER_NAME)
                .await?),
            Served::Simulated(_) => Ok(()),
        }
    }

    /// A ClusterClass-managed workload cluster `name` in `ns` whose
    /// `spec.topology.workers.machineDeployments` are `workers`, applied again on every call
    /// (Cluster API's topology controller then makes and updates their MachineDeployments).
    /// Only where Cluster API's real manager runs: the stand-in has no topology controller.
    pub async fn ensure_topology_cluster(
        &self,
        ns: &str,
        name: &str,
        workers: Value,
    ) -> Result<(), Error> {
        match &self.served {
            Served::Real { backend, .. } => Ok(backend
                .ensure_topology_cluster(&self.management, ns, name, workers)
                .await?),
            Served::Simulated(_) => Err(Error::TopologyNeedsRealClusterApi),
        }
    }

    /// Sets a MachineDeployment's spec.replicas (as a user or the controller would).
    pub async fn scale_machine_deployment(
        &self,
        ns: &str,
        name: &str,
        replicas: i64,
    ) -> Result<(), Error> {
        self.scale_group(ScalableKind::MachineDeployment, ns, name, replicas)
            .await
    }

    /// Sets `spec.replicas` of a node group of `kind`.
    pub(super) async fn scale_group(
        &self,
        kind: ScalableKind,
        ns: &str,
        name: &str,
        replicas: i64,
    ) -> Result<(), Error> {
        let v = self.cfg.capi_version;
        let resource = match kind {
            ScalableKind::MachineDeployment => v.machine_deployment(),
            ScalableKind::MachinePool => v.machine_pool(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(self.management.clone(), ns, &resource);
        crate::standin::merge_patch(&api, name, &json!({"spec": {"replicas": replicas}}))
            .await
            .map_err(kube_err(format!("scale {} {ns}/{name}", kind.as_str())))
    }

    /// The DevMachineTemplate `ns/name` without a status, unless it exists already.
    async fn create_template_object(&self, ns: &str, name: &str) -> Result<(), Error> {
        let ar = infra_template_resource();
        let api: Api<DynamicObject> = Api::namespaced_with(self.management.clone(), ns, &ar);
        match api
            .create(&PostParams::default(), &infrastructure_template(ns, name))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(kube_err(format!(
                "create {INFRA_TEMPLATE_KIND} {ns}/{name}"
            ))(e)),
        }
    }

    /// A DevMachineTemplate whose `status.capacity` is `capacity` (resource -> quantity); one
    /// that exists (created with its MachineDeployment) gets that status.
    pub async fn create_machine_template(
        &self,
        ns: &str,
        name: &str,
        capacity: BTreeMap<String, String>,
    ) -> Result<(), Error> {
        let ar = infra_template_resource();
        let api: Api<DynamicObject> = Api::namespaced_with(self.management.clone(), ns, &ar);
        let what = format!("create {INFRA_TEMPLATE_KIND} {ns}/{name}");
        self.create_template_object(ns, name).await?;
        crate::standin::merge_status(&api, name, &capacity_status(&capacity))
            .await
            .map_err(kube_err(what))
    }

    /// `count` pods named `<prefix>-<i>` requesting `cpu`/`memory`, with an optional
    /// nodeSelector and tolerations (pod spec fragments as JSON).
    pub async fn create_pods(
        &self,
        ns: &str,
        prefix: &str,
        count: usize,
        shape: &PodShape,
    ) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        for i in 0..count {
            let pod = shape.pod(&format!("{prefix}-{i}"), ns, None);
            api.create(&PostParams::default(), &pod)
                .await
                .map_err(kube_err(format!("create Pod {ns}/{prefix}-{i}")))?;
        }
        Ok(())
    }

    /// A Deployment of `replicas` pods shaped by `shape`; the Deployment stand-in
    /// (`deployments.rs`) creates its pods and keeps their number (returns before they exist).
    pub async fn create_deployment(
        &self,
        ns: &str,
        name: &str,
        replicas: usize,
        shape: &PodShape,
    ) -> Result<(), Error> {
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), ns);
        let template = shape.pod(name, ns, None);
        let mut labels = shape.labels.clone();
        let app = labels
            .entry("app".to_string())
            .or_insert_with(|| name.to_string())
            .clone();
        let body = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": app}},
                "template": {
                    "metadata": {"labels": labels, "annotations": shape.annotations},
                    "spec": template.spec,
                },
            },
        });
        let deployment: Deployment = serde_json::from_value(body).map_err(|e| {
            kube_err(format!("build Deployment {ns}/{name}"))(kube::Error::SerdeError(e))
        })?;
        deployments
            .create(&PostParams::default(), &deployment)
            .await
            .map_err(kube_err(format!("create Deployment {ns}/{name}")))?;
        Ok(())
    }

    /// Sets a Deployment's `spec.replicas`; the Deployment stand-in adds or removes pods.
    pub async fn scale_deployment(
        &self,
        ns: &str,
        name: &str,
        replicas: usize,
    ) -> Result<(), Error> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), ns);
        crate::standin::merge_patch(&api, name, &json!({"spec": {"replicas": replicas}}))
            .await
            .map_err(kube_err(format!("scale Deployment {ns}/{name}")))
    }

    /// Machines of a MachineDeployment.
    pub async fn machines_of(&self, ns: &str, md: &str) -> Result<Vec<DynamicObject>, Error> {
        self.machines_labelled(ns, DEPLOYMENT_NAME_LABEL, md).await
    }

    /// Machines of namespace `ns` whose `label` is `group`.
    pub(super) async fn machines_labelled(
        &self,
        ns: &str,
        label: &str,
        group: &str,
    ) -> Result<Vec<DynamicObject>, Error> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.management.clone(),
            ns,
            &self.cfg.capi_version.machine(),
        );
        Ok(api
            .list(&ListParams::default().labels(&format!("{label}={group}")))
            .await
            .map_err(kube_err(format!("list Machines of {ns}/{group}")))?
            .items)
    }
}

/// Requests and placement constraints of seeded pods.
#[derive(Clone, Debug, Default)]
pub struct PodShape {
    pub cpu: String,
    pub memory: String,
    pub labels: BTreeMap<String, String>,
    pub node_selector: BTreeMap<String, String>,
    /// Raw `tolerations` list.
    pub tolerations: Vec<Value>,
    /// Raw `affinity` object.
    pub affinity: Option<Value>,
    /// Pod annotations (e.g. `karpenter.sh/do-not-disrupt`, the kubelet's `exit-after`).
    pub annotations: BTreeMap<String, String>,
    /// `terminationGracePeriodSeconds` (0, the default here, makes deletions immediate).
    pub grace_seconds: i64,
}

impl PodShape {
    pub fn new(cpu: &str, memory: &str) -> Self {
        Self {
            cpu: cpu.into(),
            memory: memory.into(),
            ..Default::default()
        }
    }

    fn pod(&self, name: &str, ns: &str, owner: Option<Value>) -> Pod {
        let mut body = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": self.labels, "annotations": self.annotations},
            "spec": {
                "containers": [{
                    "name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": self.cpu, "memory": self.memory}},
                }],
                "terminationGracePeriodSeconds": self.grace_seconds,
            },
        });
        if !self.node_selector.is_empty() {
            body["spec"]["nodeSelector"] = json!(self.node_selector);
        }
        if !self.tolerations.is_empty() {
            body["spec"]["tolerations"] = json!(self.tolerations);
        }
        if let Some(a) = &self.affinity {
            body["spec"]["affinity"] = a.clone();
        }
        if let Some(o) = owner {
            body["metadata"]["ownerReferences"] = json!([o]);
        }
        serde_json::from_value(body).unwrap_or_default()
    }
}

/// A MachineDeployment body in `v`'s shape (after the upstream kubemark example and CRDs).
pub fn machine_deployment(v: CapiVersion, seed: &MachineDeploymentSeed) -> DynamicObject {
    node_group(v, seed, ScalableKind::MachineDeployment)
}

/// A MachinePool body in `v`'s shape (after the upstream CRDs): the template names the
/// infrastructure pool, not a machine template.
pub fn machine_pool(v: CapiVersion, seed: &MachineDeploymentSeed) -> DynamicObject {
    node_group(v, seed, ScalableKind::MachinePool)
}

/// The one body both kinds share: the seed's metadata, replicas and template, whose bootstrap
/// and infrastructure references are in `v`'s shape. A MachineDeployment selects its Machines
/// by the deployment-name label its template carries and refers to a machine template; a
/// MachinePool's template names the infrastructure pool and a bootstrap config (no selector:
/// Cluster API labels its Machines itself).
fn node_group(v: CapiVersion, seed: &MachineDeploymentSeed, kind: ScalableKind) -> DynamicObject {
    let name = &seed.name;
    let infra_name = seed
        .infrastructure_template
        .clone()
        .unwrap_or_else(|| name.clone());
    let deployment = kind == ScalableKind::MachineDeployment;
    let (bootstrap_kind, infra_kind) = if deployment {
        ("KubeadmConfigTemplate", INFRA_TEMPLATE_KIND)
    } else {
        ("KubeadmConfig", INFRA_POOL_KIND)
    };
    let mut template_labels = seed.template_labels.clone();
    template_labels.insert(CLUSTER_NAME_LABEL.into(), CLUSTER_NAME.into());
    if deployment {
        template_labels.insert(DEPLOYMENT_NAME_LABEL.into(), name.clone());
    }
    let (bootstrap_ref, infra_ref) = match v {
        CapiVersion::V1Beta1 => (
            json!({"apiVersion": format!("{BOOTSTRAP_GROUP}/v1beta1"), "kind": bootstrap_kind, "name": name}),
            json!({"apiVersion": format!("{INFRA_GROUP}/{INFRA_VERSION}"), "kind": infra_kind, "name": infra_name}),
        ),
        CapiVersion::V1Beta2 => (
            json!({"apiGroup": BOOTSTRAP_GROUP, "kind": bootstrap_kind, "name": name}),
            json!({"apiGroup": INFRA_GROUP, "kind": infra_kind, "name": infra_name}),
        ),
    };
    let mut spec = json!({
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
    });
    if deployment {
        spec["selector"] =
            json!({"matchLabels": {CLUSTER_NAME_LABEL: CLUSTER_NAME, DEPLOYMENT_NAME_LABEL: name}});
    }
    dynamic(json!({
        "apiVersion": v.api_version(),
        "kind": kind.as_str(),
        "metadata": {
            "name": name,
            "namespace": seed.namespace,
            "labels": seed.labels,
            "annotations": seed.annotations,
        },
        "spec": spec,
    }))
}

/// The status an infrastructure template or pool publishes its node shape in (`capacity`:
/// resource -> quantity), as a provider does for scale from zero.
pub(super) fn capacity_status(capacity: &BTreeMap<String, String>) -> Value {
    json!({"status": {
        "capacity": capacity,
        "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
    }})
}

/// `md` with the label Cluster API's defaulting webhook adds on create (a real control plane
/// runs no such webhook; the simulated server adds it itself).
pub(super) fn labelled_as_the_webhook_would(md: DynamicObject) -> DynamicObject {
    let Ok(mut value) = serde_json::to_value(&md) else {
        return md;
    };
    crate::capi_defaults::label_with_cluster(&mut value);
    serde_json::from_value(value).unwrap_or(md)
}

/// `md` bootstrapped from a data secret named after it (`<name>-bootstrap`), as a provider's
/// bootstrap controller would leave it, in place of the bootstrap config template no
/// bootstrap provider serves here.
pub(super) fn with_bootstrap_data_secret(md: DynamicObject) -> DynamicObject {
    let Ok(mut value) = serde_json::to_value(&md) else {
        return md;
    };
    let name = md.metadata.name.clone().unwrap_or_default();
    if let Some(spec) = value.pointer_mut("/spec/template/spec") {
        spec["bootstrap"] = json!({"dataSecretName": format!("{name}-bootstrap")});
    }
    serde_json::from_value(value).unwrap_or(md)
}

/// A DevMachineTemplate `ns/name` without a status (Cluster API's in-memory provider's shape).
pub fn infrastructure_template(ns: &str, name: &str) -> DynamicObject {
    dynamic(json!({
        "apiVersion": infra_template_resource().api_version,
        "kind": INFRA_TEMPLATE_KIND,
        "metadata": {"name": name, "namespace": ns, "labels": {CLUSTER_NAME_LABEL: CLUSTER_NAME}},
        "spec": {"template": {"spec": {"backend": {"inMemory": {}}}}},
    }))
}

pub fn infra_template_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(INFRA_GROUP, INFRA_VERSION, INFRA_TEMPLATE_KIND),
        "devmachinetemplates",
    )
}

/// Cluster `name` in `ns` and its `<name>-kubeconfig` Secret (`value`: `kubeconfig`), as Cluster
/// API's control plane provider writes it for each workload cluster it makes.
pub(super) async fn create_cluster_with_kubeconfig(
    management: &kube::Client,
    v: CapiVersion,
    ns: &str,
    name: &str,
    kubeconfig: &[u8],
) -> Result<(), Error> {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    let cluster = dynamic(json!({
        "apiVersion": v.cluster().api_version,
        "kind": "Cluster",
        "metadata": {"name": name, "namespace": ns},
        // Cluster API's v1beta2 schema wants one property of `spec` at least (kube-apiserver
        // refuses an empty one; this server has no Cluster schema to say so).
        "spec": {"clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}}},
    }));
    Api::<DynamicObject>::namespaced_with(management.clone(), ns, &v.cluster())
        .create(&PostParams::default(), &cluster)
        .await
        .map_err(kube_err(format!("create Cluster {ns}/{name}")))?;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("{name}-kubeconfig")),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([(
                CLUSTER_NAME_LABEL.to_string(),
                name.to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".into()),
        data: Some(BTreeMap::from([(
            "value".to_string(),
            ByteString(kubeconfig.to_vec()),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(management.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .map_err(kube_err(format!("create Secret {ns}/{name}-kubeconfig")))?;
    Ok(())
}

impl SimCluster {
    /// With the management cluster apart: one more Cluster `ns/name` there, whose kubeconfig
    /// Secret holds `kubeconfig` (a workload cluster that is not this one, or none at all).
    pub async fn create_workload_cluster(
        &self,
        ns: &str,
        name: &str,
        kubeconfig: &[u8],
    ) -> Result<(), Error> {
        create_cluster_with_kubeconfig(
            &self.management,
            self.cfg.capi_version,
            ns,
            name,
            kubeconfig,
        )
        .await
    }
}
