//! The Disruption actor (leader only; it disrupts a claim by deleting it, and the Terminator
//! drains what the claim's termination asks for). It loops as Karpenter core v1 does: a pass
//! whenever the cluster changes (debounced) and at least every `poll`:
//!
//! 1. Expired claims are deleted, whatever the budgets say (expiration is forceful in v1).
//! 2. `Drifted` / `Consolidatable` conditions and NodePool hash stamps are brought up to date;
//!    disrupted taints that no running command owns are rolled back.
//! 3. The pure `disruption::decide` picks one command (emptiness, drift, multi-node, single-node
//!    consolidation) on the blocking pool. Emptiness and consolidation are carried out only if a
//!    pass at least `validation` later decides the same again; drift is carried out at once, as
//!    upstream does.
//! 4. Carrying out, each command on its own (upstream's orchestration queue): taint and mark the
//!    candidates, create the replacements, wait until they are Initialized, then delete the
//!    candidates. Several commands run at once, bounded only by the budgets (a command's marked
//!    candidates count as disrupting), and the next decision is looked for as soon as one starts.
//!    Each write of a command retries the server's transient failures and reads back what may
//!    have landed (`persist`); a command is rolled back only when its plan no longer holds or
//!    its replacement fails, alone, and its candidates back off alone; the others go on. A controller that dies mid-way leaves taints the next leader rolls back
//!    (step 2): the API holds everything needed to resume or undo.

mod budget_check;
mod commands;
mod decide;
mod drift_backoff;
mod execute;
mod housekeeping;
mod notes;
mod repair;

pub(crate) use execute::reschedulable_pods;
pub(crate) use repair::{announce_blocked, count_repaired};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use jiff::Timestamp;
use kube::ResourceExt;

use super::Shared;
use super::backoff::Backoff;
use super::events::Events;
use crate::api::wellknown::NODEPOOL_LABEL;
use crate::disruption::drift_backoff::DriftBackoff;
use crate::disruption::validation::{self, Next, Pending, Stage};
use crate::disruption::{self, Command};
use crate::metrics::{PoolReasonLabels, ReasonLabels};
use crate::view::disruption as view;

/// Something disruption looks at changed; `pod_event` is a pod event on a node, at its time (the
/// start of the node's `consolidateAfter` countdown).
#[derive(Message, Default)]
#[rtype(result = "()")]
pub(crate) struct ClusterChanged {
    pub(crate) pod_event: Option<(String, Timestamp)>,
}

