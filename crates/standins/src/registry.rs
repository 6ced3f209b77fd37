//! The resources the simulated server serves: group, versions, kind, plural, scope, subresources.
//!
//! All served versions of one resource share one storage, as in a real server; objects are
//! handed out with `apiVersion` rewritten to the version asked for (no field conversion).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;

use super::schema::Schema;

/// Which Cluster API versions (`cluster.x-k8s.io`) the server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CapiVersions {
    V1Beta1,
    V1Beta2,
    #[default]
    Both,
}

impl CapiVersions {
    fn versions(self) -> Vec<String> {
        match self {
            Self::V1Beta1 => vec!["v1beta1".into()],
            Self::V1Beta2 => vec!["v1beta2".into()],
            Self::Both => vec!["v1beta2".into(), "v1beta1".into()],
        }
    }
}

/// One served resource. `versions` is in preference order (the first is the preferred version).
#[derive(Debug, Clone, Serialize)]
pub struct ResourceDef {
    pub group: String,
    pub versions: Vec<String>,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
    pub status: bool,
    pub scale: bool,
    /// Create-only subresources such as `binding` and `eviction` of pods.
    pub actions: Vec<String>,
    /// Built-in kinds accept strategic merge patch; custom resources do not.
    pub builtin: bool,
    /// Fields usable in a fieldSelector besides metadata.name and metadata.namespace.
    pub selectable_fields: Vec<String>,
    /// The storage of another resource this one is a view of (core/v1 Events are stored as
    /// events.k8s.io/v1 Events), by its `storage_key`.
    pub stored_as: Option<String>,
}

impl ResourceDef {
    /// A custom resource (CRD-like): not built in, so `metadata.generation` is maintained.
    pub fn custom(
        group: &str,
        versions: &[&str],
        kind: &str,
        plural: &str,
        namespaced: bool,
    ) -> Self {
        Self {
            group: group.into(),
            versions: versions.iter().map(|v| v.to_string()).collect(),
            kind: kind.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            short_names: Vec::new(),
            namespaced,
            status: false,
            scale: false,
            actions: Vec::new(),
            builtin: false,
            selectable_fields: Vec::new(),
            stored_as: None,
        }
    }

    fn builtin(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        Self {
            builtin: true,
            ..Self::custom(group, &[version], kind, plural, namespaced)
        }
    }

    pub fn with_status(mut self) -> Self {
        self.status = true;
        self
    }

    pub fn with_scale(mut self) -> Self {
        self.scale = true;
        self
    }

    pub fn with_short_names(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|n| n.to_string()).collect();
        self
    }

    fn with_actions(mut self, actions: &[&str]) -> Self {
        self.actions = actions.iter().map(|n| n.to_string()).collect();
        self
    }

    fn stored_as(mut self, key: &str) -> Self {
        self.stored_as = Some(key.to_string());
        self
    }

    fn with_fields(mut self, fields: &[&str]) -> Self {
        self.selectable_fields = fields.iter().map(|n| n.to_string()).collect();
        self
    }

    /// The key of this resource's storage, shared by all its versions.
    pub fn storage_key(&self) -> String {
        match &self.stored_as {
            Some(key) => key.clone(),
            None => format!("{}/{}", self.group, self.plural),
        }
    }

    /// `apiVersion` for objects served at `version`.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// Whether `metadata.generation` is maintained: custom resources and built-ins with a status.
    pub fn tracks_generation(&self) -> bool {
        !self.builtin || self.status
    }

    pub fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|v| v == version)
    }

    pub fn preferred_version(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }
}

/// Every resource the server knows.
#[derive(Debug, Clone)]
pub struct Registry {
    defs: Vec<ResourceDef>,
    schemas: Arc<Schemas>,
}

/// Compiled CRD schemas by `group/plural/version`.
type Schemas = HashMap<String, Arc<Schema>>;

const CAPI: &str = "cluster.x-k8s.io";

