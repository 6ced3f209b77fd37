use super::*;
use k8s_openapi::api::core::v1::{ContainerPort, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
    let list = |pairs: &[(&str, &str)]| {
        (!pairs.is_empty()).then(|| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), K8sQuantity(v.to_string())))
                .collect()
        })
    };
    Container {
        name: "c".into(),
        resources: Some(ResourceRequirements {
            requests: list(requests),
            limits: list(limits),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn cpu_of(spec: PodSpec) -> String {
    pod_requests(&spec).unwrap().get("cpu").to_string()
}

#[test]
fn effective_requests() {
    // (containers, init containers (sidecar?), overhead, expected cpu)
    let sidecar = |cpu: &str| {
        let mut c = container(&[("cpu", cpu)], &[]);
        c.restart_policy = Some("Always".into());
        c
    };
    let cases: Vec<(PodSpec, &str)> = vec![
        (
            PodSpec {
                containers: vec![
                    container(&[("cpu", "1")], &[]),
                    container(&[("cpu", "500m")], &[]),
                ],
                ..Default::default()
            },
            "1500m",
        ),
        // A limit without a request counts as the request.
        (
            PodSpec {
                containers: vec![container(&[], &[("cpu", "2")])],
                ..Default::default()
            },
            "2",
        ),
        // A big init container dominates.
        (
            PodSpec {
                containers: vec![container(&[("cpu", "1")], &[])],
                init_containers: Some(vec![container(&[("cpu", "3")], &[])]),
                ..Default::default()
            },
            "3",
        ),
        // Sidecars run alongside the containers.
        (
            PodSpec {
                containers: vec![container(&[("cpu", "1")], &[])],
                init_containers: Some(vec![sidecar("250m")]),
                ..Default::default()
            },
            "1250m",
        ),
        (
            PodSpec {
                containers: vec![container(&[("cpu", "1")], &[])],
                overhead: Some([("cpu".to_string(), K8sQuantity("100m".into()))].into()),
                ..Default::default()
            },
            "1100m",
        ),
        // Pod-level requests replace the containers' (init containers included), with
        // overhead on top.
        (
            PodSpec {
                containers: vec![container(&[("cpu", "1")], &[])],
                init_containers: Some(vec![container(&[("cpu", "5")], &[])]),
                resources: Some(ResourceRequirements {
                    requests: Some([("cpu".to_string(), K8sQuantity("3".into()))].into()),
                    ..Default::default()
                }),
                overhead: Some([("cpu".to_string(), K8sQuantity("100m".into()))].into()),
                ..Default::default()
            },
            "3100m",
        ),
    ];
    for (spec, want) in cases {
        assert_eq!(cpu_of(spec.clone()), want, "{spec:?}");
    }
    let bad = PodSpec {
        containers: vec![container(&[("cpu", "lots")], &[])],
        ..Default::default()
    };
    let err = pod_requests(&bad).unwrap_err();
    assert!(
        err.contains("spec.containers[0].resources.requests"),
        "{err}"
    );
    // Pod-level requests set only what they name; a resource pods cannot set at pod
    // level (ephemeral-storage) is still the containers'.
    let mixed = PodSpec {
        containers: vec![container(
            &[
                ("cpu", "1"),
                ("memory", "1Gi"),
                ("ephemeral-storage", "1Gi"),
            ],
            &[],
        )],
        resources: Some(ResourceRequirements {
            requests: Some(
                [
                    ("memory".to_string(), K8sQuantity("4Gi".into())),
                    ("ephemeral-storage".to_string(), K8sQuantity("9Gi".into())),
                ]
                .into(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    let r = pod_requests(&mixed).unwrap();
    assert_eq!(r.get("cpu").to_string(), "1");
    assert_eq!(r.get("memory").to_string(), "4Gi");
    assert_eq!(r.get("ephemeral-storage").to_string(), "1Gi");
    let bad = PodSpec {
        resources: Some(ResourceRequirements {
            requests: Some([("cpu".to_string(), K8sQuantity("lots".into()))].into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let err = pod_requests(&bad).unwrap_err();
    assert!(err.contains("spec.resources.requests"), "{err}");
}

#[test]
fn reads_ports_terms_and_pods_resource() {
    let mut c = container(&[("cpu", "1")], &[]);
    c.ports = Some(vec![ContainerPort {
        container_port: 80,
        host_port: Some(8080),
        ..Default::default()
    }]);
    let pod = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![c],
            node_selector: Some([("a".to_string(), "b".to_string())].into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let info = PodInfo::read(&pod).unwrap();
    assert_eq!(info.key, "ns/p");
    assert_eq!(info.requests.get("pods"), Quantity::from_units(1));
    assert_eq!(info.host_ports, vec![(8080, "TCP".to_string())]);
    assert_eq!(info.node_terms.len(), 1);
    assert!(info.node_terms[0].has("a"));
}

#[test]
fn deprecated_label_keys_are_read_as_well_known_ones() {
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    };
    let zone_term = NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: "failure-domain.beta.kubernetes.io/zone".into(),
            operator: "In".into(),
            values: Some(vec!["zone-a".into()]),
        }]),
        ..Default::default()
    };
    let pod = Pod {
        spec: Some(PodSpec {
            node_selector: Some(
                [(
                    "beta.kubernetes.io/instance-type".to_string(),
                    "small".to_string(),
                )]
                .into(),
            ),
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![zone_term],
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let info = PodInfo::read(&pod).unwrap();
    let term = &info.node_terms[0];
    let keys: Vec<&str> = term.iter().map(|r| r.key()).collect();
    assert_eq!(
        keys,
        [
            "node.kubernetes.io/instance-type",
            "topology.kubernetes.io/zone"
        ]
    );
}
