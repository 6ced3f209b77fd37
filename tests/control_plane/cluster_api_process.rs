//! `karpenter-capi simulate --control-plane real --cluster-api real` as a user runs it, a
//! process of its own (as module `simulate` checks it without Cluster API): once it has exited,
//! whether it finished with its report, failed at its `--deadline`, or was stopped by SIGTERM
//! mid-scenario, no process it started (the control plane's four and Cluster API's manager) is
//! alive, no port they opened listens and the manager's directory is gone. Its processes are
//! found while it runs, as its descendants in /proc, with the loopback ports and the directory
//! named on their command lines. And `simulate --serve` as a user drives it with the real
//! kubectl and `karpenter-capi init`: a Deployment gets nodes whose Machines Cluster API's
//! controllers made, each with its NodeClaim, then is emptied and its nodes consolidated away,
//! and after SIGTERM nothing is left.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use karpenter_capi::controlplane::BINARIES;
use karpenter_capi::controlplane::cluster_api::{RELEASE_V1BETA2, root_from_env};
use serde_json::Value;

use crate::simulate::descendants;

use crate::assets::{self, Asset};
use crate::{alive, listening};

pub fn tests() -> Vec<assets::Test> {
    trials![
        nothing_is_left_after_a_simulate_run_on_real_cluster_api
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        nothing_is_left_after_a_simulate_run_on_real_cluster_api_fails_at_its_deadline
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        nothing_is_left_after_a_simulate_run_on_real_cluster_api_is_stopped_by_sigterm
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
        a_user_provisions_and_empties_nodes_with_kubectl_on_simulate_serve_on_real_cluster_api
            needs [ControlPlane, Upstream, Helm, Kubectl, ClusterApi],
    ]
}

/// Guards hangs only.
const DEADLINE: Duration = Duration::from_secs(300);

/// Guards hangs only, for the served run a user drives: start, a launch, a consolidation.
const SERVE_DEADLINE: Duration = Duration::from_secs(600);

/// A small scenario: one Deployment of 4 pods on one MachineDeployment, on Cluster API v1.14.2.
const SCENARIO: [&str; 15] = [
    "simulate",
    "--control-plane",
    "real",
    "--cluster-api",
    "real",
    "--scenario",
    "pods",
    "--pods",
    "4",
    "--deployments",
    "1",
    "--machine-deployments",
    "1",
    "--report",
    "json",
];

/// The scenario's `--deadline` where it is meant to finish.
const ENOUGH: &str = "240s";

/// The manager's binary name (`bin/manager` of the installed release).
const MANAGER: &str = "manager";

/// The run ends with its report, which names real Cluster API; nothing is left.
fn nothing_is_left_after_a_simulate_run_on_real_cluster_api() {
    let mut run = Run::spawn(ENOUGH);
    let (status, started) = run.watch(|_| false);
    let (stdout, stderr) = run.output();
    assert!(status.success(), "simulate's exit: {status}\n{stderr}");
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("simulate's JSON report ({e}): {stdout}"));
    assert_eq!(
        report.pointer("/backend/cluster_api"),
        Some(&serde_json::json!({"kind": "real", "version": RELEASE_V1BETA2})),
        "{report}"
    );
    assert_eq!(report["pods"]["bound"], 4, "{report}");
    assert_gone(&started);
}

/// A `--deadline` too short for the pods to bind: the run fails (exit 1, saying so) after Cluster
/// API's manager started, and nothing is left.
fn nothing_is_left_after_a_simulate_run_on_real_cluster_api_fails_at_its_deadline() {
    let mut run = Run::spawn("1s");
    let (status, started) = run.watch(|_| false);
    let (_, stderr) = run.output();
    assert_eq!(
        status.code(),
        Some(1),
        "simulate's exit: {status}\n{stderr}"
    );
    assert!(
        stderr.contains("did not settle within 1s"),
        "the deadline named: {stderr}"
    );
    assert_gone(&started);
}