impl Registry {
    /// The project's resources, Cluster API in the versions asked for, plus `extra`.
    pub fn new(capi: CapiVersions, extra: Vec<ResourceDef>) -> Result<Self, String> {
        let mut defs = core_resources();
        let capi_versions = capi.versions();
        let capi_v: Vec<&str> = capi_versions.iter().map(String::as_str).collect();
        defs.extend([
            ResourceDef::custom(CAPI, &capi_v, "Machine", "machines", true)
                .with_status()
                .with_short_names(&["ma"]),
            ResourceDef::custom(CAPI, &capi_v, "MachineSet", "machinesets", true)
                .with_status()
                .with_scale()
                .with_short_names(&["ms"]),
            ResourceDef::custom(
                CAPI,
                &capi_v,
                "MachineDeployment",
                "machinedeployments",
                true,
            )
            .with_status()
            .with_scale()
            .with_short_names(&["md"]),
            ResourceDef::custom(CAPI, &capi_v, "MachinePool", "machinepools", true)
                .with_status()
                .with_scale()
                .with_short_names(&["mp"]),
            ResourceDef::custom(CAPI, &capi_v, "Cluster", "clusters", true)
                .with_status()
                .with_short_names(&["cl"]),
        ]);
        for def in extra {
            if def.versions.is_empty() || def.plural.is_empty() || def.kind.is_empty() {
                return Err(format!(
                    "{}: needs a kind, a plural and at least one version",
                    def.plural
                ));
            }
            if defs
                .iter()
                .any(|d| d.group == def.group && d.plural == def.plural)
            {
                return Err(format!(
                    "{}.{} is already registered",
                    def.plural, def.group
                ));
            }
            defs.push(def);
        }
        let schemas = crd_schemas()?.clone();
        Ok(Self { defs, schemas })
    }

    /// The compiled schema of a custom resource at `version` (None for built-ins, and for
    /// custom resources this project has no CRD for, such as Cluster API's).
    pub fn schema(&self, def: &ResourceDef, version: &str) -> Option<&Schema> {
        if def.builtin {
            return None;
        }
        self.schemas
            .get(&format!("{}/{}/{version}", def.group, def.plural))
            .map(Arc::as_ref)
    }

    pub fn all(&self) -> &[ResourceDef] {
        &self.defs
    }

    /// The resource served at `/apis/{group}/{version}/{plural}` (group "" for `/api/v1`).
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceDef> {
        self.defs
            .iter()
            .find(|d| d.group == group && d.plural == plural && d.serves(version))
    }

    /// Resolves `plural` or `plural.group` (the core group wins for a bare plural such as `events`).
    pub fn by_name(&self, resource: &str) -> Option<&ResourceDef> {
        if let Some(d) = self
            .defs
            .iter()
            .find(|d| d.plural == resource && d.group.is_empty())
        {
            return Some(d);
        }
        self.defs.iter().find(|d| {
            d.plural == resource
                || resource
                    .strip_prefix(d.plural.as_str())
                    .and_then(|rest| rest.strip_prefix('.'))
                    .is_some_and(|g| g == d.group)
        })
    }

    /// Groups in first-registered order, each with its versions in preference order.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for def in self.defs.iter().filter(|d| !d.group.is_empty()) {
            let entry = match groups.iter().position(|(g, _)| *g == def.group) {
                Some(i) => &mut groups[i].1,
                None => {
                    groups.push((def.group.clone(), Vec::new()));
                    let last = groups.len() - 1;
                    &mut groups[last].1
                }
            };
            for v in &def.versions {
                if !entry.contains(v) {
                    entry.push(v.clone());
                }
            }
        }
        for (_, versions) in &mut groups {
            versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        }
        groups
    }

    /// Resources served at one group version.
    pub fn in_group_version<'a>(
        &'a self,
        group: &'a str,
        version: &'a str,
    ) -> impl Iterator<Item = &'a ResourceDef> {
        self.defs
            .iter()
            .filter(move |d| d.group == group && d.serves(version))
    }
}

