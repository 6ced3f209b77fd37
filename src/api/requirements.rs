//! Requirement algebra over label keys: In, NotIn, Exists, DoesNotExist, Gt, Lt, Gte, Lte.
//!
//! A [`Requirement`] describes the values one key may take: either a finite set of values or
//! the complement of a finite set, optionally narrowed by integer bounds, plus whether the
//! label may be absent altogether. Intersecting two requirements is exact, which is what
//! scheduling needs to ask "can a node satisfy both the pod and the NodePool?".

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::NodeSelectorRequirement;

use super::nodeclaim::{NodeSelectorRequirementWithMinValues, Operator};
use super::wellknown::normalized_label;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("requirement on {key:?}: operator {operator} needs at least one value")]
    MissingValues { key: String, operator: Operator },
    #[error("requirement on {key:?}: operator {operator} takes no values, got {count}")]
    UnexpectedValues {
        key: String,
        operator: Operator,
        count: usize,
    },
    #[error(
        "requirement on {key:?}: operator {operator} needs exactly one integer value, got {got:?}"
    )]
    NotOneInteger {
        key: String,
        operator: Operator,
        got: Vec<String>,
    },
    #[error("requirement on {key:?}: unknown operator {operator:?}")]
    UnknownOperator { key: String, operator: String },
    #[error("requirement on {key:?}: minValues {min_values} must be between 1 and 50")]
    MinValuesRange { key: String, min_values: i64 },
}

/// Why two requirement sets cannot both hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key {key:?}: {left} is incompatible with {right}")]
pub struct Incompatibility {
    pub key: String,
    pub left: String,
    pub right: String,
}

/// minValues not met: fewer distinct values remain for `key` than required.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "minValues requirement not met for key {key:?}: needs {required} distinct values, {available} available"
)]
pub struct MinValuesError {
    pub key: String,
    pub required: usize,
    pub available: usize,
}

/// The values one label key may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    /// When true, `values` lists the excluded values (every other value is allowed).
    complement: bool,
    values: BTreeSet<String>,
    /// Inclusive integer bounds; when set, only integer values within them are allowed.
    min: Option<i64>,
    max: Option<i64>,
    /// Whether a node without this label satisfies the requirement (NotIn, DoesNotExist).
    absent_ok: bool,
    min_values: Option<usize>,
}

impl Requirement {
    /// Builds a requirement from an operator and its values, checking the value counts.
    pub fn new(key: &str, operator: Operator, values: &[String]) -> Result<Requirement, Error> {
        let key_s = key.to_string();
        let mut r = Requirement {
            key: key_s.clone(),
            complement: true,
            values: BTreeSet::new(),
            min: None,
            max: None,
            absent_ok: false,
            min_values: None,
        };
        match operator {
            Operator::In => {
                if values.is_empty() {
                    return Err(Error::MissingValues {
                        key: key_s,
                        operator,
                    });
                }
                r.complement = false;
                r.values = values.iter().cloned().collect();
            }
            Operator::NotIn => {
                r.values = values.iter().cloned().collect();
                r.absent_ok = true;
            }
            Operator::Exists | Operator::DoesNotExist => {
                if !values.is_empty() {
                    return Err(Error::UnexpectedValues {
                        key: key_s,
                        operator,
                        count: values.len(),
                    });
                }
                if operator == Operator::DoesNotExist {
                    r.complement = false;
                    r.absent_ok = true;
                }
            }
            Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte => {
                let n = match values {
                    [one] => one.trim().parse::<i64>().ok(),
                    _ => None,
                }
                .ok_or_else(|| Error::NotOneInteger {
                    key: key_s,
                    operator,
                    got: values.to_vec(),
                })?;
                // Gt n means >= n+1; at the ends of i64 the bound saturates, which only ever
                // makes an already impossible requirement stay impossible.
                match operator {
                    Operator::Gt => r.min = Some(n.saturating_add(1)),
                    Operator::Gte => r.min = Some(n),
                    Operator::Lt => r.max = Some(n.saturating_sub(1)),
                    _ => r.max = Some(n),
                }
                r.normalize();
            }
        }
        Ok(r)
    }

    /// `key In values`.
    pub fn is_in<S: AsRef<str>>(key: &str, values: &[S]) -> Requirement {
        Requirement {
            key: key.to_string(),
            complement: false,
            values: values.iter().map(|v| v.as_ref().to_string()).collect(),
            min: None,
            max: None,
            absent_ok: false,
            min_values: None,
        }
    }

