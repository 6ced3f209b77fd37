use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::api::nodeclass::{GenerateSource, ShapePrice, ShapePriceEntry, Shapes};
use crate::capi::version::CapiVersion;

fn source_value(infra: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
        "metadata": {"name": "workers", "namespace": "capi", "uid": "u1", "resourceVersion": "7",
                     "labels": {"team": "a", "topology.cluster.x-k8s.io/owned": ""},
                     "annotations": {CPU_ANNOTATION: "2", MEMORY_ANNOTATION: "4Gi",
                                     MAX_SIZE_ANNOTATION: "5",
                                     LABELS_ANNOTATION: "node.kubernetes.io/instance-type=small,tier=gold",
                                     "capacity.cluster-autoscaler.kubernetes.io/taints": "a=b:NoSchedule"}},
        "spec": {"clusterName": "c1", "replicas": 3,
                 "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": "workers"}},
                 "template": {"metadata": {"labels": {"cluster.x-k8s.io/deployment-name": "workers"}},
                              "spec": {"clusterName": "c1", "version": "v1.33.0",
                                       "bootstrap": {"configRef": {"name": "boot"}},
                                       "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                                             "kind": "VSphereMachineTemplate", "name": infra}}}},
        "status": {"replicas": 3}
    })
}

fn source(infra: &str) -> Arc<MachineDeployment> {
    Arc::new(MachineDeployment::from_value(&source_value(infra), CapiVersion::V1Beta2).unwrap())
}

fn spec() -> Generate {
    Generate {
        source: GenerateSource {
            namespace: "capi".into(),
            name: "workers".into(),
        },
        shapes: Shapes {
            cpu: vec![2, 4, 8],
            memory: vec!["4Gi".into(), "16Gi".into(), "64Gi".into()],
            min_memory_per_cpu: Some("1Gi".into()),
            max_memory_per_cpu: Some("8Gi".into()),
            ..Default::default()
        },
        patches: vec![
            TemplatePatch {
                op: "replace".into(),
                path: "/spec/template/spec/numCPUs".into(),
                value: Some(json!("{{cpu}}")),
                value_type: Some("Integer".into()),
            },
            TemplatePatch {
                op: "add".into(),
                path: "/spec/template/spec/memoryMiB".into(),
                value: Some(json!("{{memoryMiB}}")),
                value_type: Some("Integer".into()),
            },
        ],
        price: ShapePrice {
            per_cpu_hour: Some("0.03".into()),
            per_gib_hour: Some("0.004".into()),
            ..Default::default()
        },
        max_machine_deployments: 4,
        ..Default::default()
    }
}

#[test]
fn the_grid_keeps_the_shapes_within_the_memory_per_cpu_bounds() {
    let v = validate(&spec()).unwrap();
    let names: Vec<String> = v.shapes.iter().map(|(s, _)| s.name()).collect();
    // 2c: 4Gi, 16Gi (64Gi is 32Gi per CPU); 4c: 4Gi, 16Gi; 8c: 16Gi, 64Gi (4Gi is 0.5Gi per CPU).
    assert_eq!(
        names,
        [
            "2c-4gi", "2c-16gi", "4c-4gi", "4c-16gi", "8c-16gi", "8c-64gi"
        ]
    );
    let (_, price) = &v.shapes[3];
    assert!((price - (4.0 * 0.03 + 16.0 * 0.004)).abs() < 1e-9);
}

#[test]
fn a_table_price_wins_and_a_bad_price_names_its_field() {
    let mut g = spec();
    g.price.table = vec![ShapePriceEntry {
        shape: "4c-16gi".into(),
        price: "0.1".into(),
    }];
    let v = validate(&g).unwrap();
    assert!(
        v.shapes
            .iter()
            .any(|(s, p)| s.name() == "4c-16gi" && *p == 0.1)
    );
    g.price.per_gib_hour = Some("cheap".into());
    let e = validate(&g).unwrap_err();
    assert_eq!(e.field, "price.perGiBHour");
    assert!(
        e.to_string()
            .starts_with("spec.generate.price.perGiBHour: ")
    );
}

/// One change to a valid `spec.generate`.
type Edit = Box<dyn Fn(&mut Generate)>;

