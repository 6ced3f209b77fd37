//! Each replica's fair share of the Clusters. Replicas make themselves known through Kubernetes,
//! as they share the Clusters: each renews a membership Lease of its own in the Leases'
//! namespace, and counts the live ones. With `selected` Clusters and `members` replicas a
//! replica's share is `ceil(selected / members)`: it campaigns for another Cluster only while it
//! holds fewer, and when it holds more than its share plus a margin (a replica joined, or came
//! back after an upgrade) it lets Clusters go down to its share, each after its controller
//! stopped, so another replica takes them. The margin keeps a replica that won one race too many
//! from handing a Cluster back and forth.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use tokio::sync::watch;

use crate::api::nodepool::fnv1a64;

/// The names of the membership Leases.
const MEMBER_PREFIX: &str = "karpenter-capi-member-";

/// The membership Lease of replica `identity`.
pub fn member_lease_name(identity: &str) -> String {
    format!("{MEMBER_PREFIX}{:016x}", fnv1a64(identity.as_bytes()))
}

/// The fair share of `selected` Clusters among `members` replicas.
pub fn fair_share(selected: usize, members: usize) -> usize {
    selected.div_ceil(members.max(1))
}

/// How many Clusters above its share a replica may hold before it lets go.
pub fn margin(share: usize) -> usize {
    1 + share / 10
}

/// This replica's count of the Clusters it holds, against its share. A share of 0 means not
/// counted yet: nothing is campaigned for before the first count.
pub struct Share {
    held: watch::Sender<usize>,
    /// Set when the count went above the share plus the margin, until it is down to the share.
    draining: AtomicBool,
    share: watch::Sender<usize>,
    selected: watch::Sender<usize>,
}

impl Share {
    pub fn new() -> Arc<Self> {
        Arc::new(Share {
            held: watch::Sender::new(0),
            draining: AtomicBool::new(false),
            share: watch::Sender::new(0),
            selected: watch::Sender::new(0),
        })
    }

    /// How many Clusters the fleet serves now (selected, not paused or deleting).
    pub fn set_selected(&self, n: usize) {
        self.selected
            .send_if_modified(|s| std::mem::replace(s, n) != n);
    }

    /// Clusters held now.
    pub fn held(&self) -> usize {
        *self.held.borrow()
    }

    /// Resolves once this replica holds fewer Clusters than its share.
    pub async fn room(&self) {
        self.until(|held, share| held < share).await;
    }

    /// Resolves once this replica holds its share (or more).
    pub async fn full(&self) {
        self.until(|held, share| share > 0 && held >= share).await;
    }

    async fn until(&self, ok: impl Fn(usize, usize) -> bool) {
        let (mut held, mut share) = (self.held.subscribe(), self.share.subscribe());
        loop {
            if ok(*held.borrow_and_update(), *share.borrow_and_update()) {
                return;
            }
            tokio::select! {
                _ = held.changed() => {}
                _ = share.changed() => {}
            }
        }
    }

    /// Counts a Cluster won; [`Holding`] counts it lost when dropped.
    pub fn hold(self: &Arc<Self>) -> Holding {
        self.held.send_modify(|h| *h += 1);
        Holding {
            share: self.clone(),
            counted: true,
        }
    }

    /// Resolves when `holding` is one of the Clusters to let go (it is then no longer counted):
    /// once this replica holds more than its share plus the margin, Clusters are let go one at a
    /// time until it holds its share.
    pub async fn over(&self, holding: &mut Holding) {
        let (mut held, mut share) = (self.held.subscribe(), self.share.subscribe());
        loop {
            let s = *share.borrow_and_update();
            let h = *held.borrow_and_update();
            if s > 0 && h > s + margin(s) {
                self.draining.store(true, Ordering::Release);
            }
            if self.draining.load(Ordering::Acquire) {
                let mut let_go = false;
                self.held.send_if_modified(|h| {
                    let_go = *h > s;
                    if let_go {
                        *h -= 1;
                    }
                    let_go
                });
                if let_go {
                    holding.counted = false;
                    return;
                }
                self.draining.store(false, Ordering::Release);
            }
            tokio::select! {
                r = held.changed() => if r.is_err() { return std::future::pending().await },
                r = share.changed() => if r.is_err() { return std::future::pending().await },
            }
        }
    }

