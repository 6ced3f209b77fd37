//! `Env`'s helpers for claims, pools and MachineDeployments shared by the disruption tests and
//! the flows run on both backends, and the Events read through the API server (on either
//! backend, where the real one's mirror keeps none).

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use karpenter_capi::actors::DisruptionSettings;
use karpenter_capi::api::drift_hash::nodepool_hash;
use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::api::wellknown::{
    NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION, NODEPOOL_HASH_VERSION_ANNOTATION,
};
use karpenter_capi::sim::cluster::PodShape;
use karpenter_capi::simulate::launch::claim_for;

use super::{Env, NS, condition};

/// Every `events.k8s.io/v1` Event, read through the API server, so on either backend (the real
/// one's mirror keeps no Events).
pub async fn served_events(client: &kube::Client) -> Vec<Value> {
    karpenter_capi::simulate::events::all(client.clone())
        .await
        .expect("list Events")
}

/// Disruption passes at test speed: every 200 ms, validation 300 ms.
pub fn fast_disruption() -> DisruptionSettings {
    DisruptionSettings {
        poll: Duration::from_millis(200),
        debounce: Duration::from_millis(20),
        validation: Duration::from_millis(300),
        replacement_timeout: Duration::from_secs(60),
        ..DisruptionSettings::default()
    }
}

