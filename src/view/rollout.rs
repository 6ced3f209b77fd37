//! Rollout status (upstream RFC #3216, after Cluster API's `upToDateReplicas`): how many of a
//! NodePool's (or a ClusterAPINodeClass's) nodes already match its spec, how many are Ready, and
//! whether the rollout has ended (`NodesUpToDate`).
//!
//! "Up to date" is not a rule of its own: a claim is up to date exactly when drift finds nothing
//! to replace, by the function disruption acts on (`disruption::drift::drifted`), with no
//! Provider signal (the pool side, known at once from the claim's `karpenter.sh/nodepool-hash`
//! stamp and labels), plus the Disruption actor's last verdict on the claim (its `Drifted`
//! condition, written by the same function with the Cluster API side filled in). A claim being
//! deleted is counted apart: its node is still there, so the rollout has not ended.

use crate::api::conditions::{self, ConditionStatus};
use crate::api::nodeclaim::NodeClaim;
use crate::disruption::drift::{self, PoolSpec, Provider};

/// One parent's counts. `nodes` counts live claims (as `status.nodes` always has); `terminating`
/// the claims being deleted, which count against the rollout until they are gone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rollout {
    pub(crate) nodes: i64,
    pub(crate) up_to_date: i64,
    pub(crate) ready: i64,
    pub(crate) up_to_date_and_ready: i64,
    pub(crate) terminating: i64,
}

/// The `NodesUpToDate` condition a parent with these counts carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) status: ConditionStatus,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// What one claim of a known NodePool counts for in its parents' rollouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Standing {
    deleting: bool,
    ready: bool,
    up_to_date: bool,
}

impl Standing {
    pub(crate) fn of(claim: &NodeClaim, pool: &PoolSpec) -> Self {
        Standing {
            deleting: claim.metadata.deletion_timestamp.is_some(),
            ready: conditions::is_true(claim.conditions(), conditions::READY),
            up_to_date: up_to_date(claim, pool),
        }
    }
}

impl Rollout {
    pub(crate) fn count(&mut self, claim: Standing) {
        if claim.deleting {
            self.terminating += 1;
            return;
        }
        let Standing {
            ready, up_to_date, ..
        } = claim;
        self.nodes += 1;
        self.up_to_date += i64::from(up_to_date);
        self.ready += i64::from(ready);
        self.up_to_date_and_ready += i64::from(up_to_date && ready);
    }

    /// True once every node is up to date and Ready and no replaced node is left; False with
    /// the first thing still in the way while a rollout runs.
    pub(crate) fn verdict(&self) -> Verdict {
        let of = format!("{} of {} nodes up to date", self.up_to_date, self.nodes);
        let (status, reason, message) = if self.up_to_date < self.nodes {
            (ConditionStatus::False, "RollingOut", of)
        } else if self.terminating > 0 {
            (
                ConditionStatus::False,
                "Terminating",
                format!(
                    "{of}, {} replaced nodes still terminating",
                    self.terminating
                ),
            )
        } else if self.up_to_date_and_ready < self.nodes {
            (
                ConditionStatus::False,
                "WaitingForReady",
                format!("{of}, {} of them Ready", self.up_to_date_and_ready),
            )
        } else {
            (ConditionStatus::True, "NodesUpToDate", of)
        };
        Verdict {
            status,
            reason,
            message,
        }
    }
}