    /// Counts the members (live membership Leases of `lease_duration`, this replica's kept by
    /// its own election) every `period`, publishing the share; runs until dropped. A failed
    /// count keeps the last share.
    pub async fn count(
        self: Arc<Self>,
        management: kube::Client,
        namespace: String,
        lease_duration: Duration,
        period: Duration,
    ) {
        let api: Api<Lease> = Api::namespaced(management, &namespace);
        let mut selected = self.selected.subscribe();
        loop {
            match api.list(&ListParams::default()).await {
                Ok(leases) => {
                    let now = jiff::Timestamp::now();
                    let members = leases
                        .items
                        .iter()
                        .filter(|l| is_live_member(l, now, lease_duration))
                        .count();
                    let share = fair_share(*selected.borrow_and_update(), members.max(1));
                    self.share
                        .send_if_modified(|s| std::mem::replace(s, share) != share);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "counting the fleet's replicas failed; keeping the last share");
                }
            }
            let _ = tokio::time::timeout(period, selected.changed()).await;
        }
    }
}

/// A membership Lease with a holder, renewed within its duration and a third more (for the
/// clocks of two machines): a replica that died stops counting within about 20 s, and the
/// others' shares grow to take its Clusters.
fn is_live_member(lease: &Lease, now: jiff::Timestamp, duration: Duration) -> bool {
    let named = lease
        .metadata
        .name
        .as_deref()
        .is_some_and(|n| n.starts_with(MEMBER_PREFIX));
    let Some(spec) = lease.spec.as_ref().filter(|_| named) else {
        return false;
    };
    let held = spec
        .holder_identity
        .as_deref()
        .is_some_and(|h| !h.is_empty());
    let renewed = spec
        .renew_time
        .as_ref()
        .and_then(|t| now.since(t.0).ok())
        .and_then(|ago| ago.total(jiff::Unit::Second).ok())
        .is_some_and(|secs| secs < duration.as_secs_f64() * 4.0 / 3.0);
    held && renewed
}

/// One Cluster this replica holds, counted until dropped.
pub struct Holding {
    share: Arc<Share>,
    counted: bool,
}

impl Drop for Holding {
    fn drop(&mut self) {
        if self.counted {
            self.share.held.send_modify(|h| *h = h.saturating_sub(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_is_the_ceiling_and_the_margin_grows_with_it() {
        assert_eq!(fair_share(4, 2), 2);
        assert_eq!(fair_share(5, 2), 3);
        assert_eq!(fair_share(100, 3), 34);
        assert_eq!(
            fair_share(3, 0),
            3,
            "no member counted yet: this replica alone"
        );
        assert_eq!(margin(2), 1);
        assert_eq!(margin(34), 4);
    }

    #[tokio::test]
    async fn a_replica_over_its_share_lets_go_down_to_it() {
        let share = Share::new();
        share.share.send_replace(4);
        let mut held: Vec<Holding> = (0..4).map(|_| share.hold()).collect();
        assert_eq!(share.held(), 4);
        // A second replica: the share halves, two of the four are let go.
        share.share.send_replace(2);
        let mut let_go = 0;
        for h in held.iter_mut() {
            let over = tokio::time::timeout(Duration::from_millis(50), share.over(h)).await;
            if over.is_ok() {
                let_go += 1;
            }
        }
        assert_eq!(let_go, 2);
        assert_eq!(share.held(), 2);
        drop(held);
        assert_eq!(share.held(), 0, "the ones let go are not counted twice");
    }

    #[tokio::test]
    async fn within_the_margin_nothing_is_let_go() {
        let share = Share::new();
        share.share.send_replace(2);
        let mut held: Vec<Holding> = (0..3).map(|_| share.hold()).collect();
        let over = tokio::time::timeout(Duration::from_millis(50), share.over(&mut held[0])).await;
        assert!(over.is_err(), "3 is within 2 + 1");
        tokio::time::timeout(Duration::from_millis(50), share.full())
            .await
            .expect("full at its share");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), share.room())
                .await
                .is_err(),
            "no room above the share"
        );
    }

    #[test]
    fn only_renewed_membership_leases_count() {
        let now = jiff::Timestamp::now();
        let lease = |name: &str, holder: &str, ago: i64| -> Lease {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {
                    "holderIdentity": holder,
                    "renewTime": (now - jiff::SignedDuration::from_secs(ago)).to_string(),
                },
            }))
            .expect("a Lease")
        };
        let d = Duration::from_secs(15);
        assert!(is_live_member(
            &lease(&member_lease_name("a"), "a", 5),
            now,
            d
        ));
        assert!(!is_live_member(
            &lease(&member_lease_name("a"), "a", 40),
            now,
            d
        ));
        assert!(!is_live_member(
            &lease(&member_lease_name("a"), "", 1),
            now,
            d
        ));
        assert!(!is_live_member(
            &lease("karpenter-capi-default.c1", "a", 1),
            now,
            d
        ));
    }
}