#[test]
fn bad_fields_are_refused_by_name() {
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|g| g.shapes.memory[1] = "lots".into()),
            "shapes.memory[1]",
        ),
        (Box::new(|g| g.shapes.cpu[0] = 0), "shapes.cpu[0]"),
        (
            Box::new(|g| g.patches[0].op = "move".into()),
            "patches[0].op",
        ),
        (
            Box::new(|g| g.patches[1].path = "spec".into()),
            "patches[1].path",
        ),
        (
            Box::new(|g| g.patches[1].value = Some(json!("{{ram}}"))),
            "patches[1].value",
        ),
        (
            Box::new(|g| g.max_machine_deployments = 0),
            "maxMachineDeployments",
        ),
        (
            Box::new(|g| g.shapes.max_memory_per_cpu = Some("512Mi".into())),
            "shapes",
        ),
        (Box::new(|g| g.source.name = String::new()), "source"),
    ];
    for (change, field) in cases {
        let mut g = spec();
        change(&mut g);
        assert_eq!(validate(&g).unwrap_err().field, field);
    }
}

#[test]
fn a_group_is_named_by_shape_and_source_and_renamed_when_the_source_changes() {
    let v = validate(&spec()).unwrap();
    let a = plans("nc", &v, &source("tmpl-a"));
    let again = plans("nc", &v, &source("tmpl-a"));
    let b = plans("nc", &v, &source("tmpl-b"));
    let other_class = plans("other", &v, &source("tmpl-a"));
    assert_eq!(a, again);
    assert!(a[0].name.starts_with("workers-2c-4gi-"));
    assert!(a.iter().all(|p| p.name.len() <= 63));
    for i in 0..a.len() {
        assert_ne!(a[i].name, b[i].name, "a new source template is a new group");
        assert_ne!(a[i].name, other_class[i].name);
    }
    let mut long = source_value("t");
    long["metadata"]["name"] = json!("x".repeat(80));
    let long = MachineDeployment::from_value(&long, CapiVersion::V1Beta2).unwrap();
    assert!(plans("nc", &v, &long).iter().all(|p| p.name.len() <= 63));
}

#[test]
fn zones_make_one_group_per_shape_and_zone() {
    let mut g = spec();
    g.zones = vec!["dc1/rack-A".into(), "dc2".into()];
    let v = validate(&g).unwrap();
    let p = plans("nc", &v, &source("t"));
    assert_eq!(p.len(), v.shapes.len() * 2);
    assert!(p[0].name.contains("-dc1-rack-a-"));
    let md = p[0].model(&source("t"));
    assert!(md.annotations[LABELS_ANNOTATION].contains("topology.kubernetes.io/zone=dc1/rack-A"));
    let obj = p[0].group_object(&source_value("t"), &source("t"));
    assert_eq!(
        obj["spec"]["template"]["spec"]["failureDomain"],
        "dc1/rack-A"
    );
}

#[test]
fn the_group_copies_the_source_with_the_shape_and_its_own_selector() {
    let v = validate(&spec()).unwrap();
    let src = source("t");
    let plan = plans("nc", &v, &src)
        .into_iter()
        .find(|p| p.shape.name() == "4c-16gi")
        .unwrap();
    let obj = plan.group_object(&source_value("t"), &src);
    assert_eq!(obj["metadata"]["name"], json!(plan.name));
    assert_eq!(obj["metadata"]["namespace"], "capi");
    assert_eq!(obj["metadata"]["labels"][GENERATED_LABEL], "nc");
    assert_eq!(obj["metadata"]["labels"][MEMBER_LABEL], "");
    assert_eq!(obj["metadata"]["labels"]["team"], "a");
    assert!(
        obj["metadata"]["labels"]
            .get("topology.cluster.x-k8s.io/owned")
            .is_none()
    );
    let ann = &obj["metadata"]["annotations"];
    assert_eq!(ann[CPU_ANNOTATION], "4");
    assert_eq!(ann[MEMORY_ANNOTATION], "16384Mi");
    assert!(ann.get(MAX_SIZE_ANNOTATION).is_none());
    assert_eq!(
        ann["capacity.cluster-autoscaler.kubernetes.io/taints"],
        "a=b:NoSchedule"
    );
    assert_eq!(
        ann[LABELS_ANNOTATION],
        "tier=gold,node.kubernetes.io/instance-type=4c-16gi"
    );
    assert_eq!(obj["spec"]["replicas"], 0);
    assert_eq!(
        obj["spec"]["selector"]["matchLabels"][DEPLOYMENT_NAME_LABEL],
        json!(plan.name)
    );
    assert_eq!(
        obj["spec"]["template"]["metadata"]["labels"][DEPLOYMENT_NAME_LABEL],
        json!(plan.name)
    );
    assert_eq!(
        obj["spec"]["template"]["spec"]["infrastructureRef"]["name"],
        json!(plan.name)
    );
    assert_eq!(obj["spec"]["template"]["spec"]["version"], "v1.33.0");
    assert!(obj.get("status").is_none());
    // The catalog's view of it before it exists reads the same.
    let md = plan.model(&src);
    assert_eq!(md.key(), plan.key());
    assert_eq!(md.spec_replicas, Some(0));
    assert_eq!(md.annotations, serde_json::from_value(ann.clone()).unwrap());
}

