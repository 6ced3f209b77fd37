//! What kube-scheduler's filter plugins decide, as the stand-in needs it: a pod's requests,
//! whether it fits a node (selector, required node affinity, taints, resources, pod count), and
//! required pod anti-affinity over the pods already placed.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

use super::super::quantity::parse_milli;

/// Resource amounts in milli-units, by resource name ("pods" counts pods).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage(pub(super) BTreeMap<String, i128>);

impl Usage {
    pub(super) fn add(&mut self, other: &Usage) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_default() += v;
        }
    }

    pub(super) fn get(&self, k: &str) -> i128 {
        self.0.get(k).copied().unwrap_or(0)
    }
}

/// What a pod asks for: max(sum of containers, largest init container) plus overhead, plus one
/// pod slot. Limits stand in for missing requests, as the API server defaults them.
pub fn pod_requests(pod: &Pod) -> Usage {
    let mut total = Usage::default();
    let Some(spec) = pod.spec.as_ref() else {
        return total;
    };
    let container_requests = |c: &k8s_openapi::api::core::v1::Container| -> Usage {
        let mut u = Usage::default();
        if let Some(r) = c.resources.as_ref() {
            let limits = r.limits.clone().unwrap_or_default();
            let mut requests = r.requests.clone().unwrap_or_default();
            for (k, v) in limits {
                requests.entry(k).or_insert(v);
            }
            for (k, q) in requests {
                if let Some(v) = parse_milli(&q.0) {
                    u.0.insert(k, v);
                }
            }
        }
        u
    };
    for c in &spec.containers {
        total.add(&container_requests(c));
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, v) in container_requests(c).0 {
            let e = total.0.entry(k).or_default();
            *e = (*e).max(v);
        }
    }
    // Pod-level requests (`spec.resources`), where set, are the pod's requests for cpu, memory
    // and hugepages, whatever its containers ask (kube-scheduler's PodRequests).
    let pod_level = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    for (k, q) in pod_level.into_iter().flatten() {
        let supported = k == "cpu" || k == "memory" || k.starts_with("hugepages-");
        if supported && let Some(v) = parse_milli(&q.0) {
            total.0.insert(k.clone(), v);
        }
    }
    for (k, q) in spec.overhead.iter().flatten() {
        if let Some(v) = parse_milli(&q.0) {
            *total.0.entry(k.clone()).or_default() += v;
        }
    }
    total.0.insert("pods".into(), 1000);
    total
}

/// Ok(the node's score for `pod`, see [`least_allocated`]) when `pod` fits `node`, else the
/// kube-scheduler style reason.
pub fn fits(pod: &Pod, requests: &Usage, node: &Node, used: &Usage) -> Result<i128, String> {
    fits_allocatable(pod, requests, node, &allocatable(node), used)
}

/// `fits` with the node's allocatable already parsed (once per pass, not once per pod).
pub(super) fn fits_allocatable(
    pod: &Pod,
    requests: &Usage,
    node: &Node,
    allocatable: &Usage,
    used: &Usage,
) -> Result<i128, String> {
    let labels = node.labels();
    let spec = pod.spec.as_ref();
    if let Some(selector) = spec.and_then(|s| s.node_selector.as_ref())
        && selector.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return Err("node(s) didn't match Pod's node affinity/selector".into());
    }
    let terms = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice());
    if let Some(terms) = terms {
        let name = node.name_any();
        let any = terms.iter().any(|t| {
            let exprs = t.match_expressions.as_deref().unwrap_or_default();
            let fields = t.match_fields.as_deref().unwrap_or_default();
            (!exprs.is_empty() || !fields.is_empty())
                && exprs
                    .iter()
                    .all(|e| requirement_matches(e, labels.get(&e.key)))
                && fields
                    .iter()
                    .all(|f| f.key == "metadata.name" && requirement_matches(f, Some(&name)))
        });
        if !any {
            return Err("node(s) didn't match Pod's node affinity/selector".into());
        }
    }
    let tolerations = spec
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    if let Some(t) = taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
    {
        let value = t.value.as_deref().unwrap_or_default();
        return Err(format!(
            "node(s) had untolerated taint {{{}: {value}}}",
            t.key
        ));
    }
    for (resource, want) in &requests.0 {
        if *want <= 0 {
            continue;
        }
        if allocatable.get(resource) - used.get(resource) < *want {
            return Err(if resource == "pods" {
                "Too many pods".to_string()
            } else {
                format!("Insufficient {resource}")
            });
        }
    }
    Ok(least_allocated(requests, allocatable, used))
}

/// Fixed-point scale of [`least_allocated`]: finer than kube-scheduler's 0-100, whose ties it
/// breaks at random (the stand-in takes the first node in name order instead).
const SCORE_SCALE: i128 = 1_000_000;

