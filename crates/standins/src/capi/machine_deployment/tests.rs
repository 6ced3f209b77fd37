use super::super::Work;
use super::*;
use crate::cluster::{MachineDeploymentSeed, SimCluster, SimClusterConfig};
use crate::standin::shutdown_pair;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;

async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
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

/// A MachineSet scale planned from a cached copy the server has moved past is refused
/// (409 Conflict) instead of undoing the newer write, and the MachineDeployment is planned
/// again once the cache has caught up, as controller-runtime requeues on a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_from_a_stale_cache_is_refused_and_planned_again() {
    let cluster = SimCluster::start(SimClusterConfig {
        provider_delay: Duration::from_millis(30),
        jitter: Duration::from_millis(20),
        ..SimClusterConfig::default()
    })
    .await
    .expect("a simulated cluster");
    let v = cluster.capi_version();
    let client = cluster.client();
    let ns = "default";
    cluster
        .create_machine_deployment_from(&MachineDeploymentSeed {
            name: "md-stale".into(),
            namespace: ns.into(),
            replicas: 1,
            ..MachineDeploymentSeed::default()
        })
        .await
        .expect("a MachineDeployment");
    let sets: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &v.machine_set());
    let mds: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &v.machine_deployment());
    let by_md = ListParams::default().labels(&format!("{DEPLOYMENT_NAME_LABEL}=md-stale"));
    let replicas_are = |n: i64| {
        let (sets, by_md) = (&sets, &by_md);
        async move {
            let list = sets.list(by_md).await.ok()?.items;
            (list.len() == 1 && set_replicas(&list[0]) == n).then(|| list[0].clone())
        }
    };
    // What a lagging informer still holds: the set at 1 replica.
    let stale = wait_for("the MachineSet at 1 replica", || replicas_are(1)).await;
    // The newer write: the MachineDeployment raised, its set scaled to 3 by the stand-in.
    mds.patch(
        "md-stale",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .expect("raise the MachineDeployment");
    let fresh = wait_for("the MachineSet at 3 replicas", || replicas_are(3)).await;

    // A second stand-in whose set cache lags.
    let (_trigger, shutdown) = shutdown_pair();
    let mut set_cache = reflector::store::Writer::new(v.machine_set());
    let machine_cache = reflector::store::Writer::<DynamicObject>::new(v.machine());
    set_cache.apply_watcher_event(&Event::Apply(stale.clone()));
    let inner = Arc::new(Inner::new(
        crate::standin::Clusters::joined(client.clone()),
        crate::capi::CapiConfig {
            version: v,
            ..Default::default()
        },
        shutdown.clone(),
        machine_cache.as_reader(),
        set_cache.as_reader(),
    ));

    // The write itself: made from the stale copy, it is refused and the newer value stays.
    let refused = inner.scale_set(&sets, &stale, 1).await;
    assert!(
        matches!(&refused, Err(e) if is_conflict(e)),
        "a scale from the stale copy must be refused with 409, got {refused:?}"
    );
    let now = sets.get(&stale.name_any()).await.expect("the MachineSet");
    assert_eq!(set_replicas(&now), 3, "the stale write undid the newer one");

    // The reconcile: it plans from the stale cache, is refused, waits for the cache and
    // queues itself again.
    let catch_up = {
        let inner = inner.clone();
        let fresh = sets.get(&fresh.name_any()).await.expect("the MachineSet");
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            set_cache.apply_watcher_event(&Event::Apply(fresh));
            inner.cache_changed.notify_waiters();
            set_cache
        })
    };
    inner
        .reconcile_deployment(ns, "md-stale")
        .await
        .expect("a conflict is not an error of the reconcile");
    let requeued = tokio::time::timeout(Duration::from_secs(1), inner.queue.pop(&shutdown))
        .await
        .ok()
        .flatten();
    assert_eq!(
        requeued,
        Some(Work::Deployment {
            ns: ns.into(),
            name: "md-stale".into()
        }),
        "the refused reconcile must be queued again"
    );
    let _ = catch_up.await;
    let now = sets.get(&stale.name_any()).await.expect("the MachineSet");
    assert_eq!(set_replicas(&now), 3);
    cluster.shutdown().await;
}
