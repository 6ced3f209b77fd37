//! Plumbing shared by the stand-ins (Cluster API, kubelet, scheduler): the shutdown signal, a
//! deduplicating work queue, a watch pump, retries, seeded randomness and JSON field access.
//!
//! Every stand-in is a tokio task that talks to the API server only through a `kube::Client`,
//! exactly like a real controller, so the simulated cluster exercises the same wire paths.

use std::collections::{HashSet, VecDeque};
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// Sender half of the shutdown signal; dropping it also stops every stand-in.
#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        // send_replace never fails, even when every receiver is gone.
        self.tx.send_replace(true);
    }
}

/// Receiver half of the shutdown signal; cheap to clone into every task.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

impl Shutdown {
    /// Resolves once shutdown was triggered (or the trigger was dropped).
    pub async fn wait(&mut self) {
        // An error means the sender is gone, which also means "stop".
        let _ = self.rx.wait_for(|stop| *stop).await;
    }

    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow() || self.rx.has_changed().is_err()
    }

    /// Sleeps for `d`; returns false when shutdown interrupted the sleep.
    pub async fn sleep(&self, d: Duration) -> bool {
        let mut me = self.clone();
        tokio::select! {
            _ = tokio::time::sleep(d) => !self.is_triggered(),
            _ = me.wait() => false,
        }
    }
}

/// The clusters a stand-in reaches: Cluster API's objects (Machines, MachineDeployments, their
/// templates) in the management cluster, Nodes and Pods in the workload cluster. One cluster
/// plays both unless the simulated cluster was started with the management cluster apart, as
/// Cluster API runs them: a Machine there, its Node here.
#[derive(Clone)]
pub struct Clusters {
    pub management: kube::Client,
    pub workload: kube::Client,
    /// The management cluster's namespace holding this workload cluster's objects, when the
    /// management cluster is shared by several workload clusters (each Cluster in a namespace of
    /// its own): the stand-ins then watch only there, as each cluster's provider would act only
    /// on its own Machines. None: every namespace.
    pub scope: Option<String>,
}

impl Clusters {
    /// One cluster playing both.
    pub fn joined(client: kube::Client) -> Self {
        Self {
            management: client.clone(),
            workload: client,
            scope: None,
        }
    }
}

/// The objects of `ar` a stand-in watches: in every namespace, or only in `scope`
/// ([`Clusters::scope`]).
pub fn watched(
    client: &kube::Client,
    scope: Option<&str>,
    ar: &kube::api::ApiResource,
) -> Api<kube::api::DynamicObject> {
    match scope {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    }
}

pub fn shutdown_pair() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, Shutdown { rx })
}

/// A FIFO of keys where a key already waiting is not queued twice: many events about one
/// object collapse into one reconcile. Several workers may pop at once; as in client-go's
/// workqueue, a key being worked on is not handed out again until its worker calls `done`,
/// and a push meanwhile queues it once more after that.
#[derive(Debug)]
pub struct WorkQueue<K> {
    inner: Mutex<QueueState<K>>,
    notify: Notify,
}

#[derive(Debug)]
struct QueueState<K> {
    waiting: VecDeque<K>,
    queued: HashSet<K>,
    active: HashSet<K>,
    again: HashSet<K>,
}

impl<K: Clone + Eq + Hash> Default for WorkQueue<K> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(QueueState {
                waiting: VecDeque::new(),
                queued: HashSet::new(),
                active: HashSet::new(),
                again: HashSet::new(),
            }),
            notify: Notify::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    pub fn push(&self, key: K) {
        let mut state = self.inner.lock();
        if state.active.contains(&key) {
            state.again.insert(key);
        } else if state.queued.insert(key.clone()) {
            state.waiting.push_back(key);
            drop(state);
            self.notify.notify_one();
        }
    }

    fn try_pop(&self) -> Option<K> {
        let mut state = self.inner.lock();
        let key = state.waiting.pop_front()?;
        state.queued.remove(&key);
        state.active.insert(key.clone());
        Some(key)
    }

    /// The worker that popped `key` is finished with it; a push that came meanwhile queues it
    /// again now.
    pub fn done(&self, key: &K) {
        let again = {
            let mut state = self.inner.lock();
            state.active.remove(key);
            state.again.remove(key)
        };
        if again {
            self.push(key.clone());
        }
    }

    /// Next key, or None once shutdown is triggered. The caller owes a `done` for it.
    pub async fn pop(&self, shutdown: &Shutdown) -> Option<K> {
        let mut stop = shutdown.clone();
        loop {
            if shutdown.is_triggered() {
                return None;
            }
            // Register interest before checking, so a push between the check and the await
            // is not lost (notify_one stores a permit anyway, this is belt and braces).
            let notified = self.notify.notified();
            if let Some(key) = self.try_pop() {
                // Another worker may be waiting while keys remain.
                if !self.inner.lock().waiting.is_empty() {
                    self.notify.notify_one();
                }
                return Some(key);
            }
            tokio::select! {
                _ = notified => {}
                _ = stop.wait() => return None,
            }
        }
    }
}

/// Streams watch events of `api` into `on_event` until shutdown. The watcher re-lists on its
/// own after a dropped watch or a 410 Gone; errors are logged and retried with backoff.
pub fn spawn_watch<K, F>(
    what: &'static str,
    api: Api<K>,
    shutdown: Shutdown,
    mut on_event: F,
) -> JoinHandle<()>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    F: FnMut(watcher::Event<K>) + Send + 'static,
{
    tokio::spawn(async move {
        let mut stop = shutdown.clone();
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .into_stream()
            .boxed();
        loop {
            tokio::select! {
                _ = stop.wait() => break,
                next = stream.next() => match next {
                    Some(Ok(event)) => on_event(event),
                    Some(Err(err)) => tracing::warn!(watch = what, error = %err, "watch failed, retrying"),
                    None => break,
                },
            }
        }
        tracing::debug!(watch = what, "watch stopped");
    })
}

