//! Deployment artifacts against the code: every YAML file parses, the chart's CRDs are the
//! generated ones, RBAC grants exactly what the controller calls (no less, no more), the
//! Deployment is hardened and probed on the ports the binary serves, every env var it sets is a
//! real `run` flag twin with a value the real parser accepts, and the Helm templates only use
//! values that exist. The real tools check the same files the way users run them: `helm lint`
//! and `helm template` (the workload topology, joined or with a separate management cluster, and
//! the management topology, whose rendered RBAC, Secret mount and flags are checked too), and
//! `kubectl apply --dry-run=client` against the simulated cluster (`.ci/install-tools` installs
//! helm v4 and kubectl v1.35; without them those tests are reported as ignored, in CI they fail).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use karpenter_capi::cli::Cli;
use karpenter_capi::view::binding::is_karpenter_group;
use serde_json::Value;

use crate::assets;
use crate::common::chart::{CHART, strings, stripped_docs, yaml_docs};
use assets::{Asset, tool};

pub fn tests() -> Vec<assets::Test> {
    trials![
        manifests_rbac_grants_exactly_what_the_controller_calls,
        chart_rbac_grants_exactly_what_the_controller_calls,
        chart_grants_gated_rules_only_with_the_gate,
        chart_grants_generation_rules_only_when_enabled,
        manifests_grant_generation_only_in_the_opt_in_file,
        manifests_deployment_is_hardened_probed_and_spread,
        chart_deployment_is_hardened_probed_and_spread,
        deployment_env_values_are_valid_run_flags_and_agree,
        chart_sets_every_run_env_twin,
        service_and_pdb_select_the_controller_pods,
        service_monitor_is_optional_and_off_by_default,
        grafana_dashboard_is_optional_off_by_default_and_one_file,
        every_yaml_file_parses,
        chart_crds_are_copies_of_deploy_crds,
        helm_templates_use_existing_values_and_helpers,
        helm_lints_and_renders_the_chart needs [Helm],
        helm_refuses_management_values_that_cannot_work needs [Helm],
        helm_renders_generation_rules_only_when_enabled_and_where_the_objects_are needs [Helm],
        @tokio kubectl_dry_run_applies_manifests_crds_and_the_rendered_chart needs [Kubectl, Helm],
        manifests_and_crds_use_only_fields_their_types_know,
    ]
}

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MANIFESTS: &str = "deploy/manifests";
pub(crate) const NAMESPACE: &str = "karpenter-capi";
const SERVICE_ACCOUNT: &str = "karpenter-capi";
const LEASE: &str = "karpenter-capi-leader-election";

// ---------------------------------------------------------------------------------------------
// What the controller calls. KEEP THIS TABLE IN STEP WITH THE CODE: when an actor starts using a
// new resource or verb (grep for `Api::all`, `Api::namespaced`, `watcher(`, `.get(`, `.get_opt(`,
// `.create(`, `.patch(`, `.patch_status(`, `.replace(`, `.delete(`, the event Recorder), add the
// row here, then the rule in deploy/manifests and the chart. Nothing is granted ahead of the code:
// tests/control_plane/rbac.rs runs the controller under the chart's RBAC on a real API server and
// fails on a permission its audit log shows unused. The tests below fail until RBAC matches this
// table exactly.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    /// Workload cluster, cluster-wide (ClusterRole).
    Workload,
    /// The cluster the pods run in, their own namespace (Role): the leader-election Lease.
    LeaderNamespace,
    /// The cluster holding the Cluster API objects (management-rbac.yaml; the chart's ClusterRole
    /// when joined, its Role in the Cluster's namespace in the management topology).
    Management,
    /// The management cluster in the fleet topology, beyond Cluster API and the Leases: each
    /// Cluster's workload kubeconfig Secret and its Events (the chart's `-fleet` role; no plain
    /// manifest).
    Fleet,
    /// The management cluster's ClusterRole for Karpenter's own kinds (the chart's
    /// `-karpenter-objects` one) with `karpenterObjects=management`. No row names it: the
    /// workload rows of Karpenter's kinds move here ([`placed`]).
    KarpenterObjects,
}

#[derive(Clone, Copy, Debug)]
enum Use {
    /// Called today, from this code.
    Code(#[allow(dead_code)] &'static str),
    /// Called from this code only with the feature gate on: granted then, and only then.
    Gated(&'static str, #[allow(dead_code)] &'static str),
    /// Called only where a chart value switches the feature on (the plain manifests grant it in
    /// an opt-in file of `deploy/manifests/optional`): granted then, and only then.
    Switched(&'static str, #[allow(dead_code)] &'static str),
}

/// The gate a row needs, if any.
fn gate_of(n: &Need) -> Option<&'static str> {
    match n.by {
        Use::Code(_) | Use::Switched(..) => None,
        Use::Gated(gate, _) => Some(gate),
    }
}

/// The chart value a row needs, if any.
fn switch_of(n: &Need) -> Option<&'static str> {
    match n.by {
        Use::Switched(value, _) => Some(value),
        Use::Code(_) | Use::Gated(..) => None,
    }
}

/// The gate or chart value a row needs, if any.
fn condition_of(n: &Need) -> Option<&'static str> {
    gate_of(n).or_else(|| switch_of(n))
}

/// Where a row is granted: its scope, except that with `karpenterObjects=management` in
/// `switches` the workload rows of Karpenter's kinds move to the management cluster, by API
/// group as the code picks their client (`view::binding::is_karpenter_group`).
fn placed(n: &Need, switches: &[&str]) -> Scope {
    let moved =
        n.scope == Workload && is_karpenter_group(n.group) && switches.contains(&KARPENTER_OBJECTS);
    if moved { KarpenterObjects } else { n.scope }
}

/// The gates `FEATURE_GATES` turns on (`Name=true` pairs).
fn gates_on(feature_gates: &str) -> Vec<String> {
    feature_gates
        .split(',')
        .filter_map(|p| p.trim().strip_suffix("=true"))
        .map(str::to_string)
        .collect()
}

struct Need {
    scope: Scope,
    group: &'static str,
    /// A resource, or `*suffix` for a family RBAC must list one by one (infrastructure templates).
    resource: &'static str,
    verbs: &'static [&'static str],
    #[allow(dead_code)]
    by: Use,
}

const fn need(
    scope: Scope,
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    by: Use,
) -> Need {
    Need {
        scope,
        group,
        resource,
        verbs,
        by,
    }
}

use Scope::{Fleet, KarpenterObjects, LeaderNamespace, Management, Workload};
use Use::{Code, Gated, Switched};

const DELETION_COST: &str = "PodDeletionCostManagement";
/// The chart value that grants what generated node groups need (docs/generate.md).
const GENERATE: &str = "generate.enabled";
/// The plain manifests' opt-in file for the same (not applied by `kubectl apply -f deploy/manifests/`).
const GENERATE_MANIFEST: &str = "deploy/manifests/optional/generate-rbac.yaml";
/// The verbs generated node groups need on the `*machinetemplates` kinds.
const GENERATE_TEMPLATE_VERBS: [&str; 3] = ["create", "delete", "list"];
/// The chart value that puts Karpenter's objects in the management cluster (docs/deploy.md).
const KARPENTER_OBJECTS: &str = "karpenterObjects=management";

