//! CPU time of the controller's threads apart from the simulated cluster's, read per thread from
//! `/proc/self/task/*/stat` (see docs/benchmarks.md, "Controller apart from the simulator").
//!
//! Threads are told apart by name: the simulated cluster's runtime names every thread it starts
//! (workers and blocking pool) `sim`, and the thread that builds it `sim-start`; the one sampler
//! thread every meter of the process shares is `cpu-meter` and counted nowhere; every other
//! thread of the process (the actix System thread, its blocking pool, tokio's
//! `tokio-runtime-worker`s) is the controller's. A
//! thread's CPU is only readable while it lives, so the meter samples every thread every
//! [`INTERVAL`] and keeps each one's latest figure: a thread that ends loses at most its last
//! interval. The process's own total (which the kernel keeps for ended threads too) is reported
//! beside, so what went unattributed shows as the difference.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;

/// How often every thread is sampled.
pub const INTERVAL: Duration = Duration::from_millis(100);

/// Clock ticks per second of the `stat` files' utime and stime: `USER_HZ`, 100 on every Linux
/// architecture this runs on (read without a libc dependency for `sysconf(_SC_CLK_TCK)`).
const TICKS_PER_SECOND: u64 = 100;

/// Thread names of the simulated cluster (`sim` workers and blocking threads, `sim-start`).
pub const SIM_THREAD: &str = "sim";
const METER_THREAD: &str = "cpu-meter";

/// CPU milliseconds spent since the meter started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CpuMs {
    /// Every thread not the simulated cluster's: the actix System and the blocking pools.
    pub controller: f64,
    /// The simulated cluster's runtime threads.
    pub simulated_cluster: f64,
    /// `controller` over the claims the scenario requested (0 without claims).
    pub per_claim_controller: f64,
    /// `simulated_cluster` over the same claims: the stand-in apiserver's and stand-ins' own
    /// cost per claim, beside the controller's.
    pub per_claim_simulated_cluster: f64,
    /// The whole process (ended threads included), so `process - controller -
    /// simulated_cluster` is the meter's own cost plus what ended threads spent in their last
    /// interval.
    pub process: f64,
    /// On a real control plane, the CPU of its processes (etcd, kube-apiserver, kube-scheduler,
    /// kube-controller-manager) since they started; `simulated_cluster` is then the stand-ins'
    /// and the mirror's only. Null on the simulated backend, where the API server is
    /// `simulated_cluster`.
    pub control_plane: Option<f64>,
}

/// CPU milliseconds the processes `pids` have spent (None when any cannot be read).
pub fn processes_ms(pids: &[u32]) -> Option<f64> {
    let mut ticks = 0;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        ticks += parse_stat(&stat)?.1;
    }
    Some(ticks as f64 * 1000.0 / TICKS_PER_SECOND as f64)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Controller,
    Sim,
    Meter,
}

fn side_of(name: &str) -> Side {
    if name.starts_with(SIM_THREAD) {
        Side::Sim
    } else if name == METER_THREAD {
        Side::Meter
    } else {
        Side::Controller
    }
}

/// Each thread's side and the highest ticks it was seen with.
type Latest = HashMap<u32, (Side, u64)>;

/// The process's one sampler thread, shared by every meter alive. A fleet starts a meter per
/// simulated cluster, and a thread per meter, each reading every thread's `stat` 10 times a
/// second, costs clusters x threads reads: 100 clusters (~500 threads) kept ~1.6 cores busy
/// and the load average near 100 with every cluster idle. The thread holds this weakly and ends
/// once the last meter is dropped.
static SAMPLER: Mutex<Weak<Mutex<Latest>>> = Mutex::new(Weak::new());

/// Measures from its start, reading the shared sampler's figures.
pub struct CpuMeter {
    latest: Arc<Mutex<Latest>>,
    /// Ticks each thread known at start had used by then (threads started later: 0).
    baseline: HashMap<u32, u64>,
    process_start: u64,
}

impl CpuMeter {
    /// Start measuring now. Without /proc (not Linux) every figure stays 0.
    pub fn start() -> Self {
        let process_start = process_ticks().unwrap_or(0);
        let latest = shared_sampler();
        sample(&latest);
        // Threads that ended before now are in the baseline too, at their last figure, so
        // they count 0 here.
        let baseline = latest
            .lock()
            .iter()
            .map(|(tid, (_, ticks))| (*tid, *ticks))
            .collect();
        Self {
            latest,
            baseline,
            process_start,
        }
    }

