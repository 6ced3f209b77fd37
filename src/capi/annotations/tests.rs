//! Tests of the scale-from-zero annotations: restricted labels, Cluster Autoscaler's leniencies
//! (value by value, from its clusterapi provider's source) and the price annotations.

mod restricted_tests {
    use super::super::*;

    fn parse_one(key: &str, value: &str) -> Result<ScaleFromZero, AnnotationErrors> {
        let mut a = BTreeMap::new();
        a.insert(key.to_string(), value.to_string());
        if key == GPU_TYPE_ANNOTATION {
            a.insert(GPU_COUNT_ANNOTATION.to_string(), "1".to_string());
        }
        parse(&a)
    }

    #[test]
    fn restricted_labels_and_bad_gpu_types_are_skipped_naming_the_annotation() {
        for (key, value) in [
            (LABELS_ANNOTATION, "kubernetes.io/hostname=node-1"),
            (LABELS_ANNOTATION, "karpenter.sh/nodepool=default"),
            (LABELS_ANNOTATION, "team=a b"),
            (GPU_TYPE_ANNOTATION, "nvidia.com/gpu x"),
            (GPU_TYPE_ANNOTATION, "a/b/c"),
            (GPU_TYPE_ANNOTATION, "NVIDIA Tesla T4"),
        ] {
            let sfz = parse_one(key, value).expect(value);
            assert!(sfz.labels.is_empty() && sfz.gpu.is_none(), "{key}={value}");
            assert_eq!(sfz.skipped.len(), 1, "{key}={value}: {:?}", sfz.skipped);
            assert_eq!(sfz.skipped[0].key, key);
            assert!(sfz.skipped[0].to_string().contains(key), "{key}={value}");
        }
        for (key, value) in [
            (LABELS_ANNOTATION, "node.kubernetes.io/role=gpu"),
            (LABELS_ANNOTATION, "karpenter.sh/capacity-type=spot"),
            (GPU_TYPE_ANNOTATION, "nvidia-tesla-t4"),
            (GPU_TYPE_ANNOTATION, "amd.com/gpu"),
        ] {
            let sfz = parse_one(key, value).expect(value);
            assert!(sfz.skipped.is_empty(), "{key}={value}: {:?}", sfz.skipped);
        }
    }
}

/// What Cluster Autoscaler accepts is accepted (issue 37). Values are those of its sources and
/// tests: kubernetes/autoscaler@35e8a280425c, cluster-autoscaler/cloudprovider/clusterapi/.
mod autoscaler_leniency_tests {
    use super::super::*;
    use crate::capi::template::{TemplateCapacity, merge};

    fn of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn skipped_entries(sfz: &ScaleFromZero, key: &str) -> Vec<String> {
        sfz.skipped
            .iter()
            .filter(|s| s.key == key)
            .map(|s| s.entry.clone())
            .collect()
    }

    fn taint_texts(taints: &[Taint]) -> Vec<String> {
        taints.iter().map(ToString::to_string).collect()
    }

    // clusterapi_unstructured.go:219-222: an entry without `=` is passed over. The value is
    // TestAnnotations' (clusterapi_unstructured_test.go:372) with `=value4` taken off key4.
    #[test]
    fn a_label_entry_without_equals_is_skipped_not_refused() {
        let sfz = parse(&of(&[(LABELS_ANNOTATION, "key3=value3,key4,key5=value5")]))
            .expect("the other labels stand");
        assert_eq!(sfz.labels, of(&[("key3", "value3"), ("key5", "value5")]));
        assert_eq!(skipped_entries(&sfz, LABELS_ANNOTATION), ["key4"]);
        let text = sfz.skipped[0].to_string();
        assert!(
            text.contains(LABELS_ANNOTATION)
                && text.contains("\"key4\"")
                && text.contains("key=value"),
            "{text}"
        );
    }

    // clusterapi_unstructured.go:221: a later entry for the same key wins.
    #[test]
    fn a_label_given_twice_takes_the_later_value() {
        let sfz = parse(&of(&[(LABELS_ANNOTATION, "key3=value3,key3=value4")])).expect("valid");
        assert_eq!(sfz.labels, of(&[("key3", "value4")]));
        assert_eq!(skipped_entries(&sfz, LABELS_ANNOTATION), ["key3=value3"]);
    }

