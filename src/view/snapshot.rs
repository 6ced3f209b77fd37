//! The solver's view of the cluster, copied out of the indexes: pending and bound pods, the
//! existing Nodes (with the requests bound to them) and in-flight claims as room to pack onto,
//! the NodePools with their catalog instance types and usage, and the DaemonSets' overhead.
//! The provisioner solves pending pods against it; disruption simulates removing candidates
//! from it. One builder, so both see the cluster alike.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Taint};
use kube::ResourceExt;

use super::Inputs;
use super::catalog::{CatalogView, declared_taints};
use super::usage::{claim_requests, launch_headroom};
use crate::api::nodeclaim::NodeClaim;
use crate::api::requirements::{Requirement, Requirements};
use crate::api::resources::{Quantity, Resources};
use crate::api::validation::validate_nodepool;
use crate::api::wellknown::{
    INSTANCE_TYPE_LABEL, MACHINE_DEPLOYMENT_ANNOTATION, NODECLASS_GROUP, NODECLASS_KIND,
    NODEPOOL_LABEL,
};
use crate::scheduling::default_spread::DefaultSpread;
use crate::scheduling::{self, ExistingNode, PoolInput, PreferencePolicy, Snapshot};
use crate::state::compact::CompactNode;
use crate::state::{State, pods};

/// Which bound pods a snapshot carries. The solver reads bound pods for two things only: the
/// host ports they hold on their node, and the topology counts of inter-pod constraints
/// (affinity, anti-affinity, spread). Requests are summed per node here either way.
#[derive(Clone, Copy)]
pub(crate) enum BoundPods<'a> {
    /// Every bound pod (`explain` solves a pod the index may not hold).
    All,
    /// What the solve can tell apart: every bound pod when any pod in the index has
    /// inter-pod constraints, else the ones holding host ports, plus every pod on these nodes
    /// (consolidation makes the pods of its candidates' nodes pending again).
    Needed { moving: &'a HashSet<String> },
}

/// The snapshot of the whole cluster. `creating` are claims whose create has not answered yet
/// (by a local id): they are room too, and count against their pools' limits.
pub(crate) fn build<'a>(
    view: Inputs<'_>,
    creating: impl IntoIterator<Item = (&'a u64, &'a NodeClaim)>,
    preference: PreferencePolicy,
    which: BoundPods<'_>,
) -> Snapshot {
    let st = view.state;
    let creating: Vec<(&u64, &NodeClaim)> = creating.into_iter().collect();
    // Counted before the other indexes are locked (it reads the claims and nodes itself).
    let quotas: Vec<scheduling::quota::QuotaInput> =
        super::quotas::count(view, &creating.iter().map(|(_, c)| *c).collect::<Vec<_>>())
            .into_iter()
            .filter_map(|c| c.input.ok())
            .collect();
    let pods_idx = st.pods.read();
    let nodes_idx = st.nodes.read();
    let node_list: Vec<&CompactNode> = nodes_idx.all().collect();
    let claims: Vec<Arc<NodeClaim>> = st.claims.read().all().cloned().collect();
    let deleting = deleting_nodes(
        node_list.iter().copied(),
        &nodes_of_deleting_claims(claims.iter()),
    );
    let (pods, rescheduled_keys) = pods_to_place(view, &pods_idx, &deleting);
    let default_spread = default_spread(view);
    let bound_pods = bound_pods(
        &pods_idx,
        which,
        default_spread.is_some(),
        &rescheduled_keys,
    );
    let mut nodes = existing_nodes(&node_list, &deleting, &claims, &pods_idx);
    nodes.extend(in_flight_claims(&claims, &node_list, view.catalog));
    let mut usage = super::usage::usage_by_pool(st);
    let mut unlaunched = unlaunched_by_pool(&claims);
    nodes.extend(creating_claims(
        &creating,
        view.catalog,
        &mut usage,
        &mut unlaunched,
    ));
    Snapshot {
        pods,
        bound_pods,
        nodes,
        nodepools: pool_inputs(view, &usage, &unlaunched),
        daemonsets: daemon_pods(view, &pods_idx),
        preference_policy: preference,
        min_values_policy: view.settings.min_values_policy,
        // Namespaces are not watched yet: only empty namespaceSelectors match.
        namespaces: Default::default(),
        default_spread,
        // Set by whoever solves: the provisioner for pending pods, disruption for moved ones.
        volume_topology: Default::default(),
        // Set by the provisioner from its plans; disruption simulates without them.
        nominated: Default::default(),
        // Set by disruption's simulations.
        moved: Default::default(),
        under_consolidate_after: Default::default(),
        displaced: rescheduled_keys,
        // Set by disruption before it decides.
        about_to_bind: Default::default(),
        quotas,
    }
}

