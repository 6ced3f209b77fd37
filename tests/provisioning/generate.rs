//! Generated node groups (issue 44, docs/generate.md) end to end on the simulated cluster: a
//! NodeClass whose only offerings are the shapes of `spec.generate`, copied from a source
//! MachineDeployment that is not a member. Each test fails without the rule it names.

use std::time::Duration;

use karpenter_capi::api::nodeclass::ClusterAPINodeClass;
use karpenter_capi::capi::generate::{self, GENERATED_LABEL};
use karpenter_capi::capi::model::MachineDeployment;
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::sim::cluster::{MachineDeploymentSeed, PodShape};
use karpenter_capi::simulate::launch::NODECLASS;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use crate::common::{Env, NS, condition, md_seed};

const SOURCE: &str = "src";
const IDLE: &str = "3s";

/// The source: not a member (offered only through the NodeClass's shapes).
fn source() -> MachineDeploymentSeed {
    let mut s = md_seed(SOURCE, 0);
    s.labels.clear();
    s
}

fn generate_spec(patch_path: &str) -> Value {
    json!({
        "source": {"namespace": NS, "name": SOURCE},
        "shapes": {"cpu": [2, 4], "memory": ["8Gi", "16Gi"], "maxMemoryPerCPU": "4Gi"},
        "patches": [{"op": "add", "path": patch_path, "value": "{{cpu}}"}],
        "price": {"perCPUHour": "0.03", "perGiBHour": "0.004"},
        "maxMachineDeployments": 3,
        "idleAfter": IDLE,
    })
}

const SIZE_PATCH: &str = "/metadata/annotations/sim.karpenter.cluster.x-k8s.io~1cpu";

async fn env_with_generate(spec: Value) -> Env {
    let env = Env::builder()
        .cluster(super::autoscaler::cluster())
        .seeds(vec![source()])
        .short_batches()
        .start()
        .await;
    set_generate(&env, spec).await;
    env
}

async fn set_generate(env: &Env, spec: Value) {
    let api: Api<ClusterAPINodeClass> = Api::all(env.client().await);
    api.patch(
        NODECLASS,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"generate": spec}})),
    )
    .await
    .expect("spec.generate set");
}

/// The MachineDeployments carrying the mark.
fn generated(env: &Env) -> Vec<Value> {
    env.list("machinedeployments")
        .into_iter()
        .filter(|md| {
            md.pointer(&format!(
                "/metadata/labels/{}",
                GENERATED_LABEL.replace('/', "~1")
            ))
            .is_some()
        })
        .collect()
}

