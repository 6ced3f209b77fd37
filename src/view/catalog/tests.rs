use crate::api::wellknown::INSTANCE_TYPE_LABEL;
use std::collections::BTreeMap;

use super::*;
use crate::api::resources::Quantity;
use crate::capi::model::MachineDeployment;
use crate::capi::offerings::Context as OfferingContext;
use crate::scheduling::Offering;

fn offering(md: &str, price: f64, replicas: i32, zone: &str) -> Offering {
    Offering {
        machine_deployment: md.into(),
        zone: Some(zone.into()),
        capacity_type: "on-demand".into(),
        price,
        available: true,
        labels: BTreeMap::from([(
            crate::api::wellknown::ZONE_LABEL.to_string(),
            zone.to_string(),
        )]),
        taints: Vec::new(),
        replicas,
        max_size: Some(10),
    }
}

fn it(name: &str, cpu: i64, offerings: Vec<Offering>) -> InstanceType {
    InstanceType {
        name: name.into(),
        requirements: Requirements::default(),
        capacity: Resources::new().with("cpu", Quantity::from_units(cpu)),
        overhead: Resources::default(),
        offerings,
        csi_limits: Default::default(),
    }
}

#[test]
fn rank_puts_the_launch_choice_first_and_says_why_the_others_are_out() {
    let types = vec![
        it(
            "big",
            8,
            vec![
                offering("ns/b-busy", 1.0, 5, "a"),
                offering("ns/b-idle", 1.0, 1, "a"),
                offering("ns/b-other-zone", 0.5, 0, "b"),
                offering("ns/b-failed", 0.1, 0, "a"),
            ],
        ),
        it("tiny", 1, vec![offering("ns/tiny", 0.01, 0, "a")]),
    ];
    let reqs = Requirements::from_labels(&BTreeMap::from([(
        crate::api::wellknown::ZONE_LABEL.to_string(),
        "a".to_string(),
    )]));
    let requests = Resources::new().with("cpu", Quantity::from_units(2));
    let failed = |o: &Offering| o.machine_deployment == "ns/b-failed";
    let ranked = rank(&types, &reqs, &requests, &[], &failed);
    let got: Vec<(&str, Fit)> = ranked
        .iter()
        .map(|r| (r.offering.machine_deployment.as_str(), r.fit))
        .collect();
    assert_eq!(
        got,
        vec![
            // Same price: the less loaded MachineDeployment first.
            ("ns/b-idle", Fit::Eligible),
            ("ns/b-busy", Fit::Eligible),
            ("ns/tiny", Fit::TooSmall),
            ("ns/b-failed", Fit::Unavailable),
            ("ns/b-other-zone", Fit::Incompatible),
        ]
    );
    // resolve takes the first.
    let view = CatalogView::default();
    view.insert(
        "nc",
        offerings::Catalog {
            instance_types: types,
            deployments: vec!["x".into()],
            ..Default::default()
        },
        None,
    );
    let excluded = HashSet::from(["ns/b-failed".to_string()]);
    let choice = view
        .resolve("nc", None, &reqs, &requests, &excluded, &[])
        .expect("a choice");
    assert_eq!(choice.machine_deployment, "ns/b-idle");
}

/// A pool an overlay selects by name resolves, prices and explains its claims at the
/// overlaid price; another pool of the NodeClass, and a claim without a pool, at the
/// NodeClass's.
#[test]
fn a_pool_of_its_own_is_read_where_its_claims_are() {
    let overlay: crate::api::NodeOverlay = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay",
        "metadata": {"name": "deal"},
        "spec": {"requirements": [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["one"]}], "price": "0.05"},
    }))
    .unwrap();
    let pool = |name: &str| -> Arc<NodePool> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                "metadata": {"name": name},
                "spec": {"template": {"spec": {"requirements": [], "nodeClassRef": {
                    "group": crate::api::wellknown::NODECLASS_GROUP,
                    "kind": crate::api::wellknown::NODECLASS_KIND,
                    "name": "nc"}}}},
            }))
            .unwrap(),
        )
    };
    let mut catalog = offerings::Catalog {
        instance_types: vec![it("a", 4, vec![offering("ns/a", 0.5, 0, "z")])],
        deployments: vec!["ns/a".into()],
        ..Default::default()
    };
    let (verdicts, by_pool) = apply_overlays(
        &[&overlay],
        vec![("nc", &mut catalog)],
        &[pool("one"), pool("two")],
    );
    assert_eq!(verdicts["deal"], Verdict::Applied);
    let view = CatalogView::default();
    view.insert("nc", catalog, None);
    view.publish_pools(by_pool);
    let price = |pool: Option<&str>| {
        view.resolve(
            "nc",
            pool,
            &Requirements::default(),
            &Resources::new(),
            &HashSet::new(),
            &[],
        )
        .unwrap()
        .price
    };
    assert_eq!(price(Some("one")), 0.05);
    assert_eq!(price(Some("two")), 0.5);
    assert_eq!(price(None), 0.5);
    assert_eq!(view.pool_offering("ns/a", Some("one")).unwrap().price, 0.05);
    assert_eq!(view.offering("ns/a").unwrap().price, 0.5);
    assert_eq!(
        view.pool_instance_types("nc", Some("one"))[0].offerings[0].price,
        0.05
    );
    assert_eq!(
        view.price_overlay("ns/a", Some("one")).unwrap().overlay,
        "deal"
    );
    assert!(view.price_overlay("ns/a", Some("two")).is_none());
    // A pool's own catalog goes with its NodeClass.
    view.retain(&HashSet::new());
    assert!(view.pool_offering("ns/a", Some("one")).is_none());
}

