//! One read of the cluster, put into the same indexes and catalog view the controller's actors
//! read, so `explain` answers with the read layer the controller runs (`view`: the snapshot
//! builder, catalog and disruption view), from a one-off list instead of watches; nothing is
//! written and no actor is built.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::Error;
use crate::api::decode::Lenient;
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodeclass::ClusterAPINodeClass;
use crate::api::nodeoverlay::NodeOverlay;
use crate::api::nodepool::NodePool;
use crate::api::wellknown::CLUSTER_NAME_LABEL;
use crate::capi::model::{Machine, MachineDeployment};
use crate::capi::offerings::{self, Context as OfferingContext};
use crate::capi::scalable::{ScalableKind, ScalableRef};
use crate::capi::template::TemplateCapacity;
use crate::capi::template::{ReadError, read_templates};
use crate::capi::version::{self, CapiVersion};
use crate::state::State;
use crate::state::compact::CompactNode;
use crate::state::feed::Index;
use crate::view::catalog::{CatalogView, LeftOut, apply_overlays, resolve_nodeclass};
use crate::view::{Inputs, Settings};

/// What one NodeClass resolves to, as the Catalog actor would publish it.
pub struct Resolved {
    pub nodeclass: Arc<ClusterAPINodeClass>,
    pub catalog: offerings::Catalog,
    pub ready: Result<(), String>,
}

/// The cluster as read once.
pub struct Cluster {
    /// The controller's indexes, filled from the lists.
    pub state: State,
    /// The catalog as the Catalog actor would publish it.
    pub catalog: CatalogView,
    pub settings: Settings,
    pub nodeclasses: BTreeMap<String, Resolved>,
    /// Every MachineDeployment read (within the namespace and cluster flags).
    pub deployments: Vec<Arc<MachineDeployment>>,
    /// Template capacity read per MachineDeployment key.
    pub templates: HashMap<String, TemplateCapacity>,
    /// Template reads that failed, per MachineDeployment key (annotations then stand alone).
    pub template_errors: HashMap<String, String>,
    /// Objects the types could not decode: (kind, name, why).
    pub malformed: Vec<(String, String, String)>,
    /// MachineDeployments `--cluster-name` leaves out: (`namespace/name`, why).
    pub excluded: Vec<(String, String)>,
}

impl Cluster {
    /// The plain view the read layer's projections take.
    pub fn view(&self) -> Inputs<'_> {
        Inputs {
            state: &self.state,
            catalog: &self.catalog,
            settings: &self.settings,
        }
    }
}

/// What the management cluster holds, as the controller's watches see it.
pub struct CapiObjects {
    pub version: CapiVersion,
    pub deployments: Vec<MachineDeployment>,
    pub machines: Vec<Machine>,
    /// MachineDeployments the model cannot read: (`namespace/name`, why). Reported, never
    /// fatal, as the controller keeps serving the others.
    pub unreadable: Vec<(String, String)>,
    /// MachineDeployments of the namespace that `--cluster-name` leaves out: (`namespace/name`,
    /// why), so a wrong or unlabelled cluster name is named instead of looking like an empty
    /// cluster.
    pub excluded: Vec<(String, String)>,
    /// The Clusters (`namespace/name`) Cluster API's pause holds.
    pub paused_clusters: BTreeSet<String>,
    /// By Cluster, the topology entries that set replicas (`capi::topology`).
    pub topology_replicas: BTreeMap<String, BTreeSet<crate::capi::topology::Entry>>,
}

/// Why `--cluster-name` leaves out an object with these labels, or None if it keeps it. The
/// controller's watches select by the label (Cluster API's webhooks set it from
/// `spec.clusterName`), so this names the label, not the spec field.
pub fn cluster_filter(
    cluster_name: Option<&str>,
    labels: &BTreeMap<String, String>,
) -> Option<String> {
    let want = cluster_name?;
    match labels.get(CLUSTER_NAME_LABEL) {
        Some(have) if have == want => None,
        Some(have) => Some(format!(
            "left out by --cluster-name {want}: its {CLUSTER_NAME_LABEL} label is {have:?}"
        )),
        None => Some(format!(
            "left out by --cluster-name {want}: it has no {CLUSTER_NAME_LABEL} label (Cluster \
             API's webhook sets it from spec.clusterName; is its webhook running?)"
        )),
    }
}

