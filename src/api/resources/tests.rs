use super::*;

fn q(s: &str) -> Quantity {
    s.parse().unwrap()
}

const GI: i128 = 1 << 30;

#[test]
fn parses_every_kubernetes_form_exactly() {
    let table: &[(&str, i128)] = &[
        ("0", 0),
        ("1", NANOS),
        ("+1", NANOS),
        ("-1", -NANOS),
        ("0.5", NANOS / 2),
        ("1.5", 3 * NANOS / 2),
        (".5", NANOS / 2),
        ("1.", NANOS),
        ("100m", NANOS / 10),
        ("1500m", 3 * NANOS / 2),
        ("250m", NANOS / 4),
        ("1n", 1),
        ("1u", 1_000),
        ("2k", 2_000 * NANOS),
        ("4M", 4_000_000 * NANOS),
        ("4G", 4_000_000_000 * NANOS),
        ("1T", 1_000_000_000_000 * NANOS),
        ("1P", 1_000_000_000_000_000 * NANOS),
        ("1E", 1_000_000_000_000_000_000 * NANOS),
        ("1Ki", 1024 * NANOS),
        ("1Mi", 1024 * 1024 * NANOS),
        ("4Gi", 4 * GI * NANOS),
        ("1.5Gi", 3 * GI / 2 * NANOS),
        ("0.5Ki", 512 * NANOS),
        ("1Ti", (1 << 40) * NANOS),
        ("1Pi", (1 << 50) * NANOS),
        ("1Ei", (1 << 60) * NANOS),
        ("1e3", 1_000 * NANOS),
        ("1E-3", NANOS / 1_000),
        ("12e6", 12_000_000 * NANOS),
        ("1.5e3", 1_500 * NANOS),
        ("1e+3", 1_000 * NANOS),
        ("-2e-9", -2),
        ("007", 7 * NANOS),
        // Below 1n rounds up, away from zero, like Kubernetes.
        ("0.1n", 1),
        ("1.0000000001", NANOS + 1),
        ("-0.0000000001", -1),
        ("1e-100", 1),
        ("0.1Ki", 102_400_000_000),
        ("0e999999999999999999999", 0),
    ];
    assert!(table.len() >= 30);
    for (input, nanos) in table {
        assert_eq!(q(input).as_nanos(), *nanos, "{input}");
    }
}