#[rustfmt::skip]
const NEEDS: &[Need] = &[
    need(Workload, "", "nodes", &["list", "watch"], Code("actors/watches.rs start: Node feed (state::nodes)")),
    need(Workload, "", "nodes", &["patch", "delete"], Code("actors/nodeclaim/ register, initialize, delete_node")),
    need(Workload, "", "nodes", &["get"], Code("actors/nodeclaim/termination.rs node_not_indexed_yet")),
    need(Workload, "", "pods", &["list", "watch"], Code("actors/provisioner.rs pod watcher (also the terminator's pod index)")),
    need(Workload, "", "pods", &["delete"], Code("actors/terminator forced deletion at the termination deadline")),
    need(Workload, "", "pods", &["patch"], Gated(DELETION_COST, "actors/deletion_cost.rs the deletion cost and its sentinel")),
    need(Workload, "", "pods/eviction", &["create"], Code("actors/terminator evict")),
    need(Workload, "", "persistentvolumeclaims", &["get"], Code("actors/terminator/volumes.rs volumes of pods that are not drained")),
    need(Workload, "storage.k8s.io", "volumeattachments", &["list", "watch"], Code("actors/watches.rs start: VolumeAttachment feed (state::volumes)")),
    need(Workload, "", "persistentvolumeclaims", &["list", "watch"], Code("actors/watches.rs start: PersistentVolumeClaim feed (state::storage)")),
    need(Workload, "", "persistentvolumes", &["list", "watch"], Code("actors/watches.rs start: PersistentVolume feed (state::storage)")),
    need(Workload, "storage.k8s.io", "storageclasses", &["list", "watch"], Code("actors/watches.rs start: StorageClass feed (state::storage)")),
    need(Workload, "storage.k8s.io", "csinodes", &["list", "watch"], Code("actors/watches.rs start: CSINode feed (state::storage, volume limits)")),
    need(Workload, "policy", "poddisruptionbudgets", &["list", "watch"], Code("actors/watches.rs start: PodDisruptionBudget feed (state::pdbs)")),
    need(Workload, "apps", "daemonsets", &["list", "watch"], Code("actors/watches.rs start: DaemonSet feed (state::daemonsets)")),
    need(Workload, "", "services", &["list", "watch"], Code("actors/watches.rs start: Service feed (state::workloads, default topology spread)")),
    need(Workload, "", "replicationcontrollers", &["list", "watch"], Code("actors/watches.rs start: ReplicationController feed (state::workloads, default topology spread)")),
    need(Workload, "apps", "replicasets", &["list", "watch"], Code("actors/watches.rs start: ReplicaSet feed (state::workloads, default topology spread)")),
    need(Workload, "apps", "statefulsets", &["list", "watch"], Code("actors/watches.rs start: StatefulSet feed (state::workloads, default topology spread)")),
    need(Workload, "karpenter.sh", "nodeclaims", &["list", "watch"], Code("actors/supervisor.rs watcher")),
    need(Workload, "karpenter.sh", "nodeclaims", &["get", "patch", "delete"], Code("actors/nodeclaim.rs reread, patch_claim, delete_claim")),
    need(Workload, "karpenter.sh", "nodeclaims", &["create"], Code("actors/provisioner.rs create")),
    need(Workload, "karpenter.sh", "nodeclaims/status", &["patch"], Code("actors/nodeclaim.rs patch_status")),
    need(Workload, "karpenter.sh", "nodepools", &["list", "watch"], Code("actors/watches.rs start: NodePool feed (state::named)")),
    need(Workload, "karpenter.sh", "nodepools/status", &["patch"], Code("actors/nodepools.rs status")),
    need(Workload, "karpenter.cluster.x-k8s.io", "clusterapinodeclasses", &["list", "watch"], Code("actors/watches.rs start: NodeClass feed (state::named)")),
    need(Workload, "karpenter.cluster.x-k8s.io", "clusterapinodeclasses/status", &["patch"], Code("actors/catalog.rs Ready condition")),
    need(Workload, "karpenter.sh", "nodeoverlays", &["list", "watch"], Code("actors/watches.rs start: NodeOverlay feed (state::named)")),
    need(Workload, "karpenter.sh", "nodeoverlays/status", &["patch"], Code("actors/catalog/overlays.rs NodeOverlay conditions")),
    need(Workload, "autoscaling.x-k8s.io", "capacitybuffers", &["list", "watch"], Code("actors/buffers watcher")),
    need(Workload, "autoscaling.x-k8s.io", "capacitybuffers/status", &["patch"], Code("actors/buffers status")),
    need(Workload, "autoscaling.x-k8s.io", "capacityquotas", &["list", "watch"], Code("actors/quotas watcher")),
    need(Workload, "autoscaling.x-k8s.io", "capacityquotas/status", &["patch"], Code("actors/quotas status")),
    need(Workload, "", "podtemplates", &["get", "list", "watch"], Code("actors/buffers resolve and watcher")),
    need(Workload, "apps", "deployments", &["get", "list", "watch"], Code("actors/buffers resolve and watcher")),
    need(Workload, "apps", "replicasets", &["get", "list", "watch"], Code("actors/buffers resolve and watcher")),
    need(Workload, "apps", "statefulsets", &["get", "list", "watch"], Code("actors/buffers resolve and watcher")),
    need(Workload, "events.k8s.io", "events", &["create", "patch"], Code("actors/events.rs kube Recorder")),
    need(LeaderNamespace, "coordination.k8s.io", "leases", &["get", "create", "update"], Code("leader.rs get_opt, create, replace")),
    need(LeaderNamespace, "coordination.k8s.io", "leases", &["list", "watch"], Code("leader.rs watch of the one Lease (metadata.name field selector)")),
    need(Management, "events.k8s.io", "events", &["create", "patch"], Switched(KARPENTER_OBJECTS, "actors/events.rs target: Events about Karpenter's objects, in the Cluster's namespace")),
    need(Fleet, "", "secrets", &["get"], Code("app/fleet.rs workload_config: each Cluster's kubeconfig Secret")),
    need(Fleet, "events.k8s.io", "events", &["create"], Code("app/fleet.rs serve: ClusterServed, ClusterNotServed, ClusterLeaseLost Events on the Cluster")),
    need(Management, "cluster.x-k8s.io", "machines", &["list", "watch"], Code("actors/watches/capi.rs start")),
    need(Management, "cluster.x-k8s.io", "machines", &["get", "patch", "delete"], Code("actors/scaler refresh_machine, patch_machine, delete_machine")),
    need(Management, "cluster.x-k8s.io", "machinedeployments", &["list", "watch"], Code("actors/watches/capi.rs start")),
    need(Management, "cluster.x-k8s.io", "machinedeployments", &["get", "patch"], Code("actors/scaler refresh_deployment, replica write")),
    need(Management, "cluster.x-k8s.io", "machinesets", &["list", "watch"], Code("actors/watches/capi.rs MachineSets: a preflight check holding a scale-up")),
    need(Management, "cluster.x-k8s.io", "clusters", &["list", "watch"], Code("actors/watches/capi.rs clusters: Cluster API's pause")),
    need(Management, "cluster.x-k8s.io", "machinepools", &["list", "watch"], Code("actors/watches/capi.rs scalables: an optional kind")),
    need(Management, "cluster.x-k8s.io", "machinepools", &["get", "patch"], Code("actors/scaler refresh_deployment, replica write of a MachinePool")),
    need(Management, "infrastructure.cluster.x-k8s.io", "*machinetemplates", &["get"], Code("actors/catalog.rs fetch_missing_templates")),
    need(Management, "infrastructure.cluster.x-k8s.io", "*machinepools", &["get"], Code("actors/catalog.rs fetch_missing_templates (a MachinePool's infrastructure pool)")),
    need(Management, "cluster.x-k8s.io", "machinedeployments", &["create", "delete"], Switched(GENERATE, "the Generator (issue 44, being built): a generated group's create, an idle one's delete")),
    need(Management, "infrastructure.cluster.x-k8s.io", "*machinetemplates", &GENERATE_TEMPLATE_VERBS, Switched(GENERATE, "the Generator (issue 44, being built): a group's template copy created and deleted, marked ones no group references listed")),
];

/// Template kinds RBAC must list: the simulated cluster's and the Docker provider's.
const REQUIRED_TEMPLATES: &[&str] = &["devmachinetemplates", "dockermachinetemplates"];

// ---------------------------------------------------------------------------------------------
// Reading files
// ---------------------------------------------------------------------------------------------

pub(crate) fn path(rel: &str) -> PathBuf {
    Path::new(ROOT).join(rel)
}

pub(crate) fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// Files of `dir` ending in one of `exts`, sorted by name.
fn files(dir: &str, exts: &[&str]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(path(dir))
        .unwrap_or_else(|e| panic!("listing {dir}: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| exts.contains(&x))
        })
        .collect();
    out.sort();
    out
}

fn manifest_docs() -> Vec<(String, Value)> {
    files(MANIFESTS, &["yaml", "yml"])
        .iter()
        .flat_map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            yaml_docs(&read(p), &name)
                .into_iter()
                .map(move |d| (name.clone(), d))
        })
        .collect()
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or("")
}

fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or("")
}

fn one<'a>(docs: &'a [(String, Value)], k: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| kind(d) == k)
        .collect();
    assert_eq!(found.len(), 1, "expected exactly one {k} in {MANIFESTS}");
    found[0]
}

fn chart_template(file: &str) -> Vec<Value> {
    let p = path(&format!("{CHART}/templates/{file}"));
    stripped_docs(&read(&p), &format!("templates/{file} (stripped)"))
}

pub(crate) fn values() -> Value {
    let p = path(&format!("{CHART}/values.yaml"));
    yaml_docs(&read(&p), "values.yaml")
        .pop()
        .expect("values.yaml is empty")
}

// ---------------------------------------------------------------------------------------------
// RBAC
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    names: Vec<String>,
}

fn rules(role: &Value) -> Vec<Rule> {
    role["rules"]
        .as_array()
        .unwrap_or_else(|| panic!("{} {} has no rules", kind(role), name(role)))
        .iter()
        .map(|r| Rule {
            groups: strings(&r["apiGroups"]),
            resources: strings(&r["resources"]),
            verbs: strings(&r["verbs"]),
            names: strings(&r["resourceNames"]),
        })
        .collect()
}

fn resource_matches(need: &str, granted: &str) -> bool {
    match need.strip_prefix('*') {
        Some(suffix) => granted.ends_with(suffix),
        None => need == granted,
    }
}

/// Checks `granted` against the table rows placed in `scope`: every needed (group, resource,
/// verb) is granted, nothing else is, and no wildcard is used; a gated or switched row counts
/// only when `gates` has its gate or chart value, and is placed by them ([`placed`]). Returns
/// the problems found.
fn audit(scope: Scope, granted: &[Rule], gates: &[&str]) -> Vec<String> {
    let needs: Vec<&Need> = NEEDS
        .iter()
        .filter(|n| placed(n, gates) == scope && condition_of(n).is_none_or(|g| gates.contains(&g)))
        .collect();
    let mut problems = Vec::new();
    for r in granted {
        for field in [&r.groups, &r.resources, &r.verbs] {
            if field.iter().any(|s| s.contains('*')) {
                problems.push(format!("{scope:?}: wildcard in {r:?}"));
            }
        }
        for g in &r.groups {
            for res in &r.resources {
                for v in &r.verbs {
                    let wanted = needs.iter().any(|n| {
                        n.group == g
                            && resource_matches(n.resource, res)
                            && n.verbs.contains(&v.as_str())
                    });
                    if !wanted {
                        problems.push(format!(
                            "{scope:?}: grants {v} on {g:?}/{res}, which no row of NEEDS uses"
                        ));
                    }
                }
            }
        }
    }
    for n in &needs {
        for v in n.verbs {
            let ok = granted.iter().any(|r| {
                r.groups.iter().any(|g| g == n.group)
                    && r.resources
                        .iter()
                        .any(|res| resource_matches(n.resource, res))
                    && r.verbs.iter().any(|x| x == v)
            });
            if !ok {
                problems.push(format!(
                    "{scope:?}: {v} on {:?}/{} is needed ({:?}) but not granted",
                    n.group, n.resource, n.by
                ));
            }
        }
    }
    problems
}

fn template_resources(rules: &[Rule]) -> BTreeSet<String> {
    rules
        .iter()
        .filter(|r| {
            r.groups
                .iter()
                .any(|g| g == "infrastructure.cluster.x-k8s.io")
        })
        .flat_map(|r| r.resources.clone())
        .collect()
}

/// Roles of `docs` of the given kind, each checked to be bound to the controller's account.
fn bound_roles<'a>(docs: &'a [(String, Value)], role_kind: &str) -> Vec<(&'a str, &'a Value)> {
    let binding_kind = format!("{role_kind}Binding");
    docs.iter()
        .filter(|(_, d)| kind(d) == role_kind)
        .map(|(file, role)| {
            let bound = docs.iter().any(|(_, b)| {
                kind(b) == binding_kind
                    && b["roleRef"]["kind"] == role_kind
                    && b["roleRef"]["name"] == name(role)
                    && b["subjects"].as_array().is_some_and(|s| {
                        s.iter().any(|s| {
                            s["kind"] == "ServiceAccount"
                                && s["name"] == SERVICE_ACCOUNT
                                && s["namespace"] == NAMESPACE
                        })
                    })
            });
            assert!(
                bound,
                "{role_kind} {} ({file}) is not bound to {NAMESPACE}/{SERVICE_ACCOUNT}",
                name(role)
            );
            (file.as_str(), role)
        })
        .collect()
}