/// kube-scheduler's default score (`NodeResourcesFit`, strategy `LeastAllocated`, CPU and
/// memory weighted 1 each): the share of each left free once `requests` is placed, averaged.
/// A node missing one of the two scores 0 for it. Free CPU alone (what the stand-in scored
/// before) sends a memory-heavy pod to a node whose memory is nearly full.
fn least_allocated(requests: &Usage, allocatable: &Usage, used: &Usage) -> i128 {
    let share = |r: &str| {
        let total = allocatable.get(r);
        let after = used.get(r) + requests.get(r);
        match total > 0 && after <= total {
            true => (total - after) * SCORE_SCALE / total,
            false => 0,
        }
    };
    (share("cpu") + share("memory")) / 2
}

/// A node's allocatable (its capacity when it reports none) in milli-units.
pub(super) fn allocatable(node: &Node) -> Usage {
    let amounts = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()));
    Usage(
        amounts
            .into_iter()
            .flatten()
            .filter_map(|(k, q)| Some((k.clone(), parse_milli(&q.0)?)))
            .collect(),
    )
}

/// Namespace and labels of the pods on each node (bound, or bound by us in this pass).
#[derive(Debug, Default)]
pub struct Placed(HashMap<String, Vec<PlacedPod>>);

/// A placed pod's namespace and labels.
type PlacedPod = (String, BTreeMap<String, String>);

impl Placed {
    pub fn add(&mut self, node: &str, pod: &Pod) {
        self.0
            .entry(node.to_string())
            .or_default()
            .push((pod.namespace().unwrap_or_default(), pod.labels().clone()));
    }
}

/// Required pod anti-affinity of the incoming pod: no matching pod may run in the same
/// topology domain (node label `topologyKey`) as `node`. The reverse direction (existing pods'
/// anti-affinity against the incoming pod) is not simulated.
pub fn anti_affinity_ok(
    pod: &Pod,
    node: &Node,
    node_labels: &HashMap<String, BTreeMap<String, String>>,
    placed: &Placed,
) -> bool {
    taken_domains(pod, node_labels, placed).allow(node)
}

/// For each required anti-affinity term of a pod: its topology key and the domains that already
/// run a pod the term selects. Worked out once per pod, so checking a node is a lookup.
pub struct TakenDomains(Vec<(String, HashSet<String>)>);

impl TakenDomains {
    /// The pod may go to `node`: no term's domain of it is taken. A node without a term's
    /// topology key is its own domain of nothing: the term holds.
    pub fn allow(&self, node: &Node) -> bool {
        let labels = node.labels();
        self.0
            .iter()
            .all(|(key, taken)| labels.get(key).is_none_or(|domain| !taken.contains(domain)))
    }
}

pub fn taken_domains(
    pod: &Pod,
    node_labels: &HashMap<String, BTreeMap<String, String>>,
    placed: &Placed,
) -> TakenDomains {
    let terms = pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_deref()
        })
        .unwrap_or_default();
    let own_ns = pod.namespace().unwrap_or_default();
    TakenDomains(
        terms
            .iter()
            .map(|term| {
                let all_namespaces = term
                    .namespace_selector
                    .as_ref()
                    .is_some_and(|s| s.match_labels.is_none() && s.match_expressions.is_none());
                let namespaces = term.namespaces.as_deref().unwrap_or_default();
                let in_scope = |ns: &str| {
                    all_namespaces
                        || if namespaces.is_empty() {
                            ns == own_ns
                        } else {
                            namespaces.iter().any(|n| n == ns)
                        }
                };
                let taken = placed
                    .0
                    .iter()
                    .filter(|(_, pods)| {
                        pods.iter().any(|(ns, labels)| {
                            in_scope(ns) && selector_matches(term.label_selector.as_ref(), labels)
                        })
                    })
                    .filter_map(|(other, _)| node_labels.get(other)?.get(&term.topology_key))
                    .cloned()
                    .collect();
                (term.topology_key.clone(), taken)
            })
            .collect(),
    )
}

/// A LabelSelector against labels; an absent selector matches nothing (affinity semantics).
pub(super) fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(selector) = selector else {
        return false;
    };
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_labels && by_expressions
}

pub(super) fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    let int = |s: &str| s.trim().parse::<i64>().ok();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) = (
                value.and_then(|v| int(v)),
                values.first().and_then(|b| int(b)),
            ) else {
                return false;
            };
            if req.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

pub(super) fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    if tol
        .effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    match tol.operator.as_deref().unwrap_or("Equal") {
        "Exists" => tol
            .key
            .as_deref()
            .is_none_or(|k| k.is_empty() || k == taint.key),
        _ => {
            tol.key.as_deref() == Some(taint.key.as_str())
                && tol.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
    }
}