#[test]
fn rejects_invalid_inputs_with_typed_errors() {
    assert!(matches!(
        "".parse::<Quantity>(),
        Err(QuantityError::Empty { .. })
    ));
    for bad in [
        "1.2.3", "--1", "+-1", ".", "-", "+", "abc", " 1", "Ki", "e3",
    ] {
        match bad.parse::<Quantity>() {
            Err(QuantityError::BadNumber { input }) => assert_eq!(input, bad),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    for bad in [
        "1Qi", "1e", "1e1.5", "1ki", "1K", "1mi", "1ee3", "1e+", "1Gi1", "1 ",
    ] {
        match bad.parse::<Quantity>() {
            Err(QuantityError::BadSuffix { input, .. }) => assert_eq!(input, bad),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    for bad in [
        "99999999999999999999999999999999999999999",
        "1e40",
        "1e999999999999999999999",
        "200000000000000000000Ei",
    ] {
        assert!(
            matches!(bad.parse::<Quantity>(), Err(QuantityError::Overflow { .. })),
            "{bad}"
        );
    }
    let message = "1Qi".parse::<Quantity>().unwrap_err().to_string();
    assert!(message.contains("\"1Qi\""), "{message}");
}

#[test]
fn prints_canonical_kubernetes_form() {
    let table = [
        ("0", "0"),
        ("0Gi", "0"),
        ("1", "1"),
        ("0.5", "500m"),
        ("1.5", "1500m"),
        ("1000m", "1"),
        ("1000", "1k"),
        ("1500", "1500"),
        ("4G", "4G"),
        ("1Ki", "1Ki"),
        ("1024Mi", "1Gi"),
        ("1.5Gi", "1536Mi"),
        ("512", "512"),
        ("0.5Ki", "512"),
        ("2048Ki", "2Mi"),
        ("0.1Ki", "102400m"),
        ("1e3", "1e3"),
        ("12e6", "12e6"),
        ("1500e0", "1500"),
        ("1E-3", "1e-3"),
        ("-1.5Gi", "-1536Mi"),
        ("-100m", "-100m"),
        ("1n", "1n"),
    ];
    for (input, printed) in table {
        assert_eq!(q(input).to_string(), printed, "{input}");
        assert_eq!(q(printed), q(input), "{printed} must parse back to {input}");
    }
}

#[test]
fn compares_values_not_notation() {
    assert_eq!(q("1Ki"), q("1024"));
    assert_eq!(q("1"), q("1000m"));
    assert!(q("999m") < q("1"));
    assert!(q("1Gi") > q("1G"));
    assert!(q("-1") < q("0"));
    let mut v = vec![q("2"), q("100m"), q("1Ki"), q("-5")];
    v.sort();
    assert_eq!(v, vec![q("-5"), q("100m"), q("2"), q("1Ki")]);
}

#[test]
fn arithmetic_is_exact_and_bounded() {
    assert_eq!(q("100m") + q("900m"), q("1"));
    assert_eq!((q("1Gi") + q("512Mi")).to_string(), "1536Mi");
    assert_eq!(q("1") - q("1500m"), q("-500m"));
    assert_eq!(q("0.1") + q("0.2"), q("300m"));
    let max = Quantity::from_nanos(i128::MAX);
    assert_eq!(max.checked_add(q("1n")), None);
    assert_eq!(max + q("1"), max);
    assert_eq!(Quantity::from_nanos(i128::MIN).checked_sub(q("1n")), None);
    assert_eq!(q("1Ki").checked_sub(q("24")), Some(q("1000")));
    assert_eq!(q("100m").saturating_mul(3), q("300m"));
    assert_eq!(
        [q("1"), q("2"), q("3")].into_iter().sum::<Quantity>(),
        q("6")
    );
}

#[test]
fn scalar_accessors_round_up() {
    assert_eq!(q("1.5").as_millis(), 1500);
    assert_eq!(q("1n").as_millis(), 1);
    assert_eq!(q("-1n").as_millis(), -1);
    assert_eq!(q("1500m").as_units(), 2);
    assert_eq!(q("4Gi").as_units(), 4 << 30);
    assert_eq!(q("1e25").as_units(), i64::MAX);
    assert!((q("1.25").as_f64() - 1.25).abs() < 1e-12);
}

#[test]
fn k8s_and_serde_round_trip() {
    let k = K8sQuantity("1.5Gi".into());
    let ours = Quantity::from_k8s(&k).unwrap();
    assert_eq!(ours.to_k8s(), K8sQuantity("1536Mi".into()));
    assert_eq!(serde_json::to_value(q("250m")).unwrap(), "250m");
    let from_number: Quantity = serde_json::from_value(serde_json::json!(4)).unwrap();
    assert_eq!(from_number, q("4"));
    let from_float: Quantity = serde_json::from_value(serde_json::json!(0.5)).unwrap();
    assert_eq!(from_float, q("500m"));
    assert!(serde_json::from_value::<Quantity>(serde_json::json!("x")).is_err());
    assert!(serde_json::from_value::<Quantity>(serde_json::json!(true)).is_err());
}

fn res(entries: &[(&str, &str)]) -> Resources {
    entries.iter().map(|(k, v)| (k.to_string(), q(v))).collect()
}

#[test]
fn resource_lists_add_sub_max() {
    let a = res(&[("cpu", "1"), ("memory", "1Gi")]);
    let b = res(&[("cpu", "500m"), ("pods", "1")]);
    assert_eq!(
        a.add(&b),
        res(&[("cpu", "1500m"), ("memory", "1Gi"), ("pods", "1")])
    );
    assert_eq!(
        a.sub(&b),
        res(&[("cpu", "500m"), ("memory", "1Gi"), ("pods", "-1")])
    );
    assert_eq!(
        a.max_with(&b),
        res(&[("cpu", "1"), ("memory", "1Gi"), ("pods", "1")])
    );
    assert_eq!(a.get("nvidia.com/gpu"), Quantity::ZERO);
    assert!(Resources::new().is_zero());
    assert!(res(&[("cpu", "0"), ("memory", "0Gi")]).is_zero());
    assert!(!a.is_zero());
}

#[test]
fn fits_treats_missing_capacity_as_zero() {
    let capacity = res(&[("cpu", "2"), ("memory", "4Gi"), ("pods", "110")]);
    assert!(res(&[("cpu", "2"), ("memory", "4Gi")]).fits(&capacity));
    assert!(res(&[("cpu", "1999m")]).fits(&capacity));
    assert!(!res(&[("cpu", "2001m")]).fits(&capacity));
    assert!(!res(&[("nvidia.com/gpu", "1")]).fits(&capacity));
    assert!(res(&[("nvidia.com/gpu", "0")]).fits(&capacity));
    assert!(Resources::new().fits(&Resources::new()));
    assert_eq!(
        res(&[("cpu", "3"), ("memory", "1Gi"), ("x", "1")]).exceeding(&capacity),
        vec!["cpu".to_string(), "x".to_string()]
    );
}

#[test]
fn from_k8s_names_the_bad_key() {
    let mut list = BTreeMap::new();
    list.insert("cpu".to_string(), K8sQuantity("2".into()));
    list.insert("memory".to_string(), K8sQuantity("4Qi".into()));
    let err = Resources::from_k8s(&list).unwrap_err();
    assert_eq!(err.key, "memory");
    assert!(err.to_string().contains("memory"));
    list.insert("memory".to_string(), K8sQuantity("4Gi".into()));
    let ours = Resources::from_k8s(&list).unwrap();
    assert_eq!(ours.get("memory"), q("4Gi"));
    assert_eq!(ours.to_k8s::<BTreeMap<_, _>>(), list);
}
