//! The instance-type catalog. The Catalog actor watches ClusterAPINodeClasses, reads
//! infrastructure templates, rebuilds each NodeClass's instance types when a MachineDeployment or
//! NodeClass changes (never on a timer) and publishes them as an immutable snapshot in a
//! `CatalogView`; claims and the provisioner read that view directly, like any other index.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::StreamExt;
use jiff::Timestamp;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use parking_lot::RwLock;
use serde_json::json;

use super::Shared;
use super::backoff::Backoff;
use super::decode::{Lenient, Malformed};
use super::patch::write_conditions;
use super::tracked::Tracked;
use crate::api::conditions::{self, ConditionStatus};
use crate::api::nodeclass::ClusterAPINodeClass;
use crate::api::requirements::Requirements;
use crate::api::resources::Resources;
use crate::capi::model::{LabelSelector, MachineDeployment};
use crate::capi::offerings::{self, Context as OfferingContext};
use crate::capi::template::TemplateCapacity;
use crate::capi::version;
use crate::scheduling::InstanceType;

/// The offering a claim launches from, with what its node will look like.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub machine_deployment: String,
    pub instance_type: String,
    pub zone: Option<String>,
    pub capacity_type: String,
    pub price: f64,
    pub capacity: Resources,
    pub allocatable: Resources,
    pub labels: std::collections::BTreeMap<String, String>,
}

impl Choice {
    /// The labels Karpenter writes on a claim at launch: the well-known ones of the offering.
    pub fn node_labels(&self) -> Vec<(String, String)> {
        use crate::api::wellknown::*;
        [
            INSTANCE_TYPE_LABEL,
            ZONE_LABEL,
            CAPACITY_TYPE_LABEL,
            ARCH_LABEL,
            OS_LABEL,
        ]
        .iter()
        .filter_map(|k| self.labels.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("ClusterAPINodeClass {0} not found")]
    NodeClassNotFound(String),
    #[error("ClusterAPINodeClass {name} is not ready: {message}")]
    NodeClassNotReady { name: String, message: String },
    #[error("invalid NodeClaim: {0}")]
    Invalid(String),
    #[error("no available offering of ClusterAPINodeClass {nodeclass} is compatible: {details}")]
    NoCompatibleOffering { nodeclass: String, details: String },
}

impl ResolveError {
    /// Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            ResolveError::NodeClassNotFound(_) => "NodeClassNotFound",
            ResolveError::NodeClassNotReady { .. } => "NodeClassNotReady",
            ResolveError::Invalid(_) => "InvalidNodeClaim",
            ResolveError::NoCompatibleOffering { .. } => "InsufficientCapacity",
        }
    }
}

#[derive(Clone)]
struct Entry {
    catalog: Arc<offerings::Catalog>,
    create_timeout: Option<Duration>,
    ready: Result<(), String>,
}

#[derive(Default)]
struct Inner {
    by_nodeclass: HashMap<String, Entry>,
    unavailable: HashMap<String, Instant>,
}

/// Read side of the catalog, shared by every actor.
#[derive(Clone, Default)]
pub struct CatalogView {
    inner: Arc<RwLock<Inner>>,
}

impl CatalogView {
    pub fn mark_unavailable(&self, md: &str, ttl: Duration) {
        self.inner
            .write()
            .unavailable
            .insert(md.to_string(), Instant::now() + ttl);
    }

    pub fn is_unavailable(&self, md: &str) -> bool {
        self.inner
            .read()
            .unavailable
            .get(md)
            .is_some_and(|until| *until > Instant::now())
    }

    pub fn create_timeout(&self, nodeclass: &str) -> Option<Duration> {
        self.inner
            .read()
            .by_nodeclass
            .get(nodeclass)
            .and_then(|e| e.create_timeout)
    }

