//! Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection package does
//! it (15 s lease, 10 s renew deadline, 2 s retry):
//!
//! - Expiry is measured on this process's monotonic clock from the moment it last OBSERVED a
//!   change of the Lease record, never by comparing the holder's renewTime with the local wall
//!   clock, so replicas whose clocks disagree still wait a full lease duration.
//! - Every acquire/renew attempt has a deadline. A leader steps down once `renew_deadline` has
//!   passed since the start of its last successful renewal, even if a request hangs; since a
//!   standby waits `lease_duration` (> `renew_deadline`) from when it saw that renewal land, the
//!   two never both believe they lead.
//! - On release (graceful shutdown) the holder clears `holderIdentity` and sets a 1 s lease
//!   duration, guarded by the resourceVersion it last wrote, as ReleaseOnCancel does, so a standby
//!   takes over at once instead of after a full lease duration: candidates watch the Lease and
//!   try again as soon as it shows no holder, not only every retry period.
//!
//! Every write is compare-and-swap on the Lease's resourceVersion, so two candidates can never
//! both win one round.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("leader-election Lease {namespace}/{name}: {source}")]
    Api {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("leader-election Lease {namespace}/{name}: no answer within {after:?}")]
    Timeout {
        namespace: String,
        name: String,
        after: Duration,
    },
    #[error("lost the leader-election Lease {namespace}/{name}: not renewed within {deadline:?}")]
    Lost {
        namespace: String,
        name: String,
        deadline: Duration,
    },
    #[error("lost the leader-election Lease {namespace}/{name}: {holder} holds it now")]
    Taken {
        namespace: String,
        name: String,
        holder: String,
    },
    #[error("the leader-election task ended abnormally: {0}")]
    Task(String),
}

#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Config {
    pub fn new(namespace: String, name: String, identity: String) -> Self {
        Self {
            namespace,
            name,
            identity,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Identity of this replica: the pod name when running in a cluster, plus a random suffix so two
/// processes on one host never share it.
pub(crate) fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "karpenter-capi".to_string());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{host}_{}_{nanos:08x}", std::process::id())
}

/// The parts of a Lease whose change proves its holder alive. The resourceVersion is compared
/// only for equality (it is opaque).
#[derive(Clone, Debug, PartialEq)]
struct Record {
    holder: String,
    renew_time: Option<jiff::Timestamp>,
    lease_duration: Duration,
    resource_version: Option<String>,
}

impl Record {
    fn of(lease: &Lease, default_duration: Duration) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.unwrap_or_default(),
            renew_time: spec.renew_time.map(|t| t.0),
            lease_duration: spec
                .lease_duration_seconds
                .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
                .unwrap_or(default_duration),
            resource_version: lease.metadata.resource_version.clone(),
        }
    }
}

/// What this candidate last saw of the Lease, and when (monotonic).
#[derive(Debug, Default)]
struct Observer {
    last: Option<(Record, Instant)>,
}

impl Observer {
    fn observe(&mut self, record: Record, now: Instant) {
        if self.last.as_ref().map(|(r, _)| r) != Some(&record) {
            self.last = Some((record, now));
        }
    }

    /// Free when it has no holder, or nothing about it changed for its lease duration.
    fn expired(&self, now: Instant) -> bool {
        match &self.last {
            None => true,
            Some((r, _)) if r.holder.is_empty() => true,
            Some((r, seen)) => now.saturating_duration_since(*seen) >= r.lease_duration,
        }
    }
}

/// A running election: `status` is true while this replica leads.
pub struct Election {
    pub status: watch::Receiver<bool>,
    release: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), Error>>>,
}

impl Election {
    /// Start campaigning on the current runtime.
    pub fn spawn(client: kube::Client, cfg: Config) -> Self {
        Self::spawn_on(&tokio::runtime::Handle::current(), client, cfg)
    }

