//! MachineDeployment rollouts in the Cluster API stand-in, for both API versions: a template
//! change under RollingUpdate (maxSurge 1, maxUnavailable 0) replaces every Machine within the
//! surge and availability bounds, in-place fields roll nothing, OnDelete replaces only deleted
//! Machines, and a spec.replicas decrease mid-rollout honours the delete-machine annotation.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::time::Duration;

use karpenter_capi::api::wellknown::SET_NAME_LABEL;
use karpenter_capi::sim::capi::{CapiVersion, TEMPLATE_HASH_LABEL};
use karpenter_capi::sim::cluster::{SimCluster, SimClusterConfig};
use karpenter_capi::sim::standin::{merge_patch, str_at};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::core::DynamicObject;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::common::{NS, eventually, mark_for_deletion, md_seed as seed, standin_cluster as fast};

struct Apis {
    v: CapiVersion,
    mds: Api<DynamicObject>,
    sets: Api<DynamicObject>,
    machines: Api<DynamicObject>,
    templates: Api<DynamicObject>,
}

impl Apis {
    fn new(cluster: &SimCluster) -> Self {
        let v = cluster.capi_version();
        Self {
            v,
            mds: Api::namespaced_with(cluster.client(), NS, &v.machine_deployment()),
            sets: Api::namespaced_with(cluster.client(), NS, &v.machine_set()),
            machines: Api::namespaced_with(cluster.client(), NS, &v.machine()),
            templates: Api::namespaced_with(
                cluster.client(),
                NS,
                &karpenter_capi::sim::cluster::infra_template_resource(),
            ),
        }
    }

    async fn machines(&self, md: &str) -> Vec<DynamicObject> {
        let lp = ListParams::default().labels(&format!("cluster.x-k8s.io/deployment-name={md}"));
        self.machines.list(&lp).await.unwrap().items
    }

    async fn sets(&self, md: &str) -> Vec<DynamicObject> {
        let lp = ListParams::default().labels(&format!("cluster.x-k8s.io/deployment-name={md}"));
        let mut sets = self.sets.list(&lp).await.unwrap().items;
        sets.sort_by_key(|s| {
            (
                s.metadata.creation_timestamp.clone().map(|t| t.0),
                s.name_any(),
            )
        });
        sets
    }

    /// The strategy in this version's spelling.
    async fn set_strategy(&self, md: &str, strategy: Value) {
        let patch = match self.v {
            CapiVersion::V1Beta1 => json!({"spec": {"strategy": strategy}}),
            CapiVersion::V1Beta2 => json!({"spec": {"rollout": {"strategy": strategy}}}),
        };
        merge_patch(&self.mds, md, &patch).await.unwrap();
    }

    /// A change that needs new Machines: another infrastructure template.
    async fn change_infrastructure(&self, md: &str, template: &str) {
        // The new template first, as a user would: Cluster API clones it into each Machine.
        let _ = self
            .templates
            .create(
                &PostParams::default(),
                &karpenter_capi::sim::cluster::infrastructure_template(NS, template),
            )
            .await;
        let patch =
            json!({"spec": {"template": {"spec": {"infrastructureRef": {"name": template}}}}});
        merge_patch(&self.mds, md, &patch).await.unwrap();
    }

    /// The Machine's UpToDate condition status, read where this version keeps it.
    fn up_to_date(&self, m: &DynamicObject) -> Option<(String, String)> {
        let path = match self.v {
            CapiVersion::V1Beta1 => "/status/v1beta2/conditions",
            CapiVersion::V1Beta2 => "/status/conditions",
        };
        m.data
            .pointer(path)?
            .as_array()?
            .iter()
            .find(|c| c["type"] == "UpToDate")
            .map(|c| {
                (
                    c["status"].as_str().unwrap_or_default().to_string(),
                    c["reason"].as_str().unwrap_or_default().to_string(),
                )
            })
    }
}

fn rolling(surge: i64, unavailable: i64) -> Value {
    json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}})
}

fn deleting(m: &DynamicObject) -> bool {
    m.metadata.deletion_timestamp.is_some()
}

fn available(m: &DynamicObject) -> bool {
    !deleting(m) && str_at(&m.data, &["status", "nodeRef", "name"]).is_some()
}

fn set_of(m: &DynamicObject) -> String {
    m.labels().get(SET_NAME_LABEL).cloned().unwrap_or_default()
}

fn names(ms: &[DynamicObject]) -> BTreeSet<String> {
    ms.iter().map(|m| m.name_any()).collect()
}

