//! Fleet mode (`run --fleet`) against a management cluster apart: it discovers the Clusters
//! there, serves each through its `<cluster>-kubeconfig` Secret once it holds the Cluster's
//! Lease, and a Cluster it cannot reach (a kubeconfig naming a dead API server, a Secret that
//! holds no kubeconfig) neither stops nor delays the others.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

use karpenter_capi::app::fleet::{self, Fleet, lease_name};
use karpenter_capi::app::{ClientOptions, USER_AGENT};
use karpenter_capi::http::Exposition;
use karpenter_capi::sim::cluster::{CLUSTER_NAME, SimClusterConfig};
use karpenter_capi::simulate::launch::seed_of;
use karpenter_capi::simulate::sim_settings;

use crate::common::{Env, condition, fast_cluster};

/// A kubeconfig for an API server that is not there.
const DEAD: &str = r#"apiVersion: v1
kind: Config
clusters: [{name: dead, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: u, user: {}}]
contexts: [{name: dead, context: {cluster: dead, user: u}}]
current-context: dead
"#;

/// A management cluster apart, seeded, with no controller running: the fleet plays it.
async fn fleet_env() -> Env {
    let mut env = Env::builder()
        .cluster(SimClusterConfig {
            management_apart: true,
            ..fast_cluster()
        })
        .seeds(vec![seed_of(0, 10)])
        .start()
        .await;
    env.kill();
    env
}

pub(crate) async fn fleet_of(env: &Env) -> Fleet {
    let path = env
        .sim
        .cluster()
        .management_kubeconfig_path()
        .expect("the management cluster apart")
        .to_path_buf();
    let kc = Kubeconfig::read_from(&path).expect("the management kubeconfig");
    let management = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("its configuration");
    Fleet {
        management,
        options: ClientOptions::default(),
        selector: None,
        namespace: None,
        lease_namespace: "default".into(),
        identity: "fleet-a".into(),
        settings: sim_settings(None),
        capi_version: None,
        kubeconfig_secret: Default::default(),
        metrics: Default::default(),
        share_period: Duration::from_millis(300),
        retry: Duration::from_millis(500),
        start_within: Duration::from_secs(3),
    }
}

async fn holder(env: &Env, cluster: &str) -> Option<String> {
    lease_holder(env, &lease_name("default", cluster)).await
}

/// The holder of Lease `default/name`, if any.
async fn lease_holder(env: &Env, name: &str) -> Option<String> {
    let lease = env
        .sim
        .run({
            let name = name.to_string();
            move |c| async move {
                Api::<Lease>::namespaced(c.management_client(), "default")
                    .get_opt(&name)
                    .await
            }
        })
        .await
        .expect("the simulated cluster")
        .expect("a Lease read");
    lease.and_then(|l| l.spec?.holder_identity)
}

