//! Shadow mode (`run --dry-run`): a layer under every kube client that lets reads through and
//! sends no write at all. Each write the controller means to make is recorded (in memory, and as
//! one JSON line in the decision log) and answered here as the API server would have answered
//! it had it succeeded, so the caller carries on: a create gets back its object with a name and
//! UID, a patch the object read now with the patch applied, a delete the object marked deleting.
//! Nothing of it reaches the server; the layer shows the answers back to the controller's own
//! reads and watches instead (`overlay`), so its later decisions build on its earlier ones as
//! in a writing run. What only another controller would do after a write (Cluster API making
//! a Machine, a kubelet a Node) is not simulated.
//!
//! `Shadow::recording` is the same record with every write sent: the log of a writing run, to
//! compare with a dry run's decision for decision.

use std::fs::File;
use std::future::Future;
use std::io::Write as _;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Response, StatusCode};
use kube::client::{Body, DynBody};
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{Value, json};
use tower::{BoxError, Layer, Service};

mod overlay;

/// One write the controller meant to make.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Intended {
    pub verb: String,
    pub resource: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(crate) namespace: String,
    pub name: String,
    /// The request body (a created object, a patch), null for a delete.
    pub body: Value,
}

#[derive(Default)]
struct Inner {
    intended: Mutex<Vec<Intended>>,
    log: Mutex<Option<File>>,
    serial: AtomicU64,
    overlay: overlay::Overlay,
    /// Record and send (a writing run's log) rather than refuse.
    pass_through: bool,
}

/// Shared by every client of the process; clones share the record.
#[derive(Clone, Default)]
pub struct Shadow {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shadow")
            .field("intended", &self.inner.intended.lock().len())
            .finish()
    }
}

impl Shadow {
    /// Recording in memory and, when `log` is given, as JSON lines in that file.
    pub fn new(log: Option<&Path>) -> std::io::Result<Self> {
        let file = log.map(File::create).transpose()?;
        let shadow = Shadow::default();
        *shadow.inner.log.lock() = file;
        Ok(shadow)
    }

    /// Every write recorded and sent, in memory: a writing run's decisions in the form a dry
    /// run logs them.
    pub fn recording() -> Self {
        Shadow {
            inner: Arc::new(Inner {
                pass_through: true,
                ..Inner::default()
            }),
        }
    }

    /// A dry run's shadow: no write is sent (a recording one sends them all).
    #[cfg(feature = "simulator")]
    pub(crate) fn refuses_writes(&self) -> bool {
        !self.inner.pass_through
    }

    /// Every write refused (or, recording, sent) so far, in order.
    pub fn intended(&self) -> Vec<Intended> {
        self.inner.intended.lock().clone()
    }

    pub(crate) fn layer(&self) -> ShadowLayer {
        ShadowLayer(self.clone())
    }

    fn record(&self, i: Intended) {
        if let Some(f) = self.inner.log.lock().as_mut() {
            let line = serde_json::to_string(&i).unwrap_or_default();
            // The log is a report: a full disk must not stop the controller.
            if let Err(e) = writeln!(f, "{line}") {
                tracing::warn!(error = %e, "cannot write the decision log");
            }
        }
        tracing::info!(verb = %i.verb, resource = %i.resource, subresource = %i.subresource, namespace = %i.namespace, name = %i.name, "dry run: not written");
        self.inner.intended.lock().push(i);
    }

    fn serial(&self) -> u64 {
        self.inner.serial.fetch_add(1, Ordering::Relaxed) + 1
    }
}

#[derive(Clone)]
pub(crate) struct ShadowLayer(Shadow);

impl<S> Layer<S> for ShadowLayer {
    type Service = Shadowed<S>;
    fn layer(&self, inner: S) -> Shadowed<S> {
        Shadowed {
            inner: Arc::new(tokio::sync::Mutex::new(inner)),
            shadow: self.0.clone(),
        }
    }
}

/// The inner stack is shared: a refused patch or delete reads its object through it.
pub(crate) struct Shadowed<S> {
    inner: Arc<tokio::sync::Mutex<S>>,
    shadow: Shadow,
}

type Answer = Response<Box<DynBody>>;