/// SIGTERM once Cluster API's manager and the control plane's four run, before the scenario's
/// end: no report, and nothing is left.
fn nothing_is_left_after_a_simulate_run_on_real_cluster_api_is_stopped_by_sigterm() {
    let mut run = Run::spawn(ENOUGH);
    let pid = run.child.id();
    let (status, started) = run.watch(|started| {
        let up = BINARIES
            .iter()
            .copied()
            .chain([MANAGER])
            .all(|b| started.values().any(|s| s.binary == b));
        if up {
            assert_running(started);
            let sent = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .expect("kill(1)");
            assert!(sent.success(), "kill -TERM: {sent}");
        }
        up
    });
    let (stdout, stderr) = run.output();
    // Simulate's own stop (the scenario is not waited for: exit 0, no report) or the control
    // plane's signal watcher, which stops every live process and exits as the signal would (143).
    assert!(
        status.success() || status.code() == Some(143),
        "simulate's exit on SIGTERM: {status}\n{stderr}"
    );
    assert!(stdout.trim().is_empty(), "a report after SIGTERM: {stdout}");
    assert_gone(&started);
}

/// `simulate --serve` on real Cluster API as a user drives it, with the real kubectl and
/// `karpenter-capi init`: the NodeClass and NodePool `init` proposes are applied, a Deployment
/// whose pods need new nodes gets them (every pod Running on a Node whose Machine Cluster API's
/// MachineSet controller made, from a MachineSet its MachineDeployment controller made, each
/// with its NodeClaim), and scaled to 0 its nodes are consolidated away, by the controller the
/// process serves. Then SIGTERM: nothing is left.
fn a_user_provisions_and_empties_nodes_with_kubectl_on_simulate_serve_on_real_cluster_api() {
    // Its kubeconfig goes to a temporary file, not into the checkout.
    let kubeconfig = std::env::temp_dir().join(format!(
        "karpenter-capi-serve-cluster-api-{}.kubeconfig",
        std::process::id()
    ));
    let kubeconfig_arg = kubeconfig.to_string_lossy().into_owned();
    let mut run = Run::spawn_args(
        &[
            "simulate",
            "--control-plane",
            "real",
            "--cluster-api",
            "real",
            "--scenario",
            "none",
            "--machine-deployments",
            "1",
            "--serve",
            "--kubeconfig-out",
            &kubeconfig_arg,
        ],
        SERVE_DEADLINE,
    );
    let pid = run.child.id();
    let serving = std::mem::replace(&mut run.serving, mpsc::channel().1);
    // The user's session runs on a thread of its own while `watch` records the processes; its
    // panic is kept and raised after the process was stopped, so a failure leaves nothing.
    let mut user: Option<std::thread::JoinHandle<()>> = None;
    let mut outcome = None;
    let (status, started) = run.watch(|started| match &user {
        None if serving.try_recv().is_ok() => {
            assert_running(started);
            let kubeconfig = kubeconfig.clone();
            user = Some(std::thread::spawn(move || user_session(&kubeconfig)));
            false
        }
        Some(session) if session.is_finished() => {
            outcome = user.take().map(std::thread::JoinHandle::join);
            let sent = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .expect("kill(1)");
            assert!(sent.success(), "kill -TERM: {sent}");
            true
        }
        _ => false,
    });
    let (_, stderr) = run.output();
    let _ = std::fs::remove_file(&kubeconfig);
    match outcome {
        Some(Ok(())) => {}
        Some(Err(panic)) => std::panic::resume_unwind(panic),
        None => panic!("simulate exited ({status}) before the user's session ended\n{stderr}"),
    }
    // Simulate's own stop (0) or the control plane's signal watcher (143).
    assert!(
        status.success() || status.code() == Some(143),
        "simulate's exit on SIGTERM: {status}\n{stderr}"
    );
    assert_gone(&started);
}

/// The Deployment the user applies: 3 pods of 1 CPU, more than one 2-CPU node of the simulated
/// MachineDeployment holds, and none exists before.
const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: app
        image: registry.k8s.io/pause:3.10
        resources: {requests: {cpu: "1", memory: 1Gi}}
"#;

