//! Client-side rate limiting for the kube clients (`KUBE_CLIENT_QPS` / `KUBE_CLIENT_BURST`), as
//! client-go does: a token bucket in front of the HTTP stack, so a burst of launches cannot
//! overwhelm a shared API server. Requests wait for a token in `poll_ready`; nothing is dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tower::{Layer, Service};

/// Tokens refill at `qps` per second up to `burst`.
#[derive(Debug)]
pub(crate) struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub(crate) fn new(qps: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: f64::from(qps),
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Take a token now, or say how long until one is available.
    pub(crate) fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
    }
}

#[derive(Clone)]
pub(crate) struct RateLimitLayer {
    bucket: Option<Arc<Mutex<Bucket>>>,
}

impl RateLimitLayer {
    /// `qps` of 0 disables the limit.
    pub(crate) fn new(qps: u32, burst: u32) -> Self {
        Self {
            bucket: (qps > 0).then(|| Arc::new(Mutex::new(Bucket::new(qps, burst)))),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            sleep: None,
            has_token: false,
        }
    }
}

pub(crate) struct RateLimit<S> {
    inner: S,
    bucket: Option<Arc<Mutex<Bucket>>>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    has_token: bool,
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let Some(bucket) = &self.bucket {
            while !self.has_token {
                if let Some(s) = self.sleep.as_mut() {
                    ready!(s.as_mut().poll(cx));
                    self.sleep = None;
                }
                match bucket.lock().take(Instant::now()) {
                    Ok(()) => self.has_token = true,
                    Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.has_token = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_paces() {
        let start = Instant::now();
        let mut b = Bucket::new(10, 3);
        for _ in 0..3 {
            assert!(b.take(start).is_ok());
        }
        let wait = b.take(start).unwrap_err();
        assert!(
            wait > Duration::from_millis(90) && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        assert!(b.take(start + Duration::from_millis(100)).is_ok());
    }
}
