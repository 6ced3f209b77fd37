//! Label selectors (pod affinity terms, topology spread) and taint tolerations.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A parsed label selector. An absent selector matches nothing (as for affinity terms and
/// topology spread); an empty one matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Selector {
    /// `None`: the selector was absent.
    rules: Option<Vec<Rule>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Rule {
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// Parses `selector`; `what` names it in the error (e.g. `spec.topologySpreadConstraints[0]`).
    pub(crate) fn parse(selector: Option<&LabelSelector>, what: &str) -> Result<Selector, String> {
        let Some(sel) = selector else {
            return Ok(Selector { rules: None });
        };
        let mut rules = Vec::new();
        for (k, v) in sel.match_labels.iter().flatten() {
            rules.push(Rule::In(k.clone(), BTreeSet::from([v.clone()])));
        }
        for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
            let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
            let rule = match e.operator.as_str() {
                "In" if !values.is_empty() => Rule::In(e.key.clone(), values),
                "NotIn" if !values.is_empty() => Rule::NotIn(e.key.clone(), values),
                "Exists" if values.is_empty() => Rule::Exists(e.key.clone()),
                "DoesNotExist" if values.is_empty() => Rule::DoesNotExist(e.key.clone()),
                op => {
                    return Err(format!(
                        "{what}.labelSelector.matchExpressions[{i}]: operator {op:?} with {} values is not valid",
                        values.len()
                    ));
                }
            };
            rules.push(rule);
        }
        rules.sort();
        Ok(Selector { rules: Some(rules) })
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let Some(rules) = &self.rules else {
            return false;
        };
        rules.iter().all(|r| match r {
            Rule::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Rule::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Rule::Exists(k) => labels.contains_key(k),
            Rule::DoesNotExist(k) => !labels.contains_key(k),
        })
    }

    /// Whether a node whose labels are known only as far as `label` says may match: a node
    /// yet to launch (a claim) whose zone or instance type is still one of several. Used where
    /// counting a node that turns out not to match is safe and missing one is not (quotas).
    pub(crate) fn could_match<'v>(&self, label: impl Fn(&str) -> MaybeLabel<'v>) -> bool {
        let Some(rules) = &self.rules else {
            return false;
        };
        rules.iter().all(|r| match r {
            Rule::In(k, vs) => match label(k) {
                MaybeLabel::Absent => false,
                MaybeLabel::OneOf(have) => have.iter().any(|v| vs.contains(*v)),
                MaybeLabel::Any => true,
            },
            Rule::NotIn(k, vs) => match label(k) {
                MaybeLabel::OneOf(have) => have.iter().any(|v| !vs.contains(*v)),
                MaybeLabel::Absent | MaybeLabel::Any => true,
            },
            Rule::Exists(k) => !matches!(label(k), MaybeLabel::Absent),
            Rule::DoesNotExist(k) => !matches!(label(k), MaybeLabel::OneOf(_)),
        })
    }
}

/// What a node to come may carry for one label key.
pub(crate) enum MaybeLabel<'v> {
    /// It will not carry the key.
    Absent,
    /// It will carry the key, with one of these values.
    OneOf(Vec<&'v str>),
    /// It may carry the key, with any value, or not.
    Any,
}

/// Whether `tolerations` tolerate `taint`.
pub(crate) fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == taint.effect);
        let key = t.key.as_deref().unwrap_or("");
        match t.operator.as_deref().unwrap_or("Equal") {
            // An empty key with Exists tolerates everything.
            "Exists" => effect_ok && (key.is_empty() || key == taint.key),
            "Equal" => {
                effect_ok
                    && key == taint.key
                    && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
            }
            _ => false,
        }
    })
}

/// The first taint of `taints` that blocks scheduling and is not tolerated. PreferNoSchedule
/// taints block only while `prefer_no_schedule_blocks` (they are preferences, relaxed last).
pub(crate) fn untolerated<'t>(
    tolerations: &[Toleration],
    taints: &'t [Taint],
    prefer_no_schedule_blocks: bool,
) -> Option<&'t Taint> {
    taints.iter().find(|taint| {
        let blocks = match taint.effect.as_str() {
            "PreferNoSchedule" => prefer_no_schedule_blocks,
            _ => true,
        };
        blocks && !tolerates(tolerations, taint)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn selector_matching() {
        let pod = labels(&[("app", "web"), ("tier", "front")]);
        // (selector, matches)
        let cases: Vec<(Option<LabelSelector>, bool)> = vec![
            (None, false),
            (Some(LabelSelector::default()), true),
            (
                Some(LabelSelector {
                    match_labels: Some(labels(&[("app", "web")])),
                    ..Default::default()
                }),
                true,
            ),
            (
                Some(LabelSelector {
                    match_labels: Some(labels(&[("app", "db")])),
                    ..Default::default()
                }),
                false,
            ),
            (
                Some(LabelSelector {
                    match_expressions: Some(vec![
                        expr("tier", "In", &["front", "back"]),
                        expr("env", "DoesNotExist", &[]),
                    ]),
                    ..Default::default()
                }),
                true,
            ),
            (
                Some(LabelSelector {
                    match_expressions: Some(vec![expr("app", "NotIn", &["web"])]),
                    ..Default::default()
                }),
                false,
            ),
            (
                Some(LabelSelector {
                    match_expressions: Some(vec![expr("env", "Exists", &[])]),
                    ..Default::default()
                }),
                false,
            ),
        ];
        for (sel, want) in cases {
            let s = Selector::parse(sel.as_ref(), "x").unwrap();
            assert_eq!(s.matches(&pod), want, "{sel:?}");
        }
        let bad = LabelSelector {
            match_expressions: Some(vec![expr("app", "In", &[])]),
            ..Default::default()
        };
        let err = Selector::parse(Some(&bad), "spec.affinity").unwrap_err();
        assert!(
            err.contains("spec.affinity.labelSelector.matchExpressions[0]"),
            "{err}"
        );
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(str::to_string),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn tol(key: Option<&str>, op: &str, value: Option<&str>, effect: Option<&str>) -> Toleration {
        Toleration {
            key: key.map(str::to_string),
            operator: Some(op.into()),
            value: value.map(str::to_string),
            effect: effect.map(str::to_string),
            toleration_seconds: None,
        }
    }

    #[test]
    fn toleration_matching() {
        let t = taint("gpu", Some("true"), "NoSchedule");
        // (toleration, tolerated)
        let cases = [
            (tol(Some("gpu"), "Equal", Some("true"), None), true),
            (tol(Some("gpu"), "Equal", Some("false"), None), false),
            (tol(Some("gpu"), "Exists", None, Some("NoSchedule")), true),
            (tol(Some("gpu"), "Exists", None, Some("NoExecute")), false),
            (tol(None, "Exists", None, None), true),
            (tol(Some("other"), "Exists", None, None), false),
        ];
        for (toleration, want) in cases {
            assert_eq!(
                tolerates(std::slice::from_ref(&toleration), &t),
                want,
                "{toleration:?}"
            );
        }
        let soft = [taint("spot", None, "PreferNoSchedule")];
        assert!(untolerated(&[], &soft, true).is_some());
        assert!(untolerated(&[], &soft, false).is_none());
    }
}
