//! The instance-type catalog. The Catalog actor reads infrastructure templates, rebuilds each
//! ClusterAPINodeClass's instance types when a MachineDeployment or NodeClass changes (never on
//! a timer) and publishes them as an immutable snapshot in a `CatalogView` (the read layer's
//! `view::catalog`); claims and the provisioner read that view directly, like any other index.
//! NodeClasses and NodeOverlays come from their indexes (`state::named`, fed by `state::feed`,
//! so a re-list is swapped in whole and a rebuild never sees half of
//! one); their feeds ask for a rebuild. Each rebuild applies the overlays to every NodeClass's
//! catalog as each NodePool sees it before it is published (`capi::overlay`), so a new or
//! changed overlay re-prices offerings at once, and writes each overlay's conditions; a NodePool
//! whose name, NodeClass or template labels change rebuilds too.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::StreamExt;
use jiff::Timestamp;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Shared;
use super::patch::{Guarded, write_conditions, write_conditions_guarded};
use super::tracked::Tracked;
use crate::api::conditions::{self, ConditionStatus};
use crate::api::decode::Malformed;
use crate::api::nodeclass::ClusterAPINodeClass;
use crate::capi::model::MachineDeployment;
use crate::capi::offerings::{self, Context as OfferingContext};
// Re-exported where the benchmarks have always found it.
pub use crate::view::catalog::CatalogView;
use crate::view::catalog::{LeftOut, resolve_nodeclass};

mod overlays;
mod templates;
use templates::TemplateRead;

/// MachineDeployments, NodeClasses or NodeOverlays changed: rebuild (coalesced).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Rebuild {
    /// A NodeOverlay's spec changed: consolidation looks again at the new prices.
    pub(crate) overlays: bool,
}

/// NodePools changed: rebuild if overlays are applied and what they see of the pools changed.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct NodePoolsChanged;

/// What overlays see of the NodePools: whether the list has synced, and each pool's name,
/// NodeClass and template labels.
type PoolsSeen = (bool, Vec<(String, String, BTreeMap<String, String>)>);

/// Wait until the first rebuild after the NodeClass list has synced.
#[derive(Message)]
#[rtype(result = "bool")]
pub(crate) struct Synced;

/// How long the first catalog waits for the first answer about each MachineDeployment's
/// template. Published earlier, it would leave those MachineDeployments out, and the claims a
/// new leader finds waiting (or that are created at once) would wait a launch retry for them;
/// a read that hangs must not hold activation for ever either.
const FIRST_READS_WAIT: Duration = Duration::from_secs(10);
/// After a NodeClass status write lost to the NodePools actor's: time for the index to get the
/// newer copy before the rebuild computes the condition again.
const CONFLICT_RETRY: Duration = Duration::from_millis(500);

pub struct Catalog {
    shared: Arc<Shared>,
    /// By MachineDeployment key.
    templates: HashMap<String, TemplateRead>,
    fetching: HashSet<String>,
    /// A rebuild is already scheduled for a template re-read that is not due yet.
    reread_scheduled: bool,
    rebuild_scheduled: bool,
    /// A catalog has been published since the NodeClass list synced.
    built: bool,
    /// Problems already reported per NodeClass (so each is one Event, not one per rebuild).
    reported: HashMap<String, HashSet<String>>,
    /// An overlay changed since the last rebuild: consolidation looks again at the new prices.
    overlays_changed: bool,
    /// The NodePools as the overlays were last applied for them: a NodePool change that leaves
    /// them alone (its status, its limits) rebuilds nothing.
    pools_seen: Option<PoolsSeen>,
    /// When the first catalog stops waiting for first template answers (set at the first
    /// rebuild that still lacks one).
    first_reads_until: Option<Instant>,
}