/// The Cluster API objects of the management cluster (MachineDeployments and, where served,
/// MachinePools), as the controller's watches see them
/// (same namespace and cluster-name filters).
pub async fn read_capi(
    management: &kube::Client,
    forced: Option<CapiVersion>,
    namespace: Option<&str>,
    cluster_name: Option<&str>,
) -> Result<CapiObjects, Error> {
    let v = version::discover(management, forced)
        .await
        .map_err(|e| Error::Capi(e.to_string()))?;
    let api = |ar: &kube::discovery::ApiResource| -> Api<DynamicObject> {
        match namespace {
            Some(ns) => Api::namespaced_with(management.clone(), ns, ar),
            None => Api::all_with(management.clone(), ar),
        }
    };
    // Everything in the namespace is listed and the cluster filter applied here, so that what it
    // leaves out can be named.
    let lp = ListParams::default();
    let list_err = |what: &'static str| move |e: kube::Error| Error::List { what, source: e };
    let mut scalables = Vec::new();
    for kind in ScalableKind::ALL {
        match api(&kind.resource(v)).list(&lp).await {
            Ok(list) => scalables.extend(list.items.into_iter().map(|o| (kind, o))),
            // An optional kind (MachinePools: a feature gate) not served is none.
            Err(kube::Error::Api(s)) if s.code == 404 && kind.optional() => {}
            Err(e) => {
                return Err(Error::List {
                    what: kind.watch_name(),
                    source: e,
                });
            }
        }
    }
    let machines = api(&version::machine_resource(v))
        .list(&lp)
        .await
        .map_err(list_err("Machines"))?;
    let clusters = read_clusters(management, v, namespace, cluster_name).await?;
    let mut deployments = Vec::new();
    let mut unreadable = Vec::new();
    let mut excluded = Vec::new();
    for (kind, o) in &scalables {
        let key = ScalableRef::new(*kind, &o.namespace().unwrap_or_default(), &o.name_any()).key();
        if let Some(why) = cluster_filter(cluster_name, o.labels()) {
            excluded.push((key, why));
            continue;
        }
        match kind.parser()(o, v) {
            Ok(md) => deployments.push(md),
            Err(e) => unreadable.push((key, e.to_string())),
        }
    }
    Ok(CapiObjects {
        version: v,
        deployments,
        machines: machines
            .items
            .iter()
            .filter(|o| cluster_filter(cluster_name, o.labels()).is_none())
            .filter_map(|o| Machine::from_dynamic(o, v).ok())
            .collect(),
        unreadable,
        excluded,
        paused_clusters: clusters
            .iter()
            .filter(|c| crate::capi::autoscaler::cluster_paused(c))
            .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
            .collect(),
        topology_replicas: clusters
            .iter()
            .map(|c| {
                let key = format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any());
                (key, crate::capi::topology::entries_with_replicas(c))
            })
            .filter(|(_, entries)| !entries.is_empty())
            .collect(),
    })
}

/// The Clusters the controller follows (their pause and topology), as its watch selects them;
/// none where Clusters are not served (Cluster API's core CRDs without the Cluster kind).
async fn read_clusters(
    management: &kube::Client,
    v: CapiVersion,
    namespace: Option<&str>,
    cluster_name: Option<&str>,
) -> Result<Vec<DynamicObject>, Error> {
    let ar = v.cluster();
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(management.clone(), ns, &ar),
        None => Api::all_with(management.clone(), &ar),
    };
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list
            .items
            .into_iter()
            .filter(|c| cluster_name.is_none_or(|want| c.name_any() == want))
            .collect()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        // A reader without access to Clusters still gets the rest explained.
        Err(kube::Error::Api(s)) if s.code == 403 => {
            tracing::warn!(error = %s.message, "Clusters cannot be listed: their pause and topology are not shown");
            Ok(Vec::new())
        }
        Err(e) => Err(Error::List {
            what: "Clusters",
            source: e,
        }),
    }
}

/// Every object of a kind, in all namespaces when it is namespaced.
async fn list_all<K>(client: &kube::Client, what: &'static str) -> Result<Vec<K>, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(|source| Error::List { what, source })?
        .items)
}

/// Where a kind is listed: the client of its cluster, and the label selector of this Cluster's
/// objects when they are in the management cluster.
type KarpenterSource = (kube::Client, Option<String>);

/// Karpenter's objects' source: the management cluster's client and this Cluster's binding with
/// `--karpenter-objects management`, the workload cluster's otherwise.
fn karpenter_source(
    workload: &kube::Client,
    management: &kube::Client,
    settings: &crate::actors::Settings,
) -> KarpenterSource {
    match &settings.karpenter_objects {
        Some(b) => (management.clone(), Some(b.selector())),
        None => (workload.clone(), None),
    }
}

