//! The Karpenter-facing API against upstream: manifests round-trip, our CRDs carry every
//! upstream property, deploy/crds is current, and validation names the bad field. The tests that
//! read upstream's files are skipped where those are missing (`assets`).

use crate::assets;

use std::collections::BTreeMap;

use karpenter_capi::api::crds;
use karpenter_capi::api::duration::NillableDuration;
use karpenter_capi::api::nodeclaim::{NodeClaim, NodeSelectorRequirementWithMinValues, Operator};
use karpenter_capi::api::nodeclass::ClusterAPINodeClass;
use karpenter_capi::api::nodeoverlay::NodeOverlay;
use karpenter_capi::api::nodepool::{Budget, NodePool};
use karpenter_capi::api::validation::{
    validate_nodeclaim, validate_nodeclass, validate_nodeoverlay, validate_nodepool,
};
use serde_json::Value;

pub fn tests() -> Vec<assets::Test> {
    trials![
        upstream_examples_round_trip needs [Upstream],
        full_manifests_round_trip_exactly_and_validate,
        our_crds_carry_every_upstream_property needs [Upstream],
        deploy_crds_match_generated_output,
        validation_names_the_field_for_each_rule,
        validation_of_nodeclaims_and_nodeclasses,
        bad_durations_and_enums_fail_to_decode_with_the_value,
        our_crds_carry_upstream_validation needs [Upstream],
        the_upstream_kubemark_example_parses needs [Upstream],
        the_repository_example_round_trips_and_validates,
        the_generate_example_is_a_valid_generate_for_the_simulator,
        karpenter_v1_15_manifests_round_trip_and_validate,
        our_crds_default_and_enumerate_as_karpenter_v1_15,
        capacity_quota_crd_is_cluster_autoscalers needs [UpstreamCapacityQuota],
    ]
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// Records every place where `want` has something `got` lacks or differs on.
fn subset_diffs(want: &Value, got: &Value, path: &str, diffs: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                match g.get(k) {
                    Some(gv) => subset_diffs(wv, gv, &format!("{path}.{k}"), diffs),
                    None => diffs.push(format!("{path}.{k}: missing")),
                }
            }
        }
        (Value::Array(w), Value::Array(g)) => {
            if w.len() != g.len() {
                diffs.push(format!("{path}: {} items, got {}", w.len(), g.len()));
            }
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                subset_diffs(wv, gv, &format!("{path}[{i}]"), diffs);
            }
        }
        // Quantities are int-or-string: 4 and "4" are the same value.
        (Value::Number(n), Value::String(s)) if n.to_string() == *s => {}
        (w, g) if w == g => {}
        (w, g) => diffs.push(format!("{path}: want {w}, got {g}")),
    }
}

fn assert_round_trips<T>(doc: &Value, exact: bool)
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{e}: {doc}"));
    let back = serde_json::to_value(&typed).unwrap();
    let mut diffs = Vec::new();
    subset_diffs(doc, &back, "", &mut diffs);
    assert!(
        diffs.is_empty(),
        "fields lost in round trip:\n{}",
        diffs.join("\n")
    );
    if exact {
        let mut extra = Vec::new();
        subset_diffs(&back, doc, "", &mut extra);
        assert!(
            extra.is_empty(),
            "fields invented in round trip:\n{}",
            extra.join("\n")
        );
    }
}

fn upstream_examples_round_trip() {
    let mut seen = BTreeMap::new();
    for entry in std::fs::read_dir(assets::upstream("examples")).unwrap() {
        let path = entry.unwrap().path();
        for doc in yaml_docs(&read(&path)) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            match kind.as_str() {
                "NodePool" => {
                    assert_round_trips::<NodePool>(&doc, true);
                    let np: NodePool = serde_json::from_value(doc.clone()).unwrap();
                    validate_nodepool(&np).unwrap();
                }
                "NodeClaim" => assert_round_trips::<NodeClaim>(&doc, true),
                "ClusterAPINodeClass" => {
                    assert_round_trips::<ClusterAPINodeClass>(&doc, true);
                    let nc: ClusterAPINodeClass = serde_json::from_value(doc.clone()).unwrap();
                    validate_nodeclass(&nc).unwrap();
                }
                _ => continue,
            }
            *seen.entry(kind).or_insert(0) += 1;
        }
    }
    assert!(
        seen.contains_key("NodePool") && seen.contains_key("ClusterAPINodeClass"),
        "{seen:?}"
    );
}

const FULL_NODEPOOL: &str = r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: full
  labels: {team: infra}
spec:
  template:
    metadata:
      labels: {tier: batch, karpenter.sh/capacity-type: on-demand}
      annotations: {example.com/owner: infra}
    spec:
      requirements:
        - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64], minValues: 2}
        - {key: karpenter.sh/capacity-type, operator: NotIn, values: [spot]}
        - {key: example.com/cpu, operator: Gt, values: ["3"]}
        - {key: example.com/mem, operator: Lte, values: ["64"]}
        - {key: example.com/gpu, operator: DoesNotExist}
        - {key: topology.kubernetes.io/zone, operator: Exists}
      taints:
        - {key: dedicated, value: batch, effect: NoSchedule, timeAdded: "2024-01-02T03:04:05Z"}
      startupTaints:
        - {key: example.com/agent-not-ready, effect: NoExecute}
      nodeClassRef: {group: karpenter.cluster.x-k8s.io, kind: ClusterAPINodeClass, name: default}
      terminationGracePeriod: 48h
      expireAfter: Never
  disruption:
    consolidationPolicy: WhenEmpty
    consolidateAfter: 1h30m
    budgets:
      - {nodes: "10%"}
      - {nodes: "0", schedule: "0 9 * * mon-fri", duration: 8h, reasons: [Underutilized, Drifted]}
  limits: {cpu: "1000", memory: 1000Gi, nodes: "50"}
  weight: 50
