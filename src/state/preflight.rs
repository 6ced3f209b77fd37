//! Which MachineDeployments' scale-ups a MachineSet preflight check holds (Cluster API's
//! `ControlPlaneIsStable` and the version-skew checks), fed by the MachineSet watch: a claim
//! waiting for a Machine of one says why in its `Launched` condition.

use std::collections::BTreeMap;

pub(crate) use crate::capi::preflight::PreflightHold;

/// MachineSets reporting a failing preflight check, by MachineSet key (`namespace/name`), each
/// with its MachineDeployment's key. Only holding sets are kept: the rest need no memory.
#[derive(Default)]
pub(crate) struct PreflightHolds {
    by_set: BTreeMap<String, (String, PreflightHold)>,
}

impl PreflightHolds {
    /// The hold on `md_key`'s scale-up, if one of its MachineSets reports one (the first by
    /// name when several do, as during a rollout).
    pub(crate) fn of_deployment(&self, md_key: &str) -> Option<&PreflightHold> {
        self.by_set
            .values()
            .find(|(md, _)| md == md_key)
            .map(|(_, h)| h)
    }

    /// MachineSet `set` (of MachineDeployment `md_key`) now holds `hold` (None: nothing). Returns
    /// whether what `md_key`'s claims see changed.
    pub(crate) fn set(&mut self, set: &str, md_key: &str, hold: Option<PreflightHold>) -> bool {
        let before = self.of_deployment(md_key).cloned();
        match hold {
            Some(h) => self.by_set.insert(set.to_string(), (md_key.to_string(), h)),
            None => self.by_set.remove(set),
        };
        self.of_deployment(md_key) != before.as_ref()
    }

    /// After a re-list: exactly `all` hold. Returns the MachineDeployments whose hold changed.
    pub(crate) fn replace_all(
        &mut self,
        all: BTreeMap<String, (String, PreflightHold)>,
    ) -> Vec<String> {
        let old = std::mem::replace(&mut self.by_set, all);
        let mut touched: Vec<String> = old
            .values()
            .chain(self.by_set.values())
            .map(|(md, _)| md.clone())
            .collect();
        touched.sort();
        touched.dedup();
        let was = |md: &str| old.values().find(|(m, _)| m == md).map(|(_, h)| h.clone());
        touched
            .into_iter()
            .filter(|md| self.of_deployment(md).cloned() != was(md))
            .collect()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_set.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_set.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(set: &str, message: &str) -> PreflightHold {
        PreflightHold {
            machine_set: set.into(),
            message: message.into(),
        }
    }

    #[test]
    fn a_deployment_sees_its_sets_hold_come_and_go() {
        let mut holds = PreflightHolds::default();
        assert!(holds.set("ns/md-0-a", "ns/md-0", Some(hold("ns/md-0-a", "upgrading"))));
        assert!(!holds.set("ns/md-0-a", "ns/md-0", Some(hold("ns/md-0-a", "upgrading"))));
        assert_eq!(
            holds.of_deployment("ns/md-0"),
            Some(&hold("ns/md-0-a", "upgrading"))
        );
        assert_eq!(holds.of_deployment("ns/md-1"), None);
        assert!(holds.set("ns/md-0-a", "ns/md-0", None));
        assert!(holds.is_empty());
        holds.set("ns/md-1-a", "ns/md-1", Some(hold("ns/md-1-a", "skew")));
        let changed = holds.replace_all(
            [(
                "ns/md-0-b".to_string(),
                ("ns/md-0".to_string(), hold("ns/md-0-b", "upgrading")),
            )]
            .into(),
        );
        assert_eq!(changed, ["ns/md-0", "ns/md-1"]);
        assert_eq!(holds.len(), 1);
    }
}
