//! Repair policies: which Node conditions call for a repair, after how long, how urgently and
//! how forcefully the node is drained (Karpenter's reason-aware repair policies, #3336, with
//! the operator as the provider: `--repair-policies`).
//!
//! A policy names a condition type and status, and optionally a regular expression over the
//! condition's `reason`. For one condition, the policies whose expression matches its reason
//! apply; when none does, the condition's fallback (its one policy without an expression)
//! applies, so a reason nobody foresaw is still repaired, and a reason a policy names is
//! handled by that policy alone (its longer or shorter toleration is not undercut by the
//! fallback's). Every policy that applies is weighed on its own: it is due once its condition
//! has held for its toleration, counted from the condition's `lastTransitionTime` (so a
//! restarted controller reaches the same verdict). When several are due on one Node, the
//! repair takes the highest priority, then the most overdue, and the shortest termination
//! grace period of them all (the most urgent diagnosis sets the pace).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::NodeCondition;
use regex::Regex;
use serde::Deserialize;

/// Upstream's default toleration of an unhealthy `Ready` (30 minutes).
pub const READY_TOLERATION: Duration = Duration::from_secs(30 * 60);
/// Priorities run from 0 (the default) to this, the most urgent.
pub const MAX_PRIORITY: i64 = 100;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("--repair-policies is not a YAML or JSON document of policies: {0}")]
    Decode(String),
    #[error("--repair-policies has no policy: list at least one under `policies`")]
    Empty,
    #[error("--repair-policies: policies[{index}].{field}: {reason}")]
    Invalid {
        index: usize,
        field: &'static str,
        reason: String,
    },
    #[error(
        "--repair-policies: the policies for {condition}={status} need exactly one fallback (a policy without reasonRegex, action Replace), so a reason none of them names is still repaired; found {found}"
    )]
    Fallback {
        condition: String,
        status: String,
        found: usize,
    },
}

/// What a policy asks to be done with the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Replace,
    /// Upstream's proposed reboot. Cluster API has no reboot for a Machine (its contract knows
    /// create and delete; a reboot is the infrastructure provider's, when it has one), so a
    /// reboot is done as a replacement and the repair says so.
    Reboot,
}

/// One policy, checked.
#[derive(Clone, Debug)]
pub struct Policy {
    pub condition: String,
    pub status: String,
    /// The expression as written, and compiled to match the whole reason.
    reason: Option<(String, Regex)>,
    pub toleration: Duration,
    pub action: Action,
    pub priority: u8,
    /// How long the drain may take once the repair deletes the claim; zero (the default) is
    /// forceful, as upstream's repair of a node that is down: its pods cannot be evicted
    /// gracefully from a kubelet that does not answer.
    pub termination_grace_period: Duration,
}

impl Policy {
    fn fallback(&self) -> bool {
        self.reason.is_none()
    }

    fn names(&self, reason: &str) -> bool {
        self.reason
            .as_ref()
            .is_some_and(|(_, re)| re.is_match(reason))
    }

    /// `Ready=False` or `Ready=False (reason ~ KubeletNotReady)`.
    pub fn describe(&self) -> String {
        match &self.reason {
            Some((text, _)) => format!("{}={} (reason ~ {text})", self.condition, self.status),
            None => format!("{}={}", self.condition, self.status),
        }
    }
}

/// The policies node repair runs with: a checked set, cheap to clone.
#[derive(Clone, Debug)]
pub struct RepairPolicies {
    policies: Arc<[Policy]>,
    /// Priority -> dense rank (0 for the lowest priority in use), so the score a rank adds does
    /// not depend on how far apart the configured priorities are.
    ranks: Arc<HashMap<u8, usize>>,
}

/// A repair that is due on a Node: what drives it and how it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Due {
    /// The policy that drives it (the highest priority, then the most overdue).
    pub policy: String,
    /// The condition type (`Ready`).
    pub condition: String,
    /// The condition's status and reason, and since when it holds.
    pub status: String,
    pub reason: String,
    pub since: Timestamp,
    pub toleration: Duration,
    /// How long past its toleration it is.
    pub overdue: Duration,
    /// The dense rank of its priority.
    pub rank: usize,
    /// The shortest termination grace period of every policy due on the Node.
    pub termination_grace_period: Duration,
    /// A reboot was asked by every policy due (and is done as a replacement).
    pub reboot_asked: bool,
}