fn manifests_rbac_grants_exactly_what_the_controller_calls() {
    let docs = manifest_docs();
    let mut workload = Vec::new();
    let mut management = Vec::new();
    for (file, role) in bound_roles(&docs, "ClusterRole") {
        let rs = rules(role);
        let capi = rs.iter().any(|r| {
            r.groups
                .iter()
                .any(|g| g.ends_with("cluster.x-k8s.io") && g != "karpenter.cluster.x-k8s.io")
        });
        // The split matters: a separate management cluster gets management-rbac.yaml only.
        if file == "management-rbac.yaml" {
            management.extend(rs);
        } else {
            assert!(
                !capi,
                "{file}: Cluster API rules belong in management-rbac.yaml"
            );
            workload.extend(rs);
        }
    }
    let roles = bound_roles(&docs, "Role");
    assert_eq!(roles.len(), 1, "one namespaced Role, for the Lease");
    let (_, lease_role) = roles[0];
    assert_eq!(lease_role["metadata"]["namespace"], NAMESPACE);
    let lease_rules = rules(lease_role);
    for r in &lease_rules {
        let by_name_only = r.verbs.iter().all(|v| v == "get" || v == "update");
        if by_name_only {
            assert_eq!(
                r.names,
                vec![LEASE.to_string()],
                "get/update only on the one Lease"
            );
        }
    }

    // The manifests install the default gates: nothing gated is granted.
    let mut problems = audit(Workload, &workload, &[]);
    problems.extend(audit(LeaderNamespace, &lease_rules, &[]));
    problems.extend(audit(Management, &management, &[]));
    assert!(
        problems.is_empty(),
        "RBAC vs NEEDS:\n{}",
        problems.join("\n")
    );
    let templates = template_resources(&management);
    for t in REQUIRED_TEMPLATES {
        assert!(
            templates.contains(*t),
            "management-rbac.yaml does not list {t}"
        );
    }
}

/// The rules a `_rules-*.tpl` helper defines (a YAML list once its template lines are stripped),
/// after checking that every template named uses it under `rules:`.
fn chart_rules(helper_file: &str, helper: &str, used_by: &[&str]) -> Vec<Rule> {
    for file in used_by {
        let text = read(&path(&format!("{CHART}/templates/{file}")));
        assert!(
            text.contains(&format!(
                "rules:\n  {{{{- include \"{helper}\" . | nindent 2 }}}}"
            )),
            "{file} takes its rules from {helper}"
        );
    }
    let list = chart_template(helper_file)
        .pop()
        .unwrap_or_else(|| panic!("{helper_file} defines no rules"));
    rules(&serde_json::json!({ "rules": list }))
}

fn chart_rbac_grants_exactly_what_the_controller_calls() {
    let mut workload = chart_rules(
        "_rules-workload.tpl",
        "karpenter-capi.workloadRules",
        &["clusterrole.yaml", "workload-cluster-rbac.yaml"],
    );
    // Karpenter's kinds: in the workload rules by default, in the management cluster's
    // `-karpenter-objects` ClusterRole with karpenterObjects=management.
    let text = read(&path(&format!("{CHART}/templates/_rules-workload.tpl")));
    assert!(
        text.contains("{{- if not (include \"karpenter-capi.karpenterObjectsInManagement\" .) }}\n{{ include \"karpenter-capi.karpenterRules\" . }}\n{{- end }}"),
        "_rules-workload.tpl includes Karpenter's rules unless they are in the management cluster"
    );
    let karpenter = chart_rules(
        "_rules-karpenter.tpl",
        "karpenter-capi.karpenterRules",
        &["clusterrole-cluster-api.yaml"],
    );
    let mut problems = audit(KarpenterObjects, &karpenter, &[KARPENTER_OBJECTS]);
    workload.extend(karpenter);
    let lease: Vec<Rule> = chart_template("role-leader-election.yaml")
        .iter()
        .filter(|d| kind(d) == "Role")
        .flat_map(rules)
        .collect();
    // One list for the ClusterRole (joined) and the Role (management topology).
    let mut management = chart_rules(
        "_rules-cluster-api.tpl",
        "karpenter-capi.clusterAPIRules",
        &["clusterrole-cluster-api.yaml"],
    );
    // The template rules come from values (one line per entry, stripped above).
    let v = values();
    for t in v["rbac"]["clusterAPI"]["infrastructureTemplates"]
        .as_array()
        .expect("values.rbac.clusterAPI.infrastructureTemplates")
    {
        management.push(Rule {
            groups: vec![t["group"].as_str().unwrap().to_string()],
            resources: strings(&t["resources"]),
            verbs: vec!["get".into()],
            names: vec![],
        });
        // With generate.enabled, the same entry's *machinetemplates kinds once more.
        management.push(Rule {
            groups: vec![t["group"].as_str().unwrap().to_string()],
            resources: strings(&t["resources"])
                .into_iter()
                .filter(|r| r.ends_with("machinetemplates"))
                .collect(),
            verbs: GENERATE_TEMPLATE_VERBS.map(String::from).to_vec(),
            names: vec![],
        });
    }
    // Stripped of its template lines the helper lists every rule, the gated and switched ones
    // too (that each sits inside its `if` is checked by `chart_grants_gated_rules_only_with_the_gate`
    // and `chart_grants_generation_rules_only_when_enabled`).
    let gated: Vec<&str> = NEEDS.iter().filter_map(gate_of).collect();
    // Its kind is a template expression (Role or ClusterRole), stripped: the document with rules.
    let fleet: Vec<Rule> = chart_template("fleet-rbac.yaml")
        .iter()
        .filter(|d| d.get("rules").is_some())
        .flat_map(rules)
        .collect();
    problems.extend(audit(Workload, &workload, &gated));
    problems.extend(audit(LeaderNamespace, &lease, &[]));
    problems.extend(audit(
        Management,
        &management,
        &[GENERATE, KARPENTER_OBJECTS],
    ));
    problems.extend(audit(Fleet, &fleet, &[]));
    assert!(
        problems.is_empty(),
        "chart RBAC vs NEEDS:\n{}",
        problems.join("\n")
    );

    let tpl = read(&path(&format!("{CHART}/templates/_rules-cluster-api.tpl")));
    assert!(
        tpl.contains("- {apiGroups: [{{ .group | quote }}], resources: {{ toJson .resources }}, verbs: [get]}"),
        "infrastructure template rules are get only"
    );
    let text = read(&path(&format!(
        "{CHART}/templates/role-leader-election.yaml"
    )));
    assert!(text.contains("resourceNames: [{{ .Values.leaderElection.name | quote }}]"));

    // Both sources of truth list the same template kinds.
    let manifests: Vec<Rule> = manifest_docs()
        .iter()
        .filter(|(f, d)| f == "management-rbac.yaml" && kind(d) == "ClusterRole")
        .flat_map(|(_, d)| rules(d))
        .collect();
    assert_eq!(
        template_resources(&management),
        template_resources(&manifests)
    );
}

/// Each gated rule of the workload helper sits inside an `if` on its gate in
/// `controller.featureGates`, and the default values leave the gate off (upstream's chart grants
/// `pods` `patch` only with `PodDeletionCostManagement=true`).
fn chart_grants_gated_rules_only_with_the_gate() {
    let tpl = read(&path(&format!("{CHART}/templates/_rules-workload.tpl")));
    for n in NEEDS.iter().filter(|n| gate_of(n).is_some()) {
        let gate = gate_of(n).unwrap_or_default();
        let open =
            format!("{{{{- if contains \"{gate}=true\" .Values.controller.featureGates }}}}");
        let start = tpl
            .find(&open)
            .unwrap_or_else(|| panic!("no rule guarded by {gate} in _rules-workload.tpl"));
        let block = &tpl[start..];
        let block = &block[..block.find("{{- end }}").expect("the guard ends")];
        let rule = format!(
            "- apiGroups: [{:?}]\n  resources: [{}]\n  verbs: [{}]",
            n.group,
            n.resource,
            n.verbs.join(", ")
        );
        assert!(
            block.contains(&rule),
            "{rule} inside the {gate} guard:\n{block}"
        );
        let outside = tpl.replace(block, "");
        assert!(!outside.contains(&rule), "{rule} also outside its guard");
        let defaults = values()["controller"]["featureGates"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            !gates_on(&defaults).iter().any(|g| g == gate),
            "{gate} is off by default"
        );
    }
}

/// The blocks of `tpl` that `open` (an `if` action) starts, each up to its `end` (the
/// generate.enabled template block nests a `range` and an `if`, whose ends are counted).
fn guarded_blocks<'a>(tpl: &'a str, open: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = tpl;
    while let Some(start) = rest.find(open) {
        let block = &rest[start..];
        let mut depth = 0;
        let mut end = block.len();
        let mut at = 0;
        while let Some(i) = block[at..].find("{{") {
            let action = actions(&block[at + i..])
                .into_iter()
                .next()
                .unwrap_or_default();
            let word = action.split_whitespace().next().unwrap_or_default();
            match word {
                "if" | "range" | "with" => depth += 1,
                "end" => depth -= 1,
                _ => {}
            }
            at += i + 2;
            if depth == 0 {
                end = at;
                break;
            }
        }
        out.push(&block[..end]);
        rest = &block[end..];
    }
    out
}

/// Generated node groups' rules sit inside `if .Values.generate.enabled` (one block for the
/// MachineDeployment rule, one for the templates', which keeps the `*machinetemplates` kinds of
/// `rbac.clusterAPI.infrastructureTemplates` only), nowhere else, and the value is off by default.
/// The only other create, on Events, sits inside the karpenterObjects=management guard.
fn chart_grants_generation_rules_only_when_enabled() {
    let tpl = read(&path(&format!("{CHART}/templates/_rules-cluster-api.tpl")));
    let blocks = guarded_blocks(&tpl, "{{- if .Values.generate.enabled }}");
    assert_eq!(blocks.len(), 2, "two generate.enabled blocks:\n{blocks:#?}");
    let md_rule = "- apiGroups: [cluster.x-k8s.io]\n  resources: [machinedeployments]\n  verbs: [create, delete]";
    let template_rule = format!(
        "- {{apiGroups: [{{{{ .group | quote }}}}], resources: {{{{ toJson $templates }}}}, verbs: [{}]}}",
        GENERATE_TEMPLATE_VERBS.join(", ")
    );
    assert!(
        blocks[0].contains(md_rule),
        "{md_rule} inside the guard:\n{}",
        blocks[0]
    );
    assert!(
        blocks[1].contains(&template_rule),
        "{template_rule} inside the guard:\n{}",
        blocks[1]
    );
    assert!(
        blocks[1].contains("hasSuffix \"machinetemplates\""),
        "only the template kinds get create and delete:\n{}",
        blocks[1]
    );
    // The Events of Karpenter's objects are created only where they live.
    let events = guarded_blocks(
        &tpl,
        "{{- if include \"karpenter-capi.karpenterObjectsInManagement\" . }}",
    );
    assert_eq!(events.len(), 1, "one karpenterObjects block:\n{events:#?}");
    assert!(
        events[0].contains("resources: [events]\n  verbs: [create, patch]"),
        "the Events rule inside the karpenterObjects guard:\n{}",
        events[0]
    );
    let mut outside = tpl.clone();
    for b in blocks.iter().chain(&events) {
        outside = outside.replace(b, "");
    }
    // Outside the guards, nothing is created, and only Machines are deleted.
    assert!(
        !outside.contains("create"),
        "create outside generate.enabled:\n{outside}"
    );
    let deleting: Vec<&str> = outside
        .lines()
        .filter(|l| l.contains("verbs:") && l.contains("delete"))
        .collect();
    assert_eq!(
        deleting,
        ["  verbs: [get, list, watch, patch, delete]"],
        "the Machines rule only"
    );
    assert_eq!(
        values()["generate"]["enabled"],
        Value::Bool(false),
        "generate.enabled is off by default"
    );
}