/// Waits (up to 30 s) for an Event of `type_` and `reason` on Cluster `default/cluster` in the
/// management cluster whose note contains `says`.
async fn assert_told(env: &Env, cluster: &str, type_: &str, reason: &str, says: &str) {
    use k8s_openapi::api::events::v1::Event;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let events = env
            .sim
            .run(|c| async move {
                Api::<Event>::namespaced(c.management_client(), "default")
                    .list(&Default::default())
                    .await
            })
            .await
            .expect("the simulated cluster")
            .expect("Events listed");
        let found = events.items.iter().any(|e| {
            let on = e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("Cluster") && r.name.as_deref() == Some(cluster)
            });
            on && e.type_.as_deref() == Some(type_)
                && e.reason.as_deref() == Some(reason)
                && e.note.as_deref().is_some_and(|n| n.contains(says))
        });
        if found {
            return;
        }
        let notes: Vec<_> = events.items.iter().map(|e| (&e.reason, &e.note)).collect();
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {type_} {reason} Event on Cluster {cluster} saying {says:?}: {notes:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One fleet process, three Clusters: `sim` (reachable), `dead` (its kubeconfig names an API
/// server that is not there) and `lost` (its kubeconfig Secret holds no kubeconfig). The fleet serves `sim`: its
/// claims launch, with their Machines in the management cluster, while the other two keep
/// failing. Stopped, the fleet releases the Lease it held.
#[actix::test]
async fn a_fleet_serves_its_clusters_and_one_it_cannot_reach_delays_nothing() {
    let env = fleet_env().await;
    env.sim
        .run(|c| async move {
            c.create_workload_cluster("default", "dead", DEAD.as_bytes())
                .await
                .expect("Cluster dead");
            c.create_workload_cluster("default", "lost", b"not: [a kubeconfig")
                .await
                .expect("Cluster lost");
        })
        .await
        .expect("the simulated cluster");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let fleet = fleet_of(&env).await;
    let exposition = fleet::FleetExposition {
        own: karpenter_capi::metrics::Metrics::new(),
        clusters: fleet.metrics.clone(),
    };
    let running = actix::spawn(fleet::run(fleet, async move {
        let _ = stopped.await;
        "the test ends"
    }));

    let claims = env.claims(2, 1).await;
    env.settle().await;
    for name in &claims {
        let c = env.get("nodeclaims", "", name).expect("the claim");
        assert!(
            condition(&c, "Initialized").is_some_and(|i| i["status"] == "True"),
            "{c:#}"
        );
    }
    assert_eq!(
        env.list("machines").len(),
        2,
        "Machines in the management cluster"
    );
    assert_eq!(holder(&env, CLUSTER_NAME).await.as_deref(), Some("fleet-a"));
    let writes = env.controller_writes("nodeclaims");
    assert!(writes > 0, "the fleet's controller wrote as {USER_AGENT}");
    env.invariants_hold();
    // The served Cluster's series, labelled with it, each family declared once.
    let text = exposition.encode();
    assert!(
        text.lines().any(|l| l
            .starts_with("karpenter_nodeclaims_launched_total{cluster=\"default/sim\",")
            && !l.ends_with(" 0")),
        "{text}"
    );
    let created_type = "# TYPE karpenter_nodeclaims_launched counter";
    assert_eq!(text.matches(created_type).count(), 1, "{text}");
    // Each Cluster's state is told on it, in the management cluster.
    assert_told(
        &env,
        "sim",
        "Normal",
        "ClusterServed",
        "served by fleet replica fleet-a",
    )
    .await;
    assert_told(
        &env,
        "lost",
        "Warning",
        "ClusterNotServed",
        "Secret default/lost-kubeconfig",
    )
    .await;
    assert_told(
        &env,
        "dead",
        "Warning",
        "ClusterNotServed",
        "cannot serve the Cluster",
    )
    .await;
    assert!(
        !text.contains("cluster=\"default/dead\""),
        "a Cluster not served has no series"
    );

    let _ = stop.send(());
    running
        .await
        .expect("the fleet task")
        .expect("the fleet stopped cleanly");
    assert!(
        !exposition.encode().contains("cluster=\"default/sim\""),
        "a Cluster no longer served takes its series with it"
    );
    let released = holder(&env, CLUSTER_NAME).await;
    assert!(
        released.as_deref().is_none_or(str::is_empty),
        "the Lease is released: {released:?}"
    );
}

/// Two fleet replicas: `fleet-a` takes the Cluster's Lease first; killed (its task aborted, the
/// Lease left to expire, as SIGKILL leaves it), `fleet-b` takes the Cluster over within the
/// Lease's duration and launches the claims made after the kill. No claim leaks or binds twice.
#[actix::test]
async fn a_killed_fleet_replicas_cluster_moves_to_another() {
    let env = fleet_env().await;
    let a = spawn_until_pending(fleet_of(&env).await);
    let before = env.claims(1, 1).await;
    env.settle().await;
    assert_eq!(holder(&env, CLUSTER_NAME).await.as_deref(), Some("fleet-a"));
    let b = spawn_until_pending(Fleet {
        identity: "fleet-b".into(),
        ..fleet_of(&env).await
    });
    a.abort();
    let after = env.claims(2, 1).await;
    env.settle().await;
    assert_eq!(holder(&env, CLUSTER_NAME).await.as_deref(), Some("fleet-b"));
    for name in before.iter().chain(&after) {
        let c = env.get("nodeclaims", "", name).expect("the claim");
        assert!(
            condition(&c, "Initialized").is_some_and(|i| i["status"] == "True"),
            "{c:#}"
        );
    }
    assert_eq!(env.list("machines").len(), 3, "one Machine a claim");
    env.invariants_hold();
    b.abort();
}

/// Per-Cluster credentials: with `--fleet-kubeconfig-secret {cluster}-karpenter-capi` and key
/// `kubeconfig`, the fleet reaches the workload cluster through that Secret alone. Cluster API's
/// own `sim-kubeconfig` is made to name a dead API server, so a fleet reading it serves nothing.
#[actix::test]
async fn a_fleet_reads_the_kubeconfig_secret_its_template_names() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Patch, PatchParams, PostParams};

    let env = fleet_env().await;
    env.sim
        .run(|c| async move {
            let secrets = Api::<Secret>::namespaced(c.management_client(), "default");
            let admin = secrets.get("sim-kubeconfig").await?;
            let value = admin.data.as_ref().and_then(|d| d.get("value")).cloned();
            let own: Secret = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "sim-karpenter-capi"},
                "data": {"kubeconfig": value},
            }))
            .expect("a Secret");
            secrets.create(&PostParams::default(), &own).await?;
            let dead = k8s_openapi::ByteString(DEAD.as_bytes().to_vec());
            let dead = serde_json::json!({"data": {"value": dead}});
            secrets
                .patch(
                    "sim-kubeconfig",
                    &PatchParams::default(),
                    &Patch::Merge(&dead),
                )
                .await
                .map(drop)
        })
        .await
        .expect("the simulated cluster")
        .expect("the Secrets written");
    let secret = fleet::KubeconfigSecret {
        name: "{cluster}-karpenter-capi".into(),
        key: "kubeconfig".into(),
    };
    let fleet = Fleet {
        kubeconfig_secret: secret,
        ..fleet_of(&env).await
    };
    let running = spawn_until_pending(fleet);
    let claims = env.claims(1, 1).await;
    env.settle().await;
    let c = env.get("nodeclaims", "", &claims[0]).expect("the claim");
    assert!(
        condition(&c, "Initialized").is_some_and(|i| i["status"] == "True"),
        "{c:#}"
    );
    assert_eq!(holder(&env, CLUSTER_NAME).await.as_deref(), Some("fleet-a"));
    env.invariants_hold();
    running.abort();
}