    pub fn instance_types(&self, nodeclass: &str) -> Vec<InstanceType> {
        let inner = self.inner.read();
        let Some(e) = inner.by_nodeclass.get(nodeclass) else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut types = e.catalog.instance_types.clone();
        for o in types.iter_mut().flat_map(|t| t.offerings.iter_mut()) {
            if inner
                .unavailable
                .get(&o.machine_deployment)
                .is_some_and(|until| *until > now)
            {
                o.available = false;
            }
        }
        types
    }

    pub fn nodeclass_ready(&self, nodeclass: &str) -> Option<Result<(), String>> {
        self.inner
            .read()
            .by_nodeclass
            .get(nodeclass)
            .map(|e| e.ready.clone())
    }

    /// The offering backed by a MachineDeployment (any NodeClass), for a claim's status.
    pub fn offering(&self, md: &str) -> Option<Choice> {
        let inner = self.inner.read();
        inner
            .by_nodeclass
            .values()
            .flat_map(|e| e.catalog.instance_types.iter())
            .find_map(|t| {
                t.offerings
                    .iter()
                    .find(|o| o.machine_deployment == md)
                    .map(|o| choice(t, o))
            })
    }

    /// The cheapest available offering compatible with the claim; ties go to the least-loaded
    /// MachineDeployment.
    pub fn resolve(
        &self,
        nodeclass: &str,
        reqs: &Requirements,
        requests: &Resources,
        excluded: &HashSet<String>,
        declared_taints: &[k8s_openapi::api::core::v1::Taint],
    ) -> Result<Choice, ResolveError> {
        let inner = self.inner.read();
        let Some(entry) = inner.by_nodeclass.get(nodeclass) else {
            return Err(ResolveError::NodeClassNotFound(nodeclass.to_string()));
        };
        if let Err(message) = &entry.ready
            && entry.catalog.instance_types.is_empty()
        {
            return Err(ResolveError::NodeClassNotReady {
                name: nodeclass.to_string(),
                message: message.clone(),
            });
        }
        let now = Instant::now();
        let is_unavailable = |o: &crate::scheduling::Offering| {
            !o.available
                || excluded.contains(&o.machine_deployment)
                || inner
                    .unavailable
                    .get(&o.machine_deployment)
                    .is_some_and(|u| *u > now)
        };
        let ranked = rank(
            &entry.catalog.instance_types,
            reqs,
            requests,
            declared_taints,
            &is_unavailable,
        );
        let count = |fit: Fit| ranked.iter().filter(|r| r.fit == fit).count();
        match ranked.iter().find(|r| r.fit == Fit::Eligible) {
            Some(r) => Ok(choice(r.instance_type, r.offering)),
            None => Err(ResolveError::NoCompatibleOffering {
                nodeclass: nodeclass.to_string(),
                details: format!(
                    "{} offerings incompatible with the requirements or carrying taints the NodePool does not declare, {} too small for the requests, {} unavailable (max-size reached or recently failed)",
                    count(Fit::Incompatible),
                    count(Fit::TooSmall),
                    count(Fit::Unavailable)
                ),
            }),
        }
    }

    fn publish(&self, nodeclass: String, entry: Entry) {
        self.inner.write().by_nodeclass.insert(nodeclass, entry);
    }

    /// Publish a NodeClass's catalog directly (benchmarks and tools that have no Catalog actor).
    pub fn insert(
        &self,
        nodeclass: &str,
        catalog: offerings::Catalog,
        create_timeout: Option<Duration>,
    ) {
        let ready = readiness(&catalog);
        self.publish(
            nodeclass.to_string(),
            Entry {
                catalog: Arc::new(catalog),
                create_timeout,
                ready,
            },
        );
    }

    /// Drop unavailability marks that expired (keyed by MachineDeployment; they would pile up).
    fn forget_unavailable(&self) {
        let now = Instant::now();
        self.inner
            .write()
            .unavailable
            .retain(|_, until| *until > now);
    }

    fn retain(&self, names: &HashSet<String>) {
        self.inner
            .write()
            .by_nodeclass
            .retain(|k, _| names.contains(k));
    }
}