/// What a user does against the served cluster, through `karpenter-capi init` and kubectl.
fn user_session(kubeconfig: &Path) {
    let proposal = Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
        .args(["init", "-o", "yaml", "--kubeconfig"])
        .arg(kubeconfig)
        .output()
        .expect("running karpenter-capi init");
    assert!(
        proposal.status.success(),
        "init: {}",
        String::from_utf8_lossy(&proposal.stderr)
    );
    let proposal = String::from_utf8_lossy(&proposal.stdout).into_owned();
    assert!(
        proposal.contains("kind: NodePool"),
        "init's YAML: {proposal}"
    );
    kubectl_in(kubeconfig, &["apply", "-f", "-"], &proposal);
    kubectl_in(kubeconfig, &["apply", "-f", "-"], WEB);

    let pods = poll(kubeconfig, "every web pod Running on a Node", |k| {
        let pods = get_json(k, &["pods", "-n", "default", "-l", "app=web"]);
        let pods = pods["items"].as_array().cloned().unwrap_or_default();
        let placed: Vec<(String, String)> = pods
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .filter_map(|p| {
                Some((
                    p["metadata"]["name"].as_str()?.to_string(),
                    p["spec"]["nodeName"].as_str()?.to_string(),
                ))
            })
            .collect();
        (pods.len() == 3 && placed.len() == 3).then_some(placed)
    });
    let nodes: std::collections::BTreeSet<&str> = pods.iter().map(|(_, n)| n.as_str()).collect();
    assert!(nodes.len() >= 2, "3 pods of 1 CPU on 2-CPU nodes: {pods:?}");

    // Cluster API's Machine controller sets `status.nodeRef` on its own schedule (it requeues
    // while the Node is not in its cache yet), so a pod can run on a Node before its Machine
    // names it.
    let machines = poll(
        kubeconfig,
        "every pod's Node named by a Machine's nodeRef",
        |k| {
            let machines = get_json(
                k,
                &["machines.cluster.x-k8s.io", "-A", "--show-managed-fields"],
            );
            nodes
                .iter()
                .all(|node| items(&machines).any(|m| m["status"]["nodeRef"]["name"] == *node))
                .then_some(machines)
        },
    );
    let sets = get_json(
        kubeconfig,
        &[
            "machinesets.cluster.x-k8s.io",
            "-A",
            "--show-managed-fields",
        ],
    );
    let claims = get_json(kubeconfig, &["nodeclaims"]);
    let listed = get_json(kubeconfig, &["nodes"]);
    for node in &nodes {
        assert!(
            items(&listed).any(|n| n["metadata"]["name"] == *node),
            "Node {node} in {listed:#}"
        );
        let machine = items(&machines)
            .find(|m| m["status"]["nodeRef"]["name"] == *node)
            .unwrap_or_else(|| panic!("a Machine whose nodeRef is {node}: {machines:#}"));
        let machine_name = machine["metadata"]["name"].as_str().expect("a name");
        let ns = machine["metadata"]["namespace"]
            .as_str()
            .expect("a namespace");
        let owner = controller_of(machine)
            .unwrap_or_else(|| panic!("Machine {machine_name} has no controller: {machine:#}"));
        assert_eq!(owner["kind"], "MachineSet", "{machine:#}");
        // Cluster API's MachineSet controller creates its Machines by server-side apply under
        // this field owner; the simulator's stand-in never writes as it.
        assert!(
            applied_by(machine, "capi-machineset"),
            "Machine {machine_name} not made by Cluster API's MachineSet controller: {machine:#}"
        );
        let set = items(&sets)
            .find(|s| s["metadata"]["namespace"] == ns && s["metadata"]["name"] == owner["name"])
            .unwrap_or_else(|| panic!("MachineSet {} of {machine_name}: {sets:#}", owner["name"]));
        assert_eq!(
            controller_of(set).map(|o| o["kind"].clone()),
            Some(Value::from("MachineDeployment")),
            "{set:#}"
        );
        assert!(
            applied_by(set, "capi-machinedeployment"),
            "MachineSet not made by Cluster API's MachineDeployment controller: {set:#}"
        );
        let want = format!("{ns}/{machine_name}");
        let claim = items(&claims)
            .find(|c| c["metadata"]["annotations"]["cluster.x-k8s.io/machine"] == want.as_str())
            .unwrap_or_else(|| panic!("a NodeClaim for Machine {want}: {claims:#}"));
        assert_eq!(claim["status"]["nodeName"], *node, "{claim:#}");
    }

    // Emptied, the nodes are consolidated away (the NodePool `init` proposes consolidates
    // empty nodes at once), their Machines deleted through Cluster API.
    kubectl_in(
        kubeconfig,
        &[
            "scale",
            "deployment",
            "web",
            "-n",
            "default",
            "--replicas=0",
        ],
        "",
    );
    poll(kubeconfig, "no claim, Machine or Node left", |k| {
        let left: usize = [
            vec!["nodeclaims"],
            vec!["machines.cluster.x-k8s.io", "-A"],
            vec!["nodes"],
        ]
        .iter()
        .map(|what| items(&get_json(k, what)).count())
        .sum();
        (left == 0).then_some(())
    });
    // The controller still serves: its NodePool is Ready.
    let pool = get_json(kubeconfig, &["nodepool", "default"]);
    assert!(
        pool["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True"),
        "{pool:#}"
    );
}