/// What a pool counts per claim not launched yet: the instance types it may launch as, and
/// what `usage` counts it at so far.
type Unlaunched = HashMap<String, Vec<(Option<Requirement>, Resources)>>;

/// The pods to place: the provisionable ones, the pods leaving nodes will give up (planned
/// for now, and left out of the bound pods, so a pod is never counted both where it is and
/// where it will go), and CapacityBuffers' placeholders (packed like pending pods, so their
/// room is kept; a disruption simulation has to find them room too). Also the keys of the
/// pods given up.
fn pods_to_place(
    view: Inputs<'_>,
    pods_idx: &pods::Pods,
    deleting: &HashSet<String>,
) -> (Vec<Pod>, HashSet<String>) {
    let st = view.state;
    let mut pods: Vec<Pod> = pods_idx
        .provisionable()
        .iter()
        .map(|p| (**p).clone())
        .collect();
    let rescheduled = reschedulable_pods(pods_idx, deleting, st.pdbs.read().all());
    let rescheduled_keys: HashSet<String> = rescheduled.iter().map(pods::key).collect();
    pods.extend(rescheduled);
    pods.extend(st.buffers.read().all().cloned());
    (pods, rescheduled_keys)
}

/// The bound pods the solve reads (shared with the index, not copied: its pods are immutable
/// once in), without those their leaving nodes give up. Default constraints spread pods that
/// carry no term of their own: every bound pod may be counted then.
fn bound_pods(
    pods_idx: &pods::Pods,
    which: BoundPods<'_>,
    default_spread: bool,
    rescheduled_keys: &HashSet<String>,
) -> Vec<Arc<Pod>> {
    let terms = pods_idx.any_with_pod_terms() || default_spread;
    let bound_pods: Vec<Arc<Pod>> = match which {
        BoundPods::Needed { moving } if !terms => {
            let mut out: Vec<Arc<Pod>> = pods_idx
                .bound_with_host_ports()
                .into_iter()
                .filter(|p| pods::node_name(p).is_none_or(|n| !moving.contains(n)))
                .collect();
            for node in moving {
                out.extend(pods_idx.on_node(node));
            }
            out
        }
        _ => pods_idx.bound(),
    };
    if rescheduled_keys.is_empty() {
        return bound_pods;
    }
    bound_pods
        .into_iter()
        .filter(|p| !rescheduled_keys.contains(&pods::key(p)))
        .collect()
}

/// The Nodes pods may still go to (not leaving, not cordoned), with what their pods request.
fn existing_nodes(
    node_list: &[&CompactNode],
    deleting: &HashSet<String>,
    claims: &[Arc<NodeClaim>],
    pods_idx: &pods::Pods,
) -> Vec<ExistingNode> {
    let claim_of_node = claims_by_node(claims);
    node_list
        .iter()
        .filter(|n| !deleting.contains(n.name()) && !n.unschedulable())
        .map(|n| existing_node(n, claim_of_node.get(n.name()), pods_idx))
        .collect()
}

