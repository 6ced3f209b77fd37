//! The simulated API server, exercised through the real kube client over HTTP.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use karpenter_capi::sim::{CapiVersions, SimConfig, SimServer};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, EvictParams, GroupVersionKind, ListParams,
    Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use kube::{Discovery, ResourceExt};
use serde_json::{Value, json};

const GUARD: Duration = Duration::from_secs(20);

async fn sim() -> SimServer {
    SimServer::start(SimConfig::default().with_infrastructure_templates())
        .await
        .unwrap()
}

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn nodeclaims(s: &SimServer) -> Api<DynamicObject> {
    Api::all_with(
        s.client(),
        &ar("karpenter.sh", "v1", "NodeClaim", "nodeclaims"),
    )
}

fn mds(s: &SimServer, version: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        s.client(),
        "default",
        &ar(
            "cluster.x-k8s.io",
            version,
            "MachineDeployment",
            "machinedeployments",
        ),
    )
}

/// A NodeClaim spec its CRD accepts.
fn claim_spec() -> Value {
    json!({"nodeClassRef": {"group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass", "name": "default"},
        "requirements": []})
}

/// A NodePool spec its CRD accepts, of `weight`.
fn pool_spec(weight: i64) -> Value {
    json!({"template": {"spec": claim_spec()}, "weight": weight})
}

fn dynamic(ar: &ApiResource, value: Value) -> DynamicObject {
    let mut value = value;
    value["apiVersion"] = json!(ar.api_version);
    value["kind"] = json!(ar.kind);
    serde_json::from_value(value).unwrap()
}

fn cm(name: &str, labels: Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

fn api_code(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("expected an API Status error, got {other:?}"),
    }
}

fn pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "i"}]}
    }))
    .unwrap()
}

async fn next_event<S>(stream: &mut S) -> WatchEvent<ConfigMap>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    loop {
        match tokio::time::timeout(GUARD, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Bookmark(_) => continue,
            other => return other,
        }
    }
}

#[tokio::test]
async fn list_then_watch_and_resume_from_a_resource_version() {
    let s = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let rv = list.metadata.resource_version.clone().unwrap();
    assert!(!rv.is_empty());

    let mut stream = api
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default()
            },
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();
    match next_event(&mut stream).await {
        WatchEvent::Added(o) => assert_eq!(o.name_any(), "b"),
        other => panic!("expected ADDED b, got {other:?}"),
    }
    api.delete("a", &DeleteParams::default()).await.unwrap();
    match next_event(&mut stream).await {
        WatchEvent::Deleted(o) => assert_eq!(o.name_any(), "a"),
        other => panic!("expected DELETED a, got {other:?}"),
    }

    // Resuming from the list's version replays exactly what happened since.
    let mut resumed = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    assert!(matches!(next_event(&mut resumed).await, WatchEvent::Added(o) if o.name_any() == "b"));
    assert!(
        matches!(next_event(&mut resumed).await, WatchEvent::Deleted(o) if o.name_any() == "a")
    );
}

#[tokio::test]
async fn bookmarks_follow_the_initial_events() {
    let s = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let mut stream = api
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default()
            },
            "0",
        )
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        tokio::time::timeout(GUARD, stream.next()).await.unwrap(),
        Some(Ok(WatchEvent::Added(_)))
    ));
    match tokio::time::timeout(GUARD, stream.next()).await.unwrap() {
        Some(Ok(WatchEvent::Bookmark(b))) => assert_eq!(
            b.metadata.resource_version,
            s.store().resource_version().to_string()
        ),
        other => panic!("expected a bookmark, got {other:?}"),
    }
}

