//! The disruption pause: one switch that stops every voluntary disruption decision
//! (`--disruption-paused`), one per NodePool (its `karpenter.cluster.x-k8s.io/disruption-paused`
//! annotation), and Cluster API's own pause as the NodePool's condition reports it. Pure: the
//! disruption pass asks [`paused`] for each candidate's pool, the NodePools actor asks
//! [`condition`] and [`transition`] for the pool's status and Events.
//!
//! Voluntary means node repair (Karpenter v1.15's mode), drift, emptiness and consolidation.
//! Expiry is forceful in Karpenter v1 (it ignores budgets and do-not-disrupt), so a pause does
//! not hold it, nor node repair in its legacy mode; commands already under way finish, since
//! rolling one back mid-way would cost the drain it started.

use kube::ResourceExt;

use crate::api::conditions::ConditionStatus;
use crate::api::nodepool::NodePool;
use crate::api::wellknown::DISRUPTION_PAUSED_ANNOTATION;

/// What pauses a NodePool's voluntary disruption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Pause {
    /// `--disruption-paused` (`DISRUPTION_PAUSED`): every NodePool.
    Setting,
    /// The NodePool's own annotation.
    Annotation,
    /// Cluster API's pause on every node group the pool's NodeClass selects (their Cluster's
    /// `spec.paused` or `cluster.x-k8s.io/paused`, or the MachineDeployment's own): the message
    /// names them. The disruption pass holds such nodes one by one (`view::disruption`).
    ClusterApi(String),
}

impl Pause {
    /// The condition's reason.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Pause::Setting => "Setting",
            Pause::Annotation => "Annotation",
            Pause::ClusterApi(_) => "ClusterAPIPaused",
        }
    }

    /// Why, in words: the condition's message and the reason a held candidate gives.
    pub(crate) fn message(&self) -> String {
        match self {
            Pause::Setting => {
                "voluntary disruption is paused for every NodePool (--disruption-paused)".into()
            }
            Pause::Annotation => format!(
                "voluntary disruption of this NodePool is paused (\"{DISRUPTION_PAUSED_ANNOTATION}\" annotation)"
            ),
            Pause::ClusterApi(which) => format!(
                "Cluster API is paused for every node group of this NodePool ({which}): none of its Machines could be given back"
            ),
        }
    }
}

/// Whether the NodePool carries the pause annotation, set to "true" (any case), as
/// `karpenter.sh/do-not-disrupt` is read. Any other value pauses nothing.
pub(crate) fn annotated(np: &NodePool) -> bool {
    np.annotations()
        .get(DISRUPTION_PAUSED_ANNOTATION)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// What an operator's switch pauses for this pool, if anything: the setting first (it covers
/// every pool), then the pool's annotation. Cluster API's pause is read per node group by the
/// disruption pass, so it is not here.
pub(crate) fn paused(setting: bool, np: &NodePool) -> Option<Pause> {
    if setting {
        Some(Pause::Setting)
    } else if annotated(np) {
        Some(Pause::Annotation)
    } else {
        None
    }
}

/// The NodePool's `DisruptionPaused` condition: True with the pause's reason while one holds;
/// False (`NotPaused`) once a pause ended. None for a pool that never was paused (`had` is
/// false): every NodePool need not get a condition that says nothing.
pub(crate) fn condition(
    pause: Option<&Pause>,
    had: bool,
) -> Option<(ConditionStatus, &'static str, String)> {
    match pause {
        Some(p) => Some((ConditionStatus::True, p.reason(), p.message())),
        None if had => Some((
            ConditionStatus::False,
            "NotPaused",
            "voluntary disruption goes on".to_string(),
        )),
        None => None,
    }
}

/// A pause starting or ending, for the Event and the log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    Started,
    Ended,
}

/// Whether the condition's status moved between `was` (None: no condition) and `now`.
pub(crate) fn transition(was: Option<bool>, now: bool) -> Option<Transition> {
    match (was.unwrap_or(false), now) {
        (false, true) => Some(Transition::Started),
        (true, false) => Some(Transition::Ended),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(annotations: serde_json::Value) -> NodePool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "default", "annotations": annotations},
            "spec": {"template": {"spec": {"requirements": [],
                "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}}}}
        }))
        .expect("a NodePool")
    }

    #[test]
    fn the_setting_pauses_every_pool_and_the_annotation_its_own() {
        let plain = pool(serde_json::json!({}));
        let annotated = pool(serde_json::json!({DISRUPTION_PAUSED_ANNOTATION: "true"}));
        assert_eq!(paused(false, &plain), None);
        assert_eq!(paused(true, &plain), Some(Pause::Setting));
        assert_eq!(paused(false, &annotated), Some(Pause::Annotation));
        // The setting names the wider switch when both hold.
        assert_eq!(paused(true, &annotated), Some(Pause::Setting));
    }

    #[test]
    fn only_true_pauses() {
        for (value, want) in [
            ("true", true),
            ("True", true),
            (" TRUE ", true),
            ("false", false),
            ("", false),
            ("yes", false),
            ("1", false),
        ] {
            let np = pool(serde_json::json!({DISRUPTION_PAUSED_ANNOTATION: value}));
            assert_eq!(annotated(&np), want, "{value:?}");
        }
    }

    #[test]
    fn the_condition_appears_with_a_pause_and_stays_false_after_it() {
        assert_eq!(condition(None, false), None);
        let (status, reason, message) =
            condition(Some(&Pause::Annotation), false).expect("a condition");
        assert_eq!((status, reason), (ConditionStatus::True, "Annotation"));
        assert!(message.contains(DISRUPTION_PAUSED_ANNOTATION), "{message}");
        let capi = Pause::ClusterApi("Cluster default/c1".into());
        let (_, reason, message) = condition(Some(&capi), true).expect("a condition");
        assert_eq!(reason, "ClusterAPIPaused");
        assert!(message.contains("default/c1"), "{message}");
        let (status, reason, _) = condition(None, true).expect("kept, False");
        assert_eq!((status, reason), (ConditionStatus::False, "NotPaused"));
    }

    #[test]
    fn a_transition_is_a_change_of_status_only() {
        assert_eq!(transition(None, true), Some(Transition::Started));
        assert_eq!(transition(Some(false), true), Some(Transition::Started));
        assert_eq!(transition(Some(true), false), Some(Transition::Ended));
        assert_eq!(transition(Some(true), true), None);
        assert_eq!(transition(None, false), None);
        assert_eq!(transition(Some(false), false), None);
    }
}
