//! Switching from the Go Cluster API provider: started on the state it leaves (built by
//! `common::go_provider`, request by request as the provider and upstream Karpenter write it),
//! the controller adopts every live claim and its Machine with no replica write, no deletion,
//! no drain and no drift, finishes what was mid-flight, leaves other NodeClass kinds alone, and
//! leaves a state the Go provider reads without repairing anything. On both backends.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};

use karpenter_capi::api::wellknown::*;
use karpenter_capi::metrics::Metrics;
use karpenter_capi::sim::cluster::Backend;
use karpenter_capi::simulate::launch::{instance_type, seed_of};
use karpenter_capi::simulate::{sim_settings, start_controller};

use crate::common::go_provider::{
    GO_MACHINE_ANNOTATION, GoProvider, UPSTREAM_HASH, launched, ours,
};
use crate::common::{Env, NS, eventually_explained, fast_cluster};

on_both_backends![
    the_go_providers_claims_are_adopted_without_a_replica_write_a_deletion_or_a_drift,
    a_restart_in_the_middle_of_adoption_is_safe,
];

pub fn tests() -> Vec<crate::assets::Test> {
    on_both()
}

/// The controller's own writes: its User-Agent (on the real backend the audit log names the
/// writer `user (User-Agent)`), after it started.
fn by_controller(w: &karpenter_capi::sim::WriteRecord, since_ms: u64) -> bool {
    let agent = karpenter_capi::app::USER_AGENT;
    w.at_ms > since_ms && (w.agent == agent || w.agent.ends_with(&format!(" ({agent})")))
}

/// What the Go provider left: live claims by the Machine each ends on, the claim being deleted,
/// the claim of another NodeClass kind, and the replicas it set.
struct Left {
    live: BTreeMap<String, String>,
    deleting: String,
    foreign: (String, String),
    uids: BTreeMap<String, String>,
    replicas: BTreeMap<String, i64>,
    /// When the controller started (the server's clock): its writes are the ones after.
    since_ms: u64,
}

/// Provider IDs arrive late enough that a Machine bound just now has none when the controller
/// starts.
async fn seeded(backend: Backend) -> Env {
    let mut cluster = fast_cluster();
    cluster.provider_delay = Duration::from_millis(1500);
    let (sim, pool) = Env::builder()
        .cluster(cluster)
        .backend(backend)
        .seeds(vec![seed_of(0, 10), seed_of(1, 10)])
        .seeded()
        .await;
    Env {
        sim,
        pool,
        metrics: Metrics::new(),
        controller: None,
    }
}

/// The NodePool requires the label Cluster API propagates from each MachineDeployment's
/// template (`node.cluster.x-k8s.io/pool`), as users' NodePools select node groups: a claim
/// the Go provider left without it drifts unless its adoption writes it (issue 37).
const POOL_LABEL: &str = "node.cluster.x-k8s.io/pool";

