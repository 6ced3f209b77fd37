//! What the stand-in tests share: a fast simulated cluster and a bounded wait.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use karpenter_capi::sim::capi::CapiVersion;
use karpenter_capi::sim::cluster::SimClusterConfig;

pub const NS: &str = "default";

/// The simulated cluster with short provider and kubelet delays.
pub fn fast(version: CapiVersion) -> SimClusterConfig {
    SimClusterConfig {
        capi_version: version,
        provider_delay: Duration::from_millis(30),
        jitter: Duration::from_millis(20),
        node_ready_delay: Duration::from_millis(30),
        node_delete_delay: Duration::from_millis(10),
        ..SimClusterConfig::default()
    }
}

/// Polls `check` until it returns Some, failing the test after a generous deadline (the
/// deadline only guards against hangs; nothing here asserts on durations).
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