    /// `key Exists`.
    pub fn exists(key: &str) -> Requirement {
        Requirement {
            key: key.to_string(),
            complement: true,
            values: BTreeSet::new(),
            min: None,
            max: None,
            absent_ok: false,
            min_values: None,
        }
    }

    /// `key DoesNotExist`.
    pub fn does_not_exist(key: &str) -> Requirement {
        Requirement {
            complement: false,
            absent_ok: true,
            ..Requirement::exists(key)
        }
    }

    pub fn with_min_values(mut self, min_values: Option<usize>) -> Requirement {
        self.min_values = min_values;
        self
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn min_values(&self) -> Option<usize> {
        self.min_values
    }

    /// True when `value` is an allowed value of a present label.
    pub fn has(&self, value: &str) -> bool {
        if !self.within_bounds(value) {
            return false;
        }
        self.complement != self.values.contains(value)
    }

    /// True when a node without this label satisfies the requirement.
    pub fn allows_absent(&self) -> bool {
        self.absent_ok
    }

    /// The allowed values when they form a finite set (In, DoesNotExist, or an intersection that
    /// narrowed to one); `None` for complements.
    pub fn finite_values(&self) -> Option<&BTreeSet<String>> {
        (!self.complement).then_some(&self.values)
    }

    /// Number of allowed values; `usize::MAX` stands for "unbounded".
    pub fn len(&self) -> usize {
        if !self.complement {
            return self.values.len();
        }
        match (self.min, self.max) {
            (Some(lo), Some(hi)) => {
                let span = i128::from(hi) - i128::from(lo) + 1;
                let excluded = self.values.iter().filter(|v| self.within_bounds(v)).count();
                usize::try_from(span.max(0))
                    .unwrap_or(usize::MAX)
                    .saturating_sub(excluded)
            }
            _ => usize::MAX,
        }
    }

    /// True when no present value is allowed (the label must be absent, or nothing matches).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The operator that best describes this requirement (for display and error messages).
    pub fn operator(&self) -> Operator {
        if !self.complement {
            return if self.values.is_empty() && self.absent_ok {
                Operator::DoesNotExist
            } else {
                Operator::In
            };
        }
        if self.min.is_some() {
            Operator::Gte
        } else if self.max.is_some() {
            Operator::Lte
        } else if self.absent_ok {
            Operator::NotIn
        } else {
            Operator::Exists
        }
    }

    /// The intersection: values both allow, absence only if both allow it, the larger
    /// minValues.
    pub fn intersect(&self, other: &Requirement) -> Requirement {
        let min = max_opt(self.min, other.min);
        let max = min_opt(self.max, other.max);
        let (complement, values) = match (self.complement, other.complement) {
            (true, true) => (true, self.values.union(&other.values).cloned().collect()),
            (true, false) => (
                false,
                other.values.difference(&self.values).cloned().collect(),
            ),
            (false, true) => (
                false,
                self.values.difference(&other.values).cloned().collect(),
            ),
            (false, false) => (
                false,
                self.values.intersection(&other.values).cloned().collect(),
            ),
        };
        let mut r = Requirement {
            key: self.key.clone(),
            complement,
            values,
            min,
            max,
            absent_ok: self.absent_ok && other.absent_ok,
            min_values: max_opt(self.min_values, other.min_values),
        };
        r.normalize();
        r
    }

    /// Keeps the representation canonical so equal requirements compare equal: finite sets
    /// carry no bounds, and an empty integer range becomes an empty finite set.
    fn normalize(&mut self) {
        if !self.complement {
            let (min, max) = (self.min, self.max);
            self.values.retain(|v| in_bounds(v, min, max));
            self.min = None;
            self.max = None;
            return;
        }
        if let (Some(lo), Some(hi)) = (self.min, self.max)
            && lo > hi
        {
            self.complement = false;
            self.values.clear();
            self.min = None;
            self.max = None;
            return;
        }
        if self.min.is_some() || self.max.is_some() {
            let (min, max) = (self.min, self.max);
            self.values.retain(|v| in_bounds(v, min, max));
        }
    }

    fn within_bounds(&self, value: &str) -> bool {
        in_bounds(value, self.min, self.max)
    }

    /// The node selector requirements expressing this one (a complement with bounds needs
    /// several; a NotIn without absence needs an extra Exists).
    pub fn to_node_selector_requirements(&self) -> Vec<NodeSelectorRequirementWithMinValues> {
        let mut out = Vec::new();
        let req = |operator, values: Vec<String>| NodeSelectorRequirementWithMinValues {
            key: self.key.clone(),
            operator,
            values: (!values.is_empty()).then_some(values),
            min_values: self.min_values.and_then(|m| i64::try_from(m).ok()),
        };
        if !self.complement {
            if self.values.is_empty() {
                if self.absent_ok {
                    out.push(req(Operator::DoesNotExist, vec![]));
                } else {
                    // Nothing satisfies it. An empty In would say so but is rejected by
                    // validation, so write an empty integer range instead.
                    out.push(req(Operator::Gt, vec!["0".to_string()]));
                    out.push(req(Operator::Lt, vec!["0".to_string()]));
                }
            } else {
                out.push(req(Operator::In, self.values.iter().cloned().collect()));
            }
            return keep_min_values_on_first(out);
        }
        let bounded = self.min.is_some() || self.max.is_some();
        if !self.values.is_empty() {
            out.push(req(Operator::NotIn, self.values.iter().cloned().collect()));
        }
        if let Some(lo) = self.min {
            // Prefer Gt (understood by pods' node affinity too) unless that needs a negative.
            match lo.checked_sub(1).filter(|n| *n >= 0) {
                Some(n) => out.push(req(Operator::Gt, vec![n.to_string()])),
                None => out.push(req(Operator::Gte, vec![lo.to_string()])),
            }
        }
        if let Some(hi) = self.max {
            match hi.checked_add(1) {
                Some(n) if n >= 0 => out.push(req(Operator::Lt, vec![n.to_string()])),
                _ => out.push(req(Operator::Lte, vec![hi.to_string()])),
            }
        }
        if !bounded && (self.values.is_empty() || !self.absent_ok) {
            out.push(req(Operator::Exists, vec![]));
        }
        keep_min_values_on_first(out)
    }
}

/// minValues belongs on one entry only, or a round trip would count it once per entry.
fn keep_min_values_on_first(
    mut reqs: Vec<NodeSelectorRequirementWithMinValues>,
) -> Vec<NodeSelectorRequirementWithMinValues> {
    for extra in reqs.iter_mut().skip(1) {
        extra.min_values = None;
    }
    reqs
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values: Vec<&str> = self.values.iter().map(String::as_str).collect();
        match self.operator() {
            Operator::In => write!(f, "In {values:?}"),
            Operator::DoesNotExist => f.write_str("DoesNotExist"),
            Operator::Exists => f.write_str("Exists"),
            Operator::NotIn => write!(f, "NotIn {values:?}"),
            _ => {
                let lo = self.min.map(|n| format!(">= {n}"));
                let hi = self.max.map(|n| format!("<= {n}"));
                let parts: Vec<String> = lo.into_iter().chain(hi).collect();
                write!(f, "{}", parts.join(" and "))?;
                if !values.is_empty() {
                    write!(f, " NotIn {values:?}")?;
                }
                Ok(())
            }
        }
    }
}

