//! Setting the stage for the RBAC flows: a control plane with an audit log, the project's and
//! Cluster API's CRDs, the chart's RBAC installed with the real helm and kubectl, the Cluster API
//! and kubelet stand-ins, the seeded MachineDeployments, NodeClass and NodePool, and the
//! controller binary as the chart's Deployment runs it.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use karpenter_capi::api::wellknown::CLUSTER_NAME_LABEL;
use karpenter_capi::capi::version::CapiVersion;
use karpenter_capi::controlplane::rbac::{self, ServiceAccountAccess};
use karpenter_capi::controlplane::{ControlPlane, Options};
use karpenter_capi::sim::capi::CapiConfig;
use karpenter_capi::sim::cluster::{CLUSTER_NAME, MachineDeploymentSeed};
use karpenter_capi::sim::kubelet::KubeletConfig;
use karpenter_capi::sim::standin::{Clusters, Shutdown, ShutdownTrigger, shutdown_pair};
use karpenter_capi::simulate::launch::seed_of;
use karpenter_capi::view::binding::Binding;

use super::{NAMESPACE, RELEASE, Topology, UPSTREAM_CRDS, Unreached};
use crate::assets::{self, Asset};
use crate::established;

/// The controller container's environment as the chart renders it (literal values only).
pub(crate) fn chart_environment(t: &Topology) -> Vec<(String, String)> {
    let chart = Chart::new(t);
    let docs =
        rbac::render(&chart.install()).unwrap_or_else(|e| panic!("rendering the chart: {e}"));
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the chart's Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["args"], json!(["run"]), "the container's args");
    container["env"]
        .as_array()
        .expect("the container's env")
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// `karpenter-capi run` in a child process, killed if the test ends without stopping it.
pub(crate) struct ControllerProcess {
    child: std::process::Child,
    /// Its pod's name, which is its leader-election identity.
    pub(crate) name: String,
    log: PathBuf,
}

impl ControllerProcess {
    pub(super) fn spawn(
        cp: &ControlPlane,
        access: &ServiceAccountAccess,
        env: &[(String, String)],
    ) -> Self {
        let args = [OsStr::new("--kubeconfig"), access.kubeconfig.as_os_str()];
        Self::spawn_as(cp, "karpenter-capi-0", &args, env)
    }

    /// `run` with `args` and the environment `env`, as pod `name` of the release.
    pub(crate) fn spawn_as(
        cp: &ControlPlane,
        name: &str,
        args: &[&OsStr],
        env: &[(String, String)],
    ) -> Self {
        let log = cp.dir().join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("the controller's log");
        let err = out.try_clone().expect("the controller's log");
        let child = Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
            .arg("run")
            .args(args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            // The downward API's values in a pod.
            .env("POD_NAME", name)
            .env("POD_NAMESPACE", NAMESPACE)
            // Free ports: other processes on this machine may hold the chart's.
            .env("METRICS_PORT", "0")
            .env("HEALTH_PROBE_PORT", "0")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("starting karpenter-capi run");
        ControllerProcess {
            child,
            name: name.to_string(),
            log,
        }
    }

    /// SIGKILL, as a node's loss or the OOM killer ends a pod: nothing released.
    pub(crate) fn kill(&mut self) {
        self.child.kill().expect("SIGKILL to the controller");
        self.child.wait().expect("the killed controller reaped");
    }

    /// What it logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, as the kubelet stops a pod; the controller must exit 0 within its grace.
    pub(crate) fn terminate(&mut self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill(1)");
        assert!(sent.success(), "kill -TERM: {sent}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("the controller's status") {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the controller did not exit on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(status.success(), "the controller's exit: {status}");
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!(
                "--- karpenter-capi run ({}):\n{}",
                self.name,
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
        // Fails only when it already exited; the wait reaps it either way.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A control plane (its API server keeps an audit log).
pub(crate) async fn start_audited() -> ControlPlane {
    let options = Options::from_env().expect("KUBEBUILDER_ASSETS (checked by the harness)");
    let cp = ControlPlane::start(options)
        .await
        .unwrap_or_else(|e| panic!("starting the control plane: {e}"));
    say!("control plane ready in {:?}", cp.startup());
    cp
}

/// The project's CRDs and Cluster API's, and those at the paths `more` names, each Established.
pub(crate) async fn install_crds(cp: &ControlPlane, admin: &Client, more: &[PathBuf]) {
    let mut crds = karpenter_capi::api::crds::all();
    let upstream = UPSTREAM_CRDS.iter().map(|rel| assets::upstream(rel));
    for path in upstream.chain(more.iter().cloned()) {
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not a CRD: {e}", path.display()));
        crds.push(crd);
    }
    let api: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in &crds {
        api.create(&PostParams::default(), crd)
            .await
            .unwrap_or_else(|e| panic!("creating CRD {}: {e}", crd.name_any()));
    }
    for crd in &crds {
        established(cp, &crd.name_any()).await;
    }
}

/// The repository's chart, installed as a topology says, with the real helm and kubectl.
struct Chart {
    helm: PathBuf,
    kubectl: PathBuf,
    chart: PathBuf,
    /// `helm template`'s arguments beyond the release and namespace.
    args: Vec<&'static str>,
}

impl Chart {
    fn new(t: &Topology) -> Self {
        let mut args = t.helm_args.to_vec();
        if t.karpenter_objects {
            args.extend(["--set", "karpenterObjects=management"]);
        }
        Chart {
            helm: assets::tool(Asset::Helm),
            kubectl: assets::tool(Asset::Kubectl),
            chart: Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/karpenter-capi"),
            args,
        }
    }

    fn install(&self) -> rbac::Install<'_> {
        rbac::Install {
            helm: &self.helm,
            kubectl: &self.kubectl,
            chart: &self.chart,
            release: RELEASE,
            namespace: NAMESPACE,
            helm_args: &self.args,
        }
    }
}

pub(crate) async fn install_chart(cp: &ControlPlane, t: &Topology) -> ServiceAccountAccess {
    rbac::install(cp, &Chart::new(t).install())
        .await
        .unwrap_or_else(|e| panic!("installing the chart's RBAC: {e}"))
}

/// The Cluster API and kubelet stand-ins, as the administrator (they play Cluster API's
/// controllers and the kubelets, which have their own permissions in a cluster).
pub(super) struct StandIns {
    trigger: ShutdownTrigger,
}

impl StandIns {
    pub(super) fn start(admin: &Client) -> Self {
        let (trigger, shutdown) = shutdown_pair();
        spawn_standins(Clusters::joined(admin.clone()), shutdown);
        StandIns { trigger }
    }

    pub(super) fn stop(&self) {
        self.trigger.trigger();
    }
}

/// The Cluster API and kubelet stand-ins of `clusters` (Machines in its management cluster,
/// Nodes in its workload cluster), quick enough for a flow of a few minutes, until `shutdown`.
pub(crate) fn spawn_standins(clusters: Clusters, shutdown: Shutdown) {
    let version = CapiVersion::V1Beta2.into();
    karpenter_capi::sim::capi::spawn(
        clusters.clone(),
        CapiConfig {
            version,
            provider_delay: Duration::from_millis(200),
            jitter: Duration::from_millis(100),
            node_delete_delay: Duration::from_millis(100),
            ..CapiConfig::default()
        },
        shutdown.clone(),
    );
    karpenter_capi::sim::kubelet::spawn(
        clusters,
        KubeletConfig {
            version,
            node_ready_delay: Duration::from_millis(200),
            ..KubeletConfig::default()
        },
        shutdown,
    );
}

/// Permissions no flow here exercises, added to each flow's own list by [`not_reached`]: the
/// read-backs after a conflict (only a run that meets one makes them), and the kinds of the
/// providers the stand-ins are not (one provider, no MachinePools).
const EVERY_FLOW: [Unreached; 4] = [
    (
        "cluster.x-k8s.io",
        "machines",
        "get",
        "a Machine is read back after a conflicting or unanswered bind or deletion mark",
    ),
    (
        "cluster.x-k8s.io",
        "machinedeployments",
        "get",
        "a MachineDeployment is read back after a conflicting or unanswered replica write",
    ),
    (
        "infrastructure.cluster.x-k8s.io",
        "*machinetemplates",
        "get",
        "other providers' templates: the catalog reads the kind its MachineDeployments name \
      (DevMachineTemplate here), and RBAC cannot match a suffix, so the chart lists each",
    ),
    (
        "infrastructure.cluster.x-k8s.io",
        "*machinepools",
        "get",
        "a MachinePool's infrastructure pool, read by the catalog; this flow has no MachinePools",
    ),
];

/// A flow's permissions not reached: its own (`flow`) and [`EVERY_FLOW`].
pub(crate) fn not_reached(flow: &[Unreached]) -> Vec<Unreached> {
    flow.iter().chain(&EVERY_FLOW).copied().collect()
}

/// Two member MachineDeployments (4 CPUs, 16 GiB, none running), the ClusterAPINodeClass, a
/// NodeOverlay and a NodePool that consolidates empty and underutilized nodes at once, a whole node at a time.
/// With Karpenter's objects in the management cluster, each is bound to the Cluster.
pub(super) async fn seed(admin: &Client, t: &Topology) {
    for i in 0..2 {
        seed_machine_deployment(admin, t.machines, i).await;
    }
    let binding = t.binding();
    seed_pool(admin, "default", binding.as_ref()).await;
    // A NodeOverlay that changes nothing (+0%), so the catalog's overlay watch and status
    // write run under the chart's RBAC too.
    create(
        admin,
        json!({
            "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay",
            "metadata": {"name": "unchanged", "labels": binding_labels(binding.as_ref())},
            "spec": {"requirements": [], "priceAdjustment": "+0%"},
        }),
    )
    .await;
}

/// The labels that bind an object to the Cluster `binding` names (none without one): the
/// controller lists and watches only the objects that carry them.
pub(crate) fn binding_labels(binding: Option<&Binding>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if let Some(b) = binding {
        b.label(&mut labels);
    }
    labels
}

/// Member MachineDeployment `md-<i>` of Cluster `sim` in `namespace` (4 CPUs, 16 GiB, 10 at
/// most, none running) and the template it names.
pub(crate) async fn seed_machine_deployment(admin: &Client, namespace: &str, i: usize) {
    let mut seed = MachineDeploymentSeed {
        namespace: namespace.into(),
        ..seed_of(i, 10)
    };
    // Cluster API's defaulting webhook labels a MachineDeployment with its Cluster; no
    // webhook runs here, so the label is written as the webhook would.
    seed.labels
        .insert(CLUSTER_NAME_LABEL.into(), CLUSTER_NAME.into());
    // The template it names: without one Cluster API could not create its Machines, and
    // the controller does not offer it.
    let templates: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        namespace,
        &karpenter_capi::sim::cluster::infra_template_resource(),
    );
    templates
        .create(
            &PostParams::default(),
            &karpenter_capi::sim::cluster::infrastructure_template(namespace, &seed.name),
        )
        .await
        .unwrap_or_else(|e| panic!("creating the template of md-{i}: {e}"));
    let md = karpenter_capi::sim::cluster::machine_deployment(CapiVersion::V1Beta2.into(), &seed);
    let api: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        namespace,
        &CapiVersion::V1Beta2.machine_deployment(),
    );
    api.create(&PostParams::default(), &md)
        .await
        .unwrap_or_else(|e| panic!("creating MachineDeployment md-{i}: {e}"));
}

/// Cluster `namespace/name` and its `<name>-kubeconfig` Secret holding `kubeconfig` under
/// `value`, as Cluster API's control plane provider writes them for each workload cluster.
pub(crate) async fn create_cluster(admin: &Client, namespace: &str, name: &str, kubeconfig: &[u8]) {
    let v = CapiVersion::V1Beta2;
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": v.cluster().api_version, "kind": "Cluster",
        "metadata": {"name": name, "namespace": namespace},
        // Cluster API's schema wants a spec with something in it.
        "spec": {"clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}}},
    }))
    .expect("a Cluster");
    Api::<DynamicObject>::namespaced_with(admin.clone(), namespace, &v.cluster())
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap_or_else(|e| panic!("creating Cluster {namespace}/{name}: {e}"));
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": format!("{name}-kubeconfig"), "namespace": namespace,
            "labels": {CLUSTER_NAME_LABEL: name},
        },
        "type": "cluster.x-k8s.io/secret",
        "data": {"value": k8s_openapi::ByteString(kubeconfig.to_vec())},
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("creating Secret {namespace}/{name}-kubeconfig: {e}"));
}

