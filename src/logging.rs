//! Quiet logs: a warning repeated for many objects, and the client library's own errors, as
//! periodic counts rather than a line each.
//!
//! Under a failing API server the kube client logs every failed request at ERROR
//! (`failed with status 503 ...`) and the controller warns once per object it retries
//! (`reconcile failed; retrying nodeclaim=...`): hundreds of lines that all say the same thing
//! and bury the one that matters. [`Quiet`] sits between the filter and the formatter:
//! - the client library's warnings and errors (kube, hyper, tower) are not printed; the
//!   controller retries those requests and reports its own failures. Each window ends with one
//!   line counting them by status or kind.
//! - a warning or error of the controller is printed the first time its message is seen for
//!   an object kind; repeats in the same or the next window are counted, and the window ends
//!   with one line per message and kind: how many, and a few of the objects.
//!
//! With a filter that enables debug anywhere (`LOG_LEVEL=debug`, `kube_client=debug`), every
//! line is printed as it comes: the person asking for debug wants each one.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata};
use tracing_subscriber::layer::{Context, Filter};

/// How often the counts are logged, at most. A minute: the first line of each reason is printed
/// at once, so the counts only need to say how bad it is, and an outage costs a few lines a
/// minute rather than a few every half minute.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// The summaries' own target: never counted, so a summary cannot hide the next one.
const SUMMARY: &str = "karpenter_capi::logging";
/// Objects named in a repeated warning's summary.
const EXAMPLES: usize = 3;
/// Fields that name the object a line is about; the first one present is its kind.
const KINDS: &[&str] = &[
    "nodeclaim",
    "node",
    "machine",
    "machine_deployment",
    "machine_pool",
    "scalable",
    "nodepool",
    "nodeclass",
    "nodeoverlay",
    "capacity_buffer",
    "buffer",
    "pod",
    "watch",
];
/// Targets of the client stack below the controller.
const LIBRARIES: &[&str] = &["kube", "hyper", "tower", "h2", "rustls"];

/// The filter in front of the formatter. Clones share their counts.
#[derive(Clone)]
pub(crate) struct Quiet {
    tally: Arc<Mutex<Tally>>,
    verbose: bool,
}

