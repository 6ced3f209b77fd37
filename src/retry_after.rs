//! The API server's `Retry-After`, honoured by every kube client as client-go honours it: a 429
//! (API Priority and Fairness, a server asking for less) or a 503 that carries the header is sent
//! again after the time it asks for, not before, a few times within the one call. Answers
//! without the header pass through at once: a PodDisruptionBudget's 429 on an eviction is an
//! answer for the caller, whose own backoff (`actors::backoff`) takes over, and which reads the
//! same wait from the Status body (`retry_after`) when the retries here ran out.
//!
//! Each wait is capped at `MAX_WAIT`, the longest the shared API backoff ever waits: a longer
//! one (a proxy's date far ahead, a skewed clock) would stall a write past the callers' own
//! deadlines, and the caller's next attempt asks again anyway.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::{Method, Request, Response, StatusCode};
use kube::client::Body;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tower::{BoxError, Layer, Service};

use crate::metrics::ApiErrorLabels;

/// The longest one `Retry-After` is waited for.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(30);

/// How many times one call is sent again on `Retry-After` (client-go's default is 10; our
/// callers retry on their own, so fewer here keeps one call from blocking its caller for long).
pub(crate) const MAX_RETRIES: u32 = 5;

/// Throttled requests by verb and resource.
pub(crate) type Throttled = Family<ApiErrorLabels, Counter>;

/// The wait a response asks for: 429 or 503 with `Retry-After` in delta-seconds or an HTTP date,
/// capped at `MAX_WAIT`. None for any other answer.
pub(crate) fn wait_of<B>(response: &Response<B>) -> Option<Duration> {
    if !matches!(
        response.status(),
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        return None;
    }
    let value = response.headers().get(hyper::header::RETRY_AFTER)?;
    parse(value.to_str().ok()?.trim(), jiff::Timestamp::now())
}

/// `Retry-After` as of `now`: delta-seconds, or an HTTP date (a date in the past is a wait of 0).
pub(crate) fn parse(value: &str, now: jiff::Timestamp) -> Option<Duration> {
    let wait = match value.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let at = jiff::fmt::rfc2822::DateTimeParser::new()
                .parse_timestamp(value)
                .ok()?;
            Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO)
        }
    };
    Some(wait.min(MAX_WAIT))
}

/// The wait a refused call's Status asks for (`details.retryAfterSeconds`, which the API server
/// sends along with the header), capped at `MAX_WAIT`.
pub(crate) fn retry_after(error: &kube::Error) -> Option<Duration> {
    let kube::Error::Api(status) = error else {
        return None;
    };
    let secs = status.details.as_ref()?.retry_after_seconds;
    (secs > 0).then(|| Duration::from_secs(u64::from(secs)).min(MAX_WAIT))
}

/// The verb and resource of a request, as the API server's audit log and client-go's metrics
/// name them (`pods/eviction` for a subresource).
pub(crate) fn verb_and_resource<B>(req: &Request<B>) -> (&'static str, String) {
    let segments: Vec<&str> = req
        .uri()
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..),
        Some(&"apis") => segments.get(3..),
        _ => None,
    }
    .unwrap_or_default();
    // namespaces/<ns>/<resource>... unless the namespace itself is the object.
    let rest = match rest {
        ["namespaces", _, resource, tail @ ..] => {
            let mut r = vec![*resource];
            r.extend(tail);
            r
        }
        other => other.to_vec(),
    };
    let resource = match rest.as_slice() {
        [] => String::new(),
        [r] | [r, _] => (*r).to_string(),
        [r, _, sub, ..] => format!("{r}/{sub}"),
    };
    let named = rest.len() >= 2;
    let watch = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match *req.method() {
        Method::GET if watch => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

#[derive(Clone, Default)]
pub(crate) struct RetryAfterLayer {
    throttled: Option<Throttled>,
}

impl RetryAfterLayer {
    /// Counting throttled requests in `throttled` when given.
    pub(crate) fn new(throttled: Option<Throttled>) -> Self {
        Self { throttled }
    }
}

impl<S> Layer<S> for RetryAfterLayer {
    type Service = RetryAfter<S>;
    fn layer(&self, inner: S) -> RetryAfter<S> {
        RetryAfter {
            inner: Arc::new(tokio::sync::Mutex::new(inner)),
            throttled: self.throttled.clone(),
        }
    }
}

/// The inner stack is shared by a call's attempts: each attempt waits for its readiness (the
/// rate limit's token, the write gate) as a first attempt does.
pub(crate) struct RetryAfter<S> {
    inner: Arc<tokio::sync::Mutex<S>>,
    throttled: Option<Throttled>,
}

impl<S, B> Service<Request<Body>> for RetryAfter<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is awaited per attempt, inside the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let throttled = self.throttled.clone();
        Box::pin(async move {
            let (verb, resource) = verb_and_resource(&req);
            let mut req = req;
            let mut retries = 0;
            loop {
                let again = copy(&req);
                let sent = {
                    let mut svc = inner.lock().await;
                    std::future::poll_fn(|cx| svc.poll_ready(cx))
                        .await
                        .map_err(Into::into)?;
                    svc.call(req)
                };
                let response = sent.await.map_err(Into::into)?;
                let Some(wait) = wait_of(&response) else {
                    return Ok(response);
                };
                if let Some(t) = &throttled {
                    t.get_or_create(&ApiErrorLabels {
                        verb: verb.to_string(),
                        resource: resource.clone(),
                    })
                    .inc();
                }
                // A streamed body cannot be sent twice: the caller gets the answer.
                let Some(next) = again.filter(|_| retries < MAX_RETRIES) else {
                    return Ok(response);
                };
                retries += 1;
                tracing::debug!(verb, resource = %resource, wait = ?wait, retries, "the API server asked to retry later");
                drop(response);
                tokio::time::sleep(wait).await;
                req = next;
            }
        })
    }
}

