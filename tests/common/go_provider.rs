//! What the Go Cluster API provider (kubernetes-sigs/karpenter-provider-cluster-api) and the
//! upstream Karpenter core it runs in leave in a cluster, written request by request as they
//! write it, with none of this controller's code: claims created by the core's provisioner
//! (finalizer, NodePool hash stamps), replicas raised by the provider's create batch, Machines
//! claimed with the member label and named on the claim with `cluster.x-k8s.io/machine`, the
//! core's launch, registration and initialization, and the provider's delete (the Machine
//! marked `cluster.x-k8s.io/delete-machine`, then the decrement).

use std::collections::BTreeSet;

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use karpenter_capi::api::nodeclaim::NodeClaim;
use karpenter_capi::api::wellknown::*;

use super::{Env, NS};

/// Upstream Karpenter v1.14.1's hash of the seeded NodePool's template (nodeClassRef `default`,
/// capacity-type on-demand, `expireAfter: 720h`), as its own code computes it.
pub const UPSTREAM_HASH: &str = "18334128632711491354";
/// The annotation the provider names a claim's Machine with.
pub const GO_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/machine";

/// The seeded NodePool.
const NODEPOOL: &str = "default";

/// The provider's field manager, as the server records it.
const MANAGER: &str = "karpenter-provider-cluster-api";

pub struct GoProvider {
    client: kube::Client,
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind),
        plural,
    )
}

impl GoProvider {
    pub async fn new(env: &Env) -> Self {
        GoProvider {
            client: env.client().await,
        }
    }

