//! The built binary with bad flag values: every one is a usage error (exit code 2) whose message
//! names the flag, never a panic (exit code 101) and never a start-up attempt.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_karpenter-capi");

/// (subcommand, flag, bad value). Each row is run alone, so one flag's message cannot hide
/// another's.
const BAD: &[(&str, &str, &str)] = &[
    // simulate: decimal seconds that Duration::from_secs_f64 panics on, counts out of range
    ("simulate", "--provider-delay", "inf"),
    ("simulate", "--provider-delay", "NaN"),
    ("simulate", "--provider-delay", "-1"),
    ("simulate", "--provider-delay", "1e300"),
    ("simulate", "--provider-delay", "soon"),
    ("simulate", "--jitter", "-0.5"),
    ("simulate", "--jitter", "infinity"),
    ("simulate", "--fail-fraction", "1.5"),
    ("simulate", "--fail-fraction", "-0.1"),
    ("simulate", "--fail-fraction", "NaN"),
    ("simulate", "--create-timeout", "-1"),
    ("simulate", "--create-timeout", "0"),
    ("simulate", "--create-timeout", "inf"),
    ("simulate", "--create-timeout", "1e20"),
    ("simulate", "--deadline", "0"),
    ("simulate", "--deadline", "-5"),
    ("simulate", "--deadline", "18446744073709551615"),
    ("simulate", "--claims", "-1"),
    ("simulate", "--claims", "99999999999999"),
    ("simulate", "--pods", "1e3"),
    ("simulate", "--pods", "100000000"),
    ("simulate", "--deployments", "0"),
    ("simulate", "--machine-deployments", "0"),
    ("simulate", "--machine-deployments", "1000000"),
    ("simulate", "--seed", "-1"),
    ("simulate", "--scenario", "chaos"),
    ("simulate", "--cluster-api-version", "v1alpha3"),
    ("simulate", "--report", "xml"),
    ("simulate", "--log-level", "karpenter_capi=loud"),
    ("simulate", "--log-format", "yaml"),
    // run: durations (Go syntax, no overflow, bounded), ports, client limits, names
    ("run", "--create-timeout", "-1s"),
    ("run", "--create-timeout", "0"),
    ("run", "--create-timeout", "99999999999999999999999h"),
    ("run", "--create-timeout", "876000h"),
    ("run", "--create-timeout", "5 minutes"),
    ("run", "--registration-timeout", "0s"),
    ("run", "--registration-timeout", "1y"),
    ("run", "--unavailable-offering-ttl", "-3m"),
    ("run", "--unavailable-offering-ttl", "9999999999h"),
    ("run", "--batch-idle-duration", "0s"),
    ("run", "--batch-idle-duration", "1.5.5s"),
    ("run", "--batch-max-duration", "0"),
    ("run", "--batch-max-duration", "10"),
    ("run", "--preference-policy", "maybe"),
    ("run", "--min-values-policy", "Lenient"),
    ("run", "--default-termination-grace-period", "-1h"),
    ("run", "--default-termination-grace-period", "forever"),
    ("run", "--metrics-port", "65536"),
    ("run", "--health-probe-port", "-1"),
    ("run", "--health-probe-port", "http"),
    ("run", "--kube-client-qps", "-1"),
    ("run", "--kube-client-qps", "1000000000"),
    ("run", "--kube-client-burst", "0"),
    ("run", "--kube-client-burst", "4294967296"),
    ("run", "--leader-election-name", "Not_A_Name"),
    ("run", "--leader-election-name", ""),
    ("run", "--leader-election-namespace", "kube_system"),
    ("run", "--cluster-api-namespace", "-capi"),
    ("run", "--cluster-name", "my cluster"),
    ("run", "--cluster-api-url", "not a url"),
    ("run", "--cluster-api-url", "ftp://example.com"),
    (
        "run",
        "--cluster-api-certificate-authority-data",
        "not base64!",
    ),
    ("run", "--cluster-api-kubeconfig", "/nonexistent/kubeconfig"),
    ("run", "--kubeconfig", "/nonexistent/kubeconfig"),
    ("run", "--cluster-api-version", "v2"),
    ("run", "--log-level", "=="),
    ("run", "--log-format", "xml"),
    ("crds", "--output-dir", ""),
];

/// A value that is wrongly accepted starts a simulation or a controller: stop it rather than hang.
const LIMIT: Duration = Duration::from_secs(30);

fn run_bounded(mut cmd: Command) -> Option<Output> {
    let mut child = cmd
        // The env twins (LOG_LEVEL, CREATE_TIMEOUT, ...) of the machine must not interfere.
        .env_clear()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the binary");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait for the binary").is_some() {
            return Some(child.wait_with_output().expect("collect output"));
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_flag_values_are_usage_errors_naming_the_flag() {
    let mut failures = Vec::new();
    for (sub, flag, value) in BAD {
        let mut cmd = Command::new(BIN);
        cmd.arg(sub).arg(format!("{flag}={value}"));
        let Some(out) = run_bounded(cmd) else {
            failures.push(format!(
                "{sub} {flag}={value:?}: accepted (still running after {LIMIT:?})"
            ));
            continue;
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        if code != Some(2) || !stderr.contains(flag) || stderr.contains("panicked") {
            failures.push(format!(
                "{sub} {flag}={value:?}: exit {code:?}, stderr: {}",
                stderr.trim()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} bad values were not clean usage errors:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn good_values_still_parse() {
    // `crds` does no I/O without --output-dir, so it proves parsing succeeded end to end.
    let out = Command::new(BIN)
        .args(["crds"])
        .env_clear()
        .output()
        .expect("run the binary");
    assert_eq!(out.status.code(), Some(0));
    let out = Command::new(BIN)
        .args(["simulate", "--help"])
        .env_clear()
        .output()
        .expect("run the binary");
    assert_eq!(out.status.code(), Some(0));
}

/// A `simulate` whose stderr goes to a file or a pipe writes no terminal escape codes, even with
/// the controller's INFO lines asked for; and without `--log-level` it keeps them out (its
/// progress and report are its output).
#[test]
fn redirected_simulate_output_is_plain_and_quiet() {
    let run = |extra: &[&str]| {
        let out = Command::new(BIN)
            .args(["simulate", "--scenario", "launch", "--claims", "3"])
            .args(extra)
            .env_remove("NO_COLOR")
            .env_remove("LOG_LEVEL")
            .stdin(Stdio::null())
            .output()
            .expect("run the binary");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (stdout, stderr) = run(&["--log-level", "info"]);
    assert!(
        stderr.contains(" INFO "),
        "INFO lines were asked for:\n{stderr}"
    );
    for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(!text.contains('\u{1b}'), "escape codes on {name}:\n{text}");
    }
    let (_, quiet) = run(&[]);
    assert!(
        !quiet.contains(" INFO "),
        "no INFO lines by default:\n{quiet}"
    );
    assert!(quiet.contains("simulated cluster up"), "{quiet}");
}
