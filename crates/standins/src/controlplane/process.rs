//! The control plane's child processes and their cleanup.
//!
//! Every process is killed and waited for, and the temporary directory removed, when the
//! [`Processes`] holding them is dropped: on `ControlPlane` drop, on a failed start and while a
//! panic unwinds. A process-wide SIGINT/SIGTERM watcher (installed with the first control plane)
//! does the same for every live control plane and then exits, because a signal's default action
//! would end this process without running any destructor and leave etcd and kube-apiserver
//! behind.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Once, Weak};

use parking_lot::Mutex;

use super::Error;

/// One started binary.
#[derive(Debug)]
pub struct Running {
    pub binary: &'static str,
    pub child: Child,
    pub log: PathBuf,
}

/// The processes of one control plane and the directory they run in.
#[derive(Debug)]
pub struct Processes {
    pub running: Vec<Running>,
    pub dir: Option<tempfile::TempDir>,
    /// Set by [`Processes::stop`]: nothing may start after it.
    pub stopped: bool,
}

impl Processes {
    /// Kills every process, waits for each (so none is left a zombie or still holding a port),
    /// then removes the directory. Idempotent.
    pub fn stop(&mut self) {
        self.stopped = true;
        // SIGKILL: the data is thrown away with the directory, so there is nothing for a
        // graceful shutdown to save, and all are signalled before any is waited for.
        for r in &mut self.running {
            // Fails only when the process already exited; the wait below reaps it either way.
            let _ = r.child.kill();
        }
        for mut r in self.running.drain(..).rev() {
            if let Err(e) = r.child.wait() {
                tracing::warn!(binary = r.binary, error = %e, "waiting for a control-plane process");
            }
        }
        if let Some(dir) = self.dir.take()
            && let Err(e) = dir.close()
        {
            tracing::warn!(error = %e, "removing the control plane's directory");
        }
    }

    /// The first process that has exited, with its status.
    pub fn exited(&mut self) -> Option<(&'static str, ExitStatus, PathBuf)> {
        self.running
            .iter_mut()
            .find_map(|r| match r.child.try_wait() {
                Ok(Some(status)) => Some((r.binary, status, r.log.clone())),
                _ => None,
            })
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The control planes alive in this process, for the signal watcher.
static LIVE: Mutex<Vec<Weak<Mutex<Processes>>>> = Mutex::new(Vec::new());

/// Makes `processes` known to the signal watcher (installing it on first use).
pub fn register(processes: &Arc<Mutex<Processes>>) {
    watch_signals();
    let mut live = LIVE.lock();
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(processes));
}

fn stop_all() {
    let live: Vec<_> = LIVE.lock().drain(..).collect();
    for p in live.iter().filter_map(Weak::upgrade) {
        p.lock().stop();
    }
}

fn watch_signals() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The signal streams are made here, before the first process starts, so a Ctrl-C that
        // arrives right after is already ours; a thread of its own waits on them because the
        // caller's runtime (if any) may be busy or gone by then.
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::warn!(error = %e, "no signal watcher: Ctrl-C will leave the control plane running");
                return;
            }
        };
        let signals = {
            let _in_runtime = runtime.enter();
            use tokio::signal::unix::{SignalKind, signal};
            signal(SignalKind::interrupt()).and_then(|i| Ok((i, signal(SignalKind::terminate())?)))
        };
        let (mut interrupt, mut terminate) = match signals {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "no signal watcher: Ctrl-C will leave the control plane running");
                return;
            }
        };
        let spawned = std::thread::Builder::new()
            .name("controlplane-signals".into())
            .spawn(move || {
                let code = runtime.block_on(async {
                    tokio::select! {
                        _ = interrupt.recv() => 130,
                        _ = terminate.recv() => 143,
                    }
                });
                stop_all();
                // The shell's convention for "killed by signal N": 128 + N.
                std::process::exit(code);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no signal watcher: Ctrl-C will leave the control plane running");
        }
    });
}

/// A new temporary directory named `prefix…`, owned by a new (empty) process list registered
/// for signals: from then on, dropping the list (an early return included) stops what started
/// and removes the directory. `what` names the directory in the error.
pub fn in_temp_dir(prefix: &str, what: &str) -> Result<(Arc<Mutex<Processes>>, PathBuf), Error> {
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|source| Error::Io {
            what: format!("making {what}"),
            source,
        })?;
    let dir = tmp.path().to_path_buf();
    let processes = Arc::new(Mutex::new(Processes {
        running: Vec::new(),
        dir: Some(tmp),
        stopped: false,
    }));
    register(&processes);
    Ok((processes, dir))
}

/// Starts `binary` from `assets` with `args`, in `dir`, its output appended to `<dir>/<binary>.log`.
pub fn spawn(
    processes: &Mutex<Processes>,
    assets: &Path,
    dir: &Path,
    binary: &'static str,
    args: &[String],
) -> Result<(), Error> {
    let log = dir.join(format!("{binary}.log"));
    let io = |source| Error::Io {
        what: format!("opening {}", log.display()),
        source,
    };
    let out = File::create(&log).map_err(io)?;
    let err = out.try_clone().map_err(io)?;
    // Held while spawning, so a signal that stops everything cannot slip in between the spawn
    // and the registration and leave this process behind.
    let mut processes = processes.lock();
    if processes.stopped {
        return Err(Error::Stopped);
    }
    let child = Command::new(assets.join(binary))
        .args(args)
        .current_dir(dir)
        // Each binary is configured by flags only; a developer's KUBECONFIG must not leak in.
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|source| Error::Spawn { binary, source })?;
    processes.running.push(Running { binary, child, log });
    Ok(())
}

/// The last `lines` lines of a log file, for error messages.
pub fn tail(log: &Path, lines: usize) -> String {
    match std::fs::read(log) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(no log at {}: {e})", log.display()),
    }
}