/// How one offering stands for a launch, in the order the launch checks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fit {
    /// The launch may use it.
    Eligible,
    /// Its instance type's allocatable cannot hold the claim's requests.
    TooSmall,
    /// Its labels do not meet the claim's requirements, or its nodes carry taints the claim
    /// does not declare.
    Incompatible,
    /// Max size reached, recently failed, or already turned the claim down.
    Unavailable,
}

/// One offering judged for a launch.
pub struct Ranked<'a> {
    pub instance_type: &'a InstanceType,
    pub offering: &'a crate::scheduling::Offering,
    pub fit: Fit,
    /// Replicas over max size (or replicas, without one): ties on price go to the least loaded.
    pub load: f64,
}

/// Every offering of `types` judged for a claim with `reqs`, `requests` and declared taints,
/// eligible ones first in the launch's order of preference (price, then load, then
/// MachineDeployment name): the first is what a launch takes. Pure: `resolve` and `explain` use
/// it alike.
pub fn rank<'a>(
    types: &'a [InstanceType],
    reqs: &Requirements,
    requests: &Resources,
    declared_taints: &[k8s_openapi::api::core::v1::Taint],
    unavailable: &dyn Fn(&crate::scheduling::Offering) -> bool,
) -> Vec<Ranked<'a>> {
    let mut out: Vec<Ranked<'a>> = Vec::new();
    for t in types {
        let fits = requests.fits(&t.allocatable());
        for o in &t.offerings {
            let fit = if !fits {
                Fit::TooSmall
            } else if Requirements::from_labels(&o.labels)
                .compatible(reqs)
                .is_err()
                || !crate::scheduling::instance_type::taints_declared(o, declared_taints)
            {
                Fit::Incompatible
            } else if unavailable(o) {
                Fit::Unavailable
            } else {
                Fit::Eligible
            };
            let load = match o.max_size {
                Some(max) if max > 0 => f64::from(o.replicas) / f64::from(max),
                _ => f64::from(o.replicas),
            };
            out.push(Ranked {
                instance_type: t,
                offering: o,
                fit,
                load,
            });
        }
    }
    out.sort_by(|a, b| {
        (a.fit != Fit::Eligible)
            .cmp(&(b.fit != Fit::Eligible))
            .then_with(|| a.offering.price.total_cmp(&b.offering.price))
            .then_with(|| a.load.total_cmp(&b.load))
            .then_with(|| {
                a.offering
                    .machine_deployment
                    .cmp(&b.offering.machine_deployment)
            })
    });
    out
}

fn choice(t: &InstanceType, o: &crate::scheduling::Offering) -> Choice {
    Choice {
        machine_deployment: o.machine_deployment.clone(),
        instance_type: t.name.clone(),
        zone: o.zone.clone(),
        capacity_type: o.capacity_type.clone(),
        price: o.price,
        capacity: t.capacity.clone(),
        allocatable: t.allocatable(),
        labels: o.labels.clone(),
    }
}

/// MachineDeployments changed: rebuild (coalesced).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Rebuild;

/// Wait until the first rebuild after the NodeClass list has synced.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Synced;

/// A MachineDeployment that changed re-reads its template at most this often: templates are
/// small, but a scale-up changes a MachineDeployment's status many times a second.
const TEMPLATE_REREAD_MIN: Duration = Duration::from_secs(5);

/// What we last read of one MachineDeployment's infrastructure template.
struct TemplateRead {
    /// The reference it was read through (group/version/kind/name).
    ref_id: String,
    /// The MachineDeployment's resourceVersion when it was read (re-read when it changes).
    md_version: String,
    read_at: Instant,
    capacity: TemplateCapacity,
    /// Set while reads fail: when to try again (a transient error is never cached for good).
    retry_at: Option<Instant>,
    backoff: Backoff,
}

