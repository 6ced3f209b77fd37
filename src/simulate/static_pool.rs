//! `--scenario static` and `--scenario repair`: a static NodePool (`spec.replicas`, taken from
//! `--pods`, at least 5) holds its count through a Node deleted under it and a template drift;
//! with node repair on, a Node gone `Ready=False` is replaced, and with more than 20 % of the pool
//! unhealthy nothing is. The report gives the pool's count after each phase and the fewest and
//! most live claims seen while it recovered.

use std::fmt;
use std::time::Duration;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde_json::{Value, json};

use super::{BackgroundSim, Error, Kept, invariants, sim_settings, start_controller};
use crate::api::nodepool::NodePool;
use crate::api::wellknown::NODEPOOL_LABEL;
use crate::cli::{Scenario, SimulateArgs};
use crate::metrics::Metrics;

/// The static pool's name.
pub const POOL: &str = "static";
/// Node repair's toleration in the scenario (upstream's is 30 minutes): longer than any new
/// Node stays `Ready=False` while it registers, so only the Nodes the scenario sickens are due.
const TOLERATION: Duration = Duration::from_secs(60);
/// How long ago a sickened Node's `Ready` is dated to have turned: three seconds short of the
/// toleration, so its repair falls due three seconds after the scenario sickens it, time
/// enough to sicken the rest of a phase's Nodes before the first is due, even under load.
const SICK_FOR: Duration = Duration::from_secs(57);

/// A static copy of `pool` named `name`: the same template, `replicas`, no weight and no
/// limits but `nodes` (what the CRD allows a static pool).
pub fn static_copy(pool: &NodePool, name: &str, replicas: i64) -> NodePool {
    let mut spec = pool.spec.clone();
    spec.replicas = Some(replicas);
    spec.weight = None;
    spec.limits = spec
        .limits
        .map(|l| l.into_iter().filter(|(k, _)| k == "nodes").collect());
    let mut np = NodePool::new(name, spec);
    np.metadata.labels = pool.metadata.labels.clone();
    np
}

/// The pool after one phase.
#[derive(Clone, Debug, Serialize)]
pub struct Phase {
    pub phase: String,
    /// Claims of the pool not being deleted, and of them the initialized ones.
    pub live: usize,
    pub initialized: usize,
    /// The fewest and most live claims seen while the phase ran.
    pub fewest_live: usize,
    pub most_live: usize,
    /// Claims the controller has created for the pool so far.
    pub created: usize,
}

/// What replace-first did with a drifted pool at its limit, over a window of disruption passes.
#[derive(Clone, Debug, Serialize)]
pub struct Stalled {
    pub drifted: usize,
    pub replaced: usize,
    pub created: usize,
    pub window_seconds: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct StaticReport {
    pub scenario: String,
    pub replicas: usize,
    pub phases: Vec<Phase>,
    /// Repair: claims replaced as unhealthy, and Nodes whose repair was held back.
    pub repaired: usize,
    pub repair_blocked: usize,
    /// Full pool: drifted nodes replace-first left in place, and claims it created meanwhile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled: Option<Stalled>,
    pub invariants_ok: bool,
    pub problems: Vec<String>,
    /// The cluster over time, each phase's end marked: the HTML report's charts.
    #[serde(skip)]
    pub timeline: super::timeline::Timeline,
}

impl StaticReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

impl fmt::Display for StaticReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "scenario {}: static NodePool {POOL}, spec.replicas {}",
            self.scenario, self.replicas
        )?;
        for p in &self.phases {
            writeln!(
                f,
                "  {:<32} {} live ({} initialized), {}..{} live meanwhile, {} created so far",
                p.phase, p.live, p.initialized, p.fewest_live, p.most_live, p.created
            )?;
        }
        if let Some(s) = &self.stalled {
            writeln!(
                f,
                "  without TerminateFirstDrift: {} drifted nodes, {} replaced, {} claims created in {} s",
                s.drifted, s.replaced, s.created, s.window_seconds
            )?;
        }
        if self.scenario == "repair" {
            writeln!(
                f,
                "  repair: {} replaced, {} held back",
                self.repaired, self.repair_blocked
            )?;
        }
        writeln!(
            f,
            "  invariants: {}",
            if self.invariants_ok { "ok" } else { "VIOLATED" }
        )?;
        for p in &self.problems {
            writeln!(f, "    {p}")?;
        }
        Ok(())
    }
}