/// The ClusterAPINodeClass `name` and a NodePool `name` that consolidates empty and
/// underutilized nodes at once (once its consolidateAfter is lowered), a whole node at a time;
/// both bound to the Cluster `binding` names, if any.
pub(crate) async fn seed_pool(admin: &Client, name: &str, binding: Option<&Binding>) {
    let labels = binding_labels(binding);
    create(
        admin,
        json!({
            "apiVersion": "karpenter.cluster.x-k8s.io/v1alpha1", "kind": "ClusterAPINodeClass",
            "metadata": {"name": name, "labels": labels}, "spec": {},
        }),
    )
    .await;
    create(
        admin,
        json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "template": {"spec": {
                    "requirements": [{
                        "key": "karpenter.sh/capacity-type", "operator": "In",
                        "values": ["on-demand"],
                    }],
                    "nodeClassRef": {
                        "group": "karpenter.cluster.x-k8s.io",
                        "kind": "ClusterAPINodeClass", "name": name,
                    },
                }},
                "disruption": {
                    "consolidationPolicy": "WhenEmptyOrUnderutilized",
                    "consolidateAfter": "Never",
                    "budgets": [{"nodes": "100%"}],
                },
            },
        }),
    )
    .await;
}

/// Creates a cluster-scoped object of any kind as the administrator.
pub(crate) async fn create(admin: &Client, doc: Value) {
    let kind = doc["kind"].as_str().unwrap_or_default().to_string();
    let (group, version) = doc["apiVersion"]
        .as_str()
        .and_then(|v| v.split_once('/'))
        .expect("a group/version");
    let resource =
        kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(group, version, &kind));
    let api: Api<DynamicObject> = Api::all_with(admin.clone(), &resource);
    let object: DynamicObject = serde_json::from_value(doc).expect("an object");
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating the {kind}: {e}"));
}
