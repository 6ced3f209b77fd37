//! Status conditions shared by NodePool, NodeClaim and ClusterAPINodeClass, with the helpers the
//! controllers use to set them and to derive each kind's root `Ready` condition.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// ---- condition types ----
pub const READY: &str = "Ready";
// NodeClaim
pub const LAUNCHED: &str = "Launched";
pub const REGISTERED: &str = "Registered";
pub const INITIALIZED: &str = "Initialized";
pub const CONSOLIDATABLE: &str = "Consolidatable";
pub const DRIFTED: &str = "Drifted";
pub const DRAINED: &str = "Drained";
pub const VOLUMES_DETACHED: &str = "VolumesDetached";
pub const INSTANCE_TERMINATING: &str = "InstanceTerminating";
pub const DISRUPTION_REASON: &str = "DisruptionReason";
// NodePool
pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
pub const NODE_CLASS_READY: &str = "NodeClassReady";
pub const NODE_REGISTRATION_HEALTHY: &str = "NodeRegistrationHealthy";
/// True while nothing decides to disrupt the pool's nodes by choice (a setting, an annotation,
/// Cluster API's pause); not one of `Ready`'s dependents: a paused pool still provisions.
pub const DISRUPTION_PAUSED: &str = "DisruptionPaused";
/// NodePool and ClusterAPINodeClass: True once every node is up to date with the spec and Ready
/// (rollout status, upstream RFC #3216); not one of `Ready`'s dependents: a pool mid-rollout
/// still provisions.
pub const NODES_UP_TO_DATE: &str = "NodesUpToDate";

/// The conditions whose conjunction is a NodeClaim's `Ready`.
pub const NODECLAIM_READY_DEPENDENTS: [&str; 3] = [LAUNCHED, REGISTERED, INITIALIZED];
/// The conditions whose conjunction is a NodePool's `Ready`.
pub const NODEPOOL_READY_DEPENDENTS: [&str; 2] = [VALIDATION_SUCCEEDED, NODE_CLASS_READY];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    #[default]
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }

    /// True or False; None while Unknown.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            ConditionStatus::True => Some(true),
            ConditionStatus::False => Some(false),
            ConditionStatus::Unknown => None,
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(b: bool) -> Self {
        if b {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// One status condition, shaped like upstream's (metav1.Condition). `reason` and `message` are
/// always written (NodePool's schema requires them) but may be absent when read (NodeClaim's
/// schema allows that).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Type of condition in CamelCase or in foo.example.com/CamelCase.
    #[serde(rename = "type")]
    #[schemars(
        length(max = 316),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
        )
    )]
    pub type_: String,
    /// Status of the condition, one of True, False, Unknown.
    pub status: ConditionStatus,
    /// The .metadata.generation that the condition was set based upon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// The last time the condition transitioned from one status to another.
    pub last_transition_time: Time,
    /// A programmatic identifier (CamelCase) for the condition's last transition.
    #[serde(default)]
    #[schemars(
        length(max = 1024),
        regex(pattern = r"^([A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?|)$")
    )]
    pub reason: String,
    /// A human readable message about the transition; may be empty.
    #[serde(default)]
    #[schemars(length(max = 32768))]
    pub message: String,
}

impl Default for Condition {
    fn default() -> Self {
        Condition {
            type_: String::new(),
            status: ConditionStatus::Unknown,
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            reason: String::new(),
            message: String::new(),
        }
    }
}

impl Condition {
    pub fn is_true(&self) -> bool {
        self.status == ConditionStatus::True
    }
}

/// The schema's `maxLength` of a condition message.
pub const MESSAGE_LIMIT: usize = 32768;

fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let mut end = limit - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// Sets condition `type_` in `conditions`. `lastTransitionTime` moves to `now` only when the
/// status changes, so that "how long has this been false" stays answerable. An empty reason
/// becomes the type, because NodePool's schema rejects an empty reason. Returns true when
/// anything changed (so callers can skip a status write).
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let reason = if reason.is_empty() { type_ } else { reason };
    // The schema caps messages at 32768; a message quoting a huge user value is cut, on a
    // character boundary, rather than have the whole status write refused.
    let message = &cut(message, MESSAGE_LIMIT);
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            let before = existing.clone();
            if existing.status != status {
                existing.status = status;
                existing.last_transition_time = Time(now);
            }
            existing.reason = reason.to_string();
            existing.message = message.to_string();
            existing.observed_generation = observed_generation;
            *existing != before
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_string(),
                status,
                observed_generation,
                last_transition_time: Time(now),
                reason: reason.to_string(),
                message: message.to_string(),
            });
            true
        }
    }
}

/// The condition of type `type_`, if set.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when condition `type_` is set and True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(Condition::is_true)
}

/// Removes condition `type_`; returns true when it was present.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// Sets `Ready` from `dependents`: True when all are True; otherwise False if any is False,
/// else Unknown, with the first non-true dependent's reason and message (so `kubectl get`
/// shows why). Returns true when `Ready` changed.
pub fn set_root_ready(
    conditions: &mut Vec<Condition>,
    dependents: &[&str],
    observed_generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let mut blocking: Option<(ConditionStatus, String, String)> = None;
    for dep in dependents {
        let (status, reason, message) = match get(conditions, dep) {
            Some(c) if c.is_true() => continue,
            Some(c) => (c.status, c.reason.clone(), c.message.clone()),
            None => (
                ConditionStatus::Unknown,
                "AwaitingReconciliation".to_string(),
                format!("condition {dep} not yet set"),
            ),
        };
        let status = if status == ConditionStatus::True {
            ConditionStatus::Unknown
        } else {
            status
        };
        let message = if message.is_empty() {
            format!("{dep} is {}", status.as_str())
        } else {
            message
        };
        let replace = match &blocking {
            None => true,
            // A False dependent explains more than an Unknown one.
            Some((ConditionStatus::Unknown, _, _)) => status == ConditionStatus::False,
            Some(_) => false,
        };
        if replace {
            blocking = Some((status, reason, message));
        }
    }
    match blocking {
        None => set(
            conditions,
            READY,
            ConditionStatus::True,
            READY,
            "",
            observed_generation,
            now,
        ),
        Some((status, reason, message)) => set(
            conditions,
            READY,
            status,
            &reason,
            &message,
            observed_generation,
            now,
        ),
    }
}

