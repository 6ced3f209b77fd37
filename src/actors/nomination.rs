//! Upstream's `Nominated` Event: a pod a solve put on an existing node or an in-flight claim, or
//! on a claim it just created, is told where it should go ("Pod should schedule on:
//! nodeclaim/x, node/y"), so `kubectl describe pod` explains why it waits while no claim is
//! created for it. Once per pod and claim (a claim whose Node registered meanwhile is the same
//! place, not news), and rate-limited as upstream does (5 a second,
//! bursts of 10): a burst of thousands of pods must not become thousands of Event writes.

use std::collections::HashMap;
use std::time::Instant;

use crate::ratelimit::Bucket;

/// Upstream's `PodNominationRateLimiter`: 5 Events a second, bursts of 10.
const QPS: u32 = 5;
const BURST: u32 = 10;

pub struct Nominations {
    /// Where each pod was last told it goes (the claim, or the Node without one), until it is
    /// bound or gone.
    told: HashMap<String, String>,
    bucket: Bucket,
}

impl Default for Nominations {
    fn default() -> Self {
        Self {
            told: HashMap::new(),
            bucket: Bucket::new(QPS, BURST),
        }
    }
}

impl Nominations {
    /// The Event's note when `pod` should be told it goes to `target` now; None when it was
    /// already told it goes to the same place, or when the rate limit drops this one (it is
    /// told at a later solve).
    pub fn nominate(&mut self, pod: &str, target: &Target, now: Instant) -> Option<String> {
        if self.told.get(pod).is_some_and(|t| *t == target.place) || self.bucket.take(now).is_err()
        {
            return None;
        }
        self.told.insert(pod.to_string(), target.place.clone());
        Some(format!("Pod should schedule on: {}", target.text))
    }

    /// The pod is bound, not provisionable any more, or gone.
    pub fn forget(&mut self, pod: &str) {
        self.told.remove(pod);
    }

    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.told.retain(|k, _| keep(k));
    }

    pub fn len(&self) -> usize {
        self.told.len()
    }

    pub fn is_empty(&self) -> bool {
        self.told.is_empty()
    }
}

/// Where a pod should go: the claim (or the Node, for one no claim of ours made).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    place: String,
    /// Upstream's wording: the claim first, then the node.
    text: String,
}

pub fn target(nodeclaim: Option<&str>, node: Option<&str>) -> Option<Target> {
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
        let mut n = Nominations::default();
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
    fn a_burst_is_cut_to_the_rate_limit() {
        let mut n = Nominations::default();
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