    // clusterapi_unstructured.go:258-264 and parseTaint (:658-696): an entry that does not parse
    // is passed over, the rest kept. TestAnnotations' value (clusterapi_unstructured_test.go:371)
    // with an entry of each kind parseTaint refuses, or keeps with an effect no scheduler acts
    // on, put between its two taints.
    #[test]
    fn a_bad_taint_entry_is_skipped_not_refused() {
        let sfz = parse(&of(&[(
            TAINTS_ANNOTATION,
            "key1=value1:NoSchedule,key9,key9=value9,key9:Bogus,key9=value9:,a=b=c:NoSchedule,\
             a:b:NoSchedule,key9=bad value:NoSchedule,key2=value2:NoExecute",
        )]))
        .expect("the good taints stand");
        assert_eq!(
            taint_texts(&sfz.taints),
            ["key1=value1:NoSchedule", "key2=value2:NoExecute"]
        );
        assert_eq!(
            skipped_entries(&sfz, TAINTS_ANNOTATION),
            [
                "key9",
                "key9=value9",
                "key9:Bogus",
                "key9=value9:",
                "a=b=c:NoSchedule",
                "a:b:NoSchedule",
                "key9=bad value:NoSchedule"
            ]
        );
        assert!(sfz.skipped.iter().all(|s| !s.reason.is_empty()));
    }

    // clusterapi_unstructured.go:265-275: a later taint with the same key and effect replaces
    // the earlier one in place; another effect is another taint.
    #[test]
    fn a_taint_given_twice_takes_the_later_value() {
        let sfz = parse(&of(&[(
            TAINTS_ANNOTATION,
            "dedicated=gpu:NoSchedule,dedicated=gpu:NoExecute,dedicated=override:NoSchedule",
        )]))
        .expect("valid");
        assert_eq!(
            taint_texts(&sfz.taints),
            ["dedicated=override:NoSchedule", "dedicated=gpu:NoExecute"]
        );
        assert_eq!(
            skipped_entries(&sfz, TAINTS_ANNOTATION),
            ["dedicated=gpu:NoSchedule"]
        );
    }

    fn template_taint(key: &str, value: &str, effect: &str) -> TemplateTaint {
        TemplateTaint {
            key: key.into(),
            value: Some(value.into()),
            effect: effect.into(),
            propagation: Some("Always".into()),
        }
    }

    // clusterapi_unstructured.go:229-283, with TestNodeGroupTemplateNodeInfo's two cases
    // (clusterapi_nodegroup_test.go:1702-1751): the resource's own taints come first, and an
    // annotation taint with the same key and effect overrides one of them.
    #[test]
    fn template_taints_are_merged_with_the_annotation_as_the_autoscaler_merges_them() {
        let spec = [template_taint("dedicated", "gpu", "NoSchedule")];
        let alone = parse(&of(&[(CPU_ANNOTATION, "2"), (MEMORY_ANNOTATION, "2048Mi")]))
            .expect("valid")
            .with_template_taints(&spec);
        assert_eq!(taint_texts(&alone.taints), ["dedicated=gpu:NoSchedule"]);

        let overridden = parse(&of(&[(TAINTS_ANNOTATION, "dedicated=override:NoSchedule")]))
            .expect("valid")
            .with_template_taints(&spec);
        assert_eq!(
            taint_texts(&overridden.taints),
            ["dedicated=override:NoSchedule"]
        );

        // Another effect is appended; OnInitialization taints count too; a taint the schema
        // would not have let through is skipped under the field's name.
        let mut on_init = template_taint("startup", "x", "NoExecute");
        on_init.propagation = Some("OnInitialization".into());
        let spec = [
            template_taint("dedicated", "gpu", "NoSchedule"),
            on_init,
            template_taint("odd", "x", "Sometimes"),
        ];
        let both = parse(&of(&[(
            TAINTS_ANNOTATION,
            "dedicated=override:PreferNoSchedule",
        )]))
        .expect("valid")
        .with_template_taints(&spec);
        assert_eq!(
            taint_texts(&both.taints),
            [
                "dedicated=gpu:NoSchedule",
                "startup=x:NoExecute",
                "dedicated=override:PreferNoSchedule"
            ]
        );
        assert_eq!(
            skipped_entries(&both, TEMPLATE_TAINTS_FIELD),
            ["odd=x:Sometimes"]
        );
        assert!(
            both.skipped[0]
                .to_string()
                .starts_with("field spec.template.spec.taints")
        );
    }

