//! The real control plane (`karpenter_capi::controlplane`, binaries from `KUBEBUILDER_ASSETS`):
//! the real kube-controller-manager and kube-scheduler turn a Deployment into pods bound to
//! Nodes, the project's CRDs and the repository's NodePool example are accepted by the real
//! kube-apiserver, and after a drop, a Ctrl-C (SIGINT) or a panic nothing it started is alive
//! or listening and its directory is gone. The simulated cluster on this backend (`simulate
//! --control-plane real`) provisions pending pods end to end, kube-scheduler binding them.
//! Module `rbac`: the controller on it under the Helm chart's RBAC only (joined, management,
//! and management with Karpenter's objects beside the Machines). Whole flows written
//! once and run on both backends (`<module>::simulated::*` and `<module>::real::*`): `flows`
//! (launch, drain, consolidation, drift), `provisioning`, `lifecycle` (expiry, rollouts, a
//! restart mid-burst; a restart with template reads refused, real only), `failover` (leader
//! election), `malformed` (the corpus), `capi_schema` (malformed MachineDeployments refused
//! alike), `kubectl` and `init`. Module `machine_size`: a template's size annotations decide
//! its Nodes and its published capacity, with the Cluster API stand-in and with the real one.
//! Module `fleet`: three `run --fleet` processes on kube-apiserver as the management cluster,
//! under the chart's fleet RBAC; one killed or stopped mid-burst, its Clusters move, no claim
//! leaks or binds twice, and the audit log shows nothing refused and nothing granted unused
//! (also with Karpenter's objects on kube-apiserver, `karpenterObjects=management`).
//! Module `simulate`: nothing left running or listening after `karpenter-capi simulate
//! --control-plane real` exits. Module `cluster_api`: Cluster API's real manager (webhooks,
//! conversion, nothing left after a drop) and whole flows on it (`--cluster-api real`).

#[macro_use]
mod assets;
#[path = "common/mod.rs"]
mod common;
#[macro_use]
#[path = "control_plane/flows.rs"]
mod flows;
#[path = "control_plane/adoption.rs"]
mod adoption;
#[path = "control_plane/capi_schema.rs"]
mod capi_schema;
#[path = "control_plane/cluster_api.rs"]
mod cluster_api;
#[path = "control_plane/failover.rs"]
mod failover;
#[path = "control_plane/fleet.rs"]
mod fleet;
#[path = "control_plane/init.rs"]
mod init;
#[path = "control_plane/kubectl.rs"]
mod kubectl;
#[path = "control_plane/lifecycle.rs"]
mod lifecycle;
#[path = "control_plane/machine_size.rs"]
mod machine_size;
#[path = "control_plane/malformed.rs"]
mod malformed;
#[path = "control_plane/overlay.rs"]
mod overlay;
#[path = "control_plane/provisioning.rs"]
mod provisioning;
#[path = "control_plane/rbac.rs"]
mod rbac;
#[path = "control_plane/simulate.rs"]
mod simulate;

fn main() -> std::process::ExitCode {
    // This binary re-runs itself as the process that is interrupted or panics (see `child`).
    if let Ok(mode) = std::env::var(CHILD) {
        return child(&mode);
    }
    let mut tests = trials![
        @tokio a_deployment_is_scheduled_onto_nodes_by_the_real_scheduler needs [ControlPlane],
        @tokio the_crds_and_the_example_nodepool_are_accepted_by_kube_apiserver needs [ControlPlane],
        @tokio nothing_is_left_running_or_listening_after_drop needs [ControlPlane],
        nothing_is_left_after_ctrl_c needs [ControlPlane],
        nothing_is_left_after_a_panic needs [ControlPlane],
        @actix the_pods_scenario_provisions_pods_that_kube_scheduler_binds
            needs [ControlPlane, Upstream, Helm, Kubectl],
    ];
    tests.extend(rbac::tests());
    tests.extend(simulate::tests());
    tests.extend(flows::tests());
    tests.extend(overlay::tests());
    tests.extend(provisioning::tests());
    tests.extend(lifecycle::tests());
    tests.extend(failover::tests());
    tests.extend(fleet::tests());
    tests.extend(adoption::tests());
    tests.extend(machine_size::tests());
    tests.extend(malformed::tests());
    tests.extend(capi_schema::tests());
    tests.extend(kubectl::tests());
    tests.extend(init::tests());
    tests.extend(cluster_api::tests());
    assets::main(tests)
}

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use karpenter_capi::controlplane::{ControlPlane, Options};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// Guards hangs only; pods are bound within seconds of the control plane being ready.
const DEADLINE: Duration = Duration::from_secs(120);

