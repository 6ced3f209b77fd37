//! Carrying out commands, each on its own: marks, replacements, the wait for them, the
//! candidates' deletion and rollback; and the watch on a consolidation's aftermath (a launch the
//! move made necessary pauses consolidation).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kube::ResourceExt;

use crate::actors::Shared;
use crate::actors::backoff::Backoff;
use crate::actors::events::Events;
use crate::api::conditions;
use crate::api::wellknown::REPLACES_ANNOTATION;
use crate::disruption::{self, Command};

use super::{
    AFTERMATH, Aftermath, Disruption, Executing, NOMINATION_WINDOW, Nomination, Progress,
    budget_check, execute,
};

/// How a command's start ended.
enum Started {
    /// Marked, its replacements (if any) created under these names.
    Launched(Vec<String>),
    /// Not started: the server showed its budget taken (nothing written).
    Withdrawn(String),
    /// Marked, but its replacements could not be created.
    LaunchFailed(String),
}

impl Disruption {
    pub(super) fn execute(&mut self, cmd: Command, ctx: &mut Context<Self>) {
        let rooms = match self.budget_now(&cmd) {
            Ok(rooms) => rooms,
            Err(why) => {
                tracing::debug!(method = ?cmd.method, claims = ?cmd.claim_names(), why = %why, "not disrupting: the budget changed since the decision");
                self.soon(ctx);
                return;
            }
        };
        tracing::info!(method = ?cmd.method, decision = cmd.decision(), claims = ?cmd.claim_names(), replacements = cmd.replacements.len(), in_flight = self.executing.len() + 1, "{}", self.shared.settings.say("disrupting", "would disrupt"));
        let id = self.track(&cmd);
        let fut = start(self.shared.clone(), cmd, rooms);
        ctx.spawn(
            fut.into_actor(self)
                .map(move |r, act, ctx| act.started(id, r, ctx)),
        );
        // The budgets may allow another command now: look for it at once, as upstream's loop
        // does after starting a command (not after the debounce or the poll).
        if self.running {
            self.again = true;
        } else {
            ctx.run_later(Duration::ZERO, |act, ctx| act.pass(ctx));
        }
    }

