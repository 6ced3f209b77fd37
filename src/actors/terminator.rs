//! Termination: draining a node the way Karpenter does before its Machine is released
//! (the claim actor sends `Drain(node)`; docs/architecture.md). The decisions are pure
//! (`drain::plan`); this actor carries them out.
//!
//! The claim actor asks `Drain` on every reconcile of a terminating claim and gets where the drain
//! stands; the Terminator taints the Node, evicts (or, at the deadline, deletes) pods with a
//! per-pod exponential backoff, reports PodDisruptionBudget refusals as Events, and kicks the
//! claim when the Node is drained. Pod changes on a draining node (`NodeChanged`, from the pod
//! watch) make it look again at once; nothing polls the API.

pub(crate) mod drain;
mod volumes;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, Taint};
use kube::api::{Api, DeleteParams, PatchParams, PostParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use self::drain::{Action, PodRef, Waiting};
use super::Shared;
use super::backoff::Backoff;
use super::patch::JsonPatch;
use crate::api::wellknown::DISRUPTED_TAINT_KEY;
use crate::metrics::{CauseLabels, CodeLabels, NodePoolLabels, ReasonLabels};

/// Label that takes a draining Node out of external load balancers (upstream sets it too).
const EXCLUDE_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Per-pod retry of a refused or failed eviction (upstream's eviction queue: 100 ms .. 10 s).
const EVICTION_BACKOFF_MIN: Duration = Duration::from_millis(100);
const EVICTION_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Ask for `node` to be drained (idempotent; the answer is where the drain stands).
#[derive(Message, Clone, Debug)]
#[rtype(result = "DrainState")]
pub(crate) struct Drain {
    pub(crate) claim: String,
    pub(crate) node: String,
    pub(crate) nodepool: String,
    /// `karpenter.sh/nodeclaim-termination-timestamp`: every pod is gone by then.
    pub(crate) deadline: Option<jiff::Timestamp>,
    /// Why the claim goes (the `DisruptionReason` condition's reason), for Events and metrics.
    pub(crate) reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DrainState {
    /// Pods are still leaving: `evicting` are being evicted or deleted now, `waiting` are
    /// terminating, protected by do-not-disrupt, or in a later tier.
    Draining { evicting: usize, waiting: usize },
    /// The pods are gone (the claim is Drained); volume attachments of pods that were drained
    /// are still there.
    AwaitingVolumes { attachments: usize },
    /// The Machine may go. `volumes_detached` is false when the deadline cut the wait short.
    Done { volumes_detached: bool },
}

impl DrainState {}

/// Pods or volume attachments of `node` changed (the watches route this to the Terminator).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct NodeChanged(pub String);

/// Stop tracking `node` (its claim is gone).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Forget(pub String);

struct NodeDrain {
    claim: String,
    nodepool: String,
    deadline: Option<jiff::Timestamp>,
    reason: String,
    started: Instant,
    taint_in_flight: bool,
    /// Our taint write succeeded (the index may not show it yet).
    taint_done: bool,
    /// The pods are gone (counted once in `karpenter_nodes_drained_total`).
    drained: bool,
    /// PersistentVolumes of pods that are not drained (static, tolerating): their attachments
    /// never block. None until looked up (only needed when attachments remain).
    ignored_volumes: Option<HashSet<String>>,
    lookup_in_flight: bool,
    awaiting_reported: bool,
    done: Option<bool>,
    wake_at: Option<Instant>,
}

/// One pod's eviction: in flight, waiting for its backoff, or done (the pod is leaving; the
/// index may not show it yet, and a second eviction would only cost a request).
struct PodEviction {
    in_flight: bool,
    removed: bool,
    /// A forced deletion was sent.
    forced: bool,
    next: Instant,
    backoff: Backoff,
}

pub(crate) struct Terminator {
    shared: Arc<Shared>,
    /// A node counts as drained only this long after its drain began, so pods bound just before
    /// the taint landed are seen and evicted too (upstream's 5 s).
    min_drain_time: Duration,
    nodes: HashMap<String, NodeDrain>,
    /// By pod uid.
    pods: HashMap<String, PodEviction>,
    /// Retries of the node-level writes and reads (taint, PersistentVolumeClaims).
    retry: Backoff,
}

/// Start the Terminator (on the leader) and register it.
pub(crate) fn start(shared: &Arc<Shared>) {
    let terminator = Terminator::new(shared.clone(), shared.settings.min_drain_time);
    shared.router.actors().start(terminator);
}

super::registry::stoppable!(Terminator);

impl Actor for Terminator {
    type Context = Context<Self>;
}

impl Terminator {
    pub(crate) fn new(shared: Arc<Shared>, min_drain_time: Duration) -> Self {
        Self {
            shared,
            min_drain_time,
            nodes: HashMap::new(),
            pods: HashMap::new(),
            retry: Backoff::new(EVICTION_BACKOFF_MIN, EVICTION_BACKOFF_MAX),
        }
    }

    /// Look at `node` again: taint it, act on what the plan says, and say where it stands.
    fn step(&mut self, node_name: &str, ctx: &mut Context<Self>) -> DrainState {
        let done = DrainState::Done {
            volumes_detached: true,
        };
        // A Node that is gone has nothing left on it.
        let Some(node) = self.shared.state.nodes.read().get(node_name) else {
            return done;
        };
        let Some(entry) = self.nodes.get(node_name) else {
            return done;
        };
        if let Some(volumes_detached) = entry.done {
            return DrainState::Done { volumes_detached };
        }
        let (deadline, started) = (entry.deadline, entry.started);
        let tainted_now = tainted(&node) || entry.taint_done;
        if !tainted_now {
            self.taint(&node, ctx);
        }
        let pods: Vec<Pod> = self
            .shared
            .state
            .pods
            .read()
            .on_node(node_name)
            .into_iter()
            .map(|p| (*p).clone())
            .collect();
        let now = jiff::Timestamp::now();
        let plan = drain::plan(&pods, deadline, now);
        let evicting = plan.actions.len();
        let waiting = plan.waiting.len();
        let mut next_wake: Option<Instant> = None;
        for action in plan.actions {
            if let Some(at) = self.act(node_name, action, ctx) {
                next_wake = Some(next_wake.map_or(at, |w| w.min(at)));
            }
        }
        for w in &plan.waiting {
            if let Waiting::DoNotDisrupt(_) = w
                && let Some(d) = deadline
            {
                // Forced deletion starts at the deadline minus the pod's grace: look again then.
                let at = Instant::now()
                    + now
                        .duration_until(d)
                        .unsigned_abs()
                        .min(EVICTION_BACKOFF_MAX);
                next_wake = Some(next_wake.map_or(at, |w| w.min(at)));
            }
        }
        if evicting == 0 && waiting == 0 && tainted_now {
            let left = self.min_drain_time.saturating_sub(started.elapsed());
            if left.is_zero() {
                self.drained(node_name);
                return self.volumes(node_name, &pods, deadline, now, ctx);
            }
            next_wake = Some(Instant::now() + left);
        }
        if let Some(at) = next_wake {
            self.wake(node_name, at, ctx);
        }
        DrainState::Draining { evicting, waiting }
    }

    /// The pods are gone: count it once and tell the claim (it sets Drained).
    fn drained(&mut self, node_name: &str) {
        if let Some(entry) = self.nodes.get_mut(node_name)
            && !entry.drained
        {
            entry.drained = true;
            let pool = NodePoolLabels {
                nodepool: entry.nodepool.clone(),
            };
            self.shared.metrics.nodes_drained.get_or_create(&pool).inc();
            self.shared
                .metrics
                .drain_seconds
                .get_or_create(&pool)
                .observe(entry.started.elapsed().as_secs_f64());
            tracing::info!(node = %node_name, nodeclaim = %entry.claim, "{}", self.shared.settings.say("node drained", "would have drained the node (no pod evicted)"));
            self.shared.router.kick_claim(&entry.claim);
        }
    }

    fn wake(&mut self, node_name: &str, at: Instant, ctx: &mut Context<Self>) {
        let Some(entry) = self.nodes.get_mut(node_name) else {
            return;
        };
        if entry.wake_at.is_some_and(|w| w <= at && w > Instant::now()) {
            return;
        }
        entry.wake_at = Some(at);
        let name = node_name.to_string();
        ctx.run_later(
            at.saturating_duration_since(Instant::now()),
            move |act, ctx| {
                if let Some(e) = act.nodes.get_mut(&name) {
                    e.wake_at = None;
                }
                if act.nodes.contains_key(&name) {
                    act.step(&name, ctx);
                }
            },
        );
    }

    /// Start one eviction or deletion unless it is in flight or backing off; returns when the
    /// pod should be looked at again if it is backing off.
    fn act(&mut self, node_name: &str, action: Action, ctx: &mut Context<Self>) -> Option<Instant> {
        let pod = match &action {
            Action::Evict(p) | Action::Delete { pod: p, .. } => p.clone(),
        };
        let entry = self
            .pods
            .entry(pod.uid.clone())
            .or_insert_with(|| PodEviction {
                in_flight: false,
                removed: false,
                forced: false,
                next: Instant::now(),
                backoff: Backoff::new(EVICTION_BACKOFF_MIN, EVICTION_BACKOFF_MAX),
            });
        // A pod already on its way out is not asked again: an eviction that went through is
        // not repeated, and a forced deletion is sent once (the server only ever shortens a
        // pod's grace, and ours already ends at the deadline). A forced deletion may still
        // follow a plain eviction when the deadline comes first.
        let forced = matches!(action, Action::Delete { .. });
        if entry.in_flight || (entry.removed && (!forced || entry.forced)) {
            return None;
        }
        entry.forced |= forced;
        if entry.next > Instant::now() {
            return Some(entry.next);
        }
        entry.in_flight = true;
        let client = self.shared.workload.clone();
        let node = node_name.to_string();
        let fut = async move {
            match &action {
                Action::Evict(p) => evict(client, p).await,
                Action::Delete { pod, grace_seconds } => delete(client, pod, *grace_seconds).await,
            }
        };
        ctx.spawn(fut.into_actor(self).map(move |result, act, ctx| {
            act.evicted(&node, &pod, result, ctx);
        }));
        None
    }

    /// An eviction's (or deadline deletion's) answer: counted, then the pod's entry updated by
    /// what it says (removed, already gone, or retried after a back-off).
    fn evicted(
        &mut self,
        node_name: &str,
        pod: &PodRef,
        result: Result<Removed, kube::Error>,
        ctx: &mut Context<Self>,
    ) {
        let code = match &result {
            Ok(_) => 200,
            Err(kube::Error::Api(s)) => s.code,
            Err(_) => 0,
        };
        self.shared
            .metrics
            .pods_eviction_requests
            .get_or_create(&CodeLabels {
                code: code.to_string(),
            })
            .inc();
        let (claim, reason) = self
            .nodes
            .get(node_name)
            .map(|e| (e.claim.clone(), e.reason.clone()))
            .unwrap_or_default();
        let Some(entry) = self.pods.get_mut(&pod.uid) else {
            return;
        };
        entry.in_flight = false;
        match result {
            Ok(how) => {
                entry.removed = true;
                self.removed(node_name, pod, &reason, how);
            }
            // Gone, or a different pod by that name now: nothing left to do for this one. The
            // entry stays, marked removed, so the pod is not asked again while the pod watch
            // still shows it (someone else, e.g. Cluster API draining the Machine, removed it
            // first): forgetting it re-sent the eviction at once, a tight loop of 404s for as
            // long as the watch lagged, which under load made it lag further.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                entry.removed = true;
            }
            Err(e) => {
                let blocked = matches!(&e, kube::Error::Api(s) if s.code == 429)
                    || matches!(&e, kube::Error::Api(s) if s.message.contains("more than one PodDisruptionBudget"));
                let wait = entry.backoff.next_delay();
                entry.next = Instant::now() + wait;
                let at = entry.next;
                self.shared
                    .metrics
                    .eviction_backoff
                    .get_or_create(&CauseLabels {
                        cause: if blocked { "budget" } else { "error" }.into(),
                    })
                    .inc_by(wait.as_secs_f64());
                if blocked {
                    self.announce_blocked(node_name, pod, &claim);
                } else {
                    tracing::warn!(pod = %pod, node = %node_name, error = %e, "evicting a pod failed; retrying");
                }
                self.wake(node_name, at, ctx);
            }
        }
        if self.nodes.contains_key(node_name) {
            self.step(node_name, ctx);
        }
    }

    /// A pod the drain removed: counted with the node's reason and told on the pod. Both ways
    /// count: since Karpenter v1.15 (#3063) upstream counts its deletions at the deadline too.
    fn removed(&self, node_name: &str, pod: &PodRef, reason: &str, how: Removed) {
        self.shared
            .metrics
            .pods_drained
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
        let (event_reason, note) = match how {
            Removed::Evicted => ("Evicted", format!("Evicted pod: {reason}")),
            Removed::Deleted { grace_seconds } => (
                "Disrupted",
                format!(
                    "Deleting the pod to meet the termination deadline of node {node_name}: it was granted {grace_seconds}s of grace; this bypasses its PodDisruptionBudget and karpenter.sh/do-not-disrupt"
                ),
            ),
        };
        self.shared.events.normal(pod_ref(pod), event_reason, note);
    }

    /// A PodDisruptionBudget refused an eviction: `FailedDraining` on the pod, its Node and its
    /// claim, as upstream tells all three.
    fn announce_blocked(&self, node_name: &str, pod: &PodRef, claim: &str) {
        let why = format!("evicting pod {pod} violates its PodDisruptionBudget; retrying");
        self.shared.events.warning(
            pod_ref(pod),
            "FailedDraining",
            format!("Failed to drain node {node_name}, {why}"),
        );
        if let Some(node) = self.shared.state.nodes.read().get(node_name) {
            self.shared.events.warning(
                node.object_ref(&()),
                "FailedDraining",
                format!("Failed to drain node, {why}"),
            );
        }
        if let Some(c) = self.shared.state.claims.read().get(claim) {
            self.shared.events.warning(
                c.object_ref(&()),
                "FailedDraining",
                format!("Failed to drain node {node_name}, {why}"),
            );
        }
    }

    /// `karpenter.sh/disrupted:NoSchedule` and the load-balancer exclusion label, guarded by the
    /// Node's resourceVersion (a lost race is retried on the next step).
    fn taint(&mut self, node: &Node, ctx: &mut Context<Self>) {
        let name = node.name_any();
        let Some(entry) = self.nodes.get_mut(&name) else {
            return;
        };
        if entry.taint_in_flight {
            return;
        }
        entry.taint_in_flight = true;
        let mut taints: Vec<Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        // Same key with another effect is replaced, as upstream does.
        taints.retain(|t| t.key != DISRUPTED_TAINT_KEY);
        taints.push(disrupted_taint());
        let mut p = JsonPatch::guarded(node.resource_version().as_deref());
        p.set("/spec/taints", json!(taints));
        p.set_entry(
            !node.labels().is_empty(),
            "/metadata/labels",
            EXCLUDE_LB_LABEL,
            "karpenter",
        );
        let client = self.shared.workload.clone();
        let node_name = name.clone();
        let fut = async move {
            let patch = p.into_patch().map_err(kube::Error::SerdeError)?;
            Api::<Node>::all(client)
                .patch(&node_name, &PatchParams::default(), &patch)
                .await
        };
        ctx.spawn(fut.into_actor(self).map(move |result, act, ctx| {
            if let Some(e) = act.nodes.get_mut(&name) {
                e.taint_in_flight = false;
            }
            match result {
                Ok(_) => {
                    tracing::info!(node = %name, "{} {DISRUPTED_TAINT_KEY}:NoSchedule", act.shared.settings.say("tainted node", "would taint node"));
                    // One backoff serves every node: a success starts it over, so failures
                    // long ago do not stretch the next node's retry.
                    act.retry.reset();
                    // The index may still hold the untainted Node until the watch catches up.
                    if let Some(e) = act.nodes.get_mut(&name) {
                        e.taint_done = true;
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    tracing::debug!(node = %name, error = %e, "tainting the node failed; retrying");
                    let at = Instant::now() + act.retry.next_delay();
                    act.wake(&name, at, ctx);
                    return;
                }
            }
            if act.nodes.contains_key(&name) {
                act.step(&name, ctx);
            }
        }));
    }
}

impl Handler<Drain> for Terminator {
    type Result = MessageResult<Drain>;

    fn handle(&mut self, msg: Drain, ctx: &mut Context<Self>) -> Self::Result {
        let entry = self
            .nodes
            .entry(msg.node.clone())
            .or_insert_with(|| NodeDrain {
                claim: msg.claim.clone(),
                nodepool: msg.nodepool.clone(),
                deadline: msg.deadline,
                reason: msg.reason.clone(),
                started: Instant::now(),
                taint_in_flight: false,
                taint_done: false,
                drained: false,
                ignored_volumes: None,
                lookup_in_flight: false,
                awaiting_reported: false,
                done: None,
                wake_at: None,
            });
        entry.deadline = msg.deadline;
        entry.reason = msg.reason;
        MessageResult(self.step(&msg.node, ctx))
    }
}

impl Handler<NodeChanged> for Terminator {
    type Result = ();

    fn handle(&mut self, msg: NodeChanged, ctx: &mut Context<Self>) {
        if self.nodes.get(&msg.0).is_some_and(|e| e.done.is_none()) {
            self.step(&msg.0, ctx);
        }
    }
}

impl Handler<Forget> for Terminator {
    type Result = ();

    fn handle(&mut self, msg: Forget, _: &mut Context<Self>) {
        self.nodes.remove(&msg.0);
        // Pod entries are keyed by uid: drop those no longer on any draining node.
        let pods = self.shared.state.pods.read();
        let live: std::collections::HashSet<String> = self
            .nodes
            .keys()
            .flat_map(|n| pods.on_node(n))
            .filter_map(|p| p.uid())
            .collect();
        self.pods.retain(|uid, e| e.in_flight || live.contains(uid));
    }
}

enum Removed {
    Evicted,
    Deleted { grace_seconds: i64 },
}

/// POST pods/eviction, the body written out: kube 5's `Api::evict` sends `delete_options`, a
/// key kube-apiserver ignores, which would drop the uid precondition.
async fn evict(client: kube::Client, pod: &PodRef) -> Result<Removed, kube::Error> {
    let body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
        "deleteOptions": {"preconditions": {"uid": pod.uid}},
    });
    Api::<Pod>::namespaced(client, &pod.namespace)
        .create_subresource::<Value, Value>("eviction", &pod.name, &PostParams::default(), &body)
        .await
        .map(|_| Removed::Evicted)
}

async fn delete(
    client: kube::Client,
    pod: &PodRef,
    grace_seconds: i64,
) -> Result<Removed, kube::Error> {
    let params = DeleteParams {
        grace_period_seconds: Some(u32::try_from(grace_seconds.max(1)).unwrap_or(u32::MAX)),
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    Api::<Pod>::namespaced(client, &pod.namespace)
        .delete(&pod.name, &params)
        .await
        .map(|_| Removed::Deleted { grace_seconds })
}

fn disrupted_taint() -> Taint {
    Taint {
        key: DISRUPTED_TAINT_KEY.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    }
}

fn tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.key == DISRUPTED_TAINT_KEY && t.effect == "NoSchedule")
        })
}

fn pod_ref(p: &PodRef) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(p.namespace.clone()),
        name: Some(p.name.clone()),
        uid: Some(p.uid.clone()),
        ..Default::default()
    }
}
