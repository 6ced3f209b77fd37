//! The controller's HTTP endpoints: `/metrics` on the metrics port, `/healthz` and `/readyz` on
//! the health-probe port (Karpenter's defaults 8080 and 8081). One tiny hyper server serves both;
//! they are separate listeners so a NetworkPolicy can expose metrics without probes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Liveness and readiness as seen by the probes. `ready` turns true once the caches have synced;
/// a replica that is not the leader is still ready (it watches, serves /metrics and can take
/// over), so a Deployment of two replicas becomes Available. Leadership is a separate fact
/// (`leader`, the `karpenter_capi_leader` gauge), shown in the /readyz body only.
#[derive(Default)]
pub struct Health {
    pub(crate) ready: AtomicBool,
    pub(crate) leader: AtomicBool,
}

impl Health {
    pub(crate) fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }
}

/// Bind both listeners now (so a port conflict fails start-up loudly), then serve on the current
/// runtime. Returns the bound addresses (useful when a port of 0 was asked for).
pub async fn serve<E: Exposition>(
    metrics_addr: SocketAddr,
    health_addr: SocketAddr,
    metrics: Arc<E>,
    health: Arc<Health>,
) -> Result<(SocketAddr, SocketAddr), Error> {
    let m = bind(metrics_addr).await?;
    let h = bind(health_addr).await?;
    let bound = (local(&m, metrics_addr), local(&h, health_addr));
    tokio::spawn(accept_loop(m, Some(metrics), health.clone()));
    tokio::spawn(accept_loop::<E>(h, None, health));
    Ok(bound)
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
}

fn local(l: &TcpListener, fallback: SocketAddr) -> SocketAddr {
    l.local_addr().unwrap_or(fallback)
}

/// What /metrics serves: one controller's metrics, or (fleet mode) several merged.
pub trait Exposition: Send + Sync + 'static {
    /// The OpenMetrics text exposition.
    fn encode(&self) -> String;
}

impl Exposition for Metrics {
    fn encode(&self) -> String {
        Metrics::encode(self)
    }
}

async fn accept_loop<E: Exposition>(
    listener: TcpListener,
    metrics: Option<Arc<E>>,
    health: Arc<Health>,
) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed on the metrics/health listener");
                continue;
            }
        };
        let (metrics, health) = (metrics.clone(), health.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let out = route(&req, metrics.as_deref(), &health);
                async move { Ok::<_, std::convert::Infallible>(out) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, "metrics/health connection ended with an error");
            }
        });
    }
}

fn route<E: Exposition>(
    req: &Request<Incoming>,
    metrics: Option<&E>,
    health: &Health,
) -> Response<Full<Bytes>> {
    match (req.uri().path(), metrics) {
        ("/metrics", Some(metrics)) => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        ("/healthz" | "/livez", _) => reply(StatusCode::OK, "text/plain", "ok".into()),
        ("/readyz", _) if health.ready.load(Ordering::Acquire) => {
            let role = if health.leader.load(Ordering::Acquire) {
                "ok: leader"
            } else {
                "ok: standby"
            };
            reply(StatusCode::OK, "text/plain", role.into())
        }
        ("/readyz", _) => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "caches not synced".into(),
        ),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found".into()),
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_and_probes() {
        let metrics = Metrics::new();
        let health = Arc::new(Health::default());
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let (m, h) = serve(any, any, metrics, health.clone()).await.unwrap();
        assert!(get(m, "/metrics").await.contains("karpenter_build_info"));
        assert!(get(h, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(h, "/readyz").await.starts_with("HTTP/1.1 503"));
        health.set_ready();
        let standby = get(h, "/readyz").await;
        assert!(
            standby.starts_with("HTTP/1.1 200"),
            "a synced standby is ready"
        );
        assert!(standby.ends_with("ok: standby"), "{standby}");
        health.leader.store(true, Ordering::Release);
        assert!(get(h, "/readyz").await.ends_with("ok: leader"));
        assert!(
            get(h, "/metrics").await.starts_with("HTTP/1.1 404"),
            "metrics only on the metrics port"
        );
    }
}
