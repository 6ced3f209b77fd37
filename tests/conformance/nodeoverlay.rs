//! Karpenter core's NodeOverlay suite (`pkg/controllers/nodeoverlay/suite_test.go`): overlays
//! applied to a catalog as NodePools see it through `capi::overlay::apply`, the function the
//! Catalog actor runs before it publishes (and `explain` runs on its one-off read). Upstream's
//! fake instance types are the fixture's (one MachineDeployment per zone x capacity type x OS);
//! upstream's NodePool of every case is one pool of the NodeClass without labels; the
//! condition upstream writes is read from the verdict (`Verdict::failure`), as the Catalog
//! writes it.

use serde_json::{Value, json};

use karpenter_capi::api::NodeOverlay;
use karpenter_capi::api::wellknown::{CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, ZONE_LABEL};
use karpenter_capi::capi::offerings::Catalog;
use karpenter_capi::capi::overlay::{Applied, Pool, Verdict, apply};
use karpenter_capi::scheduling::InstanceType;
use karpenter_capi::testing::node_overlay as overlay;

use crate::fixture::{default_types, itype, q};

fn types_in(values: &[&str]) -> Value {
    json!([{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": values}])
}

type Reasons = std::collections::BTreeMap<String, Option<&'static str>>;

/// Upstream's NodePool of every case (no labels).
const POOL: &str = "default";

/// Applies `overlays` to one catalog of `types` seen by upstream's one NodePool; the catalog
/// after, and each overlay's reason for `ValidationSucceeded=False` (None when it is True).
fn run(types: Vec<InstanceType>, overlays: &[NodeOverlay]) -> (Catalog, Reasons) {
    let (catalog, applied) = run_pools(types, overlays, &[(POOL, &[])]);
    assert!(
        applied.pools.is_empty(),
        "{POOL} sees the NodeClass's catalog"
    );
    (catalog, reasons(applied))
}

/// The same, seen by these NodePools (name, template labels) of the NodeClass: its catalog
/// after, and what the pools see of it ([`Applied::seen_by`]).
fn run_pools(
    types: Vec<InstanceType>,
    overlays: &[NodeOverlay],
    pools: &[(&str, &[(&str, &str)])],
) -> (Catalog, Applied) {
    let mut catalog = Catalog {
        instance_types: types,
        ..Default::default()
    };
    let labels: Vec<std::collections::BTreeMap<String, String>> = pools
        .iter()
        .map(|(_, l)| {
            l.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect();
    let pools: Vec<Pool<'_>> = pools
        .iter()
        .zip(&labels)
        .map(|((name, _), labels)| Pool {
            name,
            labels,
            catalog: 0,
        })
        .collect();
    let refs: Vec<&NodeOverlay> = overlays.iter().collect();
    let applied = apply(&refs, &mut [&mut catalog], &pools);
    (catalog, applied)
}

fn reasons(applied: Applied) -> Reasons {
    applied
        .verdicts
        .into_iter()
        .map(|(k, v)| (k, v.failure().map(|(r, _)| r)))
        .collect()
}

fn reason_of(reasons: &Reasons, name: &str) -> Option<&'static str> {
    *reasons.get(name).expect("a verdict")
}

/// Upstream's single-offering default type (spot, test-zone-1, price 1.02).
fn single_offering() -> Vec<InstanceType> {
    vec![
        itype("default-instance-type")
            .os(&["linux"])
            .priced(&[("spot", "test-zone-1", 1.02)])
            .build(),
    ]
}

/// Upstream's "Offering Requirements" type: four offerings in four zones.
fn four_offerings() -> Vec<InstanceType> {
    vec![
        itype("default-instance-type")
            .os(&["linux"])
            .priced(&[
                ("spot", "test-zone-1", 1.02),
                ("on-demand", "test-zone-2", 2.02),
                ("spot", "test-zone-3", 3.02),
                ("reserved", "test-zone-4", 4.02),
            ])
            .build(),
    ]
}

fn prices(c: &Catalog, t: &str) -> Vec<f64> {
    c.instance_types
        .iter()
        .find(|it| it.name == t)
        .map(|it| it.offerings.iter().map(|o| o.price).collect())
        .unwrap_or_default()
}

#[test]
fn no_overlay_leaves_prices_alone() {
    let (c, _) = run(single_offering(), &[]);
    assert_eq!(prices(&c, "default-instance-type"), [1.02]);
    assert!(c.price_overlays.is_empty());
}

#[test]
fn a_single_overlay_validates() {
    let (_, r) = run(
        single_offering(),
        &[overlay(
            "one",
            json!({"requirements": types_in(&["default-instance-type"]), "weight": 10}),
        )],
    );
    assert_eq!(reason_of(&r, "one"), None);
}

#[test]
fn an_overlong_requirement_key_fails_runtime_validation() {
    let key = format!("test.com.test/test-{}", "a".repeat(250));
    let (_, r) = run(
        single_offering(),
        &[overlay(
            "bad",
            json!({"requirements": [{"key": key, "operator": "Exists"}], "weight": 10}),
        )],
    );
    assert_eq!(reason_of(&r, "bad"), Some("RuntimeValidation"));
}

#[test]
fn a_well_known_resource_in_capacity_fails_runtime_validation() {
    let (_, r) = run(
        single_offering(),
        &[overlay(
            "bad",
            json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "capacity": {"cpu": "5"}}),
        )],
    );
    assert_eq!(reason_of(&r, "bad"), Some("RuntimeValidation"));
}

/// Two overlays of weight 10 pricing the same offering: `overlay-b` is evaluated first and
/// applies, `overlay-a` is `Conflict`.
fn conflict(
    types: Vec<InstanceType>,
    a: Value,
    b: Value,
) -> (Option<&'static str>, Option<&'static str>) {
    let (_, r) = run(types, &[overlay("overlay-a", a), overlay("overlay-b", b)]);
    (reason_of(&r, "overlay-a"), reason_of(&r, "overlay-b"))
}

#[test]
fn price_overlays_whose_types_overlap_conflict() {
    let types = vec![
        itype("arm-instance-type").arch("arm64").build(),
        itype("amd-instance-type").build(),
    ];
    let a = json!({"requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}], "weight": 10, "price": "1.03"});
    let b = json!({"requirements": [{"key": CAPACITY_TYPE_LABEL, "operator": "Exists"}], "weight": 10, "price": "23"});
    assert_eq!(conflict(types, a, b), (Some("Conflict"), None));
}

#[test]
fn price_overlays_on_disjoint_types_both_apply() {
    let types = vec![
        itype("arm-instance-type").arch("arm64").build(),
        itype("amd-instance-type").build(),
    ];
    let a = json!({"requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}], "weight": 10, "price": "1.03"});
    let b = json!({"requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}], "weight": 10, "price": "23"});
    assert_eq!(conflict(types, a, b), (None, None));
}

#[test]
fn price_overlays_overlapping_on_a_zone_conflict() {
    let a = json!({"requirements": [{"key": ZONE_LABEL, "operator": "In", "values": ["test-zone-1", "test-zone-4"]}], "weight": 10, "price": "1.03"});
    let b = json!({"requirements": [{"key": CAPACITY_TYPE_LABEL, "operator": "Exists"}], "weight": 10, "price": "23"});
    assert_eq!(conflict(four_offerings(), a, b), (Some("Conflict"), None));
}

#[test]
fn price_overlays_overlapping_on_a_capacity_type_conflict() {
    let a = json!({"requirements": [{"key": CAPACITY_TYPE_LABEL, "operator": "Exists"}], "weight": 10, "price": "1.03"});
    let b = json!({"requirements": [{"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["spot"]}], "weight": 10, "price": "23"});
    assert_eq!(conflict(four_offerings(), a, b), (Some("Conflict"), None));
}

#[test]
fn price_overlays_on_disjoint_offerings_both_apply() {
    let a = json!({"requirements": [{"key": ZONE_LABEL, "operator": "In", "values": ["test-zone-6", "test-zone-4"]}], "weight": 10, "price": "1.03"});
    let b = json!({"requirements": [{"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["spot"]}], "weight": 10, "price": "23"});
    assert_eq!(conflict(four_offerings(), a, b), (None, None));
}

#[test]
fn price_overlays_overlapping_on_a_spot_offering_conflict() {
    let a = json!({"requirements": [{"key": ZONE_LABEL, "operator": "In", "values": ["test-zone-1", "test-zone-4"]}], "weight": 10, "price": "1.03"});
    let b = json!({"requirements": [{"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["spot"]}], "weight": 10, "price": "23"});
    assert_eq!(conflict(four_offerings(), a, b), (Some("Conflict"), None));
}

/// Upstream's pricing tables: (field, value of overlay-a, value of overlay-b).
const PRICE_ENTRIES: [(&str, &str, &str); 2] =
    [("price", "1.03", "23"), ("priceAdjustment", "+54", "-2")];

#[test]
fn different_prices_on_overlapping_types_conflict() {
    for (field, va, vb) in PRICE_ENTRIES {
        let a = json!({"requirements": types_in(&["default-instance-type", "small-instance-type"]), "weight": 10, field: va});
        let b = json!({"requirements": types_in(&["default-instance-type", "gpu-vendor-instance-type"]), "weight": 10, field: vb});
        assert_eq!(
            conflict(default_types(), a, b),
            (Some("Conflict"), None),
            "{field}"
        );
    }
}

#[test]
fn equal_prices_on_overlapping_types_still_conflict() {
    for (field, v) in [("price", "100"), ("priceAdjustment", "+100")] {
        let a = json!({"requirements": types_in(&["default-instance-type", "small-instance-type"]), "weight": 10, field: v});
        let b = json!({"requirements": types_in(&["default-instance-type", "gpu-vendor-instance-type"]), "weight": 10, field: v});
        assert_eq!(
            conflict(default_types(), a, b),
            (Some("Conflict"), None),
            "{field}"
        );
    }
}

#[test]
fn prices_on_mutually_exclusive_requirements_both_apply() {
    for (field, va, vb) in [("price", "54", "23"), ("priceAdjustment", "+54", "-2")] {
        let a =
            json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, field: va});
        let b = json!({"requirements": [{"key": INSTANCE_TYPE_LABEL, "operator": "NotIn", "values": ["default-instance-type"]}], "weight": 10, field: vb});
        assert_eq!(conflict(default_types(), a, b), (None, None), "{field}");
    }
}

#[test]
fn prices_of_different_weights_both_apply() {
    for (field, va, vb) in [("price", "34", "2"), ("priceAdjustment", "-4", "-2")] {
        let a =
            json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, field: va});
        let b = json!({"requirements": types_in(&["default-instance-type", "gpu-vendor-instance-type"]), "weight": 20, field: vb});
        assert_eq!(conflict(default_types(), a, b), (None, None), "{field}");
    }
}

fn fuse(n: &str) -> Value {
    json!({"smarter-devices/fuse": n})
}

#[test]
fn the_same_resource_on_overlapping_types_conflicts() {
    let a = json!({"requirements": types_in(&["default-instance-type", "small-instance-type"]), "weight": 10, "capacity": fuse("1")});
    let b = json!({"requirements": types_in(&["default-instance-type", "gpu-vendor-instance-type"]), "weight": 10, "capacity": fuse("54")});
    assert_eq!(conflict(default_types(), a, b), (Some("Conflict"), None));
}

#[test]
fn only_the_overlay_repeating_a_resource_conflicts() {
    let (_, r) = run(
        default_types(),
        &[
            overlay(
                "conflicting-overlay-1",
                json!({"requirements": types_in(&["default-instance-type", "small-instance-type"]), "weight": 10, "capacity": {"hugepage-1Gi": "2Gi"}}),
            ),
            overlay(
                "good-overlay-1",
                json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "capacity": fuse("1")}),
            ),
            overlay(
                "conflicting-overlay-2",
                json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "capacity": {"hugepage-1Gi": "3Gi"}}),
            ),
        ],
    );
    assert_eq!(reason_of(&r, "conflicting-overlay-1"), Some("Conflict"));
    assert_eq!(reason_of(&r, "good-overlay-1"), None);
    assert_eq!(reason_of(&r, "conflicting-overlay-2"), None);
}

#[test]
fn the_same_capacity_on_overlapping_types_still_conflicts() {
    let a = json!({"requirements": types_in(&["default-instance-type", "small-instance-type"]), "weight": 10, "capacity": fuse("54")});
    let b = json!({"requirements": types_in(&["default-instance-type", "gpu-vendor-instance-type"]), "weight": 10, "capacity": fuse("54")});
    assert_eq!(conflict(default_types(), a, b), (Some("Conflict"), None));
}

#[test]
fn capacity_on_mutually_exclusive_requirements_both_apply() {
    let a = json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "capacity": fuse("54")});
    let b = json!({"requirements": [{"key": INSTANCE_TYPE_LABEL, "operator": "NotIn", "values": ["default-instance-type"]}], "weight": 10, "capacity": fuse("5")});
    assert_eq!(conflict(default_types(), a, b), (None, None));
}

#[test]
fn capacity_of_different_weights_both_apply() {
    let a = json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "capacity": fuse("55")});
    let b = json!({"requirements": types_in(&["default-instance-type", "gpu-vendor-instance-type"]), "weight": 20, "capacity": fuse("5")});
    assert_eq!(conflict(default_types(), a, b), (None, None));
}

#[test]
fn different_resources_on_overlapping_types_both_apply() {
    let a = json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "capacity": fuse("55")});
    let b = json!({"requirements": types_in(&["default-instance-type", "gpu-vendor-instance-type"]), "weight": 20, "capacity": {"smarter-devices/buz": "5"}});
    assert_eq!(conflict(default_types(), a, b), (None, None));
}

/// Upstream's entries for one overlay on the 1.02 offering: (field, value, price after).
const REPRICE: [(&str, &str, f64); 2] = [
    ("price", "13234.223", 13234.223),
    ("priceAdjustment", "+1000", 1001.02),
];

#[test]
fn a_price_or_adjustment_reprices_the_selected_offering() {
    for (field, v, want) in REPRICE {
        let (c, r) = run(
            single_offering(),
            &[overlay(
                "o",
                json!({"requirements": types_in(&["default-instance-type"]), field: v}),
            )],
        );
        assert_eq!(reason_of(&r, "o"), None);
        let got = prices(&c, "default-instance-type");
        assert!((got[0] - want).abs() < 1e-9, "{field}: {got:?}");
        let recorded = &c.price_overlays[&c.instance_types[0].offerings[0].machine_deployment];
        assert_eq!(
            (recorded.overlay.as_str(), recorded.base_price),
            ("o", 1.02)
        );
    }
}

#[test]
fn an_overlay_that_selects_nothing_leaves_prices_alone() {
    for (field, v) in [("price", "13234.223"), ("priceAdjustment", "+1000")] {
        let (c, _) = run(
            single_offering(),
            &[overlay(
                "o",
                json!({"requirements": types_in(&["other-instance-type"]), field: v}),
            )],
        );
        assert_eq!(prices(&c, "default-instance-type"), [1.02], "{field}");
    }
}

#[test]
fn an_invalid_overlay_adds_no_capacity() {
    let (c, r) = run(
        single_offering(),
        &[overlay(
            "bad",
            json!({"requirements": types_in(&["default-instance-type"]), "capacity": {"smarter-devices/fuse": "1", "memory": "1Gi"}}),
        )],
    );
    assert_eq!(reason_of(&r, "bad"), Some("RuntimeValidation"));
    assert!(
        c.instance_types[0]
            .capacity
            .get("smarter-devices/fuse")
            .is_zero()
    );
}

#[test]
fn capacity_is_added_only_to_the_selected_types() {
    let (c, _) = run(
        default_types(),
        &[overlay(
            "o",
            json!({"requirements": types_in(&["default-instance-type"]), "capacity": fuse("1")}),
        )],
    );
    for t in &c.instance_types {
        let want = if t.name == "default-instance-type" {
            q("1")
        } else {
            q("0")
        };
        assert_eq!(t.capacity.get("smarter-devices/fuse"), want, "{}", t.name);
        // Allocatable carries it too: what the solver packs against.
        assert_eq!(
            t.allocatable().get("smarter-devices/fuse"),
            want,
            "{}",
            t.name
        );
    }
}

#[test]
fn capacity_from_several_overlays_merges_the_higher_weight_first() {
    let (c, r) = run(
        single_offering(),
        &[
            overlay(
                "low",
                json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "capacity": {"smarter-devices/fuse": "1", "hugepage-1Gi": "2Gi"}}),
            ),
            overlay(
                "high",
                json!({"requirements": types_in(&["default-instance-type"]), "weight": 20, "capacity": fuse("99")}),
            ),
        ],
    );
    assert_eq!((reason_of(&r, "low"), reason_of(&r, "high")), (None, None));
    let cap = &c.instance_types[0].capacity;
    assert_eq!(cap.get("smarter-devices/fuse"), q("99"));
    assert_eq!(cap.get("hugepage-1Gi"), q("2Gi"));
}

#[test]
fn the_higher_weight_price_applies() {
    let (c, r) = run(
        single_offering(),
        &[
            overlay(
                "low",
                json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "price": "5"}),
            ),
            overlay(
                "high",
                json!({"requirements": types_in(&["default-instance-type"]), "weight": 20, "price": "0.5"}),
            ),
        ],
    );
    assert_eq!((reason_of(&r, "low"), reason_of(&r, "high")), (None, None));
    assert_eq!(prices(&c, "default-instance-type"), [0.5]);
}

#[test]
fn price_and_capacity_from_two_overlays_both_apply() {
    let (c, r) = run(
        single_offering(),
        &[
            overlay(
                "price",
                json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "price": "0.5"}),
            ),
            overlay(
                "capacity",
                json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "capacity": fuse("3")}),
            ),
        ],
    );
    assert_eq!(
        (reason_of(&r, "price"), reason_of(&r, "capacity")),
        (None, None)
    );
    assert_eq!(prices(&c, "default-instance-type"), [0.5]);
    assert_eq!(
        c.instance_types[0].capacity.get("smarter-devices/fuse"),
        q("3")
    );
}

