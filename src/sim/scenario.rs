//! The default `simulate` scenario: three MachineDeployment sizes that scale from zero, a
//! ClusterAPINodeClass and a NodePool, and a batch of pending pods. It starts a `SimCluster`,
//! seeds it, lets the stand-ins settle and reports what the API server saw.
//!
//! No controller is wired in here yet: without one nobody raises replicas, so the pods stay
//! pending (marked Unschedulable by the scheduler stand-in) and the summary says so.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde::Serialize;
use serde_json::json;

use super::capi::dynamic;
use super::cluster::{Error, MachineDeploymentSeed, PodShape, SimCluster, SimClusterConfig};
use crate::api::wellknown::{
    CAPACITY_TYPE_LABEL, CPU_ANNOTATION, EPHEMERAL_DISK_ANNOTATION, INSTANCE_TYPE_LABEL,
    LABELS_ANNOTATION, MAX_PODS_ANNOTATION, MAX_SIZE_ANNOTATION, MEMBER_LABEL, MEMORY_ANNOTATION,
    MIN_SIZE_ANNOTATION, NODECLASS_GROUP, NODECLASS_KIND, PRICE_ANNOTATION, ZONE_LABEL,
};

pub const NAMESPACE: &str = "default";
/// Template label the default NodePool requires (as in the upstream example NodePool).
pub const WORKLOAD_LABEL: &str = "node.cluster.x-k8s.io";
pub const WORKLOAD_VALUE: &str = "workload-target";

#[derive(Clone, Debug)]
pub struct ScenarioConfig {
    pub cluster: SimClusterConfig,
    /// Pending pods to create (500m / 1Gi each).
    pub pods: usize,
    /// How long to let the simulated cluster run after seeding.
    pub settle: Duration,
    /// Print progress lines on stderr.
    pub progress: bool,
}

impl Default for ScenarioConfig {
    fn default() -> Self {
        Self {
            cluster: SimClusterConfig::default(),
            pods: 10,
            settle: Duration::from_secs(2),
            progress: true,
        }
    }
}

/// One MachineDeployment size of the default scenario.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    pub name: &'static str,
    pub cpu: &'static str,
    pub memory: &'static str,
    pub price: &'static str,
    pub zone: &'static str,
    pub max_size: u32,
}

pub const SIZES: [Size; 3] = [
    Size {
        name: "sim-small",
        cpu: "2",
        memory: "4Gi",
        price: "0.10",
        zone: "us-east-1a",
        max_size: 20,
    },
    Size {
        name: "sim-medium",
        cpu: "4",
        memory: "16Gi",
        price: "0.25",
        zone: "us-east-1b",
        max_size: 10,
    },
    Size {
        name: "sim-large",
        cpu: "8",
        memory: "32Gi",
        price: "0.55",
        zone: "us-east-1c",
        max_size: 5,
    },
];

/// What the run produced, measured from the API server.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub capi_version: String,
    pub machine_deployments: usize,
    pub machines: usize,
    pub machines_with_provider_id: usize,
    pub nodes: usize,
    pub nodes_ready: usize,
    pub pods: usize,
    pub pods_bound: usize,
    pub pods_unschedulable: usize,
    pub api_writes: usize,
    pub elapsed_ms: u64,
    pub controller: bool,
    pub notes: Vec<String>,
}

impl Summary {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "simulated cluster (Cluster API {})", self.capi_version)?;
        writeln!(f, "  machine deployments  {}", self.machine_deployments)?;
        writeln!(
            f,
            "  machines             {} ({} with a provider ID)",
            self.machines, self.machines_with_provider_id
        )?;
        writeln!(
            f,
            "  nodes                {} ({} ready)",
            self.nodes, self.nodes_ready
        )?;
        writeln!(
            f,
            "  pods                 {} ({} bound, {} unschedulable)",
            self.pods, self.pods_bound, self.pods_unschedulable
        )?;
        writeln!(f, "  API writes           {}", self.api_writes)?;
        writeln!(f, "  elapsed              {} ms", self.elapsed_ms)?;
        for note in &self.notes {
            writeln!(f, "  note: {note}")?;
        }
        Ok(())
    }
}

/// Starts a cluster, seeds the default scenario, lets it settle, and summarises.
pub async fn run_default(cfg: ScenarioConfig) -> Result<Summary, Error> {
    let started = Instant::now();
    let say = |line: String| {
        if cfg.progress {
            eprintln!("[simulate] {line}");
        }
    };
    let cluster = SimCluster::start(cfg.cluster.clone()).await?;
    say(format!(
        "API server up, kubeconfig at {}",
        cluster.kubeconfig_path().display()
    ));
    seed_default(&cluster).await?;
    say(format!(
        "seeded {} MachineDeployments, ClusterAPINodeClass default, NodePool default",
        SIZES.len()
    ));
    cluster
        .create_deployment(
            NAMESPACE,
            "inflate",
            cfg.pods,
            &PodShape::new("500m", "1Gi"),
        )
        .await?;
    say(format!("created {} pending pods (500m, 1Gi)", cfg.pods));
    say("no controller is wired into `simulate` yet: pods stay pending".to_string());
    tokio::time::sleep(cfg.settle).await;

    let mut summary = summarise(&cluster).await?;
    summary.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    summary.notes.push(
        "no controller ran: MachineDeployments stay at zero replicas and pods stay pending".into(),
    );
    say(format!(
        "{} of {} pods bound, {} unschedulable",
        summary.pods_bound, summary.pods, summary.pods_unschedulable
    ));
    cluster.shutdown().await;
    Ok(summary)
}

