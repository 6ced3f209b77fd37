//! Telling a fresh object from a stale one without reading resourceVersions as numbers.
//!
//! A resourceVersion is opaque: clients may only compare it for equality. What orders versions
//! is the watch stream, which delivers every change of an object in order. An index is fed from
//! two sources, the watch and our own write (or read) responses, which can race: a write
//! response is usually ahead of the watch, and the watch events still in flight are older.
//! So a response's version is held as "pending" until the watch delivers that same version;
//! watch events before it are older and are skipped. A version the watch already delivered
//! (the response lost the race) is not taken, since the index may already hold something newer.
//! Two responses cannot be ordered either (a read sent after a write may be served before it),
//! so while one response is waiting for the watch, another is not taken: the writer keeps its
//! own record of what it wrote until the watch shows it (e.g. the Scaler's `binding`).
//! A response that answers after the watch delivered the object's deletion is older than the
//! deletion: taken, it would bring the object back into the index for good (no watch event
//! ever comes for it again), so a deleted name refuses responses for a while. Karpenter core
//! met the same race in its cluster state (#3176) and heals it after the fact; refusing the
//! response keeps the ghost out in the first place.
//!
//! A pending version the watch never confirms would shadow its object for good, so it lapses,
//! but only on evidence that the watch is past it: the watch confirmed another of our responses
//! that came later (a later write was committed later, and the watch delivers in commit order).
//! A lapse on time alone let a watch lagging more than that time behind (a loaded fleet's shared
//! management server) take its versions from before our bind, and show a bound Machine unbound.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How many recent watch versions are remembered per object, to recognise a response that lost
/// the race with the watch.
const RECENT: usize = 8;

/// The least time a pending version shadows the watch: a watch confirms within this on a
/// healthy cluster, and a response the watch delivered long before it was answered (more than
/// [`RECENT`] versions ago) lapses no sooner.
const PENDING_TTL: Duration = Duration::from_secs(10);

/// How much later another response must have come for its confirmation to prove the watch past
/// ours: answers are taken in about the order their writes were committed, within this.
const ORDER_MARGIN: Duration = Duration::from_secs(1);

/// A pending version lapses after this long even without such proof (no other response of ours
/// confirmed), so an object nobody else of ours writes can never freeze: longer than a watch
/// that is moving at all takes to show a write.
const PENDING_CAP: Duration = Duration::from_secs(120);

/// How long a deleted name refuses responses: longer than any request may wait for its answer
/// (the client's read timeout, 300 s), so no answer sent before the deletion outlives it.
const GONE_TTL: Duration = Duration::from_secs(330);

/// Per-object bookkeeping for one index (keys are the index's keys).
#[derive(Debug, Default)]
pub(crate) struct Freshness {
    pending: HashMap<String, (String, Instant)>,
    recent: HashMap<String, VecDeque<String>>,
    /// Names whose deletion the watch delivered, and when (see the module's notes).
    gone: HashMap<String, Instant>,
    /// The same names in the order they went, to let them go after `GONE_TTL`.
    gone_order: VecDeque<(String, Instant)>,
    /// When the latest response the watch confirmed was taken: the watch is past everything
    /// committed before it (see [`Freshness::lapsed`]).
    confirmed_through: Option<Instant>,
}

impl Freshness {
    /// A write or read response carries `version` for `key`: whether to take it.
    pub(crate) fn responded(&mut self, key: &str, version: &str) -> bool {
        if self.is_gone(key) {
            return false;
        }
        if self
            .recent
            .get(key)
            .is_some_and(|r| r.iter().any(|v| v == version))
        {
            return false;
        }
        if self
            .pending
            .get(key)
            .is_some_and(|(_, at)| !self.lapsed(*at))
        {
            return false;
        }
        self.pending
            .insert(key.to_string(), (version.to_string(), Instant::now()));
        true
    }

    /// A response to one writer's requests sent strictly one after another (each sent after the
    /// previous answered, e.g. one claim's reconcile or one Scaler's MachineDeployment writes):
    /// newer than that writer's pending response, so it replaces it rather than waiting for the
    /// watch to confirm the older one. Without this, a writer faster than the watch computes
    /// its next guarded write from a version it already replaced and gets a conflict. A pending
    /// response of another writer may be shadowed early; the index then shows this version
    /// until the watch reaches it and catches up from there (every guarded write stays safe).
    /// Not taken when the watch already delivered it (the index may hold something newer).
    pub(crate) fn superseded(&mut self, key: &str, version: &str) -> bool {
        if self.is_gone(key) {
            return false;
        }
        if self
            .recent
            .get(key)
            .is_some_and(|r| r.iter().any(|v| v == version))
        {
            return false;
        }
        self.pending
            .insert(key.to_string(), (version.to_string(), Instant::now()));
        true
    }

