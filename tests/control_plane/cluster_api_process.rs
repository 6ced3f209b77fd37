//! `karpenter-capi simulate --control-plane real --cluster-api real` as a user runs it, a
//! process of its own (as module `simulate` checks it without Cluster API): once it has exited,
//! whether it finished with its report, failed at its `--deadline`, or was stopped by SIGTERM
//! mid-scenario, no process it started (the control plane's four and Cluster API's manager) is
//! alive, no port they opened listens and the manager's directory is gone. Its processes are
//! found while it runs, as its descendants in /proc, with the loopback ports and the directory
//! named on their command lines.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
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
    ]
}

/// Guards hangs only.
const DEADLINE: Duration = Duration::from_secs(300);

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

/// A running `karpenter-capi simulate`, its stdout and stderr read as they come (stderr echoed).
struct Run {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

impl Run {
    /// `karpenter-capi simulate` with the scenario and `--deadline deadline`, told where every
    /// asset is.
    fn spawn(deadline: &str) -> Run {
        let tools = assets::tool(Asset::Kubectl);
        let tools = tools.parent().expect("the tools' directory");
        let mut child = Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
            .args(SCENARIO)
            .args(["--deadline", deadline])
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
        std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("{line}");
                text.push_str(&line);
                text.push('\n');
            }
            let _ = tx.send(text);
        });
        Run {
            child,
            stdout,
            stderr,
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
            if began.elapsed() > DEADLINE {
                let _ = self.child.kill();
                panic!("simulate did not exit within {DEADLINE:?}");
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
