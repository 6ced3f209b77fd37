//! A ClusterClass-managed workload cluster for Cluster API's real manager (its topology
//! controller runs with the ClusterTopology gate): the providers' template kinds a ClusterClass
//! refers to, a bootstrap provider (a MachineDeployment class must name a bootstrap template,
//! so topology-made Machines bootstrap from configs, not from a data secret set by hand), and
//! the providers' side of what the topology controller makes:
//! - a DevCluster gets the control-plane endpoint and reports itself provisioned;
//! - a control plane reports itself initialized at the version the topology asked for (no
//!   upgrade ever under way, so the topology creates the workers at once);
//! - each bootstrap config gets its data Secret and reports it created.
//!
//! Only objects the topology controller owns (`topology.cluster.x-k8s.io/owned`) are touched,
//! and bootstrap configs (only topology-made Machines have them here): the plain cluster of
//! `provider::ensure_cluster` keeps the statuses it was given. Nothing Cluster API's own
//! controllers do is played here. It shares no code with the controller under test.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::provider::{
    CONTROL_PLANE_GROUP, CONTROL_PLANE_KIND, CONTROL_PLANE_VERSION, INFRA_GROUP, INFRA_VERSION, crd,
};
use crate::capi_version::CapiVersion;
use crate::controlplane::cluster_api::established;
use crate::standin::{Shutdown, log_retry, retry, spawn_watch, str_at};

/// The bootstrap provider's group and version.
pub const BOOTSTRAP_GROUP: &str = "bootstrap.sim.karpenter.cluster.x-k8s.io";
pub const BOOTSTRAP_VERSION: &str = "v1beta2";

/// Cluster API's label on every object its topology controller manages.
const OWNED_LABEL: &str = "topology.cluster.x-k8s.io/owned";

/// The ClusterClass's name and its templates' names.
pub const CLASS: &str = "sim-class";
/// The MachineDeployment class every worker entry uses.
pub const WORKER_CLASS: &str = "default";
const INFRA_CLUSTER_TEMPLATE: &str = "sim-class-cluster";
const CONTROL_PLANE_TEMPLATE: &str = "sim-class-control-plane";
const WORKER_TEMPLATE: &str = "sim-class-workers";
const BOOTSTRAP_TEMPLATE: &str = "sim-class-bootstrap";

/// Server-side apply's field manager for these objects.
const FIELD_MANAGER: &str = "karpenter-capi-sim-topology";

/// The kinds this module adds to the providers': (group, version, kind, plural).
const KINDS: [(&str, &str, &str, &str); 4] = [
    (
        INFRA_GROUP,
        INFRA_VERSION,
        "DevClusterTemplate",
        "devclustertemplates",
    ),
    (
        CONTROL_PLANE_GROUP,
        CONTROL_PLANE_VERSION,
        "SimControlPlaneTemplate",
        "simcontrolplanetemplates",
    ),
    (
        BOOTSTRAP_GROUP,
        BOOTSTRAP_VERSION,
        "SimBootstrapConfig",
        "simbootstrapconfigs",
    ),
    (
        BOOTSTRAP_GROUP,
        BOOTSTRAP_VERSION,
        "SimBootstrapConfigTemplate",
        "simbootstrapconfigtemplates",
    ),
];

/// The API groups of this module's kinds beyond the providers' (granted to the manager).
pub fn groups() -> Vec<String> {
    vec![BOOTSTRAP_GROUP.to_string()]
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Installs the template and bootstrap kinds (contract-labelled) and waits until they are
/// Established.
pub async fn install_crds(client: &Client) -> Result<(), super::Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for (group, version, kind, plural) in KINDS {
        let doc = crd(group, version, kind, plural);
        let name = format!("{plural}.{group}");
        api.patch(&name, &apply_params(), &Patch::Apply(&doc))
            .await
            .map_err(super::Error::Install)?;
        names.push(name);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    Ok(established(&api, &names, deadline).await?)
}

/// The API server's Kubernetes version, as a topology names it (only the semantic version:
/// kube-apiserver's build may carry a suffix).
pub async fn kubernetes_version(client: &Client) -> String {
    let built = client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .unwrap_or_default();
    match built.split(['-', '+']).next() {
        Some(v) if !v.is_empty() => v.to_string(),
        _ => "v1.33.0".to_string(),
    }
}

/// What the workload cluster `cluster` is made of: its namespace, Kubernetes version, the
/// control-plane endpoint and kubeconfig its providers would give it, and the Cluster API
/// version its ClusterClass and Cluster are written in.
pub struct TopologyCluster<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub kubernetes_version: &'a str,
    pub workload_kubeconfig: &'a str,
    pub capi_version: CapiVersion,
}