async fn start() -> ControlPlane {
    let options = Options::from_env().expect("KUBEBUILDER_ASSETS (checked by the harness)");
    let cp = ControlPlane::start(options)
        .await
        .unwrap_or_else(|e| panic!("starting the control plane: {e}"));
    say!("control plane ready in {:?}", cp.startup());
    cp
}

/// Polls `check` every 250 ms until it returns `Some`, panicking with `what` at [`DEADLINE`],
/// after the cluster's events and the end of the scheduler's and controller-manager's logs:
/// what they say is the first thing to read when pods are not placed.
async fn eventually<T, F, Fut>(cp: &ControlPlane, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() >= DEADLINE {
            if let Ok(events) = Api::<k8s_openapi::api::core::v1::Event>::all(cp.client())
                .list(&Default::default())
                .await
            {
                for e in events.items {
                    eprintln!(
                        "event {:?} {:?}: {:?}",
                        e.involved_object.name, e.reason, e.message
                    );
                }
            }
            for binary in ["kube-scheduler", "kube-controller-manager"] {
                eprintln!("--- {binary}:\n{}", cp.log_tail(binary, 40));
            }
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "ready", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        },
    }))
    .expect("a Node")
}

/// Creates a Node and then its status: the API server drops status on create.
async fn create_ready_node(client: &Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = node(name);
    nodes
        .create(&PostParams::default(), &n)
        .await
        .unwrap_or_else(|e| panic!("creating Node {name}: {e}"));
    let status = json!({"status": n.status});
    nodes
        .patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .unwrap_or_else(|e| panic!("setting Node {name}'s status: {e}"));
}

async fn a_deployment_is_scheduled_onto_nodes_by_the_real_scheduler() {
    let cp = start().await;
    let client = cp.client();
    for name in ["node-a", "node-b"] {
        create_ready_node(&client, name).await;
    }
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{
                    "name": "web", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}},
                }]},
            },
        },
    }))
    .expect("a Deployment");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("creating the Deployment");

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let placed: BTreeMap<String, String> = eventually(&cp, "3 pods bound to nodes", || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&Default::default()).await.ok()?;
            let placed: BTreeMap<String, String> = list
                .items
                .iter()
                .filter_map(|p| {
                    Some((
                        p.metadata.name.clone()?,
                        p.spec.as_ref()?.node_name.clone()?,
                    ))
                })
                .collect();
            (placed.len() == 3).then_some(placed)
        }
    })
    .await;
    for (pod, node) in &placed {
        assert!(
            node == "node-a" || node == "node-b",
            "{pod} bound to {node}"
        );
        // The pod came from the real ReplicaSet controller (owner reference to a ReplicaSet).
        let p = pods.get(pod).await.expect("the pod");
        let owner = p
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .next()
            .map(|o| o.kind);
        assert_eq!(owner.as_deref(), Some("ReplicaSet"), "{pod}'s owner");
    }
    say!("placement: {placed:?}");
}

/// Waits until CRD `name` is Established (its resource served).
async fn established(cp: &ControlPlane, name: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(cp.client());
    eventually(cp, &format!("CRD {name} Established"), || {
        let crds = crds.clone();
        async move {
            let c = crds.get(name).await.ok()?;
            c.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        }
    })
    .await;
}