#[test]
fn min_values_count_only_the_types_that_can_launch() {
    use crate::api::nodeclaim::{NodeSelectorRequirementWithMinValues, Operator};
    let view = CatalogView::default();
    view.insert(
        "nc",
        offerings::Catalog {
            instance_types: vec![
                it("a", 4, vec![offering("ns/a", 0.1, 0, "z")]),
                it("b", 4, vec![offering("ns/b", 0.2, 0, "z")]),
            ],
            deployments: vec!["ns/a".into(), "ns/b".into()],
            ..Default::default()
        },
        None,
    );
    let reqs = |min: i64| {
        Requirements::from_node_selector_requirements(&[NodeSelectorRequirementWithMinValues {
            key: INSTANCE_TYPE_LABEL.into(),
            operator: Operator::Exists,
            values: None,
            min_values: Some(min),
        }])
        .expect("requirements")
    };
    let none = HashSet::new();
    let requests = Resources::new();
    let err = view
        .resolve("nc", None, &reqs(50), &requests, &none, &[])
        .expect_err("50 types do not exist");
    assert!(matches!(err, ResolveError::MinValues { .. }), "{err}");
    assert!(err.to_string().contains(INSTANCE_TYPE_LABEL), "{err}");
    assert_eq!(err.reason(), "LaunchFailed");
    assert!(
        view.resolve("nc", None, &reqs(2), &requests, &none, &[])
            .is_ok()
    );
    // A type whose only offering cannot be used does not count.
    let excluded = HashSet::from(["ns/b".to_string()]);
    assert!(matches!(
        view.resolve("nc", None, &reqs(2), &requests, &excluded, &[]),
        Err(ResolveError::MinValues { .. })
    ));
}

/// A MachineDeployment for `resolve_nodeclass`: a member, capacity from `annotations` alone.
fn member(name: &str, annotations: serde_json::Value) -> Arc<MachineDeployment> {
    let v = serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": "default", "uid": name, "resourceVersion": "1",
                     "labels": {crate::api::wellknown::MEMBER_LABEL: ""}, "annotations": annotations},
        "spec": {"clusterName": "c", "replicas": 1,
                 "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": name}},
                 "template": {"spec": {"clusterName": "c", "bootstrap": {"dataSecretName": "x"},
                     "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                                           "kind": "DevMachineTemplate", "name": name}}}}
    });
    Arc::new(
        MachineDeployment::from_value(&v, crate::capi::version::CapiVersion::V1Beta1)
            .expect("a MachineDeployment"),
    )
}