/// What the policies make of one Node at one time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assessment {
    /// A policy applies to one of its conditions (due or not): the Node counts as unhealthy
    /// for the unhealthy-fraction guard.
    pub unhealthy: bool,
    pub due: Option<Due>,
    /// The earliest time a policy not yet due becomes due.
    pub next: Option<Timestamp>,
}

impl RepairPolicies {
    /// Upstream's policies for a provider with no health signal of its own: the kubelet's
    /// `Ready`, False or Unknown, tolerated for `toleration`, replaced forcefully.
    pub fn ready(toleration: Duration) -> Self {
        let ready = |status: &str| Policy {
            condition: "Ready".into(),
            status: status.into(),
            reason: None,
            toleration,
            action: Action::Replace,
            priority: 0,
            termination_grace_period: Duration::ZERO,
        };
        Self::of(vec![ready("False"), ready("Unknown")])
    }

    fn of(policies: Vec<Policy>) -> Self {
        let priorities: BTreeSet<u8> = policies.iter().map(|p| p.priority).collect();
        let ranks = priorities.into_iter().enumerate().map(|(r, p)| (p, r));
        Self {
            policies: policies.into(),
            ranks: Arc::new(ranks.collect()),
        }
    }

    /// Decodes and checks a `--repair-policies` document (YAML or JSON, `policies: [...]`).
    /// Empty: [`RepairPolicies::ready`] with upstream's toleration.
    pub fn parse(raw: &str) -> Result<Self, PolicyError> {
        if raw.trim().is_empty() {
            return Ok(Self::ready(READY_TOLERATION));
        }
        let doc: Document =
            serde_saphyr::from_str(raw).map_err(|e| PolicyError::Decode(e.to_string()))?;
        if doc.policies.is_empty() {
            return Err(PolicyError::Empty);
        }
        let policies = doc
            .policies
            .into_iter()
            .enumerate()
            .map(|(index, raw)| raw.check(index))
            .collect::<Result<Vec<_>, _>>()?;
        check_fallbacks(&policies)?;
        Ok(Self::of(policies))
    }

    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// Whether a Node whose `Ready` is True matches no policy: only `Ready` is watched, and
    /// never as True (the default policies). Such a Node needs no look at its conditions.
    pub fn ready_is_healthy(&self) -> bool {
        self.policies
            .iter()
            .all(|p| p.condition == "Ready" && p.status != "True")
    }

    /// The condition types the policies watch, each once.
    pub fn condition_types(&self) -> Vec<String> {
        let types: BTreeSet<&str> = self.policies.iter().map(|p| p.condition.as_str()).collect();
        types.into_iter().map(String::from).collect()
    }

    fn rank(&self, priority: u8) -> usize {
        self.ranks.get(&priority).copied().unwrap_or_default()
    }

    /// The policies that apply to `condition`: the ones whose expression matches its reason,
    /// or its fallback when none does.
    fn applying<'a>(&'a self, condition: &'a NodeCondition) -> impl Iterator<Item = &'a Policy> {
        let reason = condition.reason.as_deref().unwrap_or_default();
        let group = move || {
            self.policies
                .iter()
                .filter(move |p| p.condition == condition.type_ && p.status == condition.status)
        };
        let named = group().any(|p| p.names(reason));
        group().filter(move |p| if named { p.names(reason) } else { p.fallback() })
    }

    /// What the policies make of a Node with `conditions` at `now`.
    pub fn assess(&self, conditions: &[NodeCondition], now: Timestamp) -> Assessment {
        let mut out = Assessment::default();
        let mut due: Vec<(&Policy, &NodeCondition, Timestamp, Duration)> = Vec::new();
        for c in conditions {
            for p in self.applying(c) {
                out.unhealthy = true;
                let Some(since) = c.last_transition_time.as_ref().map(|t| t.0) else {
                    continue;
                };
                let at = since
                    .checked_add(jiff::SignedDuration::try_from(p.toleration).unwrap_or_default())
                    .unwrap_or(since);
                if now < at {
                    out.next = Some(out.next.map_or(at, |n| n.min(at)));
                } else {
                    let overdue = Duration::try_from(now.duration_since(at)).unwrap_or_default();
                    due.push((p, c, since, overdue));
                }
            }
        }
        out.due = self.merge(&due);
        out
    }