    /// Start campaigning on the runtime of `handle` (an [`ElectionThread`]'s, say): its
    /// renewals then wait for nothing that runs elsewhere.
    pub fn spawn_on(handle: &tokio::runtime::Handle, client: kube::Client, cfg: Config) -> Self {
        let (status_tx, status) = watch::channel(false);
        let (release, release_rx) = oneshot::channel();
        let elector = Elector {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            observer: Observer::default(),
            held: None,
        };
        let task = handle.spawn(elector.run(status_tx, release_rx));
        Self {
            status,
            release: Some(release),
            task: Some(task),
        }
    }

    /// Resolves when the election ends on its own: leadership lost, or the task failed.
    pub async fn finished(&mut self) -> Result<(), Error> {
        let Some(task) = self.task.as_mut() else {
            return std::future::pending().await;
        };
        let out = task.await;
        self.task = None;
        out.map_err(|e| Error::Task(e.to_string()))?
    }

    /// Stop campaigning and give the Lease up if held (bounded by `within`).
    pub async fn release(mut self, within: Duration) {
        if let Some(tx) = self.release.take() {
            let _ = tx.send(());
        }
        let Some(mut task) = self.task.take() else {
            return;
        };
        match tokio::time::timeout(within, &mut task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "leader election ended with an error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "leader election task failed"),
            Err(_) => {
                tracing::warn!(
                    ?within,
                    "releasing the Lease took too long; leaving it to expire"
                );
                task.abort();
            }
        }
    }

    /// Stop campaigning without touching the Lease (what a killed process does).
    pub fn abort(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A thread with a runtime of its own for elections: a Lease renewal waits behind nothing that
/// the process's other threads are busy with (a controller's solve on a single-threaded actix
/// runtime takes longer than a renew deadline under load). Dropped, the thread ends and the
/// tasks still on it stop as an aborted task does.
pub struct ElectionThread {
    handle: tokio::runtime::Handle,
    /// Dropped with the thread's owner: the thread's runtime then returns and is dropped there.
    _stop: oneshot::Sender<()>,
}

impl ElectionThread {
    /// Start the thread, named `name`.
    pub fn start(name: &str) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let _ = runtime.block_on(stopped);
            })?;
        Ok(Self {
            handle,
            _stop: stop,
        })
    }

    /// Where elections (and anything else that must keep time) are spawned.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

struct Elector {
    api: Api<Lease>,
    cfg: Config,
    observer: Observer,
    /// The Lease as we last wrote it while holding it (its resourceVersion guards the release).
    held: Option<Lease>,
}

/// How one attempt ended.
enum Outcome {
    Held,
    /// Someone else holds a Lease that has not expired.
    Other(String),
    /// Our write lost a compare-and-swap; the next round re-reads.
    Conflict,
}

