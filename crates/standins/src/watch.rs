//! Watch streams: newline-delimited JSON WatchEvents over a chunked response. A watch replays
//! what it must (a snapshot or history after a resourceVersion), then follows the broadcast of
//! live changes. A watch that falls behind the broadcast buffer is closed (the client re-lists),
//! so a slow watcher never holds up a writer.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::errors::ApiError;
use super::registry::ResourceDef;
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{EventKind, Store, StoredEvent, WatchStart};

/// What a client asked of a watch.
pub struct WatchRequest {
    pub def: ResourceDef,
    pub version: String,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// None: start from a snapshot of current objects ("" or "0").
    pub from: Option<u64>,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Option<Duration>,
    pub bookmark_interval: Duration,
    /// Send each object as a one-row Table (`kubectl get -w`).
    pub table: Option<super::table::Include>,
    /// Where an injected lag comes from (`Faults::set_watch_delay`).
    pub lag: Lag,
    /// A fault: answer as if `from` had been compacted away (410 in the stream).
    pub expired: bool,
}

/// A watch's source of injected lag: looked up per event, so a lag switched on reaches watches
/// already open (as the informers of a running controller-manager).
pub struct Lag {
    pub faults: Arc<super::faults::Faults>,
    /// The watching client's User-Agent (faults can be scoped to one client).
    pub agent: String,
}

/// Starts a watch and returns the channel its body is read from. An expired resourceVersion is
/// reported in-stream as an ERROR event with a 410 Status, as kube-apiserver does.
pub fn start(
    store: &Arc<Store>,
    req: WatchRequest,
    cuts: tokio::sync::watch::Receiver<u64>,
) -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let started = if req.expired {
        Err(ApiError::expired(format!(
            "too old resource version: {} (injected fault)",
            req.from.unwrap_or_default()
        )))
    } else {
        let inner = store.lock();
        inner.watch_from(&req.def, req.namespace.as_deref(), req.from, || {
            store.subscribe()
        })
    };
    tokio::spawn(async move {
        match started {
            Ok((start, live, rv)) => run(req, start, live, rv, tx, cuts).await,
            Err(err) => {
                let _ = tx
                    .send(line(&json!({"type": "ERROR", "object": err.to_status()})))
                    .await;
            }
        }
    });
    rx
}