fn existing_node(
    n: &CompactNode,
    claim: Option<&Arc<NodeClaim>>,
    pods_idx: &pods::Pods,
) -> ExistingNode {
    let name = n.name().to_string();
    let startup: Vec<Taint> = claim
        .and_then(|c| c.spec.startup_taints.clone())
        .unwrap_or_default();
    let mut node = ExistingNode {
        requested: pods_idx.requested_on(&name),
        daemon_requested: pods_idx.daemon_requested_on(&name),
        name,
        labels: n.labels().to_map(),
        taints: n.taints().to_vec(),
        allocatable: n.allocatable(),
        in_flight: false,
        nodepool: n.labels().get(NODEPOOL_LABEL).map(String::from),
    };
    // Until it is initialized a node's startup taints are its own start-up, not a refusal
    // (the solver drops ephemeral taints the same way); afterwards every taint counts. Its
    // kubelet may also report an extended resource as zero until the device plugin
    // registers: the claim's launched allocatable stands in for it (upstream's
    // `StateNode.Allocatable`), so a second GPU pod does not get a second node.
    if !node.initialized() {
        if let Some(launched) = claim.and_then(|c| launched_allocatable(c)) {
            fill_zeroed(&mut node.allocatable, &launched);
        }
        node.taints.retain(|t| {
            !startup
                .iter()
                .any(|s| s.key == t.key && s.effect == t.effect)
        });
    }
    node
}

/// Claims whose Node has not registered (and that are not being deleted), as the room they
/// will bring.
fn in_flight_claims(
    claims: &[Arc<NodeClaim>],
    node_list: &[&CompactNode],
    catalog: &CatalogView,
) -> Vec<ExistingNode> {
    let node_names: HashSet<&str> = node_list.iter().map(|n| n.name()).collect();
    claims
        .iter()
        .filter(|c| {
            let has_node = c
                .status
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| node_names.contains(n));
            !has_node && c.metadata.deletion_timestamp.is_none()
        })
        .map(|c| in_flight(c, catalog))
        .collect()
}

/// Claims not launched yet (no capacity in their status), by pool.
fn unlaunched_by_pool(claims: &[Arc<NodeClaim>]) -> Unlaunched {
    let mut unlaunched: Unlaunched = HashMap::new();
    for c in claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
    {
        if let Some(pool) = c.labels().get(NODEPOOL_LABEL)
            && c.status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .is_none()
        {
            unlaunched
                .entry(pool.clone())
                .or_default()
                .push((allowed_types(c), claim_requests(c)));
        }
    }
    unlaunched
}

/// Creates not answered yet: room too, and counted against their pools' limits.
fn creating_claims(
    creating: &[(&u64, &NodeClaim)],
    catalog: &CatalogView,
    usage: &mut BTreeMap<String, (Resources, i64)>,
    unlaunched: &mut Unlaunched,
) -> Vec<ExistingNode> {
    let mut nodes = Vec::with_capacity(creating.len());
    for (id, c) in creating {
        let mut node = in_flight(c, catalog);
        node.name = format!("creating-{id}");
        if let Some(pool) = c.labels().get(NODEPOOL_LABEL) {
            let entry = usage.entry(pool.clone()).or_default();
            entry.0.add_assign(&node.allocatable);
            entry.1 += 1;
            unlaunched
                .entry(pool.clone())
                .or_default()
                .push((allowed_types(c), node.allocatable.clone()));
        }
        nodes.push(node);
    }
    nodes
}

/// Each NodePool of ours that can provision, with the instance types it sees and its usage,
/// claims not launched yet counted at the most they may launch as.
fn pool_inputs(
    view: Inputs<'_>,
    usage: &BTreeMap<String, (Resources, i64)>,
    unlaunched: &Unlaunched,
) -> Vec<PoolInput> {
    let mut nodepools = Vec::new();
    for np in view.state.nodepools.read().values() {
        if np.metadata.deletion_timestamp.is_some() || validate_nodepool(np).is_err() {
            continue;
        }
        let r = &np.spec.template.spec.node_class_ref;
        if r.group != NODECLASS_GROUP || r.kind != NODECLASS_KIND {
            continue;
        }
        let (mut res, count) = usage.get(&np.name_any()).cloned().unwrap_or_default();
        // As this pool sees them: NodeOverlays may select it by name or template labels.
        let instance_types = scheduling::instance_type::for_declared_taints(
            view.catalog
                .pool_instance_types(&r.name, Some(&np.name_any())),
            &declared_taints(
                &np.spec.template.spec.taints,
                &np.spec.template.spec.startup_taints,
            ),
        );
        for (allowed, counted) in unlaunched.get(&np.name_any()).into_iter().flatten() {
            res.add_assign(&launch_headroom(allowed.as_ref(), counted, &instance_types));
        }
        nodepools.push(PoolInput {
            nodepool: (**np).clone(),
            instance_types,
            usage: res.with("nodes", Quantity::from_units(count)),
        });
    }
    nodepools
}