impl Catalog {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            templates: HashMap::new(),
            fetching: HashSet::new(),
            reread_scheduled: false,
            rebuild_scheduled: false,
            built: false,
            reported: HashMap::new(),
            overlays_changed: false,
            pools_seen: None,
            first_reads_until: None,
        }
    }

    /// The NodeClass list (fed by `state::feed`, on every replica from the start) has
    /// completed at least once: a catalog built before would leave every NodeClass out.
    fn synced(&self) -> bool {
        self.shared.state.nodeclasses.read().synced()
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
        let (mds, unreadable, cluster_paused, replicas_held) = {
            let deployments = self.shared.state.deployments.read();
            let mds: Vec<Arc<MachineDeployment>> = deployments.all().cloned().collect();
            // A paused Cluster's MachineDeployments are not offered (their own pause is read
            // where the offering is made).
            let cluster_paused: HashSet<String> = mds
                .iter()
                .filter(|md| deployments.cluster_paused(md))
                .map(|md| md.key())
                .collect();
            let replicas_held: HashMap<String, String> = mds
                .iter()
                .filter_map(|md| Some((md.key(), deployments.replicas_held(md)?)))
                .collect();
            let unreadable = deployments.unreadable().clone();
            (mds, unreadable, cluster_paused, replicas_held)
        };
        self.fetch_missing_templates(&mds, ctx);
        let reads = self.template_views(&mds);
        let generation_refused = self.shared.catalog.generation_refused();
        let left_out = LeftOut {
            unreadable: &unreadable,
            missing_templates: &reads.missing,
            unread_templates: &reads.unread,
            failing_templates: &reads.failing,
            replicas_held: &replicas_held,
            generation_refused: &generation_refused,
        };
        let view = self.shared.catalog.clone();
        let unavailable = |md: &str| view.is_unavailable(md) || cluster_paused.contains(md);
        let cx = OfferingContext {
            templates: &reads.capacity,
            unavailable: &unavailable,
        };
        let mut names: HashSet<String> = self
            .shared
            .state
            .nodeclasses
            .read()
            .all()
            .keys()
            .cloned()
            .collect();
        names.extend(self.publish_malformed(ctx));
        self.publish_nodeclasses(&mds, &left_out, &cx, ctx);
        self.publish_instance_hashes(&mds);
        self.shared.catalog.retain(&names);
        self.reported.retain(|k, _| names.contains(k));
        self.shared.catalog.forget_unavailable();
        self.built = self.built
            || (self.synced()
                && self.shared.state.overlays.read().synced()
                && self.first_reads_over(&reads.unread, ctx));
        if std::mem::take(&mut self.overlays_changed) {
            self.shared.router.disruption_changed();
        }
        if self.built {
            // Activation waits for the first catalog built after the NodeClass list.
            self.shared.synced.notify_waiters();
        }
        self.shared.router.provisioner_poke();
        self.shared.router.nodepools_changed();
    }

    /// NodeClasses that do not decode: published as not ready, with why. Their names.
    fn publish_malformed(&mut self, ctx: &mut Context<Self>) -> Vec<String> {
        // Published as not ready (so their NodePools say why), with `Ready=False` naming the
        // field.
        let bad: Vec<Malformed> = self
            .shared
            .state
            .nodeclasses
            .read()
            .malformed()
            .values()
            .cloned()
            .collect();
        let mut names = Vec::new();
        for m in bad {
            let Some(name) = m.metadata.name.clone() else {
                continue;
            };
            let message = format!("cannot be read: {}", m.message());
            self.update_malformed_status(&m, &message, ctx);
            self.shared.catalog.publish(
                name.clone(),
                offerings::Catalog::default(),
                None,
                Err(message),
            );
            names.push(name);
        }
        names
    }

    /// Each NodeClass resolved against the node groups, overlaid as each NodePool sees it, its
    /// status written, its problems told, and published (with the per-pool views).
    fn publish_nodeclasses(
        &mut self,
        mds: &[Arc<MachineDeployment>],
        left_out: &LeftOut<'_>,
        cx: &OfferingContext<'_>,
        ctx: &mut Context<Self>,
    ) {
        let nodeclasses: Vec<(String, Arc<ClusterAPINodeClass>)> = self
            .shared
            .state
            .nodeclasses
            .read()
            .all()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut resolved: Vec<(offerings::Catalog, Result<(), String>)> = nodeclasses
            .iter()
            .map(|(_, nc)| resolve_nodeclass(nc, mds, left_out, cx))
            .collect();
        let each: Vec<&str> = nodeclasses.iter().map(|(n, _)| n.as_str()).collect();
        let by_pool = self.apply_overlays(&each, &mut resolved, ctx);
        for ((name, nc), (catalog, ready)) in nodeclasses.iter().zip(resolved) {
            let was_ready = matches!(self.shared.catalog.nodeclass_ready(name), Some(Ok(())));
            if ready.is_ok() && !was_ready {
                self.kick_unlaunched(name);
            }
            self.update_status(nc, &catalog, &ready, ctx);
            // A template not read yet is a moment of every start, not a problem to tell.
            let reported: Vec<String> = catalog
                .problems
                .iter()
                .filter(|p| !p.ends_with(offerings::TEMPLATE_UNREAD))
                .chain(&catalog.skipped)
                .cloned()
                .collect();
            self.report_problems(nc, &reported);
            self.shared
                .catalog
                .publish(name.clone(), catalog, nc.create_timeout(), ready);
        }
        self.shared.catalog.publish_pools(by_pool);
    }

    /// `nodeclass` turned ready: the claims of it that could not launch while it was not look
    /// again now, not at their launch retry (10 s; every claim of a start or a restart met
    /// it while the templates were read).
    fn kick_unlaunched(&self, nodeclass: &str) {
        let waiting: Vec<String> = self
            .shared
            .state
            .claims
            .read()
            .all()
            .filter(|c| c.spec.node_class_ref.name == nodeclass)
            .filter(|c| !conditions::is_true(c.conditions(), conditions::LAUNCHED))
            .map(|c| c.name_any())
            .collect();
        for claim in waiting {
            self.shared.router.kick_claim(&claim);
        }
    }

    /// The instance hash each MachinePool's infrastructure pool was last read with (pool drift
    /// compares its instances with it).
    fn publish_instance_hashes(&self, mds: &[Arc<MachineDeployment>]) {
        self.shared.catalog.publish_instance_hashes(
            mds.iter()
                .filter(|md| md.is_pool())
                .filter_map(|md| {
                    let hash = self
                        .templates
                        .get(&md.key())?
                        .capacity
                        .instance_hash
                        .clone()?;
                    Some((md.key(), hash))
                })
                .collect(),
        );
    }

    /// Whether the first catalog may be published as far as templates go: every
    /// MachineDeployment's template has had its first answer (read, missing or failing), or
    /// FIRST_READS_WAIT has passed since the first rebuild that lacked one.
    fn first_reads_over(&mut self, unread: &HashSet<String>, ctx: &mut Context<Self>) -> bool {
        if unread.is_empty() {
            return true;
        }
        let now = Instant::now();
        let until = *self.first_reads_until.get_or_insert_with(|| {
            ctx.run_later(FIRST_READS_WAIT, |act, ctx| act.schedule_rebuild(ctx));
            now + FIRST_READS_WAIT
        });
        if now >= until {
            tracing::warn!(unread = ?unread, "first template reads still unanswered; publishing the catalog without those MachineDeployments");
        }
        now >= until
    }

    /// A node group (MachineDeployment or MachinePool) left out of a usable NodeClass (Ready
    /// stays True) is still something an operator must see: one Warning Event on the NodeClass
    /// per new problem, naming the node group and the annotation.
    fn report_problems(&mut self, nc: &ClusterAPINodeClass, problems: &[String]) {
        let name = nc.name_any();
        let seen = self.reported.entry(name.clone()).or_default();
        for p in problems {
            if seen.insert(p.clone()) {
                tracing::warn!(nodeclass = %name, problem = %p, "node group (MachineDeployment or MachinePool) left out of the catalog, or an annotation entry of it ignored");
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
                self.shared.client_for::<ClusterAPINodeClass>(),
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
            Ok(()) => (ConditionStatus::True, "Ready", ready_message(catalog)),
            Err(m) => (ConditionStatus::False, not_ready_reason(catalog), m.clone()),
        };
        let mut conds = nc
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let mut changed = conditions::set(
            &mut conds,
            conditions::READY,
            status,
            reason,
            &message,
            nc.metadata.generation,
            Timestamp::now(),
        );
        changed |= self.set_generation_ready(nc, catalog, &mut conds);
        if !changed {
            return;
        }
        if status == ConditionStatus::False {
            self.shared
                .events
                .warning(nc.object_ref(&()), reason, message.clone());
        }
        // The NodePools actor writes this list too (`NodesUpToDate`): the write is guarded by
        // the resourceVersion of the index's copy, and a conflict rebuilds once the index has
        // the newer one.
        ctx.spawn(
            write_conditions_guarded::<ClusterAPINodeClass>(
                self.shared.client_for::<ClusterAPINodeClass>(),
                nc.name_any(),
                nc.metadata.resource_version.clone(),
                json!(conds),
            )
            .into_actor(self)
            .map(|written, _, ctx| {
                if written == Guarded::Conflict {
                    ctx.run_later(CONFLICT_RETRY, |act, ctx| act.schedule_rebuild(ctx));
                }
            }),
        );
    }
}

