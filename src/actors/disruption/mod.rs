//! The Disruption actor (leader only; DESIGN.md's `Disruption --Disrupt--> NodeClaimActor`, here
//! by deleting the claim, whose termination the Terminator drains). It loops as Karpenter core
//! v1 does: a pass whenever the cluster changes (debounced) and at least every `poll`:
//!
//! 1. Expired claims are deleted, whatever the budgets say (expiration is forceful in v1).
//! 2. `Drifted` / `Consolidatable` conditions and NodePool hash stamps are brought up to date;
//!    disrupted taints that no running command owns are rolled back.
//! 3. With no command in flight, the pure `disruption::decide` picks one (emptiness, drift,
//!    multi-node, single-node consolidation) on the blocking pool. A command is carried out only
//!    if a pass at least `validation` later decides the same again.
//! 4. Carrying out: taint and mark the candidates, create the replacements, wait until they are
//!    Initialized, then delete the candidates. A replacement that fails rolls the command back
//!    and disruption backs off. A controller that dies mid-way leaves taints the next leader
//!    rolls back (step 2): the API holds everything needed to resume or undo.

mod execute;
pub mod view;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use jiff::Timestamp;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use super::Shared;
use super::backoff::Backoff;
use crate::api::conditions;
use crate::api::wellknown::REPLACES_ANNOTATION;
use crate::disruption::{self, Command};
use crate::metrics::{MethodLabels, PoolReasonLabels, ReasonLabels};

/// Something disruption looks at changed; `pod_event` is a pod event on a node, at its time (the
/// start of the node's `consolidateAfter` countdown).
#[derive(Message, Default)]
#[rtype(result = "()")]
pub struct ClusterChanged {
    pub pod_event: Option<(String, Timestamp)>,
}

/// A decision waiting for its validation pass.
struct Pending {
    command: Command,
    since: Instant,
}

/// A command being carried out: its replacements launch, then its candidates go.
struct Executing {
    command: Command,
    replacements: Vec<String>,
    started: Instant,
    /// The candidates' deletes are under way: a pass in the meantime must not start them again
    /// (nor count the decision twice).
    deleting: bool,
}

/// A consolidation just carried out, watched for its aftermath: pods it moved that found no room
/// where the scheduler put them make the provisioner launch again.
struct Aftermath {
    /// Claims that existed when it finished, and its own replacements.
    known: HashSet<String>,
    until: Instant,
}

/// How long after a consolidation a launch counts as its overshoot: the candidates' drain, the
/// pods' rescheduling and a provisioning batch fit well inside.
const AFTERMATH: Duration = Duration::from_secs(60);

/// How long a command's replacements stay nominated after its candidates are gone: the moved
/// pods' rescheduling and a provisioning batch (upstream nominates for 2 x the batch maximum).
const NOMINATION_WINDOW: Duration = Duration::from_secs(20);

/// A replacement the command's moved pods are heading for.
struct Nomination {
    candidates: Vec<String>,
    /// When the command finished (None while it runs).
    done: Option<Instant>,
}

enum Progress {
    Waiting,
    Ready,
    Failed(String),
}

pub struct Disruption {
    shared: Arc<Shared>,
    pdbs: BTreeMap<String, Arc<PodDisruptionBudget>>,
    pdb_buffer: Vec<PodDisruptionBudget>,
    pdbs_synced: bool,
    pod_events: HashMap<String, Timestamp>,
    started: Timestamp,
    running: bool,
    again: bool,
    debounce: Option<SpawnHandle>,
    pending: Option<Pending>,
    executing: Option<Executing>,
    /// After a failed command: no new command before this.
    quiet_until: Option<Instant>,
    backoff: Backoff,
    aftermath: Option<Aftermath>,
    nominated: HashMap<String, Nomination>,
    /// After a consolidation that overshot: no consolidation of non-empty nodes before this.
    consolidation_quiet_until: Option<Instant>,
    consolidation_backoff: Backoff,
}