    /// The watch delivered `version` for `key`: whether to take it.
    pub(crate) fn watched(&mut self, key: &str, version: &str) -> bool {
        // The watch shows the name again after its deletion: a new object of that name.
        self.gone.remove(key);
        // Most objects never change after the list: room for one version until a second comes.
        let recent = self
            .recent
            .entry(key.to_string())
            .or_insert_with(|| VecDeque::with_capacity(1));
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(version.to_string());
        match self.pending.get(key) {
            None => true,
            Some((v, at)) if v == version => {
                self.confirmed_through = self.confirmed_through.max(Some(*at));
                self.pending.remove(key);
                true
            }
            Some((_, at)) if !self.lapsed(*at) => false,
            Some(_) => {
                tracing::debug!(
                    key,
                    "the watch did not confirm our response in time; taking its version"
                );
                self.pending.remove(key);
                true
            }
        }
    }

    /// The watch delivered the object's deletion (or a re-list left it out): forget its
    /// versions, and refuse responses for it until `GONE_TTL` has passed.
    pub(crate) fn forget(&mut self, key: &str) {
        self.pending.remove(key);
        self.recent.remove(key);
        let now = Instant::now();
        self.let_go_before(now);
        self.gone.insert(key.to_string(), now);
        self.gone_order.push_back((key.to_string(), now));
    }

    /// A re-list replaced the index: the list is as new as anything we hold. Deleted names
    /// stay refused: a response older than the deletion is older than the list too.
    pub(crate) fn clear(&mut self) {
        self.pending.clear();
        self.recent.clear();
    }

    /// Whether a response taken at `at` and still unconfirmed stops shadowing the watch: the
    /// watch confirmed a response taken well after it, so had ours been coming, the watch would
    /// have shown it first; or no proof came in `PENDING_CAP`. A watch that is only behind
    /// confirms nothing taken after ours, so ours keeps shadowing its older versions.
    fn lapsed(&self, at: Instant) -> bool {
        let age = at.elapsed();
        let watch_past = self
            .confirmed_through
            .is_some_and(|c| c >= at + ORDER_MARGIN);
        age >= PENDING_TTL && (watch_past || age >= PENDING_CAP)
    }

    fn is_gone(&mut self, key: &str) -> bool {
        self.let_go_before(Instant::now());
        self.gone.contains_key(key)
    }

    /// Drop the deleted names whose refusal has run out.
    fn let_go_before(&mut self, now: Instant) {
        while let Some((key, at)) = self.gone_order.front() {
            if now.duration_since(*at) < GONE_TTL {
                break;
            }
            // A name deleted twice is in the queue twice: only its last mark counts.
            if self.gone.get(key) == Some(at) {
                self.gone.remove(key);
            }
            self.gone_order.pop_front();
        }
    }

    /// Objects with bookkeeping (for the tests that check maps shrink). Deleted names are not
    /// counted: they go by themselves after `GONE_TTL`.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let extra = self
            .pending
            .keys()
            .filter(|k| !self.recent.contains_key(*k))
            .count();
        self.recent.len() + extra
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writers_next_response_replaces_its_pending_one() {
        let mut f = Freshness::default();
        assert!(f.watched("c", "v1"));
        assert!(f.responded("c", "v2"));
        // A second response is not ordered against the first ...
        assert!(!f.responded("c", "v3"));
        // ... unless the same writer sent it after the first answered.
        assert!(f.superseded("c", "v3"));
        assert!(!f.watched("c", "v2"), "older than our last write");
        assert!(f.watched("c", "v3"));
        assert!(!f.superseded("c", "v3"), "the watch already delivered it");
    }

    #[test]
    fn a_response_ahead_of_the_watch_shadows_older_events_until_the_watch_catches_up() {
        let mut f = Freshness::default();
        // Versions are deliberately not in numeric order: only the stream's order counts.
        assert!(f.watched("m", "b7"));
        assert!(f.responded("m", "a3"));
        assert!(
            !f.watched("m", "z9"),
            "an event older than our write is skipped"
        );
        assert!(f.watched("m", "a3"), "the watch reached our write");
        assert!(f.watched("m", "c1"), "and newer events apply again");
    }

    /// Make `key`'s pending response look `by` older.
    fn backdate(f: &mut Freshness, key: &str, by: Duration) {
        let (_, at) = f.pending.get_mut(key).expect("a pending response");
        *at = at.checked_sub(by).expect("the clock reaches that far back");
    }