/// NodeClaim `Ready` = `Launched` ∧ `Registered` ∧ `Initialized`.
pub fn set_nodeclaim_ready(
    conditions: &mut Vec<Condition>,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> bool {
    set_root_ready(
        conditions,
        &NODECLAIM_READY_DEPENDENTS,
        observed_generation,
        now,
    )
}

/// NodePool `Ready` = `ValidationSucceeded` ∧ `NodeClassReady`.
pub fn set_nodepool_ready(
    conditions: &mut Vec<Condition>,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> bool {
    set_root_ready(
        conditions,
        &NODEPOOL_READY_DEPENDENTS,
        observed_generation,
        now,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ConditionStatus::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn set_moves_transition_time_only_on_status_change() {
        let mut cs = Vec::new();
        assert!(set(
            &mut cs,
            LAUNCHED,
            False,
            "Pending",
            "waiting",
            Some(1),
            t(10)
        ));
        assert!(set(
            &mut cs,
            LAUNCHED,
            False,
            "Pending",
            "still waiting",
            Some(1),
            t(20)
        ));
        assert_eq!(
            get(&cs, LAUNCHED).unwrap().last_transition_time,
            Time(t(10))
        );
        assert_eq!(get(&cs, LAUNCHED).unwrap().message, "still waiting");
        assert!(!set(
            &mut cs,
            LAUNCHED,
            False,
            "Pending",
            "still waiting",
            Some(1),
            t(25)
        ));
        assert!(set(&mut cs, LAUNCHED, True, "", "", Some(2), t(30)));
        let c = get(&cs, LAUNCHED).unwrap();
        assert_eq!(c.last_transition_time, Time(t(30)));
        assert_eq!(c.reason, LAUNCHED, "empty reason defaults to the type");
        assert_eq!(c.observed_generation, Some(2));
        assert!(is_true(&cs, LAUNCHED));
        assert!(!is_true(&cs, REGISTERED));
        assert_eq!(cs.len(), 1);
        assert!(remove(&mut cs, LAUNCHED));
        assert!(!remove(&mut cs, LAUNCHED));
    }

    #[test]
    fn nodeclaim_ready_follows_dependents() {
        let mut cs = Vec::new();
        set_nodeclaim_ready(&mut cs, None, t(1));
        assert_eq!(get(&cs, READY).unwrap().status, Unknown);
        set(&mut cs, LAUNCHED, True, "", "", None, t(2));
        set(
            &mut cs,
            REGISTERED,
            Unknown,
            "AwaitingNode",
            "no node yet",
            None,
            t(2),
        );
        set(
            &mut cs,
            INITIALIZED,
            False,
            "NotReady",
            "node not ready",
            None,
            t(2),
        );
        set_nodeclaim_ready(&mut cs, None, t(3));
        let ready = get(&cs, READY).unwrap();
        assert_eq!(ready.status, False, "a False dependent wins over Unknown");
        assert_eq!(ready.reason, "NotReady");
        assert_eq!(ready.message, "node not ready");
        set(&mut cs, REGISTERED, True, "", "", None, t(4));
        set(&mut cs, INITIALIZED, True, "", "", None, t(4));
        assert!(set_nodeclaim_ready(&mut cs, None, t(5)));
        assert!(is_true(&cs, READY));
        assert_eq!(get(&cs, READY).unwrap().last_transition_time, Time(t(5)));
        assert!(!set_nodeclaim_ready(&mut cs, None, t(6)));
    }

    #[test]
    fn nodepool_ready_follows_dependents() {
        let mut cs = Vec::new();
        set(&mut cs, VALIDATION_SUCCEEDED, True, "", "", Some(3), t(1));
        set_nodepool_ready(&mut cs, Some(3), t(1));
        assert_eq!(get(&cs, READY).unwrap().status, Unknown);
        assert!(get(&cs, READY).unwrap().message.contains(NODE_CLASS_READY));
        set(&mut cs, NODE_CLASS_READY, True, "", "", Some(3), t(2));
        set_nodepool_ready(&mut cs, Some(3), t(2));
        assert!(is_true(&cs, READY));
        set(
            &mut cs,
            VALIDATION_SUCCEEDED,
            False,
            "Invalid",
            "bad",
            Some(4),
            t(3),
        );
        set_nodepool_ready(&mut cs, Some(4), t(3));
        assert_eq!(get(&cs, READY).unwrap().status, False);
        assert_eq!(get(&cs, READY).unwrap().reason, "Invalid");
    }

    #[test]
    fn condition_serde_matches_upstream_shape() {
        let json =
            r#"{"type":"Ready","status":"True","lastTransitionTime":"2024-01-01T00:00:00Z"}"#;
        let c: Condition = serde_json::from_str(json).unwrap();
        assert!(c.is_true());
        assert_eq!(c.reason, "");
        let back = serde_json::to_value(&c).unwrap();
        assert_eq!(back["type"], "Ready");
        assert_eq!(back["lastTransitionTime"], "2024-01-01T00:00:00Z");
        assert!(back.get("observedGeneration").is_none());
    }
}
