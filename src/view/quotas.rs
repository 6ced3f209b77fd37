//! CapacityQuotas as provisioning enforces them and their status reports them: each watched
//! quota parsed (or why it cannot be), with what the nodes it selects use. Counted are every
//! Node whose labels the selector matches (at its claim's `status.capacity` when it has one,
//! else its allocatable: the Node index keeps no capacity), and every live claim that is not a
//! Node yet and may become one the selector matches (at its launched capacity, or, before
//! launch, at the largest instance type it may launch as, as a pool's limits count it). So a
//! solve made while another's claims are launching cannot pass a quota either.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kube::ResourceExt;

use super::Inputs;
use super::usage::{claim_requests, launch_headroom};
use crate::api::capacity_quota::{CapacityQuota, Malformed};
use crate::api::nodeclaim::NodeClaim;
use crate::api::requirements::{Requirement, Requirements};
use crate::api::resources::Resources;
use crate::api::wellknown::{INSTANCE_TYPE_LABEL, NODEPOOL_LABEL};
use crate::scheduling::InstanceType;
use crate::scheduling::quota::{QuotaInput, claim_label, count_node};
use crate::scheduling::selector::Selector;

/// One watched quota: the object, and it parsed with its usage, or why it is not enforced.
pub(crate) struct Counted {
    pub(crate) quota: Arc<CapacityQuota>,
    pub(crate) input: Result<QuotaInput, Malformed>,
}

/// A quota's limits and selector, checked.
pub(crate) fn parse(q: &CapacityQuota) -> Result<QuotaInput, Malformed> {
    let limits = q.limits()?;
    let empty = Default::default();
    // The selector parser names its fields as an affinity term's; a quota's has no
    // `labelSelector` level.
    let selector = Selector::parse(Some(q.spec.selector.as_ref().unwrap_or(&empty)), "spec")
        .map_err(|e| {
            let e = e.replacen("spec.labelSelector.", "spec.selector.", 1);
            match e.split_once(": ") {
                Some((field, problem)) => Malformed {
                    field: field.to_string(),
                    problem: problem.to_string(),
                },
                None => Malformed {
                    field: "spec.selector".into(),
                    problem: e,
                },
            }
        })?;
    Ok(QuotaInput {
        name: q.name_any(),
        selector,
        limits,
        usage: Resources::new(),
    })
}

/// Every watched quota with its usage; `creating` are claims whose create has not answered
/// yet (counted as in-flight claims).
pub(crate) fn count(view: Inputs<'_>, creating: &[&NodeClaim]) -> Vec<Counted> {
    let st = view.state;
    let mut out: Vec<Counted> = {
        let index = st.quotas.read();
        let mut quotas: Vec<&Arc<CapacityQuota>> = index.values().collect();
        // By name, so that every solve sees the quotas in the same order.
        quotas.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        (quotas.into_iter())
            .map(|q| Counted {
                quota: q.clone(),
                input: parse(q),
            })
            .collect()
    };
    if out.iter().all(|c| c.input.is_err()) {
        return out;
    }
    let claims: Vec<Arc<NodeClaim>> = st.claims.read().all().cloned().collect();
    let capacity_of_node: HashMap<&str, Resources> = claims
        .iter()
        .filter_map(|c| {
            let s = c.status.as_ref()?;
            let cap = Resources::from_k8s(s.capacity.as_ref()?).ok()?;
            Some((s.node_name.as_deref()?, cap))
        })
        .collect();
    let mut node_names: HashSet<String> = HashSet::new();
    for n in st.nodes.read().all() {
        node_names.insert(n.name().to_string());
        let labels = n.labels().to_map();
        let capacity = capacity_of_node
            .get(n.name())
            .cloned()
            .unwrap_or_else(|| n.allocatable());
        for q in out.iter_mut().filter_map(|c| c.input.as_mut().ok()) {
            if q.selector.matches(&labels) {
                count_node(&mut q.usage, &capacity);
            }
        }
    }
    let unregistered = claims
        .iter()
        .map(|c| &**c)
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_none_or(|n| !node_names.contains(n))
        })
        .chain(creating.iter().copied());
    let mut types_of_pool: HashMap<String, Vec<InstanceType>> = HashMap::new();
    for c in unregistered {
        let types = c.labels().get(NODEPOOL_LABEL).map(|pool| {
            types_of_pool
                .entry(pool.clone())
                .or_insert_with(|| pool_types(view, pool))
                .as_slice()
        });
        let mut reqs =
            Requirements::from_node_selector_requirements(&c.spec.requirements).unwrap_or_default();
        for (k, v) in c.labels() {
            if reqs.get(k).is_none() {
                reqs.add(Requirement::is_in(k, &[v.as_str()]));
            }
        }
        // A key the claim's pool types or offerings may add is open; without its pool's
        // types, any key is.
        let known = |k: &str| types.is_none_or(|ts| ts.iter().any(|t| t.carries(k)));
        let capacity = claim_capacity(c, &reqs, types.unwrap_or_default());
        for q in out.iter_mut().filter_map(|c| c.input.as_mut().ok()) {
            if q.selector.could_match(|k| claim_label(&reqs, &known, k)) {
                count_node(&mut q.usage, &capacity);
            }
        }
    }
    out
}