#[test]
fn the_template_copy_carries_the_patches_and_a_bad_one_is_refused_by_index() {
    let v = validate(&spec()).unwrap();
    let plan = plans("nc", &v, &source("t"))
        .into_iter()
        .find(|p| p.shape.name() == "8c-64gi")
        .unwrap();
    let template = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "VSphereMachineTemplate",
        "metadata": {"name": "t", "namespace": "capi", "uid": "x", "resourceVersion": "9",
                     "labels": {"keep": "me"}, "ownerReferences": [{"name": "c1"}]},
        "spec": {"template": {"spec": {"numCPUs": 2, "template": "ubuntu"}}},
        "status": {"capacity": {"cpu": "2"}}
    });
    let t = plan.template_object(&template).unwrap();
    assert_eq!(
        t["metadata"],
        json!({"name": plan.name, "namespace": "capi", "annotations": {},
               "labels": {"keep": "me", GENERATED_LABEL: "nc"}})
    );
    assert_eq!(t["spec"]["template"]["spec"]["numCPUs"], 8);
    assert_eq!(t["spec"]["template"]["spec"]["memoryMiB"], 65536);
    assert_eq!(t["spec"]["template"]["spec"]["template"], "ubuntu");
    assert!(t.get("status").is_none());

    let mut bad = plan.clone();
    bad.patches[1].path = "/spec/nothing/here".into();
    let e = bad.template_object(&template).unwrap_err();
    assert_eq!(e.field, "patches[1]");
    let mut bad = plan;
    bad.patches[0].value = Some(json!("{{shape}}"));
    assert_eq!(
        bad.template_object(&template).unwrap_err().field,
        "patches[0].value"
    );
}

#[test]
fn string_placeholders_fill_inside_text() {
    let mut g = spec();
    g.patches = vec![TemplatePatch {
        op: "replace".into(),
        path: "/spec/template/spec/flavor".into(),
        value: Some(json!("gen.{{cpu}}c{{memoryGiB}}g")),
        value_type: None,
    }];
    let v = validate(&g).unwrap();
    let plan = plans("nc", &v, &source("t")).remove(0);
    let t = plan
        .template_object(
            &json!({"metadata": {"name": "t"}, "spec": {"template": {"spec": {"flavor": "x"}}}}),
        )
        .unwrap();
    assert_eq!(t["spec"]["template"]["spec"]["flavor"], "gen.2c4g");
}

#[test]
fn with_rollout_a_group_keeps_its_name_and_gets_a_new_template_copy() {
    let mut g = spec();
    g.on_source_change = Some("Rollout".into());
    let v = validate(&g).unwrap();
    assert!(v.rollout);
    let a = plans("nc", &v, &source("tmpl-a"));
    let b = plans("nc", &v, &source("tmpl-b"));
    for (a, b) in a.iter().zip(&b) {
        assert_eq!(a.name, b.name);
        assert_ne!(a.template_name, b.template_name);
        assert!(a.template_name.starts_with(&a.name));
        let md = a.model(&source("tmpl-a"));
        assert_eq!(md.infrastructure_ref.name, a.template_name);
    }
    g.on_source_change = Some("Replace".into());
    assert_eq!(validate(&g).unwrap_err().field, "onSourceChange");
}
