//! The progress line `simulate` prints on stderr while it waits: every second on a terminal,
//! where a person watches it, and every ten seconds when stderr is redirected, where it would
//! only fill a log.

use std::cell::Cell;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Whether `simulate` narrates on stderr: what it creates and waits for, and its progress line.
/// On unless turned off; the report, warnings and errors print either way.
static NARRATING: AtomicBool = AtomicBool::new(true);

/// Turns `simulate`'s narration on or off for the whole process. For a test harness that
/// cannot capture what a passing test prints (libtest-mimic), so that it prints nothing.
pub fn set_narrating(on: bool) {
    NARRATING.store(on, Ordering::Relaxed);
}

pub(crate) fn narrating() -> bool {
    NARRATING.load(Ordering::Relaxed)
}

pub struct Progress {
    start: Instant,
    every: Duration,
    last: Cell<Option<Instant>>,
}

impl Progress {
    pub fn new() -> Self {
        Self::every(if std::io::stderr().is_terminal() {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(10)
        })
    }

    pub fn every(every: Duration) -> Self {
        Self {
            start: Instant::now(),
            every,
            last: Cell::new(None),
        }
    }

    /// Whether a line is due; the first one is due a full interval after the start.
    pub fn due(&self) -> bool {
        self.last.get().unwrap_or(self.start).elapsed() >= self.every
    }

    /// Prints `line` with the time since the start.
    pub fn print(&self, line: &str) {
        self.last.set(Some(Instant::now()));
        say!("  {:>5.1}s  {line}", self.start.elapsed().as_secs_f64());
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_due_once_per_interval() {
        let p = Progress::every(Duration::from_millis(30));
        assert!(!p.due());
        std::thread::sleep(Duration::from_millis(35));
        assert!(p.due());
        p.print("one");
        assert!(!p.due());
    }
}