impl Catalog {
    /// `GenerationReady` for a NodeClass with `spec.generate`: whether its groups can be
    /// offered and created, or the field that stops them (also a Warning Event when it turns
    /// False). Whether it changed.
    fn set_generation_ready(
        &self,
        nc: &ClusterAPINodeClass,
        catalog: &offerings::Catalog,
        conds: &mut Vec<conditions::Condition>,
    ) -> bool {
        let Some(generation) = &catalog.generation else {
            return false;
        };
        let (status, reason, message) = match generation {
            Ok(()) => (
                ConditionStatus::True,
                "Ready",
                format!(
                    "{} generated MachineDeployments, {} shapes offered before their group exists",
                    catalog.generated.len(),
                    catalog.to_generate.len()
                ),
            ),
            Err(why) => (ConditionStatus::False, "GenerationFailed", why.clone()),
        };
        let was_false = conditions::get(conds, GENERATION_READY)
            .is_some_and(|c| c.status == ConditionStatus::False && c.message == message);
        let changed = conditions::set(
            conds,
            GENERATION_READY,
            status,
            reason,
            &message,
            nc.metadata.generation,
            Timestamp::now(),
        );
        if status == ConditionStatus::False && !was_false {
            tracing::warn!(nodeclass = %nc.name_any(), %message, "generated node groups cannot be offered");
            self.shared
                .events
                .warning(nc.object_ref(&()), reason, message);
        }
        changed
    }
}

