//! The stand-in's informer caches, read as Cluster API's controllers read theirs: shared
//! objects by label, and waits until the cache shows what a reconcile just wrote (creates,
//! deletions, a refused write's newer version) so the next reconcile never acts on less.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::{ObjectRef, Store};

use super::Inner;

impl Inner {
    /// False when shutdown came first.
    pub(super) async fn caches_synced(&self) -> bool {
        let mut stop = self.shutdown.clone();
        tokio::select! {
            synced = async {
                self.machines.wait_until_ready().await.is_ok()
                    && self.sets.wait_until_ready().await.is_ok()
            } => synced,
            _ = stop.wait() => false,
        }
    }

    /// The cached objects of namespace `ns` whose label `key` is `value`.
    pub(super) fn cached(
        store: &Store<DynamicObject>,
        ns: &str,
        key: &str,
        value: &str,
    ) -> Vec<Arc<DynamicObject>> {
        // Shared, not copied: a reconcile reads them (a deep copy of every Machine of a set per
        // reconcile was most of the stand-in's CPU in a burst).
        store
            .state()
            .into_iter()
            .filter(|o| o.metadata.namespace.as_deref() == Some(ns))
            .filter(|o| o.labels().get(key).map(String::as_str) == Some(value))
            .collect()
    }

    /// Waits until the cache shows the objects this reconcile just created, as Cluster API's
    /// MachineSet controller waits for its creates, so the next reconcile cannot count them
    /// missing and create them again. One already deleted again (the server says 404) is not
    /// waited for. Gives up after a while (the watch may be down): the objects exist either way.
    pub(super) async fn await_cached(
        &self,
        store: &Store<DynamicObject>,
        ar: &ApiResource,
        ns: &str,
        names: &[String],
    ) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut missing: Vec<&String> = names.iter().collect();
        let mut stop = self.shutdown.clone();
        let mut asked = tokio::time::Instant::now();
        loop {
            // Registered before looking, so an event applied meanwhile still wakes us.
            let changed = self.cache_changed.notified();
            missing.retain(|n| {
                store
                    .get(&ObjectRef::new_with(n, ar.clone()).within(ns))
                    .is_none()
            });
            if missing.is_empty() {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            // Woken by the watch. An object deleted again before the cache saw it never shows,
            // so every 200 ms the server is asked which of the missing ones are gone.
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = stop.wait() => return,
            }
            if asked.elapsed() < Duration::from_millis(200) {
                continue;
            }
            asked = tokio::time::Instant::now();
            let api = self.api(ar, ns);
            let mut gone = HashSet::new();
            for n in &missing {
                if let Ok(None) = api.get_opt(n).await {
                    gone.insert(n.to_string());
                }
            }
            missing.retain(|n| !gone.contains(*n));
        }
        tracing::warn!(
            ?missing,
            "cluster api stand-in: created objects not in the cache after 10 s"
        );
    }

    /// Waits until the cache shows these just-deleted objects deleting (or gone), as Cluster
    /// API's MachineSet controller waits for its deletes: a cache that lags would otherwise
    /// still count a victim as live and take a second Machine for the same surplus. Gives up
    /// after 10 s (the watch may be down).
    pub(super) async fn await_deleting_in_cache(
        &self,
        store: &Store<DynamicObject>,
        ar: &ApiResource,
        ns: &str,
        names: &[String],
    ) {
        let settled = self
            .until_cache(|| {
                !names.iter().any(|n| {
                    store
                        .get(&ObjectRef::new_with(n, ar.clone()).within(ns))
                        .is_some_and(|o| o.metadata.deletion_timestamp.is_none())
                })
            })
            .await;
        if !settled {
            tracing::warn!(
                ?names,
                "cluster api stand-in: deleted objects not shown deleting in the cache after 10 s"
            );
        }
    }

    /// Waits until the cache holds object `name` at another resourceVersion than `stale` (or
    /// not at all): after a write refused because it was made from that stale version, the
    /// next reconcile then reads what the server refused it over, as controller-runtime's
    /// requeue after a conflict reads an informer that has caught up. Gives up after 10 s (the
    /// watch may be down).
    pub(super) async fn await_cache_past(
        &self,
        store: &Store<DynamicObject>,
        ar: &ApiResource,
        ns: &str,
        name: &str,
        stale: &str,
    ) {
        let key = ObjectRef::new_with(name, ar.clone()).within(ns);
        let settled = self
            .until_cache(|| {
                store
                    .get(&key)
                    .and_then(|o| o.metadata.resource_version.clone())
                    .as_deref()
                    != Some(stale)
            })
            .await;
        if !settled {
            tracing::warn!(
                name,
                "cluster api stand-in: the cache still holds a version the server refused after 10 s"
            );
        }
    }

    /// Waits, woken by the caches' watch events, until `done` holds. False when 10 s pass
    /// first (the watch may be down); true on shutdown too (nothing is left to wait for).
    async fn until_cache(&self, mut done: impl FnMut() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut stop = self.shutdown.clone();
        loop {
            // Registered before looking, so an event applied meanwhile still wakes us.
            let changed = self.cache_changed.notified();
            if done() {
                return true;
            }
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(deadline) => return false,
                _ = stop.wait() => return true,
            }
        }
    }
}
