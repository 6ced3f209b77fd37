//! The arithmetic of a MachineDeployment rollout, as pure functions the Cluster API stand-in
//! (`capi.rs`) calls: which template fields force a new MachineSet, the rollout strategy and its
//! fenceposts, and how many replicas each MachineSet gets on one reconcile pass (after Cluster
//! API's rollout planner for RollingUpdate and OnDelete).
//!
//! The counts are Machine counts observed by the caller from its Machine cache: `actual`
//! includes Machines being deleted (Cluster API's MachineSet `status.replicas` does),
//! `available` counts Machines with a Node that are not being deleted; `reported` is the set's
//! own `status.replicas`, read from the same copy as its spec.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::capi_version::CapiVersion;

/// Set on old MachineSets of an OnDelete MachineDeployment: they must not replace deleted Machines.
pub const DISABLE_MACHINE_CREATE_ANNOTATION: &str = "cluster.x-k8s.io/disable-machine-create";
/// The Machine condition telling whether its MachineSet matches the MachineDeployment template.
pub const UP_TO_DATE_CONDITION: &str = "UpToDate";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrategyType {
    RollingUpdate,
    OnDelete,
}

/// An `IntOrString` field: an absolute count or a percentage of the desired replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntOrPercent {
    Int(i64),
    Percent(i64),
}

impl IntOrPercent {
    fn parse(v: Option<&Value>, default: i64) -> Result<Self, String> {
        match v {
            None | Some(Value::Null) => Ok(Self::Int(default)),
            Some(Value::Number(n)) => n
                .as_i64()
                .filter(|n| *n >= 0)
                .map(Self::Int)
                .ok_or_else(|| format!("invalid value {n}")),
            Some(Value::String(s)) => s
                .strip_suffix('%')
                .and_then(|p| p.parse::<i64>().ok())
                .filter(|p| *p >= 0)
                .map(Self::Percent)
                .ok_or_else(|| format!("invalid value {s:?}: want an integer or a percentage")),
            Some(other) => Err(format!("invalid value {other}")),
        }
    }