/// The schemas of every CRD this project serves ([`crate::project_crds`]) and of Cluster API's
/// kinds (upstream's CRDs, where the upstream directory holds them), compiled once per process;
/// a schema or CEL rule that does not compile fails every registry.
fn crd_schemas() -> Result<&'static Arc<Schemas>, String> {
    static SCHEMAS: OnceLock<Result<Arc<Schemas>, String>> = OnceLock::new();
    SCHEMAS
        .get_or_init(|| {
            let mut schemas = Schemas::new();
            for crd in crate::project_crds::all()?.into_iter().chain(capi_crds()?) {
                let (group, plural) = (&crd.spec.group, &crd.spec.names.plural);
                for v in &crd.spec.versions {
                    let Some(open_api) = v
                        .schema
                        .as_ref()
                        .and_then(|s| s.open_api_v3_schema.as_ref())
                        .and_then(|s| serde_json::to_value(s).ok())
                    else {
                        continue;
                    };
                    let schema = Schema::compile(&open_api)
                        .map_err(|e| format!("CRD {plural}.{group} {}: {e}", v.name))?;
                    schemas.insert(format!("{group}/{plural}/{}", v.name), Arc::new(schema));
                }
            }
            Ok(Arc::new(schemas))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Cluster API's CRDs from the upstream directory: kube-apiserver checks Cluster API's kinds
/// against them, so the simulated server does too. A file that is not there is skipped (the
/// repository does not carry them, and a build without the directory must still run); one that
/// is there but unreadable fails. The upstream directory holds no Cluster CRD; the one of the
/// Cluster API release `.ci/install-cluster-api` built is read when it is there.
fn capi_crds() -> Result<Vec<CustomResourceDefinition>, String> {
    let dir = super::upstream::crds_dir();
    let cluster = crate::controlplane::cluster_api::root_from_env()
        .join(crate::controlplane::cluster_api::RELEASE_V1BETA2)
        .join("crds/cluster.x-k8s.io_clusters.yaml");
    let files = super::upstream::CAPI_CRDS.iter().map(|name| dir.join(name));
    let mut crds = Vec::new();
    for file in files.chain([cluster]) {
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("reading {}: {e}", file.display())),
        };
        crds.push(serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?);
    }
    Ok(crds)
}

/// Kubernetes version priority: GA > beta > alpha, then the higher number.
fn version_priority(v: &str) -> (u8, u32, u32) {
    let Some(rest) = v.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    let (level, minor_str) = if tail.is_empty() {
        (3, "")
    } else if let Some(m) = tail.strip_prefix("beta") {
        (2, m)
    } else if let Some(m) = tail.strip_prefix("alpha") {
        (1, m)
    } else {
        (0, "")
    };
    (level, major, minor_str.parse().unwrap_or(0))
}

