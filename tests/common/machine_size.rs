//! A MachineDeployment made at run time from a template whose size annotations
//! (`sim::machine_size`) say what its machines are, as the controller's generated offerings
//! will be: the template is created after the cluster started, its provider publishes the size
//! in its `status.capacity`, the MachineDeployment is POSTed at 0 replicas with scale-from-zero
//! annotations that believe otherwise, scaled to 1 through the scale subresource, and its Node
//! registers with the template's size; deleting the MachineDeployment removes its MachineSets,
//! Machines and Node. Written once, run on the simulated backend (the Cluster API stand-in) and
//! beside Cluster API's real manager.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use karpenter_capi::api::wellknown::{CPU_ANNOTATION, DEPLOYMENT_NAME_LABEL, MEMORY_ANNOTATION};
use karpenter_capi::sim::cluster::{
    MachineDeploymentSeed, SimCluster, infra_template_resource, infrastructure_template,
};
use karpenter_capi::sim::machine_size;
use karpenter_capi::sim::standin::str_at;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::{NS, eventually};

const TEMPLATE: &str = "sized-8-32";
const MD: &str = "md-sized";

/// The whole scenario on `cluster` (started by the caller, on either backend).
pub async fn a_sized_template_decides_the_node(cluster: &SimCluster) {
    let client = cluster.client();
    let v = cluster.capi_version();

    // The template, created while the cluster runs, says its machines have 8 CPUs and 32 GiB.
    let templates: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &infra_template_resource());
    let mut template = infrastructure_template(NS, TEMPLATE);
    template.metadata.annotations = Some(BTreeMap::from([
        (machine_size::CPU_ANNOTATION.to_string(), "8".to_string()),
        (
            machine_size::MEMORY_ANNOTATION.to_string(),
            "32Gi".to_string(),
        ),
    ]));
    templates
        .create(&PostParams::default(), &template)
        .await
        .expect("create the sized template");
    eventually("the template's status.capacity says its size", || async {
        let t = templates.get(TEMPLATE).await.ok()?;
        let capacity = &t.data["status"]["capacity"];
        (capacity["cpu"] == "8" && capacity["memory"] == "32Gi").then_some(())
    })
    .await;

    // The MachineDeployment's scale-from-zero annotations believe 2 CPUs and 4 GiB.
    let seed = MachineDeploymentSeed {
        name: MD.into(),
        namespace: NS.into(),
        replicas: 0,
        annotations: BTreeMap::from([
            (CPU_ANNOTATION.to_string(), "2".to_string()),
            (MEMORY_ANNOTATION.to_string(), "4Gi".to_string()),
        ]),
        infrastructure_template: Some(TEMPLATE.into()),
        ..Default::default()
    };
    cluster
        .create_machine_deployment_from(&seed)
        .await
        .expect("create the MachineDeployment at 0 replicas");
    let mds: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &v.machine_deployment());
    mds.patch_scale(
        MD,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await
    .expect("scale the MachineDeployment to 1 through its scale subresource");

    let by_md = ListParams::default().labels(&format!("{DEPLOYMENT_NAME_LABEL}={MD}"));
    let sets: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &v.machine_set());
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &v.machine());
    let nodes: Api<Node> = Api::all(client.clone());
    let node = eventually(
        "a MachineSet, a Machine with a provider ID and its Node with its capacity reported",
        || async {
            if sets.list(&by_md).await.ok()?.items.is_empty() {
                return None;
            }
            let ms = machines.list(&by_md).await.ok()?.items;
            let [m] = ms.as_slice() else {
                return None;
            };
            let pid = str_at(&m.data, &["spec", "providerID"]).filter(|p| !p.is_empty())?;
            nodes
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(pid))
                // A kubelet registers its Node, then reports its status: wait for the report.
                .filter(|n| n.status.as_ref().is_some_and(|s| s.capacity.is_some()))
        },
    )
    .await;
    let capacity = node
        .status
        .as_ref()
        .and_then(|s| s.capacity.clone())
        .unwrap_or_default();
    assert_eq!(
        capacity.get("cpu").map(|q| q.0.as_str()),
        Some("8"),
        "the Node's capacity: {capacity:?}"
    );
    assert_eq!(
        capacity.get("memory").map(|q| q.0.as_str()),
        Some("32Gi"),
        "the Node's capacity: {capacity:?}"
    );

    // Deleting the MachineDeployment removes what it made, as Cluster API does.
    mds.delete(MD, &DeleteParams::default())
        .await
        .expect("delete the MachineDeployment");
    let node_name = node.name_any();
    eventually(
        "the MachineDeployment's MachineSets, Machines and Node gone",
        || async {
            let sets_left = sets.list(&by_md).await.ok()?.items.len();
            let machines_left = machines.list(&by_md).await.ok()?.items.len();
            let node_left = nodes.get_opt(&node_name).await.ok()?.is_some();
            let md_left = mds.get_opt(MD).await.ok()?.is_some();
            (sets_left == 0 && machines_left == 0 && !node_left && !md_left).then_some(())
        },
    )
    .await;
}