/// Whether `claim` matches what its pool would launch today: not drifted by drift's own
/// function, and not left drifted by the Disruption actor's last pass.
pub(crate) fn up_to_date(claim: &NodeClaim, pool: &PoolSpec) -> bool {
    drift::drifted(claim, pool, Provider::default()).is_none()
        && !conditions::is_true(claim.conditions(), conditions::DRIFTED)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;
    use crate::api::drift_hash::nodepool_hash;
    use crate::api::nodepool::NodePool;
    use crate::api::wellknown::NODEPOOL_LABEL;
    use crate::api::wellknown::{
        NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION, NODEPOOL_HASH_VERSION_ANNOTATION,
    };
    use crate::view::pool_counts::Tally;

    fn pool(team: &str) -> NodePool {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {
                "metadata": {"labels": {"team": team}},
                "spec": {"requirements": [],
                         "nodeClassRef": {"group": "g", "kind": "K", "name": "nc"}}}}
        }))
        .expect("a NodePool")
    }

    /// A claim of pool "default" stamped with `np`'s hash, Ready or not, maybe deleting, maybe
    /// with the Disruption actor's `Drifted` condition.
    fn claim(name: &str, np: &NodePool, ready: bool, extra: Value) -> NodeClaim {
        let mut conds = vec![
            json!({"type": "Ready", "status": if ready {"True"} else {"False"},
                                    "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "R"}),
        ];
        if extra["drifted"] == true {
            conds.push(
                json!({"type": "Drifted", "status": "True", "reason": "MachineTemplateDrifted",
                              "lastTransitionTime": "2026-01-01T00:00:00Z"}),
            );
        }
        let mut c = json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {NODEPOOL_LABEL: "default", "team": "blue"},
                         "annotations": {NODEPOOL_HASH_ANNOTATION: nodepool_hash(np),
                                         NODEPOOL_HASH_VERSION_ANNOTATION: NODEPOOL_HASH_VERSION}},
            "spec": {"requirements": [], "nodeClassRef": {"group": "g", "kind": "K", "name": "nc"}},
            "status": {"conditions": conds}
        });
        if extra["deleting"] == true {
            c["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(c).expect("a NodeClaim")
    }

    fn counts(claims: &[NodeClaim], np: &NodePool) -> (Rollout, Rollout) {
        let pools = HashMap::from([("default".to_string(), Arc::new(np.clone()))]);
        let counts = Tally::default().count(claims, &pools);
        (
            counts.pools.get("default").copied().unwrap_or_default(),
            counts.classes.get("nc").copied().unwrap_or_default(),
        )
    }

    #[test]
    fn a_template_change_makes_every_node_out_of_date_until_replaced() {
        let (red, blue) = (pool("red"), pool("blue"));
        // Two nodes launched under "red"; the pool now says "blue": both drifted.
        let old = [
            claim("a", &red, true, json!({})),
            claim("b", &red, true, json!({})),
        ];
        let (p, c) = counts(&old, &blue);
        assert_eq!(
            p,
            Rollout {
                nodes: 2,
                up_to_date: 0,
                ready: 2,
                up_to_date_and_ready: 0,
                terminating: 0
            }
        );
        assert_eq!(c, p, "the NodeClass counts the same claims");
        let v = p.verdict();
        assert_eq!((v.status, v.reason), (ConditionStatus::False, "RollingOut"));
        assert_eq!(v.message, "0 of 2 nodes up to date");

        // Mid-rollout: one replacement launched (not Ready yet), one old node deleting.
        let mid = [
            claim("a", &red, true, json!({"deleting": true})),
            claim("b", &red, true, json!({})),
            claim("c", &blue, false, json!({})),
        ];
        let (p, _) = counts(&mid, &blue);
        assert_eq!(
            p,
            Rollout {
                nodes: 2,
                up_to_date: 1,
                ready: 1,
                up_to_date_and_ready: 0,
                terminating: 1
            }
        );
        assert_eq!(p.verdict().message, "1 of 2 nodes up to date");

        // Every live node replaced, but an old one still terminating: not done.
        let draining = [
            claim("b", &red, true, json!({"deleting": true})),
            claim("c", &blue, true, json!({})),
            claim("d", &blue, true, json!({})),
        ];
        let v = counts(&draining, &blue).0.verdict();
        assert_eq!(
            (v.status, v.reason),
            (ConditionStatus::False, "Terminating"),
            "{v:?}"
        );

        // A replacement not Ready yet: not done either.
        let unready = [
            claim("c", &blue, true, json!({})),
            claim("d", &blue, false, json!({})),
        ];
        let v = counts(&unready, &blue).0.verdict();
        assert_eq!(
            (v.status, v.reason),
            (ConditionStatus::False, "WaitingForReady"),
            "{v:?}"
        );

        let done = [
            claim("c", &blue, true, json!({})),
            claim("d", &blue, true, json!({})),
        ];
        let (p, _) = counts(&done, &blue);
        assert_eq!(p.up_to_date, p.nodes);
        let v = p.verdict();
        assert_eq!(
            (v.status, v.reason),
            (ConditionStatus::True, "NodesUpToDate")
        );
        assert_eq!(v.message, "2 of 2 nodes up to date");
    }

    #[test]
    fn up_to_date_is_exactly_not_drifted() {
        let (red, blue) = (pool("red"), pool("blue"));
        for (c, np) in [
            (claim("a", &red, true, json!({})), &red),
            (claim("a", &red, true, json!({})), &blue),
            (claim("a", &blue, true, json!({})), &blue),
        ] {
            let spec = PoolSpec::of(np);
            assert_eq!(
                up_to_date(&c, &spec),
                drift::drifted(&c, &spec, Provider::default()).is_none(),
                "{np:?}"
            );
        }
        // The Cluster API side only the Disruption actor sees (here: an outdated Machine)
        // reaches the count through the `Drifted` condition it wrote.
        let c = claim("a", &blue, true, json!({"drifted": true}));
        let blue = PoolSpec::of(&blue);
        assert!(!up_to_date(&c, &blue));
        assert!(
            drift::drifted(
                &c,
                &blue,
                Provider {
                    selected: None,
                    machine_up_to_date: Some(false)
                }
            )
            .is_some()
        );
    }

    #[test]
    fn an_empty_pool_has_nothing_to_roll_out() {
        let v = Rollout::default().verdict();
        assert_eq!(v.status, ConditionStatus::True);
        assert_eq!(v.message, "0 of 0 nodes up to date");
    }
}