/// `kubectl ARGS` against the served cluster with `input` on its stdin; its stdout, or the
/// session fails.
fn kubectl_in(kubeconfig: &Path, args: &[&str], input: &str) -> String {
    let mut child = Command::new(assets::tool(Asset::Kubectl))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running kubectl");
    child
        .stdin
        .take()
        .expect("kubectl's stdin")
        .write_all(input.as_bytes())
        .expect("writing to kubectl");
    let out = child.wait_with_output().expect("kubectl's output");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl get WHAT -o json`, parsed.
fn get_json(kubeconfig: &Path, what: &[&str]) -> Value {
    let mut args = vec!["get"];
    args.extend(what);
    args.extend(["-o", "json"]);
    let out = kubectl_in(kubeconfig, &args, "");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {args:?}'s JSON ({e}): {out}"))
}

fn items(list: &Value) -> impl Iterator<Item = &Value> {
    list["items"].as_array().into_iter().flatten()
}

/// The object's controlling owner reference.
fn controller_of(o: &Value) -> Option<&Value> {
    o["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)
}

/// Whether field owner `manager` applied (server-side) fields of `o`.
fn applied_by(o: &Value, manager: &str) -> bool {
    o["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|f| f["manager"] == manager && f["operation"] == "Apply")
}

/// Polls `check` every second until it returns `Some`, failing with `what` after 240 s.
fn poll<T>(kubeconfig: &Path, what: &str, mut check: impl FnMut(&Path) -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if let Some(v) = check(kubeconfig) {
            return v;
        }
        if Instant::now() > deadline {
            let state = kubectl_in(
                kubeconfig,
                &[
                    "get",
                    "pods,nodeclaims,machines.cluster.x-k8s.io,nodes",
                    "-A",
                    "-o",
                    "wide",
                ],
                "",
            );
            panic!("timed out waiting for {what}:\n{state}");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A running `karpenter-capi simulate`, its stdout and stderr read as they come (stderr echoed).
struct Run {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    /// Sent once, when it says it serves (`--serve`).
    serving: mpsc::Receiver<()>,
    /// How long [`Run::watch`] waits for it to exit.
    deadline: Duration,
}

impl Run {
    /// `karpenter-capi simulate` with the scenario and `--deadline deadline`, told where every
    /// asset is.
    fn spawn(deadline: &str) -> Run {
        let mut args = SCENARIO.to_vec();
        args.extend(["--deadline", deadline]);
        Run::spawn_args(&args, DEADLINE)
    }

    /// `karpenter-capi ARGS`, told where every asset is, watched for at most `deadline`.
    fn spawn_args(args: &[&str], deadline: Duration) -> Run {
        let tools = assets::tool(Asset::Kubectl);
        let tools = tools.parent().expect("the tools' directory");
        let mut child = Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
            .args(args)
            .env("KARPENTER_CAPI_TOOLS", tools)
            .env("KARPENTER_CAPI_UPSTREAM", assets::upstream(""))
            .env(
                karpenter_capi::controlplane::cluster_api::VARIABLE,
                root_from_env(),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting karpenter-capi simulate");
        let mut out = child.stdout.take().expect("simulate's stdout");
        let (tx, stdout) = mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = out.read_to_string(&mut text);
            let _ = tx.send(text);
        });
        let err = child.stderr.take().expect("simulate's stderr");
        let (tx, stderr) = mpsc::channel();
        let (up, serving) = mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                say!("{line}");
                if line.starts_with("serving the simulated cluster") {
                    let _ = up.send(());
                }
                text.push_str(&line);
                text.push('\n');
            }
            let _ = tx.send(text);
        });
        Run {
            child,
            stdout,
            stderr,
            serving,
            deadline,
        }
    }

    /// Records the child's descendants every 50 ms until it exits, calling `step` each time
    /// (it returns true once it has acted, and is not called again).
    fn watch(
        &mut self,
        mut step: impl FnMut(&BTreeMap<u32, Started>) -> bool,
    ) -> (ExitStatus, BTreeMap<u32, Started>) {
        let began = Instant::now();
        let mut started = BTreeMap::new();
        let mut acted = false;
        loop {
            for pid in descendants(self.child.id()) {
                // A child seen between its fork and its exec shows no command line of its own
                // yet (empty, or simulate's): read it again until it does.
                let known = started.get(&pid).is_some_and(|s: &Started| {
                    !s.binary.is_empty() && s.binary != "karpenter-capi"
                });
                if !known {
                    started.insert(pid, started_as(pid));
                }
            }
            if !acted {
                acted = step(&started);
            }
            if let Some(status) = self.child.try_wait().expect("simulate's status") {
                return (status, started);
            }
            if began.elapsed() > self.deadline {
                let _ = self.child.kill();
                panic!("simulate did not exit within {:?}", self.deadline);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the run wrote to stdout and stderr (once it has exited).
    fn output(&self) -> (String, String) {
        let wait = Duration::from_secs(30);
        (
            self.stdout.recv_timeout(wait).unwrap_or_default(),
            self.stderr.recv_timeout(wait).unwrap_or_default(),
        )
    }
}

/// A process the run started: its binary, the loopback ports its arguments name, and the
/// directory it works in where its arguments name one (the manager's).
#[derive(Debug)]
struct Started {
    binary: String,
    ports: Vec<u16>,
    dir: Option<PathBuf>,
}

/// The process as its command line names it: the control plane's `--secure-port=` and
/// `--listen-*=` URLs, the manager's `--webhook-port=`, `--health-addr=` and
/// `--diagnostics-address=`, and the manager's directory (the parent of `--webhook-cert-dir=`).
fn started_as(pid: u32) -> Started {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let argv: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let binary = argv
        .first()
        .and_then(|a| a.rsplit('/').next())
        .unwrap_or_default()
        .to_string();
    let ports = argv
        .iter()
        .filter_map(|a| {
            let value = a
                .strip_prefix("--secure-port=")
                .or_else(|| a.strip_prefix("--webhook-port="))
                .or_else(|| {
                    a.strip_prefix("--listen-")
                        .or_else(|| a.strip_prefix("--health-addr="))
                        .or_else(|| a.strip_prefix("--diagnostics-address="))
                        .and_then(|r| r.rsplit(':').next())
                })?;
            value.parse().ok()
        })
        .collect();
    let dir = argv.iter().find_map(|a| {
        let certs = a.strip_prefix("--webhook-cert-dir=")?;
        PathBuf::from(certs).parent().map(PathBuf::from)
    });
    Started { binary, ports, dir }
}

/// The control plane's four binaries and Cluster API's manager were among what the run
/// started, each listening.
fn assert_running(started: &BTreeMap<u32, Started>) {
    for binary in BINARIES.iter().copied().chain([MANAGER]) {
        let (pid, s) = started
            .iter()
            .find(|(_, s)| s.binary == binary)
            .unwrap_or_else(|| panic!("{binary} among the run's processes: {started:?}"));
        assert!(alive(*pid, binary), "{binary} ({pid}) runs");
        assert!(!s.ports.is_empty(), "{binary} names its ports: {s:?}");
    }
}

/// The control plane's four binaries and Cluster API's manager (with its three ports and its
/// directory) were among what the run started; none of them is alive, no port they named
/// listens, and the manager's directory is gone.
fn assert_gone(started: &BTreeMap<u32, Started>) {
    for binary in BINARIES.iter().copied().chain([MANAGER]) {
        assert!(
            started.values().any(|s| s.binary == binary),
            "{binary} among the run's processes: {started:?}"
        );
    }
    let manager = started
        .values()
        .find(|s| s.binary == MANAGER)
        .expect("the manager");
    assert_eq!(manager.ports.len(), 3, "the manager's ports: {manager:?}");
    let dir = manager.dir.as_ref().expect("the manager's directory");
    assert!(!dir.exists(), "{} still exists", dir.display());
    for (pid, s) in started {
        assert!(!alive(*pid, &s.binary), "{} ({pid}) still runs", s.binary);
        for port in &s.ports {
            assert!(
                !listening(*port),
                "{}'s port {port} still listens",
                s.binary
            );
        }
    }
}