impl Elector {
    async fn run(
        mut self,
        status: watch::Sender<bool>,
        mut release: oneshot::Receiver<()>,
    ) -> Result<(), Error> {
        // Start of the last successful renewal: the leader's own deadline counts from there.
        let mut renewed_at: Option<Instant> = None;
        // Candidates only: wakes the candidate when the Lease is released.
        let mut released = Some(self.released_events());
        loop {
            let started = Instant::now();
            let budget = match renewed_at {
                Some(at) => self
                    .cfg
                    .renew_deadline
                    .saturating_sub(started.saturating_duration_since(at)),
                None => self.cfg.renew_deadline,
            };
            // A release asked for mid-attempt waits for that attempt: its write may already
            // have landed, and a Lease we took but never learned of would stay held until it
            // expires (the successor waits a whole lease duration).
            let (attempt, stop) = {
                let attempt = tokio::time::timeout(budget, self.attempt());
                tokio::pin!(attempt);
                tokio::select! {
                    r = &mut attempt => (r, false),
                    _ = &mut release => (attempt.await, true),
                }
            };
            if stop {
                return self.give_up(&status).await;
            }
            let leading = renewed_at.is_some();
            match attempt {
                Ok(Ok(Outcome::Held)) => {
                    renewed_at = Some(started);
                    if !leading {
                        tracing::info!(identity = %self.cfg.identity, lease = %self.cfg.name, "became leader");
                        status.send_replace(true);
                        released = None;
                    }
                }
                Ok(Ok(Outcome::Other(holder))) if leading => {
                    status.send_replace(false);
                    tracing::warn!(%holder, "lost leadership: the Lease has another holder");
                    return Err(Error::Taken {
                        namespace: self.cfg.namespace.clone(),
                        name: self.cfg.name.clone(),
                        holder,
                    });
                }
                Ok(Ok(Outcome::Other(_) | Outcome::Conflict)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "leader election attempt failed"),
                Err(_) => tracing::warn!(
                    after = ?budget,
                    "leader election attempt timed out"
                ),
            }
            // Sleep until the next retry, but wake for the renew deadline if that comes first.
            let mut pause = self.cfg.retry_period;
            if let Some(at) = renewed_at {
                let left = self.cfg.renew_deadline.saturating_sub(at.elapsed());
                if left.is_zero() {
                    status.send_replace(false);
                    tracing::warn!(deadline = ?self.cfg.renew_deadline, "lost leadership: Lease not renewed in time");
                    return Err(Error::Lost {
                        namespace: self.cfg.namespace.clone(),
                        name: self.cfg.name.clone(),
                        deadline: self.cfg.renew_deadline,
                    });
                }
                pause = pause.min(left);
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = next_release(&mut released) => {}
                _ = &mut release => return self.give_up(&status).await,
            }
        }
    }

    /// Watch events of our Lease that show it without a holder.
    fn released_events(&self) -> BoxStream<'static, ()> {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", self.cfg.name));
        watcher(self.api.clone(), cfg)
            .default_backoff()
            .filter_map(|ev| async move {
                match ev {
                    Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l))
                        if l.spec
                            .as_ref()
                            .and_then(|s| s.holder_identity.as_deref())
                            .is_none_or(str::is_empty) =>
                    {
                        Some(())
                    }
                    _ => None,
                }
            })
            .boxed()
    }

    fn err(&self) -> impl Fn(kube::Error) -> Error + '_ {
        |source| Error::Api {
            namespace: self.cfg.namespace.clone(),
            name: self.cfg.name.clone(),
            source,
        }
    }

    /// One acquire-or-renew round (client-go's tryAcquireOrRenew).
    async fn attempt(&mut self) -> Result<Outcome, Error> {
        let now = jiff::Timestamp::now();
        let current = self.api.get_opt(&self.cfg.name).await.map_err(self.err())?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.held_spec(now, now, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => Ok(self.hold(created)),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Outcome::Conflict),
                Err(e) => Err(self.err()(e)),
            };
        };
        let record = Record::of(&lease, self.cfg.lease_duration);
        self.observer.observe(record.clone(), Instant::now());
        let ours = record.holder == self.cfg.identity;
        if !ours && !self.observer.expired(Instant::now()) {
            self.held = None;
            return Ok(Outcome::Other(record.holder));
        }
        let spec = lease.spec.clone().unwrap_or_default();
        let acquired = match (ours, spec.acquire_time) {
            (true, Some(t)) => t.0,
            _ => now,
        };
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
        lease.spec = Some(self.held_spec(acquired, now, transitions));
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => Ok(self.hold(written)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Outcome::Conflict),
            Err(e) => Err(self.err()(e)),
        }
    }

    fn hold(&mut self, written: Lease) -> Outcome {
        self.observer.observe(
            Record::of(&written, self.cfg.lease_duration),
            Instant::now(),
        );
        self.held = Some(written);
        Outcome::Held
    }

    fn held_spec(
        &self,
        acquired: jiff::Timestamp,
        now: jiff::Timestamp,
        transitions: i32,
    ) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(seconds(self.cfg.lease_duration)),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Stop leading and release the Lease if we hold it (ReleaseOnCancel).
    async fn give_up(mut self, status: &watch::Sender<bool>) -> Result<(), Error> {
        let was_leader = status.send_replace(false);
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        if was_leader {
            tracing::info!(identity = %self.cfg.identity, "releasing leadership");
        }
        // A renewal we gave up on may still have landed and moved the resourceVersion: on a
        // conflict, re-read once and release that version if it still names us.
        let mut lease = held;
        for _ in 0..2 {
            match self.release_once(lease.clone()).await {
                Ok(()) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    match self.api.get_opt(&self.cfg.name).await.map_err(self.err())? {
                        Some(fresh)
                            if Record::of(&fresh, self.cfg.lease_duration).holder
                                == self.cfg.identity =>
                        {
                            lease = fresh
                        }
                        _ => return Ok(()),
                    }
                }
                Err(e) => return Err(self.err()(e)),
            }
        }
        Ok(())
    }

    async fn release_once(&self, mut lease: Lease) -> Result<(), kube::Error> {
        let now = MicroTime(jiff::Timestamp::now());
        let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions);
        lease.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: transitions,
            ..Default::default()
        });
        self.api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }
}

