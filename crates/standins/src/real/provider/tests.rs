use super::*;
use crate::ResourceDef;
use crate::cluster::{CLUSTER_NAME, SimCluster, SimClusterConfig};
use crate::standin::shutdown_pair;
use kube::api::PostParams;

/// As the provider contract asks ("InfraMachine: pausing"): a DevMachine of a paused
/// Cluster gets no provider ID until the pause lifts, then gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_clusters_dev_machine_waits_for_the_pause_to_lift() {
    let cluster = SimCluster::start(SimClusterConfig {
        extra_resources: vec![
            ResourceDef::custom(
                INFRA_GROUP,
                &[INFRA_VERSION],
                "DevMachine",
                "devmachines",
                true,
            )
            .with_status(),
        ],
        ..SimClusterConfig::default()
    })
    .await
    .expect("a simulated cluster");
    let v = cluster.capi_version();
    let client = cluster.client();
    let ns = "default";
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &v.cluster());
    let paused = |p: bool| json!({"spec": {"paused": p}});
    if clusters
        .get_opt(CLUSTER_NAME)
        .await
        .expect("a read")
        .is_some()
    {
        clusters
            .patch(
                CLUSTER_NAME,
                &PatchParams::default(),
                &Patch::Merge(paused(true)),
            )
            .await
            .expect("pause the Cluster");
    } else {
        let c = DynamicObject::new(CLUSTER_NAME, &v.cluster())
            .within(ns)
            .data(paused(true));
        clusters
            .create(&PostParams::default(), &c)
            .await
            .expect("a paused Cluster");
    }
    let (_trigger, shutdown) = shutdown_pair();
    let _tasks = spawn(
        client.clone(),
        ProviderConfig {
            version: v,
            provider_delay: Duration::from_millis(20),
            jitter: Duration::ZERO,
            fail_fraction: 0.0,
            provider_id_style: ProviderIdStyle::default(),
            seed: 1,
            stats: None,
        },
        shutdown,
    );
    let dms: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &dev_machine_resource());
    let dm = DynamicObject::new("dm-1", &dev_machine_resource())
        .within(ns)
        .data(json!({"spec": {}}));
    let mut dm = dm;
    dm.metadata.labels = Some([(CLUSTER_NAME_LABEL.to_string(), CLUSTER_NAME.to_string())].into());
    dms.create(&PostParams::default(), &dm)
        .await
        .expect("a DevMachine");
    let provider_id = || async {
        let m = dms.get("dm-1").await.expect("the DevMachine");
        str_at(&m.data, &["spec", "providerID"]).map(str::to_string)
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        provider_id().await,
        None,
        "a paused Cluster's instance was launched"
    );

    clusters
        .patch(
            CLUSTER_NAME,
            &PatchParams::default(),
            &Patch::Merge(paused(false)),
        )
        .await
        .expect("lift the pause");
    let deadline = Instant::now() + Duration::from_secs(10);
    while provider_id().await.is_none() {
        assert!(
            Instant::now() < deadline,
            "no provider ID after the pause lifted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.shutdown().await;
}
