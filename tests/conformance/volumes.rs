//! Upstream provisioning suite "Volume Topology Requirements" and the topology cases of the
//! scheduling suite's "VolumeUsage" context: a pod's claims (and ephemeral volumes' claims)
//! restrict it to where its volumes can attach, and a claim that cannot be used makes the pod
//! not provisionable while other pods still get nodes.

use k8s_openapi::api::core::v1::{
    EphemeralVolumeSource, NodeSelectorRequirement, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource, Pod, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use karpenter_capi::api::wellknown::ZONE_LABEL;
use karpenter_capi::scheduling::PodError;
use karpenter_capi::scheduling::volumes::ANN_DEFAULT_CLASS;
use serde_json::{Value, json};

use crate::fixture::*;

const HOSTNAME: &str = "kubernetes.io/hostname";

fn plain(name: &str) -> karpenter_capi::api::nodepool::NodePool {
    let mut np = nodepool(name);
    np.spec.template.spec.requirements.clear();
    np
}

/// Upstream's provisioning-suite setup: one pool without requirements on the default catalog.
fn env() -> Env {
    Env::new(plain("default"))
}

/// A StorageClass with one allowed-topology term per entry (each an AND of key -> values).
fn class(name: &str, mode: &str, terms: &[&[(&str, &[&str])]]) -> StorageClass {
    let topologies: Vec<Value> = terms
        .iter()
        .map(|t| {
            let exprs: Vec<Value> = t
                .iter()
                .map(|(k, vs)| json!({"key": k, "values": vs}))
                .collect();
            json!({"matchLabelExpressions": exprs})
        })
        .collect();
    let mut sc = json!({
        "metadata": {"name": name}, "provisioner": "test-provisioner",
        "volumeBindingMode": mode,
    });
    if !topologies.is_empty() {
        sc["allowedTopologies"] = json!(topologies);
    }
    serde_json::from_value(sc).unwrap()
}

/// Upstream's default test StorageClass: WaitForFirstConsumer in zones 2 and 3.
fn zonal_class() -> StorageClass {
    class(
        "my-storage-class",
        "WaitForFirstConsumer",
        &[&[(ZONE_LABEL, &["test-zone-2", "test-zone-3"])]],
    )
}

/// A claim in `default`; naming a volume marks it bound (the bind-completed annotation), as
/// upstream's test helper does.
fn claim(name: &str, class: Option<&str>, volume: Option<&str>) -> PersistentVolumeClaim {
    let mut pvc = json!({"metadata": {"name": name, "namespace": "default"}, "spec": {}});
    if let Some(c) = class {
        pvc["spec"]["storageClassName"] = json!(c);
    }
    if let Some(v) = volume {
        pvc["spec"]["volumeName"] = json!(v);
        pvc["metadata"]["annotations"] = json!({"pv.kubernetes.io/bind-completed": "yes"});
    }
    serde_json::from_value(pvc).unwrap()
}

/// A CSI volume whose node affinity has one term per entry (each an AND of requirements).
fn volume(name: &str, terms: Vec<Vec<NodeSelectorRequirement>>) -> PersistentVolume {
    let mut pv = json!({"metadata": {"name": name}, "spec": {
        "csi": {"driver": "test.driver", "volumeHandle": name},
    }});
    if !terms.is_empty() {
        let terms: Vec<Value> = terms
            .into_iter()
            .map(|t| json!({"matchExpressions": t}))
            .collect();
        pv["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": terms}});
    }
    serde_json::from_value(pv).unwrap()
}

fn zonal_volume(name: &str, zones: &[&str]) -> PersistentVolume {
    volume(name, vec![vec![node_req(ZONE_LABEL, "In", zones)]])
}

/// `local` or `hostPath` instead of CSI.
fn node_local(mut pv: PersistentVolume, kind: &str) -> PersistentVolume {
    let spec = pv.spec.as_mut().unwrap();
    spec.csi = None;
    match kind {
        "local" => spec.local = Some(serde_json::from_value(json!({"path": "/mnt/x"})).unwrap()),
        _ => spec.host_path = Some(serde_json::from_value(json!({"path": "/mnt/x"})).unwrap()),
    }
    pv
}

fn with_claims(mut p: Pod, claims: &[&str]) -> Pod {
    let vols = p
        .spec
        .as_mut()
        .unwrap()
        .volumes
        .get_or_insert_with(Vec::new);
    for c in claims {
        vols.push(Volume {
            name: format!("vol-{c}"),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: c.to_string(),
                read_only: None,
            }),
            ..Default::default()
        });
    }
    p
}

