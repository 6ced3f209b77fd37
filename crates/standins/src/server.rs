//! The HTTP front: routes Kubernetes API paths to the store, applies faults, counts requests,
//! and renders objects and errors the way kube-apiserver does.

mod write;

use write::*;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use super::discovery;
use super::errors::ApiError;
use super::event_versions::{self, stamp};
use super::faults::Faults;
use super::registry::{Registry, ResourceDef};
use super::selectors::{FieldSelector, LabelSelector};
use super::stats::Stats;
use super::store::Store;
use super::table;
use super::watch::{self, WatchRequest};

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What every request handler shares.
pub struct Shared {
    pub store: Arc<Store>,
    pub registry: Arc<Registry>,
    pub stats: Stats,
    pub faults: Arc<Faults>,
    pub address: String,
    pub bookmark_interval: Duration,
    /// The store holding the NodeClaims when another server does (Karpenter's objects in a
    /// management cluster apart), for the drain audit's termination deadlines.
    pub claims_elsewhere: Arc<std::sync::OnceLock<Arc<Store>>>,
}

fn json_response(code: u16, body: &Value) -> Response<Body> {
    // `to_vec` writes straight into bytes, where `to_string` goes through `fmt`; serialising a
    // JSON value cannot fail.
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn error_response(err: &ApiError) -> Response<Body> {
    let mut resp = json_response(err.code, &err.to_status());
    if let Some(secs) = err.retry_after() {
        resp.headers_mut().insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from(secs),
        );
    }
    resp
}

/// The parsed query string (percent-decoded).
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        Self(
            q.unwrap_or_default()
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (percent_decode(k), percent_decode(v))
                })
                .collect(),
        )
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("1" | "true"))
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&c) = bytes.get(i) {
        match c {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A request for a resource, after routing.
struct Target {
    def: ResourceDef,
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl Target {
    fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }

    fn sub(&self) -> &str {
        self.sub.as_deref().unwrap_or_default()
    }
}

/// Entry point for one HTTP request.
pub async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let query = Query::parse(req.uri().query());
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let accept = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|h| h.to_str().ok())
        .map(String::from);

    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Ok(json_response(200, &discovery::version())),
        ["healthz" | "readyz" | "livez"] => {
            return Ok(Response::new(
                Full::new(Bytes::from_static(b"ok")).boxed_unsync(),
            ));
        }
        ["api"] | ["apis"] | ["api", "v1"] | ["apis", _] | ["apis", _, _] => {
            return Ok(discovery_response(&shared, &segs, accept.as_deref()));
        }
        ["openapi", "v3", rest @ ..] => {
            let doc = match rest {
                [] => Some(discovery::openapi_v3_index(&shared.registry)),
                ["api", "v1"] => discovery::openapi_v3_group_version(&shared.registry, "", "v1"),
                ["apis", g, v] => discovery::openapi_v3_group_version(&shared.registry, g, v),
                _ => None,
            };
            return Ok(match doc {
                Some(d) => json_response(200, &d),
                None => error_response(&ApiError::no_route()),
            });
        }
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Ok(error_response(&ApiError::no_route())),
    };
    let Some(target) = route(&shared.registry, group, version, rest) else {
        return Ok(error_response(&ApiError::no_route()));
    };
    let outcome = match serve(&shared, &req, &target, &query).await {
        Ok(o) => o,
        Err(e) => ServeOutcome::Done(error_response(&e)),
    };
    Ok(resp_with_body(outcome, req, &shared, &target, &query).await)
}

// `serve` needs the body, which consumes the request; split so routing errors stay cheap.
async fn resp_with_body(
    first: ServeOutcome,
    req: Request<Incoming>,
    shared: &Arc<Shared>,
    target: &Target,
    query: &Query,
) -> Response<Body> {
    match first {
        ServeOutcome::Done(r) => r,
        ServeOutcome::NeedsBody(verb, response_delay, ambiguous) => {
            let content_type = req
                .headers()
                .get(hyper::header::CONTENT_TYPE)
                .and_then(|h| h.to_str().ok())
                .map(|s| s.split(';').next().unwrap_or_default().trim().to_string())
                .unwrap_or_default();
            let agent = req
                .headers()
                .get(hyper::header::USER_AGENT)
                .and_then(|h| h.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return error_response(&ApiError::bad_request(format!(
                        "reading the request body: {e}"
                    )));
                }
            };
            let result = write(shared, target, query, verb, &content_type, &body, &agent);
            if !response_delay.is_zero() {
                tokio::time::sleep(response_delay).await;
            }
            match (result, ambiguous) {
                (Ok(_), Some(500)) => error_response(&ApiError::internal(
                    "injected fault: the write was applied, the answer is an error",
                )),
                (Ok(_), Some(_)) => error_response(&ApiError::timeout(
                    "injected fault: the write was applied, the request timed out",
                )),
                (Ok((code, v)), None) => json_response(code, &v),
                (Err(e), _) => error_response(&e),
            }
        }
    }
}