async fn the_crds_and_the_example_nodepool_are_accepted_by_kube_apiserver() {
    let cp = start().await;
    let client = cp.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in karpenter_capi::api::crds::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.create(&PostParams::default(), &crd)
            .await
            .unwrap_or_else(|e| panic!("kube-apiserver rejected CRD {name}: {e}"));
        established(&cp, &name).await;
    }

    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/nodepool.yaml"
    ))
    .expect("examples/nodepool.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("examples/nodepool.yaml");
    let mut created = Vec::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        if kind != "NodePool" && kind != "ClusterAPINodeClass" {
            continue;
        }
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').expect("a group/version");
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let object: DynamicObject = serde_json::from_value(doc).expect("an object");
        // Created as written, so the real schema validation sees every field of the example.
        let made = api
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("kube-apiserver rejected the example {kind}: {e}"));
        created.push(format!("{kind}/{}", made.metadata.name.unwrap_or_default()));
    }
    assert_eq!(
        created,
        ["ClusterAPINodeClass/default", "NodePool/default"],
        "the example's objects"
    );

    // createTimeout must be a Go duration of hours, minutes and seconds (upstream's pattern for
    // durations): kube-apiserver refuses the rest, naming the field.
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "karpenter.cluster.x-k8s.io",
        "v1alpha1",
        "ClusterAPINodeClass",
    ));
    let nodeclasses: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    for (i, bad) in ["forever", "-5m", "5 m", "1d"].into_iter().enumerate() {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "karpenter.cluster.x-k8s.io/v1alpha1", "kind": "ClusterAPINodeClass",
            "metadata": {"name": format!("bad-timeout-{i}")}, "spec": {"createTimeout": bad},
        }))
        .expect("an object");
        match nodeclasses.create(&PostParams::default(), &object).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "{bad}: {s:?}");
                assert!(
                    s.message.contains("spec.createTimeout"),
                    "{bad}: {}",
                    s.message
                );
            }
            other => panic!("createTimeout {bad:?} was not refused: {other:?}"),
        }
    }
}

/// Whether `pid` is a live process running one of the control plane's binaries (a pid reused by
/// an unrelated process since does not count).
fn alive(pid: u32, binary: &str) -> bool {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmdline) => {
            let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
            String::from_utf8_lossy(argv0).ends_with(binary)
        }
        Err(_) => false,
    }
}

fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(
        &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Duration::from_millis(500),
    )
    .is_ok()
}

/// What a control plane started: its processes, ports and directory.
struct Footprint {
    pids: Vec<(String, u32)>,
    ports: Vec<u16>,
    dir: PathBuf,
}

impl Footprint {
    fn of(cp: &ControlPlane) -> Self {
        Footprint {
            pids: cp
                .pids()
                .into_iter()
                .map(|(b, p)| (b.to_string(), p))
                .collect(),
            // etcd's client and peer ports, the API server's, and the scheduler's and
            // controller-manager's serving ports.
            ports: cp.ports().all().to_vec(),
            dir: cp.dir().to_path_buf(),
        }
    }

    fn assert_running(&self) {
        assert_eq!(self.pids.len(), 4, "{:?}", self.pids);
        for (binary, pid) in &self.pids {
            assert!(alive(*pid, binary), "{binary} ({pid}) runs before the stop");
        }
        for port in &self.ports {
            assert!(listening(*port), "port {port} listens before the stop");
        }
    }

    fn assert_gone(&self) {
        for (binary, pid) in &self.pids {
            assert!(!alive(*pid, binary), "{binary} ({pid}) still runs");
        }
        for port in &self.ports {
            assert!(!listening(*port), "port {port} still listens");
        }
        assert!(!self.dir.exists(), "{} still exists", self.dir.display());
    }

    /// One line, for the child to hand to its parent.
    fn line(&self) -> String {
        let pids: Vec<String> = self.pids.iter().map(|(b, p)| format!("{b}={p}")).collect();
        let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
        format!(
            "{} {} {}",
            pids.join(","),
            ports.join(","),
            self.dir.display()
        )
    }