    fn machines(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NS, &resource("Machine", "machines"))
    }

    fn deployments(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            NS,
            &resource("MachineDeployment", "machinedeployments"),
        )
    }

    fn claims(&self) -> Api<NodeClaim> {
        Api::all(self.client.clone())
    }

    fn params() -> PatchParams {
        PatchParams {
            field_manager: Some(MANAGER.into()),
            ..PatchParams::default()
        }
    }

    /// Upstream's NodePool hash controller stamps the NodePool; the template is pinned to the one
    /// `UPSTREAM_HASH` was computed from.
    pub async fn stamp_nodepool(&self) {
        let api: Api<karpenter_capi::api::nodepool::NodePool> = Api::all(self.client.clone());
        api.patch(
            NODEPOOL,
            &Self::params(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {
                    NODEPOOL_HASH_ANNOTATION: UPSTREAM_HASH,
                    NODEPOOL_HASH_VERSION_ANNOTATION: NODEPOOL_HASH_VERSION}},
                "spec": {"template": {"spec": {"expireAfter": "720h"}}}
            })),
        )
        .await
        .expect("stamp the NodePool");
    }

    /// The core's provisioner creates a claim for `instance_type` (with its termination
    /// finalizer, added by the core's lifecycle controller before the provider's Create).
    pub async fn create_claim(&self, name: &str, instance_type: &str, node_class: Value) -> String {
        let body = json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {
                "name": name,
                "labels": {NODEPOOL_LABEL: NODEPOOL},
                "annotations": {
                    NODEPOOL_HASH_ANNOTATION: UPSTREAM_HASH,
                    NODEPOOL_HASH_VERSION_ANNOTATION: NODEPOOL_HASH_VERSION,
                },
                "finalizers": [TERMINATION_FINALIZER],
            },
            "spec": {
                "nodeClassRef": node_class,
                "expireAfter": "720h",
                "requirements": [
                    {"key": NODEPOOL_LABEL, "operator": "In", "values": [NODEPOOL]},
                    {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [instance_type]},
                    {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]},
                    // The core copies the NodePool's requirements (the adoption tests' pool
                    // requires the label Cluster API propagates from each node group).
                    {"key": "node.cluster.x-k8s.io/pool", "operator": "In", "values": ["md-0", "md-1"]},
                ],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            },
        });
        let claim: NodeClaim = serde_json::from_value(body).expect("claim body");
        self.claims()
            .create(&PostParams::default(), &claim)
            .await
            .expect("create the claim");
        name.to_string()
    }

    /// The create batch: raise `spec.replicas` by one (read, add, update).
    pub async fn raise(&self, md: &str) {
        self.step_replicas(md, 1).await;
    }

    /// The delete batch's decrement.
    pub async fn lower(&self, md: &str) {
        self.step_replicas(md, -1).await;
    }

    /// Read, change `spec.replicas` by `by` (not below 0), update; on a conflict (a stand-in
    /// wrote the MachineDeployment between the read and the update) read again, as the Go
    /// provider's client retries on conflict.
    async fn step_replicas(&self, md: &str, by: i64) {
        loop {
            let mut obj = self
                .deployments()
                .get(md)
                .await
                .expect("read the MachineDeployment");
            let replicas = obj.data["spec"]["replicas"].as_i64().unwrap_or(0);
            obj.data["spec"]["replicas"] = json!((replicas + by).max(0));
            obj.metadata.managed_fields = None;
            match self
                .deployments()
                .replace(md, &PostParams::default(), &obj)
                .await
            {
                Ok(_) => return,
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => panic!("change the replicas by {by}: {e}"),
            }
        }
    }

    /// The create batch's poll: a Machine of `md` not claimed (no member label), not marked,
    /// not deleting, and not in `taken`.
    pub async fn unclaimed_machine(&self, env: &Env, md: &str, taken: &BTreeSet<String>) -> String {
        env.wait("an unclaimed Machine", || {
            env.machines_of(md)
                .into_iter()
                .filter(|m| m["metadata"]["labels"].get(MEMBER_LABEL).is_none())
                .filter(|m| {
                    m["metadata"]["annotations"]
                        .get(DELETE_MACHINE_ANNOTATION)
                        .is_none()
                })
                .filter(|m| m["metadata"]["deletionTimestamp"].is_null())
                .filter_map(|m| m["metadata"]["name"].as_str().map(String::from))
                .find(|n| !taken.contains(n))
        })
        .await
    }

    /// The create batch's bind: the member label on the Machine, then the Machine's name on the
    /// claim (a merge patch).
    pub async fn bind(&self, machine: &str, claim: &str) {
        self.machines()
            .patch(
                machine,
                &Self::params(),
                &Patch::Merge(json!({"metadata": {"labels": {MEMBER_LABEL: ""}}})),
            )
            .await
            .expect("label the Machine");
        self.claims()
            .patch(
                claim,
                &Self::params(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    GO_MACHINE_ANNOTATION: format!("{NS}/{machine}")}}})),
            )
            .await
            .expect("name the Machine on the claim");
    }

    /// The core's launch, registration and initialization once the Machine has its provider ID
    /// and Node: the claim's labels and status, the Node's labels, finalizer, owner and taint.
    pub async fn launch_and_register(
        &self,
        env: &Env,
        claim: &str,
        machine: &str,
        instance_type: &str,
    ) {
        let pid = env
            .wait("the Machine's provider ID", || {
                env.get("machines", NS, machine)
                    .and_then(|m| m["spec"]["providerID"].as_str().map(String::from))
            })
            .await;
        let node = env
            .wait("the Machine's Node", || env.get("nodes", "", machine))
            .await;
        let c = self.claims().get(claim).await.expect("read the claim");
        let uid = c.metadata.uid.clone().unwrap_or_default();
        let labels = json!({
            INSTANCE_TYPE_LABEL: instance_type,
            CAPACITY_TYPE_LABEL: "on-demand",
            NODEPOOL_LABEL: NODEPOOL,
        });
        self.claims()
            .patch(
                claim,
                &Self::params(),
                &Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await
            .expect("claim labels");
        let capacity = node["status"]["capacity"].clone();
        let allocatable = node["status"]["allocatable"].clone();
        let cond = |t: &str| {
            json!({"type": t, "status": "True", "reason": t, "message": "",
                   "lastTransitionTime": "2026-01-01T00:00:00Z"})
        };
        self.claims()
            .patch_status(
                claim,
                &Self::params(),
                &Patch::Merge(json!({"status": {
                    "providerID": pid, "nodeName": machine,
                    "capacity": capacity, "allocatable": allocatable,
                    "conditions": [cond("Launched"), cond("Registered"), cond("Initialized"), cond("Ready")],
                }})),
            )
            .await
            .expect("claim status");
        let taints: Vec<Value> = node["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t["key"] != UNREGISTERED_TAINT_KEY)
            .collect();
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        nodes
            .patch(
                machine,
                &Self::params(),
                &Patch::Merge(json!({
                    "metadata": {
                        "labels": {REGISTERED_LABEL: "true", INITIALIZED_LABEL: "true",
                                   NODEPOOL_LABEL: NODEPOOL, INSTANCE_TYPE_LABEL: instance_type},
                        "finalizers": [TERMINATION_FINALIZER],
                        "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                            "name": claim, "uid": uid, "blockOwnerDeletion": true}],
                    },
                    "spec": {"taints": taints},
                })),
            )
            .await
            .expect("register the Node");
    }

    /// The core's termination up to the provider's Delete: the Node tainted, the claim deleted
    /// (held by the finalizer), drained and detached, then the Machine marked and the replica removed.
    pub async fn delete(&self, claim: &str, machine: &str, md: &str) {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let node = nodes.get(machine).await.expect("read the Node");
        let mut taints = node
            .spec
            .and_then(|s| s.taints)
            .map(|ts| serde_json::to_value(ts).unwrap_or_default())
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default();
        taints.push(json!({"key": DISRUPTED_TAINT_KEY, "effect": "NoSchedule"}));
        nodes
            .patch(
                machine,
                &Self::params(),
                &Patch::Merge(json!({"spec": {"taints": taints}})),
            )
            .await
            .expect("taint the Node");
        self.claims()
            .delete(claim, &DeleteParams::default())
            .await
            .expect("delete the claim");
        let cond = |t: &str| {
            json!({"type": t, "status": "True", "reason": t, "message": "",
                   "lastTransitionTime": "2026-01-01T00:00:00Z"})
        };
        self.claims()
            .patch_status(
                claim,
                &Self::params(),
                &Patch::Merge(json!({"status": {"conditions": [
                    cond("Launched"), cond("Registered"), cond("Initialized"), cond("Ready"),
                    cond("Drained"), cond("VolumesDetached"), cond("InstanceTerminating")]}})),
            )
            .await
            .expect("claim termination status");
        self.machines()
            .patch(
                machine,
                &Self::params(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    DELETE_MACHINE_ANNOTATION: "2026-11-26 17:00:00.000000000 +0000 UTC m=+42.0"}}})),
            )
            .await
            .expect("mark the Machine");
        self.lower(md).await;
    }
}

/// The core's provisioner with the provider's create, end to end: a claim bound to a Machine
/// of `md`, launched, registered and initialized. Returns (claim, machine).
pub async fn launched(
    go: &GoProvider,
    env: &Env,
    name: &str,
    md: &str,
    instance_type: &str,
    taken: &mut BTreeSet<String>,
) -> (String, String) {
    let claim = go.create_claim(name, instance_type, ours()).await;
    go.raise(md).await;
    let machine = go.unclaimed_machine(env, md, taken).await;
    taken.insert(machine.clone());
    go.bind(&machine, &claim).await;
    go.launch_and_register(env, &claim, &machine, instance_type)
        .await;
    // The offering's labels the provider returned at launch include the label Cluster API
    // propagates from the group's template, which the adoption tests' NodePool requires.
    go.claims()
        .patch(
            &claim,
            &GoProvider::params(),
            &Patch::Merge(json!({"metadata": {"labels": {"node.cluster.x-k8s.io/pool": md}}})),
        )
        .await
        .expect("claim labels");
    (claim, machine)
}

/// Our NodeClass kind, which the Go provider's claims use too.
pub fn ours() -> Value {
    json!({"group": NODECLASS_GROUP, "kind": NODECLASS_KIND, "name": "default"})
}