/// The ClusterClass [`CLASS`] with its four templates (a DevMachineTemplate for the workers),
/// then the Cluster `cluster` on it with `workers` as its
/// `spec.topology.workers.machineDeployments` and its `<cluster>-kubeconfig` Secret, as a user
/// and the control-plane provider make them, at `cluster.capi_version`. Idempotent.
pub async fn ensure_cluster(
    client: &Client,
    cluster: &TopologyCluster<'_>,
    workers: Value,
) -> Result<(), kube::Error> {
    let ns = cluster.namespace;
    for (group, version, kind, plural, name, spec) in [
        (
            INFRA_GROUP,
            INFRA_VERSION,
            "DevClusterTemplate",
            "devclustertemplates",
            INFRA_CLUSTER_TEMPLATE,
            json!({}),
        ),
        (
            CONTROL_PLANE_GROUP,
            CONTROL_PLANE_VERSION,
            "SimControlPlaneTemplate",
            "simcontrolplanetemplates",
            CONTROL_PLANE_TEMPLATE,
            json!({}),
        ),
        (
            BOOTSTRAP_GROUP,
            BOOTSTRAP_VERSION,
            "SimBootstrapConfigTemplate",
            "simbootstrapconfigtemplates",
            BOOTSTRAP_TEMPLATE,
            json!({}),
        ),
        (
            INFRA_GROUP,
            INFRA_VERSION,
            "DevMachineTemplate",
            "devmachinetemplates",
            WORKER_TEMPLATE,
            json!({"backend": {"inMemory": {}}}),
        ),
    ] {
        let ar = resource(group, version, kind, plural);
        let body = json!({
            "apiVersion": ar.api_version, "kind": kind,
            "metadata": {"name": name, "namespace": ns},
            "spec": {"template": {"spec": spec}},
        });
        Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
            .patch(name, &apply_params(), &Patch::Apply(&body))
            .await?;
    }
    let version = cluster.capi_version;
    let (class_ar, class) = class_of(version, ns);
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &class_ar)
        .patch(CLASS, &apply_params(), &Patch::Apply(&class))
        .await?;
    apply_kubeconfig(client, cluster).await?;
    let ar = resource(
        "cluster.x-k8s.io",
        version_str(version),
        "Cluster",
        "clusters",
    );
    // v1beta1 names the class by a string, v1beta2 by a reference.
    let class_field = match version {
        CapiVersion::V1Beta1 => ("class", json!(CLASS)),
        CapiVersion::V1Beta2 => ("classRef", json!({"name": CLASS})),
    };
    let mut topology = json!({
        "version": cluster.kubernetes_version,
        "workers": {"machineDeployments": workers},
    });
    topology[class_field.0] = class_field.1;
    let body = json!({
        "apiVersion": ar.api_version, "kind": "Cluster",
        "metadata": {"name": cluster.name, "namespace": ns},
        "spec": {
            "clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}},
            "topology": topology,
        },
    });
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
        .patch(cluster.name, &apply_params(), &Patch::Apply(&body))
        .await?;
    Ok(())
}

/// The API version Cluster API's own kinds are written in (v1.10.10 serves only v1beta1).
fn version_str(version: CapiVersion) -> &'static str {
    match version {
        CapiVersion::V1Beta1 => "v1beta1",
        CapiVersion::V1Beta2 => "v1beta2",
    }
}

