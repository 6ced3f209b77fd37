//! What the dry run would have written, as the server would show it afterwards, shown back to
//! the controller's own clients: a GET of an object it wrote returns its version, a LIST
//! includes it, and every open WATCH of its kind gets it as an event. So the controller's
//! decisions follow from its own earlier ones as they would in a writing run (a claim it
//! created has its actor, replica writes add up, a claim it deleted is seen deleting) until
//! it would wait for another controller (Cluster API, a kubelet, the scheduler), which writes
//! nothing here.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::Frame;
use kube::client::DynBody;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::broadcast;
use tower::BoxError;

/// An object's place: (collection path without namespace, namespace, name).
pub(super) type Key = (String, String, String);

/// One synthetic watch event, serialised once.
struct Event {
    collection: String,
    namespace: String,
    line: Bytes,
}

pub(super) struct Overlay {
    /// The object as written, or None once gone.
    objects: Mutex<BTreeMap<Key, Option<Value>>>,
    events: broadcast::Sender<Arc<Event>>,
}

impl Default for Overlay {
    fn default() -> Self {
        Self {
            objects: Mutex::default(),
            events: broadcast::channel(4096).0,
        }
    }
}

fn meta_str<'a>(o: &'a Value, field: &str) -> &'a str {
    o["metadata"][field].as_str().unwrap_or_default()
}

impl Overlay {
    /// The object written at `key`: Some(None) when the dry run removed it, None when it never
    /// wrote it.
    pub(super) fn get(&self, key: &Key) -> Option<Option<Value>> {
        self.objects.lock().get(key).cloned()
    }

    /// `object` as the server would now hold it after a write: removed when it is deleting
    /// and has no finalizer left, as a server removes it.
    pub(super) fn put(&self, collection: &str, object: Value, created: bool) {
        let deleting = !object["metadata"]["deletionTimestamp"].is_null();
        let finalized = object["metadata"]["finalizers"]
            .as_array()
            .is_none_or(Vec::is_empty);
        let namespace = meta_str(&object, "namespace").to_string();
        let key = (
            collection.to_string(),
            namespace.clone(),
            meta_str(&object, "name").to_string(),
        );
        let (kind, stored) = match (deleting && finalized, created) {
            (true, _) => ("DELETED", None),
            (false, true) => ("ADDED", Some(object.clone())),
            (false, false) => ("MODIFIED", Some(object.clone())),
        };
        self.objects.lock().insert(key, stored);
        let mut line = serde_json::to_vec(&WatchLine {
            kind,
            object: &object,
        })
        .unwrap_or_default();
        line.push(b'\n');
        // No watch open is fine: a later LIST merges the object in.
        let _ = self.events.send(Arc::new(Event {
            collection: collection.to_string(),
            namespace,
            line: Bytes::from(line),
        }));
    }

    /// A LIST's items with the dry run's writes in place.
    pub(super) fn merge_list(&self, collection: &str, namespace: &str, list: &mut Value) {
        let objects = self.objects.lock();
        let mine: Vec<(&Key, &Option<Value>)> = objects
            .iter()
            .filter(|((c, ns, _), _)| c == collection && (namespace.is_empty() || ns == namespace))
            .collect();
        if mine.is_empty() {
            return;
        }
        let Some(items) = list["items"].as_array_mut() else {
            return;
        };
        let mut seen = Vec::new();
        items.retain_mut(|item| {
            let key = (
                collection.to_string(),
                meta_str(item, "namespace").to_string(),
                meta_str(item, "name").to_string(),
            );
            match objects.get(&key) {
                Some(Some(o)) => {
                    *item = o.clone();
                    seen.push(key);
                    true
                }
                Some(None) => false,
                None => true,
            }
        });
        for (key, object) in mine {
            if let Some(o) = object.as_ref().filter(|_| !seen.contains(key)) {
                items.push(o.clone());
            }
        }
    }

    /// A WATCH's body with the dry run's writes of its kind spliced in, each between two of
    /// the server's lines (never inside one).
    pub(super) fn watch(
        &self,
        collection: &str,
        namespace: &str,
        body: Box<DynBody>,
    ) -> Box<DynBody> {
        struct State {
            real: BodyStream<Box<DynBody>>,
            events: broadcast::Receiver<Arc<Event>>,
            at_line_start: bool,
            closed: bool,
        }
        let state = State {
            real: BodyStream::new(body),
            events: self.events.subscribe(),
            at_line_start: true,
            closed: false,
        };
        let (collection, namespace) = (collection.to_string(), namespace.to_string());
        let merged = futures::stream::unfold(state, move |mut s| {
            let (collection, namespace) = (collection.clone(), namespace.clone());
            async move {
                loop {
                    tokio::select! {
                        biased;
                        frame = s.real.next() => {
                            let frame = frame?;
                            if let Ok(f) = &frame
                                && let Some(d) = f.data_ref().filter(|d| !d.is_empty())
                            {
                                s.at_line_start = d.ends_with(b"\n");
                            }
                            return Some((frame, s));
                        }
                        event = s.events.recv(), if s.at_line_start && !s.closed => match event {
                            Ok(e) if e.collection == collection
                                && (namespace.is_empty() || e.namespace == namespace) =>
                            {
                                return Some((Ok(Frame::data(e.line.clone())), s));
                            }
                            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                            Err(broadcast::error::RecvError::Closed) => s.closed = true,
                        },
                    }
                }
            }
        });
        Box::new(StreamBody::new(merged.boxed()).map_err(BoxError::from))
    }
}

/// One watch event line as kube-apiserver writes it: `type` before `object` (a `json!` map
/// would sort `object` first). The watches of Karpenter's own kinds keep each object's text as
/// it arrives (`api::decode`), which needs the event's type read first.
#[derive(serde::Serialize)]
struct WatchLine<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    object: &'a Value,
}
