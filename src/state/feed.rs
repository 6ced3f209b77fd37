//! One way to feed an index from a watch. An index says how it keeps one kind of object
//! ([`Index`]: apply, delete, reset, synced); [`feed`] owns everything else every watch used to
//! repeat: cutting each object down as it arrives, buffering a (re-)list until it is complete
//! and swapping it in whole, and saying so (the shared `synced` notification) so that start-up
//! waits on notifications instead of polling.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use parking_lot::RwLock;
use tokio::sync::Notify;

/// An index of objects of kind `K`, fed by one watch. One type may index several kinds (one
/// implementation per kind), each with its own re-lists.
pub trait Index<K> {
    /// What the index keeps of one object: cut down as it arrives, so that a re-list in
    /// progress buffers only that, never the whole objects.
    type Kept: Send + 'static;
    /// What a change tells whoever waits on it (`()` when the index has nothing to say; the
    /// nodes whose volume attachments changed, for instance).
    type Changed;

    fn keep(obj: K) -> Self::Kept;
    /// An object was created or changed.
    fn apply(&mut self, kept: Self::Kept) -> Self::Changed;
    /// An object is gone.
    fn delete(&mut self, kept: Self::Kept) -> Self::Changed;
    /// A (re-)list completed: the objects of this kind become exactly `all`.
    fn reset(&mut self, all: Vec<Self::Kept>) -> Self::Changed;
    /// A whole list of this kind has been seen at least once.
    fn synced(&self) -> bool;
}

/// Feeds `index` from a watch's `events` until the stream ends. `synced` is notified after
/// every completed list; `changed` runs after every change the index took, with what the index
/// said of it (a re-list counts once, when it is swapped in). A watch error only logs: the watcher re-lists by itself.
pub async fn feed<K, I, S>(
    events: S,
    index: Arc<RwLock<I>>,
    synced: Arc<Notify>,
    mut changed: impl FnMut(I::Changed),
    what: &'static str,
) where
    I: Index<K>,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut buffer: Vec<I::Kept> = Vec::new();
    let mut events = std::pin::pin!(events);
    while let Some(ev) = events.next().await {
        let said = match ev {
            Ok(watcher::Event::Init) => {
                buffer.clear();
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
                continue;
            }
        };
        changed(said);
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