/// The ClusterClass at `version`, and its resource: the cluster, control-plane and one worker
/// class, each from its template. v1beta1 refers to a template as `ref` (an object reference)
/// and nests a worker class's two under `template`; v1beta2 uses `templateRef` and puts them
/// beside the class name.
fn class_of(version: CapiVersion, ns: &str) -> (ApiResource, Value) {
    let template = |group: &str, version_of: &str, kind: &str, name: &str| {
        let reference =
            json!({"apiVersion": format!("{group}/{version_of}"), "kind": kind, "name": name});
        match version {
            CapiVersion::V1Beta1 => json!({"ref": reference}),
            CapiVersion::V1Beta2 => json!({"templateRef": reference}),
        }
    };
    let bootstrap = template(
        BOOTSTRAP_GROUP,
        BOOTSTRAP_VERSION,
        "SimBootstrapConfigTemplate",
        BOOTSTRAP_TEMPLATE,
    );
    let infrastructure = template(
        INFRA_GROUP,
        INFRA_VERSION,
        "DevMachineTemplate",
        WORKER_TEMPLATE,
    );
    let worker = match version {
        CapiVersion::V1Beta1 => json!({
            "class": WORKER_CLASS,
            "template": {"bootstrap": bootstrap, "infrastructure": infrastructure},
        }),
        CapiVersion::V1Beta2 => json!({
            "class": WORKER_CLASS, "bootstrap": bootstrap, "infrastructure": infrastructure,
        }),
    };
    let ar = resource(
        "cluster.x-k8s.io",
        version_str(version),
        "ClusterClass",
        "clusterclasses",
    );
    let body = json!({
        "apiVersion": ar.api_version, "kind": "ClusterClass",
        "metadata": {"name": CLASS, "namespace": ns},
        "spec": {
            "infrastructure": template(INFRA_GROUP, INFRA_VERSION, "DevClusterTemplate", INFRA_CLUSTER_TEMPLATE),
            "controlPlane": template(CONTROL_PLANE_GROUP, CONTROL_PLANE_VERSION, "SimControlPlaneTemplate", CONTROL_PLANE_TEMPLATE),
            "workers": {"machineDeployments": [worker]},
        },
    });
    (ar, body)
}

/// The `<cluster>-kubeconfig` Secret Cluster API reaches the workload cluster with.
async fn apply_kubeconfig(
    client: &Client,
    cluster: &TopologyCluster<'_>,
) -> Result<(), kube::Error> {
    let name = format!("{}-kubeconfig", cluster.name);
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": name, "namespace": cluster.namespace,
            "labels": {"cluster.x-k8s.io/cluster-name": cluster.name},
        },
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"value": cluster.workload_kubeconfig},
    });
    Api::<Secret>::namespaced(client.clone(), cluster.namespace)
        .patch(&name, &apply_params(), &Patch::Apply(&secret))
        .await
        .map(drop)
}

/// The providers' side of topology-made objects, until `shutdown`.
pub fn spawn(client: Client, apiserver_port: u16, shutdown: Shutdown) -> Vec<JoinHandle<()>> {
    let providers = Arc::new(Providers {
        client: client.clone(),
        apiserver_port,
        done: Mutex::new(HashSet::new()),
        shutdown: shutdown.clone(),
    });
    let watch = |what: &'static str, ar: ApiResource, role: Role| {
        let me = providers.clone();
        spawn_watch(
            what,
            Api::<DynamicObject>::all_with(client.clone(), &ar),
            shutdown.clone(),
            move |event| {
                if let Event::Apply(o) | Event::InitApply(o) = event {
                    me.on_object(role, ar.clone(), o);
                }
            },
        )
    };
    vec![
        watch(
            "devclusters (topology)",
            resource(INFRA_GROUP, INFRA_VERSION, "DevCluster", "devclusters"),
            Role::InfraCluster,
        ),
        watch(
            "control planes (topology)",
            resource(
                CONTROL_PLANE_GROUP,
                CONTROL_PLANE_VERSION,
                CONTROL_PLANE_KIND,
                "simcontrolplanes",
            ),
            Role::ControlPlane,
        ),
        watch(
            "bootstrap configs",
            resource(
                BOOTSTRAP_GROUP,
                BOOTSTRAP_VERSION,
                "SimBootstrapConfig",
                "simbootstrapconfigs",
            ),
            Role::Bootstrap,
        ),
    ]
}

/// Which provider an object is for.
#[derive(Clone, Copy, Debug)]
enum Role {
    InfraCluster,
    ControlPlane,
    Bootstrap,
}

struct Providers {
    client: Client,
    apiserver_port: u16,
    /// Objects (by uid and the version they were asked for) already answered.
    done: Mutex<HashSet<String>>,
    shutdown: Shutdown,
}