async fn run(
    req: WatchRequest,
    start: WatchStart,
    mut live: broadcast::Receiver<Arc<StoredEvent>>,
    mut last_rv: u64,
    tx: mpsc::Sender<Bytes>,
    mut cuts: tokio::sync::watch::Receiver<u64>,
) {
    let key = req.def.storage_key();
    let initial: Vec<Bytes> = match start {
        WatchStart::Snapshot(objects) => objects
            .iter()
            .filter(|o| req.labels.matches_object(o) && req.fields.matches(o))
            .map(|o| event_line(&req, "ADDED", o))
            .collect(),
        WatchStart::History(events) => events.iter().filter_map(|e| translate(&req, e)).collect(),
    };
    for l in initial {
        if tx.send(l).await.is_err() {
            return;
        }
    }
    if req.bookmarks
        && tx
            .send(bookmark(&req, last_rv, req.send_initial_events))
            .await
            .is_err()
    {
        return;
    }
    cuts.mark_unchanged();
    let deadline = req.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut ticker = tokio::time::interval(req.bookmark_interval.max(Duration::from_millis(10)));
    ticker.tick().await;
    loop {
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        // Biased: a cut or a hang-up that already happened wins over events committed after it.
        tokio::select! {
            biased;
            _ = cuts.changed() => return,
            _ = tx.closed() => return,
            _ = timeout => return,
            ev = live.recv() => match ev {
                Ok(ev) => {
                    if ev.rv <= last_rv {
                        continue;
                    }
                    last_rv = ev.rv;
                    if ev.key != key {
                        continue;
                    }
                    let delay = req.lag.faults.watch_delay(&req.def.plural, &req.lag.agent);
                    if !delay.is_zero() {
                        tokio::time::sleep_until(ev.committed + delay).await;
                    }
                    if let Some(l) = translate(&req, &ev)
                        && tx.send(l).await.is_err()
                    {
                        return;
                    }
                }
                // Lagged or closed: end the stream so the client re-lists.
                Err(_) => return,
            },
            _ = ticker.tick(), if req.bookmarks => {
                if tx.send(bookmark(&req, last_rv, false)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The event a watcher sees for a stored change, honouring namespace and selectors (an object
/// leaving the selection is DELETED for this watcher, one entering it ADDED).
fn translate(req: &WatchRequest, ev: &StoredEvent) -> Option<Bytes> {
    if req.namespace.as_deref().is_some_and(|n| n != ev.namespace) {
        return None;
    }
    let selects = |o: &Value| req.labels.matches_object(o) && req.fields.matches(o);
    let now = selects(&ev.object);
    let kind = match ev.kind {
        EventKind::Added => now.then_some("ADDED"),
        EventKind::Deleted => now.then_some("DELETED"),
        EventKind::Modified => {
            let before = ev.prev.as_deref().is_some_and(selects);
            match (before, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            }
        }
    }?;
    // A Table is rendered for one `kubectl get -w`; plain events are the same bytes for every
    // watcher of this version, so they are serialised once per event and shared.
    if req.table.is_some() {
        return Some(event_line(req, kind, &ev.object));
    }
    Some(ev.line(&req.version, kind, || event_line(req, kind, &ev.object)))
}

fn event_line(req: &WatchRequest, kind: &str, obj: &Value) -> Bytes {
    // The common case needs no copy of the object: it is written with its apiVersion and kind
    // replaced on the way out (a copy of a large object per event was a tenth of the server's
    // CPU in a burst).
    if req.table.is_none()
        && !super::event_versions::is_core_event(&req.def)
        && let Some(map) = obj.as_object()
    {
        return line(&Event {
            kind,
            object: Stamped {
                map,
                api_version: req.def.api_version(&req.version),
                kind: &req.def.kind,
            },
        });
    }
    let mut obj = obj.clone();
    super::event_versions::stamp(&mut obj, &req.def, &req.version);
    if let Some(include) = req.table {
        let rv = obj.pointer("/metadata/resourceVersion").cloned();
        obj = super::table::render(
            &req.def,
            &req.version,
            &[obj],
            include,
            json!({"resourceVersion": rv}),
        );
    }
    line(&json!({"type": kind, "object": obj}))
}

fn bookmark(req: &WatchRequest, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(&json!({
        "type": "BOOKMARK",
        "object": {"kind": req.def.kind, "apiVersion": req.def.api_version(&req.version), "metadata": meta}
    }))
}

/// One newline-terminated JSON line. Serialising JSON values (string keys, finite numbers)
/// cannot fail; `to_vec` writes straight into bytes, where `to_string` goes through `fmt`.
fn line(v: &impl serde::Serialize) -> Bytes {
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

/// A watch event as it goes on the wire.
#[derive(serde::Serialize)]
struct Event<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    object: Stamped<'a>,
}

/// A stored object served as `api_version` / `kind` (what `event_versions::stamp` does to a copy).
struct Stamped<'a> {
    map: &'a serde_json::Map<String, Value>,
    api_version: String,
    kind: &'a str,
}

impl serde::Serialize for Stamped<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let rest = self
            .map
            .iter()
            .filter(|(k, _)| *k != "apiVersion" && *k != "kind");
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("apiVersion", &self.api_version)?;
        m.serialize_entry("kind", self.kind)?;
        for (k, v) in rest {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// Parses a resourceVersion query value: "" and "0" mean "from a snapshot".
pub fn parse_from(rv: Option<&str>) -> Result<Option<u64>, ApiError> {
    match rv {
        None | Some("") | Some("0") => Ok(None),
        Some(s) => s
            .parse::<u64>()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{CapiVersions, Registry};

    /// The event written without a copy is the event `stamp` on a copy made.
    #[test]
    fn an_event_is_written_as_a_stamped_copy_would_be() {
        let r = Registry::new(CapiVersions::Both, vec![]).unwrap();
        let def = r.by_name("machines").unwrap();
        for stored in [
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                   "metadata": {"name": "m", "labels": {"a": "b"}}, "spec": {"clusterName": "c"}}),
            json!({"metadata": {"name": "m"}, "status": {"phase": "Running"}}),
        ] {
            let fast = serde_json::to_vec(&Event {
                kind: "MODIFIED",
                object: Stamped {
                    map: stored.as_object().unwrap(),
                    api_version: def.api_version("v1beta1"),
                    kind: &def.kind,
                },
            })
            .unwrap();
            let mut copy = stored.clone();
            crate::event_versions::stamp(&mut copy, def, "v1beta1");
            assert_eq!(
                serde_json::from_slice::<Value>(&fast).unwrap(),
                json!({"type": "MODIFIED", "object": copy})
            );
        }
    }
}
