//! Issue 37, the restart half of "never drift on what could not be read", written once for both
//! backends: a MachineDeployment whose capacity comes only from its infrastructure template, with
//! an initialized claim on it, and a controller restarted while every read of that template by
//! the controller fails. The simulated backend fails the reads with the server's fault injection
//! (500/503 on `devmachinetemplates` for the controller's User-Agent); kube-apiserver cannot be
//! told to answer 500, so there the Helm chart's ClusterRole loses `devmachinetemplates` (a 403
//! for the chart's ServiceAccount, which the controller runs as): what a user whose provider's
//! template kind is missing from `rbac.clusterAPI.infrastructureTemplates` meets. Both are a
//! read that fails with something other than 404, which `capi::template::read_template` turns
//! into `ReadError::Other` ("failing", not "missing"): the test asks the controller's own read
//! function, with the controller's identity, before it restarts the controller.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use karpenter_capi::actors::Settings;
use karpenter_capi::api::drift_hash::nodepool_hash;
use karpenter_capi::api::nodeclass::ClusterAPINodeClass;
use karpenter_capi::api::wellknown::{
    CPU_ANNOTATION, DEPLOYMENT_NAME_LABEL, INSTANCE_TYPE_LABEL, MAX_PODS_ANNOTATION,
    MEMORY_ANNOTATION, NODECLAIM_ANNOTATION, NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION,
    NODEPOOL_HASH_VERSION_ANNOTATION,
};
use karpenter_capi::capi::template::{ReadError, read_template};
use karpenter_capi::metrics::Metrics;
use karpenter_capi::sim::cluster::{Backend, INFRA_GROUP, INFRA_TEMPLATE_KIND};
use karpenter_capi::simulate::launch::{NODECLASS, claim_for, seed_of, settle};
use karpenter_capi::simulate::{sim_settings, start_controller};
use karpenter_capi::view::catalog::CatalogView;

use super::claims::{fast_disruption, served_events};
use super::{DEADLINE, Env, NS, condition, eventually};

/// md-0: capacity from its template only, the cheaper (0.20/h), instance type `sim-0`.
const TEMPLATE_ONLY: &str = "default/md-0";
/// md-1: capacity from its annotations (0.21/h), instance type `sim-1`.
const ANNOTATED: &str = "default/md-1";
const TEMPLATES: &str = "devmachinetemplates";

fn settings() -> Settings {
    Settings {
        disruption: fast_disruption(),
        ..sim_settings(None)
    }
}

/// md-1 as seeded, md-0 without a capacity annotation and a template that states cpu and memory,
/// the NodeClass and NodePool, and the controller (disruption passes every 200 ms).
async fn env(backend: Backend) -> Env {
    let (sim, pool) = Env::builder()
        .backend(backend)
        .seeds(vec![seed_of(1, 10)])
        .seeded()
        .await;
    let mut md = seed_of(0, 10);
    for a in [CPU_ANNOTATION, MEMORY_ANNOTATION, MAX_PODS_ANNOTATION] {
        md.annotations.remove(a);
    }
    sim.run(move |c| async move {
        let capacity = BTreeMap::from([
            ("cpu".to_string(), "4".to_string()),
            ("memory".to_string(), "16Gi".to_string()),
        ]);
        c.create_machine_template(NS, &md.name, capacity)
            .await
            .expect("md-0's template with its capacity");
        c.create_machine_deployment_from(&md).await.expect("md-0");
    })
    .await
    .expect("seeding");
    let metrics = Metrics::new();
    let controller = start_controller(&sim, settings(), metrics.clone())
        .await
        .expect("controller");
    Env {
        sim,
        pool,
        metrics,
        controller: Some(controller),
    }
}

fn catalog(env: &Env) -> &CatalogView {
    &env.controller().shared.catalog
}

/// A claim as the provisioner writes it (the pool's drift hash) that any of `types` can serve;
/// waits until it is initialized.
async fn stamped_claim_of(env: &Env, types: &[&str]) -> String {
    let mut claim = claim_for(&env.pool, types[0]);
    for r in &mut claim.spec.requirements {
        if r.key == INSTANCE_TYPE_LABEL {
            r.values = Some(types.iter().map(|t| t.to_string()).collect());
        }
    }
    claim.annotations_mut().extend([
        (
            NODEPOOL_HASH_ANNOTATION.to_string(),
            nodepool_hash(&env.pool),
        ),
        (
            NODEPOOL_HASH_VERSION_ANNOTATION.to_string(),
            NODEPOOL_HASH_VERSION.to_string(),
        ),
    ]);
    env.create_and_wait(claim).await.0
}

