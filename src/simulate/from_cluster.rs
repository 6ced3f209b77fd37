//! `simulate --from-cluster`: a what-if of a live cluster. The cluster is read once, read-only
//! (`read`), loaded as it is into the embedded simulated cluster (`load`), and the controller
//! runs there for `--duration`; the report says what it did to the copy: pending pods placed,
//! nodes and cost before and after, claims drifted, budgets used. Nothing is written to the
//! source; the copy is thrown away at exit (or served, with `--serve`).

pub mod load;
pub mod read;
pub mod report;
mod workloads;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::timeline::{cost_per_hour, pending};
use super::{BackgroundSim, Kept, invariants, sim_settings, start_controller};
use crate::api::wellknown::NODEPOOL_LABEL;
use crate::metrics::Metrics;
use crate::sim::Store;
pub use report::Report;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Read(#[from] read::Error),
    #[error("loading the source's {kind} into the simulated cluster: {why}")]
    Load { kind: String, why: String },
    #[error(transparent)]
    Sim(#[from] crate::sim::cluster::Error),
    #[error(transparent)]
    Simulate(#[from] Box<super::Error>),
}

impl From<super::Error> for Error {
    fn from(e: super::Error) -> Self {
        Error::Simulate(Box::new(e))
    }
}

/// The copy with its controller running, from [`start`] until [`Running::finish`].
pub struct Running {
    sim: BackgroundSim,
    controller: crate::actors::controller::ControllerHandle,
    snap: read::Snapshot,
    before: Figures,
    started: Instant,
    controller_started: Instant,
    read_ms: u64,
    load_ms: u64,
}

/// Read `source` (and `management` for the Cluster API objects when given), load the copy and
/// start the controller on it.
pub async fn start(
    source: &Path,
    management: Option<&Path>,
    progress: bool,
) -> Result<Running, Error> {
    let started = Instant::now();
    let workload = read::client(source).await?;
    let management = match management {
        Some(p) => read::client(p).await?,
        None => workload.clone(),
    };
    let snap = read::read(&workload, &management).await?;
    let read_ms = started.elapsed().as_millis() as u64;
    say(
        progress,
        format!("read the source in {:.1}s", read_ms as f64 / 1000.0),
    );

    let loading = Instant::now();
    let sim =
        BackgroundSim::start_preloaded(load::cluster_config(&snap), Some(load::preload(&snap)))
            .await?;
    let load_ms = loading.elapsed().as_millis() as u64;
    workloads::spawn(&sim);
    let before = Figures::of(sim.cluster().store());
    sim.mark("controller started");
    let controller = start_controller(&sim, sim_settings(None), Metrics::new()).await?;
    Ok(Running {
        sim,
        controller,
        snap,
        before,
        started,
        controller_started: Instant::now(),
        read_ms,
        load_ms,
    })
}

/// [`start`], then the controller runs for `duration`, then the report. The copy and its
/// controller are kept (for `--serve`).
pub async fn what_if(
    source: &Path,
    management: Option<&Path>,
    duration: Duration,
    progress: bool,
) -> Result<(Report, Kept), Error> {
    let running = start(source, management, progress).await?;
    let until = Instant::now() + duration;
    while Instant::now() < until {
        let step = until
            .saturating_duration_since(Instant::now())
            .min(Duration::from_secs(10));
        tokio::time::sleep(step).await;
        say(
            progress,
            super::launch::progress_line(running.sim.cluster()),
        );
    }
    running.quiesce(progress).await?;
    Ok(running.finish())
}

/// How long a what-if waits, after its run, for what the controller started to land.
const QUIESCE_FOR: Duration = Duration::from_secs(120);

impl Running {
    pub fn sim(&self) -> &BackgroundSim {
        &self.sim
    }

    /// Waits (at most [`QUIESCE_FOR`]) until nothing is in flight in the copy: claims launched
    /// but not initialized, replicas written but their Machines not made yet. The report's
    /// invariants hold for a quiet cluster; taken mid-launch they would flag a replica write
    /// whose Machine is on its way. A copy still busy then is reported as it stands.
    pub async fn quiesce(&self, progress: bool) -> Result<(), Error> {
        let cluster = self.sim.cluster();
        let quiet = super::launch::wait_until(&self.sim, QUIESCE_FOR, || async {
            Ok(super::launch::quiet(cluster))
        })
        .await?;
        if !quiet {
            say(
                progress,
                format!(
                    "still in flight after {}s more: {}",
                    QUIESCE_FOR.as_secs(),
                    super::launch::unsettled(cluster).join("; ")
                ),
            );
        }
        Ok(())
    }

    /// The report on what the controller did since it started.
    pub fn finish(self) -> (Report, Kept) {
        let Running {
            sim,
            controller,
            snap,
            before,
            started,
            controller_started,
            read_ms,
            load_ms,
        } = self;
        let store = sim.cluster().store();
        let after = Figures::of(store);
        let audit = sim.cluster().disruption_audit().report();
        let inv = invariants::check(store, snap.capi_version);
        let created: Vec<&String> = after
            .claims
            .iter()
            .filter(|(c, _)| !before.claims.contains_key(*c))
            .map(|(_, pool)| pool)
            .collect();
        let report = Report {
            scenario: "from-cluster",
            source: report::Source {
                objects: snap
                    .kinds
                    .iter()
                    .map(|k| (k.plural.clone(), snap.count(&k.plural)))
                    .collect(),
                cluster_api_version: snap.capi_version.as_str().to_string(),
                read_ms,
                load_ms,
                notes: snap.notes.clone(),
            },
            duration_s: controller_started.elapsed().as_secs_f64(),
            elapsed_ms: started.elapsed().as_millis() as u64,
            pods: report::Pods {
                pending_at_start: before.pending.len(),
                placed: before
                    .pending
                    .iter()
                    .filter(|p| after.bound.contains(*p))
                    .count(),
                bound: after.bound.len(),
                unschedulable: after.pending.len(),
            },
            claims: report::Claims {
                at_start: before.claims.len(),
                created: created.len(),
                created_by_pool: created.into_iter().fold(BTreeMap::new(), |mut m, pool| {
                    *m.entry(pool.clone()).or_default() += 1;
                    m
                }),
                deleted: before
                    .claims
                    .keys()
                    .filter(|c| !after.claims.contains_key(*c))
                    .count(),
                at_end: after.claims.len(),
            },
            disruption: report::Disruption {
                nodes_before: before.nodes,
                nodes_after: after.nodes,
                cost_per_hour_before: round2(before.cost),
                cost_per_hour_after: round2(after.cost),
                decisions: audit.decisions.clone(),
                budget_violations: audit.budget_violations,
                budgets: audit.pools.clone(),
            },
            drifted: report::Drifted {
                at_end: after.drifted.clone(),
                replaced: audit.decisions.drifted,
            },
            invariants_ok: inv.ok(),
            problems: inv.problems.clone(),
            timeline: sim.timeline(),
        };
        (report, Kept::new(sim, Some(controller)))
    }
}

fn say(progress: bool, line: String) {
    if progress {
        say!("{line}");
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The copy at one moment, as the report compares it.
struct Figures {
    /// Pending pods by `namespace/name`.
    pending: BTreeSet<String>,
    bound: BTreeSet<String>,
    /// Live claims and their NodePool.
    claims: BTreeMap<String, String>,
    drifted: Vec<String>,
    nodes: usize,
    cost: f64,
}

impl Figures {
    fn of(store: &Store) -> Self {
        let key = |o: &Value| {
            format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            )
        };
        let deleting = |o: &Value| !o["metadata"]["deletionTimestamp"].is_null();
        let (mut pending_pods, mut bound) = (BTreeSet::new(), BTreeSet::new());
        store.visit("pods", |p| {
            if pending(p) {
                pending_pods.insert(key(p));
            } else if p["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty())
            {
                bound.insert(key(p));
            }
        });
        let (mut claims, mut drifted) = (BTreeMap::new(), Vec::new());
        store.visit("nodeclaims", |c| {
            if deleting(c) {
                return;
            }
            let name = c["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let marked = c["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|x| x["type"] == "Drifted" && x["status"] == "True")
            });
            if marked {
                drifted.push(name.clone());
            }
            let pool = c["metadata"]["labels"][NODEPOOL_LABEL]
                .as_str()
                .unwrap_or_default();
            claims.insert(name, pool.to_string());
        });
        let mut nodes = 0;
        store.visit("nodes", |n| nodes += usize::from(!deleting(n)));
        Self {
            pending: pending_pods,
            bound,
            claims,
            drifted,
            nodes,
            cost: cost_per_hour(store),
        }
    }
}
