//! Which claims of this solve a pod could still join, so that placing a pod does not try it
//! against every open claim.
//!
//! Claims are tried as upstream tries them: fewest pods first (it sorts its new NodeClaims by
//! pod count before each pod), and among equals in the order they were opened. Each pod count
//! keeps a bitset of its claims, so the order costs no sort. Two indexes only ever skip claims
//! the full check would refuse, so the first claim found is the one a plain scan in that order
//! would find:
//! - room: each claim's room (largest type's allocatable minus what its pods use), and per block
//!   of 64 claims the element-wise largest room, so a pod skips whole blocks of full claims;
//! - hostname terms: per hostname-keyed topology group, a bitset of the claims it refuses
//!   (a hostname spread at its skew, anti-affinity with a matching pod there) and of the claims
//!   it repels pods from (a pod there carries required anti-affinity against them). Counts per
//!   hostname only grow, so a bit once set stays right for the rest of the solve.

use std::collections::BTreeMap;

use super::amounts::Amounts;

const BLOCK: usize = 64;

#[derive(Debug, Default)]
pub(super) struct ClaimIndex {
    room: Vec<Amounts>,
    /// Per block: element-wise maximum of its claims' `room`.
    block_room: Vec<Amounts>,
    /// Per claim: how many pods it holds.
    pods: Vec<usize>,
    /// Per pod count held by some claim: those claims.
    by_pods: BTreeMap<usize, Members>,
    /// Per group: claims refusing pods that carry the group's term.
    refuses: Vec<Vec<u64>>,
    /// Per group: claims repelling pods the group's term matches.
    repels: Vec<Vec<u64>>,
}

/// The claims holding one pod count.
#[derive(Debug, Default)]
struct Members {
    bits: Vec<u64>,
    len: usize,
}

/// Where a search through the claims stands: the pod count being tried and the first claim
/// of it not yet returned.
#[derive(Debug, Default)]
pub(super) struct Cursor {
    pods: usize,
    from: usize,
}

/// The hostname-keyed groups that constrain one pod.
pub(super) struct HostTerms<'a> {
    /// Groups whose terms the pod carries (and has not relaxed).
    pub(super) carried: &'a [usize],
    /// Groups whose selector matches the pod.
    pub(super) matched: &'a [usize],
}

impl ClaimIndex {
    /// Adds the next claim with its room and pod count.
    pub(super) fn push(&mut self, room: Amounts, pods: usize) {
        let claim = self.room.len();
        if claim.is_multiple_of(BLOCK) {
            self.block_room.push(room.clone());
        } else if let Some(b) = self.block_room.last_mut() {
            b.max_assign(&room);
        }
        self.room.push(room);
        self.pods.push(pods);
        self.by_pods.entry(pods).or_default().insert(claim);
    }