/// The pod each DaemonSet would run on a new node.
fn daemon_pods(view: Inputs<'_>, pods_idx: &pods::Pods) -> Vec<Pod> {
    view.state
        .daemonsets
        .read()
        .all()
        .filter_map(|ds| {
            let template = &ds.spec.as_ref()?.template;
            let running = ds
                .metadata
                .uid
                .as_deref()
                .and_then(|u| pods_idx.daemonset_pod(u));
            Some(scheduling::daemon_pod(
                &ds.namespace().unwrap_or_default(),
                &ds.name_any(),
                template,
                running.as_deref(),
            ))
        })
        .collect()
}

/// Each claim by the name of its Node.
fn claims_by_node(claims: &[Arc<NodeClaim>]) -> HashMap<String, Arc<NodeClaim>> {
    claims
        .iter()
        .filter_map(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .map(|n| (n, c.clone()))
        })
        .collect()
}

/// Whether some pod of a deleting node is to be planned for: the provisioner has work even
/// with no pod pending. Asked on every batch trigger without pending pods, so it reads the
/// indexes in place rather than copying them as a snapshot does.
pub(crate) fn has_reschedulable_pods(st: &State) -> bool {
    let of_claims = nodes_of_deleting_claims(st.claims.read().all());
    let deleting = deleting_nodes(st.nodes.read().all(), &of_claims);
    if deleting.is_empty() {
        return false;
    }
    let budgets = crate::state::reschedulable::Budgets::new(st.pdbs.read().all());
    let pods_idx = st.pods.read();
    let now = jiff::Timestamp::now();
    deleting.iter().any(|n| {
        pods_idx
            .on_node(n)
            .iter()
            .any(|p| budgets.reschedulable(p, now))
    })
}

/// The Nodes of claims being deleted.
fn nodes_of_deleting_claims<'c>(
    claims: impl Iterator<Item = &'c Arc<NodeClaim>>,
) -> HashSet<String> {
    claims
        .filter(|c| c.metadata.deletion_timestamp.is_some())
        .filter_map(|c| c.status.as_ref()?.node_name.clone())
        .collect()
}

/// Nodes on their way out: the Node is deleting, or its claim is (upstream's
/// `MarkedForDeletion`; `of_deleting_claims` from [`nodes_of_deleting_claims`]). They take no
/// pods, and their pods are planned for elsewhere.
fn deleting_nodes<'n>(
    nodes: impl Iterator<Item = &'n CompactNode>,
    of_deleting_claims: &HashSet<String>,
) -> HashSet<String> {
    nodes
        .filter(|n| n.deleting() || of_deleting_claims.contains(n.name()))
        .map(|n| n.name().to_string())
        .collect()
}

/// The pods of `deleting` nodes that will be recreated elsewhere and can be evicted
/// ([`crate::state::reschedulable`]), as pending pods: no node yet.
fn reschedulable_pods(
    pods_idx: &pods::Pods,
    deleting: &HashSet<String>,
    pdbs: &crate::state::reschedulable::Pdbs,
) -> Vec<Pod> {
    let now = jiff::Timestamp::now();
    let budgets = crate::state::reschedulable::Budgets::new(pdbs);
    let mut out = Vec::new();
    for node in deleting {
        for p in pods_idx.on_node(node) {
            if budgets.reschedulable(&p, now) {
                let mut p = (*p).clone();
                if let Some(spec) = p.spec.as_mut() {
                    spec.node_name = None;
                }
                out.push(p);
            }
        }
    }
    // In no particular order: the solver sorts its pods itself.
    out
}

