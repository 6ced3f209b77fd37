//! What the indexes drop from a watched object before keeping it: `metadata.managedFields` (on a
//! real cluster often the largest part of an object, and nothing here reads it) and the parts of
//! Pods and Nodes the controller never reads. Everything the solver, disruption, drain,
//! termination and `explain` read stays (the tests below name those fields); annotations stay
//! whole, because the guarded JSON patches of registration decide `add` versus `replace` by
//! whether the map is empty.

use k8s_openapi::api::core::v1::{Container, Node, Pod, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Drop `managedFields`: server-side apply bookkeeping, never read here.
pub(crate) fn meta(m: &mut ObjectMeta) {
    m.managed_fields = None;
}

/// A Pod as the controller reads it. Kept: metadata (labels, annotations such as
/// `karpenter.sh/do-not-disrupt` and the pod deletion cost, owner references, uid, timestamps),
/// the scheduling constraints (node name and selector, affinity, tolerations, topology spread,
/// priority, overhead, claim-backed volumes, scheduler name), each container's name, resources, restart
/// policy and ports (requests, sidecars, host ports), the grace period and priority class
/// (drain), and from the status the phase, start time (a do-not-disrupt duration runs from it),
/// nominated node, the `PodScheduled` condition and the `Ready` one (a PodDisruptionBudget with
/// `unhealthyPodEvictionPolicy: AlwaysAllow` lets a pod that is not Ready go). Dropped: images,
/// commands, environment, probes, mounts, security contexts, container statuses, addresses and
/// the other conditions. The pod watch skips the same while it parses (`pods::watched::slim`
/// mirrors the rules below; its tests check a watched pod trimmed is the whole pod trimmed).
pub(crate) fn pod(p: &mut Pod) {
    meta(&mut p.metadata);
    if let Some(spec) = p.spec.as_mut() {
        spec.containers.iter_mut().for_each(container);
        spec.init_containers
            .iter_mut()
            .flatten()
            .for_each(container);
        volumes(&mut spec.volumes);
        // Ephemeral containers take no resources and are never scheduled.
        spec.ephemeral_containers = None;
        spec.readiness_gates = None;
        spec.dns_config = None;
        spec.host_aliases = None;
        spec.image_pull_secrets = None;
        spec.security_context = None;
    }
    if let Some(status) = p.status.as_mut() {
        status.container_statuses = None;
        status.init_container_statuses = None;
        status.ephemeral_container_statuses = None;
        status.resource_claim_statuses = None;
        status.host_ip = None;
        status.host_ips = None;
        status.pod_ip = None;
        status.pod_ips = None;
        status.message = None;
        status.qos_class = None;
        if let Some(cs) = status.conditions.as_mut() {
            cs.retain(|c| c.type_ == "PodScheduled" || c.type_ == "Ready");
            for c in cs.iter_mut() {
                c.last_probe_time = None;
            }
        }
    }
}

/// Only the volumes backed by a PersistentVolumeClaim (named, or an ephemeral volume's) tie a
/// pod to storage: its topology, the attach limits and the terminator's wait for detaches read
/// those alone. The rest go: every pod a real API server admits carries a projected
/// service-account token volume under a name of its own (`kube-api-access-<random>`), which
/// no two pods share, so the pod index kept it in every pod's compact form.
fn volumes(volumes: &mut Option<Vec<Volume>>) {
    if let Some(vs) = volumes.as_mut() {
        vs.retain(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some());
        if vs.is_empty() {
            *volumes = None;
        }
    }
}

/// A container as the solver reads it: name, resources (requests and limits), restart policy
/// (a restartable init container is a sidecar) and ports (host ports).
fn container(c: &mut Container) {
    *c = Container {
        name: std::mem::take(&mut c.name),
        resources: c.resources.take(),
        restart_policy: c.restart_policy.take(),
        ports: c.ports.take(),
        ..Container::default()
    };
}

/// A Node as the controller reads it. Kept: metadata, the spec (provider ID, taints,
/// unschedulable) and from the status allocatable, the phase, and the `Ready` condition and the
/// ones `kept` names (the conditions the repair policies watch), each with its status, reason
/// and transition time. Dropped: the image list (on real nodes tens of kilobytes), capacity
/// (what the solver and the limits count is allocatable on a Node and capacity on its claim),
/// the other conditions (the pressure conditions a real kubelet posts), the conditions'
/// heartbeats and messages, node info, addresses, daemon endpoints, volumes in use or attached
/// (VolumeAttachments are watched instead), config and features.
pub(crate) fn node_keeping(n: &mut Node, kept: &[String]) {
    if let Some(cs) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        cs.retain(|c| c.type_ == "Ready" || kept.contains(&c.type_));
    }
    node_body(n);
}

