//! `simulate --scenario buffer`: what a CapacityBuffer buys. The pods of `--pods` are provisioned
//! once without a buffer (they wait for launches); then a buffer of the same number of chunks of
//! their shape is created and provisioned, and the same burst arrives again: those pods bind on
//! the buffer's room without waiting for a launch, and the buffer is provisioned again behind
//! them. The report gives pending -> bound for both bursts.

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use super::BackgroundSim;
use super::pods::{self, PodReport, SHAPES};
use super::report::Percentiles;
use super::{Error, Kept, launch};
use crate::cli::SimulateArgs;
use crate::sim::cluster::PodShape;

/// The buffer and the burst that uses it.
const BUFFER: &str = "headroom";
const TEMPLATE: &str = "headroom-chunk";
const BURST: &str = "burst";

#[derive(Clone, Debug, Default, Serialize)]
pub struct BufferReport {
    #[serde(flatten)]
    pub pods: PodReport,
    pub buffer: BufferSection,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct BufferSection {
    /// Chunks the buffer holds (one per pod of a burst).
    pub replicas: usize,
    /// Nodes launched for the buffer before the second burst.
    pub nodes_for_buffer: usize,
    /// Pods of the first burst (no buffer): created -> bound.
    pub without_buffer_ms: Percentiles,
    /// Pods of the second burst (arriving within the buffer): created -> bound.
    pub with_buffer_ms: Percentiles,
    /// Pods of the second burst bound before any claim made after they arrived launched.
    pub bound_before_a_launch: usize,
    /// Claims made after the second burst arrived (the buffer provisioned again).
    pub refill_claims: usize,
    /// The buffer's `Provisioning` condition at the end.
    pub provisioning_at_end: String,
}

impl BufferReport {
    pub fn to_json(&self) -> String {
        self.pods.to_json_with(
            "buffer",
            serde_json::to_value(&self.buffer).unwrap_or(Value::Null),
            self.pods.launch.invariants_ok,
        )
    }
}

impl fmt::Display for BufferReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.pods)?;
        let b = &self.buffer;
        write!(
            f,
            "  buffer:   {} chunks on {} nodes; pending -> bound without the buffer p50 {:.0} ms p99 {:.0} ms, within it p50 {:.0} ms p99 {:.0} ms ({} of {} bound before any launch); {} claims refilled it; Provisioning {}",
            b.replicas,
            b.nodes_for_buffer,
            b.without_buffer_ms.p50,
            b.without_buffer_ms.p99,
            b.with_buffer_ms.p50,
            b.with_buffer_ms.p99,
            b.bound_before_a_launch,
            b.replicas,
            b.refill_claims,
            b.provisioning_at_end
        )
    }
}

/// `run`, handing back the cluster and the controller.
pub async fn run_kept(args: &SimulateArgs) -> Result<(BufferReport, Kept), Error> {
    let (cpu, memory) = SHAPES[0];
    let one_shape = move |_: usize, s: &mut PodShape| *s = PodShape::new(cpu, memory);
    let p = pods::provision_with(args, |_| {}, one_shape, |s| s.capacity_buffers = true).await?;
    let n = args.pods;
    let sim = &p.sim;
    let printer = &super::progress::Progress::new();
    let without = latencies(sim, "app-");
    let nodes_before = sim.cluster().store().list("nodes", None).len();

    create_buffer(sim, n, cpu, memory).await?;
    say!("a CapacityBuffer of {n} chunks created; waiting for its nodes");
    wait_provisioned(sim, None, args.deadline, printer).await?;
    sim.mark("buffer provisioned");
    let nodes_for_buffer = sim
        .cluster()
        .store()
        .list("nodes", None)
        .len()
        .saturating_sub(nodes_before);
    let claims_before: usize = sim.cluster().store().list("nodeclaims", None).len();
    let burst_at = sim.cluster().stats().now_ms();

    burst(sim, n, cpu, memory, args.deadline, printer).await?;
    sim.mark("burst bound, buffer refilled");
    let burst = measure_burst(sim, claims_before, burst_at);
    let mut pods = p.measure();
    pods.launch.scenario = "buffer".into();
    let report = BufferReport {
        pods,
        buffer: BufferSection {
            replicas: n,
            nodes_for_buffer,
            without_buffer_ms: without,
            with_buffer_ms: burst.with_buffer_ms,
            bound_before_a_launch: burst.bound_before_a_launch,
            refill_claims: burst.refill_claims,
            provisioning_at_end: burst.provisioning_at_end,
        },
    };
    Ok((report, p.kept()))
}

/// A second burst of `n` pods of the buffer's shape; wait until they are bound and the buffer
/// is refilled.
async fn burst(
    sim: &BackgroundSim,
    n: usize,
    cpu: &'static str,
    memory: &'static str,
    deadline: Duration,
    printer: &super::progress::Progress,
) -> Result<(), Error> {
    sim.run(move |c| async move {
        c.create_deployment(launch::NAMESPACE, BURST, n, &PodShape::new(cpu, memory))
            .await
    })
    .await??;
    sim.mark("burst created");
    say!(
        "a second burst of {n} pods created within the buffer; waiting for them to be bound and the buffer refilled"
    );
    wait_provisioned(sim, Some(n), deadline, printer).await
}