pub struct Catalog {
    shared: Arc<Shared>,
    nodeclasses: HashMap<String, Arc<ClusterAPINodeClass>>,
    /// By MachineDeployment key.
    templates: HashMap<String, TemplateRead>,
    fetching: HashSet<String>,
    /// A rebuild is already scheduled for a template re-read that is not due yet.
    reread_scheduled: bool,
    rebuild_scheduled: bool,
    synced: bool,
    /// A catalog has been published since the NodeClass list synced.
    built: bool,
    /// Problems already reported per NodeClass (so each is one Event, not one per rebuild).
    reported: HashMap<String, HashSet<String>>,
    /// NodeClasses the types cannot decode: published as not ready (so their NodePools say
    /// why), with `Ready=False` naming the field.
    malformed: HashMap<String, Malformed>,
}

impl Catalog {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            nodeclasses: HashMap::new(),
            templates: HashMap::new(),
            fetching: HashSet::new(),
            reread_scheduled: false,
            rebuild_scheduled: false,
            synced: false,
            built: false,
            reported: HashMap::new(),
            malformed: HashMap::new(),
        }
    }

    fn schedule_rebuild(&mut self, ctx: &mut Context<Self>) {
        if self.rebuild_scheduled {
            return;
        }
        self.rebuild_scheduled = true;
        // A short coalescing delay: a burst of MachineDeployment status updates is one rebuild.
        ctx.run_later(Duration::from_millis(20), |act, ctx| {
            act.rebuild_scheduled = false;
            act.rebuild(ctx);
        });
    }

    fn rebuild(&mut self, ctx: &mut Context<Self>) {
        let mds: Vec<Arc<MachineDeployment>> = self
            .shared
            .state
            .deployments
            .read()
            .all()
            .cloned()
            .collect();
        self.fetch_missing_templates(&mds, ctx);
        let templates: HashMap<String, TemplateCapacity> = self
            .templates
            .iter()
            .map(|(k, t)| (k.clone(), t.capacity.clone()))
            .collect();
        let view = self.shared.catalog.clone();
        let unavailable = |md: &str| view.is_unavailable(md);
        let cx = OfferingContext {
            templates: &templates,
            unavailable: &unavailable,
        };
        let mut names: HashSet<String> = self.nodeclasses.keys().cloned().collect();
        let bad: Vec<Malformed> = self.malformed.values().cloned().collect();
        for m in bad {
            let Some(name) = m.metadata.name.clone() else {
                continue;
            };
            let message = format!("cannot be read: {}", m.message());
            self.update_malformed_status(&m, &message, ctx);
            self.shared.catalog.publish(
                name.clone(),
                Entry {
                    catalog: Arc::new(offerings::Catalog::default()),
                    create_timeout: None,
                    ready: Err(message),
                },
            );
            names.insert(name);
        }
        let nodeclasses: Vec<(String, Arc<ClusterAPINodeClass>)> = self
            .nodeclasses
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (name, nc) in &nodeclasses {
            let (catalog, ready) = resolve_nodeclass(nc, &mds, &cx);
            self.update_status(nc, &catalog, &ready, ctx);
            self.report_problems(nc, &catalog.problems);
            self.shared.catalog.publish(
                name.clone(),
                Entry {
                    catalog: Arc::new(catalog),
                    create_timeout: nc.create_timeout(),
                    ready,
                },
            );
        }
        self.shared.catalog.retain(&names);
        self.reported.retain(|k, _| names.contains(k));
        self.shared.catalog.forget_unavailable();
        self.built = self.synced;
        self.shared.router.provisioner_poke();
        self.shared.router.nodepools_changed();
    }

    /// Read each MachineDeployment's infrastructure template: first when it appears, again
    /// when its reference changes, when the MachineDeployment changes (a provider fills a
    /// template's status.capacity after the fact; at most every TEMPLATE_REREAD_MIN), and,
    /// while reads fail, after a backoff. A template that cannot be read leaves the annotations
    /// in charge (or the last capacity read). Entries of MachineDeployments that are gone go.
    fn fetch_missing_templates(&mut self, mds: &[Arc<MachineDeployment>], ctx: &mut Context<Self>) {
        let live: HashSet<String> = mds.iter().map(|md| md.key()).collect();
        self.templates.retain(|k, _| live.contains(k));
        let now = Instant::now();
        let mut next_due: Option<Instant> = None;
        for md in mds {
            let key = md.key();
            let r = &md.infrastructure_ref;
            let ref_id = format!(
                "{}/{}/{}/{}",
                r.api_group,
                r.version.clone().unwrap_or_default(),
                r.kind,
                r.name
            );
            let due = match self.templates.get(&key) {
                None => Some(now),
                Some(t) if t.ref_id != ref_id => Some(now),
                Some(t) => match t.retry_at {
                    Some(at) => Some(at),
                    None if t.md_version != md.resource_version => {
                        Some(t.read_at + TEMPLATE_REREAD_MIN)
                    }
                    None => None,
                },
            };
            let Some(due) = due else { continue };
            if due > now {
                next_due = Some(next_due.map_or(due, |n| n.min(due)));
                continue;
            }
            if !self.fetching.insert(key.clone()) {
                continue;
            }
            let client = self.shared.management.clone();
            let (group, kind, name, ns) = (
                r.api_group.clone(),
                r.kind.clone(),
                r.name.clone(),
                md.namespace.clone(),
            );
            let pinned = r.version.clone();
            let md_version = md.resource_version.clone();
            let fut =
                async move { read_template(&client, &group, pinned, &kind, &ns, &name).await };
            ctx.spawn(fut.into_actor(self).map(move |r, act, ctx| {
                act.fetching.remove(&key);
                let previous = act.templates.remove(&key);
                let same_ref = previous.as_ref().is_some_and(|p| p.ref_id == ref_id);
                let (capacity, mut backoff) = match previous {
                    Some(p) if same_ref => (p.capacity, p.backoff),
                    _ => (TemplateCapacity::default(), Backoff::new(Duration::from_secs(1), Duration::from_secs(120))),
                };
                match r {
                    Ok(t) => {
                        backoff.reset();
                        let changed = !same_ref || t != capacity;
                        act.templates.insert(key, TemplateRead { ref_id, md_version, read_at: Instant::now(), capacity: t, retry_at: None, backoff });
                        if changed {
                            act.schedule_rebuild(ctx);
                        }
                    }
                    Err(e) => {
                        let delay = backoff.next_delay();
                        tracing::debug!(machine_deployment = %key, error = %e, retry_in = ?delay, "infrastructure template not readable; using annotations (or the last capacity read) and retrying");
                        act.templates.insert(key, TemplateRead { ref_id, md_version, read_at: Instant::now(), capacity, retry_at: Some(Instant::now() + delay), backoff });
                        ctx.run_later(delay, |act, ctx| act.schedule_rebuild(ctx));
                    }
                }
            }));
        }
        if let Some(due) = next_due
            && !self.reread_scheduled
        {
            self.reread_scheduled = true;
            ctx.run_later(due.saturating_duration_since(now), |act, ctx| {
                act.reread_scheduled = false;
                act.schedule_rebuild(ctx);
            });
        }
    }

    /// A MachineDeployment left out of a usable NodeClass (Ready stays True) is still something
    /// an operator must see: one Warning Event on the NodeClass per new problem, naming the
    /// MachineDeployment and the annotation.
    fn report_problems(&mut self, nc: &ClusterAPINodeClass, problems: &[String]) {
        let name = nc.name_any();
        let seen = self.reported.entry(name.clone()).or_default();
        for p in problems {
            if seen.insert(p.clone()) {
                tracing::warn!(nodeclass = %name, problem = %p, "MachineDeployment left out of the catalog");
                self.shared.events.warning(
                    nc.object_ref(&()),
                    "InvalidMachineDeployment",
                    p.clone(),
                );
            }
        }
        seen.retain(|p| problems.contains(p));
    }

    /// A NodeClass that does not decode: `Ready=False` (reason `ValidationFailed`) with the
    /// field and the decoder's reason, and one Event when that changes.
    fn update_malformed_status(&mut self, m: &Malformed, message: &str, ctx: &mut Context<Self>) {
        let Some(name) = m.metadata.name.clone() else {
            return;
        };
        let current: Vec<conditions::Condition> = m
            .conditions
            .clone()
            .and_then(|c| serde_json::from_value(c).ok())
            .unwrap_or_default();
        let mut conds = current.clone();
        conditions::set(
            &mut conds,
            conditions::READY,
            ConditionStatus::False,
            "ValidationFailed",
            message,
            m.metadata.generation,
            Timestamp::now(),
        );
        let seen = self.reported.entry(name.clone()).or_default();
        if seen.insert(message.to_string()) {
            seen.retain(|p| p == message);
            self.shared.events.warning(
                m.object_ref::<ClusterAPINodeClass>(),
                "ValidationFailed",
                format!("ClusterAPINodeClass {name} {message}"),
            );
        }
        if conds == current && m.conditions.is_some() {
            return;
        }
        ctx.spawn(
            write_conditions::<ClusterAPINodeClass>(
                self.shared.workload.clone(),
                name,
                json!(conds),
            )
            .into_actor(self),
        );
    }

    /// ClusterAPINodeClass status: Ready with what it resolves to, or why not.
    fn update_status(
        &self,
        nc: &ClusterAPINodeClass,
        catalog: &offerings::Catalog,
        ready: &Result<(), String>,
        ctx: &mut Context<Self>,
    ) {
        let (status, reason, message) = match ready {
            Ok(()) => (
                ConditionStatus::True,
                "Ready",
                format!(
                    "Resolved {} MachineDeployments into {} instance types",
                    catalog.deployments.len(),
                    catalog.instance_types.len()
                ),
            ),
            Err(m) => (ConditionStatus::False, not_ready_reason(catalog), m.clone()),
        };
        let mut conds = nc
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let changed = conditions::set(
            &mut conds,
            conditions::READY,
            status,
            reason,
            &message,
            nc.metadata.generation,
            Timestamp::now(),
        );
        if !changed {
            return;
        }
        if status == ConditionStatus::False {
            self.shared
                .events
                .warning(nc.object_ref(&()), reason, message.clone());
        }
        let name = nc.name_any();
        ctx.spawn(
            write_conditions::<ClusterAPINodeClass>(
                self.shared.workload.clone(),
                name,
                json!(conds),
            )
            .into_actor(self),
        );
    }
}

