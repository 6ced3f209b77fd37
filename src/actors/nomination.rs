//! Where each pod was planned to go, and upstream's `Nominated` Event about it.
//!
//! A pod a solve put on an existing node or an in-flight claim, or on a claim it just created,
//! is told where it should go ("Pod should schedule on: nodeclaim/x, node/y"), so `kubectl
//! describe pod` explains why it waits while no claim is created for it. Once per pod and claim
//! (a claim whose Node registered meanwhile is the same place, not news), and rate-limited as
//! upstream does (5 a second, bursts of 10): a burst of thousands of pods must not become
//! thousands of Event writes.
//!
//! The plan itself is kept for every pod, told or not, until the pod is bound or gone: the next
//! solve puts a pod planned onto a claim still in flight back there before anything else (see
//! [`Nominations::planned`]), so solving the same pods again while their claims launch makes
//! no claim. Upstream keeps each pod's claim too (its pod-to-NodeClaim mapping, read only for
//! metrics) and holds a node it nominated for `max(2 × batch max, 10 s)`, renewed by each solve
//! that nominates it again; it needs no more because it solves nothing while a claim has not
//! launched, and a Cluster API launch takes minutes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::ratelimit::Bucket;

/// Upstream's `PodNominationRateLimiter`: 5 Events a second, bursts of 10.
const QPS: u32 = 5;
const BURST: u32 = 10;

/// Upstream's nomination window: `max(2 × BATCH_MAX_DURATION, 10 s)`.
pub(crate) fn window(batch_max: Duration) -> Duration {
    (2 * batch_max).max(Duration::from_secs(10))
}

pub(crate) struct Nominations {
    /// Where each pod was last planned, until it is bound or gone.
    planned: HashMap<String, Planned>,
    window: Duration,
    bucket: Bucket,
}

struct Planned {
    /// The claim, or the Node for one no claim of ours made.
    place: String,
    /// The plan holds for the next solve until then; a solve that plans the pod there again
    /// renews it, as upstream renews a nomination.
    until: Instant,
    /// Its `Nominated` Event was published (the rate limit may have dropped it).
    told: bool,
}

impl Nominations {
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            planned: HashMap::new(),
            window,
            bucket: Bucket::new(QPS, BURST),
        }
    }

    /// A solve planned `pod` onto `target`: record it, and return the Event's note when the pod
    /// should be told now; None when it was already told it goes to the same place, or when the
    /// rate limit drops this one (it is told at a later solve).
    pub(crate) fn nominate(&mut self, pod: &str, target: &Target, now: Instant) -> Option<String> {
        let until = now + self.window;
        if self.place_of(pod) != Some(target.place.as_str()) {
            self.planned.insert(
                pod.to_string(),
                Planned {
                    place: target.place.clone(),
                    until,
                    told: false,
                },
            );
        }
        let entry = self.planned.get_mut(pod)?;
        entry.until = until;
        if entry.told || self.bucket.take(now).is_err() {
            return None;
        }
        entry.told = true;
        Some(format!("Pod should schedule on: {}", target.text))
    }

    /// How long a plan holds.
    pub(crate) fn window(&self) -> Duration {
        self.window
    }

    /// Where `pod` was last planned (the claim, or the Node without one), however long ago.
    pub(crate) fn place_of(&self, pod: &str) -> Option<&str> {
        self.planned.get(pod).map(|p| p.place.as_str())
    }

    /// Each pod whose plan still holds at `now`, with its place.
    pub(crate) fn planned(&self, now: Instant) -> impl Iterator<Item = (&str, &str)> {
        self.planned
            .iter()
            .filter(move |(_, p)| p.until > now)
            .map(|(k, p)| (k.as_str(), p.place.as_str()))
    }

    /// The pod is bound, not provisionable any more, or gone.
    pub(crate) fn forget(&mut self, pod: &str) {
        self.planned.remove(pod);
    }

    /// Keeps the plans `keep(pod, place)` accepts.
    pub(crate) fn retain(&mut self, keep: impl Fn(&str, &str) -> bool) {
        self.planned.retain(|k, p| keep(k, &p.place));
    }

    pub(crate) fn len(&self) -> usize {
        self.planned.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.planned.is_empty()
    }
}

