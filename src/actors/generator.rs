//! The lives of generated node groups (docs/generate.md). Creates the group a claim chose for a
//! shape of a NodeClass's `spec.generate` (the infrastructure template copy, then the
//! MachineDeployment copy at zero replicas; the Scaler then scales it as any other), checks
//! each NodeClass's patches against its source's template before any claim needs them, removes
//! generated groups idle past their NodeClass's `idleAfter` and templates no group references,
//! and lists the groups on each NodeClass's status. Leader only.
//!
//! Only objects carrying a NodeClass's mark (`capi::generate::GENERATED_LABEL`) are ever
//! deleted, and a create that finds its object made by somebody else refuses it. Names come
//! from the plan, so a restart between the two creates, or two claims racing for one shape,
//! end with the one group (AlreadyExists is success when the object is ours).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kube::Client;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::Shared;
use super::messages::Stop;
use crate::api::nodeclass::ClusterAPINodeClass;
use crate::capi::generate::{self, DEFAULT_IDLE_AFTER, GroupPlan};
use crate::capi::model::MachineDeployment;
use crate::state::claims::recorded_deployment;

mod objects;
use objects::{create_group, delete_group, read_source_template, roll_out_group, sweep_templates};

/// How often idle groups, unreferenced templates, patch checks and statuses are looked at.
const SWEEP: Duration = Duration::from_secs(5);
/// Templates are listed this often (the rest of a sweep reads the indexes only).
const TEMPLATE_SWEEP: Duration = Duration::from_secs(60);
/// A marked template no group references is left this long first: its group's create may be
/// on its way (this replica's, or a previous leader's).
pub(super) const ORPHAN_GRACE: Duration = Duration::from_secs(120);

/// A claim chose a group of `spec.generate` that does not exist: create it. Answers once the
/// MachineDeployment exists (or why it will not).
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub(crate) struct Ensure {
    pub(crate) key: String,
}

/// One infrastructure template kind in one namespace, swept for unreferenced copies.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct TemplateKind {
    group: String,
    version: Option<String>,
    kind: String,
    namespace: String,
}

/// What a patch check was made for: the NodeClass's generation and its source's digest.
type Stamp = (Option<i64>, String);

/// A patch check to make: the NodeClass, its stamp, one plan, the source.
type Check = (String, Stamp, GroupPlan, Arc<MachineDeployment>);

pub(crate) struct Generator {
    shared: Arc<Shared>,
    /// Groups being created, by key, with their NodeClass.
    creating: HashMap<String, String>,
    /// Since when each generated group has been idle.
    idle_since: HashMap<String, Instant>,
    /// Deletes sent whose effect the index does not show yet.
    deleting: HashSet<String>,
    /// The last patch check of each NodeClass: (its generation, its source's digest), and the
    /// refusal if the patches do not apply to the source's template.
    checked: HashMap<String, (Stamp, Option<String>)>,
    checking: HashSet<String>,
    /// Groups being rolled out to a new source (`onSourceChange: Rollout`).
    rolling: HashSet<String>,
    last_template_sweep: Option<Instant>,
}