/// The configured default constraints with the workload watch's selectors (None when no
/// `--scheduler-config` sets any).
fn default_spread(view: Inputs<'_>) -> Option<DefaultSpread> {
    let constraints = view.settings.default_constraints.clone()?;
    Some(DefaultSpread {
        constraints,
        workloads: view.state.workloads.read().selectors(),
    })
}

/// The instance-type requirement of a claim (None: any type of its pool).
fn allowed_types(claim: &NodeClaim) -> Option<Requirement> {
    Requirements::from_node_selector_requirements(&claim.spec.requirements)
        .ok()?
        .get(INSTANCE_TYPE_LABEL)
        .cloned()
}

/// What a launched claim's instance type allocates (its `status.allocatable`), when readable.
fn launched_allocatable(c: &NodeClaim) -> Option<Resources> {
    let a = c.status.as_ref()?.allocatable.as_ref()?;
    Resources::from_k8s(a).ok()
}

/// Every resource the node reports as zero or not at all takes the launched value.
fn fill_zeroed(node: &mut Resources, launched: &Resources) {
    for (name, q) in launched.iter() {
        if node.get(name).is_zero() {
            node.set(name, *q);
        }
    }
}

/// An in-flight claim as a node the solver can still pack onto: its single-valued requirements
/// as labels, and the room it will have: what its instance type allocates.
///
/// Upstream counts an in-flight claim at its `status.allocatable`, which launch writes from the
/// instance type the cloud provider chose, and solves no pod while any claim has not launched
/// (its cluster state is not synced until every claim has a provider ID). A Cluster API launch
/// (a provider ID) takes minutes, too long to hold every solve, but our claim has its offering
/// chosen from its creation (the MachineDeployment annotation, written by `prelaunch` or the
/// claim's first reconcile), and launch writes that offering's allocatable as the claim's: so the
/// claim counts at that allocatable from the start, as upstream's does once launched. Its
/// requests (the pods it was made for, with no slack) stand in only while no offering is
/// chosen, as upstream's unlaunched claim would offer nothing at all.
pub(crate) fn in_flight(c: &NodeClaim, catalog: &CatalogView) -> ExistingNode {
    let mut labels: BTreeMap<String, String> = c.labels().clone();
    if let Ok(reqs) = Requirements::from_node_selector_requirements(&c.spec.requirements) {
        for key in reqs.keys().map(str::to_string).collect::<Vec<_>>() {
            if let Some(values) = reqs.values(&key)
                && values.len() == 1
                && let Some(v) = values.iter().next()
            {
                labels.entry(key).or_insert_with(|| v.clone());
            }
        }
    }
    let allocatable = launched_allocatable(c)
        .or_else(|| chosen_allocatable(c, catalog))
        .or_else(|| {
            c.spec
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|a| Resources::from_k8s(a).ok())
        })
        .unwrap_or_default();
    ExistingNode {
        name: c.name_any(),
        labels,
        taints: c.spec.taints.clone().unwrap_or_default(),
        allocatable,
        requested: Resources::new(),
        daemon_requested: Resources::new(),
        in_flight: true,
        nodepool: c.labels().get(NODEPOOL_LABEL).cloned(),
    }
}