struct Run {
    sim: BackgroundSim,
    replicas: usize,
    deadline: Duration,
    phases: Vec<Phase>,
    created: usize,
    /// The claims before the template drifted.
    original: Vec<String>,
}

impl Run {
    fn claims(&self) -> Vec<Value> {
        self.sim
            .cluster()
            .store()
            .list("nodeclaims", None)
            .into_iter()
            .filter(|c| c["metadata"]["labels"][NODEPOOL_LABEL] == POOL)
            .collect()
    }

    fn live(&self) -> Vec<Value> {
        let mut live = self.claims();
        live.retain(|c| c["metadata"]["deletionTimestamp"].is_null());
        live
    }

    fn initialized(c: &Value) -> bool {
        c["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|x| x["type"] == "Initialized" && x["status"] == "True")
        })
    }

    fn node_of(c: &Value) -> Option<String> {
        c["status"]["nodeName"].as_str().map(String::from)
    }

    /// Waits until `done` holds, recording the phase and the fewest and most live claims seen.
    async fn phase(&mut self, name: &str, done: impl Fn(&Run) -> bool) -> Result<(), Error> {
        let start = std::time::Instant::now();
        let progress = super::progress::Progress::new();
        let (mut fewest, mut most) = (usize::MAX, 0);
        loop {
            let live = self.live().len();
            fewest = fewest.min(live);
            most = most.max(live);
            if done(self) {
                break;
            }
            if progress.due() {
                progress.print(&format!("waiting for {name:?}: {live} live claims"));
            }
            if start.elapsed() > self.deadline {
                return Err(Error::NotSettled {
                    after: self.deadline,
                    why: format!("phase {name:?}: {live} live claims"),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let live = self.live();
        self.created = self.created_now();
        self.phases.push(Phase {
            phase: name.into(),
            live: live.len(),
            initialized: live.iter().filter(|c| Self::initialized(c)).count(),
            fewest_live: fewest,
            most_live: most,
            created: self.created,
        });
        say!("{name}: {} live claims", live.len());
        self.sim.mark(name);
        Ok(())
    }

    /// The pool holds its replicas and none of them is one from before the drift.
    fn all_replaced(&self) -> bool {
        self.holds()
            && self
                .claims()
                .iter()
                .all(|c| !self.original.contains(&c.name_any_json()))
    }

    /// The pool holds exactly its replicas, all initialized, nothing deleting.
    fn holds(&self) -> bool {
        let all = self.claims();
        all.len() == self.replicas
            && all
                .iter()
                .all(|c| Self::initialized(c) && c["metadata"]["deletionTimestamp"].is_null())
    }

    async fn run<T: Send + 'static, F>(
        &self,
        what: &str,
        f: impl FnOnce(kube::Client) -> F + Send + 'static,
    ) -> Result<T, Error>
    where
        F: std::future::Future<Output = Result<T, kube::Error>> + Send,
    {
        let what = what.to_string();
        self.sim
            .run(move |c| async move { f(c.client()).await })
            .await?
            .map_err(|source| Error::Kube { what, source })
    }

    /// Sets a Node's `Ready` to `status`, as a kubelet failing for `SICK_FOR` would; the
    /// kubelet stand-in lets go of it first (it would report it Ready again).
    async fn sicken(&self, node: String, status: &'static str) -> Result<(), Error> {
        self.run("marking a Node unhealthy", move |client| async move {
            let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
            nodes
                .patch(
                    &node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {
                        crate::sim::kubelet::SIM_NODE_ANNOTATION: null}}})),
                )
                .await?;
            let now = jiff::Timestamp::now();
            let since = now.checked_sub(SICK_FOR).unwrap_or(now);
            let stamp = |t: jiff::Timestamp| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
            nodes
                .patch_status(
                    &node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"conditions": [{
                        "type": "Ready", "status": status, "reason": "KubeletNotReady",
                        "lastHeartbeatTime": stamp(now), "lastTransitionTime": stamp(since)}]}})),
                )
                .await
                .map(|_| ())
        })
        .await
    }
}

