//! Rollout status (issue 43): a NodePool template change drifts its nodes; while they are
//! replaced the pool (and its ClusterAPINodeClass) report `NodesUpToDate=False` with "N of M
//! nodes up to date", and True with `upToDateNodes == nodes` once the last old claim is gone.

use std::time::{Duration, Instant};

use kube::ResourceExt;
use serde_json::{Value, json};

use crate::common::*;
use crate::disruption::fast;

/// The NodePool's (or NodeClass's) `NodesUpToDate` status and message, and its counts; None
/// while they were computed for an older generation (as `kubectl wait` reads them).
fn rollout(obj: &Value) -> Option<(String, String, i64, i64, i64)> {
    let c = condition(obj, "NodesUpToDate")?;
    let s = &obj["status"];
    let generation = &obj["metadata"]["generation"];
    if c["observedGeneration"] != *generation || s["observedGeneration"] != *generation {
        return None;
    }
    Some((
        c["status"].as_str()?.to_string(),
        c["message"].as_str()?.to_string(),
        s["nodes"].as_i64()?,
        s["upToDateNodes"].as_i64()?,
        s["upToDateAndReadyNodes"].as_i64()?,
    ))
}

#[actix::test]
async fn a_drift_rollout_is_reported_on_the_pool_until_the_last_old_node_is_gone() {
    let env = env_with(fast()).await;
    let pool = env.pool.name_any();
    let class = env.pool.spec.template.spec.node_class_ref.name.clone();
    let mut old = Vec::new();
    for app in ["a", "b"] {
        let (claim, node) = env.stamped_claim("sim-0").await;
        env.pod(app, &node, json!({"app": app}), json!({})).await;
        old.push(claim);
    }
    env.wait("the pool up to date before the change", || {
        let r = rollout(&env.get("nodepools", "", &pool)?)?;
        (r.0 == "True" && r.2 == 2 && r.3 == 2 && r.4 == 2).then_some(())
    })
    .await;

    env.change_the_template().await;
    // Sample the pool's status until the rollout ends: while an old claim is left it never says
    // True, and at least once it says False with the counts.
    let start = Instant::now();
    let mut seen_rolling = None;
    loop {
        let np = env.get("nodepools", "", &pool).expect("the NodePool");
        let Some(r) = rollout(&np) else {
            assert!(start.elapsed() < DEADLINE, "no status for the change: {np}");
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let old_left = old.iter().any(|c| env.get("nodeclaims", "", c).is_some());
        if r.0 == "True" {
            assert!(
                !old_left,
                "NodesUpToDate=True while old claims remain: {r:?}"
            );
            assert_eq!((r.2, r.3, r.4), (2, 2, 2), "{r:?}");
            assert_eq!(r.1, "2 of 2 nodes up to date");
            break;
        }
        if r.0 == "False" && r.3 < r.2 {
            assert_eq!(r.1, format!("{} of {} nodes up to date", r.3, r.2), "{np}");
            seen_rolling.get_or_insert(r);
        }
        assert!(start.elapsed() < DEADLINE, "the rollout never ended: {np}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rolling = seen_rolling.expect("NodesUpToDate=False with counts while nodes were replaced");
    assert!(rolling.3 < 2, "{rolling:?}");

    for c in env.list("nodeclaims") {
        assert_eq!(c["metadata"]["labels"]["team"], "blue", "{c}");
    }
    env.wait("the NodeClass up to date too", || {
        let r = rollout(&env.get("clusterapinodeclasses", "", &class)?)?;
        (r.0 == "True" && r.2 == 2 && r.3 == 2).then_some(())
    })
    .await;
    env.assert_clean();
}