/// Lists the Karpenter objects one by one leniently: an object the types cannot decode is
/// reported, not fatal (the controller serves the rest too).
async fn list_lenient<K>(
    (client, selector): &KarpenterSource,
    what: &'static str,
    malformed: &mut Vec<(String, String, String)>,
) -> Result<Vec<K>, Error>
where
    K: Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let items: Vec<Lenient<K>> = {
        let api: Api<Lenient<K>> = Api::all(client.clone());
        let params = match selector {
            Some(s) => ListParams::default().labels(s),
            None => ListParams::default(),
        };
        api.list(&params)
            .await
            .map_err(|source| Error::List { what, source })?
            .items
    };
    let mut out = Vec::new();
    for i in items {
        match i {
            Lenient::Ok(k) => out.push(k),
            Lenient::Bad(m) => malformed.push((
                what.to_string(),
                m.metadata.name.clone().unwrap_or_default(),
                m.message(),
            )),
        }
    }
    Ok(out)
}

/// The controller's state as its watches would hold it after a list of each kind.
fn state_of(
    capi: CapiObjects,
    claims: Vec<NodeClaim>,
    nodes: Vec<Node>,
    pods: Vec<Pod>,
    daemonsets: Vec<DaemonSet>,
    pdbs: Vec<PodDisruptionBudget>,
    nodepools: Vec<NodePool>,
) -> State {
    let state = State::default();
    state.machines.write().replace_all(capi.machines);
    {
        let mut deployments = state.deployments.write();
        deployments.replace_all(
            crate::capi::ScalableKind::MachineDeployment,
            capi.deployments,
        );
        deployments.set_paused_clusters(capi.paused_clusters);
        deployments.set_topology_replicas(capi.topology_replicas);
    }
    state.claims.write().replace_all(claims);
    state
        .nodes
        .write()
        .replace_all(nodes.into_iter().map(CompactNode::new).collect());
    state.pods.write().replace_all(pods);
    state.daemonsets.write().replace_all(daemonsets);
    Index::reset(
        &mut *state.pdbs.write(),
        pdbs.into_iter().map(Arc::new).collect(),
    );
    Index::reset(
        &mut *state.nodepools.write(),
        nodepools.into_iter().map(Lenient::Ok).collect(),
    );
    state
}

/// Each NodeClass resolved as the Catalog actor resolves it (the same `resolve_nodeclass`,
/// then the NodeOverlays), from a one-off read: the catalog view, each NodeClass's result, and
/// the template errors as text.
fn resolve_all(
    state: &State,
    nodeclasses: Vec<ClusterAPINodeClass>,
    deployments: &[Arc<MachineDeployment>],
    templates: &HashMap<String, TemplateCapacity>,
    template_errors: HashMap<String, ReadError>,
    overlays: &[NodeOverlay],
) -> (
    CatalogView,
    BTreeMap<String, Resolved>,
    HashMap<String, String>,
) {
    let missing_templates: HashMap<String, String> = template_errors
        .iter()
        .filter(|(_, e)| matches!(e, ReadError::NotFound { .. }))
        .map(|(k, e)| (k.clone(), e.to_string()))
        .collect();
    let template_errors: HashMap<String, String> = template_errors
        .into_iter()
        .map(|(k, e)| (k, e.to_string()))
        .collect();
    // Launch failures mark offerings unavailable in the controller's memory only; a one-off
    // read cannot see them (max-size is seen).
    let never = |_: &str| false;
    let cx = OfferingContext {
        templates,
        unavailable: &never,
    };
    let (unreadable, replicas_held) = {
        let deployments = state.deployments.read();
        let held: HashMap<String, String> = deployments
            .all()
            .filter_map(|md| Some((md.key(), deployments.replicas_held(md)?)))
            .collect();
        (deployments.unreadable().clone(), held)
    };
    // A one-off read answers every template: none is unread, and a failing one has never
    // been read.
    let unread_templates = HashSet::new();
    let left_out = LeftOut {
        unreadable: &unreadable,
        missing_templates: &missing_templates,
        unread_templates: &unread_templates,
        failing_templates: &template_errors,
        replicas_held: &replicas_held,
        generation_refused: &HashMap::new(),
    };
    let mut each: Vec<(ClusterAPINodeClass, offerings::Catalog, Result<(), String>)> = nodeclasses
        .into_iter()
        .map(|nc| {
            let (c, ready) = resolve_nodeclass(&nc, deployments, &left_out, &cx);
            (nc, c, ready)
        })
        .collect();
    let refs: Vec<&NodeOverlay> = overlays.iter().collect();
    let names: Vec<String> = each.iter().map(|(nc, _, _)| nc.name_any()).collect();
    let catalogs: Vec<(&str, &mut offerings::Catalog)> = names
        .iter()
        .map(String::as_str)
        .zip(each.iter_mut().map(|(_, c, _)| c))
        .collect();
    let pools: Vec<Arc<NodePool>> = state.nodepools.read().values().cloned().collect();
    let (_, by_pool) = apply_overlays(&refs, catalogs, &pools);
    let catalog = CatalogView::default();
    catalog.publish_pools(by_pool);
    let mut resolved = BTreeMap::new();
    for (nc, c, ready) in each {
        catalog.insert(&nc.name_any(), c.clone(), nc.create_timeout());
        resolved.insert(
            nc.name_any(),
            Resolved {
                nodeclass: Arc::new(nc),
                catalog: c,
                ready,
            },
        );
    }
    (catalog, resolved, template_errors)
}