/// A command being carried out: its replacements launch, then its candidates go.
struct Executing {
    id: u64,
    command: Command,
    replacements: Vec<String>,
    started: Instant,
    /// When its replacements were created (their initialization is timed from here).
    launched: Option<Instant>,
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

/// How many validation periods consolidation of nodes with pods waits at most for pods on their
/// way (a drain a PodDisruptionBudget holds up is not waited for).
const SETTLE_PERIODS: u32 = 4;

/// How long a rolled-back candidate's failures are remembered after its backoff ends.
const FAILURE_MEMORY: Duration = Duration::from_secs(600);

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

pub(crate) struct Disruption {
    shared: Arc<Shared>,
    pod_events: HashMap<String, Timestamp>,
    started: Timestamp,
    running: bool,
    again: bool,
    debounce: Option<SpawnHandle>,
    pending: Option<Pending>,
    /// Commands being carried out, by id, each on its own.
    executing: HashMap<u64, Executing>,
    next_id: u64,
    /// Candidates of a command that was rolled back: not chosen again before the instant, each
    /// with its own backoff (a failing command holds back only its own candidates).
    failed: HashMap<String, (Instant, Backoff)>,
    /// Replacements this actor created, while they exist: never the provisioner's overshoot.
    own_replacements: HashSet<String>,
    /// Candidates of finished commands, until the index shows them deleting.
    deleted: HashSet<String>,
    aftermath: Option<Aftermath>,
    nominated: HashMap<String, Nomination>,
    /// After a consolidation that overshot: no consolidation of non-empty nodes before this.
    consolidation_quiet_until: Option<Instant>,
    consolidation_backoff: Backoff,
    /// Where the next pass's single-node search window starts.
    rotation: usize,
    /// Since when pods have been on their way to nodes (drains, pods about to bind), while they
    /// are.
    moving_since: Option<Instant>,
    /// NodePools whose drift replacements failed to launch wait before drifting again.
    drift_backoff: DriftBackoff,
    /// NodePools whose blocked-repair gauge is set, so it is cleared when none is left.
    repair_blocked_pools: HashSet<String>,
}

impl Disruption {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        let timing = shared.settings.disruption;
        Self {
            shared,
            pod_events: HashMap::new(),
            started: Timestamp::now(),
            running: false,
            again: false,
            debounce: None,
            pending: None,
            executing: HashMap::new(),
            next_id: 0,
            failed: HashMap::new(),
            own_replacements: HashSet::new(),
            deleted: HashSet::new(),
            aftermath: None,
            nominated: HashMap::new(),
            consolidation_quiet_until: None,
            consolidation_backoff: Backoff::new(Duration::from_secs(10), Duration::from_secs(300)),
            rotation: 0,
            moving_since: None,
            drift_backoff: DriftBackoff::new(timing.drift_backoff, timing.drift_backoff_cap),
            repair_blocked_pools: HashSet::new(),
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

    /// One pass: the view gathered and published, housekeeping written, and (unless a decision
    /// waits for its validation) the due command validated or the next one decided, off the
    /// actor; back on it, the commands under way go on and the decision is considered.
    fn pass(&mut self, ctx: &mut Context<Self>) {
        if self.running {
            self.again = true;
            return;
        }
        if !self.shared.router.is_active() || !self.shared.state.pdbs.read().synced() {
            return;
        }
        self.running = true;
        let now = Timestamp::now();
        self.forget_what_is_gone();
        let mut view = self.gather_now(now);
        self.publish_metrics(&view);
        let blocked = std::mem::take(&mut view.repair_blocked);
        let held = std::mem::take(&mut view.repair_held_pools);
        announce_blocked(
            &self.shared,
            &blocked,
            &held,
            &mut self.repair_blocked_pools,
        );
        let shared = self.shared.clone();
        let progress: Vec<(u64, Progress)> = self
            .executing
            .values()
            .filter(|e| !e.deleting)
            .map(|e| (e.id, self.progress(e)))
            .collect();
        self.judge_aftermath();
        let question = self.question(&mut view);
        // While a decision waits for its validation nothing else is decided, as upstream's loop
        // waits: a pass that decided again would replace it whenever the cluster moved a
        // little, and its clock would never run out.
        let waiting = question.is_none();
        let fut = async move {
            housekeeping::housekeeping(&shared, view).await;
            match question {
                Some(q) => decide::decide(&shared, q).await,
                None => (None, None),
            }
        };
        ctx.spawn(fut.into_actor(self).map(move |(cmd, moving), act, ctx| {
            act.after_pass(progress, waiting, cmd, moving, ctx)
        }));
    }

    /// Nodes that are gone have no countdown to keep; candidates a finished command deleted
    /// count as its own until the index shows them deleting (a pass that comes before that
    /// watch event must not see their budget free).
    fn forget_what_is_gone(&mut self) {
        {
            let nodes = self.shared.state.nodes.read();
            self.pod_events.retain(|n, _| nodes.contains(n));
        }
        let claims = self.shared.state.claims.read();
        self.deleted.retain(|name| {
            claims
                .get(name)
                .is_some_and(|c| c.metadata.deletion_timestamp.is_none())
        });
    }

    /// What the decision is asked, or None while a pending decision waits for its validation.
    /// One whose period is over is validated rather than decided again.
    fn question(&mut self, view: &mut view::View) -> Option<decide::Question> {
        let (candidates, mut held) = self.decision_candidates(view);
        held.extend(self.held_by_the_view(view));
        let leaving = self.leaving();
        let under_consolidate_after = std::mem::take(&mut view.under_consolidate_after);
        let allowed = self.next_allowed(&view.allowed);
        let stage = validation::stage(
            self.pending.as_ref(),
            Instant::now(),
            self.settings().validation,
        );
        let due = match stage {
            Stage::Wait(_) => return None,
            Stage::Validate(cmd) => Some(cmd),
            Stage::Decide => None,
        };
        Some(decide::Question {
            candidates,
            leaving,
            under_consolidate_after,
            allowed,
            due,
            not_draining_yet: self.not_draining_yet(),
            may_settle: self.may_settle(),
            held,
        })
    }

    /// The nodes the view held (blocked, and skipped for a reason other than going), with
    /// their first blocker.
    fn held_by_the_view(&self, view: &view::View) -> Vec<disruption::Blocked> {
        let claims = self.shared.state.claims.read();
        let pool_of = |name: &str| {
            claims
                .get(name)
                .and_then(|c| c.labels().get(NODEPOOL_LABEL).cloned())
                .unwrap_or_default()
        };
        let blocked = view.blocked.iter().map(|(c, hold)| disruption::Blocked {
            claim: c.name_any(),
            nodepool: c.labels().get(NODEPOOL_LABEL).cloned().unwrap_or_default(),
            hold: hold.clone(),
        });
        let skipped = view.skipped.iter().filter_map(|(name, why, blocker)| {
            Some(disruption::Blocked {
                claim: name.clone(),
                nodepool: pool_of(name),
                hold: disruption::Hold::new((*blocker)?, *why),
            })
        });
        blocked.chain(skipped).collect()
    }

    /// The view's candidates a decision may take: those of a command rolled back a moment ago
    /// wait out their own backoff (returned as held), while consolidation is paused only empty
    /// nodes and drift go, and the drifted nodes of a pool whose drift backs off are not
    /// drifted.
    fn decision_candidates(
        &mut self,
        view: &mut view::View,
    ) -> (Vec<disruption::Candidate>, Vec<disruption::Blocked>) {
        use disruption::{Blocker, Hold, blocker};
        // Moved out, not copied: housekeeping reads the rest of the view, never the candidates
        // (at 5,000 nodes a copy held every node's pod names twice).
        let mut candidates = std::mem::take(&mut view.candidates);
        let at = Instant::now();
        let held = blocker::hold_back(&mut candidates, |c| {
            let (until, _) = self.failed.get(&c.claim).filter(|(until, _)| *until > at)?;
            let left = until.duration_since(at).as_secs();
            let why = format!("its command was rolled back; it backs off for {left}s more");
            Some(Hold::new(Blocker::Backoff, why))
        });
        if self.consolidation_paused() {
            let why = "consolidation pauses after a consolidation whose pods needed new nodes";
            disruption::hold_underutilized(&mut candidates, &Hold::new(Blocker::Backoff, why));
        }
        self.hold_backed_off_drift(&mut candidates);
        (candidates, held)
    }

    /// Consolidation of non-empty nodes stays quiet after a consolidation that overshot; the
    /// gauge says so.
    fn consolidation_paused(&self) -> bool {
        let paused = self
            .consolidation_quiet_until
            .is_some_and(|t| Instant::now() < t);
        self.shared
            .metrics
            .consolidation_paused
            .set(i64::from(paused));
        paused
    }

    /// The running commands' nodes go away: the next decision plans their pods as pending
    /// (upstream adds the pods of nodes marked for deletion to every simulation), so two
    /// commands do not count on the same room.
    fn leaving(&self) -> Vec<disruption::Candidate> {
        self.executing
            .values()
            .flat_map(|e| e.command.candidates.iter().cloned())
            .collect()
    }

    /// The budgets the decision may use, its single-node search window moved on for the next
    /// pass.
    fn next_allowed(&mut self, allowed: &disruption::Allowed) -> disruption::Allowed {
        let mut allowed = allowed.clone();
        allowed.rotation = self.rotation;
        self.rotation = self
            .rotation
            .wrapping_add(disruption::MAX_SINGLE_NODE_SIMULATIONS);
        allowed
    }

    /// Pods of a command whose replacement is still launching stay where they are for now.
    fn not_draining_yet(&self) -> HashSet<String> {
        self.executing
            .values()
            .filter(|e| !e.deleting && !e.command.replacements.is_empty())
            .flat_map(|e| {
                e.command
                    .candidates
                    .iter()
                    .flat_map(|c| c.pods.iter().map(|p| p.to_string()))
            })
            .collect()
    }

    /// Consolidation waits for pods on their way at most `SETTLE_PERIODS` validation periods.
    fn may_settle(&self) -> bool {
        let settle = self.settings().validation * SETTLE_PERIODS;
        self.moving_since.is_none_or(|t| t.elapsed() < settle)
    }

    /// The pass's end, back on the actor: the commands that progressed finish or roll back, the
    /// decision is considered, and a pass asked for meanwhile comes soon.
    fn after_pass(
        &mut self,
        progress: Vec<(u64, Progress)>,
        waiting: bool,
        cmd: Option<(Command, bool)>,
        moving: Option<usize>,
        ctx: &mut Context<Self>,
    ) {
        self.running = false;
        self.note_pods_on_their_way(moving);
        for (id, p) in progress {
            match p {
                Progress::Ready => self.finish(id, ctx),
                Progress::Failed(why) => {
                    self.drift_launch_failed(id, &why);
                    self.roll_back(id, why, ctx);
                }
                Progress::Waiting => {}
            }
        }
        if !waiting {
            self.consider(cmd, ctx);
        }
        if std::mem::take(&mut self.again) {
            self.soon(ctx);
        }
    }

    /// Consolidation waits for pods on their way at most `SETTLE_PERIODS` validation periods
    /// from when they were first seen (`None`: this pass did not look).
    fn note_pods_on_their_way(&mut self, pods: Option<usize>) {
        match pods {
            Some(0) => self.moving_since = None,
            Some(_) => {
                self.moving_since.get_or_insert_with(Instant::now);
            }
            None => {}
        }
    }

    fn publish_metrics(&self, view: &view::View) {
        let m = &self.shared.metrics;
        // Upstream counts the candidates each method's ShouldDisrupt accepts: the pass's own
        // rule, so an empty node is eligible for `empty` only.
        for reason in disruption::REASONS {
            let n = view
                .candidates
                .iter()
                .filter(|c| c.eligible_for(reason))
                .count();
            m.disruption_eligible_nodes
                .get_or_create(&ReasonLabels {
                    reason: reason.as_str().to_lowercase(),
                })
                .set(n as i64);
        }
        for (pool, reason, allowed, busy) in &view.budget_use {
            let labels = PoolReasonLabels {
                nodepool: pool.clone(),
                reason: reason.as_str().to_string(),
            };
            m.nodepools_allowed_disruptions
                .get_or_create(&labels)
                .set(*allowed as i64);
            m.nodepools_nodes_consuming_budgets
                .get_or_create(&labels)
                .set(*busy as i64);
        }
    }

    /// What the pass sees now: the indexes read afresh, with this actor's memory (commands
    /// under way, nominations, pod events). Also the last look before a command starts.
    fn gather_now(&mut self, now: jiff::Timestamp) -> view::View {
        let executing: HashSet<String> = self
            .executing
            .values()
            .flat_map(|e| e.command.candidates.iter().map(|c| c.claim.clone()))
            .chain(self.deleted.iter().cloned())
            .collect();
        let mut nominated = self.nominations();
        {
            // The provisioner's plans too: a node it planned pods onto stays while one of them
            // is still pending and the plan holds.
            let now = Instant::now();
            let pods = self.shared.state.pods.read();
            let mut planned = self.shared.state.nominated.write();
            planned.retain(|pod, (_, until)| {
                *until > now
                    && pods
                        .get(pod)
                        .is_some_and(|p| crate::state::pods::node_name(&p).is_none())
            });
            nominated.extend(planned.values().map(|(place, _)| place.clone()));
        }
        {
            let claims = self.shared.state.claims.read();
            self.own_replacements.retain(|c| claims.contains(c));
        }
        // A candidate's backoff is remembered a while after it ends, so failing again soon
        // backs off longer.
        let at = Instant::now();
        self.failed
            .retain(|_, (until, _)| *until + FAILURE_MEMORY > at);
        let pdbs = self.shared.state.pdbs.read().all().clone();
        view::gather(
            self.shared.view(),
            &view::Memory {
                pdbs: &pdbs,
                pod_events: &self.pod_events,
                started: self.started,
                executing: &executing,
                nominated: &nominated,
                now,
                keep_held: false,
            },
        )
    }

    /// The budgets may have moved since the pass decided (its housekeeping writes, the
    /// snapshot and the solve take a while, longer on a loaded machine): Cluster API may have
    /// deleted Machines meanwhile (a rollout) or another command started. Read afresh from
    /// the indexes right before the command's first write: Err says why it no longer fits,
    /// Ok what each of its pools allows now, for the server-side check that follows
    /// (`budget_check::over_budget_on_server`).
    fn budget_now(&mut self, cmd: &Command) -> Result<Vec<budget_check::PoolRoom>, String> {
        let view = self.gather_now(jiff::Timestamp::now());
        let reason = cmd.method.reason();
        let mut per_pool: HashMap<&str, usize> = HashMap::new();
        for c in &cmd.candidates {
            *per_pool.entry(c.nodepool.as_str()).or_default() += 1;
        }
        let mut rooms = Vec::with_capacity(per_pool.len());
        for (pool, needed) in per_pool {
            let allowed = view.allowed.get(pool, reason);
            if needed > allowed {
                return Err(format!(
                    "NodePool {pool} now allows {allowed} more {} disruptions, the command needs {needed}",
                    reason.as_str()
                ));
            }
            let busy = view
                .budget_use
                .iter()
                .find(|(p, r, _, _)| p == pool && *r == reason)
                .map_or(0, |(_, _, _, busy)| *busy);
            rooms.push(budget_check::PoolRoom {
                pool: pool.to_string(),
                reason,
                allowed,
                busy,
                needed,
            });
        }
        Ok(rooms)
    }

    /// A command from this pass: carry it out when it is a pending one that passed its
    /// validation (or drift); otherwise it becomes (or stays) the pending one and is validated
    /// after the pause (`disruption::revalidate`).
    fn consider(&mut self, cmd: Option<(Command, bool)>, ctx: &mut Context<Self>) {
        let validation = self.settings().validation;
        match validation::settle(&mut self.pending, cmd, Instant::now(), validation) {
            Next::Execute(cmd) => self.execute(cmd, ctx),
            Next::Validating { left, new } => {
                if let Some(p) = self.pending.as_ref().filter(|_| new) {
                    let cmd = &p.command;
                    tracing::info!(method = ?cmd.method, decision = cmd.decision(), claims = ?cmd.claim_names(), "disruption candidate command; validating");
                    self.candidate_events(cmd);
                }
                ctx.run_later(left, |act, ctx| act.pass(ctx));
            }
            Next::Idle => {}
        }
    }

    /// `ConsolidationCandidate` on each candidate of a consolidation about to be validated, as
    /// upstream publishes when it computes one (emptiness and drift publish none).
    fn candidate_events(&self, cmd: &Command) {
        if !matches!(
            cmd.method,
            disruption::Method::SingleNodeConsolidation
                | disruption::Method::MultiNodeConsolidation
        ) {
            return;
        }
        let n = cmd.candidates.len();
        execute::on_candidates(
            &self.shared,
            cmd,
            Events::normal,
            "ConsolidationCandidate",
            |object| {
                format!(
                    "{object} is a consolidation candidate: {} ({} method, {n} node(s))",
                    cmd.decision(),
                    execute::method_name(cmd)
                )
            },
        );
    }

    /// The in-flight gauge follows every start and end of a command.
    fn count_in_flight(&self) {
        self.shared
            .metrics
            .disruption_commands_in_flight
            .set(self.executing.len() as i64);
    }
}

/// Start the Disruption actor (on the leader) and register it.
pub(crate) fn start(shared: &Arc<Shared>) {
    shared
        .router
        .actors()
        .start(Disruption::new(shared.clone()));
}

super::registry::stoppable!(Disruption);

impl Actor for Disruption {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let poll = self.settings().poll;
        ctx.run_interval(poll, |act, ctx| act.pass(ctx));
    }
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
