use super::*;
use Operator::*;

fn req(key: &str, op: Operator, values: &[&str]) -> Requirement {
    let values: Vec<String> = values.iter().map(|s| s.to_string()).collect();
    Requirement::new(key, op, &values).unwrap()
}

fn k(op: Operator, values: &[&str]) -> Requirement {
    req("k", op, values)
}

#[test]
fn construction_checks_value_counts() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let bad: &[(Operator, &[&str], &str)] = &[
        (In, &[], "needs at least one value"),
        (Exists, &["a"], "takes no values"),
        (DoesNotExist, &["a"], "takes no values"),
        (Gt, &[], "exactly one integer"),
        (Lt, &["a"], "exactly one integer"),
        (Gte, &["1", "2"], "exactly one integer"),
        (Lte, &["1.5"], "exactly one integer"),
    ];
    for (op, values, want) in bad {
        let err = Requirement::new("k", *op, &s(values))
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{op} {values:?}: {err}");
        assert!(err.contains("\"k\""), "names the key: {err}");
    }
}

#[test]
fn has_and_absence_per_operator() {
    // (requirement, value, has value, allows absent)
    let cases: Vec<(Requirement, &str, bool, bool)> = vec![
        (k(In, &["a", "b"]), "a", true, false),
        (k(In, &["a", "b"]), "c", false, false),
        (k(NotIn, &["a"]), "a", false, true),
        (k(NotIn, &["a"]), "c", true, true),
        (k(Exists, &[]), "x", true, false),
        (k(DoesNotExist, &[]), "x", false, true),
        (k(Gt, &["4"]), "5", true, false),
        (k(Gt, &["4"]), "4", false, false),
        (k(Gt, &["4"]), "abc", false, false),
        (k(Gte, &["4"]), "4", true, false),
        (k(Lt, &["4"]), "3", true, false),
        (k(Lt, &["4"]), "4", false, false),
        (k(Lte, &["4"]), "4", true, false),
        (k(Lte, &["4"]), "5", false, false),
    ];
    for (r, v, has, absent) in cases {
        assert_eq!(r.has(v), has, "{r} has {v}");
        assert_eq!(r.allows_absent(), absent, "{r} absent");
    }
}

#[test]
fn intersections() {
    // (left, right, expected display, expected len)
    let cases: Vec<(Requirement, Requirement, &str, usize)> = vec![
        (k(In, &["a", "b"]), k(In, &["b", "c"]), "In [\"b\"]", 1),
        (k(In, &["a"]), k(In, &["b"]), "In []", 0),
        (k(In, &["a", "b"]), k(NotIn, &["a"]), "In [\"b\"]", 1),
        (
            k(NotIn, &["a"]),
            k(NotIn, &["b"]),
            "NotIn [\"a\", \"b\"]",
            usize::MAX,
        ),
        (k(Exists, &[]), k(NotIn, &["a"]), "Exists", usize::MAX),
        (k(Exists, &[]), k(In, &["a"]), "In [\"a\"]", 1),
        (k(DoesNotExist, &[]), k(In, &["a"]), "In []", 0),
        (k(DoesNotExist, &[]), k(NotIn, &["a"]), "DoesNotExist", 0),
        (k(Gt, &["2"]), k(Lt, &["6"]), ">= 3 and <= 5", 3),
        (k(Gte, &["2"]), k(Lte, &["2"]), ">= 2 and <= 2", 1),
        (k(Gt, &["5"]), k(Lt, &["3"]), "In []", 0),
        (k(Gt, &["2"]), k(In, &["1", "3", "x"]), "In [\"3\"]", 1),
        (
            k(Gt, &["2"]),
            k(NotIn, &["4"]),
            ">= 3 NotIn [\"4\"]",
            usize::MAX,
        ),
        (
            k(Gte, &["1"]),
            k(Lte, &["3"]).intersect(&k(NotIn, &["2"])),
            ">= 1 and <= 3 NotIn [\"2\"]",
            2,
        ),
    ];
    for (a, b, want, len) in cases {
        let ab = a.intersect(&b);
        let ba = b.intersect(&a);
        assert_eq!(ab, ba, "{a} ∩ {b} is symmetric");
        assert_eq!(ab.to_string(), want, "{a} ∩ {b}");
        assert_eq!(ab.len(), len, "{a} ∩ {b} len");
    }
    // Exists ∩ NotIn keeps "must exist".
    assert!(!k(Exists, &[]).intersect(&k(NotIn, &["a"])).allows_absent());
    // minValues: the larger wins.
    let a = k(In, &["a", "b"]).with_min_values(Some(1));
    let b = k(In, &["a", "b", "c"]).with_min_values(Some(2));
    assert_eq!(a.intersect(&b).min_values(), Some(2));
}