    fn parse(line: &str) -> Self {
        let mut parts = line.splitn(3, ' ');
        let (pids, ports, dir) = match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => panic!("the child's footprint line: {line:?}"),
        };
        Footprint {
            pids: pids
                .split(',')
                .filter_map(|p| p.split_once('='))
                .map(|(b, p)| (b.to_string(), p.parse().expect("a pid")))
                .collect(),
            ports: ports
                .split(',')
                .map(|p| p.parse().expect("a port"))
                .collect(),
            dir: PathBuf::from(dir),
        }
    }
}

async fn nothing_is_left_running_or_listening_after_drop() {
    let cp = start().await;
    let footprint = Footprint::of(&cp);
    footprint.assert_running();
    drop(cp);
    footprint.assert_gone();
}

/// Set in the re-run child: `interrupt` (wait to be interrupted) or `panic`.
const CHILD: &str = "KARPENTER_CAPI_CONTROL_PLANE_CHILD";

/// The child: starts a control plane, prints its footprint, then waits for SIGINT or panics.
fn child(mode: &str) -> std::process::ExitCode {
    let mode = mode.to_string();
    assets::tokio(async move {
        let cp = start().await;
        println!("FOOTPRINT {}", Footprint::of(&cp).line());
        let _ = std::io::stdout().flush();
        if mode == "panic" {
            panic!("a panic with a control plane up, on purpose");
        }
        tokio::time::sleep(DEADLINE).await;
        drop(cp);
    });
    std::process::ExitCode::FAILURE
}

