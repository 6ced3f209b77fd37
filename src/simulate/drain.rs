//! `simulate --scenario drain`: provision Deployments of pods (every Deployment with a
//! PodDisruptionBudget of `maxUnavailable: 1`, every fifth one `karpenter.sh/do-not-disrupt`,
//! pods that take a moment to exit), then delete a third of the NodeClaims at once and measure
//! the drains. Everything is measured by the simulated server: its write log, its request
//! counts, its audit of how pods were removed, and the NodeClaim observer.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::launch;
use super::pods::{PodReport, provision};
use super::report::Percentiles;
use super::{BackgroundSim, Error, Kept};
use crate::api::wellknown::DO_NOT_DISRUPT_ANNOTATION;
use crate::cli::SimulateArgs;
use crate::sim::drain_audit::Violation;
use crate::sim::pod_lifecycle::EXIT_AFTER_ANNOTATION;

/// The claims' `terminationGracePeriod`: do-not-disrupt pods are deleted when it runs out.
const CLAIM_GRACE_SECS: u64 = 20;
/// The pods' own `terminationGracePeriodSeconds`.
const POD_GRACE_SECS: i64 = 5;

#[derive(Clone, Debug, Default, Serialize)]
pub struct TerminationCounts {
    pub claims_deleted: usize,
    /// Deleted claims whose Node reached `Drained=True`.
    pub drained: usize,
    /// Successful evictions by the controller.
    pub evictions: usize,
    /// Eviction requests refused (a PodDisruptionBudget's 429), to be retried.
    pub eviction_retries_429: u64,
    pub pdb_violations: usize,
    pub do_not_disrupt_violations: usize,
    /// Machines of the deleted claims that are gone.
    pub machines_released: usize,
    pub nodes_left: usize,
    /// Claim deleted -> its Node drained.
    pub drain_ms: Percentiles,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct DrainReport {
    #[serde(flatten)]
    pub pods: PodReport,
    pub termination: TerminationCounts,
}

impl DrainReport {
    pub fn invariants_ok(&self) -> bool {
        self.pods.launch.invariants_ok
    }

    pub fn to_json(&self) -> String {
        self.pods.to_json_with(
            "termination",
            serde_json::to_value(&self.termination).unwrap_or(Value::Null),
            self.invariants_ok(),
        )
    }
}

impl std::fmt::Display for DrainReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.pods)?;
        let t = &self.termination;
        write!(
            f,
            "  drain:    {} claims deleted, {} drained, {} machines released, {} nodes left; {} evictions, {} refused by a budget (retried); violations: {} PDB, {} do-not-disrupt; deleted -> drained p50 {:.0} ms p99 {:.0} ms",
            t.claims_deleted,
            t.drained,
            t.machines_released,
            t.nodes_left,
            t.evictions,
            t.eviction_retries_429,
            t.pdb_violations,
            t.do_not_disrupt_violations,
            t.drain_ms.p50,
            t.drain_ms.p99
        )
    }
}

/// `simulate --scenario drain`.
pub async fn run(args: &SimulateArgs) -> Result<DrainReport, Error> {
    run_kept(args).await.map(|(report, _)| report)
}