status:
  resources: {cpu: "12", memory: 48Gi, nodes: "3"}
  nodes: 3
  nodeClassObservedGeneration: 4
  conditions:
    - {type: Ready, status: "True", reason: Ready, message: "", observedGeneration: 2, lastTransitionTime: "2024-01-02T03:04:05Z"}
    - {type: ValidationSucceeded, status: "False", reason: Invalid, message: bad, lastTransitionTime: "2024-01-02T03:04:05Z"}
"#;

const FULL_NODECLAIM: &str = r#"
apiVersion: karpenter.sh/v1
kind: NodeClaim
metadata:
  name: full-abcde
  labels: {karpenter.sh/nodepool: full}
  annotations: {cluster.x-k8s.io/machine: default/md-0-abc}
spec:
  requirements:
    - {key: node.kubernetes.io/instance-type, operator: In, values: [small, large], minValues: 1}
    - {key: karpenter.sh/nodepool, operator: In, values: [full]}
    - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}
  resources:
    requests: {cpu: 1500m, memory: 2Gi, pods: "3"}
  taints:
    - {key: dedicated, value: batch, effect: NoSchedule}
  startupTaints:
    - {key: example.com/agent-not-ready, effect: NoSchedule}
  nodeClassRef: {group: karpenter.cluster.x-k8s.io, kind: ClusterAPINodeClass, name: default}
  terminationGracePeriod: 30m
  expireAfter: 720h
status:
  nodeName: node-1
  providerID: "aws:///us-east-1a/i-0abc"
  imageID: ami-123
  capacity: {cpu: "4", memory: 16Gi, pods: "110"}
  allocatable: {cpu: 3900m, memory: 15Gi, pods: "110"}
  lastPodEventTime: "2024-01-02T03:04:05Z"
  conditions:
    - {type: Launched, status: "True", reason: Launched, message: "", lastTransitionTime: "2024-01-02T03:04:05Z"}
    - {type: Ready, status: Unknown, reason: AwaitingNode, message: waiting, observedGeneration: 1, lastTransitionTime: "2024-01-02T03:04:05Z"}
"#;

const FULL_NODECLASS: &str = r#"
apiVersion: karpenter.cluster.x-k8s.io/v1alpha1
kind: ClusterAPINodeClass
metadata: {name: default}
spec:
  scalableResourceSelector:
    matchLabels: {node.cluster.x-k8s.io/pool: workers}
    matchExpressions:
      - {key: example.com/tier, operator: In, values: [a, b]}
  createTimeout: 10m
status:
  conditions:
    - {type: Ready, status: "True", reason: Ready, message: "", lastTransitionTime: "2024-01-02T03:04:05Z"}
"#;

fn full_manifests_round_trip_exactly_and_validate() {
    let np_doc = &yaml_docs(FULL_NODEPOOL)[0];
    assert_round_trips::<NodePool>(np_doc, true);
    let np: NodePool = serde_json::from_value(np_doc.clone()).unwrap();
    validate_nodepool(&np).unwrap();

    let nc_doc = &yaml_docs(FULL_NODECLAIM)[0];
    assert_round_trips::<NodeClaim>(nc_doc, true);
    let nc: NodeClaim = serde_json::from_value(nc_doc.clone()).unwrap();
    validate_nodeclaim(&nc).unwrap();
    assert_eq!(
        nc.status.as_ref().unwrap().provider_id.as_deref(),
        Some("aws:///us-east-1a/i-0abc")
    );

    let class_doc = &yaml_docs(FULL_NODECLASS)[0];
    assert_round_trips::<ClusterAPINodeClass>(class_doc, true);
    let class: ClusterAPINodeClass = serde_json::from_value(class_doc.clone()).unwrap();
    validate_nodeclass(&class).unwrap();
    assert_eq!(
        class.create_timeout(),
        Some(std::time::Duration::from_secs(600))
    );
}

/// Every property path under spec and status with its `type` (None where upstream gives none).
fn schema_paths(schema: &Value, path: &str, out: &mut BTreeMap<String, Option<String>>) {
    out.insert(
        path.to_string(),
        schema.get("type").and_then(Value::as_str).map(String::from),
    );
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            schema_paths(v, &format!("{path}.{k}"), out);
        }
    }
    if let Some(items) = schema.get("items") {
        schema_paths(items, &format!("{path}[]"), out);
    }
    if let Some(extra) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        schema_paths(extra, &format!("{path}{{}}"), out);
    }
}

fn version_schema_paths(crd: &Value) -> BTreeMap<String, Option<String>> {
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    let mut out = BTreeMap::new();
    for top in ["spec", "status"] {
        if let Some(s) = root.get(top) {
            schema_paths(s, top, &mut out);
        }
    }
    out
}