/// An ephemeral volume named `data`: its claim is `<pod>-data`.
fn with_ephemeral(mut p: Pod, class: &str) -> Pod {
    let template = json!({"spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                                   "resources": {"requests": {"storage": "1Gi"}}}});
    p.spec.as_mut().unwrap().volumes = Some(vec![Volume {
        name: "data".into(),
        ephemeral: Some(EphemeralVolumeSource {
            volume_claim_template: Some(serde_json::from_value(template).unwrap()),
        }),
        ..Default::default()
    }]);
    p
}

trait Storage {
    fn with_class(self, sc: StorageClass) -> Self;
    fn with_claim(self, pvc: PersistentVolumeClaim) -> Self;
    fn with_volume(self, pv: PersistentVolume) -> Self;
}

impl Storage for Env {
    fn with_class(mut self, sc: StorageClass) -> Self {
        self.volumes.apply_class(&sc);
        self
    }
    fn with_claim(mut self, pvc: PersistentVolumeClaim) -> Self {
        self.volumes.apply_claim(&pvc);
        self
    }
    fn with_volume(mut self, pv: PersistentVolume) -> Self {
        self.volumes.apply_volume(&pv);
        self
    }
}

/// The pod is reported as not provisionable (upstream's ignored pods).
fn ignored(out: &Outcome, pod: &str) {
    out.not_scheduled(pod);
    let key = format!("default/{pod}");
    assert!(
        out.results
            .failures
            .iter()
            .any(|(k, e)| *k == key && matches!(e, PodError::InvalidPod { .. })),
        "{pod} not reported as not provisionable: {:?}",
        out.results.failures
    );
}

// --- Volume Topology Requirements ---

#[test]
fn a_pod_with_a_missing_claim_is_not_provisionable() {
    let out = env().provision(&[with_claims(pod("p"), &["invalid"])]);
    ignored(&out, "p");
}

#[test]
fn a_bound_claim_with_an_empty_storage_class_schedules() {
    let e = env()
        .with_claim(claim("c", Some(""), Some("test-volume")))
        .with_volume(volume("test-volume", vec![]));
    e.provision(&[with_claims(pod("p"), &["c"])]).scheduled("p");
}

#[test]
fn an_unbound_claim_with_an_empty_storage_class_does_not_schedule() {
    let e = env().with_claim(claim("c", Some(""), None));
    ignored(&e.provision(&[with_claims(pod("p"), &["c"])]), "p");
}

#[test]
fn a_bound_claim_with_a_missing_storage_class_schedules() {
    let e = env()
        .with_claim(claim(
            "c",
            Some("missing-storage-class"),
            Some("test-volume"),
        ))
        .with_volume(volume("test-volume", vec![]));
    e.provision(&[with_claims(pod("p"), &["c"])]).scheduled("p");
}

#[test]
fn an_unbound_claim_with_a_missing_storage_class_does_not_schedule() {
    let e = env().with_claim(claim("c", Some("missing-storage-class"), None));
    ignored(&e.provision(&[with_claims(pod("p"), &["c"])]), "p");
}

#[test]
fn valid_pods_schedule_beside_a_pod_with_a_missing_claim() {
    let out = env().provision(&[with_claims(pod("bad"), &["invalid"]), pod("good")]);
    ignored(&out, "bad");
    out.scheduled("good");
}

#[test]
fn valid_pods_schedule_beside_a_pod_whose_claim_names_a_missing_class() {
    let e = env().with_claim(claim("c", Some("invalid-storage-class"), None));
    let out = e.provision(&[with_claims(pod("bad"), &["c"]), pod("good")]);
    ignored(&out, "bad");
    out.scheduled("good");
}

#[test]
fn valid_pods_schedule_beside_a_pod_whose_claim_names_a_missing_volume() {
    let e = env().with_claim(claim("c", None, Some("invalid-volume-name")));
    let out = e.provision(&[with_claims(pod("bad"), &["c"]), pod("good")]);
    ignored(&out, "bad");
    out.scheduled("good");
}

#[test]
fn an_unbound_claim_schedules_into_its_storage_class_zones() {
    let e = env()
        .with_class(zonal_class())
        .with_claim(claim("c", Some("my-storage-class"), None));
    let p = with_claims(pod("p"), &["c"]).required(vec![node_req(
        ZONE_LABEL,
        "In",
        &["test-zone-1", "test-zone-3"],
    )]);
    let out = e.provision(&[p]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-3"));
}

#[test]
fn an_unbound_ephemeral_claim_schedules_into_its_storage_class_zones() {
    let e =
        env()
            .with_class(zonal_class())
            .with_claim(claim("p-data", Some("my-storage-class"), None));
    let p = with_ephemeral(pod("p"), "my-storage-class").required(vec![node_req(
        ZONE_LABEL,
        "In",
        &["test-zone-1", "test-zone-3"],
    )]);
    let out = e.provision(&[p]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-3"));
}

#[test]
fn storage_class_zones_incompatible_with_the_pod_do_not_schedule() {
    let e = env()
        .with_class(zonal_class())
        .with_claim(claim("c", Some("my-storage-class"), None));
    let p =
        with_claims(pod("p"), &["c"]).required(vec![node_req(ZONE_LABEL, "In", &["test-zone-1"])]);
    e.provision(&[p]).not_scheduled("p");
}

#[test]
fn ephemeral_storage_class_zones_incompatible_with_the_pod_do_not_schedule() {
    let e =
        env()
            .with_class(zonal_class())
            .with_claim(claim("p-data", Some("my-storage-class"), None));
    let p = with_ephemeral(pod("p"), "my-storage-class").required(vec![node_req(
        ZONE_LABEL,
        "In",
        &["test-zone-1"],
    )]);
    e.provision(&[p]).not_scheduled("p");
}

#[test]
fn a_bound_claim_schedules_into_its_volume_zones() {
    let e = env()
        .with_class(zonal_class())
        .with_volume(zonal_volume("pv", &["test-zone-3"]))
        .with_claim(claim("c", Some("my-storage-class"), Some("pv")));
    let out = e.provision(&[with_claims(pod("p"), &["c"])]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-3"));
}

#[test]
fn a_bound_ephemeral_claim_schedules_into_its_volume_zones() {
    let e = env()
        .with_class(zonal_class())
        .with_volume(zonal_volume("pv", &["test-zone-3"]))
        .with_claim(claim("p-data", Some("my-storage-class"), Some("pv")));
    let out = e.provision(&[with_ephemeral(pod("p"), "my-storage-class")]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-3"));
}

fn local_path_env(kind: &str, claim_name: &str) -> Env {
    let pv = node_local(
        volume(
            "local-pv",
            vec![vec![node_req(HOSTNAME, "In", &["random-node"])]],
        ),
        kind,
    );
    env()
        .with_class(class("local-path", "WaitForFirstConsumer", &[]))
        .with_volume(pv)
        .with_claim(claim(claim_name, Some("local-path"), Some("local-pv")))
}

#[test]
fn hostname_affinity_of_a_local_volume_is_ignored() {
    let e = local_path_env("local", "c");
    e.provision(&[with_claims(pod("p"), &["c"])]).scheduled("p");
}

#[test]
fn hostname_affinity_of_a_hostpath_volume_is_ignored() {
    let e = local_path_env("hostPath", "c");
    e.provision(&[with_claims(pod("p"), &["c"])]).scheduled("p");
}

#[test]
fn hostname_affinity_of_a_local_ephemeral_volume_is_ignored() {
    let e = local_path_env("local", "p-data");
    e.provision(&[with_ephemeral(pod("p"), "local-path")])
        .scheduled("p");
}

#[test]
fn hostname_affinity_of_a_hostpath_ephemeral_volume_is_ignored() {
    let e = local_path_env("hostPath", "p-data");
    e.provision(&[with_ephemeral(pod("p"), "local-path")])
        .scheduled("p");
}

#[test]
fn hostname_affinity_of_a_csi_volume_is_kept() {
    let e = env()
        .with_class(zonal_class())
        .with_volume(volume(
            "pv",
            vec![vec![node_req(HOSTNAME, "In", &["random-node"])]],
        ))
        .with_claim(claim("c", Some("my-storage-class"), Some("pv")));
    e.provision(&[with_claims(pod("p"), &["c"])])
        .not_scheduled("p");
}

#[test]
fn volume_zones_incompatible_with_the_pod_do_not_schedule() {
    let e = env()
        .with_class(zonal_class())
        .with_volume(zonal_volume("pv", &["test-zone-3"]))
        .with_claim(claim("c", Some("my-storage-class"), Some("pv")));
    let p =
        with_claims(pod("p"), &["c"]).required(vec![node_req(ZONE_LABEL, "In", &["test-zone-1"])]);
    e.provision(&[p]).not_scheduled("p");
}

#[test]
fn ephemeral_volume_zones_incompatible_with_the_pod_do_not_schedule() {
    let e = env()
        .with_class(zonal_class())
        .with_volume(zonal_volume("pv", &["test-zone-3"]))
        .with_claim(claim("p-data", Some("my-storage-class"), Some("pv")));
    let p = with_ephemeral(pod("p"), "my-storage-class").required(vec![node_req(
        ZONE_LABEL,
        "In",
        &["test-zone-1"],
    )]);
    e.provision(&[p]).not_scheduled("p");
}

#[test]
fn relaxation_never_drops_the_volume_zone() {
    let e = env()
        .with_class(zonal_class())
        .with_volume(zonal_volume("pv", &["test-zone-3"]))
        .with_claim(claim("c", Some("my-storage-class"), Some("pv")));
    let p = with_claims(pod("p"), &["c"])
        .required(vec![node_req("example.com/label", "In", &["unsupported"])])
        .required_term(vec![node_req(
            "karpenter.sh/capacity-type",
            "In",
            &["on-demand"],
        )]);
    let out = e.provision(&[p]);
    assert_eq!(out.scheduled("p").label(ZONE_LABEL), Some("test-zone-3"));
}

// --- VolumeUsage (topology) ---

/// Two pods with anti-affinity on zone, each with its own claim restricted to zones 1 or 2.
fn anti_affine_pair(claims: [&str; 2]) -> Vec<Pod> {
    claims
        .iter()
        .enumerate()
        .map(|(i, c)| {
            with_claims(pod(&format!("pod-{i}")), &[c])
                .labels(&[("app", "multi-zone-app")])
                .pod_anti_affinity(ZONE_LABEL, &[("app", "multi-zone-app")])
        })
        .collect()
}

fn different_zones_among_1_and_2(out: &Outcome) {
    let z0 = out
        .scheduled("pod-0")
        .label(ZONE_LABEL)
        .unwrap()
        .to_string();
    let z1 = out
        .scheduled("pod-1")
        .label(ZONE_LABEL)
        .unwrap()
        .to_string();
    for z in [&z0, &z1] {
        assert!(["test-zone-1", "test-zone-2"].contains(&z.as_str()), "{z}");
    }
    assert_ne!(z0, z1);
}

#[test]
fn pods_using_a_volume_with_several_zones_spread_over_them() {
    let terms = || {
        vec![
            vec![node_req(ZONE_LABEL, "In", &["test-zone-1"])],
            vec![node_req(ZONE_LABEL, "In", &["test-zone-2"])],
        ]
    };
    let mut e = env();
    for i in 0..2 {
        e = e
            .with_volume(volume(&format!("pv-{i}"), terms()))
            .with_claim(claim(&format!("pvc-{i}"), None, Some(&format!("pv-{i}"))));
    }
    different_zones_among_1_and_2(&e.provision(&anti_affine_pair(["pvc-0", "pvc-1"])));
}

fn hostname_or_invalid_zone(kind: &str) {
    let pv = node_local(
        volume(
            "hostname-or-zone-pv",
            vec![
                vec![node_req(HOSTNAME, "In", &["existing-host"])],
                vec![node_req(ZONE_LABEL, "In", &["invalid-zone"])],
            ],
        ),
        kind,
    );
    let e = env()
        .with_volume(pv)
        .with_claim(claim("c", None, Some("hostname-or-zone-pv")));
    e.provision(&[with_claims(pod("p"), &["c"])]).scheduled("p");
}

#[test]
fn a_local_volume_keeps_its_unconstrained_alternative() {
    hostname_or_invalid_zone("local");
}

#[test]
fn a_hostpath_volume_keeps_its_unconstrained_alternative() {
    hostname_or_invalid_zone("hostPath");
}

#[test]
fn pods_using_a_storage_class_with_several_zones_spread_over_them() {
    let sc = class(
        "multi-zone-sc",
        "WaitForFirstConsumer",
        &[
            &[(ZONE_LABEL, &["test-zone-1"])],
            &[(ZONE_LABEL, &["test-zone-2"])],
        ],
    );
    let e = env()
        .with_class(sc)
        .with_claim(claim("pvc-0", Some("multi-zone-sc"), None))
        .with_claim(claim("pvc-1", Some("multi-zone-sc"), None));
    different_zones_among_1_and_2(&e.provision(&anti_affine_pair(["pvc-0", "pvc-1"])));
}

#[test]
fn a_compatible_multi_volume_alternative_survives_pruning() {
    let a = class(
        "a",
        "WaitForFirstConsumer",
        &[&[(SPECIAL, &["required"])], &[(SPECIAL, &["optional"])]],
    );
    let b = class(
        "b",
        "WaitForFirstConsumer",
        &[
            &[(ZONE_LABEL, &["test-zone-1"]), (SPECIAL, &["optional"])],
            &[(ZONE_LABEL, &["test-zone-2"]), (SPECIAL, &["required"])],
        ],
    );
    let e = Env::with_types(plain("default"), sized_types(5))
        .with_class(a)
        .with_class(b)
        .with_claim(claim("pvc-a", Some("a"), None))
        .with_claim(claim("pvc-b", Some("b"), None));
    let out = e.provision(&[with_claims(pod("p"), &["pvc-a", "pvc-b"])]);
    let node = out.scheduled("p");
    assert_eq!(node.label(ZONE_LABEL), Some("test-zone-1"));
    assert_eq!(node.label(SPECIAL), Some("optional"));
}

// --- VolumeUsage (claims that cannot be used) ---

fn other_class(mode: &str) -> StorageClass {
    class(
        "default-storage-class",
        mode,
        &[&[(ZONE_LABEL, &["test-zone-1"])]],
    )
}

#[test]
fn an_unbound_claim_of_an_immediate_class_is_not_provisionable() {
    let e = env().with_class(other_class("Immediate")).with_claim(claim(
        "tmp",
        Some("default-storage-class"),
        None,
    ));
    ignored(&e.provision(&[with_claims(pod("p"), &["tmp"])]), "p");
}

#[test]
fn a_deleting_claim_is_not_provisionable() {
    let mut pvc = claim("tmp", Some("default-storage-class"), None);
    pvc.metadata.deletion_timestamp =
        serde_json::from_value(json!("2024-01-01T00:00:00Z")).unwrap();
    let e = env()
        .with_class(other_class("WaitForFirstConsumer"))
        .with_claim(pvc);
    ignored(&e.provision(&[with_claims(pod("p"), &["tmp"])]), "p");
}

#[test]
fn a_claim_bound_to_a_deleting_volume_is_not_provisionable() {
    let mut pv = volume("pv", vec![]);
    pv.metadata.deletion_timestamp = serde_json::from_value(json!("2024-01-01T00:00:00Z")).unwrap();
    let e = env()
        .with_volume(pv)
        .with_claim(claim("p-data", None, Some("pv")));
    ignored(&e.provision(&[with_ephemeral(pod("p"), "")]), "p");
}

#[test]
fn a_lost_claim_is_not_provisionable() {
    let mut pvc = claim("tmp", Some("default-storage-class"), None);
    pvc.status = Some(serde_json::from_value(json!({"phase": "Lost"})).unwrap());
    let e = env()
        .with_class(other_class("WaitForFirstConsumer"))
        .with_claim(pvc);
    ignored(&e.provision(&[with_claims(pod("p"), &["tmp"])]), "p");
}

fn named_volume_env(bind_completed: bool) -> Env {
    let mut pvc = claim("tmp", Some("default-storage-class"), Some("pv"));
    if !bind_completed {
        pvc.metadata.annotations = None;
    }
    env()
        .with_class(other_class("WaitForFirstConsumer"))
        .with_volume(volume("pv", vec![]))
        .with_claim(pvc)
}

#[test]
fn a_claim_naming_a_volume_without_bind_completed_is_not_provisionable() {
    let e = named_volume_env(false);
    ignored(&e.provision(&[with_claims(pod("p"), &["tmp"])]), "p");
}

#[test]
fn a_claim_naming_a_volume_with_bind_completed_schedules() {
    let e = named_volume_env(true);
    e.provision(&[with_claims(pod("p"), &["tmp"])])
        .scheduled("p");
}

fn bound_ephemeral_without_class(class: &str) {
    let e = env()
        .with_volume(volume("test-pv", vec![]))
        .with_claim(claim("p-data", Some(class), Some("test-pv")));
    let out = e.provision(&[with_ephemeral(pod("p"), class)]);
    out.scheduled("p");
    assert_eq!(out.nodes.len(), 1);
}

#[test]
fn a_bound_ephemeral_claim_of_a_missing_class_schedules() {
    bound_ephemeral_without_class("non-existent");
}

#[test]
fn a_bound_ephemeral_claim_without_a_class_schedules() {
    bound_ephemeral_without_class("");
}

/// No claim exists yet for the ephemeral volume: nothing to attach, nothing launched.
fn unbound_ephemeral_without_class(class: &str) {
    let out = env().provision(&[with_ephemeral(pod("p"), class)]);
    ignored(&out, "p");
    assert!(out.nodes.is_empty());
}

#[test]
fn an_unbound_ephemeral_volume_of_a_missing_class_is_not_provisionable() {
    unbound_ephemeral_without_class("non-existent");
}

#[test]
fn an_unbound_ephemeral_volume_without_a_class_is_not_provisionable() {
    unbound_ephemeral_without_class("");
}

// --- Topology suite ---

fn spread_min_3(p: Pod) -> Pod {
    p.labels(&[("test", "test")]).spread_with(
        k8s_openapi::api::core::v1::TopologySpreadConstraint {
            topology_key: ZONE_LABEL.into(),
            max_skew: 1,
            when_unsatisfiable: "DoNotSchedule".into(),
            label_selector: selector(&[("test", "test")]),
            min_domains: Some(3),
            ..Default::default()
        },
    )
}

#[test]
fn a_zonal_volume_pod_joins_a_spread_already_over_every_zone() {
    let mut e = Env::new(nodepool("default"))
        .with_volume(zonal_volume("test-pv", &["test-zone-1"]))
        .with_claim(claim("test-pvc", None, Some("test-pv")));
    e.provision_and_bind(&pods("p", 3, spread_min_3));
    assert_eq!(e.skew(ZONE_LABEL), vec![1, 1, 1]);
    let out = e.provision_and_bind(&[spread_min_3(with_claims(pod("v"), &["test-pvc"]))]);
    // An existing node in the volume's zone has room: upstream binds it there.
    let node = out.existing_of("v").expect("v goes to an existing node");
    let node = e.nodes.iter().find(|n| n.name == node).unwrap();
    assert_eq!(node.labels[ZONE_LABEL], "test-zone-1");
    assert_eq!(e.skew(ZONE_LABEL), vec![1, 1, 2]);
}

// --- VolumeUsage (CSI attach limits) ---

const CSI: &str = "fake.csi.provider";

/// One existing node (from a first provisioning round) whose CSINode allows 10 volumes of
/// [`CSI`], with room for 100 pods.
fn node_with_csi_limit() -> (Env, String) {
    let mut e = env();
    e.provision_and_bind(&[pod("initial")]);
    let node = e.nodes[0].name.clone();
    // Room for many pods, so only the volume limit decides.
    e.nodes[0]
        .allocatable
        .set("pods".to_string(), "100".parse().unwrap());
    e.csi_limits
        .insert(node.clone(), [(CSI.to_string(), 10)].into_iter().collect());
    (e, node)
}

#[test]
fn volume_limits_send_pods_past_them_to_a_new_node() {
    let (e, node) = node_with_csi_limit();
    let zone = e.nodes[0].labels[ZONE_LABEL].clone();
    let mut sc = class(
        "my-storage-class",
        "WaitForFirstConsumer",
        &[&[(ZONE_LABEL, &[zone.as_str()])]],
    );
    sc.provisioner = CSI.into();
    let mut e = e.with_class(sc);
    let mut ps = Vec::new();
    for i in 0..6 {
        let (a, b) = (format!("my-claim-a-{i}"), format!("my-claim-b-{i}"));
        e = e
            .with_claim(claim(&a, Some("my-storage-class"), None))
            .with_claim(claim(&b, Some("my-storage-class"), None));
        ps.push(with_claims(pod(&format!("p-{i}")), &[&a, &b]));
    }
    let out = e.provision(&ps);
    let on_node = ps
        .iter()
        .filter(|p| out.existing_of(p.metadata.name.as_deref().unwrap()) == Some(node.as_str()))
        .count();
    // Two volumes each: five pods reach the limit of 10; the sixth needs a new node.
    assert_eq!(on_node, 5, "{:?}", out.results);
    assert_eq!(out.nodes.len(), 1);
}

#[test]
fn pods_sharing_one_claim_count_it_once() {
    let (e, node) = node_with_csi_limit();
    let zone = e.nodes[0].labels[ZONE_LABEL].clone();
    let mut pv = zonal_volume("my-volume", &[zone.as_str()]);
    pv.spec.as_mut().unwrap().csi.as_mut().unwrap().driver = CSI.into();
    let e = e.with_volume(pv).with_claim(claim(
        "my-claim",
        Some("my-storage-class"),
        Some("my-volume"),
    ));
    let ps = pods("p", 3, |p| with_claims(p, &["my-claim"]));
    let out = e.provision(&ps);
    for p in &ps {
        let name = p.metadata.name.as_deref().unwrap();
        assert_eq!(
            out.existing_of(name),
            Some(node.as_str()),
            "{:?}",
            out.results
        );
    }
    assert!(out.nodes.is_empty());
}

#[test]
fn nfs_volumes_are_not_limited() {
    let (e, node) = node_with_csi_limit();
    let mut pv = volume("my-volume", vec![]);
    let spec = pv.spec.as_mut().unwrap();
    spec.csi = None;
    spec.nfs = Some(
        serde_json::from_value(json!({"server": "fake.server", "path": "/some/path"})).unwrap(),
    );
    let e = e
        .with_volume(pv)
        .with_claim(claim("my-claim", Some(""), Some("my-volume")));
    let ps = pods("p", 3, |p| with_claims(p, &["my-claim", "my-claim"]));
    let out = e.provision(&ps);
    for p in &ps {
        let name = p.metadata.name.as_deref().unwrap();
        assert_eq!(
            out.existing_of(name),
            Some(node.as_str()),
            "{:?}",
            out.results
        );
    }
    assert!(out.nodes.is_empty());
}

// --- VolumeUsage: the driver of a claim through its (default) StorageClass, and CSI migration ---

/// A WaitForFirstConsumer class in `test-zone-1` provisioned by `provisioner`, marked the
/// cluster default or not, created at `created`.
fn limited_class(name: &str, provisioner: &str, default: bool, created: &str) -> StorageClass {
    let mut sc = class(
        name,
        "WaitForFirstConsumer",
        &[&[(ZONE_LABEL, &["test-zone-1"])]],
    );
    sc.provisioner = provisioner.into();
    sc.metadata.creation_timestamp = Some(serde_json::from_value(json!(created)).unwrap());
    if default {
        sc.metadata.annotations = Some(
            [(ANN_DEFAULT_CLASS.to_string(), "true".to_string())]
                .into_iter()
                .collect(),
        );
    }
    sc
}

/// An ephemeral volume whose claim template names no StorageClass (the default's).
fn with_default_ephemeral(p: Pod) -> Pod {
    let mut p = with_ephemeral(p, "");
    let volumes = p.spec.as_mut().unwrap().volumes.as_mut().unwrap();
    let template = volumes[0].ephemeral.as_mut().unwrap();
    template
        .volume_claim_template
        .as_mut()
        .unwrap()
        .spec
        .storage_class_name = None;
    p
}

/// Upstream's shape: `first` goes onto a node, whose CSINode then allows `limits`; `second`'s
/// volume would exceed them there, so it gets a new node.
fn second_pod_needs_a_new_node(mut e: Env, first: Pod, second: Pod, limits: &[(&str, usize)]) {
    let first_name = first.metadata.name.clone().unwrap();
    e.provision_and_bind(&[first]).scheduled(&first_name);
    let node = e.nodes[0].name.clone();
    e.nodes[0]
        .allocatable
        .set("pods".to_string(), "100".parse().unwrap());
    let limits = limits.iter().map(|(d, n)| (d.to_string(), *n)).collect();
    e.csi_limits.insert(node.clone(), limits);
    let second_name = second.metadata.name.clone().unwrap();
    let out = e.provision(&[second]);
    assert_ne!(
        out.existing_of(&second_name),
        Some(node.as_str()),
        "{:?}",
        out.results
    );
    out.scheduled(&second_name);
    assert_eq!(out.nodes.len(), 1);
}

const OLDER: &str = "2024-01-01T00:00:00Z";
const NEWER: &str = "2024-01-01T00:00:02Z";

#[test]
fn an_ephemeral_claim_counts_against_the_driver_of_its_named_class() {
    let e = env()
        .with_class(limited_class("my-storage-class", CSI, false, OLDER))
        .with_class(limited_class(
            "default-storage-class",
            "other-provider",
            true,
            OLDER,
        ))
        .with_claim(claim("initial-data", Some("my-storage-class"), None))
        .with_claim(claim("p-data", Some("my-storage-class"), None));
    second_pod_needs_a_new_node(
        e,
        with_ephemeral(pod("initial"), "my-storage-class"),
        with_ephemeral(pod("p"), "my-storage-class"),
        &[(CSI, 1), ("other-provider", 10)],
    );
}

#[test]
fn an_ephemeral_claim_without_a_class_counts_against_the_default_class_driver() {
    let e = env()
        .with_class(limited_class("default-storage-class", CSI, true, OLDER))
        .with_claim(claim("initial-data", None, None))
        .with_claim(claim("p-data", None, None));
    second_pod_needs_a_new_node(
        e,
        with_default_ephemeral(pod("initial")),
        with_default_ephemeral(pod("p")),
        &[(CSI, 1)],
    );
}

#[test]
fn an_ephemeral_claim_without_a_class_counts_against_the_newest_default_class_driver() {
    let e = env()
        .with_class(limited_class(
            "default-storage-class",
            "other-provider",
            true,
            OLDER,
        ))
        .with_class(limited_class(
            "newer-default-storage-class",
            CSI,
            true,
            NEWER,
        ))
        .with_claim(claim("initial-data", None, None))
        .with_claim(claim("p-data", None, None));
    second_pod_needs_a_new_node(
        e,
        with_default_ephemeral(pod("initial")),
        with_default_ephemeral(pod("p")),
        &[(CSI, 1), ("other-provider", 10)],
    );
}

const IN_TREE_EBS: &str = "kubernetes.io/aws-ebs";
const EBS_CSI: &str = "ebs.csi.aws.com";

/// The default class, of the in-tree EBS provisioner, whose claims count against the migrated
/// CSI driver's limit.
fn in_tree_class() -> StorageClass {
    limited_class("in-tree-storage-class", IN_TREE_EBS, true, OLDER)
}

#[test]
fn a_claim_of_an_in_tree_class_counts_against_its_migrated_csi_driver() {
    let mut pv = zonal_volume("my-volume", &["test-zone-1"]);
    let spec = pv.spec.as_mut().unwrap();
    spec.csi = None;
    spec.aws_elastic_block_store =
        Some(serde_json::from_value(json!({"volumeID": "vol-0123"})).unwrap());
    let e = env()
        .with_class(in_tree_class())
        .with_volume(pv)
        .with_claim(claim("pvc-1", Some("in-tree-storage-class"), None))
        .with_claim(claim("pvc-2", Some("in-tree-storage-class"), None));
    second_pod_needs_a_new_node(
        e,
        with_claims(pod("initial"), &["pvc-1"]),
        with_claims(pod("p"), &["pvc-2"]),
        &[(EBS_CSI, 1)],
    );
}

#[test]
fn an_ephemeral_claim_of_an_in_tree_class_counts_against_its_migrated_csi_driver() {
    let e = env()
        .with_class(in_tree_class())
        .with_claim(claim("initial-data", None, None))
        .with_claim(claim("p-data", None, None));
    second_pod_needs_a_new_node(
        e,
        with_ephemeral(pod("initial"), "in-tree-storage-class"),
        with_ephemeral(pod("p"), "in-tree-storage-class"),
        &[(EBS_CSI, 1)],
    );
}

#[test]
fn a_bound_in_tree_volume_counts_against_its_migrated_csi_driver() {
    let ebs = |name: &str| {
        let mut pv = zonal_volume(name, &["test-zone-1"]);
        let spec = pv.spec.as_mut().unwrap();
        spec.csi = None;
        spec.aws_elastic_block_store =
            Some(serde_json::from_value(json!({"volumeID": name})).unwrap());
        pv
    };
    let e = env()
        .with_volume(ebs("pv-1"))
        .with_volume(ebs("pv-2"))
        .with_claim(claim("pvc-1", Some(""), Some("pv-1")))
        .with_claim(claim("pvc-2", Some(""), Some("pv-2")));
    second_pod_needs_a_new_node(
        e,
        with_claims(pod("initial"), &["pvc-1"]),
        with_claims(pod("p"), &["pvc-2"]),
        &[(EBS_CSI, 1)],
    );
}
