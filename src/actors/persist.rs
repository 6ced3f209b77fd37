//! Writes carried through a failing API server: a disruption command's (a taint, a claim's
//! mark, a candidate's delete) and every NodeClaim create (`claim_factory`). Each write is retried on transient errors with the write backoff
//! (`Backoff::write`), the server's `Retry-After` as its floor. After any failure whose outcome
//! is unknown (a 5xx, a timeout, a reset: the write may have landed) the object is read back
//! from the API before the write is sent again, so it is never repeated blindly, as the Scaler
//! reads back its replica writes. A command gives up, and is rolled back, only when the plan no
//! longer holds: the object is gone or being deleted, a conflict that reading the object again
//! does not resolve, an answer retrying cannot change (forbidden, invalid), or a server that
//! kept failing through every attempt.

use std::future::Future;
use std::time::Duration;

use crate::actors::Error;
use crate::actors::backoff::Backoff;
use crate::metrics::Metrics;

/// Attempts of one write before the command gives up: with the write backoff (50 ms doubling)
/// the last one comes 19-26 s after the first (the requests' own time aside), as the eighth did
/// with the API backoff (200 ms doubling), and at a 30 % error rate all of them fail about once
/// in 170,000 writes.
pub(crate) const MAX_ATTEMPTS: u32 = 10;

/// Conflicts in a row that re-reading did not resolve: someone else keeps writing the object.
pub(crate) const MAX_CONFLICTS: u32 = 3;

/// What a failed write means for the next attempt.
#[derive(Debug, PartialEq)]
pub(crate) enum Failure {
    /// The outcome is unknown or the server asked for time: back off, read back, try again.
    Transient,
    /// A lost compare-and-swap: read the object again and recompute the write.
    Conflict,
    /// The plan no longer holds (gone, being deleted) or retrying cannot help.
    Final,
}

pub(crate) fn classify(e: &Error) -> Failure {
    match e {
        Error::Timeout { .. } => Failure::Transient,
        Error::Api { verb, source, .. } => match source {
            kube::Error::Api(s) => match s.code {
                // A create's 422 is an invalid object, which no retry changes; a patch's is a
                // failed JSON patch `test`, a lost compare-and-swap.
                422 if *verb == "create" => Failure::Final,
                409 | 422 => Failure::Conflict,
                429 | 500..=599 => Failure::Transient,
                _ => Failure::Final,
            },
            // No answer (a reset, a timeout) or one that could not be read: unknown outcome.
            _ => Failure::Transient,
        },
        Error::Gone { .. } | Error::Patch { .. } | Error::Model { .. } => Failure::Final,
    }
}

/// Run `attempt` until it succeeds, retrying transient failures and conflicts. `attempt` gets
/// `true` once an earlier attempt failed: it then reads the object from the API (not the
/// indexes, which may lag) and returns at once when the earlier write already landed.
pub(crate) async fn persist<T, Fut>(
    what: &str,
    mut attempt: impl FnMut(bool) -> Fut,
) -> Result<T, Error>
where
    Fut: Future<Output = Result<T, Error>>,
{
    persist_with(what, Backoff::write(), &mut |_| {}, &mut attempt).await
}

/// `persist` for one of a disruption command's writes (`write`: taint, mark, create, delete):
/// each retry and its wait are counted, so a slow command shows where its time went.
pub(crate) async fn persist_counted<T, Fut>(
    metrics: &Metrics,
    write: &str,
    what: &str,
    mut attempt: impl FnMut(bool) -> Fut,
) -> Result<T, Error>
where
    Fut: Future<Output = Result<T, Error>>,
{
    let mut count = |waited| metrics.disruption_write_retry(write, waited);
    persist_with(what, Backoff::write(), &mut count, &mut attempt).await
}

