//! What the scheduler needs to know about a pod, read once from its spec: requests, node
//! requirements, tolerations, host ports and topology terms.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeSelectorTerm, Pod, PodAffinityTerm, Toleration,
    TopologySpreadConstraint, WeightedPodAffinityTerm,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use super::selector::Selector;
use crate::api::requirements::{Requirement, Requirements};
use crate::api::resources::{Quantity, Resources};
use crate::api::wellknown::{RESOURCE_CPU, RESOURCE_MEMORY, RESOURCE_PODS, normalized_label};

/// How a topology term constrains a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum TermKind {
    /// Topology spread: at most `max_skew` more matching pods in a domain than in the emptiest.
    /// `honor_affinity` (nodeAffinityPolicy Honor, the default): only domains the pod's node
    /// requirements allow count towards the emptiest; `honor_taints` (nodeTaintsPolicy Honor,
    /// default Ignore): only domains of nodes and NodePools whose taints the pod tolerates.
    Spread {
        max_skew: i32,
        min_domains: i32,
        honor_affinity: bool,
        honor_taints: bool,
    },
    /// Pod affinity: only into domains that already hold matching pods.
    Affinity,
    /// Pod anti-affinity: never into a domain that holds a matching pod.
    AntiAffinity,
}

/// Identity of a set of pods counted per topology domain. Pods sharing a term share the
/// counts, so terms are interned by this key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct GroupKey {
    pub(crate) kind: TermKind,
    pub(crate) topology_key: String,
    pub(crate) namespaces: Namespaces,
    pub(crate) selector: Selector,
    /// For a spread: its node filter (the carrying pod's node-selector terms when it honours
    /// node affinity, its tolerations when it honours taints). Pods with different filters see
    /// different domains and count different nodes, so they do not share the group.
    pub(crate) node_filter: String,
}

/// The namespaces an affinity term (or spread) counts pods in: the listed ones, plus those a
/// `namespaceSelector` matches. With neither, the pod's own namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Namespaces {
    pub(crate) names: BTreeSet<String>,
    /// Matched against the Namespace's labels (an empty selector matches every namespace).
    pub(crate) selector: Option<Selector>,
}

impl Namespaces {
    pub(crate) fn only(namespace: &str) -> Namespaces {
        Namespaces {
            names: BTreeSet::from([namespace.to_string()]),
            selector: None,
        }
    }

    /// Whether `namespace`, whose labels `labels` gives, is in scope.
    pub(crate) fn contains<'l>(
        &self,
        namespace: &str,
        labels: impl FnOnce(&str) -> Option<&'l BTreeMap<String, String>>,
    ) -> bool {
        if self.names.contains(namespace) {
            return true;
        }
        let Some(selector) = &self.selector else {
            return false;
        };
        let none = BTreeMap::new();
        selector.matches(labels(namespace).unwrap_or(&none))
    }
}

/// One topology term of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Term {
    pub(crate) group: GroupKey,
    /// Hard (DoNotSchedule, required...) or a preference that relaxation may drop.
    pub(crate) required: bool,
    pub(crate) weight: i32,
}

/// A pod as the solver sees it.
#[derive(Clone, Debug)]
pub(crate) struct PodInfo {
    /// `namespace/name`.
    pub(crate) key: String,
    pub(crate) namespace: String,
    pub(crate) labels: BTreeMap<String, String>,
    /// Effective requests (init containers, sidecars and overhead included) plus `pods: 1`.
    pub(crate) requests: Resources,
    /// nodeSelector intersected with each required node-affinity term (the terms are ORed);
    /// always at least one entry.
    pub(crate) node_terms: Vec<Requirements>,
    /// Preferred node-affinity terms, heaviest first.
    pub(crate) preferred_node: Vec<(i32, Requirements)>,
    pub(crate) tolerations: Vec<Toleration>,
    /// (hostPort, protocol) pairs.
    pub(crate) host_ports: Vec<(i32, String)>,
    pub(crate) terms: Vec<Term>,
    /// A CapacityBuffer's placeholder: it holds room, so it yields to real pods of its size.
    pub(crate) placeholder: bool,
}

impl PodInfo {
    /// Reads `pod`; an error names the field that could not be read.
    pub(crate) fn read(pod: &Pod) -> Result<PodInfo, String> {
        PodInfo::read_with_defaults(pod, None)
    }

