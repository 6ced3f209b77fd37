use std::collections::HashMap;

use serde_json::json;

use super::*;
use crate::api::nodeclass::{GenerateSource, ShapePrice, Shapes};
use crate::api::wellknown::{CPU_ANNOTATION, MEMBER_LABEL, MEMORY_ANNOTATION};
use crate::capi::generate::GENERATED_LABEL;
use crate::capi::version::CapiVersion;

fn md(name: &str, labels: serde_json::Value, template: &str) -> Arc<MachineDeployment> {
    let v = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": "1",
                     "labels": labels,
                     "annotations": {CPU_ANNOTATION: "2", MEMORY_ANNOTATION: "4Gi"}},
        "spec": {"clusterName": "c", "replicas": 1,
                 "selector": {"matchLabels": {"x": name}},
                 "template": {"spec": {"clusterName": "c", "infrastructureRef": {
                     "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachineTemplate",
                     "name": template}}}}
    });
    Arc::new(MachineDeployment::from_value(&v, CapiVersion::V1Beta2).unwrap())
}

fn spec(max: i32) -> Generate {
    Generate {
        source: GenerateSource {
            namespace: "ns".into(),
            name: "src".into(),
        },
        shapes: Shapes {
            cpu: vec![2, 4],
            memory: vec!["8Gi".into()],
            ..Default::default()
        },
        price: ShapePrice {
            per_cpu_hour: Some("0.03".into()),
            per_gib_hour: Some("0.004".into()),
            ..Default::default()
        },
        max_machine_deployments: max,
        ..Default::default()
    }
}

fn catalog(spec: &Generate, mds: &[Arc<MachineDeployment>]) -> Catalog {
    let templates = HashMap::new();
    let never = |_: &str| false;
    let cx = Context {
        templates: &templates,
        unavailable: &never,
    };
    let mut c = Catalog::default();
    add_generated("nc", spec, None, mds, &cx, &mut c);
    c
}

/// A group generated for `plan`, as Cluster API would show it.
fn generated(plan: &GroupPlan, source: &MachineDeployment) -> Arc<MachineDeployment> {
    let mut m = plan.model(source);
    m.uid = "u".into();
    m.spec_replicas = Some(2);
    Arc::new(m)
}

#[test]
fn every_shape_is_offered_before_its_group_exists() {
    let src = md("src", json!({}), "t");
    let c = catalog(&spec(4), &[src]);
    assert_eq!(c.generation, Some(Ok(())));
    let names: Vec<&str> = c.instance_types.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["2c-8gi", "4c-8gi"]);
    let t = &c.instance_types[1];
    assert_eq!(t.capacity.get("cpu").as_units(), 4);
    assert!((t.offerings[0].price - (4.0 * 0.03 + 8.0 * 0.004)).abs() < 1e-9);
    assert_eq!(c.to_generate.len(), 2);
    assert!(c.selected.iter().all(|k| c.to_generate.contains_key(k)));
    assert!(c.generated.is_empty());
}

#[test]
fn an_existing_group_is_offered_as_itself_and_an_outdated_one_is_not_selected() {
    let src = md("src", json!({}), "t");
    let g = spec(4);
    let before = catalog(&g, std::slice::from_ref(&src));
    let plan = before.to_generate.values().next().unwrap().clone();
    let live = generated(&plan, &src);
    // The source's template changes: the live group is no longer a shape's group.
    let changed = md("src", json!({}), "t2");
    let now = catalog(&g, &[changed.clone(), live.clone()]);
    assert!(!now.selected.contains(&live.key()), "its claims drift");
    assert_eq!(now.generated.len(), 1);
    assert!(!now.generated[0].current);
    assert_eq!(now.to_generate.len(), 2, "new groups for both shapes");
    // Unchanged: offered as the group it is, with its replicas.
    let same = catalog(&g, &[src.clone(), live.clone()]);
    assert!(same.selected.contains(&live.key()));
    assert!(!same.to_generate.contains_key(&live.key()));
    let o = same
        .instance_types
        .iter()
        .flat_map(|t| &t.offerings)
        .find(|o| o.machine_deployment == live.key())
        .unwrap();
    assert_eq!(o.replicas, 2);
    assert!(same.generated[0].current);
}

#[test]
fn at_the_cap_no_new_group_is_offered() {
    let src = md("src", json!({}), "t");
    let g = spec(1);
    let plan = catalog(&g, std::slice::from_ref(&src))
        .to_generate
        .values()
        .next()
        .unwrap()
        .clone();
    let live = generated(&plan, &src);
    let c = catalog(&g, &[src, live.clone()]);
    assert!(c.to_generate.is_empty());
    assert_eq!(c.instance_types.len(), 1);
    assert_eq!(
        c.instance_types[0].offerings[0].machine_deployment,
        live.key()
    );
}

#[test]
fn a_spec_that_cannot_be_used_leaves_the_groups_unknown_never_gone() {
    let src = md("src", json!({}), "t");
    let good = spec(4);
    let plan = catalog(&good, std::slice::from_ref(&src))
        .to_generate
        .values()
        .next()
        .unwrap()
        .clone();
    let live = generated(&plan, &src);
    let mut bad = good.clone();
    bad.price.per_cpu_hour = Some("free".into());
    for (spec, mds) in [
        (bad, vec![src.clone(), live.clone()]),
        (good, vec![live.clone()]), // the source is not in the index
    ] {
        let c = catalog(&spec, &mds);
        let Some(Err(why)) = &c.generation else {
            panic!("usable: {:?}", c.generation)
        };
        assert!(why.starts_with("spec.generate."), "{why}");
        assert!(c.selected.contains(&live.key()), "not drifted");
        assert!(c.unknown.contains_key(&live.key()));
        assert!(c.instance_types.is_empty() && c.to_generate.is_empty());
    }
}

#[test]
fn only_the_marked_groups_of_this_nodeclass_are_its_own() {
    let src = md("src", json!({}), "t");
    let other = md(
        "x",
        json!({GENERATED_LABEL: "other", MEMBER_LABEL: ""}),
        "t",
    );
    let hand_made = md("y", json!({MEMBER_LABEL: ""}), "t");
    let c = catalog(&spec(4), &[src, other.clone(), hand_made.clone()]);
    assert!(c.generated.is_empty());
    assert!(!c.selected.contains(&other.key()) && !c.selected.contains(&hand_made.key()));
    // And the generic selection never takes a generated group.
    assert!(!crate::capi::offerings::selected(&other, None));
    assert!(crate::capi::offerings::selected(&hand_made, None));
}

#[test]
fn a_group_under_a_plans_name_that_is_not_ours_is_never_offered_for_it() {
    let src = md("src", json!({}), "t");
    let g = spec(4);
    let plan = catalog(&g, std::slice::from_ref(&src))
        .to_generate
        .values()
        .next()
        .unwrap()
        .clone();
    let squatter = md(&plan.name, json!({MEMBER_LABEL: ""}), "t");
    let c = catalog(&g, &[src, squatter.clone()]);
    assert!(!c.to_generate.contains_key(&squatter.key()));
    assert!(!c.selected.contains(&squatter.key()));
    assert!(
        c.instance_types
            .iter()
            .flat_map(|t| &t.offerings)
            .all(|o| o.machine_deployment != squatter.key())
    );
    assert!(
        c.problems.iter().any(|p| p.contains(&squatter.key())),
        "{:?}",
        c.problems
    );
}