    /// The count for `desired` replicas; percentages round up for surge, down for unavailable.
    fn scaled(self, desired: i64, round_up: bool) -> i64 {
        match self {
            Self::Int(n) => n,
            Self::Percent(p) if round_up => (p * desired + 99) / 100,
            Self::Percent(p) => p * desired / 100,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strategy {
    pub kind: StrategyType,
    pub max_surge: IntOrPercent,
    pub max_unavailable: IntOrPercent,
}

/// The MachineDeployment's rollout strategy: v1beta1 `spec.strategy`, v1beta2
/// `spec.rollout.strategy`; type RollingUpdate, maxSurge 1 and maxUnavailable 0 by default.
pub fn strategy(md_spec: &Value, v: CapiVersion) -> Result<Strategy, String> {
    let s = match v {
        CapiVersion::V1Beta1 => md_spec.get("strategy"),
        CapiVersion::V1Beta2 => md_spec.pointer("/rollout/strategy"),
    };
    let kind = match s.and_then(|s| s.get("type")).and_then(Value::as_str) {
        None | Some("RollingUpdate") => StrategyType::RollingUpdate,
        Some("OnDelete") => StrategyType::OnDelete,
        Some(other) => return Err(format!("unexpected rollout strategy type {other:?}")),
    };
    let rolling = s.and_then(|s| s.get("rollingUpdate"));
    Ok(Strategy {
        kind,
        max_surge: IntOrPercent::parse(rolling.and_then(|r| r.get("maxSurge")), 1)
            .map_err(|e| format!("maxSurge: {e}"))?,
        max_unavailable: IntOrPercent::parse(rolling.and_then(|r| r.get("maxUnavailable")), 0)
            .map_err(|e| format!("maxUnavailable: {e}"))?,
    })
}

impl Strategy {
    /// (maxSurge, maxUnavailable) as counts for `desired` replicas; both resolving to zero
    /// means maxUnavailable 1, as Kubernetes and Cluster API resolve them.
    pub fn fenceposts(&self, desired: i64) -> (i64, i64) {
        let surge = self.max_surge.scaled(desired, true);
        let unavailable = self.max_unavailable.scaled(desired, false);
        if surge == 0 && unavailable == 0 {
            (0, 1)
        } else {
            (surge, unavailable)
        }
    }

    pub fn max_surge(&self, desired: i64) -> i64 {
        match self.kind {
            StrategyType::RollingUpdate => self.fenceposts(desired).0,
            StrategyType::OnDelete => 0,
        }
    }

    pub fn max_unavailable(&self, desired: i64) -> i64 {
        match self.kind {
            StrategyType::RollingUpdate if desired > 0 => self.fenceposts(desired).1.min(desired),
            _ => 0,
        }
    }
}

/// One MachineSet as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetCounts {
    pub name: String,
    /// spec.replicas
    pub spec: i64,
    /// Machines that exist, those being deleted included.
    pub actual: i64,
    /// The set's own `status.replicas`, from the same (possibly stale) copy as `spec`. Cluster
    /// API's surge arithmetic adds up `max(spec, status)` per set: a cache whose set lags its
    /// Machines then sees a scale-up still under way, never Machines beyond the spec to take
    /// back.
    pub reported: i64,
    /// Machines with a Node that are not being deleted.
    pub available: i64,
}

impl SetCounts {
    fn unavailable(&self) -> i64 {
        (self.actual - self.available).max(0)
    }
}

/// New spec.replicas per MachineSet name, for the sets that change.
pub type Intents = BTreeMap<String, i64>;

fn intent_or_spec(intents: &Intents, s: &SetCounts) -> i64 {
    intents.get(&s.name).copied().unwrap_or(s.spec)
}

/// How far the up-to-date MachineSet may grow: up to `replicas + maxSurge` Machines in all
/// (RollingUpdate) or `replicas` (OnDelete), counting a set's spec or its Machines, whichever is more.
fn new_set_replicas(
    replicas: i64,
    strategy: &Strategy,
    new: &SetCounts,
    olds: &[SetCounts],
) -> i64 {
    let current: i64 = olds
        .iter()
        .chain(std::iter::once(new))
        .map(|s| s.spec.max(s.reported))
        .sum();
    let ceiling = replicas + strategy.max_surge(replicas);
    if current >= ceiling {
        return new.spec;
    }
    let room = ceiling - current;
    match strategy.kind {
        StrategyType::RollingUpdate => new.spec + room.min(replicas - new.spec),
        StrategyType::OnDelete => new.spec + room,
    }
}

/// spec.replicas of a MachineSet created for a new template, given the existing (old) sets.
pub fn initial_new_set_replicas(replicas: i64, strategy: &Strategy, olds: &[SetCounts]) -> i64 {
    let new = SetCounts {
        name: String::new(),
        spec: 0,
        actual: 0,
        reported: 0,
        available: 0,
    };
    new_set_replicas(replicas, strategy, &new, olds).max(0)
}

fn plan_new_set(
    replicas: i64,
    strategy: &Strategy,
    new: &SetCounts,
    olds: &[SetCounts],
) -> Intents {
    let mut intents = Intents::new();
    let target = if new.spec > replicas {
        replicas
    } else {
        new_set_replicas(replicas, strategy, new, olds)
    };
    if target != new.spec {
        intents.insert(new.name.clone(), target);
    }
    intents
}

/// RollingUpdate: grow the up-to-date set within maxSurge, shrink old sets (oldest first,
/// unavailable Machines first) without ever counting on more than `replicas - maxUnavailable`
/// available Machines: a scale-down is assumed to take available Machines, since the
/// MachineSet picks its victims by its own order. `olds` must be sorted oldest first.
pub fn plan_rolling_update(
    replicas: i64,
    strategy: &Strategy,
    new: &SetCounts,
    olds: &[SetCounts],
) -> Intents {
    let mut intents = plan_new_set(replicas, strategy, new, olds);
    let all = || olds.iter().chain(std::iter::once(new));
    if olds.iter().map(|s| s.spec).sum::<i64>() == 0 {
        return intents;
    }
    let min_available = (replicas - strategy.max_unavailable(replicas)).max(0);
    let total_spec: i64 = all().map(|s| s.spec).sum();
    let mut total_available: i64 = all().map(|s| s.available).sum();
    // Machines already on their way out (spec below what exists) will lower availability.
    let pending_scale_down: i64 = all()
        .map(|s| (s.actual - s.spec.min(intent_or_spec(&intents, s))).max(0))
        .sum();
    let mut budget = (total_spec - pending_scale_down - min_available).max(0);
    for only_unavailable in [true, false] {
        for old in olds {
            if budget <= 0 {
                break;
            }
            let current = intent_or_spec(&intents, old);
            if current <= 0 {
                continue;
            }
            let extent = if only_unavailable {
                (current - old.available).max(0)
            } else {
                current
            };
            let mut down = extent.min(budget);
            if down == 0 {
                continue;
            }
            if old.available > 0 {
                let target = (current - down).max(0);
                let mut existing_deleted = (old.actual - target).max(0);
                if existing_deleted > 0 {
                    if total_available - min_available < existing_deleted {
                        let deletable = (total_available - min_available).max(0);
                        let revisited = (old.actual - deletable).min(current);
                        down = (current - revisited).max(0);
                        existing_deleted = (old.actual - revisited).max(0);
                    }
                    total_available -= old.available.min(existing_deleted);
                }
            }
            if down > 0 {
                intents.insert(old.name.clone(), (current - down).max(0));
                budget = (budget - down).max(0);
            }
        }
    }
    break_deadlock(new, olds, &mut intents);
    intents
}

/// A rollout stuck on unavailable Machines of old sets, with nothing else moving, may take one
/// of them down even though that formally breaches maxUnavailable (as Cluster API does).
fn break_deadlock(new: &SetCounts, olds: &[SetCounts], intents: &mut Intents) {
    let old_actual: i64 = olds.iter().map(|s| s.actual).sum();
    let old_available: i64 = olds.iter().map(|s| s.available).sum();
    if old_actual == 0 || old_actual == old_available {
        return;
    }
    let moving = olds
        .iter()
        .chain(std::iter::once(new))
        .any(|s| s.spec != s.actual || intents.contains_key(&s.name));
    if moving || new.unavailable() > 0 {
        return;
    }
    if let Some(old) = olds.iter().find(|s| s.available != s.actual && s.spec > 0) {
        intents.insert(old.name.clone(), (old.spec - 1).max(0));
    }
}

/// OnDelete: old sets only shrink to acknowledge Machines someone deleted (or when
/// spec.replicas went down), and the up-to-date set grows so the total stays `replicas`.
/// `olds` must be sorted oldest first.
pub fn plan_on_delete(
    replicas: i64,
    strategy: &Strategy,
    new: &SetCounts,
    olds: &[SetCounts],
) -> Intents {
    let mut intents = plan_new_set(replicas, strategy, new, olds);
    let old_spec: i64 = olds.iter().map(|s| s.spec).sum();
    if old_spec == 0 {
        return intents;
    }
    let new_replicas = intent_or_spec(&intents, new);
    let mut excess = (old_spec + new_replicas - replicas).max(0);
    for old in olds.iter().filter(|s| s.spec > 0) {
        let gone = (old.spec - old.actual).max(0);
        if gone > 0 {
            intents.insert(old.name.clone(), old.spec - gone);
            excess -= gone;
        }
    }
    for old in olds {
        if excess <= 0 {
            break;
        }
        let current = intent_or_spec(&intents, old);
        if current <= 0 {
            continue;
        }
        let down = current.min(excess);
        intents.insert(old.name.clone(), (old.spec - down).max(0));
        excess -= down;
    }
    intents
}

/// A MachineSet template reduced to the fields whose change needs new Machines: metadata
/// (labels, annotations) and the fields Cluster API propagates in place are dropped, and a
/// v1beta1 reference's apiVersion is reduced to its group.
pub fn rollout_fields(template: Option<&Value>) -> Value {
    let mut spec = template
        .and_then(|t| t.get("spec"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for key in IN_PLACE_SPEC_FIELDS {
        spec.remove(*key);
    }
    if let Some(r) = spec.get_mut("infrastructureRef") {
        group_only(r);
    }
    if let Some(r) = spec
        .get_mut("bootstrap")
        .and_then(|b| b.get_mut("configRef"))
    {
        group_only(r);
    }
    strip_nulls(Value::Object(spec))
}

/// Machine template spec fields Cluster API updates on existing MachineSets (and Machines)
/// instead of rolling out (v1beta1 and v1beta2 spellings).
pub const IN_PLACE_SPEC_FIELDS: &[&str] = &[
    "nodeDrainTimeout",
    "nodeDeletionTimeout",
    "nodeVolumeDetachTimeout",
    "deletion",
    "minReadySeconds",
    "readinessGates",
    "taints",
];

fn group_only(reference: &mut Value) {
    if let Some(obj) = reference.as_object_mut()
        && let Some(api_version) = obj.get("apiVersion").and_then(Value::as_str)
    {
        let group = api_version
            .rsplit_once('/')
            .map_or("", |(g, _)| g)
            .to_string();
        obj.insert("apiVersion".into(), Value::String(group));
    }
}

fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect::<Map<String, Value>>(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

/// Whether a MachineSet template needs no new Machines to match the MachineDeployment's.
pub fn same_rollout_fields(set_template: Option<&Value>, md_template: Option<&Value>) -> bool {
    rollout_fields(set_template) == rollout_fields(md_template)
}

/// A stable hash of the rollout fields (FNV-1a over the canonical JSON), the first half of the
/// `machine-template-hash` label value.
pub fn template_hash(md_template: Option<&Value>) -> u32 {
    // serde_json's Map is ordered by key here, so the serialization is canonical.
    let text = rollout_fields(md_template).to_string();
    text.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set(name: &str, spec: i64, actual: i64, available: i64) -> SetCounts {
        SetCounts {
            name: name.into(),
            spec,
            actual,
            reported: actual,
            available,
        }
    }

    #[test]
    fn a_set_whose_cached_spec_lags_its_machines_is_not_scaled_down() {
        // The set was scaled 1 -> 4 and made its four Machines; the Machine cache has them, the
        // set cache still shows spec 1 / status 1. Cluster API sums the set's own spec and
        // status (1): room for three more, so the set goes to 4, not back to 2.
        let new = SetCounts {
            reported: 1,
            ..set("new", 1, 4, 4)
        };
        let intents = plan_rolling_update(4, &rolling(1, 0), &new, &[]);
        assert_eq!(intents.get("new"), Some(&4), "{intents:?}");
    }

    fn rolling(surge: i64, unavailable: i64) -> Strategy {
        Strategy {
            kind: StrategyType::RollingUpdate,
            max_surge: IntOrPercent::Int(surge),
            max_unavailable: IntOrPercent::Int(unavailable),
        }
    }

    #[test]
    fn strategy_defaults_and_both_spellings() {
        let d = strategy(&json!({}), CapiVersion::V1Beta2).unwrap();
        assert_eq!(d, rolling(1, 0));
        let v1 = json!({"strategy": {"type": "OnDelete"}});
        assert_eq!(
            strategy(&v1, CapiVersion::V1Beta1).unwrap().kind,
            StrategyType::OnDelete
        );
        // The v1beta1 spelling means nothing to v1beta2.
        assert_eq!(
            strategy(&v1, CapiVersion::V1Beta2).unwrap().kind,
            StrategyType::RollingUpdate
        );
        let v2 = json!({"rollout": {"strategy": {"type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 2}}}});
        let s = strategy(&v2, CapiVersion::V1Beta2).unwrap();
        assert_eq!(s.max_surge, IntOrPercent::Percent(25));
        assert_eq!(s.fenceposts(10), (3, 2), "surge rounds up");
        assert!(
            strategy(
                &json!({"strategy": {"type": "Recreate"}}),
                CapiVersion::V1Beta1
            )
            .is_err()
        );
        let bad = json!({"strategy": {"rollingUpdate": {"maxSurge": "x"}}});
        assert!(strategy(&bad, CapiVersion::V1Beta1).is_err());
    }

    #[test]
    fn fenceposts_never_both_zero_and_unavailable_is_capped() {
        assert_eq!(rolling(0, 0).fenceposts(3), (0, 1));
        let pct = Strategy {
            max_unavailable: IntOrPercent::Percent(10),
            max_surge: IntOrPercent::Int(0),
            ..rolling(0, 0)
        };
        assert_eq!(pct.fenceposts(5), (0, 1), "10% of 5 rounds down to 0");
        assert_eq!(rolling(0, 5).max_unavailable(2), 2);
        assert_eq!(rolling(1, 1).max_unavailable(0), 0);
    }

    #[test]
    fn rolling_update_surges_one_then_swaps_one_at_a_time() {
        let s = rolling(1, 0);
        // Fresh rollout: the new set may take one surge Machine, nothing old may go yet.
        let olds = [set("old", 3, 3, 3)];
        assert_eq!(initial_new_set_replicas(3, &s, &olds), 1);
        let new = set("new", 1, 1, 0);
        assert!(plan_rolling_update(3, &s, &new, &olds).is_empty());
        // The surge Machine is available: one old Machine may go, and only one.
        let new = set("new", 1, 1, 1);
        let plan = plan_rolling_update(3, &s, &new, &olds);
        assert_eq!(plan, Intents::from([("old".into(), 2)]));
        // While that old Machine is still being deleted nothing more moves.
        let olds = [set("old", 2, 3, 2)];
        assert!(plan_rolling_update(3, &s, &new, &olds).is_empty());
        // It is gone: the new set grows by one.
        let olds = [set("old", 2, 2, 2)];
        let plan = plan_rolling_update(3, &s, &new, &olds);
        assert_eq!(plan, Intents::from([("new".into(), 2)]));
    }

    #[test]
    fn rolling_update_takes_unavailable_old_machines_first_and_never_breaches_availability() {
        let s = rolling(1, 0);
        let new = set("new", 1, 1, 0);
        // Old set: 3 Machines, 1 without a Node. Its scale-down might take an available one,
        // so with maxUnavailable 0 nothing goes...
        let olds = [set("old", 3, 3, 2)];
        assert!(plan_rolling_update(3, &s, &new, &olds).is_empty());
        // With the new Machine available and maxUnavailable 1 there is room for exactly one.
        let new = set("new", 1, 1, 1);
        let plan = plan_rolling_update(3, &rolling(1, 1), &new, &olds);
        assert_eq!(plan, Intents::from([("old".into(), 2)]));
    }

    #[test]
    fn rolling_update_deadlock_breaker_takes_one_unavailable_old_machine() {
        let s = rolling(1, 0);
        let new = set("new", 1, 1, 1);
        let olds = [set("old", 3, 3, 2)];
        // total spec 4, min available 3, available 3: no room; the breaker takes one.
        let plan = plan_rolling_update(3, &s, &new, &olds);
        assert_eq!(plan, Intents::from([("old".into(), 2)]));
    }

    #[test]
    fn rolling_update_replicas_decrease_shrinks_old_sets_first() {
        let s = rolling(1, 0);
        // Mid-rollout, spec.replicas 3 -> 2: the new set (1) stays, old sets go down within
        // availability (everything available here).
        let new = set("new", 1, 1, 1);
        let olds = [set("old", 3, 3, 3)];
        let plan = plan_rolling_update(2, &s, &new, &olds);
        assert_eq!(plan, Intents::from([("old".into(), 1)]));
        // A new set above spec.replicas is cut down to it.
        let new = set("new", 3, 3, 3);
        let olds = [set("old", 1, 1, 1)];
        let plan = plan_rolling_update(2, &s, &new, &olds);
        assert_eq!(plan.get("new"), Some(&2));
        assert_eq!(plan.get("old"), Some(&0));
    }

    #[test]
    fn rolling_update_oldest_sets_go_first() {
        let s = rolling(0, 2);
        let new = set("new", 0, 0, 0);
        let olds = [set("oldest", 2, 2, 2), set("older", 2, 2, 2)];
        let plan = plan_rolling_update(4, &s, &new, &olds);
        assert_eq!(plan, Intents::from([("oldest".into(), 0)]));
    }

    #[test]
    fn on_delete_replaces_only_deleted_machines() {
        let s = Strategy {
            kind: StrategyType::OnDelete,
            ..rolling(1, 0)
        };
        let olds = [set("old", 3, 3, 3)];
        assert_eq!(initial_new_set_replicas(3, &s, &olds), 0);
        let new = set("new", 0, 0, 0);
        assert!(plan_on_delete(3, &s, &new, &olds).is_empty());
        // A Machine being deleted still counts.
        let olds = [set("old", 3, 3, 2)];
        assert!(plan_on_delete(3, &s, &new, &olds).is_empty());
        // Gone: the old set acknowledges it...
        let olds = [set("old", 3, 2, 2)];
        let plan = plan_on_delete(3, &s, &new, &olds);
        assert_eq!(plan, Intents::from([("old".into(), 2)]));
        // ...and then the new set takes the replacement.
        let olds = [set("old", 2, 2, 2)];
        let plan = plan_on_delete(3, &s, &new, &olds);
        assert_eq!(plan, Intents::from([("new".into(), 1)]));
        // spec.replicas down: the oldest old set shrinks.
        let plan = plan_on_delete(1, &s, &new, &[set("a", 2, 2, 2), set("b", 1, 1, 1)]);
        assert_eq!(plan, Intents::from([("a".into(), 0)]));
    }

    #[test]
    fn in_place_fields_do_not_roll_out() {
        let md = json!({
            "metadata": {"labels": {"a": "1"}},
            "spec": {
                "version": "v1.33.0",
                "infrastructureRef": {"apiVersion": "infra.example/v1beta2", "kind": "T", "name": "t1"},
                "bootstrap": {"configRef": {"apiVersion": "boot.example/v1beta1", "kind": "C", "name": "c"}},
                "nodeDrainTimeout": "10s",
            },
        });
        let mut ms = md.clone();
        ms["metadata"]["labels"]["machine-template-hash"] = json!("1-abcde");
        ms["metadata"]["labels"]["b"] = json!("2");
        ms["spec"]["nodeDrainTimeout"] = json!("5m");
        ms["spec"]["deletion"] = json!({"nodeDrainTimeoutSeconds": 5});
        ms["spec"]["minReadySeconds"] = json!(3);
        ms["spec"]["infrastructureRef"]["apiVersion"] = json!("infra.example/v1beta1");
        assert!(same_rollout_fields(Some(&ms), Some(&md)));
        assert_eq!(template_hash(Some(&ms)), template_hash(Some(&md)));
        for (field, value) in [
            ("/spec/version", json!("v1.34.0")),
            ("/spec/infrastructureRef/name", json!("t2")),
            ("/spec/bootstrap/configRef/name", json!("c2")),
            (
                "/spec/infrastructureRef/apiVersion",
                json!("other.example/v1beta2"),
            ),
        ] {
            let mut changed = md.clone();
            *changed.pointer_mut(field).unwrap() = value;
            assert!(!same_rollout_fields(Some(&changed), Some(&md)), "{field}");
            assert_ne!(template_hash(Some(&changed)), template_hash(Some(&md)));
        }
    }
}
