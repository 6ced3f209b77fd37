//! What the scheduler needs to know about a pod, read once from its spec: requests, node
//! requirements, tolerations, host ports and topology terms.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Container, NodeSelectorTerm, Pod, PodAffinityTerm, Toleration, WeightedPodAffinityTerm,
};

use super::selector::Selector;
use crate::api::requirements::{Requirement, Requirements};
use crate::api::resources::{Quantity, Resources};
use crate::api::wellknown::RESOURCE_PODS;

/// How a topology term constrains a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TermKind {
    /// Topology spread: at most `max_skew` more matching pods in a domain than in the emptiest.
    Spread { max_skew: i32, min_domains: i32 },
    /// Pod affinity: only into domains that already hold matching pods.
    Affinity,
    /// Pod anti-affinity: never into a domain that holds a matching pod.
    AntiAffinity,
}

/// Identity of a set of pods counted per topology domain. Pods sharing a term share the
/// counts, so terms are interned by this key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    pub kind: TermKind,
    pub topology_key: String,
    pub namespaces: BTreeSet<String>,
    pub selector: Selector,
}

/// One topology term of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    pub group: GroupKey,
    /// Hard (DoNotSchedule, required...) or a preference that relaxation may drop.
    pub required: bool,
    pub weight: i32,
}

/// A pod as the solver sees it.
#[derive(Clone, Debug)]
pub struct PodInfo {
    /// `namespace/name`.
    pub key: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// Effective requests (init containers, sidecars and overhead included) plus `pods: 1`.
    pub requests: Resources,
    /// nodeSelector intersected with each required node-affinity term (the terms are ORed);
    /// always at least one entry.
    pub node_terms: Vec<Requirements>,
    /// Preferred node-affinity terms, heaviest first.
    pub preferred_node: Vec<(i32, Requirements)>,
    pub tolerations: Vec<Toleration>,
    /// (hostPort, protocol) pairs.
    pub host_ports: Vec<(i32, String)>,
    pub terms: Vec<Term>,
}

impl PodInfo {
    /// Reads `pod`; an error names the field that could not be read.
    pub fn read(pod: &Pod) -> Result<PodInfo, String> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let spec = pod.spec.as_ref();
        let requests = spec.map(pod_requests).transpose()?.unwrap_or_default();
        let requests = requests.with(RESOURCE_PODS, Quantity::from_units(1));

        let mut selector_reqs = Requirements::new();
        for (k, v) in spec
            .and_then(|s| s.node_selector.as_ref())
            .into_iter()
            .flatten()
        {
            selector_reqs.add(Requirement::is_in(k, &[v.as_str()]));
        }
        let node_affinity = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref());
        let mut node_terms = Vec::new();
        let required_terms = node_affinity
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|r| r.node_selector_terms.as_slice())
            .unwrap_or_default();
        for (i, term) in required_terms.iter().enumerate() {
            let what = format!(
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]"
            );
            node_terms.push(selector_reqs.intersect(&term_requirements(term, &what)?));
        }
        if node_terms.is_empty() {
            node_terms.push(selector_reqs);
        }
        let mut preferred_node = Vec::new();
        let preferred = node_affinity
            .and_then(|n| {
                n.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .into_iter()
            .flatten();
        for (i, p) in preferred.enumerate() {
            let what = format!(
                "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference"
            );
            preferred_node.push((p.weight, term_requirements(&p.preference, &what)?));
        }
        // Heaviest first; the sort is stable so equal weights keep their order.
        preferred_node.sort_by_key(|p| std::cmp::Reverse(p.0));

        let host_ports = spec
            .into_iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let port = p.host_port.filter(|h| *h > 0)?;
                Some((port, p.protocol.clone().unwrap_or_else(|| "TCP".into())))
            })
            .collect();

        Ok(PodInfo {
            key: format!("{namespace}/{name}"),
            terms: topology_terms(pod, &namespace)?,
            namespace,
            labels,
            requests,
            node_terms,
            preferred_node,
            tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
            host_ports,
        })
    }

    pub fn cpu(&self) -> Quantity {
        self.requests.get(crate::api::wellknown::RESOURCE_CPU)
    }

    pub fn memory(&self) -> Quantity {
        self.requests.get(crate::api::wellknown::RESOURCE_MEMORY)
    }
}

fn term_requirements(term: &NodeSelectorTerm, what: &str) -> Result<Requirements, String> {
    if term.match_fields.as_ref().is_some_and(|f| !f.is_empty()) {
        return Err(format!(
            "{what}.matchFields: node fields cannot be known before a node exists"
        ));
    }
    Requirements::from_pod_node_selector(term.match_expressions.as_deref().unwrap_or_default())
        .map_err(|e| format!("{what}.matchExpressions: {e}"))
}

