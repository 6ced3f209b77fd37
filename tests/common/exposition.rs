//! A controller's /metrics as the chart's alerts and the Grafana dashboard meet it: the
//! controller on the simulated cluster with its endpoint served as in production, the text read
//! over HTTP, and the series and family TYPEs of that text.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use karpenter_capi::actors::controller::ControllerHandle;
use karpenter_capi::http::{self, Health};
use karpenter_capi::metrics::Metrics;
use karpenter_capi::sim::capi::CapiVersion;
use karpenter_capi::sim::cluster::PodShape;
use karpenter_capi::simulate::{BackgroundSim, launch, pods, sim_settings, start_controller};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{NS, eventually, standin_cluster};

/// A controller on the simulated cluster, its /metrics served as in production.
pub struct Served {
    // Declared before `sim` so that it is dropped first, as a test's locals were.
    _controller: ControllerHandle,
    pub sim: BackgroundSim,
    pub addr: SocketAddr,
}

impl Served {
    /// The controller with `metrics`, on a cluster seeded with `machine_deployments` of the
    /// pods scenario's MachineDeployments and the launch scenario's NodeClass and NodePool.
    pub async fn start(machine_deployments: usize, metrics: Arc<Metrics>) -> Served {
        let sim = BackgroundSim::start(standin_cluster(CapiVersion::V1Beta2))
            .await
            .expect("simulated cluster");
        sim.run(move |c| async move {
            for i in 0..machine_deployments {
                c.create_machine_deployment_from(&pods::seed_of(i, 10))
                    .await
                    .expect("MachineDeployment");
            }
            launch::seed_nodeclass_and_pool(c.client())
                .await
                .expect("NodePool");
        })
        .await
        .expect("seed");
        let controller = start_controller(&sim, sim_settings(None), metrics.clone())
            .await
            .expect("controller");
        let local = SocketAddr::from(([127, 0, 0, 1], 0));
        let (addr, _) = http::serve(local, local, metrics, Arc::new(Health::default()))
            .await
            .expect("metrics endpoint");
        Served {
            _controller: controller,
            sim,
            addr,
        }
    }

    /// Creates a Deployment of `replicas` pods and waits until every one is bound to a node.
    pub async fn bind_pods(&self, replicas: usize) {
        self.sim
            .run(move |c| async move {
                c.create_deployment(NS, "app", replicas, &PodShape::new("500m", "1Gi"))
                    .await
                    .expect("Deployment");
            })
            .await
            .expect("pods");
        let store = self.sim.cluster().clone();
        eventually("every pod bound", || {
            let pods = store.server().store().list("pods", None);
            let bound =
                pods.len() == replicas && pods.iter().all(|p| p["spec"]["nodeName"].is_string());
            async move { bound.then_some(()) }
        })
        .await;
    }

    /// The body of `GET /metrics`.
    pub async fn scrape(&self) -> String {
        let mut s = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
            .await
            .expect("request");
        let mut body = String::new();
        s.read_to_string(&mut body).await.expect("response");
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        body.split_once("\r\n\r\n")
            .expect("headers end")
            .1
            .to_string()
    }
}

/// The sample lines of an exposition, each as its series name and the rest of the line (labels
/// and value).
pub fn samples(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split_at(l.find(['{', ' ']).unwrap_or(l.len())))
}

/// The series names with samples in an exposition.
pub fn sampled(text: &str) -> BTreeSet<String> {
    samples(text).map(|(name, _)| name.to_string()).collect()
}

/// The TYPE line of every family an exposition declares, by family.
pub fn family_types(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}