fn column_signature(crd: &Value) -> Vec<String> {
    crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .map(|cols| {
            cols.iter()
                .map(|c| {
                    format!(
                        "{} {} {} {}",
                        c["name"], c["type"], c["jsonPath"], c["priority"]
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Our CRDs as JSON, by name.
fn our_crds_by_name() -> BTreeMap<String, Value> {
    crds::all()
        .into_iter()
        .map(|c| {
            (
                c.metadata.name.clone().expect("our CRDs are named"),
                serde_json::to_value(c).expect("our CRDs serialise"),
            )
        })
        .collect()
}

/// Each path upstream's schema has that ours lacks, or has with another type.
fn path_problems(
    theirs: &BTreeMap<String, Option<String>>,
    have: &BTreeMap<String, Option<String>>,
) -> Vec<String> {
    theirs
        .iter()
        .filter_map(|(path, ty)| match (have.get(path), ty) {
            (None, _) => Some(format!("missing {path}")),
            (Some(got), Some(want)) if got.as_ref() != Some(want) => {
                Some(format!("{path}: type {want}, ours {got:?}"))
            }
            _ => None,
        })
        .collect()
}

fn our_crds_carry_every_upstream_property() {
    let ours = our_crds_by_name();
    for file in [
        "karpenter.sh_nodepools.yaml",
        "karpenter.sh_nodeclaims.yaml",
        "karpenter.cluster.x-k8s.io_clusterapinodeclasses.yaml",
        "karpenter.sh_nodeoverlays.yaml",
        "autoscaling.x-k8s.io_capacitybuffers.yaml",
    ] {
        let upstream = yaml_docs(&read(&assets::upstream(&format!("crds/{file}")))).remove(0);
        let name = upstream["metadata"]["name"].as_str().unwrap();
        let mine = ours.get(name).unwrap_or_else(|| panic!("no CRD {name}"));

        let theirs = version_schema_paths(&upstream);
        let have = version_schema_paths(mine);
        let problems = path_problems(&theirs, &have);
        assert!(problems.is_empty(), "{file}:\n{}", problems.join("\n"));
        assert!(
            theirs.len() > 5,
            "{file}: walked only {} paths",
            theirs.len()
        );

        for field in ["scope", "group"] {
            assert_eq!(
                mine["spec"][field], upstream["spec"][field],
                "{file} {field}"
            );
        }
        for field in ["kind", "plural", "singular", "shortNames", "categories"] {
            assert_eq!(
                mine["spec"]["names"][field], upstream["spec"]["names"][field],
                "{file} names.{field}"
            );
        }
        let (mv, uv) = (
            &mine["spec"]["versions"][0],
            &upstream["spec"]["versions"][0],
        );
        for field in ["name", "served", "storage", "subresources"] {
            assert_eq!(mv[field], uv[field], "{file} versions[0].{field}");
        }
        assert_eq!(
            column_signature(mine),
            column_signature(&upstream),
            "{file} printer columns"
        );
    }
}

fn deploy_crds_match_generated_output() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crds");
    if std::env::var("UPDATE_CRDS").is_ok_and(|v| v == "1") {
        crds::write_dir(&dir).unwrap();
    }
    for (name, yaml) in crds::render_each().unwrap() {
        let path = dir.join(&name);
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == yaml,
            "{} is out of date with the Rust types: run `cargo run -- crds --output-dir deploy/crds` \
             (or `UPDATE_CRDS=1 cargo test --test deploy api::`)",
            path.display()
        );
    }
    let all = crds::render_yaml().unwrap();
    let docs = yaml_docs(&all);
    assert_eq!(docs.len(), 6);
    assert!(docs.iter().all(|d| d["kind"] == "CustomResourceDefinition"));
}

fn valid_pool() -> NodePool {
    serde_json::from_value(yaml_docs(FULL_NODEPOOL).remove(0)).unwrap()
}

fn req(key: &str, op: Operator, values: &[&str]) -> NodeSelectorRequirementWithMinValues {
    NodeSelectorRequirementWithMinValues::new(key, op, values)
}

fn validation_names_the_field_for_each_rule() {
    type Mutate = fn(&mut NodePool);
    let cases: Vec<(&str, Mutate, &str, &str)> = vec![
        (
            "In without values",
            |np| np.spec.template.spec.requirements[2] = req("a.io/b", Operator::In, &[]),
            "spec.template.spec.requirements[2].values",
            "operator In needs at least one value",
        ),
        (
            "Gt without an integer",
            |np| np.spec.template.spec.requirements[2] = req("a.io/b", Operator::Gt, &["x"]),
            "spec.template.spec.requirements[2].values",
            "operator Gt needs exactly one integer",
        ),
        (
            "Lt with two values",
            |np| np.spec.template.spec.requirements[2] = req("a.io/b", Operator::Lt, &["1", "2"]),
            "spec.template.spec.requirements[2].values",
            "operator Lt needs exactly one integer",
        ),
        (
            "Gte negative",
            |np| np.spec.template.spec.requirements[2] = req("a.io/b", Operator::Gte, &["-1"]),
            "spec.template.spec.requirements[2].values",
            "operator Gte needs exactly one integer value >= 0",
        ),
        (
            "Exists with values",
            |np| np.spec.template.spec.requirements[5] = req("a.io/b", Operator::Exists, &["x"]),
            "spec.template.spec.requirements[5].values",
            "operator Exists takes no values",
        ),
        (
            "DoesNotExist with values",
            |np| {
                np.spec.template.spec.requirements[4] =
                    req("a.io/b", Operator::DoesNotExist, &["x"])
            },
            "spec.template.spec.requirements[4].values",
            "operator DoesNotExist takes no values",
        ),
        (
            "minValues above values",
            |np| np.spec.template.spec.requirements[0].min_values = Some(3),
            "spec.template.spec.requirements[0].minValues",
            "minValues 3 needs at least that many values",
        ),
        (
            "minValues out of range",
            |np| np.spec.template.spec.requirements[0].min_values = Some(0),
            "spec.template.spec.requirements[0].minValues",
            "between 1 and 50",
        ),
        (
            "bad requirement value",
            |np| np.spec.template.spec.requirements[0].values = Some(vec!["a b".into()]),
            "spec.template.spec.requirements[0].values[0]",
            "must be at most 63 characters",
        ),
        (
            "karpenter.sh requirement key",
            |np| np.spec.template.spec.requirements[1].key = "karpenter.sh/foo".into(),
            "spec.template.spec.requirements[1].key",
            "label domain \"karpenter.sh\" is restricted",
        ),
        (
            "karpenter.sh subdomain requirement key",
            |np| np.spec.template.spec.requirements[1].key = "x.karpenter.sh/foo".into(),
            "spec.template.spec.requirements[1].key",
            "label domain \"karpenter.sh\" is restricted",
        ),
        (
            "nodepool requirement key",
            |np| np.spec.template.spec.requirements[1].key = "karpenter.sh/nodepool".into(),
            "spec.template.spec.requirements[1].key",
            "label \"karpenter.sh/nodepool\" is restricted",
        ),
        (
            "hostname requirement key",
            |np| np.spec.template.spec.requirements[1].key = "kubernetes.io/hostname".into(),
            "spec.template.spec.requirements[1].key",
            "label \"kubernetes.io/hostname\" is restricted",
        ),
        (
            "malformed requirement key",
            |np| np.spec.template.spec.requirements[1].key = "Bad_Prefix/x".into(),
            "spec.template.spec.requirements[1].key",
            "lowercase DNS subdomain",
        ),
        (
            "karpenter.sh template label",
            |np| label(np, "karpenter.sh/registered"),
            "spec.template.metadata.labels[\"karpenter.sh/registered\"]",
            "label domain \"karpenter.sh\" is restricted",
        ),
        (
            "nodepool template label",
            |np| label(np, "karpenter.sh/nodepool"),
            "spec.template.metadata.labels[\"karpenter.sh/nodepool\"]",
            "label \"karpenter.sh/nodepool\" is restricted",
        ),
        (
            "hostname template label",
            |np| label(np, "kubernetes.io/hostname"),
            "spec.template.metadata.labels[\"kubernetes.io/hostname\"]",
            "label \"kubernetes.io/hostname\" is restricted",
        ),
        (
            "taint effect",
            |np| np.spec.template.spec.taints.as_mut().unwrap()[0].effect = "Sometimes".into(),
            "spec.template.spec.taints[0].effect",
            "must be one of NoSchedule, PreferNoSchedule, NoExecute",
        ),
        (
            "startup taint key",
            |np| np.spec.template.spec.startup_taints.as_mut().unwrap()[0].key = String::new(),
            "spec.template.spec.startupTaints[0].key",
            "may not be empty",
        ),
        (
            "nodeClassRef name",
            |np| np.spec.template.spec.node_class_ref.name = String::new(),
            "spec.template.spec.nodeClassRef.name",
            "name may not be empty",
        ),
        (
            "nodeClassRef group with version",
            |np| np.spec.template.spec.node_class_ref.group = "a.io/v1".into(),
            "spec.template.spec.nodeClassRef.group",
            "without a version",
        ),
        (
            "weight too high",
            |np| np.spec.weight = Some(101),
            "spec.weight",
            "weight 101 must be between 1 and 100",
        ),
        (
            "weight zero",
            |np| np.spec.weight = Some(0),
            "spec.weight",
            "must be between 1 and 100",
        ),
        (
            "budget nodes",
            |np| budget(np).nodes = "110%".into(),
            "spec.disruption.budgets[1].nodes",
            "must be a count",
        ),
        (
            "budget schedule syntax",
            |np| budget(np).schedule = Some("0 25 * * *".into()),
            "spec.disruption.budgets[1].schedule",
            "hour field",
        ),
        (
            "budget schedule macro",
            |np| budget(np).schedule = Some("@every 1h".into()),
            "spec.disruption.budgets[1].schedule",
            "unknown macro",
        ),
        (
            "budget schedule without duration",
            |np| budget(np).duration = None,
            "spec.disruption.budgets[1].duration",
            "'schedule' must be set with 'duration'",
        ),
        (
            "budget duration without schedule",
            |np| budget(np).schedule = None,
            "spec.disruption.budgets[1].schedule",
            "'schedule' must be set with 'duration'",
        ),
        (
            "budget duration seconds",
            |np| budget(np).duration = Some("90s".parse().unwrap()),
            "spec.disruption.budgets[1].duration",
            "whole minutes or hours",
        ),
        (
            "budget duplicate reason",
            |np| {
                budget(np)
                    .reasons
                    .as_mut()
                    .unwrap()
                    .push(karpenter_capi::api::nodepool::DisruptionReason::Drifted)
            },
            "spec.disruption.budgets[1].reasons[2]",
            "duplicate reason Drifted",
        ),
        (
            "consolidateAfter sub-second",
            |np| {
                np.spec.disruption.as_mut().unwrap().consolidate_after =
                    Some("1.5s".parse().unwrap())
            },
            "spec.disruption.consolidateAfter",
            "whole number of seconds",
        ),
        (
            "expireAfter sub-second",
            |np| np.spec.template.spec.expire_after = Some("500ms".parse().unwrap()),
            "spec.template.spec.expireAfter",
            "whole number of seconds",
        ),
        (
            "terminationGracePeriod sub-second",
            |np| np.spec.template.spec.termination_grace_period = Some("10.5s".parse().unwrap()),
            "spec.template.spec.terminationGracePeriod",
            "whole number of seconds",
        ),
        (
            "static pool with weight",
            |np| np.spec.replicas = Some(3),
            "spec.weight",
            "'weight' is not supported on static NodePools",
        ),
        (
            "static pool with cpu limit",
            |np| {
                np.spec.replicas = Some(3);
                np.spec.weight = None;
            },
            "spec.limits",
            "only 'limits.nodes' is supported on static NodePools",
        ),
        (
            "negative replicas",
            |np| {
                np.spec.replicas = Some(-1);
                np.spec.weight = None;
                np.spec.limits = None;
            },
            "spec.replicas",
            "must not be negative",
        ),
    ];
    validate_nodepool(&valid_pool()).expect("the base case is valid");
    for (name, mutate, field, message) in cases {
        let mut np = valid_pool();
        mutate(&mut np);
        let errs = validate_nodepool(&np).expect_err(name);
        let text = errs.to_string();
        assert!(errs.has_field(field), "{name}: no error on {field}: {text}");
        assert!(text.contains(&format!("{field}: ")), "{name}: {text}");
        let on_field: Vec<_> = errs.errors.iter().filter(|e| e.field == field).collect();
        assert!(
            on_field.iter().any(|e| e.message.contains(message)),
            "{name}: want {message:?} on {field}, got {text}"
        );
    }
}

fn label(np: &mut NodePool, key: &str) {
    np.spec
        .template
        .metadata
        .get_or_insert_default()
        .labels
        .get_or_insert_default()
        .insert(key.to_string(), "x".to_string());
}

fn budget(np: &mut NodePool) -> &mut Budget {
    &mut np
        .spec
        .disruption
        .as_mut()
        .unwrap()
        .budgets
        .as_mut()
        .unwrap()[1]
}

fn validation_of_nodeclaims_and_nodeclasses() {
    let nc: NodeClaim = serde_json::from_value(yaml_docs(FULL_NODECLAIM).remove(0)).unwrap();
    // NodeClaims may carry karpenter.sh/nodepool, but never the hostname.
    validate_nodeclaim(&nc).unwrap();
    let mut bad = nc.clone();
    bad.spec.requirements[1].key = "kubernetes.io/hostname".into();
    bad.spec.requirements[2] = req("a.io/b", Operator::In, &[]);
    let errs = validate_nodeclaim(&bad).unwrap_err();
    assert!(errs.has_field("spec.requirements[1].key"), "{errs}");
    assert!(errs.has_field("spec.requirements[2].values"), "{errs}");
    assert_eq!(errs.errors.len(), 2, "all errors reported: {errs}");

    let class: ClusterAPINodeClass =
        serde_json::from_value(yaml_docs(FULL_NODECLASS).remove(0)).unwrap();
    let mut bad = class.clone();
    let sel = bad.spec.scalable_resource_selector.as_mut().unwrap();
    sel.match_expressions.as_mut().unwrap()[0].values = None;
    let errs = validate_nodeclass(&bad).unwrap_err();
    assert!(
        errs.has_field("spec.scalableResourceSelector.matchExpressions[0].values"),
        "{errs}"
    );
    let mut bad = class.clone();
    bad.spec
        .scalable_resource_selector
        .as_mut()
        .unwrap()
        .match_expressions
        .as_mut()
        .unwrap()[0]
        .operator = "Gt".into();
    let errs = validate_nodeclass(&bad).unwrap_err();
    assert!(
        errs.has_field("spec.scalableResourceSelector.matchExpressions[0].operator"),
        "{errs}"
    );
    let mut bad = class;
    bad.spec.create_timeout = Some("0s".parse().unwrap());
    assert!(
        validate_nodeclass(&bad)
            .unwrap_err()
            .has_field("spec.createTimeout")
    );
}

fn bad_durations_and_enums_fail_to_decode_with_the_value() {
    let mut doc = yaml_docs(FULL_NODEPOOL).remove(0);
    doc["spec"]["template"]["spec"]["terminationGracePeriod"] = "Never".into();
    let err = serde_json::from_value::<NodePool>(doc)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Never"), "{err}");
    let mut doc = yaml_docs(FULL_NODEPOOL).remove(0);
    doc["spec"]["template"]["spec"]["requirements"][0]["operator"] = "Near".into();
    let err = serde_json::from_value::<NodePool>(doc)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Near"), "{err}");
}

/// The validation keywords compared with upstream.
const KEYWORDS: [&str; 9] = [
    "pattern",
    "maxLength",
    "minLength",
    "enum",
    "required",
    "minimum",
    "maximum",
    "maxItems",
    "x-kubernetes-validations",
];

/// Every (path, keyword) -> value under spec and status.
fn schema_keywords(schema: &Value, path: &str, out: &mut BTreeMap<String, Value>) {
    for k in KEYWORDS {
        if let Some(v) = schema.get(k) {
            let v = match (k, v) {
                // Order of `required` and of CEL rules carries no meaning.
                ("required", Value::Array(a)) => {
                    let mut a: Vec<String> = a.iter().map(|x| x.to_string()).collect();
                    a.sort();
                    Value::from(a)
                }
                // 0 and 0.0 are the same bound.
                (_, Value::Number(n)) => Value::from(n.as_f64().unwrap_or_default()),
                ("x-kubernetes-validations", Value::Array(a)) => {
                    let mut a: Vec<String> = a.iter().map(|x| x["rule"].to_string()).collect();
                    a.sort();
                    Value::from(a)
                }
                _ => v.clone(),
            };
            out.insert(format!("{path} {k}"), v);
        }
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            schema_keywords(v, &format!("{path}.{k}"), out);
        }
    }
    if let Some(items) = schema.get("items") {
        schema_keywords(items, &format!("{path}[]"), out);
    }
    if let Some(extra) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        schema_keywords(extra, &format!("{path}{{}}"), out);
    }
}

fn version_schema_keywords(crd: &Value) -> BTreeMap<String, Value> {
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    let mut out = BTreeMap::new();
    for top in ["spec", "status"] {
        if let Some(s) = root.get(top) {
            schema_keywords(s, top, &mut out);
        }
    }
    out
}

fn our_crds_carry_upstream_validation() {
    let ours = our_crds_by_name();
    let mut problems = Vec::new();
    for file in [
        "karpenter.sh_nodepools.yaml",
        "karpenter.sh_nodeclaims.yaml",
        "karpenter.cluster.x-k8s.io_clusterapinodeclasses.yaml",
        "karpenter.sh_nodeoverlays.yaml",
        "autoscaling.x-k8s.io_capacitybuffers.yaml",
    ] {
        let upstream = yaml_docs(&read(&assets::upstream(&format!("crds/{file}")))).remove(0);
        let name = upstream["metadata"]["name"].as_str().unwrap();
        let mine = ours.get(name).unwrap_or_else(|| panic!("no CRD {name}"));
        let theirs = version_schema_keywords(&upstream);
        let have = version_schema_keywords(mine);
        for (key, want) in &theirs {
            if have.get(key) != Some(want) {
                let intended = INTENDED_DIFFERENCES
                    .iter()
                    .any(|(f, k, _)| *f == file && *k == key);
                if !intended {
                    problems.push(format!(
                        "{file} {key}: upstream {want}, ours {}",
                        have.get(key).map_or("none".into(), Value::to_string)
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} differences:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Where our schema deliberately differs from upstream's (file, "path keyword", why).
const INTENDED_DIFFERENCES: &[(&str, &str, &str)] = &[
    (
        "karpenter.sh_nodepools.yaml",
        "spec.template.spec.requirements x-kubernetes-validations",
        "NodePool and NodeClaim share one requirement type, so the NodePool-only rule \
         `key != karpenter.sh/nodepool` sits on the list as `self.all(x, x.key != ...)` \
         instead of on the item's key: the same objects are refused",
    ),
    (
        "karpenter.sh_nodepools.yaml",
        "spec.template.spec.requirements[].key x-kubernetes-validations",
        "the other half of the difference above: the key carries the two rules both kinds share",
    ),
    (
        "karpenter.sh_nodepools.yaml",
        "spec.disruption.budgets[].reasons[] enum",
        "Karpenter v1.15's node repair (#3311) adds the reason Unhealthy, merged after the \
         upstream CRD files compared here",
    ),
];

/// The scale-from-zero annotations of upstream's kubemark example read as Cluster Autoscaler reads them.
fn the_upstream_kubemark_example_parses() {
    let path = assets::upstream("examples/kubemark-machine-deployment.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let first = text.split("\n---").next().unwrap();
    let md: Value = serde_saphyr::from_str(first).unwrap();
    let annotations: BTreeMap<String, String> =
        serde_json::from_value(md["metadata"]["annotations"].clone()).unwrap();
    let sfz = karpenter_capi::capi::annotations::parse(&annotations).unwrap();
    assert_eq!(sfz.memory, Some("4G".parse().unwrap()));
    assert_eq!(sfz.max_size, Some(10));
    assert_eq!(sfz.price, Some(0.5));
    assert_eq!(
        sfz.labels
            .get(karpenter_capi::api::wellknown::CAPACITY_TYPE_LABEL)
            .map(String::as_str),
        Some("on-demand")
    );
}

/// `examples/nodepool.yaml`, which the README applies, is exact for our types and valid.
fn the_repository_example_round_trips_and_validates() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/nodepool.yaml");
    let mut kinds = Vec::new();
    for doc in yaml_docs(&read(&path)) {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "NodePool" => {
                assert_round_trips::<NodePool>(&doc, true);
                validate_nodepool(&serde_json::from_value(doc.clone()).unwrap()).unwrap();
            }
            "ClusterAPINodeClass" => {
                assert_round_trips::<ClusterAPINodeClass>(&doc, true);
                validate_nodeclass(&serde_json::from_value(doc.clone()).unwrap()).unwrap();
            }
            "Deployment" => {
                serde_json::from_value::<k8s_openapi::api::apps::v1::Deployment>(doc.clone())
                    .unwrap();
            }
            other => panic!("{}: unexpected kind {other:?}", path.display()),
        }
        kinds.push(kind);
    }
    assert_eq!(kinds, ["ClusterAPINodeClass", "NodePool", "Deployment"]);
}

/// `examples/generate-nodeclass.yaml` is exact for our types, its `spec.generate` passes
/// `capi::generate::validate`, and for every shape its patch applies to the simulator's source
/// (`default/md-small` and its DevMachineTemplate, as `--scenario none` seeds them), giving a
/// template the simulated infrastructure sizes the VM from, and a group marked as this
/// NodeClass's that its selector picks.
fn the_generate_example_is_a_valid_generate_for_the_simulator() {
    use karpenter_capi::capi::generate::{self, GENERATED_LABEL};
    use karpenter_capi::capi::model::MachineDeployment;
    use karpenter_capi::capi::version::CapiVersion;
    use karpenter_capi::sim::cluster::{infrastructure_template, machine_deployment};

    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/generate-nodeclass.yaml");
    let docs = yaml_docs(&read(&path));
    let kinds: Vec<&str> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(kinds, ["ClusterAPINodeClass", "NodePool"]);
    assert_round_trips::<ClusterAPINodeClass>(&docs[0], true);
    assert_round_trips::<NodePool>(&docs[1], true);
    let nodeclass: ClusterAPINodeClass = serde_json::from_value(docs[0].clone()).unwrap();
    validate_nodeclass(&nodeclass).unwrap();
    let nodepool: NodePool = serde_json::from_value(docs[1].clone()).unwrap();
    validate_nodepool(&nodepool).unwrap();
    assert_eq!(nodepool.spec.template.spec.node_class_ref.name, "generated");

    let g = nodeclass.spec.generate.as_ref().expect("spec.generate");
    let valid = generate::validate(g).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(valid.source, "default/md-small");
    assert_eq!(valid.shapes.len(), 11, "{:?}", valid.shapes);
    assert_eq!(valid.max_groups, 6);
    assert_eq!(valid.idle_after, std::time::Duration::from_secs(300));
    let priced: BTreeMap<String, f64> = valid.shapes.iter().map(|(s, p)| (s.name(), *p)).collect();
    assert!((priced["2c-8gi"] - 0.098).abs() < 1e-9, "{priced:?}");

    let v = CapiVersion::V1Beta2;
    let seed = karpenter_capi::simulate::pods::seed_of(0, 10);
    assert_eq!(
        (seed.namespace.as_str(), seed.name.as_str()),
        ("default", "md-small")
    );
    // As the API server returns it: with a uid and a resourceVersion.
    let mut source_raw = serde_json::to_value(machine_deployment(v.into(), &seed)).unwrap();
    source_raw["metadata"]["uid"] = serde_json::json!("u-md-small");
    source_raw["metadata"]["resourceVersion"] = serde_json::json!("1");
    let source = MachineDeployment::from_value(&source_raw, v).unwrap();
    let template = serde_json::to_value(infrastructure_template("default", "md-small")).unwrap();
    let name = nodeclass.metadata.name.as_deref().unwrap_or_default();
    let selector = nodeclass
        .spec
        .scalable_resource_selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    let plans = generate::plans(name, &valid, &source);
    assert_eq!(plans.len(), 11);
    for plan in &plans {
        let t = plan
            .template_object(&template)
            .unwrap_or_else(|e| panic!("{}: {e}", plan.name));
        let ann = &t["metadata"]["annotations"];
        assert_eq!(
            ann["sim.karpenter.cluster.x-k8s.io/cpu"],
            plan.shape.cpu.to_string()
        );
        assert_eq!(
            ann["sim.karpenter.cluster.x-k8s.io/memory"],
            format!("{}Mi", plan.shape.memory_mib)
        );
        assert_eq!(ann["sim.karpenter.cluster.x-k8s.io/gpu"], "0");
        assert_eq!(t["metadata"]["labels"][GENERATED_LABEL], name);
        let group = plan.group_object(&source_raw, &source);
        assert_eq!(group["spec"]["replicas"], 0);
        for (k, want) in &selector {
            assert_eq!(
                group["metadata"]["labels"][k],
                want.as_str(),
                "{}",
                plan.name
            );
        }
    }
}

/// Manifests written for Karpenter v1.15's API (kubernetes-sigs/karpenter#3220: `consolidateAfter`
/// defaulted to `0s` instead of required; #2924: the requirement operators listed whole, Gte and
/// Lte among them), here and not copied: a v1.14.1 CRD refuses the first and third NodePools.
const KARPENTER_V1_15: &str = r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: no-consolidate-after}
spec:
  template:
    spec:
      requirements:
        - {key: kubernetes.io/arch, operator: In, values: [amd64]}
        - {key: karpenter.sh/capacity-type, operator: NotIn, values: [spot]}
        - {key: topology.kubernetes.io/zone, operator: Exists}
        - {key: example.com/gpu, operator: DoesNotExist}
        - {key: example.com/cpu, operator: Gt, values: ["1"]}
        - {key: example.com/cpu-max, operator: Lt, values: ["65"]}
        - {key: example.com/generation, operator: Gte, values: ["3"]}
        - {key: example.com/memory-gib, operator: Lte, values: ["256"]}
      nodeClassRef: {group: karpenter.cluster.x-k8s.io, kind: ClusterAPINodeClass, name: default}
  disruption:
    consolidationPolicy: WhenEmpty
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: as-stored}
spec:
  template:
    spec:
      requirements:
        - {key: example.com/generation, operator: Gte, values: ["3"]}
      nodeClassRef: {group: karpenter.cluster.x-k8s.io, kind: ClusterAPINodeClass, name: default}
      expireAfter: 720h
  disruption:
    consolidateAfter: 0s
    consolidationPolicy: WhenEmptyOrUnderutilized
    budgets:
      - {nodes: "10%"}
      - {nodes: "1", reasons: [Unhealthy]}
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: static-no-consolidate-after}
spec:
  replicas: 3
  template:
    spec:
      requirements: []
      nodeClassRef: {group: karpenter.cluster.x-k8s.io, kind: ClusterAPINodeClass, name: default}
  disruption:
    budgets:
      - {nodes: "1"}
  limits: {nodes: "5"}
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: no-disruption}
spec:
  template:
    spec:
      requirements: []
      nodeClassRef: {group: karpenter.cluster.x-k8s.io, kind: ClusterAPINodeClass, name: default}
---
apiVersion: karpenter.sh/v1
kind: NodeClaim
metadata:
  name: v115-abcde
  labels: {karpenter.sh/nodepool: no-consolidate-after}
spec:
  requirements:
    - {key: karpenter.sh/nodepool, operator: In, values: [no-consolidate-after]}
    - {key: example.com/generation, operator: Gte, values: ["3"], minValues: 1}
    - {key: example.com/memory-gib, operator: Lte, values: ["256"]}
  nodeClassRef: {group: karpenter.cluster.x-k8s.io, kind: ClusterAPINodeClass, name: default}
  expireAfter: 720h
---
apiVersion: karpenter.sh/v1alpha1
kind: NodeOverlay
metadata: {name: newer-generations}
spec:
  requirements:
    - {key: example.com/generation, operator: Gte, values: ["5"]}
    - {key: example.com/memory-gib, operator: Lte, values: ["64"]}
  priceAdjustment: "-10%"
  weight: 10
"#;

/// What v1.15 added is read, kept and written back unchanged, and means what it means upstream:
/// a pool without `consolidateAfter` consolidates as one with `0s` does.
fn karpenter_v1_15_manifests_round_trip_and_validate() {
    let mut kinds = Vec::new();
    let mut pools = BTreeMap::new();
    for doc in yaml_docs(KARPENTER_V1_15) {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "NodePool" => {
                assert_round_trips::<NodePool>(&doc, true);
                let np: NodePool = serde_json::from_value(doc.clone()).unwrap();
                validate_nodepool(&np).unwrap_or_else(|e| panic!("{}: {e}", doc["metadata"]));
                pools.insert(doc["metadata"]["name"].as_str().unwrap().to_string(), np);
            }
            "NodeClaim" => {
                assert_round_trips::<NodeClaim>(&doc, true);
                validate_nodeclaim(&serde_json::from_value(doc.clone()).unwrap()).unwrap();
            }
            "NodeOverlay" => {
                assert_round_trips::<NodeOverlay>(&doc, true);
                validate_nodeoverlay(&serde_json::from_value(doc.clone()).unwrap()).unwrap();
            }
            other => panic!("unexpected kind {other:?}"),
        }
        kinds.push(kind);
    }
    assert_eq!(
        kinds,
        [
            "NodePool",
            "NodePool",
            "NodePool",
            "NodePool",
            "NodeClaim",
            "NodeOverlay"
        ]
    );
    // Upstream's defaulted `0s`: consolidate as soon as a node qualifies.
    let zero = NillableDuration::After(std::time::Duration::ZERO);
    for name in [
        "no-consolidate-after",
        "as-stored",
        "static-no-consolidate-after",
        "no-disruption",
    ] {
        assert_eq!(pools[name].disruption().consolidate_after(), zero, "{name}");
    }
    assert!(pools["static-no-consolidate-after"].is_static());
}

/// Our CRDs carry v1.15's schema for what changed since v1.14.1 (checked here without
/// upstream's files; `our_crds_carry_upstream_validation` compares every keyword with them):
/// `consolidateAfter` defaults to `0s` and is not required, and every requirement's operator
/// lists the eight operators in upstream's order.
fn our_crds_default_and_enumerate_as_karpenter_v1_15() {
    let ours = our_crds_by_name();
    let spec = |crd: &str| {
        ours[crd]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
    };
    let disruption = spec("nodepools.karpenter.sh")["properties"]["disruption"].clone();
    assert_eq!(
        disruption["properties"]["consolidateAfter"]["default"],
        "0s"
    );
    assert_eq!(disruption["default"]["consolidateAfter"], "0s");
    let required = disruption["required"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !required.iter().any(|r| r == "consolidateAfter"),
        "{required:?}"
    );
    let operators = [
        "In",
        "NotIn",
        "Exists",
        "DoesNotExist",
        "Gt",
        "Lt",
        "Gte",
        "Lte",
    ];
    for (crd, requirements) in [
        (
            "nodepools.karpenter.sh",
            spec("nodepools.karpenter.sh")["properties"]["template"]["properties"]["spec"]
                ["properties"]["requirements"]
                .clone(),
        ),
        (
            "nodeclaims.karpenter.sh",
            spec("nodeclaims.karpenter.sh")["properties"]["requirements"].clone(),
        ),
        (
            "nodeoverlays.karpenter.sh",
            spec("nodeoverlays.karpenter.sh")["properties"]["requirements"].clone(),
        ),
    ] {
        assert_eq!(
            requirements["items"]["properties"]["operator"]["enum"],
            serde_json::json!(operators),
            "{crd}"
        );
    }
}

/// Our CapacityQuota CRD against Cluster Autoscaler's (1.37, `apis/config/crd`): the same
/// group, kind, names and cluster scope, a `v1beta1` with a status subresource, and that
/// version's every property, type and validation keyword. Upstream also serves the deprecated
/// `v1alpha1` (the same schema); we serve `v1beta1` only.
fn capacity_quota_crd_is_cluster_autoscalers() {
    let upstream = yaml_docs(&read(&assets::upstream(assets::CAPACITY_QUOTA_CRD))).remove(0);
    let name = upstream["metadata"]["name"].as_str().unwrap();
    assert_eq!(name, "capacityquotas.autoscaling.x-k8s.io");
    let ours = our_crds_by_name();
    let mine = ours.get(name).unwrap_or_else(|| panic!("no CRD {name}"));
    for field in ["group", "scope", "names"] {
        let mut want = upstream["spec"][field].clone();
        if let Some(n) = want.as_object_mut() {
            // Generated by kube-apiserver when absent; ours leaves it to it.
            n.remove("listKind");
        }
        let mut got = mine["spec"][field].clone();
        if let Some(n) = got.as_object_mut() {
            n.remove("listKind");
        }
        assert_eq!(got, want, "spec.{field}");
    }
    let v1beta1 = upstream["spec"]["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == "v1beta1"))
        .cloned()
        .expect("upstream serves v1beta1");
    assert_eq!(v1beta1["storage"], true);
    let mine_version = &mine["spec"]["versions"][0];
    assert_eq!(mine_version["name"], "v1beta1");
    assert_eq!(mine_version["subresources"], v1beta1["subresources"]);
    let upstream_one = serde_json::json!({"spec": {"versions": [v1beta1]}});
    let (theirs, have) = (
        version_schema_paths(&upstream_one),
        version_schema_paths(mine),
    );
    let mut problems = path_problems(&theirs, &have);
    problems.extend(
        have.keys()
            .filter(|p| !theirs.contains_key(*p))
            .map(|p| format!("extra {p}")),
    );
    let (theirs, have) = (
        version_schema_keywords(&upstream_one),
        version_schema_keywords(mine),
    );
    for (key, want) in &theirs {
        if have.get(key) != Some(want) {
            problems.push(format!(
                "{key}: upstream {want}, ours {}",
                have.get(key).map_or("none".into(), Value::to_string)
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