impl Providers {
    fn on_object(self: &Arc<Self>, role: Role, ar: ApiResource, o: DynamicObject) {
        if o.metadata.deletion_timestamp.is_some() {
            return;
        }
        let owned = o.labels().contains_key(OWNED_LABEL);
        let (due, key) = match role {
            Role::InfraCluster => (
                owned && o.data.pointer("/status/initialization/provisioned") != Some(&json!(true)),
                String::new(),
            ),
            Role::ControlPlane => {
                let asked = str_at(&o.data, &["spec", "version"]).unwrap_or_default();
                let at = str_at(&o.data, &["status", "version"]).unwrap_or_default();
                (owned && !asked.is_empty() && asked != at, asked.to_string())
            }
            Role::Bootstrap => (
                str_at(&o.data, &["status", "dataSecretName"]).is_none(),
                String::new(),
            ),
        };
        let uid = format!("{}@{key}", o.uid().unwrap_or_default());
        if !due || !self.done.lock().insert(uid) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move { me.answer(role, ar, o).await });
    }

    /// Writes what the provider reports for `o` (its spec first where the contract puts a
    /// provider's answer there).
    async fn answer(&self, role: Role, ar: ApiResource, o: DynamicObject) {
        let ns = o.namespace().unwrap_or_default();
        let name = o.name_any();
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, &ar);
        let endpoint = json!({"host": "127.0.0.1", "port": self.apiserver_port});
        let (spec, status) = match role {
            Role::InfraCluster => (
                Some(json!({"spec": {"controlPlaneEndpoint": endpoint}})),
                json!({"status": {"ready": true, "initialization": {"provisioned": true}}}),
            ),
            Role::ControlPlane => {
                let version = str_at(&o.data, &["spec", "version"]).unwrap_or_default();
                (
                    None,
                    json!({"status": {
                        "initialized": true,
                        "ready": true,
                        "initialization": {"controlPlaneInitialized": true},
                        "version": version,
                        "externalManagedControlPlane": true,
                    }}),
                )
            }
            Role::Bootstrap => {
                let secret = format!("{name}-bootstrap");
                if self.bootstrap_secret(&ns, &secret, &o).await.is_err() {
                    return;
                }
                (
                    None,
                    json!({"status": {
                        "ready": true,
                        "dataSecretName": secret,
                        "initialization": {"dataSecretCreated": true},
                    }}),
                )
            }
        };
        let subject = format!("{} {ns}/{name}", ar.kind);
        if let Some(spec) = &spec {
            let wrote = retry("spec", &self.shutdown, || async {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(spec))
                    .await
                    .map(drop)
                    .inspect_err(|e| log_retry("topology providers", &subject, e))
            })
            .await;
            if wrote.is_err() {
                return;
            }
        }
        let _ = retry("status", &self.shutdown, || async {
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .map(drop)
                .inspect_err(|e| log_retry("topology providers", &subject, e))
        })
        .await;
        tracing::debug!(object = %subject, "topology provider answered");
    }

    /// The bootstrap data Secret of config `o` (owned by it, so it goes with it).
    async fn bootstrap_secret(&self, ns: &str, name: &str, o: &DynamicObject) -> Result<(), ()> {
        let cluster = o
            .labels()
            .get("cluster.x-k8s.io/cluster-name")
            .cloned()
            .unwrap_or_default();
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {
                "name": name, "namespace": ns,
                "labels": {"cluster.x-k8s.io/cluster-name": cluster},
                "ownerReferences": [{
                    "apiVersion": o.types.as_ref().map(|t| t.api_version.clone()).unwrap_or_default(),
                    "kind": "SimBootstrapConfig", "name": o.name_any(),
                    "uid": o.uid().unwrap_or_default(), "controller": true,
                }],
            },
            "type": "cluster.x-k8s.io/secret",
            "stringData": {"value": "#cloud-config\n", "format": "cloud-config"},
        });
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let body: Secret = serde_json::from_value(secret).map_err(drop)?;
        retry("bootstrap secret", &self.shutdown, || async {
            match api.create(&PostParams::default(), &body).await {
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                other => other.map(drop).inspect_err(|e| {
                    log_retry("bootstrap provider", &format!("Secret {ns}/{name}"), e)
                }),
            }
        })
        .await
        .map_err(drop)
    }
}
