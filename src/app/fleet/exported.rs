//! What the fleet's /metrics exports: its own metrics and each served Cluster's, labelled.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::metrics::Metrics;

/// The metrics of each Cluster this replica serves, by `namespace/name`: a Cluster's controller
/// has a registry of its own, entered when it starts and removed when it stops, so a Cluster
/// that moves to another replica takes its series there and the label stays bounded by the
/// Clusters served.
#[derive(Clone, Default)]
pub struct ClusterMetrics(
    Arc<parking_lot::RwLock<BTreeMap<String, Arc<Metrics>>>>,
    Starts,
);

/// How each Cluster's turns went in this replica, which `simulate --clusters` reports.
type Starts = Arc<parking_lot::Mutex<BTreeMap<String, Turns>>>;

/// A Cluster's controller starts here, and the Leases lost under it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Turns {
    /// Its controller started: more than once means it lost its Lease, failed to start or was
    /// let go, and took the Cluster back.
    pub starts: u64,
    /// Its Lease was lost while its controller ran (not renewed within the renew deadline, or
    /// taken by another replica).
    pub leases_lost: u64,
}

impl ClusterMetrics {
    pub(super) fn enter(&self, cluster: &str, metrics: Arc<Metrics>) {
        self.0.write().insert(cluster.to_string(), metrics);
        self.1.lock().entry(cluster.to_string()).or_default().starts += 1;
    }

    pub(super) fn lease_lost(&self, cluster: &str) {
        self.1
            .lock()
            .entry(cluster.to_string())
            .or_default()
            .leases_lost += 1;
    }

    /// How Cluster `cluster`'s turns went here.
    pub fn turns(&self, cluster: &str) -> Turns {
        self.1.lock().get(cluster).copied().unwrap_or_default()
    }

    pub(super) fn remove(&self, cluster: &str) {
        self.0.write().remove(cluster);
    }

    /// The metrics of Cluster `cluster` (`namespace/name`) while it is served.
    pub fn of(&self, cluster: &str) -> Option<Arc<Metrics>> {
        self.0.read().get(cluster).cloned()
    }

    /// Every served Cluster's exposition, by Cluster.
    pub fn encoded(&self) -> Vec<(String, String)> {
        self.0
            .read()
            .iter()
            .map(|(cluster, m)| (cluster.clone(), m.encode()))
            .collect()
    }
}

/// The fleet's /metrics: its own metrics as they are, and every served Cluster's with a
/// `cluster="namespace/name"` label on each series, each family once.
pub struct FleetExposition {
    pub own: Arc<Metrics>,
    pub clusters: ClusterMetrics,
}

impl crate::http::Exposition for FleetExposition {
    fn encode(&self) -> String {
        let own = self.own.encode();
        let clusters = self.clusters.encoded();
        let mut parts: Vec<(Option<&str>, &str)> = vec![(None, own.as_str())];
        parts.extend(
            clusters
                .iter()
                .map(|(c, text)| (Some(c.as_str()), text.as_str())),
        );
        crate::metrics::labelled::merge("cluster", &parts)
    }
}