/// The resources served whatever the Cluster API versions, Kubernetes' own and the project's,
/// in the order they are registered.
fn core_resources() -> Vec<ResourceDef> {
    [
        cluster_resources(),
        workload_resources(),
        storage_resources(),
        install_resources(),
        karpenter_resources(),
        capacity_resources(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The core of a cluster: namespaces, nodes, pods and what pods are configured and reported
/// with.
fn cluster_resources() -> Vec<ResourceDef> {
    let b = ResourceDef::builtin;
    vec![
        b("", "v1", "Namespace", "namespaces", false)
            .with_status()
            .with_short_names(&["ns"])
            .with_fields(&["status.phase"]),
        b("", "v1", "Node", "nodes", false)
            .with_status()
            .with_short_names(&["no"])
            .with_fields(&["spec.unschedulable", "spec.providerID"]),
        b("", "v1", "Pod", "pods", true)
            .with_status()
            .with_short_names(&["po"])
            .with_actions(&["binding", "eviction"])
            .with_fields(&[
                "spec.nodeName",
                "spec.schedulerName",
                "spec.restartPolicy",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ]),
        b("", "v1", "Event", "events", true)
            .with_short_names(&["ev"])
            .with_fields(&[
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ])
            .stored_as("events.k8s.io/events"),
        b("", "v1", "ConfigMap", "configmaps", true).with_short_names(&["cm"]),
        b("", "v1", "Secret", "secrets", true),
        b("", "v1", "ServiceAccount", "serviceaccounts", true).with_short_names(&["sa"]),
        b("events.k8s.io", "v1", "Event", "events", true).with_short_names(&["ev"]),
    ]
}

/// Workloads, their disruption budgets, and leases.
fn workload_resources() -> Vec<ResourceDef> {
    let b = ResourceDef::builtin;
    vec![
        b("apps", "v1", "DaemonSet", "daemonsets", true)
            .with_status()
            .with_short_names(&["ds"]),
        b("apps", "v1", "Deployment", "deployments", true)
            .with_status()
            .with_scale()
            .with_short_names(&["deploy"]),
        b("apps", "v1", "ReplicaSet", "replicasets", true)
            .with_status()
            .with_scale()
            .with_short_names(&["rs"]),
        // Stored and served, nothing acts on them: their selectors are what default topology
        // spread constraints deduce a pod's selector from (as are ReplicaSets' and Services').
        b("apps", "v1", "StatefulSet", "statefulsets", true)
            .with_status()
            .with_scale()
            .with_short_names(&["sts"]),
        b(
            "",
            "v1",
            "ReplicationController",
            "replicationcontrollers",
            true,
        )
        .with_status()
        .with_scale()
        .with_short_names(&["rc"]),
        b(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
        )
        .with_status()
        .with_short_names(&["pdb"]),
        b("coordination.k8s.io", "v1", "Lease", "leases", true),
    ]
}

/// Storage: what a drain waits for (VolumeAttachments) and how a pod's volume maps to one.
fn storage_resources() -> Vec<ResourceDef> {
    let b = ResourceDef::builtin;
    vec![
        b(
            "",
            "v1",
            "PersistentVolumeClaim",
            "persistentvolumeclaims",
            true,
        )
        .with_status()
        .with_short_names(&["pvc"]),
        b("", "v1", "PersistentVolume", "persistentvolumes", false)
            .with_status()
            .with_short_names(&["pv"]),
        b(
            "storage.k8s.io",
            "v1",
            "StorageClass",
            "storageclasses",
            false,
        )
        .with_short_names(&["sc"]),
        b("storage.k8s.io", "v1", "CSINode", "csinodes", false),
        b(
            "storage.k8s.io",
            "v1",
            "VolumeAttachment",
            "volumeattachments",
            false,
        )
        .with_status(),
    ]
}

/// What a controller's own install needs, so `kubectl apply` of the deploy files works against
/// the simulated cluster (stored and served; nothing acts on them).
fn install_resources() -> Vec<ResourceDef> {
    let b = ResourceDef::builtin;
    vec![
        b("", "v1", "Service", "services", true)
            .with_status()
            .with_short_names(&["svc"]),
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            false,
        ),
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
        ),
        b("rbac.authorization.k8s.io", "v1", "Role", "roles", true),
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            true,
        ),
        b(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
        )
        .with_status()
        .with_short_names(&["crd", "crds"]),
    ]
}

/// The controller's own resources.
fn karpenter_resources() -> Vec<ResourceDef> {
    vec![
        ResourceDef::custom("karpenter.sh", &["v1"], "NodePool", "nodepools", false)
            .with_status()
            .with_scale(),
        ResourceDef::custom("karpenter.sh", &["v1"], "NodeClaim", "nodeclaims", false)
            .with_status(),
        ResourceDef::custom(
            "karpenter.cluster.x-k8s.io",
            &["v1alpha1"],
            "ClusterAPINodeClass",
            "clusterapinodeclasses",
            false,
        )
        .with_status()
        .with_short_names(&["capinc"]),
        ResourceDef::custom(
            "karpenter.sh",
            &["v1alpha1"],
            "NodeOverlay",
            "nodeoverlays",
            false,
        )
        .with_status()
        .with_short_names(&["overlays"]),
    ]
}