/// The plain manifests grant generated node groups' rules only in their opt-in file (outside
/// what `kubectl apply -f deploy/manifests/` applies): a ClusterRole bound to the controller's
/// account that, with management-rbac.yaml, grants exactly the switched rows, for the same
/// template kinds.
fn manifests_grant_generation_only_in_the_opt_in_file() {
    let p = path(GENERATE_MANIFEST);
    let docs: Vec<(String, Value)> = yaml_docs(&read(&p), GENERATE_MANIFEST)
        .into_iter()
        .map(|d| ("generate-rbac.yaml".to_string(), d))
        .collect();
    let roles = bound_roles(&docs, "ClusterRole");
    assert_eq!(roles.len(), 1, "{GENERATE_MANIFEST}: one ClusterRole");
    let extra = rules(roles[0].1);
    let mut management: Vec<Rule> = manifest_docs()
        .iter()
        .filter(|(f, d)| f == "management-rbac.yaml" && kind(d) == "ClusterRole")
        .flat_map(|(_, d)| rules(d))
        .collect();
    let templates = template_resources(&management)
        .into_iter()
        .filter(|r| r.ends_with("machinetemplates"))
        .collect::<BTreeSet<_>>();
    assert_eq!(
        template_resources(&extra),
        templates,
        "{GENERATE_MANIFEST} lists management-rbac.yaml's template kinds"
    );
    // The opt-in file alone grants nothing but the switched rows.
    let switched: Vec<&Need> = NEEDS.iter().filter(|n| switch_of(n).is_some()).collect();
    for r in &extra {
        for v in &r.verbs {
            assert!(
                switched
                    .iter()
                    .any(|n| r.groups.iter().any(|g| g == n.group)
                        && r.resources
                            .iter()
                            .all(|res| resource_matches(n.resource, res))
                        && n.verbs.contains(&v.as_str())),
                "{GENERATE_MANIFEST}: {r:?} is not a generate.enabled row"
            );
        }
    }
    management.extend(extra);
    let problems = audit(Management, &management, &[GENERATE]);
    assert!(
        problems.is_empty(),
        "with {GENERATE_MANIFEST}:\n{}",
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Deployment
// ---------------------------------------------------------------------------------------------

fn env_twins() -> BTreeMap<String, clap::Arg> {
    let cmd = Cli::command();
    let run = cmd.find_subcommand("run").expect("run subcommand");
    run.get_arguments()
        .filter_map(|a| {
            a.get_env()
                .map(|e| (e.to_string_lossy().to_string(), a.clone()))
        })
        .collect()
}

fn container(dep: &Value) -> &Value {
    let cs = dep["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(cs.len(), 1, "one container");
    &cs[0]
}

fn env_names(c: &Value) -> Vec<String> {
    c["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| e["name"].as_str().expect("env name").to_string())
        .collect()
}

/// The hardening, probes, downward API and env names, common to the manifests' Deployment and
/// the chart's (stripped) template.
fn check_deployment(dep: &Value, origin: &str) {
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{origin}");
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
        "{origin}"
    );
    assert!(
        pod.get("hostNetwork").is_none() && pod.get("hostPID").is_none(),
        "{origin}"
    );

    let c = container(dep);
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true, "{origin}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{origin}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{origin}");
    assert_eq!(
        strings(&sc["capabilities"]["drop"]),
        vec!["ALL"],
        "{origin}"
    );
    assert!(sc["capabilities"].get("add").is_none(), "{origin}");
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{origin}");
    let args = strings(&c["args"]);
    assert_eq!(args.first().map(String::as_str), Some("run"), "{origin}");
    assert!(
        args.len() == 1 || args[1..].first().map(String::as_str) == Some("--kubeconfig"),
        "{origin}: run takes only --kubeconfig as an argument, the rest by env: {args:?}"
    );

    let ports: BTreeMap<String, &Value> = c["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| (p["name"].as_str().unwrap().to_string(), &p["containerPort"]))
        .collect();
    for (probe, path_) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path_, "{origin}: {probe}");
        assert_eq!(
            get["port"], "http-health",
            "{origin}: {probe} uses the health port"
        );
    }
    assert!(
        ports.contains_key("http-health") && ports.contains_key("http-metrics"),
        "{origin}: {ports:?}"
    );

    let env = &c["env"].as_array().expect("env");
    for (var, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let e = env
            .iter()
            .find(|e| e["name"] == var)
            .unwrap_or_else(|| panic!("{origin}: {var}"));
        assert_eq!(
            e["valueFrom"]["fieldRef"]["fieldPath"], field,
            "{origin}: {var}"
        );
    }
    let names = env_names(c);
    let twins = env_twins();
    for n in &names {
        assert!(
            n == "POD_NAME" || n == "POD_NAMESPACE" || twins.contains_key(n),
            "{origin}: {n} is not the env twin of any `run` flag"
        );
    }
    for required in [
        "CREATE_TIMEOUT",
        "REGISTRATION_TIMEOUT",
        "LOG_LEVEL",
        "LOG_FORMAT",
        "KUBE_CLIENT_QPS",
        "KUBE_CLIENT_BURST",
        "METRICS_PORT",
        "HEALTH_PROBE_PORT",
    ] {
        assert!(
            names.iter().any(|n| n == required),
            "{origin}: sets no {required}"
        );
    }
}

fn manifests_deployment_is_hardened_probed_and_spread() {
    let docs = manifest_docs();
    let dep = one(&docs, "Deployment");
    check_deployment(dep, "30-deployment.yaml");
    assert_eq!(dep["spec"]["replicas"], 2);
    let c = container(dep);
    let port = |n: &str| {
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == n)
            .map(|p| p["containerPort"].clone())
    };
    assert_eq!(port("http-metrics"), Some(8080.into()));
    assert_eq!(port("http-health"), Some(8081.into()));
    for k in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(c["resources"][k][r].is_string(), "resources.{k}.{r}");
        }
    }
    let pod = &dep["spec"]["template"]["spec"];
    let spread = pod["topologySpreadConstraints"]
        .as_array()
        .expect("topologySpreadConstraints");
    let labels = &dep["spec"]["template"]["metadata"]["labels"];
    assert!(
        spread
            .iter()
            .any(|s| s["topologyKey"] == "kubernetes.io/hostname")
    );
    for s in spread {
        assert_eq!(
            &s["labelSelector"]["matchLabels"], labels,
            "spread selects the controller's pods"
        );
    }
    assert_eq!(pod["serviceAccountName"], SERVICE_ACCOUNT);
    assert_eq!(dep["metadata"]["namespace"], NAMESPACE);
}

fn chart_deployment_is_hardened_probed_and_spread() {
    let docs = chart_template("deployment.yaml");
    let dep = docs
        .iter()
        .find(|d| kind(d) == "Deployment")
        .expect("Deployment");
    check_deployment(dep, "templates/deployment.yaml");
    let v = values();
    assert_eq!(v["replicaCount"], 2);
    assert_eq!(v["leaderElection"]["enabled"], true);
    assert_eq!(v["metrics"]["port"], 8080);
    assert_eq!(v["healthProbe"]["port"], 8081);
    for k in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(v["resources"][k][r].is_string(), "values.resources.{k}.{r}");
        }
    }
    let spread = v["topologySpreadConstraints"]
        .as_array()
        .expect("topologySpreadConstraints");
    assert!(
        spread
            .iter()
            .any(|s| s["topologyKey"] == "kubernetes.io/hostname")
    );
    let text = read(&path(&format!("{CHART}/templates/deployment.yaml")));
    assert!(text.contains("containerPort: {{ .Values.metrics.port }}"));
    assert!(text.contains("containerPort: {{ .Values.healthProbe.port }}"));
    assert!(
        text.contains(r#"{{- include "karpenter-capi.selectorLabels" $ | nindent 14 }}"#),
        "spread selects the release's pods"
    );
    // A separate management cluster's kubeconfig comes from a Secret, mounted read-only, and
    // never through subPath, which would freeze the file at its first content.
    assert!(text.contains("secretName: {{ .Values.clusterAPI.kubeconfigSecret.name }}"));
    assert!(text.contains("readOnly: true"));
    assert!(
        !text.lines().any(|l| l.trim_start().starts_with("subPath:")),
        "no subPath mount"
    );
}