/// A claim's capacity once launched; before, its requests raised to the largest instance
/// type it may launch as.
fn claim_capacity(c: &NodeClaim, reqs: &Requirements, types: &[InstanceType]) -> Resources {
    if let Some(cap) = c
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|r| Resources::from_k8s(r).ok())
    {
        return cap;
    }
    let counted = claim_requests(c);
    let extra = launch_headroom(reqs.get(INSTANCE_TYPE_LABEL), &counted, types);
    counted.add(&extra)
}

fn pool_types(view: Inputs<'_>, pool: &str) -> Vec<InstanceType> {
    let Some(np) = view.state.nodepools.read().get(pool).cloned() else {
        return Vec::new();
    };
    let class = &np.spec.template.spec.node_class_ref.name;
    view.catalog.pool_instance_types(class, Some(pool))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::decode::Lenient;
    use crate::state::feed::Index;

    fn quota(name: &str, team: &str) -> CapacityQuota {
        serde_json::from_value(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityQuota",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {"team": team}},
                "limits": {"resources": {"cpu": "100", "nodes": "10"}},
            },
        }))
        .unwrap()
    }

    fn claim(name: &str, team: &str, body: serde_json::Value) -> NodeClaim {
        let mut v = json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {"team": team}},
            "spec": {"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"}, "requirements": []},
        });
        crate::testing::merge(&mut v, body);
        serde_json::from_value(v).unwrap()
    }

    fn node(name: &str, team: &str, cpu: &str) -> k8s_openapi::api::core::v1::Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"team": team}},
            "status": {"allocatable": {"cpu": cpu, "pods": "110"}},
        }))
        .unwrap()
    }

    /// Nodes count at their claim's capacity (else allocatable), claims not yet Nodes and
    /// creates not answered yet at what they ask for, deleting claims not at all; each only in
    /// the quotas whose selector matches.
    #[test]
    fn usage_counts_matching_nodes_and_claims_to_come() {
        let state = crate::state::State::default();
        for q in [quota("a", "a"), quota("b", "b")] {
            Index::apply(&mut *state.quotas.write(), Lenient::Ok(q));
        }
        {
            let mut nodes = state.nodes.write();
            nodes.apply(node("n-a", "a", "4"));
            nodes.apply(node("n-b", "b", "2"));
        }
        {
            let mut claims = state.claims.write();
            let launched = json!({"status": {"nodeName": "n-a", "capacity": {"cpu": "8"}}});
            claims.apply(Arc::new(claim("c-a", "a", launched)));
            let asks = json!({"spec": {"resources": {"requests": {"cpu": "1"}}}});
            claims.apply(Arc::new(claim("c-new", "a", asks)));
            let going = json!({
                "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x"]},
                "spec": {"resources": {"requests": {"cpu": "5"}}},
            });
            claims.apply(Arc::new(claim("c-going", "a", going)));
        }
        let creating = claim(
            "c-creating",
            "a",
            json!({"spec": {"resources": {"requests": {"cpu": "2"}}}}),
        );
        let catalog = crate::view::CatalogView::default();
        let settings = crate::view::Settings::default();
        let view = Inputs {
            state: &state,
            catalog: &catalog,
            settings: &settings,
        };
        let counted = count(view, &[&creating]);
        let usage = |name: &str| {
            let c = counted.iter().find(|c| c.quota.name_any() == name).unwrap();
            let u = &c.input.as_ref().unwrap().usage;
            (u.get("cpu").as_units(), u.get("nodes").as_units())
        };
        assert_eq!(usage("a"), (8 + 1 + 2, 3));
        assert_eq!(usage("b"), (2, 1));
    }

    #[test]
    fn a_bad_selector_is_named_by_its_field() {
        let q: CapacityQuota = serde_json::from_value(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityQuota",
            "metadata": {"name": "q"},
            "spec": {
                "selector": {"matchExpressions": [{"key": "team", "operator": "Near"}]},
                "limits": {"resources": {"nodes": "1"}},
            },
        }))
        .unwrap();
        let err = parse(&q).err().unwrap();
        assert_eq!(err.field, "spec.selector.matchExpressions[0]");
        assert!(err.problem.contains("\"Near\""), "{err}");
        let bad_limit: CapacityQuota = serde_json::from_value(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityQuota",
            "metadata": {"name": "q"},
            "spec": {"limits": {"resources": {"cpu": "1500m"}}},
        }))
        .unwrap();
        assert_eq!(
            parse(&bad_limit).err().unwrap().field,
            "spec.limits.resources.cpu"
        );
        let fine: CapacityQuota = serde_json::from_value(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityQuota",
            "metadata": {"name": "q"},
            "spec": {"limits": {"resources": {"cpu": "8"}}},
        }))
        .unwrap();
        assert!(parse(&fine).is_ok_and(|i| i.selector.matches(&Default::default())));
    }
}