/// Fair share: four Clusters, one replica takes them all; a second replica joins and each ends
/// up holding two (the first lets two go, each after its controller stopped, and the second
/// takes them); the second killed, the first takes all four back.
#[actix::test]
async fn replicas_share_the_clusters_fairly() {
    let (env, clusters, a) = fleet_a_holding_four().await;
    let b = spawn_until_pending(Fleet {
        identity: "fleet-b".into(),
        ..fleet_of(&env).await
    });
    held_by(&env, &clusters, &[("fleet-a", 2), ("fleet-b", 2)]).await;
    b.abort();
    held_by(&env, &clusters, &[("fleet-a", 4)]).await;
    a.abort();
}

/// The start of the fair-share tests: four Clusters, and `fleet-a` running until aborted and
/// holding all four.
async fn fleet_a_holding_four() -> (
    Env,
    [&'static str; 4],
    tokio::task::JoinHandle<Result<(), fleet::Error>>,
) {
    let env = fleet_env().await;
    let clusters = with_extra_clusters(&env).await;
    let a = spawn_until_pending(fleet_of(&env).await);
    held_by(&env, &clusters, &[("fleet-a", 4)]).await;
    (env, clusters, a)
}

/// `fleet` running until its task is aborted.
pub(crate) fn spawn_until_pending(
    fleet: Fleet,
) -> tokio::task::JoinHandle<Result<(), fleet::Error>> {
    actix::spawn(fleet::run(fleet, std::future::pending::<&'static str>()))
}

/// Waits (up to 90 s) until the Clusters' Leases are held as `want` says (holder, count).
async fn held_by(env: &Env, clusters: &[&str], want: &[(&str, usize)]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let mut holders = Vec::new();
        for c in clusters {
            holders.push(holder(env, c).await.unwrap_or_default());
        }
        let ok = want
            .iter()
            .all(|(who, n)| holders.iter().filter(|h| h.as_str() == *who).count() == *n);
        if ok {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Leases held as {holders:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A graceful stop gives up the membership Lease too, not only the Clusters' Leases: two
/// replicas share four Clusters; `fleet-b` stopped (SIGTERM's path), its membership Lease has no
/// holder and `fleet-a`'s share grows at its next count, so it takes all four without waiting
/// for `fleet-b`'s membership to expire.
#[actix::test]
async fn a_gracefully_stopped_replica_gives_up_its_membership() {
    let (env, clusters, a) = fleet_a_holding_four().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let b = actix::spawn(fleet::run(
        Fleet {
            identity: "fleet-b".into(),
            ..fleet_of(&env).await
        },
        async move {
            let _ = stopped.await;
            "the test stops fleet-b"
        },
    ));
    held_by(&env, &clusters, &[("fleet-a", 2), ("fleet-b", 2)]).await;
    let member = fleet::member_lease_name("fleet-b");
    assert_eq!(
        lease_holder(&env, &member).await.as_deref(),
        Some("fleet-b"),
        "fleet-b counts as a member while it runs"
    );

    let _ = stop.send(());
    b.await
        .expect("fleet-b's task")
        .expect("fleet-b stopped cleanly");
    let left = lease_holder(&env, &member).await;
    assert!(
        left.as_deref().is_none_or(str::is_empty),
        "fleet-b's membership Lease is released: {left:?}"
    );
    held_by(&env, &clusters, &[("fleet-a", 4)]).await;
    a.abort();
}

/// Three more Clusters beside `sim`, reached through `sim`'s kubeconfig: the four names.
async fn with_extra_clusters(env: &Env) -> [&'static str; 4] {
    let extra = ["c2", "c3", "c4"];
    env.sim
        .run(move |c| async move {
            let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
                c.management_client(),
                "default",
            );
            let kubeconfig = secrets
                .get("sim-kubeconfig")
                .await
                .expect("Cluster API's Secret of sim")
                .data
                .and_then(|d| d.get("value").cloned())
                .expect("its kubeconfig");
            for name in extra {
                c.create_workload_cluster("default", name, &kubeconfig.0)
                    .await
                    .expect("a Cluster");
            }
        })
        .await
        .expect("the simulated cluster");
    [CLUSTER_NAME, "c2", "c3", "c4"]
}

/// The Clusters' Leases are renewed on a thread of their own: the fleet's own thread (where every
/// Cluster's controller runs) blocked for longer than the renew deadline, as a long solve under
/// load blocks it, costs no Lease and restarts no controller.
#[actix::test]
async fn a_busy_fleet_thread_costs_no_lease() {
    let env = fleet_env().await;
    let fleet = fleet_of(&env).await;
    let turns = fleet.metrics.clone();
    let running = spawn_until_pending(fleet);
    let cluster = format!("default/{CLUSTER_NAME}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while turns.turns(&cluster).starts == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fleet never served {cluster}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // This test's thread is the fleet's: nothing on it runs for 12 s (the renew deadline is 10).
    std::thread::sleep(Duration::from_secs(12));
    // Time for the fleet to notice a loss, had there been one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        turns.turns(&cluster),
        fleet::Turns {
            starts: 1,
            leases_lost: 0
        },
        "the Lease was kept and the controller ran on"
    );
    assert_eq!(holder(&env, CLUSTER_NAME).await.as_deref(), Some("fleet-a"));
    running.abort();
}

/// A membership Lease lost while the replica runs (here another holder written over it, as a
/// renewal that missed its deadline under load would leave it) is campaigned for again: the
/// replica counts as a member again once the other holder's Lease expires, so the other replicas
/// do not count it gone while it still serves its Clusters.
#[actix::test]
async fn a_lost_membership_lease_is_taken_back() {
    let env = fleet_env().await;
    let running = spawn_until_pending(fleet_of(&env).await);
    let member = fleet::member_lease_name("fleet-a");
    wait_for_holder(&env, &member, "fleet-a").await;
    env.sim
        .run({
            let member = member.clone();
            move |c| async move {
                let leases = Api::<Lease>::namespaced(c.management_client(), "default");
                let mut lease = leases.get(&member).await?;
                if let Some(spec) = lease.spec.as_mut() {
                    spec.holder_identity = Some("someone-else".into());
                }
                leases
                    .replace(&member, &Default::default(), &lease)
                    .await
                    .map(drop)
            }
        })
        .await
        .expect("the simulated cluster")
        .expect("the membership Lease taken");
    wait_for_holder(&env, &member, "someone-else").await;
    wait_for_holder(&env, &member, "fleet-a").await;
    running.abort();
}

/// Waits (up to 60 s) until Lease `default/name` is held by `who`.
async fn wait_for_holder(env: &Env, name: &str, who: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let held = lease_holder(env, name).await;
        if held.as_deref() == Some(who) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Lease {name} held by {held:?}, not {who}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