/// What one NodeClass resolves to, and whether it is ready (the Catalog actor publishes this;
/// `explain` computes it the same way from a one-off read).
pub fn resolve_nodeclass(
    nc: &ClusterAPINodeClass,
    mds: &[Arc<MachineDeployment>],
    cx: &OfferingContext<'_>,
) -> (offerings::Catalog, Result<(), String>) {
    let selector = nc
        .spec
        .scalable_resource_selector
        .as_ref()
        .map(LabelSelector::try_from);
    match selector.transpose() {
        Err(e) => (
            offerings::Catalog::default(),
            Err(format!("spec.scalableResourceSelector: {e}")),
        ),
        Ok(sel) => {
            let c = offerings::build(sel.as_ref(), mds, cx);
            let ready = readiness(&c);
            (c, ready)
        }
    }
}

/// Read a MachineDeployment's infrastructure template's capacity (`group`, `kind`, `name` in
/// namespace `ns`); the version is discovered unless the reference pins one.
pub async fn read_template(
    client: &kube::Client,
    group: &str,
    pinned: Option<String>,
    kind: &str,
    ns: &str,
    name: &str,
) -> Result<TemplateCapacity, String> {
    let ver = match pinned {
        Some(v) => v,
        None => version::infrastructure_version(client, group)
            .await
            .map_err(|e| e.to_string())?,
    };
    let ar = version::infrastructure_template_resource(group, &ver, kind);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let obj = api.get(name).await.map_err(|e| match e {
        // The server's own message ("... not found") rather than the whole Status.
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        e => e.to_string(),
    })?;
    TemplateCapacity::from_dynamic(&obj).map_err(|e| e.to_string())
}