/// `run`, handing back the cluster and the controller (`simulate --serve` keeps them running).
pub async fn run_kept(args: &SimulateArgs) -> Result<(DrainReport, Kept), Error> {
    let p = provision(
        args,
        |pool| {
            *pool = json!({"spec": {"template": {"spec": {
                "terminationGracePeriod": format!("{CLAIM_GRACE_SECS}s")}}}});
        },
        |d, shape| {
            shape.grace_seconds = POD_GRACE_SECS;
            // Applications take 0.2 .. 1.6 s to exit on SIGTERM.
            shape.annotations.insert(
                EXIT_AFTER_ANNOTATION.to_string(),
                format!("{:.1}", 0.2 + (d % 8) as f64 * 0.2),
            );
            if d % 5 == 0 {
                shape
                    .annotations
                    .insert(DO_NOT_DISRUPT_ANNOTATION.to_string(), "true".to_string());
            }
            shape.labels.insert("app".into(), format!("app-{d}"));
        },
    )
    .await?;
    let deployments = args.deployments.max(1);
    p.sim
        .run(move |c| async move {
            let api: kube::Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
                kube::Api::namespaced(c.client(), launch::NAMESPACE);
            for d in 0..deployments {
                let pdb = serde_json::from_value(json!({
                    "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": {"name": format!("app-{d}")},
                    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": format!("app-{d}")}}},
                }))
                .map_err(|e| Error::Kube {
                    what: "building a PodDisruptionBudget".into(),
                    source: kube::Error::SerdeError(e),
                })?;
                api.create(&kube::api::PostParams::default(), &pdb)
                    .await
                    .map_err(|source| Error::Kube {
                        what: format!("creating PodDisruptionBudget app-{d}"),
                        source,
                    })?;
            }
            Ok::<_, Error>(())
        })
        .await??;

    let mut victims: Vec<(String, Option<String>)> = p
        .observer
        .snapshot()
        .into_iter()
        .filter(|(_, t)| t.deleted_ms.is_none())
        .map(|(name, t)| (name, t.machine))
        .collect();
    victims.sort();
    let victims: Vec<(String, Option<String>)> = victims.into_iter().step_by(3).collect();
    say!(
        "deleting {} of the NodeClaims at once (PDBs maxUnavailable 1, every fifth Deployment do-not-disrupt, claims' terminationGracePeriod {CLAIM_GRACE_SECS}s)",
        victims.len()
    );
    let names: Vec<String> = victims.iter().map(|(n, _)| n.clone()).collect();
    p.sim
        .run(move |c| async move {
            let api: kube::Api<crate::api::nodeclaim::NodeClaim> =
                kube::Api::all(c.karpenter_client());
            for n in names {
                match api.delete(&n, &kube::api::DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(source) => {
                        return Err(Error::Kube {
                            what: format!("deleting NodeClaim {n}"),
                            source,
                        });
                    }
                }
            }
            Ok(())
        })
        .await??;
    p.sim.mark("claims deleted");
    wait_gone(&p.sim, &victims, args.deadline).await?;
    p.sim.mark("drained");
    let pods = p.measure();
    let termination = termination_counts(&p.sim, &p.observer, &victims);
    let mut report = DrainReport { pods, termination };
    report.pods.launch.scenario = "drain".into();
    let t = &report.termination;
    if t.pdb_violations + t.do_not_disrupt_violations > 0 {
        report.pods.launch.invariants_ok = false;
        report.pods.launch.problems.push(format!(
            "{} PodDisruptionBudget and {} do-not-disrupt violations (see the server's audit)",
            t.pdb_violations, t.do_not_disrupt_violations
        ));
    }
    Ok((report, p.kept()))
}

/// Wait (reading the in-process store) until every deleted claim is gone and the launch path is
/// quiet again.
async fn wait_gone(
    sim: &BackgroundSim,
    victims: &[(String, Option<String>)],
    deadline: Duration,
) -> Result<(), Error> {
    let start = Instant::now();
    let printer = super::progress::Progress::new();
    loop {
        let store = sim.cluster().karpenter_store();
        let left = victims
            .iter()
            .filter(|(n, _)| store.get("nodeclaims", "", n).is_some())
            .count();
        if left == 0 && launch::quiet(sim.cluster()) {
            return Ok(());
        }
        if start.elapsed() > deadline {
            return Err(Error::NotSettled {
                after: deadline,
                why: format!("{left} deleted NodeClaims still terminating"),
            });
        }
        if printer.due() {
            printer.print(&format!("{left} claims still terminating"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn termination_counts(
    sim: &BackgroundSim,
    observer: &super::observer::Observer,
    victims: &[(String, Option<String>)],
) -> TerminationCounts {
    let stats = sim.cluster().stats();
    let store = sim.cluster().capi_store();
    let writes = stats.writes();
    let controller = |agent: &str| agent.starts_with("karpenter-capi");
    let deleted_at: BTreeMap<String, u64> = writes
        .iter()
        .filter(|w| w.resource == "nodeclaims" && w.verb == "delete" && w.subresource.is_empty())
        .map(|w| (w.name.clone(), w.at_ms))
        .collect();
    let times = observer.snapshot();
    let mut drained = 0;
    let mut drain_ms = Vec::new();
    for (name, _) in victims {
        if let Some(d) = times.get(name).and_then(|t| t.drained_ms) {
            drained += 1;
            if let Some(at) = deleted_at.get(name) {
                drain_ms.push(d.saturating_sub(*at) as f64);
            }
        }
    }
    let evictions = writes
        .iter()
        .filter(|w| w.resource == "pods" && w.subresource == "eviction" && controller(&w.agent))
        .count();
    let asked = stats.requests("create", "pods", "eviction");
    let violations = stats.violations();
    let count = |v: Violation| violations.iter().filter(|r| r.violation == v).count();
    let machines_released = victims
        .iter()
        .filter_map(|(_, m)| m.as_ref())
        .filter(|m| {
            m.split_once('/')
                .is_none_or(|(ns, n)| store.get("machines", ns, n).is_none())
        })
        .count();
    TerminationCounts {
        claims_deleted: victims.len(),
        drained,
        evictions,
        eviction_retries_429: asked.saturating_sub(evictions as u64),
        pdb_violations: count(Violation::PdbViolation),
        do_not_disrupt_violations: count(Violation::DoNotDisrupt),
        machines_released,
        nodes_left: store.list("nodes", None).len(),
        drain_ms: Percentiles::of(drain_ms),
    }
}