fn in_bounds(value: &str, min: Option<i64>, max: Option<i64>) -> bool {
    if min.is_none() && max.is_none() {
        return true;
    }
    let Ok(n) = value.trim().parse::<i64>() else {
        return false;
    };
    min.is_none_or(|lo| n >= lo) && max.is_none_or(|hi| n <= hi)
}

fn max_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn min_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Requirements on many keys; all must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements {
    by_key: BTreeMap<String, Requirement>,
}

impl Requirements {
    pub fn new() -> Requirements {
        Requirements::default()
    }

    /// From a NodePool's or NodeClaim's requirements; several entries on one key intersect.
    pub fn from_node_selector_requirements(
        reqs: &[NodeSelectorRequirementWithMinValues],
    ) -> Result<Requirements, Error> {
        let mut out = Requirements::new();
        for r in reqs {
            let min_values = match r.min_values {
                None => None,
                Some(m) if (1..=50).contains(&m) => usize::try_from(m).ok(),
                Some(m) => {
                    return Err(Error::MinValuesRange {
                        key: r.key.clone(),
                        min_values: m,
                    });
                }
            };
            out.add(Requirement::new(&r.key, r.operator, r.values())?.with_min_values(min_values));
        }
        Ok(out)
    }

    /// From a pod's node selector terms (core NodeSelectorRequirement, string operators), with
    /// deprecated label keys read as the well-known ones.
    pub fn from_pod_node_selector(reqs: &[NodeSelectorRequirement]) -> Result<Requirements, Error> {
        let mut out = Requirements::new();
        for r in reqs {
            let operator = Operator::parse(&r.operator).ok_or_else(|| Error::UnknownOperator {
                key: r.key.clone(),
                operator: r.operator.clone(),
            })?;
            out.add(Requirement::new(
                normalized_label(&r.key),
                operator,
                r.values.as_deref().unwrap_or_default(),
            )?);
        }
        Ok(out)
    }

