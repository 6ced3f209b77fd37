//! The report's time series: a sampler on the simulated cluster's runtime counts, from the
//! server's own store, pending pods, nodes and NodeClaims by phase, the cost per hour and the
//! NodePools' up-to-date nodes; the replica writes come from the server's write log afterwards.
//! The controller is never asked: even its NodePool status is read as the server stores it.
//!
//! Sampling costs one walk of the store (no copies) every interval. The interval starts at
//! 250 ms, doubles whenever `MAX_SAMPLES` are held (every other sample is dropped then), so a
//! run of any length ends with at most `MAX_SAMPLES` samples, and stays at least 50 times what
//! a sample takes (a moving average), so sampling takes at most about 2% of the time however
//! large the cluster.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;

use crate::api::wellknown::{DEPLOYMENT_NAME_LABEL, POOL_NAME_LABEL, PRICE_ANNOTATION};
use crate::app::USER_AGENT;
use crate::sim::Store;
use crate::sim::cluster::SimCluster;

/// The most samples held; reaching it halves them and doubles the interval.
pub const MAX_SAMPLES: usize = 480;
const FIRST_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct NodePhases {
    pub ready: usize,
    pub not_ready: usize,
    pub terminating: usize,
}

/// NodeClaims by how far they got: each counts in its latest phase only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ClaimPhases {
    /// Created, no provider ID yet.
    pub launching: usize,
    pub launched: usize,
    pub registered: usize,
    pub initialized: usize,
    pub terminating: usize,
}

/// The NodePools' rollout status summed over the pools: `status.nodes` and
/// `status.upToDateNodes` as the controller last wrote them (issue 43), so a chart shows a
/// template change rolling out as the pools report it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct UpToDate {
    pub nodes: usize,
    pub up_to_date: usize,
}

/// The cluster at one moment, on the server's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Sample {
    pub at_ms: u64,
    pub pending_pods: usize,
    pub nodes: NodePhases,
    pub claims: ClaimPhases,
    pub cost_per_hour: f64,
    pub pool_status: UpToDate,
}

/// A moment the scenario moved from one phase to the next (`provisioned`, `scaled down`,
/// `template changed`, ...), on the server's clock, so the charts can show what caused a change.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    pub at_ms: u64,
    pub label: String,
}

/// Everything the report's charts show.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub samples: Vec<Sample>,
    /// The scenario's phase changes, in time order.
    pub marks: Vec<Mark>,
    /// The controller's replica writes per MachineDeployment (`namespace/name`), counted up to
    /// each sample's time.
    pub replica_writes: BTreeMap<String, Vec<usize>>,
}

/// `v[path[0]][path[1]]...`: plain field lookups (no JSON pointer parsing, no allocation), as
/// the sampler walks thousands of objects.
fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn deleting(v: &Value) -> bool {
    at(v, &["metadata", "deletionTimestamp"]).is_some_and(|t| !t.is_null())
}

fn condition_true(v: &Value, ty: &str) -> bool {
    at(v, &["status", "conditions"])
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == ty && c["status"] == "True"))
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    at(v, path).and_then(Value::as_str).unwrap_or_default()
}

/// A pod waiting for a node: unbound, not finished, not being deleted.
pub fn pending(pod: &Value) -> bool {
    !deleting(pod)
        && str_at(pod, &["spec", "nodeName"]).is_empty()
        && !matches!(str_at(pod, &["status", "phase"]), "Succeeded" | "Failed")
}

fn claim_phases(store: &Store) -> ClaimPhases {
    let mut p = ClaimPhases::default();
    store.visit("nodeclaims", |c| {
        let slot = if deleting(c) {
            &mut p.terminating
        } else if condition_true(c, "Initialized") {
            &mut p.initialized
        } else if condition_true(c, "Registered") {
            &mut p.registered
        } else if condition_true(c, "Launched") {
            &mut p.launched
        } else {
            &mut p.launching
        };
        *slot += 1;
    });
    p
}

fn node_phases(store: &Store) -> NodePhases {
    let mut p = NodePhases::default();
    store.visit("nodes", |n| {
        let slot = if deleting(n) {
            &mut p.terminating
        } else if condition_true(n, "Ready") {
            &mut p.ready
        } else {
            &mut p.not_ready
        };
        *slot += 1;
    });
    p
}

