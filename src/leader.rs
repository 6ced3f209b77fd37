//! Leader election on a coordination.k8s.io/v1 Lease, with client-go's timings (15 s lease,
//! 10 s renew deadline, 2 s retry). Every replica watches; only the leader writes. A leader that
//! cannot renew in time steps down and the process exits, as controller-runtime does: a clean
//! restart is simpler and safer than unwinding half-done writes.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("leader-election Lease {namespace}/{name}: {source}")]
    Api {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("lost the leader-election Lease {namespace}/{name}: not renewed within {deadline:?}")]
    Lost {
        namespace: String,
        name: String,
        deadline: Duration,
    },
}

#[derive(Clone, Debug)]
pub struct Config {
    pub namespace: String,
    pub name: String,
    pub identity: String,
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
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "karpenter-capi".to_string());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{host}_{}_{nanos:08x}", std::process::id())
}

/// Campaign until elected, then renew. `leader` turns true on election. Returns `Err(Lost)`
/// when leadership is lost; the caller exits.
pub async fn run(
    client: kube::Client,
    cfg: Config,
    leader: watch::Sender<bool>,
) -> Result<(), Error> {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut last_renew = tokio::time::Instant::now();
    loop {
        let now = jiff::Timestamp::now();
        match try_acquire_or_renew(&api, &cfg, now).await {
            Ok(true) => {
                last_renew = tokio::time::Instant::now();
                if !*leader.borrow() {
                    tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became leader");
                    leader.send_replace(true);
                }
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "leader election attempt failed"),
        }
        if *leader.borrow() && last_renew.elapsed() > cfg.renew_deadline {
            leader.send_replace(false);
            return Err(Error::Lost {
                namespace: cfg.namespace.clone(),
                name: cfg.name.clone(),
                deadline: cfg.renew_deadline,
            });
        }
        tokio::time::sleep(cfg.retry_period).await;
    }
}

/// One round: true when we hold the lease afterwards. All writes are compare-and-swap on the
/// Lease's resourceVersion, so two candidates can never both win.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Result<bool, Error> {
    let err = |source| Error::Api {
        namespace: cfg.namespace.clone(),
        name: cfg.name.clone(),
        source,
    };
    let Some(mut lease) = api.get_opt(&cfg.name).await.map_err(err)? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                ..Default::default()
            },
            spec: Some(held_spec(cfg, now, now, 0)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(err(e)),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let ours = spec.holder_identity.as_deref() == Some(cfg.identity.as_str());
    if !ours && !expired(&spec, now) {
        return Ok(false);
    }
    let acquired = if ours {
        spec.acquire_time.map(|t| t.0).unwrap_or(now)
    } else {
        now
    };
    let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
    lease.spec = Some(held_spec(cfg, acquired, now, transitions));
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(err(e)),
    }
}

fn held_spec(
    cfg: &Config,
    acquired: jiff::Timestamp,
    now: jiff::Timestamp,
    transitions: i32,
) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(i32::try_from(cfg.lease_duration.as_secs()).unwrap_or(15)),
        acquire_time: Some(MicroTime(acquired)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

/// A lease with no holder, no renew time or a renew time older than its duration is free.
fn expired(spec: &LeaseSpec, now: jiff::Timestamp) -> bool {
    let (Some(holder), Some(renew)) = (&spec.holder_identity, &spec.renew_time) else {
        return true;
    };
    if holder.is_empty() {
        return true;
    }
    let duration =
        jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    renew
        .0
        .checked_add(duration)
        .map(|until| until < now)
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed_secs_ago: i64) -> LeaseSpec {
        let now = jiff::Timestamp::now();
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(
                now - jiff::SignedDuration::from_secs(renewed_secs_ago),
            )),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }
    }

    #[test]
    fn lease_expiry() {
        let now = jiff::Timestamp::now();
        assert!(!expired(&spec("a", 3), now));
        assert!(expired(&spec("a", 20), now));
        assert!(expired(&spec("", 1), now));
        assert!(expired(&LeaseSpec::default(), now));
    }
}