/// The same request again, when its body is held in memory (every kube call but streams).
fn copy(req: &Request<Body>) -> Option<Request<Body>> {
    let body = req.body().try_clone()?;
    let mut again = Request::new(body);
    *again.method_mut() = req.method().clone();
    *again.uri_mut() = req.uri().clone();
    *again.version_mut() = req.version();
    *again.headers_mut() = req.headers().clone();
    *again.extensions_mut() = req.extensions().clone();
    Some(again)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers 429 `Retry-After: <secs>` to the first request and 200 after,
    /// noting when (on tokio's clock) each request came.
    #[derive(Clone)]
    struct Throttling {
        secs: &'static str,
        seen: Arc<parking_lot::Mutex<Vec<tokio::time::Instant>>>,
    }

    impl Service<Request<Body>> for Throttling {
        type Response = Response<()>;
        type Error = std::convert::Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Response<()>, Self::Error>> + Send>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request<Body>) -> Self::Future {
            let mut seen = self.seen.lock();
            seen.push(tokio::time::Instant::now());
            let first = seen.len() == 1;
            let secs = self.secs;
            Box::pin(async move {
                let mut r = Response::builder();
                if first {
                    r = r
                        .status(StatusCode::TOO_MANY_REQUESTS)
                        .header(hyper::header::RETRY_AFTER, secs);
                }
                Ok(r.body(()).expect("response"))
            })
        }
    }

    fn patch() -> Request<Body> {
        Request::builder()
            .method(Method::PATCH)
            .uri("/api/v1/nodes/a")
            .body(Body::from(b"[]".to_vec()))
            .expect("request")
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_with_retry_after_2_is_retried_after_2_s_not_before() {
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let throttled = Throttled::default();
        let mut svc = RetryAfterLayer::new(Some(throttled.clone())).layer(Throttling {
            secs: "2",
            seen: seen.clone(),
        });
        let response = svc.call(patch()).await;
        assert_eq!(response.expect("answered").status(), StatusCode::OK);
        let seen = seen.lock().clone();
        assert_eq!(seen.len(), 2, "sent once more after the 429");
        assert_eq!(seen[1] - seen[0], Duration::from_secs(2));
        let labels = ApiErrorLabels {
            verb: "patch".into(),
            resource: "nodes".into(),
        };
        assert_eq!(throttled.get_or_create(&labels).get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_beyond_the_cap_is_cut_to_it() {
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut svc = RetryAfterLayer::default().layer(Throttling {
            secs: "3600",
            seen: seen.clone(),
        });
        let response = svc.call(patch()).await;
        assert_eq!(response.expect("answered").status(), StatusCode::OK);
        let seen = seen.lock().clone();
        assert_eq!(seen[1] - seen[0], MAX_WAIT);
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now: jiff::Timestamp = "1994-11-06T08:49:30Z".parse().expect("time");
        assert_eq!(parse("2", now), Some(Duration::from_secs(2)));
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse("120", now), Some(MAX_WAIT));
        assert_eq!(parse("soon", now), None);
        let no_header = Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .body(())
            .expect("response");
        assert_eq!(wait_of(&no_header), None, "a PDB's 429 passes through");
        let error = Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .header(hyper::header::RETRY_AFTER, "1")
            .body(())
            .expect("response");
        assert_eq!(wait_of(&error), None);
    }

    #[test]
    fn verbs_and_resources_as_the_audit_log_names_them() {
        let req = |m: Method, uri: &str| {
            Request::builder()
                .method(m)
                .uri(uri)
                .body(())
                .expect("request")
        };
        let cases = [
            (req(Method::GET, "/api/v1/nodes"), ("list", "nodes")),
            (
                req(Method::GET, "/api/v1/nodes?watch=true&resourceVersion=1"),
                ("watch", "nodes"),
            ),
            (req(Method::GET, "/api/v1/nodes/a"), ("get", "nodes")),
            (
                req(Method::POST, "/api/v1/namespaces/d/pods/p/eviction"),
                ("create", "pods/eviction"),
            ),
            (
                req(Method::PATCH, "/apis/karpenter.sh/v1/nodeclaims/c/status"),
                ("patch", "nodeclaims/status"),
            ),
            (
                req(Method::DELETE, "/apis/karpenter.sh/v1/nodeclaims/c"),
                ("delete", "nodeclaims"),
            ),
            (
                req(
                    Method::PUT,
                    "/apis/coordination.k8s.io/v1/namespaces/k/leases/l",
                ),
                ("update", "leases"),
            ),
            (
                req(Method::GET, "/api/v1/namespaces/kube-system"),
                ("get", "namespaces"),
            ),
        ];
        for (r, (verb, resource)) in cases {
            let (v, res) = verb_and_resource(&r);
            assert_eq!((v, res.as_str()), (verb, resource), "{}", r.uri());
        }
    }
}
