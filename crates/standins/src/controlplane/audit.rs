//! kube-apiserver's audit log: the policy the control plane starts it with, and a reader of the
//! JSON-lines log it writes (`--audit-log-path`). On the real backend this is where the figures
//! the simulated server counts itself (requests by verb, writes by target, who made them) come
//! from, so a report never takes the controller's word about its own traffic.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Every request at `Metadata` (who, what, the answer's code), except creates of pods, NodeClaims
/// and Machines, logged with their answer so a generated name is known (`objectRef` has no name
/// for a create by `generateName`, as the ReplicaSet controller's pods are made). The `RequestReceived` stage is left out: each request then
/// leaves one line when it completes (and a watch one more when its answer starts).
pub const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: RequestResponse
  verbs: [create]
  resources:
  - group: ''
    resources: [pods]
  - group: karpenter.sh
    resources: [nodeclaims]
  - group: cluster.x-k8s.io
    resources: [machines]
- level: Metadata
";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the audit log {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("an audit log line is not an audit event: {source}; the line: {line}")]
    Parse {
        line: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The parts of one audit event the reports use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub stage: Stage,
    pub verb: String,
    pub username: String,
    pub user_agent: String,
    /// The request's path and query, as the client sent it.
    pub request_uri: String,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// The answer's HTTP status code (absent on a `ResponseStarted` line of some requests).
    pub code: Option<u16>,
    /// When the API server received the request and when this stage was reached.
    pub received: jiff::Timestamp,
    pub at: jiff::Timestamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Stage {
    RequestReceived,
    ResponseStarted,
    ResponseComplete,
    Panic,
}

impl Event {
    /// One line of the log. Every line kube-apiserver writes is an event; anything else is an
    /// error, so a change of format is seen rather than read as an empty log.
    pub fn parse(line: &str) -> Result<Event, Error> {
        let raw: Raw = serde_json::from_str(line).map_err(|source| Error::Parse {
            line: line.chars().take(300).collect(),
            source,
        })?;
        let object = raw.object_ref.unwrap_or_default();
        let name = object.name.or_else(|| {
            raw.response_object
                .as_ref()
                .and_then(|o| o.pointer("/metadata/name"))
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        });
        Ok(Event {
            stage: raw.stage,
            verb: raw.verb,
            username: raw.user.username,
            user_agent: raw.user_agent.unwrap_or_default(),
            request_uri: raw.request_uri.unwrap_or_default(),
            api_group: object.api_group.unwrap_or_default(),
            resource: object.resource.unwrap_or_default(),
            subresource: object.subresource.unwrap_or_default(),
            namespace: object.namespace.unwrap_or_default(),
            name: name.unwrap_or_default(),
            code: raw.response_status.and_then(|s| s.code),
            received: raw.request_received_timestamp,
            at: raw.stage_timestamp,
        })
    }

    /// Whether this line stands for one request: a watch when its answer starts (it completes
    /// only when the watch ends), anything else when it completes.
    pub fn is_request(&self) -> bool {
        match self.stage {
            Stage::ResponseStarted => self.verb == "watch",
            Stage::ResponseComplete => self.verb != "watch",
            Stage::RequestReceived | Stage::Panic => false,
        }
    }

    /// Whether this line is a write that succeeded (create, update, patch, delete answered 2xx).
    pub fn is_successful_write(&self) -> bool {
        self.stage == Stage::ResponseComplete
            && matches!(
                self.verb.as_str(),
                "create" | "update" | "patch" | "delete" | "deletecollection"
            )
            && self.code.is_some_and(|c| (200..300).contains(&c))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    stage: Stage,
    verb: String,
    user: User,
    user_agent: Option<String>,
    #[serde(rename = "requestURI")]
    request_uri: Option<String>,
    object_ref: Option<ObjectRef>,
    response_status: Option<Status>,
    response_object: Option<serde_json::Value>,
    request_received_timestamp: jiff::Timestamp,
    stage_timestamp: jiff::Timestamp,
}

#[derive(Deserialize)]
struct User {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    resource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    api_group: Option<String>,
    subresource: Option<String>,
}

#[derive(Deserialize)]
struct Status {
    code: Option<u16>,
}

/// Reads a growing audit log from where the last read ended; a line not yet complete is kept
/// for the next read.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl Tail {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// The events written since the last call (none while the file does not exist yet).
    pub fn read_new(&mut self) -> Result<Vec<Event>, Error> {
        let io = |source| Error::Io {
            path: self.path.clone(),
            source,
        };
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(e)),
        };
        file.seek(SeekFrom::Start(self.offset)).map_err(io)?;
        let mut bytes = std::mem::take(&mut self.partial);
        let read = file.read_to_end(&mut bytes).map_err(io)?;
        self.offset += read as u64;
        let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        self.partial = bytes.split_off(complete);
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(Event::parse)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVICTION: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"9d3c","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/default/pods/web-1/eviction","verb":"create","user":{"username":"karpenter-capi-controller","groups":["system:masters","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"karpenter-capi/0.1.0","objectRef":{"resource":"pods","namespace":"default","name":"web-1","apiVersion":"v1","subresource":"eviction"},"responseStatus":{"metadata":{},"code":201},"requestReceivedTimestamp":"2026-11-26T12:00:00.100000Z","stageTimestamp":"2026-11-26T12:00:00.104512Z","annotations":{"authorization.k8s.io/decision":"allow"}}"#;

    const GENERATED_CREATE: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"RequestResponse","auditID":"1","stage":"ResponseComplete","requestURI":"/apis/cluster.x-k8s.io/v1beta2/namespaces/default/machines","verb":"create","user":{"username":"system:serviceaccount:x:y"},"userAgent":"sim","objectRef":{"resource":"machines","namespace":"default","apiGroup":"cluster.x-k8s.io","apiVersion":"v1beta2"},"responseStatus":{"metadata":{},"code":201},"requestObject":{"metadata":{"generateName":"md-"}},"responseObject":{"metadata":{"name":"md-x7k2p"}},"requestReceivedTimestamp":"2026-11-26T12:00:01Z","stageTimestamp":"2026-11-26T12:00:01.002Z"}"#;

    const WATCH_STARTED: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"2","stage":"ResponseStarted","requestURI":"/api/v1/nodes?watch=true","verb":"watch","user":{"username":"system:kube-scheduler"},"userAgent":"kube-scheduler/v1.36.2","objectRef":{"resource":"nodes","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-11-26T12:00:02Z","stageTimestamp":"2026-11-26T12:00:02Z"}"#;

    const CONFLICT: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"3","stage":"ResponseComplete","requestURI":"/apis/karpenter.sh/v1/nodeclaims/c-1/status","verb":"patch","user":{"username":"karpenter-capi-controller"},"userAgent":"karpenter-capi/0.1.0","objectRef":{"resource":"nodeclaims","name":"c-1","apiGroup":"karpenter.sh","apiVersion":"v1","subresource":"status"},"responseStatus":{"metadata":{},"status":"Failure","reason":"Conflict","code":409},"requestReceivedTimestamp":"2026-11-26T12:00:03Z","stageTimestamp":"2026-11-26T12:00:03Z"}"#;

    #[test]
    fn an_eviction_is_a_successful_write_by_its_user() {
        let e = Event::parse(EVICTION).unwrap();
        assert_eq!(e.stage, Stage::ResponseComplete);
        assert_eq!(
            (e.verb.as_str(), e.resource.as_str(), e.subresource.as_str()),
            ("create", "pods", "eviction")
        );
        assert_eq!(
            (e.namespace.as_str(), e.name.as_str()),
            ("default", "web-1")
        );
        assert_eq!(e.username, "karpenter-capi-controller");
        assert_eq!(e.user_agent, "karpenter-capi/0.1.0");
        assert_eq!(e.api_group, "");
        assert_eq!(e.code, Some(201));
        assert!(e.is_request() && e.is_successful_write());
        assert_eq!(
            e.at.as_microsecond() - e.received.as_microsecond(),
            4512,
            "timestamps keep their microseconds"
        );
    }

    #[test]
    fn a_create_by_generate_name_is_named_from_its_answer() {
        let e = Event::parse(GENERATED_CREATE).unwrap();
        assert_eq!(e.name, "md-x7k2p");
        assert_eq!(e.api_group, "cluster.x-k8s.io");
        assert!(e.is_successful_write());
    }

    #[test]
    fn a_watch_counts_when_its_answer_starts_and_is_no_write() {
        let e = Event::parse(WATCH_STARTED).unwrap();
        assert!(e.is_request());
        assert!(!e.is_successful_write());
        let done = WATCH_STARTED.replace("ResponseStarted", "ResponseComplete");
        assert!(!Event::parse(&done).unwrap().is_request());
    }

    #[test]
    fn a_refused_write_is_a_request_but_no_write() {
        let e = Event::parse(CONFLICT).unwrap();
        assert_eq!(e.code, Some(409));
        assert!(e.is_request());
        assert!(!e.is_successful_write());
    }

    #[test]
    fn a_line_that_is_no_event_is_an_error() {
        assert!(matches!(
            Event::parse(r#"{"kind":"Event"}"#),
            Err(Error::Parse { .. })
        ));
        assert!(Event::parse("not json").is_err());
    }

    #[test]
    fn the_tail_reads_complete_lines_once_and_keeps_a_partial_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let mut tail = Tail::new(&path);
        assert!(tail.read_new().unwrap().is_empty(), "no file yet");
        let (head, rest) = CONFLICT.split_at(40);
        std::fs::write(&path, format!("{EVICTION}\n{head}")).unwrap();
        let first = tail.read_new().unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].name, "web-1");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, format!("{rest}\n{WATCH_STARTED}\n").as_bytes()).unwrap();
        let next: Vec<_> = tail
            .read_new()
            .unwrap()
            .into_iter()
            .map(|e| e.verb)
            .collect();
        assert_eq!(next, ["patch", "watch"]);
        assert!(tail.read_new().unwrap().is_empty());
    }
}