/// `--scenario static` or `--scenario repair`.
pub async fn run_kept(args: &SimulateArgs) -> Result<(StaticReport, Kept), Error> {
    let repair = args.scenario == Scenario::Repair;
    let full = args.scenario == Scenario::FullPool;
    let sim = super::start_sim(args).await?;
    super::announce(&sim, args, "nodeclaims,nodes");
    super::pods::seed_machine_deployments(&sim, args).await?;
    let replicas = args.pods.max(5);
    let seeded = sim
        .run(|c| async move { super::launch::seed_nodeclass_and_pool(c.client()).await })
        .await??;
    let mut pool = static_copy(&seeded, POOL, replicas as i64);
    if full {
        pool.spec.limits = Some(
            serde_json::from_value(json!({"nodes": replicas.to_string()}))
                .map_err(|e| Error::Usage(format!("the pool's limits: {e}")))?,
        );
    }
    let mut settings = sim_settings(args.create_timeout);
    super::disruption::fast_disruption(&mut settings);
    if repair {
        settings.node_repair = Some(crate::view::repair::RepairPolicies::ready(TOLERATION));
    }
    let metrics = Metrics::new();
    let controller = start_controller(&sim, settings.clone(), metrics.clone()).await?;
    let mut run = Run {
        sim,
        replicas,
        deadline: args.deadline,
        phases: Vec::new(),
        created: 0,
        original: Vec::new(),
    };
    run.run("creating the static NodePool", move |client| async move {
        Api::<NodePool>::all(client)
            .create(&PostParams::default(), &pool)
            .await
            .map(|_| ())
    })
    .await?;
    run.phase("launched", Run::holds).await?;
    let mut stalled = None;
    let controller = if repair {
        repair_phases(&mut run).await?;
        controller
    } else if full {
        stalled = Some(replace_first_stalls(&mut run).await?);
        // The same controller restarted with the gate, as an operator would turn it on.
        controller.stop();
        settings.disruption.terminate_first_drift = true;
        let controller = start_controller(&run.sim, settings, metrics.clone()).await?;
        run.phase("terminate-first rolled the drift", Run::all_replaced)
            .await?;
        controller
    } else {
        static_phases(&mut run).await?;
        controller
    };
    let inv = invariants::check(
        run.sim.cluster().store(),
        run.sim.cluster().capi_version().into(),
    );
    let encoded = metrics.encode();
    let metric = |name: &str| -> usize {
        encoded
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as usize
    };
    let timeline = run.sim.timeline();
    let report = StaticReport {
        timeline,
        scenario: match args.scenario {
            Scenario::Repair => "repair",
            Scenario::FullPool => "full-pool",
            _ => "static",
        }
        .into(),
        stalled,
        replicas,
        phases: run.phases,
        repaired: metric("karpenter_nodeclaims_unhealthy_disrupted_total"),
        repair_blocked: metric("karpenter_capi_nodes_repair_blocked"),
        invariants_ok: inv.ok(),
        problems: inv.problems.iter().map(|p| format!("{p:?}")).collect(),
    };
    Ok((report, Kept::new(run.sim, Some(controller))))
}

/// A Node deleted under the pool, then a template change that drifts every node.
async fn static_phases(run: &mut Run) -> Result<(), Error> {
    let victim = run
        .live()
        .first()
        .and_then(Run::node_of)
        .unwrap_or_default();
    run.run("deleting a Node", move |client| async move {
        Api::<k8s_openapi::api::core::v1::Node>::all(client)
            .delete(&victim, &DeleteParams::default())
            .await
            .map(|_| ())
    })
    .await?;
    let before = run.created;
    run.phase("a Node deleted", move |r| {
        r.holds() && r.created_now() > before
    })
    .await?;
    run.original = run.live().iter().map(|c| c.name_any_json()).collect();
    drift_the_template(run).await?;
    run.phase("every node drifted and replaced", Run::all_replaced)
        .await
}