/// The template capacity of every MachineDeployment that has a readable one (one-off reads for
/// tools; the Catalog actor caches and re-reads on its own schedule).
pub async fn read_templates(
    client: &kube::Client,
    mds: &[Arc<MachineDeployment>],
) -> (HashMap<String, TemplateCapacity>, HashMap<String, String>) {
    let mut ok = HashMap::new();
    let mut failed = HashMap::new();
    for md in mds {
        let r = &md.infrastructure_ref;
        match read_template(
            client,
            &r.api_group,
            r.version.clone(),
            &r.kind,
            &md.namespace,
            &r.name,
        )
        .await
        {
            Ok(t) => {
                ok.insert(md.key(), t);
            }
            Err(e) => {
                failed.insert(md.key(), e);
            }
        }
    }
    (ok, failed)
}

fn readiness(c: &offerings::Catalog) -> Result<(), String> {
    if c.deployments.is_empty() {
        let mut m = "selects no usable MachineDeployment (a MachineDeployment needs the node.cluster.x-k8s.io/karpenter-member label and must match spec.scalableResourceSelector)".to_string();
        if !c.problems.is_empty() {
            m.push_str(": ");
            m.push_str(&c.problems.join("; "));
        }
        return Err(m);
    }
    Ok(())
}

fn not_ready_reason(c: &offerings::Catalog) -> &'static str {
    if c.problems.is_empty() {
        "NoMachineDeployments"
    } else {
        "InvalidMachineDeployments"
    }
}