fn discovery_response(shared: &Shared, segs: &[&str], accept: Option<&str>) -> Response<Body> {
    if !discovery::accepts_plain_json(accept) {
        return error_response(&ApiError::not_acceptable(
            "only unaggregated discovery (application/json) is served",
        ));
    }
    let doc = match segs {
        ["api"] => Some(discovery::core_versions(&shared.address)),
        ["api", "v1"] => discovery::resource_list(&shared.registry, "", "v1"),
        ["apis"] => Some(discovery::group_list(&shared.registry)),
        ["apis", g] => discovery::group(&shared.registry, g),
        ["apis", g, v] => discovery::resource_list(&shared.registry, g, v),
        _ => None,
    };
    match doc {
        Some(d) => json_response(200, &d),
        None => error_response(&ApiError::no_route()),
    }
}

fn route(registry: &Registry, group: &str, version: &str, rest: &[&str]) -> Option<Target> {
    let namespaced_form = match rest {
        ["namespaces", ns, plural, tail @ ..] if tail.len() <= 2 => registry
            .lookup(group, version, plural)
            .filter(|d| d.namespaced)
            .map(|d| (d, Some(*ns), tail)),
        _ => None,
    };
    let (def, ns, tail) = match namespaced_form {
        Some(found) => found,
        None => {
            let (plural, tail) = rest.split_first()?;
            if tail.len() > 2 {
                return None;
            }
            (registry.lookup(group, version, plural)?, None, tail)
        }
    };
    let name = tail.first().map(|s| s.to_string());
    let sub = tail.get(1).map(|s| s.to_string());
    if let Some(s) = &sub {
        let known =
            (s == "status" && def.status) || (s == "scale" && def.scale) || def.actions.contains(s);
        if !known {
            return None;
        }
    }
    // A cluster-scoped kind has no namespace in its path; a namespaced kind needs one except to
    // list or watch across namespaces.
    if !def.namespaced && ns.is_some() || def.namespaced && ns.is_none() && name.is_some() {
        return None;
    }
    Some(Target {
        def: def.clone(),
        version: version.to_string(),
        namespace: ns.map(String::from),
        name,
        sub,
    })
}

enum ServeOutcome {
    Done(Response<Body>),
    /// A write, with how long to hold back its answer once applied, and the error it is
    /// answered with although it was applied (fault injection).
    NeedsBody(&'static str, Duration, Option<u16>),
}

fn verb_of(method: &Method, target: &Target, query: &Query) -> Result<&'static str, ApiError> {
    Ok(match (method, target.name.is_some()) {
        (&Method::GET, false) if query.flag("watch") => "watch",
        (&Method::GET, false) => "list",
        (&Method::GET, true) => "get",
        (&Method::POST, false) if target.sub.is_none() => "create",
        (&Method::POST, true) if target.def.actions.contains(&target.sub().to_string()) => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) if target.sub.is_none() => "delete",
        (m, _) => {
            return Err(ApiError::method_not_allowed(format!(
                "{m} is not supported on this path"
            )));
        }
    })
}

async fn serve(
    shared: &Arc<Shared>,
    req: &Request<Incoming>,
    target: &Target,
    query: &Query,
) -> Result<ServeOutcome, ApiError> {
    let verb = verb_of(req.method(), target, query)?;
    let agent = req
        .headers()
        .get(hyper::header::USER_AGENT)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    shared
        .stats
        .count_request(verb, &target.def.plural, target.sub(), agent);
    let decision = shared.faults.decide_for(&target.def.plural, verb, agent);
    if !decision.latency.is_zero() {
        tokio::time::sleep(decision.latency).await;
    }
    if let Some(secs) = decision.throttle {
        return Err(ApiError::throttled(secs));
    }
    match decision.error {
        Some(500) => return Err(ApiError::internal("injected fault: internal error")),
        Some(_) => {
            return Err(ApiError::unavailable(
                "injected fault: the server is currently unable to handle the request",
            ));
        }
        None => {}
    }
    if decision.conflict {
        let name = target.name.clone().unwrap_or_default();
        shared.store.lock().touch(&target.def, target.ns(), &name);
        return Err(ApiError::conflict(
            &target.def.group,
            &target.def.plural,
            &name,
        ));
    }
    let accept = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|h| h.to_str().ok());
    // Tables are for the resource itself; a subresource (scale) answers its own kind.
    let table =
        table::requested(accept, query.get("includeObject")).filter(|_| target.sub.is_none());
    match verb {
        "get" => get(shared, target)
            .map(|v| ServeOutcome::Done(json_response(200, &as_table(target, v, table)))),
        "list" => list(shared, target, query)
            .map(|v| ServeOutcome::Done(json_response(200, &as_table(target, v, table)))),
        "watch" => start_watch(shared, target, query, table, agent, decision.expire_watch)
            .map(ServeOutcome::Done),
        other => Ok(ServeOutcome::NeedsBody(
            other,
            decision.response_delay,
            decision.ambiguous,
        )),
    }
}

