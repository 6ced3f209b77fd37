//! The kubelet stand-in's heartbeat: a Lease in `kube-node-lease` per Node it registered,
//! renewed every [`RENEW`] as a kubelet renews its own. On a real control plane the node
//! lifecycle controller reads these to decide a Node is alive; without them it would mark every
//! Node unreachable, and it is what lifts the `node.kubernetes.io/not-ready` taint a new Node
//! gets at admission once the Node is Ready.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use serde_json::json;
use tokio::task::JoinHandle;

use super::kubelet::SIM_NODE_ANNOTATION;
use super::standin::{Shutdown, spawn_watch};

/// A kubelet's default renew interval (a quarter of the 40-second lease).
const RENEW: Duration = Duration::from_secs(10);
const LEASE_SECONDS: i32 = 40;
const NAMESPACE: &str = "kube-node-lease";
const MANAGER: &str = "sim-kubelet";
/// Leases renewed at once.
const RENEWERS: usize = 16;

/// Starts the watch of Nodes and the renewer.
pub fn spawn(client: Client, shutdown: Shutdown) -> Vec<JoinHandle<()>> {
    // Node name -> uid, for the Lease's owner reference (a Node's Lease goes with it).
    let nodes: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let seen = nodes.clone();
    let fresh = Arc::new(tokio::sync::Notify::new());
    let woken = fresh.clone();
    let watch = spawn_watch(
        "nodes (node leases)",
        Api::<Node>::all(client),
        shutdown.clone(),
        move |event| match event {
            Event::Apply(n) | Event::InitApply(n) => {
                if n.annotations().contains_key(SIM_NODE_ANNOTATION) && n.uid().is_some() {
                    let new = seen
                        .lock()
                        .insert(n.name_any(), n.uid().unwrap_or_default())
                        .is_none();
                    if new {
                        woken.notify_one();
                    }
                }
            }
            Event::Delete(n) => {
                seen.lock().remove(&n.name_any());
            }
            Event::Init | Event::InitDone => {}
        },
    );
    let renewer = tokio::spawn(async move {
        let mut shutdown = shutdown;
        let mut renewed: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
        loop {
            let due: Vec<(String, String)> = {
                let now = tokio::time::Instant::now();
                let nodes = nodes.lock();
                renewed.retain(|n, _| nodes.contains_key(n));
                nodes
                    .iter()
                    .filter(|(n, _)| renewed.get(*n).is_none_or(|at| now - *at >= RENEW))
                    .map(|(n, u)| (n.clone(), u.clone()))
                    .collect()
            };
            // Side by side, as every kubelet renews its own: one at a time, a hundred Nodes on a
            // loaded machine take longer than a lease lasts, and node lifecycle then marks Nodes
            // unreachable (tainting them, evicting their pods) and back, over and over.
            let results: Vec<_> = futures::stream::iter(due)
                .map(|(node, uid)| {
                    let leases = leases.clone();
                    async move {
                        let r = renew(&leases, &node, &uid).await;
                        (node, r)
                    }
                })
                .buffer_unordered(RENEWERS)
                .collect()
                .await;
            for (node, r) in results {
                match r {
                    Ok(()) => {
                        renewed.insert(node, tokio::time::Instant::now());
                    }
                    Err(e) => tracing::debug!(%node, error = %e, "renewing a node lease"),
                }
            }
            tokio::select! {
                _ = shutdown.wait() => break,
                _ = fresh.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    });
    vec![watch, renewer]
}

/// Creates or renews `node`'s Lease (server-side apply: one request either way).
async fn renew(leases: &Api<Lease>, node: &str, uid: &str) -> Result<(), kube::Error> {
    // A MicroTime: microseconds, always six digits.
    let t = jiff::Timestamp::now();
    let now = format!(
        "{}.{:06}Z",
        t.strftime("%Y-%m-%dT%H:%M:%S"),
        t.subsec_microsecond()
    );
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": NAMESPACE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": now,
        },
    });
    leases
        .patch(
            node,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&lease),
        )
        .await
        .map(drop)
}