    /// Each label becomes `key In [value]`.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Requirements {
        let mut out = Requirements::new();
        for (k, v) in labels {
            out.add(Requirement::is_in(k, &[v]));
        }
        out
    }

    /// Adds a requirement, intersecting with any already on its key.
    pub fn add(&mut self, req: Requirement) {
        match self.by_key.get_mut(&req.key) {
            Some(existing) => *existing = existing.intersect(&req),
            None => {
                self.by_key.insert(req.key.clone(), req);
            }
        }
    }

    /// Both sets of requirements at once.
    pub fn intersect(&self, other: &Requirements) -> Requirements {
        let mut out = self.clone();
        for r in other.by_key.values() {
            out.add(r.clone());
        }
        out
    }

    /// Whether a node could satisfy both: for every key on both sides some value (or absence)
    /// satisfies both. Keys on one side only never conflict.
    pub fn compatible(&self, other: &Requirements) -> Result<(), Incompatibility> {
        for (key, mine) in &self.by_key {
            let Some(theirs) = other.by_key.get(key) else {
                continue;
            };
            let both = mine.intersect(theirs);
            if both.is_empty() && !both.allows_absent() {
                return Err(Incompatibility {
                    key: key.clone(),
                    left: mine.to_string(),
                    right: theirs.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Whether `labels`, each read as `key In (value)`, are compatible with these requirements:
    /// the verdict of `Requirements::from_labels(labels).compatible(self)`, without building a
    /// requirement per label (drift asks it of every claim on every pass). A label is
    /// compatible exactly when the requirement on its key, if any, allows its value; a
    /// requirement on a key with no label is not checked here.
    pub fn compatible_with_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.by_key
            .values()
            .all(|r| labels.get(&r.key).is_none_or(|v| r.has(v)))
    }

    /// Whether a node with these labels satisfies every requirement. A missing label satisfies
    /// only requirements that allow absence (NotIn, DoesNotExist).
    pub fn matches_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.by_key.values().all(|r| match labels.get(&r.key) {
            Some(v) => r.has(v),
            None => r.allows_absent(),
        })
    }

    pub fn get(&self, key: &str) -> Option<&Requirement> {
        self.by_key.get(key)
    }

    /// The finite set of allowed values for `key`, if the key is constrained to one.
    pub fn values(&self, key: &str) -> Option<&BTreeSet<String>> {
        self.by_key.get(key).and_then(Requirement::finite_values)
    }

    pub fn has(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.by_key.keys().map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Requirement> {
        self.by_key.values()
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Back to CRD requirements, one key after another in key order.
    pub fn to_node_selector_requirements(&self) -> Vec<NodeSelectorRequirementWithMinValues> {
        self.by_key
            .values()
            .flat_map(Requirement::to_node_selector_requirements)
            .collect()
    }

    /// Checks every minValues: `available(key)` says how many distinct values of `key` remain
    /// among the candidate instance types.
    pub fn check_min_values(
        &self,
        available: impl Fn(&str) -> usize,
    ) -> Result<(), MinValuesError> {
        for r in self.by_key.values() {
            if let Some(required) = r.min_values {
                let have = available(&r.key);
                if have < required {
                    return Err(MinValuesError {
                        key: r.key.clone(),
                        required,
                        available: have,
                    });
                }
            }
        }
        Ok(())
    }

    /// Lowers every minValues `available(key)` cannot meet to what it can (upstream's
    /// BestEffort policy); a key with no value left keeps no minValues, as a NodeClaim's
    /// minValues must be at least 1.
    pub fn relax_min_values(&mut self, available: impl Fn(&str) -> usize) {
        for r in self.by_key.values_mut() {
            if let Some(required) = r.min_values {
                let have = available(&r.key);
                if have < required {
                    r.min_values = (have > 0).then_some(have);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