/// The NodePools' `status.nodes` and `status.upToDateNodes`, summed; a pool whose status has
/// no counts yet adds nothing.
fn pool_status(store: &Store) -> UpToDate {
    let mut u = UpToDate::default();
    let count = |v: &Value, field: &str| {
        at(v, &["status", field])
            .and_then(Value::as_u64)
            .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
    };
    store.visit("nodepools", |p| {
        u.nodes += count(p, "nodes");
        u.up_to_date += count(p, "upToDateNodes");
    });
    u
}

/// The sum of the prices (the node groups' price annotation) of the live Machines; a
/// MachinePool without MachinePool Machines counts each instance it lists.
pub fn cost_per_hour(store: &Store) -> f64 {
    cost_per_hour_in(store, None)
}

/// [`cost_per_hour`] of the Machines in namespace `scope` alone (every namespace when None).
pub fn cost_per_hour_in(store: &Store, scope: Option<&str>) -> f64 {
    // (kind's Machine label, namespace, name) -> price
    let mut prices: BTreeMap<(&str, String, String), f64> = BTreeMap::new();
    let mut listed: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (resource, label) in [
        ("machinedeployments", DEPLOYMENT_NAME_LABEL),
        ("machinepools", POOL_NAME_LABEL),
    ] {
        store.visit_in(resource, scope, |g| {
            let price = str_at(g, &["metadata", "annotations", PRICE_ANNOTATION])
                .parse()
                .unwrap_or(0.0);
            let ns = str_at(g, &["metadata", "namespace"]).to_string();
            let name = str_at(g, &["metadata", "name"]).to_string();
            if resource == "machinepools" {
                let n = g
                    .pointer("/spec/providerIDList")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                listed.insert((ns.clone(), name.clone()), n);
            }
            prices.insert((label, ns, name), price);
        });
    }
    let mut total = 0.0;
    store.visit_in("machines", scope, |m| {
        if deleting(m) {
            return;
        }
        let ns = str_at(m, &["metadata", "namespace"]).to_string();
        for label in [DEPLOYMENT_NAME_LABEL, POOL_NAME_LABEL] {
            let group = str_at(m, &["metadata", "labels", label]);
            if group.is_empty() {
                continue;
            }
            listed.remove(&(ns.clone(), group.to_string()));
            total += prices
                .get(&(label, ns.clone(), group.to_string()))
                .copied()
                .unwrap_or(0.0);
        }
    });
    // Pools with no Machine at all: their instances are only in spec.providerIDList.
    for ((ns, name), n) in listed {
        let price = prices
            .get(&(POOL_NAME_LABEL, ns, name))
            .copied()
            .unwrap_or(0.0);
        total += price * n as f64;
    }
    total
}

/// Count the cluster now, each kind where it lives (Machines in the management cluster when it
/// is apart, Karpenter's objects there too with `--karpenter-objects management`).
pub fn sample(cluster: &SimCluster, at_ms: u64) -> Sample {
    let (store, karpenter) = (cluster.store(), cluster.karpenter_store());
    let mut pending_pods = 0;
    store.visit("pods", |p| pending_pods += usize::from(pending(p)));
    Sample {
        at_ms,
        pending_pods,
        nodes: node_phases(store),
        claims: claim_phases(karpenter),
        // In a fleet the management store holds every Cluster's Machines: this cluster's only.
        cost_per_hour: cost_per_hour_in(cluster.capi_store(), cluster.capi_namespace()),
        pool_status: pool_status(karpenter),
    }
}

#[derive(Debug)]
struct Held {
    /// The interval the sample count allows.
    every: Duration,
    /// A moving average of how long a sample takes.
    cost: Duration,
    samples: Vec<Sample>,
    /// Never thinned: a scenario has a handful.
    marks: Vec<Mark>,
}

impl Held {
    fn interval(&self) -> Duration {
        self.every.max(self.cost * 50)
    }
}

/// Samples the simulated cluster until it is gone (clones share the samples).
#[derive(Clone, Debug)]
pub struct Sampler {
    held: Arc<Mutex<Held>>,
}

impl Default for Sampler {
    fn default() -> Self {
        Self {
            held: Arc::new(Mutex::new(Held {
                every: FIRST_INTERVAL,
                cost: Duration::ZERO,
                samples: Vec::new(),
                marks: Vec::new(),
            })),
        }
    }
}