/// Seeds the scenario's MachineDeployments (scale-from-zero, member label, sizes, prices,
/// zones), their templates, the ClusterAPINodeClass and the NodePool.
pub async fn seed_default(cluster: &SimCluster) -> Result<(), Error> {
    for size in SIZES {
        let labels_annotation = format!(
            "kubernetes.io/arch=amd64,kubernetes.io/os=linux,{CAPACITY_TYPE_LABEL}=on-demand,{INSTANCE_TYPE_LABEL}={},{ZONE_LABEL}={}",
            size.name, size.zone
        );
        let annotations = BTreeMap::from([
            (CPU_ANNOTATION.to_string(), size.cpu.to_string()),
            (MEMORY_ANNOTATION.to_string(), size.memory.to_string()),
            (EPHEMERAL_DISK_ANNOTATION.to_string(), "100Gi".to_string()),
            (MAX_PODS_ANNOTATION.to_string(), "110".to_string()),
            (LABELS_ANNOTATION.to_string(), labels_annotation),
            (MIN_SIZE_ANNOTATION.to_string(), "0".to_string()),
            (MAX_SIZE_ANNOTATION.to_string(), size.max_size.to_string()),
            (PRICE_ANNOTATION.to_string(), size.price.to_string()),
        ]);
        cluster
            .create_machine_template(
                NAMESPACE,
                size.name,
                BTreeMap::from([
                    ("cpu".to_string(), size.cpu.to_string()),
                    ("memory".to_string(), size.memory.to_string()),
                ]),
            )
            .await?;
        cluster
            .create_machine_deployment_from(&MachineDeploymentSeed {
                name: size.name.into(),
                namespace: NAMESPACE.into(),
                replicas: 0,
                labels: BTreeMap::from([(MEMBER_LABEL.to_string(), String::new())]),
                template_labels: BTreeMap::from([(
                    WORKLOAD_LABEL.to_string(),
                    WORKLOAD_VALUE.to_string(),
                )]),
                annotations,
                ..Default::default()
            })
            .await?;
    }
    create_cluster_scoped(
        cluster,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(NODECLASS_GROUP, "v1alpha1", NODECLASS_KIND),
            "clusterapinodeclasses",
        ),
        json!({
            "apiVersion": format!("{NODECLASS_GROUP}/v1alpha1"),
            "kind": NODECLASS_KIND,
            "metadata": {"name": "default"},
            "spec": {"scalableResourceSelector": {"matchLabels": {}}},
        }),
    )
    .await?;
    create_cluster_scoped(
        cluster,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool"),
            "nodepools",
        ),
        json!({
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodePool",
            "metadata": {"name": "default"},
            "spec": {
                "template": {"spec": {
                    "requirements": [
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                        {"key": WORKLOAD_LABEL, "operator": "In", "values": [WORKLOAD_VALUE]},
                        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]},
                    ],
                    "nodeClassRef": {"group": NODECLASS_GROUP, "kind": NODECLASS_KIND, "name": "default"},
                    "expireAfter": "720h",
                }},
                "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "30s"},
                "limits": {"cpu": "200"},
            },
        }),
    )
    .await
}

async fn create_cluster_scoped(
    cluster: &SimCluster,
    ar: &ApiResource,
    body: serde_json::Value,
) -> Result<(), Error> {
    let api: Api<DynamicObject> = Api::all_with(cluster.client(), ar);
    let obj = dynamic(body);
    api.create(&PostParams::default(), &obj)
        .await
        .map(|_| ())
        .map_err(|source| Error::Kube {
            what: format!(
                "create {} {}",
                ar.kind,
                obj.metadata.name.unwrap_or_default()
            ),
            source,
        })
}

/// Counts objects as the API server has them now.
pub async fn summarise(cluster: &SimCluster) -> Result<Summary, Error> {
    let client = cluster.client();
    let v = cluster.capi_version();
    let err = |what: &str| {
        let what = what.to_string();
        move |source| Error::Kube { what, source }
    };
    let lp = ListParams::default();
    let mds = Api::<DynamicObject>::all_with(client.clone(), &v.machine_deployment())
        .list(&lp)
        .await
        .map_err(err("list MachineDeployments"))?
        .items;
    let machines = Api::<DynamicObject>::all_with(client.clone(), &v.machine())
        .list(&lp)
        .await
        .map_err(err("list Machines"))?
        .items;
    let nodes = Api::<Node>::all(client.clone())
        .list(&lp)
        .await
        .map_err(err("list Nodes"))?
        .items;
    let pods = Api::<Pod>::all(client)
        .list(&lp)
        .await
        .map_err(err("list Pods"))?
        .items;
    let unschedulable = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
    };
    Ok(Summary {
        capi_version: v.as_str().to_string(),
        machine_deployments: mds.len(),
        machines: machines.len(),
        machines_with_provider_id: machines
            .iter()
            .filter(|m| super::standin::str_at(&m.data, &["spec", "providerID"]).is_some())
            .count(),
        nodes: nodes.len(),
        nodes_ready: nodes
            .iter()
            .filter(|n| super::kubelet::node_ready(n))
            .count(),
        pods: pods.len(),
        pods_bound: pods
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
            .count(),
        pods_unschedulable: pods.iter().filter(|p| unschedulable(p)).count(),
        api_writes: cluster.stats().writes().len(),
        elapsed_ms: 0,
        controller: false,
        notes: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_renders_as_text_and_json() {
        let s = Summary {
            capi_version: "v1beta2".into(),
            pods: 3,
            notes: vec!["n".into()],
            ..Default::default()
        };
        let text = s.to_string();
        assert!(
            text.contains("Cluster API v1beta2") && text.contains("note: n"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(json["pods"], 3);
    }
}