impl Disruption {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            pdbs: BTreeMap::new(),
            pdb_buffer: Vec::new(),
            pdbs_synced: false,
            pod_events: HashMap::new(),
            started: Timestamp::now(),
            running: false,
            again: false,
            debounce: None,
            pending: None,
            executing: None,
            quiet_until: None,
            backoff: Backoff::new(Duration::from_secs(5), Duration::from_secs(300)),
            aftermath: None,
            nominated: HashMap::new(),
            consolidation_quiet_until: None,
            consolidation_backoff: Backoff::new(Duration::from_secs(10), Duration::from_secs(300)),
        }
    }

    fn settings(&self) -> super::DisruptionSettings {
        self.shared.settings.disruption
    }

    /// A pass soon (changes arriving together make one pass).
    fn soon(&mut self, ctx: &mut Context<Self>) {
        if self.debounce.is_some() {
            return;
        }
        let d = self.settings().debounce;
        self.debounce = Some(ctx.run_later(d, |act, ctx| {
            act.debounce = None;
            act.pass(ctx);
        }));
    }

    fn pass(&mut self, ctx: &mut Context<Self>) {
        if self.running {
            self.again = true;
            return;
        }
        if !self.shared.router.is_active() || !self.pdbs_synced {
            return;
        }
        self.running = true;
        let now = Timestamp::now();
        // Nodes that are gone have no countdown to keep.
        {
            let nodes = self.shared.state.nodes.read();
            self.pod_events.retain(|n, _| nodes.get(n).is_some());
        }
        let executing: HashSet<String> = self
            .executing
            .iter()
            .flat_map(|e| e.command.candidates.iter().map(|c| c.claim.clone()))
            .collect();
        let nominated = self.nominations();
        let view = view::gather(
            &self.shared,
            &view::Memory {
                pdbs: &self.pdbs,
                pod_events: &self.pod_events,
                started: self.started,
                executing: &executing,
                nominated: &nominated,
                now,
            },
        );
        self.publish_metrics(&view);
        let shared = self.shared.clone();
        let progress = self
            .executing
            .as_ref()
            .filter(|e| !e.deleting)
            .map(|e| self.progress(e));
        let quiet = self.quiet_until.is_some_and(|t| Instant::now() < t);
        let decide = self.executing.is_none() && !quiet;
        self.judge_aftermath();
        let mut candidates = view.candidates.clone();
        if self
            .consolidation_quiet_until
            .is_some_and(|t| Instant::now() < t)
        {
            // Only empty nodes and drift while consolidation stays quiet.
            for c in candidates.iter_mut().filter(|c| !c.pods.is_empty()) {
                c.consolidatable = false;
            }
        }
        let allowed = view.allowed.clone();
        let validation = self.settings().validation;
        // A decision whose pause is over is validated rather than decided again.
        let due = self
            .pending
            .as_ref()
            .filter(|p| p.since.elapsed() >= validation)
            .map(|p| p.command.clone());
        let fut = async move {
            housekeeping(&shared, view).await;
            if !decide {
                return None;
            }
            let snapshot = view::snapshot(&shared, &candidates);
            let started = Instant::now();
            let decision = tokio::task::spawn_blocking(move || {
                if let Some(pending) = due {
                    let validated =
                        disruption::revalidate(&snapshot, &candidates, &allowed, &pending);
                    if validated.is_some() {
                        return (validated, true, Vec::new());
                    }
                }
                let d = disruption::decide_explained(&snapshot, &candidates, &allowed);
                (d.command, false, d.unconsolidatable)
            })
            .await
            .unwrap_or_default();
            let (command, validated, unconsolidatable) = decision;
            shared
                .metrics
                .disruption_evaluation_seconds
                .get_or_create(&MethodLabels {
                    method: "all".into(),
                })
                .observe(started.elapsed().as_secs_f64());
            for (claim, why) in &unconsolidatable {
                let c = shared.state.claims.read().get(claim);
                if let Some(c) = c {
                    shared.events.normal(
                        c.object_ref(&()),
                        "Unconsolidatable",
                        format!("NodeClaim {claim} cannot be consolidated: {why}"),
                    );
                }
            }
            command.map(|c| (c, validated))
        };
        ctx.spawn(fut.into_actor(self).map(move |cmd, act, ctx| {
            act.running = false;
            match progress {
                Some(Progress::Ready) => act.finish(ctx),
                Some(Progress::Failed(why)) => act.roll_back(why, ctx),
                _ => act.consider(cmd, ctx),
            }
            if std::mem::take(&mut act.again) {
                act.soon(ctx);
            }
        }));
    }

    fn publish_metrics(&self, view: &view::View) {
        let m = &self.shared.metrics;
        for reason in ["empty", "drifted", "underutilized"] {
            let n = view
                .candidates
                .iter()
                .filter(|c| match reason {
                    "empty" => c.consolidatable && c.pods.is_empty(),
                    "drifted" => c.drift.is_some(),
                    _ => c.consolidatable,
                })
                .count();
            m.disruption_eligible_nodes
                .get_or_create(&ReasonLabels {
                    reason: reason.into(),
                })
                .set(n as i64);
        }
        for ((pool, reason), n) in &view.allowed.0 {
            m.nodepools_allowed_disruptions
                .get_or_create(&PoolReasonLabels {
                    nodepool: pool.clone(),
                    reason: reason.as_str().to_lowercase(),
                })
                .set(*n as i64);
        }
    }

    /// A command from this pass: carry it out when it is a pending one that passed its
    /// validation; otherwise it becomes (or stays) the pending one and is validated after the
    /// pause (`disruption::revalidate`).
    fn consider(&mut self, cmd: Option<(Command, bool)>, ctx: &mut Context<Self>) {
        let Some((cmd, validated)) = cmd else {
            self.pending = None;
            return;
        };
        if validated {
            self.pending = None;
            self.execute(cmd, ctx);
            return;
        }
        let validation = self.settings().validation;
        match self.pending.take() {
            Some(p)
                if p.command.method == cmd.method
                    && p.command.claim_names() == cmd.claim_names()
                    && p.since.elapsed() < validation =>
            {
                let left = validation.saturating_sub(p.since.elapsed());
                self.pending = Some(p);
                ctx.run_later(left, |act, ctx| act.pass(ctx));
            }
            _ => {
                tracing::info!(method = ?cmd.method, decision = cmd.decision(), claims = ?cmd.claim_names(), "disruption candidate command; validating");
                self.pending = Some(Pending {
                    command: cmd,
                    since: Instant::now(),
                });
                ctx.run_later(validation, |act, ctx| act.pass(ctx));
            }
        }
    }

    fn execute(&mut self, cmd: Command, ctx: &mut Context<Self>) {
        tracing::info!(method = ?cmd.method, decision = cmd.decision(), claims = ?cmd.claim_names(), replacements = cmd.replacements.len(), "disrupting");
        // Ours from the first write on: the next pass must not roll the taints back.
        self.executing = Some(Executing {
            command: cmd.clone(),
            replacements: Vec::new(),
            started: Instant::now(),
            deleting: false,
        });
        let shared = self.shared.clone();
        let fut = async move {
            execute::mark(&shared, &cmd).await?;
            let names = execute::launch_replacements(&shared, &cmd).await?;
            if names.is_empty() {
                execute::delete_candidates(&shared, &cmd).await?;
            }
            Ok::<_, super::Error>(names)
        };
        ctx.spawn(fut.into_actor(self).map(|r, act, ctx| match r {
            Ok(names) if names.is_empty() => {
                act.completed();
                act.soon(ctx);
            }
            Ok(names) => {
                if let Some(e) = act.executing.as_mut() {
                    let candidates: Vec<String> = e
                        .command
                        .candidates
                        .iter()
                        .map(|c| c.claim.clone())
                        .collect();
                    for n in &names {
                        act.nominated.insert(
                            n.clone(),
                            Nomination {
                                candidates: candidates.clone(),
                                done: None,
                            },
                        );
                    }
                    e.replacements = names;
                }
            }
            Err(e) => act.roll_back(format!("carrying out the command failed: {e}"), ctx),
        }));
    }

    /// Where the replacements of the running command stand.
    fn progress(&self, e: &Executing) -> Progress {
        if e.replacements.is_empty() {
            return Progress::Waiting;
        }
        let claims = self.shared.state.claims.read();
        let mut ready = true;
        for name in &e.replacements {
            match claims.get(name) {
                None => return Progress::Failed(format!("replacement NodeClaim {name} is gone")),
                Some(c) if c.metadata.deletion_timestamp.is_some() => {
                    return Progress::Failed(format!(
                        "replacement NodeClaim {name} is being deleted"
                    ));
                }
                Some(c) => ready &= conditions::is_true(c.conditions(), conditions::INITIALIZED),
            }
        }
        if ready {
            Progress::Ready
        } else if e.started.elapsed() > self.settings().replacement_timeout {
            Progress::Failed("replacements were not initialized in time".into())
        } else {
            Progress::Waiting
        }
    }

    /// The replacements are ready: the candidates go.
    fn finish(&mut self, ctx: &mut Context<Self>) {
        let Some(e) = self.executing.as_mut().filter(|e| !e.deleting) else {
            return;
        };
        // Still ours until the deletes answered: the claims stay listed as executing.
        e.deleting = true;
        let cmd = e.command.clone();
        let shared = self.shared.clone();
        ctx.spawn(
            async move { execute::delete_candidates(&shared, &cmd).await }
                .into_actor(self)
                .map(|r, act, ctx| match r {
                    Ok(()) => {
                        act.completed();
                        act.soon(ctx);
                    }
                    Err(e) => act.roll_back(format!("deleting the candidates failed: {e}"), ctx),
                }),
        );
    }

    /// The running command is done. A consolidation that moved pods is watched for a while.
    fn completed(&mut self) {
        self.backoff.reset();
        let Some(e) = self.executing.take() else {
            return;
        };
        for r in &e.replacements {
            if let Some(n) = self.nominated.get_mut(r) {
                n.done = Some(Instant::now());
            }
        }
        let moved_pods = e.command.candidates.iter().any(|c| !c.pods.is_empty());
        let consolidation = matches!(
            e.command.method,
            disruption::Method::MultiNodeConsolidation
                | disruption::Method::SingleNodeConsolidation
        );
        if consolidation && moved_pods {
            let mut known: HashSet<String> = self
                .shared
                .state
                .claims
                .read()
                .all()
                .map(|c| c.name_any())
                .collect();
            known.extend(e.replacements);
            self.aftermath = Some(Aftermath {
                known,
                until: Instant::now() + AFTERMATH,
            });
        }
    }

    /// Replacements still nominated: their command runs, one of its candidates is still there
    /// (draining), or it finished less than the nomination window ago.
    fn nominations(&mut self) -> HashSet<String> {
        let claims = self.shared.state.claims.read();
        self.nominated.retain(|name, n| {
            claims.contains(name)
                && (n.done.is_none_or(|t| t.elapsed() < NOMINATION_WINDOW)
                    || n.candidates.iter().any(|c| claims.contains(c)))
        });
        self.nominated.keys().cloned().collect()
    }

    /// Consolidation plans where the moved pods go, but the scheduler decides (kube-scheduler
    /// spreads pods to the least-allocated node, often the fresh replacement, so pods planned
    /// for it can find no room). When the provisioner had to launch after a consolidation, the
    /// move gained nothing: consolidation of non-empty nodes pauses, for longer each time in a
    /// row, instead of replacing nodes in circles. A consolidation without such a launch resets
    /// the pause.
    fn judge_aftermath(&mut self) {
        let Some(a) = &self.aftermath else {
            return;
        };
        let launched: Vec<String> = self
            .shared
            .state
            .claims
            .read()
            .all()
            .filter(|c| !a.known.contains(&c.name_any()))
            .filter(|c| !c.annotations().contains_key(REPLACES_ANNOTATION))
            .map(|c| c.name_any())
            .collect();
        if !launched.is_empty() {
            let pause = self.consolidation_backoff.next_delay();
            self.consolidation_quiet_until = Some(Instant::now() + pause);
            self.aftermath = None;
            tracing::info!(launched = ?launched, pause = ?pause, "pods moved by the last consolidation needed new nodes; pausing consolidation");
        } else if Instant::now() >= a.until {
            self.aftermath = None;
            self.consolidation_backoff.reset();
        }
    }

    /// Undo the running command's marks and stay quiet for a while.
    fn roll_back(&mut self, why: String, ctx: &mut Context<Self>) {
        let Some(e) = self.executing.take() else {
            return;
        };
        // Nothing moves to the replacements now: they are ordinary claims.
        for r in &e.replacements {
            self.nominated.remove(r);
        }
        let quiet = self.backoff.next_delay();
        self.quiet_until = Some(Instant::now() + quiet);
        tracing::warn!(method = ?e.command.method, claims = ?e.command.claim_names(), reason = %why, retry_in = ?quiet, "disruption command failed; rolling back");
        for c in &e.command.candidates {
            if let Some(claim) = self.shared.state.claims.read().get(&c.claim) {
                self.shared.events.warning(
                    claim.object_ref(&()),
                    "DisruptionFailed",
                    format!("Disrupting NodeClaim {} was rolled back: {why}", c.claim),
                );
            }
        }
        // The next pass sees the taints as stale and removes them (one place for rollback).
        ctx.run_later(Duration::from_millis(10), |act, ctx| act.pass(ctx));
    }
}