/// The effective requests of a pod as the kube-scheduler computes them: the larger of the
/// running containers (plus restartable init "sidecar" containers) and each init container in
/// turn (plus the sidecars started before it), then pod overhead. A container's limit stands in
/// for a missing request, as the API server defaults it.
pub fn pod_requests(spec: &k8s_openapi::api::core::v1::PodSpec) -> Result<Resources, String> {
    let mut running = Resources::new();
    for (i, c) in spec.containers.iter().enumerate() {
        running.add_assign(&container_requests(c, &format!("spec.containers[{i}]"))?);
    }
    let mut sidecars = Resources::new();
    let mut init_peak = Resources::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let r = container_requests(c, &format!("spec.initContainers[{i}]"))?;
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars.add_assign(&r);
            init_peak = init_peak.max_with(&sidecars);
        } else {
            init_peak = init_peak.max_with(&r.add(&sidecars));
        }
    }
    let mut total = running.add(&sidecars).max_with(&init_peak);
    if let Some(overhead) = &spec.overhead {
        let overhead = Resources::from_k8s(overhead).map_err(|e| format!("spec.overhead: {e}"))?;
        total.add_assign(&overhead);
    }
    Ok(total)
}

fn container_requests(c: &Container, what: &str) -> Result<Resources, String> {
    let Some(res) = &c.resources else {
        return Ok(Resources::new());
    };
    let mut out = match &res.limits {
        Some(l) => Resources::from_k8s(l).map_err(|e| format!("{what}.resources.limits: {e}"))?,
        None => Resources::new(),
    };
    if let Some(r) = &res.requests {
        let requests =
            Resources::from_k8s(r).map_err(|e| format!("{what}.resources.requests: {e}"))?;
        for (k, v) in requests.iter() {
            out.set(k, *v);
        }
    }
    Ok(out)
}

fn topology_terms(pod: &Pod, namespace: &str) -> Result<Vec<Term>, String> {
    let Some(spec) = &pod.spec else {
        return Ok(Vec::new());
    };
    let own_namespace = || BTreeSet::from([namespace.to_string()]);
    let mut out = Vec::new();
    for (i, c) in spec
        .topology_spread_constraints
        .iter()
        .flatten()
        .enumerate()
    {
        let what = format!("spec.topologySpreadConstraints[{i}]");
        out.push(Term {
            group: GroupKey {
                kind: TermKind::Spread {
                    max_skew: c.max_skew.max(1),
                    min_domains: c.min_domains.unwrap_or(1).max(1),
                },
                topology_key: c.topology_key.clone(),
                namespaces: own_namespace(),
                selector: Selector::parse(c.label_selector.as_ref(), &what)?,
            },
            required: c.when_unsatisfiable != "ScheduleAnyway",
            weight: 0,
        });
    }
    let affinity = spec.affinity.as_ref();
    let pod_affinity = affinity.and_then(|a| a.pod_affinity.as_ref());
    let anti = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
    let sets = [
        (
            TermKind::Affinity,
            "spec.affinity.podAffinity",
            pod_affinity.and_then(|p| {
                p.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
            pod_affinity.and_then(|p| {
                p.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
        ),
        (
            TermKind::AntiAffinity,
            "spec.affinity.podAntiAffinity",
            anti.and_then(|p| {
                p.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
            anti.and_then(|p| {
                p.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
        ),
    ];
    for (kind, base, required, preferred) in sets {
        for (i, t) in required.into_iter().flatten().enumerate() {
            let what = format!("{base}.requiredDuringSchedulingIgnoredDuringExecution[{i}]");
            out.push(affinity_term(kind, t, namespace, &what, true, 0)?);
        }
        let preferred: &[WeightedPodAffinityTerm] = preferred.map(Vec::as_slice).unwrap_or(&[]);
        for (i, w) in preferred.iter().enumerate() {
            let what = format!("{base}.preferredDuringSchedulingIgnoredDuringExecution[{i}]");
            out.push(affinity_term(
                kind,
                &w.pod_affinity_term,
                namespace,
                &what,
                false,
                w.weight,
            )?);
        }
    }
    Ok(out)
}

fn affinity_term(
    kind: TermKind,
    t: &PodAffinityTerm,
    namespace: &str,
    what: &str,
    required: bool,
    weight: i32,
) -> Result<Term, String> {
    // An empty namespace list means the pod's own namespace. A namespaceSelector would need
    // the Namespace objects, which the solver does not see; it is treated the same way.
    let mut namespaces: BTreeSet<String> = t.namespaces.iter().flatten().cloned().collect();
    if namespaces.is_empty() {
        namespaces.insert(namespace.to_string());
    }
    Ok(Term {
        group: GroupKey {
            kind,
            topology_key: t.topology_key.clone(),
            namespaces,
            selector: Selector::parse(t.label_selector.as_ref(), what)?,
        },
        required,
        weight,
    })
}

#[cfg(test)]
mod tests {
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
}