impl Sampler {
    /// Sample every interval while the cluster lives; holds it only while counting, so the
    /// cluster still goes away when its owner drops it.
    pub async fn run(self, cluster: Weak<SimCluster>) {
        loop {
            let interval = self.held.lock().interval();
            tokio::time::sleep(interval).await;
            let Some(c) = cluster.upgrade() else {
                return;
            };
            let took = Instant::now();
            let s = sample(&c, c.stats().now_ms());
            drop(c);
            self.record(s);
            let mut held = self.held.lock();
            held.cost = (held.cost * 4 + took.elapsed()) / 5;
        }
    }

    fn record(&self, s: Sample) {
        let mut held = self.held.lock();
        held.samples.push(s);
        if held.samples.len() >= MAX_SAMPLES {
            // Keep the latest and every other one before it.
            let last = held.samples.len() - 1;
            let kept = held
                .samples
                .iter()
                .enumerate()
                .filter(|(i, _)| (last - i).is_multiple_of(2))
                .map(|(_, s)| *s)
                .collect();
            held.samples = kept;
            held.every *= 2;
        }
    }

    /// Note that the scenario entered a new phase at `at_ms` (the server's clock).
    pub fn mark(&self, at_ms: u64, label: &str) {
        self.held.lock().marks.push(Mark {
            at_ms,
            label: label.to_string(),
        });
    }

    /// The timeline so far, with one last sample taken now.
    pub fn timeline(&self, cluster: &SimCluster) -> Timeline {
        let stats = cluster.stats();
        self.record(sample(cluster, stats.now_ms()));
        let (samples, marks) = {
            let held = self.held.lock();
            (held.samples.clone(), held.marks.clone())
        };
        let mut writes: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for w in stats.writes() {
            if w.agent == USER_AGENT
                && w.resource == "machinedeployments"
                && matches!(w.verb.as_str(), "patch" | "update")
            {
                writes
                    .entry(format!("{}/{}", w.namespace, w.name))
                    .or_default()
                    .push(w.at_ms);
            }
        }
        let replica_writes = writes
            .into_iter()
            .map(|(md, at)| {
                // The write log is in time order, so a partition point counts those up to t.
                let counts = samples
                    .iter()
                    .map(|s| at.partition_point(|&t| t <= s.at_ms))
                    .collect();
                (md, counts)
            })
            .collect();
        Timeline {
            samples,
            marks,
            replica_writes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_keeps_the_latest_and_bounds_the_count() {
        let s = Sampler::default();
        for i in 0..(MAX_SAMPLES * 5) as u64 {
            s.record(Sample {
                at_ms: i,
                ..Sample::default()
            });
        }
        let held = s.held.lock();
        assert!(held.samples.len() < MAX_SAMPLES);
        assert!(held.samples.len() >= MAX_SAMPLES / 2);
        assert_eq!(
            held.samples.last().map(|s| s.at_ms),
            Some((MAX_SAMPLES * 5) as u64 - 1)
        );
        assert!(held.samples.windows(2).all(|w| w[0].at_ms < w[1].at_ms));
        assert!(held.every > FIRST_INTERVAL);
    }

    #[test]
    fn pending_means_unbound_unfinished_and_not_deleting() {
        let claim = |conds: &[&str], deleting: bool| {
            let mut c = serde_json::json!({"status": {"conditions": conds.iter()
                .map(|t| serde_json::json!({"type": t, "status": "True"})).collect::<Vec<_>>()}});
            if deleting {
                c["metadata"] = serde_json::json!({"deletionTimestamp": "2024-01-01T00:00:00Z"});
            }
            c
        };
        let pod = serde_json::json!({"spec": {}, "status": {"phase": "Pending"}});
        assert!(pending(&pod));
        let bound = serde_json::json!({"spec": {"nodeName": "n"}});
        assert!(!pending(&bound));
        let finished = serde_json::json!({"spec": {}, "status": {"phase": "Succeeded"}});
        assert!(!pending(&finished));
        assert!(!deleting(&claim(&["Launched"], false)));
        assert!(deleting(&claim(&[], true)));
        assert!(condition_true(
            &claim(&["Launched", "Registered"], false),
            "Registered"
        ));
    }
}