/// Env var -> value the Deployment gives it, for plain `value:` entries.
fn literal_env(c: &Value) -> BTreeMap<String, String> {
    c["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Env var -> values.yaml path, from `value: {{ .Values.x.y | quote }}` lines of the template.
fn chart_env_paths(template: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in template.lines().map(str::trim) {
        if let Some(n) = line.strip_prefix("- name: ") {
            current = Some(n.to_string());
        } else if let (Some(n), Some(rest)) = (&current, line.strip_prefix("value: {{ .Values.")) {
            let path: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '.' || *c == '_')
                .collect();
            out.insert(n.clone(), path);
        }
    }
    out
}

fn lookup<'a>(v: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(v, |v, k| v.get(k))
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Parses `env` as the real `run` command line would (flag by flag, through each env var's
/// flag), so a typo in a duration or an enum fails here rather than in a crash-looping pod.
fn assert_parses_as_flags(env: &BTreeMap<String, String>, origin: &str) {
    let twins = env_twins();
    let mut argv = vec!["karpenter-capi".to_string(), "run".to_string()];
    for (var, value) in env {
        let Some(arg) = twins.get(var) else { continue };
        let long = format!("--{}", arg.get_long().expect("long flag"));
        if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
            assert!(
                value == "true" || value == "false",
                "{origin}: {var}={value:?} is not a boolean"
            );
            if value == "true" {
                argv.push(long);
            }
        } else {
            argv.push(long);
            argv.push(value.clone());
        }
    }
    if let Err(e) = <Cli as clap::Parser>::try_parse_from(&argv) {
        panic!("{origin}: {argv:?} is rejected: {e}");
    }
}

/// No two settings of the container conflict for clap: an environment variable counts as given
/// even when it says `false`, so a flag that conflicts with a boolean's twin fails at start-up
/// although the translation to flags above drops the `false` (the management topology's
/// `--kubeconfig` beside `FLEET=false` did).
fn assert_no_conflicting_settings(c: &Value, origin: &str) {
    let cmd = Cli::command();
    let run = cmd.find_subcommand("run").expect("run subcommand");
    let twins = env_twins();
    let mut given: Vec<&clap::Arg> = literal_env(c)
        .keys()
        .filter_map(|var| twins.get(var))
        .collect();
    for a in strings(&c["args"]) {
        if let Some(long) = a.strip_prefix("--")
            && let Some(arg) = run.get_arguments().find(|x| x.get_long() == Some(long))
        {
            given.push(arg);
        }
    }
    for a in &given {
        for other in run.get_arg_conflicts_with(a) {
            assert!(
                !given.iter().any(|g| g.get_id() == other.get_id()),
                "{origin}: {} and {} are both given and conflict",
                a.get_id(),
                other.get_id()
            );
        }
    }
}

fn deployment_env_values_are_valid_run_flags_and_agree() {
    let docs = manifest_docs();
    let manifests = literal_env(container(one(&docs, "Deployment")));
    assert_parses_as_flags(&manifests, "30-deployment.yaml");

    let template = read(&path(&format!("{CHART}/templates/deployment.yaml")));
    let v = values();
    let mut chart = BTreeMap::new();
    for (var, p) in chart_env_paths(&template) {
        let value = lookup(&v, &p).unwrap_or_else(|| panic!("{var}: values.{p} is missing"));
        chart.insert(var, scalar(value));
    }
    // DISABLE_LEADER_ELECTION is `not .Values.leaderElection.enabled`.
    assert!(template.contains("value: {{ not .Values.leaderElection.enabled | quote }}"));
    chart.insert("DISABLE_LEADER_ELECTION".into(), "false".into());
    assert_parses_as_flags(&chart, "chart defaults");

    // The two ways to install behave the same out of the box.
    for (var, value) in &manifests {
        if let Some(c) = chart.get(var) {
            assert_eq!(
                c, value,
                "{var}: chart default differs from the plain manifest"
            );
        }
    }
}

fn chart_sets_every_run_env_twin() {
    let template = read(&path(&format!("{CHART}/templates/deployment.yaml")));
    // The Lease namespace is the release namespace (POD_NAMESPACE): the Role lives there.
    let exempt = ["LEADER_ELECTION_NAMESPACE"];
    for var in env_twins().keys() {
        if exempt.contains(&var.as_str()) {
            continue;
        }
        assert!(
            template.contains(&format!("- name: {var}\n")),
            "templates/deployment.yaml does not set {var}; add a value for the new flag"
        );
    }
}

fn service_and_pdb_select_the_controller_pods() {
    let docs = manifest_docs();
    let dep = one(&docs, "Deployment");
    let labels = &dep["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&dep["spec"]["selector"]["matchLabels"], labels);

    let svc = one(&docs, "Service");
    assert_eq!(&svc["spec"]["selector"], labels);
    let ports = svc["spec"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1, "only metrics is exposed");
    assert_eq!(ports[0]["port"], 8080);
    assert_eq!(ports[0]["targetPort"], "http-metrics");

    let pdb = one(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], labels);
    assert_eq!(values()["podDisruptionBudget"]["maxUnavailable"], 1);

    for (file, d) in &docs {
        let namespaced = !matches!(kind(d), "Namespace" | "ClusterRole" | "ClusterRoleBinding");
        if namespaced {
            assert_eq!(
                d["metadata"]["namespace"],
                NAMESPACE,
                "{file}: {} {}",
                kind(d),
                name(d)
            );
        }
    }
    let sa = docs.iter().filter(|(_, d)| kind(d) == "ServiceAccount");
    assert!(sa.clone().count() >= 1 && sa.into_iter().all(|(_, d)| name(d) == SERVICE_ACCOUNT));
}

fn service_monitor_is_optional_and_off_by_default() {
    assert_eq!(values()["serviceMonitor"]["enabled"], false);
    let text = read(&path(&format!("{CHART}/templates/servicemonitor.yaml")));
    assert!(text.starts_with("{{- if .Values.serviceMonitor.enabled }}"));
    assert!(text.trim_end().ends_with("{{- end }}"));
    let docs = chart_template("servicemonitor.yaml");
    let sm = docs
        .iter()
        .find(|d| kind(d) == "ServiceMonitor")
        .expect("ServiceMonitor");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "http-metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
}

const DASHBOARD: &str = "deploy/grafana/karpenter-capi.json";

fn grafana_dashboard_is_optional_off_by_default_and_one_file() {
    assert_eq!(values()["grafanaDashboard"]["enabled"], false);
    assert_eq!(
        values()["grafanaDashboard"]["labels"]["grafana_dashboard"],
        "1"
    );
    let text = read(&path(&format!("{CHART}/templates/grafana-dashboard.yaml")));
    assert!(text.starts_with("{{- if .Values.grafanaDashboard.enabled }}"));
    assert!(text.trim_end().ends_with("{{- end }}"));
    // Helm reads only files inside the chart: the chart's copy is a link to deploy/grafana, so
    // there is one dashboard to edit.
    let in_chart = path(&format!("{CHART}/dashboards/karpenter-capi.json"));
    let link = std::fs::symlink_metadata(&in_chart).expect("the chart's dashboard");
    assert!(
        link.file_type().is_symlink(),
        "{} is a link",
        in_chart.display()
    );
    assert_eq!(
        std::fs::canonicalize(&in_chart).expect("the link resolves"),
        std::fs::canonicalize(path(DASHBOARD)).expect("deploy/grafana")
    );
}

// ---------------------------------------------------------------------------------------------
// Files and templates
// ---------------------------------------------------------------------------------------------

fn every_yaml_file_parses() {
    let mut dirs = vec![
        MANIFESTS.to_string(),
        format!("{MANIFESTS}/optional"),
        format!("{CHART}/crds"),
        "deploy/crds".into(),
    ];
    dirs.push(CHART.to_string());
    let mut count = 0;
    for dir in &dirs {
        for p in files(dir, &["yaml", "yml"]) {
            let docs = yaml_docs(&read(&p), &p.display().to_string());
            assert!(!docs.is_empty(), "{}: no documents", p.display());
            count += docs.len();
        }
    }
    for p in files(&format!("{CHART}/templates"), &["yaml"]) {
        stripped_docs(&read(&p), &format!("{} (stripped)", p.display()));
    }
    assert!(count >= 15, "only {count} documents found");
}

fn chart_crds_are_copies_of_deploy_crds() {
    let names = |dir: &str| -> Vec<String> {
        files(dir, &["yaml"])
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
            .collect()
    };
    let generated = names("deploy/crds");
    assert_eq!(
        generated.len(),
        6,
        "NodePool, NodeClaim, ClusterAPINodeClass, NodeOverlay, CapacityBuffer, CapacityQuota"
    );
    assert_eq!(names(&format!("{CHART}/crds")), generated);
    for n in &generated {
        assert!(
            read(&path(&format!("deploy/crds/{n}"))) == read(&path(&format!("{CHART}/crds/{n}"))),
            "{CHART}/crds/{n} differs from deploy/crds/{n}: cp deploy/crds/*.yaml {CHART}/crds/"
        );
    }
}

/// The text of each `{{ ... }}` action, without its trim markers.
pub(crate) fn actions(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let end = after.find("}}").expect("unclosed {{");
        out.push(after[..end].trim_matches('-').trim());
        rest = &after[end + 2..];
    }
    out
}