/// What the offering chosen for a claim not launched yet allocates (as its pool sees it): what
/// launch will write as its `status.allocatable`. None before an offering is chosen, or when
/// the catalog no longer lists that MachineDeployment.
fn chosen_allocatable(c: &NodeClaim, catalog: &CatalogView) -> Option<Resources> {
    let md = c.annotations().get(MACHINE_DEPLOYMENT_ANNOTATION)?;
    let pool = c.labels().get(NODEPOOL_LABEL).map(String::as_str);
    catalog.pool_offering(md, pool).map(|o| o.allocatable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zeroed_extended_resource_takes_the_launched_value() {
        let q = |s: &str| s.parse::<crate::api::resources::Quantity>().unwrap();
        let mut node = Resources::new()
            .with("cpu", q("4"))
            .with("vendor-a/gpu", q("0"));
        let launched = Resources::new()
            .with("cpu", q("8"))
            .with("vendor-a/gpu", q("2"))
            .with("vendor-b/gpu", q("1"));
        fill_zeroed(&mut node, &launched);
        // What the node reports stands; only zero or missing values are filled.
        assert_eq!(node.get("cpu"), q("4"));
        assert_eq!(node.get("vendor-a/gpu"), q("2"));
        assert_eq!(node.get("vendor-b/gpu"), q("1"));
    }

    fn it(name: &str, cpu: i64) -> scheduling::InstanceType {
        scheduling::InstanceType {
            name: name.into(),
            requirements: Requirements::new(),
            capacity: Resources::new().with("cpu", Quantity::from_units(cpu)),
            overhead: Resources::new(),
            offerings: vec![],
            csi_limits: Default::default(),
        }
    }

    fn claim(types: &[&str]) -> NodeClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c"},
            "spec": {
                "requirements": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": types}],
                "nodeClassRef": {"group": NODECLASS_GROUP, "kind": NODECLASS_KIND, "name": "d"}
            }
        }))
        .expect("a NodeClaim")
    }

    #[test]
    fn an_unlaunched_claim_offers_its_chosen_offerings_allocatable_not_its_requests() {
        let q = |s: &str| s.parse::<Quantity>().unwrap();
        let mut large = it("large", 8);
        large.overhead = Resources::new().with("cpu", q("100m"));
        large.offerings = vec![scheduling::Offering {
            machine_deployment: "ns/md-large".into(),
            zone: None,
            capacity_type: "on-demand".into(),
            price: 1.0,
            available: true,
            labels: BTreeMap::new(),
            taints: vec![],
            replicas: 0,
            max_size: None,
        }];
        let catalog = CatalogView::default();
        catalog.insert(
            "d",
            crate::capi::offerings::Catalog {
                instance_types: vec![large],
                deployments: vec!["ns/md-large".into()],
                ..Default::default()
            },
            None,
        );
        let mut c = claim(&["large"]);
        c.spec.resources = Some(crate::api::nodeclaim::ResourceRequirements {
            requests: Some(Resources::new().with("cpu", q("3")).to_k8s()),
        });
        // No offering chosen yet: its requests are all it is known to offer.
        assert_eq!(in_flight(&c, &catalog).allocatable.get("cpu"), q("3"));
        // Chosen at creation: what launch will write as its allocatable.
        c.metadata.annotations = Some(
            [(
                MACHINE_DEPLOYMENT_ANNOTATION.to_string(),
                "ns/md-large".to_string(),
            )]
            .into(),
        );
        assert_eq!(in_flight(&c, &catalog).allocatable.get("cpu"), q("7900m"));
        // Launched: its own status says.
        c.status = Some(crate::api::nodeclaim::NodeClaimStatus {
            allocatable: Some(Resources::new().with("cpu", q("7")).to_k8s()),
            ..Default::default()
        });
        assert_eq!(in_flight(&c, &catalog).allocatable.get("cpu"), q("7"));
    }

    #[test]
    fn an_unlaunched_claim_counts_as_the_largest_type_it_allows() {
        let types = [it("small", 2), it("medium", 4), it("large", 16)];
        let counted = Resources::new().with("cpu", Quantity::from_units(1));
        let extra = launch_headroom(
            allowed_types(&claim(&["small", "medium"])).as_ref(),
            &counted,
            &types,
        );
        assert_eq!(
            extra.get("cpu"),
            Quantity::from_units(3),
            "4 CPUs less the 1 counted"
        );
        // Counted at more than any allowed type: nothing to add, never a negative amount.
        let big = Resources::new().with("cpu", Quantity::from_units(8));
        assert!(
            launch_headroom(allowed_types(&claim(&["small"])).as_ref(), &big, &types).is_empty()
        );
    }
}
