//! `simulate --serve --scenario none --nodes N --pods M`: a large settled cluster, fast, for
//! measuring a controller started apart (e.g. its memory, `scripts/controller-rss.sh`).
//!
//! The Nodes come through the real launch path, so every object is exactly what the controller
//! writes and expects: N NodeClaims are created, an in-process controller launches them (the
//! Cluster API stand-in creates the Machines, the provider their IDs, the kubelet the Nodes) and
//! the cluster settles (250 claims at a time); with `--no-controller` that controller then stops. The pods go straight
//! into the store, bound and Running (one event each, nothing left for the stand-ins or the
//! scheduler to do), spread round-robin over the Nodes. On a real control plane there is no
//! store to write into: the pods are created through the API already bound (`spec.nodeName`,
//! as kube-scheduler's binding leaves them), many at a time, and the kubelet stand-in starts
//! them as it starts any pod bound to its Nodes.

use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

use super::{BackgroundSim, Error, launch, sim_settings, start_controller};
use crate::cli::SimulateArgs;
use crate::metrics::Metrics;
use crate::sim::cluster::{Backend, SimCluster};

/// Claims launched at a time.
const CLAIM_BATCH: usize = 250;

/// Pods written per store lock, with a pause between so watchers keep up.
const POD_CHUNK: usize = 500;

/// Pod creates in flight at once on a real control plane: one at a time, 50,000 pods take
/// most of an hour on a loaded machine.
const POD_CREATES: usize = 16;

/// Stand up `--nodes` Nodes and `--pods` pods bound to them. `controller_running`: an
/// in-process controller already runs (it launches the claims); otherwise one is started for
/// the launches and stopped once the cluster has settled.
pub async fn stand_up(
    sim: &BackgroundSim,
    args: &SimulateArgs,
    controller_running: bool,
) -> Result<(), Error> {
    let mds = args.machine_deployments.max(1);
    let sized = SimulateArgs {
        claims: args.nodes.max(1),
        ..args.clone()
    };
    let pool = launch::seed(sim, &sized).await?;
    let launcher = match controller_running {
        true => None,
        false => Some(start_controller(sim, sim_settings(None), Metrics::new()).await?),
    };
    say!(
        "standing up {} Nodes over {}",
        args.nodes,
        super::node_groups::named(args.scalable, mds)
    );
    // In batches, each settled before the next: one burst of thousands of claims runs into
    // the controller's create timeout on a small machine and loses claims.
    let mut left = args.nodes;
    while left > 0 {
        let batch = left.min(CLAIM_BATCH);
        launch::create_claims_on(sim, pool.clone(), batch, mds).await?;
        launch::settle_with_progress(sim, args.deadline, true).await?;
        left -= batch;
    }
    if let Some(c) = launcher {
        c.stop();
    }
    say!("binding {} running pods to them", args.pods);
    let pods = args.pods;
    sim.run(move |c| async move {
        match c.backend() {
            Backend::Simulated => bind_pods(&c, pods).await,
            Backend::Real => create_bound_pods(&c, pods).await,
        }
    })
    .await??;
    Ok(())
}

/// Create `n` pods through a real API server, bound round-robin to every Node.
async fn create_bound_pods(cluster: &SimCluster, n: usize) -> Result<(), Error> {
    if n == 0 {
        return Ok(());
    }
    let client = cluster.client();
    let nodes: Vec<String> = Api::<Node>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .map_err(|source| Error::Kube {
            what: "listing the Nodes to bind the pods to".into(),
            source,
        })?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    if nodes.is_empty() {
        return Err(Error::Usage("no Nodes to bind the pods to".into()));
    }
    let pods: Api<Pod> = Api::namespaced(client, launch::NAMESPACE);
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let mut created = stream::iter(0..n)
        .map(|i| {
            let pods = pods.clone();
            let pod = running_pod(i, &nodes[i % nodes.len()], &now);
            async move { create_pod(&pods, i, pod).await }
        })
        .buffer_unordered(POD_CREATES);
    let mut done = 0;
    while let Some(r) = created.next().await {
        r?;
        done += 1;
        if done % 5000 == 0 {
            say!("  {done} of {n} pods created");
        }
    }
    Ok(())
}

/// Create one pod (its status is the server's to reset and the kubelet's to write).
async fn create_pod(pods: &Api<Pod>, i: usize, pod: Value) -> Result<(), Error> {
    let pod: Pod = serde_json::from_value(pod)
        .map_err(|e| Error::Usage(format!("the standup pod {i}: {e}")))?;
    match pods.create(&PostParams::default(), &pod).await {
        Ok(_) => Ok(()),
        // Already there: a retried create whose first answer was lost.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(source) => Err(Error::Kube {
            what: format!("creating the standup pod {i}"),
            source,
        }),
    }
}

/// Write `n` Running pods into the store, spread over every Node.
async fn bind_pods(cluster: &SimCluster, n: usize) -> Result<(), Error> {
    // Written straight into the simulated server's store: on a real control plane there is no
    // such shortcut (and writing into the mirror would report pods the API server never had).
    let store = cluster.try_server()?.store();
    let mut nodes: Vec<String> = Vec::new();
    store.visit("nodes", |node| {
        if let Some(name) = node.pointer("/metadata/name").and_then(Value::as_str) {
            nodes.push(name.to_string());
        }
    });
    if nodes.is_empty() {
        return Err(Error::Usage("no Nodes to bind the pods to".into()));
    }
    let def = store
        .registry()
        .lookup("", "v1", "pods")
        .cloned()
        .ok_or_else(|| Error::Usage("the simulated cluster serves no pods".into()))?;
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    for start in (0..n).step_by(POD_CHUNK) {
        let chunk = start..(start + POD_CHUNK).min(n);
        let pods = chunk.map(|i| running_pod(i, &nodes[i % nodes.len()], &now));
        store
            .create_with_status(&def, launch::NAMESPACE, pods)
            .map_err(|e| Error::Usage(format!("creating the standup pods from {start}: {e}")))?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// A small pod as the scheduler and kubelet leave it: bound, Running, Ready.
fn running_pod(i: usize, node: &str, now: &str) -> Value {
    let conditions: Vec<Value> = ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
        .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": now}))
        .into();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("standup-{i}"), "labels": {"app": "standup"}},
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}
            }]
        },
        "status": {
            "phase": "Running",
            "startTime": now,
            "conditions": conditions
        }
    })
}