    /// Ours from the first write on: the next pass must not roll the taints back. Its id.
    fn track(&mut self, cmd: &Command) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.executing.insert(
            id,
            Executing {
                id,
                command: cmd.clone(),
                replacements: Vec::new(),
                started: Instant::now(),
                launched: None,
                deleting: false,
            },
        );
        self.count_in_flight();
        id
    }

    /// How command `id`'s start ended.
    fn started(
        &mut self,
        id: u64,
        r: Result<Started, crate::actors::Error>,
        ctx: &mut Context<Self>,
    ) {
        match r {
            Ok(Started::Withdrawn(why)) => {
                // Nothing was written: no rollback, no backoff for its candidates.
                tracing::debug!(why = %why, "not disrupting: the server shows the budget taken since the decision");
                self.executing.remove(&id);
                self.count_in_flight();
                self.soon(ctx);
            }
            Ok(Started::LaunchFailed(why)) => {
                let why = format!("creating the replacements failed: {why}");
                self.drift_launch_failed(id, &why);
                self.roll_back(id, why, ctx);
            }
            Ok(Started::Launched(names)) if names.is_empty() => {
                self.completed(id);
                self.soon(ctx);
            }
            Ok(Started::Launched(names)) => self.replacements_launched(id, names),
            Err(e) => self.roll_back(id, format!("carrying out the command failed: {e}"), ctx),
        }
    }

    /// Command `id`'s replacements are created: they are nominated for its candidates' pods and
    /// waited for.
    fn replacements_launched(&mut self, id: u64, names: Vec<String>) {
        self.own_replacements.extend(names.iter().cloned());
        let Some(e) = self.executing.get_mut(&id) else {
            return;
        };
        let candidates: Vec<String> = e
            .command
            .candidates
            .iter()
            .map(|c| c.claim.clone())
            .collect();
        for n in &names {
            self.nominated.insert(
                n.clone(),
                Nomination {
                    candidates: candidates.clone(),
                    done: None,
                },
            );
        }
        for n in &names {
            let claim = self.shared.state.claims.read().get(n);
            if let Some(claim) = claim {
                execute::replacement_waiting(&self.shared, &claim, &e.command);
            }
        }
        e.replacements = names;
        e.launched = Some(Instant::now());
    }

    /// Where the replacements of the running command stand.
    pub(super) fn progress(&self, e: &Executing) -> Progress {
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
                Some(c) => {
                    let initialized = conditions::is_true(c.conditions(), conditions::INITIALIZED);
                    if !initialized {
                        execute::replacement_waiting(&self.shared, &c, &e.command);
                    }
                    ready &= initialized;
                }
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
    pub(super) fn finish(&mut self, id: u64, ctx: &mut Context<Self>) {
        let Some(e) = self.executing.get_mut(&id).filter(|e| !e.deleting) else {
            return;
        };
        // Still ours until the deletes answered: the claims stay listed as executing.
        e.deleting = true;
        if let Some(launched) = e.launched {
            self.shared
                .metrics
                .disruption_stage("initialize", launched.elapsed());
        }
        let cmd = e.command.clone();
        let shared = self.shared.clone();
        ctx.spawn(
            async move {
                let stage = Instant::now();
                let r = execute::delete_candidates(&shared, &cmd).await;
                shared.metrics.disruption_stage("delete", stage.elapsed());
                r
            }
            .into_actor(self)
            .map(move |r, act, ctx| match r {
                Ok(()) => {
                    act.completed(id);
                    act.soon(ctx);
                }
                Err(e) => act.roll_back(id, format!("deleting the candidates failed: {e}"), ctx),
            }),
        );
    }

    /// A command is done. A consolidation that moved pods is watched for a while.
    pub(super) fn completed(&mut self, id: u64) {
        let Some(e) = self.executing.remove(&id) else {
            return;
        };
        self.count_in_flight();
        self.drift_replaced(&e);
        for c in &e.command.candidates {
            self.failed.remove(&c.claim);
            self.deleted.insert(c.claim.clone());
        }
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
    pub(super) fn nominations(&mut self) -> HashSet<String> {
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
    pub(super) fn judge_aftermath(&mut self) {
        let Some(a) = &self.aftermath else {
            return;
        };
        // A command still creating its replacements: they may be in the index before their
        // names are known here. Judge once they are.
        if self
            .executing
            .values()
            .any(|e| e.replacements.is_empty() && !e.command.replacements.is_empty())
        {
            return;
        }
        let launched = overshoot(
            self.shared.state.claims.read().all().map(|c| &**c),
            &a.known,
            &self.own_replacements,
        );
        if !launched.is_empty() {
            let pause = self.consolidation_backoff.next_delay();
            self.consolidation_quiet_until = Some(Instant::now() + pause);
            self.shared.metrics.consolidation_paused.set(1);
            self.aftermath = None;
            tracing::info!(launched = ?launched, pause = ?pause, "pods moved by the last consolidation needed new nodes; pausing consolidation");
        } else if Instant::now() >= a.until {
            self.aftermath = None;
            self.consolidation_backoff.reset();
        }
    }

    /// Undo a command's marks; its candidates back off before they are chosen again (each on
    /// its own: the other commands and candidates go on).
    pub(super) fn roll_back(&mut self, id: u64, why: String, ctx: &mut Context<Self>) {
        let Some(e) = self.executing.remove(&id) else {
            return;
        };
        self.count_in_flight();
        // Nothing moves to the replacements now: they are ordinary claims.
        for r in &e.replacements {
            self.nominated.remove(r);
        }
        let mut quiet = Duration::ZERO;
        for c in &e.command.candidates {
            let (until, backoff) = self.failed.entry(c.claim.clone()).or_insert_with(|| {
                (
                    Instant::now(),
                    Backoff::new(Duration::from_secs(5), Duration::from_secs(300)),
                )
            });
            let delay = backoff.next_delay();
            *until = Instant::now() + delay;
            quiet = quiet.max(delay);
        }
        tracing::warn!(method = ?e.command.method, claims = ?e.command.claim_names(), reason = %why, retry_in = ?quiet, "disruption command failed; rolling back");
        self.shared
            .metrics
            .disruption_queue_failures
            .get_or_create(&execute::decision_labels(&e.command))
            .inc();
        execute::on_candidates(
            &self.shared,
            &e.command,
            Events::warning,
            "DisruptionFailed",
            |object| format!("Disrupting {object} was rolled back: {why}"),
        );
        // The next pass sees the taints as stale and removes them (one place for rollback).
        ctx.run_later(Duration::from_millis(10), |act, ctx| act.pass(ctx));
    }
}

/// Claims launched since a consolidation that it did not expect: not there when it finished,
/// and neither a later command's replacement nor a rollout's. Only the provisioner's launches
/// for pods the move left without room are an overshoot.
fn overshoot<'a>(
    claims: impl Iterator<Item = &'a crate::api::nodeclaim::NodeClaim>,
    known: &HashSet<String>,
    own: &HashSet<String>,
) -> Vec<String> {
    claims
        .map(|c| (c.name_any(), c))
        .filter(|(name, _)| !known.contains(name) && !own.contains(name))
        .filter(|(_, c)| !c.annotations().contains_key(REPLACES_ANNOTATION))
        .map(|(name, _)| name)
        .collect()
}

/// A command's writes up to its replacements: the budget checked on the server and the marks
/// (no claim deletion of ours lands between the two: `gate`), then the replacements, or the
/// candidates' deletion when there are none.
async fn start(
    shared: Arc<Shared>,
    cmd: Command,
    rooms: Vec<budget_check::PoolRoom>,
) -> Result<Started, crate::actors::Error> {
    let m = &shared.metrics;
    let gate = shared
        .deletion_gate
        .hold("disruption command's budget check")
        .await;
    if let Some(why) = budget_check::over_budget_on_server(&shared, &cmd, &rooms).await {
        return Ok(Started::Withdrawn(why));
    }
    let stage = Instant::now();
    execute::mark(&shared, &cmd).await?;
    drop(gate);
    m.disruption_stage("mark", stage.elapsed());
    let stage = Instant::now();
    let names = match execute::launch_replacements(&shared, &cmd).await {
        Ok(names) => names,
        Err(e) => return Ok(Started::LaunchFailed(e.to_string())),
    };
    if !names.is_empty() {
        m.disruption_stage("launch", stage.elapsed());
    }
    execute::count_started(&shared, &cmd);
    if names.is_empty() {
        let stage = Instant::now();
        execute::delete_candidates(&shared, &cmd).await?;
        m.disruption_stage("delete", stage.elapsed());
    }
    Ok(Started::Launched(names))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::nodeclaim::NodeClaim;

    fn claim(name: &str, annotations: serde_json::Value) -> NodeClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"requirements": [], "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}}
        }))
        .expect("a NodeClaim")
    }

    /// Issue 21, item 6: a replacement this actor created for the next command, right after a
    /// consolidation, is not that consolidation's overshoot; the provisioner's launch is.
    #[test]
    fn only_the_provisioners_launches_are_an_overshoot() {
        let known: HashSet<String> = ["old".to_string()].into();
        let own: HashSet<String> = ["next-command-replacement".to_string()].into();
        let claims = [
            claim("old", serde_json::json!({})),
            claim("next-command-replacement", serde_json::json!({})),
            claim("rollout", serde_json::json!({REPLACES_ANNOTATION: "old"})),
            claim("provisioned", serde_json::json!({})),
        ];
        assert_eq!(
            overshoot(claims.iter(), &known, &own),
            vec!["provisioned".to_string()]
        );
    }
}