fn helm_templates_use_existing_values_and_helpers() {
    let v = values();
    let dir = format!("{CHART}/templates");
    let all: Vec<(PathBuf, String)> = files(&dir, &["yaml", "tpl", "txt"])
        .into_iter()
        .map(|p| {
            let t = read(&p);
            (p, t)
        })
        .collect();
    let defined: BTreeSet<String> = all
        .iter()
        .flat_map(|(_, t)| actions(t))
        .filter_map(|a| a.strip_prefix("define \""))
        .map(|a| a.trim_end_matches('"').to_string())
        .collect();
    let mut problems = Vec::new();
    let mut refs = 0;
    for (p, text) in &all {
        let file = p.file_name().unwrap().to_string_lossy();
        let mut depth = 0i32;
        for a in actions(text) {
            if a.starts_with("/*") {
                continue;
            }
            let word = a.split_whitespace().next().unwrap_or("");
            match word {
                "if" | "with" | "range" | "define" | "block" => depth += 1,
                "end" => depth -= 1,
                _ => {}
            }
            if depth < 0 {
                problems.push(format!("{file}: `end` without a block"));
            }
            let mut rest = a;
            while let Some(i) = rest.find(".Values.") {
                let path: String = rest[i + 8..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '.' || *c == '_')
                    .collect();
                refs += 1;
                if lookup(&v, path.trim_end_matches('.')).is_none() {
                    problems.push(format!("{file}: .Values.{path} is not in values.yaml"));
                }
                rest = &rest[i + 8..];
            }
            if let Some(i) = a.find("include \"") {
                let name: String = a[i + 9..].chars().take_while(|c| *c != '"').collect();
                if !defined.contains(&name) {
                    problems.push(format!("{file}: include {name:?} is not defined"));
                }
            }
        }
        if depth != 0 {
            problems.push(format!("{file}: {depth} block(s) without `end`"));
        }
    }
    assert!(refs > 40, "only {refs} .Values references found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    let chart = yaml_docs(&read(&path(&format!("{CHART}/Chart.yaml"))), "Chart.yaml").remove(0);
    assert_eq!(chart["apiVersion"], "v2");
    assert_eq!(
        chart["appVersion"],
        env!("CARGO_PKG_VERSION"),
        "appVersion follows Cargo.toml"
    );
}

// ---------------------------------------------------------------------------------------------
// Real tools: helm v4 and kubectl v1.35 (installed by `.ci/install-tools`)
// ---------------------------------------------------------------------------------------------

pub(crate) fn run_tool(bin: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {} {args:?}: {e}", bin.display()))
}

pub(crate) fn assert_ok(out: &std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The Cluster of the management topology's value sets.
const CLUSTER: &str = "c1";

/// The chart's value sets users install with: the workload topology (joined, a separate
/// management cluster by kubeconfig Secret or URL), the management topology (Cluster API's
/// kubeconfig Secret, or a least-privilege one with its workload RBAC rendered), the fleet
/// topology, Karpenter's objects in the management cluster in each topology, and the optional
/// extras switched on.
const VALUE_SETS: &[(&str, &[&str])] = &[
    ("default values", &[]),
    (
        "management topology",
        &[
            "--set",
            "topology=management",
            "--set",
            "clusterAPI.clusterName=c1",
        ],
    ),
    (
        "management topology, least-privilege workload kubeconfig, workload RBAC rendered",
        &[
            "--set",
            "topology=management",
            "--set",
            "clusterAPI.clusterName=c1",
            "--set",
            "workloadCluster.kubeconfigSecret.name=c1-karpenter-capi",
            "--set",
            "workloadCluster.rbac.render=true",
        ],
    ),
    (
        "separate management cluster",
        &["--set", "clusterAPI.kubeconfigSecret.name=mgmt"],
    ),
    (
        "separate management cluster by URL, ServiceMonitor on",
        &[
            "--set",
            "clusterAPI.url=https://management.example:6443",
            "--set",
            "serviceMonitor.enabled=true",
        ],
    ),
    (
        "pod deletion cost management on",
        &[
            "--set-string",
            "controller.featureGates=PodDeletionCostManagement=true",
        ],
    ),
    (
        "generated node groups on, management topology",
        &[
            "--set",
            "topology=management",
            "--set",
            "clusterAPI.clusterName=c1",
            "--set",
            "generate.enabled=true",
        ],
    ),
    (
        "fleet topology",
        &[
            "--set",
            "topology=fleet",
            "--set",
            "fleet.selector=karpenter=enabled",
        ],
    ),
    (
        "fleet topology in one namespace, least-privilege kubeconfig Secrets, workload RBAC rendered",
        &[
            "--set",
            "topology=fleet",
            "--set",
            "clusterAPI.namespace=clusters",
            // --set would read the braces as a list.
            "--set-json",
            r#"fleet.kubeconfigSecret.name="{cluster}-karpenter-capi""#,
            "--set",
            "fleet.kubeconfigSecret.key=kubeconfig",
            "--set",
            "workloadCluster.rbac.render=true",
        ],
    ),
    (
        "Karpenter's objects in the management cluster, management topology, workload RBAC rendered",
        &[
            "--set",
            "topology=management",
            "--set",
            "clusterAPI.clusterName=c1",
            "--set",
            KARPENTER_OBJECTS,
            "--set",
            "workloadCluster.kubeconfigSecret.name=c1-karpenter-capi",
            "--set",
            "workloadCluster.rbac.render=true",
        ],
    ),
    (
        "Karpenter's objects in the management cluster, fleet topology, workload RBAC rendered",
        &[
            "--set",
            "topology=fleet",
            "--set",
            KARPENTER_OBJECTS,
            "--set",
            "workloadCluster.rbac.render=true",
        ],
    ),
    (
        "Karpenter's objects in the management cluster, joined workload topology",
        &[
            "--set",
            KARPENTER_OBJECTS,
            "--set",
            "clusterAPI.clusterName=c1",
            "--set",
            "clusterAPI.namespace=clusters",
        ],
    ),
    (
        "Karpenter's objects in the management cluster, separate management cluster",
        &[
            "--set",
            KARPENTER_OBJECTS,
            "--set",
            "clusterAPI.kubeconfigSecret.name=mgmt",
            "--set",
            "clusterAPI.clusterName=c1",
            "--set",
            "clusterAPI.namespace=clusters",
        ],
    ),
    (
        "Grafana dashboard on",
        &[
            "--set",
            "grafanaDashboard.enabled=true",
            "--set-string",
            "grafanaDashboard.annotations.grafana_folder=Autoscaling",
        ],
    ),
];

pub(crate) fn helm_template(helm: &Path, extra: &[&str]) -> String {
    let chart = path(CHART);
    let mut args = vec!["template", "k", "--namespace", NAMESPACE];
    let chart_arg = chart.to_string_lossy().into_owned();
    args.push(&chart_arg);
    args.extend_from_slice(extra);
    assert_ok(&run_tool(helm, &args), &format!("helm template {extra:?}"))
}

fn helm_lints_and_renders_the_chart() {
    let helm = tool(Asset::Helm);
    let chart = path(CHART).to_string_lossy().into_owned();
    for (what, extra) in VALUE_SETS {
        let mut args = vec!["lint", "--strict", chart.as_str()];
        args.extend_from_slice(extra);
        let out = assert_ok(&run_tool(&helm, &args), &format!("helm lint ({what})"));
        assert!(
            out.contains("0 chart(s) failed"),
            "helm lint ({what}): {out}"
        );
    }
    for (what, extra) in VALUE_SETS {
        let rendered = helm_template(&helm, extra);
        let docs = yaml_docs(&rendered, &format!("helm template ({what})"));
        for doc in &docs {
            assert_typed_round_trip(doc, &format!("helm template ({what})"));
        }
        let dep = docs
            .iter()
            .find(|d| kind(d) == "Deployment")
            .expect("Deployment");
        check_deployment(dep, &format!("helm template ({what})"));
        check_karpenter_objects(&docs, what, extra);
        let problems = rendered_rbac_problems(&docs, extra);
        assert!(
            problems.is_empty(),
            "helm template ({what}): RBAC vs NEEDS:\n{}",
            problems.join("\n")
        );
        let management = extra.contains(&"topology=management");
        let mut env = literal_env(container(dep));
        // A file flag's value is checked for existence when parsed: the mount exists in the pod only.
        let mut flags = env.clone();
        flags.remove("CLUSTER_API_KUBECONFIG");
        assert_parses_as_flags(&flags, &format!("helm template ({what})"));
        assert_no_conflicting_settings(container(dep), &format!("helm template ({what})"));
        env.remove("CLUSTER_API_KUBECONFIG");
        if management {
            check_management_topology(&docs, what, extra);
        } else if extra.contains(&"topology=fleet") {
            check_fleet_topology(&docs, what, extra);
        } else {
            assert!(!env.contains_key("CLUSTER_API_IN_CLUSTER"), "{what}");
            let capi_role = docs
                .iter()
                .any(|d| kind(d) == "ClusterRole" && name(d).ends_with("-cluster-api"));
            let separate = extra.iter().any(|a| {
                a.starts_with("clusterAPI.kubeconfigSecret.name=")
                    || a.starts_with("clusterAPI.url=")
            });
            assert_eq!(
                capi_role, !separate,
                "{what}: Cluster API rules only in the joined topology"
            );
        }
        let monitor = docs.iter().any(|d| kind(d) == "ServiceMonitor");
        assert_eq!(
            monitor,
            extra.contains(&"serviceMonitor.enabled=true"),
            "{what}: ServiceMonitor only when enabled"
        );
        let dashboard = docs
            .iter()
            .find(|d| kind(d) == "ConfigMap" && name(d).ends_with("-dashboard"));
        assert_eq!(
            dashboard.is_some(),
            extra.contains(&"grafanaDashboard.enabled=true"),
            "{what}: the dashboard ConfigMap only when enabled"
        );
        if let Some(cm) = dashboard {
            check_dashboard_config_map(cm, what);
        }
    }
}

/// Rendered RBAC against NEEDS, each role by its part: the leader-election Role, the Cluster API
/// role (ClusterRole or Role), and the workload ClusterRole (installed, or rendered for the
/// workload cluster). A part a value set leaves out is not audited; which parts each topology
/// has is checked by the callers.
fn rendered_rbac_problems(docs: &[Value], extra: &[&str]) -> Vec<String> {
    let feature_gates = docs
        .iter()
        .find(|d| kind(d) == "Deployment")
        .and_then(|d| literal_env(container(d)).get("FEATURE_GATES").cloned())
        .unwrap_or_default();
    let on = gates_on(&feature_gates);
    let mut gates: Vec<&str> = on.iter().map(String::as_str).collect();
    if extra.contains(&"generate.enabled=true") {
        gates.push(GENERATE);
    }
    if extra.contains(&KARPENTER_OBJECTS) {
        gates.push(KARPENTER_OBJECTS);
    }
    let (mut workload, mut lease, mut capi, mut fleet, mut karpenter) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for d in docs
        .iter()
        .filter(|d| matches!(kind(d), "Role" | "ClusterRole"))
    {
        let part = if name(d).ends_with("-leader-election") {
            &mut lease
        } else if name(d).ends_with("-cluster-api") {
            &mut capi
        } else if name(d).ends_with("-fleet") {
            &mut fleet
        } else if name(d).ends_with("-karpenter-objects") {
            &mut karpenter
        } else {
            &mut workload
        };
        part.extend(rules(d));
    }
    let mut problems = audit(LeaderNamespace, &lease, &gates);
    let parts = [
        (Workload, &workload),
        (Management, &capi),
        (Fleet, &fleet),
        (KarpenterObjects, &karpenter),
    ];
    for (scope, part) in parts {
        if !part.is_empty() {
            problems.extend(audit(scope, part, &gates));
        }
    }
    problems
}

/// Where Karpenter's objects live as rendered: `KARPENTER_OBJECTS` says the layout, and their
/// management-cluster ClusterRole, bound to the controller's account, is rendered exactly when
/// they live there and the chart grants the Cluster API rules (a separate management cluster
/// is granted by hand, docs/deploy.md).
fn check_karpenter_objects(docs: &[Value], what: &str, extra: &[&str]) {
    let management = extra.contains(&KARPENTER_OBJECTS);
    let dep = find(docs, "Deployment", "karpenter-capi", what);
    let layout = if management { "management" } else { "workload" };
    let env = literal_env(container(dep));
    assert_eq!(
        env.get("KARPENTER_OBJECTS").map(String::as_str),
        Some(layout),
        "{what}"
    );
    let capi = docs.iter().any(|d| name(d).ends_with("-cluster-api"));
    let role = docs
        .iter()
        .find(|d| kind(d) == "ClusterRole" && name(d).ends_with("-karpenter-objects"));
    assert_eq!(
        role.is_some(),
        management && capi,
        "{what}: Karpenter's ClusterRole where the Cluster API rules are, in that layout only"
    );
    if let Some(role) = role {
        let b = find(docs, "ClusterRoleBinding", "-karpenter-objects", what);
        assert_eq!(b["roleRef"]["name"], name(role), "{what}");
        assert_eq!(b["subjects"][0]["kind"], "ServiceAccount", "{what}");
        assert_eq!(b["subjects"][0]["namespace"], NAMESPACE, "{what}");
    }
}

fn find<'a>(docs: &'a [Value], k: &str, suffix: &str, what: &str) -> &'a Value {
    docs.iter()
        .find(|d| kind(d) == k && name(d).ends_with(suffix))
        .unwrap_or_else(|| panic!("{what}: no {k} named *{suffix}"))
}