    /// A claim changed: pods joined it (its room shrank), or its types narrowed.
    pub(super) fn update(&mut self, claim: usize, room: Amounts, pods: usize) {
        let (Some(slot), Some(count)) = (self.room.get_mut(claim), self.pods.get_mut(claim)) else {
            return;
        };
        *slot = room;
        let was = std::mem::replace(count, pods);
        if was != pods {
            if let Some(m) = self.by_pods.get_mut(&was) {
                m.remove(claim);
                if m.len == 0 {
                    self.by_pods.remove(&was);
                }
            }
            self.by_pods.entry(pods).or_default().insert(claim);
        }
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

    /// The next claim, fewest pods first, with room for `want` that no hostname term of the
    /// pod rules out; the caller still runs every check on it.
    pub(super) fn next(&self, at: &mut Cursor, want: &Amounts, terms: &HostTerms) -> Option<usize> {
        for (&pods, members) in self.by_pods.range(at.pods..) {
            if pods != at.pods {
                *at = Cursor { pods, from: 0 };
            }
            if let Some(claim) = self.next_of(members, at.from, want, terms) {
                at.from = claim + 1;
                return Some(claim);
            }
        }
        at.pods = usize::MAX;
        None
    }

    /// The first of `members` at or after `from` with room for `want` that no hostname term
    /// rules out.
    fn next_of(
        &self,
        members: &Members,
        from: usize,
        want: &Amounts,
        terms: &HostTerms,
    ) -> Option<usize> {
        for block in from / BLOCK..members.bits.len() {
            let mut free = members.bits[block];
            if free == 0 || !self.block_room.get(block).is_some_and(|r| fits(want, r)) {
                continue;
            }
            free &= self.free_in(block, terms);
            let base = block * BLOCK;
            if from > base {
                free &= u64::MAX << (from - base);
            }
            while free != 0 {
                let claim = base + free.trailing_zeros() as usize;
                if self.room.get(claim).is_some_and(|r| fits(want, r)) {
                    return Some(claim);
                }
                free &= free - 1;
            }
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

impl Members {
    fn insert(&mut self, claim: usize) {
        let word = claim / BLOCK;
        if self.bits.len() <= word {
            self.bits.resize(word + 1, 0);
        }
        self.bits[word] |= 1 << (claim % BLOCK);
        self.len += 1;
    }

    fn remove(&mut self, claim: usize) {
        let bit = 1 << (claim % BLOCK);
        if let Some(w) = self.bits.get_mut(claim / BLOCK)
            && *w & bit != 0
        {
            *w &= !bit;
            self.len -= 1;
        }
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

    const NONE: HostTerms = HostTerms {
        carried: &[],
        matched: &[],
    };

    /// Every claim `next` returns for `want`, in order.
    fn order(index: &ClaimIndex, want: &[i128], terms: &HostTerms) -> Vec<usize> {
        let mut at = Cursor::default();
        std::iter::from_fn(|| index.next(&mut at, &amounts(want), terms)).collect()
    }

    fn first(index: &ClaimIndex, want: &[i128], terms: &HostTerms) -> Option<usize> {
        index.next(&mut Cursor::default(), &amounts(want), terms)
    }

    #[test]
    fn skips_full_and_refusing_claims_in_order() {
        let mut index = ClaimIndex::default();
        for i in 0..150 {
            // Claims 0..100 are full; 100.. have room.
            index.push(amounts(&[if i < 100 { 0 } else { 10 }]), 1);
        }
        assert_eq!(first(&index, &[1], &NONE), Some(100));
        assert_eq!(order(&index, &[1], &NONE), (100..150).collect::<Vec<_>>());
        assert_eq!(first(&index, &[11], &NONE), None);
        index.update(100, amounts(&[0]), 1);
        assert_eq!(first(&index, &[1], &NONE), Some(101));

        index.mark(101, 3, true, false);
        index.mark(102, 3, false, true);
        let carrier = HostTerms {
            carried: &[3],
            matched: &[],
        };
        assert_eq!(first(&index, &[1], &carrier), Some(102));
        let matcher = HostTerms {
            carried: &[],
            matched: &[3],
        };
        assert_eq!(first(&index, &[1], &matcher), Some(101));
        let both = HostTerms {
            carried: &[3],
            matched: &[3],
        };
        assert_eq!(first(&index, &[1], &both), Some(103));
        // Zero requests fit even a full claim.
        assert_eq!(first(&index, &[0], &NONE), Some(0));
    }

    #[test]
    fn fewest_pods_first_then_opening_order() {
        let mut index = ClaimIndex::default();
        for pods in [3, 1, 2, 1] {
            index.push(amounts(&[10]), pods);
        }
        assert_eq!(order(&index, &[1], &NONE), vec![1, 3, 2, 0]);
        // Claim 1 gains two pods: it now ties with claim 0, opened before it.
        index.update(1, amounts(&[8]), 3);
        assert_eq!(order(&index, &[1], &NONE), vec![3, 2, 0, 1]);
        // A claim too full for the pod is skipped wherever it stands.
        index.update(3, amounts(&[0]), 2);
        assert_eq!(order(&index, &[1], &NONE), vec![2, 0, 1]);
    }
}
