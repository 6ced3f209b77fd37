//! What the server measured: every request by (verb, resource, subresource), and a timestamped log
//! of every successful write. Reports read these, so the controller never reports on itself.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde::Serialize;

/// One successful write (create, update, patch, delete) as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WriteRecord {
    /// Milliseconds since the server started.
    pub at_ms: u64,
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// The client's User-Agent, so reports can tell the controller's writes from the rest.
    pub agent: String,
}

impl WriteRecord {
    /// `verb resource[/subresource]`, e.g. `patch nodeclaims/status`.
    pub fn target(&self) -> String {
        if self.subresource.is_empty() {
            format!("{} {}", self.verb, self.resource)
        } else {
            format!("{} {}/{}", self.verb, self.resource, self.subresource)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestCount {
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub count: u64,
}

/// A serialisable copy of everything measured so far.
#[derive(Debug, Clone, Serialize)]
pub struct StatsSnapshot {
    pub elapsed_ms: u64,
    pub requests: Vec<RequestCount>,
    pub writes: Vec<WriteRecord>,
}

type RequestKey = (String, String, String);

/// Something a stand-in did that no API write shows on its own (e.g. "the provider finished
/// this Machine"), timed on the same clock as the writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Milestone {
    pub at_ms: u64,
    pub what: String,
    pub namespace: String,
    pub name: String,
}

/// A pod removal that broke Karpenter's drain rules (see `drain_audit`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ViolationRecord {
    pub at_ms: u64,
    pub violation: super::drain_audit::Violation,
    pub namespace: String,
    pub name: String,
    pub agent: String,
}

#[derive(Debug)]
struct Inner {
    requests: BTreeMap<RequestKey, u64>,
    /// Requests by (User-Agent, verb), so reports can count the controller's own.
    by_agent: BTreeMap<(String, String), u64>,
    writes: Vec<WriteRecord>,
    milestones: Vec<Milestone>,
    violations: Vec<ViolationRecord>,
    /// Requests refused for want of a permission (403), as `verb path`, with their count.
    refused: BTreeMap<String, u64>,
}

/// A cheap handle onto the server's counters (clones share them).
#[derive(Debug, Clone)]
pub struct Stats {
    started: Instant,
    /// The wall clock at `started`, to place another server's timestamps (an audit log) on
    /// this clock.
    wall: jiff::Timestamp,
    inner: Arc<Mutex<Inner>>,
}

impl Stats {
    pub(crate) fn new() -> Self {
        Self {
            started: Instant::now(),
            wall: jiff::Timestamp::now(),
            inner: Arc::new(Mutex::new(Inner {
                requests: BTreeMap::new(),
                by_agent: BTreeMap::new(),
                writes: Vec::new(),
                milestones: Vec::new(),
                violations: Vec::new(),
                refused: BTreeMap::new(),
            })),
        }
    }

    pub(crate) fn count_request(&self, verb: &str, resource: &str, subresource: &str, agent: &str) {
        let key = (
            verb.to_string(),
            resource.to_string(),
            subresource.to_string(),
        );
        let mut inner = self.inner.lock();
        *inner.requests.entry(key).or_default() += 1;
        // Look up before inserting: the agents are few, so the key is almost always there.
        match inner
            .by_agent
            .get_mut(&(agent.to_string(), verb.to_string()))
        {
            Some(n) => *n += 1,
            None => {
                inner
                    .by_agent
                    .insert((agent.to_string(), verb.to_string()), 1);
            }
        }
    }

    /// Requests by verb (get, list, watch, create, update, patch, delete) from clients whose
    /// User-Agent is exactly `agent`, counted when they arrive (also those that then failed).
    pub fn requests_by_verb(&self, agent: &str) -> BTreeMap<String, u64> {
        self.inner
            .lock()
            .by_agent
            .iter()
            .filter(|((a, _), _)| a == agent)
            .map(|((_, verb), n)| (verb.clone(), *n))
            .collect()
    }

