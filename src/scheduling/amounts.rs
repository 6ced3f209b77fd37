//! Resource lists as dense vectors for the solver's inner loops.
//!
//! `Resources` is a map keyed by strings, which is right for the API but slow when one pod is
//! tried against thousands of claims and hundreds of instance types. The solver interns every
//! resource name it meets once ([`Dims`]) and then works on [`Amounts`]: one exact nano-unit
//! value per interned name, compared element-wise.

use std::collections::HashMap;

#[cfg(test)]
use crate::api::resources::Quantity;
use crate::api::resources::Resources;

/// The resource names of one solve, each with a fixed position.
#[derive(Debug, Default, Clone)]
pub(crate) struct Dims {
    names: Vec<String>,
    index: HashMap<String, usize>,
}

impl Dims {
    /// Interns every name of `list`.
    pub(crate) fn learn(&mut self, list: &Resources) {
        for (name, _) in list.iter() {
            self.intern(name);
        }
    }

    pub(crate) fn intern(&mut self, name: &str) -> usize {
        if let Some(i) = self.index.get(name) {
            return *i;
        }
        let i = self.names.len();
        self.names.push(name.to_string());
        self.index.insert(name.to_string(), i);
        i
    }

    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    pub(crate) fn name(&self, i: usize) -> &str {
        self.names.get(i).map(String::as_str).unwrap_or("")
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// The dense form of `list`; names not interned are dropped (learn them first).
    pub(crate) fn amounts(&self, list: &Resources) -> Amounts {
        let mut out = Amounts::zero(self.len());
        for (name, q) in list.iter() {
            if let Some(i) = self.position(name) {
                out.0[i] = q.as_nanos();
            }
        }
        out
    }

    /// Back to a resource list, without zero entries.
    #[cfg(test)]
    pub(crate) fn resources(&self, amounts: &Amounts) -> Resources {
        amounts
            .0
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != 0)
            .map(|(i, v)| (self.name(i).to_string(), Quantity::from_nanos(*v)))
            .collect()
    }
}

/// One exact value (nano-units) per interned resource name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Amounts(pub Vec<i128>);

impl Amounts {
    pub(crate) fn zero(len: usize) -> Amounts {
        Amounts(vec![0; len])
    }

    pub(crate) fn add_assign(&mut self, other: &Amounts) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a = a.saturating_add(*b);
        }
    }

    pub(crate) fn sub_assign(&mut self, other: &Amounts) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a = a.saturating_sub(*b);
        }
    }

    pub(crate) fn sub(&self, other: &Amounts) -> Amounts {
        let mut out = self.clone();
        out.sub_assign(other);
        out
    }

    /// Element-wise maximum, in place.
    pub(crate) fn max_assign(&mut self, other: &Amounts) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a = (*a).max(*b);
        }
    }

    /// True when `self + extra <= limit` in every dimension.
    pub(crate) fn fits_with(&self, extra: &Amounts, limit: &Amounts) -> bool {
        self.0
            .iter()
            .zip(&extra.0)
            .zip(&limit.0)
            .all(|((a, b), l)| a.saturating_add(*b) <= *l)
    }

    /// The first dimension where `self + extra > limit`.
    #[cfg(test)]
    pub(crate) fn first_exceeding(&self, extra: &Amounts, limit: &Amounts) -> Option<usize> {
        self.0
            .iter()
            .zip(&extra.0)
            .zip(&limit.0)
            .position(|((a, b), l)| a.saturating_add(*b) > *l)
    }

    pub(crate) fn get(&self, i: usize) -> i128 {
        self.0.get(i).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(pairs: &[(&str, &str)]) -> Resources {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.parse::<Quantity>().unwrap()))
            .collect()
    }

    #[test]
    fn round_trip_and_fit() {
        let mut dims = Dims::default();
        let cap = res(&[("cpu", "4"), ("memory", "8Gi"), ("pods", "10")]);
        dims.learn(&cap);
        let cap_a = dims.amounts(&cap);
        assert_eq!(dims.resources(&cap_a), cap);
        let used = dims.amounts(&res(&[("cpu", "3500m"), ("pods", "9")]));
        let pod = dims.amounts(&res(&[("cpu", "500m"), ("pods", "1")]));
        assert!(used.fits_with(&pod, &cap_a));
        let big = dims.amounts(&res(&[("cpu", "501m"), ("pods", "1")]));
        assert!(!used.fits_with(&big, &cap_a));
        assert_eq!(
            used.first_exceeding(&big, &cap_a).map(|i| dims.name(i)),
            Some("cpu")
        );
        // A name never learned is dropped rather than mis-indexed.
        assert_eq!(dims.amounts(&res(&[("gpu", "1")])), Amounts::zero(3));
    }
}