/// The next release seen by the watch; never, without one (a leader does not watch).
async fn next_release(events: &mut Option<BoxStream<'static, ()>>) {
    match events.as_mut() {
        Some(s) => {
            if s.next().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, renew: jiff::Timestamp, rv: &str) -> Record {
        Record {
            holder: holder.into(),
            renew_time: Some(renew),
            lease_duration: Duration::from_secs(15),
            resource_version: Some(rv.into()),
        }
    }

    /// The holder's renewTime says nothing about expiry: a holder whose clock runs an hour behind
    /// (renewTime "long ago") keeps the Lease while it keeps renewing, and one whose clock runs an
    /// hour ahead loses it a lease duration after it stops. Comparing renewTime with the local
    /// wall clock (the old `expired`) got both wrong.
    #[test]
    fn expiry_is_measured_from_observed_changes_on_the_monotonic_clock() {
        let wall = jiff::Timestamp::now();
        let hour = jiff::SignedDuration::from_secs(3600);
        let t0 = Instant::now();
        let secs = Duration::from_secs;

        let mut behind = Observer::default();
        behind.observe(record("a", wall - hour, "1"), t0);
        assert!(!behind.expired(t0), "just observed: valid");
        assert!(!behind.expired(t0 + secs(14)));
        behind.observe(
            record("a", wall - hour + jiff::SignedDuration::from_secs(2), "2"),
            t0 + secs(14),
        );
        assert!(
            !behind.expired(t0 + secs(28)),
            "renewed at 14 s: valid until 29 s"
        );
        assert!(behind.expired(t0 + secs(29)));

        let mut ahead = Observer::default();
        ahead.observe(record("a", wall + hour, "1"), t0);
        // The same record seen again is not a renewal.
        ahead.observe(record("a", wall + hour, "1"), t0 + secs(10));
        assert!(!ahead.expired(t0 + secs(14)));
        assert!(
            ahead.expired(t0 + secs(15)),
            "unchanged for a lease duration: expired"
        );

        // A change of resourceVersion alone restarts the clock (someone wrote it).
        let mut rv = Observer::default();
        rv.observe(record("a", wall, "1"), t0);
        rv.observe(record("a", wall, "2"), t0 + secs(10));
        assert!(!rv.expired(t0 + secs(20)));
    }

    #[test]
    fn released_or_unknown_leases_are_free() {
        let t0 = Instant::now();
        assert!(Observer::default().expired(t0), "never observed");
        let mut released = Observer::default();
        released.observe(record("", jiff::Timestamp::now(), "3"), t0);
        assert!(released.expired(t0), "no holder");
        let mut short = Observer::default();
        let mut r = record("a", jiff::Timestamp::now(), "4");
        r.lease_duration = Duration::from_secs(1);
        short.observe(r, t0);
        assert!(!short.expired(t0));
        assert!(short.expired(t0 + Duration::from_secs(1)));
    }
}