    /// One repair from the policies due on a Node: driven by the highest priority, then the
    /// most overdue, drained within the shortest grace period of them all.
    fn merge(&self, due: &[(&Policy, &NodeCondition, Timestamp, Duration)]) -> Option<Due> {
        let (p, c, since, overdue) = due
            .iter()
            .max_by(|a, b| a.0.priority.cmp(&b.0.priority).then(a.3.cmp(&b.3)))?;
        let grace = due.iter().map(|d| d.0.termination_grace_period).min();
        Some(Due {
            policy: p.describe(),
            condition: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone().unwrap_or_default(),
            since: *since,
            toleration: p.toleration,
            overdue: *overdue,
            rank: self.rank(p.priority),
            termination_grace_period: grace.unwrap_or_default(),
            reboot_asked: due.iter().all(|d| d.0.action == Action::Reboot),
        })
    }
}

/// Each condition with policies has exactly one fallback.
fn check_fallbacks(policies: &[Policy]) -> Result<(), PolicyError> {
    let mut fallbacks: HashMap<(&str, &str), usize> = HashMap::new();
    for p in policies {
        *fallbacks.entry((&p.condition, &p.status)).or_default() += usize::from(p.fallback());
    }
    let mut wrong: Vec<_> = fallbacks.into_iter().filter(|(_, n)| *n != 1).collect();
    wrong.sort();
    match wrong.first() {
        None => Ok(()),
        Some(((condition, status), found)) => Err(PolicyError::Fallback {
            condition: condition.to_string(),
            status: status.to_string(),
            found: *found,
        }),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    #[serde(default)]
    policies: Vec<RawPolicy>,
}

/// A policy as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawPolicy {
    condition_type: String,
    condition_status: String,
    #[serde(default)]
    reason_regex: Option<String>,
    toleration_duration: String,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    priority: Option<i64>,
    #[serde(default)]
    termination_grace_period: Option<String>,
}

impl RawPolicy {
    fn check(self, index: usize) -> Result<Policy, PolicyError> {
        let invalid = |field: &'static str, reason: String| PolicyError::Invalid {
            index,
            field,
            reason,
        };
        if self.condition_type.trim().is_empty() {
            return Err(invalid("conditionType", "must be set".into()));
        }
        if !matches!(self.condition_status.as_str(), "True" | "False" | "Unknown") {
            return Err(invalid(
                "conditionStatus",
                format!("{:?} must be True, False or Unknown", self.condition_status),
            ));
        }
        let reason = match self.reason_regex {
            None => None,
            Some(text) if text.is_empty() => {
                return Err(invalid(
                    "reasonRegex",
                    "is empty: leave it out for the fallback policy".into(),
                ));
            }
            Some(text) => {
                let re = Regex::new(&format!("^(?:{text})$"))
                    .map_err(|e| invalid("reasonRegex", format!("{text:?}: {e}")))?;
                Some((text, re))
            }
        };
        let toleration = crate::api::duration::parse(&self.toleration_duration)
            .map_err(|e| invalid("tolerationDuration", e.to_string()))?;
        let action = match self.action.as_deref() {
            None | Some("Replace") => Action::Replace,
            Some("Reboot") if reason.is_none() => {
                return Err(invalid(
                    "action",
                    "a fallback policy (no reasonRegex) must be Replace".into(),
                ));
            }
            Some("Reboot") => Action::Reboot,
            Some(other) => {
                return Err(invalid(
                    "action",
                    format!("{other:?} must be Replace or Reboot"),
                ));
            }
        };
        let priority = match self.priority.unwrap_or(0) {
            p @ 0..=MAX_PRIORITY => p as u8,
            p => {
                return Err(invalid(
                    "priority",
                    format!("{p} must be between 0 and {MAX_PRIORITY}"),
                ));
            }
        };
        let termination_grace_period = match self.termination_grace_period {
            None => Duration::ZERO,
            Some(text) => crate::api::duration::parse(&text)
                .map_err(|e| invalid("terminationGracePeriod", e.to_string()))?,
        };
        Ok(Policy {
            condition: self.condition_type,
            status: self.condition_status,
            reason,
            toleration,
            action,
            priority,
            termination_grace_period,
        })
    }
}

#[cfg(test)]
mod tests;