impl Generator {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            creating: HashMap::new(),
            idle_since: HashMap::new(),
            deleting: HashSet::new(),
            checked: HashMap::new(),
            checking: HashSet::new(),
            rolling: HashSet::new(),
            last_template_sweep: None,
        }
    }

    fn client(&self) -> Client {
        self.shared.management.clone()
    }

    fn sweep(&mut self, ctx: &mut Context<Self>) {
        self.check_patches(ctx);
        self.roll_out(ctx);
        self.remove_idle(ctx);
        if self
            .last_template_sweep
            .is_none_or(|t| t.elapsed() >= TEMPLATE_SWEEP)
        {
            self.last_template_sweep = Some(Instant::now());
            self.remove_unreferenced_templates(ctx);
        }
        self.write_statuses(ctx);
    }

    /// Why a group may not be created now, if it may not.
    fn refusal(&self, plan: &GroupPlan) -> Option<String> {
        if let Some((_, Some(why))) = self.checked.get(&plan.nodeclass) {
            return Some(why.clone());
        }
        let max = self.max_groups(&plan.nodeclass)?;
        let current = self
            .shared
            .catalog
            .generated()
            .into_iter()
            .filter(|(nc, _, _)| nc == &plan.nodeclass)
            .flat_map(|(_, groups, _)| groups)
            .filter(|g| g.current && g.machine_deployment != plan.key())
            .count();
        let on_the_way = self
            .creating
            .iter()
            .filter(|(k, nc)| *nc == &plan.nodeclass && *k != &plan.key())
            .count();
        (current + on_the_way >= max).then(|| {
            format!(
                "ClusterAPINodeClass {}: spec.generate.maxMachineDeployments ({max}) reached",
                plan.nodeclass
            )
        })
    }

    /// The NodeClass's `spec.generate` as it validates now, if it does.
    fn valid(&self, nodeclass: &str) -> Option<generate::Valid> {
        let ncs = self.shared.state.nodeclasses.read();
        let g = ncs.get(nodeclass)?.spec.generate.clone()?;
        generate::validate(&g).ok()
    }

    fn max_groups(&self, nodeclass: &str) -> Option<usize> {
        self.valid(nodeclass).map(|v| v.max_groups)
    }

    /// How long a group of `nodeclass` may stay idle: its NodeClass's `idleAfter`; no time
    /// when the NodeClass is gone (nothing will reuse the group); None until the NodeClass list
    /// has synced (a NodeClass not seen yet is not gone).
    fn idle_after(&self, nodeclass: &str) -> Option<Duration> {
        {
            let ncs = self.shared.state.nodeclasses.read();
            if !ncs.synced() {
                return None;
            }
            if ncs.get(nodeclass).is_none() {
                return Some(Duration::ZERO);
            }
        }
        Some(
            self.valid(nodeclass)
                .map_or(DEFAULT_IDLE_AFTER, |v| v.idle_after),
        )
    }

    /// Check each NodeClass's patches against its source's template once per (generation,
    /// source): a patch that does not apply is refused on the status before any claim needs
    /// it, and nothing is created.
    fn check_patches(&mut self, ctx: &mut Context<Self>) {
        self.forget_deleted_nodeclasses();
        let due: Vec<Check> = {
            let ncs = self.shared.state.nodeclasses.read();
            let deployments = self.shared.state.deployments.read();
            ncs.all()
                .iter()
                .filter(|(name, _)| !self.checking.contains(*name))
                .filter_map(|(name, nc)| {
                    let valid = generate::validate(nc.spec.generate.as_ref()?).ok()?;
                    let source = deployments.get(&valid.source)?;
                    let stamp = (nc.metadata.generation, source.spec_template_digest.clone());
                    if self.checked.get(name).is_some_and(|(s, _)| *s == stamp) {
                        return None;
                    }
                    let plan = generate::plans(name, &valid, &source).into_iter().next()?;
                    Some((name.clone(), stamp, plan, source))
                })
                .collect()
        };
        for (name, stamp, plan, source) in due {
            self.checking.insert(name.clone());
            let client = self.client();
            ctx.spawn(
                async move {
                    let template = read_source_template(&client, &source).await?;
                    Ok::<_, String>(plan.template_object(&template).err().map(|e| e.to_string()))
                }
                .into_actor(self)
                .map(move |verdict, act, _| {
                    act.checking.remove(&name);
                    match verdict {
                        Ok(refused) => {
                            if act.checked.get(&name).map(|(_, r)| r) != Some(&refused) {
                                act.shared.catalog.refuse_generation(&name, refused.clone());
                                act.shared.router.catalog_changed();
                            }
                            act.checked.insert(name, (stamp, refused));
                        }
                        // The template could not be read: the next sweep tries again.
                        Err(e) => {
                            tracing::debug!(nodeclass = %name, error = %e, "source template not read for the patch check")
                        }
                    }
                }),
            );
        }
    }

    /// `onSourceChange: Rollout`: a group made from an older source gets the new template copy
    /// and the source's Machine template, so Cluster API rolls its Machines out (its name, and
    /// so its claims' offering, stay).
    fn roll_out(&mut self, ctx: &mut Context<Self>) {
        let due: Vec<(GroupPlan, Arc<MachineDeployment>)> = {
            let ncs = self.shared.state.nodeclasses.read();
            let deployments = self.shared.state.deployments.read();
            let mut due = Vec::new();
            for (name, nc) in ncs.all() {
                let Some(valid) = nc
                    .spec
                    .generate
                    .as_ref()
                    .and_then(|g| generate::validate(g).ok())
                else {
                    continue;
                };
                let Some(source) = deployments.get(&valid.source) else {
                    continue;
                };
                if !valid.rollout || self.checked.get(name).is_some_and(|(_, r)| r.is_some()) {
                    continue;
                }
                for plan in generate::plans(name, &valid, &source) {
                    let outdated = deployments.get(&plan.key()).is_some_and(|md| {
                        generate::generated_by(&md.labels) == Some(name.as_str())
                            && md.deletion_timestamp.is_none()
                            && md.annotations.get(generate::SOURCE_DIGEST_ANNOTATION)
                                != Some(&plan.source_digest)
                    });
                    if outdated && !self.rolling.contains(&plan.key()) {
                        due.push((plan, source.clone()));
                    }
                }
            }
            due
        };
        for (plan, source) in due {
            let key = plan.key();
            self.rolling.insert(key.clone());
            tracing::info!(machine_deployment = %key, nodeclass = %plan.nodeclass, "rolling a generated node group out to its source's new Machines");
            ctx.spawn(
                roll_out_group(self.client(), plan, source)
                    .into_actor(self)
                    .map(move |r, act, _| {
                        act.rolling.remove(&key);
                        if let Err(e) = r {
                            tracing::warn!(machine_deployment = %key, error = %e, "generated node group not rolled out; tried again at the next sweep");
                        }
                    }),
            );
        }
    }

    /// A NodeClass that is gone keeps no check and no refusal.
    fn forget_deleted_nodeclasses(&mut self) {
        let ncs = self.shared.state.nodeclasses.read();
        let gone: Vec<String> = self
            .checked
            .keys()
            .filter(|n| ncs.get(n).is_none())
            .cloned()
            .collect();
        drop(ncs);
        for name in gone {
            self.checked.remove(&name);
            self.shared.catalog.refuse_generation(&name, None);
        }
    }

    /// Delete generated groups idle past their NodeClass's `idleAfter`: zero replicas asked and
    /// running, no Machine, no claim recording it, not being created.
    fn remove_idle(&mut self, ctx: &mut Context<Self>) {
        let groups: Vec<Arc<MachineDeployment>> = self
            .shared
            .state
            .deployments
            .read()
            .all()
            .filter(|md| generate::generated_by(&md.labels).is_some())
            .cloned()
            .collect();
        let keys: HashSet<String> = groups.iter().map(|md| md.key()).collect();
        self.idle_since.retain(|k, _| keys.contains(k));
        self.deleting.retain(|k| keys.contains(k));
        let now = Instant::now();
        for md in groups {
            let key = md.key();
            if !self.idle(&md) {
                self.idle_since.remove(&key);
                continue;
            }
            let since = *self.idle_since.entry(key.clone()).or_insert(now);
            let nodeclass = generate::generated_by(&md.labels).unwrap_or_default();
            let Some(idle_after) = self.idle_after(nodeclass) else {
                continue;
            };
            if now.duration_since(since) < idle_after || self.deleting.contains(&key) {
                continue;
            }
            self.deleting.insert(key.clone());
            tracing::info!(machine_deployment = %key, nodeclass, "removing idle generated node group");
            let client = self.client();
            ctx.spawn(
                delete_group(client, md)
                    .into_actor(self)
                    .map(move |r, act, _| {
                        if let Err(e) = r {
                            act.deleting.remove(&key);
                            tracing::warn!(machine_deployment = %key, error = %e, "idle generated node group not removed");
                        }
                    }),
            );
        }
    }

    fn idle(&self, md: &MachineDeployment) -> bool {
        let key = md.key();
        md.deletion_timestamp.is_none()
            && md.spec_replicas == Some(0)
            && md.status_replicas.unwrap_or(0) == 0
            && !self.creating.contains_key(&key)
            && self
                .shared
                .state
                .machines
                .read()
                .of_deployment(&key)
                .is_empty()
            && !self
                .shared
                .state
                .claims
                .read()
                .all()
                .any(|c| recorded_deployment(c) == Some(key.as_str()))
    }

    /// Delete marked templates that no MachineDeployment references (a crash between the two
    /// creates, or a group whose delete went through), after ORPHAN_GRACE.
    fn remove_unreferenced_templates(&mut self, ctx: &mut Context<Self>) {
        let (kinds, referenced) = self.template_kinds();
        let creating: HashSet<String> = self.creating.keys().cloned().collect();
        for kind in kinds {
            let client = self.client();
            let referenced = referenced.clone();
            let creating = creating.clone();
            ctx.spawn(
                async move {
                    if let Err(e) = sweep_templates(client, &kind, &referenced, &creating).await {
                        tracing::debug!(kind = %kind.kind, namespace = %kind.namespace, error = %e, "generated templates not swept");
                    }
                }
                .into_actor(self),
            );
        }
    }

    /// The template kinds generated groups use (their sources' and their own), and every
    /// template any MachineDeployment references (`namespace/kind/name`).
    fn template_kinds(&self) -> (HashSet<TemplateKind>, HashSet<String>) {
        let deployments = self.shared.state.deployments.read();
        let sources: HashSet<String> = self
            .shared
            .state
            .nodeclasses
            .read()
            .all()
            .values()
            .filter_map(|nc| nc.spec.generate.as_ref())
            .map(|g| format!("{}/{}", g.source.namespace, g.source.name))
            .collect();
        let mut kinds = HashSet::new();
        let mut referenced = HashSet::new();
        for md in deployments.all() {
            let r = &md.infrastructure_ref;
            referenced.insert(format!("{}/{}/{}", md.namespace, r.kind, r.name));
            if sources.contains(&md.key()) || generate::generated_by(&md.labels).is_some() {
                kinds.insert(TemplateKind {
                    group: r.api_group.clone(),
                    version: r.version.clone(),
                    kind: r.kind.clone(),
                    namespace: md.namespace.clone(),
                });
            }
        }
        (kinds, referenced)
    }

    /// Each NodeClass's generated groups on its status, written when they change.
    fn write_statuses(&mut self, ctx: &mut Context<Self>) {
        for (name, groups, _) in self.shared.catalog.generated() {
            let written = self
                .shared
                .state
                .nodeclasses
                .read()
                .get(&name)
                .map(|nc| nc.status.as_ref().and_then(|s| s.generated.clone()));
            let Some(written) = written else { continue };
            if written.unwrap_or_default() == groups {
                continue;
            }
            let api = self.shared.api::<ClusterAPINodeClass>();
            ctx.spawn(
                async move {
                    let patch = json!({"status": {"generated": groups}});
                    if let Err(e) = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        tracing::debug!(nodeclass = %name, error = %e, "generated groups not written to the status");
                    }
                }
                .into_actor(self),
            );
        }
    }
}