/// Runs this binary as a child in `mode`, returns it and the footprint it reported.
fn spawn_child(mode: &str) -> (std::process::Child, Footprint) {
    let exe = std::env::current_exe().expect("this test binary");
    let mut child = Command::new(exe)
        .env(CHILD, mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // Its panic is on purpose: shown only with --nocapture.
        .stderr(if assets::narrating() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .expect("re-running this test binary");
    let stdout = child.stdout.take().expect("the child's stdout");
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("FOOTPRINT ").map(str::to_string))
        .expect("the child's footprint (did its control plane start?)");
    (child, Footprint::parse(&line))
}

fn wait_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("the child's status") {
            return status;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("the child did not exit");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn nothing_is_left_after_ctrl_c() {
    let (mut child, footprint) = spawn_child("interrupt");
    footprint.assert_running();
    // SIGINT, as a terminal's Ctrl-C delivers it to the foreground process.
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill(1)");
    assert!(sent.success(), "kill -INT: {sent}");
    let status = wait_exit(&mut child);
    assert_eq!(status.code(), Some(130), "the child's exit: {status}");
    footprint.assert_gone();
}

fn nothing_is_left_after_a_panic() {
    let (mut child, footprint) = spawn_child("panic");
    let status = wait_exit(&mut child);
    assert_eq!(status.code(), Some(101), "the child's exit: {status}");
    footprint.assert_gone();
}

/// `simulate --control-plane real --scenario pods`, small: pending pods (made by the real
/// ReplicaSet controller) -> NodeClaims -> Machines (the Cluster API stand-in) -> Nodes (the
/// kubelet stand-in) -> pods bound by kube-scheduler; the report's figures come from the audit
/// log. After the cluster is dropped nothing it started runs or listens.
async fn the_pods_scenario_provisions_pods_that_kube_scheduler_binds() {
    use karpenter_capi::cli::SimulateArgs;
    use karpenter_capi::simulate::pods;

    let args = SimulateArgs::from_words(&[
        "--control-plane",
        "real",
        "--scenario",
        "pods",
        "--pods",
        "12",
        "--deployments",
        "2",
        "--machine-deployments",
        "2",
        "--deadline",
        "300s",
    ])
    .expect("simulate's arguments");
    let (report, kept) = pods::run_kept(&args)
        .await
        .unwrap_or_else(|e| panic!("the pods scenario on a real control plane: {e}"));
    let cluster = kept.sim.cluster().clone();
    assert!(
        report.launch.invariants_ok,
        "invariants: {:?}",
        report.launch.problems
    );
    assert_eq!(report.pods.pending_at_start, 12);
    assert_eq!(report.pods.bound, 12, "{}", report);
    let claims = &report.launch.claims;
    assert!(claims.requested >= 1, "{report}");
    assert_eq!(claims.initialized, claims.requested, "{report}");
    assert_eq!(report.launch.machines.bound, claims.requested, "{report}");
    assert!(report.nodes.created >= 1, "{report}");

    // Through the real API server: every pod is on a Node the kubelet stand-in registered
    // for a Machine, and kube-scheduler (not a stand-in) bound each.
    let client = cluster.new_client().expect("a client");
    let pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), "default")
        .list(&Default::default())
        .await
        .expect("pods")
        .items;
    let nodes: Vec<String> = Api::<Node>::all(client)
        .list(&Default::default())
        .await
        .expect("nodes")
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert_eq!(pods.len(), 12);
    // kube-controller-manager's node lifecycle controller lifts `not-ready:NoExecute` on its
    // next monitor pass after the Node turns Ready, which may come after the last pod is bound:
    // pods tolerate that taint for 300 s (DefaultTolerationSeconds), so kube-scheduler binds
    // them before it goes. Wait for the passes rather than race them.
    let nodes_api = Api::<Node>::all(cluster.new_client().expect("a client"));
    let started = Instant::now();
    loop {
        let tainted: Vec<(String, Vec<String>)> = nodes_api
            .list(&Default::default())
            .await
            .expect("nodes")
            .items
            .into_iter()
            .filter_map(|n| {
                let keys: Vec<String> = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .into_iter()
                    .flatten()
                    .filter(|t| t.key.starts_with("node.kubernetes.io/"))
                    .map(|t| format!("{}:{}", t.key, t.effect))
                    .collect();
                (!keys.is_empty()).then(|| (n.metadata.name.unwrap_or_default(), keys))
            })
            .collect();
        if tainted.is_empty() {
            break;
        }
        if started.elapsed() < Duration::from_millis(250) {
            say!("waiting for the node lifecycle controller: {tainted:?}");
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the node lifecycle controller lifted every not-ready taint: {tainted:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let node_controller_writes = cluster
        .stats()
        .writes_for("nodes", "")
        .into_iter()
        .filter(|w| {
            w.agent
                .starts_with("system:serviceaccount:kube-system:node-controller ")
        })
        .count();
    assert!(
        node_controller_writes > 0,
        "the node lifecycle controller tainted and untainted the new Nodes"
    );
    for pod in &pods {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        assert!(
            node.as_ref().is_some_and(|n| nodes.contains(n)),
            "{:?} on {node:?}, Nodes {nodes:?}",
            pod.metadata.name
        );
    }
    let binders: std::collections::BTreeSet<String> = cluster
        .stats()
        .writes_for("pods", "binding")
        .into_iter()
        .map(|w| w.agent)
        .collect();
    assert_eq!(binders.len(), 1, "one binder, kube-scheduler: {binders:?}");
    assert!(
        binders
            .iter()
            .all(|a| a.starts_with("system:kube-scheduler ")),
        "bindings by {binders:?}"
    );
    assert_eq!(cluster.stats().writes_for("pods", "binding").len(), 12);
    assert!(
        report.pod_latency_ms.pod_pending_to_bound.p99 > 0.0,
        "pending -> bound measured from the audit log: {report}"
    );
    let controller_writes = cluster
        .stats()
        .writes()
        .into_iter()
        .filter(|w| w.agent == karpenter_capi::app::USER_AGENT)
        .count();
    assert!(
        controller_writes > 0,
        "the controller's writes are told apart by its user"
    );

    let footprint = cluster
        .with_control_plane(Footprint::of)
        .expect("a real control plane");
    footprint.assert_running();
    drop(kept);
    cluster.stop_processes();
    footprint.assert_gone();
}