/// [`node_keeping`] with no condition but `Ready`.
#[cfg(test)]
pub(crate) fn node(n: &mut Node) {
    node_keeping(n, &[]);
}

/// Everything [`node_keeping`] drops but the conditions it leaves out: the Node index's own
/// trim, after the watch's (which knows the policies) chose the conditions. The Node watch skips
/// the same while it parses (`nodes::watched` mirrors the rules below; its tests check a watched
/// Node is the whole Node trimmed); our write responses come whole and are cut here.
pub(crate) fn node_body(n: &mut Node) {
    meta(&mut n.metadata);
    if let Some(status) = n.status.as_mut() {
        status.capacity = None;
        for c in status.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
            c.message = None;
        }
        status.images = None;
        status.node_info = None;
        status.addresses = None;
        status.daemon_endpoints = None;
        status.volumes_in_use = None;
        status.volumes_attached = None;
        status.config = None;
        status.features = None;
        status.runtime_handlers = None;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn pod_keeps_what_the_controller_reads() {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"app": "a"},
                "annotations": {"karpenter.sh/do-not-disrupt": "true",
                                "controller.kubernetes.io/pod-deletion-cost": "5",
                                "kubernetes.io/config.mirror": "x"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r",
                                     "uid": "o", "controller": true}],
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "managedFields": [{"manager": "kubectl", "operation": "Apply",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": {
                "nodeName": "n1",
                "nodeSelector": {"zone": "a"},
                "priority": 10, "priorityClassName": "high",
                "terminationGracePeriodSeconds": 30,
                "overhead": {"cpu": "10m"},
                "schedulerName": "default-scheduler",
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname",
                     "labelSelector": {"matchLabels": {"app": "a"}}}]}},
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                    "whenUnsatisfiable": "DoNotSchedule"}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "c"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}}}}}},
                    {"name": "kube-api-access-x7k2p", "projected": {"sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt",
                                       "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}},
                    {"name": "config", "configMap": {"name": "app"}},
                    {"name": "tmp", "emptyDir": {}}],
                "initContainers": [{"name": "side", "image": "i", "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "50m"}}, "env": [{"name": "E", "value": "v"}]}],
                "containers": [{
                    "name": "app", "image": "registry.k8s.io/pause:3.10",
                    "command": ["/pause"], "env": [{"name": "E", "value": "v"}],
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                  "limits": {"memory": "512Mi"}},
                    "ports": [{"containerPort": 80, "hostPort": 8080}],
                    "readinessProbe": {"httpGet": {"port": 80}},
                    "volumeMounts": [{"name": "data", "mountPath": "/d"}]
                }]
            },
            "status": {
                "phase": "Running",
                "startTime": "2026-01-01T00:00:00Z",
                "nominatedNodeName": "n2",
                "podIP": "10.0.0.1",
                "conditions": [
                    {"type": "PodScheduled", "status": "True",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "Ready", "status": "True"},
                    {"type": "ContainersReady", "status": "True"}],
                "containerStatuses": [{"name": "app", "image": "i", "imageID": "x", "ready": true,
                                       "restartCount": 0}]
            }
        }))
        .unwrap();
        pod(&mut p);
        let v = serde_json::to_value(&p).unwrap();
        assert!(v["metadata"].get("managedFields").is_none());
        assert_eq!(v["metadata"]["uid"], "u1");
        assert_eq!(v["metadata"]["resourceVersion"], "7");
        assert_eq!(v["metadata"]["labels"]["app"], "a");
        assert_eq!(v["metadata"]["annotations"].as_object().unwrap().len(), 3);
        assert_eq!(v["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet");
        assert!(p.metadata.deletion_timestamp.is_some());
        let spec = &v["spec"];
        for kept in [
            "nodeName",
            "nodeSelector",
            "priority",
            "priorityClassName",
            "terminationGracePeriodSeconds",
            "overhead",
            "schedulerName",
            "tolerations",
            "affinity",
            "topologySpreadConstraints",
            "volumes",
        ] {
            assert!(spec.get(kept).is_some(), "spec.{kept} dropped");
        }
        let volumes: Vec<&str> = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            volumes,
            ["data", "scratch"],
            "only claim-backed volumes are kept"
        );
        let c = &spec["containers"][0];
        assert_eq!(c["name"], "app");
        assert_eq!(c["resources"]["requests"]["memory"], "256Mi");
        assert_eq!(c["resources"]["limits"]["memory"], "512Mi");
        assert_eq!(c["ports"][0]["hostPort"], 8080);
        for dropped in ["image", "command", "env", "readinessProbe", "volumeMounts"] {
            assert!(c.get(dropped).is_none(), "container {dropped} kept");
        }
        let init = &spec["initContainers"][0];
        assert_eq!(init["restartPolicy"], "Always");
        assert_eq!(init["resources"]["requests"]["cpu"], "50m");
        assert!(init.get("env").is_none());
        let status = &v["status"];
        assert_eq!(status["phase"], "Running");
        assert_eq!(status["startTime"], "2026-01-01T00:00:00Z");
        assert_eq!(status["nominatedNodeName"], "n2");
        assert_eq!(status["conditions"].as_array().unwrap().len(), 2);
        assert_eq!(status["conditions"][0]["type"], "PodScheduled");
        assert_eq!(status["conditions"][1]["type"], "Ready");
        assert!(status.get("containerStatuses").is_none());
        assert!(status.get("podIP").is_none());
        // What the controller decides from a pod is the same after trimming.
        assert!(!crate::state::pods::is_provisionable(&p));
        assert_eq!(crate::state::pods::node_name(&p), Some("n1"));
        let requests = crate::scheduling::pod::pod_requests(p.spec.as_ref().unwrap()).unwrap();
        assert!(!requests.is_empty());
    }

    #[test]
    fn node_keeps_what_the_controller_reads() {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "resourceVersion": "3", "labels": {"karpenter.sh/nodepool": "p"},
                         "annotations": {"karpenter.sh/do-not-disrupt": "true"},
                         "finalizers": ["karpenter.sh/termination"],
                         "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
            "spec": {"providerID": "sim://n1", "unschedulable": true,
                     "taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"cpu": "4", "pods": "110"},
                "capacity": {"cpu": "4"},
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                    {"type": "Ready", "status": "True", "reason": "KubeletReady",
                     "message": "kubelet is posting ready status",
                     "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 1}],
                "nodeInfo": {"architecture": "amd64", "bootID": "", "containerRuntimeVersion": "",
                             "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "",
                             "machineID": "", "operatingSystem": "linux", "osImage": "",
                             "systemUUID": ""},
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]
            }
        }))
        .unwrap();
        node(&mut n);
        let v = serde_json::to_value(&n).unwrap();
        assert!(v["metadata"].get("managedFields").is_none());
        assert_eq!(v["metadata"]["resourceVersion"], "3");
        assert_eq!(v["metadata"]["labels"]["karpenter.sh/nodepool"], "p");
        assert_eq!(
            v["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"],
            "true"
        );
        assert_eq!(v["metadata"]["finalizers"][0], "karpenter.sh/termination");
        assert_eq!(v["spec"]["providerID"], "sim://n1");
        assert_eq!(v["spec"]["unschedulable"], true);
        assert_eq!(v["spec"]["taints"][0]["key"], "karpenter.sh/disrupted");
        assert_eq!(v["status"]["allocatable"]["pods"], "110");
        let conditions = v["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0]["type"], "Ready");
        assert_eq!(conditions[0]["status"], "True");
        assert_eq!(conditions[0]["reason"], "KubeletReady");
        assert_eq!(conditions[0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        for dropped in ["message", "lastHeartbeatTime"] {
            assert!(
                conditions[0].get(dropped).is_none(),
                "Ready's {dropped} kept"
            );
        }
        for dropped in ["images", "nodeInfo", "addresses", "capacity"] {
            assert!(v["status"].get(dropped).is_none(), "status.{dropped} kept");
        }
        let with_pressure = |kept: &[String]| {
            let mut m: Node = serde_json::from_value(json!({"status": {"conditions": [
                {"type": "MemoryPressure", "status": "True", "message": "low on memory"},
                {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung"},
                {"type": "Ready", "status": "True"}]}}))
            .unwrap();
            node_keeping(&mut m, kept);
            serde_json::to_value(&m).unwrap()["status"]["conditions"].clone()
        };
        assert_eq!(
            with_pressure(&["KernelDeadlock".to_string()]),
            json!([{"type": "KernelDeadlock", "status": "True", "reason": "DockerHung"},
                   {"type": "Ready", "status": "True"}]),
            "the conditions a repair policy watches are kept"
        );
        assert_eq!(crate::state::nodes::provider_id(&n), Some("sim://n1"));
        // What the controller decides from a Node is the same after trimming.
        assert!(crate::actors::nodeclaim::initialization::node_ready(&n));
    }
}