fn read_only(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

impl<S> Service<Request<Body>> for Shadowed<S>
where
    S: Service<Request<Body>, Response = Answer> + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Answer;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let shadow = self.shadow.clone();
        Box::pin(async move {
            if shadow.inner.pass_through && read_only(req.method()) {
                return send(&inner, req).await;
            }
            if read_only(req.method()) {
                return read(&inner, &shadow, req).await;
            }
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.map_err(Box::new)?;
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let path = Path_::parse(parts.uri.path());
            let verb = match parts.method {
                Method::POST => "create",
                Method::PUT => "update",
                Method::PATCH => "patch",
                Method::DELETE => "delete",
                _ => "other",
            };
            shadow.record(Intended {
                verb: verb.into(),
                resource: path.resource.clone(),
                subresource: path.subresource.clone(),
                namespace: path.namespace.clone(),
                name: path.name.clone(),
                body: body.clone(),
            });
            if shadow.inner.pass_through {
                let req = Request::from_parts(parts, Body::from(bytes.to_vec()));
                return send(&inner, req).await;
            }
            let overlay = &shadow.inner.overlay;
            let kind = parts
                .headers
                .get(hyper::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let evicted = path.subresource == "eviction";
            match parts.method {
                Method::POST if !path.subresource.is_empty() && !evicted => {
                    Ok(answer(StatusCode::CREATED, &status_success()))
                }
                Method::POST if !evicted => {
                    let object = created(body, &shadow);
                    overlay.put(&path.collection, object.clone(), true);
                    Ok(answer(StatusCode::CREATED, &object))
                }
                Method::PUT => {
                    overlay.put(&path.collection, body.clone(), false);
                    Ok(answer(StatusCode::OK, &body))
                }
                Method::PATCH | Method::DELETE | Method::POST => {
                    let object = match current(&inner, overlay, &path).await? {
                        Ok(o) => o,
                        Err(refused) => return Ok(refused),
                    };
                    let result = if parts.method == Method::PATCH {
                        patched(object, body, &kind)
                    } else {
                        // A delete, or an eviction, which deletes the pod.
                        Ok(deleting(object))
                    };
                    Ok(match result {
                        Ok(o) => {
                            overlay.put(&path.collection, o.clone(), false);
                            match evicted {
                                true => answer(StatusCode::CREATED, &status_success()),
                                false => answer(StatusCode::OK, &o),
                            }
                        }
                        Err(message) => answer(StatusCode::CONFLICT, &status_conflict(&message)),
                    })
                }
                _ => Ok(answer(StatusCode::OK, &status_success())),
            }
        })
    }
}

/// A read answered with the dry run's writes in place: an object it wrote from what it wrote,
/// a list with them merged, a watch with them spliced in.
async fn read<S>(
    inner: &tokio::sync::Mutex<S>,
    shadow: &Shadow,
    req: Request<Body>,
) -> Result<Answer, BoxError>
where
    S: Service<Request<Body>, Response = Answer>,
    S::Error: Into<BoxError>,
{
    let overlay = &shadow.inner.overlay;
    let path = Path_::parse(req.uri().path());
    let watch = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    if req.method() != Method::GET {
        return send(inner, req).await;
    }
    if !path.name.is_empty() && path.subresource.is_empty() {
        if let Some(written) = overlay.get(&path.key()) {
            return Ok(match written {
                Some(o) => answer(StatusCode::OK, &o),
                None => answer(StatusCode::NOT_FOUND, &status_not_found(&path)),
            });
        }
        return send(inner, req).await;
    }
    if !path.name.is_empty() {
        return send(inner, req).await;
    }
    let response = send(inner, req).await?;
    if !response.status().is_success() {
        return Ok(response);
    }
    let (parts, body) = response.into_parts();
    if watch {
        let body = overlay.watch(&path.collection, &path.namespace, body);
        return Ok(Response::from_parts(parts, body));
    }
    let bytes = body.collect().await?.to_bytes();
    let mut list: Value = serde_json::from_slice(&bytes)?;
    overlay.merge_list(&path.collection, &path.namespace, &mut list);
    Ok(answer(parts.status, &list))
}

/// The object a patch, delete or eviction applies to: as the dry run left it, else as the
/// server has it; Err is the server's (or a not-found) answer to pass on.
async fn current<S>(
    inner: &tokio::sync::Mutex<S>,
    overlay: &overlay::Overlay,
    path: &Path_,
) -> Result<Result<Value, Answer>, BoxError>
where
    S: Service<Request<Body>, Response = Answer>,
    S::Error: Into<BoxError>,
{
    match overlay.get(&path.key()) {
        Some(Some(o)) => return Ok(Ok(o)),
        Some(None) => return Ok(Err(answer(StatusCode::NOT_FOUND, &status_not_found(path)))),
        None => {}
    }
    let get = Request::get(path.object.as_str())
        .body(Body::empty())
        .map_err(Box::new)?;
    let current = send(inner, get).await?;
    if !current.status().is_success() {
        return Ok(Err(current));
    }
    let bytes = current.into_body().collect().await?.to_bytes();
    Ok(Ok(serde_json::from_slice(&bytes)?))
}

async fn send<S>(inner: &tokio::sync::Mutex<S>, req: Request<Body>) -> Result<Answer, BoxError>
where
    S: Service<Request<Body>, Response = Answer>,
    S::Error: Into<BoxError>,
{
    let sent = {
        let mut svc = inner.lock().await;
        std::future::poll_fn(|cx| svc.poll_ready(cx))
            .await
            .map_err(Into::into)?;
        svc.call(req)
    };
    sent.await.map_err(Into::into)
}

