//! The generate scenario's scale to zero: the nodes going, then the groups generated for them,
//! timed; and the sampling of the generated groups over the whole run.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::marked_names;
use crate::cli::SimulateArgs;
use crate::sim::cluster::SimCluster;
use crate::simulate::launch::NAMESPACE;
use crate::simulate::{BackgroundSim, Error};

/// Scale to zero with consolidation on: the nodes go, then the idle groups. How long each took
/// from the scale, `None` when not within `--deadline`.
pub(super) async fn scale_to_zero(
    sim: &BackgroundSim,
    args: &SimulateArgs,
    k: usize,
) -> Result<(Option<u64>, Option<u64>), Error> {
    let cluster = sim.cluster().clone();
    let start = Instant::now();
    crate::simulate::disruption::patch_nodepool(
        sim,
        json!({"spec": {"disruption": {
            "consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s"}}}),
    )
    .await?;
    sim.run(move |c| async move {
        for d in 0..k {
            c.scale_deployment(NAMESPACE, &format!("app-{d}"), 0)
                .await?;
        }
        Ok::<_, crate::sim::cluster::Error>(())
    })
    .await??;
    sim.mark("scaled to zero");
    let nodes_removed = wait_for(&cluster, args.deadline, "the nodes to go", |c| {
        let (nodes, claims) = (
            c.store().list("nodes", None).len(),
            c.store().list("nodeclaims", None).len(),
        );
        (nodes + claims > 0).then(|| format!("{nodes} nodes, {claims} claims"))
    })
    .await
    .map(|_| start.elapsed().as_millis() as u64);
    sim.mark("nodes removed");
    let groups_removed = wait_for(&cluster, args.deadline, "the idle groups to go", |c| {
        let (groups, templates) = (
            marked_names(c, "machinedeployments").len(),
            marked_names(c, "devmachinetemplates").len(),
        );
        (groups + templates > 0)
            .then(|| format!("{groups} generated groups, {templates} generated templates"))
    })
    .await
    .map(|_| start.elapsed().as_millis() as u64);
    sim.mark("generated groups removed");
    Ok((nodes_removed, groups_removed))
}

/// Samples the generated MachineDeployments every 250 ms until stopped: the most at once and
/// every name seen.
pub(super) struct GroupSampler {
    seen: Arc<parking_lot::Mutex<(usize, BTreeSet<String>)>>,
    task: tokio::task::JoinHandle<()>,
    cluster: Arc<SimCluster>,
}

impl GroupSampler {
    pub(super) fn start(cluster: Arc<SimCluster>) -> Self {
        let seen = Arc::new(parking_lot::Mutex::new((0, BTreeSet::new())));
        let (into, sampled) = (seen.clone(), cluster.clone());
        let task = tokio::spawn(async move {
            loop {
                Self::sample(&sampled, &into);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Self {
            seen,
            task,
            cluster,
        }
    }

    fn sample(cluster: &SimCluster, into: &parking_lot::Mutex<(usize, BTreeSet<String>)>) {
        let now = marked_names(cluster, "machinedeployments");
        let mut s = into.lock();
        s.0 = s.0.max(now.len());
        s.1.extend(now);
    }

    /// (most at once, every name), one last sample taken now.
    pub(super) fn read(&self) -> (usize, Vec<String>) {
        Self::sample(&self.cluster, &self.seen);
        let s = self.seen.lock();
        (s.0, s.1.iter().cloned().collect())
    }
}

impl Drop for GroupSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls `done` on the store every 250 ms for at most `deadline`: how long it took.
async fn wait_for(
    cluster: &SimCluster,
    deadline: Duration,
    what: &str,
    done: impl Fn(&SimCluster) -> Option<String>,
) -> Option<Duration> {
    let start = Instant::now();
    let progress = crate::simulate::progress::Progress::new();
    loop {
        let left = match done(cluster) {
            None => return Some(start.elapsed()),
            Some(left) => left,
        };
        if start.elapsed() > deadline {
            eprintln!("gave up waiting for {what} after {deadline:?}: {left}");
            return None;
        }
        if progress.due() {
            progress.print(&format!("waiting for {what}: {left}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