/// The NodeOverlays, or none where the API does not serve them (a cluster without the CRD).
async fn list_overlays(
    client: &KarpenterSource,
    malformed: &mut Vec<(String, String, String)>,
) -> Result<Vec<NodeOverlay>, Error> {
    match list_lenient(client, "NodeOverlays", malformed).await {
        Err(Error::List {
            source: kube::Error::Api(e),
            ..
        }) if e.code == 404 => Ok(Vec::new()),
        other => other,
    }
}

/// The CapacityQuotas (with the gate on), or none where the API does not serve them (no CRD)
/// or this reader may not list them: a pod is then explained without them.
async fn list_quotas(
    client: &KarpenterSource,
    malformed: &mut Vec<(String, String, String)>,
) -> Result<Vec<crate::api::capacity_quota::CapacityQuota>, Error> {
    match list_lenient(client, "CapacityQuotas", malformed).await {
        Err(Error::List {
            source: kube::Error::Api(e),
            ..
        }) if e.code == 404 || e.code == 403 => {
            tracing::warn!(error = %e.message, "CapacityQuotas cannot be listed: pods are explained without them");
            Ok(Vec::new())
        }
        other => other,
    }
}

/// Read everything the controller watches and build its state from it.
pub async fn read(
    workload: kube::Client,
    management: kube::Client,
    forced: Option<CapiVersion>,
    settings: Settings,
) -> Result<Cluster, Error> {
    let mut malformed = Vec::new();
    let mut capi = read_capi(
        &management,
        forced,
        settings.capi_namespace.as_deref(),
        settings.cluster_name.as_deref(),
    )
    .await?;
    for (md, why) in &capi.unreadable {
        malformed.push(("MachineDeployment".into(), md.clone(), why.clone()));
    }
    let excluded = std::mem::take(&mut capi.excluded);
    // Karpenter's objects where the controller reads them (`view::binding`).
    let k = &karpenter_source(&workload, &management, &settings);
    let nodepools: Vec<NodePool> = list_lenient(k, "NodePools", &mut malformed).await?;
    let claims: Vec<NodeClaim> = list_lenient(k, "NodeClaims", &mut malformed).await?;
    let nodeclasses: Vec<ClusterAPINodeClass> =
        list_lenient(k, "ClusterAPINodeClasses", &mut malformed).await?;
    let nodes: Vec<Node> = list_all(&workload, "Nodes").await?;
    let pods: Vec<Pod> = list_all(&workload, "Pods").await?;
    let daemonsets: Vec<DaemonSet> = list_all(&workload, "DaemonSets").await?;
    let pdbs: Vec<PodDisruptionBudget> = list_all(&workload, "PodDisruptionBudgets").await?;

    let state = state_of(capi, claims, nodes, pods, daemonsets, pdbs, nodepools);
    if settings.capacity_quotas {
        let quotas = list_quotas(&(workload.clone(), None), &mut malformed).await?;
        let quotas = quotas.into_iter().map(Lenient::Ok).collect();
        Index::reset(&mut *state.quotas.write(), quotas);
    }
    let deployments: Vec<Arc<MachineDeployment>> =
        state.deployments.read().all().cloned().collect();
    let (templates, template_errors) = read_templates(&management, &deployments).await;
    // The prices and capacity the Catalog actor publishes are after the NodeOverlays.
    let overlays = list_overlays(k, &mut malformed).await?;
    let (catalog, resolved, template_errors) = resolve_all(
        &state,
        nodeclasses,
        &deployments,
        &templates,
        template_errors,
        &overlays,
    );
    Ok(Cluster {
        state,
        catalog,
        settings,
        nodeclasses: resolved,
        deployments,
        templates,
        template_errors,
        malformed,
        excluded,
    })
}