async fn persist_with<T, Fut>(
    what: &str,
    mut backoff: Backoff,
    retried: &mut impl FnMut(Duration),
    attempt: &mut impl FnMut(bool) -> Fut,
) -> Result<T, Error>
where
    Fut: Future<Output = Result<T, Error>>,
{
    let mut conflicts = 0;
    let mut failed = false;
    loop {
        let e = match attempt(failed).await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        failed = true;
        let wait = match classify(&e) {
            Failure::Final => return Err(e),
            Failure::Conflict => {
                conflicts += 1;
                if conflicts >= MAX_CONFLICTS {
                    return Err(e);
                }
                Duration::ZERO
            }
            Failure::Transient => {
                conflicts = 0;
                if backoff.attempts() + 1 >= MAX_ATTEMPTS {
                    return Err(e);
                }
                backoff.next_delay_after(e.retry_after())
            }
        };
        tracing::info!(error = %e, retry_in = ?wait, "{what} failed; reading back and retrying");
        tokio::time::sleep(wait).await;
        retried(wait);
    }
}

/// Five characters from the alphabet kube-apiserver's `generateName` uses (no vowels, no
/// look-alikes): 14 million names per pool.
pub(crate) fn name_suffix() -> String {
    use rand::{Rng, SeedableRng};
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rngs::SmallRng::seed_from_u64(crate::actors::backoff::seed());
    (0..5)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> Error {
        Error::Api {
            verb: "patch",
            kind: "nodes",
            name: "n".into(),
            source: kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            })),
        }
    }

    fn gone() -> Error {
        Error::Gone { what: "x".into() }
    }

    /// Replays `answers`, noting whether each attempt was told to read back first.
    async fn run(answers: Vec<Result<u8, Error>>) -> (Result<u8, Error>, Vec<bool>) {
        let answers = std::cell::RefCell::new(answers.into_iter());
        let seen = std::cell::RefCell::new(Vec::new());
        let fast = Backoff::new(Duration::from_millis(1), Duration::from_millis(2));
        let r = persist_with("writing", fast, &mut |_| {}, &mut |fresh| {
            seen.borrow_mut().push(fresh);
            let next = answers.borrow_mut().next().unwrap_or(Ok(0));
            async move { next }
        })
        .await;
        (r, seen.into_inner())
    }

    #[tokio::test]
    async fn a_500_is_read_back_and_retried() {
        let (r, seen) = run(vec![Err(api(500)), Ok(7)]).await;
        assert_eq!(r.ok(), Some(7));
        assert_eq!(seen, vec![false, true]);
    }

    #[tokio::test]
    async fn gone_and_forbidden_end_at_once() {
        let (r, seen) = run(vec![Err(gone()), Ok(7)]).await;
        assert!(matches!(r, Err(Error::Gone { .. })));
        assert_eq!(seen.len(), 1);
        let (r, seen) = run(vec![Err(api(403))]).await;
        assert!(r.is_err());
        assert_eq!(seen.len(), 1);
    }

    #[tokio::test]
    async fn conflicts_that_rereading_does_not_resolve_end_it() {
        let (r, seen) = run((0..5).map(|_| Err(api(409))).collect()).await;
        assert!(r.is_err());
        assert_eq!(seen.len() as u32, MAX_CONFLICTS);
        let (r, _) = run(vec![Err(api(409)), Err(api(503)), Err(api(409)), Ok(1)]).await;
        assert_eq!(
            r.ok(),
            Some(1),
            "a transient error in between starts the count again"
        );
    }

    #[tokio::test]
    async fn a_server_that_keeps_failing_ends_it_after_the_attempts() {
        let (r, seen) = run((0..20).map(|_| Err(api(503))).collect()).await;
        assert!(r.is_err());
        assert_eq!(seen.len() as u32, MAX_ATTEMPTS);
    }

    #[test]
    fn classified_as_the_api_server_means_them() {
        assert_eq!(classify(&api(429)), Failure::Transient);
        assert_eq!(classify(&api(504)), Failure::Transient);
        assert_eq!(classify(&api(422)), Failure::Conflict);
        assert_eq!(classify(&api(404)), Failure::Final);
        assert_eq!(classify(&api(400)), Failure::Final);
        let create = |code| match api(code) {
            Error::Api {
                kind, name, source, ..
            } => Error::Api {
                verb: "create",
                kind,
                name,
                source,
            },
            e => e,
        };
        assert_eq!(classify(&create(422)), Failure::Final, "an invalid object");
        assert_eq!(classify(&create(409)), Failure::Conflict, "read back");
        let timeout = Error::Timeout {
            what: "w".into(),
            after: Duration::from_secs(1),
        };
        assert_eq!(classify(&timeout), Failure::Transient);
    }
}
