//! Real kubectl (v1.35, `.ci/install-tools`) against `karpenter-capi simulate --serve`, the way a
//! user drives the served cluster: the built binary serves the cluster with no controller, a
//! second `karpenter-capi run` process (leader election on) provisions against it, and kubectl
//! applies the upstream examples, watches, waits, describes, labels, patches, scales and deletes.
//! Every command either works or fails as it would against kube-apiserver (the gaps are listed in
//! docs/simulated-cluster.md). A second test serves the cluster with the controller in-process,
//! after its report.

use crate::assets;

pub fn tests() -> Vec<assets::Test> {
    trials![
        kubectl_drives_the_served_cluster_and_a_separate_controller_provisions needs [Kubectl, Upstream],
        serve_with_the_controller_reports_then_serves_until_sigterm needs [Kubectl],
        the_readme_flow_works_with_the_repository_example needs [Kubectl],
    ]
}

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_karpenter-capi");
/// Guards hangs only; an idle machine needs a few seconds.
const DEADLINE: Duration = Duration::from_secs(90);

/// A process of ours whose output lines arrive on channels; killed when dropped.
struct Proc {
    child: Child,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
    what: String,
}

fn lines_of(r: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Proc {
    fn start(bin: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(bin)
            .args(args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} {args:?}: {e}", bin.display()));
        let stdout = lines_of(child.stdout.take().expect("stdout"));
        let stderr = lines_of(child.stderr.take().expect("stderr"));
        Self {
            child,
            stdout,
            stderr,
            what: format!("{} {}", bin.display(), args.join(" ")),
        }
    }

    /// Waits for a line on stderr (`err`) or stdout containing `needle`; returns it.
    fn wait_line(&self, err: bool, needle: &str) -> String {
        let rx = if err { &self.stderr } else { &self.stdout };
        let start = Instant::now();
        let mut seen = Vec::new();
        while start.elapsed() < DEADLINE {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => seen.push(line),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(_) => break,
            }
        }
        panic!(
            "{}: no line with {needle:?} within {DEADLINE:?}; saw:\n{}",
            self.what,
            seen.join("\n")
        );
    }

    /// Sends SIGTERM and returns how the process exited.
    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{} did not exit on SIGTERM",
                self.what
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// kubectl with the served cluster's kubeconfig.
struct Kubectl {
    bin: PathBuf,
    kubeconfig: String,
}

impl Kubectl {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        c
    }

    fn output(&self, args: &[&str]) -> Output {
        self.cmd(args)
            .output()
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"))
    }

    /// Runs kubectl and returns its stdout; fails the test with both streams if it failed.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.output(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs kubectl that must fail; returns its stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.output(args);
        assert!(
            !out.status.success(),
            "kubectl {args:?} should have failed:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn create_stdin(&self, yaml: &str) -> String {
        use std::io::Write;
        let mut child = self
            .cmd(&["create", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl create");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(yaml.as_bytes())
            .expect("writing to kubectl");
        let out = child.wait_with_output().expect("kubectl create");
        assert!(
            out.status.success(),
            "kubectl create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `karpenter-capi run` in another process against the served cluster (leader election on,
    /// metrics and probes on free ports), with `extra` flags.
    fn start_controller(&self, extra: &[&str]) -> Proc {
        let mut args = vec![
            "run",
            "--kubeconfig",
            &self.kubeconfig,
            "--metrics-port",
            "0",
            "--health-probe-port",
            "0",
        ];
        args.extend_from_slice(extra);
        Proc::start(Path::new(BIN), &args)
    }

    /// Polls `get` until `done` holds for its stdout (for what another process does).
    fn eventually(&self, args: &[&str], what: &str, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let out = self.output(args);
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() && done(&stdout) {
                return stdout;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{what}: kubectl {args:?} never got there; last:\n{stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The upstream examples: ClusterAPINodeClass, NodePool, a v1beta1 kubemark MachineDeployment
/// with its templates, and a Deployment (0 replicas) of pods for that NodePool.
fn examples() -> PathBuf {
    assets::upstream("examples")
}

/// Starts `simulate --serve` with `extra` flags and waits until it serves.
fn serve(dir: &Path, extra: &[&str]) -> (Proc, String) {
    let kubeconfig = dir.join("simulated.kubeconfig");
    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
    let mut args = vec![
        "simulate",
        "--serve",
        "--kubeconfig-out",
        &kubeconfig,
        "--cluster-api-version",
        "v1beta1",
    ];
    args.extend_from_slice(extra);
    let served = Proc::start(Path::new(BIN), &args);
    served.wait_line(true, "serving the simulated cluster at");
    (served, kubeconfig)
}

fn kubectl_drives_the_served_cluster_and_a_separate_controller_provisions() {
    let bin = assets::tool(assets::Asset::Kubectl);
    let dir = tempfile::tempdir().expect("tempdir");
    let (served, kubeconfig) = serve(dir.path(), &["--no-controller", "--scenario", "none"]);
    let k = Kubectl { bin, kubeconfig };

    // Discovery and raw paths.
    let version = k.ok(&["version", "-o", "json"]);
    assert!(version.contains("\"serverVersion\""), "{version}");
    for raw in ["/api", "/apis", "/version", "/openapi/v3", "/healthz"] {
        k.ok(&["get", "--raw", raw]);
    }
    let err = k.fails(&["get", "--raw", "/openapi/v2"]);
    assert!(err.contains("NotFound"), "{err}");
    let resources = k.ok(&["api-resources", "-o", "name"]);
    for r in [
        "nodeclaims.karpenter.sh",
        "machinedeployments.cluster.x-k8s.io",
        "leases.coordination.k8s.io",
    ] {
        assert!(resources.lines().any(|l| l == r), "{r} in:\n{resources}");
    }

    // `--scenario none`: the simulated infrastructure's MachineDeployments, no NodePool.
    let mds = k.ok(&["get", "machinedeployments", "-o", "name"]);
    assert!(
        mds.contains("machinedeployment.cluster.x-k8s.io/md-small"),
        "{mds}"
    );
    let pools = k.ok(&["get", "nodepools", "-o", "name"]);
    assert!(pools.trim().is_empty(), "no NodePool is seeded: {pools}");

    // Client-side apply of the upstream examples, twice; server-side apply is refused as by a
    // server without it (415), and kubectl says so.
    let ex = examples().to_string_lossy().into_owned();
    let applied = k.ok(&["apply", "-f", &ex]);
    assert_eq!(
        applied.lines().filter(|l| l.ends_with(" created")).count(),
        6,
        "{applied}"
    );
    let again = k.ok(&["apply", "-f", &ex]);
    assert_eq!(
        again.lines().filter(|l| l.ends_with(" unchanged")).count(),
        6,
        "{again}"
    );
    let ssa = k.fails(&["apply", "--server-side", "-f", &ex]);
    assert!(
        ssa.contains("Server-side apply not available on the server")
            && ssa.contains("the body of the request was in an unknown format"),
        "{ssa}"
    );
    let cm = dir.path().join("cm.yaml");
    std::fs::write(
        &cm,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: dry}\n",
    )
    .expect("cm.yaml");
    let dry = k.fails(&["apply", "--dry-run=server", "-f", &cm.to_string_lossy()]);
    assert!(dry.contains("dryRun is not supported"), "{dry}");
    // kubectl sends a delete's dry run in the DeleteOptions body: refused too, nothing deleted.
    let dry = k.fails(&["delete", "namespace", "default", "--dry-run=server"]);
    assert!(dry.contains("dryRun is not supported"), "{dry}");
    k.ok(&["get", "namespace", "default"]);
    // kubectl's imperative generators send protobuf: 415, as for any undecodable media type.
    let pb = k.fails(&["create", "configmap", "pb", "--from-literal=a=b"]);
    assert!(
        pb.contains("accepted media types include: application/json"),
        "{pb}"
    );

    // A second process: the controller, with leader election, against the served cluster.
    let kc = k.kubeconfig.clone();
    let controller = k.start_controller(&["--log-format", "json"]);
    let holder = k.eventually(
        &[
            "get",
            "lease",
            "-n",
            "kube-system",
            "karpenter-capi-leader-election",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
        "the controller takes the leader-election Lease",
        |out| !out.trim().is_empty(),
    );
    assert!(!holder.trim().is_empty());

    // Watch NodeClaims, scale the examples' Deployment: the claims are printed as they come.
    let watch = Proc::start(
        &k.bin,
        &[
            "--kubeconfig",
            &kc,
            "get",
            "nodeclaims",
            "--watch",
            "-o",
            "name",
        ],
    );
    let scaled = k.ok(&["scale", "deployment", "scale-up", "--replicas", "2"]);
    assert!(scaled.contains("scaled"), "{scaled}");
    let first = watch.wait_line(false, "nodeclaim.karpenter.sh/");
    drop(watch);
    let claim = first
        .trim()
        .trim_start_matches("nodeclaim.karpenter.sh/")
        .to_string();

    let waited = k.ok(&[
        "wait",
        "--for=condition=Initialized",
        &format!("nodeclaim/{claim}"),
        "--timeout=90s",
    ]);
    assert!(waited.contains("condition met"), "{waited}");
    k.eventually(
        &[
            "get",
            "pods",
            "-l",
            "app=scale-up",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ],
        "both pods are bound",
        |out| out.split_whitespace().count() == 2,
    );

    // get in every output a user reaches for; tables carry the printer columns of a real cluster.
    let table = k.ok(&["get", "nodeclaims"]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "TYPE", "CAPACITY", "ZONE", "NODE", "READY", "AGE"],
        "{table}"
    );
    let wide = k.ok(&["get", "nodeclaims,machines,nodes,pods", "-o", "wide"]);
    for column in ["NODEPOOL", "PROVIDER ID", "STATUS", "NOMINATED NODE"] {
        assert!(wide.contains(column), "{column} in:\n{wide}");
    }
    assert!(wide.contains(&claim), "{wide}");
    let yaml = k.ok(&["get", "nodeclaim", &claim, "-o", "yaml"]);
    assert!(
        yaml.contains("kind: NodeClaim") && yaml.contains("type: Initialized"),
        "{yaml}"
    );
    let node = k.ok(&[
        "get",
        "nodeclaim",
        &claim,
        "-o",
        "jsonpath={.status.nodeName}",
    ]);
    assert!(!node.is_empty(), "the claim names its Node");

    // describe lists the claim's events, whichever API wrote them (events.k8s.io/v1 here, as
    // the controller writes them; core/v1 Events are the same objects).
    let uid = k.ok(&["get", "nodeclaim", &claim, "-o", "jsonpath={.metadata.uid}"]);
    k.create_stdin(&format!(
        "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata: {{name: kubectl-test, namespace: default}}\n\
         regarding: {{apiVersion: karpenter.sh/v1, kind: NodeClaim, name: {claim}, uid: {uid}}}\n\
         reason: Checked\nnote: seen by the kubectl test\ntype: Normal\naction: Check\n\
         reportingController: kubectl-test\nreportingInstance: kubectl-test-1\n\
         eventTime: \"2026-01-01T00:00:00.000000Z\"\n"
    ));
    let described = k.ok(&["describe", "nodeclaim", &claim]);
    assert!(
        described.contains("Events:") && described.contains("seen by the kubectl test"),
        "{described}"
    );
    let core = k.ok(&[
        "get",
        "events",
        "kubectl-test",
        "-o",
        "jsonpath={.involvedObject.name} {.message}",
    ]);
    assert_eq!(core, format!("{claim} seen by the kubectl test"));

    // label, annotate, and the three patch types: strategic merge on a built-in kind, refused
    // with 415 on a custom resource (kubectl names the type), merge and JSON patch on both.
    assert!(
        k.ok(&["label", "nodeclaim", &claim, "team=a"])
            .contains("labeled")
    );
    assert!(
        k.ok(&["annotate", "node", &node, "note=hi"])
            .contains("annotated")
    );
    k.ok(&[
        "patch",
        "node",
        &node,
        "--type",
        "strategic",
        "-p",
        r#"{"metadata":{"labels":{"smp":"yes"}}}"#,
    ]);
    let smp = k.fails(&[
        "patch",
        "nodeclaim",
        &claim,
        "--type",
        "strategic",
        "-p",
        r#"{"metadata":{"labels":{"smp":"yes"}}}"#,
    ]);
    assert!(
        smp.contains("the body of the request was in an unknown format"),
        "{smp}"
    );
    k.ok(&[
        "patch",
        "nodeclaim",
        &claim,
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"labels":{"merge":"yes"}}}"#,
    ]);
    k.ok(&[
        "patch",
        "nodeclaim",
        &claim,
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/metadata/labels/json","value":"yes"}]"#,
    ]);
    let failed_test = k.fails(&[
        "patch",
        "nodeclaim",
        &claim,
        "--type",
        "json",
        "-p",
        r#"[{"op":"test","path":"/metadata/labels/json","value":"no"}]"#,
    ]);
    assert!(
        failed_test.contains("Invalid") || failed_test.contains("test failed"),
        "{failed_test}"
    );
    let labels = k.ok(&[
        "get",
        "nodeclaim",
        &claim,
        "-o",
        "jsonpath={.metadata.labels}",
    ]);
    for l in ["\"team\":\"a\"", "\"merge\":\"yes\"", "\"json\":\"yes\""] {
        assert!(labels.contains(l), "{l} in {labels}");
    }
    let node_meta = k.ok(&[
        "get",
        "node",
        &node,
        "-o",
        "jsonpath={.metadata.labels.smp} {.metadata.annotations.note}",
    ]);
    assert_eq!(node_meta, "yes hi");

    // scale a MachineDeployment through its scale subresource.
    let scaled = k.ok(&[
        "scale",
        "machinedeployment",
        "km-wl-kubemark-md-0",
        "--replicas",
        "0",
    ]);
    assert!(scaled.contains("scaled"), "{scaled}");

    // delete with a finalizer: the object stays, marked, until the finalizer goes.
    k.create_stdin(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: held, finalizers: [example.com/hold]}\n",
    );
    let deleted = k.ok(&["delete", "configmap", "held", "--wait=false"]);
    assert!(deleted.contains("deleted"), "{deleted}");
    let marked = k.ok(&[
        "get",
        "configmap",
        "held",
        "-o",
        "jsonpath={.metadata.deletionTimestamp}",
    ]);
    assert!(
        !marked.is_empty(),
        "a finalizer keeps the ConfigMap, marked for deletion"
    );
    k.ok(&[
        "patch",
        "configmap",
        "held",
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    let gone = k.fails(&["get", "configmap", "held"]);
    assert!(gone.contains("NotFound"), "{gone}");

    // SIGTERM: both processes exit cleanly; the kubeconfig the user asked for stays.
    assert!(
        controller.terminate().success(),
        "the controller exits 0 on SIGTERM"
    );
    assert!(
        served.terminate().success(),
        "simulate --serve exits 0 on SIGTERM"
    );
    assert!(Path::new(&k.kubeconfig).is_file(), "the kubeconfig is kept");
}

fn serve_with_the_controller_reports_then_serves_until_sigterm() {
    let bin = assets::tool(assets::Asset::Kubectl);
    let dir = tempfile::tempdir().expect("tempdir");
    // A port that was free a moment ago: --port makes the kubeconfig name it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let (served, kubeconfig) = serve(
        dir.path(),
        &[
            "--scenario",
            "launch",
            "--claims",
            "3",
            "--machine-deployments",
            "2",
            "--report",
            "json",
            "--port",
            &port,
        ],
    );
    let text = std::fs::read_to_string(&kubeconfig).expect("the kubeconfig");
    assert!(
        text.contains(&format!("server: http://127.0.0.1:{port}")),
        "{text}"
    );
    let report = served.wait_line(false, "\"invariants_ok\"");
    assert!(report.contains("\"invariants_ok\":true"), "{report}");
    let k = Kubectl { bin, kubeconfig };
    // The claims the scenario launched are still there, and the in-process controller still acts.
    let claims = k.ok(&["get", "nodeclaims", "-o", "name"]);
    assert_eq!(claims.lines().count(), 3, "{claims}");
    k.ok(&[
        "wait",
        "--for=condition=Initialized",
        "nodeclaim",
        "--all",
        "--timeout=60s",
    ]);
    assert!(served.terminate().success(), "exit 0 on SIGTERM");
}

/// The README's "A simulated cluster you can point anything at", command for command: serve the
/// cluster alone, apply `examples/nodepool.yaml`, run the controller in another process, scale
/// the example's Deployment and see its pods land on new nodes.
fn the_readme_flow_works_with_the_repository_example() {
    let bin = assets::tool(assets::Asset::Kubectl);
    let dir = tempfile::tempdir().expect("tempdir");
    let (_served, kubeconfig) = serve(dir.path(), &["--no-controller", "--scenario", "none"]);
    let k = Kubectl { bin, kubeconfig };
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/nodepool.yaml");
    let applied = k.ok(&["apply", "-f", &example.to_string_lossy()]);
    assert_eq!(
        applied.lines().filter(|l| l.ends_with(" created")).count(),
        3,
        "{applied}"
    );
    let _controller = k.start_controller(&[]);
    k.eventually(
        &[
            "get",
            "nodepool",
            "default",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        "the example NodePool becomes Ready",
        |out| out.trim() == "True",
    );
    k.ok(&["scale", "deployment", "inflate", "--replicas", "3"]);
    k.eventually(
        &[
            "get",
            "pods",
            "-l",
            "app=inflate",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ],
        "the example's pods are bound to new nodes",
        |out| out.split_whitespace().count() == 3,
    );
}