/// Why a retried call gave up.
#[derive(Debug, PartialEq, Eq)]
pub enum GaveUp {
    NotFound,
    Shutdown,
}

/// Runs `op` until it succeeds, the object is gone (404) or shutdown; other errors (conflicts,
/// injected faults, timeouts) are logged and retried with capped exponential backoff.
pub async fn retry<T, F, Fut>(what: &str, shutdown: &Shutdown, mut op: F) -> Result<T, GaveUp>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut backoff = Duration::from_millis(20);
    loop {
        if shutdown.is_triggered() {
            return Err(GaveUp::Shutdown);
        }
        match op().await {
            Ok(v) => return Ok(v),
            Err(err) if is_not_found(&err) => return Err(GaveUp::NotFound),
            Err(err) => {
                tracing::debug!(op = what, error = %brief(&err), "retrying");
                if !shutdown.sleep(backoff).await {
                    return Err(GaveUp::Shutdown);
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Merge-patches `name` (main resource).
pub async fn merge_patch<K>(api: &Api<K>, name: &str, patch: &Value) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
}

/// Merge-patches `name`'s status subresource.
pub async fn merge_status<K>(api: &Api<K>, name: &str, patch: &Value) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
}

/// Deletes `name`; already gone counts as success.
pub async fn delete_quietly<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(err) if is_not_found(&err) => Ok(()),
        Err(err) => Err(err),
    }
}

/// An error as one short line: the API server's message and code, not `kube::Error`'s Display,
/// which appends a Debug dump of the whole Status.
pub fn brief(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

/// Logs a step of a stand-in that failed and will be retried. A conflict (another writer came
/// first) or an object already gone is the ordinary life of a controller among writers, so it is
/// DEBUG; anything else is a WARN.
pub fn log_retry(component: &str, subject: &str, err: &kube::Error) {
    let error = brief(err);
    if is_conflict(err) || is_not_found(err) {
        tracing::debug!(subject, %error, "{component}: retrying");
    } else {
        tracing::warn!(subject, %error, "{component}: retrying");
    }
}

pub fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.is_not_found())
}

pub fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

/// Seeded randomness shared by a stand-in's tasks (names, delays, failures).
#[derive(Clone, Debug)]
pub struct SimRng(Arc<Mutex<SmallRng>>);

/// Lower-case consonants and digits, as Kubernetes uses for generated names (no vowels, so no
/// accidental words).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

impl SimRng {
    pub fn new(seed: u64) -> Self {
        Self(Arc::new(Mutex::new(SmallRng::seed_from_u64(seed))))
    }

    pub fn suffix(&self) -> String {
        let mut rng = self.0.lock();
        (0..5)
            .map(|_| char::from(NAME_ALPHABET[rng.random_range(0..NAME_ALPHABET.len())]))
            .collect()
    }

    pub fn hex(&self, len: usize) -> String {
        let mut rng = self.0.lock();
        (0..len)
            .map(|_| char::from(b"0123456789abcdef"[rng.random_range(0..16)]))
            .collect()
    }

    /// `base` plus a uniform draw from `[0, jitter]`.
    pub fn delay(&self, base: Duration, jitter: Duration) -> Duration {
        if jitter.is_zero() {
            return base;
        }
        let extra = self
            .0
            .lock()
            .random_range(0..=jitter.as_micros().min(u64::MAX as u128) as u64);
        base + Duration::from_micros(extra)
    }

    /// True with probability `p` (clamped to [0, 1]).
    pub fn chance(&self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        if p >= 1.0 {
            return true;
        }
        self.0.lock().random_bool(p)
    }
}

/// `value[path[0]][path[1]]...` as a string.
pub fn str_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(value, path)?.as_str()
}

pub fn at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, key| v.get(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_deduplicates_waiting_keys() {
        let q = WorkQueue::default();
        q.push("a");
        q.push("b");
        q.push("a");
        assert_eq!(q.try_pop(), Some("a"));
        q.done(&"a");
        q.push("a");
        assert_eq!(q.try_pop(), Some("b"));
        assert_eq!(q.try_pop(), Some("a"));
        assert_eq!(q.try_pop(), None);
    }

    #[test]
    fn queue_holds_a_key_back_while_a_worker_has_it() {
        let q = WorkQueue::default();
        q.push("a");
        assert_eq!(q.try_pop(), Some("a"));
        q.push("a");
        q.push("a");
        assert_eq!(q.try_pop(), None, "a is being worked on");
        q.done(&"a");
        assert_eq!(q.try_pop(), Some("a"), "pushed meanwhile: queued once more");
        q.done(&"a");
        assert_eq!(q.try_pop(), None);
    }

    #[test]
    fn rng_is_deterministic_per_seed() {
        let (a, b) = (SimRng::new(7), SimRng::new(7));
        assert_eq!(a.suffix(), b.suffix());
        assert_eq!(a.hex(17), b.hex(17));
        let d = a.delay(Duration::from_secs(1), Duration::from_secs(1));
        assert!(d >= Duration::from_secs(1) && d <= Duration::from_secs(2));
        assert!(a.chance(1.0) && !a.chance(0.0));
    }

    #[tokio::test]
    async fn shutdown_interrupts_sleep_and_pop() {
        let (trigger, shutdown) = shutdown_pair();
        let q: WorkQueue<u8> = WorkQueue::default();
        trigger.trigger();
        assert!(!shutdown.sleep(Duration::from_secs(60)).await);
        assert_eq!(q.pop(&shutdown).await, None);
    }
}
