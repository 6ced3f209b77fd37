//! One way to feed an index from a watch. An index says how it keeps one kind of object
//! ([`Index`]: apply, delete, reset, synced); [`feed`] owns everything else every watch used to
//! repeat: cutting each object down as it arrives, buffering a (re-)list until it is complete
//! and swapping it in whole, and saying so (the shared `synced` notification) so that start-up
//! waits on notifications instead of polling.

use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use parking_lot::RwLock;
use tokio::sync::Notify;

use crate::metrics::{Metrics, WatchLabels};

/// An index of objects of kind `K`, fed by one watch. One type may index several kinds (one
/// implementation per kind), each with its own re-lists.
pub trait Index<K> {
    /// What the index keeps of one object: cut down as it arrives, so that a re-list in
    /// progress buffers only that, never the whole objects.
    type Kept: Send + 'static;
    /// A (re-)list in progress, filled as it arrives: a `Vec` of what is kept, or, for an
    /// index that packs what it keeps, a fresh index of its own (so a list never holds every
    /// object unpacked).
    type Listing: Listing<Self::Kept>;
    /// What a change tells whoever waits on it (`()` when the index has nothing to say; the
    /// nodes whose volume attachments changed, for instance).
    type Changed;

    fn keep(obj: K) -> Self::Kept;
    /// An object was created or changed.
    fn apply(&mut self, kept: Self::Kept) -> Self::Changed;
    /// An object is gone.
    fn delete(&mut self, kept: Self::Kept) -> Self::Changed;
    /// A (re-)list completed: the objects of this kind become exactly `all`.
    fn reset(&mut self, all: Self::Listing) -> Self::Changed;
    /// A whole list of this kind has been seen at least once.
    fn synced(&self) -> bool;
    /// The watch failed (it will list again by itself). An index whose kind may not exist at
    /// all (an optional CRD) can take that as an empty list and say what changed; by default
    /// nothing changes.
    fn failed(&mut self) -> Option<Self::Changed> {
        None
    }
}

/// A (re-)list being gathered before an index swaps it in.
pub trait Listing<T>: Default + Send + 'static {
    fn push(&mut self, kept: T);
}

impl<T: Send + 'static> Listing<T> for Vec<T> {
    fn push(&mut self, kept: T) {
        Vec::push(self, kept);
    }
}

/// Feeds `index` from a watch's `events` until the stream ends. `synced` is notified after
/// every completed list; `changed` runs after every change the index took, with what the index
/// said of it (a re-list counts once, when it is swapped in). A watch error only logs: the watcher re-lists by itself.
pub(crate) async fn feed<K, I, S>(
    events: S,
    index: Arc<RwLock<I>>,
    synced: Arc<Notify>,
    mut changed: impl FnMut(I::Changed),
    what: &'static str,
    metrics: Arc<Metrics>,
) where
    I: Index<K>,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut buffer = I::Listing::default();
    let mut events = std::pin::pin!(events);
    let mut stale = Staleness::new(what);
    while let Some(ev) = events.next().await {
        stale.saw(&ev, &metrics);
        let said = match ev {
            Ok(watcher::Event::Init) => {
                buffer = I::Listing::default();
                continue;
            }
            Ok(watcher::Event::InitApply(o)) => {
                buffer.push(I::keep(o));
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                let said = index.write().reset(std::mem::take(&mut buffer));
                synced.notify_waiters();
                said
            }
            Ok(watcher::Event::Apply(o)) => index.write().apply(I::keep(o)),
            Ok(watcher::Event::Delete(o)) => index.write().delete(I::keep(o)),
            Err(e) => {
                tracing::warn!(error = %e, watch = what, "watch failed; it will re-list");
                let Some(said) = index.write().failed() else {
                    continue;
                };
                synced.notify_waiters();
                said
            }
        };
        changed(said);
    }
}

/// How long one watch's index is behind the API server after the start-up: from the failure
/// that made the watch list again (or the start of that list) until the new list is swapped
/// in. Counted per watch in `karpenter_capi_watch_relists_total` and
/// `karpenter_capi_watch_stale_seconds_total`; a failure the watch recovers from without a
/// list (it resumes from its resourceVersion) is not counted.
#[derive(Debug)]
pub(crate) struct Staleness {
    watch: &'static str,
    since: Option<Instant>,
    listed: bool,
}

impl Staleness {
    pub(crate) fn new(watch: &'static str) -> Self {
        Self {
            watch,
            since: None,
            listed: false,
        }
    }

    /// Note one event of the watch.
    pub(crate) fn saw<K>(
        &mut self,
        ev: &Result<watcher::Event<K>, watcher::Error>,
        metrics: &Metrics,
    ) {
        match ev {
            Err(_) => {
                self.since.get_or_insert_with(Instant::now);
            }
            Ok(watcher::Event::Init) => {
                self.since.get_or_insert_with(Instant::now);
            }
            Ok(watcher::Event::InitDone) => {
                let since = self.since.take();
                if let Some(since) = since.filter(|_| self.listed) {
                    let labels = WatchLabels {
                        watch: self.watch.to_string(),
                    };
                    metrics.watch_relists.get_or_create(&labels).inc();
                    metrics
                        .watch_stale_seconds
                        .get_or_create(&labels)
                        .inc_by(since.elapsed().as_secs_f64());
                }
                self.listed = true;
            }
            // Events flow again: an earlier failure was resumed from, not re-listed.
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => self.since = None,
            Ok(watcher::Event::InitApply(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Names and lengths: `keep` cuts each word down to its length.
    #[derive(Default)]
    struct Lengths {
        by_name: BTreeMap<String, usize>,
        listed: bool,
    }

    impl Index<String> for Lengths {
        type Kept = (String, usize);
        type Listing = Vec<(String, usize)>;
        type Changed = ();
        fn keep(obj: String) -> (String, usize) {
            let n = obj.len();
            (obj, n)
        }
        fn apply(&mut self, (name, n): (String, usize)) {
            self.by_name.insert(name, n);
        }
        fn delete(&mut self, (name, _): (String, usize)) {
            self.by_name.remove(&name);
        }
        fn reset(&mut self, all: Vec<(String, usize)>) {
            self.by_name = all.into_iter().collect();
            self.listed = true;
        }
        fn synced(&self) -> bool {
            self.listed
        }
    }

    #[tokio::test]
    async fn a_relist_is_swapped_in_whole_and_said_once() {
        use watcher::Event::*;
        let index = Arc::new(RwLock::new(Lengths::default()));
        index.write().apply(("stale".into(), 5));
        let synced = Arc::new(Notify::new());
        let said = synced.notified();
        let events = futures::stream::iter(vec![
            Ok(Init),
            Ok(InitApply("a".to_string())),
            Ok(InitApply("bb".to_string())),
            Ok(InitDone),
            Ok(Apply("ccc".to_string())),
            Ok(Delete("a".to_string())),
        ]);
        let mut changes = 0;
        feed(
            events,
            index.clone(),
            synced.clone(),
            |()| changes += 1,
            "test",
            Metrics::new(),
        )
        .await;
        said.await;
        let got = index.read();
        assert!(got.synced());
        assert_eq!(
            got.by_name
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect::<Vec<_>>(),
            vec![("bb", 2), ("ccc", 3)],
            "the re-list replaced what was there"
        );
        assert_eq!(changes, 3, "one change per re-list, apply and delete");
    }
}