/// Step 1 and 2 of a pass: expirations, stamps, stale marks; Events for protected candidates.
/// Best effort: a failed write is logged and the next pass, which recomputes everything from
/// the indexes, tries again.
async fn housekeeping(shared: &Shared, view: view::View) {
    for c in &view.expired {
        if let Err(e) = execute::expire(shared, c).await {
            tracing::warn!(nodeclaim = %c.name_any(), error = %e, "expiring failed");
        }
    }
    for s in &view.stamps {
        if let Err(e) = execute::stamp(shared, s).await {
            tracing::debug!(nodeclaim = %s.claim.name_any(), error = %e, "updating disruption conditions failed");
        }
    }
    for old in &view.rollout {
        if let Err(e) = execute::replace_for_rollout(shared, old).await {
            tracing::warn!(nodeclaim = %old.name_any(), error = %e, "creating a rollout replacement failed");
        }
    }
    for (c, at) in &view.pod_event_times {
        if let Err(e) = execute::record_pod_event(shared, c, *at).await {
            tracing::debug!(nodeclaim = %c.name_any(), error = %e, "recording the last pod event failed");
        }
    }
    for (c, np) in &view.restamp {
        if let Err(e) = execute::restamp(shared, c, np).await {
            tracing::debug!(nodeclaim = %c.name_any(), error = %e, "re-stamping the NodePool hash failed");
        }
    }
    for (node, claim) in &view.stale {
        tracing::info!(node = %node.name_any(), nodeclaim = %claim.name_any(), "removing a disruption mark no command owns");
        if let Err(e) = execute::unmark(shared, claim, node).await {
            tracing::warn!(node = %node.name_any(), error = %e, "rolling back a disruption mark failed");
        }
    }
    for (np, reason) in &view.budget_blocked {
        shared.events.normal(
            np.object_ref(&()),
            "DisruptionBlocked",
            format!(
                "No allowed disruptions for reason {} due to blocking budget",
                reason.as_str()
            ),
        );
    }
    let interesting: HashSet<&str> = view
        .stamps
        .iter()
        .filter(|s| s.drift.is_some() || s.consolidatable)
        .map(|s| s.claim.metadata.name.as_deref().unwrap_or_default())
        .collect();
    for (c, why) in &view.blocked {
        let drifted_or_idle = interesting.contains(c.name_any().as_str())
            || conditions::is_true(c.conditions(), conditions::DRIFTED)
            || conditions::is_true(c.conditions(), conditions::CONSOLIDATABLE);
        if drifted_or_idle {
            shared.events.normal(
                c.object_ref(&()),
                "DisruptionBlocked",
                format!("Cannot disrupt NodeClaim {}: {why}", c.name_any()),
            );
        }
    }
}