fn answer(status: StatusCode, body: &Value) -> Answer {
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap_or_default());
    let body: Box<DynBody> = Box::new(Full::new(bytes).map_err(|never| match never {}));
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn status_success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})
}

fn status_not_found(path: &Path_) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
           "code": 404, "message": format!("{} \"{}\" not found", path.resource, path.name)})
}

fn status_conflict(message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict",
           "code": 409, "message": message})
}

/// A created object as the server returns it: named (from `generateName` when unnamed), with a
/// UID, a resourceVersion and a creation time.
fn created(mut o: Value, shadow: &Shadow) -> Value {
    let n = shadow.serial();
    let meta = &mut o["metadata"];
    if meta["name"].as_str().is_none_or(str::is_empty) {
        let prefix = meta["generateName"].as_str().unwrap_or("").to_string();
        meta["name"] = json!(format!("{prefix}dry{n:05}"));
    }
    meta["uid"] = json!(format!("00000000-0000-0000-0000-{n:012}"));
    meta["resourceVersion"] = json!("1");
    meta["creationTimestamp"] = json!(jiff::Timestamp::now().to_string());
    o
}

fn deleting(mut o: Value) -> Value {
    o["metadata"]["deletionTimestamp"] = json!(jiff::Timestamp::now().to_string());
    o
}

/// The patch applied to the object read now, by its content type (a strategic merge or an apply
/// is taken as a merge: every patch this controller sends reads the same either way).
fn patched(mut o: Value, patch: Value, kind: &str) -> Result<Value, String> {
    if kind.starts_with("application/json-patch") {
        let p: json_patch::Patch = serde_json::from_value(patch).map_err(|e| e.to_string())?;
        json_patch::patch(&mut o, &p).map_err(|e| e.to_string())?;
    } else {
        json_patch::merge(&mut o, &patch);
    }
    Ok(o)
}

/// A request path's parts: `/api/v1/namespaces/ns/pods/name/eviction`,
/// `/apis/group/version/resource/name/status`.
struct Path_ {
    resource: String,
    namespace: String,
    name: String,
    subresource: String,
    /// The object's own path (no subresource, no query).
    object: String,
    /// The resource's path across namespaces: `/api/v1/pods`, `/apis/group/version/resource`.
    collection: String,
}

impl Path_ {
    fn parse(path: &str) -> Path_ {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let start = match segs.first() {
            Some(&"api") => 2,
            _ => 3,
        };
        let mut rest = segs.get(start..).unwrap_or(&[]).to_vec();
        let mut namespace = String::new();
        let mut consumed = start;
        if rest.first() == Some(&"namespaces") && rest.len() > 2 {
            namespace = rest[1].to_string();
            rest.drain(..2);
            consumed += 2;
        }
        let at = |i: usize| rest.get(i).map(|s| s.to_string()).unwrap_or_default();
        let object_len = consumed + rest.len().min(2);
        let prefix = segs.get(..start).unwrap_or(&segs[..]).join("/");
        Path_ {
            collection: format!("/{prefix}/{}", at(0)),
            resource: at(0),
            name: at(1),
            subresource: at(2),
            namespace,
            object: format!("/{}", segs[..object_len.min(segs.len())].join("/")),
        }
    }
}

impl Path_ {
    fn key(&self) -> overlay::Key {
        (
            self.collection.clone(),
            self.namespace.clone(),
            self.name.clone(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_parts() {
        let p = Path_::parse("/api/v1/namespaces/default/pods/web-1/eviction");
        assert_eq!(
            (
                p.resource.as_str(),
                p.namespace.as_str(),
                p.name.as_str(),
                p.subresource.as_str()
            ),
            ("pods", "default", "web-1", "eviction")
        );
        assert_eq!(p.object, "/api/v1/namespaces/default/pods/web-1");
        assert_eq!(p.collection, "/api/v1/pods");
        let p = Path_::parse("/apis/karpenter.sh/v1/nodeclaims/c-1/status");
        assert_eq!(p.resource, "nodeclaims");
        assert_eq!(p.object, "/apis/karpenter.sh/v1/nodeclaims/c-1");
        let p = Path_::parse("/apis/karpenter.sh/v1/nodeclaims");
        assert_eq!((p.resource.as_str(), p.name.as_str()), ("nodeclaims", ""));
    }

    #[test]
    fn a_failed_test_operation_is_a_conflict() {
        let o = json!({"metadata": {"resourceVersion": "5"}, "spec": {"replicas": 2}});
        let p = json!([{"op": "test", "path": "/spec/replicas", "value": 1},
                       {"op": "replace", "path": "/spec/replicas", "value": 3}]);
        assert!(patched(o.clone(), p, "application/json-patch+json").is_err());
        let p = json!([{"op": "test", "path": "/spec/replicas", "value": 2},
                       {"op": "replace", "path": "/spec/replicas", "value": 3}]);
        let r = patched(o, p, "application/json-patch+json").expect("applies");
        assert_eq!(r["spec"]["replicas"], 3);
    }
}