impl Actor for Catalog {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Per-object decoding: one NodeClass the types cannot read must not stop the watch.
        let api: Api<Lenient<ClusterAPINodeClass>> = Api::all(self.shared.workload.clone());
        ctx.add_stream(watcher(api, watcher::Config::default()).default_backoff());
    }
}

impl StreamHandler<Result<watcher::Event<Lenient<ClusterAPINodeClass>>, watcher::Error>>
    for Catalog
{
    fn handle(
        &mut self,
        ev: Result<watcher::Event<Lenient<ClusterAPINodeClass>>, watcher::Error>,
        ctx: &mut Self::Context,
    ) {
        match ev {
            Ok(watcher::Event::Apply(Lenient::Ok(nc)))
            | Ok(watcher::Event::InitApply(Lenient::Ok(nc))) => {
                self.malformed.remove(&nc.name_any());
                self.nodeclasses.insert(nc.name_any(), Arc::new(nc));
            }
            Ok(watcher::Event::Apply(Lenient::Bad(m)))
            | Ok(watcher::Event::InitApply(Lenient::Bad(m))) => {
                let name = m.metadata.name.clone().unwrap_or_default();
                tracing::warn!(nodeclass = %name, problem = %m, "ClusterAPINodeClass cannot be decoded");
                self.nodeclasses.remove(&name);
                self.malformed.insert(name, *m);
            }
            Ok(watcher::Event::Delete(nc)) => {
                self.nodeclasses.remove(&nc.name_any());
                self.malformed.remove(&nc.name_any());
            }
            Ok(watcher::Event::Init) => {
                self.nodeclasses.clear();
                self.malformed.clear();
            }
            Ok(watcher::Event::InitDone) => self.synced = true,
            Err(e) => {
                tracing::warn!(error = %e, "ClusterAPINodeClass watch failed; retrying");
                return;
            }
        }
        if self.synced {
            self.schedule_rebuild(ctx);
        }
    }
}