#[tokio::test]
async fn expired_version_gives_410_and_watcher_recovers() {
    let s = SimServer::start(SimConfig {
        history_size: 3,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    for i in 0..6 {
        api.create(&PostParams::default(), &cm(&format!("c{i}"), json!({})))
            .await
            .unwrap();
    }
    let mut stream = api
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(GUARD, stream.next()).await.unwrap() {
        Some(Ok(WatchEvent::Error(e))) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
        }
        other => panic!("expected an in-stream 410, got {other:?}"),
    }
    // A paginated list whose continue token fell out of history is 410 too.
    let page = api.list(&ListParams::default().limit(2)).await.unwrap();
    let token = page.metadata.continue_.clone().unwrap();
    for i in 6..12 {
        api.create(&PostParams::default(), &cm(&format!("c{i}"), json!({})))
            .await
            .unwrap();
    }
    let err = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap_err();
    assert_eq!(api_code(err).0, 410);

    // kube's watcher lists, watches and keeps delivering.
    let mut w = watcher(api.clone(), watcher::Config::default()).boxed();
    api.create(&PostParams::default(), &cm("late", json!({})))
        .await
        .unwrap();
    let found = tokio::time::timeout(GUARD, async {
        while let Some(ev) = w.try_next().await.unwrap() {
            if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = ev
                && o.name_any() == "late"
            {
                return true;
            }
        }
        false
    })
    .await
    .unwrap();
    assert!(found);
}

#[tokio::test]
async fn pagination_with_limit_and_continue() {
    let s = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    for i in 0..5 {
        api.create(&PostParams::default(), &cm(&format!("c{i}"), json!({})))
            .await
            .unwrap();
    }
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(2);
    loop {
        let page = api.list(&lp).await.unwrap();
        names.extend(page.items.iter().map(|c| c.name_any()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    assert_eq!(names, vec!["c0", "c1", "c2", "c3", "c4"]);
}

#[tokio::test]
async fn stale_update_conflicts_and_errors_are_status_objects() {
    let s = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let created = api
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let mut fresh = created.clone();
    fresh.data = Some([("k".to_string(), "2".to_string())].into());
    api.replace("a", &PostParams::default(), &fresh)
        .await
        .unwrap();
    let err = api
        .replace("a", &PostParams::default(), &created)
        .await
        .unwrap_err();
    assert_eq!(api_code(err), (409, "Conflict".into()));

    let err = api
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_code(err), (409, "AlreadyExists".into()));
    match nodeclaims(&s).get("missing").await.unwrap_err() {
        kube::Error::Api(st) => {
            assert_eq!(st.code, 404);
            assert_eq!(st.reason, "NotFound");
            assert_eq!(st.message, "nodeclaims.karpenter.sh \"missing\" not found");
        }
        other => panic!("{other:?}"),
    }
    // A namespace that does not exist is 404, as on a real server.
    let elsewhere: Api<ConfigMap> = Api::namespaced(s.client(), "nowhere");
    let err = elsewhere
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_code(err).0, 404);
}

#[tokio::test]
async fn deletion_waits_for_finalizers() {
    let s = sim().await;
    let ar = ar("karpenter.sh", "v1", "NodeClaim", "nodeclaims");
    let api = nodeclaims(&s);
    let claim = dynamic(
        &ar,
        json!({"metadata": {"name": "c", "finalizers": ["karpenter.sh/termination"]}, "spec": claim_spec()}),
    );
    let created = api.create(&PostParams::default(), &claim).await.unwrap();
    let rv = created.resource_version().unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    api.delete("c", &DeleteParams::default()).await.unwrap();
    let deleting = api.get("c").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    // Deleting again is a no-op that returns the object.
    api.delete("c", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        api.get("c").await.unwrap().resource_version(),
        deleting.resource_version()
    );

    api.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_code(api.get("c").await.unwrap_err()).0, 404);
    let mut kinds = Vec::new();
    while kinds.last().map(String::as_str) != Some("DELETED") {
        let ev = tokio::time::timeout(GUARD, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        kinds.push(match ev {
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Modified(_) => "MODIFIED".to_string(),
            WatchEvent::Deleted(_) => "DELETED".to_string(),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(kinds, vec!["MODIFIED", "DELETED"]);

    // Preconditions are honoured.
    let created = api
        .create(
            &PostParams::default(),
            &dynamic(
                &ar,
                json!({"metadata": {"name": "d"}, "spec": claim_spec()}),
            ),
        )
        .await
        .unwrap();
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("other".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(api_code(api.delete("d", &dp).await.unwrap_err()).0, 409);
    assert!(api.get("d").await.is_ok());
    drop(created);
}

#[tokio::test]
async fn garbage_collection_follows_owner_references() {
    let s = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let owner = api
        .create(&PostParams::default(), &cm("owner", json!({})))
        .await
        .unwrap();
    let owned = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.uid().unwrap()}
        ]}}))
        .unwrap()
    };
    api.create(&PostParams::default(), &owned("child"))
        .await
        .unwrap();
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_code(api.get("child").await.unwrap_err()).0, 404);

    let owner = api
        .create(&PostParams::default(), &cm("owner", json!({})))
        .await
        .unwrap();
    let orphan: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "orphan", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.uid().unwrap()}
        ]}}))
        .unwrap();
    api.create(&PostParams::default(), &orphan).await.unwrap();
    api.delete("owner", &DeleteParams::orphan()).await.unwrap();
    let kept = api.get("orphan").await.unwrap();
    assert!(
        kept.metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );
}