async fn running(apis: &Apis, md: &str, n: usize) -> Vec<DynamicObject> {
    eventually(&format!("{n} running machines of {md}"), || async {
        let ms = apis.machines(md).await;
        (ms.len() == n && ms.iter().all(available)).then_some(ms)
    })
    .await
}

// ---- (a) RollingUpdate replaces every Machine within maxSurge / maxUnavailable ----

async fn rolling_update_replaces_every_machine(v: CapiVersion) {
    let cluster = SimCluster::start(fast(v)).await.unwrap();
    let apis = Apis::new(&cluster);
    cluster
        .create_machine_deployment_from(&seed("md-roll", 3))
        .await
        .unwrap();
    let before = names(&running(&apis, "md-roll", 3).await);
    let old_set = apis.sets("md-roll").await[0].clone();
    apis.set_strategy("md-roll", rolling(1, 0)).await;
    apis.change_infrastructure("md-roll", "md-roll-v2").await;

    // Sample the whole rollout: at most replicas + maxSurge Machines (being deleted or not),
    // never fewer than replicas available.
    let (samples, peak) = (Cell::new(0), Cell::new(0));
    let new_set = eventually("every machine replaced", || {
        let (apis, before, old_set) = (&apis, &before, &old_set);
        let (samples, peak) = (&samples, &peak);
        async move {
            let ms = apis.machines("md-roll").await;
            let up = ms.iter().filter(|m| available(m)).count();
            samples.set(samples.get() + 1);
            peak.set(peak.get().max(ms.len()));
            assert!(
                ms.len() <= 4,
                "more than replicas+maxSurge Machines: {}",
                ms.len()
            );
            assert!(up >= 3, "fewer than replicas available: {up}");
            let sets = apis.sets("md-roll").await;
            let new_set = sets.iter().find(|s| s.name_any() != old_set.name_any())?;
            let done = ms.len() == 3
                && ms.iter().all(|m| {
                    available(m)
                        && !before.contains(&m.name_any())
                        && set_of(m) == new_set.name_any()
                        && apis.up_to_date(m).is_some_and(|(s, _)| s == "True")
                });
            done.then(|| new_set.clone())
        }
    })
    .await;
    assert!(samples.get() > 0 && peak.get() <= 4, "peak {}", peak.get());

    assert_ne!(
        new_set.labels()[TEMPLATE_HASH_LABEL],
        old_set.labels()[TEMPLATE_HASH_LABEL]
    );
    assert_eq!(
        new_set.data["spec"]["template"]["spec"]["infrastructureRef"]["name"],
        "md-roll-v2"
    );
    for m in apis.machines("md-roll").await {
        assert_eq!(
            apis.up_to_date(&m).unwrap(),
            ("True".into(), "UpToDate".into())
        );
        assert_eq!(
            m.labels()[TEMPLATE_HASH_LABEL],
            new_set.labels()[TEMPLATE_HASH_LABEL]
        );
    }
    // The old set: scaled to zero, then kept as history (v1beta1 revisionHistoryLimit 1) or
    // deleted (v1beta2).
    eventually("old set settled", || async {
        let old = apis.sets.get_opt(&old_set.name_any()).await.unwrap();
        match v {
            CapiVersion::V1Beta1 => old.filter(|o| o.data["spec"]["replicas"] == 0).map(|_| ()),
            CapiVersion::V1Beta2 => old.is_none().then_some(()),
        }
    })
    .await;
    eventually("md status after the rollout", || async {
        let md = apis.mds.get("md-roll").await.unwrap();
        let st = &md.data["status"];
        let updated = match v {
            CapiVersion::V1Beta1 => &st["updatedReplicas"],
            CapiVersion::V1Beta2 => &st["upToDateReplicas"],
        };
        (st["replicas"] == 3
            && st["availableReplicas"] == 3
            && st["readyReplicas"] == 3
            && *updated == 3)
            .then_some(())
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_replaces_every_machine_v1beta1() {
    rolling_update_replaces_every_machine(CapiVersion::V1Beta1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_replaces_every_machine_v1beta2() {
    rolling_update_replaces_every_machine(CapiVersion::V1Beta2).await;
}

// ---- (b) in-place fields roll nothing ----

async fn label_change_is_propagated_in_place(v: CapiVersion) {
    let cluster = SimCluster::start(fast(v)).await.unwrap();
    let apis = Apis::new(&cluster);
    cluster
        .create_machine_deployment_from(&seed("md-label", 2))
        .await
        .unwrap();
    let before = names(&running(&apis, "md-label", 2).await);
    let set = apis.sets("md-label").await[0].clone();
    let drain = match v {
        CapiVersion::V1Beta1 => json!({"nodeDrainTimeout": "30s"}),
        CapiVersion::V1Beta2 => json!({"deletion": {"nodeDrainTimeoutSeconds": 30}}),
    };
    let patch = json!({"spec": {"template": {
        "metadata": {"labels": {"example.com/tier": "gold"}, "annotations": {"example.com/note": "x"}},
        "spec": drain,
    }}});
    merge_patch(&apis.mds, "md-label", &patch).await.unwrap();

    let field = match v {
        CapiVersion::V1Beta1 => "/spec/nodeDrainTimeout",
        CapiVersion::V1Beta2 => "/spec/deletion/nodeDrainTimeoutSeconds",
    };
    let after = eventually(
        "label, annotation and drain timeout on every machine",
        || async {
            let ms = apis.machines("md-label").await;
            let done = ms.len() == 2
                && ms.iter().all(|m| {
                    m.labels().get("example.com/tier").map(String::as_str) == Some("gold")
                        && m.annotations().get("example.com/note").map(String::as_str) == Some("x")
                        && m.data.pointer(field).is_some()
                });
            done.then_some(ms)
        },
    )
    .await;
    assert_eq!(names(&after), before, "no Machine was replaced");
    let md = apis.mds.get("md-label").await.unwrap();
    eventually("md observed the change", || async {
        let cur = apis.mds.get("md-label").await.unwrap();
        (cur.data["status"]["observedGeneration"] == json!(md.metadata.generation)).then_some(())
    })
    .await;
    let sets = apis.sets("md-label").await;
    assert_eq!(sets.len(), 1, "no new MachineSet");
    assert_eq!(sets[0].name_any(), set.name_any());
    assert_eq!(sets[0].labels()["example.com/tier"], "gold");
    assert_eq!(
        sets[0].labels()[TEMPLATE_HASH_LABEL],
        set.labels()[TEMPLATE_HASH_LABEL]
    );
    for m in apis.machines("md-label").await {
        assert!(!deleting(&m));
        assert_eq!(apis.up_to_date(&m).unwrap().0, "True");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_change_is_propagated_in_place_v1beta1() {
    label_change_is_propagated_in_place(CapiVersion::V1Beta1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_change_is_propagated_in_place_v1beta2() {
    label_change_is_propagated_in_place(CapiVersion::V1Beta2).await;
}

// ---- (c) OnDelete replaces only deleted Machines ----

async fn on_delete_replaces_only_deleted_machines(v: CapiVersion) {
    let cluster = SimCluster::start(fast(v)).await.unwrap();
    let apis = Apis::new(&cluster);
    cluster
        .create_machine_deployment_from(&seed("md-ondel", 3))
        .await
        .unwrap();
    let before = names(&running(&apis, "md-ondel", 3).await);
    let old_set = apis.sets("md-ondel").await[0].name_any();
    apis.set_strategy("md-ondel", json!({"type": "OnDelete"}))
        .await;
    apis.change_infrastructure("md-ondel", "md-ondel-v2").await;

    // The new set exists with no replicas; the old Machines stay and learn they are outdated.
    let new_set = eventually("old machines outdated, new set empty", || async {
        let sets = apis.sets("md-ondel").await;
        let new_set = sets.iter().find(|s| s.name_any() != old_set)?;
        let ms = apis.machines("md-ondel").await;
        let outdated = ms
            .iter()
            .all(|m| apis.up_to_date(m) == Some(("False".into(), "NotUpToDate".into())));
        (outdated && new_set.data["spec"]["replicas"] == 0).then(|| new_set.name_any())
    })
    .await;
    let ms = apis.machines("md-ondel").await;
    assert_eq!(names(&ms), before, "nothing replaced before a deletion");
    assert!(ms.iter().all(available));
    let old = apis.sets.get(&old_set).await.unwrap();
    assert_eq!(old.data["spec"]["replicas"], 3);
    assert_eq!(
        old.annotations()["cluster.x-k8s.io/disable-machine-create"],
        "true"
    );

    let victim = before.iter().next().unwrap().clone();
    apis.machines
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    let after = eventually("one replacement in the new set", || async {
        let ms = apis.machines("md-ondel").await;
        let done = ms.len() == 3
            && ms.iter().all(available)
            && ms.iter().filter(|m| set_of(m) == new_set).count() == 1;
        done.then_some(ms)
    })
    .await;
    let survivors: BTreeSet<String> = before.iter().filter(|n| **n != victim).cloned().collect();
    for m in &after {
        if set_of(m) == new_set {
            assert!(!before.contains(&m.name_any()));
            eventually("replacement up to date", || async {
                let m = apis.machines.get(&m.name_any()).await.unwrap();
                (apis.up_to_date(&m).map(|c| c.0) == Some("True".into())).then_some(())
            })
            .await;
        } else {
            assert!(survivors.contains(&m.name_any()), "{}", m.name_any());
            assert_eq!(set_of(m), old_set);
            assert_eq!(apis.up_to_date(m).unwrap().0, "False");
        }
    }
    let old = apis.sets.get(&old_set).await.unwrap();
    assert_eq!(old.data["spec"]["replicas"], 2);
    assert_eq!(
        apis.sets.get(&new_set).await.unwrap().data["spec"]["replicas"],
        1
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_delete_replaces_only_deleted_machines_v1beta1() {
    on_delete_replaces_only_deleted_machines(CapiVersion::V1Beta1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_delete_replaces_only_deleted_machines_v1beta2() {
    on_delete_replaces_only_deleted_machines(CapiVersion::V1Beta2).await;
}

// ---- (d) spec.replicas down during a rollout ----

async fn replicas_decrease_during_rollout_takes_the_annotated_machine(v: CapiVersion) {
    // A slower provider keeps the rollout's first new Machine unavailable for a while, so the
    // decrease lands mid-rollout (the test checks it did).
    let cluster = SimCluster::start(SimClusterConfig {
        provider_delay: Duration::from_millis(400),
        jitter: Duration::ZERO,
        ..fast(v)
    })
    .await
    .unwrap();
    let apis = Apis::new(&cluster);
    cluster
        .create_machine_deployment_from(&seed("md-down", 3))
        .await
        .unwrap();
    let before = running(&apis, "md-down", 3).await;
    // Not the oldest: the annotation, not age, must pick it.
    let marked = before
        .iter()
        .max_by_key(|m| {
            (
                m.metadata.creation_timestamp.clone().map(|t| t.0),
                m.name_any(),
            )
        })
        .unwrap()
        .name_any();
    mark_for_deletion(&cluster, &marked).await;
    let before = names(&before);
    let old_set = apis.sets("md-down").await[0].name_any();
    apis.set_strategy("md-down", rolling(1, 0)).await;
    apis.change_infrastructure("md-down", "md-down-v2").await;
    eventually("the rollout started", || async {
        let ms = apis.machines("md-down").await;
        ms.iter().any(|m| set_of(m) != old_set).then_some(())
    })
    .await;
    let ms = apis.machines("md-down").await;
    let old_live = ms
        .iter()
        .filter(|m| before.contains(&m.name_any()) && !deleting(m))
        .count();
    assert_eq!(old_live, 3, "the decrease must land mid-rollout");
    cluster
        .scale_machine_deployment(NS, "md-down", 2)
        .await
        .unwrap();

    // The first old Machine(s) to go must include the annotated one.
    let first_gone: RefCell<Option<BTreeSet<String>>> = RefCell::new(None);
    eventually("two new machines, every old one gone", || {
        let (apis, before, first_gone) = (&apis, &before, &first_gone);
        async move {
            let ms = apis.machines("md-down").await;
            assert!(ms.len() <= 4, "{} Machines", ms.len());
            let gone: BTreeSet<String> = before
                .iter()
                .filter(|n| ms.iter().all(|m| m.name_any() != **n || deleting(m)))
                .cloned()
                .collect();
            if first_gone.borrow().is_none() && !gone.is_empty() {
                *first_gone.borrow_mut() = Some(gone);
            }
            let done = ms.len() == 2
                && ms.iter().all(|m| {
                    available(m)
                        && !before.contains(&m.name_any())
                        && apis.up_to_date(m).is_some_and(|(s, _)| s == "True")
                });
            done.then_some(())
        }
    })
    .await;
    let first_gone = first_gone.into_inner().unwrap();
    assert!(
        first_gone.contains(&marked),
        "the annotated Machine goes first: {first_gone:?} (marked {marked})"
    );
    eventually("md status", || async {
        let md = apis.mds.get("md-down").await.unwrap();
        (md.data["status"]["replicas"] == 2 && md.data["status"]["availableReplicas"] == 2)
            .then_some(())
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_decrease_during_rollout_takes_the_annotated_machine_v1beta1() {
    replicas_decrease_during_rollout_takes_the_annotated_machine(CapiVersion::V1Beta1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_decrease_during_rollout_takes_the_annotated_machine_v1beta2() {
    replicas_decrease_during_rollout_takes_the_annotated_machine(CapiVersion::V1Beta2).await;
}