impl Handler<Rebuild> for Catalog {
    type Result = ();
    fn handle(&mut self, _: Rebuild, ctx: &mut Self::Context) {
        if self.synced {
            self.schedule_rebuild(ctx);
        }
    }
}

impl Handler<Tracked> for Catalog {
    type Result = MessageResult<Tracked>;
    fn handle(&mut self, _: Tracked, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            [
                ("templates", self.templates.len()),
                ("fetching", self.fetching.len()),
                ("reported", self.reported.len()),
                ("nodeclasses", self.nodeclasses.len()),
            ]
            .into_iter()
            .collect(),
        )
    }
}

impl Handler<Synced> for Catalog {
    type Result = bool;
    fn handle(&mut self, _: Synced, ctx: &mut Self::Context) -> bool {
        if self.synced && !self.built {
            self.rebuild(ctx);
        }
        self.built
    }
}

#[allow(unused)]
fn _stream_ext_used<S: futures::Stream>(s: S) -> futures::stream::Fuse<S> {
    s.fuse()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::resources::Quantity;
    use crate::scheduling::Offering;

    fn offering(md: &str, price: f64, replicas: i32, zone: &str) -> Offering {
        Offering {
            machine_deployment: md.into(),
            zone: Some(zone.into()),
            capacity_type: "on-demand".into(),
            price,
            available: true,
            labels: BTreeMap::from([(
                crate::api::wellknown::ZONE_LABEL.to_string(),
                zone.to_string(),
            )]),
            taints: Vec::new(),
            replicas,
            max_size: Some(10),
        }
    }

    fn it(name: &str, cpu: i64, offerings: Vec<Offering>) -> InstanceType {
        InstanceType {
            name: name.into(),
            requirements: Requirements::default(),
            capacity: Resources::new().with("cpu", Quantity::from_units(cpu)),
            overhead: Resources::default(),
            offerings,
        }
    }

    #[test]
    fn rank_puts_the_launch_choice_first_and_says_why_the_others_are_out() {
        let types = vec![
            it(
                "big",
                8,
                vec![
                    offering("ns/b-busy", 1.0, 5, "a"),
                    offering("ns/b-idle", 1.0, 1, "a"),
                    offering("ns/b-other-zone", 0.5, 0, "b"),
                    offering("ns/b-failed", 0.1, 0, "a"),
                ],
            ),
            it("tiny", 1, vec![offering("ns/tiny", 0.01, 0, "a")]),
        ];
        let reqs = Requirements::from_labels(&BTreeMap::from([(
            crate::api::wellknown::ZONE_LABEL.to_string(),
            "a".to_string(),
        )]));
        let requests = Resources::new().with("cpu", Quantity::from_units(2));
        let failed = |o: &Offering| o.machine_deployment == "ns/b-failed";
        let ranked = rank(&types, &reqs, &requests, &[], &failed);
        let got: Vec<(&str, Fit)> = ranked
            .iter()
            .map(|r| (r.offering.machine_deployment.as_str(), r.fit))
            .collect();
        assert_eq!(
            got,
            vec![
                // Same price: the less loaded MachineDeployment first.
                ("ns/b-idle", Fit::Eligible),
                ("ns/b-busy", Fit::Eligible),
                ("ns/tiny", Fit::TooSmall),
                ("ns/b-failed", Fit::Unavailable),
                ("ns/b-other-zone", Fit::Incompatible),
            ]
        );
        // resolve takes the first.
        let view = CatalogView::default();
        view.insert(
            "nc",
            offerings::Catalog {
                instance_types: types,
                deployments: vec!["x".into()],
                problems: Vec::new(),
            },
            None,
        );
        let excluded = HashSet::from(["ns/b-failed".to_string()]);
        let choice = view
            .resolve("nc", &reqs, &requests, &excluded, &[])
            .expect("a choice");
        assert_eq!(choice.machine_deployment, "ns/b-idle");
    }
}