/// CapacityBuffers and CapacityQuotas, and the PodTemplates buffers name.
fn capacity_resources() -> Vec<ResourceDef> {
    let b = ResourceDef::builtin;
    vec![
        // A buffer's chunk shape (`spec.podTemplateRef`): stored and served, nothing acts on it.
        b("", "v1", "PodTemplate", "podtemplates", true),
        ResourceDef::custom(
            "autoscaling.x-k8s.io",
            &["v1beta1"],
            "CapacityBuffer",
            "capacitybuffers",
            true,
        )
        .with_status()
        .with_short_names(&["cb"]),
        ResourceDef::custom(
            "autoscaling.x-k8s.io",
            &["v1beta1"],
            "CapacityQuota",
            "capacityquotas",
            false,
        )
        .with_status()
        .with_short_names(&["cq"]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capi_prefers_v1beta2_and_shares_storage() {
        let r = Registry::new(CapiVersions::Both, vec![]).unwrap();
        let groups = r.groups();
        let capi = groups.iter().find(|(g, _)| g == CAPI).unwrap();
        assert_eq!(capi.1, vec!["v1beta2", "v1beta1"]);
        let a = r.lookup(CAPI, "v1beta1", "machines").unwrap();
        let b = r.lookup(CAPI, "v1beta2", "machines").unwrap();
        assert_eq!(a.storage_key(), b.storage_key());
    }

    /// With the Cluster API release built, its Cluster schema is checked as kube-apiserver
    /// checks it: a v1beta2 Cluster needs a `spec` with one property at least.
    #[test]
    fn a_cluster_is_checked_against_cluster_apis_schema_when_built() {
        let crd = crate::controlplane::cluster_api::root_from_env()
            .join(crate::controlplane::cluster_api::RELEASE_V1BETA2)
            .join("crds/cluster.x-k8s.io_clusters.yaml");
        if !crd.exists() {
            eprintln!(
                "skipped: no {} (.ci/install-cluster-api builds it)",
                crd.display()
            );
            return;
        }
        let r = Registry::new(CapiVersions::Both, vec![]).unwrap();
        let def = r.lookup(CAPI, "v1beta2", "clusters").unwrap();
        let cluster = |spec: serde_json::Value| {
            serde_json::json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": "c", "namespace": "ns"}, "spec": spec})
        };
        let mut empty = cluster(serde_json::json!({}));
        assert!(crate::validate::admit_custom(&r, def, &mut empty, None).is_err());
        let mut network = cluster(serde_json::json!({"clusterNetwork":
            {"pods": {"cidrBlocks": ["192.168.0.0/16"]}}}));
        let admitted = crate::validate::admit_custom(&r, def, &mut network, None);
        assert!(admitted.is_ok(), "{admitted:?}");
    }

    #[test]
    fn only_served_capi_versions_resolve() {
        let r = Registry::new(CapiVersions::V1Beta1, vec![]).unwrap();
        assert!(r.lookup(CAPI, "v1beta2", "machines").is_none());
        assert!(r.lookup(CAPI, "v1beta1", "machines").is_some());
    }

    #[test]
    fn by_name_resolves_plural_and_qualified() {
        let r = Registry::new(CapiVersions::Both, vec![]).unwrap();
        assert_eq!(r.by_name("events").unwrap().group, "");
        assert_eq!(
            r.by_name("events.events.k8s.io").unwrap().group,
            "events.k8s.io"
        );
        assert_eq!(r.by_name("nodeclaims").unwrap().group, "karpenter.sh");
        assert!(r.by_name("nothing").is_none());
    }

    #[test]
    fn version_priority_orders_like_kubernetes() {
        let mut v = vec!["v1alpha4", "v1beta1", "v1", "v1beta2"];
        v.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        assert_eq!(v, vec!["v1", "v1beta2", "v1beta1", "v1alpha4"]);
    }
}