    /// Reads `pod`, spread by `defaults` (the cluster's default constraints with the pod's
    /// deduced selector, see [`super::default_spread`]) in place of its own constraints.
    pub(crate) fn read_with_defaults(
        pod: &Pod,
        defaults: Option<&[TopologySpreadConstraint]>,
    ) -> Result<PodInfo, String> {
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
            selector_reqs.add(Requirement::is_in(normalized_label(k), &[v.as_str()]));
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
            // kube-scheduler: a term without expressions or fields matches no node, so it adds
            // nothing to the ORed alternatives.
            if term_is_empty(term) {
                continue;
            }
            let what = format!(
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]"
            );
            node_terms.push(selector_reqs.intersect(&term_requirements(term, &what)?));
        }
        if node_terms.is_empty() && !required_terms.is_empty() {
            return Err(
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: every term is empty, and an empty term matches no node".to_string(),
            );
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
            terms: topology_terms(pod, &namespace, &node_terms, defaults)?,
            namespace,
            labels,
            requests,
            node_terms,
            preferred_node,
            tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
            host_ports,
            placeholder: crate::api::capacity_buffer::is_placeholder(pod),
        })
    }

    pub(crate) fn cpu(&self) -> Quantity {
        self.requests.get(RESOURCE_CPU)
    }

    pub(crate) fn memory(&self) -> Quantity {
        self.requests.get(RESOURCE_MEMORY)
    }
}

fn term_is_empty(term: &NodeSelectorTerm) -> bool {
    term.match_expressions.as_ref().is_none_or(Vec::is_empty)
        && term.match_fields.as_ref().is_none_or(Vec::is_empty)
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
    // Pod-level requests (spec.resources) are the pod's requests for the resources they name,
    // whatever its containers ask (kube-scheduler's PodRequests); overhead comes on top.
    if let Some(requests) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        let requests =
            Resources::from_k8s(requests).map_err(|e| format!("spec.resources.requests: {e}"))?;
        for (k, v) in requests.iter() {
            if pod_level_resource(k) {
                total.set(k, *v);
            }
        }
    }
    if let Some(overhead) = &spec.overhead {
        let overhead = Resources::from_k8s(overhead).map_err(|e| format!("spec.overhead: {e}"))?;
        total.add_assign(&overhead);
    }
    Ok(total)
}