/// The management topology as rendered: Cluster API through a namespaced Role of the release's
/// own ServiceAccount (no ClusterRole that can touch Machines), the Lease Role beside it, the
/// workload kubeconfig Secret mounted read-only without subPath and passed as --kubeconfig, and
/// the controller confined to the release namespace and the Cluster.
fn check_management_topology(docs: &[Value], what: &str, extra: &[&str]) {
    let account = "k-karpenter-capi";
    for d in docs.iter().filter(|d| kind(d) == "ClusterRole") {
        for r in rules(d) {
            assert!(
                !r.groups.iter().any(|g| g == "cluster.x-k8s.io"),
                "{what}: ClusterRole {} grants {:?} on Cluster API objects cluster-wide",
                name(d),
                r.verbs
            );
        }
    }
    let workload_rbac = extra.contains(&"workloadCluster.rbac.render=true");
    // Karpenter's own ClusterRole, in their management layout: check_karpenter_objects.
    let cluster_wide: Vec<&str> = docs
        .iter()
        .filter(|d| matches!(kind(d), "ClusterRole" | "ClusterRoleBinding"))
        .map(name)
        .filter(|n| !n.ends_with("-karpenter-objects"))
        .collect();
    if workload_rbac {
        assert_eq!(
            cluster_wide, ["karpenter-capi"; 2],
            "{what}: the workload ClusterRole"
        );
        let binding = find(docs, "ClusterRoleBinding", "karpenter-capi", what);
        assert_eq!(binding["subjects"][0]["kind"], "User", "{what}");
    } else {
        assert!(cluster_wide.is_empty(), "{what}: {cluster_wide:?}");
    }
    for (role, binding) in [
        ("-cluster-api", "-cluster-api"),
        ("-leader-election", "-leader-election"),
    ] {
        let r = find(docs, "Role", role, what);
        assert_eq!(r["metadata"]["namespace"], NAMESPACE, "{what}: {}", name(r));
        let b = find(docs, "RoleBinding", binding, what);
        assert_eq!(b["metadata"]["namespace"], NAMESPACE, "{what}");
        assert_eq!(b["roleRef"]["kind"], "Role", "{what}");
        assert_eq!(b["roleRef"]["name"], name(r), "{what}");
        assert_eq!(b["subjects"][0]["kind"], "ServiceAccount", "{what}");
        assert_eq!(b["subjects"][0]["name"], account, "{what}");
        assert_eq!(b["subjects"][0]["namespace"], NAMESPACE, "{what}");
    }
    let lease = find(docs, "Role", "-leader-election", what);
    assert!(
        rules(lease).iter().any(|r| r.names == [LEASE]),
        "{what}: the Lease Role names the Lease"
    );
    let sa = find(docs, "ServiceAccount", account, what);
    assert_eq!(sa["metadata"]["namespace"], NAMESPACE, "{what}");

    let dep = find(docs, "Deployment", "karpenter-capi", what);
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], account, "{what}");
    assert_ne!(
        pod["automountServiceAccountToken"], false,
        "{what}: the in-cluster client needs the projected token"
    );
    let c = container(dep);
    let file = "/etc/karpenter-capi/workload/kubeconfig";
    assert_eq!(strings(&c["args"]), ["run", "--kubeconfig", file], "{what}");
    let mounts = c["volumeMounts"].as_array().expect("volumeMounts");
    assert_eq!(mounts.len(), 1, "{what}: {mounts:?}");
    let m = &mounts[0];
    assert_eq!(m["mountPath"], "/etc/karpenter-capi/workload", "{what}");
    assert_eq!(m["readOnly"], true, "{what}");
    assert!(
        m.get("subPath").is_none(),
        "{what}: a subPath mount never sees the Secret's rotation"
    );
    let volume = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == m["name"]))
        .unwrap_or_else(|| panic!("{what}: no volume {}", m["name"]));
    let secret = if workload_rbac {
        "c1-karpenter-capi".to_string()
    } else {
        format!("{CLUSTER}-kubeconfig")
    };
    assert_eq!(volume["secret"]["secretName"], secret.as_str(), "{what}");
    assert_eq!(
        volume["secret"]["items"],
        serde_json::json!([{"key": "value", "path": "kubeconfig"}]),
        "{what}: Cluster API's key, as the file --kubeconfig names"
    );
    let env = literal_env(c);
    for (var, want) in [
        ("CLUSTER_API_IN_CLUSTER", "true"),
        ("CLUSTER_API_NAMESPACE", NAMESPACE),
        ("CLUSTER_NAME", CLUSTER),
    ] {
        assert_eq!(
            env.get(var).map(String::as_str),
            Some(want),
            "{what}: {var}"
        );
    }
    for var in [
        "CLUSTER_API_KUBECONFIG",
        "CLUSTER_API_URL",
        "CLUSTER_API_TOKEN",
    ] {
        assert!(!env_names(c).iter().any(|n| n == var), "{what}: {var}");
    }
}

/// The fleet topology as rendered: the pods run in the management cluster (no workload
/// ClusterRole installed there), reach Cluster API in-cluster, serve the selected Clusters
/// through the named kubeconfig Secrets, and share them through Leases the Role cannot name;
/// Cluster API and Secret rules are cluster-wide, or confined to clusterAPI.namespace.
fn check_fleet_topology(docs: &[Value], what: &str, extra: &[&str]) {
    let confined = extra
        .iter()
        .find_map(|a| a.strip_prefix("clusterAPI.namespace="));
    let workload_rbac = extra.contains(&"workloadCluster.rbac.render=true");
    let dep = find(docs, "Deployment", "karpenter-capi", what);
    let c = container(dep);
    assert_eq!(
        strings(&c["args"]),
        ["run"],
        "{what}: no --kubeconfig in a fleet"
    );
    assert!(c.get("volumeMounts").is_none(), "{what}: nothing mounted");
    let env = literal_env(c);
    assert_eq!(env["FLEET"], "true", "{what}");
    assert_eq!(env["CLUSTER_API_IN_CLUSTER"], "true", "{what}");
    for var in [
        "CLUSTER_NAME",
        "DRY_RUN",
        "DISABLE_LEADER_ELECTION",
        "CLUSTER_API_KUBECONFIG",
    ] {
        assert!(!env.contains_key(var), "{what}: {var} set in a fleet");
    }
    let secret = extra
        .iter()
        .find_map(|a| a.strip_prefix("fleet.kubeconfigSecret.name="))
        .map_or("{cluster}-kubeconfig", |v| v.trim_matches('"'));
    assert_eq!(env["FLEET_KUBECONFIG_SECRET"], secret, "{what}");
    assert_eq!(
        env.get("CLUSTER_API_NAMESPACE").map(String::as_str),
        confined,
        "{what}"
    );
    for part in ["-cluster-api", "-fleet"] {
        let (role_kind, ns) = match confined {
            Some(ns) => ("Role", ns),
            None => ("ClusterRole", ""),
        };
        let role = find(docs, role_kind, part, what);
        assert_eq!(
            role["metadata"]["namespace"].as_str().unwrap_or_default(),
            ns,
            "{what}: {}",
            name(role)
        );
        let binding = find(docs, &format!("{role_kind}Binding"), part, what);
        assert_eq!(binding["roleRef"]["name"], name(role), "{what}");
        assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE, "{what}");
    }
    let lease = find(docs, "Role", "-leader-election", what);
    assert_eq!(lease["metadata"]["namespace"], NAMESPACE, "{what}");
    assert!(
        rules(lease).iter().all(|r| r.names.is_empty()),
        "{what}: one Lease per Cluster, named after it: the Role cannot name them"
    );
    let workload_roles: Vec<&str> = docs
        .iter()
        .filter(|d| {
            kind(d) == "ClusterRole"
                && !name(d).ends_with("-cluster-api")
                && !name(d).ends_with("-fleet")
                && !name(d).ends_with("-karpenter-objects")
        })
        .map(name)
        .collect();
    let expected: &[&str] = if workload_rbac {
        &["karpenter-capi"]
    } else {
        &[]
    };
    assert_eq!(
        workload_roles, expected,
        "{what}: the workload ClusterRole only when rendered for the workload clusters"
    );
}

/// The (kind, namespace, group, resource, verb) grants of `docs` that only generated node groups
/// use: create or delete on MachineDeployments and infrastructure objects, list on templates.
fn generation_grants(docs: &[Value]) -> BTreeSet<(String, String, String, String, String)> {
    let mut out = BTreeSet::new();
    for d in docs
        .iter()
        .filter(|d| matches!(kind(d), "Role" | "ClusterRole"))
    {
        let ns = d["metadata"]["namespace"].as_str().unwrap_or_default();
        for r in rules(d) {
            for g in &r.groups {
                for res in &r.resources {
                    for v in &r.verbs {
                        let md = g == "cluster.x-k8s.io" && res == "machinedeployments";
                        let infra = g == "infrastructure.cluster.x-k8s.io";
                        let generation = (md && matches!(v.as_str(), "create" | "delete"))
                            || (infra && matches!(v.as_str(), "create" | "delete" | "list"));
                        if generation {
                            out.insert((
                                kind(d).to_string(),
                                ns.to_string(),
                                g.clone(),
                                res.clone(),
                                v.clone(),
                            ));
                        }
                    }
                }
            }
        }
    }
    out
}

/// `generate.enabled`: off, no role grants create or delete on MachineDeployments or templates;
/// on, the Cluster API role grants them where the objects are (the ClusterRole when joined, the
/// Role in the release namespace in the management topology, nothing in the workload cluster
/// with a separate management cluster), for every `*machinetemplates` kind of the values and no
/// MachinePool kind, and its RBAC audits clean against NEEDS with the switched rows.
fn helm_renders_generation_rules_only_when_enabled_and_where_the_objects_are() {
    let helm = tool(Asset::Helm);
    let management: &[&str] = &[
        "--set",
        "topology=management",
        "--set",
        "clusterAPI.clusterName=c1",
        "--set",
        "workloadCluster.rbac.render=true",
    ];
    let separate: &[&str] = &["--set", "clusterAPI.kubeconfigSecret.name=mgmt"];
    let kinds: BTreeSet<String> = values()["rbac"]["clusterAPI"]["infrastructureTemplates"]
        .as_array()
        .expect("values.rbac.clusterAPI.infrastructureTemplates")
        .iter()
        .flat_map(|t| strings(&t["resources"]))
        .filter(|r| r.ends_with("machinetemplates"))
        .collect();
    assert!(kinds.contains("devmachinetemplates"), "{kinds:?}");
    for (what, topology, role_kind, ns) in [
        ("joined", &[][..], Some("ClusterRole"), ""),
        ("management topology", management, Some("Role"), NAMESPACE),
        ("separate management cluster", separate, None, ""),
    ] {
        for enabled in [false, true] {
            let mut extra = topology.to_vec();
            let set = format!("generate.enabled={enabled}");
            extra.extend(["--set", set.as_str()]);
            let what = format!("{what}, {set}");
            let docs = yaml_docs(&helm_template(&helm, &extra), &what);
            let problems = rendered_rbac_problems(&docs, &extra);
            assert!(
                problems.is_empty(),
                "{what}: RBAC vs NEEDS:\n{}",
                problems.join("\n")
            );
            let found = generation_grants(&docs);
            let Some(role_kind) = role_kind.filter(|_| enabled) else {
                assert!(found.is_empty(), "{what}: {found:#?}");
                continue;
            };
            let mut want = BTreeSet::new();
            let at = |g: &str, r: &str, v: &str| {
                (
                    role_kind.to_string(),
                    ns.to_string(),
                    g.to_string(),
                    r.to_string(),
                    v.to_string(),
                )
            };
            for v in ["create", "delete"] {
                want.insert(at("cluster.x-k8s.io", "machinedeployments", v));
            }
            for k in &kinds {
                for v in GENERATE_TEMPLATE_VERBS {
                    want.insert(at("infrastructure.cluster.x-k8s.io", k, v));
                }
            }
            assert_eq!(found, want, "{what}");
            let role = find(&docs, role_kind, "-cluster-api", &what);
            assert_eq!(
                role["metadata"]["namespace"].as_str().unwrap_or_default(),
                ns,
                "{what}"
            );
        }
    }
}