impl Actor for Disruption {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let pdbs: Api<PodDisruptionBudget> = Api::all(self.shared.workload.clone());
        ctx.add_stream(watcher(pdbs, watcher::Config::default()).default_backoff());
        let poll = self.settings().poll;
        ctx.run_interval(poll, |act, ctx| act.pass(ctx));
    }
}

impl Disruption {
    /// The budgets for the provisioner's snapshot too (a map of shared pointers: cheap).
    fn publish_pdbs(&self) {
        *self.shared.state.pdbs.write() = self.pdbs.clone();
    }
}

impl StreamHandler<Result<watcher::Event<PodDisruptionBudget>, watcher::Error>> for Disruption {
    fn handle(
        &mut self,
        ev: Result<watcher::Event<PodDisruptionBudget>, watcher::Error>,
        ctx: &mut Self::Context,
    ) {
        let key = |p: &PodDisruptionBudget| {
            format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
        };
        match ev {
            Ok(watcher::Event::Init) => self.pdb_buffer.clear(),
            Ok(watcher::Event::InitApply(p)) => self.pdb_buffer.push(p),
            Ok(watcher::Event::InitDone) => {
                self.pdbs = std::mem::take(&mut self.pdb_buffer)
                    .into_iter()
                    .map(|p| (key(&p), Arc::new(p)))
                    .collect();
                self.pdbs_synced = true;
                self.publish_pdbs();
                self.soon(ctx);
            }
            Ok(watcher::Event::Apply(p)) => {
                self.pdbs.insert(key(&p), Arc::new(p));
                self.publish_pdbs();
                self.soon(ctx);
            }
            Ok(watcher::Event::Delete(p)) => {
                self.pdbs.remove(&key(&p));
                self.publish_pdbs();
                self.soon(ctx);
            }
            Err(e) => {
                tracing::warn!(error = %e, "PodDisruptionBudget watch failed; it will re-list")
            }
        }
    }

    // The PDB stream ending must not stop the actor (it lives as long as leadership).
    fn finished(&mut self, _: &mut Self::Context) {}
}

impl Handler<ClusterChanged> for Disruption {
    type Result = ();
    fn handle(&mut self, msg: ClusterChanged, ctx: &mut Self::Context) {
        if let Some((node, at)) = msg.pod_event {
            let last = self.pod_events.entry(node).or_insert(at);
            *last = (*last).max(at);
        }
        self.soon(ctx);
    }
}