/// The pool at its limit drifts with `TerminateFirstDrift` off: every claim is marked
/// `Drifted`, and over a window of disruption passes nothing is replaced (no room for a
/// replacement first).
async fn replace_first_stalls(run: &mut Run) -> Result<Stalled, Error> {
    run.original = run.live().iter().map(|c| c.name_any_json()).collect();
    drift_the_template(run).await?;
    run.phase("every node drifted", |r| {
        r.live().iter().all(|c| {
            c["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|d| d["type"] == "Drifted" && d["status"] == "True")
            })
        })
    })
    .await?;
    let before = run.created_now();
    tokio::time::sleep(STALL_WINDOW).await;
    let replaced = run
        .original
        .iter()
        .filter(|n| !run.live().iter().any(|c| c.name_any_json() == **n))
        .count();
    run.phase("replace-first stalled", |_| true).await?;
    Ok(Stalled {
        drifted: run.original.len(),
        replaced,
        created: run.created_now() - before,
        window_seconds: STALL_WINDOW.as_secs(),
    })
}

/// How long the full-pool scenario watches replace-first do nothing: several disruption passes
/// at the scenario's pace.
const STALL_WINDOW: Duration = Duration::from_secs(5);

async fn drift_the_template(run: &Run) -> Result<(), Error> {
    run.run("changing the template", |client| async move {
        Api::<NodePool>::all(client)
            .patch(
                POOL,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"spec": {"template": {"metadata": {"labels": {"phase": "drifted"}}}}}),
                ),
            )
            .await
            .map(|_| ())
    })
    .await
}

/// One Node `Ready=False` (replaced past the toleration), then over a fifth of the pool's Nodes
/// `Unknown` (two of five; more than the 20 % repair allows: held back).
async fn repair_phases(run: &mut Run) -> Result<(), Error> {
    let live = run.live();
    let first = live.first().map(|c| c.name_any_json()).unwrap_or_default();
    if let Some(node) = live.first().and_then(Run::node_of) {
        run.sicken(node, "False").await?;
    }
    run.phase("one Node Ready=False, replaced", move |r| {
        r.holds() && !r.claims().iter().any(|c| c.name_any_json() == first)
    })
    .await?;
    // Repair allows a fifth of the pool rounded up (upstream's scaled percentage): one more is
    // held back.
    let over_a_fifth = crate::view::repair::threshold(run.replicas) + 1;
    let sick: Vec<String> = run
        .live()
        .iter()
        .take(over_a_fifth)
        .filter_map(Run::node_of)
        .collect();
    for node in sick.clone() {
        run.sicken(node, "Unknown").await?;
    }
    // Held back: the decision is told by an Event per Node, and nothing is deleted.
    run.phase("over a fifth Unknown, held back", move |r| {
        let told = r
            .sim
            .cluster()
            .store()
            .list("events.events.k8s.io", None)
            .into_iter()
            .filter(|e| e["reason"] == "NodeRepairBlocked" && e["regarding"]["kind"] == "Node")
            .filter(|e| {
                e["regarding"]["name"]
                    .as_str()
                    .is_some_and(|n| sick.iter().any(|s| s == n))
            })
            .count();
        told == sick.len() && r.claims().len() == r.replicas
    })
    .await
}

trait NameJson {
    fn name_any_json(&self) -> String;
}

impl NameJson for Value {
    fn name_any_json(&self) -> String {
        self["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

impl Run {
    fn created_now(&self) -> usize {
        self.sim
            .cluster()
            .stats()
            .writes()
            .iter()
            .filter(|w| {
                w.agent == crate::app::USER_AGENT
                    && w.resource == "nodeclaims"
                    && w.verb == "create"
            })
            .count()
    }
}
