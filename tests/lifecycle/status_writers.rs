//! Two writers of one conditions list: a ClusterAPINodeClass's `Ready` (the Catalog) and
//! `NodesUpToDate` (the NodePools actor). A merge patch replaces the list whole, so a writer
//! patching from a stale copy would drop the other's condition;
//! `actors::patch::write_conditions_guarded` guards the write with the copy's resourceVersion,
//! so a stale writer gets a conflict (and computes again from a newer copy) instead.

use jiff::Timestamp;
use karpenter_capi::actors::patch::{Guarded, write_conditions_guarded};
use karpenter_capi::api::conditions::{self, ConditionStatus};
use karpenter_capi::api::nodeclass::{ClusterAPINodeClass, ClusterAPINodeClassSpec};
use karpenter_capi::sim::capi::CapiVersion;
use karpenter_capi::sim::cluster::SimCluster;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::standin_cluster;

fn types_of(nc: &ClusterAPINodeClass) -> Vec<(String, String)> {
    let mut t: Vec<(String, String)> = nc
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.message))
        .collect();
    t.sort();
    t
}

/// The Catalog's view is one write behind: the NodePools actor has since added
/// `NodesUpToDate`. The Catalog's `Ready` from the stale copy is refused rather than written
/// over it, and from the newer copy lands beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_keeps_the_other_writers_condition() {
    let cluster = SimCluster::start(standin_cluster(CapiVersion::V1Beta2))
        .await
        .unwrap();
    let api: Api<ClusterAPINodeClass> = Api::all(cluster.client());
    api.create(
        &PostParams::default(),
        &ClusterAPINodeClass::new("default", ClusterAPINodeClassSpec::default()),
    )
    .await
    .unwrap();
    let stale = api.get("default").await.unwrap();

    // The other writer: `NodesUpToDate` added from the same copy.
    let mut theirs = Vec::new();
    conditions::set(
        &mut theirs,
        "NodesUpToDate",
        ConditionStatus::True,
        "",
        "0 of 0 nodes up to date",
        Some(1),
        Timestamp::now(),
    );
    api.patch_status(
        "default",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": theirs}})),
    )
    .await
    .unwrap();

    // This writer, from the stale copy (no conditions, the older resourceVersion): refused,
    // and the other writer's condition stays.
    let mut ready = Vec::new();
    conditions::set(
        &mut ready,
        conditions::READY,
        ConditionStatus::True,
        "Ready",
        "resolved",
        Some(1),
        Timestamp::now(),
    );
    let stale_write = write_conditions_guarded::<ClusterAPINodeClass>(
        cluster.client(),
        "default".to_string(),
        stale.metadata.resource_version.clone(),
        json!(ready),
    )
    .await;
    assert_eq!(stale_write, Guarded::Conflict);
    let now = api.get("default").await.unwrap();
    assert_eq!(
        types_of(&now),
        [(
            "NodesUpToDate".to_string(),
            "0 of 0 nodes up to date".to_string()
        )],
        "the other writer's condition kept"
    );

    // Computed again from the newer copy, it lands beside it.
    let mut conds = now
        .status
        .clone()
        .unwrap_or_default()
        .conditions
        .unwrap_or_default();
    conds.extend(ready);
    let fresh_write = write_conditions_guarded::<ClusterAPINodeClass>(
        cluster.client(),
        "default".to_string(),
        now.metadata.resource_version.clone(),
        json!(conds),
    )
    .await;
    assert_eq!(fresh_write, Guarded::Written);
    assert_eq!(
        types_of(&api.get("default").await.unwrap()),
        [
            (
                "NodesUpToDate".to_string(),
                "0 of 0 nodes up to date".to_string()
            ),
            ("Ready".to_string(), "resolved".to_string())
        ],
        "both writers' conditions"
    );
    cluster.shutdown().await;
}