/// An object or a list as a metav1 Table when one was asked for, else unchanged.
fn as_table(target: &Target, doc: Value, table: Option<table::Include>) -> Value {
    let Some(include) = table else { return doc };
    let (objects, meta) = match doc.get("items").and_then(Value::as_array) {
        Some(items) => (
            items.clone(),
            doc.get("metadata").cloned().unwrap_or_default(),
        ),
        None => {
            let rv = doc.pointer("/metadata/resourceVersion").cloned();
            (vec![doc], json!({"resourceVersion": rv}))
        }
    };
    table::render(&target.def, &target.version, &objects, include, meta)
}

fn rendered(mut obj: Value, target: &Target) -> Value {
    stamp(&mut obj, &target.def, &target.version);
    obj
}

fn current(shared: &Shared, target: &Target) -> Result<Value, ApiError> {
    let name = target.name.as_deref().unwrap_or_default();
    let inner = shared.store.lock();
    inner
        .get(&target.def, target.ns(), name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(&target.def.group, &target.def.plural, name))
}

fn get(shared: &Shared, target: &Target) -> Result<Value, ApiError> {
    let obj = current(shared, target)?;
    Ok(match target.sub() {
        "scale" => scale_of(&obj),
        _ => rendered(obj, target),
    })
}

fn selectors(target: &Target, query: &Query) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(
        query.get("fieldSelector").unwrap_or_default(),
        &target.def.selectable_fields,
    )
    .map_err(ApiError::bad_request)?;
    let fields = if event_versions::is_core_event(&target.def) {
        fields.map_fields(event_versions::stored_field)
    } else {
        fields
    };
    Ok((labels, fields))
}

fn list(shared: &Shared, target: &Target, query: &Query) -> Result<Value, ApiError> {
    let (labels, fields) = selectors(target, query)?;
    let limit = match query.get("limit") {
        None | Some("") | Some("0") => None,
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        ),
    };
    let inner = shared.store.lock();
    let (list_rv, after) = match query.get("continue").filter(|c| !c.is_empty()) {
        None => (inner.rv(), None),
        Some(token) => {
            let (rv, key) = decode_continue(token)?;
            if inner.is_expired(rv) {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            (rv, Some(key))
        }
    };
    let (items, next) = inner.list_page(
        &target.def,
        target.namespace.as_deref(),
        &labels,
        &fields,
        after.as_ref(),
        limit,
    );
    drop(inner);
    let items: Vec<Value> = items.into_iter().map(|o| rendered(o, target)).collect();
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if let Some(k) = next {
        meta["continue"] = json!(encode_continue(list_rv, &k));
    }
    Ok(json!({
        "apiVersion": target.def.api_version(&target.version),
        "kind": format!("{}List", target.def.kind),
        "metadata": meta,
        "items": items,
    }))
}

fn encode_continue(rv: u64, (ns, name): &(String, String)) -> String {
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    format!("{rv}-{}-{}", hex(ns), hex(name))
}

fn decode_continue(token: &str) -> Result<(u64, (String, String)), ApiError> {
    let bad = || ApiError::bad_request(format!("invalid continue token {token:?}"));
    let unhex = |s: &str| -> Option<String> {
        let bytes: Option<Vec<u8>> = (0..s.len())
            .step_by(2)
            .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
            .collect();
        bytes.and_then(|b| String::from_utf8(b).ok())
    };
    let mut parts = token.split('-');
    let rv = parts.next().and_then(|r| r.parse().ok()).ok_or_else(bad)?;
    let ns = parts.next().and_then(unhex).ok_or_else(bad)?;
    let name = parts.next().and_then(unhex).ok_or_else(bad)?;
    Ok((rv, (ns, name)))
}

fn start_watch(
    shared: &Arc<Shared>,
    target: &Target,
    query: &Query,
    table: Option<table::Include>,
    agent: &str,
    expire: bool,
) -> Result<Response<Body>, ApiError> {
    let (labels, fields) = selectors(target, query)?;
    let send_initial_events = query.flag("sendInitialEvents");
    let from = if send_initial_events {
        None
    } else {
        watch::parse_from(query.get("resourceVersion"))?
    };
    // A fault: the history this watch resumes from was compacted away.
    let expired = expire && from.is_some_and(|rv| rv > 0);
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map(Duration::from_secs);
    let req = WatchRequest {
        def: target.def.clone(),
        version: target.version.clone(),
        namespace: target.namespace.clone(),
        labels,
        fields,
        from,
        bookmarks: query.flag("allowWatchBookmarks"),
        send_initial_events,
        timeout,
        bookmark_interval: shared.bookmark_interval,
        table,
        lag: watch::Lag {
            faults: shared.faults.clone(),
            agent: agent.to_string(),
        },
        expired,
    };
    let rx = watch::start(&shared.store, req, shared.faults.subscribe_cuts());
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut resp = Response::new(BodyExt::boxed_unsync(StreamBody::new(stream)));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