/// The condition of a NodeClass with `spec.generate` (docs/generate.md).
pub(crate) const GENERATION_READY: &str = "GenerationReady";

/// What a Ready NodeClass resolved to, and the selected MachineDeployments it left out (each
/// also an Event), so the condition alone tells an operator that some are not offered.
fn ready_message(c: &offerings::Catalog) -> String {
    let mut m = format!(
        "Resolved {} MachineDeployments into {} instance types",
        c.deployments.len(),
        c.instance_types.len()
    );
    if !c.problems.is_empty() {
        m.push_str(&format!("; left out: {}", c.problems.join("; ")));
    }
    if !c.skipped.is_empty() {
        m.push_str(&format!("; ignored: {}", c.skipped.join("; ")));
    }
    // The API bounds a condition message at 32768 bytes.
    if m.len() > 8192 {
        let mut end = 8192;
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m.truncate(end);
        m.push_str("...");
    }
    m
}

fn not_ready_reason(c: &offerings::Catalog) -> &'static str {
    if c.problems.is_empty() {
        "NoMachineDeployments"
    } else {
        "InvalidMachineDeployments"
    }
}

super::registry::stoppable!(Catalog);

impl Actor for Catalog {
    type Context = Context<Self>;
}

impl Handler<Rebuild> for Catalog {
    type Result = ();
    fn handle(&mut self, msg: Rebuild, ctx: &mut Self::Context) {
        self.overlays_changed |= msg.overlays;
        if self.synced() {
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
                ("nodeclasses", self.shared.state.nodeclasses.read().len()),
                ("nodeoverlays", self.shared.state.overlays.read().len()),
            ]
            .into_iter()
            .collect(),
        )
    }
}

impl Handler<Synced> for Catalog {
    type Result = bool;
    fn handle(&mut self, _: Synced, ctx: &mut Self::Context) -> bool {
        if self.synced() && !self.built {
            self.rebuild(ctx);
        }
        self.built
    }
}

#[allow(unused)]
fn _stream_ext_used<S: futures::Stream>(s: S) -> futures::stream::Fuse<S> {
    s.fuse()
}
