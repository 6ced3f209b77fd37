//! One copy of each value that many index entries carry alike (the labels of the Machines of
//! one MachineSet, of the pods of one ReplicaSet): at thousands of entries a copy each is most
//! of their room.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

pub(crate) struct Shared<T> {
    known: HashSet<Arc<T>>,
    /// How many values were left by the last sweep of unused ones.
    swept: usize,
}

impl<T> Default for Shared<T> {
    fn default() -> Self {
        Self {
            known: HashSet::new(),
            swept: 0,
        }
    }
}

impl<T: Hash + Eq> Shared<T> {
    /// The kept copy of `value`, kept from now on if there is none.
    pub(crate) fn share(&mut self, value: Arc<T>) -> Arc<T> {
        if let Some(known) = self.known.get(&value) {
            return known.clone();
        }
        self.keep(value)
    }

    /// [`Shared::share`] for a borrowed value: it is copied only when no copy is kept yet.
    pub(crate) fn share_ref(&mut self, value: &T) -> Arc<T>
    where
        T: Clone,
    {
        match self.known.get(value) {
            Some(known) => known.clone(),
            None => self.keep(Arc::new(value.clone())),
        }
    }

    /// Keeps `value`; values nobody else holds any more are dropped first once their number
    /// has doubled since the last sweep (a sweep is a pass over them all).
    fn keep(&mut self, value: Arc<T>) -> Arc<T> {
        if self.known.len() >= (self.swept * 2).max(64) {
            self.known.retain(|v| Arc::strong_count(v) > 1);
            self.swept = self.known.len();
        }
        self.known.insert(value.clone());
        value
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.known.len()
    }

    pub(crate) fn clear(&mut self) {
        self.known.clear();
        self.swept = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy_and_unused_ones_are_swept() {
        let mut shared = Shared::<String>::default();
        let a = shared.share(Arc::new("a".to_string()));
        let b = shared.share_ref(&"a".to_string());
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        for i in 0..63 {
            shared.share_ref(&i.to_string());
        }
        // The 65th value sweeps: nobody holds "a" nor the 63 numbers any more.
        let kept = shared.share_ref(&"z".to_string());
        assert_eq!(shared.len(), 1);
        assert!(Arc::ptr_eq(&kept, &shared.share_ref(&"z".to_string())));
    }
}
