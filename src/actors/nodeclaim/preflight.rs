//! A claim waiting for a Machine that Cluster API holds back: while a MachineSet preflight
//! check fails (the control plane upgrading, a version skew), the MachineSet creates no Machine
//! for the replica the Scaler raised, and the claim would only wait out its create timeout.
//! Its `Launched` condition (Unknown) names the check, quoting Cluster API and the MachineSet,
//! with one Event; once the check passes it goes back to waiting for the Machine.

use jiff::Timestamp;
use serde_json::Value;

use super::{Next, Step, object_ref};
use crate::actors::Error;
use crate::api::conditions::{self, ConditionStatus};
use crate::api::nodeclaim::NodeClaim;
use crate::capi::preflight::{PREFLIGHT_CHECK_FAILED, PreflightHold};

/// `Launched`'s reason once a preflight hold has lifted and the Machine is on its way.
pub(crate) const WAITING_FOR_MACHINE: &str = "WaitingForMachine";

/// What the claim's `Launched` condition must say while it waits for a Machine of `md`, when
/// that differs from what it says: the hold, or (a hold having lifted) the plain wait. None when
/// nothing is to be written (a claim never held writes nothing while it waits).
pub(crate) fn waiting_condition(
    claim: &NodeClaim,
    md: &str,
    hold: Option<&PreflightHold>,
) -> Option<(&'static str, String)> {
    let launched = conditions::get(claim.conditions(), conditions::LAUNCHED);
    let (reason, message) = match hold {
        Some(h) => (PREFLIGHT_CHECK_FAILED, held_message(md, h)),
        None if launched.is_some_and(|l| l.reason == PREFLIGHT_CHECK_FAILED) => (
            WAITING_FOR_MACHINE,
            format!("waiting for MachineDeployment {md} to create a Machine"),
        ),
        None => return None,
    };
    let same = launched.is_some_and(|l| {
        l.status == ConditionStatus::Unknown && l.reason == reason && l.message == message
    });
    (!same).then_some((reason, message))
}

/// The claim's words for a hold: which MachineSet, and Cluster API's own message.
pub(crate) fn held_message(md: &str, hold: &PreflightHold) -> String {
    format!(
        "MachineSet {} of MachineDeployment {md} creates no Machine while a preflight check fails: {}",
        hold.machine_set, hold.message
    )
}

impl Step {
    /// The preflight hold on `md`'s scale-up, as the MachineSet watch last reported it.
    pub(super) fn preflight_hold(&self, md: &str) -> Option<PreflightHold> {
        self.shared
            .state
            .preflight
            .read()
            .of_deployment(md)
            .cloned()
    }

    /// Write `Launched` (Unknown) as `waiting_condition` says, with an Event when a hold
    /// begins or changes. None when the condition already says it.
    pub(super) async fn say_why_waiting(&mut self, md: &str) -> Result<Option<Next>, Error> {
        let hold = self.preflight_hold(md);
        let Some((reason, message)) = waiting_condition(&self.claim, md, hold.as_ref()) else {
            return Ok(None);
        };
        let c = self.claim.clone();
        let mut st = c.status.clone().unwrap_or_default();
        let mut conds = st.conditions.take().unwrap_or_default();
        let now = Timestamp::now();
        conditions::set(
            &mut conds,
            conditions::LAUNCHED,
            ConditionStatus::Unknown,
            reason,
            &message,
            c.metadata.generation,
            now,
        );
        conditions::set_nodeclaim_ready(&mut conds, c.metadata.generation, now);
        st.conditions = Some(conds);
        let updated = self
            .patch_status(serde_json::to_value(&st).unwrap_or(Value::Null))
            .await?;
        if hold.is_some() {
            tracing::warn!(nodeclaim = %self.name(), machine_deployment = %md, %message, "Cluster API holds the Machine: a preflight check fails");
            self.shared.events.warning(
                object_ref(&c),
                PREFLIGHT_CHECK_FAILED,
                format!("NodeClaim {} waits for its Machine: {message}", self.name()),
            );
        } else {
            tracing::info!(nodeclaim = %self.name(), machine_deployment = %md, "preflight hold lifted; waiting for the Machine");
        }
        Ok(Some(Next::Continue(updated)))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(launched: Option<(&str, &str, &str)>) -> NodeClaim {
        let conditions: Vec<Value> = launched
            .into_iter()
            .map(|(status, reason, message)| {
                json!({"type": "Launched", "status": status, "reason": reason,
                       "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"})
            })
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c"},
            "spec": {"requirements": [],
                     "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}},
            "status": {"conditions": conditions},
        }))
        .expect("a valid NodeClaim")
    }

    fn hold() -> PreflightHold {
        PreflightHold {
            machine_set: "ns/md-0-x".into(),
            message: "SimControlPlane ns/sim is upgrading (\"ControlPlaneIsStable\" preflight check failed)".into(),
        }
    }

    #[test]
    fn a_hold_is_named_once_then_lifted_once() {
        let md = "ns/md-0";
        // Held: the reason and Cluster API's words with the MachineSet.
        let (reason, message) =
            waiting_condition(&claim(None), md, Some(&hold())).expect("a hold to say");
        assert_eq!(reason, "PreflightCheckFailed");
        assert!(message.contains("MachineSet ns/md-0-x"), "{message}");
        assert!(
            message.contains("\"ControlPlaneIsStable\" preflight check failed"),
            "{message}"
        );
        // Said already: nothing to write.
        let held = claim(Some(("Unknown", reason, &message)));
        assert_eq!(waiting_condition(&held, md, Some(&hold())), None);
        // Lifted: back to the plain wait, once.
        let (reason, message) = waiting_condition(&held, md, None).expect("the hold lifted");
        assert_eq!(reason, WAITING_FOR_MACHINE);
        assert_eq!(
            waiting_condition(&claim(Some(("Unknown", reason, &message))), md, None),
            None
        );
        // Never held: a waiting claim writes nothing.
        assert_eq!(waiting_condition(&claim(None), md, None), None);
    }
}
