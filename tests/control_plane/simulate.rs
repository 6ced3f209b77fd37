//! `karpenter-capi simulate --control-plane real` as a user runs it, a process of its own: once
//! it has exited, after its report or on SIGTERM while it serves, no process it started is alive
//! and no port they opened listens. Its processes are found while it runs, as its descendants in
//! /proc, with the loopback ports named on their command lines.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use karpenter_capi::controlplane::BINARIES;

use crate::assets::{self, Asset};
use crate::{alive, listening};

pub fn tests() -> Vec<assets::Test> {
    trials![
        nothing_is_left_after_a_simulate_run needs [ControlPlane, Upstream, Helm, Kubectl],
        nothing_is_left_after_simulate_serve_is_stopped
            needs [ControlPlane, Upstream, Helm, Kubectl],
    ]
}

/// Guards hangs only.
const DEADLINE: Duration = Duration::from_secs(300);

/// A small scenario: one Deployment of 4 pods on one MachineDeployment.
const SCENARIO: [&str; 13] = [
    "simulate",
    "--control-plane",
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

fn nothing_is_left_after_a_simulate_run() {
    let mut child = spawn(&[]);
    let (status, started) = watch(&mut child, |_| false);
    assert!(status.success(), "simulate's exit: {status}");
    assert_gone(&started);
}

fn nothing_is_left_after_simulate_serve_is_stopped() {
    // Its kubeconfig goes to a temporary file, not into the checkout.
    let kubeconfig = std::env::temp_dir().join(format!(
        "karpenter-capi-simulate-{}.kubeconfig",
        std::process::id()
    ));
    let kubeconfig_arg = kubeconfig.to_string_lossy().into_owned();
    let mut child = spawn(&["--serve", "--kubeconfig-out", &kubeconfig_arg]);
    let stderr = child.stderr.take().expect("simulate's stderr");
    let (tx, serving) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            say!("{line}");
            if line.starts_with("serving the simulated cluster") {
                let _ = tx.send(());
            }
        }
    });
    let pid = child.id();
    let (status, started) = watch(&mut child, |started| {
        let up = serving.try_recv().is_ok();
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
    // Either simulate's own stop (0) or the control plane's signal watcher, which stops every
    // live control plane and exits as the signal would (143).
    assert!(
        status.success() || status.code() == Some(143),
        "simulate's exit on SIGTERM: {status}"
    );
    assert_gone(&started);
    let _ = std::fs::remove_file(&kubeconfig);
}

/// `karpenter-capi simulate` with the scenario and `extra`, told where every asset is.
fn spawn(extra: &[&str]) -> Child {
    let tools = assets::tool(Asset::Kubectl);
    let tools = tools.parent().expect("the tools' directory");
    Command::new(env!("CARGO_BIN_EXE_karpenter-capi"))
        .args(SCENARIO)
        .args(extra)
        .env("KARPENTER_CAPI_TOOLS", tools)
        .env("KARPENTER_CAPI_UPSTREAM", assets::upstream(""))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // A run to its end is shown only with --nocapture (a failure says how it exited).
        .stderr(if !extra.is_empty() {
            Stdio::piped()
        } else if assets::narrating() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .expect("starting karpenter-capi simulate")
}

/// A process the run started: its binary and the loopback ports its arguments name.
#[derive(Debug)]
struct Started {
    binary: String,
    ports: Vec<u16>,
}

/// Records the child's descendants every 50 ms until it exits, calling `step` each time (it
/// returns true once it has acted, and is not called again).
fn watch(
    child: &mut Child,
    mut step: impl FnMut(&BTreeMap<u32, Started>) -> bool,
) -> (std::process::ExitStatus, BTreeMap<u32, Started>) {
    let began = Instant::now();
    let mut started = BTreeMap::new();
    let mut acted = false;
    loop {
        for pid in descendants(child.id()) {
            started.entry(pid).or_insert_with(|| started_as(pid));
        }
        if !acted {
            acted = step(&started);
        }
        if let Some(status) = child.try_wait().expect("simulate's status") {
            return (status, started);
        }
        if began.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("simulate did not exit within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every live process descending from `root`.
pub(crate) fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        i += 1;
    }
    found.split_off(1)
}

/// The parent pid, from /proc/<pid>/stat (after the command's closing parenthesis).
pub(crate) fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

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
            let value = a.strip_prefix("--secure-port=").or_else(|| {
                a.strip_prefix("--listen-")
                    .and_then(|r| r.rsplit(':').next())
            })?;
            value.parse().ok()
        })
        .collect();
    Started { binary, ports }
}

/// The control plane's four binaries were among what the run started, each listening.
fn assert_running(started: &BTreeMap<u32, Started>) {
    for binary in BINARIES {
        let (pid, s) = started
            .iter()
            .find(|(_, s)| s.binary == binary)
            .unwrap_or_else(|| panic!("{binary} among the run's processes: {started:?}"));
        assert!(alive(*pid, binary), "{binary} ({pid}) runs");
        assert!(!s.ports.is_empty(), "{binary} names its ports: {s:?}");
    }
}

/// Nothing the run started is alive, no port they named listens.
fn assert_gone(started: &BTreeMap<u32, Started>) {
    for binary in BINARIES {
        assert!(
            started.values().any(|s| s.binary == binary),
            "{binary} among the run's processes: {started:?}"
        );
    }
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
