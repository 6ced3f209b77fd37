//! Which claims of this solve a pod could still join, so that placing a pod does not try it
//! against every open claim.
//!
//! Two indexes, both of which only ever skip claims the full check would refuse, so the first
//! claim found is the one a plain scan in claim order would find:
//! - room: each claim's room (largest type's allocatable minus what its pods use), and per block
//!   of 64 claims the element-wise largest room, so a pod skips whole blocks of full claims;
//! - hostname terms: per hostname-keyed topology group, a bitset of the claims it refuses
//!   (a hostname spread at its skew, anti-affinity with a matching pod there) and of the claims
//!   it repels pods from (a pod there carries required anti-affinity against them). Counts per
//!   hostname only grow, so a bit once set stays right for the rest of the solve.

use super::amounts::Amounts;

const BLOCK: usize = 64;

#[derive(Debug, Default)]
pub(super) struct ClaimIndex {
    room: Vec<Amounts>,
    /// Per block: element-wise maximum of its claims' `room`.
    block_room: Vec<Amounts>,
    /// Per group: claims refusing pods that carry the group's term.
    refuses: Vec<Vec<u64>>,
    /// Per group: claims repelling pods the group's term matches.
    repels: Vec<Vec<u64>>,
}

/// The hostname-keyed groups that constrain one pod.
pub(super) struct HostTerms<'a> {
    /// Groups whose terms the pod carries (and has not relaxed).
    pub(super) carried: &'a [usize],
    /// Groups whose selector matches the pod.
    pub(super) matched: &'a [usize],
}

impl ClaimIndex {
    /// Adds the next claim with its room.
    pub(super) fn push(&mut self, room: Amounts) {
        if self.room.len().is_multiple_of(BLOCK) {
            self.block_room.push(room.clone());
        } else if let Some(b) = self.block_room.last_mut() {
            b.max_assign(&room);
        }
        self.room.push(room);
    }

    /// A claim's room shrank (pods joined it, or its types narrowed).
    pub(super) fn set_room(&mut self, claim: usize, room: Amounts) {
        let Some(slot) = self.room.get_mut(claim) else {
            return;
        };
        *slot = room;
        let block = claim / BLOCK;
        let start = block * BLOCK;
        let end = (start + BLOCK).min(self.room.len());
        let mut max = self.room[start].clone();
        for r in &self.room[start + 1..end] {
            max.max_assign(r);
        }
        if let Some(b) = self.block_room.get_mut(block) {
            *b = max;
        }
    }

    /// Records what a hostname-keyed group now says about a claim.
    pub(super) fn mark(&mut self, claim: usize, group: usize, refuses: bool, repels: bool) {
        for (on, sets) in [(refuses, &mut self.refuses), (repels, &mut self.repels)] {
            if !on {
                continue;
            }
            if sets.len() <= group {
                sets.resize_with(group + 1, Vec::new);
            }
            let bits = &mut sets[group];
            let word = claim / BLOCK;
            if bits.len() <= word {
                bits.resize(word + 1, 0);
            }
            bits[word] |= 1 << (claim % BLOCK);
        }
    }

    /// The first claim at or after `from` with room for `want` that no hostname term of the
    /// pod rules out; the caller still runs every check on it.
    pub(super) fn next(&self, from: usize, want: &Amounts, terms: &HostTerms) -> Option<usize> {
        let n = self.room.len();
        let mut block = from / BLOCK;
        while block * BLOCK < n {
            if self.block_room.get(block).is_some_and(|r| fits(want, r)) {
                let mut free = self.free_in(block, terms);
                let base = block * BLOCK;
                if from > base {
                    free &= u64::MAX << (from - base);
                }
                let len = n - base;
                if len < BLOCK {
                    free &= (1u64 << len) - 1;
                }
                while free != 0 {
                    let claim = base + free.trailing_zeros() as usize;
                    if self.room.get(claim).is_some_and(|r| fits(want, r)) {
                        return Some(claim);
                    }
                    free &= free - 1;
                }
            }
            block += 1;
        }
        None
    }

    /// Claims of a block no hostname term of the pod rules out, as a bitmask.
    fn free_in(&self, block: usize, terms: &HostTerms) -> u64 {
        let word = |sets: &[Vec<u64>], g: usize| {
            sets.get(g)
                .and_then(|bits| bits.get(block))
                .copied()
                .unwrap_or(0)
        };
        let mut taken = 0u64;
        for &g in terms.carried {
            taken |= word(&self.refuses, g);
        }
        for &g in terms.matched {
            taken |= word(&self.repels, g);
        }
        !taken
    }
}

fn fits(want: &Amounts, room: &Amounts) -> bool {
    want.0.iter().zip(&room.0).all(|(w, r)| w <= r)
}

/// A claim's room: its largest type's allocatable minus what its pods use.
pub(super) fn room(max_avail: &Amounts, used: &Amounts) -> Amounts {
    max_avail.sub(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amounts(v: &[i128]) -> Amounts {
        Amounts(v.to_vec())
    }

    #[test]
    fn skips_full_and_refusing_claims_in_order() {
        let mut index = ClaimIndex::default();
        for i in 0..150 {
            // Claims 0..100 are full; 100.. have room.
            index.push(amounts(&[if i < 100 { 0 } else { 10 }]));
        }
        let none = HostTerms {
            carried: &[],
            matched: &[],
        };
        assert_eq!(index.next(0, &amounts(&[1]), &none), Some(100));
        assert_eq!(index.next(101, &amounts(&[1]), &none), Some(101));
        assert_eq!(index.next(0, &amounts(&[11]), &none), None);
        index.set_room(100, amounts(&[0]));
        assert_eq!(index.next(0, &amounts(&[1]), &none), Some(101));

        index.mark(101, 3, true, false);
        index.mark(102, 3, false, true);
        let carrier = HostTerms {
            carried: &[3],
            matched: &[],
        };
        assert_eq!(index.next(0, &amounts(&[1]), &carrier), Some(102));
        let matcher = HostTerms {
            carried: &[],
            matched: &[3],
        };
        assert_eq!(index.next(0, &amounts(&[1]), &matcher), Some(101));
        let both = HostTerms {
            carried: &[3],
            matched: &[3],
        };
        assert_eq!(index.next(0, &amounts(&[1]), &both), Some(103));
        // Zero requests fit even a full claim.
        assert_eq!(index.next(0, &amounts(&[0]), &none), Some(0));
    }
}