    /// CPU so far, with a fresh sample; `claims` for the per-claim figure.
    pub fn read(&self, claims: usize) -> CpuMs {
        sample(&self.latest);
        let (mut controller, mut sim) = (0u64, 0u64);
        for (tid, (side, ticks)) in self.latest.lock().iter() {
            let spent = ticks.saturating_sub(self.baseline.get(tid).copied().unwrap_or(0));
            match side {
                Side::Controller => controller += spent,
                Side::Sim => sim += spent,
                Side::Meter => {}
            }
        }
        let process = process_ticks()
            .unwrap_or(0)
            .saturating_sub(self.process_start);
        let ms = |ticks: u64| ticks as f64 * 1000.0 / TICKS_PER_SECOND as f64;
        let per_claim = |ms: f64| if claims == 0 { 0.0 } else { ms / claims as f64 };
        CpuMs {
            controller: ms(controller),
            simulated_cluster: ms(sim),
            per_claim_controller: per_claim(ms(controller)),
            per_claim_simulated_cluster: per_claim(ms(sim)),
            process: ms(process),
            control_plane: None,
        }
    }
}

/// The sampler alive, or a new one (its thread started) when no meter is.
fn shared_sampler() -> Arc<Mutex<Latest>> {
    let mut global = SAMPLER.lock();
    if let Some(latest) = global.upgrade() {
        return latest;
    }
    let latest = Arc::new(Mutex::new(Latest::new()));
    *global = Arc::downgrade(&latest);
    let weak = Arc::downgrade(&latest);
    let spawned = std::thread::Builder::new()
        .name(METER_THREAD.into())
        .spawn(move || {
            loop {
                std::thread::sleep(INTERVAL);
                let Some(latest) = weak.upgrade() else { break };
                sample(&latest);
            }
        });
    if let Err(e) = spawned {
        // Without the thread, ended threads are lost but the end sample still counts.
        eprintln!("cpu meter: cannot start its thread ({e}); sampling at the end only");
    }
    latest
}

fn sample(latest: &Mutex<Latest>) {
    let now = threads();
    let mut latest = latest.lock();
    for (tid, name, ticks) in now {
        // A thread keeps the side it was first seen with (a runtime names its threads before
        // they run any task, so the first sample already has the final name).
        let entry = latest.entry(tid).or_insert((side_of(&name), 0));
        entry.1 = entry.1.max(ticks);
    }
}

/// Every live thread of this process: (tid, name, utime + stime ticks).
fn threads() -> Vec<(u32, String, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let tid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let (name, ticks) = parse_stat(&stat)?;
            Some((tid, name, ticks))
        })
        .collect()
}

fn process_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat(&stat).map(|(_, ticks)| ticks)
}

/// The name and utime + stime of a `stat` line: `pid (comm) state ppid ...`, utime and stime
/// being fields 14 and 15. The name may hold spaces and parentheses, so it ends at the last `)`.
fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state), so field n is rest[n - 3].
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_stat_line_with_spaces_in_the_name() {
        let line = "4242 (tokio (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 37 5 0 0 20 0 1 0";
        assert_eq!(parse_stat(line), Some(("tokio (x) y".into(), 42)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn sides_by_thread_name() {
        assert_eq!(side_of("sim"), Side::Sim);
        assert_eq!(side_of("sim-start"), Side::Sim);
        // The API server's workers, whole and as Linux truncates a thread name (15 bytes).
        assert_eq!(side_of(crate::sim::API_SERVER_THREAD), Side::Sim);
        assert_eq!(side_of(&crate::sim::API_SERVER_THREAD[..15]), Side::Sim);
        assert_eq!(side_of("tokio-rt-worker"), Side::Controller);
        assert_eq!(side_of("cpu-meter"), Side::Meter);
        assert_eq!(side_of("tokio-runtime-w"), Side::Controller);
        assert_eq!(side_of("karpenter-capi"), Side::Controller);
    }

    #[test]
    fn counts_this_threads_work() {
        let meter = CpuMeter::start();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(300) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        assert!(meter.read(1).process > 0.0);
    }

    #[test]
    fn meters_share_one_sampler_thread() {
        // A fleet starts a meter per cluster: ten meters must not mean ten sampler threads.
        let meters: Vec<CpuMeter> = (0..10).map(|_| CpuMeter::start()).collect();
        // A sampler whose meters (other tests') were all dropped ends within its interval.
        std::thread::sleep(INTERVAL * 3);
        let samplers = threads()
            .iter()
            .filter(|(_, name, _)| name == METER_THREAD)
            .count();
        assert_eq!(samplers, 1);
        assert!(
            meters
                .iter()
                .all(|m| Arc::ptr_eq(&m.latest, &meters[0].latest))
        );
    }
}