/// Whether pod-level resources may set `name` (upstream's `IsSupportedPodLevelResource`).
fn pod_level_resource(name: &str) -> bool {
    name == RESOURCE_CPU || name == RESOURCE_MEMORY || name.starts_with("hugepages-")
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

/// The pod's placement terms: its spread constraints (the cluster's defaults in their place when
/// given), then its pod affinity and anti-affinity.
fn topology_terms(
    pod: &Pod,
    namespace: &str,
    node_terms: &[Requirements],
    defaults: Option<&[TopologySpreadConstraint]>,
) -> Result<Vec<Term>, String> {
    let Some(spec) = &pod.spec else {
        return Ok(Vec::new());
    };
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let (constraints, field) = match defaults {
        Some(d) => (d, "default topologySpreadConstraints"),
        None => (
            spec.topology_spread_constraints
                .as_deref()
                .unwrap_or_default(),
            "spec.topologySpreadConstraints",
        ),
    };
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    for (i, c) in constraints.iter().enumerate() {
        let what = format!("{field}[{i}]");
        out.push(spread_term(
            c,
            &what,
            namespace,
            &labels,
            node_terms,
            tolerations,
        )?);
    }
    out.extend(affinity_terms(spec.affinity.as_ref(), namespace, &labels)?);
    Ok(out)
}

/// One topology spread constraint as a term.
fn spread_term(
    c: &TopologySpreadConstraint,
    what: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    node_terms: &[Requirements],
    tolerations: &[Toleration],
) -> Result<Term, String> {
    let honor_affinity = node_policy(
        c.node_affinity_policy.as_ref(),
        what,
        "nodeAffinityPolicy",
        true,
    )?;
    let honor_taints = node_policy(
        c.node_taints_policy.as_ref(),
        what,
        "nodeTaintsPolicy",
        false,
    )?;
    // minDomains applies only to DoNotSchedule (the API server rejects it otherwise).
    let hard = c.when_unsatisfiable != "ScheduleAnyway";
    let min_domains = if hard { c.min_domains.unwrap_or(1) } else { 1 };
    let selector = with_label_keys(
        c.label_selector.as_ref(),
        labels,
        c.match_label_keys.as_deref().unwrap_or_default(),
        &[],
    );
    // Terms share a group only when they count the same domains: what decides which domains
    // count (the honoured node requirements and tolerations) is part of the group's key.
    let mut node_filter = String::new();
    if honor_affinity {
        node_filter.push_str(&format!("{node_terms:?}"));
    }
    if honor_taints {
        node_filter.push_str(&format!("{tolerations:?}"));
    }
    Ok(Term {
        group: GroupKey {
            kind: TermKind::Spread {
                max_skew: c.max_skew.max(1),
                min_domains: min_domains.max(1),
                honor_affinity,
                honor_taints,
            },
            topology_key: c.topology_key.clone(),
            namespaces: Namespaces::only(namespace),
            selector: Selector::parse(selector.as_ref(), what)?,
            node_filter,
        },
        required: c.when_unsatisfiable != "ScheduleAnyway",
        weight: 0,
    })
}

/// A spread constraint's nodeAffinityPolicy or nodeTaintsPolicy: whether it is honoured.
fn node_policy(
    value: Option<&String>,
    what: &str,
    field: &str,
    default: bool,
) -> Result<bool, String> {
    match value.map(String::as_str) {
        None => Ok(default),
        Some("Honor") => Ok(true),
        Some("Ignore") => Ok(false),
        Some(other) => Err(format!("{what}.{field}: {other:?} is not Honor or Ignore")),
    }
}

/// The pod affinity and anti-affinity terms, required then preferred of each.
fn affinity_terms(
    affinity: Option<&Affinity>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<Vec<Term>, String> {
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
    let mut out = Vec::new();
    for (kind, base, required, preferred) in sets {
        for (i, t) in required.into_iter().flatten().enumerate() {
            let what = format!("{base}.requiredDuringSchedulingIgnoredDuringExecution[{i}]");
            out.push(affinity_term(kind, t, namespace, labels, &what, true, 0)?);
        }
        let preferred: &[WeightedPodAffinityTerm] = preferred.map(Vec::as_slice).unwrap_or(&[]);
        for (i, w) in preferred.iter().enumerate() {
            let what = format!("{base}.preferredDuringSchedulingIgnoredDuringExecution[{i}]");
            out.push(affinity_term(
                kind,
                &w.pod_affinity_term,
                namespace,
                labels,
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
    labels: &BTreeMap<String, String>,
    what: &str,
    required: bool,
    weight: i32,
) -> Result<Term, String> {
    // Neither a namespace list nor a selector: the pod's own namespace. An empty selector
    // (`{}`) selects every namespace.
    let names: BTreeSet<String> = t.namespaces.iter().flatten().cloned().collect();
    let namespaces = match &t.namespace_selector {
        None if names.is_empty() => Namespaces::only(namespace),
        None => Namespaces {
            names,
            selector: None,
        },
        Some(sel) => Namespaces {
            names,
            selector: Some(Selector::parse(
                Some(sel),
                &format!("{what}.namespaceSelector"),
            )?),
        },
    };
    let selector = with_label_keys(
        t.label_selector.as_ref(),
        labels,
        t.match_label_keys.as_deref().unwrap_or_default(),
        t.mismatch_label_keys.as_deref().unwrap_or_default(),
    );
    Ok(Term {
        group: GroupKey {
            kind,
            topology_key: t.topology_key.clone(),
            namespaces,
            selector: Selector::parse(selector.as_ref(), what)?,
            node_filter: String::new(),
        },
        required,
        weight,
    })
}

/// A term's label selector with `matchLabelKeys` (key In the pod's value) and
/// `mismatchLabelKeys` (key NotIn the pod's value) merged in, as kube-scheduler does. Keys the
/// pod has no label for are skipped; an absent selector stays absent (it matches nothing).
fn with_label_keys(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
    match_keys: &[String],
    mismatch_keys: &[String],
) -> Option<LabelSelector> {
    let mut selector = selector?.clone();
    let merged = [("In", match_keys), ("NotIn", mismatch_keys)]
        .into_iter()
        .flat_map(|(op, keys)| keys.iter().map(move |k| (op, k)))
        .filter_map(|(op, key)| {
            let value = labels.get(key)?;
            Some(LabelSelectorRequirement {
                key: key.clone(),
                operator: op.to_string(),
                values: Some(vec![value.clone()]),
            })
        });
    let expressions: Vec<LabelSelectorRequirement> = merged.collect();
    if !expressions.is_empty() {
        selector
            .match_expressions
            .get_or_insert_with(Vec::new)
            .extend(expressions);
    }
    Some(selector)
}

/// A pod's `namespace/name`, the key pods go by in a solve's results.
pub(super) fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests;
