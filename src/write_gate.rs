//! A gate on a kube client's writes, for shutdown and loss of leadership: once closed, no new
//! write leaves this process (it fails at once, before reaching the API server), and the writes
//! already on the wire can be waited for with a bound. Stopping the actors alone cannot promise
//! this: an actor that is mid-reconcile may start one more write, and a stopped actor's dropped
//! future may or may not have sent its request. Lease requests (coordination.k8s.io) pass
//! always, because releasing the Lease is the last write of a shutdown.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::{Method, Request};
use tokio::sync::Notify;
use tower::{Layer, Service};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
#[error("{method} {path} refused: this replica is shutting down or no longer leads")]
pub(crate) struct Closed {
    pub(crate) method: Method,
    pub(crate) path: String,
}

#[derive(Debug, Default)]
struct Inner {
    closed: AtomicBool,
    in_flight: AtomicUsize,
    idle: Notify,
}

/// Shared by every client of one replica (clones share the state).
#[derive(Clone, Debug, Default)]
pub struct WriteGate {
    inner: Arc<Inner>,
}

impl WriteGate {
    /// Refuse every write that has not started yet.
    pub(crate) fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Writes sent and not answered yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::Acquire)
    }

    /// Wait until no write is in flight, at most `within`; true when drained.
    pub(crate) async fn drained(&self, within: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.inner.idle.notified();
                if self.in_flight() == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }

    pub(crate) fn layer(&self) -> WriteGateLayer {
        WriteGateLayer(self.clone())
    }
}

/// A write is anything but a read; the Lease is exempt (see the module comment).
fn gated<B>(req: &Request<B>) -> bool {
    !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS)
        && !req.uri().path().starts_with("/apis/coordination.k8s.io/")
}

/// Counts one write in flight until dropped (answered, failed or cancelled).
struct InFlight(Arc<Inner>);

impl InFlight {
    fn new(inner: &Arc<Inner>) -> Self {
        inner.in_flight.fetch_add(1, Ordering::AcqRel);
        Self(inner.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[derive(Clone)]
pub(crate) struct WriteGateLayer(WriteGate);

impl<S> Layer<S> for WriteGateLayer {
    type Service = Gated<S>;
    fn layer(&self, inner: S) -> Gated<S> {
        Gated {
            inner,
            gate: self.0.clone(),
        }
    }
}

pub(crate) struct Gated<S> {
    inner: S,
    gate: WriteGate,
}

impl<S, B> Service<Request<B>> for Gated<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if !gated(&req) {
            let fut = self.inner.call(req);
            return Box::pin(async move { fut.await.map_err(Into::into) });
        }
        // Count before the closed check so that `close` then `drained` cannot miss a write that
        // passed the check concurrently.
        let guard = InFlight::new(&self.gate.inner);
        if self.gate.is_closed() {
            let closed = Closed {
                method: req.method().clone(),
                path: req.uri().path().to_string(),
            };
            drop(guard);
            return Box::pin(async move { Err(closed.into()) });
        }
        let fut = self.inner.call(req);
        Box::pin(async move {
            let out = fut.await.map_err(Into::into);
            drop(guard);
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A service that answers when told to.
    #[derive(Clone)]
    struct Held(Arc<Notify>);

    impl Service<Request<()>> for Held {
        type Response = &'static str;
        type Error = std::convert::Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<&'static str, Self::Error>> + Send>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, r: Request<()>) -> Self::Future {
            let n = self.0.clone();
            let hold = r.method() == Method::PATCH;
            Box::pin(async move {
                if hold {
                    n.notified().await;
                }
                Ok("done")
            })
        }
    }

    fn req(method: Method, path: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .expect("request")
    }

    #[tokio::test]
    async fn closed_gate_refuses_new_writes_and_waits_for_the_ones_in_flight() {
        let gate = WriteGate::default();
        let release = Arc::new(Notify::new());
        let mut svc = gate.layer().layer(Held(release.clone()));
        let write = svc.call(req(Method::PATCH, "/api/v1/nodes/a"));
        let in_flight = tokio::spawn(write);
        assert_eq!(gate.in_flight(), 1);
        gate.close();
        let refused = svc
            .call(req(Method::POST, "/api/v1/namespaces/d/events"))
            .await;
        assert!(refused.is_err(), "a write after close is refused");
        assert!(
            !gate.drained(Duration::from_millis(50)).await,
            "the write in flight is still counted"
        );
        // Reads and the Lease still pass after close.
        assert!(svc.call(req(Method::GET, "/api/v1/nodes")).await.is_ok());
        let lease = "/apis/coordination.k8s.io/v1/namespaces/d/leases/l";
        assert!(svc.call(req(Method::PUT, lease)).await.is_ok());
        // The held write registers its waiter when first polled.
        while !in_flight.is_finished() {
            release.notify_waiters();
            tokio::task::yield_now().await;
        }
        assert_eq!(in_flight.await.expect("join").expect("answered"), "done");
        assert!(gate.drained(Duration::from_secs(5)).await);
    }
}