/// The MachineDeployment of the Machine claim `claim` launched on.
fn group_of(env: &Env, claim: &str) -> Option<String> {
    env.list("machines")
        .into_iter()
        .find(|m| m["metadata"]["annotations"][NODECLAIM_ANNOTATION] == claim)
        .and_then(|m| {
            m["metadata"]["labels"][DEPLOYMENT_NAME_LABEL]
                .as_str()
                .map(String::from)
        })
}

/// The claim is kept, not being deleted and not drifted.
fn assert_kept(env: &Env, claim: &str) {
    let c = env
        .get("nodeclaims", "", claim)
        .unwrap_or_else(|| panic!("claim {claim} was deleted"));
    assert!(
        c["metadata"]["deletionTimestamp"].is_null(),
        "claim {claim} is being deleted: {c:#}"
    );
    assert!(
        condition(&c, "Drifted").is_none_or(|d| d["status"] != "True"),
        "claim {claim} drifted: {c:#}"
    );
}

/// What the controller's own read of md-0's template answers now, with its identity (the
/// chart's ServiceAccount on the real backend) and its User-Agent (which the simulated server's
/// faults match).
async fn controller_reads_template(env: &Env) -> Result<(), ReadError> {
    let client = karpenter_capi::app::client_from_kubeconfig_with(
        env.sim.cluster().controller_kubeconfig_path(),
        &karpenter_capi::app::ClientOptions::default(),
    )
    .await
    .expect("the controller's client");
    read_template(&client, INFRA_GROUP, None, INFRA_TEMPLATE_KIND, NS, "md-0")
        .await
        .map(|_| ())
}

/// How the controller's template reads are made to fail, undone by [`Denied::lift`].
enum Denied {
    /// The simulated server answers them 500/503.
    Faults,
    /// The ClusterRoles that granted `devmachinetemplates`, with their rules as they were.
    Rbac(Vec<(String, Vec<PolicyRule>)>),
}

async fn deny_template_reads(env: &Env) -> Denied {
    match env.backend() {
        Backend::Simulated => {
            let faults = env.sim.cluster().server().faults();
            faults.set_agent(Some(karpenter_capi::app::USER_AGENT));
            faults.set_error_rate(TEMPLATES, 1.0);
            Denied::Faults
        }
        Backend::Real => {
            let api: Api<ClusterRole> = Api::all(env.client().await);
            let mut narrowed = Vec::new();
            for role in api
                .list(&Default::default())
                .await
                .expect("ClusterRoles")
                .items
            {
                let rules = role.rules.clone().unwrap_or_default();
                let grants = |r: &PolicyRule| {
                    r.resources
                        .as_ref()
                        .is_some_and(|rs| rs.iter().any(|x| x == TEMPLATES))
                };
                if !rules.iter().any(grants) {
                    continue;
                }
                let without: Vec<PolicyRule> = rules
                    .iter()
                    .cloned()
                    .filter_map(|mut r| {
                        if let Some(rs) = &mut r.resources {
                            rs.retain(|x| x != TEMPLATES);
                            if rs.is_empty() {
                                return None;
                            }
                        }
                        Some(r)
                    })
                    .collect();
                api.patch(
                    &role.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"rules": without})),
                )
                .await
                .expect("narrow the ClusterRole");
                narrowed.push((role.name_any(), rules));
            }
            assert!(
                !narrowed.is_empty(),
                "no ClusterRole granted {TEMPLATES} (the chart's should)"
            );
            Denied::Rbac(narrowed)
        }
    }
}

impl Denied {
    async fn lift(self, env: &Env) {
        match self {
            Denied::Faults => env.sim.cluster().server().faults().clear(),
            Denied::Rbac(roles) => {
                let api: Api<ClusterRole> = Api::all(env.client().await);
                for (name, rules) in roles {
                    api.patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"rules": rules})),
                    )
                    .await
                    .expect("restore the ClusterRole");
                }
            }
        }
    }
}