fn name(v: &Value) -> String {
    v["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn templates(env: &Env) -> Vec<Value> {
    env.list("devmachinetemplates")
}

fn nodeclass(env: &Env) -> Value {
    env.get("clusterapinodeclasses", "", NODECLASS)
        .expect("the NodeClass")
}

fn spec_of(v: &Value) -> Value {
    v["spec"].clone()
}

/// The group `spec.generate` would make for `shape` from the source as it is now.
fn planned(env: &Env, spec: &Value, shape: &str) -> generate::GroupPlan {
    let raw = env
        .get("machinedeployments", NS, SOURCE)
        .expect("the source");
    let src = MachineDeployment::from_value(&raw, CapiVersion::V1Beta2).expect("source model");
    let g = serde_json::from_value(spec.clone()).expect("spec.generate");
    let valid = generate::validate(&g).expect("valid");
    generate::plans(NODECLASS, &valid, &src)
        .into_iter()
        .find(|p| p.shape.name() == shape)
        .expect("the shape is offered")
}

#[actix::test]
async fn two_claims_for_one_new_shape_make_one_group_sized_by_its_template() {
    let env = env_with_generate(generate_spec(SIZE_PATCH)).await;
    let source_before = spec_of(&env.get("machinedeployments", NS, SOURCE).unwrap());
    // Two 3-CPU pods: each needs a 4-CPU node of its own, in one batch.
    env.deployment("pair", 2, PodShape::new("3", "1Gi")).await;
    env.until("both pods bound", |e| e.bound_pods() == 2).await;
    let groups = generated(&env);
    assert_eq!(groups.len(), 1, "one group for the shape: {groups:#?}");
    let g = &groups[0];
    assert!(name(g).starts_with("src-4c-8gi-"), "{}", name(g));
    assert_eq!(g["spec"]["replicas"], 2);
    assert_eq!(g["metadata"]["labels"][GENERATED_LABEL], NODECLASS);
    // Its own template, copied from the source's with the patch applied.
    let t = env
        .get("devmachinetemplates", NS, &name(g))
        .expect("the group's template");
    assert_eq!(t["metadata"]["labels"][GENERATED_LABEL], NODECLASS);
    assert_eq!(
        t["metadata"]["annotations"]["sim.karpenter.cluster.x-k8s.io/cpu"],
        "4"
    );
    assert_eq!(
        g["spec"]["template"]["spec"]["infrastructureRef"]["name"],
        json!(name(g))
    );
    assert_eq!(
        spec_of(&env.get("machinedeployments", NS, SOURCE).unwrap()),
        source_before,
        "the source is copied, never changed"
    );
    env.until("the NodeClass lists the group", |e| {
        nodeclass(e)["status"]["generated"]
            .as_array()
            .is_some_and(|l| l.len() == 1 && l[0]["shape"] == "4c-8gi" && l[0]["current"] == true)
    })
    .await;
    let nc = nodeclass(&env);
    assert_eq!(condition(&nc, "GenerationReady").unwrap()["status"], "True");
    env.assert_clean();
}

#[actix::test]
async fn an_idle_group_goes_with_its_template_and_nothing_else_does() {
    let env = env_with_generate(generate_spec(SIZE_PATCH)).await;
    // A hand-made group at zero replicas, never to be removed.
    let mut hand_made = md_seed("hand-made", 0);
    hand_made.labels.clear();
    env.sim
        .run(move |c| async move { c.create_machine_deployment_from(&hand_made).await })
        .await
        .expect("runtime")
        .expect("hand-made MachineDeployment");
    env.deployment("one", 1, PodShape::new("1", "1Gi")).await;
    env.until("the pod bound", |e| e.bound_pods() == 1).await;
    let group = name(&generated(&env)[0]);
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(env.client().await, NS);
    deployments
        .delete("one", &Default::default())
        .await
        .expect("pods gone");
    env.until("no pod left", |e| e.list("pods").is_empty())
        .await;
    let claims = env.list("nodeclaims");
    for c in &claims {
        env.delete_claim(&name(c)).await;
    }
    env.until("the group at zero replicas", |e| e.replicas(&group) == 0)
        .await;
    env.until("the idle group and its template removed", |e| {
        generated(e).is_empty() && e.get("devmachinetemplates", NS, &group).is_none()
    })
    .await;
    for kept in [SOURCE, "hand-made"] {
        assert!(
            env.get("machinedeployments", NS, kept).is_some(),
            "{kept} is not the controller's to remove"
        );
        assert!(env.get("devmachinetemplates", NS, kept).is_some());
    }
}

#[actix::test]
async fn a_patch_that_does_not_apply_is_refused_naming_it_and_creates_nothing() {
    let env = env_with_generate(generate_spec("/spec/no/such/field")).await;
    env.until("GenerationReady=False naming the patch", |e| {
        condition(&nodeclass(e), "GenerationReady").is_some_and(|c| {
            c["status"] == "False"
                && c["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("spec.generate.patches[0]"))
        })
    })
    .await;
    env.deployment("one", 1, PodShape::new("1", "1Gi")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(generated(&env).is_empty());
    assert_eq!(templates(&env).len(), 1, "only the source's template");
    assert_eq!(env.bound_pods(), 0);
    assert!(!env.events("GenerationFailed").is_empty());
}

#[actix::test]
async fn a_restart_between_the_template_and_the_group_ends_with_one_group() {
    let spec = generate_spec(SIZE_PATCH);
    let mut env = env_with_generate(spec.clone()).await;
    let plan = planned(&env, &spec, "2c-8gi");
    // A leader that created the template and died before the MachineDeployment.
    env.kill();
    let source_template = env
        .get("devmachinetemplates", NS, SOURCE)
        .expect("the source's template");
    let copy = plan.template_object(&source_template).expect("patched");
    let client = env.client().await;
    let gvk = GroupVersionKind::gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1beta2",
        "DevMachineTemplate",
    );
    let ar = kube::core::ApiResource::from_gvk_with_plural(&gvk, "devmachinetemplates");
    let api: Api<DynamicObject> = Api::namespaced_with(client, NS, &ar);
    let left: DynamicObject = serde_json::from_value(copy).unwrap();
    let left = api
        .create(&PostParams::default(), &left)
        .await
        .expect("left over");
    env.restart().await;
    env.deployment("one", 1, PodShape::new("1", "1Gi")).await;
    env.until("the pod bound", |e| e.bound_pods() == 1).await;
    let groups = generated(&env);
    assert_eq!(groups.len(), 1);
    assert_eq!(name(&groups[0]), plan.name);
    let t = env.get("devmachinetemplates", NS, &plan.name).unwrap();
    assert_eq!(
        t["metadata"]["uid"].as_str(),
        left.metadata.uid.as_deref(),
        "the template left over is the group's"
    );
}

#[actix::test]
async fn a_squatter_with_the_groups_name_is_never_taken_or_removed() {
    let spec = generate_spec(SIZE_PATCH);
    let env = env_with_generate(spec.clone()).await;
    // Somebody else's MachineDeployment under the name the 2c-8gi group would get.
    let plan = planned(&env, &spec, "2c-8gi");
    let mut squatter = md_seed(&plan.name, 0);
    squatter.labels.clear();
    env.sim
        .run(move |c| async move { c.create_machine_deployment_from(&squatter).await })
        .await
        .expect("runtime")
        .expect("squatter");
    env.deployment("one", 1, PodShape::new("1", "1Gi")).await;
    env.until("the pod bound", |e| e.bound_pods() == 1).await;
    // Served by another shape's group.
    let groups = generated(&env);
    assert_eq!(groups.len(), 1, "{groups:#?}");
    assert_ne!(name(&groups[0]), plan.name);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let still = env
        .get("machinedeployments", NS, &plan.name)
        .expect("the squatter stays");
    assert!(still["metadata"]["labels"].get(GENERATED_LABEL).is_none());
    assert_eq!(still["spec"]["replicas"], 0);
}

#[actix::test]
async fn a_new_source_template_drifts_the_generated_groups() {
    let env = env_with_generate(generate_spec(SIZE_PATCH)).await;
    env.deployment("one", 1, PodShape::new("1", "1Gi")).await;
    env.until("the pod bound", |e| e.bound_pods() == 1).await;
    let old = name(&generated(&env)[0]);
    roll_source(&env).await;
    env.until(
        "the pod moved to a group of the new source, the old one gone",
        |e| {
            let groups = generated(e);
            e.bound_pods() == 1 && groups.len() == 1 && name(&groups[0]) != old
        },
    )
    .await;
    let new = &generated(&env)[0];
    assert_eq!(
        new["metadata"]["annotations"][generate::SHAPE_ANNOTATION],
        "2c-8gi"
    );
    // The Generator deletes a group's MachineDeployment, then its template: the template may
    // still be there when the group is seen gone.
    env.until("the old group's template deleted", |e| {
        e.get("devmachinetemplates", NS, &old).is_none()
    })
    .await;
}

#[actix::test]
async fn with_rollout_a_new_source_template_rolls_the_same_group_out() {
    let mut spec = generate_spec(SIZE_PATCH);
    spec["onSourceChange"] = json!("Rollout");
    let env = env_with_generate(spec).await;
    env.deployment("one", 1, PodShape::new("1", "1Gi")).await;
    env.until("the pod bound", |e| e.bound_pods() == 1).await;
    let group = generated(&env)[0].clone();
    let old_template = group["spec"]["template"]["spec"]["infrastructureRef"]["name"].clone();
    let old_machines: Vec<String> = env.machines_of(&name(&group)).iter().map(name).collect();
    assert!(!old_machines.is_empty());
    roll_source(&env).await;
    env.until("the group's Machines replaced under the same name", |e| {
        let groups = generated(e);
        let machines: Vec<String> = e.machines_of(&name(&group)).iter().map(name).collect();
        e.bound_pods() == 1
            && groups.len() == 1
            && name(&groups[0]) == name(&group)
            && groups[0]["spec"]["template"]["spec"]["infrastructureRef"]["name"] != old_template
            && !machines.is_empty()
            && machines.iter().all(|m| !old_machines.contains(m))
    })
    .await;
    let now = &generated(&env)[0];
    let template = now["spec"]["template"]["spec"]["infrastructureRef"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let t = env
        .get("devmachinetemplates", NS, &template)
        .expect("the new copy");
    assert_eq!(t["metadata"]["labels"][GENERATED_LABEL], NODECLASS);
    assert_eq!(
        t["metadata"]["annotations"]["sim.karpenter.cluster.x-k8s.io/cpu"],
        "2"
    );
}

/// A new template for the source (a new image, say), as Cluster API users roll one.
async fn roll_source(env: &Env) {
    let mut v2 = env.get("devmachinetemplates", NS, SOURCE).unwrap();
    v2["metadata"] = json!({"name": "src-v2", "namespace": NS});
    let client = env.client().await;
    let gvk = GroupVersionKind::gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1beta2",
        "DevMachineTemplate",
    );
    let ar = kube::core::ApiResource::from_gvk_with_plural(&gvk, "devmachinetemplates");
    let templates: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ar);
    templates
        .create(&PostParams::default(), &serde_json::from_value(v2).unwrap())
        .await
        .expect("src-v2");
    let mdr =
        karpenter_capi::capi::kind::ScalableKind::MachineDeployment.resource(CapiVersion::V1Beta2);
    let mds: Api<DynamicObject> = Api::namespaced_with(client, NS, &mdr);
    mds.patch(
        SOURCE,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"template": {"spec": {"infrastructureRef": {"name": "src-v2"}}}}}),
        ),
    )
    .await
    .expect("source rolled");
}

#[actix::test]
async fn a_deleted_nodeclass_leaves_its_running_nodes_until_their_claims_go() {
    let env = env_with_generate(generate_spec(SIZE_PATCH)).await;
    env.deployment("one", 1, PodShape::new("1", "1Gi")).await;
    env.until("the pod bound", |e| e.bound_pods() == 1).await;
    let group = name(&generated(&env)[0]);
    let api: Api<ClusterAPINodeClass> = Api::all(env.client().await);
    api.delete(NODECLASS, &Default::default())
        .await
        .expect("NodeClass deleted");
    env.until("the NodeClass gone", |e| {
        e.get("clusterapinodeclasses", "", NODECLASS).is_none()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(env.replicas(&group), 1, "its node stays");
    assert_eq!(env.bound_pods(), 1);
    for c in env.list("nodeclaims") {
        env.delete_claim(&name(&c)).await;
    }
    env.until(
        "the group removed once idle, under the deleted NodeClass's mark",
        |e| generated(e).is_empty() && e.get("devmachinetemplates", NS, &group).is_none(),
    )
    .await;
    assert!(env.get("machinedeployments", NS, SOURCE).is_some());
}