/// Issue 37: every selected group stays selected whatever the catalog could read of it, so
/// drift takes none for gone; what it could not read is unknown, with why, and a template not
/// read yet holds the provisioner (unread) and the launch (pending).
#[test]
fn groups_the_catalog_cannot_read_stay_selected_and_unknown() {
    use crate::api::nodeclass::{ClusterAPINodeClass, ClusterAPINodeClassSpec};
    use crate::api::wellknown::{CPU_ANNOTATION, MEMORY_ANNOTATION};
    let sized = serde_json::json!({CPU_ANNOTATION: "4", MEMORY_ANNOTATION: "16Gi"});
    let mds = vec![
        member("good", sized.clone()),
        member(
            "typo",
            serde_json::json!({CPU_ANNOTATION: "lots", MEMORY_ANNOTATION: "16Gi"}),
        ),
        // Capacity from the template only: unread, then failing.
        member("unread", serde_json::json!({})),
        member("failing", serde_json::json!({})),
        // Complete annotations stand while the template fails; not read yet, they wait too.
        member("annotated-failing", sized.clone()),
        member("annotated-unread", sized),
    ];
    let templates: HashMap<String, crate::capi::template::TemplateCapacity> = HashMap::new();
    let never = |_: &str| false;
    let cx = OfferingContext {
        templates: &templates,
        unavailable: &never,
    };
    let unreadable = BTreeMap::new();
    let missing = HashMap::new();
    let unread: HashSet<String> = ["default/unread", "default/annotated-unread"]
        .map(String::from)
        .into();
    let failing: HashMap<String, String> = [
        ("default/failing", "forbidden (403)"),
        ("default/annotated-failing", "forbidden (403)"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .into();
    let left_out = LeftOut {
        unreadable: &unreadable,
        missing_templates: &missing,
        unread_templates: &unread,
        failing_templates: &failing,
        replicas_held: &HashMap::new(),
        generation_refused: &HashMap::new(),
    };
    let nc = ClusterAPINodeClass::new("nc", ClusterAPINodeClassSpec::default());
    let (c, ready) = resolve_nodeclass(&nc, &mds, &left_out, &cx);
    assert_eq!(ready, Ok(()));
    assert_eq!(c.deployments, ["default/annotated-failing", "default/good"]);
    assert_eq!(c.selected.len(), 6, "{:?}", c.selected);
    let unknown: Vec<&str> = c.unknown.keys().map(String::as_str).collect();
    assert_eq!(
        unknown,
        [
            "default/annotated-unread",
            "default/failing",
            "default/typo",
            "default/unread"
        ]
    );
    assert!(c.unknown["default/failing"].contains("forbidden (403)"));
    assert!(c.unknown["default/typo"].contains(CPU_ANNOTATION));
    assert_eq!(c.unread, ["default/annotated-unread", "default/unread"]);
    let mut pending = c.pending.clone();
    pending.sort();
    assert_eq!(pending, ["default/annotated-unread", "default/unread"]);
    // What the disruption view reads: selected, so no claim of these drifts.
    let view = CatalogView::default();
    view.publish("nc".into(), c, None, Ok(()));
    let selected = view.selected("nc").expect("published");
    assert!(selected.contains("default/typo") && selected.contains("default/unread"));
    assert!(view.unknown("default/typo").is_some());
    assert_eq!(view.unread(["nc"]).len(), 2);
}

fn claim_on(name: &str, md: &str, machine: Option<&str>) -> Arc<crate::api::nodeclaim::NodeClaim> {
    use crate::api::wellknown::{MACHINE_ANNOTATION, MACHINE_DEPLOYMENT_ANNOTATION};
    let mut annotations = serde_json::json!({MACHINE_DEPLOYMENT_ANNOTATION: md});
    if let Some(m) = machine {
        annotations[MACHINE_ANNOTATION] = m.into();
    }
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "resourceVersion": "1", "annotations": annotations},
            "spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io",
                                      "kind": "ClusterAPINodeClass", "name": "nc"},
                     "requirements": []}
        }))
        .expect("a NodeClaim"),
    )
}

/// Issue 40, as every reader sees it: md-0 is one Machine short of its max size, and a claim
/// chosen for it (its create in flight, then in the index) has no replica yet. Neither the
/// solver's instance types nor the launch offer md-0 again; once the replicas count the claim
/// it is not counted twice.
#[test]
fn the_view_counts_claims_the_replicas_do_not_show_yet() {
    use crate::api::wellknown::{
        CPU_ANNOTATION, MANAGED_REPLICAS_ANNOTATION, MAX_SIZE_ANNOTATION, MEMORY_ANNOTATION,
    };
    let md = |managed: &str| {
        member(
            "md-0",
            serde_json::json!({CPU_ANNOTATION: "4", MEMORY_ANNOTATION: "16Gi",
                MAX_SIZE_ANNOTATION: "2", MANAGED_REPLICAS_ANNOTATION: managed}),
        )
    };
    let templates = HashMap::new();
    let never = |_: &str| false;
    let cx = OfferingContext {
        templates: &templates,
        unavailable: &never,
    };
    let claims = Arc::new(RwLock::new(Claims::default()));
    let view = CatalogView::counting(claims.clone());
    view.insert("nc", offerings::build(None, &[md("1")], &cx), None);
    let available = || view.instance_types("nc")[0].offerings[0].available;
    let launchable = || {
        view.resolve(
            "nc",
            None,
            &Requirements::default(),
            &Resources::new(),
            &HashSet::new(),
            &[],
        )
        .is_ok()
    };
    claims
        .write()
        .apply(claim_on("a", "default/md-0", Some("default/m-a")));
    assert!(
        available() && launchable(),
        "1 of 2 replicas, its claim bound"
    );
    claims.write().expect("b", "default/md-0");
    assert!(
        !available() && !launchable(),
        "b's create holds the last slot"
    );
    assert_eq!(view.instance_types("nc")[0].offerings[0].replicas, 2);
    claims.write().apply(claim_on("b", "default/md-0", None));
    assert!(
        !available() && !launchable(),
        "b in the index, counted once"
    );
    assert_eq!(view.instance_types("nc")[0].offerings[0].replicas, 2);
    claims.write().remove("b");
    assert!(
        available(),
        "b deleted before the write: the slot is free again"
    );
    // Without the claim index (tools, benchmarks): the replicas alone.
    let plain = CatalogView::default();
    plain.insert("nc", offerings::build(None, &[md("1")], &cx), None);
    claims.write().expect("c", "default/md-0");
    assert!(plain.instance_types("nc")[0].offerings[0].available);
}