/// Start the Generator (on the leader) and register it.
pub(crate) fn start(shared: &Arc<Shared>) {
    shared.router.actors().start(Generator::new(shared.clone()));
}

impl Actor for Generator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(SWEEP, |act, ctx| act.sweep(ctx));
    }
}

impl Handler<Ensure> for Generator {
    type Result = ResponseActFuture<Self, Result<(), String>>;

    fn handle(&mut self, msg: Ensure, _: &mut Self::Context) -> Self::Result {
        let ready = |r: Result<(), String>| Box::pin(actix::fut::ready(r)) as Self::Result;
        if let Some(md) = self.shared.state.deployments.read().get(&msg.key) {
            return ready(match generate::generated_by(&md.labels) {
                Some(_) => Ok(()),
                None => Err(format!("{} exists and was not generated", msg.key)),
            });
        }
        let Some(plan) = self.shared.catalog.to_generate(&msg.key) else {
            return ready(Err(format!(
                "{} is no longer a generated group any NodeClass offers",
                msg.key
            )));
        };
        if let Some(why) = self.refusal(&plan) {
            return ready(Err(why));
        }
        let Some(source) = self.shared.state.deployments.read().get(&plan.source) else {
            return ready(Err(format!(
                "source MachineDeployment {} not found",
                plan.source
            )));
        };
        self.creating.insert(plan.key(), plan.nodeclass.clone());
        let key = plan.key();
        Box::pin(
            create_group(self.client(), plan, source)
                .into_actor(self)
                .map(move |r, act, _| {
                    act.creating.remove(&key);
                    r
                }),
        )
    }
}

impl Handler<Stop> for Generator {
    type Result = ();
    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<super::tracked::Tracked> for Generator {
    type Result = MessageResult<super::tracked::Tracked>;
    fn handle(&mut self, _: super::tracked::Tracked, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            [
                ("creating", self.creating.len()),
                ("idle_since", self.idle_since.len()),
                ("deleting", self.deleting.len()),
                ("checked", self.checked.len()),
            ]
            .into_iter()
            .collect(),
        )
    }
}
