use crate::capi::model::TemplateTaint;
use serde_json::json;

use super::*;

fn pool(version: CapiVersion) -> Value {
    let infra_ref = match version {
        CapiVersion::V1Beta1 => json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
            "kind": "DevMachinePool", "name": "mp-infra",
        }),
        CapiVersion::V1Beta2 => json!({
            "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachinePool", "name": "mp-infra",
        }),
    };
    json!({
        "apiVersion": version.api_version(),
        "kind": "MachinePool",
        "metadata": {
            "name": "mp", "namespace": "ns", "uid": "u1", "resourceVersion": "7", "generation": 2,
            "labels": {"node.cluster.x-k8s.io/karpenter-member": ""},
            "annotations": {"capacity.cluster-autoscaler.kubernetes.io/cpu": "4"},
        },
        "spec": {
            "clusterName": "c1",
            "replicas": 3,
            "providerIDList": ["aws:///us-east-1a/i-1", "aws:///us-east-1a/i-2"],
            "template": {
                "metadata": {"labels": {"role": "worker"}},
                "spec": {"clusterName": "c1", "infrastructureRef": infra_ref, "version": "v1.33.0"},
            },
        },
        "status": {"replicas": 2, "readyReplicas": 1, "observedGeneration": 2},
    })
}

#[test]
fn reads_a_machine_pool_in_both_versions() {
    for v in CapiVersion::ALL {
        let mp = MachineDeployment::from_pool_value(&pool(v), v).unwrap();
        assert!(mp.is_pool());
        assert_eq!(mp.key(), "MachinePool/ns/mp");
        assert_eq!(mp.spec_replicas, Some(3));
        assert_eq!((mp.status_replicas, mp.ready_replicas), (Some(2), Some(1)));
        assert_eq!(mp.provider_id_list.len(), 2);
        assert_eq!(mp.infrastructure_ref.kind, "DevMachinePool");
        assert_eq!(
            mp.infrastructure_ref.api_group,
            "infrastructure.cluster.x-k8s.io"
        );
        assert_eq!(mp.template_labels["role"], "worker");
        assert_eq!(mp.selector.match_labels[POOL_NAME_LABEL], "mp");
        assert_eq!(mp.selector.match_labels[CLUSTER_NAME_LABEL], "c1");
        assert!(
            mp.labels
                .contains_key("node.cluster.x-k8s.io/karpenter-member")
        );
    }
}

#[test]
fn a_malformed_provider_id_list_names_the_field() {
    let mut v = pool(CapiVersion::V1Beta2);
    v["spec"]["providerIDList"] = json!(["ok", 5]);
    let err = MachineDeployment::from_pool_value(&v, CapiVersion::V1Beta2).unwrap_err();
    assert!(err.to_string().contains("spec.providerIDList[1]"), "{err}");
}

#[test]
fn keys_round_trip_and_stay_compatible() {
    let md = ScalableRef::new(ScalableKind::MachineDeployment, "ns", "md");
    assert_eq!(md.key(), "ns/md");
    let mp = ScalableRef::new(ScalableKind::MachinePool, "ns", "mp");
    assert_eq!(mp.key(), "MachinePool/ns/mp");
    for r in [&md, &mp] {
        assert_eq!(ScalableRef::parse(&r.key()).as_ref(), Some(r));
    }
    assert_eq!(mp.to_string(), "MachinePool ns/mp");
    for bad in ["", "md", "ns/", "/md", "Other/ns/md", "a/b/c/d"] {
        assert_eq!(ScalableRef::parse(bad), None, "{bad}");
    }
    assert_eq!(
        ScalableKind::MachinePool
            .resource(CapiVersion::V1Beta1)
            .plural,
        "machinepools"
    );
}

#[test]
fn a_machine_pool_machine_names_its_pool() {
    let m = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {
            "name": "mp-x", "namespace": "ns", "uid": "u2", "resourceVersion": "3",
            "labels": {POOL_NAME_LABEL: "mp", CLUSTER_NAME_LABEL: "c1"},
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
                "name": "mp", "uid": "u1", "controller": true}],
        },
        "spec": {"clusterName": "c1", "infrastructureRef": {
            "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachine", "name": "mp-x"}},
    });
    let machine = Machine::from_value(&m, CapiVersion::V1Beta2).unwrap();
    assert_eq!(machine.pool_name.as_deref(), Some("mp"));
    assert_eq!(machine.deployment_name, None);
    assert_eq!(
        machine.scalable(),
        Some(ScalableRef::new(ScalableKind::MachinePool, "ns", "mp"))
    );
}