async fn left_by_the_go_provider(env: &Env) -> Left {
    let go = GoProvider::new(env).await;
    env.patch_pool(json!({"spec": {"template": {"spec": {"requirements": [
        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]},
        {"key": POOL_LABEL, "operator": "In", "values": ["md-0", "md-1"]},
    ]}}}}))
    .await;
    go.stamp_nodepool().await;
    let (it0, it1) = (instance_type(0), instance_type(1));
    let mut taken = BTreeSet::new();
    let mut live = BTreeMap::new();
    // Launched, registered and initialized.
    for (name, md, it) in [
        ("go-a", "md-0", &it0),
        ("go-b", "md-0", &it0),
        ("go-c", "md-1", &it1),
    ] {
        let (c, m) = launched(&go, env, name, md, it, &mut taken).await;
        live.insert(c, m);
    }
    // Being deleted: drained, its Machine marked and its replica removed by the provider.
    let (deleting, dm) = launched(&go, env, "go-d", "md-1", &it1, &mut taken).await;
    go.delete(&deleting, &dm, "md-1").await;
    // Mid-launch: bound, the Machine without a provider ID yet.
    let e = go.create_claim("go-e", &it0, ours()).await;
    go.raise("md-0").await;
    let me = go.unclaimed_machine(env, "md-0", &taken).await;
    taken.insert(me.clone());
    go.bind(&me, &e).await;
    live.insert(e, me);
    // Mid-launch: replicas raised, the Machine not bound yet.
    let f = go.create_claim("go-f", &it0, ours()).await;
    go.raise("md-0").await;
    let mf = go.unclaimed_machine(env, "md-0", &taken).await;
    live.insert(f, mf);
    // Another provider's claim.
    let aws = json!({"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"});
    let g = go.create_claim("aws-g", &it0, aws).await;
    // On the real backend the store is a watch's mirror: wait until it shows the last claim
    // written, so that every identity below is read from it.
    let foreign_rv = env
        .wait("the other kind's claim in the store", || {
            env.get("nodeclaims", "", &g)
                .and_then(|c| c["metadata"]["resourceVersion"].as_str().map(String::from))
        })
        .await;
    let uids = env
        .list("nodeclaims")
        .iter()
        .map(|c| {
            (
                name(c),
                c["metadata"]["uid"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let replicas = ["md-0", "md-1"]
        .iter()
        .map(|md| (md.to_string(), env.replicas(md)))
        .collect();
    Left {
        live,
        deleting,
        foreign: (g, foreign_rv),
        uids,
        replicas,
        since_ms: env.sim.cluster().stats().now_ms(),
    }
}

fn name(v: &Value) -> String {
    v["metadata"]["name"].as_str().unwrap_or("").to_string()
}

fn condition(c: &Value, t: &str) -> Option<String> {
    c["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|x| x["type"] == t)
        .and_then(|x| x["status"].as_str().map(String::from))
}

/// Every live claim initialized on its Machine, bound by our annotation; the deleting one gone.
async fn adopted(env: &Env, left: &Left) {
    let done = |e: &Env| {
        e.get("nodeclaims", "", &left.deleting).is_none()
            && left.live.iter().all(|(c, m)| {
                let claim = e.get("nodeclaims", "", c);
                let machine = e.get("machines", NS, m);
                claim.is_some_and(|c| condition(&c, "Initialized").as_deref() == Some("True"))
                    && machine.is_some_and(|m| {
                        m["metadata"]["annotations"][NODECLAIM_ANNOTATION] == c.as_str()
                    })
            })
    };
    eventually_explained(
        "every claim adopted and settled",
        || std::future::ready(done(env).then_some(())),
        || adoption_state(env, left),
    )
    .await;
}

/// For a failed wait: each claim the Go provider left with its Machine, every Machine of the
/// MachineDeployments, and what the controller wrote.
fn adoption_state(env: &Env, left: &Left) -> String {
    let mut out = String::new();
    for (c, m) in &left.live {
        let claim = env.get("nodeclaims", "", c);
        let machine = env.get("machines", NS, m);
        out += &format!(
            "{c}: initialized {:?}; expected Machine {m} exists {}, bound to {}\n",
            claim.as_ref().and_then(|c| condition(c, "Initialized")),
            machine.is_some(),
            machine
                .as_ref()
                .map(|m| m["metadata"]["annotations"][NODECLAIM_ANNOTATION].to_string())
                .unwrap_or_default(),
        );
    }
    for md in left.replicas.keys() {
        for m in env.machines_of(md) {
            out += &format!(
                "{md} Machine {} created {} deleting {} bound to {} provider ID {}\n",
                name(&m),
                m["metadata"]["creationTimestamp"],
                !m["metadata"]["deletionTimestamp"].is_null(),
                m["metadata"]["annotations"][NODECLAIM_ANNOTATION],
                m["spec"]["providerID"],
            );
        }
    }
    for w in env.sim.cluster().stats().writes() {
        let machine_churn = w.resource == "machines" && (w.verb == "create" || w.verb == "delete");
        if by_controller(&w, left.since_ms) || machine_churn {
            out += &format!(
                "{}: {} {} {}/{} at {} ms\n",
                w.agent, w.verb, w.resource, w.subresource, w.name, w.at_ms
            );
        }
    }
    out
}

fn assert_untouched_and_go_readable(env: &Env, left: &Left) {
    // No replica write, no deletion, no drain, no claim created.
    for (md, before) in &left.replicas {
        assert_eq!(env.replicas(md), *before, "{md}: replicas unchanged");
    }
    let writes = env.sim.cluster().stats().writes();
    let ours: Vec<_> = writes
        .iter()
        .filter(|w| by_controller(w, left.since_ms))
        .collect();
    for w in &ours {
        say!(
            "{} {} {}/{} {}",
            w.verb,
            w.resource,
            w.subresource,
            w.name,
            w.at_ms
        );
    }
    let forbidden: Vec<_> = ours
        .iter()
        .filter(|w| {
            w.verb == "delete"
                && matches!(
                    w.resource.as_str(),
                    "machines" | "nodeclaims" | "machinedeployments"
                )
                || w.verb == "create" && (w.resource == "nodeclaims" || w.subresource == "eviction")
        })
        .collect();
    assert!(
        forbidden.is_empty(),
        "no deletion, claim or eviction: {forbidden:#?}"
    );
    let md_writes: Vec<_> = ours
        .iter()
        .filter(|w| w.resource == "machinedeployments")
        .collect();
    assert!(
        md_writes.len() <= 2 * left.replicas.len(),
        "only the adoption records: {md_writes:#?}"
    );
    for md in left.replicas.keys() {
        let annotations = env
            .list("machinedeployments")
            .into_iter()
            .find(|d| name(d) == *md)
            .map(|d| d["metadata"]["annotations"].clone())
            .unwrap_or(Value::Null);
        assert!(
            annotations[MANAGED_REPLICAS_ANNOTATION].is_string(),
            "{md} adopted: {annotations:#}"
        );
    }
    // Identity kept, no drift.
    for c in env.list("nodeclaims") {
        let n = name(&c);
        assert_eq!(
            c["metadata"]["uid"].as_str(),
            left.uids.get(&n).map(String::as_str),
            "{n} keeps its identity"
        );
        assert_ne!(
            condition(&c, "Drifted").as_deref(),
            Some("True"),
            "{n} not drifted"
        );
    }
    for c in left.live.keys() {
        let claim = env.get("nodeclaims", "", c).expect("live claim");
        assert_eq!(
            claim["metadata"]["annotations"][NODEPOOL_HASH_ANNOTATION],
            UPSTREAM_HASH
        );
    }
    let (g, rv) = &left.foreign;
    let foreign = env
        .get("nodeclaims", "", g)
        .expect("the other kind's claim");
    assert_eq!(
        foreign["metadata"]["resourceVersion"].as_str(),
        Some(rv.as_str()),
        "another NodeClass kind's claim untouched: {foreign:#}"
    );
    // Rollback: what the Go provider reads is whole. Each claim names its Machine, which carries
    // the member label and the claim's provider ID; no Machine is left unclaimed (its next
    // create would take it), and every replica has a claimed Machine.
    for (c, m) in &left.live {
        let claim = env.get("nodeclaims", "", c).expect("claim");
        let machine = env.get("machines", NS, m).expect("machine");
        assert_eq!(
            claim["metadata"]["annotations"][GO_MACHINE_ANNOTATION],
            format!("{NS}/{m}").as_str(),
            "{c} names its Machine"
        );
        assert!(
            machine["metadata"]["labels"].get(MEMBER_LABEL).is_some(),
            "{m} member"
        );
        assert_eq!(claim["status"]["providerID"], machine["spec"]["providerID"]);
    }
    for md in left.replicas.keys() {
        let live: Vec<Value> = env
            .machines_of(md)
            .into_iter()
            .filter(|m| m["metadata"]["deletionTimestamp"].is_null())
            .collect();
        assert!(
            live.iter()
                .all(|m| m["metadata"]["labels"].get(MEMBER_LABEL).is_some()),
            "{md}: no unclaimed Machine"
        );
        assert_eq!(
            env.replicas(md),
            live.len() as i64,
            "{md}: a claimed Machine per replica"
        );
    }
}

async fn the_go_providers_claims_are_adopted_without_a_replica_write_a_deletion_or_a_drift(
    backend: Backend,
) {
    let mut env = seeded(backend).await;
    let left = left_by_the_go_provider(&env).await;
    // Disruption passes every 200 ms: a drift of the adopted claims would show within the
    // wait below (the Go provider's in-flight claims drifted 5-6 s after their launch).
    let settings = karpenter_capi::actors::Settings {
        disruption: crate::common::claims::fast_disruption(),
        ..sim_settings(None)
    };
    env.controller = Some(
        start_controller(&env.sim, settings, env.metrics.clone())
            .await
            .expect("controller"),
    );
    adopted(&env, &left).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_untouched_and_go_readable(&env, &left);
    for c in left.live.keys() {
        let claim = env.get("nodeclaims", "", c).expect("live claim");
        assert!(
            claim["metadata"]["labels"][POOL_LABEL].is_string(),
            "{c} carries the label its NodePool requires: {:#}",
            claim["metadata"]["labels"]
        );
    }
    env.invariants_hold();
}

async fn a_restart_in_the_middle_of_adoption_is_safe(backend: Backend) {
    let mut env = seeded(backend).await;
    let left = left_by_the_go_provider(&env).await;
    env.controller = Some(
        start_controller(&env.sim, sim_settings(None), env.metrics.clone())
            .await
            .expect("controller"),
    );
    // Killed as soon as it recorded its first adoption, before the bindings.
    env.wait("the first adoption record", || {
        let writes = env.sim.cluster().stats().writes();
        writes
            .iter()
            .any(|w| by_controller(w, left.since_ms) && w.resource == "machinedeployments")
            .then_some(())
    })
    .await;
    env.restart().await;
    adopted(&env, &left).await;
    assert_untouched_and_go_readable(&env, &left);
    env.invariants_hold();
}