    // clusterapi_unstructured.go:336: a GPU needs both a type and a non-zero count; either
    // alone is ignored. The count is TestParseGPUCapacity's (clusterapi_utils_test.go:567).
    #[test]
    fn a_gpu_type_without_a_count_is_ignored() {
        let sfz = parse(&of(&[(GPU_TYPE_ANNOTATION, "nvidia.com/gpu")])).expect("ignored");
        assert_eq!(sfz.gpu, None);
        assert_eq!(
            skipped_entries(&sfz, GPU_TYPE_ANNOTATION),
            ["nvidia.com/gpu"]
        );
        assert!(sfz.capacity().get("nvidia.com/gpu").is_zero());

        let sfz = parse(&of(&[(GPU_COUNT_ANNOTATION, "13")])).expect("ignored");
        assert_eq!(sfz.gpu, None);
        assert_eq!(skipped_entries(&sfz, GPU_COUNT_ANNOTATION), ["13"]);

        let sfz = parse(&of(&[
            (GPU_TYPE_ANNOTATION, " "),
            (GPU_COUNT_ANNOTATION, "13"),
        ]))
        .expect("ignored");
        assert_eq!(sfz.gpu, None);
        assert_eq!(sfz.skipped.len(), 1);

        // A count CA refuses (clusterapi_utils_test.go:572) is still an error, once.
        let err = parse(&of(&[
            (GPU_TYPE_ANNOTATION, "nvidia.com/gpu"),
            (GPU_COUNT_ANNOTATION, "13Mi"),
        ]))
        .expect_err("13Mi is no integer");
        assert_eq!(err.0.len(), 1, "{err}");
        assert_eq!(err.0[0].key, GPU_COUNT_ANNOTATION);
    }

    // clusterapi_utils.go:260 and :153/:184 read integers with Go's strconv, which takes a
    // leading `+`.
    #[test]
    fn integers_may_have_a_leading_plus() {
        let sfz = parse(&of(&[
            (MAX_PODS_ANNOTATION, "+58"),
            (GPU_TYPE_ANNOTATION, "nvidia.com/gpu"),
            (GPU_COUNT_ANNOTATION, "+2"),
            (MIN_SIZE_ANNOTATION, "+1"),
            (MAX_SIZE_ANNOTATION, "+3"),
        ]))
        .expect("Go's strconv takes a leading +");
        assert_eq!(sfz.max_pods, Some(58));
        assert_eq!(sfz.gpu.map(|g| g.count), Some(2));
        assert_eq!((sfz.min_size, sfz.max_size), (Some(1), Some(3)));
        assert!(sfz.skipped.is_empty(), "{:?}", sfz.skipped);
        // Values CA refuses (clusterapi_utils_test.go:605, 615) still are.
        for bad in ["not-a-quantity", "13Mi", "+", "+-5", "1.5"] {
            assert!(parse(&of(&[(MAX_PODS_ANNOTATION, bad)])).is_err(), "{bad}");
        }
    }

    // clusterapi_unstructured.go:311, 319, 327: a zero cpu, memory or ephemeral-disk is left
    // out, so the infrastructure template's status.capacity stands.
    #[test]
    fn a_zero_capacity_takes_the_templates_value() {
        let sfz = parse(&of(&[
            (CPU_ANNOTATION, "0"),
            (MEMORY_ANNOTATION, "0Gi"),
            (EPHEMERAL_DISK_ANNOTATION, "0"),
        ]))
        .expect("zero is valid");
        assert_eq!(
            (sfz.cpu, sfz.memory, sfz.ephemeral_disk),
            (None, None, None)
        );
        assert_eq!(sfz.skipped.len(), 3);
        let mut template = TemplateCapacity::default();
        for (key, value) in [
            ("cpu", "8"),
            ("memory", "32Gi"),
            ("ephemeral-storage", "100Gi"),
        ] {
            template
                .capacity
                .set(key, value.parse().expect("a quantity"));
        }
        let shape = merge(Some(&template), &sfz);
        assert_eq!(shape.capacity.get("cpu"), "8".parse().expect("a quantity"));
        assert_eq!(
            shape.capacity.get("memory"),
            "32Gi".parse().expect("a quantity")
        );
        assert_eq!(
            shape.capacity.get("ephemeral-storage"),
            "100Gi".parse().expect("a quantity")
        );
    }

    // clusterapi_utils.go:252 and :259: an empty value is no annotation; min/max sizes are read
    // by Atoi (:153), which refuses an empty string.
    #[test]
    fn an_empty_capacity_or_count_is_unset() {
        let sfz = parse(&of(&[
            (CPU_ANNOTATION, ""),
            (MEMORY_ANNOTATION, ""),
            (EPHEMERAL_DISK_ANNOTATION, ""),
            (MAX_PODS_ANNOTATION, ""),
            (GPU_COUNT_ANNOTATION, ""),
        ]))
        .expect("empty is unset");
        assert_eq!(
            (sfz.cpu, sfz.memory, sfz.ephemeral_disk, sfz.max_pods),
            (None, None, None, None)
        );
        assert_eq!(sfz.skipped.len(), 5);
        assert!(parse(&of(&[(MIN_SIZE_ANNOTATION, "")])).is_err());
    }