#[tokio::test]
async fn status_subresource_and_generation() {
    let s = sim().await;
    // A NodePool: its spec may change (a NodeClaim's is immutable) and it has a status.
    let ar = ar("karpenter.sh", "v1", "NodePool", "nodepools");
    let api: Api<DynamicObject> = Api::all_with(s.client(), &ar);
    let created = api
        .create(
            &PostParams::default(),
            &dynamic(
                &ar,
                json!({"metadata": {"name": "c"}, "spec": pool_spec(1), "status": {"nodes": 1}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert!(
        created.data.get("status").is_none(),
        "create ignores status"
    );

    let st = api
        .patch_status(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodes": 2}, "spec": {"weight": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(st.data["status"]["nodes"], 2);
    assert_eq!(st.data["spec"]["weight"], 1, "status write ignores spec");
    assert_eq!(st.metadata.generation, Some(1));

    let main = api
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodes": 3}, "metadata": {"labels": {"l": "v"}}})),
        )
        .await
        .unwrap();
    assert_eq!(main.data["status"]["nodes"], 2, "main write ignores status");
    assert_eq!(
        main.metadata.generation,
        Some(1),
        "metadata changes keep the generation"
    );

    let main = api
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"weight": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(main.metadata.generation, Some(2));

    let mut whole = api.get_status("c").await.unwrap();
    whole.data["status"] = json!({"nodes": 4});
    let replaced = api
        .replace_status("c", &PostParams::default(), &whole)
        .await
        .unwrap();
    assert_eq!(replaced.data["status"]["nodes"], 4);
}

#[tokio::test]
async fn scale_subresource_of_a_machine_deployment_and_shared_versions() {
    let s = sim().await;
    let v1b1 = ar(
        "cluster.x-k8s.io",
        "v1beta1",
        "MachineDeployment",
        "machinedeployments",
    );
    let created = mds(&s, "v1beta1")
        .create(
            &PostParams::default(),
            &dynamic(
                &v1b1,
                json!({"metadata": {"name": "md"}, "spec": {
                    "replicas": 1, "clusterName": "c",
                    "selector": {"matchLabels": {"md": "md"}},
                    "template": {"metadata": {"labels": {"md": "md"}}, "spec": {
                        "clusterName": "c",
                        "bootstrap": {"dataSecretName": "bootstrap"},
                        "infrastructureRef": {"kind": "DevMachineTemplate", "name": "t"},
                    }},
                }}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        created.types.as_ref().unwrap().api_version,
        "cluster.x-k8s.io/v1beta1"
    );
    let api = mds(&s, "v1beta2");
    let got = api.get("md").await.unwrap();
    assert_eq!(
        got.types.as_ref().unwrap().api_version,
        "cluster.x-k8s.io/v1beta2"
    );
    api.patch_status(
        "md",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"replicas": 1, "selector": "a=b"}})),
    )
    .await
    .unwrap();

    let scale = api.get_scale("md").await.unwrap();
    assert_eq!(scale.spec.as_ref().unwrap().replicas, Some(1));
    assert_eq!(scale.status.as_ref().unwrap().replicas, 1);
    assert_eq!(
        scale.status.as_ref().unwrap().selector.as_deref(),
        Some("a=b")
    );

    let mut up = scale.clone();
    up.spec.as_mut().unwrap().replicas = Some(3);
    let replaced = api
        .replace_scale("md", &PostParams::default(), &up)
        .await
        .unwrap();
    assert_eq!(replaced.spec.unwrap().replicas, Some(3));
    // The old Scale's resourceVersion is stale now.
    assert_eq!(
        api_code(
            api.replace_scale("md", &PostParams::default(), &up)
                .await
                .unwrap_err()
        )
        .0,
        409
    );

    let patched = api
        .patch_scale(
            "md",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.unwrap().replicas, Some(5));
    let md = api.get("md").await.unwrap();
    assert_eq!(md.data["spec"]["replicas"], 5);
    assert_eq!(md.metadata.generation, Some(3));
    assert_eq!(
        s.store()
            .get("machinedeployments", "default", "md")
            .unwrap()["spec"]["replicas"],
        5
    );
}

#[tokio::test]
async fn served_versions_are_configurable() {
    let s = SimServer::start(SimConfig {
        served_capi_versions: CapiVersions::V1Beta1,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let err = mds(&s, "v1beta2")
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(err).0, 404);
    assert!(
        mds(&s, "v1beta1")
            .list(&ListParams::default())
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn merge_json_and_strategic_patches() {
    let s = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("a", json!({"x": "1"})))
        .await
        .unwrap();
    let merged = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": null, "y": "2"}}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.labels().get("y").map(String::as_str), Some("2"));
    assert!(!merged.labels().contains_key("x"));

    let patched = json_patch(
        &s,
        "a",
        json!([
            {"op": "test", "path": "/data/k", "value": "v"},
            {"op": "replace", "path": "/data/k", "value": "w"}
        ]),
    )
    .await
    .unwrap();
    assert_eq!(patched.data.unwrap()["k"], "w");
    let err = json_patch(
        &s,
        "a",
        json!([
            {"op": "test", "path": "/data/k", "value": "v"},
            {"op": "replace", "path": "/data/k", "value": "z"}
        ]),
    )
    .await
    .unwrap_err();
    assert_eq!(api_code(err), (422, "Invalid".into()));
    assert_eq!(
        api.get("a").await.unwrap().data.unwrap()["k"],
        "w",
        "a failed JSON patch changes nothing"
    );

    let nodes: Api<Node> = Api::all(s.client());
    let node: Node = serde_json::from_value(
        json!({"metadata": {"name": "n", "finalizers": ["a"]}, "spec": {"taints": [
            {"key": "karpenter.sh/unregistered", "effect": "NoExecute"}
        ]}}),
    )
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let patched = nodes
        .patch(
            "n",
            &PatchParams::default(),
            &Patch::Strategic(json!({
                "metadata": {"finalizers": ["b"]},
                "spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.metadata.finalizers.unwrap(),
        vec!["a", "b"],
        "finalizers merge"
    );
    let taints = patched.spec.unwrap().taints.unwrap();
    assert_eq!(
        taints.len(),
        1,
        "spec.taints has no merge key in Kubernetes: the list is replaced"
    );
    assert_eq!(taints[0].key, "karpenter.sh/disrupted");

    // Custom resources do not take strategic merge patch, as on a real server.
    let ar = ar("karpenter.sh", "v1", "NodeClaim", "nodeclaims");
    nodeclaims(&s)
        .create(
            &PostParams::default(),
            &dynamic(
                &ar,
                json!({"metadata": {"name": "c"}, "spec": claim_spec()}),
            ),
        )
        .await
        .unwrap();
    let err = nodeclaims(&s)
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"a": 1}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(err).0, 415);
}

#[tokio::test]
async fn label_and_field_selectors() {
    let s = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(
        &PostParams::default(),
        &cm("a", json!({"tier": "web", "zone": "1"})),
    )
    .await
    .unwrap();
    api.create(&PostParams::default(), &cm("b", json!({"tier": "db"})))
        .await
        .unwrap();
    api.create(&PostParams::default(), &cm("c", json!({})))
        .await
        .unwrap();
    let names = |sel: &'static str| {
        let api = api.clone();
        async move {
            let mut n: Vec<String> = api
                .list(&ListParams::default().labels(sel))
                .await
                .unwrap()
                .items
                .iter()
                .map(|c| c.name_any())
                .collect();
            n.sort();
            n
        }
    };
    assert_eq!(names("tier=web").await, vec!["a"]);
    assert_eq!(names("tier==db").await, vec!["b"]);
    assert_eq!(names("tier!=web").await, vec!["b", "c"]);
    assert_eq!(names("tier in (web,db)").await, vec!["a", "b"]);
    assert_eq!(names("tier notin (web)").await, vec!["b", "c"]);
    assert_eq!(names("zone").await, vec!["a"]);
    assert_eq!(names("!tier").await, vec!["c"]);
    assert_eq!(names("tier,!zone").await, vec!["b"]);

    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    pods.create(&PostParams::default(), &pod("p1", json!({})))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("p2", json!({})))
        .await
        .unwrap();
    bind(&s, "p1", "node-1").await.unwrap();
    let by_field = |sel: &'static str| {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default().fields(sel))
                .await
                .unwrap()
                .items
                .iter()
                .map(|p| p.name_any())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(by_field("spec.nodeName=node-1").await, vec!["p1"]);
    assert_eq!(by_field("spec.nodeName==").await, vec!["p2"]);
    assert_eq!(by_field("spec.nodeName!=node-1").await, vec!["p2"]);
    assert_eq!(
        by_field("status.phase=Pending,metadata.name=p2").await,
        vec!["p2"]
    );
    assert_eq!(by_field("metadata.namespace=default").await.len(), 2);
    let all: Api<Pod> = Api::all(s.client());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        2,
        "cluster-wide list of a namespaced kind"
    );
    let err = pods
        .list(&ListParams::default().fields("spec.bogus=x"))
        .await
        .unwrap_err();
    assert_eq!(api_code(err).0, 400);

    let nodes: Api<Node> = Api::all(s.client());
    let node: Node = serde_json::from_value(
        json!({"metadata": {"name": "n"}, "spec": {"providerID": "sim://n"}}),
    )
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(
        nodes
            .list(&ListParams::default().fields("spec.providerID=sim://n"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
}

/// kube's `Patch::Json` needs a feature this crate does not enable, so send the request by hand.
async fn json_patch(s: &SimServer, name: &str, ops: Value) -> kube::Result<ConfigMap> {
    let req = hyper::Request::patch(format!("/api/v1/namespaces/default/configmaps/{name}"))
        .header("Content-Type", "application/json-patch+json")
        .body(serde_json::to_vec(&ops).unwrap())
        .unwrap();
    s.client().request::<ConfigMap>(req).await
}

async fn bind(s: &SimServer, pod: &str, node: &str) -> kube::Result<Value> {
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod}, "target": {"kind": "Node", "name": node}});
    pods.create_subresource::<Value, Value>("binding", pod, &PostParams::default(), &binding)
        .await
}

#[tokio::test]
async fn generate_name_binding_and_eviction() {
    let s = sim().await;
    let ar = ar("karpenter.sh", "v1", "NodeClaim", "nodeclaims");
    let c = nodeclaims(&s)
        .create(
            &PostParams::default(),
            &dynamic(
                &ar,
                json!({"metadata": {"generateName": "default-"}, "spec": claim_spec()}),
            ),
        )
        .await
        .unwrap();
    let name = c.name_any();
    assert!(
        name.starts_with("default-") && name.len() == "default-".len() + 5,
        "{name}"
    );
    assert!(c.uid().is_some() && c.metadata.creation_timestamp.is_some());

    // kube retries 429 by default (for minutes); see the answer itself.
    let pods: Api<Pod> = Api::namespaced(s.client_without_retries(), "default");
    pods.create(&PostParams::default(), &pod("guarded", json!({"app": "x"})))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("free", json!({"app": "y"})))
        .await
        .unwrap();
    for p in ["guarded", "free"] {
        bind(&s, p, "n1").await.unwrap();
        pods.patch_status(
            p,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    }
    let bound = pods.get("guarded").await.unwrap();
    assert_eq!(bound.spec.unwrap().node_name.as_deref(), Some("n1"));
    assert_eq!(
        api_code(bind(&s, "guarded", "n2").await.unwrap_err()).0,
        409,
        "binding twice conflicts"
    );

    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(s.client(), "default");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "pdb"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "x"}}}
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    match pods
        .evict("guarded", &EvictParams::default())
        .await
        .unwrap_err()
    {
        kube::Error::Api(st) => {
            assert_eq!(st.code, 429);
            assert_eq!(st.reason, "TooManyRequests");
            assert_eq!(
                st.message,
                "Cannot evict pod as it would violate the pod's disruption budget."
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(pods.get("guarded").await.is_ok());
    // A running pod is evicted gracefully, as kube-apiserver does it: marked with its deadline
    // (default grace 30 s); its kubelet (none runs on a bare server) removes it. An eviction
    // with a grace of 0 removes it at once.
    pods.evict("free", &EvictParams::default()).await.unwrap();
    let marked = pods.get("free").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
    // (kube 5's `evict` writes `delete_options`, a key kube-apiserver ignores, so the Eviction
    // is posted as the API defines it.)
    let eviction = json!({
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "free", "namespace": "default"},
        "deleteOptions": {"gracePeriodSeconds": 0},
    });
    pods.create_subresource::<serde_json::Value, serde_json::Value>(
        "eviction",
        "free",
        &PostParams::default(),
        &eviction,
    )
    .await
    .unwrap();
    assert_eq!(api_code(pods.get("free").await.unwrap_err()).0, 404);
}

#[tokio::test]
async fn discovery_finds_karpenter_and_capi_kinds() {
    let s = SimServer::start(SimConfig::default().with_infrastructure_templates())
        .await
        .unwrap();
    let discovery = Discovery::new(s.client()).run().await.unwrap();
    for (group, kind) in [
        ("karpenter.sh", "NodePool"),
        ("karpenter.sh", "NodeClaim"),
        ("karpenter.cluster.x-k8s.io", "ClusterAPINodeClass"),
        ("cluster.x-k8s.io", "MachineDeployment"),
        ("infrastructure.cluster.x-k8s.io", "DevMachineTemplate"),
        ("", "Node"),
        ("policy", "PodDisruptionBudget"),
    ] {
        let g = discovery
            .get(group)
            .unwrap_or_else(|| panic!("group {group:?}"));
        assert!(g.recommended_kind(kind).is_some(), "{group} {kind}");
    }
    let capi = discovery.get("cluster.x-k8s.io").unwrap();
    assert_eq!(capi.preferred_version(), Some("v1beta2"));
    let groups = s.client().list_api_groups().await.unwrap();
    let capi = groups
        .groups
        .iter()
        .find(|g| g.name == "cluster.x-k8s.io")
        .unwrap();
    assert_eq!(capi.preferred_version.as_ref().unwrap().version, "v1beta2");
    let (md, caps) = capi_md(&discovery);
    assert_eq!(md.version, "v1beta2");
    assert!(
        caps.subresources
            .iter()
            .any(|(r, _)| r.plural == "machinedeployments/scale" || r.plural == "scale")
    );
    let text = std::fs::read_to_string(s.kubeconfig_path()).unwrap();
    assert!(text.contains(s.url()));
}

fn capi_md(d: &Discovery) -> (ApiResource, kube::discovery::ApiCapabilities) {
    d.get("cluster.x-k8s.io")
        .unwrap()
        .recommended_kind("MachineDeployment")
        .unwrap()
}

#[tokio::test]
async fn injected_errors_and_watch_cuts() {
    let s = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(s.client_without_retries(), "default");
    s.faults().set_error_rate("configmaps", 1.0);
    for _ in 0..4 {
        let code = api_code(api.list(&ListParams::default()).await.unwrap_err()).0;
        assert!(code == 500 || code == 503, "{code}");
    }
    s.faults().set_error_rate("configmaps", 0.0);
    api.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();

    s.faults().set_conflict_rate("configmaps", 1.0);
    let before = api.get("a").await.unwrap().resource_version();
    let err = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "2"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(err).0, 409);
    assert_ne!(
        api.get("a").await.unwrap().resource_version(),
        before,
        "the phantom writer bumped the version"
    );
    s.faults().clear();

    let leases: Api<Lease> = Api::namespaced(s.client(), "default");
    let mut w = watcher(leases.clone(), watcher::Config::default()).boxed();
    let lists_before = s.stats().requests("list", "leases", "");
    loop {
        if let watcher::Event::InitDone = tokio::time::timeout(GUARD, w.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            break;
        }
    }
    // Once a lease created now arrives, the watch is open; then cut it.
    let lease = |name: &str| -> Lease {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    leases
        .create(&PostParams::default(), &lease("before-cut"))
        .await
        .unwrap();
    assert!(wait_for_lease(&mut w, "before-cut").await);
    let watches_before = s.stats().requests("watch", "leases", "");
    s.faults().cut_watches();
    leases
        .create(&PostParams::default(), &lease("after-cut"))
        .await
        .unwrap();
    let seen = wait_for_lease(&mut w, "after-cut").await;
    assert!(seen);
    assert!(
        s.stats().requests("watch", "leases", "") > watches_before,
        "the watcher re-watched after the cut"
    );
    assert!(s.stats().requests("list", "leases", "") >= lists_before);
}

async fn wait_for_lease<S>(w: &mut S, name: &str) -> bool
where
    S: futures::Stream<Item = Result<watcher::Event<Lease>, watcher::Error>> + Unpin,
{
    tokio::time::timeout(GUARD, async {
        while let Some(ev) = w.try_next().await.unwrap() {
            if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = ev
                && o.name_any() == name
            {
                return true;
            }
        }
        false
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn writes_are_counted_by_the_server() {
    let s = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    let _ = api.get("missing").await;
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let stats = s.stats();
    let writes = stats.writes_for("configmaps", "");
    let verbs: Vec<&str> = writes.iter().map(|w| w.verb.as_str()).collect();
    assert_eq!(verbs, vec!["create", "patch", "delete"]);
    assert!(
        writes
            .iter()
            .all(|w| w.name == "a" && w.namespace == "default")
    );
    assert_eq!(stats.requests("get", "configmaps", ""), 1);
    let snap = serde_json::to_value(stats.snapshot()).unwrap();
    assert_eq!(snap["writes"].as_array().unwrap().len(), 3);
}

/// As the real API server: empty metadata maps and lists are never stored or served (Go's
/// `omitempty`), and a JSON patch `test` for null passes only while the member is absent, which
/// is how a writer guards "this object has no annotations yet".
#[tokio::test]
async fn empty_metadata_maps_are_dropped_and_null_tests_guard_absent_maps() {
    let s = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let mut c = cm("bare", json!({}));
    c.metadata.annotations = Some(Default::default());
    c.metadata.finalizers = Some(Vec::new());
    let created = cms.create(&PostParams::default(), &c).await.unwrap();
    let raw = serde_json::to_value(&created).unwrap();
    for field in ["labels", "annotations", "finalizers"] {
        assert!(raw["metadata"].get(field).is_none(), "{field}: {raw}");
    }
    let guarded = json!([
        {"op": "test", "path": "/metadata/annotations", "value": null},
        {"op": "add", "path": "/metadata/annotations", "value": {"first": "yes"}}
    ]);
    let first = json_patch(&s, "bare", guarded.clone()).await.unwrap();
    assert_eq!(
        first.annotations().get("first").map(String::as_str),
        Some("yes")
    );
    // The same guarded write again: the map is there now, so the test fails (422).
    let kube::Error::Api(e) = json_patch(&s, "bare", guarded).await.unwrap_err() else {
        panic!("a Status error")
    };
    assert_eq!(e.code, 422, "{e:?}");
    assert!(e.message.contains("/metadata/annotations"), "{e:?}");
    // A test below a member that does not exist at all does not apply.
    let kube::Error::Api(e) = json_patch(
        &s,
        "bare",
        json!([{"op": "test", "path": "/metadata/nothing/here", "value": null}]),
    )
    .await
    .unwrap_err() else {
        panic!("a Status error")
    };
    assert_eq!(e.code, 422, "{e:?}");
    assert!(e.message.contains("is missing path"), "{e:?}");
}

/// Karpenter v1.15 (kubernetes-sigs/karpenter#3220) defaults `consolidateAfter` to `0s` where
/// v1.14.1 required it: our CRD served by the simulated server does the same, for a dynamic pool
/// whose `disruption` omits it, one without `disruption` at all, and a static pool (upstream's
/// own cases in `nodepool_validation_cel_test.go`); a value that is set is kept.
#[tokio::test]
async fn consolidate_after_is_defaulted_as_karpenter_v1_15_defaults_it() {
    let s = sim().await;
    let ar = ar("karpenter.sh", "v1", "NodePool", "nodepools");
    let api: Api<DynamicObject> = Api::all_with(s.client(), &ar);
    let cases = [
        (
            "dynamic",
            json!({"template": {"spec": claim_spec()},
                "disruption": {"consolidationPolicy": "WhenEmpty"}}),
            "0s",
        ),
        (
            "no-disruption",
            json!({"template": {"spec": claim_spec()}}),
            "0s",
        ),
        (
            "static",
            json!({"replicas": 3, "template": {"spec": claim_spec()},
                "disruption": {"budgets": [{"nodes": "1"}]}}),
            "0s",
        ),
        (
            "set",
            json!({"template": {"spec": claim_spec()},
                "disruption": {"consolidateAfter": "5m"}}),
            "5m",
        ),
    ];
    for (name, spec, want) in cases {
        let created = api
            .create(
                &PostParams::default(),
                &dynamic(&ar, json!({"metadata": {"name": name}, "spec": spec})),
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let disruption = &created.data["spec"]["disruption"];
        assert_eq!(disruption["consolidateAfter"], want, "{name}: {disruption}");
        // The other defaults of the same object, as upstream's CRD has them.
        if name != "static" {
            assert_eq!(disruption["budgets"], json!([{"nodes": "10%"}]), "{name}");
        }
        let typed: karpenter_capi::api::nodepool::NodePool =
            serde_json::from_value(serde_json::to_value(&created).unwrap()).unwrap();
        let want: karpenter_capi::api::duration::NillableDuration = want.parse().unwrap();
        assert_eq!(typed.disruption().consolidate_after(), want, "{name}");
    }
}

/// What the API server stores of a claim the controller would create still reads back as the
/// controller's NodeClaim (the stand-in serves the shipped CRD; the controller reads its types).
#[tokio::test]
async fn a_stored_claim_reads_back() {
    use karpenter_capi::api::nodeclaim::NodeClaim;
    let s = sim().await;
    let pool = karpenter_capi::testing::nodepool("default");
    let claim = karpenter_capi::simulate::launch::claim_for(&pool, "sim-0");
    let claims: Api<NodeClaim> = Api::all(s.client());
    let created = claims.create(&PostParams::default(), &claim).await;
    let name = match created {
        Ok(c) => c.name_any(),
        Err(e) => panic!("the stand-in refused or garbled the claim: {e}"),
    };
    let raw = nodeclaims(&s).get(&name).await.unwrap();
    let back: Result<NodeClaim, _> = serde_json::from_value(serde_json::to_value(&raw).unwrap());
    assert!(back.is_ok(), "{back:?}\n{raw:?}");
}