    #[test]
    fn a_watch_that_is_only_behind_never_outlasts_our_response() {
        let mut f = Freshness::default();
        assert!(f.watched("m", "unbound"));
        assert!(f.responded("m", "bound"));
        // The watch is 3 x PENDING_TTL behind, and confirmed nothing taken after our bind.
        backdate(&mut f, "m", PENDING_TTL * 3);
        assert!(
            !f.watched("m", "unbound-touched"),
            "a version from before the bind, however late it comes"
        );
        assert!(!f.responded("m", "read"), "still waiting for the watch");
        assert!(f.watched("m", "bound"), "the watch reached our write");
        assert!(f.pending.is_empty());
    }

    #[test]
    fn our_response_lapses_once_the_watch_confirms_a_later_one() {
        let mut f = Freshness::default();
        assert!(f.watched("a", "1"));
        assert!(f.watched("b", "1"));
        // The watch delivered this version before we took the answer, more than RECENT
        // versions ago: it will never come again.
        assert!(f.responded("a", "lost"));
        backdate(&mut f, "a", PENDING_TTL + ORDER_MARGIN * 2);
        assert!(
            !f.watched("a", "2"),
            "no proof yet that the watch is past it"
        );
        assert!(f.responded("b", "2"));
        assert!(f.watched("b", "2"), "a response taken later, confirmed");
        assert!(f.watched("a", "3"), "so the watch is past ours: it lapsed");
        assert!(f.pending.is_empty());
    }

    #[test]
    fn a_response_confirmed_before_ours_proves_nothing() {
        let mut f = Freshness::default();
        assert!(f.watched("a", "1"));
        assert!(f.watched("b", "1"));
        assert!(f.responded("b", "2"));
        assert!(f.responded("a", "2"));
        // b's answer came well before ours.
        backdate(&mut f, "b", PENDING_TTL * 2 + ORDER_MARGIN * 2);
        backdate(&mut f, "a", PENDING_TTL * 2);
        assert!(f.watched("b", "2"), "confirms a response taken before ours");
        assert!(
            !f.watched("a", "1b"),
            "older than our write: still shadowed"
        );
    }

    #[test]
    fn without_proof_our_response_lapses_at_the_cap() {
        let mut f = Freshness::default();
        assert!(f.watched("a", "1"));
        assert!(f.responded("a", "lost"));
        backdate(&mut f, "a", PENDING_CAP);
        assert!(f.watched("a", "2"), "the index cannot freeze");
    }

    #[test]
    fn a_response_that_lost_the_race_with_the_watch_is_not_taken() {
        let mut f = Freshness::default();
        assert!(f.watched("m", "10"));
        assert!(f.watched("m", "11"));
        assert!(
            !f.responded("m", "10"),
            "the index already holds something newer"
        );
        assert!(f.watched("m", "12"));
    }

    #[test]
    fn a_second_response_waits_for_the_watch_to_confirm_the_first() {
        let mut f = Freshness::default();
        assert!(f.watched("m", "1"));
        // A bind answered, then a read that was served before the bind landed.
        assert!(f.responded("m", "3"));
        assert!(!f.responded("m", "2"), "responses cannot be ordered");
        assert!(!f.watched("m", "2"));
        assert!(f.watched("m", "3"));
        assert!(f.responded("m", "4"), "nothing pending any more");
    }

    #[test]
    fn a_response_answering_after_the_deletion_is_not_taken() {
        let mut f = Freshness::default();
        assert!(f.watched("c", "1"));
        // The watch delivered the deletion before the answer to a write sent before it.
        f.forget("c");
        assert!(!f.responded("c", "2"), "the object is gone");
        assert!(!f.superseded("c", "2"), "the object is gone");
        f.clear();
        assert!(!f.responded("c", "2"), "a re-list does not bring it back");
        // A new object of the same name, as the watch shows it.
        assert!(f.watched("c", "5"));
        assert!(f.responded("c", "6"));
    }

    #[test]
    fn a_deleted_name_refuses_responses_only_for_a_while() {
        let mut f = Freshness::default();
        f.forget("a");
        f.forget("b");
        f.forget("a");
        assert_eq!(f.gone_order.len(), 3);
        f.let_go_before(Instant::now() + GONE_TTL);
        assert!(f.gone.is_empty() && f.gone_order.is_empty());
        assert!(f.responded("a", "1"), "its refusal ran out");
    }

    #[test]
    fn forget_and_clear_drop_the_bookkeeping() {
        let mut f = Freshness::default();
        f.watched("a", "1");
        f.responded("b", "2");
        assert_eq!(f.len(), 2);
        f.forget("a");
        f.forget("b");
        assert!(f.is_empty());
        f.responded("c", "3");
        f.clear();
        assert!(f.is_empty());
        assert!(f.watched("c", "1"));
    }
}
