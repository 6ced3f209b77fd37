//! A watch of one kind, ready to [`feed`] an index: which objects it lists, and how each is
//! read (cut down, parsed) before the index keeps it. The only place a watch stream is made,
//! so every kind has the same re-list semantics and metrics.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::RwLock;
use tokio::sync::Notify;

use super::feed::{Index, feed};
use crate::metrics::Metrics;

/// A kind a watch can list: typed (`Node`) or dynamic (a Cluster API kind whose version is
/// picked at run time).
pub(crate) trait Watchable:
    kube::Resource<DynamicType: Eq + std::hash::Hash + Clone>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + 'static
{
}

impl<K> Watchable for K where
    K: kube::Resource<DynamicType: Eq + std::hash::Hash + Clone>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static
{
}

/// One watch: where, which objects, and its name in logs and metrics.
pub(crate) struct Watch<K> {
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
}

/// Where a fed index reports: the shared `synced` notification and the metrics.
pub(crate) struct Reports<'a> {
    pub(crate) synced: &'a Arc<Notify>,
    pub(crate) metrics: &'a Arc<Metrics>,
}

impl<K: Watchable> Watch<K> {
    pub(crate) fn new(api: Api<K>, what: &'static str) -> Self {
        Self {
            api,
            config: watcher::Config::default(),
            what,
        }
    }

    /// Only the objects with these labels (a label selector).
    pub(crate) fn labels(mut self, selector: &str) -> Self {
        self.config = self.config.labels(selector);
        self
    }

    /// Only the objects with these fields (a field selector).
    pub(crate) fn fields(mut self, selector: &str) -> Self {
        self.config = self.config.fields(selector);
        self
    }

    /// List in pages of `n` objects.
    pub(crate) fn page_size(mut self, n: u32) -> Self {
        self.config = self.config.page_size(n);
        self
    }

    /// Feed `index` until the watch ends (never, unless aborted): each object read by `read`
    /// as it arrives, `changed` told of each change the index took (see [`feed`]).
    pub(crate) fn feed<T, I>(
        self,
        mut read: impl FnMut(K) -> T + Send + 'static,
        index: &Arc<RwLock<I>>,
        reports: Reports<'_>,
        changed: impl FnMut(I::Changed) + 'static,
    ) -> impl Future<Output = ()> + 'static
    where
        T: 'static,
        I: Index<T> + 'static,
    {
        let events = watcher(self.api, self.config)
            .default_backoff()
            .map(move |ev| ev.map(|ev| read_event(ev, &mut read)));
        feed(
            events,
            index.clone(),
            reports.synced.clone(),
            changed,
            self.what,
            reports.metrics.clone(),
        )
    }
}

fn read_event<K, T>(ev: watcher::Event<K>, read: &mut impl FnMut(K) -> T) -> watcher::Event<T> {
    match ev {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(read(o)),
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::Apply(o) => watcher::Event::Apply(read(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(read(o)),
    }
}