    // TestUtilParseScalingBounds (clusterapi_utils_test.go:51-125) and Atoi's 64-bit range.
    #[test]
    fn sizes_are_read_as_the_autoscaler_reads_them() {
        for (min, max) in [
            ("-1", "0"),
            ("not-an-int", "0"),
            ("0", "-1"),
            ("0", "not-an-int"),
            ("1", "0"),
        ] {
            let err = parse(&of(&[
                (MIN_SIZE_ANNOTATION, min),
                (MAX_SIZE_ANNOTATION, max),
            ]))
            .expect_err("refused by the autoscaler too");
            assert!(!err.0.is_empty());
        }
        let ok = parse(&of(&[
            (MIN_SIZE_ANNOTATION, "0"),
            (MAX_SIZE_ANNOTATION, "1"),
        ]))
        .expect("valid");
        assert_eq!((ok.min_size, ok.max_size), (Some(0), Some(1)));
        let big = parse(&of(&[(MAX_SIZE_ANNOTATION, "99999999999")])).expect("Atoi takes it");
        assert_eq!(big.max_size, Some(i32::MAX));
        assert_eq!(skipped_entries(&big, MAX_SIZE_ANNOTATION), ["99999999999"]);
    }

    // TestParseCPUCapacity and TestParseMemoryCapacity (clusterapi_utils_test.go:465-531).
    #[test]
    fn the_autoscalers_own_quantities_read_the_same() {
        for (key, value, expect) in [
            (CPU_ANNOTATION, "123m", "123m"),
            (CPU_ANNOTATION, "1", "1"),
            (CPU_ANNOTATION, "0.1", "100m"),
            (CPU_ANNOTATION, "+2", "2"),
            (MEMORY_ANNOTATION, "1024", "1024"),
            (MEMORY_ANNOTATION, "456Mi", "456Mi"),
            (MEMORY_ANNOTATION, "8Gi", "8Gi"),
            (MEMORY_ANNOTATION, "1e3", "1000"),
        ] {
            let sfz = parse(&of(&[(key, value)])).expect(value);
            let expect: Quantity = expect.parse().expect("a quantity");
            assert_eq!(
                sfz.capacity().get(key.rsplit('/').next().unwrap_or(key)),
                expect,
                "{value}"
            );
        }
        for key in [CPU_ANNOTATION, MEMORY_ANNOTATION] {
            assert!(parse(&of(&[(key, "not-a-quantity")])).is_err());
        }
    }
}

mod price_tests {
    use super::super::*;

    fn price_of(pairs: &[(&str, &str)]) -> Result<ScaleFromZero, AnnotationErrors> {
        parse(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn either_price_annotation_prices_the_group() {
        let current = price_of(&[(PRICE_ANNOTATION, "0.5")]).expect("parses");
        assert_eq!(current.price, Some(0.5));
        let ca = price_of(&[(CA_PRICE_ANNOTATION, "0.25")]).expect("parses");
        assert_eq!(ca.price, Some(0.25));
        assert!(ca.skipped.is_empty());
        let same =
            price_of(&[(PRICE_ANNOTATION, "0.5"), (CA_PRICE_ANNOTATION, "0.5")]).expect("parses");
        assert_eq!(same.price, Some(0.5));
        assert!(same.skipped.is_empty());
    }

    #[test]
    fn machine_current_price_wins_and_the_other_is_reported() {
        let both =
            price_of(&[(PRICE_ANNOTATION, "0.5"), (CA_PRICE_ANNOTATION, "0.1")]).expect("parses");
        assert_eq!(both.price, Some(0.5));
        assert_eq!(both.skipped.len(), 1);
        assert_eq!(both.skipped[0].key, CA_PRICE_ANNOTATION);
        assert_eq!(both.skipped[0].entry, "0.1");
    }

    #[test]
    fn a_malformed_ca_price_is_an_error_naming_it() {
        let e = price_of(&[(CA_PRICE_ANNOTATION, "cheap")]).expect_err("refused");
        assert!(e.to_string().contains(CA_PRICE_ANNOTATION), "{e}");
    }
}