/// Management-topology values that cannot work fail the render with what to do instead.
fn helm_refuses_management_values_that_cannot_work() {
    let helm = tool(Asset::Helm);
    let chart = path(CHART).to_string_lossy().into_owned();
    for (set, says) in [
        (&["topology=management"][..], "needs clusterAPI.clusterName"),
        (
            &["topology=joined"][..],
            "topology must be workload, management or fleet",
        ),
        (
            &["topology=fleet", "clusterAPI.clusterName=c1"][..],
            "leave clusterAPI.clusterName empty",
        ),
        (
            &["topology=fleet", "clusterAPI.url=https://m.example:6443"][..],
            "reaches Cluster API in-cluster",
        ),
        (
            &["topology=fleet", "leaderElection.enabled=false"][..],
            "one Lease per Cluster",
        ),
        (
            &["topology=fleet", "controller.dryRun=true"][..],
            "has no shadow mode",
        ),
        (
            &[
                "topology=fleet",
                "fleet.kubeconfigSecret.name=shared-kubeconfig",
            ][..],
            "does not contain {cluster}",
        ),
        (
            &[
                "topology=management",
                "clusterAPI.clusterName=c1",
                "clusterAPI.kubeconfigSecret.name=mgmt",
            ][..],
            "leave clusterAPI.kubeconfigSecret.name and clusterAPI.url empty",
        ),
        (
            &[
                "topology=management",
                "clusterAPI.clusterName=c1",
                "clusterAPI.namespace=elsewhere",
            ][..],
            "install the release in the Cluster's namespace",
        ),
        (
            &["karpenterObjects=elsewhere"][..],
            "karpenterObjects must be workload or management",
        ),
        (
            &[KARPENTER_OBJECTS, "clusterAPI.namespace=clusters"][..],
            "set clusterAPI.clusterName",
        ),
        (
            &[KARPENTER_OBJECTS, "clusterAPI.clusterName=c1"][..],
            "set clusterAPI.namespace",
        ),
    ] {
        let mut args = vec!["template", "k", "--namespace", NAMESPACE, chart.as_str()];
        for s in set {
            args.extend(["--set", s]);
        }
        let out = run_tool(&helm, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set:?} rendered");
        assert!(stderr.contains(says), "{set:?}: {stderr}");
    }
}

/// The rendered dashboard ConfigMap: labelled for the Grafana sidecar, holding the dashboard of
/// deploy/grafana byte for byte.
fn check_dashboard_config_map(cm: &Value, what: &str) {
    assert_eq!(
        cm["metadata"]["labels"]["grafana_dashboard"], "1",
        "{what}: the sidecar's label"
    );
    assert_eq!(
        cm["metadata"]["annotations"]["grafana_folder"],
        "Autoscaling"
    );
    assert_eq!(cm["metadata"]["namespace"], NAMESPACE);
    let data = cm["data"]["karpenter-capi.json"]
        .as_str()
        .expect("the dashboard in data");
    assert_eq!(
        data.trim_end(),
        read(&path(DASHBOARD)).trim_end(),
        "{what}: the ConfigMap holds deploy/grafana/karpenter-capi.json"
    );
    let parsed: Value = serde_json::from_str(data).expect("the dashboard is JSON");
    assert_eq!(parsed["uid"], "karpenter-capi");
}

/// `kubectl apply --dry-run=client` of the plain manifests, the CRDs and the rendered chart,
/// against the simulated cluster (kubectl needs an API server for discovery). Every object must
/// map to a served kind and come back as "created (dry run)". Schema validation is off because
/// the simulated server publishes no OpenAPI document; `assert_typed_round_trip` covers field
/// names instead.
async fn kubectl_dry_run_applies_manifests_crds_and_the_rendered_chart() {
    let kubectl = tool(Asset::Kubectl);
    let helm = tool(Asset::Helm);
    let sim = karpenter_capi::simulate::BackgroundSim::start(Default::default())
        .await
        .expect("simulated cluster");
    let kubeconfig = sim.kubeconfig().to_string_lossy().into_owned();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut inputs: Vec<(String, PathBuf, usize)> = Vec::new();
    for dir_rel in [MANIFESTS, "deploy/manifests/optional", "deploy/crds"] {
        for p in files(dir_rel, &["yaml", "yml"]) {
            let n = yaml_docs(&read(&p), &p.display().to_string()).len();
            inputs.push((p.display().to_string(), p, n));
        }
    }
    for (i, (what, extra)) in VALUE_SETS.iter().enumerate() {
        // A ServiceMonitor needs the Prometheus operator's CRD, which this cluster (like most)
        // does not have: kubectl rightly refuses it, so that set is checked by helm alone.
        if extra.contains(&"serviceMonitor.enabled=true") {
            continue;
        }
        let rendered = helm_template(&helm, extra);
        let n = yaml_docs(&rendered, what).len();
        let file = dir.path().join(format!("chart-{i}.yaml"));
        std::fs::write(&file, rendered).expect("writing the rendered chart");
        inputs.push((format!("helm template ({what})"), file, n));
    }
    let handle = tokio::task::spawn_blocking(move || {
        for (what, file, docs) in inputs {
            let file = file.to_string_lossy().into_owned();
            let out = run_tool(
                &kubectl,
                &[
                    "--kubeconfig",
                    &kubeconfig,
                    "apply",
                    "--dry-run=client",
                    "--validate=false",
                    "-f",
                    &file,
                ],
            );
            let stdout = assert_ok(&out, &format!("kubectl apply --dry-run=client ({what})"));
            let created = stdout
                .lines()
                .filter(|l| l.ends_with("created (dry run)"))
                .count();
            assert_eq!(
                created, docs,
                "{what}: every object must be applied, got:\n{stdout}"
            );
        }
    });
    handle.await.expect("kubectl checks");
}

/// Decode a manifest into its k8s-openapi type and encode it again: a field the type does not
/// know (a typo such as `readinessProbes`, or a field at the wrong level) is dropped on the way,
/// and is reported with its path. Kinds without a built-in type (ServiceMonitor) are skipped.
fn assert_typed_round_trip(doc: &Value, origin: &str) {
    if let Err(e) = typed_round_trip(doc, origin) {
        panic!("{e}");
    }
}

/// The fields of `doc` its k8s-openapi type drops, as an error naming them.
fn typed_round_trip(doc: &Value, origin: &str) -> Result<(), String> {
    use k8s_openapi::api::{apps, core, policy, rbac};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    fn again<T: serde::de::DeserializeOwned + serde::Serialize>(
        doc: &Value,
    ) -> Result<Value, String> {
        let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
        serde_json::to_value(typed).map_err(|e| e.to_string())
    }
    let typed = match kind(doc) {
        "Namespace" => again::<core::v1::Namespace>(doc),
        "ServiceAccount" => again::<core::v1::ServiceAccount>(doc),
        "Service" => again::<core::v1::Service>(doc),
        "ConfigMap" => again::<core::v1::ConfigMap>(doc),
        "Secret" => again::<core::v1::Secret>(doc),
        "Deployment" => again::<apps::v1::Deployment>(doc),
        "PodDisruptionBudget" => again::<policy::v1::PodDisruptionBudget>(doc),
        "ClusterRole" => again::<rbac::v1::ClusterRole>(doc),
        "ClusterRoleBinding" => again::<rbac::v1::ClusterRoleBinding>(doc),
        "Role" => again::<rbac::v1::Role>(doc),
        "RoleBinding" => again::<rbac::v1::RoleBinding>(doc),
        "CustomResourceDefinition" => again::<CustomResourceDefinition>(doc),
        "ServiceMonitor" => return Ok(()),
        other => {
            return Err(format!(
                "{origin}: no typed check for kind {other:?}; add it here"
            ));
        }
    };
    let typed = typed.map_err(|e| format!("{origin}: {} {}: {e}", kind(doc), name(doc)))?;
    let mut lost = Vec::new();
    lost_fields(doc, &typed, String::new(), &mut lost);
    if lost.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{origin}: {} {} has fields its type does not know: {lost:?}",
            kind(doc),
            name(doc)
        ))
    }
}

fn lost_fields(original: &Value, typed: &Value, at: String, lost: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(o), Value::Object(t)) => {
            for (k, v) in o {
                let here = format!("{at}.{k}");
                match t.get(k) {
                    Some(tv) => lost_fields(v, tv, here, lost),
                    None if v.is_null() => {}
                    None => lost.push(here),
                }
            }
        }
        (Value::Array(o), Value::Array(t)) => {
            for (i, v) in o.iter().enumerate() {
                match t.get(i) {
                    Some(tv) => lost_fields(v, tv, format!("{at}[{i}]"), lost),
                    None => lost.push(format!("{at}[{i}]")),
                }
            }
        }
        (Value::Object(_) | Value::Array(_), _) => lost.push(at),
        _ => {}
    }
}

fn manifests_and_crds_use_only_fields_their_types_know() {
    for (file, doc) in manifest_docs() {
        assert_typed_round_trip(&doc, &file);
    }
    for p in files("deploy/crds", &["yaml"]) {
        for doc in yaml_docs(&read(&p), &p.display().to_string()) {
            assert_typed_round_trip(&doc, &p.display().to_string());
        }
    }
    // The round trip itself must catch a typo.
    let mut bad = one(&manifest_docs(), "Deployment").clone();
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = serde_json::json!({});
    let caught = typed_round_trip(&bad, "typo");
    assert!(
        caught.is_err_and(|e| e.contains("readinessProbes")),
        "a misspelt field must be reported"
    );
}