/// Wait until the cluster is quiet, the buffer says `Provisioning=True` and, when `burst` is
/// given, that many pods of the burst are bound.
async fn wait_provisioned(
    sim: &BackgroundSim,
    burst: Option<usize>,
    deadline: Duration,
    printer: &super::progress::Progress,
) -> Result<(), Error> {
    let done = launch::wait_until(sim, deadline, || async {
        print_progress(sim, printer).await?;
        sim.run(move |c| async move {
            let store = c.store();
            let burst_bound = || {
                store
                    .list("pods", None)
                    .iter()
                    .filter(|p| {
                        is_burst(p) && p.pointer("/spec/nodeName").is_some_and(|n| !n.is_null())
                    })
                    .count()
            };
            Ok(launch::quiet(&c)
                && burst.is_none_or(|n| burst_bound() == n)
                && provisioning(&store.get("capacitybuffers", launch::NAMESPACE, BUFFER)) == "True")
        })
        .await?
    })
    .await?;
    if done {
        Ok(())
    } else {
        Err(Error::Deadline(deadline))
    }
}

/// The progress line, when one is due.
async fn print_progress(
    sim: &BackgroundSim,
    printer: &super::progress::Progress,
) -> Result<(), Error> {
    if printer.due() {
        let line = sim
            .run(|c| async move { launch::progress_line(&c) })
            .await?;
        printer.print(&line);
    }
    Ok(())
}

/// What the second burst found (the fields of `BufferSection` of the same names).
struct Burst {
    with_buffer_ms: Percentiles,
    bound_before_a_launch: usize,
    refill_claims: usize,
    provisioning_at_end: String,
}

fn measure_burst(sim: &BackgroundSim, claims_before: usize, burst_at: u64) -> Burst {
    let with_buffer_ms = latencies(sim, &format!("{BURST}-"));
    let store = sim.cluster().store();
    let refill_claims = store
        .list("nodeclaims", None)
        .len()
        .saturating_sub(claims_before);
    let first_launch = first_launch_after(sim, burst_at);
    let bound_before_a_launch = binding_times(sim, &format!("{BURST}-"))
        .iter()
        .filter(|t| first_launch.is_none_or(|l| **t < l))
        .count();
    Burst {
        with_buffer_ms,
        bound_before_a_launch,
        refill_claims,
        provisioning_at_end: provisioning(&store.get("capacitybuffers", launch::NAMESPACE, BUFFER)),
    }
}

/// A PodTemplate of the pods' shape and a buffer of `n` chunks of it.
async fn create_buffer(
    sim: &BackgroundSim,
    n: usize,
    cpu: &str,
    memory: &str,
) -> Result<(), Error> {
    let template = json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": TEMPLATE, "namespace": launch::NAMESPACE},
        "template": {"spec": {"containers": [{
            "name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": cpu, "memory": memory}},
        }]}},
    });
    let buffer = json!({
        "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
        "metadata": {"name": BUFFER, "namespace": launch::NAMESPACE},
        "spec": {"podTemplateRef": {"name": TEMPLATE}, "replicas": n},
    });
    sim.run(move |c| async move {
        use kube::api::{Api, PostParams};
        let templates: Api<k8s_openapi::api::core::v1::PodTemplate> =
            Api::namespaced(c.client(), launch::NAMESPACE);
        let buffers: Api<crate::api::capacity_buffer::CapacityBuffer> =
            Api::namespaced(c.client(), launch::NAMESPACE);
        let t = serde_json::from_value(template).map_err(kube::Error::SerdeError)?;
        templates.create(&PostParams::default(), &t).await?;
        let b = serde_json::from_value(buffer).map_err(kube::Error::SerdeError)?;
        buffers.create(&PostParams::default(), &b).await?;
        Ok::<_, kube::Error>(())
    })
    .await?
    .map_err(|e| Error::Usage(format!("creating the CapacityBuffer: {e}")))
}

fn is_burst(p: &Value) -> bool {
    p.pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_some_and(|n| n.starts_with(&format!("{BURST}-")))
}

/// The buffer's `Provisioning` status ("" when unset).
fn provisioning(buffer: &Option<Value>) -> String {
    buffer
        .as_ref()
        .and_then(|b| b.pointer("/status/conditions"))
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Provisioning"))
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Created -> bound of the pods whose names start with `prefix`.
fn latencies(sim: &BackgroundSim, prefix: &str) -> Percentiles {
    let writes = sim.cluster().stats().writes();
    let created: std::collections::HashMap<String, u64> = writes
        .iter()
        .filter(|w| w.resource == "pods" && w.verb == "create" && w.subresource.is_empty())
        .filter(|w| w.name.starts_with(prefix))
        .map(|w| (w.name.clone(), w.at_ms))
        .collect();
    let samples: Vec<f64> = writes
        .iter()
        .filter(|w| w.resource == "pods" && w.subresource == "binding")
        .filter_map(|w| {
            created
                .get(&w.name)
                .map(|c| w.at_ms.saturating_sub(*c) as f64)
        })
        .collect();
    Percentiles::of(samples)
}

/// When the pods named `prefix*` were bound.
fn binding_times(sim: &BackgroundSim, prefix: &str) -> Vec<u64> {
    sim.cluster()
        .stats()
        .writes()
        .iter()
        .filter(|w| {
            w.resource == "pods" && w.subresource == "binding" && w.name.starts_with(prefix)
        })
        .map(|w| w.at_ms)
        .collect()
}

/// The first Node created after `since_ms` (a launch finishing).
fn first_launch_after(sim: &BackgroundSim, since_ms: u64) -> Option<u64> {
    sim.cluster()
        .stats()
        .writes()
        .iter()
        .filter(|w| w.resource == "nodes" && w.verb == "create" && w.at_ms >= since_ms)
        .map(|w| w.at_ms)
        .min()
}