/// For `span`, every 100 ms: the claim on md-0 kept and not drifted, and md-0 at one replica
/// with one Machine (nothing launched on it, nothing released).
async fn hold(env: &Env, claim: &str, span: Duration) {
    let until = Instant::now() + span;
    while Instant::now() < until {
        assert_kept(env, claim);
        assert_eq!(env.replicas("md-0"), 1, "md-0's replicas changed");
        assert_eq!(env.machines_of("md-0").len(), 1, "md-0's Machines changed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 37: a template-capacity-only MachineDeployment whose template the restarted controller
/// cannot read is unknown, not gone: none of its claims drifts or goes, nothing launches on it (a
/// new claim goes to md-1 although md-0 is cheaper), the claim (Event) and the NodeClass (Ready
/// message) say why, and once the reads succeed it is offered (and launched on) again with
/// nothing drifted.
pub async fn template_reads_failing_after_a_restart_drift_and_launch_nothing(backend: Backend) {
    let mut env = env(backend).await;
    env.wait("md-0 offered from its template", || {
        catalog(&env).offering(TEMPLATE_ONLY)
    })
    .await;
    let claim = stamped_claim_of(&env, &["sim-0"]).await;
    assert_eq!(group_of(&env, &claim).as_deref(), Some("md-0"));
    settle(&env.sim, DEADLINE).await.expect("settles");

    let denied = deny_template_reads(&env).await;
    eventually("the controller's template reads failing", || async {
        match controller_reads_template(&env).await {
            Ok(()) => None,
            Err(ReadError::NotFound { .. }) => panic!("the template reads as missing, not failing"),
            Err(e) => Some(e.to_string()),
        }
    })
    .await;
    let since = env.sim.cluster().stats().now_ms();
    env.restart_with(settings()).await;
    env.wait("the restarted controller offers md-1", || {
        catalog(&env).offering(ANNOTATED)
    })
    .await;
    // Many disruption passes (every 200 ms) with md-0's template unreadable.
    hold(&env, &claim, Duration::from_secs(4)).await;
    let why = env
        .wait("md-0 unknown: its template could not be read", || {
            catalog(&env)
                .unknown(TEMPLATE_ONLY)
                .filter(|w| w.contains("could not be read"))
        })
        .await;
    assert!(catalog(&env).offering(TEMPLATE_ONLY).is_none(), "{why}");

    // A new claim either group serves goes to md-1, although md-0 is cheaper.
    let other = stamped_claim_of(&env, &["sim-0", "sim-1"]).await;
    assert_eq!(group_of(&env, &other).as_deref(), Some("md-1"));
    hold(&env, &claim, Duration::from_secs(1)).await;

    // The claim and the NodeClass say why.
    let client = env.client().await;
    eventually(
        "a MachineDeploymentUnknown Event on md-0's claim",
        || async {
            served_events(&client).await.into_iter().find(|e| {
                e["reason"] == "MachineDeploymentUnknown" && e["regarding"]["name"] == claim
            })
        },
    )
    .await;
    eventually("the NodeClass's Ready message names md-0", || async {
        let nc = Api::<ClusterAPINodeClass>::all(client.clone())
            .get(NODECLASS)
            .await
            .ok()?;
        let nc = serde_json::to_value(nc).ok()?;
        let message = condition(&nc, "Ready")?["message"].as_str()?.to_string();
        (message.contains("md-0") && message.contains("could not be read")).then_some(message)
    })
    .await;
    let md0_writes: Vec<_> = env
        .controller_replica_writes_since(since)
        .into_iter()
        .filter(|(_, _, name)| name == "md-0")
        .collect();
    assert!(
        md0_writes.is_empty(),
        "the controller wrote md-0 while it was unknown: {md0_writes:?}"
    );

    denied.lift(&env).await;
    env.wait("md-0 offered again once its template reads", || {
        catalog(&env).offering(TEMPLATE_ONLY)
    })
    .await;
    // md-0 is launched on again: the cheaper of the two.
    let third = stamped_claim_of(&env, &["sim-0", "sim-1"]).await;
    assert_eq!(group_of(&env, &third).as_deref(), Some("md-0"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    for c in [&claim, &other, &third] {
        assert_kept(&env, c);
    }
    settle(&env.sim, DEADLINE).await.expect("settles");
    for c in [&claim, &other, &third] {
        assert_kept(&env, c);
    }

    let stats = env.sim.cluster().stats();
    let violations = stats.violations();
    assert!(violations.is_empty(), "drain rules broken: {violations:#?}");
    // On the real backend the only refusals are the template reads denied above (and they
    // happened: the failure was RBAC's).
    let refused = stats.refused();
    let (templates, others): (Vec<_>, Vec<_>) = refused
        .keys()
        .partition(|r| r.starts_with("get ") && r.contains(&format!("/{TEMPLATES}/")));
    assert!(
        others.is_empty(),
        "the API server refused the controller: {others:?}"
    );
    if backend == Backend::Real {
        assert!(
            !templates.is_empty(),
            "no template read was refused: {refused:?}"
        );
    }
    env.invariants_hold();
}