/// Requirements written as (key, operator, values) rows.
type Spec<'a> = &'a [(&'a str, Operator, &'a [&'a str])];

fn reqs(list: Spec) -> Requirements {
    let crd: Vec<_> = list
        .iter()
        .map(|(key, op, v)| NodeSelectorRequirementWithMinValues::new(key, *op, v))
        .collect();
    Requirements::from_node_selector_requirements(&crd).unwrap()
}

#[test]
fn compatibility() {
    // (left, right, compatible)
    type Row<'a> = (Spec<'a>, Spec<'a>, bool);
    let cases: &[Row] = &[
        (
            &[("arch", In, &["amd64"])],
            &[("arch", In, &["amd64", "arm64"])],
            true,
        ),
        (
            &[("arch", In, &["amd64"])],
            &[("arch", In, &["arm64"])],
            false,
        ),
        (&[("arch", In, &["amd64"])], &[("zone", In, &["a"])], true),
        (&[("arch", In, &["amd64"])], &[], true),
        (
            &[("gpu", DoesNotExist, &[])],
            &[("gpu", In, &["a100"])],
            false,
        ),
        (
            &[("gpu", DoesNotExist, &[])],
            &[("gpu", Exists, &[])],
            false,
        ),
        (
            &[("gpu", DoesNotExist, &[])],
            &[("gpu", NotIn, &["a100"])],
            true,
        ),
        (&[("gpu", NotIn, &["a"])], &[("gpu", NotIn, &["b"])], true),
        (&[("gpu", NotIn, &["a"])], &[("gpu", In, &["a"])], false),
        (&[("cpu", Gt, &["4"])], &[("cpu", In, &["8"])], true),
        (&[("cpu", Gt, &["4"])], &[("cpu", Lt, &["5"])], false),
        (&[("cpu", Gte, &["4"])], &[("cpu", Lte, &["4"])], true),
        (
            &[("a", In, &["1"]), ("b", In, &["x"])],
            &[("a", In, &["1"]), ("b", In, &["y"])],
            false,
        ),
    ];
    for (l, r, ok) in cases {
        let (l, r) = (reqs(l), reqs(r));
        assert_eq!(l.compatible(&r).is_ok(), *ok, "{l:?} vs {r:?}");
        assert_eq!(r.compatible(&l).is_ok(), *ok, "symmetric: {r:?} vs {l:?}");
    }
    let err = reqs(&[("arch", In, &["amd64"])])
        .compatible(&reqs(&[("arch", In, &["arm64"])]))
        .unwrap_err();
    assert_eq!(err.key, "arch");
    assert!(err.to_string().contains("amd64") && err.to_string().contains("arm64"));
}

#[test]
fn label_matching() {
    let labels: BTreeMap<String, String> = [
        ("arch".to_string(), "amd64".to_string()),
        ("cpu".to_string(), "8".to_string()),
    ]
    .into();
    // (requirements, matches)
    let cases: &[(Spec, bool)] = &[
        (&[], true),
        (&[("arch", In, &["amd64"])], true),
        (&[("arch", In, &["arm64"])], false),
        (&[("arch", NotIn, &["arm64"])], true),
        (&[("arch", Exists, &[])], true),
        (&[("arch", DoesNotExist, &[])], false),
        (&[("zone", In, &["a"])], false),
        (&[("zone", Exists, &[])], false),
        (&[("zone", NotIn, &["a"])], true),
        (&[("zone", DoesNotExist, &[])], true),
        (&[("zone", Gt, &["1"])], false),
        (&[("cpu", Gt, &["4"])], true),
        (&[("cpu", Lt, &["8"])], false),
        (&[("cpu", Lte, &["8"]), ("arch", In, &["amd64"])], true),
    ];
    for (r, want) in cases {
        assert_eq!(reqs(r).matches_labels(&labels), *want, "{r:?}");
    }
    assert!(Requirements::from_labels(&labels).matches_labels(&labels));
    let from = Requirements::from_labels(&labels);
    assert_eq!(
        from.values("arch").unwrap().iter().collect::<Vec<_>>(),
        ["amd64"]
    );
    assert!(from.has("cpu") && !from.has("zone"));
    assert_eq!(from.get("cpu").unwrap().operator(), In);
}

#[test]
fn node_selector_round_trip() {
    let cases: &[Spec] = &[
        &[("a", In, &["x", "y"])],
        &[("a", NotIn, &["x"])],
        &[("a", Exists, &[])],
        &[("a", DoesNotExist, &[])],
        &[("a", Gt, &["3"])],
        &[("a", Gte, &["0"])],
        &[("a", Lt, &["0"])],
        &[("a", Lte, &["7"])],
        &[("a", Gt, &["1"]), ("a", Lt, &["9"]), ("a", NotIn, &["5"])],
        &[("a", Exists, &[]), ("a", NotIn, &["x"])],
        &[("a", In, &["x"]), ("a", In, &["y"])],
        &[("a", In, &["x"]), ("b", NotIn, &["y"]), ("c", Gte, &["2"])],
    ];
    for case in cases {
        let r = reqs(case);
        let back = r.to_node_selector_requirements();
        let again = Requirements::from_node_selector_requirements(&back).unwrap();
        assert_eq!(again, r, "{case:?} -> {back:?}");
        for b in &back {
            if b.operator.is_numeric() {
                assert!(b.values()[0].parse::<i64>().unwrap() >= 0, "{back:?}");
            }
        }
    }
    let mut with_min = NodeSelectorRequirementWithMinValues::new("t", In, &["a", "b"]);
    with_min.min_values = Some(2);
    let r = Requirements::from_node_selector_requirements(std::slice::from_ref(&with_min)).unwrap();
    assert_eq!(r.to_node_selector_requirements(), vec![with_min]);
}

#[test]
fn min_values_checking() {
    let mut crd = vec![
        NodeSelectorRequirementWithMinValues::new("type", In, &["a", "b", "c"]),
        NodeSelectorRequirementWithMinValues::new("zone", Exists, &[]),
    ];
    crd[0].min_values = Some(2);
    let r = Requirements::from_node_selector_requirements(&crd).unwrap();
    assert!(
        r.check_min_values(|k| if k == "type" { 2 } else { 0 })
            .is_ok()
    );
    let err = r.check_min_values(|_| 1).unwrap_err();
    assert_eq!(
        err,
        MinValuesError {
            key: "type".into(),
            required: 2,
            available: 1
        }
    );
    crd[0].min_values = Some(0);
    assert!(matches!(
        Requirements::from_node_selector_requirements(&crd),
        Err(Error::MinValuesRange { .. })
    ));
}

#[test]
fn min_values_relaxing() {
    let mut r = Requirements::new();
    r.add(k(In, &["a", "b", "c"]).with_min_values(Some(3)));
    r.add(req("met", Exists, &[]).with_min_values(Some(1)));
    r.add(req("none", Exists, &[]).with_min_values(Some(2)));
    let available = |key: &str| match key {
        "k" => 2,
        "met" => 1,
        _ => 0,
    };
    r.relax_min_values(available);
    let mins: Vec<Option<usize>> = ["k", "met", "none"]
        .iter()
        .map(|key| r.get(key).and_then(Requirement::min_values))
        .collect();
    assert_eq!(mins, [Some(2), Some(1), None]);
    assert!(r.check_min_values(available).is_ok());
}

#[test]
fn pod_node_selector_operators() {
    let pod = vec![NodeSelectorRequirement {
        key: "arch".into(),
        operator: "In".into(),
        values: Some(vec!["amd64".into()]),
    }];
    assert!(
        Requirements::from_pod_node_selector(&pod)
            .unwrap()
            .has("arch")
    );
    let bad = vec![NodeSelectorRequirement {
        key: "arch".into(),
        operator: "Near".into(),
        values: None,
    }];
    let err = Requirements::from_pod_node_selector(&bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Near") && err.contains("arch"), "{err}");
}

/// Drift's label check without building a requirement per label gives the verdict of the
/// requirement sets it stands for, for every operator and for labels inside, outside and beside
/// the constrained keys (an intersection of bounds and a complement included).
#[test]
fn compatible_with_labels_agrees_with_requirements_built_from_the_labels() {
    let set = |reqs: Vec<Requirement>| {
        let mut out = Requirements::new();
        for r in reqs {
            out.add(r);
        }
        out
    };
    let pools: Vec<Requirements> = vec![
        Requirements::new(),
        set(vec![k(In, &["a", "b"])]),
        set(vec![k(NotIn, &["a"])]),
        set(vec![k(Exists, &[])]),
        set(vec![k(DoesNotExist, &[])]),
        set(vec![k(Gt, &["3"]), req("j", Lt, &["10"])]),
        set(vec![k(Gte, &["3"]), k(NotIn, &["4"]), req("j", In, &["x"])]),
        set(vec![k(Lte, &["5"]), k(Gte, &["2"])]),
    ];
    let values = ["a", "b", "c", "1", "2", "3", "4", "5", "9", " 4", "x", "-1"];
    let mut label_sets: Vec<BTreeMap<String, String>> = vec![BTreeMap::new()];
    for v in values {
        label_sets.push(BTreeMap::from([("k".to_string(), v.to_string())]));
        label_sets.push(BTreeMap::from([("j".to_string(), v.to_string())]));
        label_sets.push(BTreeMap::from([
            ("k".to_string(), v.to_string()),
            ("j".to_string(), "x".to_string()),
            ("other".to_string(), "y".to_string()),
        ]));
    }
    for pool in &pools {
        for labels in &label_sets {
            let built = Requirements::from_labels(labels).compatible(pool).is_ok();
            assert_eq!(
                pool.compatible_with_labels(labels),
                built,
                "pool {pool:?}, labels {labels:?}"
            );
        }
    }
}