    pub(crate) fn record_write(
        &self,
        verb: &str,
        resource: &str,
        subresource: &str,
        namespace: &str,
        name: &str,
        agent: &str,
    ) {
        let at_ms = self.now_ms();
        self.record_write_at(at_ms, verb, resource, subresource, namespace, name, agent);
    }

    /// A write another server made at `at_ms` on this clock (see [`Stats::ms_at`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record_write_at(
        &self,
        at_ms: u64,
        verb: &str,
        resource: &str,
        subresource: &str,
        namespace: &str,
        name: &str,
        agent: &str,
    ) {
        self.inner.lock().writes.push(WriteRecord {
            at_ms,
            verb: verb.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: namespace.into(),
            name: name.into(),
            agent: agent.into(),
        });
    }

    /// Requests counted for (verb, resource plural, subresource; "" for the main resource).
    pub fn requests(&self, verb: &str, resource: &str, subresource: &str) -> u64 {
        let key = (
            verb.to_string(),
            resource.to_string(),
            subresource.to_string(),
        );
        self.inner.lock().requests.get(&key).copied().unwrap_or(0)
    }

    /// Successful writes to a resource plural and subresource ("" for the main resource).
    pub fn writes_for(&self, resource: &str, subresource: &str) -> Vec<WriteRecord> {
        self.inner
            .lock()
            .writes
            .iter()
            .filter(|w| w.resource == resource && w.subresource == subresource)
            .cloned()
            .collect()
    }

    /// Milliseconds since the server started (the clock of every record).
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A wall-clock time on this clock (0 before it started).
    pub fn ms_at(&self, t: jiff::Timestamp) -> u64 {
        let us = t.as_microsecond() - self.wall.as_microsecond();
        u64::try_from(us / 1000).unwrap_or(0)
    }

    /// Record a stand-in's milestone.
    pub fn milestone(&self, what: &str, namespace: &str, name: &str) {
        let at_ms = self.now_ms();
        self.inner.lock().milestones.push(Milestone {
            at_ms,
            what: what.into(),
            namespace: namespace.into(),
            name: name.into(),
        });
    }

    pub fn milestones(&self, what: &str) -> Vec<Milestone> {
        self.inner
            .lock()
            .milestones
            .iter()
            .filter(|m| m.what == what)
            .cloned()
            .collect()
    }

    pub(crate) fn record_violation(
        &self,
        violation: super::drain_audit::Violation,
        namespace: &str,
        name: &str,
        agent: &str,
    ) {
        let at_ms = self.now_ms();
        self.record_violation_at(at_ms, violation, namespace, name, agent);
    }

    pub(crate) fn record_violation_at(
        &self,
        at_ms: u64,
        violation: super::drain_audit::Violation,
        namespace: &str,
        name: &str,
        agent: &str,
    ) {
        self.inner.lock().violations.push(ViolationRecord {
            at_ms,
            violation,
            namespace: namespace.into(),
            name: name.into(),
            agent: agent.into(),
        });
    }

    /// Every pod removal that broke a PodDisruptionBudget or a do-not-disrupt annotation before
    /// the node's termination deadline.
    pub fn violations(&self) -> Vec<ViolationRecord> {
        self.inner.lock().violations.clone()
    }

    /// A request the API server refused for want of a permission (only a real control plane
    /// authorizes; the simulated server never refuses).
    pub(crate) fn record_refused(&self, request: String) {
        *self.inner.lock().refused.entry(request).or_default() += 1;
    }

    /// The refused requests, as `verb path`, with how many times each was refused.
    pub fn refused(&self) -> BTreeMap<String, u64> {
        self.inner.lock().refused.clone()
    }

    /// Every successful write, in order.
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.inner.lock().writes.clone()
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let inner = self.inner.lock();
        StatsSnapshot {
            elapsed_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            requests: inner
                .requests
                .iter()
                .map(|((verb, resource, subresource), count)| RequestCount {
                    verb: verb.clone(),
                    resource: resource.clone(),
                    subresource: subresource.clone(),
                    count: *count,
                })
                .collect(),
            writes: inner.writes.clone(),
        }
    }
}