struct Tally {
    since: Instant,
    /// Windows ended so far: the current window's number.
    window: u64,
    /// Client-library errors in this window, by status or kind.
    api: BTreeMap<String, u64>,
    /// Repeats held back in this window, by message and object kind.
    repeated: BTreeMap<(String, &'static str), Repeat>,
    /// The window each message and kind was last seen in.
    seen: HashMap<(String, &'static str), u64>,
}

#[derive(Default)]
struct Repeat {
    n: u64,
    examples: Vec<String>,
    /// Objects beyond the examples were seen too.
    others: bool,
}

impl Quiet {
    /// `verbose`: print everything (the filter enables debug somewhere).
    pub(crate) fn new(verbose: bool) -> Self {
        Self {
            tally: Arc::new(Mutex::new(Tally {
                since: Instant::now(),
                window: 0,
                api: BTreeMap::new(),
                repeated: BTreeMap::new(),
                seen: HashMap::new(),
            })),
            verbose,
        }
    }

    /// Whether `event` is printed now; when not, it is counted.
    fn admit(&self, event: &Event<'_>) -> bool {
        let meta = event.metadata();
        if self.verbose || *meta.level() > Level::WARN || meta.target() == SUMMARY {
            return true;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut tally = self.tally.lock();
        if library(meta.target()) {
            *tally.api.entry(api_kind(&fields.message)).or_default() += 1;
            return false;
        }
        let window = tally.window;
        let key = (fields.message, fields.kind.unwrap_or(""));
        let recent = tally
            .seen
            .insert(key.clone(), window)
            .is_some_and(|last| last + 1 >= window);
        if !recent {
            return true;
        }
        let repeat = tally.repeated.entry(key).or_default();
        repeat.n += 1;
        if let Some(o) = fields.object
            && !repeat.examples.contains(&o)
        {
            if repeat.examples.len() < EXAMPLES {
                repeat.examples.push(o);
            } else {
                repeat.others = true;
            }
        }
        false
    }

    /// Ends the window: one warning for the client errors and one per repeated message and
    /// kind, each through the current subscriber.
    pub(crate) fn flush(&self) {
        let (secs, api, repeated) = {
            let mut tally = self.tally.lock();
            let secs = tally.since.elapsed().as_secs().max(1);
            tally.since = Instant::now();
            tally.window += 1;
            let window = tally.window;
            // A message quiet for a whole window is printed in full when it comes back.
            tally.seen.retain(|_, last| *last + 1 >= window);
            (
                secs,
                std::mem::take(&mut tally.api),
                std::mem::take(&mut tally.repeated),
            )
        };
        // Logged with the lock released: these events pass through `admit` too.
        if !api.is_empty() {
            let total: u64 = api.values().sum();
            let mut by = String::new();
            for (kind, n) in &api {
                let sep = if by.is_empty() { "" } else { ", " };
                let _ = write!(by, "{sep}{kind}: {n}");
            }
            tracing::warn!(target: SUMMARY, "{total} API errors retried in the last {secs} s ({by}); LOG_LEVEL=kube_client=debug prints each");
        }
        // One line per object kind: the reasons, each with its count and a few of the objects.
        let mut by_kind: BTreeMap<&'static str, String> = BTreeMap::new();
        for ((message, kind), r) in repeated {
            let line = by_kind.entry(kind).or_default();
            let sep = if line.is_empty() { "" } else { ", " };
            let _ = write!(line, "{sep}\"{message}\" {} more", r.n);
            if !r.examples.is_empty() {
                let more = if r.others { ", ..." } else { "" };
                let _ = write!(line, " ({}{more})", r.examples.join(", "));
            }
        }
        for (kind, reasons) in by_kind {
            match kind {
                "" => tracing::warn!(target: SUMMARY, "repeated in the last {secs} s: {reasons}"),
                kind => {
                    tracing::warn!(target: SUMMARY, "repeated in the last {secs} s for {kind}: {reasons}")
                }
            }
        }
    }
}

impl<S> Filter<S> for Quiet {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        self.admit(event)
    }
}

fn library(target: &str) -> bool {
    let krate = target.split("::").next().unwrap_or(target);
    LIBRARIES
        .iter()
        .any(|l| krate == *l || krate.starts_with(&format!("{l}_")))
}

/// `failed with status 503 Service Unavailable` -> `503 Service Unavailable`;
/// `failed with error client error (Connect)` -> `client error (Connect)`; `eof in poll: ...`
/// -> `eof in poll`.
fn api_kind(message: &str) -> String {
    let m = message
        .strip_prefix("failed with status ")
        .or_else(|| message.strip_prefix("failed with error "))
        .unwrap_or(message);
    m.split(':').next().unwrap_or(m).trim().to_string()
}

#[derive(Default)]
struct Fields {
    message: String,
    kind: Option<&'static str>,
    object: Option<String>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: String) {
        if field.name() == "message" {
            self.message = value;
        } else if self.kind.is_none() && KINDS.contains(&field.name()) {
            self.kind = Some(field.name());
            self.object = Some(value);
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}"));
    }
}

static GLOBAL: OnceLock<Quiet> = OnceLock::new();

/// A field's text as the text format prints it, with the client's rendering of an API error's
/// whole `Status` (`ApiError: message: Reason (Status { status: .., code: 503, .. })`, hundreds of
/// characters that repeat the message) cut down to its HTTP code: `(HTTP 503)`. Everything
/// else passes unchanged; the JSON format keeps the full text for machines.
pub(crate) fn shorten(text: &str) -> std::borrow::Cow<'_, str> {
    const START: &str = " (Status { ";
    let Some(at) = text.find(START) else {
        return text.into();
    };
    let Some(end) = closing_paren(text, at + 1) else {
        return text.into();
    };
    let status = &text[at..end];
    let code = status
        .split_once("code: ")
        .map(|(_, rest)| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .filter(|c| !c.is_empty());
    let short = code.map_or_else(|| " (Status)".to_string(), |c| format!(" (HTTP {c})"));
    let rest = shorten(&text[end + 1..]).into_owned();
    format!("{}{short}{rest}", &text[..at]).into()
}

/// The index of the `)` that closes the `(` at `open`, skipping quoted strings.
fn closing_paren(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in text[open..].char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '(' | '{' | '[' if !quoted => depth += 1,
            ')' | '}' | ']' if !quoted => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The text format's field writer: as tracing's default (the message bare, other fields as
/// `name=value`), each value through [`shorten`].
pub(crate) fn write_field(
    w: &mut tracing_subscriber::fmt::format::Writer<'_>,
    field: &Field,
    value: &dyn std::fmt::Debug,
) -> std::fmt::Result {
    let text = format!("{value:?}");
    let text = shorten(&text);
    match field.name() {
        "message" => write!(w, "{text}"),
        name => write!(w, "{name}={text}"),
    }
}

/// Makes `quiet` the process's: a thread ends its window every [`WINDOW`], and [`flush`] ends
/// it early (at exit, so the last counts are not lost).
pub(crate) fn install(quiet: Quiet) {
    if GLOBAL.set(quiet.clone()).is_err() {
        return;
    }
    let ticker = std::thread::Builder::new()
        .name("log-summary".into())
        .spawn(move || {
            loop {
                std::thread::sleep(WINDOW);
                quiet.flush();
            }
        });
    if let Err(e) = ticker {
        tracing::warn!(error = %e, "cannot start the log summary's thread; counts are logged at exit only");
    }
}

/// Logs the counts held back so far (the process is about to exit).
pub fn flush() {
    if let Some(q) = GLOBAL.get() {
        q.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::{Layer as _, fmt::MakeWriter};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    impl Captured {
        fn lines(&self) -> Vec<String> {
            String::from_utf8_lossy(&self.0.lock())
                .lines()
                .map(str::to_string)
                .collect()
        }
    }

    fn logged(verbose: bool, f: impl FnOnce(&Quiet)) -> Vec<String> {
        let out = Captured::default();
        let quiet = Quiet::new(verbose);
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(out.clone())
            .with_ansi(false)
            .without_time()
            .with_filter(quiet.clone());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || f(&quiet));
        out.lines()
    }

    #[test]
    fn an_api_errors_status_is_cut_to_its_code() {
        let long = "get machines m-1: ApiError: injected fault: unavailable: ServiceUnavailable \
            (Status { status: Some(Failure), code: 503, message: \"injected fault: (a) {b}\", \
            metadata: Some(ListMeta { continue_: None }), reason: \"ServiceUnavailable\", \
            details: None }); retrying";
        assert_eq!(
            shorten(long),
            "get machines m-1: ApiError: injected fault: unavailable: ServiceUnavailable \
             (HTTP 503); retrying"
        );
        assert_eq!(shorten("no status here (x)"), "no status here (x)");
        assert_eq!(
            shorten("cut off (Status { code: 5"),
            "cut off (Status { code: 5"
        );
    }

    #[test]
    fn a_warning_repeated_for_many_objects_is_one_line_and_a_count() {
        let lines = logged(false, |q| {
            for i in 0..50 {
                tracing::warn!(nodeclaim = %format!("c-{i}"), machine_deployment = "md", "create timeout");
            }
            tracing::warn!(nodepool = %"default", "create timeout");
            tracing::warn!(nodepool = %"default", "create timeout");
            q.flush();
        });
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(
            lines[0].contains("create timeout nodeclaim=c-0"),
            "{lines:#?}"
        );
        assert!(lines[1].contains("create timeout nodepool=default"));
        assert!(
            lines[2].contains(
                r#"repeated in the last 1 s for nodeclaim: "create timeout" 49 more (c-1, c-2, c-3, ...)"#
            ),
            "{lines:#?}"
        );
        // The one object it was repeated for, without a "..." that suggests more.
        assert!(
            lines[3].contains(r#"for nodepool: "create timeout" 1 more (default)"#),
            "{lines:#?}"
        );
    }

    #[test]
    fn client_errors_are_counted_by_status_not_printed() {
        let lines = logged(false, |q| {
            for _ in 0..3 {
                tracing::error!(target: "kube_client::client::builder", "failed with status 503 Service Unavailable");
            }
            tracing::error!(target: "kube_client::client::builder", "failed with error client error (Connect)");
            tracing::warn!(target: "kube_runtime::watcher", "eof in poll: connection closed");
            tracing::info!("launched");
            q.flush();
            q.flush();
        });
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(lines[0].contains("INFO") && lines[0].contains("launched"));
        assert!(
            lines[1].contains(
                "WARN karpenter_capi::logging: 5 API errors retried in the last 1 s (503 Service Unavailable: 3, client error (Connect): 1, eof in poll: 1)"
            ),
            "{lines:#?}"
        );
    }

    #[test]
    fn a_warning_back_after_a_quiet_window_is_printed_again() {
        let lines = logged(false, |q| {
            tracing::warn!(nodeclaim = %"a", "reconcile failed; retrying");
            q.flush();
            tracing::warn!(nodeclaim = %"b", "reconcile failed; retrying");
            q.flush();
            q.flush();
            tracing::warn!(nodeclaim = %"c", "reconcile failed; retrying");
        });
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert!(
            lines[1].contains(r#"for nodeclaim: "reconcile failed; retrying" 1 more (b)"#),
            "{lines:#?}"
        );
        assert!(lines[2].contains("nodeclaim=c"));
    }

    #[test]
    fn debug_prints_every_line() {
        let lines = logged(true, |q| {
            for i in 0..5 {
                tracing::warn!(nodeclaim = i, "create timeout");
                tracing::error!(target: "kube_client::client::builder", "failed with status 500 Internal Server Error");
            }
            q.flush();
        });
        assert_eq!(lines.len(), 10, "{lines:#?}");
    }
}