#[test]
fn a_conflicting_overlay_is_not_applied_in_part() {
    // overlay-b (evaluated first) prices the default type; overlay-a would price it and the
    // small type: it conflicts, and the small type keeps its price too.
    let before = prices(&run(default_types(), &[]).0, "small-instance-type");
    let (c, r) = run(
        default_types(),
        &[
            overlay(
                "overlay-a",
                json!({"requirements": types_in(&["default-instance-type", "small-instance-type"]), "weight": 10, "price": "0.01"}),
            ),
            overlay(
                "overlay-b",
                json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "price": "0.02"}),
            ),
        ],
    );
    assert_eq!(reason_of(&r, "overlay-a"), Some("Conflict"));
    assert_eq!(prices(&c, "small-instance-type"), before);
    assert!(
        prices(&c, "default-instance-type")
            .iter()
            .all(|p| *p == 0.02)
    );
}

/// The conflict names the overlay applied, which upstream's message does not.
#[test]
fn a_conflict_names_the_overlay_it_lost_to() {
    let mut catalog = Catalog {
        instance_types: single_offering(),
        ..Default::default()
    };
    let a = overlay(
        "overlay-a",
        json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "price": "1"}),
    );
    let b = overlay(
        "overlay-b",
        json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "price": "2"}),
    );
    let labels = Default::default();
    let pool = Pool {
        name: POOL,
        labels: &labels,
        catalog: 0,
    };
    let applied = apply(&[&a, &b], &mut [&mut catalog], &[pool]);
    match &applied.verdicts["overlay-a"] {
        Verdict::Conflict { with } => assert!(with.contains("overlay-b")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_price_on_a_capacity_type_reprices_only_those_offerings() {
    let (c, _) = run(
        four_offerings(),
        &[overlay(
            "o",
            json!({"requirements": [{"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]}], "priceAdjustment": "+1000"}),
        )],
    );
    let got = prices(&c, "default-instance-type");
    assert_eq!((got[0], got[2], got[3]), (1.02, 3.02, 4.02));
    assert!((got[1] - 1002.02).abs() < 1e-9, "{got:?}");
}

#[test]
fn a_price_on_a_zone_reprices_only_that_offering() {
    let (c, _) = run(
        four_offerings(),
        &[overlay(
            "o",
            json!({"requirements": [{"key": ZONE_LABEL, "operator": "In", "values": ["test-zone-3"]}], "price": "121.421"}),
        )],
    );
    assert_eq!(
        prices(&c, "default-instance-type"),
        [1.02, 2.02, 121.421, 4.02]
    );
}

#[test]
fn an_invalid_overlay_changes_no_price() {
    for (field, v) in [("price", "13234.223"), ("priceAdjustment", "+1000")] {
        let key = format!("test.com.test/test-{}", "a".repeat(250));
        let (c, r) = run(
            single_offering(),
            &[overlay(
                "bad",
                json!({"requirements": [{"key": key, "operator": "Exists"}], field: v}),
            )],
        );
        assert_eq!(reason_of(&r, "bad"), Some("RuntimeValidation"));
        assert_eq!(prices(&c, "default-instance-type"), [1.02], "{field}");
    }
}

#[test]
fn overlays_on_different_offerings_each_price_their_own() {
    let (c, r) = run(
        four_offerings(),
        &[
            overlay(
                "zones",
                json!({"requirements": [{"key": ZONE_LABEL, "operator": "In", "values": ["test-zone-2", "test-zone-4"]}], "weight": 10, "price": "11"}),
            ),
            overlay(
                "spot",
                json!({"requirements": [{"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["spot"]}], "weight": 10, "priceAdjustment": "+1"}),
            ),
        ],
    );
    assert_eq!(
        (reason_of(&r, "zones"), reason_of(&r, "spot")),
        (None, None)
    );
    let got = prices(&c, "default-instance-type");
    assert_eq!((got[1], got[3]), (11.0, 11.0));
    assert!(
        (got[0] - 2.02).abs() < 1e-9 && (got[2] - 4.02).abs() < 1e-9,
        "{got:?}"
    );
}

/// Three one-offering types (spot in zone 1, on-demand in zone 2, reserved in zone 4).
fn one_offering_each() -> Vec<InstanceType> {
    [
        ("zone-one", "spot", "test-zone-1", 1.02),
        ("zone-two", "on-demand", "test-zone-2", 2.02),
        ("zone-four", "reserved", "test-zone-4", 4.02),
    ]
    .into_iter()
    .map(|(n, ct, z, p)| itype(n).os(&["linux"]).priced(&[(ct, z, p)]).build())
    .collect()
}

fn cap(c: &Catalog, t: &str, r: &str) -> karpenter_capi::api::resources::Quantity {
    c.instance_types
        .iter()
        .find(|it| it.name == t)
        .map(|it| it.capacity.get(r))
        .unwrap_or_default()
}

#[test]
fn capacity_overlays_on_offerings_reach_their_types() {
    let (c, _) = run(
        one_offering_each(),
        &[
            overlay(
                "zones",
                json!({"requirements": [{"key": ZONE_LABEL, "operator": "In", "values": ["test-zone-2", "test-zone-4"]}], "weight": 10, "capacity": fuse("1")}),
            ),
            overlay(
                "spot",
                json!({"requirements": [{"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["spot"]}], "weight": 10, "capacity": {"hugepages-1Gi": "2Gi"}}),
            ),
        ],
    );
    assert_eq!(cap(&c, "zone-one", "hugepages-1Gi"), q("2Gi"));
    assert_eq!(cap(&c, "zone-two", "smarter-devices/fuse"), q("1"));
    assert_eq!(cap(&c, "zone-four", "smarter-devices/fuse"), q("1"));
    assert!(cap(&c, "zone-one", "smarter-devices/fuse").is_zero());
    assert_eq!(prices(&c, "zone-two"), [2.02]);
}

#[test]
fn two_overlays_add_different_resources_to_one_type() {
    let (c, r) = run(
        single_offering(),
        &[
            overlay(
                "fuse",
                json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "capacity": fuse("1")}),
            ),
            overlay(
                "pages",
                json!({"requirements": types_in(&["default-instance-type"]), "weight": 10, "capacity": {"hugepages-1Gi": "2Gi"}}),
            ),
        ],
    );
    assert_eq!(
        (reason_of(&r, "fuse"), reason_of(&r, "pages")),
        (None, None)
    );
    assert_eq!(
        cap(&c, "default-instance-type", "smarter-devices/fuse"),
        q("1")
    );
    assert_eq!(cap(&c, "default-instance-type", "hugepages-1Gi"), q("2Gi"));
    assert_eq!(prices(&c, "default-instance-type"), [1.02]);
}

#[test]
fn capacity_overlays_of_different_weights_on_shared_offerings() {
    let (c, _) = run(
        one_offering_each(),
        &[
            overlay(
                "heavy",
                json!({"requirements": [{"key": ZONE_LABEL, "operator": "In", "values": ["test-zone-2"]}], "weight": 20, "capacity": fuse("1")}),
            ),
            overlay(
                "light",
                json!({"requirements": [{"key": ZONE_LABEL, "operator": "In", "values": ["test-zone-2", "test-zone-4"]}], "weight": 10, "capacity": {"hugepages-1Gi": "2Gi"}}),
            ),
        ],
    );
    assert_eq!(cap(&c, "zone-two", "smarter-devices/fuse"), q("1"));
    assert_eq!(cap(&c, "zone-two", "hugepages-1Gi"), q("2Gi"));
    assert_eq!(cap(&c, "zone-four", "hugepages-1Gi"), q("2Gi"));
    assert!(cap(&c, "zone-four", "smarter-devices/fuse").is_zero());
}

// Overlays per NodePool: upstream applies them to the instance types each NodePool sees, which
// carry the pool's name (`karpenter.sh/nodepool`) and its template labels.

const ONE: &str = "nodepool-one";
const TWO: &str = "nodepool-two";

fn on_pool(pool: &str) -> Value {
    json!([{"key": "karpenter.sh/nodepool", "operator": "In", "values": [pool]}])
}

/// The single offering's price as `pool` sees it.
fn price_seen(c: &Catalog, applied: &Applied, pool: &str) -> f64 {
    prices(applied.seen_by(pool, c), "default-instance-type")[0]
}

#[test]
fn a_price_on_one_pool_reprices_it_alone() {
    for (field, v, want) in REPRICE {
        let (c, applied) = run_pools(
            single_offering(),
            &[overlay(
                "o",
                json!({"requirements": on_pool(ONE), "weight": 10, field: v}),
            )],
            &[(ONE, &[]), (TWO, &[])],
        );
        assert!(
            (price_seen(&c, &applied, ONE) - want).abs() < 1e-9,
            "{field}"
        );
        assert_eq!(price_seen(&c, &applied, TWO), 1.02, "{field}");
    }
}

#[test]
fn each_pool_takes_its_own_overlays_price() {
    for (field, va, vb, want_one, want_two) in [
        ("price", "13234.223", "232.11", 13234.223, 232.11),
        ("priceAdjustment", "+1000", "+2500", 1001.02, 2501.02),
    ] {
        let (c, applied) = run_pools(
            single_offering(),
            &[
                overlay(
                    "overlay-a",
                    json!({"requirements": on_pool(ONE), "weight": 10, field: va}),
                ),
                overlay(
                    "overlay-b",
                    json!({"requirements": on_pool(TWO), "weight": 10, field: vb}),
                ),
            ],
            &[(ONE, &[]), (TWO, &[])],
        );
        for o in ["overlay-a", "overlay-b"] {
            assert_eq!(applied.verdicts[o], Verdict::Applied, "{field} {o}");
        }
        assert!(
            (price_seen(&c, &applied, ONE) - want_one).abs() < 1e-9,
            "{field}"
        );
        assert!(
            (price_seen(&c, &applied, TWO) - want_two).abs() < 1e-9,
            "{field}"
        );
    }
}

#[test]
fn a_price_on_a_template_label_reprices_only_the_pools_with_it() {
    for (field, v, want) in REPRICE {
        let (c, applied) = run_pools(
            single_offering(),
            &[overlay(
                "o",
                json!({"requirements": [{"key": "test-label", "operator": "In", "values": ["test-value"]}], "weight": 10, field: v}),
            )],
            &[(ONE, &[]), (TWO, &[("test-label", "test-value")])],
        );
        assert_eq!(price_seen(&c, &applied, ONE), 1.02, "{field}");
        assert!(
            (price_seen(&c, &applied, TWO) - want).abs() < 1e-9,
            "{field}"
        );
    }
}

/// Whether a NodeOverlay priced the type's offerings, in what `pool` sees (upstream's
/// `IsPricingOverlayApplied`).
fn priced(c: &Catalog, applied: &Applied, pool: &str, t: &str) -> bool {
    let seen = applied.seen_by(pool, c);
    seen.instance_types
        .iter()
        .filter(|it| it.name == t)
        .flat_map(|it| &it.offerings)
        .any(|o| seen.price_overlays.contains_key(&o.machine_deployment))
}

#[test]
fn a_conflict_in_one_pool_is_not_applied_to_the_others() {
    for (field, va, vb) in [("price", "382", "100"), ("priceAdjustment", "+10", "-23")] {
        let (c, applied) = run_pools(
            default_types(),
            &[
                overlay(
                    "overlay-a",
                    json!({"requirements": types_in(&["default-instance-type", "small-instance-type", "gpu-vendor-b-instance-type"]), "weight": 10, field: va}),
                ),
                overlay(
                    "overlay-b",
                    json!({"requirements": types_in(&["small-instance-type", "gpu-vendor-instance-type"]), "weight": 10, field: vb}),
                ),
            ],
            &[(ONE, &[]), (TWO, &[])],
        );
        assert_eq!(
            applied.verdicts["overlay-a"].failure().map(|(r, _)| r),
            Some("Conflict"),
            "{field}"
        );
        assert_eq!(applied.verdicts["overlay-b"], Verdict::Applied, "{field}");
        for pool in [ONE, TWO] {
            for (t, want) in [
                ("default-instance-type", false),
                ("gpu-vendor-b-instance-type", false),
                ("gpu-vendor-instance-type", true),
                ("small-instance-type", true),
            ] {
                assert_eq!(priced(&c, &applied, pool, t), want, "{field} {pool} {t}");
            }
        }
    }
}

fn cap_seen(
    c: &Catalog,
    applied: &Applied,
    pool: &str,
    r: &str,
) -> karpenter_capi::api::resources::Quantity {
    cap(applied.seen_by(pool, c), "default-instance-type", r)
}

#[test]
fn capacity_on_one_pool_reaches_it_alone() {
    let (c, applied) = run_pools(
        single_offering(),
        &[overlay(
            "o",
            json!({"requirements": on_pool(ONE), "weight": 10, "capacity": fuse("1")}),
        )],
        &[(ONE, &[]), (TWO, &[])],
    );
    assert_eq!(cap_seen(&c, &applied, ONE, "smarter-devices/fuse"), q("1"));
    assert!(cap_seen(&c, &applied, TWO, "smarter-devices/fuse").is_zero());
}

#[test]
fn each_pool_takes_its_own_capacity() {
    let (c, applied) = run_pools(
        single_offering(),
        &[
            overlay(
                "overlay-a",
                json!({"requirements": on_pool(ONE), "weight": 10, "capacity": fuse("1")}),
            ),
            overlay(
                "overlay-b",
                json!({"requirements": on_pool(TWO), "weight": 10, "capacity": {"dumb-devices/bar": "2"}}),
            ),
        ],
        &[(ONE, &[]), (TWO, &[])],
    );
    assert_eq!(applied.verdicts["overlay-a"], Verdict::Applied);
    assert_eq!(applied.verdicts["overlay-b"], Verdict::Applied);
    assert_eq!(cap_seen(&c, &applied, ONE, "smarter-devices/fuse"), q("1"));
    assert_eq!(cap_seen(&c, &applied, TWO, "dumb-devices/bar"), q("2"));
}

#[test]
fn capacity_on_a_template_label_reaches_only_the_pools_with_it() {
    let (c, applied) = run_pools(
        single_offering(),
        &[overlay(
            "o",
            json!({"requirements": [{"key": "test-label", "operator": "In", "values": ["test-value"]}], "weight": 10, "capacity": fuse("1")}),
        )],
        &[(ONE, &[]), (TWO, &[("test-label", "test-value")])],
    );
    assert!(cap_seen(&c, &applied, ONE, "smarter-devices/fuse").is_zero());
    assert_eq!(cap_seen(&c, &applied, TWO, "smarter-devices/fuse"), q("1"));
}

#[test]
fn a_capacity_conflict_in_one_pool_is_not_applied_to_the_others() {
    let (c, applied) = run_pools(
        default_types(),
        &[
            overlay(
                "overlay-a",
                json!({"requirements": types_in(&["default-instance-type", "small-instance-type"]), "weight": 10, "capacity": {"smarter-devices/buz": "54"}}),
            ),
            overlay(
                "overlay-b",
                json!({"requirements": types_in(&["small-instance-type", "gpu-vendor-instance-type"]), "weight": 10, "capacity": {"smarter-devices/buz": "21"}}),
            ),
        ],
        &[(ONE, &[]), (TWO, &[])],
    );
    assert_eq!(
        applied.verdicts["overlay-a"].failure().map(|(r, _)| r),
        Some("Conflict")
    );
    assert_eq!(applied.verdicts["overlay-b"], Verdict::Applied);
    for pool in [ONE, TWO] {
        let seen = applied.seen_by(pool, &c);
        for (t, want) in [
            ("default-instance-type", "0"),
            ("gpu-vendor-b-instance-type", "0"),
            ("gpu-vendor-instance-type", "21"),
            ("small-instance-type", "21"),
        ] {
            assert_eq!(cap(seen, t, "smarter-devices/buz"), q(want), "{pool} {t}");
        }
    }
}

/// Our own: pools that see a catalog alike share it (no copy), and a conflict is found in the
/// one pool where two overlays of equal weight both select an offering.
#[test]
fn pools_share_a_catalog_unless_an_overlay_tells_them_apart() {
    let teams: &[(&str, &[(&str, &str)])] = &[
        (ONE, &[("team", "a")]),
        (TWO, &[("team", "b")]),
        ("nodepool-three", &[("team", "b")]),
    ];
    let (_, applied) = run_pools(
        single_offering(),
        &[overlay(
            "o",
            json!({"requirements": types_in(&["default-instance-type"]), "price": "0.5"}),
        )],
        teams,
    );
    assert!(
        applied.pools.is_empty(),
        "no overlay names a pool-level label"
    );
    let on_team_a = overlay(
        "on-team-a",
        json!({"requirements": [{"key": "team", "operator": "In", "values": ["a"]}], "weight": 10, "price": "0.5"}),
    );
    let (c, applied) = run_pools(single_offering(), std::slice::from_ref(&on_team_a), teams);
    assert_eq!(applied.pools.len(), 3);
    assert!(std::sync::Arc::ptr_eq(
        &applied.pools[TWO],
        &applied.pools["nodepool-three"]
    ));
    assert_eq!(price_seen(&c, &applied, ONE), 0.5);
    assert_eq!(price_seen(&c, &applied, TWO), 1.02);
    // Readers without a pool see the NodeClass's catalog: no pool label, nothing selected.
    assert_eq!(prices(&c, "default-instance-type"), [1.02]);
    let (_, applied) = run_pools(
        single_offering(),
        &[
            on_team_a,
            overlay(
                "on-one",
                json!({"requirements": on_pool(ONE), "weight": 10, "price": "0.7"}),
            ),
        ],
        teams,
    );
    // on-team-a (evaluated first: the later name) prices pool one's offering; on-one would
    // too: a conflict, found in pool one alone.
    assert_eq!(applied.verdicts["on-team-a"], Verdict::Applied);
    assert_eq!(
        applied.verdicts["on-one"].failure().map(|(r, _)| r),
        Some("Conflict")
    );
}