/// Where a pod should go: the claim (or the Node, for one no claim of ours made).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    place: String,
    /// Upstream's wording: the claim first, then the node.
    text: String,
}

impl Target {
    /// The claim's name, or the Node's for one no claim of ours made.
    pub(crate) fn place(&self) -> &str {
        &self.place
    }
}

pub(crate) fn target(nodeclaim: Option<&str>, node: Option<&str>) -> Option<Target> {
    let place = nodeclaim.or(node)?.to_string();
    let text = nodeclaim
        .map(|c| format!("nodeclaim/{c}"))
        .into_iter()
        .chain(node.map(|n| format!("node/{n}")))
        .collect::<Vec<_>>()
        .join(", ");
    Some(Target { place, text })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_pod_is_told_once_per_target() {
        let mut n = Nominations::new(window(Duration::from_secs(10)));
        let now = Instant::now();
        let a = target(Some("a"), None).unwrap();
        assert_eq!(
            n.nominate("default/p", &a, now).as_deref(),
            Some("Pod should schedule on: nodeclaim/a")
        );
        assert_eq!(n.nominate("default/p", &a, now), None);
        // Claim a's Node registered: the same place.
        let a_node = target(Some("a"), Some("x")).unwrap();
        assert_eq!(n.nominate("default/p", &a_node, now), None);
        let b = target(Some("b"), Some("y")).unwrap();
        assert_eq!(
            n.nominate("default/p", &b, now).as_deref(),
            Some("Pod should schedule on: nodeclaim/b, node/y")
        );
        n.forget("default/p");
        assert!(n.is_empty());
    }

    #[test]
    fn a_plan_is_kept_untold_and_holds_for_the_window_renewed_by_each_solve() {
        let mut n = Nominations::new(Duration::from_secs(10));
        let now = Instant::now();
        let a = target(Some("a"), None).unwrap();
        // The rate limit drops all but the first burst's Events; every plan is kept.
        for i in 0..100 {
            n.nominate(&format!("default/p{i}"), &a, now);
        }
        assert_eq!(n.planned(now).count(), 100);
        assert_eq!(n.place_of("default/p99"), Some("a"));
        let later = now + Duration::from_secs(9);
        n.nominate("default/p0", &a, later);
        let after = now + Duration::from_secs(11);
        let held: Vec<_> = n.planned(after).collect();
        assert_eq!(held, vec![("default/p0", "a")]);
        // Expired plans still say where the pod was planned.
        assert_eq!(n.place_of("default/p1"), Some("a"));
        assert_eq!(window(Duration::from_secs(3)), Duration::from_secs(10));
        assert_eq!(window(Duration::from_secs(10)), Duration::from_secs(20));
    }

    #[test]
    fn a_burst_is_cut_to_the_rate_limit() {
        let mut n = Nominations::new(window(Duration::from_secs(10)));
        let now = Instant::now();
        let a = target(Some("a"), None).unwrap();
        let told = (0..100)
            .filter(|i| n.nominate(&format!("default/p{i}"), &a, now).is_some())
            .count();
        assert_eq!(told, BURST as usize);
        // A second later five more tokens; the dropped pods are told at a later solve.
        let later = now + Duration::from_secs(1);
        let more = (10..100)
            .filter(|i| n.nominate(&format!("default/p{i}"), &a, later).is_some())
            .count();
        assert_eq!(more, QPS as usize);
    }

    #[test]
    fn targets_name_the_claim_then_the_node() {
        let text = |c, n| target(c, n).map(|t| t.text);
        assert_eq!(
            text(Some("c"), Some("n")).as_deref(),
            Some("nodeclaim/c, node/n")
        );
        assert_eq!(text(None, Some("n")).as_deref(), Some("node/n"));
        assert_eq!(target(None, None), None);
    }
}