impl Env {
    /// Merges `patch` into the NodePool.
    pub async fn patch_pool(&self, patch: Value) {
        let api: Api<NodePool> = Api::all(self.karpenter_client().await);
        api.patch(
            &self.pool.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .expect("patch the NodePool");
    }

    pub async fn set_disruption(&self, disruption: Value) {
        self.patch_pool(json!({"spec": {"disruption": disruption}}))
            .await;
    }

    /// A claim as the provisioner writes it (with the pool's drift hash) on `instance_type`.
    pub async fn stamped_claim(&self, instance_type: &str) -> (String, String) {
        let mut claim = claim_for(&self.pool, instance_type);
        claim.annotations_mut().extend([
            (
                NODEPOOL_HASH_ANNOTATION.to_string(),
                nodepool_hash(&self.pool),
            ),
            (
                NODEPOOL_HASH_VERSION_ANNOTATION.to_string(),
                NODEPOOL_HASH_VERSION.to_string(),
            ),
        ]);
        self.create_and_wait(claim).await
    }

    /// Creates `claim` and waits until it is initialized; returns (claim, node).
    pub async fn create_and_wait(&self, claim: NodeClaim) -> (String, String) {
        let name = self.create_claim(&claim).await;
        let node = self
            .wait("the claim initialized", || {
                self.get("nodeclaims", "", &name).and_then(|c| {
                    (condition(&c, "Initialized")?["status"] == "True")
                        .then(|| c["status"]["nodeName"].as_str().map(String::from))
                        .flatten()
                })
            })
            .await;
        (name, node)
    }

    /// The controller's own metric starting with `needle` (0 when absent).
    pub fn metric(&self, needle: &str) -> f64 {
        self.metrics
            .encode()
            .lines()
            .find(|l| l.starts_with(needle))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Merges `body` into MachineDeployment `md-0`.
    pub async fn patch_md(&self, body: Value) {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client().await,
            NS,
            &self.sim.cluster().capi_version().machine_deployment(),
        );
        api.patch("md-0", &PatchParams::default(), &Patch::Merge(body))
            .await
            .expect("patch the MachineDeployment");
    }

    /// Pauses (or resumes) Cluster API's Cluster of the seeded MachineDeployments by its
    /// `spec.paused`, creating the Cluster where none exists (the stand-in needs none), and
    /// waits until the controller has seen it.
    pub async fn set_cluster_paused(&self, paused: bool) {
        self.merge_into_cluster(json!({"spec": {"paused": paused}}))
            .await;
        self.wait("the controller sees the Cluster's pause", || {
            let c = self.controller.as_ref()?;
            let d = c.shared.state.deployments.read();
            (d.all().any(|md| d.cluster_paused(md)) == paused).then_some(())
        })
        .await;
    }

    /// Merges `body` into the seeded Cluster, creating it with `body` if it does not exist.
    async fn merge_into_cluster(&self, body: Value) {
        let ar = self.sim.cluster().capi_version().cluster();
        let api: Api<DynamicObject> = Api::namespaced_with(self.client().await, NS, &ar);
        let name = karpenter_capi::sim::cluster::CLUSTER_NAME;
        if api.get_opt(name).await.expect("read the Cluster").is_some() {
            api.patch(name, &PatchParams::default(), &Patch::Merge(body))
                .await
                .expect("patch the Cluster");
        } else {
            let obj = DynamicObject::new(name, &ar).within(NS).data(body);
            api.create(&kube::api::PostParams::default(), &obj)
                .await
                .expect("create the Cluster");
        }
    }

    /// Gives the Cluster a ClusterClass topology whose workers are `machine_deployments` (the
    /// `spec.topology.workers.machineDeployments` list, replaced whole), creating the Cluster
    /// if need be, and waits until the controller sees whether a group's replicas are held.
    pub async fn set_cluster_topology(&self, machine_deployments: Value) {
        let holds = machine_deployments
            .as_array()
            .is_some_and(|l| l.iter().any(|e| !e["replicas"].is_null()));
        let body = json!({"spec": {"topology": {
            "classRef": {"name": "sim-class"}, "version": "v1.33.0",
            "workers": {"machineDeployments": machine_deployments},
        }}});
        self.merge_into_cluster(body).await;
        self.wait("the controller sees the Cluster's topology", || {
            let c = self.controller.as_ref()?;
            let d = c.shared.state.deployments.read();
            (d.all().any(|md| d.replicas_held(md).is_some()) == holds).then_some(())
        })
        .await;
    }

    /// Points md-0 at a new infrastructure template, created first as a user would (Cluster API
    /// clones it into each Machine).
    pub async fn change_template_of_md(&self, template: &str) {
        let templates: Api<DynamicObject> = Api::namespaced_with(
            self.client().await,
            NS,
            &karpenter_capi::sim::cluster::infra_template_resource(),
        );
        templates
            .create(
                &kube::api::PostParams::default(),
                &karpenter_capi::sim::cluster::infrastructure_template(NS, template),
            )
            .await
            .expect("create the new template");
        self.patch_md(
            json!({"spec": {"template": {"spec": {"infrastructureRef": {"name": template}}}}}),
        )
        .await;
    }

    /// Writes to MachineDeployments by the controller after `since_ms`: (ms, verb, name).
    pub fn controller_replica_writes_since(&self, since_ms: u64) -> Vec<(u64, String, String)> {
        self.sim
            .cluster()
            .stats()
            .writes()
            .into_iter()
            .filter(|w| {
                w.at_ms > since_ms
                    && w.agent == karpenter_capi::app::USER_AGENT
                    && w.resource == "machinedeployments"
            })
            .map(|w| (w.at_ms, w.verb, w.name))
            .collect()
    }

    pub fn machine_up_to_date(&self, m: &Value) -> Option<bool> {
        m.pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "UpToDate"))
            .map(|c| c["status"] == "True")
    }

    /// Deployment `name` of `replicas` pods of `shape` in the test namespace.
    pub async fn deployment(&self, name: &str, replicas: usize, shape: PodShape) {
        let name = name.to_string();
        self.sim
            .run(move |c| async move { c.create_deployment(NS, &name, replicas, &shape).await })
            .await
            .expect("the cluster's runtime")
            .expect("a Deployment");
    }

    /// Every `events.k8s.io/v1` Event with `reason`, read through the API server.
    pub async fn served_events(&self, reason: &str) -> Vec<Value> {
        let mut all = served_events(&self.client().await).await;
        all.retain(|e| e["reason"] == reason);
        all
    }

    /// The notes of the Events with `reason` about objects whose names start with `prefix`.
    pub async fn notes_about(&self, reason: &str, prefix: &str) -> Vec<String> {
        notes_about(&self.served_events(reason).await, prefix)
    }
}

/// The notes of `events` about objects whose names start with `prefix`.
pub fn notes_about(events: &[Value], prefix: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| {
            e["regarding"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .map(|e| e["note"].as_str().unwrap_or_default().to_string())
        .collect()
}