#[test]
fn a_pool_template_hash_changes_with_a_rollout_field_only() {
    let v = CapiVersion::V1Beta2;
    let base = pool(v);
    let hash = |p: &Value| {
        MachineDeployment::from_pool_value(p, v)
            .unwrap()
            .template_hash
    };
    assert!(hash(&base).is_some());
    let mut replicas = base.clone();
    replicas["spec"]["replicas"] = json!(9);
    replicas["spec"]["template"]["spec"]["deletion"] = json!({"nodeDrainTimeoutSeconds": 5});
    assert_eq!(hash(&replicas), hash(&base), "not a rollout field");
    for (field, value) in [
        ("version", json!("v1.34.0")),
        (
            "bootstrap",
            json!({"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "new"}}),
        ),
        (
            "infrastructureRef",
            json!({"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachinePool", "name": "other"}),
        ),
    ] {
        let mut changed = base.clone();
        changed["spec"]["template"]["spec"][field] = value;
        assert_ne!(hash(&changed), hash(&base), "{field}");
    }
    // The same fields written in another order hash the same.
    let mut reordered = base.clone();
    let spec = reordered["spec"]["template"]["spec"].take();
    let mut fields: Vec<(String, Value)> = spec.as_object().unwrap().clone().into_iter().collect();
    fields.reverse();
    reordered["spec"]["template"]["spec"] = Value::Object(fields.into_iter().collect());
    assert_eq!(hash(&reordered), hash(&base));
}

#[test]
fn an_infrastructure_pool_hash_changes_with_an_instance_field_only() {
    let base = json!({
        "kind": "AWSMachinePool",
        "spec": {
            "minSize": 1, "maxSize": 10,
            "providerIDList": ["aws:///us-east-1a/i-1"],
            "awsLaunchTemplate": {"instanceType": "m5.large", "ami": {"id": "ami-1"}},
        },
    });
    let hash = infrastructure_pool_hash(&base);
    assert!(hash.is_some());
    let mut scaled = base.clone();
    scaled["spec"]["maxSize"] = json!(20);
    scaled["spec"]["providerIDList"] = json!(["aws:///us-east-1a/i-1", "aws:///us-east-1a/i-2"]);
    scaled["status"] = json!({"replicas": 2});
    assert_eq!(infrastructure_pool_hash(&scaled), hash, "no instance field");
    let mut edited = base.clone();
    edited["spec"]["awsLaunchTemplate"]["instanceType"] = json!("m5.xlarge");
    assert_ne!(infrastructure_pool_hash(&edited), hash, "launch template");
    let mut mixed = base.clone();
    mixed["spec"]["mixedInstancesPolicy"] = json!({"overrides": [{"instanceType": "m5a.large"}]});
    assert_ne!(
        infrastructure_pool_hash(&mixed),
        hash,
        "mixed instances policy"
    );

    let dev = json!({"spec": {"template": {"backend": {"inMemory": {}}}}});
    let mut dev_edited = dev.clone();
    dev_edited["spec"]["template"]["backend"]["inMemory"] = json!({"vm": {}});
    assert_ne!(
        infrastructure_pool_hash(&dev),
        infrastructure_pool_hash(&dev_edited)
    );
    // Nothing that says what the instances are made of: nothing to compare.
    assert_eq!(
        infrastructure_pool_hash(&json!({"spec": {"minSize": 1}})),
        None
    );
    assert_eq!(infrastructure_pool_hash(&json!({})), None);
}

/// A MachineDeployment like the pool above, for the template taints.
fn deployment(version: CapiVersion) -> Value {
    let mut md = pool(version);
    md["kind"] = json!("MachineDeployment");
    md["spec"]["selector"] = json!({"matchLabels": {"cluster.x-k8s.io/deployment-name": "mp"}});
    md
}

// CA clusterapi_unstructured.go:232-252 (kubernetes/autoscaler@35e8a280425c, tag
// cluster-autoscaler-1.36.1) reads `spec.template.spec.taints` of either kind, in both API
// versions (Cluster API >= 1.12's taint propagation); the taint is TestNodeGroupTemplateNodeInfo's
// (clusterapi_nodegroup_test.go:1708-1709).
#[test]
fn template_taints_are_read_from_either_kind_in_both_versions() {
    let taints = json!([
        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule", "propagation": "Always"},
        {"key": "boot", "effect": "NoExecute", "propagation": "OnInitialization"},
    ]);
    let expected = vec![
        TemplateTaint {
            key: "dedicated".into(),
            value: Some("gpu".into()),
            effect: "NoSchedule".into(),
            propagation: Some("Always".into()),
        },
        TemplateTaint {
            key: "boot".into(),
            value: None,
            effect: "NoExecute".into(),
            propagation: Some("OnInitialization".into()),
        },
    ];
    for v in CapiVersion::ALL {
        let mut mp = pool(v);
        mp["spec"]["template"]["spec"]["taints"] = taints.clone();
        let mp = MachineDeployment::from_pool_value(&mp, v).unwrap();
        assert_eq!(mp.template_taints, expected, "{v:?} MachinePool");
        let mut md = deployment(v);
        md["spec"]["template"]["spec"]["taints"] = taints.clone();
        let md = MachineDeployment::from_value(&md, v).unwrap();
        assert_eq!(md.template_taints, expected, "{v:?} MachineDeployment");
        // None written: none read.
        let plain = MachineDeployment::from_value(&deployment(v), v).unwrap();
        assert!(plain.template_taints.is_empty());
    }
}

// As CA reads them (clusterapi_unstructured.go:234-239): a taint list it cannot read is no
// taints, an item that is not an object is passed over, and neither fails the object.
#[test]
fn unreadable_template_taints_never_fail_the_object() {
    let v = CapiVersion::V1Beta2;
    let mut md = deployment(v);
    md["spec"]["template"]["spec"]["taints"] = json!("dedicated=gpu:NoSchedule");
    assert!(
        MachineDeployment::from_value(&md, v)
            .unwrap()
            .template_taints
            .is_empty()
    );
    md["spec"]["template"]["spec"]["taints"] =
        json!(["junk", {"key": "k", "value": 5, "effect": "NoSchedule"}]);
    let read = MachineDeployment::from_value(&md, v)
        .unwrap()
        .template_taints;
    assert_eq!(read.len(), 1);
    assert_eq!(
        (read[0].key.as_str(), read[0].value.as_deref()),
        ("k", None)
    );
}
